// Text helpers shared by the tokenizer pipeline stages: UTF-8 handling with Rust's semantics
// (HF `tokenizers` is Rust), the GPT-2 byte<->char table, Unicode classes, Oniguruma patterns and
// checked JSON accessors for tokenizer.json.
#ifndef KVRM_MODEL_TOKENIZER_TEXT_H_
#define KVRM_MODEL_TOKENIZER_TEXT_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/json.h"

struct re_pattern_buffer;  // Oniguruma's regex_t.

namespace kvrm::tok {

// ---- UTF-8 ----------------------------------------------------------------------------------

bool IsValidUtf8(std::string_view s);
// Rust's String::from_utf8_lossy: each maximal ill-formed subsequence becomes one U+FFFD.
std::string Utf8Lossy(std::string_view bytes);
// Byte length of the character starting at s[i]; `s` must be valid UTF-8.
inline size_t Utf8Len(unsigned char lead) {
  return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}
// Decodes the character at s[*i] (valid UTF-8) and advances *i.
uint32_t NextCodePoint(std::string_view s, size_t* i);
// The code point ending at s[end) (valid UTF-8, end > 0).
uint32_t PrevCodePoint(std::string_view s, size_t end);
void AppendUtf8(uint32_t cp, std::string* out);
// Number of characters.
size_t Utf8Count(std::string_view s);

// ---- Unicode classes, as Rust defines them --------------------------------------------------

bool IsWhitespace(uint32_t cp);  // char::is_whitespace / regex \s (White_Space)
bool IsWordChar(uint32_t cp);    // regex \w
bool IsNumeric(uint32_t cp);     // char::is_numeric (Nd, Nl, No)

// ---- GPT-2 byte-level alphabet --------------------------------------------------------------

// The printable character (UTF-8) that stands for each byte.
const std::array<std::string, 256>& ByteToChar();
// Inverse of ByteToChar: -1 for code points that stand for no byte.
int CharToByte(uint32_t cp);

// ---- Patterns -------------------------------------------------------------------------------

// A [start, end) byte span and whether it is a match of the pattern (true) or the text between.
struct Span {
  size_t start;
  size_t end;
  bool is_match;
};

// HF's `Pattern`: a literal string or an Oniguruma regex (HF compiles its regexes with onig, so
// the same engine gives the same matches). Immutable after construction; FindMatches is
// thread-safe (each call has its own onig region).
class Pattern {
 public:
  static absl::StatusOr<std::unique_ptr<Pattern>> Literal(std::string literal);
  static absl::StatusOr<std::unique_ptr<Pattern>> Regex(std::string_view regex);
  ~Pattern();
  Pattern(const Pattern&) = delete;
  Pattern& operator=(const Pattern&) = delete;

  // Covers all of `text` with match and non-match spans, in order (HF `find_matches`). An empty
  // text yields one empty non-match span.
  std::vector<Span> FindMatches(std::string_view text) const;

 private:
  Pattern() = default;
  std::vector<std::pair<size_t, size_t>> MatchRanges(std::string_view text) const;

  std::string literal_;
  re_pattern_buffer* regex_ = nullptr;
};

// Replaces every match of `pattern` in `s` with `content`.
std::string ReplaceAll(const Pattern& pattern, std::string_view s, std::string_view content);

// ---- tokenizer.json accessors ---------------------------------------------------------------

// Where a value sits in the file, for errors: "tokenizer.json: model.merges[3]".
class JsonPath {
 public:
  JsonPath(std::string what, std::string path) : what_(std::move(what)), path_(std::move(path)) {}
  JsonPath Key(std::string_view key) const;
  JsonPath Index(size_t i) const;
  // INVALID_ARGUMENT "<what>: <path>: <message>".
  absl::Status Invalid(std::string_view message) const;
  absl::Status Unimplemented(std::string_view message) const;
  const std::string& path() const { return path_; }

 private:
  std::string what_;
  std::string path_;
};

// The member `key` of object `obj`, or nullptr when absent or JSON null.
const Json* Member(const Json& obj, std::string_view key);
absl::StatusOr<std::string> RequiredString(const Json& obj, std::string_view key,
                                           const JsonPath& at);
absl::StatusOr<std::string> OptionalString(const Json& obj, std::string_view key,
                                           const JsonPath& at, std::string fallback);
absl::StatusOr<bool> OptionalBool(const Json& obj, std::string_view key, const JsonPath& at,
                                  bool fallback);
absl::StatusOr<int64_t> OptionalInt(const Json& obj, std::string_view key, const JsonPath& at,
                                    int64_t fallback);
// A string that is exactly one character (Metaspace replacement, Strip content).
absl::StatusOr<uint32_t> RequiredChar(const Json& obj, std::string_view key, const JsonPath& at);
// {"String": s} or {"Regex": r} as used by Split and Replace.
absl::StatusOr<std::unique_ptr<Pattern>> ParsePattern(const Json& obj, std::string_view key,
                                                      const JsonPath& at);

}  // namespace kvrm::tok

#endif  // KVRM_MODEL_TOKENIZER_TEXT_H_
