// The Llama step's CUDA kernels, each behind a checked launch wrapper (INVALID_ARGUMENT on a bad
// shape, INTERNAL naming the launch on a CUDA error). Activations are f32 except the inputs of
// the cuBLASLt products, which are bf16 (written by the kernel before the product); weights bf16;
// the KV pool f32 or bf16 (the KV kernels are templates on its element type).
//
// Every kernel reads the step's rows through StepInputs (kernels/cuda/step_inputs.h) in device
// memory, so the same launches serve every replay of a captured graph.
#ifndef KVRM_KERNELS_CUDA_LLAMA_KERNELS_H_
#define KVRM_KERNELS_CUDA_LLAMA_KERNELS_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/step_inputs.h"

namespace kvrm::cuda {

using bf16 = __nv_bfloat16;

// x[r][:] = embed[token[r]][:] (f32), for every row (inactive rows read token 0).
absl::Status LaunchEmbed(const bf16* embed, StepInputs in, int32_t hidden, float* x,
                         cudaStream_t stream);

// out[r][:] = x[r] / sqrt(mean(x[r]^2) + eps) * w. With `row_select` non-null, one row: x's row
// *row_select goes to out row 0 (a prefill chunk's last token, chosen on the device).
template <typename Out>
absl::Status LaunchRmsNorm(const float* x, const bf16* weight, Out* out, int32_t rows,
                           int32_t dim, float eps, const int32_t* row_select,
                           cudaStream_t stream);

// The O projection's bias and the MLP's RMSNorm in one launch (models with an O bias: Llama or
// Qwen3 with attention_bias): x[r] += bias (f32 [dim], kept in the residual stream), then out[r]
// as LaunchRmsNorm<bf16> writes it. On the CPU the bias joins the all-reduced O partials before
// the residual add, here the residual after it: the same sum in another order.
absl::Status LaunchAddBiasAndRmsNorm(float* x, const float* bias, const bf16* weight, bf16* out,
                                     int32_t rows, int32_t dim, float eps, cudaStream_t stream);

// Qwen2's Q/K/V biases and Qwen3's per-head Q/K norms on the fused QKV product's rows, before
// RoPE (LaunchRopeAndStoreKv), as the CPU rank computes them: qkv [rows][(heads + 2 kv_heads) *
// head_dim] += bias ([(heads + 2 kv_heads) * head_dim] f32, the row's own layout: bq, bk, bv;
// null: none), then each Q head and each K head RMS-normalised over head_dim with q_norm /
// k_norm ([head_dim] f32, both or neither; null: none): x * inv * w, inv = 1 / sqrt(sum of
// squares (f32) / head_dim + eps). Every row, active or not. head_dim a multiple of 32, at most
// 128; one warp per (row, head), the head in registers, no block barrier.
absl::Status LaunchQkvBiasAndNorm(float* qkv, int32_t rows, int32_t heads, int32_t kv_heads,
                                  int32_t head_dim, const float* bias, const float* q_norm,
                                  const float* k_norm, float eps, cudaStream_t stream);

// The K/V cache of one layer of one rank: [kv_heads][pool_tokens][head_dim] each, of `Kv`: float
// (the default f32 pool) or bf16 (--kv_dtype=bf16, half the bytes per token). The backend picks
// the instantiation from the pool's DType (runtime/cuda/cuda_backend.cc).
template <typename Kv>
struct KvLayer {
  Kv* k = nullptr;
  Kv* v = nullptr;
  int64_t head_stride = 0;  // pool_tokens * head_dim (elements)
  int32_t block_tokens = 0;
  int32_t head_dim = 0;
};

// qkv: [rows][(heads + 2 * kv_heads) * head_dim] from the fused QKV product. Rotates Q and K in
// place (RoPE, rotate-half; `rope` [max_context][head_dim]: cos half then sin half; null: a
// layer without RoPE, SmolLM3's NoPE layers, whose Q and K stay as they are) and writes
// K and V of each active row to the physical token its run table gives its position. A bf16
// pool stores them rounded to nearest even exactly as the CPU's FloatToBf16 (common/dtype.h)
// does, so the two backends' pools hold the same bits for the same f32 K and V.
// Instantiated for Kv = float and bf16.
template <typename Kv>
absl::Status LaunchRopeAndStoreKv(float* qkv, StepInputs in, const float* rope, int32_t heads,
                                  int32_t kv_heads, KvLayer<Kv> kv, cudaStream_t stream);

// Fixed-shape attention scratch for `rows` rows: splits of `split_tokens` KV positions.
struct AttentionWorkspace {
  float* partial_out = nullptr;  // [rows][heads][splits][head_dim]
  float* partial_ml = nullptr;   // [rows][heads][splits][2]: running max and sum of exp
  int32_t splits = 0;
  int32_t split_tokens = 0;
  // [rows][kv_heads] counts of finished splits: zero before the first launch, and left zero by
  // each launch (the last split of a (row, KV head) merges the splits and resets its count).
  int32_t* done = nullptr;
  // Sets of tokens whose K and V each warp loads before using them (2 or 4): more in flight per
  // warp against more registers a thread (fewer blocks resident).
  int32_t token_sets = 2;
};
inline int64_t AttentionPartialFloats(int32_t rows, int32_t heads, int32_t splits,
                                      int32_t head_dim) {
  return int64_t{rows} * heads * splits * head_dim;
}
inline int64_t AttentionCounterInts(int32_t rows, int32_t kv_heads) {
  return int64_t{rows} * kv_heads;
}

// Attention of each active row's query heads over positions [0, position] of its run table, or
// with `window` > 0 (a sliding-window layer) over the last `window` of them, [position + 1 -
// window, position] (grouped-query: heads / kv_heads query heads per KV head), split over the
// KV length and then
// reduced, in one launch (the last split block of each row and KV head reduces). out:
// [rows][heads * head_dim] bf16 (zeros for inactive rows). head_dim 64 or 128, at most 8 query
// heads per KV head. K and V are widened to f32 as they are loaded (exactly, for
// bf16); scores, softmax and the weighted sum are f32 whatever Kv is. Instantiated for Kv =
// float and bf16.
template <typename Kv>
absl::Status LaunchAttention(const float* qkv, StepInputs in, KvLayer<Kv> kv, int32_t heads,
                             int32_t kv_heads, float scale, int32_t window, AttentionWorkspace ws,
                             bf16* out, cudaStream_t stream);

// out[r][i] = silu(gate_up[r][i]) * gate_up[r][ffn + i] (bf16), gate_up [rows][2 * ffn].
absl::Status LaunchSwiGlu(const float* gate_up, int32_t rows, int32_t ffn, bf16* out,
                          cudaStream_t stream);

// LoRA adapters (runtime/cuda/cuda_backend.cc): y += scale B (A x) on the rows that run one,
// as two launches after a projection's product, over the rows' adapters in in.adapter (1 + the
// adapter slot; 0: none, and the row is left alone). One launch serves up to kLoraMaxTargets
// projections that share their input (Q, K and V; gate and up) and write disjoint columns of one
// output. The factors are bf16, the sums f32; x is the product's bf16 input.
//
// One adapted projection's factors in one adapter slot (device memory; rank 0: the slot's
// adapter does not adapt this projection, or the slot is empty).
struct LoraFactors {
  const bf16* at = nullptr;  // A^T [in][stride], zeros past the rank
  const bf16* bt = nullptr;  // (scale B)^T [rank][out]
  int32_t rank = 0;
  int32_t stride = 0;
};
// The host writes the table the kernels read: one layout for g++ and nvcc.
static_assert(sizeof(LoraFactors) == 24 && alignof(LoraFactors) == 8,
              "LoraFactors: two pointers and two int32");
inline constexpr int32_t kLoraMaxTargets = 3;
inline constexpr int32_t kLoraMaxSplits = 8;
// The shrink's splits of the input features (partial sums the expand adds up).
inline int32_t LoraSplits(int32_t in) {
  const int32_t s = (in + 511) / 512;
  return s < 1 ? 1 : s > kLoraMaxSplits ? kLoraMaxSplits : s;
}
// Scratch of the shrink's partial sums for `rows` rows: [targets][splits][rows][max_rank] f32,
// `splits` the most of any launch (LoraSplits of the widest input).
inline int64_t LoraPartialFloats(int32_t rows, int32_t max_rank, int32_t splits) {
  return int64_t{kLoraMaxTargets} * splits * rows * max_rank;
}

// Shrink: partial[t][split][r][k] = sum over the split's features c of x[r][c] * at[c][k], for
// each row r whose adapter a adapts target t (factors[t * slots + a].rank > 0), k < that rank.
// x [rows][in] bf16; `factors` [targets][slots]; ranks at most max_rank.
absl::Status LaunchLoraShrink(const bf16* x, int32_t in, StepInputs rows,
                              const LoraFactors* factors, int32_t targets, int32_t slots,
                              int32_t max_rank, float* partial, cudaStream_t stream);

// Where each target's delta goes: columns [col[t], col[t] + out[t]) of y's rows.
struct LoraOutputs {
  int32_t out[kLoraMaxTargets] = {};
  int32_t col[kLoraMaxTargets] = {};
};
// Expand: y[r][col[t] + o] += sum_k mid[k] * bt[k][o], mid[k] = the shrink's partials summed
// over its splits (LoraSplits(in)), for the same rows and targets; y f32 with row stride ldy.
absl::Status LaunchLoraExpand(const float* partial, int32_t in, StepInputs rows,
                              const LoraFactors* factors, int32_t targets, int32_t slots,
                              int32_t max_rank, LoraOutputs outputs, float* y, int64_t ldy,
                              cudaStream_t stream);

// Per-slot penalty state: counts[r][v] = times v was generated, seen[r][v] = 1 when v was in the
// prompt or generated (uint8). Updated by the host between steps (or by LaunchAcceptTokens).
// Both null: no penalties (the rows' penalty parameters must then be off), nothing is read.
// `params` is [rows] SamplingRow (kernels/cuda/step_inputs.h), e.g. in.sample_params.
// Samples one token per active row from logits [rows][vocab] (modified in place: penalised,
// scaled, -inf outside the kept support) in vLLM's order: repetition, presence and frequency
// penalties; temperature; top-k, top-p and min-p as thresholds on the probability (ties at a
// threshold are all kept); then the inverse CDF at `uniform` over the kept ids in id order.
// `probs` is [rows][vocab] scratch.
absl::Status LaunchSample(float* logits, StepInputs in, int32_t vocab, const SamplingRow* params,
                          const int32_t* counts, const uint8_t* seen, float* probs,
                          int32_t* tokens_out, cudaStream_t stream);

// Tensor parallelism: rank k's logits for vocabulary ids [k * share, (k + 1) * share), gathered
// as gathered[k][row][j], laid out as full[row][k * share + j] for `rows` rows (what the sampling
// kernel reads).
absl::Status LaunchInterleaveShards(const float* gathered, int32_t ranks, int32_t rows,
                                    int32_t share, float* full, cudaStream_t stream);

// counts[r][tokens[r]] += 1 and seen[r][tokens[r]] = 1 for each active row.
absl::Status LaunchAcceptTokens(const int32_t* tokens, StepInputs in, int32_t vocab,
                                int32_t* counts, uint8_t* seen, cudaStream_t stream);

}  // namespace kvrm::cuda

#endif  // KVRM_KERNELS_CUDA_LLAMA_KERNELS_H_
