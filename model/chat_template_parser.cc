#include "model/chat_template_parser.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "common/status_macros.h"
#include "model/chat_template.h"
#include "model/tokenizer_text.h"

namespace kvrm::jinja {
namespace {

constexpr std::string_view kFilters[] = {
    "abs",     "capitalize", "count",     "d",      "default", "dictsort",   "e",      "escape",
    "first",   "float",      "from_json", "indent", "int",     "items",      "join",   "last",
    "length",  "list",       "lower",     "map",    "max",     "min",        "reject", "rejectattr",
    "replace", "reverse",    "round",     "safe",   "select",  "selectattr", "sort",   "string",
    "title",   "tojson",     "trim",      "unique", "upper"};
constexpr std::string_view kTests[] = {
    "defined",  "undefined", "none",    "string",      "mapping",     "iterable",
    "sequence", "number",    "integer", "float",       "boolean",     "true",
    "false",    "callable",  "equalto", "eq",          "sameas",      "ne",
    "lt",       "lessthan",  "le",      "gt",          "greaterthan", "ge",
    "in",       "odd",       "even",    "divisibleby", "lower",       "upper"};

std::string JoinTags(const std::vector<std::string_view>& tags) {
  std::string out;
  for (std::string_view t : tags) out += Cat(out.empty() ? "" : "' or '", t);
  return out;
}

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || IsDigit(c); }

// A \u escape's code point as UTF-8; a lone surrogate or one past U+10FFFF becomes U+FFFD.
void AppendEscapedCodePoint(uint32_t cp, std::string* out) {
  if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) cp = 0xFFFD;
  tok::AppendUtf8(cp, out);
}

// ---- lexer ------------------------------------------------------------------------------------

enum class Tok {
  kData,
  kVarBegin,
  kVarEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kString,
  kInt,
  kFloat,
  kOp,
  kEof
};

struct Token {
  Tok type = Tok::kEof;
  std::string text;  // data, name, string value, operator
  int64_t int_value = 0;
  double float_value = 0;
  size_t offset = 0;  // in the (newline-normalized) source
};

class SourceMap {
 public:
  explicit SourceMap(std::string_view src) {
    starts_.push_back(0);
    for (size_t i = 0; i < src.size(); ++i) {
      if (src[i] == '\n') starts_.push_back(i + 1);
    }
  }
  int Line(size_t offset) const {
    return static_cast<int>(std::upper_bound(starts_.begin(), starts_.end(), offset) -
                            starts_.begin());
  }
  int Col(size_t offset) const { return static_cast<int>(offset - starts_[Line(offset) - 1]) + 1; }

 private:
  std::vector<size_t> starts_;
};

absl::Status SyntaxError(const SourceMap& map, size_t offset, std::string_view msg) {
  return absl::InvalidArgumentError(
      Cat(kErrorPrefix, "line ", map.Line(offset), " col ", map.Col(offset), ": ", msg));
}

class Lexer {
 public:
  Lexer(std::string_view src, const SourceMap& map) : src_(src), map_(map) {}

  absl::StatusOr<std::vector<Token>> Run() {
    const size_t n = src_.size();
    size_t pos = 0;
    while (pos < n) {
      size_t start = pos;
      while (true) {
        start = src_.find('{', start);
        if (start == std::string_view::npos || start + 1 >= n) {
          start = std::string_view::npos;
          break;
        }
        const char c = src_[start + 1];
        if (c == '{' || c == '%' || c == '#') break;
        ++start;
      }
      if (start == std::string_view::npos) {
        Emit(Tok::kData, src_.substr(pos), pos);
        break;
      }
      const bool line_starting = pos == 0 || src_[pos - 1] == '\n';
      std::string_view text = src_.substr(pos, start - pos);
      const char kind = src_[start + 1];
      size_t p = start + 2;
      const char mod = p < n ? src_[p] : '\0';
      if (mod == '-' || (mod == '+' && kind != '{')) ++p;
      if (mod == '-') {
        while (!text.empty() && IsSpace(text.back())) text.remove_suffix(1);
      } else if (kind != '{' && mod != '+') {
        // lstrip_blocks: spaces and tabs from the start of the line up to a block or comment.
        const size_t nl = text.rfind('\n');
        const size_t line_start = nl == std::string_view::npos ? 0 : nl + 1;
        if ((line_start > 0 || line_starting) &&
            text.find_first_not_of(" \t", line_start) == std::string_view::npos) {
          text = text.substr(0, line_start);
        }
      }
      if (!text.empty()) Emit(Tok::kData, text, pos);
      if (kind == '#') {
        const size_t end = src_.find("#}", p);
        if (end == std::string_view::npos) return Error(start, "unclosed comment");
        const char before = end > p ? src_[end - 1] : '\0';
        pos = end + 2;
        if (before == '-') {
          while (pos < n && IsSpace(src_[pos])) ++pos;
        } else if (before != '+' && pos < n && src_[pos] == '\n') {
          ++pos;  // trim_blocks
        }
        continue;
      }
      RETURN_IF_ERROR(LexTag(kind, start, p, &pos));
    }
    Token eof;
    eof.offset = n;
    tokens_.push_back(eof);
    return std::move(tokens_);
  }

 private:
  void Emit(Tok type, std::string_view text, size_t offset) {
    Token t;
    t.type = type;
    t.text = std::string(text);
    t.offset = offset;
    tokens_.push_back(std::move(t));
  }
  absl::Status Error(size_t offset, std::string_view msg) const {
    return SyntaxError(map_, offset, msg);
  }
  bool At(size_t p, std::string_view s) const { return src_.substr(p, s.size()) == s; }
  void SkipSpace(size_t* p) const {
    while (*p < src_.size() && IsSpace(src_[*p])) ++*p;
  }

  // Tokens of a {{ }} or {% %} tag from `p` (after the opener); *pos gets the offset after it.
  absl::Status LexTag(char kind, size_t start, size_t p, size_t* pos) {
    const size_t n = src_.size();
    const size_t first = tokens_.size();
    Emit(kind == '{' ? Tok::kVarBegin : Tok::kBlockBegin, "", start);
    std::string balance;
    while (true) {
      SkipSpace(&p);
      if (p >= n) return Error(start, kind == '{' ? "unclosed '{{'" : "unclosed '{%'");
      if (balance.empty()) {
        if (kind == '%') {
          const bool strip = At(p, "-%}"), plus = At(p, "+%}");
          if (strip || plus || At(p, "%}")) {
            Emit(Tok::kBlockEnd, "", p);
            p += (strip || plus) ? 3 : 2;
            if (strip) {
              SkipSpace(&p);
            } else if (!plus && p < n && src_[p] == '\n') {
              ++p;  // trim_blocks
            }
            break;
          }
        } else {
          const bool strip = At(p, "-}}");
          if (strip || At(p, "}}")) {
            Emit(Tok::kVarEnd, "", p);
            p += strip ? 3 : 2;
            if (strip) SkipSpace(&p);
            break;
          }
        }
      }
      const char c = src_[p];
      if (IsNameStart(c)) {
        const size_t b = p;
        while (p < n && IsNameChar(src_[p])) ++p;
        Emit(Tok::kName, src_.substr(b, p - b), b);
        continue;
      }
      if (IsDigit(c)) {
        RETURN_IF_ERROR(LexNumber(&p));
        continue;
      }
      if (c == '\'' || c == '"') {
        RETURN_IF_ERROR(LexString(&p));
        continue;
      }
      static constexpr std::string_view kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
      bool two = false;
      for (std::string_view op : kTwo) {
        if (At(p, op)) {
          Emit(Tok::kOp, op, p);
          p += 2;
          two = true;
          break;
        }
      }
      if (two) continue;
      if (c != '\0' && std::strchr("+-*/%~<>=()[]{},.:|", c) != nullptr) {
        if (c == '(' || c == '[' || c == '{') {
          if (balance.size() >= static_cast<size_t>(ChatTemplate::kMaxParseDepth)) {
            return Error(p, "brackets nested too deep");
          }
          balance.push_back(c);
        } else if (c == ')' || c == ']' || c == '}') {
          const char open = c == ')' ? '(' : (c == ']' ? '[' : '{');
          if (balance.empty() || balance.back() != open) {
            return Error(p, Cat("unexpected '", std::string(1, c), "'"));
          }
          balance.pop_back();
        }
        Emit(Tok::kOp, src_.substr(p, 1), p);
        ++p;
        continue;
      }
      return Error(p, Cat("unexpected character '", absl::CHexEscape(std::string(1, c)), "'"));
    }
    *pos = p;
    if (kind == '%' && tokens_.size() == first + 3 && tokens_[first + 1].type == Tok::kName &&
        tokens_[first + 1].text == "raw") {
      tokens_.resize(first);
      return LexRaw(start, pos);
    }
    return absl::OkStatus();
  }

  // {% raw %}...{% endraw %}: the text between is literal.
  absl::Status LexRaw(size_t start, size_t* pos) {
    const size_t n = src_.size();
    for (size_t p = *pos;;) {
      const size_t hit = src_.find("{%", p);
      if (hit == std::string_view::npos) return Error(start, "missing '{% endraw %}'");
      p = hit + 2;
      size_t q = p;
      const bool strip_before = q < n && src_[q] == '-';
      if (strip_before || (q < n && src_[q] == '+')) ++q;
      SkipSpace(&q);
      if (!At(q, "endraw")) continue;
      q += 6;
      SkipSpace(&q);
      const bool strip = At(q, "-%}"), plus = At(q, "+%}");
      if (!strip && !plus && !At(q, "%}")) continue;
      std::string_view text = src_.substr(*pos, hit - *pos);
      if (strip_before) {
        while (!text.empty() && IsSpace(text.back())) text.remove_suffix(1);
      }
      if (!text.empty()) Emit(Tok::kData, text, *pos);
      q += (strip || plus) ? 3 : 2;
      if (strip) {
        SkipSpace(&q);
      } else if (!plus && q < n && src_[q] == '\n') {
        ++q;
      }
      *pos = q;
      return absl::OkStatus();
    }
  }

  absl::Status LexNumber(size_t* pos) {
    const size_t n = src_.size();
    const size_t b = *pos;
    size_t p = b;
    auto digits = [&] {
      const size_t d0 = p;
      while (p < n && (IsDigit(src_[p]) ||
                       (src_[p] == '_' && p > d0 && p + 1 < n && IsDigit(src_[p + 1])))) {
        ++p;
      }
    };
    digits();
    bool is_float = false;
    const bool after_dot = b > 0 && src_[b - 1] == '.';  // `a.0.1` indexes twice
    if (!after_dot && p + 1 < n && src_[p] == '.' && IsDigit(src_[p + 1])) {
      ++p;
      digits();
      is_float = true;
    }
    if (!after_dot && p < n && (src_[p] == 'e' || src_[p] == 'E')) {
      size_t q = p + 1;
      if (q < n && (src_[q] == '+' || src_[q] == '-')) ++q;
      if (q < n && IsDigit(src_[q])) {
        p = q;
        digits();
        is_float = true;
      }
    }
    std::string text;
    for (size_t i = b; i < p; ++i) {
      if (src_[i] != '_') text.push_back(src_[i]);
    }
    Token t;
    t.offset = b;
    t.text = text;
    if (is_float) {
      t.type = Tok::kFloat;
      t.float_value = std::strtod(text.c_str(), nullptr);
    } else {
      t.type = Tok::kInt;
      if (!absl::SimpleAtoi(text, &t.int_value)) return Error(b, "integer literal out of range");
    }
    tokens_.push_back(std::move(t));
    *pos = p;
    return absl::OkStatus();
  }

  // A quoted string with Python's escapes (\n \t \\ \' \" \xhh \uhhhh \ooo ...).
  absl::Status LexString(size_t* pos) {
    const size_t n = src_.size();
    const size_t b = *pos;
    const char quote = src_[b];
    size_t p = b + 1;
    std::string out;
    auto hex = [&](int digits, uint32_t* cp) {
      *cp = 0;
      for (int i = 0; i < digits; ++i, ++p) {
        if (p >= n || !std::isxdigit(static_cast<unsigned char>(src_[p]))) return false;
        const char h = src_[p];
        *cp = *cp * 16 + (IsDigit(h) ? h - '0' : (h | 0x20) - 'a' + 10);
      }
      return true;
    };
    while (true) {
      if (p >= n) return Error(b, "unterminated string");
      const char c = src_[p];
      if (c == quote) {
        ++p;
        break;
      }
      if (c != '\\') {
        out.push_back(c);
        ++p;
        continue;
      }
      if (p + 1 >= n) return Error(b, "unterminated string");
      const char e = src_[p + 1];
      p += 2;
      uint32_t cp = 0;
      switch (e) {
        case '\n':
          break;
        case '\\':
          out.push_back('\\');
          break;
        case '\'':
          out.push_back('\'');
          break;
        case '"':
          out.push_back('"');
          break;
        case 'a':
          out.push_back('\a');
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'v':
          out.push_back('\v');
          break;
        case 'x':
          if (!hex(2, &cp)) return Error(p, "invalid \\x escape");
          AppendEscapedCodePoint(cp, &out);
          break;
        case 'u':
          if (!hex(4, &cp)) return Error(p, "invalid \\u escape");
          AppendEscapedCodePoint(cp, &out);
          break;
        case 'U':
          if (!hex(8, &cp) || cp > 0x10FFFF) return Error(p, "invalid \\U escape");
          AppendEscapedCodePoint(cp, &out);
          break;
        case 'N':
          return Error(p, "\\N{...} escapes are not supported");
        default:
          if (e >= '0' && e <= '7') {
            cp = e - '0';
            for (int i = 0; i < 2 && p < n && src_[p] >= '0' && src_[p] <= '7'; ++i, ++p) {
              cp = cp * 8 + (src_[p] - '0');
            }
            AppendEscapedCodePoint(cp, &out);
          } else {
            out.push_back('\\');  // Python keeps unknown escapes as written
            out.push_back(e);
          }
      }
    }
    Emit(Tok::kString, out, b);
    *pos = p;
    return absl::OkStatus();
  }

  std::string_view src_;
  const SourceMap& map_;
  std::vector<Token> tokens_;
};

// ---- parser -----------------------------------------------------------------------------------

class Parser {
 public:
  Parser(std::vector<Token> tokens, const SourceMap& map) : toks_(std::move(tokens)), map_(map) {}

  absl::StatusOr<Body> ParseTemplate() {
    std::string end;
    return ParseBody({}, &end);
  }

 private:
  const Token& Cur() const { return toks_[i_]; }
  const Token& Peek() const { return toks_[std::min(i_ + 1, toks_.size() - 1)]; }
  void Advance() {
    if (i_ + 1 < toks_.size()) ++i_;
  }
  bool IsOp(std::string_view op) const { return Cur().type == Tok::kOp && Cur().text == op; }
  bool IsName(std::string_view n) const { return Cur().type == Tok::kName && Cur().text == n; }
  bool SkipOp(std::string_view op) {
    if (!IsOp(op)) return false;
    Advance();
    return true;
  }
  bool SkipName(std::string_view n) {
    if (!IsName(n)) return false;
    Advance();
    return true;
  }
  absl::Status Error(const Token& t, std::string_view msg) const {
    return SyntaxError(map_, t.offset, msg);
  }
  static std::string Describe(const Token& t) {
    switch (t.type) {
      case Tok::kData:
        return "template text";
      case Tok::kVarBegin:
        return "'{{'";
      case Tok::kVarEnd:
        return "'}}'";
      case Tok::kBlockBegin:
        return "'{%'";
      case Tok::kBlockEnd:
        return "'%}'";
      case Tok::kName:
      case Tok::kOp:
        return Cat("'", t.text, "'");
      case Tok::kString:
        return "a string";
      case Tok::kInt:
      case Tok::kFloat:
        return "a number";
      case Tok::kEof:
        return "end of template";
    }
    return "?";
  }
  absl::Status ExpectOp(std::string_view op) {
    if (SkipOp(op)) return absl::OkStatus();
    return Error(Cur(), Cat("expected '", op, "', got ", Describe(Cur())));
  }
  absl::Status ExpectBlockEnd() {
    if (Cur().type == Tok::kBlockEnd) {
      Advance();
      return absl::OkStatus();
    }
    return Error(Cur(), Cat("expected '%}', got ", Describe(Cur())));
  }
  absl::StatusOr<std::string> ExpectName() {
    if (Cur().type != Tok::kName) {
      return Error(Cur(), Cat("expected a name, got ", Describe(Cur())));
    }
    std::string name = Cur().text;
    Advance();
    return name;
  }

  ExprPtr NewExpr(ExprKind kind, const Token& at) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = map_.Line(at.offset);
    e->offset = at.offset;
    return e;
  }
  std::unique_ptr<Stmt> NewStmt(StmtKind kind, const Token& at) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->line = map_.Line(at.offset);
    return s;
  }
  // Records the node's depth; the evaluator's recursion follows it, so it is bounded.
  absl::Status Finish(Expr& e) {
    int d = 0;
    for (const auto& a : e.args) {
      if (a) d = std::max(d, a->depth);
    }
    for (const auto& kv : e.kwargs) d = std::max(d, kv.second->depth);
    e.depth = d + 1;
    if (e.depth > ChatTemplate::kMaxParseDepth) {
      return SyntaxError(map_, e.offset, "expression nested too deep");
    }
    return absl::OkStatus();
  }
  absl::StatusOr<ExprPtr> Node(ExprKind kind, const Token& at, ExprPtr a, ExprPtr b = nullptr,
                               std::string name = "") {
    ExprPtr e = NewExpr(kind, at);
    e->args.push_back(std::move(a));
    if (b) e->args.push_back(std::move(b));
    e->name = std::move(name);
    RETURN_IF_ERROR(Finish(*e));
    return e;
  }

  // ---- statements

  absl::StatusOr<Body> ParseBody(const std::vector<std::string_view>& ends, std::string* end) {
    DepthGuard guard(&depth_);
    if (depth_ > ChatTemplate::kMaxParseDepth) return Error(Cur(), "blocks nested too deep");
    Body body;
    while (true) {
      const Token& t = Cur();
      switch (t.type) {
        case Tok::kData: {
          auto s = NewStmt(StmtKind::kText, t);
          s->text = t.text;
          body.push_back(std::move(s));
          Advance();
          break;
        }
        case Tok::kVarBegin: {
          auto s = NewStmt(StmtKind::kOutput, t);
          Advance();
          ASSIGN_OR_RETURN(s->expr, ParseTuple(true));
          if (Cur().type != Tok::kVarEnd) {
            return Error(Cur(), Cat("expected '}}', got ", Describe(Cur())));
          }
          Advance();
          body.push_back(std::move(s));
          break;
        }
        case Tok::kBlockBegin: {
          const Token& name = Peek();
          if (name.type == Tok::kName &&
              std::find(ends.begin(), ends.end(), name.text) != ends.end()) {
            *end = name.text;
            Advance();
            Advance();
            return body;
          }
          ASSIGN_OR_RETURN(auto s, ParseStatement());
          body.push_back(std::move(s));
          break;
        }
        case Tok::kEof:
          if (!ends.empty()) {
            return Error(t, Cat("unexpected end of template, expected '", JoinTags(ends), "'"));
          }
          return body;
        default:
          return Error(t, Cat("unexpected ", Describe(t)));
      }
    }
  }

  absl::StatusOr<std::unique_ptr<Stmt>> ParseStatement() {
    const Token& begin = Cur();
    Advance();
    const Token& name = Cur();
    if (name.type != Tok::kName) {
      return Error(name, Cat("expected a tag name, got ", Describe(name)));
    }
    const std::string tag = name.text;
    Advance();
    if (tag == "if") return ParseIf(begin);
    if (tag == "for") return ParseFor(begin);
    if (tag == "set") return ParseSet(begin);
    if (tag == "macro") return ParseMacro(begin);
    if (tag == "generation") {
      auto s = NewStmt(StmtKind::kBlock, begin);
      RETURN_IF_ERROR(ExpectBlockEnd());
      std::string end;
      ASSIGN_OR_RETURN(s->body, ParseBody({"endgeneration"}, &end));
      RETURN_IF_ERROR(ExpectBlockEnd());
      return s;
    }
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) return Error(name, Cat("'", tag, "' outside of a loop"));
      auto s = NewStmt(tag == "break" ? StmtKind::kBreak : StmtKind::kContinue, begin);
      RETURN_IF_ERROR(ExpectBlockEnd());
      return s;
    }
    if (tag == "filter") {
      // {% filter f(args) | g %}body{% endfilter %}: the body's text through the chain.
      auto s = NewStmt(StmtKind::kFilterBlock, begin);
      ExprPtr operand = NewExpr(ExprKind::kName, name);
      operand->name = kFilterBlockOperand;
      ASSIGN_OR_RETURN(ExprPtr first, ParseOneFilter(std::move(operand)));
      ASSIGN_OR_RETURN(s->expr, ParseFilterExpr(std::move(first)));
      if (s->expr->kind != ExprKind::kFilter)
        return Error(name, "a filter block takes filters only");
      RETURN_IF_ERROR(ExpectBlockEnd());
      ASSIGN_OR_RETURN(s->body, ParseDetachedBody("endfilter"));
      return s;
    }
    static constexpr std::string_view kUnsupported[] = {"call",       "include", "import", "from",
                                                        "extends",    "block",   "with",   "do",
                                                        "autoescape", "trans"};
    if (InSet(kUnsupported, tag)) {
      return Error(name, Cat("unsupported tag '", tag, "'"));
    }
    static constexpr std::string_view kEnds[] = {
        "elif",          "else",   "endif",   "endfor",    "endset",   "endmacro",
        "endgeneration", "endraw", "endcall", "endfilter", "endblock", "endwith"};
    if (InSet(kEnds, tag)) return Error(name, Cat("unexpected '", tag, "'"));
    return Error(name, Cat("unknown tag '", tag, "'"));
  }

  absl::StatusOr<std::unique_ptr<Stmt>> ParseIf(const Token& begin) {
    auto s = NewStmt(StmtKind::kIf, begin);
    ASSIGN_OR_RETURN(ExprPtr cond, ParseTuple(false));
    RETURN_IF_ERROR(ExpectBlockEnd());
    while (true) {
      std::string end;
      ASSIGN_OR_RETURN(Body body, ParseBody({"elif", "else", "endif"}, &end));
      s->branches.emplace_back(std::move(cond), std::move(body));
      if (end == "elif") {
        ASSIGN_OR_RETURN(cond, ParseTuple(false));
        RETURN_IF_ERROR(ExpectBlockEnd());
        continue;
      }
      if (end == "else") {
        RETURN_IF_ERROR(ExpectBlockEnd());
        ASSIGN_OR_RETURN(Body else_body, ParseBody({"endif"}, &end));
        s->branches.emplace_back(nullptr, std::move(else_body));
      }
      RETURN_IF_ERROR(ExpectBlockEnd());
      return s;
    }
  }

  absl::Status ParseTargets(Stmt* s) {
    const bool paren = SkipOp("(");
    do {
      ASSIGN_OR_RETURN(std::string name, ExpectName());
      s->targets.push_back(std::move(name));
    } while (SkipOp(","));
    if (paren) RETURN_IF_ERROR(ExpectOp(")"));
    s->unpack = s->targets.size() > 1;
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<Stmt>> ParseFor(const Token& begin) {
    auto s = NewStmt(StmtKind::kFor, begin);
    RETURN_IF_ERROR(ParseTargets(s.get()));
    if (!SkipName("in")) return Error(Cur(), Cat("expected 'in', got ", Describe(Cur())));
    ASSIGN_OR_RETURN(s->expr, ParseTuple(false));
    if (SkipName("if")) {
      ASSIGN_OR_RETURN(s->filter, ParseExpression(true));
    }
    if (IsName("recursive")) return Error(Cur(), "unsupported: recursive loops");
    RETURN_IF_ERROR(ExpectBlockEnd());
    std::string end;
    ++loop_depth_;
    absl::StatusOr<Body> body = ParseBody({"endfor", "else"}, &end);
    --loop_depth_;
    if (!body.ok()) return body.status();
    s->body = std::move(*body);
    if (end == "else") {
      RETURN_IF_ERROR(ExpectBlockEnd());
      ASSIGN_OR_RETURN(s->else_body, ParseBody({"endfor"}, &end));
    }
    RETURN_IF_ERROR(ExpectBlockEnd());
    return s;
  }

  // A body in which break/continue refer to no enclosing loop (macro, block set).
  absl::StatusOr<Body> ParseDetachedBody(std::string_view end_tag) {
    const int saved = loop_depth_;
    loop_depth_ = 0;
    std::string end;
    absl::StatusOr<Body> body = ParseBody({end_tag}, &end);
    loop_depth_ = saved;
    if (!body.ok()) return body.status();
    RETURN_IF_ERROR(ExpectBlockEnd());
    return body;
  }

  absl::StatusOr<std::unique_ptr<Stmt>> ParseSet(const Token& begin) {
    auto s = NewStmt(StmtKind::kSet, begin);
    if (Cur().type == Tok::kName && Peek().type == Tok::kOp && Peek().text == ".") {
      s->kind = StmtKind::kSetAttr;
      s->targets.push_back(Cur().text);
      Advance();
      Advance();
      ASSIGN_OR_RETURN(s->text, ExpectName());
      RETURN_IF_ERROR(ExpectOp("="));
      ASSIGN_OR_RETURN(s->expr, ParseTuple(true));
      RETURN_IF_ERROR(ExpectBlockEnd());
      return s;
    }
    RETURN_IF_ERROR(ParseTargets(s.get()));
    if (SkipOp("=")) {
      ASSIGN_OR_RETURN(s->expr, ParseTuple(true));
      RETURN_IF_ERROR(ExpectBlockEnd());
      return s;
    }
    if (s->unpack) return Error(Cur(), "a block set assigns one name");
    if (IsOp("|")) return Error(Cur(), "unsupported: filters on a block set");
    RETURN_IF_ERROR(ExpectBlockEnd());
    s->kind = StmtKind::kSetBlock;
    ASSIGN_OR_RETURN(s->body, ParseDetachedBody("endset"));
    return s;
  }

  absl::StatusOr<std::unique_ptr<Stmt>> ParseMacro(const Token& begin) {
    auto s = NewStmt(StmtKind::kMacro, begin);
    ASSIGN_OR_RETURN(s->text, ExpectName());
    RETURN_IF_ERROR(ExpectOp("("));
    bool defaults = false;
    while (!IsOp(")")) {
      if (!s->params.empty()) {
        RETURN_IF_ERROR(ExpectOp(","));
        if (IsOp(")")) break;
      }
      const Token& at = Cur();
      ASSIGN_OR_RETURN(std::string param, ExpectName());
      ExprPtr def;
      if (SkipOp("=")) {
        ASSIGN_OR_RETURN(def, ParseExpression(true));
        defaults = true;
      } else if (defaults) {
        return Error(at, "non-default argument follows default argument");
      }
      s->params.emplace_back(std::move(param), std::move(def));
    }
    Advance();
    RETURN_IF_ERROR(ExpectBlockEnd());
    ASSIGN_OR_RETURN(s->body, ParseDetachedBody("endmacro"));
    return s;
  }

  // ---- expressions (precedence, loosest first: if-else, or, and, not, comparisons, + -, ~,
  // * / // %, **, unary - +, then postfix . [] () and filters/tests binding to a unary operand)

  bool IsTupleEnd() const {
    const Tok t = Cur().type;
    return t == Tok::kVarEnd || t == Tok::kBlockEnd || t == Tok::kEof || IsOp(")");
  }

  absl::StatusOr<ExprPtr> ParseTuple(bool with_condexpr) {
    const Token& at = Cur();
    std::vector<ExprPtr> items;
    bool tuple = false;
    while (true) {
      if (!items.empty()) {
        if (!SkipOp(",")) break;
        tuple = true;
        if (IsTupleEnd()) break;
      }
      ASSIGN_OR_RETURN(ExprPtr item, ParseExpression(with_condexpr));
      items.push_back(std::move(item));
    }
    if (!tuple) return std::move(items[0]);
    ExprPtr e = NewExpr(ExprKind::kTuple, at);
    e->args = std::move(items);
    RETURN_IF_ERROR(Finish(*e));
    return e;
  }

  absl::StatusOr<ExprPtr> ParseExpression(bool with_condexpr) {
    DepthGuard guard(&depth_);
    if (depth_ > ChatTemplate::kMaxParseDepth) return Error(Cur(), "expression nested too deep");
    ASSIGN_OR_RETURN(ExprPtr expr, ParseOr());
    if (!with_condexpr) return expr;
    while (IsName("if")) {
      const Token& at = Cur();
      Advance();
      ASSIGN_OR_RETURN(ExprPtr cond, ParseOr());
      ExprPtr other;
      if (SkipName("else")) {
        ASSIGN_OR_RETURN(other, ParseExpression(true));
      }
      ExprPtr e = NewExpr(ExprKind::kCond, at);
      e->args.push_back(std::move(expr));
      e->args.push_back(std::move(cond));
      e->args.push_back(std::move(other));
      RETURN_IF_ERROR(Finish(*e));
      expr = std::move(e);
    }
    return expr;
  }

  absl::StatusOr<ExprPtr> ParseOr() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseAnd());
    while (IsName("or")) {
      const Token& at = Cur();
      Advance();
      ASSIGN_OR_RETURN(ExprPtr right, ParseAnd());
      ASSIGN_OR_RETURN(left, Node(ExprKind::kOr, at, std::move(left), std::move(right)));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseAnd() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseNot());
    while (IsName("and")) {
      const Token& at = Cur();
      Advance();
      ASSIGN_OR_RETURN(ExprPtr right, ParseNot());
      ASSIGN_OR_RETURN(left, Node(ExprKind::kAnd, at, std::move(left), std::move(right)));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseNot() {
    if (!IsName("not")) return ParseCompare();
    const Token& at = Cur();
    Advance();
    DepthGuard guard(&depth_);
    if (depth_ > ChatTemplate::kMaxParseDepth) return Error(at, "expression nested too deep");
    ASSIGN_OR_RETURN(ExprPtr operand, ParseNot());
    return Node(ExprKind::kNot, at, std::move(operand));
  }

  absl::StatusOr<ExprPtr> ParseCompare() {
    const Token& at = Cur();
    ASSIGN_OR_RETURN(ExprPtr first, ParseMath1());
    ExprPtr e = NewExpr(ExprKind::kCompare, at);
    e->args.push_back(std::move(first));
    while (true) {
      std::string op;
      if (Cur().type == Tok::kOp &&
          (IsOp("==") || IsOp("!=") || IsOp("<") || IsOp("<=") || IsOp(">") || IsOp(">="))) {
        op = Cur().text;
        Advance();
      } else if (IsName("in")) {
        op = "in";
        Advance();
      } else if (IsName("not") && Peek().type == Tok::kName && Peek().text == "in") {
        op = "not in";
        Advance();
        Advance();
      } else {
        break;
      }
      ASSIGN_OR_RETURN(ExprPtr operand, ParseMath1());
      e->ops.push_back(std::move(op));
      e->args.push_back(std::move(operand));
    }
    if (e->ops.empty()) return std::move(e->args[0]);
    RETURN_IF_ERROR(Finish(*e));
    return e;
  }

  absl::StatusOr<ExprPtr> ParseMath1() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseConcat());
    while (IsOp("+") || IsOp("-")) {
      const Token& at = Cur();
      Advance();
      ASSIGN_OR_RETURN(ExprPtr right, ParseConcat());
      ASSIGN_OR_RETURN(left,
                       Node(ExprKind::kBinary, at, std::move(left), std::move(right), at.text));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseConcat() {
    const Token& at = Cur();
    ASSIGN_OR_RETURN(ExprPtr first, ParseMath2());
    if (!IsOp("~")) return first;
    ExprPtr e = NewExpr(ExprKind::kConcat, at);
    e->args.push_back(std::move(first));
    while (SkipOp("~")) {
      ASSIGN_OR_RETURN(ExprPtr next, ParseMath2());
      e->args.push_back(std::move(next));
    }
    RETURN_IF_ERROR(Finish(*e));
    return e;
  }

  absl::StatusOr<ExprPtr> ParseMath2() {
    ASSIGN_OR_RETURN(ExprPtr left, ParsePow());
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const Token& at = Cur();
      Advance();
      ASSIGN_OR_RETURN(ExprPtr right, ParsePow());
      ASSIGN_OR_RETURN(left,
                       Node(ExprKind::kBinary, at, std::move(left), std::move(right), at.text));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParsePow() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseUnary(true));
    while (IsOp("**")) {
      const Token& at = Cur();
      Advance();
      ASSIGN_OR_RETURN(ExprPtr right, ParseUnary(true));
      ASSIGN_OR_RETURN(left, Node(ExprKind::kBinary, at, std::move(left), std::move(right), "**"));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseUnary(bool with_filter) {
    DepthGuard guard(&depth_);
    if (depth_ > ChatTemplate::kMaxParseDepth) return Error(Cur(), "expression nested too deep");
    const Token& at = Cur();
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      Advance();
      ASSIGN_OR_RETURN(ExprPtr operand, ParseUnary(false));
      ASSIGN_OR_RETURN(
          node, Node(at.text == "-" ? ExprKind::kNeg : ExprKind::kPos, at, std::move(operand)));
    } else {
      ASSIGN_OR_RETURN(node, ParsePrimary());
      ASSIGN_OR_RETURN(node, ParsePostfix(std::move(node)));
    }
    if (with_filter) return ParseFilterExpr(std::move(node));
    return node;
  }

  absl::StatusOr<ExprPtr> ParsePrimary() {
    const Token& t = Cur();
    ExprPtr e = NewExpr(ExprKind::kLiteral, t);
    switch (t.type) {
      case Tok::kName:
        if (t.text == "true" || t.text == "True") {
          e->literal = Value::Bool(true);
        } else if (t.text == "false" || t.text == "False") {
          e->literal = Value::Bool(false);
        } else if (t.text == "none" || t.text == "None") {
          e->literal = Value::None();
        } else {
          e->kind = ExprKind::kName;
          e->name = t.text;
        }
        Advance();
        return e;
      case Tok::kString: {
        std::string s = t.text;
        Advance();
        while (Cur().type == Tok::kString) {  // adjacent literals concatenate
          s += Cur().text;
          Advance();
        }
        e->literal = Value::Str(std::move(s));
        return e;
      }
      case Tok::kInt:
        e->literal = Value::Int(t.int_value);
        Advance();
        return e;
      case Tok::kFloat:
        e->literal = Value::Float(t.float_value);
        Advance();
        return e;
      case Tok::kOp:
        if (t.text == "(") {
          Advance();
          if (SkipOp(")")) {
            e->kind = ExprKind::kTuple;
            return e;
          }
          ASSIGN_OR_RETURN(ExprPtr first, ParseExpression(true));
          if (!IsOp(",")) {
            RETURN_IF_ERROR(ExpectOp(")"));
            return first;
          }
          e->kind = ExprKind::kTuple;
          e->args.push_back(std::move(first));
          while (SkipOp(",") && !IsOp(")")) {
            ASSIGN_OR_RETURN(ExprPtr item, ParseExpression(true));
            e->args.push_back(std::move(item));
          }
          RETURN_IF_ERROR(ExpectOp(")"));
          RETURN_IF_ERROR(Finish(*e));
          return e;
        }
        if (t.text == "[" || t.text == "{") {
          const bool dict = t.text == "{";
          const std::string close = dict ? "}" : "]";
          e->kind = dict ? ExprKind::kDict : ExprKind::kList;
          Advance();
          while (!IsOp(close)) {
            if (!e->args.empty()) {
              RETURN_IF_ERROR(ExpectOp(","));
              if (IsOp(close)) break;
            }
            ASSIGN_OR_RETURN(ExprPtr item, ParseExpression(true));
            e->args.push_back(std::move(item));
            if (dict) {
              RETURN_IF_ERROR(ExpectOp(":"));
              ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
              e->args.push_back(std::move(value));
            }
          }
          Advance();
          RETURN_IF_ERROR(Finish(*e));
          return e;
        }
        break;
      default:
        break;
    }
    return Error(t, Cat("unexpected ", Describe(t)));
  }

  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr node) {
    while (true) {
      const Token& at = Cur();
      if (SkipOp(".")) {
        if (Cur().type == Tok::kName) {
          ASSIGN_OR_RETURN(node, Node(ExprKind::kAttr, at, std::move(node), nullptr, Cur().text));
        } else if (Cur().type == Tok::kInt) {
          ExprPtr index = NewExpr(ExprKind::kLiteral, Cur());
          index->literal = Value::Int(Cur().int_value);
          ASSIGN_OR_RETURN(node, Node(ExprKind::kItem, at, std::move(node), std::move(index)));
        } else {
          return Error(Cur(), Cat("expected an attribute name, got ", Describe(Cur())));
        }
        Advance();
      } else if (SkipOp("[")) {
        ExprPtr parts[3];
        bool slice = false;
        if (!IsOp(":")) {
          ASSIGN_OR_RETURN(parts[0], ParseExpression(true));
        }
        if (SkipOp(":")) {
          slice = true;
          if (!IsOp("]") && !IsOp(":")) {
            ASSIGN_OR_RETURN(parts[1], ParseExpression(true));
          }
          if (SkipOp(":") && !IsOp("]")) {
            ASSIGN_OR_RETURN(parts[2], ParseExpression(true));
          }
        }
        RETURN_IF_ERROR(ExpectOp("]"));
        if (slice) {
          ExprPtr e = NewExpr(ExprKind::kSlice, at);
          e->args.push_back(std::move(node));
          for (auto& part : parts) e->args.push_back(std::move(part));
          RETURN_IF_ERROR(Finish(*e));
          node = std::move(e);
        } else {
          ASSIGN_OR_RETURN(node, Node(ExprKind::kItem, at, std::move(node), std::move(parts[0])));
        }
      } else if (IsOp("(")) {
        ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
      } else {
        return node;
      }
    }
  }

  absl::StatusOr<ExprPtr> ParseCall(ExprPtr callee) {
    ExprPtr e = NewExpr(ExprKind::kCall, Cur());
    e->args.push_back(std::move(callee));
    Advance();  // (
    RETURN_IF_ERROR(ParseArgs(e.get()));
    RETURN_IF_ERROR(Finish(*e));
    return e;
  }

  // Arguments after '(' through ')': positional into e->args, then keyword into e->kwargs.
  absl::Status ParseArgs(Expr* e) {
    bool first = true;
    while (!IsOp(")")) {
      if (!first) {
        RETURN_IF_ERROR(ExpectOp(","));
        if (IsOp(")")) break;
      }
      first = false;
      if (IsOp("*") || IsOp("**")) return Error(Cur(), "unsupported: *args and **kwargs");
      if (Cur().type == Tok::kName && Peek().type == Tok::kOp && Peek().text == "=") {
        std::string key = Cur().text;
        Advance();
        Advance();
        ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
        e->kwargs.emplace_back(std::move(key), std::move(value));
      } else {
        if (!e->kwargs.empty()) return Error(Cur(), "positional argument follows keyword argument");
        ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
        e->args.push_back(std::move(value));
      }
    }
    Advance();  // )
    return absl::OkStatus();
  }

  bool StartsTestArgument() const {
    const Token& t = Cur();
    if (t.type == Tok::kName) {
      static constexpr std::string_view kStop[] = {"else", "or",  "and", "if",
                                                   "in",   "not", "is",  "recursive"};
      return !InSet(kStop, t.text);
    }
    return t.type == Tok::kString || t.type == Tok::kInt || t.type == Tok::kFloat || IsOp("[") ||
           IsOp("{");
  }

  // One filter (its name and arguments, at the current token) applied to `node`.
  absl::StatusOr<ExprPtr> ParseOneFilter(ExprPtr node) {
    const Token& name = Cur();
    if (name.type != Tok::kName) {
      return Error(name, Cat("expected a filter name, got ", Describe(name)));
    }
    if (!IsKnownFilter(name.text)) {
      return Error(name, Cat("unknown filter '", name.text, "'"));
    }
    ExprPtr f = NewExpr(ExprKind::kFilter, name);
    f->name = name.text;
    f->args.push_back(std::move(node));
    Advance();
    if (SkipOp("(")) RETURN_IF_ERROR(ParseArgs(f.get()));
    RETURN_IF_ERROR(Finish(*f));
    return f;
  }

  absl::StatusOr<ExprPtr> ParseFilterExpr(ExprPtr node) {
    while (true) {
      if (SkipOp("|")) {
        ASSIGN_OR_RETURN(node, ParseOneFilter(std::move(node)));
      } else if (IsName("is")) {
        Advance();
        const bool negated = SkipName("not");
        const Token& name = Cur();
        if (name.type != Tok::kName) {
          return Error(name, Cat("expected a test name, got ", Describe(name)));
        }
        if (!IsKnownTest(name.text)) {
          return Error(name, Cat("unknown test '", name.text, "'"));
        }
        ExprPtr t = NewExpr(ExprKind::kTest, name);
        t->name = name.text;
        t->negated = negated;
        t->args.push_back(std::move(node));
        Advance();
        if (SkipOp("(")) {
          RETURN_IF_ERROR(ParseArgs(t.get()));
        } else if (StartsTestArgument()) {
          ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
          ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
          t->args.push_back(std::move(arg));
        }
        RETURN_IF_ERROR(Finish(*t));
        node = std::move(t);
      } else if (IsOp("(")) {
        ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
      } else {
        return node;
      }
    }
  }

  std::vector<Token> toks_;
  const SourceMap& map_;
  size_t i_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

bool IsKnownFilter(std::string_view name) { return InSet(kFilters, name); }
bool IsKnownTest(std::string_view name) { return InSet(kTests, name); }

absl::StatusOr<std::shared_ptr<const Program>> ParseTemplate(std::string_view source) {
  if (source.size() > ChatTemplate::kMaxSourceBytes) {
    return absl::InvalidArgumentError(
        Cat(kErrorPrefix, "template exceeds ", ChatTemplate::kMaxSourceBytes, " bytes"));
  }
  // Jinja normalizes newlines and drops one trailing newline (keep_trailing_newline=False).
  std::string src;
  src.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      src.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      src.push_back(source[i]);
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  const SourceMap map(src);
  Lexer lexer(src, map);
  ASSIGN_OR_RETURN(std::vector<Token> tokens, lexer.Run());
  Parser parser(std::move(tokens), map);
  auto program = std::make_shared<Program>();
  ASSIGN_OR_RETURN(program->body, parser.ParseTemplate());
  return std::shared_ptr<const Program>(std::move(program));
}

}  // namespace kvrm::jinja
