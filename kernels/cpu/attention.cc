#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>

#include "common/logging.h"

namespace kvrm {

int64_t PhysicalToken(const KvRun* runs, int32_t num_runs, int32_t block_tokens, int64_t pos) {
  int64_t logical_block = pos / block_tokens;
  for (int32_t r = 0; r < num_runs; ++r) {
    if (logical_block < runs[r].num_blocks) {
      return (static_cast<int64_t>(runs[r].first_block) + logical_block) * block_tokens +
             pos % block_tokens;
    }
    logical_block -= runs[r].num_blocks;
  }
  LOG(FATAL) << "position " << pos << " beyond the run table";
  return -1;
}

namespace {

inline float Dot(const float* __restrict a, const float* __restrict b, int32_t n) {
  constexpr int kLanes = 16;
  float acc[kLanes] = {};
  int32_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) acc[j] += a[i + j] * b[i + j];
  }
  float s = 0;
  for (int j = 0; j < kLanes; ++j) s += acc[j];
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

void AttendOneHead(const float* q, const KvLayerView& kv, int32_t kv_head, const KvRun* runs,
                   int32_t num_runs, int64_t seq_len, float scale, float* scores, float* out) {
  const int32_t d = kv.head_dim;
  // Pass 1: scores, run by run (each run contiguous in memory).
  int64_t t = 0;
  float mx = -INFINITY;
  for (int32_t r = 0; r < num_runs && t < seq_len; ++r) {
    const int64_t run_tokens =
        std::min<int64_t>(static_cast<int64_t>(runs[r].num_blocks) * kv.block_tokens, seq_len - t);
    const float* k = kv.KeyAt(kv_head, static_cast<int64_t>(runs[r].first_block) * kv.block_tokens);
    for (int64_t j = 0; j < run_tokens; ++j) {
      const float s = Dot(q, k + j * d, d) * scale;
      scores[t + j] = s;
      mx = std::max(mx, s);
    }
    t += run_tokens;
  }
  DCHECK(t == seq_len);
  float sum = 0;
  for (int64_t j = 0; j < seq_len; ++j) {
    scores[j] = std::exp(scores[j] - mx);
    sum += scores[j];
  }
  const float inv = 1.0f / sum;
  // Pass 2: weighted sum of values.
  std::fill(out, out + d, 0.0f);
  t = 0;
  for (int32_t r = 0; r < num_runs && t < seq_len; ++r) {
    const int64_t run_tokens =
        std::min<int64_t>(static_cast<int64_t>(runs[r].num_blocks) * kv.block_tokens, seq_len - t);
    const float* v =
        kv.ValueAt(kv_head, static_cast<int64_t>(runs[r].first_block) * kv.block_tokens);
    for (int64_t j = 0; j < run_tokens; ++j) {
      const float p = scores[t + j] * inv;
      const float* vj = v + j * d;
      for (int32_t i = 0; i < d; ++i) out[i] += p * vj[i];
    }
    t += run_tokens;
  }
}

}  // namespace kvrm
