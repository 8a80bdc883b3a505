// Byte-level BPE training (the GPT-2 / Llama 3 scheme) over pre-token counts.
//
// Input: distinct pre-tokens (raw bytes, as the pre-tokenizer regex splits text) with counts.
// Output: a vocabulary whose ids 0..255 are the single bytes in byte order, followed by one
// token per merge in merge order. Merges are learned greedily: the most frequent adjacent pair
// (summed over pre-token counts) is merged next; ties go to the lexicographically smallest pair
// (comparing the two parts' bytes, unsigned). A pair whose concatenation is already a token
// (reachable by a different split) is skipped rather than recorded, so merge i always creates
// token 256 + i.
#ifndef KVRM_TOOLS_MODELGEN_BPE_TRAINER_H_
#define KVRM_TOOLS_MODELGEN_BPE_TRAINER_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace kvrm::modelgen {

struct BpeTrainerOptions {
  int num_merges = 0;
  // Pairs seen fewer times than this are never merged; training fails if it runs out first.
  int64_t min_frequency = 2;
};

struct BpeModel {
  std::vector<std::string> tokens;  // id -> raw bytes; tokens.size() == 256 + merges.size()
  std::vector<std::pair<int32_t, int32_t>> merges;  // merge i: (left id, right id) -> 256 + i
};

using WordCounts = std::vector<std::pair<std::string, int64_t>>;

// FAILED_PRECONDITION when fewer than options.num_merges pairs reach min_frequency (the corpus
// is too small); INVALID_ARGUMENT on bad options or non-positive counts. Deterministic: the
// result does not depend on the order of `words`.
absl::StatusOr<BpeModel> TrainBpe(const WordCounts& words, const BpeTrainerOptions& options);

// GPT-2's reversible byte -> printable character map (as UTF-8), used by byte-level tokenizers.
const std::array<std::string, 256>& ByteLevelAlphabet();

// Maps raw bytes to their byte-level string ("a b" -> "aĠb").
std::string ToByteLevel(std::string_view bytes);

}  // namespace kvrm::modelgen

#endif  // KVRM_TOOLS_MODELGEN_BPE_TRAINER_H_
