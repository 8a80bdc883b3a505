// Hugging Face config.json for Llama-family models (llama, mistral, qwen2, qwen3, phi3,
// granite), Gemma 2 / 3 (gemma2, gemma3_text, and gemma3's text model) and the mixtures of experts
// built on the same block (mixtral, qwen2_moe, qwen3_moe), validated on load.
//
// The file is untrusted: every size is checked before anyone allocates from it, and features the
// engine does not implement (MLP biases, unknown RoPE scalings, sliding windows shorter than the
// context) fail with UNIMPLEMENTED rather than loading a model that would compute something other
// than what Transformers computes.
#ifndef KVRM_MODEL_CONFIG_H_
#define KVRM_MODEL_CONFIG_H_

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kvrm {

// HF "rope_scaling" (Transformers 5: "rope_parameters"). The type comes from "rope_type" (newer
// files) or "type" (older ones).
struct RopeScaling {
  // "" = none; otherwise "llama3", "linear", "yarn", or "freq_factors" (GGUF's
  // rope_freqs.weight: each inverse frequency divided by its own factor, as llama.cpp applies it)
  std::string type;
  double factor = 1;
  double low_freq_factor = 1;                       // llama3 only
  double high_freq_factor = 4;                      // llama3 only
  int64_t original_max_position_embeddings = 8192;  // llama3 and yarn
  std::vector<double> freq_factors;                 // freq_factors only: [head_dim / 2]
  // YaRN (Qwen2.5 / Qwen3 long context): the frequency band blended between extrapolation and
  // interpolation is bounded by beta_fast and beta_slow rotations over the original context
  // (floored / ceiled when `truncate`), and cos and sin are multiplied by `attention_factor`
  // (from the config, else 0.1 ln(factor) + 1, or DeepSeek's mscale / mscale_all_dim ratio).
  double beta_fast = 32;
  double beta_slow = 1;
  bool truncate = true;
  double attention_factor = 1;  // every type: what cos and sin are multiplied by (1 but yarn)
};

// config.json's "quantization_config": how a quantized checkpoint stores its linear weights
// (model/quantized_checkpoint.h reads them). Weight grids: per group of `group_size` input
// features of `block_rows` output rows, a scale s (and, for packed integer schemes, a zero z);
// the weight is s * (q - z), q an integer of `bits` bits or an FP8 number.
struct CheckpointQuantization {
  // "" (none), "awq" (AutoAWQ's GEMM layout), "gptq" (AutoGPTQ / GPTQModel), "mxfp4" (gpt-oss's
  // experts: OCP MXFP4, FP4 E2M1 values in blocks of 32 with an E8M0 scale; every other tensor
  // unquantized),
  // "compressed-tensors" (llm-compressor: pack-quantized W4A16 / W8A16, int-quantized W8A8,
  // float-quantized FP8), "fp8" (Transformers' FP8: DeepSeek-V3's and Qwen3's blocks, or one
  // scale a tensor as AutoFP8 writes), "fbgemm_fp8" (one scale an output row) or "bitsandbytes"
  // (Transformers' load_in_4bit NF4 / FP4 blocks of 64, and load_in_8bit LLM.int8() rows).
  std::string method;
  int32_t bits = 0;         // 4 (awq), 4 or 8 (gptq, compressed-tensors), 8 (FP8)
  int32_t group_size = 0;   // input features per scale; 0: the whole row
  int32_t block_rows = 1;   // output features per scale (FP8 blocks: 128); 0: one per tensor
  bool zero_point = false;  // a stored zero per group (awq zero_point, gptq !sym, !symmetric)
  // GPTQ's desc_act / compressed-tensors' actorder "group": g_idx tensors map each input
  // feature to its group, which need not be contiguous.
  bool act_order = false;
  // GPTQ checkpoint_format "gptq" (v1) stores each zero less one; "gptq_v2" as it is.
  bool gptq_v1_zeros = true;
  // The quantized values are the ".weight" tensor itself, one element each (I8 integers, or
  // F8_E4M3 / F8_E5M2 numbers with `fp8`), not int32 words of packed ones: compressed-tensors'
  // int-quantized, float-quantized and naive-quantized formats, fp8, fbgemm_fp8. Their scales
  // are `scale_suffix` ([rows / block_rows][cols / group_size], rounded up; one element for
  // one a tensor).
  bool unpacked = false;
  bool fp8 = false;
  std::string scale_suffix = ".weight_scale";  // fp8 blocks: ".weight_scale_inv"; LLM.int8: ".SCB"
  // What a stored scale is multiplied by: 1, or LLM.int8()'s 1 / 127 (its SCB is each row's
  // largest magnitude, the weight q * SCB / 127).
  float scale_multiplier = 1;
  // bitsandbytes 4-bit: "nf4" or "fp4" (bnb_4bit_quant_type), the 16 values of its quant_map,
  // times each block's absmax (model/quantized_checkpoint.h). Empty otherwise.
  std::string bnb_4bit_type;
  // The checkpoint was calibrated with quantized activations too (W8A8, FP8 dynamic or static:
  // input_activations, activation_scheme). kvrm computes activations its own way (int8 per 32
  // on the CPU's 8-bit blocks, bf16 on CUDA) and reads no input scales.
  bool activations_quantized = false;
  bool enabled() const { return !method.empty(); }
  // Values that are not integers of one scale (FP8 numbers, NF4 / FP4 codes): never exactly
  // 8-bit blocks.
  bool NonIntegerValues() const { return fp8 || !bnb_4bit_type.empty(); }
  // "awq 4-bit g128", "gptq 4-bit g128 act-order", "fp8 block 128x128", "compressed-tensors
  // fp8 per-channel", "compressed-tensors 8-bit per-tensor": ModelInfo.weights_format.
  std::string Describe() const;
};

// The most layers a config may claim (no model has more than a few hundred): a claim of more is
// refused before per-layer state (the sliding layers) is allocated for it.
inline constexpr int32_t kMaxHiddenLayers = 65536;

// gpt-oss's GLU: g * sigmoid(kGptOssSwigluAlpha * g) (GptOssExperts' alpha, a constant there).
inline constexpr double kGptOssSwigluAlpha = 1.702;

struct LlamaConfig {
  // "llama", "mistral", "qwen2", "qwen3", "phi3", "granite", "gemma2" or "gemma3_text" (also
  // gemma3's text model: multimodal_wrapper), "mixtral" (Mistral's attention), "qwen2_moe"
  // (Qwen2's) or "qwen3_moe" (Qwen3's), whose MLPs are mixtures of experts: the Llama block, with
  // Qwen2's Q/K/V biases and Qwen3's per-head Q/K RMSNorm (the flags below say which a model has);
  // Phi-3 stores Q/K/V as one qkv_proj and gate/up as one gate_up_proj (`fused_projections`);
  // Granite scales the embedding, the attention scores, the residual branches and the logits by the
  // multipliers below.
  std::string model_type;
  int32_t vocab_size = 0;
  int32_t hidden_size = 0;
  int32_t intermediate_size = 0;
  int32_t num_hidden_layers = 0;
  int32_t num_attention_heads = 0;
  int32_t num_key_value_heads = 0;  // defaults to num_attention_heads, as in Transformers
  int32_t head_dim = 0;             // defaults to hidden_size / num_attention_heads
  int32_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000;
  RopeScaling rope_scaling;
  // Sliding-window attention (Mistral, Qwen2 with use_sliding_window, Phi-3, Gemma 2 / 3): a
  // position attends to the last `sliding_window` positions, itself included, in the layers
  // `sliding_layers` marks (0: none, or a Llama config, whose HF model ignores the key; a window
  // no shorter than the model's context is none). Use SlidingWindowOf(layer).
  int32_t sliding_window = 0;
  // [num_hidden_layers], or empty: no layer slides. Marked even when the window is none.
  std::vector<bool> sliding_layers;
  // Gemma 3: the RoPE base of the sliding layers, which rotate without rope_scaling
  // (rope_local_base_freq; 0: every layer rotates as rope_theta and rope_scaling say).
  double rope_local_theta = 0;
  // SmolLM3's NoPE layers: [num_hidden_layers], true where a layer rotates Q and K (its config's
  // no_rope_layers, whose 1 means "uses RoPE"; by default every no_rope_layer_interval-th layer,
  // 4th, does not); empty: every layer rotates. Use UsesRope(layer).
  std::vector<bool> rope_layers;
  bool tie_word_embeddings = false;
  // Biases on the Q, K and V projections (qwen2 always; llama and qwen3 with attention_bias).
  bool qkv_bias = false;
  // A bias on the O projection (llama and qwen3 with attention_bias; qwen2 never).
  bool o_bias = false;
  // Qwen3: each head of Q and K goes through RMSNorm over head_dim (its own weight
  // self_attn.q_norm / k_norm, rms_norm_eps) after the projection and before RoPE.
  bool qk_norm = false;
  // OLMo 2 (with qk_norm): the RMSNorm is over the whole projection instead, every head of Q
  // together (q_norm: [heads * head_dim]) and of K (k_norm: [kv_heads * head_dim]).
  bool qk_norm_whole = false;
  // Phi-3: self_attn.qkv_proj ([q; k; v] rows) and mlp.gate_up_proj ([gate; up] rows) instead of
  // the separate products (the same values; bound as row ranges of the fused tensors).
  bool fused_projections = false;
  // Granite's multipliers (1 for the others): the embedding rows are multiplied by
  // `embedding_multiplier`, attention scores by `attention_scale` (every other model:
  // 1 / sqrt(head_dim)), each attention and MLP output by `residual_multiplier` before it joins
  // the residual stream, and the logits divided by `logits_scaling`.
  double embedding_multiplier = 1;
  double attention_scale = 0;  // 0: 1 / sqrt(head_dim)
  double residual_multiplier = 1;
  double logits_scaling = 1;
  // Gemma 2 / 3 (1 / false / 0 / "silu" for the others):
  // - RMSNorm multiplies by (norm_weight_offset + w): Gemma stores its norm weights as w - 1;
  // - `sandwich_norms`: the attention and MLP outputs are normalized again before they join the
  //   residual stream (post_attention_layernorm, post_feedforward_layernorm), and the MLP's input
  //   by pre_feedforward_layernorm;
  // - attention scores s become c tanh(s / c) with c = attn_logit_softcapping, and the logits
  //   likewise with final_logit_softcapping (0: none);
  // - the embedding multiplier is sqrt(hidden_size) as the model's dtype rounds it, the
  //   attention scale query_pre_attn_scalar^-1/2, and the MLP activation `hidden_act`:
  //   "silu" or "gelu_pytorch_tanh" (GELU's tanh approximation).
  // OLMo 2 has the output norms (`sandwich_norms`: post_attention_layernorm,
  // post_feedforward_layernorm) and no input norms (`pre_norms` false): attention and the MLP
  // read the residual stream itself, and only their outputs are normalized.
  double norm_weight_offset = 0;
  bool sandwich_norms = false;
  bool pre_norms = true;
  double attn_logit_softcapping = 0;
  double final_logit_softcapping = 0;
  std::string hidden_act = "silu";
  // Mixtures of experts (mixtral, qwen2_moe, qwen3_moe): in the layers `moe_layers`
  // marks, the MLP is `num_experts` SwiGLU experts of `moe_intermediate_size` features each. A
  // router ([num_experts][hidden], no bias) scores each token; of the softmax of its scores (in
  // f32) the `num_experts_per_tok` largest are kept, divided by their sum when `norm_topk_prob`,
  // and the token's MLP output is the kept experts' outputs weighted by them. The other layers
  // (Qwen3-MoE's mlp_only_layers, decoder_sparse_step) keep the dense MLP of intermediate_size.
  // All 0 / false / empty for a dense model. Use IsMoeLayer(layer).
  int32_t num_experts = 0;
  int32_t num_experts_per_tok = 0;
  int32_t moe_intermediate_size = 0;
  bool norm_topk_prob = false;
  std::vector<bool> moe_layers;  // [num_hidden_layers], or empty: no mixture of experts
  // Qwen2-MoE (qwen2_moe): each MoE layer also runs a shared expert, a SwiGLU MLP of this many
  // features on every token, its output scaled by sigmoid(shared_expert_gate . x) and added to
  // the routed experts' (0: none).
  int32_t shared_expert_intermediate_size = 0;
  // gpt-oss (gpt_oss; GptOssForCausalLM), a mixture of experts in every layer with:
  // - `attention_sinks`: each query head has a learned logit (self_attn.sinks [heads]) that joins
  //   its softmax's denominator and takes no value: attention weights may sum to less than 1;
  // - `moe_biases`: the router has a bias (mlp.router.bias [experts]) and the experts' gate, up
  //   and down products too; the kept experts' weights are the softmax of their top-k logits
  //   (norm_topk_prob);
  // - `swiglu_limit` > 0: the experts' activation is (clamp(up, -L, L) + 1) * g * sigmoid(1.702 g)
  //   with g = min(gate, L) (GptOssExperts), instead of SiLU(gate) * up.
  // False / 0 for every other model.
  bool attention_sinks = false;
  bool moe_biases = false;
  double swiglu_limit = 0;
  // gemma3 (Gemma3ForConditionalGeneration): this is its text_config, whose language model is
  // served; its tensors are named under language_model.model. (or model.language_model.).
  bool multimodal_wrapper = false;
  std::optional<int32_t> bos_token_id;
  std::vector<int32_t> eos_token_ids;  // "eos_token_id" may be an int or a list
  std::string torch_dtype;             // informational ("torch_dtype", or "dtype" in newer files)
  CheckpointQuantization quantization;  // quantization_config; method "" when the weights are not

  // The window layer `layer` attends within (0: all of its history).
  int32_t SlidingWindowOf(int32_t layer) const {
    return sliding_window > 0 && IsSlidingLayer(layer) ? sliding_window : 0;
  }
  bool IsSlidingLayer(int32_t layer) const {
    return !sliding_layers.empty() && sliding_layers[layer];
  }
  // Whether every layer attends within sliding_window (Mistral 7B v0.1, Phi-3, Qwen2 with every
  // layer sliding): K/V wholly behind a row's window is then never read by it or any later row.
  bool AllLayersSlide() const {
    return sliding_window > 0 && !sliding_layers.empty() &&
           std::find(sliding_layers.begin(), sliding_layers.end(), false) == sliding_layers.end();
  }
  bool UsesRope(int32_t layer) const { return rope_layers.empty() || rope_layers[layer]; }
  // Whether some layer rotates no Q and K (SmolLM3).
  bool HasNopeLayers() const {
    return std::find(rope_layers.begin(), rope_layers.end(), false) != rope_layers.end();
  }
  bool gelu_tanh() const { return hidden_act == "gelu_pytorch_tanh"; }
  bool clamped_swiglu() const { return swiglu_limit > 0; }
  bool IsMoeLayer(int32_t layer) const { return !moe_layers.empty() && moe_layers[layer]; }
  bool moe() const { return !moe_layers.empty(); }
  // The mixture-of-experts layers; whether some layer has the dense MLP of intermediate_size.
  int32_t NumMoeLayers() const {
    return static_cast<int32_t>(std::count(moe_layers.begin(), moe_layers.end(), true));
  }
  bool HasDenseMlp() const { return NumMoeLayers() < num_hidden_layers; }
};

// Reads <model_dir>/config.json and, when present, <model_dir>/generation_config.json, whose
// bos_token_id / eos_token_id override config.json's (as Transformers' generate() does).
absl::StatusOr<LlamaConfig> LoadLlamaConfig(const std::string& model_dir);

// Transformers' model class of a supported model_type ("qwen3" -> "Qwen3ForCausalLM"), as
// config.json's "architectures" names it; "LlamaForCausalLM" for any other.
std::string_view ArchitectureClassName(std::string_view model_type);

// Parses and validates config.json text; `what` names the source in error messages.
// INVALID_ARGUMENT for malformed or inconsistent values, UNIMPLEMENTED for unsupported features;
// both name the key.
absl::StatusOr<LlamaConfig> ParseLlamaConfig(std::string_view json, std::string_view what);

// RoPE inverse frequencies, one per rotated pair: [head_dim / 2]. Base theta^(-2i/head_dim), then
// llama3 or linear scaling exactly as Transformers' _compute_llama3_parameters /
// _compute_linear_scaling_rope_parameters, in double precision.
// yarn as Transformers' _compute_yarn_parameters (the explicit factor; the ramp over
// [0, head_dim / 2) between the correction dims of beta_fast and beta_slow).
std::vector<double> RopeInverseFrequencies(const LlamaConfig& config);

// The RoPE table both backends rotate with: [positions][head_dim] floats, for each position the
// head_dim / 2 cosines then the sines of position * inverse frequency, times the scaling's
// attention_factor, computed in double and rounded once.
std::vector<float> RopeTable(const LlamaConfig& config, int64_t positions);

// The config the sliding layers rotate with: `config` itself, or with Gemma 3's local base
// (rope_local_theta) and no scaling. Pass it to RopeInverseFrequencies / RopeTable.
LlamaConfig LocalRopeConfig(const LlamaConfig& config);

}  // namespace kvrm

#endif  // KVRM_MODEL_CONFIG_H_
