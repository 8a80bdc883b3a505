// Tool calls written in Python syntax (vLLM's "pythonic" and "llama4_pythonic" parsers): a Python
// list of calls with keyword arguments whose values are literals,
//
//   [get_weather(city="Lima", days=3), get_time(zone='UTC')]
//
// as Llama 3.2's pythonic chat template and Llama 4 teach (Llama 4 may wrap the list in
// <|python_start|> ... <|python_end|>). Values: strings ('...', "...", triple-quoted, r-prefixed,
// with Python's escapes; adjacent ones joined), integers (decimal, 0x / 0o / 0b, underscores),
// floats, True / False / None, lists, tuples and dicts of these; they become JSON (tuples as
// arrays, dict keys as json.dumps writes them). Anything else (a positional argument, a name,
// an expression, a set, bytes, f-strings) is an error, as Python's ast would not read it as a
// literal. Internal to //model:tool_calls.
#ifndef KVRM_MODEL_PYTHONIC_CALLS_H_
#define KVRM_MODEL_PYTHONIC_CALLS_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kvrm::pythonic {

inline constexpr std::string_view kPythonStart = "<|python_start|>";
inline constexpr std::string_view kPythonEnd = "<|python_end|>";

struct Call {
  std::string name;
  std::string arguments;  // a JSON object, compact, keys in the order written
};

// Whether a reply that begins with `lead` (its leading whitespace dropped) begins a list of
// calls, "[" then a name then "(" (spaces allowed between): kYes, kNo (a "[1]" citation, a
// markdown link), or kUndecided while `lead` is a prefix of that.
enum class Begins { kYes, kNo, kUndecided };
Begins BeginsCalls(std::string_view lead);

// The calls of `text`: optional whitespace and <|python_start|>, the list, optional
// <|python_end|> and whitespace, nothing else. INVALID_ARGUMENT naming the first problem and
// its byte offset otherwise. Bounded: nesting deeper than 64 is refused.
absl::StatusOr<std::vector<Call>> ParseCalls(std::string_view text);

}  // namespace kvrm::pythonic

#endif  // KVRM_MODEL_PYTHONIC_CALLS_H_
