// tokenizer.json "pre_tokenizer": cuts normalized text into the pieces the model encodes one by
// one (HF `pre_tokenizers`).
#ifndef KVRM_MODEL_TOKENIZER_PRETOKENIZER_H_
#define KVRM_MODEL_TOKENIZER_PRETOKENIZER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/json.h"
#include "model/tokenizer_text.h"

namespace kvrm::tok {

// One pre-token. `at_start`: it begins at offset 0 of the original input (HF's
// `offsets_original().0 == 0`, which Metaspace's prepend_scheme "first" tests).
struct Piece {
  std::string text;
  bool at_start = false;
};

// Immutable after parsing; PreTokenize is thread-safe. Empty pieces are dropped, as HF does.
class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void PreTokenize(std::vector<Piece>* pieces) const = 0;
};

// Supported: Sequence, Split, ByteLevel, Metaspace, Digits, WhitespaceSplit; other types are
// UNIMPLEMENTED naming the type.
absl::StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const Json& j, const JsonPath& at,
                                                                int depth = 0);

// How the spans of a Split are kept (HF SplitDelimiterBehavior).
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// The [start, end) ranges of `text` a split with `behavior` keeps, from FindMatches spans.
std::vector<std::pair<size_t, size_t>> ApplySplitBehavior(const std::vector<Span>& spans,
                                                          SplitBehavior behavior);

}  // namespace kvrm::tok

#endif  // KVRM_MODEL_TOKENIZER_PRETOKENIZER_H_
