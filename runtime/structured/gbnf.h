// GBNF grammar text -> regex_ast.h tree, for structured outputs' `grammar` constraint (vLLM's
// guided_grammar, llama.cpp's `grammar`).
//
// The syntax is llama.cpp's GBNF (grammars/README.md there), which xgrammar's EBNF (vLLM's
// default backend) also reads:
//   name ::= alternatives          one rule per definition; the grammar's text is `root`'s
//   a b                            sequence;  a | b  alternatives;  ( ... )  grouping
//   "text"  'text'                 literals (UTF-8; escapes \n \r \t \\ \" \' \[ \] \xHH
//                                  \uHHHH \UHHHHHHHH)
//   [a-z_]  [^"\\]                 one code point of a class, or of its complement
//   .                              any one code point
//   x*  x+  x?  x{m}  x{m,}  x{m,n}   repetition of the item before
//   # ...                          a comment to the end of the line
// Names are letters, digits, '-' and '_'. Whitespace and newlines may appear anywhere between
// items; a rule ends where the next `name ::=` begins (llama.cpp needs a rule's continuation
// lines inside parentheses or after '|'; every grammar it reads means the same here).
//
// Recursion: a finite automaton cannot follow unbounded nesting, so a rule that can reach
// itself (value -> object -> value) is unfolded: each such rule may be open at most
// `max_depth` times on one derivation; past that, the alternative that would open it again
// matches nothing (JSON Schema's recursive $refs unfold the same way, json_schema.h). Rules that
// cannot reach themselves are exact. Left recursion (expr ::= expr "+" term | term) unfolds like
// any other.
//
// Refused with INVALID_ARGUMENT naming the line and column: syntax errors, a rule defined twice,
// a reference to an undefined rule, no `root`, text that is not valid UTF-8, repetition counts
// above kMaxGbnfRepeat, and an unfolding larger than max_nodes.
#ifndef KVRM_RUNTIME_STRUCTURED_GBNF_H_
#define KVRM_RUNTIME_STRUCTURED_GBNF_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "runtime/structured/regex_ast.h"

namespace kvrm::structured {

inline constexpr int32_t kMaxGbnfRepeat = 2000;  // llama.cpp's MAX_REPETITION_THRESHOLD

struct GbnfOptions {
  // Times a rule that can reach itself may be open on one derivation path (at least 1).
  int32_t max_depth = 4;
  // Tree nodes the unfolding may build, about 160 bytes each (a grammar whose recursion fans
  // out widely is refused rather than built at any size; llama.cpp's JSON grammar at depth 4
  // builds between 200 and 500).
  int64_t max_nodes = 200000;
  // The start rule.
  std::string root = "root";
};

absl::StatusOr<Regex> GbnfToRegex(std::string_view grammar, const GbnfOptions& options = {});

}  // namespace kvrm::structured

#endif  // KVRM_RUNTIME_STRUCTURED_GBNF_H_
