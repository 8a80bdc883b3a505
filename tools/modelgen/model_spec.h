// The named model shapes make_model can generate ("tiny", "small", ...), shared with tests and
// benchmarks so they agree on dimensions without reading a config.json.
#ifndef KVRM_TOOLS_MODELGEN_MODEL_SPEC_H_
#define KVRM_TOOLS_MODELGEN_MODEL_SPEC_H_

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kvrm {

// config.json's rope_scaling: Llama 3.1's ("rope_type": "llama3", every field but YaRN's),
// linear ("rope_type": "linear", `factor` only: positions divided by it, as Gemma 3's global
// layers) or YaRN ("rope_type": "yarn": factor, original_max_position_embeddings, beta_fast,
// beta_slow and truncate, as gpt-oss writes them; Transformers derives the attention factor
// 0.1 ln(factor) + 1 that multiplies cos and sin).
struct RopeScalingSpec {
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int original_max_position_embeddings = 8192;
  std::string_view rope_type = "llama3";  // "llama3", "linear" or "yarn"
  double beta_fast = 32.0;                // yarn only
  double beta_slow = 1.0;                 // yarn only
  bool truncate = true;                   // yarn only
};
using Llama3RopeScaling = RopeScalingSpec;

struct ModelSpec {
  std::string_view name;
  // config.json's model_type: "llama", "qwen2" (Q/K/V biases), "qwen3" (per-head Q/K norms) or
  // "phi3" (fused qkv_proj and gate_up_proj tensors) or "granite" (the multipliers below), or
  // "mistral" (Llama's tensors, sliding_window below), or Gemma's "gemma2" / "gemma3_text"
  // (norm weights stored as w - 1, sandwich norms, GELU-tanh MLP, the Gemma fields below;
  // gemma3_text also has per-head Q/K norms), or the mixtures of experts (the fields below):
  // "mixtral" (Mistral's block, block_sparse_moe.* tensors), "qwen2_moe" (Qwen2's block with its
  // Q/K/V biases, mlp.gate / mlp.experts.* tensors and a shared expert) and "qwen3_moe" (Qwen3's
  // block, mlp.gate / mlp.experts.* tensors), or "smollm3" (Llama's block, every
  // no_rope_layer_interval-th layer without RoPE), or "gpt_oss" (gpt-oss: every projection of the
  // attention biased, a learned sink logit per head, YaRN RoPE, even layers sliding, and in every
  // layer a biased router and experts stored fused and transposed, with the clamped GLU of
  // swiglu_limit below).
  std::string_view model_type = "llama";
  bool attention_bias = false;  // llama / qwen3: every attention projection biased
  // granite: config.json's embedding_multiplier, attention_multiplier, residual_multiplier and
  // logits_scaling.
  double embedding_multiplier = 1, attention_multiplier = 1, residual_multiplier = 1,
         logits_scaling = 1;
  int hidden_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int intermediate_size = 0;
  int vocab_size = 0;  // Includes the special tokens, which take the last ids.
  int max_position_embeddings = 0;
  double rope_theta = 10000.0;
  std::optional<RopeScalingSpec> rope_scaling;
  // Sliding-window attention over the last `sliding_window` positions (0: none; written as
  // config.json's sliding_window, with layer_types for Gemma). The layers that slide: every one
  // when sliding_window_pattern is 0 (Mistral), else all but every sliding_window_pattern-th
  // (Gemma 3's rule; 2 is Gemma 2's even layers).
  int sliding_window = 0;
  int sliding_window_pattern = 0;
  // smollm3: every no_rope_layer_interval-th layer rotates no Q and K (written as config.json's
  // no_rope_layers list and no_rope_layer_interval).
  int no_rope_layer_interval = 0;
  // Gemma: the attention scale is query_pre_attn_scalar^-1/2; scores and final logits are
  // soft-capped as c tanh(x / c) (0: none, written as null); gemma3_text's sliding layers rotate
  // with rope_local_base_freq and without rope_scaling.
  int query_pre_attn_scalar = 0;
  double attn_logit_softcapping = 0;
  double final_logit_softcapping = 0;
  double rope_local_base_freq = 0;
  // Mixture of experts (num_experts 0: none). In a MoE layer (IsMoeLayer) the MLP is a router
  // ([num_experts][hidden]) and num_experts SwiGLU experts of moe_intermediate_size features, of
  // which each token takes its num_experts_per_tok best; the other layers keep the dense MLP of
  // intermediate_size. mixtral: every layer, moe_intermediate_size == intermediate_size (its
  // config.json has no key of its own). qwen3_moe: a layer is dense when listed in
  // mlp_only_layers or when (layer + 1) is not a multiple of decoder_sparse_step, as Transformers'
  // Qwen3MoeDecoderLayer decides (qwen2_moe: the same rule); norm_topk_prob says whether the kept
  // weights are renormalized (written to config.json; Mixtral always renormalizes).
  int num_experts = 0;
  int num_experts_per_tok = 0;
  int moe_intermediate_size = 0;
  bool norm_topk_prob = false;
  int decoder_sparse_step = 1;
  std::vector<int> mlp_only_layers;
  // qwen2_moe: each MoE layer also has a shared expert, a SwiGLU MLP of this many features that
  // every token takes (mlp.shared_expert.{gate,up,down}_proj), its output scaled by
  // sigmoid(mlp.shared_expert_gate . x) ([1][hidden]) and added to the routed experts' (0: none).
  int shared_expert_intermediate_size = 0;
  // gpt_oss: the experts' GLU is (clamp(up, -L, L) + 1) * g * sigmoid(1.702 g) with
  // g = min(gate, L), L = swiglu_limit (config.json's key; 0: the plain SwiGLU of the others).
  double swiglu_limit = 0;
  bool tie_word_embeddings = false;
  double rms_norm_eps = 1e-5;
  double initializer_range = 0.02;  // Written to config.json; see weight_init.h for the stds.

  // Qwen2's attention (qwen2, qwen2_moe): Q/K/V biased, O not, whatever attention_bias says.
  bool qwen2_attention() const { return model_type == "qwen2" || model_type == "qwen2_moe"; }
  bool qkv_bias() const { return qwen2_attention() || attention_bias; }
  bool o_bias() const { return !qwen2_attention() && attention_bias; }
  bool qk_norm() const {
    return model_type == "qwen3" || model_type == "qwen3_moe" || model_type == "gemma3_text" ||
           olmo();
  }
  // OLMo 2 and 3: q_norm / k_norm over the whole projections, no input norms (input_layernorm,
  // pre_feedforward_layernorm), the attention and MLP outputs normalized.
  bool olmo() const { return model_type == "olmo2" || model_type == "olmo3"; }
  bool pre_norms() const { return !olmo(); }
  bool mixtral() const { return model_type == "mixtral"; }
  // gpt-oss: self_attn.sinks [heads], mlp.router.{weight,bias} and the experts as fused tensors
  // mlp.experts.gate_up_proj [experts][hidden][2 ffn] (gate and up in alternate columns) and
  // mlp.experts.down_proj [experts][ffn][hidden] (input x output, unlike nn.Linear), with their
  // biases gate_up_proj_bias [experts][2 ffn] and down_proj_bias [experts][hidden].
  bool gpt_oss() const { return model_type == "gpt_oss"; }
  bool fused_projections() const { return model_type == "phi3"; }
  bool gemma() const { return model_type == "gemma2" || model_type == "gemma3_text"; }
  // Gemma's pre_feedforward_layernorm and post_feedforward_layernorm (its post_attention_layernorm
  // normalizes the attention output rather than the MLP's input).
  bool sandwich_norms() const { return gemma() || olmo(); }
  // What every RMSNorm weight is drawn around: Gemma stores w - 1 (its RMSNorm multiplies by
  // 1 + w), so 0 there, 1 elsewhere.
  double norm_weight_mean() const { return gemma() ? 0.0 : 1.0; }
  bool UsesRope(int layer) const {
    return no_rope_layer_interval == 0 || (layer + 1) % no_rope_layer_interval != 0;
  }
  // Whether layer `layer` attends within sliding_window.
  bool IsSlidingLayer(int layer) const {
    return sliding_window > 0 &&
           (sliding_window_pattern == 0 || (layer + 1) % sliding_window_pattern != 0);
  }
  // Whether layer `layer`'s MLP is a mixture of experts (else the dense MLP).
  bool IsMoeLayer(int layer) const {
    return num_experts > 0 && decoder_sparse_step > 0 && (layer + 1) % decoder_sparse_step == 0 &&
           std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) ==
               mlp_only_layers.end();
  }
  int q_dim() const { return num_heads * head_dim; }
  int kv_dim() const { return num_kv_heads * head_dim; }
  int64_t NumParameters() const;
};

// INVALID_ARGUMENT naming the known sizes when `name` is not one of them.
absl::StatusOr<ModelSpec> FindModelSpec(std::string_view name);

// All known names, in table order.
std::vector<std::string_view> ModelSpecNames();

}  // namespace kvrm

#endif  // KVRM_TOOLS_MODELGEN_MODEL_SPEC_H_
