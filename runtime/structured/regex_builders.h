// Shorthands over regex_ast.h's builders for hand-written grammars (the JSON grammars of
// json_strings.h, json_number_ranges.h and json_string_formats.h): classes from lists of ASCII
// characters, digits, fixed repeats, and the set algebra CodePointSet leaves out.
//
// Pure functions of their arguments; every result is an ordinary regex_ast.h tree.
#ifndef KVRM_RUNTIME_STRUCTURED_REGEX_BUILDERS_H_
#define KVRM_RUNTIME_STRUCTURED_REGEX_BUILDERS_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "runtime/structured/regex_ast.h"

namespace kvrm::structured {

// The set of the (ASCII) characters of `chars`, and the class of one of them.
CodePointSet SetOf(const char* chars);
Regex Chars(const char* chars);
// One character in [lo, hi].
Regex Range(uint32_t lo, uint32_t hi);
// [0-9], and [0-9a-fA-F] as a set and a class.
Regex Digit();
CodePointSet HexSet();
Regex HexDigit();
// `r` exactly n times.
Regex Times(Regex r, int32_t n);

// A thinking model's <think> block ahead of a constraint (kvrmd's reasoning output): any text
// that does not contain "</think>", then "</think>" and at most 4 whitespace characters, for a
// reply that starts inside the block (`inside`); for one that may open it, optionally: "<think>"
// then the same. Concatenated before the constraint, it leaves the thinking free and holds the
// answer after it.
Regex ThinkingPrefix(bool inside);
// A gpt-oss reply's harmony messages ahead of a constraint (its generation prompt ends
// "<|start|>assistant"): HarmonyMessages, any number of messages on the analysis or commentary
// channel ("<|channel|>" NAME "<|message|>", text without "<|end|>", "<|end|><|start|>assistant"),
// then the final channel's header, "<|channel|>final<|message|>". Concatenated before the
// constraint, it leaves the analysis free and holds the final answer.
Regex HarmonyMessages();
Regex HarmonyPrefix();
// The header of gpt-oss's call to `function`, before its JSON arguments:
// "<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>".
std::string HarmonyCallHeader(std::string_view function);
// Any text that does not contain `marker`, whose first character (ASCII) occurs nowhere else in
// it ("</think>", "<|end|>").
Regex TextWithout(std::string_view marker);

// a ∩ b, and whether a and b hold the same code points.
CodePointSet Intersect(const CodePointSet& a, const CodePointSet& b);
bool SameSet(const CodePointSet& a, const CodePointSet& b);

}  // namespace kvrm::structured

#endif  // KVRM_RUNTIME_STRUCTURED_REGEX_BUILDERS_H_
