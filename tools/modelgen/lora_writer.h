// Writes a deterministic random LoRA adapter in PEFT's layout (adapter_config.json +
// adapter_model.safetensors) for a model of a given LlamaConfig, as model/lora.h loads it.
//
// Values. PEFT initializes B to zero, so a freshly created adapter changes nothing; this one looks
// trained instead, so that an engine which drops or misapplies it produces different text:
//   - lora_A has std 1/sqrt(in): on an input x of unit RMS, A x has unit RMS (r values);
//   - lora_B has std 0.3 / (scale * sqrt(r)) (scale = alpha / r, or alpha / sqrt(r) with
//     use_rslora): scale * B (A x) then has RMS 0.3 on every output row, against the base
//     projection's ~1 (weight_init.h gives every projection std 1/sqrt(fan_in)). So each adapted
//     projection moves by about 30% of its output: every greedy continuation changes, and the
//     adapted model is still a sane, non-degenerate language model.
// For the defaults (r 8, alpha 16: scale 2) B's std is 0.3 / (2 sqrt(8)) ~= 0.053.
// Each tensor's values come from a stream seeded by (seed, tensor name), as weight_init.h's do,
// so the same layer and module get the same values whatever else the adapter targets.
#ifndef KVRM_TOOLS_MODELGEN_LORA_WRITER_H_
#define KVRM_TOOLS_MODELGEN_LORA_WRITER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "model/config.h"

namespace kvrm::modelgen {

// The RMS of scale * B A x relative to the base projection's output, on a unit-RMS input.
inline constexpr double kLoraRelativeRms = 0.3;

struct MakeLoraOptions {
  std::string out_dir;  // created if missing
  int32_t rank = 8;
  double alpha = 16;
  bool use_rslora = false;
  // PEFT's module names. For a model with fused projections (Phi-3), q_proj / k_proj / v_proj
  // each mean qkv_proj and gate_proj / up_proj mean gate_up_proj (the only modules such a model
  // has, which PEFT would target), and qkv_proj / gate_up_proj may be named directly.
  std::vector<std::string> target_modules = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                             "gate_proj", "up_proj", "down_proj"};
  std::vector<int32_t> layers;  // empty: every layer (otherwise written as layers_to_transform)
  DType dtype = DType::kF32;    // of the tensors
  uint64_t seed = 0;
  std::string base_model;  // written as base_model_name_or_path
};

// Writes <out_dir>/adapter_config.json (sorted keys, as PEFT's save_pretrained writes them) and
// <out_dir>/adapter_model.safetensors (__metadata__ {"format": "pt"}) with tensors
// base_model.model.model.layers.{L}.{self_attn|mlp}.{module}.lora_{A|B}.weight, layer by layer
// in forward order. INVALID_ARGUMENT for a rank outside [1, kMaxLoraRank] (model/lora.h),
// alpha <= 0, an unknown module or one the model does not have, a layer outside the model, or no
// out_dir.
absl::Status MakeLoraAdapter(const LlamaConfig& config, const MakeLoraOptions& options);

// The LlamaConfig of a make_model size ("tiny", "tiny-phi3", ...: model_spec.h), as its
// config.json would load.
absl::StatusOr<LlamaConfig> LlamaConfigForSize(std::string_view size);

}  // namespace kvrm::modelgen

#endif  // KVRM_TOOLS_MODELGEN_LORA_WRITER_H_
