// Regex text -> regex_ast.h tree, for structured outputs' `regex` constraint and JSON Schema's
// `pattern`.
//
// The pattern describes the whole text (an implicit full match, as vLLM's guided_regex and
// outlines take it); ^ at the start and $ at the end are accepted and change nothing. The syntax
// is the common subset of Python `re`, ECMAScript and RE2 that describes a regular language:
//   literals (any UTF-8), .  (any character but \n), [...] and [^...] with ranges, escapes and
//   POSIX classes ([:alpha:] ...), \d \D \w \W \s \S (ASCII), \n \t \r \f \v \0, \xHH, \x{H...},
//   \uHHHH, \u{H...}, \ before any punctuation, groups (...) (?:...) (?P<n>...) (?<n>...),
//   alternation |, quantifiers * + ? {n} {n,} {n,m} (lazy forms accepted: they match the same
//   language). A "{" that does not start a quantifier is a literal, as in Python; "{,n}", which
//   Python reads as {0,n} and ECMAScript and RE2 as text, is refused.
// Refused with INVALID_ARGUMENT naming the offset: what would need more than a finite automaton
// (backreferences, lookaround, word boundaries, anchors inside the pattern, possessive
// quantifiers), inline flags, counts above kMaxRepeat, nesting deeper than kMaxNesting, and text
// that is not valid UTF-8.
#ifndef KVRM_RUNTIME_STRUCTURED_REGEX_PARSER_H_
#define KVRM_RUNTIME_STRUCTURED_REGEX_PARSER_H_

#include <string_view>

#include "absl/status/statusor.h"
#include "runtime/structured/regex_ast.h"

namespace kvrm::structured {

inline constexpr int32_t kMaxRepeat = 1000;
inline constexpr int32_t kMaxNesting = 200;

absl::StatusOr<Regex> ParseRegex(std::string_view pattern);

}  // namespace kvrm::structured

#endif  // KVRM_RUNTIME_STRUCTURED_REGEX_PARSER_H_
