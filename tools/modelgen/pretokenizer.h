// The Llama 3 pre-tokenizer split (the regex of its tokenizer.json), run with Oniguruma as
// Hugging Face tokenizers does, so training sees exactly the pieces inference will see.
#ifndef KVRM_TOOLS_MODELGEN_PRETOKENIZER_H_
#define KVRM_TOOLS_MODELGEN_PRETOKENIZER_H_

#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "tools/modelgen/bpe_trainer.h"

namespace kvrm::modelgen {

// The Llama 3 Split pattern (behavior Isolated), verbatim as in tokenizer.json.
inline constexpr std::string_view kLlama3SplitPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

class PreTokenizer {
 public:
  // INTERNAL if Oniguruma rejects the pattern.
  static absl::StatusOr<std::unique_ptr<PreTokenizer>> Create();
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Calls `piece` for each matched piece and each unmatched gap, in order (Isolated behavior).
  template <typename F>
  void Split(std::string_view text, F&& piece) const {
    size_t pos = 0;
    while (pos < text.size()) {
      size_t begin, end;
      if (!NextMatch(text, pos, &begin, &end)) break;
      if (begin > pos) piece(text.substr(pos, begin - pos));
      piece(text.substr(begin, end - begin));
      pos = end;
    }
    if (pos < text.size()) piece(text.substr(pos));
  }

  // Adds the count of every piece of `text` to `counts` (keyed by raw bytes).
  void Count(std::string_view text, WordCounts* counts) const;

 private:
  explicit PreTokenizer(void* regex) : regex_(regex) {}
  // The next non-empty match at or after `pos`; false when none.
  bool NextMatch(std::string_view text, size_t pos, size_t* begin, size_t* end) const;

  void* regex_;   // OnigRegex (kept opaque so users need not include oniguruma.h)
  void* region_;  // OnigRegion, reused: a PreTokenizer is used by one thread at a time
};

}  // namespace kvrm::modelgen

#endif  // KVRM_TOOLS_MODELGEN_PRETOKENIZER_H_
