#include "runtime/structured/regex_builders.h"

#include <string>
#include <string_view>
#include <utility>

#include "common/logging.h"
#include "model/harmony.h"

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

Regex TextWithout(std::string_view marker) {
  // The automaton of the marker's prefixes, unrolled. Its first character c occurs only at its
  // start, so after c and j more of its characters, another c goes back to "after c" (A), a
  // character that is neither the next one nor c back to the start (B), and the text may end
  // anywhere short of the whole marker (C).
  CHECK(!marker.empty() && marker.find(marker[0], 1) == std::string_view::npos &&
        static_cast<unsigned char>(marker[0]) < 0x80)
      << marker;
  const uint32_t c = static_cast<unsigned char>(marker[0]);
  const std::string_view rest = marker.substr(1);
  std::vector<Regex> again, leave, end;
  for (size_t j = 0; j < rest.size(); ++j) {
    const Regex prefix = Literal(rest.substr(0, j));
    CodePointSet next = CodePointSet::Single(static_cast<unsigned char>(rest[j]));
    next.Add(c, c);
    again.push_back(Concat({prefix, Literal(marker.substr(0, 1))}));
    leave.push_back(Concat({prefix, Class(next.Complement())}));
    end.push_back(prefix);
  }
  const Regex open = Concat({Literal(marker.substr(0, 1)), Star(Alt(std::move(again)))});
  return Concat({Star(Alt({Class(CodePointSet::Single(c).Complement()),
                           Concat({open, Alt(std::move(leave))})})),
                 Optional(Concat({open, Alt(std::move(end))}))});
}

Regex ThinkingPrefix(bool inside) {
  // At most 4 whitespace characters after the block (models write "\n\n"), and none before an
  // opening marker (models write it first): whitespace the constraint does not bound would let
  // a model pad forever.
  const Regex block =
      Concat({TextWithout("</think>"), Literal("</think>"), Repeat(Chars(" \t\n\r"), 0, 4)});
  if (inside) return block;
  return Optional(Concat({Literal("<think>"), block}));
}

Regex HarmonyMessages() {
  const Regex message =
      Concat({Literal(kHarmonyChannel), Alt({Literal("analysis"), Literal("commentary")}),
              Literal(kHarmonyMessage), TextWithout(kHarmonyEnd),
              Literal(HarmonyText({kHarmonyEnd, kHarmonyStart, "assistant"}))});
  return Star(message);
}

Regex HarmonyPrefix() {
  return Concat(
      {HarmonyMessages(), Literal(HarmonyText({kHarmonyChannel, "final", kHarmonyMessage}))});
}

std::string HarmonyCallHeader(std::string_view function) {
  return HarmonyText({kHarmonyChannel, "commentary to=functions.", function, " ", kHarmonyConstrain,
                      "json", kHarmonyMessage});
}

}  // namespace kvrm::structured
