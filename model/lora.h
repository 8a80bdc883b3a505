// LoRA adapters in PEFT's layout (github.com/huggingface/peft), loaded for multi-LoRA serving:
// a directory with adapter_config.json and adapter_model.safetensors.
//
// An adapted projection W [out][in] computes W x + scale * B (A x), with A [rank][in] and
// B [out][rank] as PEFT stores them (lora_A.weight, lora_B.weight) and scale = lora_alpha / r
// (lora_alpha / sqrt(r) with use_rslora). The base weights are never changed: requests with
// different adapters, or none, share one decode pass (runtime/cpu_rank.h applies each row's
// adapter), as vLLM's and TGI's multi-LoRA serving do.
//
// Supported: LoRA on any of the seven Llama projections (q, k, v, o, gate, up, down; Phi-3's
// fused qkv_proj and gate_up_proj, whose B rows split like the base matrix's), in any subset of
// layers, tensors in f32, bf16 or f16. Refused with a message naming the field or tensor:
// anything that would compute something other than PEFT does (DoRA, trained biases,
// fan_in_fan_out, modules_to_save, per-module rank or alpha patterns, embedding or lm_head
// adapters, tensors of unknown modules or the wrong shape).
//
// The files are untrusted: every size is checked against the model's config before anything is
// allocated from it.
#ifndef KVRM_MODEL_LORA_H_
#define KVRM_MODEL_LORA_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "model/config.h"

namespace kvrm {

// The largest rank (r) an adapter may have (vLLM's --max-lora-rank goes up to 512 too).
inline constexpr int32_t kMaxLoraRank = 512;

// The projections an adapter may adapt, in the order of a layer's forward pass.
enum class LoraTarget : int32_t { kQ = 0, kK, kV, kO, kGate, kUp, kDown };
inline constexpr int32_t kNumLoraTargets = 7;
// "q_proj", "k_proj", ... as PEFT's target_modules name them.
std::string_view LoraTargetName(LoraTarget target);

// One adapted projection: delta W = B A with the adapter's scale already multiplied into B.
// rank == 0: the projection is not adapted (in and out 0 too, a and b empty).
struct LoraMatrix {
  int32_t rank = 0;
  int64_t in = 0;        // the base matrix's columns
  int64_t out = 0;       // the base matrix's rows
  std::vector<float> a;  // [rank][in], row-major
  std::vector<float> b;  // [out][rank], row-major, times scale
};

// A module an adapter may name in a model of `config` ("self_attn.q_proj"; Phi-3's fused
// "self_attn.qkv_proj" and "mlp.gate_up_proj"), with the projections whose B rows it stacks, in
// forward order.
struct LoraModule {
  std::string_view path;
  std::vector<LoraTarget> targets;
};
std::vector<LoraModule> LoraModulesOf(const LlamaConfig& config);

// The base projection's [out][in] in a model of `config`.
std::pair<int64_t, int64_t> LoraTargetShape(const LlamaConfig& config, LoraTarget target);

struct LoraLayer {
  std::array<LoraMatrix, kNumLoraTargets> m;  // indexed by LoraTarget
  const LoraMatrix& at(LoraTarget t) const { return m[static_cast<int32_t>(t)]; }
};

struct LoraAdapter {
  std::string name;  // what requests select it by
  std::string path;  // the directory it was loaded from
  int32_t rank = 0;  // adapter_config.json's r
  double alpha = 0;  // lora_alpha
  double scale = 0;  // alpha / r, or alpha / sqrt(r) with use_rslora
  std::string base_model;  // base_model_name_or_path ("" when absent): informational
  std::vector<LoraLayer> layers;  // [config.num_hidden_layers]
  // A and B values as the file stores them, all projections (a fused projection's A counted
  // once, as PEFT counts trainable parameters); the loaded floats hold A once per target.
  int64_t num_parameters = 0;
  // Which projections any layer adapts (names in LoraTarget order; Phi-3's qkv_proj shows as
  // q_proj, k_proj, v_proj), for messages and ServerInfo.
  std::vector<std::string> target_modules;
};

// Loads `dir` (adapter_config.json + adapter_model.safetensors) for a model of `config`.
// Tensor names as PEFT saves them
// (base_model.model.model.layers.{L}.self_attn.q_proj.lora_A.weight), also without the leading
// base_model.model. and with an adapter name (lora_A.default.weight);
// every tensor must be one of those, and each adapted projection needs both its A and B.
// NaN or infinite values are refused, as is a file with no tensors.
// NOT_FOUND when a file is missing; INVALID_ARGUMENT naming the field or tensor for malformed
// content or shapes that do not fit the model; UNIMPLEMENTED naming the field for PEFT features
// listed above as refused.
absl::StatusOr<LoraAdapter> LoadLoraAdapter(const LlamaConfig& config, std::string_view name,
                                            const std::string& dir);

}  // namespace kvrm

#endif  // KVRM_MODEL_LORA_H_
