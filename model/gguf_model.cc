#include "model/gguf_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/json.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "kernels/cpu/q8_0.h"
#include "model/gguf_quants.h"
#include "model/gguf_tokenizer.h"

namespace kvrm {
namespace {

// A per-layer integer hyperparameter: a scalar, or an array whose entries all agree (llama.cpp
// allows them to differ; the engine's layers are all alike).
absl::StatusOr<uint64_t> LayerUint(const GgufFile& f, const std::string& key) {
  const GgufValue* v = f.Find(key);
  if (v == nullptr || v->type != GgufValueType::kArray) return f.GetUint(key);
  ASSIGN_OR_RETURN(std::vector<double> all, f.GetNumberArray(key));
  // (Range first: converting a double past uint64_t's range is undefined.)
  if (all.empty() || !(all[0] >= 0 && all[0] < 0x1p63) || all[0] != std::floor(all[0])) {
    return f.Invalid(key, "expected non-negative integers, one per layer");
  }
  for (double x : all) {
    if (x != all[0]) return f.Unimplemented(key, "differs between layers");
  }
  return static_cast<uint64_t>(all[0]);
}

// Which layers slide over a window of `window`, as llama.cpp's set_swa_pattern reads
// attention.sliding_window_pattern: one bool per layer, or a period (`period` when the key is
// absent; GgufLayerSlides). As config.json's sliding_window and layer_types.
absl::Status GgufSlidingLayers(const GgufFile& f, const std::string& p, uint64_t window,
                               uint64_t period, uint64_t layers, Json* c) {
  std::vector<bool> sliding(layers, false);
  if (window > 0) {
    const std::string key = p + "attention.sliding_window_pattern";
    const GgufValue* v = f.Find(key);
    if (v != nullptr && v->type == GgufValueType::kArray) {
      if (v->count != layers) {  // before the entries are read
        return f.Invalid(key, absl::StrCat("has ", v->count, " entries for ", layers, " layers"));
      }
      ASSIGN_OR_RETURN(const std::vector<double> each, f.GetNumberArray(key));
      for (uint64_t l = 0; l < layers; ++l) sliding[l] = each[l] != 0;
    } else {
      if (v != nullptr) {
        ASSIGN_OR_RETURN(period, f.GetUint(key));
      }
      for (uint64_t l = 0; l < layers; ++l) sliding[l] = GgufLayerSlides(l, period);
    }
    (*c)["sliding_window"] = window;
  }
  Json types = Json::array();
  for (bool s : sliding) types.push_back(s ? "sliding_attention" : "full_attention");
  (*c)["layer_types"] = std::move(types);
  return absl::OkStatus();
}

// rope.freq_base_swa where the engine has one base for all layers: the global one or absent.
// (llama.cpp would rotate the sliding layers with it, scaled as the others.)
absl::Status NoSecondRopeBase(const GgufFile& f, const std::string& p, absl::string_view model) {
  if (f.Find(p + "rope.freq_base_swa") == nullptr) return absl::OkStatus();
  ASSIGN_OR_RETURN(const double local, f.GetFloat(p + "rope.freq_base_swa"));
  double global = 10000;  // llama.cpp's default base
  if (f.Find(p + "rope.freq_base") != nullptr) {
    ASSIGN_OR_RETURN(global, f.GetFloat(p + "rope.freq_base"));
  }
  if (local == global) return absl::OkStatus();
  return f.Unimplemented(p + "rope.freq_base_swa",
                         absl::StrCat("a second RoPE base for ", model, "'s sliding layers"));
}

// Gemma 2 / 3's keys as llama.cpp reads them, into config.json's names: the window (Gemma 2:
// 4096 when absent; Gemma 3: none), the sliding layers (GgufSlidingLayers: Gemma 2's period 2,
// Gemma 3's 6), the sliding layers' RoPE base (rope.freq_base_swa; Gemma 3: 10000 when absent,
// Gemma 2: the global base) and the softcaps (Gemma 2: 50 and 30 when absent; Gemma 3: the
// logits' only, none when absent).
absl::Status GemmaGgufFields(const GgufFile& f, const std::string& p, bool gemma2, uint64_t layers,
                             Json* c) {
  const bool windowed = gemma2 || f.Find(p + "attention.sliding_window") != nullptr;
  uint64_t window = 4096;
  if (f.Find(p + "attention.sliding_window") != nullptr) {
    ASSIGN_OR_RETURN(window, f.GetUint(p + "attention.sliding_window"));
  }
  RETURN_IF_ERROR(GgufSlidingLayers(f, p, windowed ? window : 0, gemma2 ? 2 : 6, layers, c));
  if (!gemma2 && f.Find(p + "rope.freq_base_swa") != nullptr) {
    ASSIGN_OR_RETURN((*c)["rope_local_base_freq"], f.GetFloat(p + "rope.freq_base_swa"));
  } else if (gemma2) {
    RETURN_IF_ERROR(NoSecondRopeBase(f, p, "Gemma 2"));
  }
  for (const char* key : {"attn_logit_softcapping", "final_logit_softcapping"}) {
    if (f.Find(p + key) != nullptr) {
      ASSIGN_OR_RETURN(const double cap, f.GetFloat(p + key));
      (*c)[key] = cap == 0 && !gemma2 ? Json(nullptr) : Json(cap);  // gemma3: 0 is none
    } else if (!gemma2) {
      (*c)[key] = nullptr;
    }
  }
  if (!gemma2 && c->contains("attn_logit_softcapping") &&
      !(*c)["attn_logit_softcapping"].is_null()) {
    return f.Unimplemented(p + "attn_logit_softcapping",
                           "Gemma 3's scores are not capped (llama.cpp ignores the key)");
  }
  return absl::OkStatus();
}

// gpt-oss's keys as llama.cpp's openai-moe graph reads them: the window
// (attention.sliding_window, required there) over the layers the period 2 marks (the even ones)
// unless the file says, one RoPE base for all layers, and the clamped GLU's limit, which
// llama.cpp fixes at 7 (LLM_FFN_SWIGLU_OAI_MOE).
absl::Status GptOssGgufFields(const GgufFile& f, const std::string& p, uint64_t layers, Json* c) {
  ASSIGN_OR_RETURN(const uint64_t window, f.GetUint(p + "attention.sliding_window"));
  RETURN_IF_ERROR(GgufSlidingLayers(f, p, window, 2, layers, c));
  RETURN_IF_ERROR(NoSecondRopeBase(f, p, "gpt-oss"));
  (*c)["swiglu_limit"] = 7.0;
  return absl::OkStatus();
}

// OLMo 3's keys as llama.cpp's olmo2 graph reads them when the file has a window: the window
// over the layers the period 4 marks (all but every fourth) unless the file says, one RoPE base.
// Its sliding layers rotate unscaled there (as Olmo3Model's), and its YaRN has an attention
// factor of its own: RoPE scaling is refused with the window rather than read another way.
absl::Status Olmo3GgufFields(const GgufFile& f, const std::string& p, uint64_t layers, Json* c) {
  ASSIGN_OR_RETURN(const uint64_t window, f.GetUint(p + "attention.sliding_window"));
  RETURN_IF_ERROR(GgufSlidingLayers(f, p, window, 4, layers, c));
  RETURN_IF_ERROR(NoSecondRopeBase(f, p, "OLMo 3"));
  if (f.Find(p + "rope.scaling.type") != nullptr) {
    ASSIGN_OR_RETURN(const absl::string_view scaling, f.GetString(p + "rope.scaling.type"));
    if (scaling != "none") {
      return f.Unimplemented(p + "rope.scaling.type",
                             absl::StrCat("\"", scaling, "\" with OLMo 3's sliding layers"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

int64_t GgufGemmaAttentionScaleSize(const LlamaConfig& c) {
  const bool big = c.num_hidden_layers == (c.model_type == "gemma2" ? 46 : 62);
  return big ? c.hidden_size / c.num_attention_heads : c.head_dim;
}

bool GgufPermutesQk(std::string_view architecture) {
  // (mixtral: the model type a llama file with experts is served as.)
  return architecture == "llama" || architecture == "granite" || architecture == "mixtral" ||
         architecture == "smollm3";
}

int64_t GgufRopeRowToHf(int64_t row, int64_t head_dim) {
  const int64_t h = row / head_dim, w = row % head_dim;
  return h * head_dim + (w % 2) * (head_dim / 2) + w / 2;
}

absl::StatusOr<LlamaConfig> GgufLlamaConfig(const GgufFile& f) {
  ASSIGN_OR_RETURN(const absl::string_view arch, f.GetString("general.architecture"));
  const bool gemma = arch == "gemma2" || arch == "gemma3";
  const bool gpt_oss = arch == "gpt-oss";
  // llama.cpp's olmo2 is OLMo 2, and OLMo 3 where the file has a window.
  const bool olmo = arch == "olmo2";
  if (arch != "llama" && arch != "qwen2" && arch != "qwen3" && arch != "qwen2moe" &&
      arch != "qwen3moe" && arch != "phi3" && arch != "granite" && arch != "smollm3" && !gemma &&
      !gpt_oss && !olmo) {
    return f.Unimplemented(
        "general.architecture",
        absl::StrCat("\"", arch,
                     "\" is not supported (llama, qwen2, qwen3, qwen2moe, qwen3moe, phi3, "
                     "granite, smollm3, olmo2, gemma2, gemma3, gpt-oss)"));
  }
  const std::string p = absl::StrCat(arch, ".");  // the architecture's metadata: "qwen2.*"
  // (smollm3: llama.cpp's layers without RoPE are every fourth, fixed, as SmolLM3Config's default
  // no_rope_layer_interval of 4 has them: ParseLlamaConfig makes them so.)
  Json c = Json::object();
  c["model_type"] = arch == "gemma3"                                            ? "gemma3_text"
                    : gpt_oss                                                   ? "gpt_oss"
                    : olmo && f.Find(p + "attention.sliding_window") != nullptr ? "olmo3"
                                                                                : std::string(arch);
  // Mixtures of experts as llama.cpp computes them: a llama file with experts is Mixtral (each
  // expert feed_forward_length wide), qwen3moe is Qwen3-MoE (expert_feed_forward_length), both
  // renormalizing the chosen experts' weights; qwen2moe is Qwen2-MoE (not renormalized, with a
  // shared expert expert_shared_feed_forward_length wide); gpt-oss is gpt-oss (the softmax of
  // the chosen experts' biased logits; expert_feed_forward_length). Every layer is a mixture.
  uint64_t experts = 0;
  if (f.Find(p + "expert_count") != nullptr || gpt_oss) {
    ASSIGN_OR_RETURN(experts, f.GetUint(p + "expert_count"));
  }
  if (arch == "qwen2moe" || arch == "qwen3moe" || gpt_oss || experts > 0) {
    if (arch != "llama" && arch != "qwen2moe" && arch != "qwen3moe" && !gpt_oss) {
      return f.Unimplemented(
          p + "expert_count",
          absl::StrCat(experts,
                       " experts: mixtures of experts are served for llama (Mixtral), "
                       "qwen2moe, qwen3moe and gpt-oss, not \"",
                       arch, "\""));
    }
    const bool mixtral = arch == "llama";
    if (!gpt_oss) {
      c["model_type"] = mixtral ? "mixtral" : arch == "qwen2moe" ? "qwen2_moe" : "qwen3_moe";
    }
    ASSIGN_OR_RETURN(c[mixtral || gpt_oss ? "num_local_experts" : "num_experts"],
                     f.GetUint(p + "expert_count"));
    ASSIGN_OR_RETURN(c["num_experts_per_tok"], f.GetUint(p + "expert_used_count"));
    if (gpt_oss) {  // GptOssConfig's intermediate_size is the experts' width
      ASSIGN_OR_RETURN(c["intermediate_size"], LayerUint(f, p + "expert_feed_forward_length"));
    } else if (!mixtral) {
      ASSIGN_OR_RETURN(c["moe_intermediate_size"], f.GetUint(p + "expert_feed_forward_length"));
      c["norm_topk_prob"] = arch == "qwen3moe";
    }
    if (arch == "qwen2moe") {
      ASSIGN_OR_RETURN(c["shared_expert_intermediate_size"],
                       f.GetUint(p + "expert_shared_feed_forward_length"));
    }
  }
  for (const auto& [key, hf] : {std::pair{"context_length", "max_position_embeddings"},
                                std::pair{"embedding_length", "hidden_size"},
                                std::pair{"block_count", "num_hidden_layers"}}) {
    ASSIGN_OR_RETURN(c[hf], f.GetUint(p + key));
  }
  if (!gpt_oss) {
    ASSIGN_OR_RETURN(c["intermediate_size"], LayerUint(f, p + "feed_forward_length"));
  }
  ASSIGN_OR_RETURN(const uint64_t heads, LayerUint(f, p + "attention.head_count"));
  c["num_attention_heads"] = heads;
  if (f.Find(p + "attention.head_count_kv") != nullptr) {
    ASSIGN_OR_RETURN(c["num_key_value_heads"], LayerUint(f, p + "attention.head_count_kv"));
  }
  ASSIGN_OR_RETURN(c["rms_norm_eps"], f.GetFloat(p + "attention.layer_norm_rms_epsilon"));
  // Granite's multipliers, under llama.cpp's names (each 1 when absent, as GraniteConfig's).
  if (arch == "granite") {
    for (const auto& [key, hf] : {std::pair{"embedding_scale", "embedding_multiplier"},
                                  std::pair{"residual_scale", "residual_multiplier"},
                                  std::pair{"attention.scale", "attention_multiplier"},
                                  std::pair{"logit_scale", "logits_scaling"}}) {
      if (f.Find(p + key) != nullptr) {
        ASSIGN_OR_RETURN(c[hf], f.GetFloat(p + key));
      }
    }
  }
  if (gemma || gpt_oss || c["model_type"] == "olmo3") {
    ASSIGN_OR_RETURN(const uint64_t layers, f.GetUint(p + "block_count"));
    if (layers == 0 || layers > kMaxHiddenLayers) {  // before anything is allocated per layer
      return f.Invalid(p + "block_count",
                       absl::StrCat("(", layers, ") must be in [1, ", kMaxHiddenLayers, "]"));
    }
    RETURN_IF_ERROR(gemma     ? GemmaGgufFields(f, p, arch == "gemma2", layers, &c)
                    : gpt_oss ? GptOssGgufFields(f, p, layers, &c)
                              : Olmo3GgufFields(f, p, layers, &c));
  }
  // Phi-3's window (the engine serves within it, as config.json's sliding_window).
  if (arch == "phi3" && f.Find(p + "attention.sliding_window") != nullptr) {
    ASSIGN_OR_RETURN(c["sliding_window"], f.GetUint(p + "attention.sliding_window"));
  }
  if (f.Find(p + "rope.freq_base") != nullptr) {
    ASSIGN_OR_RETURN(c["rope_theta"], f.GetFloat(p + "rope.freq_base"));
  }
  // The head size: key_length (= value_length), else hidden / heads as in Transformers.
  uint64_t head_dim = heads > 0 ? c["hidden_size"].get<uint64_t>() / heads : 0;
  if (f.Find(p + "attention.key_length") != nullptr) {
    ASSIGN_OR_RETURN(head_dim, f.GetUint(p + "attention.key_length"));
    c["head_dim"] = head_dim;
  }
  if (f.Find(p + "attention.value_length") != nullptr) {
    ASSIGN_OR_RETURN(const uint64_t v, f.GetUint(p + "attention.value_length"));
    if (v != head_dim) {
      return f.Unimplemented(p + "attention.value_length",
                             absl::StrCat(v, " differs from the key length ", head_dim));
    }
  }
  if (f.Find(p + "rope.dimension_count") != nullptr) {
    ASSIGN_OR_RETURN(const uint64_t rot, f.GetUint(p + "rope.dimension_count"));
    if (rot != head_dim) {
      return f.Unimplemented(p + "rope.dimension_count",
                             absl::StrCat("RoPE over ", rot, " of the head's ", head_dim,
                                          " dimensions (partial rotary)"));
    }
  }
  ASSIGN_OR_RETURN(const absl::Span<const absl::string_view> tokens,
                   f.GetStringArray("tokenizer.ggml.tokens"));
  c["vocab_size"] = tokens.size();
  if (f.Find(p + "vocab_size") != nullptr) {
    ASSIGN_OR_RETURN(c["vocab_size"], f.GetUint(p + "vocab_size"));
  }
  c["tie_word_embeddings"] = f.FindTensor("output.weight") == nullptr;
  // RoPE scaling: linear (rope.scaling.type, which llama.cpp takes as linear when absent; or the
  // older rope.scale_linear), yarn (its factor, original context length and betas; llama.cpp's
  // default attention factor), or none.
  absl::string_view scaling = "linear";
  if (f.Find(p + "rope.scaling.type") != nullptr) {
    ASSIGN_OR_RETURN(scaling, f.GetString(p + "rope.scaling.type"));
    if (scaling != "none" && scaling != "linear" && scaling != "yarn") {
      return f.Unimplemented(p + "rope.scaling.type", absl::StrCat("\"", scaling,
                                                                   "\" is not supported (none, "
                                                                   "linear, yarn)"));
    }
  }
  if (scaling == "yarn") {
    // (truncate: llama.cpp's ramp runs between whole dimensions, ggml_rope_yarn_corr_dims
    // flooring the first and ceiling the last, whatever the model's own config said.)
    Json yarn = {{"type", "yarn"}, {"truncate", true}};
    ASSIGN_OR_RETURN(yarn["factor"], f.GetFloat(p + "rope.scaling.factor"));
    if (f.Find(p + "rope.scaling.original_context_length") != nullptr) {
      ASSIGN_OR_RETURN(yarn["original_max_position_embeddings"],
                       f.GetUint(p + "rope.scaling.original_context_length"));
    }
    for (const auto& [key, hf] : {std::pair{"yarn_beta_fast", "beta_fast"},
                                  std::pair{"yarn_beta_slow", "beta_slow"}}) {
      if (f.Find(p + "rope.scaling." + key) != nullptr) {
        ASSIGN_OR_RETURN(yarn[hf], f.GetFloat(p + "rope.scaling." + key));
      }
    }
    if (f.Find(p + "rope.scaling.yarn_log_multiplier") != nullptr) {
      ASSIGN_OR_RETURN(const double m, f.GetFloat(p + "rope.scaling.yarn_log_multiplier"));
      if (m != 0) {
        return f.Unimplemented(p + "rope.scaling.yarn_log_multiplier",
                               "(DeepSeek's YaRN attention factor) is not supported");
      }
    }
    c["rope_scaling"] = std::move(yarn);
  }
  double linear = 0;
  for (const std::string key : {p + "rope.scaling.factor", p + "rope.scale_linear"}) {
    if (scaling == "linear" && linear == 0 && f.Find(key) != nullptr) {
      ASSIGN_OR_RETURN(linear, f.GetFloat(key));
    }
  }
  if (linear > 0 && linear != 1) c["rope_scaling"] = {{"type", "linear"}, {"factor", linear}};
  // BOS, and every token that ends a generation.
  ASSIGN_OR_RETURN(const GgufSpecialTokens special, ReadGgufSpecialTokens(f));
  if (special.bos >= 0) c["bos_token_id"] = special.bos;
  if (!special.end_of_generation.empty()) c["eos_token_id"] = special.end_of_generation;

  ASSIGN_OR_RETURN(LlamaConfig config,
                   ParseLlamaConfig(c.dump(), absl::StrCat(f.path(), " (as config.json)")));
  if (gemma) {
    // As llama.cpp's gemma2 / gemma3 graphs compute them: the norms stored as 1 + w already, the
    // embedding scaled by sqrtf(hidden) in f32, and the attention scale from the head size
    // (from hidden / heads at the 27B models' layer counts, 46 and 62), not a file key.
    config.norm_weight_offset = 0;
    config.embedding_multiplier = std::sqrt(static_cast<float>(config.hidden_size));
    config.attention_scale = 1 / std::sqrt(static_cast<float>(GgufGemmaAttentionScaleSize(config)));
  }
  // Attention biases: Qwen2's Q/K/V ones always (as ParseLlamaConfig has them); Llama's and
  // Qwen3's where the file has them, the Q/K/V ones and the O one each optional as llama.cpp
  // takes them (HF's attention_bias is all four). Layer 0 says; the other layers must agree.
  if (config.model_type != "qwen2") {
    config.qkv_bias = f.FindTensor("blk.0.attn_q.bias") != nullptr;
    config.o_bias = f.FindTensor("blk.0.attn_output.bias") != nullptr;
  }
  if (const GgufTensor* t = f.FindTensor("rope_freqs.weight")) {
    if (config.rope_scaling.type == "linear" || config.rope_scaling.type == "yarn") {
      return f.Unimplemented("rope_freqs.weight",
                             absl::StrCat("with ", config.rope_scaling.type,
                                          " RoPE scaling as well"));
    }
    if (t->type != GgmlType::kF32 || t->numel() != config.head_dim / 2) {
      return f.Invalid("rope_freqs.weight",
                       absl::StrCat("expected ", config.head_dim / 2, " f32 factors"));
    }
    std::vector<float> factors(t->numel());
    std::memcpy(factors.data(), t->data, t->nbytes);
    config.rope_scaling.type = "freq_factors";
    for (float x : factors) {
      if (!(x > 0)) return f.Invalid("rope_freqs.weight", "factors must be positive");
      config.rope_scaling.freq_factors.push_back(x);
    }
  }
  return config;
}

namespace {

// The GGUF tensor that holds HF tensor `hf`, and whether its rows (a bias: its elements) were
// reordered for RoPE on adjacent pairs: attn_q over the query heads, attn_k over the KV heads,
// in the llama architecture only (`permuted`; llama.cpp's qwen2 and qwen3 rotate halves, as HF).
// An expert's matrix (bias) is one slab of a [experts][rows][cols] ([experts][n]) tensor
// (ffn_gate_exps, ffn_gate_exps.bias, ...).
struct GgufName {
  std::string name;
  bool rope_rows = false;
  int32_t expert = -1;  // the slab; -1: the whole tensor
};

// Whether HF's post_attention_layernorm is llama.cpp's post_attention_norm (Gemma's sandwich
// norms; gpt-oss, whose FFN pre-norm llama.cpp's openai-moe graph names so) rather than ffn_norm.
bool PostAttentionNormNames(const LlamaConfig& c) {
  return c.sandwich_norms || c.model_type == "gpt_oss";
}

absl::StatusOr<GgufName> ToGgufName(const std::string& hf, bool permuted, bool sandwich) {
  // Gemma's four norms a layer: post_attention_layernorm normalizes the attention output there
  // (and gpt-oss's names its FFN pre-norm so).
  static const auto* kSandwich = new std::vector<std::pair<absl::string_view, absl::string_view>>{
      {"post_attention_layernorm.weight", "post_attention_norm.weight"},
      {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
      {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"}};
  static const auto* kTop = new std::vector<std::pair<absl::string_view, absl::string_view>>{
      {"model.embed_tokens.weight", "token_embd.weight"},
      {"model.norm.weight", "output_norm.weight"},
      {"lm_head.weight", "output.weight"}};
  static const auto* kLayer = new std::vector<std::pair<absl::string_view, absl::string_view>>{
      {"input_layernorm.weight", "attn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.qkv_proj.weight", "attn_qkv.weight"},  // phi3: [q; k; v] rows
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"self_attn.q_proj.bias", "attn_q.bias"},
      {"self_attn.k_proj.bias", "attn_k.bias"},
      {"self_attn.v_proj.bias", "attn_v.bias"},
      {"self_attn.o_proj.bias", "attn_output.bias"},
      {"self_attn.q_norm.weight", "attn_q_norm.weight"},
      {"self_attn.k_norm.weight", "attn_k_norm.weight"},
      {"self_attn.sinks", "attn_sinks.weight"},  // gpt-oss
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.gate_up_proj.weight", "ffn_up.weight"},  // phi3: [gate; up] rows in one ffn_up
      {"mlp.down_proj.weight", "ffn_down.weight"}};
  // Mixtral's, Qwen2 / Qwen3-MoE's and gpt-oss's names for the routers, the experts' products
  // (and gpt-oss's biases) and Qwen2-MoE's shared expert.
  static const auto* kMoe = new std::vector<std::pair<absl::string_view, absl::string_view>>{
      {"block_sparse_moe.gate.weight", "ffn_gate_inp.weight"},
      {"mlp.gate.weight", "ffn_gate_inp.weight"},
      {"mlp.router.weight", "ffn_gate_inp.weight"},  // gpt-oss: biased router and experts
      {"mlp.router.bias", "ffn_gate_inp.bias"},
      {"gate_proj.bias", "ffn_gate_exps.bias"},
      {"up_proj.bias", "ffn_up_exps.bias"},
      {"down_proj.bias", "ffn_down_exps.bias"},
      {"w1.weight", "ffn_gate_exps.weight"},
      {"w3.weight", "ffn_up_exps.weight"},
      {"w2.weight", "ffn_down_exps.weight"},
      {"gate_proj.weight", "ffn_gate_exps.weight"},
      {"up_proj.weight", "ffn_up_exps.weight"},
      {"down_proj.weight", "ffn_down_exps.weight"},
      {"mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight"},
      {"mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight"},
      {"mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight"},
      {"mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight"}};
  for (const auto& [from, to] : *kTop) {
    if (hf == from) return GgufName{std::string(to)};
  }
  const std::vector<absl::string_view> parts = absl::StrSplit(hf, absl::MaxSplits('.', 3));
  int layer;
  if (parts.size() == 4 && parts[0] == "model" && parts[1] == "layers" &&
      absl::SimpleAtoi(parts[2], &layer)) {
    // "block_sparse_moe.experts.E.w1.weight", "mlp.experts.E.gate_proj.weight", the routers.
    const std::vector<absl::string_view> moe = absl::StrSplit(parts[3], absl::MaxSplits('.', 3));
    int expert = -1;
    const bool is_expert = moe.size() == 4 && moe[1] == "experts" &&
                           (moe[0] == "block_sparse_moe" || moe[0] == "mlp") &&
                           absl::SimpleAtoi(moe[2], &expert) && expert >= 0;
    for (const auto& [from, to] : *kMoe) {
      if (is_expert ? moe[3] == from && absl::StrContains(to, "_exps") : parts[3] == from) {
        return GgufName{absl::StrCat("blk.", layer, ".", to), false, is_expert ? expert : -1};
      }
    }
    for (const auto* table : {sandwich ? kSandwich : nullptr, kLayer}) {
      if (table == nullptr) continue;
      for (const auto& [from, to] : *table) {
        if (parts[3] == from) {
          return GgufName{
              absl::StrCat("blk.", layer, ".", to),
              permuted && (absl::StartsWith(to, "attn_q.") || absl::StartsWith(to, "attn_k."))};
        }
      }
    }
  }
  return absl::InternalError(absl::StrCat("no GGUF name for tensor ", hf));
}

std::string NeString(absl::Span<const int64_t> ne) {
  std::string s = "{";
  for (size_t i = 0; i < ne.size(); ++i) absl::StrAppend(&s, i ? ", " : "", ne[i]);
  return s + "}";
}

DType StoredDType(GgmlType t) {
  return t == GgmlType::kF16 ? DType::kF16 : t == GgmlType::kBF16 ? DType::kBF16 : DType::kF32;
}
bool Unquantized(GgmlType t) {
  return t == GgmlType::kF32 || t == GgmlType::kF16 || t == GgmlType::kBF16;
}

// Binds one tensor: in place when it can be, else converted into `converted`.
absl::StatusOr<WeightMatrix> BindTensor(const GgufFile& f, const LlamaConfig& config,
                                        const GgufLoadOptions& options, const std::string& hf,
                                        const std::vector<int64_t>& shape,
                                        std::vector<std::vector<std::byte>>* converted) {
  ASSIGN_OR_RETURN(const GgufName name, ToGgufName(hf, GgufPermutesQk(config.model_type),
                                                   PostAttentionNormNames(config)));
  const GgufTensor* t = f.FindTensor(name.name);
  if (t == nullptr) {
    return absl::NotFoundError(absl::StrCat(f.path(), ": tensor \"", name.name, "\" is missing"));
  }
  std::vector<int64_t> ne(shape.rbegin(), shape.rend());
  if (name.expert >= 0) ne.push_back(config.num_experts);  // the experts' slabs, one tensor
  if (ne.size() == 2 && ne[1] == 1 && t->ne.size() == 1) ne.pop_back();  // [1][n] as 1-D {n}
  if (t->ne != ne) {
    return absl::InvalidArgumentError(absl::StrCat(f.path(), ": tensor \"", name.name, "\": ne ",
                                                   NeString(t->ne), ", the config needs ",
                                                   NeString(ne)));
  }
  // An expert: its slab of rows, bound as a matrix of its own (in place when it can be).
  GgufTensor slab;
  if (name.expert >= 0) {
    slab = *t;
    slab.ne.pop_back();
    slab.nbytes = t->nbytes / static_cast<size_t>(t->ne.back());
    slab.data = t->data + static_cast<size_t>(name.expert) * slab.nbytes;
    t = &slab;
  }
  const int64_t rows = t->rows(), cols = t->cols();
  if (Unquantized(t->type) && !name.rope_rows) {
    return WeightMatrix{StoredDType(t->type), t->data, rows, cols, cols};
  }
  // Dequantization is most of a quantized model's load (one core: ~1 s per 125M parameters),
  // so the rows are shared among the threads, at least 64 rows each.
  auto parallel_rows = [&](const std::function<void(int64_t, int64_t)>& convert) {
    const int64_t threads = std::clamp<int64_t>(rows / 64, 1, std::max(options.threads, 1));
    std::vector<std::thread> pool;
    for (int64_t i = 1; i < threads; ++i) {
      pool.emplace_back(convert, rows * i / threads, rows * (i + 1) / threads);
    }
    convert(0, rows / threads);
    for (std::thread& th : pool) th.join();
  };
  // Matrices (not the 1-D norms, which the kernels read as dtype) of a quantized type, in a
  // block format of exactly their values: q8_0, q4_K and q6_K as they are (in place, or with
  // their rows put in HF order), q4_0 in rows of whole 256-value super-blocks as q4 groups (the
  // same bits, 4.75 bits a weight), other q4_0 and q5_0 as q8_0 blocks, q4_1, q5_1 and q5_K (and
  // MXFP4 the kernels do not take) as q8 affine blocks.
  // MXFP4 (gpt-oss's experts) as it is where the kernels take every E8M0 scale (2 to 252: from
  // f32's normal range to the largest whose 6 x 2^(e - 127) is finite) and options.mxfp4 asks,
  // else as q8 affine blocks; a scale past f32's range (253, 254) or E8M0's NaN (255) refused.
  bool mxfp4_kernels = options.mxfp4;
  if (t->type == GgmlType::kMxfp4) {
    const auto* blocks = reinterpret_cast<const uint8_t*>(t->data);
    for (int64_t b = 0; b < t->numel() / WeightMatrix::kQ8Block; ++b) {
      const uint8_t e = blocks[b * WeightMatrix::kMxfp4BlockBytes];
      if (!Mxfp4FiniteScale(e)) {
        return f.Invalid(
            absl::StrCat("tensor \"", name.name, "\""),
            absl::StrCat("block ", b, name.expert >= 0 ? " of expert " : "",
                         name.expert >= 0 ? absl::StrCat(name.expert) : "", ": E8M0 scale ", e,
                         e == 255 ? " is NaN" : ": 6 x 2^(e - 127) overflows"));
      }
      mxfp4_kernels = mxfp4_kernels && Mxfp4KernelScale(e);
    }
  }
  const WeightFormat stored = t->type == GgmlType::kMxfp4 && !mxfp4_kernels
                                  ? WeightFormat::kDense
                                  : StoredBlockFormat(t->type);
  const bool as_is = stored != WeightFormat::kDense;
  const bool q4_groups = t->type == GgmlType::kQ4_0 && cols % WeightMatrix::kQ4KBlock == 0;
  const WeightFormat format = as_is       ? stored
                              : q4_groups ? WeightFormat::kQ4G
                                          : Exact8BitFormat(t->type);
  if (options.as_q8 && shape.size() == 2 && format != WeightFormat::kDense) {
    WeightMatrix m{options.dequantized, t->data, rows, cols, cols, nullptr, format};
    if (as_is && !name.rope_rows) return m;
    const int64_t row_bytes = m.DataBytes(cols);
    std::vector<std::byte>& buffer = converted->emplace_back(row_bytes * rows);
    parallel_rows([&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const int64_t dst = name.rope_rows ? GgufRopeRowToHf(r, config.head_dim) : r;
        const std::byte* src = t->data + r * t->row_bytes();
        std::byte* to = buffer.data() + dst * row_bytes;
        if (as_is) {
          std::memcpy(to, src, row_bytes);
          continue;
        }
        CHECK(q4_groups ? ToQ4GroupsExactly(t->type, src, cols, to)
                        : ToExact8Bit(t->type, src, cols, to));
      }
    });
    m.data = buffer.data();
    return m;
  }
  const DType out = Unquantized(t->type) ? StoredDType(t->type) : options.dequantized;
  const size_t out_row = static_cast<size_t>(cols) * DTypeSize(out);
  std::vector<std::byte>& buffer = converted->emplace_back(out_row * rows);
  // Rows [begin, end): reordered or dequantized into the buffer (disjoint rows per thread).
  auto convert = [&](int64_t begin, int64_t end) {
    std::vector<float> row(Unquantized(t->type) ? 0 : cols);
    for (int64_t r = begin; r < end; ++r) {
      const int64_t dst = name.rope_rows ? GgufRopeRowToHf(r, config.head_dim) : r;
      const std::byte* src = t->data + r * t->row_bytes();
      std::byte* to = buffer.data() + dst * out_row;
      if (Unquantized(t->type)) {
        std::memcpy(to, src, out_row);
        continue;
      }
      DequantizeRow(t->type, src, cols, row.data());
      if (out == DType::kF32) {
        std::memcpy(to, row.data(), out_row);
      } else {
        for (int64_t c = 0; c < cols; ++c) {
          const uint16_t h = FloatToBf16(row[c]);
          std::memcpy(to + c * 2, &h, 2);
        }
      }
    }
  };
  parallel_rows(convert);
  if (name.rope_rows && shape.size() == 1) {  // a bias: its elements reordered as the rows were
    const size_t size = DTypeSize(out);
    const std::vector<std::byte> file_order = buffer;
    for (int64_t i = 0; i < cols; ++i) {
      std::memcpy(buffer.data() + GgufRopeRowToHf(i, config.head_dim) * size,
                  file_order.data() + i * size, size);
    }
  }
  return WeightMatrix{out, buffer.data(), rows, cols, cols};
}

}  // namespace

absl::StatusOr<std::unique_ptr<GgufModel>> LoadGgufModel(const std::string& path,
                                                         const GgufLoadOptions& options) {
  if (options.dequantized != DType::kF32 && options.dequantized != DType::kBF16) {
    return absl::InvalidArgumentError("GGUF: quantized tensors dequantize to f32 or bf16");
  }
  auto m = std::make_unique<GgufModel>();
  ASSIGN_OR_RETURN(m->file, GgufFile::Open(path));
  const GgufFile& f = *m->file;
  if (f.Find("split.count") != nullptr) {
    ASSIGN_OR_RETURN(const uint64_t parts, f.GetUint("split.count"));
    if (parts > 1) {
      return f.Unimplemented("split.count", absl::StrCat("one part of ", parts,
                                                         " (merge them with llama.cpp's "
                                                         "llama-gguf-split --merge)"));
    }
  }
  ASSIGN_OR_RETURN(m->config, GgufLlamaConfig(f));
  ASSIGN_OR_RETURN(m->tokenizer, LoadGgufTokenizer(f, m->config.vocab_size));
  if (f.Find("tokenizer.chat_template") != nullptr) {
    ASSIGN_OR_RETURN(const absl::string_view t, f.GetString("tokenizer.chat_template"));
    m->chat_template = std::string(t);
  }
  // The texts chat templates see as bos_token and eos_token.
  ASSIGN_OR_RETURN(const absl::Span<const absl::string_view> tokens,
                   f.GetStringArray("tokenizer.ggml.tokens"));
  ASSIGN_OR_RETURN(const GgufSpecialTokens special, ReadGgufSpecialTokens(f));
  if (special.bos >= 0) m->bos_token = std::string(tokens[special.bos]);
  if (special.eos >= 0) m->eos_token = std::string(tokens[special.eos]);
  // What the file is called by (Q4_K_M files are mostly q4_K): the type most parameters of its
  // matrices have.
  std::map<GgmlType, int64_t> by_type;
  for (const GgufTensor& t : f.tensors()) {
    if (t.ne.size() >= 2) by_type[t.type] += t.numel();  // (experts: 3-D)
  }
  int64_t most = -1;
  for (const auto& [type, params] : by_type) {
    if (params > most) {
      m->file_type = GgmlTraits(type).name;
      most = params;
    }
  }
  const LlamaConfig& config = m->config;
  auto* converted = &m->converted;
  absl::flat_hash_set<std::string> bound = {"rope_freqs.weight"};  // (read by GgufLlamaConfig)
  ASSIGN_OR_RETURN(
      m->weights,
      BindLlamaWeights(config, [&](const std::string& hf, const std::vector<int64_t>& shape) {
        bound.insert(
            ToGgufName(hf, false, PostAttentionNormNames(config)).value_or(GgufName{}).name);
        return BindTensor(f, config, options, hf, shape, converted);
      }));
  // A tensor the model does not use is a part of it the engine would not compute (a bias the
  // architecture does not have, another layer's kind): refused, as llama.cpp refuses a file with
  // tensors its architecture does not create.
  for (const GgufTensor& t : f.tensors()) {
    if (!bound.contains(t.name)) {
      return f.Unimplemented(absl::StrCat("tensor \"", t.name, "\""),
                             absl::StrCat("is not used by a \"", config.model_type,
                                          "\" model (kvrm does not compute it)"));
    }
  }
  return m;
}

}  // namespace kvrm
