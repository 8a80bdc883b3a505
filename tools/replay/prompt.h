// Prompts of exact token lengths, as token ids, so the server's tokenizer cannot change them.
//
// Ids are drawn uniformly from the vocabulary minus the special ids (BOS, EOS), so no prompt
// contains an end-of-sequence token. A request with hash ids gets, for its i-th id, a block of
// `hash_block_tokens` ids generated from (seed, hash id) alone: requests whose leading hash ids
// agree share identical leading blocks, which is what prefix caching can reuse. Tokens past the
// blocks come from (seed, request index), so different requests differ there.
#ifndef KVRM_TOOLS_REPLAY_PROMPT_H_
#define KVRM_TOOLS_REPLAY_PROMPT_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "tools/replay/workload.h"

namespace kvrm::replay {

class PromptSynthesizer {
 public:
  // Fails unless some id in [0, vocab_size) is not in `special_ids`.
  static absl::StatusOr<PromptSynthesizer> Create(int vocab_size,
                                                  absl::Span<const int32_t> special_ids,
                                                  uint64_t seed);

  // Exactly request.input_tokens ids.
  std::vector<int32_t> Synthesize(const PlannedRequest& request) const;

 private:
  PromptSynthesizer(std::vector<int32_t> allowed, uint64_t seed)
      : allowed_(std::move(allowed)), seed_(seed) {}

  // Appends `count` ids drawn from a generator seeded with (seed_, stream, key).
  void AppendRandom(uint64_t stream, uint64_t key, int count, std::vector<int32_t>* out) const;

  std::vector<int32_t> allowed_;  // the ids prompts may use, ascending
  uint64_t seed_;
};

}  // namespace kvrm::replay

#endif  // KVRM_TOOLS_REPLAY_PROMPT_H_
