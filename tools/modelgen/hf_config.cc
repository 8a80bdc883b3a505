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
  }
  return "float32";
}

std::string BuildConfigJson(const ModelSpec& spec, DType dtype, const SpecialIds& ids) {
  OJson c;
  const bool qwen = spec.model_type == "qwen2" || spec.model_type == "qwen3";
  const bool phi3 = spec.model_type == "phi3";
  c["architectures"] = {std::string(ArchitectureClassName(spec.model_type))};
  if (spec.model_type != "qwen2") c["attention_bias"] = spec.attention_bias;
  c["attention_dropout"] = 0.0;
  c["bos_token_id"] = ids.bos;
  c["eos_token_id"] = EosJson(ids);
  c["head_dim"] = spec.head_dim;
  c["hidden_act"] = "silu";
  c["hidden_size"] = spec.hidden_size;
  c["initializer_range"] = spec.initializer_range;
  c["intermediate_size"] = spec.intermediate_size;
  c["max_position_embeddings"] = spec.max_position_embeddings;
  if (qwen) {
    c["max_window_layers"] = spec.num_layers;
  } else {
    c["mlp_bias"] = false;
  }
  c["model_type"] = std::string(spec.model_type);
  if (spec.model_type == "granite") {
    c["attention_multiplier"] = spec.attention_multiplier;
    c["embedding_multiplier"] = spec.embedding_multiplier;
    c["logits_scaling"] = spec.logits_scaling;
    c["residual_multiplier"] = spec.residual_multiplier;
  }
  c["num_attention_heads"] = spec.num_heads;
  c["num_hidden_layers"] = spec.num_layers;
  c["num_key_value_heads"] = spec.num_kv_heads;
  if (phi3) c["original_max_position_embeddings"] = spec.max_position_embeddings;
  if (!qwen && !phi3) c["pretraining_tp"] = 1;
  c["rms_norm_eps"] = spec.rms_norm_eps;
  if (spec.rope_scaling.has_value()) {
    const Llama3RopeScaling& r = *spec.rope_scaling;
    c["rope_scaling"] = {{"factor", r.factor},
                         {"high_freq_factor", r.high_freq_factor},
                         {"low_freq_factor", r.low_freq_factor},
                         {"original_max_position_embeddings", r.original_max_position_embeddings},
                         {"rope_type", "llama3"}};
  } else {
    c["rope_scaling"] = nullptr;
  }
  c["rope_theta"] = spec.rope_theta;
  if (qwen || phi3) c["sliding_window"] = nullptr;
  c["tie_word_embeddings"] = spec.tie_word_embeddings;
  c["torch_dtype"] = TorchDtypeName(dtype);
  c["transformers_version"] = "4.45.0";
  c["use_cache"] = true;
  if (qwen) c["use_sliding_window"] = false;
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
