#include "tools/modelgen/hf_config.h"

#include "model/config.h"
#include "nlohmann/json.hpp"

namespace kvrm::modelgen {
namespace {

using OJson = nlohmann::ordered_json;

OJson EosJson(const SpecialIds& ids) {
  OJson eos = OJson::array();
  for (int id : ids.eos) eos.push_back(id);
  return eos;
}

}  // namespace

std::string TorchDtypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "float32";
    case DType::kF16:
      return "float16";
    case DType::kBF16:
      return "bfloat16";
    case DType::kF8E4M3:
      return "float8_e4m3fn";
    case DType::kF8E5M2:
      return "float8_e5m2";
  }
  return "float32";
}

std::string BuildConfigJson(const ModelSpec& spec, DType dtype, const SpecialIds& ids) {
  OJson c;
  const bool qwen3_moe = spec.model_type == "qwen3_moe";
  const bool qwen2_moe = spec.model_type == "qwen2_moe";
  const bool qwen_moe = qwen2_moe || qwen3_moe;  // Qwen2MoeConfig / Qwen3MoeConfig's expert keys
  const bool qwen =
      spec.model_type == "qwen2" || spec.model_type == "qwen3" || qwen2_moe || qwen3_moe;
  const bool phi3 = spec.model_type == "phi3";
  const bool mixtral = spec.mixtral();
  const bool mistral = spec.model_type == "mistral" || mixtral;  // MixtralConfig: Mistral's keys
  const bool moe = spec.num_experts > 0;
  const bool gemma = spec.gemma();
  const bool gemma3 = spec.model_type == "gemma3_text";
  const bool smollm3 = spec.model_type == "smollm3";
  const bool olmo =
      spec.olmo();  // Olmo2Config / Olmo3Config: no head_dim, mlp_bias, pretraining_tp
  const bool gpt_oss = spec.gpt_oss();  // GptOssConfig: no mlp_bias, pretraining_tp
  // Keys as the model's Transformers config class writes them: MistralConfig has no
  // attention_bias, mlp_bias or pretraining_tp, Gemma's configs no mlp_bias or pretraining_tp,
  // and Gemma reads its activation from hidden_activation (hidden_act written too, as
  // gemma-2-2b's file has both). The mixtures of experts add their config classes' keys:
  // MixtralConfig's num_local_experts and router_jitter_noise, Qwen2MoeConfig's and
  // Qwen3MoeConfig's num_experts, moe_intermediate_size, norm_topk_prob, decoder_sparse_step and
  // mlp_only_layers, and Qwen2MoeConfig's shared_expert_intermediate_size; GptOssConfig has
  // Mixtral's num_local_experts, layer_types (the even layers sliding), swiglu_limit and
  // router_aux_loss_coef 0.9, as openai/gpt-oss-20b's file has them. Qwen2's attention (qwen2,
  // qwen2_moe) has its Q/K/V biases from the architecture, no attention_bias key.
  const auto softcap = [](double cap) { return cap > 0 ? OJson(cap) : OJson(nullptr); };
  c["architectures"] = {std::string(ArchitectureClassName(spec.model_type))};
  if (!spec.qwen2_attention() && !mistral) c["attention_bias"] = spec.attention_bias;
  c["attention_dropout"] = 0.0;
  if (gemma) c["attn_logit_softcapping"] = softcap(spec.attn_logit_softcapping);
  c["bos_token_id"] = ids.bos;
  if (gemma) c["cache_implementation"] = "hybrid";
  if (qwen_moe) c["decoder_sparse_step"] = spec.decoder_sparse_step;
  c["eos_token_id"] = EosJson(ids);
  if (gemma) c["final_logit_softcapping"] = softcap(spec.final_logit_softcapping);
  if (!olmo) c["head_dim"] = spec.head_dim;
  const char* act = gemma ? "gelu_pytorch_tanh" : "silu";
  c["hidden_act"] = act;
  if (gemma) c["hidden_activation"] = act;
  c["hidden_size"] = spec.hidden_size;
  c["initializer_range"] = spec.initializer_range;
  c["intermediate_size"] = spec.intermediate_size;
  if ((gemma || spec.model_type == "olmo3" || gpt_oss) && spec.sliding_window > 0) {
    OJson types = OJson::array();
    for (int i = 0; i < spec.num_layers; ++i) {
      types.push_back(spec.IsSlidingLayer(i) ? "sliding_attention" : "full_attention");
    }
    c["layer_types"] = std::move(types);
  }
  c["max_position_embeddings"] = spec.max_position_embeddings;
  if (qwen) {
    c["max_window_layers"] = spec.num_layers;
  } else if (!mistral && !gemma && !olmo && !gpt_oss) {
    c["mlp_bias"] = false;
  }
  if (qwen_moe) {
    OJson dense = OJson::array();
    for (int layer : spec.mlp_only_layers) dense.push_back(layer);
    c["mlp_only_layers"] = std::move(dense);
  }
  c["model_type"] = std::string(spec.model_type);
  if (qwen_moe) {
    c["moe_intermediate_size"] = spec.moe_intermediate_size;
    c["norm_topk_prob"] = spec.norm_topk_prob;
  }
  if (spec.model_type == "granite") {
    c["attention_multiplier"] = spec.attention_multiplier;
    c["embedding_multiplier"] = spec.embedding_multiplier;
    c["logits_scaling"] = spec.logits_scaling;
    c["residual_multiplier"] = spec.residual_multiplier;
  }
  c["num_attention_heads"] = spec.num_heads;
  if (qwen_moe) c["num_experts"] = spec.num_experts;
  if (moe) c["num_experts_per_tok"] = spec.num_experts_per_tok;
  c["num_hidden_layers"] = spec.num_layers;
  c["num_key_value_heads"] = spec.num_kv_heads;
  if (smollm3) {  // SmolLM3Config's list (1: the layer uses RoPE) and the interval it came from
    OJson rope = OJson::array();
    for (int i = 0; i < spec.num_layers; ++i) rope.push_back(spec.UsesRope(i) ? 1 : 0);
    c["no_rope_layer_interval"] = spec.no_rope_layer_interval;
    c["no_rope_layers"] = std::move(rope);
  }
  if (mixtral || gpt_oss) c["num_local_experts"] = spec.num_experts;
  if (moe) c["output_router_logits"] = false;
  if (phi3) c["original_max_position_embeddings"] = spec.max_position_embeddings;
  if (!qwen && !phi3 && !mistral && !gemma && !smollm3 && !olmo && !gpt_oss) {
    c["pretraining_tp"] = 1;
  }
  if (gemma) c["query_pre_attn_scalar"] = spec.query_pre_attn_scalar;
  c["rms_norm_eps"] = spec.rms_norm_eps;
  if (gemma3) c["rope_local_base_freq"] = spec.rope_local_base_freq;
  if (spec.rope_scaling.has_value()) {
    const RopeScalingSpec& r = *spec.rope_scaling;
    if (r.rope_type == "linear") {
      c["rope_scaling"] = {{"factor", r.factor}, {"rope_type", "linear"}};
    } else if (r.rope_type == "yarn") {  // gpt-oss's keys (no attention_factor: derived)
      c["rope_scaling"] = {{"beta_fast", r.beta_fast},
                           {"beta_slow", r.beta_slow},
                           {"factor", r.factor},
                           {"original_max_position_embeddings", r.original_max_position_embeddings},
                           {"rope_type", "yarn"},
                           {"truncate", r.truncate}};
    } else {
      c["rope_scaling"] = {{"factor", r.factor},
                           {"high_freq_factor", r.high_freq_factor},
                           {"low_freq_factor", r.low_freq_factor},
                           {"original_max_position_embeddings", r.original_max_position_embeddings},
                           {"rope_type", std::string(r.rope_type)}};
    }
  } else if (!mistral && spec.model_type != "gemma2") {  // neither config class has the key
    c["rope_scaling"] = nullptr;
  }
  c["rope_theta"] = spec.rope_theta;
  // Mixtral-8x7B's, gpt-oss's and Qwen1.5-MoE-A2.7B's / Qwen3-30B-A3B's values (only training
  // reads them).
  if (moe) c["router_aux_loss_coef"] = mixtral ? 0.02 : gpt_oss ? 0.9 : 0.001;
  if (mixtral) c["router_jitter_noise"] = 0.0;
  if (qwen2_moe) c["shared_expert_intermediate_size"] = spec.shared_expert_intermediate_size;
  if (spec.sliding_window > 0) {
    c["sliding_window"] = spec.sliding_window;
  } else if (qwen || phi3 || mixtral || smollm3) {
    c["sliding_window"] = nullptr;
  }
  if (gemma3 && spec.sliding_window > 0) {
    c["sliding_window_pattern"] = spec.sliding_window_pattern;
  }
  if (gpt_oss) c["swiglu_limit"] = spec.swiglu_limit;
  c["tie_word_embeddings"] = spec.tie_word_embeddings;
  c["torch_dtype"] = TorchDtypeName(dtype);
  // Gemma 3's first, Qwen3-MoE's first, gpt-oss's first, else one that has every other class.
  c["transformers_version"] = gemma3      ? "4.50.0"
                              : qwen3_moe ? "4.51.0"
                              : gpt_oss   ? "4.55.0"
                                          : "4.45.0";
  c["use_cache"] = true;
  if (qwen || smollm3) c["use_sliding_window"] = false;
  c["vocab_size"] = spec.vocab_size;
  return c.dump(2) + "\n";
}

std::string BuildGenerationConfigJson(const SpecialIds& ids) {
  OJson c;
  c["bos_token_id"] = ids.bos;
  c["eos_token_id"] = EosJson(ids);
  c["pad_token_id"] = ids.pad;
  c["transformers_version"] = "4.45.0";
  return c.dump(2) + "\n";
}

}  // namespace kvrm::modelgen
