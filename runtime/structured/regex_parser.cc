#include "runtime/structured/regex_parser.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/tokenizer_text.h"

namespace kvrm::structured {
namespace {

bool IsDigit(uint32_t c) { return c >= '0' && c <= '9'; }
bool IsAlnum(uint32_t c) {
  return IsDigit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
int HexValue(uint32_t c) {
  if (c >= '0' && c <= '9') return static_cast<int>(c - '0');
  if (c >= 'a' && c <= 'f') return static_cast<int>(c - 'a' + 10);
  if (c >= 'A' && c <= 'F') return static_cast<int>(c - 'A' + 10);
  return -1;
}

CodePointSet Digits() { return CodePointSet::Range('0', '9'); }
CodePointSet WordChars() {
  CodePointSet s = Digits();
  s.Add('a', 'z');
  s.Add('A', 'Z');
  s.Add('_', '_');
  return s;
}
CodePointSet Spaces() {
  CodePointSet s;
  s.Add(' ', ' ');
  s.Add('\t', '\r');  // \t \n \v \f \r
  return s;
}

std::optional<CodePointSet> PosixClass(std::string_view name) {
  CodePointSet s;
  if (name == "alpha") {
    s.Add('a', 'z');
    s.Add('A', 'Z');
  } else if (name == "digit") {
    s = Digits();
  } else if (name == "alnum") {
    s = Digits();
    s.Add('a', 'z');
    s.Add('A', 'Z');
  } else if (name == "upper") {
    s.Add('A', 'Z');
  } else if (name == "lower") {
    s.Add('a', 'z');
  } else if (name == "space") {
    s = Spaces();
  } else if (name == "xdigit") {
    s = Digits();
    s.Add('a', 'f');
    s.Add('A', 'F');
  } else if (name == "word") {
    s = WordChars();
  } else if (name == "punct") {
    s.Add('!', '/');
    s.Add(':', '@');
    s.Add('[', '`');
    s.Add('{', '~');
  } else if (name == "blank") {
    s.Add(' ', ' ');
    s.Add('\t', '\t');
  } else if (name == "cntrl") {
    s.Add(0, 0x1F);
    s.Add(0x7F, 0x7F);
  } else if (name == "print") {
    s.Add(0x20, 0x7E);
  } else if (name == "graph") {
    s.Add(0x21, 0x7E);
  } else {
    return std::nullopt;
  }
  return s;
}

class Parser {
 public:
  explicit Parser(std::vector<uint32_t> chars) : s_(std::move(chars)) {}

  absl::StatusOr<Regex> ParseAll() {
    // ^ at the very start and $ at the very end only restate the full match.
    size_t end = s_.size();
    if (pos_ < end && s_[pos_] == '^') ++pos_;
    if (end > pos_ && s_[end - 1] == '$' && !EscapedAt(end - 1)) --end;
    end_ = end;
    auto r = ParseAlternation(0);
    if (!r.ok()) return r.status();
    if (pos_ < end_) {
      // Only an unmatched ')' stops the top-level alternation early.
      return Error("unmatched ')'");
    }
    return r;
  }

 private:
  // True when s_[i] is preceded by an odd number of backslashes.
  bool EscapedAt(size_t i) const {
    size_t n = 0;
    while (i > n && s_[i - n - 1] == '\\') ++n;
    return n % 2 == 1;
  }

  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("regex at offset ", pos_, ": ", what));
  }

  bool AtEnd() const { return pos_ >= end_; }
  uint32_t Peek(size_t ahead = 0) const { return pos_ + ahead < end_ ? s_[pos_ + ahead] : 0; }
  bool Has(size_t ahead) const { return pos_ + ahead < end_; }

  absl::StatusOr<Regex> ParseAlternation(int depth) {
    if (depth > kMaxNesting) return Error("groups nested too deep");
    std::vector<Regex> options;
    while (true) {
      auto part = ParseConcat(depth);
      if (!part.ok()) return part.status();
      options.push_back(*std::move(part));
      if (AtEnd() || Peek() != '|') break;
      ++pos_;
    }
    if (options.size() == 1) return options[0];
    return Alt(std::move(options));
  }

  absl::StatusOr<Regex> ParseConcat(int depth) {
    std::vector<Regex> parts;
    while (!AtEnd() && Peek() != '|' && Peek() != ')') {
      auto atom = ParseAtom(depth);
      if (!atom.ok()) return atom.status();
      auto repeated = ParseQuantifiers(*std::move(atom));
      if (!repeated.ok()) return repeated.status();
      parts.push_back(*std::move(repeated));
    }
    return Concat(std::move(parts));
  }

  // Reads {n}, {n,}, {n,m} at pos_ when it is one; nullopt (pos_ unchanged) when the "{" is a
  // literal.
  // "{,n}" at pos_: a quantifier in Python only.
  bool OmitsLowerBound() const {
    size_t p = pos_ + 1;
    if (p >= end_ || s_[p] != ',') return false;
    const size_t digits = ++p;
    while (p < end_ && IsDigit(s_[p])) ++p;
    return p > digits && p < end_ && s_[p] == '}';
  }

  std::optional<std::pair<int64_t, int64_t>> ReadBraces() {
    size_t p = pos_ + 1;
    auto number = [&](int64_t* out) {
      const size_t start = p;
      int64_t v = 0;
      while (p < end_ && IsDigit(s_[p])) {
        v = std::min<int64_t>(v * 10 + (s_[p] - '0'), int64_t{1} << 40);
        ++p;
      }
      *out = v;
      return p > start;
    };
    int64_t lo = 0, hi = 0;
    if (!number(&lo)) return std::nullopt;
    if (p < end_ && s_[p] == '}') {
      pos_ = p + 1;
      return std::make_pair(lo, lo);
    }
    if (p >= end_ || s_[p] != ',') return std::nullopt;
    ++p;
    if (p < end_ && s_[p] == '}') {
      pos_ = p + 1;
      return std::make_pair(lo, int64_t{-1});
    }
    if (!number(&hi) || p >= end_ || s_[p] != '}') return std::nullopt;
    pos_ = p + 1;
    return std::make_pair(lo, hi);
  }

  absl::StatusOr<Regex> ParseQuantifiers(Regex atom) {
    bool quantified = false;
    while (!AtEnd()) {
      const uint32_t c = Peek();
      int64_t lo = 0, hi = 0;
      const size_t at = pos_;
      if (c == '*') {
        lo = 0, hi = -1, ++pos_;
      } else if (c == '+') {
        lo = 1, hi = -1, ++pos_;
      } else if (c == '?') {
        lo = 0, hi = 1, ++pos_;
      } else if (c == '{') {
        if (OmitsLowerBound()) {
          return Error("{,n}: Python reads it as {0,n}, ECMAScript and RE2 as the text itself; "
                       "write {0,n}, or \\{ for the text");
        }
        auto braces = ReadBraces();
        if (!braces) break;  // a literal "{"
        lo = braces->first, hi = braces->second;
      } else {
        break;
      }
      if (quantified) {
        pos_ = at;
        return Error("multiple repeat (a quantifier right after another)");
      }
      quantified = true;
      if (lo > kMaxRepeat || hi > kMaxRepeat) {
        pos_ = at;
        return Error(absl::StrCat("repeat count above ", kMaxRepeat));
      }
      if (hi >= 0 && hi < lo) {
        pos_ = at;
        return Error(absl::StrCat("repeat {", lo, ",", hi, "}: the maximum is below the minimum"));
      }
      if (!AtEnd() && Peek() == '?') {
        ++pos_;  // lazy: same language
      } else if (!AtEnd() && Peek() == '+') {
        return Error("possessive quantifiers are not supported");
      }
      atom = Repeat(std::move(atom), static_cast<int32_t>(lo), static_cast<int32_t>(hi));
    }
    return atom;
  }

  absl::StatusOr<Regex> ParseAtom(int depth) {
    const uint32_t c = Peek();
    switch (c) {
      case '(':
        return ParseGroup(depth);
      case '[': {
        auto set = ParseClass();
        if (!set.ok()) return set.status();
        return Class(*std::move(set));
      }
      case '.': {
        ++pos_;
        return Class(CodePointSet::Single('\n').Complement());
      }
      case '*': case '+': case '?':
        return Error("nothing to repeat");
      case '{':
        if (ReadBraces()) return Error("nothing to repeat");
        ++pos_;
        return Literal("{");
      case '^': case '$':
        return Error("anchors are only supported at the start (^) and end ($) of the pattern");
      case '\\':
        return ParseEscapeAtom();
      default: {
        ++pos_;
        return Class(CodePointSet::Single(c));
      }
    }
  }

  absl::StatusOr<Regex> ParseGroup(int depth) {
    const size_t open = pos_;
    ++pos_;  // (
    if (!AtEnd() && Peek() == '?') {
      const uint32_t kind = Peek(1);
      if (kind == ':') {
        pos_ += 2;
      } else if (kind == 'P' && Peek(2) == '<') {
        pos_ += 3;
        RETURN_IF_ERROR(SkipGroupName());
      } else if (kind == '<' && Peek(2) != '=' && Peek(2) != '!') {
        pos_ += 2;
        RETURN_IF_ERROR(SkipGroupName());
      } else if (kind == '=' || kind == '!' || kind == '<') {
        pos_ = open;
        return Error("lookaround is not supported");
      } else {
        pos_ = open;
        return Error("inline flags and other (? groups are not supported");
      }
    }
    auto inner = ParseAlternation(depth + 1);
    if (!inner.ok()) return inner.status();
    if (AtEnd() || Peek() != ')') {
      pos_ = open;
      return Error("unclosed group '('");
    }
    ++pos_;
    return inner;
  }

  absl::Status SkipGroupName() {
    while (!AtEnd() && Peek() != '>') {
      if (!IsAlnum(Peek()) && Peek() != '_') return Error("bad character in group name");
      ++pos_;
    }
    if (AtEnd()) return Error("unterminated group name");
    ++pos_;
    return absl::OkStatus();
  }
  // After a backslash: a class escape (\d ...) or one code point. pos_ is at the backslash.
  struct Escape {
    std::optional<CodePointSet> set;  // \d \w \s and negations
    uint32_t code_point = 0;
  };

  absl::StatusOr<uint32_t> ReadHex(size_t min_digits, size_t max_digits, bool braced) {
    uint32_t v = 0;
    size_t n = 0;
    while (n < max_digits && !AtEnd() && HexValue(Peek()) >= 0) {
      v = v * 16 + static_cast<uint32_t>(HexValue(Peek()));
      if (v > kMaxCodePoint) return Error("code point above U+10FFFF");
      ++pos_, ++n;
    }
    if (n < min_digits) return Error("bad hexadecimal escape");
    if (braced) {
      if (AtEnd() || Peek() != '}') return Error("unterminated \\x{...} or \\u{...} escape");
      ++pos_;
    }
    return v;
  }

  absl::StatusOr<Escape> ParseEscape() {
    ++pos_;  // the backslash
    if (AtEnd()) return Error("trailing backslash");
    const uint32_t c = Peek();
    ++pos_;
    Escape e;
    switch (c) {
      case 'd': e.set = Digits(); return e;
      case 'D': e.set = Digits().Complement(); return e;
      case 'w': e.set = WordChars(); return e;
      case 'W': e.set = WordChars().Complement(); return e;
      case 's': e.set = Spaces(); return e;
      case 'S': e.set = Spaces().Complement(); return e;
      case 'n': e.code_point = '\n'; return e;
      case 't': e.code_point = '\t'; return e;
      case 'r': e.code_point = '\r'; return e;
      case 'f': e.code_point = '\f'; return e;
      case 'v': e.code_point = '\v'; return e;
      case 'a': e.code_point = 0x07; return e;
      case '0':
        if (!AtEnd() && IsDigit(Peek())) return Error("octal escapes are not supported");
        e.code_point = 0;
        return e;
      case 'x':
      case 'u': {
        const bool braced = !AtEnd() && Peek() == '{';
        if (braced) ++pos_;
        const size_t digits = c == 'x' ? 2 : 4;
        auto v = braced ? ReadHex(1, 6, true) : ReadHex(digits, digits, false);
        if (!v.ok()) return v.status();
        if (*v >= 0xD800 && *v <= 0xDFFF) return Error("surrogate code point in an escape");
        e.code_point = *v;
        return e;
      }
      case 'b': case 'B': case 'A': case 'z': case 'Z': case 'G':
        return Error("word boundaries and anchors are not supported");
      default:
        if (IsDigit(c)) return Error("backreferences are not supported");
        if (IsAlnum(c)) {
          return Error(absl::StrCat("unknown escape \\", std::string(1, static_cast<char>(c))));
        }
        e.code_point = c;  // \. \* \\ \- \/ ... and any non-ASCII character
        return e;
    }
  }

  absl::StatusOr<Regex> ParseEscapeAtom() {
    auto e = ParseEscape();
    if (!e.ok()) return e.status();
    if (e->set) return Class(*std::move(e->set));
    return Class(CodePointSet::Single(e->code_point));
  }

  absl::StatusOr<CodePointSet> ParseClass() {
    const size_t open = pos_;
    ++pos_;  // [
    bool negate = false;
    if (!AtEnd() && Peek() == '^') {
      negate = true;
      ++pos_;
    }
    CodePointSet set;
    bool first = true;
    while (true) {
      if (AtEnd()) {
        pos_ = open;
        return Error("unterminated character class '['");
      }
      uint32_t c = Peek();
      if (c == ']' && !first) {
        ++pos_;
        break;
      }
      first = false;
      if (c == '[' && Peek(1) == ':') {
        size_t p = pos_ + 2;
        std::string name;
        while (p < end_ && s_[p] >= 'a' && s_[p] <= 'z') name.push_back(static_cast<char>(s_[p++]));
        if (p + 1 < end_ && s_[p] == ':' && s_[p + 1] == ']') {
          auto posix = PosixClass(name);
          if (!posix) return Error(absl::StrCat("unknown POSIX class [:", name, ":]"));
          set.AddSet(*posix);
          pos_ = p + 2;
          continue;
        }
      }
      // One class item: a code point (maybe the start of a range) or a class escape.
      uint32_t lo = 0;
      if (c == '\\') {
        auto e = ParseEscape();
        if (!e.ok()) return e.status();
        if (e->set) {
          set.AddSet(*e->set);
          continue;
        }
        lo = e->code_point;
      } else {
        lo = c;
        ++pos_;
      }
      if (!AtEnd() && Peek() == '-' && Has(1) && Peek(1) != ']') {
        ++pos_;  // -
        uint32_t hi = 0;
        if (Peek() == '\\') {
          auto e = ParseEscape();
          if (!e.ok()) return e.status();
          if (e->set) return Error("a class escape cannot end a range");
          hi = e->code_point;
        } else {
          hi = Peek();
          ++pos_;
        }
        if (hi < lo) return Error("character range out of order");
        set.Add(lo, hi);
      } else {
        set.Add(lo, lo);
      }
    }
    return negate ? set.Complement() : set;
  }

  std::vector<uint32_t> s_;
  size_t pos_ = 0;
  size_t end_ = 0;
};

}  // namespace

absl::StatusOr<Regex> ParseRegex(std::string_view pattern) {
  // Strict (no overlong forms, surrogates or code points past U+10FFFF), so the decode below
  // only sees whole characters.
  if (!tok::IsValidUtf8(pattern)) return absl::InvalidArgumentError("regex: not valid UTF-8");
  std::vector<uint32_t> chars;
  chars.reserve(pattern.size());
  for (size_t i = 0; i < pattern.size();) chars.push_back(tok::NextCodePoint(pattern, &i));
  Parser parser(std::move(chars));
  return parser.ParseAll();
}

}  // namespace kvrm::structured
