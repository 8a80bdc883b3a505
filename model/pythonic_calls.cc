#include "model/pythonic_calls.h"

#include <cstdint>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/json.h"
#include "common/status_macros.h"

namespace kvrm::pythonic {
namespace {

constexpr int kMaxDepth = 64;

bool IsIdentStart(char c) { return absl::ascii_isalpha(c) || c == '_'; }
bool IsIdent(char c) { return absl::ascii_isalnum(c) || c == '_'; }

// Appends `c` to the content of a JSON string: '"' and '\\' escaped, control characters as
// \u00XX, the rest (UTF-8 bytes included: the JSON parse at the end refuses what is not UTF-8)
// as it is.
void AppendJsonChar(char c, std::string* out) {
  if (c == '"' || c == '\\') {
    out->push_back('\\');
    out->push_back(c);
  } else if (static_cast<unsigned char>(c) < 0x20) {
    absl::StrAppend(out, "\\u00", absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2));
  } else {
    out->push_back(c);
  }
}

// Appends code point `cp` as a JSON escape (a surrogate pair past the BMP; a lone surrogate
// stays one, which the JSON parse refuses); false past U+10FFFF.
bool AppendJsonCodePoint(uint32_t cp, std::string* out) {
  if (cp > 0x10ffff) return false;
  if (cp < 0x10000) {
    absl::StrAppend(out, "\\u", absl::Hex(cp, absl::kZeroPad4));
  } else {
    cp -= 0x10000;
    absl::StrAppend(out, "\\u", absl::Hex(0xd800 + (cp >> 10), absl::kZeroPad4), "\\u",
                    absl::Hex(0xdc00 + (cp & 0x3ff), absl::kZeroPad4));
  }
  return true;
}

class Parser {
 public:
  explicit Parser(std::string_view s) : s_(s) {}

  absl::StatusOr<std::vector<Call>> Calls() {
    Space();
    if (Rest().substr(0, kPythonStart.size()) == kPythonStart) i_ += kPythonStart.size();
    Space();
    if (!Eat('[')) return Error("expected '[' (a list of calls)");
    std::vector<Call> calls;
    Space();
    while (!Eat(']')) {
      if (!calls.empty()) {
        if (!Eat(',')) return Error("expected ',' or ']' after a call");
        Space();
        if (Eat(']')) break;  // a trailing comma
      }
      ASSIGN_OR_RETURN(Call call, OneCall());
      calls.push_back(std::move(call));
      Space();
    }
    Space();
    if (Rest().substr(0, kPythonEnd.size()) == kPythonEnd) i_ += kPythonEnd.size();
    Space();
    if (i_ != s_.size()) return Error("text after the list of calls");
    return calls;
  }

 private:
  std::string_view Rest() const { return s_.substr(i_); }
  bool AtEnd() const { return i_ >= s_.size(); }
  char Peek(size_t ahead = 0) const { return i_ + ahead < s_.size() ? s_[i_ + ahead] : '\0'; }
  bool Eat(char c) {
    if (Peek() != c || AtEnd()) return false;
    ++i_;
    return true;
  }
  void Space() {
    while (!AtEnd() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  absl::Status Error(std::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("pythonic tool calls: ", std::string(what), " at byte ", i_));
  }

  std::string_view Ident() {
    const size_t start = i_;
    if (AtEnd() || !IsIdentStart(s_[i_])) return {};
    while (!AtEnd() && IsIdent(s_[i_])) ++i_;
    return s_.substr(start, i_ - start);
  }

  absl::StatusOr<Call> OneCall() {
    Call call;
    call.name = std::string(Ident());
    if (call.name.empty()) return Error("expected a function name");
    Space();
    if (!Eat('(')) return Error(absl::StrCat("expected '(' after ", call.name));
    std::string args = "{";
    std::vector<std::string> keys;
    Space();
    while (!Eat(')')) {
      if (!keys.empty()) {
        if (!Eat(',')) return Error("expected ',' or ')' after an argument");
        Space();
        if (Eat(')')) break;
      }
      const std::string key(Ident());
      Space();
      if (key.empty() || !Eat('=')) {
        return Error(absl::StrCat(call.name, ": expected a keyword argument (name=value)"));
      }
      for (const std::string& k : keys) {
        if (k == key) return Error(absl::StrCat(call.name, ": argument ", key, " repeated"));
      }
      Space();
      if (!keys.empty()) args.push_back(',');
      absl::StrAppend(&args, "\"", key, "\":");  // (an identifier: nothing to escape)
      RETURN_IF_ERROR(Value(0, &args));
      keys.push_back(key);
      Space();
    }
    args.push_back('}');
    // Through the JSON parser: the text is well-formed JSON (strings valid UTF-8) and comes out
    // compact as every format's arguments do.
    ASSIGN_OR_RETURN(const OrderedJson j, ParseOrderedJson(args, "pythonic tool call arguments"));
    call.arguments = j.dump();
    return call;
  }

  // One literal, as JSON text appended to `out`.
  absl::Status Value(int depth, std::string* out) {
    if (depth > kMaxDepth) return Error("literals nested too deeply");
    const char c = Peek();
    if (c == '[') return Sequence(']', depth, out);
    if (c == '(') return Sequence(')', depth, out);
    if (c == '{') return Dict(depth, out);
    if (c == '"' || c == '\'' ||
        ((c == 'r' || c == 'R' || c == 'u' || c == 'U') && (Peek(1) == '"' || Peek(1) == '\''))) {
      out->push_back('"');
      RETURN_IF_ERROR(Strings(out));
      out->push_back('"');
      return absl::OkStatus();
    }
    if (absl::ascii_isdigit(c) || c == '.' || c == '-' || c == '+') return Number(out);
    const size_t at = i_;
    const std::string_view word = Ident();
    if (word == "True") return out->append("true"), absl::OkStatus();
    if (word == "False") return out->append("false"), absl::OkStatus();
    if (word == "None") return out->append("null"), absl::OkStatus();
    i_ = at;
    return Error(word.empty() ? std::string("expected a literal")
                              : absl::StrCat("'", std::string(word), "' is not a literal"));
  }

  // A list or tuple (as a JSON array); "(x)" is x itself, as in Python.
  absl::Status Sequence(char close, int depth, std::string* out) {
    ++i_;
    std::string items = "[";
    int count = 0;
    Space();
    while (!Eat(close)) {
      if (count > 0) {
        if (!Eat(',')) return Error(absl::StrCat("expected ',' or '", std::string(1, close), "'"));
        Space();
        if (Eat(close)) break;
      }
      if (count > 0) items.push_back(',');
      const size_t before = items.size();
      RETURN_IF_ERROR(Value(depth + 1, &items));
      if (close == ')' && count == 0 && Peek() != ',') {
        // Possibly "(x)": a parenthesized value when it closes here.
        Space();
        if (Eat(')')) {
          out->append(items.substr(before));
          return absl::OkStatus();
        }
      }
      ++count;
      Space();
    }
    items.push_back(']');
    out->append(items);
    return absl::OkStatus();
  }

  absl::Status Dict(int depth, std::string* out) {
    ++i_;
    out->push_back('{');
    bool first = true;
    Space();
    while (!Eat('}')) {
      if (!first) {
        if (!Eat(',')) return Error("expected ',' or '}' in a dict");
        Space();
        if (Eat('}')) break;
      }
      // The key as json.dumps writes it: strings as they are, numbers, True / False / None as
      // their JSON text.
      std::string key;
      RETURN_IF_ERROR(Value(depth + 1, &key));
      if (key.empty() || key[0] == '[' || key[0] == '{')
        return Error("a dict key must be a scalar");
      if (key[0] != '"') key = absl::StrCat("\"", key, "\"");  // number / true / false / null
      Space();
      if (!Eat(':')) {
        return Error(first ? "expected ':' in a dict (sets are not JSON)"
                           : "expected ':' in a dict");
      }
      Space();
      if (!first) out->push_back(',');
      out->append(key);
      out->push_back(':');
      RETURN_IF_ERROR(Value(depth + 1, out));
      first = false;
      Space();
    }
    out->push_back('}');
    return absl::OkStatus();
  }

  // One or more adjacent string literals, joined (Python's implicit concatenation).
  absl::Status Strings(std::string* text) {
    do {
      RETURN_IF_ERROR(OneString(text));
      Space();
    } while (Peek() == '"' || Peek() == '\'' ||
             ((Peek() == 'r' || Peek() == 'R' || Peek() == 'u' || Peek() == 'U') &&
              (Peek(1) == '"' || Peek(1) == '\'')));
    return absl::OkStatus();
  }

  absl::Status OneString(std::string* text) {
    bool raw = false;
    if (Peek() == 'r' || Peek() == 'R') raw = true, ++i_;
    if (Peek() == 'u' || Peek() == 'U') ++i_;
    const char q = Peek();
    const bool triple = Peek(1) == q && Peek(2) == q;
    i_ += triple ? 3 : 1;
    for (;;) {
      if (AtEnd()) return Error("unterminated string");
      const char c = s_[i_];
      if (c == q && (!triple || (Peek(1) == q && Peek(2) == q))) {
        i_ += triple ? 3 : 1;
        return absl::OkStatus();
      }
      if (c == '\n' && !triple) return Error("newline in a string");
      if (c != '\\') {
        AppendJsonChar(c, text);
        ++i_;
        continue;
      }
      if (raw) {  // the backslash stays, and shields the next character from ending the string
        AppendJsonChar('\\', text);
        ++i_;
        if (!AtEnd()) AppendJsonChar(s_[i_++], text);
        continue;
      }
      ++i_;
      if (AtEnd()) return Error("unterminated string");
      const char e = s_[i_++];
      // Python's escapes: the character they stand for.
      constexpr std::string_view kSimple = "\\\\''\"\"a\ab\bf\fn\nr\rt\tv\v";
      if (e == '\n') continue;  // a line continuation
      if (const size_t at = kSimple.find(e); at != std::string_view::npos && at % 2 == 0) {
        AppendJsonChar(kSimple[at + 1], text);
        continue;
      }
      if (e == 'x' || e == 'u' || e == 'U') {
        const int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        uint32_t cp = 0;
        for (int d = 0; d < digits; ++d) {
          const char h = Peek();
          if (!absl::ascii_isxdigit(h)) return Error("bad escape in a string");
          cp = cp * 16 + (absl::ascii_isdigit(h) ? h - '0' : (absl::ascii_tolower(h) - 'a' + 10));
          ++i_;
        }
        if (!AppendJsonCodePoint(cp, text)) return Error("escape is not a character");
      } else if (e >= '0' && e <= '7') {  // octal, up to three digits
        uint32_t cp = e - '0';
        for (int d = 0; d < 2 && Peek() >= '0' && Peek() <= '7'; ++d) {
          cp = cp * 8 + (s_[i_++] - '0');
        }
        AppendJsonCodePoint(cp, text);
      } else if (e == 'N') {
        return Error("\\N{...} escapes (Unicode names) are not supported");
      } else {  // an unknown escape keeps its backslash, as Python does
        AppendJsonChar('\\', text);
        AppendJsonChar(e, text);
      }
    }
  }

  // An int or float, with an optional sign, as JSON number text.
  absl::Status Number(std::string* out) {
    bool negative = false;
    if (Peek() == '-' || Peek() == '+') {  // one sign (literal_eval refuses "--5")
      negative = Peek() == '-';
      ++i_;
      Space();
    }
    auto run = [&](auto is_digit) {
      std::string got;
      while (!AtEnd() &&
             (is_digit(s_[i_]) || (s_[i_] == '_' && !got.empty() && is_digit(Peek(1))))) {
        if (s_[i_] != '_') got.push_back(s_[i_]);
        ++i_;
      }
      return got;
    };
    const auto dec = [](char c) { return absl::ascii_isdigit(c); };
    if (Peek() == '0' && (Peek(1) == 'x' || Peek(1) == 'X' || Peek(1) == 'o' || Peek(1) == 'O' ||
                          Peek(1) == 'b' || Peek(1) == 'B')) {
      const int base = absl::ascii_tolower(Peek(1)) == 'x'   ? 16
                       : absl::ascii_tolower(Peek(1)) == 'o' ? 8
                                                             : 2;
      i_ += 2;
      if (Peek() == '_') ++i_;
      const std::string text = run([base](char c) {
        return base == 16 ? absl::ascii_isxdigit(c) : c >= '0' && c < '0' + base;
      });
      if (text.empty()) return Error("bad number");
      uint64_t v = 0;
      for (const char c : text) {
        const uint64_t d = absl::ascii_isdigit(c) ? c - '0' : absl::ascii_tolower(c) - 'a' + 10;
        if (v > (UINT64_MAX - d) / base) return Error("integer too large");
        v = v * base + d;
      }
      absl::StrAppend(out, negative ? "-" : "", v);
      return absl::OkStatus();
    }
    std::string whole = run(dec), frac, exp;
    bool is_float = false;
    if (Peek() == '.') {
      ++i_;
      is_float = true;
      frac = run(dec);
    }
    if (whole.empty() && frac.empty()) return Error("bad number");
    if (Peek() == 'e' || Peek() == 'E') {
      ++i_;
      is_float = true;
      std::string sign;
      if (Peek() == '+' || Peek() == '-') sign = std::string(1, s_[i_++]);
      exp = run(dec);
      if (exp.empty()) return Error("bad exponent");
      exp = "e" + sign + exp;
    }
    if (Peek() == 'j' || Peek() == 'J' || IsIdent(Peek())) return Error("bad number");
    // Leading zeros go (Python allows "00" and "0.5" and "00.5"; JSON only one).
    size_t nz = 0;
    while (nz + 1 < whole.size() && whole[nz] == '0') ++nz;
    whole = whole.empty() ? "0" : whole.substr(nz);
    if (!is_float && whole != "0" && nz > 0) return Error("leading zeros in an integer");
    absl::StrAppend(out, negative ? "-" : "", whole);
    if (is_float) absl::StrAppend(out, ".", frac.empty() ? "0" : frac, exp);
    return absl::OkStatus();
  }

  std::string_view s_;
  size_t i_ = 0;
};

}  // namespace

Begins BeginsCalls(std::string_view lead) {
  size_t i = 0;
  const auto space = [&] {
    while (i < lead.size() && absl::ascii_isspace(static_cast<unsigned char>(lead[i]))) ++i;
  };
  if (lead.empty()) return Begins::kUndecided;
  if (lead[0] != '[') return Begins::kNo;
  ++i;
  space();
  if (i == lead.size()) return Begins::kUndecided;
  if (!IsIdentStart(lead[i])) return Begins::kNo;
  while (i < lead.size() && IsIdent(lead[i])) ++i;
  space();
  if (i == lead.size()) return Begins::kUndecided;
  return lead[i] == '(' ? Begins::kYes : Begins::kNo;
}

absl::StatusOr<std::vector<Call>> ParseCalls(std::string_view text) { return Parser(text).Calls(); }

}  // namespace kvrm::pythonic
