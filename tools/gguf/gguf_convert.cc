#include "tools/gguf/gguf_convert.h"

#include <cmath>
#include <filesystem>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/weight_matrix.h"
#include "model/gguf_model.h"
#include "model/gguf_quants.h"
#include "model/gguf_vocab.h"
#include "model/tokenizer.h"
#include "runtime/model_bundle.h"

namespace kvrm {
namespace {

using namespace gguf_vocab;  // NOLINT: the token types and splits

// tokenizer.ggml.pre for a byte-level BPE's pre_tokenizer.
absl::StatusOr<std::string> PreTokenizerName(const Json& pre) {
  if (pre.is_object() && pre.value("type", "") == "ByteLevel" && pre.value("use_regex", false)) {
    return std::string("gpt-2");
  }
  if (pre.is_object() && pre.value("type", "") == "Sequence") {
    const Json list = pre.value("pretokenizers", Json());
    if (list.is_array() && list.size() == 2 && list[0].is_object() && list[1].is_object() &&
        list[0].value("type", "") == "Split" && list[1].value("type", "") == "ByteLevel") {
      const Json pattern = list[0].value("pattern", Json());
      const std::string regex = pattern.is_object() ? pattern.value("Regex", "") : "";
      if (regex == kLlama3Split) return std::string("llama-bpe");
      if (regex == kQwen2Split) return std::string("qwen2");
      if (regex == kGpt4oSplit) return std::string("gpt-4o");
    }
  }
  return absl::UnimplementedError(
      absl::StrCat("tokenizer.json pre_tokenizer ", pre.dump().substr(0, 200),
                   ": no llama.cpp pre-tokenizer is known to match it"));
}

}  // namespace

bool UseMoreBits(int layer, int layers) {
  return layer < layers / 8 || layer >= 7 * layers / 8 || (layer - layers / 8) % 3 == 2;
}

GgmlType FallbackType(GgmlType type, int64_t cols) {
  if (cols % GgmlTraits(type).block_elems == 0) return type;
  switch (type) {  // llama-quantize's (llama-quant.cpp) for rows of no whole 256-element block
    case GgmlType::kQ4_K:
      type = GgmlType::kQ5_0;
      break;
    case GgmlType::kQ5_K:
      type = GgmlType::kQ5_1;
      break;
    case GgmlType::kQ6_K:
      type = GgmlType::kQ8_0;
      break;
    default:
      break;
  }
  return cols % GgmlTraits(type).block_elems == 0 ? type : GgmlType::kF16;
}

namespace {

std::string MergeString(const Json& m) {
  if (m.is_string()) return m.get<std::string>();
  return absl::StrCat(m.at(0).get<std::string>(), " ", m.at(1).get<std::string>());
}

}  // namespace

absl::Status AddGgufTokenizer(const Json& tj, int64_t bos_id, int64_t eos_id, GgufWriter* w,
                              int64_t vocab_size) {
  // Read by kvrm's tokenizer first: past it, the structure read below is known to be sound.
  ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer,
                   Tokenizer::FromJson(tj.dump(), "tokenizer.json"));
  const Json& model = tj.at("model");
  if (model.value("type", "") != "BPE") {
    return absl::UnimplementedError("tokenizer.json: only BPE models convert to GGUF");
  }
  const bool spm = model.value("byte_fallback", false);
  // Tokens by id: the vocabulary, then the added tokens.
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  auto put = [&](int64_t id, const std::string& text, int32_t type) {
    if (id >= static_cast<int64_t>(tokens.size())) {
      for (int64_t i = tokens.size(); i <= id; ++i) {
        tokens.push_back(absl::StrCat("[PAD", i, "]"));
        types.push_back(kUnused);
      }
    }
    tokens[id] = text;
    types[id] = type;
  };
  for (const auto& [text, id] : model.at("vocab").items()) {
    const bool byte = spm && text.size() == 6 && text.rfind("<0x", 0) == 0 && text.back() == '>';
    put(id.get<int64_t>(), text, byte ? kByte : kNormal);
  }
  const std::string unk =
      model.value("unk_token", Json()).is_string() ? model.at("unk_token").get<std::string>() : "";
  for (const Json& a : tj.value("added_tokens", Json::array())) {
    const std::string text = a.at("content").get<std::string>();
    put(a.at("id").get<int64_t>(), text,
        text == unk                 ? kUnknown
        : a.value("special", false) ? kControl
                                    : kUserDefined);
  }
  for (int64_t i = tokens.size(); i < vocab_size; ++i) {
    tokens.push_back(absl::StrCat("[PAD", i, "]"));
    types.push_back(kUnused);
  }
  absl::flat_hash_map<std::string, int64_t> rank;  // the first merge making each piece
  std::vector<std::string> merges;
  for (const Json& m : model.value("merges", Json::array())) {
    merges.push_back(MergeString(m));
    const size_t space = merges.back().find(' ');
    std::string piece = merges.back();
    piece.erase(space, 1);
    rank.emplace(piece, static_cast<int64_t>(merges.size() - 1));
  }
  w->AddString("tokenizer.ggml.model", spm ? "llama" : "gpt2");
  if (spm) {
    w->AddString("tokenizer.ggml.pre", "default");
    std::vector<float> scores(tokens.size(), 0.0f);
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (auto it = rank.find(tokens[i]); it != rank.end() && types[i] == kNormal) {
        scores[i] = -static_cast<float>(it->second);
      }
    }
    w->AddStringArray("tokenizer.ggml.tokens", tokens);
    w->AddFloat32Array("tokenizer.ggml.scores", scores);
    w->AddInt32Array("tokenizer.ggml.token_type", types);
  } else {
    ASSIGN_OR_RETURN(const std::string pre, PreTokenizerName(tj.value("pre_tokenizer", Json())));
    w->AddString("tokenizer.ggml.pre", pre);
    w->AddStringArray("tokenizer.ggml.tokens", tokens);
    w->AddInt32Array("tokenizer.ggml.token_type", types);
    w->AddStringArray("tokenizer.ggml.merges", merges);
  }
  if (bos_id >= 0) w->AddUint32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(bos_id));
  if (eos_id >= 0) w->AddUint32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(eos_id));
  if (spm) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (types[i] != kUnknown) continue;
      w->AddUint32("tokenizer.ggml.unknown_token_id", static_cast<uint32_t>(i));
      break;
    }
  }
  // Whether the post-processor adds BOS / EOS: what encoding nothing with special tokens gives.
  ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer->Encode("", /*add_special_tokens=*/true));
  w->AddBool("tokenizer.ggml.add_bos_token", !ids.empty() && ids.front() == bos_id);
  w->AddBool("tokenizer.ggml.add_eos_token", !ids.empty() && ids.back() == eos_id);
  return absl::OkStatus();
}

// Whether layer `l` slides (a model without sliding layers slides none), and the first layer
// that does not slide as the period marks it (GgufLayerSlides, llama.cpp's set_swa_pattern), -1
// when every layer does.
bool LayerSlides(const LlamaConfig& c, int32_t l) {
  return !c.sliding_layers.empty() && c.sliding_layers[l];
}
int32_t FirstLayerOffPeriod(const LlamaConfig& c, int32_t period) {
  for (int32_t l = 0; l < c.num_hidden_layers; ++l) {
    if (LayerSlides(c, l) != GgufLayerSlides(l, period)) return l;
  }
  return -1;
}

// llama.cpp's gemma2 / gemma3 graphs take what a file cannot say from the model's shape: the
// attention scale (GgufGemmaAttentionScaleSize) and which layers slide from a period
// (GgufLayerSlides). A model these cannot express is refused by name rather than written as
// something llama.cpp would compute differently. The period: the first that marks the model's
// sliding layers, 0 when none slide, -1 when no period does.
int32_t GemmaGgufSwaPeriod(const LlamaConfig& c) {
  if (c.sliding_layers.empty()) return 0;
  for (int32_t period = 1; period <= c.num_hidden_layers + 1; ++period) {
    if (FirstLayerOffPeriod(c, period) < 0) return period;
  }
  return -1;
}

absl::Status CheckGemmaHasGgufForm(const std::string& model_dir, const LlamaConfig& c) {
  const double scale = 1 / std::sqrt(static_cast<double>(GgufGemmaAttentionScaleSize(c)));
  if (std::abs(c.attention_scale - scale) > 1e-9 * scale) {
    return absl::UnimplementedError(absl::StrCat(
        model_dir, ": query_pre_attn_scalar ", 1 / (c.attention_scale * c.attention_scale),
        ": llama.cpp's ", c.model_type, " takes the attention scale from the head size (", scale,
        "); this model has no GGUF form"));
  }
  if (GemmaGgufSwaPeriod(c) < 0) {
    return absl::UnimplementedError(absl::StrCat(
        model_dir, ": the sliding layers follow no period: no GGUF form for them here"));
  }
  if (c.model_type == "gemma2" && c.final_logit_softcapping == 0) {
    return absl::UnimplementedError(absl::StrCat(
        model_dir, ": llama.cpp's gemma2 caps the logits always (30 unless the file says)"));
  }
  if ((c.model_type == "gemma2") != (c.attn_logit_softcapping > 0)) {
    // llama.cpp caps Gemma 2's scores always, Gemma 3's never.
    return absl::UnimplementedError(absl::StrCat(
        model_dir, ": llama.cpp's ", c.model_type, " ",
        c.model_type == "gemma2" ? "caps attention scores always" : "does not cap attention scores",
        ": attn_logit_softcapping ", c.attn_logit_softcapping, " has no GGUF form"));
  }
  return absl::OkStatus();
}

// llama.cpp's openai-moe graph fixes what a gpt-oss file cannot say: the clamped GLU's limit (7),
// the sliding layers' period (2: the even layers) and the attention scale (the head size's).
absl::Status CheckGptOssHasGgufForm(const std::string& model_dir, const LlamaConfig& c) {
  if (c.swiglu_limit != 7) {
    return absl::UnimplementedError(
        absl::StrCat(model_dir, ": swiglu_limit ", c.swiglu_limit,
                     ": llama.cpp's gpt-oss clamps at 7 always; this model has no GGUF form"));
  }
  if (const int32_t l = FirstLayerOffPeriod(c, 2); l >= 0) {
    return absl::UnimplementedError(absl::StrCat(
        model_dir, ": layer ", l, LayerSlides(c, l) ? " slides" : " attends to everything",
        ": llama.cpp's gpt-oss slides the even layers; no GGUF form"));
  }
  const double scale = 1 / std::sqrt(static_cast<double>(c.head_dim));
  if (c.attention_scale != 0 && std::abs(c.attention_scale - scale) > 1e-9 * scale) {  // (0: it)
    return absl::UnimplementedError(absl::StrCat(
        model_dir, ": attention scale ", c.attention_scale,
        ": llama.cpp's gpt-oss scales by the head size's (", scale, "); no GGUF form"));
  }
  return absl::OkStatus();
}

// llama.cpp's olmo2 takes the head size as hidden / heads, leaves OLMo 3's sliding layers (the
// period 4 marks: all but every fourth) unscaled with a YaRN of its own attention factor (not
// written here: RoPE scaling is refused with a window), and wants an output matrix (a tied one is
// written out).
absl::Status CheckOlmoHasGgufForm(const std::string& model_dir, const LlamaConfig& c) {
  if (static_cast<int64_t>(c.head_dim) * c.num_attention_heads != c.hidden_size) {
    return absl::UnimplementedError(absl::StrCat(
        model_dir, ": head_dim ", c.head_dim, " x ", c.num_attention_heads,
        " heads is not hidden_size: llama.cpp's olmo2 takes hidden / heads; no GGUF form"));
  }
  if (c.sliding_window == 0) return absl::OkStatus();  // (no window: OLMo 2, or all within it)
  if (const int32_t l = FirstLayerOffPeriod(c, 4); l >= 0) {
    return absl::UnimplementedError(
        absl::StrCat(model_dir, ": layer ", l, LayerSlides(c, l) ? " slides" : " does not slide",
                     ": llama.cpp's OLMo 3 slides all but every fourth layer; no GGUF form"));
  }
  if (!c.rope_scaling.type.empty()) {
    return absl::UnimplementedError(
        absl::StrCat(model_dir, ": RoPE scaling ", c.rope_scaling.type,
                     " with OLMo 3's sliding layers has no GGUF form in this converter"));
  }
  return absl::OkStatus();
}

// The Gemma keys under llama.cpp's names (convert_hf_to_gguf's Gemma2Model / Gemma3Model), as
// llama.cpp de3ff815 (2026-09, //tests:llama_cpp_interop_test's) reads them: the period and the
// sliding layers' base are read from the file there; older llama.cpp builds take Gemma 3's as 6
// and 10000 whatever the file says, so a model with others is read differently by those.
void AddGemmaMetadata(const LlamaConfig& c, const std::string& prefix, GgufWriter* w) {
  if (!c.sliding_layers.empty()) {
    // A window no shorter than the context is written as the context (it masks nothing): the
    // sliding layers must still be marked, for Gemma 3's local RoPE base.
    const int32_t window = c.sliding_window > 0 ? c.sliding_window : c.max_position_embeddings;
    w->AddUint32(prefix + "attention.sliding_window", static_cast<uint32_t>(window));
    w->AddUint32(prefix + "attention.sliding_window_pattern",
                 static_cast<uint32_t>(GemmaGgufSwaPeriod(c)));
  }
  if (c.rope_local_theta > 0) {
    w->AddFloat32(prefix + "rope.freq_base_swa", static_cast<float>(c.rope_local_theta));
  }
  if (c.attn_logit_softcapping > 0) {
    w->AddFloat32(prefix + "attn_logit_softcapping", static_cast<float>(c.attn_logit_softcapping));
  }
  if (c.final_logit_softcapping > 0) {
    w->AddFloat32(prefix + "final_logit_softcapping",
                  static_cast<float>(c.final_logit_softcapping));
  }
}

absl::Status ConvertToGguf(const std::string& model_dir, const std::string& out_path,
                           const GgufConvertOptions& options) {
  // A quantized checkpoint's exact 8-bit and 4-bit blocks as they are; FP8 ones (not 8-bit
  // integers) as their values in f32, exactly, for --type to round once.
  ModelBundle::LoadOptions load;
  load.requantize_non_integer = false;
  load.dense = DType::kF32;
  ASSIGN_OR_RETURN(std::unique_ptr<ModelBundle> model, ModelBundle::Load(model_dir, load));
  if (model->gguf != nullptr) return absl::InvalidArgumentError(model_dir + ": already GGUF");
  const LlamaConfig& c = model->config;
  // OLMo 2 / 3 are llama.cpp's olmo2 (the block of output norms only, Q/K norms over the whole
  // projections): CheckOlmoHasGgufForm.
  const bool olmo = c.model_type == "olmo2" || c.model_type == "olmo3";
  if ((!c.pre_norms || c.qk_norm_whole) && !olmo) {
    return absl::UnimplementedError(absl::StrCat(
        model_dir, ": ", c.model_type,
        "'s block (output norms only, Q/K norms over the whole projection) has no GGUF form in "
        "this converter"));
  }
  if (olmo) RETURN_IF_ERROR(CheckOlmoHasGgufForm(model_dir, c));
  const bool gpt_oss = c.model_type == "gpt_oss";
  if ((c.attention_sinks || c.moe_biases) && !gpt_oss) {
    return absl::UnimplementedError(absl::StrCat(
        model_dir, ": ", c.model_type,
        "'s block (attention sinks, biased experts) has no GGUF form in this converter"));
  }
  const bool gemma = c.sandwich_norms && !olmo;
  if (gemma) RETURN_IF_ERROR(CheckGemmaHasGgufForm(model_dir, c));
  if (gpt_oss) RETURN_IF_ERROR(CheckGptOssHasGgufForm(model_dir, c));
  // llama.cpp's mixtures have experts in every layer; llama with experts and qwen3moe
  // renormalize the chosen experts' weights, qwen2moe does not and has a shared expert.
  if (c.moe()) {
    const bool qwen2 = c.model_type == "qwen2_moe";
    if (c.norm_topk_prob == qwen2) {
      return absl::UnimplementedError(absl::StrCat(
          model_dir, ": norm_topk_prob ", c.norm_topk_prob ? "true" : "false", ": llama.cpp's ",
          c.model_type, qwen2 ? " does not renormalize" : " renormalizes",
          " the chosen experts' weights; this model has no GGUF form"));
    }
    if (qwen2 && c.shared_expert_intermediate_size == 0) {
      return absl::UnimplementedError(absl::StrCat(
          model_dir, ": no shared expert: llama.cpp's qwen2moe has one; no GGUF form"));
    }
    for (int32_t i = 0; i < c.num_hidden_layers; ++i) {
      if (!c.IsMoeLayer(i)) {
        return absl::UnimplementedError(
            absl::StrCat(model_dir, ": layer ", i,
                         " is dense (mlp_only_layers, decoder_sparse_step): llama.cpp's ",
                         c.model_type, " has experts in every layer; this model has no GGUF form"));
      }
    }
  }
  if (c.HasNopeLayers()) {
    // llama.cpp's smollm3 leaves every fourth layer unrotated, whatever the file says.
    bool step4 = c.model_type == "smollm3";
    for (int32_t l = 0; l < c.num_hidden_layers && step4; ++l) {
      step4 = c.UsesRope(l) == ((l + 1) % 4 != 0);
    }
    if (!step4) {
      return absl::UnimplementedError(absl::StrCat(
          model_dir, ": ", c.model_type,
          "'s layers without RoPE (no_rope_layers) are not every fourth (llama.cpp's smollm3): "
          "no GGUF form"));
    }
  }
  // The architecture llama.cpp's converter writes: qwen2, qwen3, granite and smollm3 as
  // themselves, Llama and Mistral as llama (and Phi-3, whose fused Q/K/V and gate/up are llama's
  // tensors side by side). llama, granite and smollm3 have their attn_q / attn_k rows (and biases)
  // reordered for RoPE on adjacent pairs ("NORM" RoPE); qwen2 and qwen3 rotate halves as HF does
  // ("NEOX"), their rows as they are.
  // Mixtral is llama with experts; Qwen2-MoE and Qwen3-MoE are qwen2moe and qwen3moe; gpt-oss is
  // gpt-oss.
  const std::string arch = c.model_type == "qwen2" || c.model_type == "qwen3" ||
                                   c.model_type == "granite" || c.model_type == "gemma2"
                               ? c.model_type
                           : c.model_type == "gemma3_text" ? "gemma3"
                           : c.model_type == "qwen3_moe"   ? "qwen3moe"
                           : c.model_type == "qwen2_moe"   ? "qwen2moe"
                           : gpt_oss                       ? "gpt-oss"
                           : c.model_type == "smollm3"     ? "smollm3"
                           : olmo                          ? "olmo2"
                                                           : "llama";
  const bool permuted = GgufPermutesQk(arch);
  const std::string prefix = arch + ".";  // of its metadata keys
  GgufWriter w;
  w.AddString("general.architecture", arch);
  w.AddString("general.name", model->name);
  w.AddUint32("general.quantization_version", 2);
  w.AddUint32(prefix + "context_length", c.max_position_embeddings);
  w.AddUint32(prefix + "embedding_length", c.hidden_size);
  w.AddUint32(prefix + "block_count", c.num_hidden_layers);
  w.AddUint32(prefix + "feed_forward_length", c.intermediate_size);
  w.AddUint32(prefix + "attention.head_count", c.num_attention_heads);
  w.AddUint32(prefix + "attention.head_count_kv", c.num_key_value_heads);
  w.AddFloat32(prefix + "attention.layer_norm_rms_epsilon", static_cast<float>(c.rms_norm_eps));
  w.AddFloat32(prefix + "rope.freq_base", static_cast<float>(c.rope_theta));
  w.AddUint32(prefix + "rope.dimension_count", c.head_dim);
  // (The converter writes them where config.json has head_dim, as Qwen3's always does.)
  if (c.head_dim * c.num_attention_heads != c.hidden_size || arch == "qwen3" ||
      arch == "qwen3moe" || gemma) {
    w.AddUint32(prefix + "attention.key_length", c.head_dim);
    w.AddUint32(prefix + "attention.value_length", c.head_dim);
  }
  w.AddUint32(prefix + "vocab_size", c.vocab_size);
  if (c.moe()) {
    w.AddUint32(prefix + "expert_count", c.num_experts);
    w.AddUint32(prefix + "expert_used_count", c.num_experts_per_tok);
    if (arch != "llama") {
      w.AddUint32(prefix + "expert_feed_forward_length", c.moe_intermediate_size);
    }
    if (c.shared_expert_intermediate_size > 0) {
      w.AddUint32(prefix + "expert_shared_feed_forward_length", c.shared_expert_intermediate_size);
    }
  }
  if (arch == "granite") {  // llama.cpp's names for Granite's multipliers
    w.AddFloat32(prefix + "embedding_scale", static_cast<float>(c.embedding_multiplier));
    w.AddFloat32(prefix + "residual_scale", static_cast<float>(c.residual_multiplier));
    w.AddFloat32(prefix + "attention.scale", static_cast<float>(c.attention_scale));
    w.AddFloat32(prefix + "logit_scale", static_cast<float>(c.logits_scaling));
  }
  if (gemma) AddGemmaMetadata(c, prefix, &w);
  // (The sliding layers: llama.cpp's default periods, 2 for gpt-oss and 4 for OLMo 3, which
  // CheckGptOssHasGgufForm and CheckOlmoHasGgufForm hold the model to.)
  if (gpt_oss || (olmo && c.sliding_window > 0)) {
    const int32_t window = c.sliding_window > 0 ? c.sliding_window : c.max_position_embeddings;
    w.AddUint32(prefix + "attention.sliding_window", static_cast<uint32_t>(window));
  }
  const RopeScaling& rs = c.rope_scaling;
  if (rs.type == "linear") {
    w.AddString(prefix + "rope.scaling.type", "linear");
    w.AddFloat32(prefix + "rope.scaling.factor", static_cast<float>(rs.factor));
  } else if (rs.type == "yarn") {
    // llama.cpp's YaRN keys (as convert_hf_to_gguf writes Qwen's); its attention factor is the
    // default 0.1 ln(factor) + 1, and its correction dims are truncated.
    const double default_factor = rs.factor <= 1 ? 1.0 : 0.1 * std::log(rs.factor) + 1;
    // gpt-oss's config says truncate false, and llama.cpp's converter writes it all the same:
    // that file rotates as llama.cpp computes it (GgufLlamaConfig).
    if ((!rs.truncate && !gpt_oss) || std::abs(rs.attention_factor - default_factor) > 1e-12) {
      return absl::UnimplementedError(absl::StrCat(
          model_dir, ": YaRN with truncate false or its own attention factor has no GGUF form"));
    }
    w.AddString(prefix + "rope.scaling.type", "yarn");
    w.AddFloat32(prefix + "rope.scaling.factor", static_cast<float>(rs.factor));
    w.AddUint32(prefix + "rope.scaling.original_context_length",
                static_cast<uint32_t>(rs.original_max_position_embeddings));
    w.AddFloat32(prefix + "rope.scaling.yarn_beta_fast", static_cast<float>(rs.beta_fast));
    w.AddFloat32(prefix + "rope.scaling.yarn_beta_slow", static_cast<float>(rs.beta_slow));
  } else if (!c.rope_scaling.type.empty() && (c.rope_scaling.type != "llama3" || !permuted)) {
    // (llama.cpp applies rope_freqs.weight to its llama architecture only.)
    return absl::UnimplementedError(absl::StrCat(model_dir, ": RoPE scaling ", c.rope_scaling.type,
                                                 " has no GGUF form for ", arch, " here"));
  }

  ASSIGN_OR_RETURN(Json tokenizer, ReadJsonFile(model_dir + "/tokenizer.json"));
  const int64_t bos = c.bos_token_id ? *c.bos_token_id : -1;
  // EOS as convert_hf_to_gguf takes it: tokenizer_config's eos_token (the end of a turn, for an
  // instruct model), else config.json's first. The loader adds the other ends of generation
  // llama.cpp knows by their text (<|eot_id|>, <|eom_id|>, <|end_of_text|>, ...).
  int64_t eos = c.eos_token_ids.empty() ? -1 : c.eos_token_ids[0];
  if (const std::optional<int32_t> id = model->tokenizer->TokenToId(model->chat.eos_token)) {
    eos = *id;
  }
  RETURN_IF_ERROR(AddGgufTokenizer(tokenizer, bos, eos, &w, c.vocab_size));
  // The chat template as the model's files give it (chat_template.jinja over tokenizer_config's).
  std::string chat;
  if (absl::StatusOr<std::string> jinja = ReadFileToString(model_dir + "/chat_template.jinja");
      jinja.ok()) {
    chat = *jinja;
  } else if (absl::StatusOr<Json> tc = ReadJsonFile(model_dir + "/tokenizer_config.json");
             tc.ok() && tc->contains("chat_template") && (*tc)["chat_template"].is_string()) {
    chat = (*tc)["chat_template"].get<std::string>();
  }
  if (!chat.empty()) w.AddString("tokenizer.chat_template", chat);

  // Llama 3.1's scaling as the converter writes it: a divisor per rotated pair.
  if (c.rope_scaling.type == "llama3") {
    LlamaConfig plain = c;
    plain.rope_scaling = RopeScaling{};
    const std::vector<double> base = RopeInverseFrequencies(plain);
    const std::vector<double> scaled = RopeInverseFrequencies(c);
    std::vector<std::byte> bytes(base.size() * 4);
    std::vector<float> factors(base.size());
    for (size_t i = 0; i < base.size(); ++i) factors[i] = static_cast<float>(base[i] / scaled[i]);
    QuantizeRow(GgmlType::kF32, factors.data(), static_cast<int64_t>(factors.size()), bytes.data());
    w.AddTensor("rope_freqs.weight", GgmlType::kF32, {static_cast<int64_t>(base.size())},
                std::move(bytes));
  }

  // Each matrix row by row: to float, reordered where the converter permutes, then encoded.
  // 1-D tensors (norms, biases) in f32, a bias's elements reordered as its matrix's rows.
  // `more_bits`: a matrix the Q4_K_M mix gives q6_K.
  // Gemma's norms are written as llama.cpp's converter writes them: 1 + w (the stored w - 1).
  const float norm_offset = static_cast<float>(c.norm_weight_offset);
  // `stack`: one matrix, or the experts' matrices of one product (an `_exps` tensor), written as
  // one [experts][rows][cols] tensor (even of one expert). A router (`ffn_gate_inp`) is written in
  // f32 whatever the type, as llama-quantize leaves it.
  // The experts' matrices: options.experts_type, else MXFP4 where the checkpoint's are (exactly:
  // each MXFP4 block's values are FP4 values of the scale ggml's quantizer picks for them).
  auto experts_type = [&](const WeightMatrix& m, GgmlType chosen) {
    if (options.experts_type) return *options.experts_type;
    return m.format == WeightFormat::kMxfp4 ? GgmlType::kMxfp4 : chosen;
  };
  auto add_stack = [&](const std::string& name, const std::vector<WeightMatrix>& stack,
                       bool rope_rows, bool more_bits = false) {
    const WeightMatrix& m = stack.front();
    const bool keep = absl::EndsWith(name, "ffn_gate_inp.weight");
    const bool stacked = absl::StrContains(name, "_exps.");  // (gpt-oss's biases too)
    const bool norm = m.rows == 1;
    const bool shifted = norm && norm_offset != 0 && absl::EndsWith(name, "norm.weight");
    GgmlType chosen = !options.q4_k_m ? options.type
                      : more_bits     ? GgmlType::kQ6_K
                                      : GgmlType::kQ4_K;
    if (stacked && !norm) chosen = experts_type(m, chosen);
    const GgmlType type = norm || keep ? GgmlType::kF32 : FallbackType(chosen, m.cols);
    const GgmlTypeTraits& t = GgmlTraits(type);
    const size_t row_bytes = static_cast<size_t>(m.cols / t.block_elems * t.block_bytes);
    std::vector<std::byte> bytes(row_bytes * m.rows * stack.size());
    std::vector<float> row(m.cols), hf(norm && rope_rows ? m.cols : 0);
    std::byte* out = bytes.data();
    for (const WeightMatrix& x : stack) {
      for (int64_t r = 0; r < m.rows; ++r, out += row_bytes) {
        if (norm && rope_rows) {
          WeightRowToFloat(x, 0, hf.data());
          for (int64_t i = 0; i < m.cols; ++i) row[i] = hf[GgufRopeRowToHf(i, c.head_dim)];
        } else {
          WeightRowToFloat(x, rope_rows ? GgufRopeRowToHf(r, c.head_dim) : r, row.data());
        }
        if (shifted) {
          for (float& v : row) v += norm_offset;
        }
        QuantizeRow(type, row.data(), m.cols, out);
      }
    }
    std::vector<int64_t> ne = {m.cols};
    if (!norm) ne.push_back(m.rows);
    if (stacked) ne.push_back(static_cast<int64_t>(stack.size()));
    w.AddTensor(name, type, std::move(ne), std::move(bytes));
  };
  auto add = [&](const std::string& name, const WeightMatrix& m, bool rope_rows,
                 bool more_bits = false) { add_stack(name, {m}, rope_rows, more_bits); };
  const LlamaWeights& wt = model->weights;
  add("token_embd.weight", wt.embed, false, /*more_bits=*/c.tie_word_embeddings);  // the output
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const LayerWeights& l = wt.layers[i];
    const std::string p = absl::StrCat("blk.", i, ".");
    const bool more_bits = UseMoreBits(i, c.num_hidden_layers);
    if (c.pre_norms) add(p + "attn_norm.weight", l.attn_norm, false);
    add(p + "attn_q.weight", l.wq, permuted);
    add(p + "attn_k.weight", l.wk, permuted);
    add(p + "attn_v.weight", l.wv, false, more_bits);
    add(p + "attn_output.weight", l.wo, false);
    if (c.qkv_bias) {
      add(p + "attn_q.bias", l.bq, permuted);
      add(p + "attn_k.bias", l.bk, permuted);
      add(p + "attn_v.bias", l.bv, false);
    }
    if (c.o_bias) add(p + "attn_output.bias", l.bo, false);
    if (c.qk_norm) {
      add(p + "attn_q_norm.weight", l.q_norm, false);
      add(p + "attn_k_norm.weight", l.k_norm, false);
    }
    if (c.attention_sinks) add(p + "attn_sinks.weight", l.sinks, false);
    if (c.sandwich_norms) add(p + "post_attention_norm.weight", l.attn_post_norm, false);
    // (gpt-oss's FFN pre-norm is llama.cpp's post_attention_norm; OLMo has none.)
    if (c.pre_norms) {
      add(p + (gpt_oss ? "post_attention_norm.weight" : "ffn_norm.weight"), l.mlp_norm, false);
    }
    if (c.IsMoeLayer(i)) {
      add(p + "ffn_gate_inp.weight", l.router, false);
      add_stack(p + "ffn_gate_exps.weight", l.expert_gate, false);
      add_stack(p + "ffn_up_exps.weight", l.expert_up, false);
      add_stack(p + "ffn_down_exps.weight", l.expert_down, false, more_bits);
      if (c.moe_biases) {  // gpt-oss's, in f32: the router's, then each expert's, stacked
        add(p + "ffn_gate_inp.bias", l.router_bias, false);
        add_stack(p + "ffn_gate_exps.bias", l.expert_gate_bias, false);
        add_stack(p + "ffn_up_exps.bias", l.expert_up_bias, false);
        add_stack(p + "ffn_down_exps.bias", l.expert_down_bias, false);
      }
      if (l.shared_gate.data != nullptr) {  // Qwen2-MoE's shared expert and its gate ({hidden})
        add(p + "ffn_gate_inp_shexp.weight", l.shared_expert_gate, false);
        add(p + "ffn_gate_shexp.weight", l.shared_gate, false);
        add(p + "ffn_up_shexp.weight", l.shared_up, false);
        add(p + "ffn_down_shexp.weight", l.shared_down, false, more_bits);
      }
    } else {
      add(p + "ffn_gate.weight", l.w_gate, false);
      add(p + "ffn_up.weight", l.w_up, false);
      add(p + "ffn_down.weight", l.w_down, false, more_bits);
    }
    if (c.sandwich_norms) add(p + "post_ffw_norm.weight", l.mlp_post_norm, false);
  }
  add("output_norm.weight", wt.final_norm, false);
  // (llama.cpp's gpt-oss and olmo2 require output.weight: a tied one is written out.)
  if (!c.tie_word_embeddings || gpt_oss || olmo) {
    add("output.weight", c.tie_word_embeddings ? wt.embed : wt.lm_head, false, /*more_bits=*/true);
  }
  return w.WriteFile(out_path);
}

}  // namespace kvrm
