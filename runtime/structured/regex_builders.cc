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

}  // namespace kvrm::structured
