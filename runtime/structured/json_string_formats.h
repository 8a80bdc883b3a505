// JSON Schema "format"s as regexes over string content (the text between the quotes): date-time,
// date, time, uuid, email, ipv4, uri.
//
// Dates know the calendar (month lengths, Gregorian leap years); times have no leap seconds;
// email is a dot-atom local part at a domain of two or more labels; uri is loose (a scheme, then
// URI characters). The languages are ASCII without " or \ (nothing JSON must escape), so a
// content is its own JSON spelling, and its length in characters is its length in bytes.
#ifndef KVRM_RUNTIME_STRUCTURED_JSON_STRING_FORMATS_H_
#define KVRM_RUNTIME_STRUCTURED_JSON_STRING_FORMATS_H_

#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "runtime/structured/regex_ast.h"

namespace kvrm::structured {

struct StringFormat {
  Regex regex;  // the content, without quotes
  // The lengths (in characters) of the strings in `regex`, for checking it against minLength and
  // maxLength.
  uint64_t min_length = 0;
  uint64_t max_length = std::numeric_limits<uint64_t>::max();
};

// The format called `name`; nullopt for a format not translated (an annotation then, as for
// validators that do not know it).
std::optional<StringFormat> FindStringFormat(const std::string& name);

}  // namespace kvrm::structured

#endif  // KVRM_RUNTIME_STRUCTURED_JSON_STRING_FORMATS_H_
