#include "runtime/structured/regex_ast.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "model/tokenizer_text.h"

namespace kvrm::structured {
namespace {

void SplitUtf8(uint32_t lo, uint32_t hi, std::vector<std::vector<ByteRange>>* out) {
  // First by encoded length: both ends must take the same number of bytes.
  for (uint32_t boundary : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= boundary && hi > boundary) {
      SplitUtf8(lo, boundary, out);
      SplitUtf8(boundary + 1, hi, out);
      return;
    }
  }
  if (hi < 0x80) {
    out->push_back({{static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)}});
    return;
  }
  // Then until every continuation byte below the first that differs spans its whole range.
  for (int i = 1; i < 4; ++i) {
    const uint32_t max = (1u << (6 * i)) - 1;
    if ((lo & ~max) != (hi & ~max)) {
      if ((lo & max) != 0) {
        SplitUtf8(lo, lo | max, out);
        SplitUtf8((lo | max) + 1, hi, out);
        return;
      }
      if ((hi & max) != max) {
        SplitUtf8(lo, (hi & ~max) - 1, out);
        SplitUtf8(hi & ~max, hi, out);
        return;
      }
    }
  }
  std::string a, b;
  tok::AppendUtf8(lo, &a);
  tok::AppendUtf8(hi, &b);  // as long as a: both ends take the same number of bytes
  std::vector<ByteRange> seq(a.size());
  for (size_t k = 0; k < a.size(); ++k) {
    seq[k] = {static_cast<uint8_t>(a[k]), static_cast<uint8_t>(b[k])};
  }
  out->push_back(std::move(seq));
}

constexpr uint32_t kSurrogateLo = 0xD800;
constexpr uint32_t kSurrogateHi = 0xDFFF;

int64_t SatAdd(int64_t a, int64_t b) { return std::min(kSizeLimit, a + b); }
int64_t SatMul(int64_t a, int64_t b) {
  if (a == 0 || b == 0) return 0;
  return a > kSizeLimit / b ? kSizeLimit : std::min(kSizeLimit, a * b);
}

Regex Make(RegexNode node) { return std::make_shared<const RegexNode>(std::move(node)); }

bool IsMeta(uint32_t c) {
  switch (c) {
    case '\\': case '.': case '+': case '*': case '?': case '(': case ')': case '|':
    case '[': case ']': case '{': case '}': case '^': case '$': case '-': case '/':
      return true;
    default:
      return false;
  }
}

void AppendCodePoint(uint32_t c, bool in_class, std::string* out) {
  if (c >= 0x20 && c < 0x7F) {
    if (IsMeta(c) || (in_class && c == '&')) out->push_back('\\');
    out->push_back(static_cast<char>(c));
    return;
  }
  absl::StrAppendFormat(out, "\\x{%X}", c);
}

void AppendPattern(const Regex& r, std::string* out);

void AppendGrouped(const Regex& r, std::string* out) {
  const bool atom = r->kind == RegexNode::Kind::kClass ||
                    (r->kind == RegexNode::Kind::kLiteral && r->text.size() == 1);
  if (atom) {
    AppendPattern(r, out);
  } else {
    out->append("(?:");
    AppendPattern(r, out);
    out->push_back(')');
  }
}

void AppendPattern(const Regex& r, std::string* out) {
  switch (r->kind) {
    case RegexNode::Kind::kNothing:
      out->append("[^\\x{0}-\\x{10FFFF}]");
      return;
    case RegexNode::Kind::kEmpty:
      out->append("(?:)");
      return;
    case RegexNode::Kind::kLiteral:
      for (size_t i = 0; i < r->text.size();) AppendCodePoint(tok::NextCodePoint(r->text, &i), false, out);
      return;
    case RegexNode::Kind::kClass: {
      const auto& ranges = r->set.ranges();
      if (ranges.size() == 1 && ranges[0].lo == ranges[0].hi) {
        AppendCodePoint(ranges[0].lo, false, out);
        return;
      }
      out->push_back('[');
      for (const CodePointRange& range : ranges) {
        AppendCodePoint(range.lo, true, out);
        if (range.hi != range.lo) {
          out->push_back('-');
          AppendCodePoint(range.hi, true, out);
        }
      }
      out->push_back(']');
      return;
    }
    case RegexNode::Kind::kConcat:
      for (const Regex& child : r->children) {
        if (child->kind == RegexNode::Kind::kAlt) {
          AppendGrouped(child, out);
        } else {
          AppendPattern(child, out);
        }
      }
      return;
    case RegexNode::Kind::kAlt:
      for (size_t k = 0; k < r->children.size(); ++k) {
        if (k > 0) out->push_back('|');
        AppendPattern(r->children[k], out);
      }
      return;
    case RegexNode::Kind::kRepeat:
      AppendGrouped(r->children[0], out);
      if (r->min == 0 && r->max == 1) {
        out->push_back('?');
      } else if (r->min == 0 && r->max < 0) {
        out->push_back('*');
      } else if (r->min == 1 && r->max < 0) {
        out->push_back('+');
      } else if (r->max < 0) {
        absl::StrAppend(out, "{", r->min, ",}");
      } else if (r->min == r->max) {
        absl::StrAppend(out, "{", r->min, "}");
      } else {
        absl::StrAppend(out, "{", r->min, ",", r->max, "}");
      }
      return;
  }
}

}  // namespace

CodePointSet CodePointSet::Range(uint32_t lo, uint32_t hi) {
  CodePointSet s;
  s.Add(lo, hi);
  return s;
}

void CodePointSet::Add(uint32_t lo, uint32_t hi) {
  hi = std::min(hi, kMaxCodePoint);
  if (lo > hi) return;
  // Surrogates are not characters: cut them out of the range.
  if (lo <= kSurrogateHi && hi >= kSurrogateLo) {
    if (lo < kSurrogateLo) ranges_.push_back({lo, kSurrogateLo - 1});
    if (hi > kSurrogateHi) ranges_.push_back({kSurrogateHi + 1, hi});
  } else {
    ranges_.push_back({lo, hi});
  }
  Normalize();
}

void CodePointSet::AddSet(const CodePointSet& other) {
  ranges_.insert(ranges_.end(), other.ranges_.begin(), other.ranges_.end());
  Normalize();
}

void CodePointSet::Normalize() {
  std::sort(ranges_.begin(), ranges_.end(),
            [](const CodePointRange& a, const CodePointRange& b) { return a.lo < b.lo; });
  std::vector<CodePointRange> merged;
  merged.reserve(ranges_.size());
  for (const CodePointRange& r : ranges_) {
    // Ranges that touch across the surrogate gap stay apart: the gap is never in a set.
    if (!merged.empty() && r.lo <= merged.back().hi + 1) {
      merged.back().hi = std::max(merged.back().hi, r.hi);
    } else {
      merged.push_back(r);
    }
  }
  ranges_ = std::move(merged);
}

CodePointSet CodePointSet::Complement() const {
  CodePointSet out;
  uint32_t next = 0;
  for (const CodePointRange& r : ranges_) {
    if (r.lo > next) out.Add(next, r.lo - 1);
    next = r.hi + 1;
  }
  if (next <= kMaxCodePoint) out.Add(next, kMaxCodePoint);
  return out;
}

bool CodePointSet::Contains(uint32_t c) const {
  auto it = std::upper_bound(ranges_.begin(), ranges_.end(), c,
                             [](uint32_t v, const CodePointRange& r) { return v < r.lo; });
  return it != ranges_.begin() && std::prev(it)->hi >= c;
}

Regex Nothing() {
  static const Regex* nothing = new Regex(Make(RegexNode{.kind = RegexNode::Kind::kNothing}));
  return *nothing;
}

Regex Empty() {
  static const Regex* empty =
      new Regex(Make(RegexNode{.kind = RegexNode::Kind::kEmpty, .size = 1}));
  return *empty;
}

Regex Literal(std::string_view utf8) {
  if (utf8.empty()) return Empty();
  return Make(RegexNode{.kind = RegexNode::Kind::kLiteral,
                        .text = std::string(utf8),
                        .size = static_cast<int64_t>(utf8.size()) + 1});
}

std::vector<std::vector<ByteRange>> Utf8Sequences(uint32_t lo, uint32_t hi) {
  std::vector<std::vector<ByteRange>> out;
  if (lo <= hi) SplitUtf8(lo, std::min(hi, kMaxCodePoint), &out);
  return out;
}

Regex Class(CodePointSet set) {
  if (set.empty()) return Nothing();
  // What the automaton compiler builds: a state per byte range of each UTF-8 sequence, and one
  // fork over the sequences.
  int64_t size = 1;
  for (const CodePointRange& range : set.ranges()) {
    for (const std::vector<ByteRange>& seq : Utf8Sequences(range.lo, range.hi)) {
      size += static_cast<int64_t>(seq.size());
    }
  }
  return Make(RegexNode{.kind = RegexNode::Kind::kClass, .set = std::move(set), .size = size});
}

Regex Concat(std::vector<Regex> parts) {
  std::vector<Regex> flat;
  flat.reserve(parts.size());
  for (Regex& p : parts) {
    CHECK(p != nullptr);
    switch (p->kind) {
      case RegexNode::Kind::kNothing:
        return Nothing();
      case RegexNode::Kind::kEmpty:
        break;
      case RegexNode::Kind::kConcat:
        flat.insert(flat.end(), p->children.begin(), p->children.end());
        break;
      case RegexNode::Kind::kLiteral:
        // Adjacent literals merge: fewer nodes, same language.
        if (!flat.empty() && flat.back()->kind == RegexNode::Kind::kLiteral) {
          flat.back() = Literal(flat.back()->text + p->text);
          break;
        }
        flat.push_back(std::move(p));
        break;
      default:
        flat.push_back(std::move(p));
    }
  }
  if (flat.empty()) return Empty();
  if (flat.size() == 1) return flat[0];
  int64_t size = 0;
  for (const Regex& p : flat) size = SatAdd(size, p->size);
  return Make(RegexNode{.kind = RegexNode::Kind::kConcat, .children = std::move(flat), .size = size});
}

Regex Alt(std::vector<Regex> options) {
  std::vector<Regex> flat;
  flat.reserve(options.size());
  for (Regex& o : options) {
    CHECK(o != nullptr);
    if (o->kind == RegexNode::Kind::kNothing) continue;
    if (o->kind == RegexNode::Kind::kAlt) {
      flat.insert(flat.end(), o->children.begin(), o->children.end());
    } else {
      flat.push_back(std::move(o));
    }
  }
  if (flat.empty()) return Nothing();
  if (flat.size() == 1) return flat[0];
  int64_t size = 0;
  for (const Regex& o : flat) size = SatAdd(size, SatAdd(o->size, 1));
  return Make(RegexNode{.kind = RegexNode::Kind::kAlt, .children = std::move(flat), .size = size});
}

Regex Repeat(Regex r, int32_t min, int32_t max) {
  CHECK(r != nullptr);
  CHECK(min >= 0 && (max < 0 || max >= min)) << "repeat {" << min << "," << max << "}";
  if (max == 0) return Empty();
  if (r->kind == RegexNode::Kind::kNothing) return min == 0 ? Empty() : Nothing();
  if (r->kind == RegexNode::Kind::kEmpty) return Empty();
  if (min == 1 && max == 1) return r;
  const int64_t copies = max < 0 ? static_cast<int64_t>(min) + 1 : max;
  const int64_t size = SatAdd(SatMul(SatAdd(r->size, 1), copies), 1);
  return Make(RegexNode{.kind = RegexNode::Kind::kRepeat,
                        .children = {std::move(r)},
                        .min = min,
                        .max = max < 0 ? -1 : max,
                        .size = size});
}

std::string ToPattern(const Regex& r) {
  std::string out;
  AppendPattern(r, &out);
  return out;
}

}  // namespace kvrm::structured
