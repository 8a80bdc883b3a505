#include "runtime/structured/regex_builders.h"

#include <utility>

namespace kvrm::structured {

CodePointSet SetOf(const char* chars) {
  CodePointSet s;
  for (const char* p = chars; *p != '\0'; ++p) {
    s.Add(static_cast<uint8_t>(*p), static_cast<uint8_t>(*p));
  }
  return s;
}
Regex Chars(const char* chars) { return Class(SetOf(chars)); }
Regex Range(uint32_t lo, uint32_t hi) { return Class(CodePointSet::Range(lo, hi)); }
Regex Digit() { return Range('0', '9'); }
CodePointSet HexSet() {
  CodePointSet s = CodePointSet::Range('0', '9');
  s.Add('a', 'f');
  s.Add('A', 'F');
  return s;
}
Regex HexDigit() { return Class(HexSet()); }
Regex Times(Regex r, int32_t n) { return Repeat(std::move(r), n, n); }

CodePointSet Intersect(const CodePointSet& a, const CodePointSet& b) {
  CodePointSet either = a.Complement();
  either.AddSet(b.Complement());
  return either.Complement();
}

bool SameSet(const CodePointSet& a, const CodePointSet& b) {
  if (a.ranges().size() != b.ranges().size()) return false;
  for (size_t i = 0; i < a.ranges().size(); ++i) {
    if (a.ranges()[i].lo != b.ranges()[i].lo || a.ranges()[i].hi != b.ranges()[i].hi) return false;
  }
  return true;
}

Regex ThinkingPrefix(bool inside) {
  // Text without "</think>": the automaton of the marker's prefixes, unrolled. '<' occurs only
  // at the marker's start, so after '<' and j more of its characters, another '<' goes back to
  // "after '<'" (A), a character that is neither the next one nor '<' back to the start (B), and
  // the text may end anywhere short of the whole marker (C).
  constexpr std::string_view kRest = "/think>";  // the marker after its '<'
  std::vector<Regex> again, leave, end;
  for (size_t j = 0; j < kRest.size(); ++j) {
    const Regex prefix = Literal(kRest.substr(0, j));
    CodePointSet next = CodePointSet::Single(static_cast<uint32_t>(kRest[j]));
    next.Add('<', '<');
    again.push_back(Concat({prefix, Literal("<")}));
    leave.push_back(Concat({prefix, Class(next.Complement())}));
    end.push_back(prefix);
  }
  const Regex open = Concat({Literal("<"), Star(Alt(std::move(again)))});
  const Regex thinking =
      Concat({Star(Alt({Class(CodePointSet::Single('<').Complement()),
                        Concat({open, Alt(std::move(leave))})})),
              Optional(Concat({open, Alt(std::move(end))}))});
  // At most 4 whitespace characters after the block (models write "\n\n"), and none before an
  // opening marker (models write it first): whitespace the constraint does not bound would let
  // a model pad forever.
  const Regex block = Concat({thinking, Literal("</think>"), Repeat(Chars(" \t\n\r"), 0, 4)});
  if (inside) return block;
  return Optional(Concat({Literal("<think>"), block}));
}

}  // namespace kvrm::structured
