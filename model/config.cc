#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/json.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace kvrm {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

// Gemma 2 / 3's block (LlamaConfig's Gemma fields): gemma2, and gemma3_text (gemma3's too).
bool IsGemma(std::string_view model_type) {
  return model_type == "gemma2" || model_type == "gemma3_text";
}

// OLMo 2 and 3: output norms only, Q/K norms over the whole projections.
bool IsOlmo(std::string_view model_type) { return model_type == "olmo2" || model_type == "olmo3"; }

// The most experts a mixture may have (Qwen3-MoE 128, DeepSeek-V3 256): a claim of more is
// refused before anything is kept per expert.
constexpr int64_t kMaxExperts = 4096;
// The most experts a token may run (the models here run 1 to 10): the CPU rank keeps
// [rows x this] gathered rows, so a claim of thousands is refused rather than allocated for.
constexpr int64_t kMaxExpertsPerToken = 64;

// Typed, non-throwing access to one JSON object's fields. Errors read
// "<what>: <prefix><key> <problem>", so a nested key shows as "rope_scaling.factor".
class Fields {
 public:
  Fields(const Json& obj, std::string_view what, std::string prefix = "")
      : obj_(obj), what_(what), prefix_(std::move(prefix)) {}

  // nullptr when the key is absent or JSON null (Transformers treats both as "use the default").
  const Json* Get(const char* key) const {
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  std::string Name(const char* key) const { return absl::StrCat(prefix_, key); }
  std::string_view what() const { return what_; }

  absl::Status Invalid(const char* key, std::string_view problem) const {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(what_), ": ", Name(key), " ", std::string(problem)));
  }
  absl::Status Unimplemented(const char* key, std::string_view problem) const {
    return absl::UnimplementedError(
        absl::StrCat(std::string(what_), ": ", Name(key), " ", std::string(problem)));
  }

  // Integer in [min, max]; absent leaves *out alone unless `required`.
  absl::Status Int(const char* key, bool required, int64_t min, int64_t max, int64_t* out) const {
    const Json* v = Get(key);
    if (v == nullptr) return required ? Invalid(key, "is missing") : absl::OkStatus();
    if (!v->is_number_integer()) return Invalid(key, "must be an integer");
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(max)) {
      return Invalid(key, absl::StrCat("(", v->get<uint64_t>(), ") must be at most ", max));
    }
    const int64_t x = v->get<int64_t>();
    if (x < min || x > max) {
      return Invalid(key, absl::StrCat("(", x, ") must be in [", min, ", ", max, "]"));
    }
    *out = x;
    return absl::OkStatus();
  }

  absl::Status PositiveInt32(const char* key, bool required, int32_t* out) const {
    int64_t x = *out;
    RETURN_IF_ERROR(Int(key, required, 1, kInt32Max, &x));
    *out = static_cast<int32_t>(x);
    return absl::OkStatus();
  }

  // Finite number > 0 (or >= `min_inclusive` when given).
  absl::Status PositiveDouble(const char* key, bool required, double* out,
                              std::optional<double> min_inclusive = std::nullopt) const {
    const Json* v = Get(key);
    if (v == nullptr) return required ? Invalid(key, "is missing") : absl::OkStatus();
    if (!v->is_number()) return Invalid(key, "must be a number");
    const double x = v->get<double>();
    if (!std::isfinite(x)) return Invalid(key, "must be finite");
    if (min_inclusive.has_value() ? x < *min_inclusive : x <= 0) {
      return Invalid(key,
                     absl::StrCat("(", x, ") must be ",
                                  min_inclusive ? absl::StrCat(">= ", *min_inclusive) : "> 0"));
    }
    *out = x;
    return absl::OkStatus();
  }

  absl::Status Bool(const char* key, bool* out) const {
    const Json* v = Get(key);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_boolean()) return Invalid(key, "must be true or false");
    *out = v->get<bool>();
    return absl::OkStatus();
  }

  absl::Status String(const char* key, bool required, std::string* out) const {
    const Json* v = Get(key);
    if (v == nullptr) return required ? Invalid(key, "is missing") : absl::OkStatus();
    if (!v->is_string()) return Invalid(key, "must be a string");
    *out = v->get_ref<const std::string&>();
    return absl::OkStatus();
  }

 private:
  const Json& obj_;
  std::string_view what_;
  std::string prefix_;
};

// YaRN's fields, as Transformers reads them: the factor (absent: max_position_embeddings over
// the original), original_max_position_embeddings (absent: max_position_embeddings), beta_fast /
// beta_slow (absent or 0: 32 / 1), truncate, and the attention factor (absent: from mscale and
// mscale_all_dim when both are set, else 0.1 ln(factor) + 1, 1 for a factor of at most 1).
absl::Status ParseYarn(const Fields& f, int64_t max_position_embeddings, RopeScaling* out) {
  out->original_max_position_embeddings = max_position_embeddings;
  RETURN_IF_ERROR(f.Int("original_max_position_embeddings", false, 1, kInt32Max,
                        &out->original_max_position_embeddings));
  out->factor = static_cast<double>(max_position_embeddings) /
                static_cast<double>(out->original_max_position_embeddings);
  RETURN_IF_ERROR(f.PositiveDouble("factor", false, &out->factor, 1.0));
  for (auto [key, value] : {std::pair{"beta_fast", &out->beta_fast},
                            std::pair{"beta_slow", &out->beta_slow}}) {
    const Json* v = f.Get(key);
    if (v != nullptr && !(v->is_number() && v->get<double>() == 0)) {
      RETURN_IF_ERROR(f.PositiveDouble(key, false, value));
    }
  }
  if (out->beta_fast < out->beta_slow) {
    return f.Invalid("beta_fast", absl::StrCat("(", out->beta_fast, ") must be at least beta_slow (",
                                               out->beta_slow, ")"));
  }
  RETURN_IF_ERROR(f.Bool("truncate", &out->truncate));
  const auto mscale = [](double scale, double m) {
    return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
  };
  double m = 0, m_all = 0;
  RETURN_IF_ERROR(f.PositiveDouble("mscale", false, &m, 0.0));
  RETURN_IF_ERROR(f.PositiveDouble("mscale_all_dim", false, &m_all, 0.0));
  out->attention_factor = m != 0 && m_all != 0 ? mscale(out->factor, m) / mscale(out->factor, m_all)
                                               : mscale(out->factor, 1);
  return f.PositiveDouble("attention_factor", false, &out->attention_factor);
}

// One RoPE scaling object: `rope_scaling` (Transformers 4) or `rope_parameters` (Transformers
// 5, which also carries rope_theta there). `prefix` names it in errors; yarn's defaults come from
// `max_position_embeddings`.
absl::Status ParseScalingObject(const Json& obj, std::string_view what, const char* prefix,
                                int64_t max_position_embeddings, RopeScaling* out) {
  const Fields f(obj, what, prefix);
  const char* type_key = f.Get("rope_type") != nullptr ? "rope_type" : "type";
  std::string type;
  RETURN_IF_ERROR(f.String(type_key, /*required=*/true, &type));
  if (type == "default") return absl::OkStatus();
  if (type != "llama3" && type != "linear" && type != "yarn") {
    return f.Unimplemented(type_key, absl::StrCat("\"", type,
                                                  "\" is not supported (supported: "
                                                  "llama3, linear, yarn, default)"));
  }
  out->type = type;
  if (type == "yarn") return ParseYarn(f, max_position_embeddings, out);
  // Transformers' _validate_*_parameters require factor >= 1 for both.
  RETURN_IF_ERROR(f.PositiveDouble("factor", /*required=*/true, &out->factor, 1.0));
  if (type == "linear") return absl::OkStatus();
  RETURN_IF_ERROR(f.PositiveDouble("low_freq_factor", true, &out->low_freq_factor));
  RETURN_IF_ERROR(f.PositiveDouble("high_freq_factor", true, &out->high_freq_factor));
  if (out->high_freq_factor <= out->low_freq_factor) {
    // The smoothing divides by their difference.
    return f.Invalid("high_freq_factor",
                     absl::StrCat("(", out->high_freq_factor, ") must exceed low_freq_factor (",
                                  out->low_freq_factor, ")"));
  }
  return f.Int("original_max_position_embeddings", true, 1, kInt32Max,
               &out->original_max_position_embeddings);
}

bool SameScaling(const RopeScaling& a, const RopeScaling& b) {
  return a.type == b.type && a.factor == b.factor && a.low_freq_factor == b.low_freq_factor &&
         a.high_freq_factor == b.high_freq_factor &&
         a.original_max_position_embeddings == b.original_max_position_embeddings &&
         a.beta_fast == b.beta_fast && a.beta_slow == b.beta_slow && a.truncate == b.truncate &&
         a.attention_factor == b.attention_factor;
}

// rope_theta and the scaling, from wherever the file keeps them. Transformers 5 writes
// `rope_parameters` ({"rope_type", "rope_theta", and the type's fields}) and may drop the
// top-level rope_theta or write it null; older files have top-level rope_theta and
// `rope_scaling`. A file with both must agree: a wrong base frequency or a scaling left out
// computes garbage without any other sign.
absl::Status ParseRope(const Json& root, std::string_view what, LlamaConfig* c) {
  const Fields f(root, what);
  RETURN_IF_ERROR(f.PositiveDouble("rope_theta", false, &c->rope_theta));
  if (const Json* scaling = f.Get("rope_scaling")) {
    if (!scaling->is_object()) return f.Invalid("rope_scaling", "must be an object or null");
    RETURN_IF_ERROR(ParseScalingObject(*scaling, what, "rope_scaling.",
                                       c->max_position_embeddings, &c->rope_scaling));
  }
  const Json* params = f.Get("rope_parameters");
  if (params == nullptr) return absl::OkStatus();
  if (!params->is_object()) return f.Invalid("rope_parameters", "must be an object or null");
  const Fields p(*params, what, "rope_parameters.");
  if (p.Get("rope_type") == nullptr && p.Get("type") == nullptr &&
      p.Get("rope_theta") == nullptr) {
    // Keyed by layer type ({"full_attention": {...}, "sliding_attention": {...}}, Transformers
    // 5's Gemma 3): the full layers' as rope_theta / rope_scaling, the sliding layers' base as
    // rope_local_base_freq (they rotate unscaled here, as Gemma 3's do).
    const Json* full = p.Get("full_attention");
    const Json* sliding = p.Get("sliding_attention");
    if ((c->model_type != "gemma3_text" && c->model_type != "olmo3") || full == nullptr ||
        !full->is_object()) {
      return f.Unimplemented("rope_parameters",
                             "without rope_type or rope_theta is supported only as Gemma 3's "
                             "and OLMo 3's (keyed by full_attention and sliding_attention)");
    }
    if (sliding != nullptr) {
      if (!sliding->is_object()) {
        return f.Invalid("rope_parameters", "sliding_attention must be an object");
      }
      const Fields local(*sliding, what, "rope_parameters.sliding_attention.");
      std::string type = "default";
      RETURN_IF_ERROR(local.String("rope_type", false, &type));
      if (type != "default") {
        return local.Unimplemented("rope_type", absl::StrCat("\"", type,
                                                             "\": the sliding layers rotate "
                                                             "unscaled here"));
      }
      RETURN_IF_ERROR(local.PositiveDouble("rope_theta", false, &c->rope_local_theta));
    }
    const Fields g(*full, what, "rope_parameters.full_attention.");
    RETURN_IF_ERROR(g.PositiveDouble("rope_theta", false, &c->rope_theta));
    if (g.Get("rope_type") != nullptr || g.Get("type") != nullptr) {
      RETURN_IF_ERROR(ParseScalingObject(*full, what, "rope_parameters.full_attention.",
                                         c->max_position_embeddings, &c->rope_scaling));
    }
    return absl::OkStatus();
  }
  double theta = c->rope_theta;
  RETURN_IF_ERROR(p.PositiveDouble("rope_theta", false, &theta));
  if (f.Get("rope_theta") != nullptr && theta != c->rope_theta) {
    return f.Invalid("rope_theta", absl::StrCat("(", c->rope_theta,
                                                ") disagrees with rope_parameters.rope_theta (",
                                                theta, ")"));
  }
  c->rope_theta = theta;
  RopeScaling scaling;
  if (p.Get("rope_type") != nullptr || p.Get("type") != nullptr) {
    RETURN_IF_ERROR(ParseScalingObject(*params, what, "rope_parameters.",
                                       c->max_position_embeddings, &scaling));
  }
  if (f.Get("rope_scaling") != nullptr && !SameScaling(scaling, c->rope_scaling)) {
    return f.Invalid("rope_scaling", "disagrees with rope_parameters");
  }
  c->rope_scaling = scaling;
  return absl::OkStatus();
}

// "bos_token_id" / "eos_token_id": an int, a list of ints (eos only), or null. Leaves the outputs
// untouched when the key is absent, so generation_config.json overrides only what it names.
absl::Status ParseTokenIds(const Json& root, std::string_view what, int32_t vocab_size,
                           LlamaConfig* config) {
  const Fields f(root, what);
  const auto check_id = [&](const char* key, const Json& v) -> absl::StatusOr<int32_t> {
    if (!v.is_number_integer()) return f.Invalid(key, "must be an integer or a list of integers");
    // Unsigned values above INT64_MAX would wrap through get<int64_t>().
    if (v.is_number_unsigned() ? v.get<uint64_t>() >= static_cast<uint64_t>(vocab_size)
                               : (v.get<int64_t>() < 0 || v.get<int64_t>() >= vocab_size)) {
      return f.Invalid(
          key, absl::StrCat("(", v.dump(), ") is outside the vocabulary [0, ", vocab_size, ")"));
    }
    return static_cast<int32_t>(v.get<int64_t>());
  };
  if (const Json* bos = f.Get("bos_token_id")) {
    ASSIGN_OR_RETURN(config->bos_token_id, check_id("bos_token_id", *bos));
  }
  if (const Json* eos = f.Get("eos_token_id")) {
    std::vector<int32_t> ids;
    if (eos->is_array()) {
      for (const Json& e : *eos) {
        ASSIGN_OR_RETURN(int32_t id, check_id("eos_token_id", e));
        ids.push_back(id);
      }
    } else {
      ASSIGN_OR_RETURN(int32_t id, check_id("eos_token_id", *eos));
      ids.push_back(id);
    }
    config->eos_token_ids = std::move(ids);
  }
  return absl::OkStatus();
}

// The attention biases and norms of the architecture (Qwen2: Q/K/V biases; Qwen3: Q/K norms;
// Llama and Qwen3: every projection biased under attention_bias), and the features of other
// Llama-like models that this engine does not compute.
absl::Status ParseAttentionFeatures(const Fields& f, LlamaConfig* c) {
  bool attention_bias = c->model_type == "gpt_oss";  // GptOssConfig's default: biased
  RETURN_IF_ERROR(f.Bool("attention_bias", &attention_bias));
  if (c->model_type == "qwen2" || c->model_type == "qwen2_moe") {
    c->qkv_bias = true;  // Qwen2Attention: q/k/v_proj bias=True, o_proj bias=False
  } else if (c->model_type != "mistral" && c->model_type != "mixtral") {
    // Mistral's and Mixtral's attention has no biases (ignores the key).
    c->qkv_bias = c->o_bias = attention_bias;
  }
  c->qk_norm = c->model_type == "qwen3" || c->model_type == "qwen3_moe" ||
               c->model_type == "gemma3_text" || IsOlmo(c->model_type);
  c->qk_norm_whole = IsOlmo(c->model_type);
  if (c->qk_norm_whole && c->qkv_bias) {
    // Olmo2Attention adds the biases before its whole-projection norms; this engine normalizes
    // the whole projections first.
    return f.Unimplemented("attention_bias",
                           "is true: OLMo 2 / 3 with biased projections is not supported");
  }
  // Rotating part of each head (Phi-4-mini's 0.75, GPT-NeoX's rotary_pct): not computed here.
  double rotary = 1;
  RETURN_IF_ERROR(f.PositiveDouble("partial_rotary_factor", false, &rotary));
  if (rotary != 1) {
    return f.Unimplemented("partial_rotary_factor",
                           absl::StrCat("(", rotary, "): RoPE over part of each head is not "
                                                     "supported"));
  }
  bool mlp_bias = false;
  RETURN_IF_ERROR(f.Bool("mlp_bias", &mlp_bias));
  if (mlp_bias) {
    return f.Unimplemented("mlp_bias", "is true: biased MLP projections are not supported");
  }
  // Gemma's modeling code reads hidden_activation (its configs carry hidden_act too).
  const bool gemma = IsGemma(c->model_type);
  const char* act_key =
      gemma && f.Get("hidden_activation") != nullptr ? "hidden_activation" : "hidden_act";
  RETURN_IF_ERROR(f.String(act_key, false, &c->hidden_act));
  if (c->hidden_act != "silu" && c->hidden_act != "gelu_pytorch_tanh") {
    return f.Unimplemented(act_key, absl::StrCat("\"", c->hidden_act,
                                                 "\" is not supported (silu, gelu_pytorch_tanh)"));
  }
  return absl::OkStatus();
}

// SmolLM3's NoPE layers: no_rope_layers, a 0 / 1 a layer (at least num_hidden_layers of them;
// 1: the layer uses RoPE), else a NoPE layer every no_rope_layer_interval-th (default 4), as
// SmolLM3Config fills it in.
absl::Status ParseNopeLayers(const Fields& f, LlamaConfig* c) {
  if (c->model_type != "smollm3") return absl::OkStatus();
  const int32_t layers = c->num_hidden_layers;
  c->rope_layers.assign(layers, true);
  if (const Json* list = f.Get("no_rope_layers")) {
    if (!list->is_array() || list->size() < static_cast<size_t>(layers)) {
      return f.Invalid("no_rope_layers", absl::StrCat("must be a list of at least "
                                                      "num_hidden_layers (",
                                                      layers, ") 0s and 1s"));
    }
    for (int32_t i = 0; i < layers; ++i) {
      const Json& v = (*list)[i];
      if (!v.is_number_integer() || (v.get<int64_t>() != 0 && v.get<int64_t>() != 1)) {
        return f.Invalid("no_rope_layers",
                         absl::StrCat("[", i, "] is ", v.dump(), ", not 0 (NoPE) or 1 (RoPE)"));
      }
      c->rope_layers[i] = v.get<int64_t>() == 1;
    }
    return absl::OkStatus();
  }
  int64_t interval = 4;
  RETURN_IF_ERROR(f.Int("no_rope_layer_interval", false, 1, kInt32Max, &interval));
  for (int32_t i = 0; i < layers; ++i) c->rope_layers[i] = (i + 1) % interval != 0;
  return absl::OkStatus();
}

// Which layers attend within `sliding_window`, and its span (none when no shorter than the
// model's context). Mistral and Phi-3: every layer (Phi-3-mini-4k's 2047 of 4096). Gemma 2 / 3 and
// Qwen2 / Qwen3 with use_sliding_window (as their Transformers configs read it): the layers
// `layer_types` names "sliding_attention"; without layer_types, Gemma 2's even layers, Gemma 3's
// all but every sliding_window_pattern-th (default 6), Qwen's from max_window_layers (default
// 28) on. Transformers' Llama and Granite ignore the key.
absl::Status ParseSlidingWindow(const Fields& f, LlamaConfig* c) {
  const std::string& type = c->model_type;
  if (type == "llama" || type == "granite") return absl::OkStatus();
  const bool gemma = IsGemma(type);
  // SmolLM3Config reads use_sliding_window as Qwen's do; without layer_types its NoPE layers
  // are the sliding ones.
  const bool smollm3 = type == "smollm3";
  const bool qwen =
      type == "qwen2" || type == "qwen3" || type == "qwen2_moe" || type == "qwen3_moe" || smollm3;
  const int32_t layers = c->num_hidden_layers;
  std::vector<bool> sliding(layers, true);
  if (qwen) {
    bool windowed = false;
    RETURN_IF_ERROR(f.Bool("use_sliding_window", &windowed));
    if (!windowed) return absl::OkStatus();
  }
  if (const Json* types = f.Get("layer_types")) {
    if (!types->is_array() || types->size() != static_cast<size_t>(layers)) {
      return f.Invalid("layer_types",
                       absl::StrCat("must be a list of num_hidden_layers (", layers, ") strings"));
    }
    for (int32_t i = 0; i < layers; ++i) {
      const Json& t = (*types)[i];
      if (t != "sliding_attention" && t != "full_attention") {
        return f.Unimplemented(
            "layer_types",
            absl::StrCat(t.dump(), " is not supported (full_attention, sliding_attention)"));
      }
      sliding[i] = t == "sliding_attention";
    }
  } else if (type == "gemma2") {
    for (int32_t i = 0; i < layers; ++i) sliding[i] = i % 2 == 0;
  } else if (type == "gemma3_text") {
    int64_t pattern = 6;
    RETURN_IF_ERROR(f.Int("sliding_window_pattern", false, 1, kInt32Max, &pattern));
    for (int32_t i = 0; i < layers; ++i) sliding[i] = (i + 1) % pattern != 0;
  } else if (smollm3) {
    for (int32_t i = 0; i < layers; ++i) sliding[i] = !c->UsesRope(i);
  } else if (type == "olmo3") {  // Olmo3Config: every fourth layer full
    for (int32_t i = 0; i < layers; ++i) sliding[i] = (i + 1) % 4 != 0;
  } else if (type == "gpt_oss") {  // GptOssConfig: the even layers slide
    for (int32_t i = 0; i < layers; ++i) sliding[i] = i % 2 == 0;
  } else if (qwen) {
    int64_t first = 28;
    RETURN_IF_ERROR(f.Int("max_window_layers", false, 0, kInt32Max, &first));
    for (int32_t i = 0; i < layers; ++i) sliding[i] = i >= first;
  }
  if (std::find(sliding.begin(), sliding.end(), true) == sliding.end()) return absl::OkStatus();
  // Gemma2Config's, Gemma3TextConfig's and Olmo3Config's default
  int64_t window = gemma || type == "olmo3" ? 4096 : type == "gpt_oss" ? 128 : 0;
  RETURN_IF_ERROR(f.Int("sliding_window", false, 1, std::numeric_limits<int64_t>::max(), &window));
  // The layers stay marked without a window: Gemma 3's still rotate with the local base.
  c->sliding_layers = std::move(sliding);
  if (window != 0 && window < c->max_position_embeddings) {
    c->sliding_window = static_cast<int32_t>(window);
  }
  return absl::OkStatus();
}

// The mixture of experts of mixtral (every layer: num_local_experts experts of intermediate_size,
// the top num_experts_per_tok renormalized), qwen3_moe (num_experts of moe_intermediate_size;
// norm_topk_prob; the layers in mlp_only_layers, and those whose number is not a multiple of
// decoder_sparse_step, dense) and qwen2_moe (as qwen3_moe, plus a shared expert of
// shared_expert_intermediate_size in each MoE layer), with their Transformers config classes'
// defaults.
absl::Status ParseExperts(const Fields& f, LlamaConfig* c) {
  const bool gpt_oss = c->model_type == "gpt_oss";
  const bool mixtral = c->model_type == "mixtral" || gpt_oss;  // (the same keys)
  const bool qwen2 = c->model_type == "qwen2_moe";
  if (!mixtral && !qwen2 && c->model_type != "qwen3_moe") return absl::OkStatus();
  const char* experts_key = mixtral ? "num_local_experts" : "num_experts";
  int64_t experts = mixtral ? (gpt_oss ? 128 : 8) : qwen2 ? 60 : 128;
  RETURN_IF_ERROR(f.Int(experts_key, false, 0, kMaxExperts, &experts));
  if (gpt_oss) {
    // GptOssForCausalLM: every layer a mixture of experts, sinks in every attention head, biased
    // router and experts, the clamped GLU (GptOssConfig's swiglu_limit, default 7).
    if (experts < 1) return f.Invalid(experts_key, "must be positive for gpt_oss");
    c->attention_sinks = true;
    c->moe_biases = true;
    c->swiglu_limit = 7;
    RETURN_IF_ERROR(f.PositiveDouble("swiglu_limit", false, &c->swiglu_limit));
  }
  int64_t top_k = mixtral ? (gpt_oss ? 4 : 2) : qwen2 ? 4 : 8;
  RETURN_IF_ERROR(f.Int("num_experts_per_tok", false, 1, kMaxExpertsPerToken, &top_k));
  int32_t moe_ffn = mixtral ? c->intermediate_size : qwen2 ? 1408 : 768;
  if (!mixtral) RETURN_IF_ERROR(f.PositiveInt32("moe_intermediate_size", false, &moe_ffn));
  bool norm_topk_prob = mixtral;
  if (!mixtral) RETURN_IF_ERROR(f.Bool("norm_topk_prob", &norm_topk_prob));
  const int32_t layers = c->num_hidden_layers;
  std::vector<bool> moe(layers, experts > 0);
  if (!mixtral && experts > 0) {
    int64_t step = 1;
    RETURN_IF_ERROR(f.Int("decoder_sparse_step", false, 1, kInt32Max, &step));
    for (int32_t i = 0; i < layers; ++i) moe[i] = (i + 1) % step == 0;
    if (const Json* dense = f.Get("mlp_only_layers")) {
      if (!dense->is_array())
        return f.Invalid("mlp_only_layers", "must be a list of layer numbers");
      for (const Json& v : *dense) {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= layers) {
          return f.Invalid(
              "mlp_only_layers",
              absl::StrCat(v.dump(), " is not a layer number (0 to ", layers - 1, ")"));
        }
        moe[v.get<int64_t>()] = false;
      }
    }
  }
  if (std::find(moe.begin(), moe.end(), true) == moe.end()) return absl::OkStatus();
  if (top_k > experts) {
    return f.Invalid("num_experts_per_tok", absl::StrCat("(", top_k, ") must be at most ",
                                                         experts_key, " (", experts, ")"));
  }
  // Set only for a model with experts: a dense one keeps every expert field 0.
  c->num_experts = static_cast<int32_t>(experts);
  c->num_experts_per_tok = static_cast<int32_t>(top_k);
  c->moe_intermediate_size = moe_ffn;
  c->norm_topk_prob = norm_topk_prob;
  c->moe_layers = std::move(moe);
  if (qwen2) {
    int64_t shared = 5632;  // Qwen2MoeConfig's default; 0: no shared expert
    RETURN_IF_ERROR(f.Int("shared_expert_intermediate_size", false, 0, kInt32Max, &shared));
    c->shared_expert_intermediate_size = static_cast<int32_t>(shared);
  }
  return absl::OkStatus();
}

// A [rows, cols] block shape: fp8's weight_block_size, compressed-tensors' block_structure (a
// list, or "RxC" in its older releases).
absl::Status ParseBlockShape(const Fields& f, const char* key, CheckpointQuantization* q) {
  const Json* v = f.Get(key);
  int64_t dims[2] = {0, 0};
  bool ok = false;
  if (v != nullptr && v->is_array() && v->size() == 2) {
    ok = true;
    for (int i = 0; i < 2; ++i) {
      ok = ok && (*v)[i].is_number_integer();
      if (ok) dims[i] = (*v)[i].get<int64_t>();
    }
  } else if (v != nullptr && v->is_string()) {
    const std::string& text = v->get_ref<const std::string&>();
    const size_t x = text.find('x');
    ok = x != std::string::npos && absl::SimpleAtoi(text.substr(0, x), &dims[0]) &&
         absl::SimpleAtoi(text.substr(x + 1), &dims[1]);
  }
  if (!ok || dims[0] <= 0 || dims[1] <= 0 || dims[0] > kInt32Max || dims[1] > kInt32Max) {
    return f.Invalid(key, absl::StrCat(v == nullptr ? "null" : v->dump(),
                                       " is not a block shape [rows, cols] of positive sizes"));
  }
  q->block_rows = static_cast<int32_t>(dims[0]);
  q->group_size = static_cast<int32_t>(dims[1]);
  return absl::OkStatus();
}

// compressed-tensors' schemes: every config group the same "weights" scheme, either int 4 or 8
// bits by group or by channel stored "pack-quantized" (llm-compressor's W4A16 / W8A16), or 8-bit
// int or float (FP8 e4m3) by tensor, channel, group or block stored one element each
// ("int-quantized", "float-quantized", "naive-quantized": W8A8, FP8, FP8_DYNAMIC), symmetric.
// input_activations (the A8 of W8A8) are read as a flag: kvrm computes activations its own way.
absl::Status ParseCompressedTensors(const Fields& f, CheckpointQuantization* q) {
  std::string format;
  RETURN_IF_ERROR(f.String("format", false, &format));
  const Json* groups = f.Get("config_groups");
  if (groups == nullptr || !groups->is_object() || groups->empty()) {
    return f.Invalid("config_groups", "must be an object of one or more schemes");
  }
  bool first = true;
  for (const auto& [name, group] : groups->items()) {
    const std::string where = absl::StrCat("config_groups.", name);
    if (!group.is_object())
      return f.Invalid("config_groups", absl::StrCat(name, " is not an object"));
    const Fields g(group, f.what(), absl::StrCat(f.Name(where.c_str()), "."));
    std::string group_format = format;
    RETURN_IF_ERROR(g.String("format", false, &group_format));
    CheckpointQuantization scheme;
    scheme.method = "compressed-tensors";
    scheme.unpacked = group_format == "int-quantized" || group_format == "float-quantized" ||
                      group_format == "naive-quantized";
    if (group_format != "pack-quantized" && !scheme.unpacked) {
      return g.Unimplemented("format",
                             absl::StrCat("\"", group_format,
                                          "\" is not supported (pack-quantized, int-quantized, "
                                          "float-quantized, naive-quantized)"));
    }
    if (const Json* a = g.Get("input_activations"); a != nullptr) {
      if (!a->is_object()) return g.Invalid("input_activations", "must be an object or null");
      scheme.activations_quantized = true;
    }
    const Json* weights = g.Get("weights");
    if (weights == nullptr || !weights->is_object()) {
      return g.Invalid("weights", "must be an object (the weights' quantization scheme)");
    }
    const Fields w(*weights, f.what(), g.Name("weights."));
    std::string type = "int";
    RETURN_IF_ERROR(w.String("type", false, &type));
    if (type != "int" && (type != "float" || group_format == "pack-quantized")) {
      return w.Unimplemented(
          "type", absl::StrCat("\"", type, "\" is not supported (int; float for FP8 weights)"));
    }
    scheme.fp8 = type == "float";
    int64_t bits = 0;
    RETURN_IF_ERROR(w.Int("num_bits", true, 1, 64, &bits));
    if (scheme.fp8 ? bits != 8 : bits != 4 && bits != 8) {
      return w.Unimplemented("num_bits", absl::StrCat("(", bits, ") is not supported (",
                                                      scheme.fp8 ? "8" : "4, 8", ")"));
    }
    scheme.bits = static_cast<int32_t>(bits);
    std::string strategy;
    RETURN_IF_ERROR(w.String("strategy", true, &strategy));
    if (strategy == "group") {
      int64_t size = 0;
      RETURN_IF_ERROR(w.Int("group_size", true, 1, kInt32Max, &size));
      scheme.group_size = static_cast<int32_t>(size);
    } else if (scheme.unpacked && strategy == "tensor") {
      scheme.block_rows = 0;
    } else if (scheme.unpacked && strategy == "block") {
      RETURN_IF_ERROR(ParseBlockShape(w, "block_structure", &scheme));
    } else if (strategy != "channel") {
      return w.Unimplemented("strategy",
                             absl::StrCat("\"", strategy, "\" is not supported (group, channel",
                                          scheme.unpacked ? ", tensor, block"
                                                          : "; tensor and block with int-quantized "
                                                            "or float-quantized weights",
                                          ")"));
    }
    bool symmetric = true;
    RETURN_IF_ERROR(w.Bool("symmetric", &symmetric));
    if (!symmetric && scheme.unpacked) {
      return w.Unimplemented("symmetric", absl::StrCat("false is not supported for ", group_format,
                                                       " weights (pack-quantized ones may be)"));
    }
    scheme.zero_point = !symmetric;
    bool dynamic = false;
    RETURN_IF_ERROR(w.Bool("dynamic", &dynamic));
    if (dynamic) return w.Unimplemented("dynamic", "true is not supported for weights");
    // actorder "group" stores weight_g_idx (groups in activation order); "weight" only changed
    // the order GPTQ quantized in, and the groups stay contiguous.
    if (const Json* order = w.Get("actorder");
        order != nullptr && !(order->is_boolean() && !order->get<bool>())) {
      if (!order->is_string() || (*order != "group" && *order != "weight") ||
          (*order == "group" && scheme.unpacked)) {
        return w.Unimplemented("actorder",
                               absl::StrCat(order->dump(), " is not supported (",
                                            scheme.unpacked ? "weight" : "group, weight", ")"));
      }
      scheme.act_order = *order == "group";
    }
    if (!first && (scheme.bits != q->bits || scheme.group_size != q->group_size ||
                   scheme.block_rows != q->block_rows || scheme.zero_point != q->zero_point ||
                   scheme.act_order != q->act_order || scheme.unpacked != q->unpacked ||
                   scheme.fp8 != q->fp8)) {
      return f.Unimplemented("config_groups",
                             absl::StrCat(name,
                                          " differs from the first scheme: one weight "
                                          "scheme for every layer is supported"));
    }
    scheme.activations_quantized |= q->activations_quantized;
    *q = scheme;
    first = false;
  }
  return absl::OkStatus();
}

// quantization_config: AWQ (AutoAWQ's keys, and its older w_bit / q_group_size), GPTQ, and
// compressed-tensors' weight-only integer schemes; anything else is refused by name rather than
// read as unquantized weights that are not there.
absl::Status ParseQuantization(const Json& root, std::string_view what, LlamaConfig* c) {
  const auto it = root.find("quantization_config");
  if (it == root.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(what), ": quantization_config must be an object"));
  }
  const Fields f(*it, what, "quantization_config.");
  CheckpointQuantization q;
  RETURN_IF_ERROR(f.String("quant_method", true, &q.method));
  q.method = absl::AsciiStrToLower(q.method);
  // group_size: a positive count, or -1 for one group per output row (0 here).
  auto group = [&](const char* key, bool required, int64_t fallback) -> absl::Status {
    int64_t g = fallback;
    RETURN_IF_ERROR(f.Int(key, required, -1, kInt32Max, &g));
    if (g == 0) return f.Invalid(key, "must be positive, or -1 for one group per row");
    q.group_size = g < 0 ? 0 : static_cast<int32_t>(g);
    return absl::OkStatus();
  };
  if (q.method == "awq") {
    int64_t bits = 4;
    const char* bits_key = f.Get("bits") != nullptr ? "bits" : "w_bit";
    RETURN_IF_ERROR(f.Int(bits_key, false, 1, 64, &bits));
    if (bits != 4) {
      return f.Unimplemented(bits_key, absl::StrCat("(", bits, ") is not supported for AWQ (4)"));
    }
    q.bits = 4;
    RETURN_IF_ERROR(
        group(f.Get("group_size") != nullptr ? "group_size" : "q_group_size", false, 128));
    q.zero_point = true;
    RETURN_IF_ERROR(f.Bool("zero_point", &q.zero_point));
    if (!q.zero_point) {
      return f.Unimplemented("zero_point",
                             "false is not supported (AutoAWQ's GEMM checkpoints "
                             "store zeros)");
    }
    std::string version = "gemm";
    RETURN_IF_ERROR(f.String("version", false, &version));
    if (absl::AsciiStrToLower(version) != "gemm") {
      return f.Unimplemented("version", absl::StrCat("\"", version,
                                                     "\" is not supported (gemm: AutoAWQ's "
                                                     "default layout)"));
    }
  } else if (q.method == "gptq") {
    int64_t bits = 4;
    RETURN_IF_ERROR(f.Int("bits", true, 1, 64, &bits));
    if (bits != 4 && bits != 8) {
      return f.Unimplemented("bits", absl::StrCat("(", bits, ") is not supported for GPTQ (4, 8)"));
    }
    q.bits = static_cast<int32_t>(bits);
    RETURN_IF_ERROR(group("group_size", false, 128));
    bool sym = true;
    RETURN_IF_ERROR(f.Bool("sym", &sym));
    q.zero_point = !sym;
    RETURN_IF_ERROR(f.Bool("desc_act", &q.act_order));
    std::string format = "gptq";
    RETURN_IF_ERROR(f.String("checkpoint_format", false, &format));
    if (format != "gptq" && format != "gptq_v2") {
      return f.Unimplemented("checkpoint_format",
                             absl::StrCat("\"", format, "\" is not supported (gptq, gptq_v2)"));
    }
    q.gptq_v1_zeros = format == "gptq";
    // GPTQModel's per-module overrides: an object of regexes (false / null / {}: none).
    if (const Json* dynamic = f.Get("dynamic");
        dynamic != nullptr && (dynamic->is_object() || dynamic->is_array()) && !dynamic->empty()) {
      return f.Unimplemented("dynamic", "(per-module bits and groups) is not supported");
    }
  } else if (q.method == "compressed-tensors") {
    RETURN_IF_ERROR(ParseCompressedTensors(f, &q));
  } else if (q.method == "fp8" || q.method == "fbgemm_fp8") {
    // Transformers' FP8 (FineGrainedFP8Config; vLLM's Fp8Config): e4m3 weights, a
    // weight_scale_inv per weight_block_size block (DeepSeek-V3, Qwen3-FP8), or without blocks
    // one weight_scale a tensor (AutoFP8). fbgemm_fp8 (Meta's Llama 3.1 405B FP8): one
    // weight_scale an output row. Both quantize activations at run time (or by input_scale).
    q.bits = 8;
    q.fp8 = true;
    q.unpacked = true;
    q.activations_quantized = true;
    if (q.method == "fp8") {
      std::string fmt = "e4m3";
      RETURN_IF_ERROR(f.String("fmt", false, &fmt));
      if (fmt != "e4m3") {
        return f.Unimplemented("fmt", absl::StrCat("\"", fmt, "\" is not supported (e4m3)"));
      }
      std::string scheme = "dynamic";
      RETURN_IF_ERROR(f.String("activation_scheme", false, &scheme));
      if (scheme != "dynamic" && scheme != "static") {
        return f.Invalid("activation_scheme",
                         absl::StrCat("\"", scheme, "\" is not dynamic or static"));
      }
      if (f.Get("weight_block_size") != nullptr) {
        RETURN_IF_ERROR(ParseBlockShape(f, "weight_block_size", &q));
        q.scale_suffix = ".weight_scale_inv";
      } else {
        q.block_rows = 0;
      }
    }
  } else if (q.method == "bitsandbytes") {
    // Transformers' BitsAndBytesConfig as saved with the weights: load_in_4bit (NF4 or FP4
    // codes, two a byte, and a float absmax, or a double-quantized one, per block) or
    // load_in_8bit (LLM.int8(): int8 rows and their SCB).
    bool in4 = false, in8 = false;
    RETURN_IF_ERROR(f.Bool("load_in_4bit", &in4));
    RETURN_IF_ERROR(f.Bool("load_in_8bit", &in8));
    if (in4 == in8) {
      return f.Invalid("load_in_4bit", "and load_in_8bit: exactly one must be true");
    }
    q.unpacked = true;
    q.bits = in4 ? 4 : 8;
    if (in4) {
      q.bnb_4bit_type = "fp4";  // BitsAndBytesConfig's default
      RETURN_IF_ERROR(f.String("bnb_4bit_quant_type", false, &q.bnb_4bit_type));
      if (q.bnb_4bit_type != "nf4" && q.bnb_4bit_type != "fp4") {
        return f.Unimplemented(
            "bnb_4bit_quant_type",
            absl::StrCat("\"", q.bnb_4bit_type, "\" is not supported (nf4, fp4)"));
      }
      std::string storage = "uint8";
      RETURN_IF_ERROR(f.String("bnb_4bit_quant_storage", false, &storage));
      if (storage != "uint8") {
        return f.Unimplemented("bnb_4bit_quant_storage",
                               absl::StrCat("\"", storage, "\" is not supported (uint8)"));
      }
      q.group_size = 64;  // bitsandbytes' default; each weight's quant_state says its own
    } else {
      q.scale_suffix = ".SCB";
      q.scale_multiplier = 1.0f / 127;
    }
  } else if (q.method == "mxfp4") {
    // gpt-oss's own checkpoints: the experts' gate_up_proj and down_proj as *_blocks (two FP4
    // E2M1 values a byte) and *_scales (an E8M0 exponent per 32); the rest (attention, router,
    // embeddings: modules_to_not_convert) unquantized.
    if (c->model_type != "gpt_oss") {
      return f.Unimplemented("quant_method", "\"mxfp4\" is read for gpt_oss's experts only");
    }
    q.bits = 4;
    q.group_size = 32;
  } else {
    return f.Unimplemented("quant_method",
                           absl::StrCat("\"", q.method,
                                        "\" is not supported (awq, gptq, compressed-tensors, "
                                        "fp8, fbgemm_fp8, bitsandbytes, mxfp4; or a GGUF file of "
                                        "the model)"));
  }
  c->quantization = std::move(q);
  return absl::OkStatus();
}

// Gemma 2 / 3's differences from the Llama block (LlamaConfig's Gemma fields), with their
// Transformers config classes' defaults. A softcapping key that is null means none; absent, the
// class default (Gemma 2: 50 and 30; Gemma 3: none).
absl::Status ParseGemma(const Json& root, const Fields& f, LlamaConfig* c) {
  const bool gemma2 = c->model_type == "gemma2";
  c->norm_weight_offset = 1;
  c->sandwich_norms = true;
  c->hidden_act = "gelu_pytorch_tanh";
  c->tie_word_embeddings = true;
  c->rms_norm_eps = 1e-6;
  c->rope_theta = gemma2 ? 10000 : 1000000;
  if (!gemma2) c->rope_local_theta = 10000;
  RETURN_IF_ERROR(f.PositiveDouble("rope_local_base_freq", false, &c->rope_local_theta));
  double query_pre_attn_scalar = 256;
  RETURN_IF_ERROR(f.PositiveDouble("query_pre_attn_scalar", false, &query_pre_attn_scalar));
  c->attention_scale = 1 / std::sqrt(query_pre_attn_scalar);
  const auto softcap = [&](const char* key, double default_value, double* out) -> absl::Status {
    *out = root.contains(key) ? 0 : default_value;
    return f.PositiveDouble(key, false, out);
  };
  RETURN_IF_ERROR(softcap("attn_logit_softcapping", gemma2 ? 50 : 0, &c->attn_logit_softcapping));
  RETURN_IF_ERROR(softcap("final_logit_softcapping", gemma2 ? 30 : 0, &c->final_logit_softcapping));
  bool bidirectional = false;
  RETURN_IF_ERROR(f.Bool("use_bidirectional_attention", &bidirectional));
  if (bidirectional) {
    return f.Unimplemented("use_bidirectional_attention",
                           "is true (an embedding model): only causal attention is served");
  }
  return absl::OkStatus();
}

// Gemma's embedding multiplier: sqrt(hidden_size) as a tensor of the model's dtype holds it
// (Gemma2Model / Gemma3TextScaledWordEmbedding), e.g. 33.94 -> 34 in bfloat16.
double GemmaEmbeddingScale(const LlamaConfig& c) {
  const float scale = static_cast<float>(std::sqrt(static_cast<double>(c.hidden_size)));
  if (c.torch_dtype == "bfloat16") return Bf16ToFloat(FloatToBf16(scale));
  if (c.torch_dtype == "float16") return F16ToFloat(FloatToF16(scale));
  return scale;
}

absl::Status ParseSizes(const Fields& f, LlamaConfig* c) {
  RETURN_IF_ERROR(f.PositiveInt32("vocab_size", true, &c->vocab_size));
  RETURN_IF_ERROR(f.PositiveInt32("hidden_size", true, &c->hidden_size));
  RETURN_IF_ERROR(f.PositiveInt32("intermediate_size", true, &c->intermediate_size));
  RETURN_IF_ERROR(f.PositiveInt32("num_hidden_layers", true, &c->num_hidden_layers));
  if (c->num_hidden_layers > kMaxHiddenLayers) {  // before anything is kept per layer
    return f.Invalid("num_hidden_layers", absl::StrCat("(", c->num_hidden_layers,
                                                       ") must be at most ", kMaxHiddenLayers));
  }
  RETURN_IF_ERROR(f.PositiveInt32("num_attention_heads", true, &c->num_attention_heads));
  RETURN_IF_ERROR(f.PositiveInt32("max_position_embeddings", true, &c->max_position_embeddings));
  c->num_key_value_heads = c->num_attention_heads;
  RETURN_IF_ERROR(f.PositiveInt32("num_key_value_heads", false, &c->num_key_value_heads));
  if (c->num_attention_heads % c->num_key_value_heads != 0) {
    return f.Invalid("num_key_value_heads", absl::StrCat("(", c->num_key_value_heads,
                                                         ") must divide num_attention_heads (",
                                                         c->num_attention_heads, ")"));
  }
  const bool explicit_head_dim = f.Get("head_dim") != nullptr;
  RETURN_IF_ERROR(f.PositiveInt32("head_dim", false, &c->head_dim));
  // Gemma2Config's and Gemma3TextConfig's default is 256, not hidden / heads (Gemma 3 4B's
  // text_config, saved as a diff against the defaults, may leave it out).
  const bool gemma = IsGemma(c->model_type);
  if (!explicit_head_dim && gemma) c->head_dim = 256;
  if (!explicit_head_dim && c->model_type == "gpt_oss") c->head_dim = 64;  // GptOssConfig's
  if (!explicit_head_dim && !gemma && c->model_type != "gpt_oss") {
    if (c->hidden_size % c->num_attention_heads != 0) {
      return f.Invalid(
          "hidden_size",
          absl::StrCat("(", c->hidden_size, ") must be a multiple of num_attention_heads (",
                       c->num_attention_heads, ") when head_dim is not given"));
    }
    c->head_dim = c->hidden_size / c->num_attention_heads;
  }
  if (c->head_dim % 2 != 0) {
    return f.Invalid("head_dim", absl::StrCat("(", c->head_dim, ") must be even for RoPE"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LlamaConfig> ParseLlamaConfig(std::string_view json, std::string_view what) {
  ASSIGN_OR_RETURN(Json root, ParseJson(json, what));
  if (!root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(what), ": not a JSON object"));
  }
  const Fields f(root, what);
  LlamaConfig c;
  RETURN_IF_ERROR(f.String("model_type", true, &c.model_type));
  if (c.model_type == "gemma3") {
    // Gemma3ForConditionalGeneration (Gemma 3 4B and up): its language model is served, from
    // text_config (whose model_type is gemma3_text); the vision tower is not loaded.
    const Json* text = f.Get("text_config");
    if (text == nullptr || !text->is_object()) {
      return f.Invalid("text_config", "must be an object (gemma3's language model)");
    }
    Json inner = *text;
    inner["model_type"] = "gemma3_text";
    // Google's files give only what differs from Gemma3TextConfig's defaults.
    const std::pair<const char*, int64_t> kDefaults[] = {{"vocab_size", 262208},
                                                         {"hidden_size", 2304},
                                                         {"intermediate_size", 9216},
                                                         {"num_hidden_layers", 26},
                                                         {"num_attention_heads", 8},
                                                         {"num_key_value_heads", 4},
                                                         {"max_position_embeddings", 131072}};
    for (const auto& [key, value] : kDefaults) {
      if (!inner.contains(key)) inner[key] = value;
    }
    for (const char* key : {"torch_dtype", "dtype", "bos_token_id", "eos_token_id"}) {
      if (!inner.contains(key) && root.contains(key)) inner[key] = root[key];
    }
    ASSIGN_OR_RETURN(
        LlamaConfig inner_config,
        ParseLlamaConfig(inner.dump(), absl::StrCat(std::string(what), " text_config")));
    inner_config.multimodal_wrapper = true;
    return inner_config;
  }
  const bool gemma = IsGemma(c.model_type);
  static constexpr std::string_view kTypes[] = {
      "llama",     "mistral", "qwen2",       "qwen3",   "phi3",  "granite", "mixtral", "qwen2_moe",
      "qwen3_moe", "gemma2",  "gemma3_text", "smollm3", "olmo2", "olmo3",   "gpt_oss"};
  if (std::find(std::begin(kTypes), std::end(kTypes), c.model_type) == std::end(kTypes)) {
    return f.Unimplemented("model_type",
                           absl::StrCat("\"", c.model_type,
                                        "\" is not supported (llama, mistral, "
                                        "qwen2, qwen3, phi3, granite, mixtral, "
                                        "qwen2_moe, qwen3_moe, gemma2, gemma3, "
                                        "gemma3_text, smollm3, olmo2, olmo3, gpt_oss)"));
  }
  c.fused_projections = c.model_type == "phi3";
  if (c.model_type == "granite") {
    // GraniteConfig's defaults are 1 for all four (the attention scale too, not 1 / sqrt(d)).
    c.attention_scale = 1;
    RETURN_IF_ERROR(f.PositiveDouble("embedding_multiplier", false, &c.embedding_multiplier));
    RETURN_IF_ERROR(f.PositiveDouble("attention_multiplier", false, &c.attention_scale));
    RETURN_IF_ERROR(f.PositiveDouble("residual_multiplier", false, &c.residual_multiplier));
    RETURN_IF_ERROR(f.PositiveDouble("logits_scaling", false, &c.logits_scaling));
  }
  RETURN_IF_ERROR(ParseSizes(f, &c));
  if (gemma) RETURN_IF_ERROR(ParseGemma(root, f, &c));
  if (c.model_type == "smollm3") {  // SmolLM3Config's defaults
    c.rope_theta = 2000000;
    c.tie_word_embeddings = true;
  }
  if (c.model_type == "gpt_oss") {  // GptOssConfig's defaults
    c.rms_norm_eps = 1e-5;
    c.rope_theta = 150000;
  }
  if (IsOlmo(c.model_type)) {  // their configs' eps; the norms
    c.rms_norm_eps = 1e-5;
    c.sandwich_norms = true;
    c.pre_norms = false;
  }
  RETURN_IF_ERROR(f.PositiveDouble("rms_norm_eps", false, &c.rms_norm_eps));
  RETURN_IF_ERROR(ParseRope(root, what, &c));
  if (c.model_type == "olmo3" && !c.rope_scaling.type.empty() && c.rope_local_theta == 0) {
    // Olmo3Model: "RoPE scaling is not applied to sliding window attention layers" (they rotate
    // with the default embedding at the same base).
    c.rope_local_theta = c.rope_theta;
  }
  RETURN_IF_ERROR(f.Bool("tie_word_embeddings", &c.tie_word_embeddings));
  RETURN_IF_ERROR(f.String("torch_dtype", false, &c.torch_dtype));
  if (c.torch_dtype.empty()) RETURN_IF_ERROR(f.String("dtype", false, &c.torch_dtype));
  if (gemma) c.embedding_multiplier = GemmaEmbeddingScale(c);
  RETURN_IF_ERROR(ParseAttentionFeatures(f, &c));
  RETURN_IF_ERROR(ParseNopeLayers(f, &c));
  RETURN_IF_ERROR(ParseSlidingWindow(f, &c));
  RETURN_IF_ERROR(ParseExperts(f, &c));
  RETURN_IF_ERROR(ParseQuantization(root, what, &c));
  RETURN_IF_ERROR(ParseTokenIds(root, what, c.vocab_size, &c));
  return c;
}

std::string CheckpointQuantization::Describe() const {
  if (!enabled()) return "";
  const std::string grid = block_rows == 0  ? " per-tensor"
                           : block_rows > 1 ? absl::StrCat(" block ", block_rows, "x", group_size)
                           : group_size > 0 ? absl::StrCat(" g", group_size)
                                            : std::string(" per-channel");
  if (method == "fp8" || method == "fbgemm_fp8") return method + grid;
  if (method == "mxfp4") return "mxfp4 experts";
  if (method == "bitsandbytes") {
    return bnb_4bit_type.empty() ? "bitsandbytes 8-bit per-channel"
                                 : absl::StrCat("bitsandbytes ", bnb_4bit_type);
  }
  return absl::StrCat(method, fp8 ? " fp8" : absl::StrCat(" ", bits, "-bit"), grid,
                      act_order ? " act-order" : "");
}

std::string_view ArchitectureClassName(std::string_view model_type) {
  static constexpr std::pair<std::string_view, std::string_view> kClasses[] = {
      {"llama", "LlamaForCausalLM"},        {"mistral", "MistralForCausalLM"},
      {"qwen2", "Qwen2ForCausalLM"},        {"qwen3", "Qwen3ForCausalLM"},
      {"phi3", "Phi3ForCausalLM"},          {"granite", "GraniteForCausalLM"},
      {"gemma2", "Gemma2ForCausalLM"},      {"gemma3_text", "Gemma3ForCausalLM"},
      {"mixtral", "MixtralForCausalLM"},    {"qwen2_moe", "Qwen2MoeForCausalLM"},
      {"qwen3_moe", "Qwen3MoeForCausalLM"}, {"smollm3", "SmolLM3ForCausalLM"},
      {"olmo2", "Olmo2ForCausalLM"},        {"olmo3", "Olmo3ForCausalLM"},
      {"gpt_oss", "GptOssForCausalLM"}};
  for (const auto& [type, name] : kClasses) {
    if (type == model_type) return name;
  }
  return "LlamaForCausalLM";
}

absl::StatusOr<LlamaConfig> LoadLlamaConfig(const std::string& model_dir) {
  const std::string config_path = model_dir + "/config.json";
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(config_path));
  ASSIGN_OR_RETURN(LlamaConfig config, ParseLlamaConfig(text, config_path));

  const std::string gen_path = model_dir + "/generation_config.json";
  absl::StatusOr<std::string> gen_text = ReadFileToString(gen_path);
  if (absl::IsNotFound(gen_text.status())) return config;
  if (!gen_text.ok()) return gen_text.status();
  ASSIGN_OR_RETURN(Json gen, ParseJson(*gen_text, gen_path));
  if (!gen.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(gen_path, ": not a JSON object"));
  }
  RETURN_IF_ERROR(ParseTokenIds(gen, gen_path, config.vocab_size, &config));
  return config;
}

std::vector<double> RopeInverseFrequencies(const LlamaConfig& config) {
  const int dim = config.head_dim;
  std::vector<double> inv_freq(dim / 2);
  for (int i = 0; i < dim / 2; ++i) {
    inv_freq[i] = 1.0 / std::pow(config.rope_theta, static_cast<double>(2 * i) / dim);
  }
  const RopeScaling& s = config.rope_scaling;
  if (s.type == "linear") {
    for (double& f : inv_freq) f /= s.factor;
  } else if (s.type == "freq_factors") {
    CHECK(s.freq_factors.size() == inv_freq.size()) << "rope freq_factors: one per rotated pair";
    for (size_t i = 0; i < inv_freq.size(); ++i) inv_freq[i] /= s.freq_factors[i];
  } else if (s.type == "yarn") {
    // The dims whose wavelength turns beta_fast / beta_slow times over the original context
    // bound a linear ramp from extrapolation (the base frequency) to interpolation (/ factor).
    const double orig = static_cast<double>(s.original_max_position_embeddings);
    const auto correction_dim = [&](double rotations) {
      return dim * std::log(orig / (rotations * 2 * M_PI)) / (2 * std::log(config.rope_theta));
    };
    double low = correction_dim(s.beta_fast), high = correction_dim(s.beta_slow);
    if (s.truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(dim - 1));
    if (low == high) high += 0.001;  // no singularity
    for (int i = 0; i < dim / 2; ++i) {
      const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
      const double extrapolation = 1 - ramp;
      inv_freq[i] = inv_freq[i] / s.factor * (1 - extrapolation) + inv_freq[i] * extrapolation;
    }
  } else if (s.type == "llama3") {
    // Wavelengths shorter than original/high_freq_factor keep their frequency, longer than
    // original/low_freq_factor are divided by factor, and the band between is interpolated.
    const double old_len = static_cast<double>(s.original_max_position_embeddings);
    const double low_freq_wavelen = old_len / s.low_freq_factor;
    const double high_freq_wavelen = old_len / s.high_freq_factor;
    for (double& f : inv_freq) {
      const double wavelen = 2 * M_PI / f;
      if (wavelen > low_freq_wavelen) {
        f /= s.factor;
      } else if (wavelen >= high_freq_wavelen) {
        const double smooth =
            (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        f = (1 - smooth) * f / s.factor + smooth * f;
      }
    }
  }
  return inv_freq;
}

LlamaConfig LocalRopeConfig(const LlamaConfig& config) {
  LlamaConfig local = config;
  if (config.rope_local_theta > 0) {
    local.rope_theta = config.rope_local_theta;
    local.rope_scaling = RopeScaling{};
  }
  return local;
}

std::vector<float> RopeTable(const LlamaConfig& config, int64_t positions) {
  const int64_t hd = config.head_dim, half = hd / 2;
  const std::vector<double> inv_freq = RopeInverseFrequencies(config);
  const double scale = config.rope_scaling.attention_factor;
  std::vector<float> table(static_cast<size_t>(positions) * hd);
  for (int64_t p = 0; p < positions; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(p) * inv_freq[i];
      table[p * hd + i] = static_cast<float>(std::cos(angle) * scale);
      table[p * hd + half + i] = static_cast<float>(std::sin(angle) * scale);
    }
  }
  return table;
}

}  // namespace kvrm
