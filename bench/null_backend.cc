#include "bench/null_backend.h"

#include <sys/prctl.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <thread>

#include "common/logging.h"
#include "common/status_macros.h"

namespace kvrm::bench {

absl::StatusOr<DeviceTiming> DeviceTiming::Preset(const std::string& name) {
  DeviceTiming t;
  if (name == "none") return t;
  if (name != "h200") {
    return absl::InvalidArgumentError("--device_timing=" + name + ": use none or h200");
  }
  t.decode_fixed_us = 610;
  t.decode_row_us = 0.05;
  t.decode_kv_token_ns = 7.2;
  t.chunk_apart_us = 850;
  t.chunk_in_pass_us = 530;
  t.chunk_attention_ns = 0.5;
  t.copy_group_us = 10;
  t.copy_device_gbs = 1500;
  t.copy_host_gbs = 20;
  return t;
}

NullBackend::NullBackend(int32_t vocab, int64_t blocks, int32_t block_tokens, int32_t chunk,
                         bool device, absl::Duration spin, DeviceTiming timing)
    : vocab_(vocab), chunk_(chunk), device_(device), spin_(spin), timing_(timing) {
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

void NullBackend::Take(std::chrono::steady_clock::time_point start, double us) {
  if (us <= 0) return;
  thread_local bool slack_set = false;
  if (!slack_set) {
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);  // wake-ups within microseconds, not 50
    slack_set = true;
  }
  const auto deadline = start + std::chrono::nanoseconds(static_cast<int64_t>(us * 1e3));
  // Sleep to near the deadline, then spin: a wake-up comes tens of microseconds late.
  constexpr auto kSpin = std::chrono::microseconds(60);
  if (const auto now = std::chrono::steady_clock::now(); deadline - now > kSpin) {
    std::this_thread::sleep_until(deadline - kSpin);
  }
  while (std::chrono::steady_clock::now() < deadline) {
  }
  modelled_ns_.fetch_add(static_cast<int64_t>(us * 1e3), std::memory_order_relaxed);
  overshoot_ns_.fetch_add(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                           deadline)
          .count(),
      std::memory_order_relaxed);
}

double NullBackend::DecodeUs(const StepDescriptor& step) const {
  if (!timing_.enabled()) return 0;
  int64_t rows = 0, kv = 0;
  for (int32_t s = 0; s < step.max_slots; ++s) {
    if (!step.active[s]) continue;
    ++rows;
    kv += step.position[s] + 1;
  }
  if (rows == 0) return 0;
  return timing_.decode_fixed_us + timing_.decode_row_us * rows +
         timing_.decode_kv_token_ns * 1e-3 * kv;
}

double NullBackend::ChunkUs(const PrefillChunk& chunk, bool in_pass) const {
  if (!timing_.enabled()) return 0;
  const double n = static_cast<double>(chunk.tokens.size());
  const double history = chunk.start + (n + 1) / 2;  // what the chunk's rows attend to, on average
  return (in_pass ? timing_.chunk_in_pass_us : timing_.chunk_apart_us) +
         timing_.chunk_attention_ns * 1e-3 * n * history;
}

void NullBackend::FillRows(const StepDescriptor& step, float* logits, int32_t* tokens) const {
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
}

void NullBackend::FillLast(const PrefillChunk& chunk, float* last_logits) const {
  if (last_logits == nullptr) return;
  const int32_t n = static_cast<int32_t>(chunk.tokens.size());
  std::fill(last_logits, last_logits + vocab_, 0.0f);
  last_logits[Next(chunk.tokens.back(), chunk.start + n - 1)] = 10.0f;
}

absl::Status NullBackend::DecodeAndSample(const StepDescriptor& step, float* logits,
                                          int32_t* tokens) {
  const auto t0 = std::chrono::steady_clock::now();
  FillRows(step, logits, tokens);
  backend_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  Take(t0, DecodeUs(step));
  return absl::OkStatus();
}

absl::Status NullBackend::Prefill(const PrefillChunk& chunk, float* last_logits) {
  const auto t0 = std::chrono::steady_clock::now();
  FillLast(chunk, last_logits);
  Take(t0, ChunkUs(chunk, /*in_pass=*/false));
  return absl::OkStatus();
}

absl::Status NullBackend::DecodeWithChunk(const PrefillChunk& chunk, float* last_logits,
                                          const StepDescriptor& step, float* logits) {
  return DecodeWithChunkAndSample(chunk, last_logits, step, logits, nullptr);
}

absl::Status NullBackend::DecodeWithChunkAndSample(const PrefillChunk& chunk, float* last_logits,
                                                   const StepDescriptor& step, float* logits,
                                                   int32_t* tokens) {
  const auto t0 = std::chrono::steady_clock::now();
  FillLast(chunk, last_logits);
  FillRows(step, logits, tokens);
  // One pass: the step's cost (its fixed part even with no decode row) and the chunk's share.
  Take(t0, std::max(DecodeUs(step), timing_.decode_fixed_us) + ChunkUs(chunk, /*in_pass=*/true));
  return absl::OkStatus();
}

absl::Status NullBackend::CopyGroup(const TransferGroup& group) {
  const auto t0 = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(Backend::CopyGroup(group));
  if (timing_.enabled()) {
    const bool host = group.src_tier == KvTier::kHost || group.dst_tier == KvTier::kHost;
    const double bytes = static_cast<double>(group.num_blocks) * timing_.bytes_per_block;
    Take(t0, timing_.copy_group_us +
                 bytes / ((host ? timing_.copy_host_gbs : timing_.copy_device_gbs) * 1e3));
  }
  return absl::OkStatus();
}

}  // namespace kvrm::bench
