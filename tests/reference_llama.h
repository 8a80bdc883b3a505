// A deliberately naive float64 forward pass of the Llama family and Gemma 2 / 3, the yardstick for
// the engine's backends.
//
// Written from Hugging Face's modeling_llama (LlamaForCausalLM) rather than from kvrm's kernels,
// so that a shared misreading cannot make both sides agree: weights are looked up by their HF
// names straight from the safetensors files (not through BindLlamaWeights), widened to double,
// and every step (RMSNorm, rotate_half RoPE, GQA attention with a causal mask, SwiGLU, final
// norm, lm_head) is computed in double over the whole sequence at once. Qwen2's Q/K/V biases
// (modeling_qwen2: q/k/v_proj with bias), Qwen3's Q/K head norms (modeling_qwen3: q_norm and
// k_norm, RMSNorm over each head's head_dim after the projection, before RoPE), Llama's
// attention_bias (every projection biased), Phi-3's fused projections and Granite's multipliers
// are read from the same config fields. So are Gemma 2 / 3 (modeling_gemma2, modeling_gemma3,
// Gemma3ForCausalLM): RMSNorm times (1 + w) (also Gemma 3's q_norm / k_norm); the sandwich
// norms (post_attention_layernorm on the attention output, pre_ / post_feedforward_layernorm
// around the MLP); the scaled embedding and query_pre_attn_scalar's attention scale; attention
// scores and logits soft-capped (c tanh(x / c)); the GELU-tanh gated MLP; and Gemma 3's sliding
// layers rotating with rope_local_base_freq, unscaled. Sliding-window attention (any model, per
// layer, as Transformers' sliding_window_causal mask): position q sees keys q - window < k <= q.
// Mixtures of experts (modeling_mixtral's MixtralSparseMoeBlock, modeling_qwen3_moe's
// Qwen3MoeSparseMoeBlock, modeling_qwen2_moe's Qwen2MoeSparseMoeBlock; Mixtral's attention is
// Mistral's, Qwen3-MoE's Qwen3's, Qwen2-MoE's Qwen2's with its Q/K/V biases): in the layers
// config.IsMoeLayer marks, the MLP's input x gives router logits W_router x (`gate`, no bias),
// their softmax over all experts, the num_experts_per_tok largest of it kept (top-k; on a tie the
// lower expert number, where torch.topk leaves the order unspecified), divided by their sum when
// norm_topk_prob (Mixtral always), and the output sum_e p_e down_e(act(gate_e x) * up_e x) over
// the kept experts e; the other layers (Qwen3-MoE's and Qwen2-MoE's mlp_only_layers,
// decoder_sparse_step) keep the dense MLP. The router's tensor is block_sparse_moe.gate (Mixtral)
// or mlp.gate (Qwen3-MoE, Qwen2-MoE), the experts' block_sparse_moe.experts.E.w1 / w3 / w2 (gate /
// up / down) or mlp.experts.E.gate_proj / up_proj / down_proj. Qwen2-MoE's shared expert (when
// shared_expert_intermediate_size > 0): every token of a MoE layer also runs the SwiGLU MLP
// mlp.shared_expert.gate_proj / up_proj / down_proj (of shared_expert_intermediate_size features),
// and sigmoid(w . x) times its output, w the [1][hidden] mlp.shared_expert_gate (no bias), is
// added to the routed experts' sum.
// The rounding options treat the shared expert's gate / up / down as linear layers like any
// (input rounding; quantized by QuantizeLinearQ8_0, replaced by ReplaceLinearWeights under their
// HF names), and shared_expert_gate as the router: kept as stored, its input rounded by the bf16
// option only.
// gpt-oss (modeling_gpt_oss's GptOssForCausalLM: config.attention_sinks, moe_biases,
// clamped_swiglu): Llama's pre-norm block, every attention projection biased, YaRN on every layer
// (its attention factor on cos and sin), the layers config.sliding_layers marks (the even ones)
// sliding, and:
// - attention sinks, self_attn.sinks [heads]: head h's softmax over its visible scores s_j gets
//   one more logit sinks[h] in its denominator (and in the max it subtracts) that takes no value,
//   p_j = exp(s_j - m) / (sum_k exp(s_k - m) + exp(sinks[h] - m)), so the weights may sum to
//   less than 1 (eager_attention_forward: the sink column concatenated, dropped after softmax);
// - the router, mlp.router.weight / mlp.router.bias: logits W x + b; the num_experts_per_tok
//   largest kept (a tie to the lower expert), weighted by the softmax of the kept logits alone
//   (GptOssTopKRouter); min_routing_margin is measured on these biased logits;
// - the experts, from the fused HF tensors mlp.experts.gate_up_proj [E][hidden][2 ffn] (input x
//   output: gate_up = x @ W + gate_up_proj_bias [E][2 ffn]; gate the even columns, up the odd)
//   and mlp.experts.down_proj [E][ffn][hidden] with down_proj_bias [E][hidden]; or, when
//   config.quantization.method is "mxfp4", decoded here from their *_blocks / *_scales (U8
//   [E][out][in / 32][16] and [E][out][in / 32]: per output feature, blocks of 32 inputs, FP4
//   E2M1 codes two a byte, the low nibble the earlier, times 2^(scale - 127)), exactly;
// - each kept expert: g = min(gate, L), u = clamp(up, -L, L) (L = swiglu_limit),
//   y = ((u + 1) * g * sigmoid(1.702 g)) @ down_proj + down_proj_bias (GptOssExperts).
// The experts are held as linear layers ([out][in]: each expert's gate, up and down), so the bf16
// input rounding, q8_0 (blocks of 32 along the input dimension) and the int8 block inputs apply
// to them as to any MLP. ReplaceLinearWeights and the set_int8_* selectors visit each layer's
// two fused tensors once, by their HF names (model.layers.N.mlp.experts.gate_up_proj /
// down_proj) but as [rows][cols] = [E * out][in], the MXFP4 blocks' order: gate_up_proj's row
// e * 2 ffn + c is expert e's output column c (even c gate feature c / 2, odd c up feature),
// down_proj's row e * hidden + r expert e's output r; what they write is taken back. The sinks,
// the router and every bias are kept as stored (never rounded, quantized or visited); the
// router's input is rounded by the bf16 option only, as other routers'.
// The only shared code is config parsing and RopeInverseFrequencies / LocalRopeConfig (the
// llama3 / linear / yarn frequency scaling and the local base; the yarn attention factor is
// applied here, to this file's own cos and sin).
//
// Cost: O(layers * T * (params_per_layer + T * hidden)) per Forward, where a MoE layer's
// parameters count the router, the num_experts_per_tok experts a token runs (not all of them)
// and the shared expert and its gate; meant for T in the hundreds.
#ifndef KVRM_TESTS_REFERENCE_LLAMA_H_
#define KVRM_TESTS_REFERENCE_LLAMA_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "model/config.h"
#include "model/safetensors.h"

namespace kvrm {

class ReferenceLlama {
 public:
  // Copies every weight into double; `files` need not outlive the result. NOT_FOUND /
  // INVALID_ARGUMENT from the safetensors set when a tensor is missing or has the wrong shape.
  static absl::StatusOr<std::unique_ptr<ReferenceLlama>> Create(const LlamaConfig& config,
                                                                const SafetensorsSet& files);

  // Logits after each token of `tokens` (position t sees tokens[0..t]): [T][vocab].
  std::vector<std::vector<double>> Forward(absl::Span<const int32_t> tokens) const;

  // Far-history summaries as docs/runtime.md defines them, written here from that text: position
  // t attends to keys [0, sink_blocks * B) and [(sink_blocks + n) * B, t] exactly, with
  // n = max(0, t / B - window_blocks + 1 - sink_blocks), and to one (mean key, mean value) per
  // block in between, its score + log(B). window_blocks = 0: the full attention (Forward above).
  // Not defined with a sliding-window model: window_blocks > 0 there aborts.
  struct FarHistory {
    int64_t block_tokens = 16;
    int64_t sink_blocks = 0;
    int64_t window_blocks = 0;
  };
  std::vector<std::vector<double>> Forward(absl::Span<const int32_t> tokens,
                                           const FarHistory& far) const;

  // The final norm's output after each token (what lm_head multiplies; the hidden states an
  // embedding pools, as Hugging Face's base model returns them): [T][hidden].
  std::vector<std::vector<double>> FinalHidden(absl::Span<const int32_t> tokens) const;
  std::vector<std::vector<double>> FinalHidden(absl::Span<const int32_t> tokens,
                                               const FarHistory& far) const;

  const LlamaConfig& config() const { return config_; }

  // The smallest gap, over every token and MoE layer of every Forward since construction, between
  // the num_experts_per_tok-th and the next largest router logit (gpt-oss: with the router's
  // bias), as this reference computed them (with its input rounding): how far the expert choice
  // was from flipping. A backend whose router logits are within half of it of these picked the
  // same experts. +infinity when num_experts_per_tok == num_experts or no MoE layer has run; 0 on
  // a tie.
  double min_routing_margin() const { return min_routing_margin_.load(); }

  // When on, every linear layer's input vector is rounded to bf16 (through float, to nearest
  // even) before the product, as bf16 GEMMs on GPUs and the CPU's avx512_bf16 path take their
  // activations; the products and sums stay in double. Off by default. The MoE router's input
  // too (and Qwen2-MoE's shared_expert_gate's): the engine computes the router as a linear layer
  // in the model's dtype.
  void set_bf16_linear_inputs(bool on) { bf16_linear_inputs_ = on; }
  // When on, every key (after RoPE) and value is rounded to bf16 (through float, to nearest even)
  // before attention reads it, as a bf16 KV cache (--kv_dtype=bf16) stores them. Off by default.
  void set_bf16_kv(bool on) { kv_dtype_ = on ? DType::kBF16 : DType::kF32; }
  // The same for an FP8 cache (--kv_dtype=fp8, fp8_e5m2): every key becomes the FP8 code nearest
  // key / k_scale (to nearest even, saturating at the format's largest finite value), times
  // k_scale; values with v_scale. `scales`: (k_scale, v_scale) per layer, or empty for 1 (what
  // an engine uses without the checkpoint's). f32 turns rounding off.
  void set_kv_dtype(DType dtype, std::vector<std::pair<double, double>> scales = {}) {
    kv_dtype_ = dtype;
    kv_scales_ = std::move(scales);
  }
  // The largest |key| and |value| (after RoPE, before any KV rounding) of each layer over every
  // Forward since the last reset: what a calibrator makes static FP8 KV scales from
  // (amax / 448). Forward may run on several threads: read between calls.
  std::vector<std::pair<double, double>> kv_amax() const;
  void reset_kv_amax();
  // q8_0 linear layers, as the CPU backend multiplies them with --quantization=q8_0 (written
  // here from GGUF's q8_0 definition and docs/design.md, not from the kernels): every linear
  // weight (Q, K, V, O, gate, up, down and each expert's and the shared expert's, lm_head; not
  // the embedding lookup nor the MoE router or Qwen2-MoE's shared_expert_gate, which vLLM and
  // llama.cpp keep unquantized) becomes, per block of 32 values of a row, d * q with
  // d = amax / 127 stored as f16 and q = round(x / (amax / 127)) half away from zero (a last
  // partial block padded with zeros); and every linear layer's input (not the router's nor the
  // shared_expert_gate's) is rounded to steps of s = amax / 32767 of its own largest magnitude (in
  // float: round to nearest even of x * (32767 / amax)). Irreversible: the weights are replaced.
  void QuantizeLinearQ8_0();
  // Replaces every linear weight (Q, K, V, O, gate, up, down and each expert's and the shared
  // expert's, lm_head; not the embedding lookup nor the MoE router or shared_expert_gate) with the
  // values `fill` writes: fill(HF tensor name, rows, cols, data) over a row-major [rows][cols] of
  // the current values (a test passes a quantized copy's values).
  void ReplaceLinearWeights(
      const std::function<void(const std::string&, int64_t, int64_t, double*)>& fill);
  // Every linear layer's input (not the MoE router's nor the shared_expert_gate's) rounded as the
  // CPU backend's q4_K products take it (kernels/cpu/q4_k.h, written here from that definition):
  // per block of 32 values, to steps of amax / 127 of the block's largest magnitude (in float:
  // round to nearest even of x * (127 / amax)).
  void set_int8_block_linear_inputs(bool on) { int8_block_linear_inputs_ = on; }
  // The same rounding for the inputs of the linear weights `which(HF tensor name, rows, cols)`
  // picks only (as a backend multiplies a model whose matrices are in several formats: q4 groups
  // with int8 block activations beside others).
  void set_int8_block_inputs_of(
      const std::function<bool(const std::string&, int64_t, int64_t)>& which);
  // The order in which a linear weight's inputs form those blocks (an act-order matrix's
  // WeightMatrix::input_order): order(HF tensor name) returns it, or empty for input order.
  void set_int8_block_input_order_of(
      const std::function<std::vector<int32_t>(const std::string&)>& order);

 private:
  // A dense row-major matrix [rows][cols] (HF nn.Linear layout: [out_features][in_features]).
  struct Matrix {
    int64_t rows = 0;
    int64_t cols = 0;
    std::vector<double> data;
    bool int8_block_inputs = false;  // set_int8_block_inputs_of
    // The blocks of 32 those inputs are rounded in: inputs input_order[32 b .. 32 b + 31]
    // (empty: in order).
    std::vector<int32_t> input_order;
    const double* Row(int64_t r) const { return data.data() + r * cols; }
  };
  // One SwiGLU (or GELU-gated, or gpt-oss's clamped) MLP: the dense one, or one expert of a
  // mixture.
  struct Mlp {
    Matrix gate, up;  // [ffn][hidden]
    Matrix down;      // [hidden][ffn]
    // gpt-oss's expert biases ([ffn], [ffn], [hidden]; empty: none).
    std::vector<double> gate_bias, up_bias, down_bias;
  };
  struct Layer {
    std::vector<double> input_norm, post_attention_norm;  // [hidden]
    // Gemma's sandwich norms around the MLP, [hidden] (empty: none; post_attention_norm then
    // normalizes the MLP's input).
    std::vector<double> pre_feedforward_norm, post_feedforward_norm;
    Matrix q, k, v, o;
    Mlp mlp;  // a dense layer's (empty in a MoE layer)
    // A MoE layer's router [num_experts][hidden] and experts (empty in a dense layer), and
    // gpt-oss's router bias [num_experts] (empty: none).
    Matrix router;
    std::vector<double> router_bias;
    std::vector<Mlp> experts;
    // Qwen2-MoE: a MoE layer's shared expert and its gate [1][hidden] (empty: none).
    Mlp shared_expert;
    Matrix shared_expert_gate;
    std::vector<double> bq, bk, bv, bo;  // biases (empty: none)
    std::vector<double> q_norm, k_norm;  // [head_dim] (empty: none)
    std::vector<double> sinks;           // gpt-oss: [heads] (empty: none)
  };

  explicit ReferenceLlama(const LlamaConfig& config) : config_(config) {}
  // f(HF tensor name, matrix) on every linear weight ReplaceLinearWeights names.
  void ForEachLinear(const std::function<void(const std::string&, Matrix&)>& f);
  // A [rows][cols] tensor; one with rows == 1 is stored 1-D ([cols]) unless `two_d`.
  static absl::StatusOr<Matrix> Load(const SafetensorsSet& files, const std::string& name,
                                     int64_t rows, int64_t cols, bool two_d = false);
  static Matrix Rows(const Matrix& m, int64_t begin, int64_t count);
  // The HF names of a MoE layer's router and of expert `e`'s gate, up and down (with `expert`'s
  // matrices and their shapes), by model_type.
  static std::string RouterName(const LlamaConfig& config, int32_t layer);
  static std::vector<std::tuple<std::string, Matrix*, int64_t, int64_t>> ExpertTensors(
      const LlamaConfig& config, int32_t layer, int64_t e, Mlp& expert, int64_t hidden,
      int64_t ffn);
  // A MoE layer's shared expert's gate, up and down (Qwen2-MoE), as ExpertTensors.
  static std::vector<std::tuple<std::string, Matrix*, int64_t, int64_t>> SharedExpertTensors(
      int32_t layer, Mlp& expert, int64_t hidden, int64_t ffn);
  // gpt-oss: layer `layer`'s router (and bias) and experts, split from the fused tensors (or
  // their MXFP4 blocks) into `l`.
  static absl::Status LoadGptOssMoe(const LlamaConfig& config, const SafetensorsSet& files,
                                    int32_t layer, Layer& l);
  // gpt-oss: f on layer `l`'s experts as its two fused tensors [E * out][in] (see the header
  // comment), named `prefix` + "gate_up_proj" / "down_proj"; what f writes (values, and the
  // int8 block flags and order) goes back to every expert.
  static void ForEachGptOssExpertTensor(Layer& l, const std::string& prefix,
                                        const std::function<void(const std::string&, Matrix&)>& f);

  // y = W x for one vector (x rounded to bf16 first under set_bf16_linear_inputs, to int16 steps
  // under QuantizeLinearQ8_0, to int8 block steps under set_int8_block_linear_inputs).
  std::vector<double> Linear(const Matrix& w, const std::vector<double>& x) const;
  // y = W x with x as given.
  static std::vector<double> Product(const Matrix& w, const std::vector<double>& x);
  // down(act(gate x) * up x) for one vector (gpt-oss: with the biases and the clamped GLU).
  std::vector<double> GatedMlp(const Mlp& mlp, const std::vector<double>& x) const;
  // The mixture of experts of layer `l` for one vector (with its shared expert, if any); lowers
  // `*min_margin` to this token's routing margin (see min_routing_margin).
  std::vector<double> MixtureOfExperts(const Layer& l, const std::vector<double>& x,
                                       double* min_margin) const;
  // HF LlamaRMSNorm: weight * x / sqrt(mean(x^2) + eps); Gemma's (1 + weight) * ... with
  // norm_weight_offset = 1.
  std::vector<double> RmsNorm(const std::vector<double>& x, const std::vector<double>& w) const;
  // Rotates each head of `x` ([heads][head_dim]) in place, rotate_half layout: pair (i, i + hd/2);
  // with the sliding layers' frequencies (LocalRopeConfig) when `local`.
  void Rope(std::vector<double>& x, int64_t heads, int64_t position, bool local) const;
  // Linear plus its bias (none when `bias` is empty).
  std::vector<double> Affine(const Matrix& w, const std::vector<double>& bias,
                             const std::vector<double>& x) const;
  // RMSNorm of each head of `x` ([heads][head_dim]) in place with `w` ([head_dim]); none when
  // `w` is empty.
  void HeadNorm(std::vector<double>& x, const std::vector<double>& w) const;

  LlamaConfig config_;
  std::vector<double> inv_freq_;  // [head_dim / 2]
  // The sliding layers' (Gemma 3's local base, unscaled; else the same as above).
  std::vector<double> local_inv_freq_;  // [head_dim / 2]
  double local_attention_factor_ = 1;
  Matrix embed_;    // [vocab][hidden]
  Matrix lm_head_;  // [vocab][hidden]; a copy of embed_ when tied
  std::vector<double> final_norm_;
  std::vector<Layer> layers_;
  bool q8_0_linear_ = false;
  bool int8_block_linear_inputs_ = false;
  bool bf16_linear_inputs_ = false;
  DType kv_dtype_ = DType::kF32;
  std::vector<std::pair<double, double>> kv_scales_;
  mutable std::mutex kv_amax_mu_;
  mutable std::vector<std::pair<double, double>> kv_amax_;
  // Lowered by each Forward (atomic: Forward is const, and may run on several threads at once).
  mutable std::atomic<double> min_routing_margin_{std::numeric_limits<double>::infinity()};
};

}  // namespace kvrm

#endif  // KVRM_TESTS_REFERENCE_LLAMA_H_
