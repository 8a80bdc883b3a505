// Attention of one slot's queries over its KV history, read through a run table.
//
// KV layout of one layer (the pool's, see runtime/kv_pool.h): K and V each
// [kv_heads][num_blocks * block_tokens][head_dim] floats, so that a run of physically
// consecutive blocks is one contiguous stretch of tokens per head: long sequential reads.
#ifndef KVRM_KERNELS_CPU_ATTENTION_H_
#define KVRM_KERNELS_CPU_ATTENTION_H_

#include <cstdint>

#include "common/dtype.h"
#include "common/logging.h"

namespace kvrm {

// A maximal stretch of a slot's logical blocks that is physically contiguous.
struct KvRun {
  int32_t first_block = 0;  // physical block id of the run's first block
  int32_t num_blocks = 0;
};

struct KvLayerView {
  void* k = nullptr;  // [kv_heads][pool_tokens][head_dim] of `dtype`
  void* v = nullptr;
  int64_t head_stride = 0;  // pool_tokens * head_dim
  int32_t block_tokens = 0;
  int32_t head_dim = 0;
  // f32; bf16 (--kv_dtype=bf16: half the bytes per token); FP8 E4M3 or E5M2 (--kv_dtype=fp8,
  // fp8_e5m2: a quarter), which hold key / k_scale and value / v_scale.
  DType dtype = DType::kF32;
  // The layer's FP8 scales (checkpoint k_scale / v_scale, else 1); f32 and bf16 pools ignore them.
  float k_scale = 1;
  float v_scale = 1;

  // What a stored element, widened (FP8 through its f16 view), is multiplied by to be the key
  // (value) it stands for: 1 but for FP8 pools.
  float KeyUnit() const { return IsFp8(dtype) ? k_scale * Fp8HalfUnit(dtype) : 1.0f; }
  float ValueUnit() const { return IsFp8(dtype) ? v_scale * Fp8HalfUnit(dtype) : 1.0f; }

  int64_t Offset(int64_t head, int64_t physical_token) const {
    return head * head_stride + physical_token * head_dim;
  }
  // f32 pools.
  float* KeyAt(int64_t head, int64_t physical_token) const {
    DCHECK(dtype == DType::kF32);
    return static_cast<float*>(k) + Offset(head, physical_token);
  }
  float* ValueAt(int64_t head, int64_t physical_token) const {
    DCHECK(dtype == DType::kF32);
    return static_cast<float*>(v) + Offset(head, physical_token);
  }
  // Either dtype: the first byte of a token's key (value) row.
  char* KeyBytes(int64_t head, int64_t physical_token) const {
    return static_cast<char*>(k) + Offset(head, physical_token) * DTypeSize(dtype);
  }
  char* ValueBytes(int64_t head, int64_t physical_token) const {
    return static_cast<char*>(v) + Offset(head, physical_token) * DTypeSize(dtype);
  }
};

// Writes one token's key and value rows (head_dim floats each) into `kv` at (head, physical
// token), rounded to nearest even for a bf16 pool; for an FP8 pool, key / k_scale and
// value / v_scale rounded to nearest even, saturating at the format's largest finite value.
void StoreKv(const KvLayerView& kv, int64_t head, int64_t physical_token, const float* key,
             const float* value);

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

// What a row's scores are beyond q . k * scale, and which keys it sees beyond the causal mask
// (Gemma 2's softcapping; sliding-window layers of Mistral, Qwen2, Phi-3 and Gemma).
struct AttentionScoring {
  float scale = 1;
  // > 0: each score s (already scaled) becomes softcap * tanh(s / softcap) before the softmax.
  float softcap = 0;
  // > 0: a row at position seq_len - 1 attends to the last min(window, seq_len) positions only.
  int64_t window = 0;
  // gpt-oss's attention sinks: null, or one logit per query head of the group ([group]) that
  // joins its softmax's denominator (exp(sink - max) added to the sum, the max taken over the
  // sink too) and takes no value, so the weights sum to less than 1.
  const float* sinks = nullptr;
  // With a window: whole blocks behind it that the run table no longer lists (a model whose
  // every layer slides releases them, runtime/engine.h), in tokens; the table starts at this
  // logical position. At most seq_len - window, and 0 without a window shorter than seq_len.
  int64_t released_tokens = 0;
};

// AttendGroup with `scoring`: AttendGroup itself, bit for bit, with no softcap and no window.
void AttendGroup(const float* q, int32_t group, const KvLayerView& kv, int32_t kv_head,
                 const KvRun* runs, int32_t num_runs, int64_t seq_len,
                 const AttentionScoring& scoring, float* scores, float* out);

// Largest query-head group AttendGroup takes.
inline constexpr int32_t kMaxAttentionGroup = 16;

// ---- far-history summaries (runtime/far_history.h) ---------------------------------------------
//
// With far history on, a slot's run table lists only its kept blocks, in logical order: logical
// blocks [0, sink_blocks) (the sinks), then logical blocks from sink_blocks + dropped on; the
// `dropped` blocks in between were summarized and freed. One row attends to
//   its sink tokens, exactly;
//   summary entries [0, num_summaries) (entry j: logical block sink_blocks + j), whose scores get
//     + log_weight (log of the tokens an entry stands for);
//   logical tokens from (sink_blocks + num_summaries) * block_tokens to seq_len - 1, exactly.
// num_summaries >= dropped: a block may still be in the run table while its summary is read (the
// step that summarizes it).
struct FarAttention {
  int32_t sink_blocks = 0;
  int32_t dropped = 0;
  int32_t num_summaries = 0;
  const float* k_summary = nullptr;  // [num_summaries][head_dim] of the KV head attended
  const float* v_summary = nullptr;
  float log_weight = 0;

  bool active() const { return num_summaries > 0 || dropped > 0; }
};

// Where logical position `pos` sits in a run table that lacks `dropped` blocks after the first
// `sink_blocks` (pass it to PhysicalToken). The identity when nothing was dropped.
inline int64_t KeptPosition(int64_t pos, int32_t block_tokens, int32_t sink_blocks,
                            int32_t dropped) {
  const int64_t sink_tokens = int64_t{sink_blocks} * block_tokens;
  return dropped == 0 || pos < sink_tokens ? pos : pos - int64_t{dropped} * block_tokens;
}

// AttendGroup over sinks + summaries + window (see FarAttention). With !far.active() it is
// AttendGroup itself, bit for bit. `scores` holds group * seq_len floats (a row attends to at
// most seq_len columns).
void AttendGroupFar(const float* q, int32_t group, const KvLayerView& kv, int32_t kv_head,
                    const KvRun* runs, int32_t num_runs, int64_t seq_len, const FarAttention& far,
                    float scale, float* scores, float* out);
// With a softcap, each summary's score is capped before + log_weight. A window shorter than
// seq_len with far history active is not computed (the engine does not combine them).
void AttendGroupFar(const float* q, int32_t group, const KvLayerView& kv, int32_t kv_head,
                    const KvRun* runs, int32_t num_runs, int64_t seq_len, const FarAttention& far,
                    const AttentionScoring& scoring, float* scores, float* out);

// One summary entry of KV head `kv_head`: the mean of the block_tokens keys and of the values
// that start at physical token `first_token` (one block). k_out and v_out are [head_dim].
void SummarizeBlock(const KvLayerView& kv, int32_t kv_head, int64_t first_token, float* k_out,
                    float* v_out);

}  // namespace kvrm

#endif  // KVRM_KERNELS_CPU_ATTENTION_H_
