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

// SmolLM3's NoPE layers: every second layer of the four attends without RoPE (SmolLM3-3B:
// every fourth of 36), on SmolLM3's base of 2e6 and tied embeddings. A layer that rotates
// where it should not (or the other way) moves every logit.
ModelSpec TinySmolLM3() {
  ModelSpec s = Tiny();
  s.name = "tiny-smollm3";
  s.model_type = "smollm3";
  s.rope_scaling.reset();
  s.rope_theta = 2000000.0;
  s.no_rope_layer_interval = 2;
  s.tie_word_embeddings = true;
  s.rms_norm_eps = 1e-6;
  return s;
}

// OLMo 2's block: no input norms, the attention and MLP outputs normalized before they join the
// residual stream, Q and K normalized over all their heads at once; OLMo-2-1124-7B's RoPE base
// (500000) and eps (1e-6). A norm applied per head, or before the block instead of after, moves
// every logit.
ModelSpec TinyOlmo2() {
  ModelSpec s = Tiny();
  s.name = "tiny-olmo2";
  s.model_type = "olmo2";
  s.rope_scaling.reset();
  s.rope_theta = 500000.0;
  s.rms_norm_eps = 1e-6;
  s.tie_word_embeddings = false;
  return s;
}

// OLMo 3: OLMo 2's block with layers 0-2 of 4 attending within 48 positions (Olmo3Config's
// pattern: every fourth layer full) and llama3 RoPE scaling that the sliding layers do not take
// (Olmo3Model). A sliding layer rotated with the scaling moves every logit past position 128.
ModelSpec TinyOlmo3() {
  ModelSpec s = TinyOlmo2();
  s.name = "tiny-olmo3";
  s.model_type = "olmo3";
  s.rope_scaling = Tiny().rope_scaling;
  s.sliding_window = 48;
  s.sliding_window_pattern = 4;
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

// Gemma 2's block in the tiny shape, with heads of 64: norm weights stored as w - 1, sandwich
// norms, GELU-tanh MLP, embeddings scaled by sqrt(hidden), attention scale
// query_pre_attn_scalar^-1/2 (96, not head_dim: as gemma-2-27b's 144 against its 128, so an
// engine that scales by head_dim^-1/2 instead is caught), even layers
// attending within a 48-position window (so prompts of 100-200 tokens leave it), tied
// embeddings.
//
// The soft caps are small enough that c tanh(x / c) visibly bends what these random weights
// produce (Gemma 2's real 50 / 30 would leave them all but unchanged). The final logits have RMS
// ~2 and maxima ~6-7 (embed std 2 / sqrt(hidden) against a unit-RMS normed state): a cap of 5
// (2.5x their RMS) moves a logit of 2 by 0.1 and one of 6.5 by 2.2, so the head of the
// distribution flattens (mean top-1 probability 0.09 -> 0.02; the argmax stays, tanh being
// monotonic). The attention scores have RMS ~1 and maxima ~5 (unit-RMS q and k over 64 dims
// scaled by 1/8): a cap of 2 moves a score of 1 by 0.08 and one of 3 by 1.2, and leaving it out
// moves the logits after a 200-token prompt by up to ~2.
// make_model_test's RandomGemmaModelsAreVariedAndTheirSoftCapsMatter measures both.
ModelSpec TinyGemma2() {
  ModelSpec s = Tiny();
  s.name = "tiny-gemma2";
  s.model_type = "gemma2";
  s.head_dim = 64;
  s.rms_norm_eps = 1e-6;
  s.rope_theta = 10000.0;
  s.rope_scaling.reset();
  s.tie_word_embeddings = true;
  s.query_pre_attn_scalar = 96;
  s.sliding_window = 48;
  s.sliding_window_pattern = 2;  // layers 0 and 2 slide, 1 and 3 attend to everything
  s.attn_logit_softcapping = 2.0;
  s.final_logit_softcapping = 5.0;
  return s;
}

// Gemma 3's text model: tiny-gemma2 with per-head Q/K norms (stored as w - 1 too), no soft caps,
// full layers with rope_theta 1e6 and linear RoPE scaling (factor 4, as Gemma 3 4B's global
// layers scale by 8), sliding layers with rope_local_base_freq 1e4 and no scaling. Pattern 2:
// with 4 layers, layers 0 and 2 slide and 1 and 3 are full. query_pre_attn_scalar = head_dim, as
// Gemma 3 1B-12B have it (and llama.cpp's gemma3 assumes it): the model has a GGUF form.
ModelSpec TinyGemma3() {
  ModelSpec s = TinyGemma2();
  s.name = "tiny-gemma3";
  s.model_type = "gemma3_text";
  s.query_pre_attn_scalar = 64;
  s.rope_theta = 1000000.0;
  s.rope_local_base_freq = 10000.0;
  s.rope_scaling = RopeScalingSpec{.factor = 4.0, .rope_type = "linear"};
  s.attn_logit_softcapping = 0;
  s.final_logit_softcapping = 0;
  return s;
}

// Mistral: the tiny shape with every layer attending within a 48-position window
// (< max_position_embeddings 512, so the window is real), no RoPE scaling (Mistral's config has
// none).
ModelSpec TinyMistralSlidingWindow() {
  ModelSpec s = Tiny();
  s.name = "tiny-mistral-sw";
  s.model_type = "mistral";
  s.rope_scaling.reset();
  s.sliding_window = 48;
  return s;
}

// Mixtral's sparse MoE block in the tiny shape: Mistral's attention (no sliding window, as
// Mixtral-8x7B's sliding_window null), rope_theta 1e6, and in every layer 4 experts of
// intermediate_size 352 (Mixtral's experts take intermediate_size), of which each token takes 2,
// their router weights renormalized. Tied embeddings, as tiny.
ModelSpec TinyMixtral() {
  ModelSpec s = Tiny();
  s.name = "tiny-mixtral";
  s.model_type = "mixtral";
  s.rope_scaling.reset();
  s.rope_theta = 1000000.0;
  s.num_experts = 4;
  s.num_experts_per_tok = 2;
  s.moe_intermediate_size = s.intermediate_size;
  return s;
}

// Qwen3-MoE in tiny-qwen3's shape (heads of 64, per-head Q/K norms, rope_theta 1e6): in every
// layer but the last, 8 experts of 96 features (moe_intermediate_size), 3 per token, their router
// weights not renormalized (norm_topk_prob false; Qwen3-30B-A3B has true, which tiny-mixtral's
// renormalizing router already covers); layer 3 keeps the dense MLP of 352 (mlp_only_layers), so
// one model has both kinds of layer (and its first three layers, renormalized, are a model
// llama.cpp's qwen3moe computes: //tests:gguf_e2e_test).
ModelSpec TinyQwen3Moe() {
  ModelSpec s = TinyQwen3();
  s.name = "tiny-qwen3-moe";
  s.model_type = "qwen3_moe";
  s.num_experts = 8;
  s.num_experts_per_tok = 3;
  s.moe_intermediate_size = 96;
  s.norm_topk_prob = false;
  s.decoder_sparse_step = 1;
  s.mlp_only_layers = {3};
  return s;
}

// Qwen2-MoE (Qwen1.5-MoE / Qwen2-57B-A14B's block) in tiny-qwen2's shape (heads of 64, Q/K/V
// biases, rope_theta 1e6): in every layer 4 experts of 96 features, 2 per token, their router
// weights not renormalized (norm_topk_prob false, Qwen2MoeConfig's default and what llama.cpp's
// qwen2moe computes), and a shared expert of 192 features that every token takes, scaled by
// sigmoid(shared_expert_gate . x).
ModelSpec TinyQwen2Moe() {
  ModelSpec s = TinyQwen2();
  s.name = "tiny-qwen2-moe";
  s.model_type = "qwen2_moe";
  s.num_experts = 4;
  s.num_experts_per_tok = 2;
  s.moe_intermediate_size = 96;
  s.norm_topk_prob = false;
  s.decoder_sparse_step = 1;
  s.mlp_only_layers = {};
  s.shared_expert_intermediate_size = 192;
  return s;
}

// The benchmark shape as Mixtral: in each of small's 12 layers 8 experts of 1024 features, 2 a
// token, so a token's MLP reads as many weights as small's dense 2048-feature one while the
// model holds 4x its MLP weights (~340M parameters): what a decode step reads depends on how
// many experts its rows choose (bench/cpu_decode_bench, docs/benchmarks.md).
ModelSpec SmallMixtral() {
  ModelSpec s = Small();
  s.name = "small-mixtral";
  s.model_type = "mixtral";
  s.intermediate_size = 1024;  // Mixtral's experts take intermediate_size
  s.num_experts = 8;
  s.num_experts_per_tok = 2;
  s.moe_intermediate_size = s.intermediate_size;
  return s;
}

// gpt-oss (openai/gpt-oss-20b's block) in the tiny shape: 8 heads of 32 over hidden 128 (a Q
// width of 256 != hidden, as gpt-oss's 64 heads of 64 against 2880), 2 KV heads, every
// attention projection biased, a learned sink logit per head; YaRN RoPE on every layer (factor 4
// over an original context of 128, truncate false: gpt-oss's 32 over 4096, scaled down) with
// rope_theta 150000; the even layers attending within 16 positions (gpt-oss: 128); and in every
// layer a biased router over 8 experts of intermediate_size 128, 4 a token (gpt-oss-20b: 32, 4),
// their GLU clamped at swiglu_limit 7. 128 features are 4 MXFP4 blocks of 32, so each of 2
// tensor-parallel ranks holds whole blocks (64 features). Untied, as gpt-oss.
ModelSpec TinyGptOss() {
  ModelSpec s = Tiny();
  s.name = "tiny-gptoss";
  s.model_type = "gpt_oss";
  s.attention_bias = true;
  s.num_heads = 8;
  s.num_kv_heads = 2;
  s.head_dim = 32;
  s.intermediate_size = 128;
  s.rope_theta = 150000.0;
  s.rope_scaling = RopeScalingSpec{.factor = 4.0,
                                   .original_max_position_embeddings = 128,
                                   .rope_type = "yarn",
                                   .beta_fast = 32.0,
                                   .beta_slow = 1.0,
                                   .truncate = false};
  s.sliding_window = 16;
  s.sliding_window_pattern = 2;  // layers 0 and 2 slide, 1 and 3 attend to everything
  s.num_experts = 8;
  s.num_experts_per_tok = 4;
  s.moe_intermediate_size = s.intermediate_size;  // GptOssConfig: the experts' intermediate_size
  s.norm_topk_prob = true;  // the softmax of the kept logits (not a config key)
  s.swiglu_limit = 7.0;
  s.tie_word_embeddings = false;
  s.rms_norm_eps = 1e-5;
  return s;
}

// The benchmark shape as gpt-oss: small's 12 layers with 12 heads of 64 (4 KV heads), every
// projection biased, sinks, YaRN as gpt-oss-20b (factor 32 over 4096), the even layers sliding
// over 128 positions, and in every layer 16 experts of 768 features, 4 a token (gpt-oss-20b: 32
// of 2880, 4): ~360M parameters, of which a token runs ~110M. For bench/cpu_decode_bench's
// bf16-against-MXFP4 comparison (docs/benchmarks.md).
ModelSpec SmallGptOss() {
  ModelSpec s = TinyGptOss();
  const ModelSpec small = Small();
  s.name = "small-gptoss";
  s.hidden_size = small.hidden_size;
  s.num_layers = small.num_layers;
  s.num_heads = small.num_heads;
  s.num_kv_heads = small.num_kv_heads;
  s.head_dim = small.head_dim;
  s.vocab_size = small.vocab_size;
  s.max_position_embeddings = 131072;
  s.rope_scaling->factor = 32.0;
  s.rope_scaling->original_max_position_embeddings = 4096;
  s.sliding_window = 128;
  s.intermediate_size = 768;
  s.moe_intermediate_size = 768;
  s.num_experts = 16;
  return s;
}

// Mistral 7B v0.1's attention at the benchmark size: every layer within a 512-position window
// of the 4096 served (Mistral's 4096 of 32768: an eighth), no RoPE scaling. For
// bench/window_release_bench (a slot's KV blocks behind the window released, or kept).
ModelSpec SmallMistralSlidingWindow() {
  ModelSpec s = Small();
  s.name = "small-mistral-sw";
  s.model_type = "mistral";
  s.rope_scaling.reset();
  s.sliding_window = 512;
  return s;
}

const std::vector<ModelSpec>& Table() {
  static const auto* table = new std::vector<ModelSpec>{Tiny(),
                                                        Small(),
                                                        TinyQwen2(),
                                                        TinyQwen3(),
                                                        TinyBiased(),
                                                        TinyPhi3(),
                                                        TinyGranite(),
                                                        TinyK(),
                                                        TinyQwen2TwoHeads(),
                                                        TinyGemma2(),
                                                        TinyGemma3(),
                                                        TinyMistralSlidingWindow(),
                                                        TinyMixtral(),
                                                        TinyQwen2Moe(),
                                                        TinyQwen3Moe(),
                                                        SmallMixtral(),
                                                        TinySmolLM3(),
                                                        TinyOlmo2(),
                                                        TinyOlmo3(),
                                                        TinyGptOss(),
                                                        SmallGptOss(),
                                                        SmallMistralSlidingWindow()};
  return *table;
}

}  // namespace

int64_t ModelSpec::NumParameters() const {
  const int64_t d = hidden_size;
  // input / post-attention norms (Gemma: and pre- / post-feedforward)
  // (OLMo 2: the two output norms only, and Q/K norms over the whole projections)
  const int64_t norms = olmo() ? 2 : sandwich_norms() ? 4 : 2;
  const int64_t sinks = gpt_oss() ? num_heads : 0;       // gpt-oss: self_attn.sinks, one a head
  const int64_t attention = norms * d + d * q_dim() * 2  // q_proj, o_proj
                            + d * kv_dim() * 2           // k_proj, v_proj
                            + (qkv_bias() ? q_dim() + 2 * kv_dim() : 0) + (o_bias() ? d : 0) +
                            (!qk_norm() ? 0
                             : olmo()   ? q_dim() + kv_dim()
                                        : 2 * head_dim) +
                            sinks;
  const int64_t dense_mlp = d * intermediate_size * 3;  // gate, up, down
  // The router, then each expert's gate, up and down, then (qwen2_moe) the shared expert's gate,
  // up and down and its [1][hidden] gate.
  const int64_t shared_mlp =
      shared_expert_intermediate_size > 0 ? 3 * d * shared_expert_intermediate_size + d : 0;
  // gpt-oss: the router's bias [experts] and the experts' gate_up_proj_bias [2 ffn] and
  // down_proj_bias [hidden].
  const int64_t moe_biases =
      gpt_oss() ? int64_t{num_experts} * (1 + 2 * moe_intermediate_size + d) : 0;
  const int64_t moe_mlp = int64_t{num_experts} * d +
                          int64_t{num_experts} * 3 * d * moe_intermediate_size + shared_mlp +
                          moe_biases;
  int64_t layers = 0;
  for (int i = 0; i < num_layers; ++i) layers += attention + (IsMoeLayer(i) ? moe_mlp : dense_mlp);
  const int64_t embed = static_cast<int64_t>(vocab_size) * d;
  return embed * (tie_word_embeddings ? 1 : 2) + layers + d;
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
