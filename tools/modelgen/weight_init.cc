#include "tools/modelgen/weight_init.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "tools/modelgen/prng.h"

namespace kvrm::modelgen {
namespace {

constexpr double kNormStd = 0.1;
// Gemma's post_attention_layernorm / post_feedforward_layernorm (stored w - 1): 3, an effective
// gain of 4. Gemma multiplies the embedding by sqrt(hidden), so with tied embeddings of std
// 2 / sqrt(hidden) (logits of std ~2) the input token enters the residual stream with RMS 2; with
// gains of 1 the 2 * layers normed branch outputs (RMS 1 each) do not outweigh it and the random
// model predicts its last input token (10 of make_model_test's 10 prompts); with gains of 4 they
// do (1 of 10, top-1 probability ~0.1, as the Llama tiny model).
constexpr double kGemmaPostNormMean = 3.0;
// Biases as large as Qwen2's K biases are against the projections' unit outputs, so a bias left
// out moves the logits by O(1).
constexpr double kBiasStd = 0.5;
// A mixture of experts' router ([experts][hidden]) scores the RMS-normalized MLP input, so its
// logits have std 0.25 sqrt(hidden) (2.8 at hidden 128): top-k choices well separated, so that
// an engine's and a float64 reference's choices agree (near-ties would flip experts), yet not
// one-hot softmax weights (the kept experts' weights all matter).
constexpr double kRouterStd = 0.25;
// Qwen2-MoE's shared_expert_gate ([1][hidden]) scales the shared expert's output by
// sigmoid(w . x) of the RMS-normalized MLP input: std 0.1 gives logits of std 0.1 sqrt(hidden)
// (1.1 at hidden 128), so the gate spreads over (0, 1) rather than saturating at 0 or 1 (a gate
// an engine leaves out, or applies without its sigmoid, moves the output).
constexpr double kSharedExpertGateStd = 0.1;
// gpt-oss. Sinks (self_attn.sinks, one logit a head) of std 1, as large as the attention scores
// they compete with (std ~1.6: unit-RMS q and k with their biases, times YaRN's attention factor
// squared, 1.3), so the weight a head gives its keys ranges from nearly all (a sink of -2 against
// a few keys) to a small part (a sink of 2 against one or two), and leaving them out moves the
// logits by O(1) (//tests:reference_moe_test measures up to ~6 on tiny-gptoss).
constexpr double kSinkStd = 1.0;
// The router's bias (mlp.router.bias) moves each expert's logits by N(0, 0.5), a fifth of their
// spread (kRouterStd): it changes which experts win often enough to matter, without the ties
// kRouterStd keeps away.
constexpr double kRouterBiasStd = 0.5;
// The experts' biases (gate_up_proj_bias, down_proj_bias): small against the products' unit
// scale, but present in every expert, so a bias left out shifts every output.
constexpr double kExpertBiasStd = 0.1;
// gate_up_proj has std 3 / sqrt(hidden), not 1 / sqrt(hidden): gate and up have std ~3 on the
// normed input, so ~1% of gate values exceed swiglu_limit 7 (gate = min(gate, 7)) and ~2% of up
// values leave [-7, 7] (clamped on both sides): the clamp changes (up + 1) * glu by ~9% RMS, so
// an engine that skips it (or clamps gate from below too) is caught, while most features stay
// inside it.
constexpr double kClampedGateUpGain = 3.0;
// With those, (clamp(up) + 1) * glu has RMS ~6.5 (glu = g sigmoid(1.702 g), g = min(gate, 7)),
// so down_proj takes a gain of 1 / 6.5 to give each expert's output the ~unit RMS of every other
// projection: the experts do not drown the attention in the residual stream.
constexpr double kClampedDownGain = 1.0 / 6.5;

double FanIn(int64_t fan_in) { return 1.0 / std::sqrt(static_cast<double>(fan_in)); }

}  // namespace

int64_t TensorPlan::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<TensorPlan> PlanTensors(const ModelSpec& spec) {
  const int64_t d = spec.hidden_size, q = spec.q_dim(), kv = spec.kv_dim();
  const int64_t ffn = spec.intermediate_size, vocab = spec.vocab_size;
  const double embed_std = 2.0 / std::sqrt(static_cast<double>(d));
  // Around 1, or around 0 where the model stores w - 1 (Gemma): the same effective weights
  // (but Gemma's post-branch norms: kGemmaPostNormMean).
  const double norm = spec.norm_weight_mean();
  std::vector<TensorPlan> plans;
  plans.push_back({"model.embed_tokens.weight", {vocab, d}, 0.0, embed_std});
  for (int i = 0; i < spec.num_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    if (spec.pre_norms()) plans.push_back({p + "input_layernorm.weight", {d}, norm, kNormStd});
    if (spec.fused_projections()) {
      plans.push_back({p + "self_attn.qkv_proj.weight", {q + 2 * kv, d}, 0.0, FanIn(d)});
    } else {
      plans.push_back({p + "self_attn.q_proj.weight", {q, d}, 0.0, FanIn(d)});
      if (spec.qkv_bias()) plans.push_back({p + "self_attn.q_proj.bias", {q}, 0.0, kBiasStd});
      plans.push_back({p + "self_attn.k_proj.weight", {kv, d}, 0.0, FanIn(d)});
      if (spec.qkv_bias()) plans.push_back({p + "self_attn.k_proj.bias", {kv}, 0.0, kBiasStd});
      plans.push_back({p + "self_attn.v_proj.weight", {kv, d}, 0.0, FanIn(d)});
      if (spec.qkv_bias()) plans.push_back({p + "self_attn.v_proj.bias", {kv}, 0.0, kBiasStd});
    }
    plans.push_back({p + "self_attn.o_proj.weight", {d, q}, 0.0, FanIn(q)});
    if (spec.o_bias()) plans.push_back({p + "self_attn.o_proj.bias", {d}, 0.0, kBiasStd});
    if (spec.gpt_oss()) plans.push_back({p + "self_attn.sinks", {spec.num_heads}, 0.0, kSinkStd});
    if (spec.qk_norm()) {  // per head, or (OLMo 2) over the whole projection
      plans.push_back(
          {p + "self_attn.q_norm.weight", {spec.olmo() ? q : spec.head_dim}, norm, kNormStd});
      plans.push_back(
          {p + "self_attn.k_norm.weight", {spec.olmo() ? kv : spec.head_dim}, norm, kNormStd});
    }
    plans.push_back({p + "post_attention_layernorm.weight",
                     {d},
                     spec.gemma() ? kGemmaPostNormMean : norm,
                     kNormStd});
    if (spec.sandwich_norms() && spec.pre_norms()) {
      plans.push_back({p + "pre_feedforward_layernorm.weight", {d}, norm, kNormStd});
    }
    if (spec.IsMoeLayer(i) && spec.gpt_oss()) {
      // GptOssMLP: router.weight / router.bias ([experts][hidden], [experts]) and the experts'
      // fused tensors, as GptOssExperts holds them (input x output, gate and up interleaved).
      const int64_t experts = spec.num_experts, expert_ffn = spec.moe_intermediate_size;
      const std::string moe = p + "mlp.";
      plans.push_back({moe + "router.weight", {experts, d}, 0.0, kRouterStd});
      plans.push_back({moe + "router.bias", {experts}, 0.0, kRouterBiasStd});
      plans.push_back({moe + "experts.gate_up_proj",
                       {experts, d, 2 * expert_ffn},
                       0.0,
                       kClampedGateUpGain * FanIn(d)});
      plans.push_back(
          {moe + "experts.gate_up_proj_bias", {experts, 2 * expert_ffn}, 0.0, kExpertBiasStd});
      plans.push_back({moe + "experts.down_proj",
                       {experts, expert_ffn, d},
                       0.0,
                       kClampedDownGain * FanIn(expert_ffn)});
      plans.push_back({moe + "experts.down_proj_bias", {experts, d}, 0.0, kExpertBiasStd});
    } else if (spec.IsMoeLayer(i)) {
      // The router, then each expert's gate, up and down (Mixtral: w1, w3, w2), drawn as the
      // dense MLP's matrices of the same shapes are.
      const int64_t experts = spec.num_experts, expert_ffn = spec.moe_intermediate_size;
      const std::string moe = p + (spec.mixtral() ? "block_sparse_moe." : "mlp.");
      plans.push_back({moe + "gate.weight", {experts, d}, 0.0, kRouterStd});
      for (int64_t e = 0; e < experts; ++e) {
        const std::string x = absl::StrCat(moe, "experts.", e, ".");
        const bool m = spec.mixtral();
        plans.push_back({x + (m ? "w1" : "gate_proj") + ".weight", {expert_ffn, d}, 0.0, FanIn(d)});
        plans.push_back({x + (m ? "w3" : "up_proj") + ".weight", {expert_ffn, d}, 0.0, FanIn(d)});
        plans.push_back(
            {x + (m ? "w2" : "down_proj") + ".weight", {d, expert_ffn}, 0.0, FanIn(expert_ffn)});
      }
      // Qwen2-MoE: the shared expert (drawn as the dense MLP's matrices are) and its gate.
      if (const int64_t shared = spec.shared_expert_intermediate_size; shared > 0) {
        const std::string x = moe + "shared_expert.";
        plans.push_back({x + "gate_proj.weight", {shared, d}, 0.0, FanIn(d)});
        plans.push_back({x + "up_proj.weight", {shared, d}, 0.0, FanIn(d)});
        plans.push_back({x + "down_proj.weight", {d, shared}, 0.0, FanIn(shared)});
        plans.push_back({moe + "shared_expert_gate.weight", {1, d}, 0.0, kSharedExpertGateStd});
      }
    } else {
      if (spec.fused_projections()) {
        plans.push_back({p + "mlp.gate_up_proj.weight", {2 * ffn, d}, 0.0, FanIn(d)});
      } else {
        plans.push_back({p + "mlp.gate_proj.weight", {ffn, d}, 0.0, FanIn(d)});
        plans.push_back({p + "mlp.up_proj.weight", {ffn, d}, 0.0, FanIn(d)});
      }
      plans.push_back({p + "mlp.down_proj.weight", {d, ffn}, 0.0, FanIn(ffn)});
    }
    if (spec.sandwich_norms()) {
      plans.push_back({p + "post_feedforward_layernorm.weight",
                       {d},
                       spec.gemma() ? kGemmaPostNormMean : norm,
                       kNormStd});
    }
  }
  plans.push_back({"model.norm.weight", {d}, norm, kNormStd});
  if (!spec.tie_word_embeddings) plans.push_back({"lm_head.weight", {vocab, d}, 0.0, embed_std});
  return plans;
}

void FillTensor(const TensorPlan& plan, uint64_t seed, DType dtype, std::byte* out) {
  Rng rng(DeriveSeed(seed, plan.name));
  const int64_t n = plan.numel();
  for (int64_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(plan.mean + plan.stddev * rng.Normal());
    switch (dtype) {
      case DType::kF32:
        std::memcpy(out + i * 4, &v, 4);
        break;
      case DType::kBF16: {
        const uint16_t h = FloatToBf16(v);
        std::memcpy(out + i * 2, &h, 2);
        break;
      }
      case DType::kF16: {
        const uint16_t h = FloatToF16(v);
        std::memcpy(out + i * 2, &h, 2);
        break;
      }
      case DType::kF8E4M3:
        out[i] = static_cast<std::byte>(FloatToF8E4M3(v));
        break;
      case DType::kF8E5M2:
        out[i] = static_cast<std::byte>(FloatToF8E5M2(v));
        break;
    }
  }
}

}  // namespace kvrm::modelgen
