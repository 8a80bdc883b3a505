// JSON number numerals as regexes: the full RFC 8259 number grammar, and the exact languages of
// the numerals between bounds that the JSON Schema translation (json_schema.h) generates for
// "minimum" / "maximum" / "exclusiveMinimum" / "exclusiveMaximum".
//
// Ranges are decomposed digit by digit (the classic construction: a shared leading digit, or the
// low edge, the full middle and the high edge), so a range costs states that grow with the number
// of digits of its bounds, not with its width. The languages are exact: a numeral is in the
// language iff its value is in range. Numerals are written as JSON writes them (no leading zeros,
// no "+"); the bounded ones without an exponent and never as "-0".
#ifndef KVRM_RUNTIME_STRUCTURED_JSON_NUMBER_RANGES_H_
#define KVRM_RUNTIME_STRUCTURED_JSON_NUMBER_RANGES_H_

#include <cstdint>
#include <optional>
#include <string>

#include "runtime/structured/regex_ast.h"

namespace kvrm::structured {

// Any JSON number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
Regex JsonNumber();

// Fixed-width numerals from x to y: x and y are strings of decimal digits of equal length with
// x <= y; leading zeros stand as written ("00" to "23" is an hour).
Regex SameLengthNumerals(const std::string& x, const std::string& y);

// JSON integers in [lo, hi] (absent: unbounded), exactly. "-0" is not generated. Nothing() when
// lo > hi.
Regex IntegerRange(std::optional<int64_t> lo, std::optional<int64_t> hi);

struct NumberBound {
  int64_t value = 0;
  bool exclusive = false;
};

// JSON numbers x with lo <= x <= hi (integer bounds, each inclusive or exclusive; absent:
// unbounded), without exponents, fractions of any length ("1.000" is 1). Nothing() when no number
// is in range.
Regex BoundedNumber(std::optional<NumberBound> lo, std::optional<NumberBound> hi);

}  // namespace kvrm::structured

#endif  // KVRM_RUNTIME_STRUCTURED_JSON_NUMBER_RANGES_H_
