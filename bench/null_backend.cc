#include "bench/null_backend.h"

#include <algorithm>
#include <chrono>
#include <random>

#include "common/logging.h"

namespace kvrm::bench {

NullBackend::NullBackend(int32_t vocab, int64_t blocks, int32_t block_tokens, int32_t chunk,
                         bool device, absl::Duration spin)
    : vocab_(vocab), chunk_(chunk), device_(device), spin_(spin) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  patterns_.resize(static_cast<size_t>(kPatterns) * vocab);
  for (float& x : patterns_) x = normal(rng);
  KvPoolShape shape;
  shape.num_layers = 1;
  shape.kv_heads = 1;
  shape.head_dim = 4;
  shape.block_tokens = block_tokens;
  shape.num_blocks = blocks;
  absl::StatusOr<std::unique_ptr<KvPool>> pool = KvPool::Create(shape);
  CHECK_OK(pool.status());
  pool_ = std::move(*pool);
}

int32_t NullBackend::Next(int32_t token, int32_t position) const {
  return 100 + (token * 31 + position * 7) % (vocab_ - 200);  // clear of the special ids
}

absl::Status NullBackend::Decode(const StepDescriptor& step, float* logits) {
  return DecodeAndSample(step, logits, nullptr);
}

absl::Status NullBackend::DecodeAndSample(const StepDescriptor& step, float* logits,
                                          int32_t* tokens) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int32_t s = 0; s < step.max_slots; ++s) {
    if (!step.active[s]) continue;
    const int32_t next = Next(step.token[s], step.position[s]);
    if (tokens != nullptr && step.sampling[s].on_device) {
      tokens[s] = next;
      continue;
    }
    float* row = logits + static_cast<size_t>(s) * vocab_;
    const float* pattern = patterns_.data() + static_cast<size_t>(next % kPatterns) * vocab_;
    std::copy(pattern, pattern + vocab_, row);
    row[next] = 12.0f;  // above every normal(0, 2) draw of the pattern (6 sigma)
  }
  backend_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return absl::OkStatus();
}

absl::Status NullBackend::Prefill(const PrefillChunk& chunk, float* last_logits) {
  if (last_logits != nullptr) {
    const int32_t n = static_cast<int32_t>(chunk.tokens.size());
    std::fill(last_logits, last_logits + vocab_, 0.0f);
    last_logits[Next(chunk.tokens.back(), chunk.start + n - 1)] = 10.0f;
  }
  return absl::OkStatus();
}

}  // namespace kvrm::bench
