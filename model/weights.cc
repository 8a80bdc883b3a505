#include "model/weights.h"

#include <cmath>
#include <string>
#include <string_view>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/gpt_oss.h"

namespace kvrm {
namespace {

absl::StatusOr<WeightMatrix> Bind(const SafetensorsSet& files, const std::string& name,
                                  const std::vector<int64_t>& shape) {
  ASSIGN_OR_RETURN(TensorView t, files.Get(name, shape));
  const int64_t rows = shape.size() == 2 ? shape[0] : 1;
  const int64_t cols = shape.back();
  return WeightMatrix{t.dtype, t.data, rows, cols, cols};
}

// A mixture-of-experts layer's router and experts, by Mixtral's names
// (block_sparse_moe.gate, experts.E.w1 / w3 / w2) or Qwen2 / Qwen3-MoE's (mlp.gate,
// experts.E.gate_proj / up_proj / down_proj), and Qwen2-MoE's shared expert
// (mlp.shared_expert.*, mlp.shared_expert_gate).
absl::Status BindExperts(const LlamaConfig& c, const std::string& p, const LlamaTensorBinder& bind,
                         LayerWeights* l) {
  const int64_t d = c.hidden_size, ffn = c.moe_intermediate_size;
  const bool mixtral = c.model_type == "mixtral";
  const std::string moe = p + (mixtral ? "block_sparse_moe." : "mlp.");
  if (c.moe_biases) {  // gpt-oss: mlp.router, biased, and biased experts (model/gpt_oss.h)
    ASSIGN_OR_RETURN(l->router, bind(moe + "router.weight", {c.num_experts, d}));
    ASSIGN_OR_RETURN(l->router_bias, bind(moe + "router.bias", {c.num_experts}));
    for (int32_t e = 0; e < c.num_experts; ++e) {
      const std::string x = absl::StrCat(moe, "experts.", e, ".");
      ASSIGN_OR_RETURN(l->expert_gate_bias.emplace_back(), bind(x + "gate_proj.bias", {ffn}));
      ASSIGN_OR_RETURN(l->expert_up_bias.emplace_back(), bind(x + "up_proj.bias", {ffn}));
      ASSIGN_OR_RETURN(l->expert_down_bias.emplace_back(), bind(x + "down_proj.bias", {d}));
    }
  } else {
    ASSIGN_OR_RETURN(l->router, bind(moe + "gate.weight", {c.num_experts, d}));
  }
  const char* gate = mixtral ? "w1" : "gate_proj";
  const char* up = mixtral ? "w3" : "up_proj";
  const char* down = mixtral ? "w2" : "down_proj";
  for (int32_t e = 0; e < c.num_experts; ++e) {
    const std::string x = absl::StrCat(moe, "experts.", e, ".");
    ASSIGN_OR_RETURN(l->expert_gate.emplace_back(),
                     bind(absl::StrCat(x, gate, ".weight"), {ffn, d}));
    ASSIGN_OR_RETURN(l->expert_up.emplace_back(), bind(absl::StrCat(x, up, ".weight"), {ffn, d}));
    ASSIGN_OR_RETURN(l->expert_down.emplace_back(),
                     bind(absl::StrCat(x, down, ".weight"), {d, ffn}));
  }
  if (const int64_t shared = c.shared_expert_intermediate_size; shared > 0) {  // Qwen2-MoE's
    ASSIGN_OR_RETURN(l->shared_gate, bind(moe + "shared_expert.gate_proj.weight", {shared, d}));
    ASSIGN_OR_RETURN(l->shared_up, bind(moe + "shared_expert.up_proj.weight", {shared, d}));
    ASSIGN_OR_RETURN(l->shared_down, bind(moe + "shared_expert.down_proj.weight", {d, shared}));
    ASSIGN_OR_RETURN(l->shared_expert_gate, bind(moe + "shared_expert_gate.weight", {1, d}));
  }
  return absl::OkStatus();
}

// The names checkpoints give a layer's FP8 KV cache scales, under "model.layers.N.self_attn.",
// key then value: compressed-tensors' and Transformers' (k_scale), vLLM's own module path
// (attn.k_scale), ModelOpt's (k_proj.k_scale), Quark's (k_proj.output_scale), and AutoFP8's one
// scale for both (kv_scale).
constexpr std::pair<const char*, const char*> kKvScaleNames[] = {
    {"k_scale", "v_scale"},
    {"attn.k_scale", "attn.v_scale"},
    {"k_proj.k_scale", "v_proj.v_scale"},
    {"k_proj.output_scale", "v_proj.output_scale"},
    {"kv_scale", "kv_scale"},
};

// One scale tensor: one element, finite and positive.
absl::StatusOr<float> ReadKvScale(const SafetensorsSet& files, const std::string& name) {
  ASSIGN_OR_RETURN(const TensorView t, files.Get(name));
  if (t.numel() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(files.dir(), ": ", name, " has ", t.numel(),
                                                   " elements; a KV cache scale has one"));
  }
  const float v = FloatElement(t, 0);
  if (!std::isfinite(v) || v <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(files.dir(), ": ", name, " is ", v, "; a KV cache scale must be positive"));
  }
  return v;
}

// Fills each layer's k_cache_scale / v_cache_scale from the checkpoint, where it has them.
absl::Status ReadKvCacheScales(const SafetensorsSet& files, const std::string& prefix,
                               LlamaWeights* w) {
  size_t with = 0;
  for (size_t i = 0; i < w->layers.size(); ++i) {
    const std::string p = absl::StrCat(prefix, "layers.", i, ".self_attn.");
    for (const auto& [k, v] : kKvScaleNames) {
      if (!files.Contains(p + k) && !files.Contains(p + v)) continue;
      LayerWeights& l = w->layers[i];
      ASSIGN_OR_RETURN(l.k_cache_scale, ReadKvScale(files, p + k));
      ASSIGN_OR_RETURN(l.v_cache_scale, ReadKvScale(files, p + v));
      const std::string names = k == std::string_view(v) ? absl::StrCat("self_attn.", k)
                                                         : absl::StrCat("self_attn.", k, " / ", v);
      if (w->kv_cache_scales.empty()) {
        w->kv_cache_scales = names;
      } else if (w->kv_cache_scales != names) {
        return absl::InvalidArgumentError(
            absl::StrCat(files.dir(), ": layer ", i, "'s KV cache scales are ", names,
                         ", another layer's ", w->kv_cache_scales, ": one convention a model"));
      }
      ++with;
      break;
    }
  }
  if (with > 0 && with < w->layers.size()) {
    absl::StrAppend(&w->kv_cache_scales, ", ", with, " of ", w->layers.size(),
                    " layers (the rest 1)");
  }
  return absl::OkStatus();
}

}  // namespace

std::string LanguageModelPrefix(const LlamaConfig& config, const SafetensorsSet& files) {
  // Gemma 3's multimodal checkpoints keep the language model under language_model.model.
  // (Transformers before 4.52, as Google's own files) or model.language_model.; lm_head is tied.
  if (!config.multimodal_wrapper) {
    return !files.Contains("model.embed_tokens.weight") && files.Contains("embed_tokens.weight")
               ? ""
               : "model.";
  }
  return files.Contains("model.language_model.embed_tokens.weight") ? "model.language_model."
                                                                    : "language_model.model.";
}

absl::StatusOr<LlamaWeights> BindLlamaWeights(const LlamaConfig& config,
                                              const SafetensorsSet& files,
                                              const QuantizedCheckpointLoad* quantized) {
  const std::string prefix = LanguageModelPrefix(config, files);
  const CheckpointQuantization& q = config.quantization;
  // A base model's checkpoint (an embedding model's) and a sequence classifier's (score.weight
  // in its place) have no LM head: bound as if tied, marked.
  const bool no_lm_head = !config.tie_word_embeddings && !files.Contains("lm_head.weight") &&
                          (prefix.empty() || files.Contains("score.weight"));
  LlamaConfig bound = config;
  if (no_lm_head) bound.tie_word_embeddings = true;
  absl::StatusOr<LlamaWeights> w = BindLlamaWeights(
      bound,
      [&](const std::string& hf_name,
          const std::vector<int64_t>& shape) -> absl::StatusOr<WeightMatrix> {
        const std::string name =
            hf_name.rfind("model.", 0) == 0 ? prefix + hf_name.substr(6) : hf_name;
        // A quantized checkpoint's linear weight: "<base>.qweight" (or .weight_packed) and the rest
        // where "<base>.weight" would be, or (FP8, int8) "<base>.weight" of a quantized element
        // type and its scales. Modules it left alone (AWQ's modules_to_not_convert,
        // compressed-tensors' ignore, the routers) keep a float .weight.
        constexpr absl::string_view kWeight = ".weight";
        if (q.enabled() && shape.size() == 2 && absl::EndsWith(name, kWeight)) {
          const std::string base = name.substr(0, name.size() - kWeight.size());
          if (HasQuantizedLinear(files, q, base)) {
            if (quantized == nullptr || quantized->converted == nullptr) {
              return absl::FailedPreconditionError(
                  absl::StrCat(files.dir(), ": ", base, " is ", q.method,
                               "-quantized, and this loader does not unpack checkpoints"));
            }
            return LoadQuantizedLinear(files, q, base, shape[0], shape[1], quantized->options,
                                       quantized->converted, quantized->stats);
          }
        }
        // gpt-oss's experts: from its fused tensors.
        if (auto expert = GptOssExpertTensor(files, config, name, shape,
                                             quantized != nullptr ? &quantized->options : nullptr,
                                             quantized != nullptr ? quantized->converted : nullptr,
                                             quantized != nullptr ? quantized->stats : nullptr)) {
          return *std::move(expert);
        }
        return Bind(files, name, shape);
      });
  if (w.ok()) {
    w->has_lm_head = !no_lm_head;
    if (absl::Status s = ReadKvCacheScales(files, prefix, &*w); !s.ok()) {
      for (LayerWeights& l : w->layers) l.k_cache_scale = l.v_cache_scale = 1;
      w->kv_cache_scales.clear();
      w->kv_cache_scales_error = std::move(s);
    }
  }
  return w;
}

absl::StatusOr<LlamaWeights> BindLlamaWeights(const LlamaConfig& c, const LlamaTensorBinder& bind) {
  LlamaWeights w;
  const int64_t d = c.hidden_size, hd = c.head_dim, ffn = c.intermediate_size;
  const int64_t q_rows = c.num_attention_heads * hd, kv_rows = c.num_key_value_heads * hd;
  ASSIGN_OR_RETURN(w.embed, bind("model.embed_tokens.weight", {c.vocab_size, d}));
  ASSIGN_OR_RETURN(w.final_norm, bind("model.norm.weight", {d}));
  if (c.tie_word_embeddings) {
    w.lm_head = w.embed;
  } else {
    ASSIGN_OR_RETURN(w.lm_head, bind("lm_head.weight", {c.vocab_size, d}));
  }
  // Layer by layer, each added once its tensors are found: a config that claims more layers
  // than the files hold fails at the first missing tensor, not by allocating for the claim.
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    LayerWeights& l = w.layers.emplace_back();
    if (c.pre_norms) {
      ASSIGN_OR_RETURN(l.attn_norm, bind(p + "input_layernorm.weight", {d}));
    }
    if (c.fused_projections) {
      // Phi-3: row ranges of the fused tensors, views like the rest.
      ASSIGN_OR_RETURN(const WeightMatrix qkv,
                       bind(p + "self_attn.qkv_proj.weight", {q_rows + 2 * kv_rows, d}));
      l.wq = qkv.RowSlice(0, q_rows);
      l.wk = qkv.RowSlice(q_rows, kv_rows);
      l.wv = qkv.RowSlice(q_rows + kv_rows, kv_rows);
      ASSIGN_OR_RETURN(const WeightMatrix gate_up,
                       bind(p + "mlp.gate_up_proj.weight", {2 * ffn, d}));
      l.w_gate = gate_up.RowSlice(0, ffn);
      l.w_up = gate_up.RowSlice(ffn, ffn);
    } else {
      ASSIGN_OR_RETURN(l.wq, bind(p + "self_attn.q_proj.weight", {q_rows, d}));
      ASSIGN_OR_RETURN(l.wk, bind(p + "self_attn.k_proj.weight", {kv_rows, d}));
      ASSIGN_OR_RETURN(l.wv, bind(p + "self_attn.v_proj.weight", {kv_rows, d}));
      if (!c.IsMoeLayer(i)) {
        ASSIGN_OR_RETURN(l.w_gate, bind(p + "mlp.gate_proj.weight", {ffn, d}));
        ASSIGN_OR_RETURN(l.w_up, bind(p + "mlp.up_proj.weight", {ffn, d}));
      }
    }
    ASSIGN_OR_RETURN(l.wo, bind(p + "self_attn.o_proj.weight", {d, q_rows}));
    if (c.sandwich_norms) {
      ASSIGN_OR_RETURN(l.attn_post_norm, bind(p + "post_attention_layernorm.weight", {d}));
      if (c.pre_norms) {
        ASSIGN_OR_RETURN(l.mlp_norm, bind(p + "pre_feedforward_layernorm.weight", {d}));
      }
      ASSIGN_OR_RETURN(l.mlp_post_norm, bind(p + "post_feedforward_layernorm.weight", {d}));
    } else {
      ASSIGN_OR_RETURN(l.mlp_norm, bind(p + "post_attention_layernorm.weight", {d}));
    }
    if (c.IsMoeLayer(i)) {
      RETURN_IF_ERROR(BindExperts(c, p, bind, &l));
    } else {
      ASSIGN_OR_RETURN(l.w_down, bind(p + "mlp.down_proj.weight", {d, ffn}));
    }
    if (c.qkv_bias) {
      ASSIGN_OR_RETURN(l.bq, bind(p + "self_attn.q_proj.bias", {q_rows}));
      ASSIGN_OR_RETURN(l.bk, bind(p + "self_attn.k_proj.bias", {kv_rows}));
      ASSIGN_OR_RETURN(l.bv, bind(p + "self_attn.v_proj.bias", {kv_rows}));
    }
    if (c.o_bias) {
      ASSIGN_OR_RETURN(l.bo, bind(p + "self_attn.o_proj.bias", {d}));
    }
    if (c.attention_sinks) {
      ASSIGN_OR_RETURN(l.sinks, bind(p + "self_attn.sinks", {c.num_attention_heads}));
    }
    if (c.qk_norm) {  // per head, or (OLMo 2) over the whole projection
      ASSIGN_OR_RETURN(l.q_norm,
                       bind(p + "self_attn.q_norm.weight", {c.qk_norm_whole ? q_rows : hd}));
      ASSIGN_OR_RETURN(l.k_norm,
                       bind(p + "self_attn.k_norm.weight", {c.qk_norm_whole ? kv_rows : hd}));
    }
  }
  w.dtype = w.embed.dtype;
  auto count = [&](const WeightMatrix& m) {
    if (m.data == nullptr) return;  // an optional tensor the model does not have
    w.num_parameters += m.rows * m.cols;
    w.bytes += m.bytes();
  };
  int64_t idle_experts = 0;  // parameters of the experts a token does not run
  count(w.embed);
  count(w.final_norm);
  if (!c.tie_word_embeddings) count(w.lm_head);
  for (const LayerWeights& l : w.layers) {
    for (const WeightMatrix* m :
         {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.mlp_norm, &l.w_gate, &l.w_up, &l.w_down,
          &l.bq, &l.bk, &l.bv, &l.bo, &l.q_norm, &l.k_norm, &l.attn_post_norm, &l.mlp_post_norm}) {
      count(*m);
    }
    for (const WeightMatrix* m : {&l.router, &l.shared_gate, &l.shared_up, &l.shared_down,
                                  &l.shared_expert_gate, &l.sinks, &l.router_bias}) {
      count(*m);
    }
    for (const auto* experts : {&l.expert_gate, &l.expert_up, &l.expert_down, &l.expert_gate_bias,
                                &l.expert_up_bias, &l.expert_down_bias}) {
      for (const WeightMatrix& m : *experts) count(m);
    }
    if (!l.expert_gate.empty()) {  // gate, up and down of the same size, for each idle expert
      const WeightMatrix& g = l.expert_gate.front();
      idle_experts += (c.num_experts - c.num_experts_per_tok) * 3 * g.rows * g.cols;
      if (!l.expert_gate_bias.empty()) {  // gpt-oss's: gate, up and down biases
        idle_experts += (c.num_experts - c.num_experts_per_tok) * (2 * g.rows + g.cols);
      }
    }
  }
  w.num_active_parameters = w.num_parameters - idle_experts;
  return w;
}

}  // namespace kvrm
