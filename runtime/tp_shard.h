// One tensor-parallel rank's share of the Llama weights, Megatron style, cut at load time from
// the same Hugging Face tensors every rank maps.
//
// Hugging Face stores nn.Linear weights [out][in]. Column-parallel products (Q, K, V by heads;
// gate and up by intermediate features; lm_head by vocabulary rows) take a contiguous range of
// rows: views into the mapped file. Row-parallel products (O by query heads, down by
// intermediate features) take a range of input columns: strided in the file, so each rank copies
// its shard into memory it owns, dense. Norms (Qwen3's per-head Q/K norms too), the O bias and
// the embedding are replicated (views); Q/K/V biases are cut by heads like their products.
#ifndef KVRM_RUNTIME_TP_SHARD_H_
#define KVRM_RUNTIME_TP_SHARD_H_

#include <cstdint>
#include <array>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/cpu/lora.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/weight_matrix.h"
#include "model/config.h"
#include "model/lora.h"
#include "model/weights.h"

namespace kvrm {

// One rank's share of one adapted projection (model/lora.h), laid out for the products of
// kernels/cpu/lora.h: at = A^T [in][rank_stride] over this rank's input columns (zeros past the
// rank), bt = (scale B)^T [rank][out] over this rank's output rows, in f32 (at, bt) or in bf16
// (at16, bt16: each value rounded to nearest, half the bytes). rank == 0: not adapted.
struct LoraShard {
  int32_t rank = 0;
  int32_t rank_stride = 0;  // rank rounded up to kLoraRankLanes
  int64_t in = 0;
  int64_t out = 0;
  bool bf16 = false;
  std::vector<float> at;
  std::vector<float> bt;
  std::vector<uint16_t> at16;
  std::vector<uint16_t> bt16;
};

// One rank's share of a LoRA adapter: [layer][LoraTarget].
using RankLora = std::vector<std::array<LoraShard, kNumLoraTargets>>;

struct RankWeights {
  int32_t rank = 0;
  int32_t size = 1;
  int32_t heads = 0;     // this rank's query heads: [rank * heads, (rank + 1) * heads)
  int32_t kv_heads = 0;  // this rank's KV heads, likewise
  int32_t ffn = 0;       // this rank's intermediate features
  // Mixture of experts: this rank's features of each expert, and the experts whose router rows
  // it holds ([router_begin, router_begin + router.rows) of each MoE layer).
  int32_t moe_ffn = 0;
  int32_t router_begin = 0;
  int32_t shared_ffn = 0;   // this rank's features of the shared expert (Qwen2-MoE)
  int32_t vocab_begin = 0;  // this rank's lm_head rows: [vocab_begin, vocab_begin + lm_head.rows)
  WeightMatrix embed;       // replicated
  WeightMatrix final_norm;  // replicated
  WeightMatrix lm_head;     // [vocab share][hidden]
  // Per layer: wq [heads * head_dim][hidden], wk/wv [kv_heads * head_dim][hidden],
  // wo [hidden][heads * head_dim] (owned), gate/up [ffn][hidden], down [hidden][ffn] (owned);
  // or, in a mixture-of-experts layer, each expert cut likewise by moe_ffn, and the router's
  // rows of this rank's experts (every rank runs every expert: the router is split only so that
  // the ranks' all-reduce of their slices gives each the same scores, bit for bit).
  std::vector<LayerWeights> layers;
  // Memory of the copied (row-parallel) shards; empty when size == 1.
  std::vector<std::unique_ptr<uint8_t[]>> owned;
  int64_t owned_bytes = 0;
  // The panel copies (AttachPanels).
  std::vector<PanelCopy> panels;
  int64_t panel_bytes = 0;
};

// INVALID_ARGUMENT when heads, KV heads or intermediate size do not divide by `size`, or when a
// rank's share of a row-parallel block-format matrix's inputs is not whole 32-column blocks. A
// q4_K or q6_K share that is, but splits a 256-column super-block, is copied as 8-bit blocks of
// exactly its values (q8 affine, q8 halves).
absl::StatusOr<RankWeights> ShardLlamaWeights(const LlamaConfig& config,
                                              const LlamaWeights& weights, int32_t rank,
                                              int32_t size);

// Rank `rank` of `size`'s share of `adapter` (loaded for `config`), cut like the base matrices
// (column-parallel Q/K/V/gate/up: B's rows; row-parallel O/down: A's columns, so each rank's
// delta is a partial sum the all-reduce completes), its factors kept as `dtype` (f32, or bf16).
// INVALID_ARGUMENT when the adapter's layers or shapes do not match the config's.
absl::StatusOr<RankLora> ShardLoraAdapter(const LlamaConfig& config, const LoraAdapter& adapter,
                                          int32_t rank, int32_t size, DType dtype = DType::kF32);

// Gives the rank's linear weights (Q, K, V, O, gate, up, down, lm_head) their panel copies
// (WeightMatrix::panels), in memory `weights` owns:
// - block panels (kernels/cpu/q8_0.h, q4_k.h) to every block-format matrix, and to every dense
//   one when `quantize` is kQ8_0 (each row's 32-column blocks quantized: --quantization=q8_0) or
//   kQ4K (each row's 256-column super-blocks quantized, q8_0 for a matrix whose rows are not
//   whole super-blocks, as llama-quantize falls back: --quantization=q4_K);
// - else, when `dense_panels`, dtype panels to those whose panels `isa`'s matmul reads
//   (MatMulReadsPanels).
// The row-major views stay: the embedding, the norms and the other kernel paths read them. The
// matrices are packed on `threads` threads (start-up only).
void AttachPanels(RankWeights* weights, CpuIsa isa, bool dense_panels, WeightFormat quantize,
                  int threads);

}  // namespace kvrm

#endif  // KVRM_RUNTIME_TP_SHARD_H_
