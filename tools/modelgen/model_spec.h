// The named model shapes make_model can generate ("tiny", "small"), shared with tests and
// benchmarks so they agree on dimensions without reading a config.json.
#ifndef KVRM_TOOLS_MODELGEN_MODEL_SPEC_H_
#define KVRM_TOOLS_MODELGEN_MODEL_SPEC_H_

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kvrm {

// Llama 3.1 style rope_scaling ("rope_type": "llama3").
struct Llama3RopeScaling {
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int original_max_position_embeddings = 8192;
};

struct ModelSpec {
  std::string_view name;
  // config.json's model_type: "llama", "qwen2" (Q/K/V biases), "qwen3" (per-head Q/K norms) or
  // "phi3" (fused qkv_proj and gate_up_proj tensors) or "granite" (the multipliers below).
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
  std::optional<Llama3RopeScaling> rope_scaling;
  bool tie_word_embeddings = false;
  double rms_norm_eps = 1e-5;
  double initializer_range = 0.02;  // Written to config.json; see weight_init.h for the stds.

  bool qkv_bias() const { return model_type == "qwen2" || attention_bias; }
  bool o_bias() const { return model_type != "qwen2" && attention_bias; }
  bool qk_norm() const { return model_type == "qwen3"; }
  bool fused_projections() const { return model_type == "phi3"; }
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
