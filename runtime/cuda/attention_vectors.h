// Host side of the attention's vectors beyond the Llama block's, as the CUDA backend uploads
// them: Qwen2's Q/K/V biases, an O bias (Llama or Qwen3 with attention_bias) and Qwen3's per-head
// Q/K norm weights, every layer's in one f32 buffer per rank (f32 holds the f32, bf16 and f16
// stored values exactly, so the kernels read what the CPU rank reads). No CUDA: built and tested
// on every machine.
#ifndef KVRM_RUNTIME_CUDA_ATTENTION_VECTORS_H_
#define KVRM_RUNTIME_CUDA_ATTENTION_VECTORS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "model/config.h"
#include "runtime/tp_shard.h"

namespace kvrm::cuda {

struct AttentionVectors {
  // Offsets in floats into `data` of each layer's vectors, -1 where the model has none; each
  // starts 256-byte aligned (the kernels' 16-byte loads):
  //   qkv_bias [(heads + 2 kv_heads) * head_dim]: bq, bk, bv of this rank's heads, the fused QKV
  //            row's own layout (LaunchQkvBiasAndNorm);
  //   o_bias   [hidden], replicated (LaunchAddBiasAndRmsNorm);
  //   q_norm, k_norm [head_dim], replicated.
  struct Layer {
    int64_t qkv_bias = -1, o_bias = -1, q_norm = -1, k_norm = -1;
  };
  std::vector<Layer> layers;
  std::vector<float> data;  // empty when the model has none of them
};

// Packs one rank's vectors (`w`: ShardLlamaWeights' share, whose Q/K/V biases are already cut by
// heads). INVALID_ARGUMENT when the config names a vector the weights lack or a length differs.
absl::StatusOr<AttentionVectors> PackAttentionVectors(const LlamaConfig& config,
                                                      const RankWeights& w);

}  // namespace kvrm::cuda

#endif  // KVRM_RUNTIME_CUDA_ATTENTION_VECTORS_H_
