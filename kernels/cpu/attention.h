// Attention of one slot's queries over its KV history, read through a run table.
//
// KV layout of one layer (the pool's, see runtime/kv_pool.h): K and V each
// [kv_heads][num_blocks * block_tokens][head_dim] floats, so that a run of physically
// consecutive blocks is one contiguous stretch of tokens per head: long sequential reads.
#ifndef KVRM_KERNELS_CPU_ATTENTION_H_
#define KVRM_KERNELS_CPU_ATTENTION_H_

#include <cstdint>

namespace kvrm {

// A maximal stretch of a slot's logical blocks that is physically contiguous.
struct KvRun {
  int32_t first_block = 0;  // physical block id of the run's first block
  int32_t num_blocks = 0;
};

struct KvLayerView {
  float* k = nullptr;        // [kv_heads][pool_tokens][head_dim]
  float* v = nullptr;
  int64_t head_stride = 0;   // pool_tokens * head_dim
  int32_t block_tokens = 0;
  int32_t head_dim = 0;

  float* KeyAt(int64_t head, int64_t physical_token) const {
    return k + head * head_stride + physical_token * head_dim;
  }
  float* ValueAt(int64_t head, int64_t physical_token) const {
    return v + head * head_stride + physical_token * head_dim;
  }
};

// Physical token index of logical position `pos` of a history laid out by `runs`.
int64_t PhysicalToken(const KvRun* runs, int32_t num_runs, int32_t block_tokens, int64_t pos);

// One query head attending to logical positions [0, seq_len) of KV head `kv_head`:
// out[d] = sum_t softmax_t(q . k_t * scale) v_t[d]. `scores` holds seq_len floats.
void AttendOneHead(const float* q, const KvLayerView& kv, int32_t kv_head, const KvRun* runs,
                   int32_t num_runs, int64_t seq_len, float scale, float* scores, float* out);

// The `group` query heads that share KV head `kv_head` (grouped-query attention), so each K and
// V row is read from memory once for the whole group. q and out are [group][head_dim]
// (consecutive heads); `scores` holds group * seq_len floats. Per head, the same sums as
// AttendOneHead in the same order: results do not depend on the grouping or the run layout.
void AttendGroup(const float* q, int32_t group, const KvLayerView& kv, int32_t kv_head,
                 const KvRun* runs, int32_t num_runs, int64_t seq_len, float scale, float* scores,
                 float* out);

// Largest query-head group AttendGroup takes.
inline constexpr int32_t kMaxAttentionGroup = 16;

}  // namespace kvrm

#endif  // KVRM_KERNELS_CPU_ATTENTION_H_
