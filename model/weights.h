// The Llama weight set, as views into the memory-mapped safetensors files.
#ifndef KVRM_MODEL_WEIGHTS_H_
#define KVRM_MODEL_WEIGHTS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cpu/weight_matrix.h"
#include "model/config.h"
#include "model/quantized_checkpoint.h"
#include "model/safetensors.h"

namespace kvrm {

struct LayerWeights {
  WeightMatrix attn_norm;  // [1][hidden]
  WeightMatrix wq;         // [heads * head_dim][hidden]
  WeightMatrix wk;         // [kv_heads * head_dim][hidden]
  WeightMatrix wv;         // [kv_heads * head_dim][hidden]
  WeightMatrix wo;         // [hidden][heads * head_dim]
  WeightMatrix mlp_norm;   // [1][hidden]: the MLP's input norm (Gemma: pre_feedforward_layernorm)
  WeightMatrix w_gate;     // [ffn][hidden]
  WeightMatrix w_up;       // [ffn][hidden]
  WeightMatrix w_down;     // [hidden][ffn]
  // Present only where the config says (data == nullptr otherwise): Q/K/V biases
  // (LlamaConfig::qkv_bias), the O bias (o_bias), and Qwen3's per-head norms (qk_norm).
  WeightMatrix bq;      // [1][heads * head_dim]
  WeightMatrix bk;      // [1][kv_heads * head_dim]
  WeightMatrix bv;      // [1][kv_heads * head_dim]
  WeightMatrix bo;      // [1][hidden]
  WeightMatrix q_norm;  // [1][head_dim]; OLMo 2 (qk_norm_whole): [1][heads * head_dim]
  WeightMatrix k_norm;  // [1][head_dim]; OLMo 2: [1][kv_heads * head_dim]
  // Gemma's sandwich norms (LlamaConfig::sandwich_norms) of the attention output
  // (post_attention_layernorm) and the MLP output (post_feedforward_layernorm).
  WeightMatrix attn_post_norm;  // [1][hidden]
  WeightMatrix mlp_post_norm;   // [1][hidden]
  // A mixture-of-experts layer (LlamaConfig::IsMoeLayer) has no w_gate / w_up / w_down but a
  // router, [num_experts][hidden], and each expert's SwiGLU products: [moe_ffn][hidden] gate and
  // up, [hidden][moe_ffn] down. Empty in a dense layer.
  WeightMatrix router;
  std::vector<WeightMatrix> expert_gate, expert_up, expert_down;
  // Qwen2-MoE's shared expert (LlamaConfig::shared_expert_intermediate_size), run on every token:
  // [shared_ffn][hidden] gate and up, [hidden][shared_ffn] down, and the [1][hidden] gate of its
  // output (sigmoid of its dot product with the MLP input). Empty otherwise.
  WeightMatrix shared_gate, shared_up, shared_down, shared_expert_gate;
  // gpt-oss (LlamaConfig::attention_sinks, moe_biases; empty otherwise): each query head's
  // sink logit (self_attn.sinks, [1][heads]), the router's bias ([1][experts]) and each expert's
  // gate and up biases ([1][moe_ffn]) and down bias ([1][hidden]).
  WeightMatrix sinks;
  WeightMatrix router_bias;
  std::vector<WeightMatrix> expert_gate_bias, expert_up_bias, expert_down_bias;
  // An FP8 KV cache (--kv_dtype=fp8) holds key / k_cache_scale and value / v_cache_scale: the
  // checkpoint's self_attn.k_scale and v_scale where it has them (LlamaWeights::kv_cache_scales),
  // else 1 (as vLLM). f32 and bf16 caches ignore them.
  float k_cache_scale = 1;
  float v_cache_scale = 1;
};

// Calls f(WeightMatrix&) on each linear product `layer` has: Q, K, V, O, then gate, up and down,
// or each expert's gate, up and down and the shared expert's (a mixture-of-experts layer). Not
// the router, the shared expert's gate, the norms or the biases. `layer` may be const.
template <typename Layer, typename F>
void ForEachLinearWeight(Layer& layer, F&& f) {
  for (auto* m : {&layer.wq, &layer.wk, &layer.wv, &layer.wo}) f(*m);
  if (layer.expert_gate.empty()) {
    for (auto* m : {&layer.w_gate, &layer.w_up, &layer.w_down}) f(*m);
    return;
  }
  for (size_t e = 0; e < layer.expert_gate.size(); ++e) {
    f(layer.expert_gate[e]);
    f(layer.expert_up[e]);
    f(layer.expert_down[e]);
  }
  if (layer.shared_gate.data != nullptr) {
    for (auto* m : {&layer.shared_gate, &layer.shared_up, &layer.shared_down}) f(*m);
  }
}

struct LlamaWeights {
  WeightMatrix embed;       // [vocab][hidden]
  WeightMatrix final_norm;  // [1][hidden]
  WeightMatrix lm_head;     // [vocab][hidden]; the embedding when tied
  // False for a base model's checkpoint without lm_head.weight (MistralModel, Qwen3Model: what
  // sentence-transformers saves of an embedding model): it serves embeddings only, and lm_head
  // is the embedding, never multiplied (Engine::Submit refuses generation).
  bool has_lm_head = true;
  std::vector<LayerWeights> layers;
  DType dtype = DType::kF32;  // of the embedding: what ModelInfo reports
  int64_t num_parameters = 0;
  // What one token runs: num_parameters less the experts it does not (a mixture of experts).
  int64_t num_active_parameters = 0;
  int64_t bytes = 0;
  // Where LayerWeights::k_cache_scale and v_cache_scale came from: "" (none: 1), or the
  // checkpoint's tensor names ("self_attn.k_scale / v_scale", ...; "..., 3 of 4 layers (the
  // rest 1)" where only some have them).
  std::string kv_cache_scales;
  // Why the checkpoint's scales could not be read (every scale then 1): only an FP8 KV cache
  // reads them, so only Engine::Create with --kv_dtype=fp8 refuses the model for it; f32 and
  // bf16 caches serve it as before.
  absl::Status kv_cache_scales_error;
};

// Finds one tensor by its Hugging Face name ("model.layers.0.self_attn.q_proj.weight"), checked
// against `shape` ([rows, cols], or [cols] for a norm): a view that stays valid while what it
// comes from lives.
using LlamaTensorBinder = std::function<absl::StatusOr<WeightMatrix>(
    const std::string& hf_name, const std::vector<int64_t>& shape)>;

// Where a checkpoint keeps the language model's tensors: "model." ("model.layers.N...."), under
// Gemma 3's multimodal wrappers "model.language_model." / "language_model.model.", or "" for a
// base model's checkpoint ("layers.N....", "embed_tokens.weight": MistralModel, Qwen3Model).
std::string LanguageModelPrefix(const LlamaConfig& config, const SafetensorsSet& files);

// Binds every tensor of `config` through `bind`, and counts parameters and bytes.
absl::StatusOr<LlamaWeights> BindLlamaWeights(const LlamaConfig& config,
                                              const LlamaTensorBinder& bind);

// How a quantized checkpoint's linear weights (config.quantization) are unpacked: with
// `options`, into buffers appended to `converted`, which must outlive the weights.
struct QuantizedCheckpointLoad {
  QuantizedLoadOptions options;
  std::vector<std::vector<std::byte>>* converted = nullptr;
  QuantizedLoadStats* stats = nullptr;
};

// Finds every tensor of `config` in `files` (HF names), checking each shape against the config.
// The views stay valid while `files` lives. A linear weight that a quantized checkpoint
// (config.quantization) stores packed instead of as "<name>.weight" is unpacked as `quantized`
// says (model/quantized_checkpoint.h); without `quantized`, it is refused.
absl::StatusOr<LlamaWeights> BindLlamaWeights(const LlamaConfig& config,
                                              const SafetensorsSet& files,
                                              const QuantizedCheckpointLoad* quantized = nullptr);

}  // namespace kvrm

#endif  // KVRM_MODEL_WEIGHTS_H_
