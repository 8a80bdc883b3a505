// A regular language over UTF-8 text, as an immutable tree: what the regex parser and the JSON
// Schema translator produce and the automaton compiler (automaton.h) consumes.
//
// Characters are Unicode code points (classes hold code point ranges); the compiler lowers them to
// UTF-8 byte sequences, so the language is a set of byte strings that are all valid UTF-8.
// Builders simplify as they go (a concatenation holding Nothing is Nothing, Nothing drops out of an
// alternation, one-child lists collapse), so a translator can build freely and still get a small
// tree. Nodes are shared (shared_ptr to const), never copied: a subtree used twice is one node.
#ifndef KVRM_RUNTIME_STRUCTURED_REGEX_AST_H_
#define KVRM_RUNTIME_STRUCTURED_REGEX_AST_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kvrm::structured {

inline constexpr uint32_t kMaxCodePoint = 0x10FFFF;

// Inclusive [lo, hi].
struct CodePointRange {
  uint32_t lo = 0;
  uint32_t hi = 0;
};

// Sorted, disjoint, non-adjacent ranges; never containing the surrogates D800-DFFF (no UTF-8
// encodes them).
class CodePointSet {
 public:
  CodePointSet() = default;
  static CodePointSet Range(uint32_t lo, uint32_t hi);
  static CodePointSet Single(uint32_t c) { return Range(c, c); }
  static CodePointSet All() { return Range(0, kMaxCodePoint); }

  void Add(uint32_t lo, uint32_t hi);
  void AddSet(const CodePointSet& other);
  // Everything in [0, kMaxCodePoint] (surrogates excluded) that is not in this set.
  CodePointSet Complement() const;
  bool Contains(uint32_t c) const;
  bool empty() const { return ranges_.empty(); }
  const std::vector<CodePointRange>& ranges() const { return ranges_; }

 private:
  void Normalize();
  std::vector<CodePointRange> ranges_;
};

// The UTF-8 encodings of the code points in [lo, hi] (no surrogates inside) as sequences of
// byte ranges: every byte string of the union, and no other, matches one sequence position by
// position (what the automaton compiler lowers a class to, and what a class's size counts).
struct ByteRange {
  uint8_t lo = 0;
  uint8_t hi = 0;
};
std::vector<std::vector<ByteRange>> Utf8Sequences(uint32_t lo, uint32_t hi);

struct RegexNode;
using Regex = std::shared_ptr<const RegexNode>;

struct RegexNode {
  enum class Kind {
    kNothing,  // matches no string at all
    kEmpty,    // matches only ""
    kLiteral,  // `text`: these bytes exactly (valid UTF-8)
    kClass,    // one code point of `set`
    kConcat,   // `children` in order
    kAlt,      // any one of `children`
    kRepeat,   // `children[0]` between `min` and `max` times (max < 0: unbounded)
  };
  Kind kind = Kind::kNothing;
  std::string text;
  CodePointSet set;
  std::vector<Regex> children;
  int32_t min = 0;
  int32_t max = 0;
  // States a Thompson automaton of this tree needs, saturating at kSizeLimit: lets callers refuse
  // a pattern (a{1000}{1000}) before building anything of that size.
  int64_t size = 0;
};

inline constexpr int64_t kSizeLimit = int64_t{1} << 40;

Regex Nothing();
Regex Empty();
Regex Literal(std::string_view utf8);
Regex Class(CodePointSet set);  // an empty set is Nothing
Regex Concat(std::vector<Regex> parts);
Regex Alt(std::vector<Regex> options);
Regex Repeat(Regex r, int32_t min, int32_t max);  // max < 0: unbounded; CHECKs 0 <= min <= max
inline Regex Optional(Regex r) { return Repeat(std::move(r), 0, 1); }
inline Regex Star(Regex r) { return Repeat(std::move(r), 0, -1); }
inline Regex Plus(Regex r) { return Repeat(std::move(r), 1, -1); }

// The tree in regex syntax (what ParseRegex reads back into the same language), for error
// messages, logs and tests.
std::string ToPattern(const Regex& r);

}  // namespace kvrm::structured

#endif  // KVRM_RUNTIME_STRUCTURED_REGEX_AST_H_
