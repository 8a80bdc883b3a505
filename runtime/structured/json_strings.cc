#include "runtime/structured/json_strings.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/tokenizer_text.h"
#include "runtime/structured/regex_builders.h"

namespace kvrm::structured {
namespace {

Regex L(const char* text) { return Literal(text); }

// Characters a JSON string holds as themselves: all but ", \ and U+0000-U+001F.
CodePointSet UnescapedSet() {
  CodePointSet s;
  s.Add(0x20, 0x21);
  s.Add(0x23, 0x5B);
  s.Add(0x5D, kMaxCodePoint);
  return s;
}

// A character as it stands inside a JSON string, escaped the one way nlohmann writes it.
void AppendJsonChar(uint32_t c, std::string* out) {
  switch (c) {
    case '"':
      *out += "\\\"";
      return;
    case '\\':
      *out += "\\\\";
      return;
    case '\b':
      *out += "\\b";
      return;
    case '\f':
      *out += "\\f";
      return;
    case '\n':
      *out += "\\n";
      return;
    case '\r':
      *out += "\\r";
      return;
    case '\t':
      *out += "\\t";
      return;
    default:
      break;
  }
  if (c < 0x20) {
    static constexpr char kHex[] = "0123456789abcdef";
    *out += "\\u00";
    out->push_back(kHex[c >> 4]);
    out->push_back(kHex[c & 0xF]);
    return;
  }
  tok::AppendUtf8(c, out);
}

// One character of a pattern's class, as JSON string content: those a string holds as themselves
// as a class, each of the others as its canonical escape.
Regex ClassContent(const CodePointSet& pattern_set) {
  CodePointSet set = pattern_set;
  // ParseRegex reads "." as anything but \n; in ECMAScript (JSON Schema's dialect) it also
  // excludes \r, U+2028 and U+2029. Narrowing keeps every generated string a match.
  if (SameSet(set, CodePointSet::Single('\n').Complement())) {
    CodePointSet line_ends = SetOf("\n\r");
    line_ends.Add(0x2028, 0x2029);
    set = line_ends.Complement();
  }
  std::vector<Regex> options = {Class(Intersect(set, UnescapedSet()))};
  for (uint32_t c = 0; c <= 0x5C; ++c) {
    if ((c < 0x20 || c == '"' || c == '\\') && set.Contains(c)) {
      std::string escape;
      AppendJsonChar(c, &escape);
      options.push_back(Literal(escape));
    }
  }
  return Alt(std::move(options));
}

}  // namespace

// Lone surrogates are grammatical JSON but not text; parsers (nlohmann's too) reject them.
Regex JsonStringChar() {
  static const Regex* const kChar = new Regex([] {
    const Regex hex = HexDigit();
    CodePointSet not_d = HexSet();
    not_d = Intersect(not_d, SetOf("dD").Complement());
    const Regex bmp = Alt(
        {Concat({Class(not_d), hex, hex, hex}), Concat({Chars("dD"), Range('0', '7'), hex, hex})});
    const Regex high = Concat({Chars("dD"), Chars("89abAB"), hex, hex});
    const Regex low = Concat({Chars("dD"), Chars("cdefCDEF"), hex, hex});
    return Alt({Class(UnescapedSet()), Concat({L("\\"), Chars("\"\\/bfnrt")}),
                Concat({L("\\u"), bmp}), Concat({L("\\u"), high, L("\\u"), low})});
  }());
  return *kChar;
}

Regex JsonString() {
  static const Regex* const kString = new Regex(Quote(Star(JsonStringChar())));
  return *kString;
}

Regex Quote(Regex content) { return Concat({L("\""), std::move(content), L("\"")}); }

Regex PatternContent(const Regex& r) {
  switch (r->kind) {
    case RegexNode::Kind::kNothing:
    case RegexNode::Kind::kEmpty:
      return r;
    case RegexNode::Kind::kLiteral: {
      std::string out;
      for (size_t i = 0; i < r->text.size();) AppendJsonChar(tok::NextCodePoint(r->text, &i), &out);
      return Literal(out);
    }
    case RegexNode::Kind::kClass:
      return ClassContent(r->set);
    case RegexNode::Kind::kConcat:
    case RegexNode::Kind::kAlt: {
      std::vector<Regex> children;
      children.reserve(r->children.size());
      for (const Regex& child : r->children) children.push_back(PatternContent(child));
      return r->kind == RegexNode::Kind::kConcat ? Concat(std::move(children))
                                                 : Alt(std::move(children));
    }
    case RegexNode::Kind::kRepeat:
      return Repeat(PatternContent(r->children[0]), r->min, r->max);
  }
  return Nothing();
}

}  // namespace kvrm::structured
