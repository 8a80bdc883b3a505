#include "tools/modelgen/model_spec.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kvrm {
namespace {

ModelSpec Tiny() {
  ModelSpec s;
  s.name = "tiny";  // ~1M parameters: unit tests.
  s.hidden_size = 128;
  s.num_layers = 4;
  s.num_heads = 4;
  s.num_kv_heads = 2;
  s.head_dim = 32;
  s.intermediate_size = 352;
  s.vocab_size = 1024;
  s.max_position_embeddings = 512;
  s.rope_theta = 10000.0;
  s.rope_scaling = Llama3RopeScaling{8.0, 1.0, 4.0, 128};
  s.tie_word_embeddings = true;
  return s;
}

ModelSpec Small() {
  ModelSpec s;
  s.name = "small";  // ~125M parameters: the benchmark shape.
  s.hidden_size = 768;
  s.num_layers = 12;
  s.num_heads = 12;
  s.num_kv_heads = 4;
  s.head_dim = 64;
  s.intermediate_size = 2048;
  s.vocab_size = 32000;
  s.max_position_embeddings = 4096;
  s.rope_theta = 500000.0;
  s.tie_word_embeddings = false;
  return s;
}

// The tiny shape in the other architectures the engine computes, for their tests: Qwen2 (Q/K/V
// biases), Qwen3 (per-head Q/K norms), and Llama with attention_bias (every attention projection
// biased, O's too). The Qwen shapes have heads of 64 (as the CUDA kernels take), so a head_dim
// other than hidden / heads, as Qwen3's own. No RoPE scaling.
ModelSpec TinyQwen2() {
  ModelSpec s = Tiny();
  s.name = "tiny-qwen2";
  s.model_type = "qwen2";
  s.head_dim = 64;
  s.rope_scaling.reset();
  s.rope_theta = 1000000.0;
  s.rms_norm_eps = 1e-6;
  return s;
}

// tiny-qwen2 with two heads of 64 (head_dim = hidden / heads, as llama.cpp's qwen2 graph takes
// it: //tests:llama_cpp_interop_test).
ModelSpec TinyQwen2TwoHeads() {
  ModelSpec s = TinyQwen2();
  s.name = "tiny-qwen2-2h";
  s.num_heads = 2;
  s.num_kv_heads = 1;
  return s;
}

ModelSpec TinyQwen3() {
  ModelSpec s = TinyQwen2();
  s.name = "tiny-qwen3";
  s.model_type = "qwen3";
  return s;
}

// Phi-3's layout: Q/K/V in one qkv_proj tensor, gate and up in one gate_up_proj (untied, as
// Phi-3-mini).
ModelSpec TinyPhi3() {
  ModelSpec s = Tiny();
  s.name = "tiny-phi3";
  s.model_type = "phi3";
  s.rope_scaling.reset();
  s.tie_word_embeddings = false;
  return s;
}

// Granite 3's multipliers (granite-3.1-2b's, but the attention scale 1 / head_dim as Granite's
// own models have it): a wrong or missing one moves every logit.
ModelSpec TinyGranite() {
  ModelSpec s = Tiny();
  s.name = "tiny-granite";
  s.model_type = "granite";
  s.rope_scaling.reset();
  s.embedding_multiplier = 12.0;
  s.attention_multiplier = 1.0 / 32;
  s.residual_multiplier = 0.22;
  s.logits_scaling = 8.0;
  return s;
}

ModelSpec TinyBiased() {
  ModelSpec s = Tiny();
  s.name = "tiny-biased";
  s.attention_bias = true;
  s.tie_word_embeddings = false;
  return s;
}

// Rows of whole 256-value super-blocks (hidden 256, intermediate 768), so that llama.cpp's
// llama-quantize writes every matrix in a K-quant: the shape of //tests:llama_cpp_interop_test's
// file. Untied, no RoPE scaling, heads of 64.
ModelSpec TinyK() {
  ModelSpec s = Tiny();
  s.name = "tiny-k";
  s.hidden_size = 256;
  s.num_layers = 2;
  s.num_heads = 4;
  s.num_kv_heads = 2;
  s.head_dim = 64;
  s.intermediate_size = 768;
  s.rope_scaling.reset();
  s.tie_word_embeddings = false;
  return s;
}

const std::vector<ModelSpec>& Table() {
  static const auto* table = new std::vector<ModelSpec>{
      Tiny(),     Small(),       TinyQwen2(), TinyQwen3(),        TinyBiased(),
      TinyPhi3(), TinyGranite(), TinyK(),     TinyQwen2TwoHeads()};
  return *table;
}

}  // namespace

int64_t ModelSpec::NumParameters() const {
  const int64_t d = hidden_size;
  const int64_t per_layer = 2 * d                      // input / post-attention norms
                            + d * q_dim() * 2          // q_proj, o_proj
                            + d * kv_dim() * 2         // k_proj, v_proj
                            + d * intermediate_size * 3  // gate, up, down
                            + (qkv_bias() ? q_dim() + 2 * kv_dim() : 0) + (o_bias() ? d : 0) +
                            (qk_norm() ? 2 * head_dim : 0);
  const int64_t embed = static_cast<int64_t>(vocab_size) * d;
  return embed * (tie_word_embeddings ? 1 : 2) + per_layer * num_layers + d;
}

absl::StatusOr<ModelSpec> FindModelSpec(std::string_view name) {
  for (const ModelSpec& spec : Table()) {
    if (spec.name == name) return spec;
  }
  std::vector<std::string> names;
  for (const ModelSpec& spec : Table()) names.emplace_back(spec.name);
  return absl::InvalidArgumentError(absl::StrCat("unknown model size \"", std::string(name),
                                                 "\"; known: ", absl::StrJoin(names, ", ")));
}

std::vector<std::string_view> ModelSpecNames() {
  std::vector<std::string_view> names;
  for (const ModelSpec& spec : Table()) names.push_back(spec.name);
  return names;
}

}  // namespace kvrm
