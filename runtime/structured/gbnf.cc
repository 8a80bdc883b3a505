#include "runtime/structured/gbnf.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/tokenizer_text.h"

namespace kvrm::structured {
namespace {

constexpr int32_t kMaxRules = 4096;
constexpr int32_t kMaxGroupNesting = 200;
// C++ frames of the unfolding (rules within rules, groups within groups), far above any real
// grammar, well inside a thread's stack.
constexpr int32_t kMaxUnfoldFrames = 2000;
constexpr int32_t kMaxDepthOption = 64;

// The parsed grammar: one expression tree per rule, references by rule index.
struct Expr {
  enum class Kind { kSeq, kAlt, kLiteral, kClass, kRef, kRepeat };
  Kind kind = Kind::kSeq;  // an empty sequence matches ""
  std::string text;        // kLiteral: UTF-8
  CodePointSet set;        // kClass
  int32_t rule = -1;       // kRef
  std::vector<Expr> children;
  int32_t min = 0;  // kRepeat
  int32_t max = 0;  // kRepeat; < 0: unbounded
};

struct Rule {
  std::string name;
  Expr body;
  bool defined = false;
  size_t defined_at = 0;
  size_t first_ref = 0;  // where a reference first named it (undefined-rule errors)
};

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  absl::Status Parse(std::string_view root) {
    if (!tok::IsValidUtf8(text_)) return absl::InvalidArgumentError("grammar: not valid UTF-8");
    SkipSpace();
    while (!AtEnd()) {
      const size_t at = pos_;
      const std::string_view name = Name();
      if (name.empty()) return Error(at, absl::StrCat("expecting a rule name, not ", Shown(at)));
      SkipSpace();
      if (text_.substr(pos_, 3) != "::=") {
        return Error(pos_, absl::StrCat("expecting ::= after the rule name ", std::string(name)));
      }
      pos_ += 3;
      ASSIGN_OR_RETURN(const int32_t id, RuleId(name, at));
      if (rules_[id].defined) {
        return Error(at, absl::StrCat("rule ", std::string(name), " is defined twice (first at ",
                                      Where(rules_[id].defined_at), ")"));
      }
      rules_[id].defined = true;
      rules_[id].defined_at = at;
      ASSIGN_OR_RETURN(Expr body, Alternates(0));
      rules_[id].body = std::move(body);
      SkipSpace();
      if (!AtEnd() && !AtRuleStart()) {
        return Error(pos_, absl::StrCat("unexpected ", Shown(pos_)));
      }
    }
    for (const Rule& r : rules_) {
      if (!r.defined) return Error(r.first_ref, absl::StrCat("undefined rule ", r.name));
    }
    auto it = index_.find(std::string(root));
    if (it == index_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("grammar: no rule named ", std::string(root)));
    }
    root_ = it->second;
    return absl::OkStatus();
  }

  const std::vector<Rule>& rules() const { return rules_; }
  int32_t root() const { return root_; }

 private:
  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek() const { return AtEnd() ? '\0' : text_[pos_]; }

  // "line L column C" (1-based; columns in bytes).
  std::string Where(size_t offset) const {
    int64_t line = 1;
    size_t line_start = 0;
    for (size_t i = 0; i < offset && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        line_start = i + 1;
      }
    }
    return absl::StrCat("line ", line, " column ", offset - line_start + 1);
  }
  absl::Status Error(size_t offset, std::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("grammar: ", Where(offset), ": ", std::string(what)));
  }
  // The character at `offset`, for messages.
  std::string Shown(size_t offset) const {
    if (offset >= text_.size()) return "the end of the grammar";
    const char c = text_[offset];
    if (c == '\n' || c == '\r') return "a newline";
    size_t i = offset;
    const uint32_t cp = tok::NextCodePoint(text_, &i);
    std::string s = "'";
    tok::AppendUtf8(cp, &s);
    return s + "'";
  }

  // Spaces, tabs, newlines and # comments.
  void SkipSpace() {
    while (!AtEnd()) {
      const char c = text_[pos_];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++pos_;
      } else if (c == '#') {
        while (!AtEnd() && text_[pos_] != '\n' && text_[pos_] != '\r') ++pos_;
      } else {
        break;
      }
    }
  }

  std::string_view Name() {
    const size_t from = pos_;
    while (!AtEnd() && IsNameChar(text_[pos_])) ++pos_;
    return text_.substr(from, pos_ - from);
  }

  // Whether a rule definition ("name ::=") starts here; moves nothing.
  bool AtRuleStart() const {
    size_t i = pos_;
    while (i < text_.size() && IsNameChar(text_[i])) ++i;
    if (i == pos_) return false;
    while (i < text_.size()) {
      const char c = text_[i];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++i;
      } else if (c == '#') {
        while (i < text_.size() && text_[i] != '\n' && text_[i] != '\r') ++i;
      } else {
        break;
      }
    }
    return text_.substr(i, 3) == "::=";
  }

  absl::StatusOr<int32_t> RuleId(std::string_view name, size_t at) {
    auto it = index_.find(std::string(name));
    if (it != index_.end()) return it->second;
    if (static_cast<int32_t>(rules_.size()) >= kMaxRules) {
      return Error(at, absl::StrCat("more than ", kMaxRules, " rules"));
    }
    const int32_t id = static_cast<int32_t>(rules_.size());
    Rule r;
    r.name = std::string(name);
    r.first_ref = at;
    rules_.push_back(std::move(r));
    index_.emplace(std::string(name), id);
    return id;
  }

  absl::StatusOr<Expr> Alternates(int32_t nesting) {
    if (nesting > kMaxGroupNesting) {
      return Error(pos_, absl::StrCat("groups nest deeper than ", kMaxGroupNesting));
    }
    Expr alt;
    alt.kind = Expr::Kind::kAlt;
    ASSIGN_OR_RETURN(Expr first, Sequence(nesting));
    alt.children.push_back(std::move(first));
    while (Peek() == '|') {
      ++pos_;
      ASSIGN_OR_RETURN(Expr next, Sequence(nesting));
      alt.children.push_back(std::move(next));
    }
    if (alt.children.size() == 1) return std::move(alt.children[0]);
    return alt;
  }

  absl::StatusOr<Expr> Sequence(int32_t nesting) {
    Expr seq;
    seq.kind = Expr::Kind::kSeq;
    for (;;) {
      SkipSpace();
      if (AtEnd()) break;
      const char c = text_[pos_];
      if (c == '|' || c == ')') break;
      if (IsNameChar(c) && AtRuleStart()) break;
      const size_t at = pos_;
      Expr item;
      if (c == '"' || c == '\'') {
        ASSIGN_OR_RETURN(item, Literal(c));
      } else if (c == '[') {
        ASSIGN_OR_RETURN(item, Class());
      } else if (c == '.') {
        ++pos_;
        item.kind = Expr::Kind::kClass;
        item.set = CodePointSet::All();
      } else if (c == '(') {
        ++pos_;
        ASSIGN_OR_RETURN(item, Alternates(nesting + 1));
        SkipSpace();
        if (Peek() != ')') {
          return Error(pos_, absl::StrCat("expecting ')' to close the group at ", Where(at),
                                          ", not ", Shown(pos_)));
        }
        ++pos_;
      } else if (IsNameChar(c)) {
        const std::string_view name = Name();
        item.kind = Expr::Kind::kRef;
        ASSIGN_OR_RETURN(item.rule, RuleId(name, at));
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        return Error(at,
                     absl::StrCat("'", std::string(1, c), "' with nothing before it to repeat"));
      } else {
        return Error(at, absl::StrCat("unexpected ", Shown(at)));
      }
      // Postfix repetitions, each applying to everything before it.
      for (;;) {
        SkipSpace();
        int32_t min = 0;
        int32_t max = 0;
        const char op = Peek();
        if (op == '*') {
          ++pos_;
          min = 0;
          max = -1;
        } else if (op == '+') {
          ++pos_;
          min = 1;
          max = -1;
        } else if (op == '?') {
          ++pos_;
          min = 0;
          max = 1;
        } else if (op == '{') {
          ++pos_;
          RETURN_IF_ERROR(Counts(&min, &max));
        } else {
          break;
        }
        Expr rep;
        rep.kind = Expr::Kind::kRepeat;
        rep.min = min;
        rep.max = max;
        rep.children.push_back(std::move(item));
        item = std::move(rep);
      }
      seq.children.push_back(std::move(item));
    }
    if (seq.children.size() == 1) return std::move(seq.children[0]);
    return seq;
  }

  // After "{": "m}", "m,}" or "m,n}".
  absl::Status Counts(int32_t* min, int32_t* max) {
    SkipSpace();
    ASSIGN_OR_RETURN(*min, Count("{"));
    SkipSpace();
    if (Peek() == '}') {
      ++pos_;
      *max = *min;
      return absl::OkStatus();
    }
    if (Peek() != ',') return Error(pos_, absl::StrCat("expecting ',' or '}', not ", Shown(pos_)));
    ++pos_;
    SkipSpace();
    *max = -1;
    if (Peek() >= '0' && Peek() <= '9') {
      ASSIGN_OR_RETURN(*max, Count(","));
      SkipSpace();
    }
    if (Peek() != '}') return Error(pos_, absl::StrCat("expecting '}', not ", Shown(pos_)));
    ++pos_;
    if (*max >= 0 && *max < *min) {
      return Error(pos_ - 1,
                   absl::StrCat("repetition {", *min, ",", *max, "}: ", *max, " < ", *min));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<int32_t> Count(std::string_view after) {
    const size_t at = pos_;
    int64_t n = 0;
    while (Peek() >= '0' && Peek() <= '9') {
      n = std::min<int64_t>(n * 10 + (text_[pos_] - '0'), int64_t{1} << 40);
      ++pos_;
    }
    if (pos_ == at) {
      return Error(
          at, absl::StrCat("expecting a count after '", std::string(after), "', not ", Shown(at)));
    }
    if (n > kMaxGbnfRepeat) {
      return Error(at, absl::StrCat("repetition count ", n, " is above ", kMaxGbnfRepeat));
    }
    return static_cast<int32_t>(n);
  }

  // One character of a literal or class, escapes decoded.
  absl::StatusOr<uint32_t> Char() {
    const size_t at = pos_;
    if (text_[pos_] != '\\') return tok::NextCodePoint(text_, &pos_);
    if (pos_ + 1 >= text_.size()) return Error(at, "a '\\' at the end of the grammar");
    const char e = text_[pos_ + 1];
    pos_ += 2;
    int digits = 0;
    switch (e) {
      case 'n':
        return uint32_t{'\n'};
      case 'r':
        return uint32_t{'\r'};
      case 't':
        return uint32_t{'\t'};
      case '\\':
      case '"':
      case '\'':
      case '[':
      case ']':
        return static_cast<uint32_t>(e);
      case 'x':
        digits = 2;
        break;
      case 'u':
        digits = 4;
        break;
      case 'U':
        digits = 8;
        break;
      default: {
        size_t i = at + 1;
        std::string shown;
        tok::AppendUtf8(tok::NextCodePoint(text_, &i), &shown);
        return Error(at, absl::StrCat("unknown escape \\", shown));
      }
    }
    uint64_t cp = 0;
    for (int i = 0; i < digits; ++i) {
      const int v = pos_ < text_.size() ? HexValue(text_[pos_]) : -1;
      if (v < 0) {
        return Error(at, absl::StrCat("\\", std::string(1, e), " needs ", digits, " hex digits"));
      }
      cp = cp * 16 + static_cast<uint64_t>(v);
      ++pos_;
    }
    if (cp > kMaxCodePoint || (cp >= 0xD800 && cp <= 0xDFFF)) {
      return Error(at,
                   absl::StrCat("escape \\", std::string(1, e), " is not a Unicode scalar value"));
    }
    return static_cast<uint32_t>(cp);
  }

  absl::StatusOr<Expr> Literal(char quote) {
    const size_t at = pos_;
    ++pos_;
    Expr lit;
    lit.kind = Expr::Kind::kLiteral;
    while (!AtEnd() && text_[pos_] != quote) {
      ASSIGN_OR_RETURN(const uint32_t cp, Char());
      tok::AppendUtf8(cp, &lit.text);
    }
    if (AtEnd()) return Error(at, "unterminated literal");
    ++pos_;
    if (lit.text.empty()) lit.kind = Expr::Kind::kSeq;  // "" matches the empty text
    return lit;
  }

  absl::StatusOr<Expr> Class() {
    const size_t at = pos_;
    ++pos_;
    bool negated = false;
    if (Peek() == '^') {
      negated = true;
      ++pos_;
    }
    Expr cls;
    cls.kind = Expr::Kind::kClass;
    while (!AtEnd() && text_[pos_] != ']') {
      const size_t from = pos_;
      ASSIGN_OR_RETURN(const uint32_t lo, Char());
      uint32_t hi = lo;
      if (Peek() == '-' && pos_ + 1 < text_.size() && text_[pos_ + 1] != ']') {
        ++pos_;
        ASSIGN_OR_RETURN(hi, Char());
        if (hi < lo) return Error(from, "a range whose end is before its start");
      }
      cls.set.Add(lo, hi);
    }
    if (AtEnd()) return Error(at, "unterminated character class");
    ++pos_;
    if (negated) cls.set = cls.set.Complement();
    return cls;
  }

  std::string_view text_;
  size_t pos_ = 0;
  std::vector<Rule> rules_;
  absl::flat_hash_map<std::string, int32_t> index_;
  int32_t root_ = -1;
};

// The regex of `root`, rules that can reach themselves unfolded (see gbnf.h).
class Unfolder {
 public:
  Unfolder(const std::vector<Rule>& rules, const GbnfOptions& options)
      : rules_(rules),
        max_depth_(std::clamp(options.max_depth, 1, kMaxDepthOption)),
        max_nodes_(options.max_nodes),
        refs_(rules.size()),
        scc_(rules.size(), -1),
        cyclic_(rules.size(), 0),
        open_(rules.size(), 0),
        memo_(rules.size()) {
    for (size_t r = 0; r < rules.size(); ++r) CollectRefs(rules[r].body, &refs_[r]);
    Components();
  }

  absl::StatusOr<Regex> Unfold(int32_t root) {
    ASSIGN_OR_RETURN(Regex r, RuleRegex(root, 0));
    if (r->kind == RegexNode::Kind::kNothing) {
      return absl::InvalidArgumentError(
          absl::StrCat("grammar: ", rules_[root].name, " matches no text",
                       any_cyclic_ ? absl::StrCat(" (a rule that can reach itself unfolds at most ",
                                                  max_depth_, " levels deep)")
                                   : ""));
    }
    return r;
  }

 private:
  static void CollectRefs(const Expr& e, std::vector<int32_t>* out) {
    if (e.kind == Expr::Kind::kRef) out->push_back(e.rule);
    for (const Expr& c : e.children) CollectRefs(c, out);
  }

  // Strongly connected components of the reference graph (Tarjan's, iterative): a rule is
  // cyclic when its component has several rules or it names itself.
  void Components() {
    const int32_t n = static_cast<int32_t>(rules_.size());
    std::vector<int32_t> index(n, -1), low(n, 0), stack;
    std::vector<uint8_t> on_stack(n, 0);
    std::vector<std::pair<int32_t, size_t>> frames;  // (rule, next reference to look at)
    int32_t counter = 0;
    for (int32_t start = 0; start < n; ++start) {
      if (index[start] >= 0) continue;
      frames.push_back({start, 0});
      while (!frames.empty()) {
        auto& [v, next] = frames.back();
        if (next == 0 && index[v] < 0) {
          index[v] = low[v] = counter++;
          stack.push_back(v);
          on_stack[v] = 1;
        }
        if (next < refs_[v].size()) {
          const int32_t w = refs_[v][next++];
          if (index[w] < 0) {
            frames.push_back({w, 0});
          } else if (on_stack[w]) {
            low[v] = std::min(low[v], index[w]);
          }
          continue;
        }
        if (low[v] == index[v]) {
          const int32_t id = static_cast<int32_t>(members_.size());
          members_.emplace_back();
          int32_t w;
          do {
            w = stack.back();
            stack.pop_back();
            on_stack[w] = 0;
            scc_[w] = id;
            members_[id].push_back(w);
          } while (w != v);
        }
        const int32_t done = v;
        frames.pop_back();
        if (!frames.empty())
          low[frames.back().first] = std::min(low[frames.back().first], low[done]);
      }
    }
    for (int32_t r = 0; r < n; ++r) {
      const bool self = std::find(refs_[r].begin(), refs_[r].end(), r) != refs_[r].end();
      cyclic_[r] = members_[scc_[r]].size() > 1 || self;
      any_cyclic_ = any_cyclic_ || cyclic_[r];
    }
  }

  // A rule's regex. One that cannot reach itself does not depend on the path that reached it
  // (no rule it reaches can be open: it would then reach itself), so it is built once; a cyclic
  // one depends only on how often each rule of its component is open, which keys its memo.
  absl::StatusOr<Regex> RuleRegex(int32_t r, int32_t frames) {
    if (!cyclic_[r]) {
      auto it = memo_[r].find(std::string());
      if (it != memo_[r].end()) return it->second;
      ASSIGN_OR_RETURN(Regex built, Build(rules_[r].body, frames + 1));
      memo_[r].emplace(std::string(), built);
      return built;
    }
    if (open_[r] >= max_depth_) return Nothing();
    std::string key;
    for (int32_t m : members_[scc_[r]]) key.push_back(static_cast<char>(open_[m]));
    auto it = memo_[r].find(key);
    if (it != memo_[r].end()) return it->second;
    ++open_[r];
    absl::StatusOr<Regex> built = Build(rules_[r].body, frames + 1);
    --open_[r];
    if (!built.ok()) return built.status();
    memo_[r].emplace(std::move(key), *built);
    return built;
  }

  absl::StatusOr<Regex> Build(const Expr& e, int32_t frames) {
    if (++nodes_ > max_nodes_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "grammar: unfolds into more than ", max_nodes_,
          " nodes (its recursive rules fan out too widely for ", max_depth_, " levels)"));
    }
    if (frames > kMaxUnfoldFrames) {
      return absl::InvalidArgumentError(
          absl::StrCat("grammar: rules nest more than ", kMaxUnfoldFrames, " deep"));
    }
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return Literal(e.text);
      case Expr::Kind::kClass:
        return Class(e.set);
      case Expr::Kind::kRef:
        return RuleRegex(e.rule, frames);
      case Expr::Kind::kRepeat: {
        ASSIGN_OR_RETURN(Regex inner, Build(e.children[0], frames + 1));
        return Repeat(std::move(inner), e.min, e.max);
      }
      case Expr::Kind::kSeq:
      case Expr::Kind::kAlt: {
        std::vector<Regex> parts;
        parts.reserve(e.children.size());
        for (const Expr& c : e.children) {
          ASSIGN_OR_RETURN(Regex part, Build(c, frames + 1));
          parts.push_back(std::move(part));
        }
        return e.kind == Expr::Kind::kSeq ? Concat(std::move(parts)) : Alt(std::move(parts));
      }
    }
    return Nothing();
  }

  const std::vector<Rule>& rules_;
  const int32_t max_depth_;
  const int64_t max_nodes_;
  std::vector<std::vector<int32_t>> refs_;
  std::vector<int32_t> scc_;
  std::vector<std::vector<int32_t>> members_;
  std::vector<uint8_t> cyclic_;
  bool any_cyclic_ = false;
  std::vector<int32_t> open_;
  std::vector<absl::flat_hash_map<std::string, Regex>> memo_;
  int64_t nodes_ = 0;
};

}  // namespace

absl::StatusOr<Regex> GbnfToRegex(std::string_view grammar, const GbnfOptions& options) {
  Parser parser(grammar);
  RETURN_IF_ERROR(parser.Parse(options.root));
  return Unfolder(parser.rules(), options).Unfold(parser.root());
}

}  // namespace kvrm::structured
