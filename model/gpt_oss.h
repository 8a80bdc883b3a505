// gpt-oss's experts as kvrm's per-expert matrices.
//
// GptOssExperts keeps each layer's experts in four fused tensors, transposed against nn.Linear:
//   mlp.experts.gate_up_proj       [E][hidden][2 I]  (column 2f: gate feature f; 2f + 1: up f)
//   mlp.experts.gate_up_proj_bias  [E][2 I]          (interleaved alike)
//   mlp.experts.down_proj          [E][I][hidden]
//   mlp.experts.down_proj_bias     [E][hidden]
// or, in openai's own MXFP4 checkpoints, gate_up_proj_blocks / _scales [E][2 I][hidden / 32]
// and down_proj_blocks / _scales [E][hidden][I / 32] (output rows, as nn.Linear; see
// LoadMxfp4Rows) with the biases as above.
//
// BindLlamaWeights asks for each expert's products and biases by per-expert names, as a
// Qwen-MoE checkpoint stores them ("model.layers.N.mlp.experts.E.gate_proj.weight",
// up_proj, down_proj, and ".bias"); GptOssExpertTensor makes them from the fused tensors: the
// products as [I][hidden] gate / up and [hidden][I] down matrices in new buffers (the
// checkpoint's dtype, exactly; MXFP4 as LoadMxfp4Rows says), the gate / up biases as f32
// vectors, the down bias a view of its row.
#ifndef KVRM_MODEL_GPT_OSS_H_
#define KVRM_MODEL_GPT_OSS_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cpu/weight_matrix.h"
#include "model/config.h"
#include "model/quantized_checkpoint.h"
#include "model/safetensors.h"

namespace kvrm {

// One expert's tensor that `name` asks for (the per-expert names above), built from `files`'
// fused tensors and checked against `shape`; std::nullopt when `name` is not such a name.
// `converted` receives the new buffers and must outlive the views. `options` (MXFP4 only): how
// FP4 blocks are held; null: q8 blocks.
std::optional<absl::StatusOr<WeightMatrix>> GptOssExpertTensor(
    const SafetensorsSet& files, const LlamaConfig& config, const std::string& name,
    const std::vector<int64_t>& shape, const QuantizedLoadOptions* options,
    std::vector<std::vector<std::byte>>* converted, QuantizedLoadStats* stats);

}  // namespace kvrm

#endif  // KVRM_MODEL_GPT_OSS_H_
