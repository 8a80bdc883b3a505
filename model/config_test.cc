#include "model/config.h"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvrm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// meta-llama/Llama-3.2-1B config.json as published (transformers 4.45).
constexpr char kLlama32_1B[] = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})";

// meta-llama/Llama-2-7b-hf config.json: no head_dim, no rope_theta, rope_scaling null.
constexpr char kLlama2_7B[] = R"({
  "_name_or_path": "meta-llama/Llama-2-7b-hf",
  "architectures": ["LlamaForCausalLM"],
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 11008,
  "max_position_embeddings": 4096,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 32,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "tie_word_embeddings": false,
  "torch_dtype": "float16",
  "transformers_version": "4.31.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
})";

// Llama-3.2-1B-Instruct generation_config.json.
constexpr char kInstructGenerationConfig[] = R"({
  "bos_token_id": 128000,
  "do_sample": true,
  "eos_token_id": [128001, 128008, 128009],
  "temperature": 0.6,
  "top_p": 0.9,
  "transformers_version": "4.45.0.dev0"
})";

// kLlama32_1B with `edit` applied.
std::string Edited(const std::function<void(Json&)>& edit) {
  Json j = Json::parse(kLlama32_1B);
  edit(j);
  return j.dump();
}

absl::Status ParseStatus(const std::string& json) {
  return ParseLlamaConfig(json, "config.json").status();
}

void ExpectError(const absl::Status& s, absl::StatusCode code, const std::string& substr) {
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(substr));
  EXPECT_THAT(std::string(s.message()), HasSubstr("config.json"));
}

std::string MakeTempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(base != nullptr ? base : "/tmp") + "/" + name;
  std::string cmd = "mkdir -p '" + dir + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  return dir;
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  ASSERT_TRUE(out.good()) << path;
}

TEST(ConfigTest, ParsesLlama32_1B) {
  absl::StatusOr<LlamaConfig> c = ParseLlamaConfig(kLlama32_1B, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type, "llama");
  EXPECT_EQ(c->vocab_size, 128256);
  EXPECT_EQ(c->hidden_size, 2048);
  EXPECT_EQ(c->intermediate_size, 8192);
  EXPECT_EQ(c->num_hidden_layers, 16);
  EXPECT_EQ(c->num_attention_heads, 32);
  EXPECT_EQ(c->num_key_value_heads, 8);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->max_position_embeddings, 131072);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c->rope_theta, 500000.0);
  EXPECT_EQ(c->rope_scaling.type, "llama3");
  EXPECT_DOUBLE_EQ(c->rope_scaling.factor, 32.0);
  EXPECT_DOUBLE_EQ(c->rope_scaling.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c->rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->bos_token_id, 128000);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(128001));
  EXPECT_EQ(c->torch_dtype, "bfloat16");
}

TEST(ConfigTest, ParsesLlama2_7BWithDefaults) {
  absl::StatusOr<LlamaConfig> c = ParseLlamaConfig(kLlama2_7B, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->vocab_size, 32000);
  EXPECT_EQ(c->hidden_size, 4096);
  EXPECT_EQ(c->intermediate_size, 11008);
  EXPECT_EQ(c->num_hidden_layers, 32);
  EXPECT_EQ(c->num_key_value_heads, 32);
  EXPECT_EQ(c->head_dim, 128);  // hidden_size / num_attention_heads
  EXPECT_EQ(c->max_position_embeddings, 4096);
  EXPECT_DOUBLE_EQ(c->rope_theta, 10000.0);  // Transformers' default
  EXPECT_EQ(c->rope_scaling.type, "");
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_EQ(c->bos_token_id, 1);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(2));
  EXPECT_EQ(c->torch_dtype, "float16");
}

TEST(ConfigTest, KeyValueHeadsDefaultToAttentionHeads) {
  absl::StatusOr<LlamaConfig> c =
      ParseLlamaConfig(Edited([](Json& j) { j.erase("num_key_value_heads"); }), "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_key_value_heads, 32);
}

TEST(ConfigTest, ExplicitHeadDimMayDifferFromHiddenOverHeads) {
  // Mistral-Nemo style: 32 heads of 128 with hidden_size 5120.
  absl::StatusOr<LlamaConfig> c = ParseLlamaConfig(Edited([](Json& j) {
                                                     j["model_type"] = "mistral";
                                                     j["hidden_size"] = 5120;
                                                     j["head_dim"] = 128;
                                                     j["sliding_window"] = nullptr;
                                                   }),
                                                   "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type, "mistral");
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->hidden_size, 5120);
}

TEST(ConfigTest, EosListAndOldStyleRopeTypeKey) {
  absl::StatusOr<LlamaConfig> c =
      ParseLlamaConfig(Edited([](Json& j) {
                         j["eos_token_id"] = {128001, 128008, 128009};
                         j["rope_scaling"] = {{"type", "linear"}, {"factor", 4.0}};
                       }),
                       "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->eos_token_ids, ElementsAre(128001, 128008, 128009));
  EXPECT_EQ(c->rope_scaling.type, "linear");
  EXPECT_DOUBLE_EQ(c->rope_scaling.factor, 4.0);
}

TEST(ConfigTest, LoadsFromDirectoryWithGenerationConfigOverride) {
  const std::string dir = MakeTempDir("gen_override");
  WriteFile(dir + "/config.json", kLlama32_1B);
  WriteFile(dir + "/generation_config.json", kInstructGenerationConfig);
  absl::StatusOr<LlamaConfig> c = LoadLlamaConfig(dir);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->bos_token_id, 128000);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(128001, 128008, 128009));
}

TEST(ConfigTest, LoadsWithoutGenerationConfig) {
  const std::string dir = MakeTempDir("no_gen");
  WriteFile(dir + "/config.json", kLlama2_7B);
  absl::StatusOr<LlamaConfig> c = LoadLlamaConfig(dir);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->eos_token_ids, ElementsAre(2));
}

TEST(ConfigTest, GenerationConfigErrorsNameThatFile) {
  const std::string dir = MakeTempDir("bad_gen");
  WriteFile(dir + "/config.json", kLlama32_1B);
  WriteFile(dir + "/generation_config.json", R"({"eos_token_id": [1, "x"]})");
  absl::Status s = LoadLlamaConfig(dir).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("generation_config.json: eos_token_id"));
}

TEST(ConfigTest, MissingDirectoryIsNotFound) {
  EXPECT_EQ(LoadLlamaConfig("/nonexistent/model").status().code(), absl::StatusCode::kNotFound);
}

TEST(ConfigTest, KeyValueHeadsMustDivideHeads) {
  absl::Status s = ParseStatus(Edited([](Json& j) {
    j["num_attention_heads"] = 12;
    j["num_key_value_heads"] = 5;
  }));
  ExpectError(s, absl::StatusCode::kInvalidArgument, "num_key_value_heads (5)");
  s = ParseStatus(Edited([](Json& j) {
    j["hidden_size"] = 768;
    j["num_attention_heads"] = 12;
    j["num_key_value_heads"] = 8;
    j.erase("head_dim");
  }));
  EXPECT_EQ(s.message(),
            "config.json: num_key_value_heads (8) must divide num_attention_heads (12)");
}

TEST(ConfigTest, MissingZeroAndNegativeSizes) {
  for (const char* key : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                          "num_attention_heads", "max_position_embeddings"}) {
    SCOPED_TRACE(key);
    ExpectError(ParseStatus(Edited([&](Json& j) { j.erase(key); })),
                absl::StatusCode::kInvalidArgument, std::string(key) + " is missing");
    ExpectError(ParseStatus(Edited([&](Json& j) { j[key] = 0; })),
                absl::StatusCode::kInvalidArgument, key);
    ExpectError(ParseStatus(Edited([&](Json& j) { j[key] = -4; })),
                absl::StatusCode::kInvalidArgument, key);
    ExpectError(ParseStatus(Edited([&](Json& j) { j[key] = 1ull << 40; })),
                absl::StatusCode::kInvalidArgument, key);
  }
  // A layer count no model has: refused before per-layer state is kept for it.
  ExpectError(ParseStatus(Edited([](Json& j) { j["num_hidden_layers"] = 2000000000; })),
              absl::StatusCode::kInvalidArgument,
              "num_hidden_layers (2000000000) must be at most 65536");
  ExpectError(ParseStatus(Edited([](Json& j) { j["num_key_value_heads"] = 0; })),
              absl::StatusCode::kInvalidArgument, "num_key_value_heads");
  ExpectError(ParseStatus(Edited([](Json& j) { j["head_dim"] = -64; })),
              absl::StatusCode::kInvalidArgument, "head_dim");
}

TEST(ConfigTest, HiddenSizeMustBeHeadsTimesHeadDimWithoutExplicitHeadDim) {
  ExpectError(ParseStatus(Edited([](Json& j) {
                j.erase("head_dim");
                j["hidden_size"] = 2050;
              })),
              absl::StatusCode::kInvalidArgument, "hidden_size (2050)");
  ExpectError(ParseStatus(Edited([](Json& j) { j["head_dim"] = 63; })),
              absl::StatusCode::kInvalidArgument, "head_dim (63) must be even");
}

// Qwen/Qwen2.5-0.5B-Instruct's config.json (transformers 4.43): Q/K/V biases implied by the
// architecture, a sliding window that use_sliding_window leaves off.
constexpr char kQwen25_05B[] = R"({
  "architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "hidden_act": "silu",
  "hidden_size": 896,
  "initializer_range": 0.02,
  "intermediate_size": 4864,
  "max_position_embeddings": 32768,
  "max_window_layers": 21,
  "model_type": "qwen2",
  "num_attention_heads": 14,
  "num_hidden_layers": 24,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 32768,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.43.1",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

// Qwen/Qwen3-0.6B's config.json (transformers 4.51): per-head Q/K norms, head_dim 128 with
// hidden_size 1024 and 16 heads.
constexpr char kQwen3_06B[] = R"({
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 1024,
  "initializer_range": 0.02,
  "intermediate_size": 3072,
  "max_position_embeddings": 40960,
  "max_window_layers": 28,
  "model_type": "qwen3",
  "num_attention_heads": 16,
  "num_hidden_layers": 28,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

// Written after microsoft/Phi-3-mini-4k-instruct's config.json: fused projections, a 2047-token
// sliding window in a 4096 context (kept: the engine serves within it).
constexpr char kPhi3Mini4k[] = R"({
  "architectures": ["Phi3ForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 1,
  "embd_pdrop": 0.0,
  "eos_token_id": 32000,
  "hidden_act": "silu",
  "hidden_size": 3072,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "max_position_embeddings": 4096,
  "model_type": "phi3",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 32,
  "original_max_position_embeddings": 4096,
  "pad_token_id": 32000,
  "resid_pdrop": 0.0,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "rope_theta": 10000.0,
  "sliding_window": 2047,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.40.2",
  "use_cache": true,
  "vocab_size": 32064
})";

TEST(ConfigTest, ParsesPhi3Mini4k) {
  absl::StatusOr<LlamaConfig> c = ParseLlamaConfig(kPhi3Mini4k, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type, "phi3");
  EXPECT_TRUE(c->fused_projections);
  EXPECT_FALSE(c->qkv_bias || c->o_bias || c->qk_norm);
  EXPECT_EQ(c->head_dim, 96);
  EXPECT_EQ(c->sliding_window, 2047);
  // Phi-3.5's LongRoPE and Phi-4-mini's partial rotary are refused by name.
  Json j = Json::parse(kPhi3Mini4k);
  j["rope_scaling"] = {{"type", "longrope"}, {"short_factor", {1.0}}, {"long_factor", {1.0}}};
  ExpectError(ParseStatus(j.dump()), absl::StatusCode::kUnimplemented,
              "rope_scaling.type \"longrope\"");
  j = Json::parse(kPhi3Mini4k);
  j["partial_rotary_factor"] = 0.75;
  ExpectError(ParseStatus(j.dump()), absl::StatusCode::kUnimplemented,
              "partial_rotary_factor (0.75): RoPE over part of each head is not supported");
}

// Written after ibm-granite/granite-3.1-2b-instruct's config.json: Granite's four multipliers.
constexpr char kGranite31_2B[] = R"({
  "architectures": ["GraniteForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.1,
  "attention_multiplier": 0.015625,
  "bos_token_id": 0,
  "embedding_multiplier": 12.0,
  "eos_token_id": 0,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "logits_scaling": 8.0,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "granite",
  "num_attention_heads": 32,
  "num_hidden_layers": 40,
  "num_key_value_heads": 8,
  "pad_token_id": 0,
  "residual_multiplier": 0.22,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "rope_theta": 5000000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.47.0",
  "use_cache": true,
  "vocab_size": 49155
})";

TEST(ConfigTest, ParsesGranite31_2B) {
  absl::StatusOr<LlamaConfig> c = ParseLlamaConfig(kGranite31_2B, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type, "granite");
  EXPECT_EQ(c->embedding_multiplier, 12.0);
  EXPECT_EQ(c->attention_scale, 0.015625);
  EXPECT_EQ(c->residual_multiplier, 0.22);
  EXPECT_EQ(c->logits_scaling, 8.0);
  // Absent, each is GraniteConfig's 1 (the attention scale too, not 1 / sqrt(head_dim)); other
  // models keep 1 / sqrt(head_dim) (0 here) and ignore the keys.
  Json j = Json::parse(kGranite31_2B);
  for (const char* key : {"attention_multiplier", "embedding_multiplier", "residual_multiplier",
                          "logits_scaling"}) {
    j.erase(key);
  }
  c = ParseLlamaConfig(j.dump(), "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->attention_scale, 1.0);
  EXPECT_EQ(c->embedding_multiplier, 1.0);
  j = Json::parse(kGranite31_2B);
  j["model_type"] = "llama";
  c = ParseLlamaConfig(j.dump(), "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->attention_scale, 0.0);
  EXPECT_EQ(c->logits_scaling, 1.0);
  j = Json::parse(kGranite31_2B);
  j["residual_multiplier"] = -1;
  ExpectError(ParseStatus(j.dump()), absl::StatusCode::kInvalidArgument,
              "residual_multiplier (-1) must be > 0");
}

// HuggingFaceTB/SmolLM3-3B's config.json: Llama's block, every fourth layer without RoPE
// (no_rope_layers, 1 where a layer uses it), bos_token_id null.
constexpr char kSmolLM3_3B[] = R"({
  "architectures": ["SmolLM3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": null, "eos_token_id": 128012, "hidden_act": "silu", "hidden_size": 2048,
  "initializer_range": 0.02, "intermediate_size": 11008,
  "layer_types": ["full_attention","full_attention","full_attention","full_attention","full_attention","full_attention","full_attention","full_attention","full_attention","full_attention","full_attention","full_attention","full_attention","full_attention","full_attention","full_attention","full_attention","full_attention","full_attention","full_attention","full_attention","full_attention","full_attention","full_attention","full_attention","full_attention","full_attention","full_attention","full_attention","full_attention","full_attention","full_attention","full_attention","full_attention","full_attention","full_attention"],
  "max_position_embeddings": 65536, "max_window_layers": 28, "mlp_bias": false,
  "model_type": "smollm3", "no_rope_layer_interval": 4,
  "no_rope_layers": [1,1,1,0,1,1,1,0,1,1,1,0,1,1,1,0,1,1,1,0,1,1,1,0,1,1,1,0,1,1,1,0,1,1,1,0],
  "num_attention_heads": 16, "num_hidden_layers": 36, "num_key_value_heads": 4,
  "pad_token_id": 128004, "pretraining_tp": 2, "rms_norm_eps": 1e-06, "rope_scaling": null,
  "rope_theta": 5000000.0, "sliding_window": null, "torch_dtype": "bfloat16",
  "transformers_version": "4.54.0.dev0", "use_cache": false, "use_sliding_window": false,
  "vocab_size": 128256})";

// After allenai/OLMo-2-1124-7B's config.json: OLMo 2's block (output norms only, Q/K norms over
// the whole projections), no head_dim key.
constexpr char kOlmo2_7B[] = R"({
  "architectures": ["Olmo2ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "eos_token_id": 100257, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 11008, "max_position_embeddings": 4096, "model_type": "olmo2",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
  "pad_token_id": 100277, "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 500000,
  "tie_word_embeddings": false, "torch_dtype": "float32", "transformers_version": "4.47.0.dev0",
  "use_cache": true, "vocab_size": 100352})";

TEST(ConfigTest, ParsesOlmo2_7B) {
  absl::StatusOr<LlamaConfig> c = ParseLlamaConfig(kOlmo2_7B, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type, "olmo2");
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->rms_norm_eps, 1e-6);
  EXPECT_EQ(c->rope_theta, 500000.0);
  EXPECT_TRUE(c->qk_norm);
  EXPECT_TRUE(c->qk_norm_whole);
  EXPECT_TRUE(c->sandwich_norms);
  EXPECT_FALSE(c->pre_norms);
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_EQ(ArchitectureClassName("olmo2"), "Olmo2ForCausalLM");
  // Olmo2Config's default eps is 1e-5, not Llama's 1e-6.
  Json j = Json::parse(kOlmo2_7B);
  j.erase("rms_norm_eps");
  c = ParseLlamaConfig(j.dump(), "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rms_norm_eps, 1e-5);
  // Biased projections, which Olmo2Attention normalizes after the bias, are refused by name.
  j["attention_bias"] = true;
  ExpectError(ParseStatus(j.dump()), absl::StatusCode::kUnimplemented, "attention_bias");
}

// OLMo 3: OLMo 2's block, every fourth layer full and the others sliding (Olmo3Config's defaults:
// window 4096), the RoPE scaling for the full layers only; layer_types as given.
TEST(ConfigTest, ParsesOlmo3) {
  Json j = Json::parse(kOlmo2_7B);
  j["model_type"] = "olmo3";
  j["architectures"] = {"Olmo3ForCausalLM"};
  j["max_position_embeddings"] = 65536;
  j["rope_scaling"] = {{"rope_type", "yarn"},
                       {"factor", 8.0},
                       {"original_max_position_embeddings", 8192},
                       {"attention_factor", 1.2079441541679836}};
  absl::StatusOr<LlamaConfig> c = ParseLlamaConfig(j.dump(), "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->qk_norm_whole);
  EXPECT_FALSE(c->pre_norms);
  EXPECT_EQ(c->sliding_window, 4096);
  for (int32_t i = 0; i < 32; ++i) EXPECT_EQ(c->SlidingWindowOf(i), (i + 1) % 4 ? 4096 : 0) << i;
  EXPECT_EQ(c->rope_scaling.type, "yarn");
  EXPECT_EQ(c->rope_local_theta, 500000.0);  // the sliding layers: the same base, unscaled
  EXPECT_EQ(ArchitectureClassName("olmo3"), "Olmo3ForCausalLM");
  j["sliding_window"] = 1024;
  Json types = Json::array();
  for (int i = 0; i < 32; ++i) types.push_back(i % 2 ? "full_attention" : "sliding_attention");
  j["layer_types"] = types;
  j["rope_scaling"] = nullptr;
  c = ParseLlamaConfig(j.dump(), "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->SlidingWindowOf(0), 1024);
  EXPECT_EQ(c->SlidingWindowOf(1), 0);
  EXPECT_EQ(c->rope_local_theta, 0);  // nothing to leave out
}

// openai/gpt-oss-20b's config.json as published (layer_types shortened to the pattern below).
constexpr char kGptOss20B[] = R"({
  "architectures": ["GptOssForCausalLM"], "attention_bias": true, "attention_dropout": 0.0,
  "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu",
  "hidden_size": 2880, "initial_context_length": 4096, "initializer_range": 0.02,
  "intermediate_size": 2880, "max_position_embeddings": 131072, "model_type": "gpt_oss",
  "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": 24,
  "num_key_value_heads": 8, "num_local_experts": 32, "output_router_logits": false,
  "pad_token_id": 199999,
  "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn",
    "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"},
  "rms_norm_eps": 1e-05,
  "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
    "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": false},
  "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128,
  "swiglu_limit": 7.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.55.0.dev0", "use_cache": true, "vocab_size": 201088})";

TEST(ConfigTest, ParsesGptOss20B) {
  Json j = Json::parse(kGptOss20B);
  Json types = Json::array();
  for (int i = 0; i < 24; ++i) types.push_back(i % 2 ? "full_attention" : "sliding_attention");
  j["layer_types"] = types;
  absl::StatusOr<LlamaConfig> c = ParseLlamaConfig(j.dump(), "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->hidden_size, 2880);
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_TRUE(c->o_bias);
  EXPECT_TRUE(c->attention_sinks);
  EXPECT_TRUE(c->moe_biases);
  EXPECT_EQ(c->swiglu_limit, 7.0);
  EXPECT_EQ(c->num_experts, 32);
  EXPECT_EQ(c->num_experts_per_tok, 4);
  EXPECT_EQ(c->moe_intermediate_size, 2880);
  EXPECT_TRUE(c->norm_topk_prob);
  EXPECT_EQ(c->NumMoeLayers(), 24);
  EXPECT_FALSE(c->HasDenseMlp());
  for (int32_t i = 0; i < 24; ++i) EXPECT_EQ(c->SlidingWindowOf(i), i % 2 ? 0 : 128) << i;
  EXPECT_EQ(c->rope_scaling.type, "yarn");
  EXPECT_FALSE(c->rope_scaling.truncate);
  EXPECT_EQ(c->rope_scaling.factor, 32.0);
  EXPECT_EQ(c->rope_local_theta, 0);  // YaRN on every layer
  EXPECT_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_EQ(c->quantization.method, "mxfp4");
  EXPECT_EQ(c->quantization.Describe(), "mxfp4 experts");
  EXPECT_EQ(c->eos_token_ids, std::vector<int32_t>({200002}));
  EXPECT_EQ(ArchitectureClassName("gpt_oss"), "GptOssForCausalLM");

  // GptOssConfig's defaults where a file leaves keys out: biased attention, heads of 64, the
  // even layers sliding over 128, swiglu_limit 7, 128 experts, 4 a token.
  for (const char* key : {"attention_bias", "head_dim", "sliding_window", "swiglu_limit",
                          "num_local_experts", "num_experts_per_tok", "rms_norm_eps"}) {
    j.erase(key);
  }
  j.erase("layer_types");
  j["max_position_embeddings"] = 131072;
  c = ParseLlamaConfig(j.dump(), "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->qkv_bias && c->o_bias);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->SlidingWindowOf(0), 128);
  EXPECT_EQ(c->SlidingWindowOf(1), 0);
  EXPECT_EQ(c->swiglu_limit, 7.0);
  EXPECT_EQ(c->num_experts, 128);
  EXPECT_EQ(c->num_experts_per_tok, 4);
  EXPECT_EQ(c->rms_norm_eps, 1e-5);

  // Refusals name the key: no experts; MXFP4 for another architecture.
  j["num_local_experts"] = 0;
  absl::Status st = ParseLlamaConfig(j.dump(), "config.json").status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("num_local_experts"), std::string::npos) << st;
  Json llama = Json::parse(kGptOss20B);
  llama["model_type"] = "llama";
  st = ParseLlamaConfig(llama.dump(), "config.json").status();
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(st.message().find("mxfp4"), std::string::npos) << st;
}

TEST(ConfigTest, ParsesSmolLM3_3B) {
  absl::StatusOr<LlamaConfig> c = ParseLlamaConfig(kSmolLM3_3B, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type, "smollm3");
  EXPECT_EQ(c->num_hidden_layers, 36);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->rope_theta, 5000000.0);
  EXPECT_TRUE(c->tie_word_embeddings);  // SmolLM3Config's default; the file does not say
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_EQ(c->sliding_window, 0);
  ASSERT_EQ(c->rope_layers.size(), 36u);
  for (int32_t i = 0; i < 36; ++i) EXPECT_EQ(c->UsesRope(i), (i + 1) % 4 != 0) << i;
  EXPECT_TRUE(c->HasNopeLayers());
  EXPECT_EQ(ArchitectureClassName("smollm3"), "SmolLM3ForCausalLM");
  // Without the list, the interval makes it (SmolLM3Config.__post_init__); a list says which.
  Json j = Json::parse(kSmolLM3_3B);
  j.erase("no_rope_layers");
  j["no_rope_layer_interval"] = 3;
  c = ParseLlamaConfig(j.dump(), "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  for (int32_t i = 0; i < 36; ++i) EXPECT_EQ(c->UsesRope(i), (i + 1) % 3 != 0) << i;
  j.erase("no_rope_layer_interval");
  c = ParseLlamaConfig(j.dump(), "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->UsesRope(3));
  EXPECT_TRUE(c->UsesRope(4));
  // use_sliding_window with a window: the NoPE layers slide, as SmolLM3Config fills layer_types.
  j.erase("layer_types");
  j["use_sliding_window"] = true;
  j["sliding_window"] = 4096;
  c = ParseLlamaConfig(j.dump(), "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->SlidingWindowOf(3), 4096);
  EXPECT_EQ(c->SlidingWindowOf(2), 0);
}

TEST(ConfigTest, SmolLM3BadNopeLayersNameTheKey) {
  Json j = Json::parse(kSmolLM3_3B);
  j["no_rope_layers"] = {1, 1, 0};
  ExpectError(ParseLlamaConfig(j.dump(), "config.json").status(),
              absl::StatusCode::kInvalidArgument, "no_rope_layers must be a list of at least");
  j = Json::parse(kSmolLM3_3B);
  j["no_rope_layers"][5] = 2;
  ExpectError(ParseLlamaConfig(j.dump(), "config.json").status(),
              absl::StatusCode::kInvalidArgument, "no_rope_layers [5] is 2");
  j = Json::parse(kSmolLM3_3B);
  j.erase("no_rope_layers");
  j["no_rope_layer_interval"] = 0;
  ExpectError(ParseLlamaConfig(j.dump(), "config.json").status(),
              absl::StatusCode::kInvalidArgument, "no_rope_layer_interval");
}

TEST(ConfigTest, ArchitectureClassNames) {
  EXPECT_EQ(ArchitectureClassName("qwen3"), "Qwen3ForCausalLM");
  EXPECT_EQ(ArchitectureClassName("phi3"), "Phi3ForCausalLM");
  EXPECT_EQ(ArchitectureClassName("granite"), "GraniteForCausalLM");
  EXPECT_EQ(ArchitectureClassName("mistral"), "MistralForCausalLM");
  EXPECT_EQ(ArchitectureClassName("llama"), "LlamaForCausalLM");
}

TEST(ConfigTest, ParsesQwen25_05B) {
  absl::StatusOr<LlamaConfig> c = ParseLlamaConfig(kQwen25_05B, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type, "qwen2");
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->num_key_value_heads, 2);
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_FALSE(c->o_bias);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_EQ(c->sliding_window, 0);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->rope_theta, 1e6);
  EXPECT_EQ(c->rms_norm_eps, 1e-6);
  EXPECT_FALSE(c->bos_token_id.has_value() && *c->bos_token_id != 151643);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(151645));
}

TEST(ConfigTest, ParsesQwen3_06B) {
  absl::StatusOr<LlamaConfig> c = ParseLlamaConfig(kQwen3_06B, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type, "qwen3");
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->num_attention_heads * c->head_dim, 2048);
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_FALSE(c->o_bias);
  EXPECT_TRUE(c->qk_norm);
  EXPECT_EQ(c->sliding_window, 0);
  EXPECT_EQ(c->max_position_embeddings, 40960);
}

// Llama and Qwen3 bias every attention projection under attention_bias, Qwen2 always Q/K/V and
// never O (whatever the key says), Mistral never (Transformers' MistralAttention ignores it).
TEST(ConfigTest, AttentionBiasesFollowTheArchitecture) {
  struct Case {
    const char* json;
    const char* model_type;
    bool attention_bias;
    bool qkv, o;
  };
  for (const Case& k : {Case{kLlama32_1B, "llama", true, true, true},
                        Case{kLlama32_1B, "llama", false, false, false},
                        Case{kLlama32_1B, "mistral", true, false, false},
                        Case{kQwen3_06B, "qwen3", true, true, true},
                        Case{kQwen25_05B, "qwen2", false, true, false},
                        Case{kQwen25_05B, "qwen2", true, true, false}}) {
    Json j = Json::parse(k.json);
    j["model_type"] = k.model_type;
    j["attention_bias"] = k.attention_bias;
    absl::StatusOr<LlamaConfig> c = ParseLlamaConfig(j.dump(), "config.json");
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->qkv_bias, k.qkv) << k.model_type << " " << k.attention_bias;
    EXPECT_EQ(c->o_bias, k.o) << k.model_type << " " << k.attention_bias;
    EXPECT_EQ(c->qk_norm, std::string(k.model_type) == "qwen3");
  }
  ExpectError(ParseStatus(Edited([](Json& j) { j["attention_bias"] = "yes"; })),
              absl::StatusCode::kInvalidArgument, "attention_bias must be true or false");
}

TEST(ConfigTest, MlpBiasesAreUnimplemented) {
  ExpectError(ParseStatus(Edited([](Json& j) { j["mlp_bias"] = true; })),
              absl::StatusCode::kUnimplemented, "mlp_bias");
}

// Qwen2/Qwen3 window only where use_sliding_window is on, for the layers from max_window_layers
// (default 28) or those layer_types names: then the window bounds the served context as
// Mistral's does.
TEST(ConfigTest, QwenSlidingWindowOnlyWhereUsed) {
  const auto with = [](const std::function<void(Json&)>& edit) {
    Json j = Json::parse(kQwen25_05B);
    edit(j);
    return ParseLlamaConfig(j.dump(), "config.json");
  };
  struct Case {
    std::function<void(Json&)> edit;
    int32_t window;
    std::vector<int32_t> sliding = {};
  };
  const std::vector<Case> cases = {
      {[](Json& j) { j["sliding_window"] = 4096; }, 0},  // use_sliding_window false
      {[](Json& j) {
         j["use_sliding_window"] = true;
         j["sliding_window"] = 4096;
       },
       4096,
       {21, 22, 23}},
      {[](Json& j) {
         j["use_sliding_window"] = true;
         j["sliding_window"] = 4096;
         j["max_window_layers"] = 24;
       },
       0},  // no layer from 24 on
      {[](Json& j) {
         j["use_sliding_window"] = true;
         j["sliding_window"] = 4096;
         j.erase("max_window_layers");
       },
       0},  // the default, 28, past the 24 layers
      {[](Json& j) {
         j["use_sliding_window"] = true;
         j["sliding_window"] = 4096;
         j["layer_types"] = Json::array();
         for (int i = 0; i < 24; ++i) {
           j["layer_types"].push_back(i == 1 ? "sliding_attention" : "full_attention");
         }
       },
       4096,
       {1}},
      {[](Json& j) {
         j["use_sliding_window"] = true;
         j["sliding_window"] = 4096;
         j["layer_types"] = Json::array();
         for (int i = 0; i < 24; ++i) j["layer_types"].push_back("full_attention");
       },
       0},
      {[](Json& j) {
         j["use_sliding_window"] = true;
         j["sliding_window"] = 65536;  // past the context: full attention
       },
       0},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    absl::StatusOr<LlamaConfig> c = with(cases[i].edit);
    ASSERT_TRUE(c.ok()) << i << ": " << c.status();
    EXPECT_EQ(c->sliding_window, cases[i].window) << "case " << i;
    // Which layers slide: from max_window_layers (21 in Qwen2.5-0.5B's file), or layer_types.
    std::vector<int32_t> sliding;
    for (int32_t l = 0; l < c->num_hidden_layers; ++l) {
      if (c->SlidingWindowOf(l) > 0) sliding.push_back(l);
    }
    EXPECT_EQ(sliding, cases[i].sliding) << "case " << i;
  }
  ExpectError(with([](Json& j) {
                j["use_sliding_window"] = true;
                j["layer_types"] = Json::array();
                for (int i = 0; i < 24; ++i) j["layer_types"].push_back("chunked_attention");
              }).status(),
              absl::StatusCode::kUnimplemented, "layer_types \"chunked_attention\"");
  // One entry per layer, as Transformers validates them.
  ExpectError(with([](Json& j) {
                j["use_sliding_window"] = true;
                j["layer_types"] = {"full_attention", "sliding_attention"};
              }).status(),
              absl::StatusCode::kInvalidArgument,
              "layer_types must be a list of num_hidden_layers (24) strings");
}

TEST(ConfigTest, UnsupportedArchitectureFeaturesAreUnimplemented) {
  ExpectError(ParseStatus(Edited([](Json& j) { j["model_type"] = "gpt2"; })),
              absl::StatusCode::kUnimplemented,
              "model_type \"gpt2\" is not supported (llama, mistral, qwen2, qwen3, phi3, "
              "granite, mixtral, qwen2_moe, qwen3_moe, gemma2, gemma3, gemma3_text, smollm3, "
              "olmo2, olmo3, gpt_oss)");
  ExpectError(ParseStatus(Edited([](Json& j) { j["hidden_act"] = "gelu"; })),
              absl::StatusCode::kUnimplemented, "hidden_act");
}

TEST(ConfigTest, MistralSlidingWindowIsKeptLlamaIgnoresIt) {
  // Mistral-7B-v0.1: a 4096 window in a 32768 context. Kept, for the engine to serve within.
  absl::StatusOr<LlamaConfig> c = ParseLlamaConfig(Edited([](Json& j) {
                                                     j["model_type"] = "mistral";
                                                     j["sliding_window"] = 4096;
                                                   }),
                                                   "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sliding_window, 4096);
  // A window covering the whole context changes nothing; null is none.
  for (const Json& window : std::vector<Json>{131072, nullptr}) {
    c = ParseLlamaConfig(Edited([&](Json& j) {
                           j["model_type"] = "mistral";
                           j["sliding_window"] = window;
                         }),
                         "config.json");
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->sliding_window, 0) << window;
  }
  // Transformers' Llama never reads the key.
  c = ParseLlamaConfig(Edited([](Json& j) { j["sliding_window"] = 4096; }), "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sliding_window, 0);
  ExpectError(ParseStatus(Edited([](Json& j) {
                j["model_type"] = "mistral";
                j["sliding_window"] = 0;
              })),
              absl::StatusCode::kInvalidArgument, "sliding_window");
}

// Transformers 5 keeps rope_theta and the scaling in rope_parameters (and may write the
// top-level rope_theta null or not at all): Llama 3.2 1B re-saved that way.
TEST(ConfigTest, ReadsTransformers5RopeParameters) {
  const auto v5 = [](Json& j) {
    Json params = j["rope_scaling"];
    params["rope_theta"] = 500000.0;
    j["rope_parameters"] = params;
    j.erase("rope_scaling");
    j["rope_theta"] = nullptr;
  };
  absl::StatusOr<LlamaConfig> c = ParseLlamaConfig(Edited(v5), "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->rope_theta, 500000.0);
  EXPECT_EQ(c->rope_scaling.type, "llama3");
  EXPECT_DOUBLE_EQ(c->rope_scaling.factor, 32.0);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 8192);
  // The same frequencies as the Transformers 4 file.
  const absl::StatusOr<LlamaConfig> v4 = ParseLlamaConfig(kLlama32_1B, "config.json");
  ASSERT_TRUE(v4.ok());
  EXPECT_EQ(RopeInverseFrequencies(*c), RopeInverseFrequencies(*v4));

  // Default rotation: only the base.
  c = ParseLlamaConfig(Edited([](Json& j) {
                         j.erase("rope_scaling");
                         j.erase("rope_theta");
                         j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};
                       }),
                       "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->rope_theta, 1e6);
  EXPECT_EQ(c->rope_scaling.type, "");

  // Both places, agreeing (a file written for both versions): fine. Disagreeing: refused,
  // naming the key, since either reading computes garbage for the other.
  EXPECT_TRUE(ParseStatus(Edited([&](Json& j) {
                Json params = j["rope_scaling"];
                params["rope_theta"] = 500000.0;
                j["rope_parameters"] = params;
              })).ok());
  ExpectError(ParseStatus(Edited([](Json& j) {
                Json params = j["rope_scaling"];
                params["rope_theta"] = 10000.0;
                j["rope_parameters"] = params;
              })),
              absl::StatusCode::kInvalidArgument, "rope_theta (500000) disagrees");
  ExpectError(ParseStatus(Edited([](Json& j) {
                Json params = j["rope_scaling"];
                params["factor"] = 8.0;
                params["rope_theta"] = 500000.0;
                j["rope_parameters"] = params;
              })),
              absl::StatusCode::kInvalidArgument, "rope_scaling disagrees with rope_parameters");
  // Its fields are checked as rope_scaling's are, and named as its own.
  ExpectError(ParseStatus(Edited([](Json& j) {
                j.erase("rope_scaling");
                j["rope_parameters"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
              })),
              absl::StatusCode::kInvalidArgument, "rope_parameters.low_freq_factor is missing");
  ExpectError(ParseStatus(Edited([](Json& j) {
                j.erase("rope_scaling");
                j["rope_parameters"] = {{"rope_type", "longrope"}, {"factor", 4.0}};
              })),
              absl::StatusCode::kUnimplemented, "rope_parameters.rope_type \"longrope\"");
  // Per layer type (Gemma 3 style): not computed here.
  ExpectError(ParseStatus(Edited([](Json& j) {
                j.erase("rope_scaling");
                j["rope_parameters"] = {
                    {"full_attention", {{"rope_type", "default"}, {"rope_theta", 1e6}}},
                    {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 1e4}}}};
              })),
              absl::StatusCode::kUnimplemented, "rope_parameters without rope_type");
  ExpectError(ParseStatus(Edited([](Json& j) { j["rope_parameters"] = 3; })),
              absl::StatusCode::kInvalidArgument, "rope_parameters must be an object");
}

TEST(ConfigTest, UnknownRopeTypeIsUnimplemented) {
  ExpectError(ParseStatus(Edited([](Json& j) { j["rope_scaling"]["rope_type"] = "longrope"; })),
              absl::StatusCode::kUnimplemented, "rope_scaling.rope_type \"longrope\"");
  ExpectError(ParseStatus(Edited([](Json& j) {
                j["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};
              })),
              absl::StatusCode::kUnimplemented, "rope_scaling.type \"dynamic\"");
  absl::StatusOr<LlamaConfig> c = ParseLlamaConfig(Edited([](Json& j) {
                                                     j["rope_scaling"] = {{"rope_type", "default"}};
                                                   }),
                                                   "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.type, "");
}

TEST(ConfigTest, Llama3RopeParametersAreValidated) {
  ExpectError(ParseStatus(Edited([](Json& j) { j["rope_scaling"].erase("low_freq_factor"); })),
              absl::StatusCode::kInvalidArgument, "rope_scaling.low_freq_factor is missing");
  ExpectError(ParseStatus(Edited([](Json& j) { j["rope_scaling"]["high_freq_factor"] = 1.0; })),
              absl::StatusCode::kInvalidArgument, "rope_scaling.high_freq_factor");
  ExpectError(ParseStatus(Edited([](Json& j) { j["rope_scaling"]["factor"] = 0.5; })),
              absl::StatusCode::kInvalidArgument, "rope_scaling.factor");
  ExpectError(ParseStatus(Edited([](Json& j) { j["rope_scaling"]["rope_type"] = 3; })),
              absl::StatusCode::kInvalidArgument, "rope_scaling.rope_type must be a string");
}

TEST(ConfigTest, WrongJsonTypesNameTheKey) {
  ExpectError(ParseStatus(Edited([](Json& j) { j["hidden_size"] = "2048"; })),
              absl::StatusCode::kInvalidArgument, "hidden_size must be an integer");
  ExpectError(ParseStatus(Edited([](Json& j) { j["hidden_size"] = 2048.0; })),
              absl::StatusCode::kInvalidArgument, "hidden_size must be an integer");
  ExpectError(ParseStatus(Edited([](Json& j) { j["rms_norm_eps"] = "1e-5"; })),
              absl::StatusCode::kInvalidArgument, "rms_norm_eps must be a number");
  ExpectError(ParseStatus(Edited([](Json& j) { j["rope_theta"] = -1.0; })),
              absl::StatusCode::kInvalidArgument, "rope_theta");
  ExpectError(ParseStatus(Edited([](Json& j) { j["tie_word_embeddings"] = "yes"; })),
              absl::StatusCode::kInvalidArgument, "tie_word_embeddings must be true or false");
  ExpectError(ParseStatus(Edited([](Json& j) { j["attention_bias"] = 0; })),
              absl::StatusCode::kInvalidArgument, "attention_bias");
  ExpectError(ParseStatus(Edited([](Json& j) { j["rope_scaling"] = 5; })),
              absl::StatusCode::kInvalidArgument, "rope_scaling must be an object");
  ExpectError(ParseStatus(Edited([](Json& j) { j["eos_token_id"] = "2"; })),
              absl::StatusCode::kInvalidArgument, "eos_token_id");
  ExpectError(ParseStatus(Edited([](Json& j) {
                j["eos_token_id"] = {1, 2.5};
              })),
              absl::StatusCode::kInvalidArgument, "eos_token_id");
  ExpectError(ParseStatus(Edited([](Json& j) { j["eos_token_id"] = 128256; })),
              absl::StatusCode::kInvalidArgument,
              "eos_token_id (128256) is outside the vocabulary");
  ExpectError(ParseStatus(Edited([](Json& j) { j["bos_token_id"] = -1; })),
              absl::StatusCode::kInvalidArgument, "bos_token_id");
  ExpectError(ParseStatus(Edited([](Json& j) { j["model_type"] = nullptr; })),
              absl::StatusCode::kInvalidArgument, "model_type is missing");
  ExpectError(ParseStatus("[1, 2]"), absl::StatusCode::kInvalidArgument, "not a JSON object");
  ExpectError(ParseStatus("{\"vocab_size\": "), absl::StatusCode::kInvalidArgument, "invalid JSON");
}

// Meta's reference apply_scaling (llama/models/llama3/reference_impl/model.py), written per
// frequency with explicit regions; returns the region for the test to count.
enum class Region { kHigh, kMid, kLow };
double ReferenceLlama3(double freq, Region* region) {
  const double scale_factor = 32, low_freq_factor = 1, high_freq_factor = 4, old_context_len = 8192;
  const double low_freq_wavelen = old_context_len / low_freq_factor;
  const double high_freq_wavelen = old_context_len / high_freq_factor;
  const double wavelen = 2 * M_PI / freq;
  if (wavelen < high_freq_wavelen) {
    *region = Region::kHigh;
    return freq;
  }
  if (wavelen > low_freq_wavelen) {
    *region = Region::kLow;
    return freq / scale_factor;
  }
  *region = Region::kMid;
  const double smooth =
      (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
  return (1 - smooth) * freq / scale_factor + smooth * freq;
}

TEST(RopeTest, Llama3ScalingMatchesReferenceInAllThreeRegions) {
  absl::StatusOr<LlamaConfig> c = ParseLlamaConfig(kLlama32_1B, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  const std::vector<double> inv = RopeInverseFrequencies(*c);
  ASSERT_EQ(inv.size(), 32u);
  int counts[3] = {0, 0, 0};
  for (int i = 0; i < 32; ++i) {
    const double base = std::exp(-std::log(500000.0) * (2.0 * i) / 64.0);
    Region region;
    const double want = ReferenceLlama3(base, &region);
    ++counts[static_cast<int>(region)];
    EXPECT_NEAR(inv[i], want, 1e-12 * want) << "pair " << i;
    switch (region) {
      case Region::kHigh:
        EXPECT_NEAR(inv[i], base, 1e-12 * base) << "pair " << i << " should be unscaled";
        break;
      case Region::kLow:
        EXPECT_NEAR(inv[i], base / 32, 1e-12 * base) << "pair " << i << " should be divided";
        break;
      case Region::kMid:
        EXPECT_GT(inv[i], base / 32 * (1 + 1e-9)) << "pair " << i;
        EXPECT_LT(inv[i], base * (1 - 1e-9)) << "pair " << i;
        break;
    }
  }
  // For head_dim 64 / theta 5e5 the bands are: pairs 0-14 high, 15-17 smoothed, 18-31 low.
  EXPECT_EQ(counts[0], 15);
  EXPECT_EQ(counts[1], 3);
  EXPECT_EQ(counts[2], 14);
  // Spot values computed separately in Python (float64).
  EXPECT_NEAR(inv[14], 0.0032114459947525913, 1e-15);
  EXPECT_NEAR(inv[15], 0.001290547928209264, 1e-15);
  EXPECT_NEAR(inv[16], 0.00042955679655936815, 1e-16);
  EXPECT_NEAR(inv[17], 9.70828780262767e-05, 1e-17);
  EXPECT_NEAR(inv[31], 9.418306725434909e-08, 1e-19);
}

// Qwen2.5's long-context setting (its model card's rope_scaling: yarn, factor 4 over 32768):
// pairs below the beta_fast correction dim keep their frequency, those above the beta_slow one
// are divided by the factor, the band between is ramped; cos and sin are scaled by
// 0.1 ln 4 + 1. Spot values from a plain-Python transcription of Transformers'
// _compute_yarn_parameters (float64).
TEST(RopeTest, YarnAsQwen25LongContext) {
  Json j = Json::parse(kQwen25_05B);
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
  absl::StatusOr<LlamaConfig> c = ParseLlamaConfig(j.dump(), "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.type, "yarn");
  EXPECT_DOUBLE_EQ(c->rope_scaling.factor, 4.0);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 32768);
  EXPECT_NEAR(c->rope_scaling.attention_factor, 1.138629436111989, 1e-15);
  const std::vector<double> inv = RopeInverseFrequencies(*c);
  ASSERT_EQ(inv.size(), 32u);
  for (int i = 0; i < 32; ++i) {
    const double base = std::pow(1e6, -2.0 * i / 64);
    if (i <= 11) EXPECT_NEAR(inv[i], base, 1e-13 * base) << "pair " << i << " extrapolates";
    if (i >= 20) EXPECT_NEAR(inv[i], base / 4, 1e-13 * base) << "pair " << i << " interpolates";
    if (i > 11 && i < 20) {
      EXPECT_LT(inv[i], base * (1 - 1e-9)) << i;
      EXPECT_GT(inv[i], base / 4 * (1 + 1e-9)) << i;
    }
  }
  EXPECT_NEAR(inv[15], 0.0010266176840396614, 1e-13 * inv[15]);
  EXPECT_NEAR(inv[20], 4.445698525097307e-05, 1e-13 * inv[20]);
  EXPECT_NEAR(inv[31], 3.84981631514873e-07, 1e-13 * inv[31]);
  // The table both backends rotate with carries the attention factor.
  const std::vector<float> table = RopeTable(*c, 3);
  ASSERT_EQ(table.size(), 3u * 64);
  EXPECT_FLOAT_EQ(table[0], 1.138629436111989f);       // position 0: cos 0 * factor
  EXPECT_FLOAT_EQ(table[32], 0.0f);                    // sin 0
  EXPECT_FLOAT_EQ(table[64 + 32 + 15],                 // position 1, sin of pair 15
                  static_cast<float>(std::sin(inv[15]) * 1.138629436111989));
  // Without truncation the band's ends are the correction dims themselves; without a factor it
  // is max_position_embeddings over the original; an explicit attention_factor wins.
  j["rope_scaling"] = {{"rope_type", "yarn"},
                       {"original_max_position_embeddings", 8192},
                       {"truncate", false},
                       {"beta_fast", nullptr},
                       {"attention_factor", 1.0}};
  c = ParseLlamaConfig(j.dump(), "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->rope_scaling.factor, 4.0);  // 32768 / 8192
  EXPECT_DOUBLE_EQ(c->rope_scaling.beta_fast, 32);
  EXPECT_FALSE(c->rope_scaling.truncate);
  EXPECT_DOUBLE_EQ(c->rope_scaling.attention_factor, 1.0);
  // DeepSeek's mscale pair: the ratio of the two scales.
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 40.0}, {"mscale", 1.0}, {"mscale_all_dim", 0.5}};
  c = ParseLlamaConfig(j.dump(), "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NEAR(c->rope_scaling.attention_factor,
              (0.1 * std::log(40.0) + 1) / (0.05 * std::log(40.0) + 1), 1e-15);
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}, {"beta_fast", 1}, {"beta_slow", 2}};
  ExpectError(ParseStatus(j.dump()), absl::StatusCode::kInvalidArgument,
              "rope_scaling.beta_fast (1) must be at least beta_slow (2)");
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 0.5}};
  ExpectError(ParseStatus(j.dump()), absl::StatusCode::kInvalidArgument,
              "rope_scaling.factor (0.5) must be >= 1");
  j["rope_scaling"] = {{"type", "longrope"}, {"factor", 4.0}};
  ExpectError(ParseStatus(j.dump()), absl::StatusCode::kUnimplemented,
              "(supported: llama3, linear, yarn, default)");
}

TEST(RopeTest, UnscaledAndLinear) {
  absl::StatusOr<LlamaConfig> c = ParseLlamaConfig(kLlama2_7B, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  std::vector<double> inv = RopeInverseFrequencies(*c);
  ASSERT_EQ(inv.size(), 64u);
  EXPECT_DOUBLE_EQ(inv[0], 1.0);
  EXPECT_NEAR(inv[1], std::pow(10000.0, -2.0 / 128), 1e-15);
  EXPECT_NEAR(inv[63], std::pow(10000.0, -126.0 / 128), 1e-18);
  c->rope_scaling.type = "linear";
  c->rope_scaling.factor = 4;
  const std::vector<double> scaled = RopeInverseFrequencies(*c);
  for (int i = 0; i < 64; ++i) EXPECT_NEAR(scaled[i], inv[i] / 4, 1e-12 * inv[i]) << i;
}

// ---- Gemma 2 / 3 ------------------------------------------------------------------------------

// google/gemma-2-2b-it's config.json.
constexpr char kGemma2_2B[] = R"({
  "architectures": ["Gemma2ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid",
  "eos_token_id": [1, 107], "final_logit_softcapping": 30.0, "head_dim": 256,
  "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
  "hidden_size": 2304, "initializer_range": 0.02, "intermediate_size": 9216,
  "max_position_embeddings": 8192, "model_type": "gemma2", "num_attention_heads": 8,
  "num_hidden_layers": 26, "num_key_value_heads": 4, "pad_token_id": 0,
  "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
  "sliding_window": 4096, "torch_dtype": "bfloat16", "transformers_version": "4.42.4",
  "use_cache": true, "vocab_size": 256000})";

// google/gemma-3-1b-it's config.json.
constexpr char kGemma3_1B[] = R"({
  "architectures": ["Gemma3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "attn_logit_softcapping": null, "bos_token_id": 2, "cache_implementation": "hybrid",
  "eos_token_id": [1, 106], "final_logit_softcapping": null, "head_dim": 256,
  "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152, "initializer_range": 0.02,
  "intermediate_size": 6912, "max_position_embeddings": 32768, "model_type": "gemma3_text",
  "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1,
  "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
  "rope_local_base_freq": 10000, "rope_scaling": null, "rope_theta": 1000000,
  "sliding_window": 512, "sliding_window_pattern": 6, "torch_dtype": "bfloat16",
  "transformers_version": "4.50.0.dev0", "use_cache": true, "vocab_size": 262144})";

// google/gemma-3-4b-it's config.json (the vision tower's part cut short): its text_config gives
// only what differs from Gemma3TextConfig's defaults.
constexpr char kGemma3_4B[] = R"({
  "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999,
  "eoi_token_index": 256000, "eos_token_id": [1, 106], "image_token_index": 262144,
  "initializer_range": 0.02, "mm_tokens_per_image": 256, "model_type": "gemma3",
  "text_config": {"head_dim": 256, "hidden_size": 2560, "intermediate_size": 10240,
    "model_type": "gemma3_text", "num_attention_heads": 8, "num_hidden_layers": 34,
    "num_key_value_heads": 4, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
    "sliding_window": 1024},
  "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
  "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152}})";

std::vector<int32_t> SlidingLayers(const LlamaConfig& c) {
  std::vector<int32_t> layers;
  for (int32_t l = 0; l < c.num_hidden_layers; ++l) {
    if (c.SlidingWindowOf(l) > 0) layers.push_back(l);
  }
  return layers;
}

TEST(GemmaConfigTest, Gemma2) {
  absl::StatusOr<LlamaConfig> c = ParseLlamaConfig(kGemma2_2B, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 256);
  EXPECT_EQ(c->norm_weight_offset, 1);
  EXPECT_TRUE(c->sandwich_norms);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_TRUE(c->gelu_tanh());
  EXPECT_TRUE(c->tie_word_embeddings);  // Gemma2Config's default: the file does not say
  EXPECT_EQ(c->attn_logit_softcapping, 50);
  EXPECT_EQ(c->final_logit_softcapping, 30);
  EXPECT_EQ(c->attention_scale, 1.0 / 16);
  EXPECT_EQ(c->embedding_multiplier, 48);  // sqrt(2304), exact in bfloat16
  EXPECT_EQ(c->rope_local_theta, 0);
  EXPECT_EQ(c->sliding_window, 4096);
  std::vector<int32_t> even;
  for (int32_t l = 0; l < 26; l += 2) even.push_back(l);
  EXPECT_EQ(SlidingLayers(*c), even);  // Gemma 2: the even layers slide
  // Null softcapping is none; absent, Gemma2Config's defaults (above).
  Json j = Json::parse(kGemma2_2B);
  j["attn_logit_softcapping"] = nullptr;
  j.erase("final_logit_softcapping");
  c = ParseLlamaConfig(j.dump(), "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->attn_logit_softcapping, 0);
  EXPECT_EQ(c->final_logit_softcapping, 30);
  j["hidden_activation"] = "gelu";
  ExpectError(ParseStatus(j.dump()), absl::StatusCode::kUnimplemented,
              "hidden_activation \"gelu\" is not supported");
}

TEST(GemmaConfigTest, Gemma3Text) {
  absl::StatusOr<LlamaConfig> c = ParseLlamaConfig(kGemma3_1B, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->qk_norm);
  EXPECT_TRUE(c->sandwich_norms);
  EXPECT_EQ(c->attn_logit_softcapping, 0);
  EXPECT_EQ(c->final_logit_softcapping, 0);
  EXPECT_EQ(c->rope_theta, 1e6);
  EXPECT_EQ(c->rope_local_theta, 1e4);
  EXPECT_EQ(c->sliding_window, 512);
  // sqrt(1152) = 33.94 is 34 in bfloat16, as Gemma3TextScaledWordEmbedding's scale tensor.
  EXPECT_EQ(c->embedding_multiplier, 34);
  std::vector<int32_t> sliding;
  for (int32_t l = 0; l < 26; ++l) {
    if ((l + 1) % 6 != 0) sliding.push_back(l);  // every sixth layer is global
  }
  EXPECT_EQ(SlidingLayers(*c), sliding);
  // The local base: the sliding layers' table rotates with 10000, unscaled.
  const LlamaConfig local = LocalRopeConfig(*c);
  EXPECT_EQ(local.rope_theta, 1e4);
  EXPECT_EQ(local.rope_scaling.type, "");
  // Transformers 5 writes the two rotations keyed by layer type.
  Json j = Json::parse(kGemma3_1B);
  j.erase("rope_theta");
  j.erase("rope_local_base_freq");
  j.erase("rope_scaling");
  j["rope_parameters"] = {
      {"full_attention", {{"rope_type", "linear"}, {"factor", 8.0}, {"rope_theta", 1e6}}},
      {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 1e4}}}};
  c = ParseLlamaConfig(j.dump(), "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_theta, 1e6);
  EXPECT_EQ(c->rope_scaling.type, "linear");
  EXPECT_EQ(c->rope_scaling.factor, 8);
  EXPECT_EQ(c->rope_local_theta, 1e4);
  j["rope_parameters"]["sliding_attention"]["rope_type"] = "yarn";
  ExpectError(ParseStatus(j.dump()), absl::StatusCode::kUnimplemented,
              "rope_parameters.sliding_attention.rope_type \"yarn\"");
  // A window no shorter than the context: no layer attends within one, but the sliding layers
  // still rotate with the local base.
  j = Json::parse(kGemma3_1B);
  j["sliding_window"] = 32768;
  c = ParseLlamaConfig(j.dump(), "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sliding_window, 0);
  EXPECT_TRUE(SlidingLayers(*c).empty());
  EXPECT_TRUE(c->IsSlidingLayer(0));
  EXPECT_FALSE(c->IsSlidingLayer(5));
  j = Json::parse(kGemma3_1B);
  j["use_bidirectional_attention"] = true;  // EmbeddingGemma
  ExpectError(ParseStatus(j.dump()), absl::StatusCode::kUnimplemented,
              "use_bidirectional_attention");
}

// Gemma 3 4B and up: the language model of Gemma3ForConditionalGeneration, from text_config and
// Gemma3TextConfig's defaults for what it leaves out.
TEST(GemmaConfigTest, Gemma3MultimodalServesItsLanguageModel) {
  absl::StatusOr<LlamaConfig> c = ParseLlamaConfig(kGemma3_4B, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->multimodal_wrapper);
  EXPECT_EQ(c->model_type, "gemma3_text");
  EXPECT_EQ(c->hidden_size, 2560);
  EXPECT_EQ(c->num_hidden_layers, 34);
  EXPECT_EQ(c->vocab_size, 262208);
  EXPECT_EQ(c->max_position_embeddings, 131072);
  EXPECT_EQ(c->rope_scaling.type, "linear");
  EXPECT_EQ(c->rope_scaling.factor, 8);
  EXPECT_EQ(c->sliding_window, 1024);
  EXPECT_EQ(c->torch_dtype, "bfloat16");
  EXPECT_EQ(c->eos_token_ids, (std::vector<int32_t>{1, 106}));
  // Without head_dim (a text_config saved as a diff against Gemma3TextConfig's defaults): 256,
  // the class default, not hidden / heads (320).
  Json j = Json::parse(kGemma3_4B);
  j["text_config"].erase("head_dim");
  c = ParseLlamaConfig(j.dump(), "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 256);
  j = Json::parse(kGemma2_2B);
  j.erase("head_dim");
  c = ParseLlamaConfig(j.dump(), "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 256);
  j = Json::parse(kGemma3_4B);
  j.erase("text_config");
  ExpectError(ParseStatus(j.dump()), absl::StatusCode::kInvalidArgument, "text_config");
}

// mistralai/Mixtral-8x7B-Instruct-v0.1's config.json.
constexpr char kMixtral8x7B[] = R"json({
  "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
  "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mixtral",
  "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": false,
  "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
  "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.36.0.dev0", "use_cache": true, "vocab_size": 32000})json";

// Qwen/Qwen3-30B-A3B's config.json.
constexpr char kQwen3_30B_A3B[] = R"json({
  "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
  "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
  "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48,
  "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
  "norm_topk_prob": true, "num_attention_heads": 32, "num_experts": 128,
  "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4,
  "output_router_logits": false, "rms_norm_eps": 1e-06, "rope_scaling": null,
  "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": null,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})json";

TEST(MoeConfigTest, Mixtral8x7B) {
  absl::StatusOr<LlamaConfig> c = ParseLlamaConfig(kMixtral8x7B, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type, "mixtral");
  EXPECT_EQ(c->num_experts, 8);
  EXPECT_EQ(c->num_experts_per_tok, 2);
  EXPECT_EQ(c->moe_intermediate_size, 14336);  // Mixtral's experts are intermediate_size wide
  EXPECT_TRUE(c->norm_topk_prob);              // MixtralSparseMoeBlock always renormalizes
  ASSERT_EQ(c->moe_layers.size(), 32u);
  for (int32_t i = 0; i < 32; ++i) EXPECT_TRUE(c->IsMoeLayer(i)) << i;
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_EQ(c->sliding_window, 0);
  EXPECT_EQ(ArchitectureClassName("mixtral"), "MixtralForCausalLM");
  // Mistral's attention: attention_bias is ignored; a window is every layer's.
  Json j = Json::parse(kMixtral8x7B);
  j["attention_bias"] = true;
  j["sliding_window"] = 4096;
  c = ParseLlamaConfig(j.dump(), "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_EQ(c->SlidingWindowOf(31), 4096);
  // MixtralConfig's defaults: 8 experts, 2 a token.
  j = Json::parse(kMixtral8x7B);
  j.erase("num_local_experts");
  j.erase("num_experts_per_tok");
  c = ParseLlamaConfig(j.dump(), "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_experts, 8);
  EXPECT_EQ(c->num_experts_per_tok, 2);
}

TEST(MoeConfigTest, Qwen3_30B_A3B) {
  absl::StatusOr<LlamaConfig> c = ParseLlamaConfig(kQwen3_30B_A3B, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type, "qwen3_moe");
  EXPECT_EQ(c->num_experts, 128);
  EXPECT_EQ(c->num_experts_per_tok, 8);
  EXPECT_EQ(c->moe_intermediate_size, 768);
  EXPECT_EQ(c->intermediate_size, 6144);
  EXPECT_TRUE(c->norm_topk_prob);
  EXPECT_TRUE(c->qk_norm);
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_EQ(c->head_dim, 128);
  ASSERT_EQ(c->moe_layers.size(), 48u);
  for (int32_t i = 0; i < 48; ++i) EXPECT_TRUE(c->IsMoeLayer(i)) << i;
  EXPECT_EQ(ArchitectureClassName("qwen3_moe"), "Qwen3MoeForCausalLM");
  // Dense layers: those in mlp_only_layers, and those not on decoder_sparse_step.
  Json j = Json::parse(kQwen3_30B_A3B);
  j["mlp_only_layers"] = {0, 47};
  j["decoder_sparse_step"] = 2;
  j.erase("norm_topk_prob");  // Qwen3MoeConfig's default: false
  c = ParseLlamaConfig(j.dump(), "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->norm_topk_prob);
  for (int32_t i = 0; i < 48; ++i) {
    EXPECT_EQ(c->IsMoeLayer(i), i % 2 == 1 && i != 47) << i;
  }
  // No expert at all, or every layer dense: a dense model.
  j = Json::parse(kQwen3_30B_A3B);
  j["num_experts"] = 0;
  c = ParseLlamaConfig(j.dump(), "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->moe());
  EXPECT_EQ(c->num_experts, 0);
  EXPECT_EQ(c->moe_intermediate_size, 0);  // every expert field, not only the count
  EXPECT_FALSE(c->norm_topk_prob);
}

// Qwen/Qwen1.5-MoE-A2.7B's config.json.
constexpr char kQwen15MoeA27B[] = R"json({
  "architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
  "intermediate_size": 5632, "max_position_embeddings": 8192, "max_window_layers": 21,
  "model_type": "qwen2_moe", "num_attention_heads": 16, "num_hidden_layers": 24,
  "num_key_value_heads": 16, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "sliding_window": 32768, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.39.0.dev0", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 151936, "decoder_sparse_step": 1, "moe_intermediate_size": 1408,
  "shared_expert_intermediate_size": 5632, "num_experts_per_tok": 4, "num_experts": 60,
  "norm_topk_prob": false, "output_router_logits": false, "router_aux_loss_coef": 0.001})json";

TEST(MoeConfigTest, Qwen15MoeA27B) {
  absl::StatusOr<LlamaConfig> c = ParseLlamaConfig(kQwen15MoeA27B, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type, "qwen2_moe");
  EXPECT_EQ(c->num_experts, 60);
  EXPECT_EQ(c->num_experts_per_tok, 4);
  EXPECT_EQ(c->moe_intermediate_size, 1408);
  EXPECT_EQ(c->shared_expert_intermediate_size, 5632);
  EXPECT_FALSE(c->norm_topk_prob);
  EXPECT_TRUE(c->qkv_bias);  // Qwen2's attention
  EXPECT_FALSE(c->o_bias);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_EQ(c->sliding_window, 0);  // use_sliding_window false
  EXPECT_EQ(c->NumMoeLayers(), 24);
  EXPECT_FALSE(c->HasDenseMlp());
  EXPECT_EQ(ArchitectureClassName("qwen2_moe"), "Qwen2MoeForCausalLM");
  // Qwen2MoeConfig's defaults; a shared expert of 0 is none.
  Json j = Json::parse(kQwen15MoeA27B);
  for (const char* key : {"num_experts", "num_experts_per_tok", "moe_intermediate_size",
                          "shared_expert_intermediate_size", "norm_topk_prob"}) {
    j.erase(key);
  }
  c = ParseLlamaConfig(j.dump(), "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_experts, 60);
  EXPECT_EQ(c->num_experts_per_tok, 4);
  EXPECT_EQ(c->moe_intermediate_size, 1408);
  EXPECT_EQ(c->shared_expert_intermediate_size, 5632);
  EXPECT_FALSE(c->norm_topk_prob);
  j["shared_expert_intermediate_size"] = 0;
  c = ParseLlamaConfig(j.dump(), "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->shared_expert_intermediate_size, 0);
  j["shared_expert_intermediate_size"] = -1;
  EXPECT_EQ(ParseLlamaConfig(j.dump(), "config.json").status().code(),
            absl::StatusCode::kInvalidArgument);
  // The Qwen3-MoE shared expert key is not read (Qwen3MoeSparseMoeBlock has none).
  j = Json::parse(kQwen3_30B_A3B);
  j["shared_expert_intermediate_size"] = 512;
  c = ParseLlamaConfig(j.dump(), "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->shared_expert_intermediate_size, 0);
}

TEST(MoeConfigTest, BadExpertFieldsNameTheKey) {
  const auto edited = [](const char* json, const std::function<void(Json&)>& edit) {
    Json j = Json::parse(json);
    edit(j);
    return ParseLlamaConfig(j.dump(), "config.json").status();
  };
  ExpectError(edited(kMixtral8x7B, [](Json& j) { j["num_experts_per_tok"] = 9; }),
              absl::StatusCode::kInvalidArgument,
              "num_experts_per_tok (9) must be at most num_local_experts (8)");
  ExpectError(edited(kMixtral8x7B, [](Json& j) { j["num_experts_per_tok"] = 0; }),
              absl::StatusCode::kInvalidArgument, "num_experts_per_tok (0) must be in [1, 64]");
  ExpectError(edited(kQwen3_30B_A3B, [](Json& j) { j["num_experts_per_tok"] = 65; }),
              absl::StatusCode::kInvalidArgument, "num_experts_per_tok (65) must be at most 64");
  ExpectError(edited(kMixtral8x7B, [](Json& j) { j["num_local_experts"] = 100000; }),
              absl::StatusCode::kInvalidArgument,
              "num_local_experts (100000) must be at most 4096");
  ExpectError(edited(kQwen3_30B_A3B,
                     [](Json& j) {
                       j["mlp_only_layers"] = {3, 48};
                     }),
              absl::StatusCode::kInvalidArgument,
              "mlp_only_layers 48 is not a layer number (0 to 47)");
  ExpectError(edited(kQwen3_30B_A3B, [](Json& j) { j["mlp_only_layers"] = 3; }),
              absl::StatusCode::kInvalidArgument, "mlp_only_layers must be a list");
  ExpectError(edited(kQwen3_30B_A3B, [](Json& j) { j["moe_intermediate_size"] = -1; }),
              absl::StatusCode::kInvalidArgument, "moe_intermediate_size");
  ExpectError(edited(kQwen3_30B_A3B, [](Json& j) { j["decoder_sparse_step"] = 0; }),
              absl::StatusCode::kInvalidArgument, "decoder_sparse_step");
  ExpectError(edited(kQwen3_30B_A3B, [](Json& j) { j["norm_topk_prob"] = 1; }),
              absl::StatusCode::kInvalidArgument, "norm_topk_prob must be true or false");
}

// quantization_config as the quantization tools save it, on Qwen/Qwen2.5-7B-Instruct-AWQ's,
// Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4's and RedHatAI's W4A16 checkpoints (the rest of each
// config.json is Qwen2.5's).
constexpr char kAwqQwen25[] = R"json({
  "bits": 4, "group_size": 128, "modules_to_not_convert": null, "quant_method": "awq",
  "version": "gemm", "zero_point": true})json";

constexpr char kGptqQwen25Int4[] = R"json({
  "bits": 4, "damp_percent": 0.01, "desc_act": false, "group_size": 128,
  "model_file_base_name": null, "model_name_or_path": null, "quant_method": "gptq",
  "static_groups": false, "sym": true, "true_sequential": true})json";

constexpr char kCompressedW4A16[] = R"json({
  "quant_method": "compressed-tensors", "format": "pack-quantized",
  "quantization_status": "compressed", "ignore": ["lm_head"], "kv_cache_scheme": null,
  "config_groups": {"group_0": {
    "targets": ["Linear"], "input_activations": null, "output_activations": null,
    "weights": {"num_bits": 4, "type": "int", "symmetric": true, "strategy": "group",
                "group_size": 128, "dynamic": false, "actorder": null, "observer": "minmax",
                "block_structure": null}}}})json";

// kQwen25_05B with `quantization` (JSON) as its quantization_config, after `edit`.
absl::StatusOr<LlamaConfig> ParseQuantized(
    const char* quantization, const std::function<void(Json&)>& edit = [](Json&) {}) {
  Json j = Json::parse(kQwen25_05B);
  j["quantization_config"] = Json::parse(quantization);
  edit(j["quantization_config"]);
  return ParseLlamaConfig(j.dump(), "config.json");
}

absl::Status QuantizedStatus(const char* quantization, const std::function<void(Json&)>& edit) {
  return ParseQuantized(quantization, edit).status();
}

// The W4A16 scheme's weights object, for edits.
Json& W4A16Weights(Json& q) { return q["config_groups"]["group_0"]["weights"]; }

TEST(QuantizationConfigTest, NoneWhenAbsentOrNull) {
  absl::StatusOr<LlamaConfig> c = ParseLlamaConfig(kQwen25_05B, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->quantization.method, "");
  EXPECT_FALSE(c->quantization.enabled());
  c = ParseQuantized("null");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->quantization.method, "");
  EXPECT_FALSE(c->quantization.enabled());
}

TEST(QuantizationConfigTest, AwqAsQwen25Instruct) {
  absl::StatusOr<LlamaConfig> c = ParseQuantized(kAwqQwen25);
  ASSERT_TRUE(c.ok()) << c.status();
  const CheckpointQuantization& q = c->quantization;
  EXPECT_TRUE(q.enabled());
  EXPECT_EQ(q.method, "awq");
  EXPECT_EQ(q.bits, 4);
  EXPECT_EQ(q.group_size, 128);
  EXPECT_TRUE(q.zero_point);
  EXPECT_FALSE(q.act_order);
  EXPECT_EQ(c->model_type, "qwen2");  // the rest of the config as without it
  EXPECT_EQ(c->hidden_size, 896);
}

TEST(QuantizationConfigTest, AwqOlderAutoAwqKeys) {
  absl::StatusOr<LlamaConfig> c = ParseQuantized(
      R"({"quant_method": "awq", "w_bit": 4, "q_group_size": 64, "zero_point": true,
          "version": "GEMM"})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->quantization.method, "awq");
  EXPECT_EQ(c->quantization.bits, 4);
  EXPECT_EQ(c->quantization.group_size, 64);
  EXPECT_TRUE(c->quantization.zero_point);
  EXPECT_FALSE(c->quantization.act_order);
}

TEST(QuantizationConfigTest, GptqAsQwen25Int4) {
  absl::StatusOr<LlamaConfig> c = ParseQuantized(kGptqQwen25Int4);
  ASSERT_TRUE(c.ok()) << c.status();
  const CheckpointQuantization& q = c->quantization;
  EXPECT_EQ(q.method, "gptq");
  EXPECT_EQ(q.bits, 4);
  EXPECT_EQ(q.group_size, 128);
  EXPECT_FALSE(q.zero_point);  // sym
  EXPECT_FALSE(q.act_order);
  EXPECT_TRUE(q.gptq_v1_zeros);  // no checkpoint_format: AutoGPTQ's v1
}

TEST(QuantizationConfigTest, GptqActOrderPerRowV2AndEightBits) {
  // TheBloke's desc_act checkpoints, with one group per row.
  absl::StatusOr<LlamaConfig> c = ParseQuantized(kGptqQwen25Int4, [](Json& q) {
    q["desc_act"] = true;
    q["group_size"] = -1;
  });
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->quantization.group_size, 0);
  EXPECT_TRUE(c->quantization.act_order);
  // GPTQModel's v2 format stores the zeros as they are.
  c = ParseQuantized(kGptqQwen25Int4, [](Json& q) { q["checkpoint_format"] = "gptq_v2"; });
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->quantization.gptq_v1_zeros);
  c = ParseQuantized(kGptqQwen25Int4, [](Json& q) { q["checkpoint_format"] = "gptq"; });
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->quantization.gptq_v1_zeros);
  c = ParseQuantized(kGptqQwen25Int4, [](Json& q) { q["bits"] = 8; });
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->quantization.bits, 8);
  c = ParseQuantized(kGptqQwen25Int4, [](Json& q) { q["sym"] = false; });
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->quantization.zero_point);
}

TEST(QuantizationConfigTest, CompressedTensorsW4A16) {
  absl::StatusOr<LlamaConfig> c = ParseQuantized(kCompressedW4A16);
  ASSERT_TRUE(c.ok()) << c.status();
  const CheckpointQuantization& q = c->quantization;
  EXPECT_TRUE(q.enabled());
  EXPECT_EQ(q.method, "compressed-tensors");
  EXPECT_EQ(q.bits, 4);
  EXPECT_EQ(q.group_size, 128);
  EXPECT_FALSE(q.zero_point);
  EXPECT_FALSE(q.act_order);
}

TEST(QuantizationConfigTest, CompressedTensorsSchemeVariants) {
  // By channel: one scale per output row.
  absl::StatusOr<LlamaConfig> c = ParseQuantized(kCompressedW4A16, [](Json& q) {
    W4A16Weights(q)["strategy"] = "channel";
    W4A16Weights(q)["group_size"] = nullptr;
  });
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->quantization.group_size, 0);
  c = ParseQuantized(kCompressedW4A16, [](Json& q) { W4A16Weights(q)["actorder"] = "group"; });
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->quantization.act_order);
  c = ParseQuantized(kCompressedW4A16, [](Json& q) { W4A16Weights(q)["actorder"] = "weight"; });
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->quantization.act_order);  // the groups stay contiguous
  c = ParseQuantized(kCompressedW4A16, [](Json& q) { W4A16Weights(q)["symmetric"] = false; });
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->quantization.zero_point);
  // W8A16.
  c = ParseQuantized(kCompressedW4A16, [](Json& q) { W4A16Weights(q)["num_bits"] = 8; });
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->quantization.bits, 8);
  // Two groups of the same scheme (different targets) are one scheme.
  c = ParseQuantized(kCompressedW4A16, [](Json& q) {
    q["config_groups"]["group_1"] = q["config_groups"]["group_0"];
    q["config_groups"]["group_1"]["targets"] = {"re:.*mlp.*"};
  });
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->quantization.bits, 4);
  EXPECT_EQ(c->quantization.group_size, 128);
}

TEST(QuantizationConfigTest, UnsupportedMethodsAreRefusedByName) {
  for (const char* method : {"hqq", "modelopt", "torchao"}) {
    ExpectError(QuantizedStatus(kAwqQwen25, [&](Json& q) { q["quant_method"] = method; }),
                absl::StatusCode::kUnimplemented,
                absl::StrCat("quantization_config.quant_method \"", method, "\""));
  }
  ExpectError(QuantizedStatus(kAwqQwen25, [](Json& q) { q.erase("quant_method"); }),
              absl::StatusCode::kInvalidArgument, "quantization_config.quant_method");
  for (const char* text : {"4", "\"awq\"", "[]"}) {
    ExpectError(QuantizedStatus(text, [](Json&) {}), absl::StatusCode::kInvalidArgument,
                "quantization_config must be an object");
  }
}

TEST(QuantizationConfigTest, AwqRefusalsNameTheKey) {
  ExpectError(QuantizedStatus(kAwqQwen25, [](Json& q) { q["bits"] = 3; }),
              absl::StatusCode::kUnimplemented, "quantization_config.bits (3)");
  for (const char* version : {"gemv", "gemv_fast"}) {
    ExpectError(QuantizedStatus(kAwqQwen25, [&](Json& q) { q["version"] = version; }),
                absl::StatusCode::kUnimplemented,
                absl::StrCat("quantization_config.version \"", version, "\""));
  }
  ExpectError(QuantizedStatus(kAwqQwen25, [](Json& q) { q["zero_point"] = false; }),
              absl::StatusCode::kUnimplemented, "quantization_config.zero_point");
}

TEST(QuantizationConfigTest, GptqRefusalsNameTheKey) {
  ExpectError(QuantizedStatus(kGptqQwen25Int4, [](Json& q) { q["bits"] = 3; }),
              absl::StatusCode::kUnimplemented, "quantization_config.bits (3)");
  ExpectError(QuantizedStatus(kGptqQwen25Int4, [](Json& q) { q["checkpoint_format"] = "marlin"; }),
              absl::StatusCode::kUnimplemented, "quantization_config.checkpoint_format \"marlin\"");
  ExpectError(QuantizedStatus(kGptqQwen25Int4,
                              [](Json& q) {
                                q["dynamic"] = Json::parse(
                                    R"({"-:.*\\.mlp\\..*": {}, "+:.*attn.*": {"bits": 8}})");
                              }),
              absl::StatusCode::kUnimplemented, "quantization_config.dynamic");
  ExpectError(QuantizedStatus(kGptqQwen25Int4, [](Json& q) { q["group_size"] = 0; }),
              absl::StatusCode::kInvalidArgument, "quantization_config.group_size");
}

TEST(QuantizationConfigTest, CompressedTensorsRefusalsNameTheKey) {
  constexpr char kGroup[] = "quantization_config.config_groups.group_0.";
  for (const char* format : {"nvfp4-pack-quantized", "marlin-24", "dense"}) {
    ExpectError(QuantizedStatus(kCompressedW4A16, [&](Json& q) { q["format"] = format; }),
                absl::StatusCode::kUnimplemented, absl::StrCat(kGroup, "format \"", format, "\""));
  }
  ExpectError(
      QuantizedStatus(kCompressedW4A16,
                      [](Json& q) { q["config_groups"]["group_0"]["input_activations"] = "int8"; }),
      absl::StatusCode::kInvalidArgument, absl::StrCat(kGroup, "input_activations"));
  // FP8 weights are stored unpacked (float-quantized), never in int32 words.
  ExpectError(QuantizedStatus(kCompressedW4A16, [](Json& q) { W4A16Weights(q)["type"] = "float"; }),
              absl::StatusCode::kUnimplemented, absl::StrCat(kGroup, "weights.type \"float\""));
  for (const char* strategy : {"tensor", "block"}) {
    ExpectError(
        QuantizedStatus(kCompressedW4A16, [&](Json& q) { W4A16Weights(q)["strategy"] = strategy; }),
        absl::StatusCode::kUnimplemented,
        absl::StrCat(kGroup, "weights.strategy \"", strategy, "\""));
  }
  ExpectError(QuantizedStatus(kCompressedW4A16,
                              [](Json& q) {
                                q["config_groups"]["group_1"] = q["config_groups"]["group_0"];
                                W4A16Weights(q)["num_bits"] = 8;
                              }),
              absl::StatusCode::kUnimplemented, "quantization_config.config_groups");
  ExpectError(
      QuantizedStatus(kCompressedW4A16, [](Json& q) { q["config_groups"] = Json::object(); }),
      absl::StatusCode::kInvalidArgument, "quantization_config.config_groups");
  ExpectError(QuantizedStatus(kCompressedW4A16, [](Json& q) { W4A16Weights(q)["dynamic"] = true; }),
              absl::StatusCode::kUnimplemented, absl::StrCat(kGroup, "weights.dynamic"));
}

// Transformers' FP8 as Qwen/Qwen3-8B-FP8 and deepseek-ai/DeepSeek-V3 save it (128x128 blocks,
// weight_scale_inv), AutoFP8's one scale a tensor (neuralmagic's older FP8 checkpoints, static
// activation scales), and meta-llama/Llama-3.1-405B-Instruct-FP8's fbgemm_fp8 (one a row).
constexpr char kFp8Qwen3[] = R"json({
  "activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
  "weight_block_size": [128, 128]})json";

TEST(QuantizationConfigTest, Fp8BlocksPerTensorAndFbgemm) {
  absl::StatusOr<LlamaConfig> c = ParseQuantized(kFp8Qwen3);
  ASSERT_TRUE(c.ok()) << c.status();
  const CheckpointQuantization* q = &c->quantization;
  EXPECT_EQ(q->method, "fp8");
  EXPECT_TRUE(q->fp8);
  EXPECT_TRUE(q->unpacked);
  EXPECT_EQ(q->bits, 8);
  EXPECT_EQ(q->block_rows, 128);
  EXPECT_EQ(q->group_size, 128);
  EXPECT_EQ(q->scale_suffix, ".weight_scale_inv");
  EXPECT_TRUE(q->activations_quantized);
  EXPECT_EQ(q->Describe(), "fp8 block 128x128");
  c = ParseQuantized(R"json({"quant_method": "fp8", "activation_scheme": "static",
                             "ignored_layers": ["lm_head"]})json");
  ASSERT_TRUE(c.ok()) << c.status();
  q = &c->quantization;
  EXPECT_EQ(q->block_rows, 0);
  EXPECT_EQ(q->group_size, 0);
  EXPECT_EQ(q->scale_suffix, ".weight_scale");
  EXPECT_EQ(q->Describe(), "fp8 per-tensor");
  c = ParseQuantized(R"json({"activation_scale_ub": 1200.0, "quant_method": "fbgemm_fp8",
                             "modules_to_not_convert": ["model.layers.0.mlp.down_proj",
                                                        "lm_head"]})json");
  ASSERT_TRUE(c.ok()) << c.status();
  q = &c->quantization;
  EXPECT_TRUE(q->fp8 && q->unpacked);
  EXPECT_EQ(q->block_rows, 1);
  EXPECT_EQ(q->group_size, 0);
  EXPECT_EQ(q->Describe(), "fbgemm_fp8 per-channel");
}

TEST(QuantizationConfigTest, Fp8RefusalsNameTheKey) {
  ExpectError(QuantizedStatus(kFp8Qwen3, [](Json& q) { q["fmt"] = "e5m2"; }),
              absl::StatusCode::kUnimplemented, "quantization_config.fmt \"e5m2\"");
  ExpectError(QuantizedStatus(kFp8Qwen3, [](Json& q) { q["activation_scheme"] = "weird"; }),
              absl::StatusCode::kInvalidArgument, "quantization_config.activation_scheme");
  for (const char* block : {"[128]", "[128, 0]", "[128, 1.5]", "\"128\""}) {
    ExpectError(
        QuantizedStatus(kFp8Qwen3, [&](Json& q) { q["weight_block_size"] = Json::parse(block); }),
        absl::StatusCode::kInvalidArgument, "quantization_config.weight_block_size");
  }
}

// llm-compressor's unpacked schemes, as RedHatAI's checkpoints save them: FP8 (weights by
// channel or tensor, activations by token or tensor), FP8 blocks, and W8A8 int8.
constexpr char kCompressedFp8[] = R"json({
  "quant_method": "compressed-tensors", "format": "float-quantized",
  "quantization_status": "compressed", "ignore": ["lm_head"], "kv_cache_scheme": null,
  "config_groups": {"group_0": {
    "targets": ["Linear"], "output_activations": null,
    "input_activations": {"num_bits": 8, "type": "float", "symmetric": true, "strategy": "token",
                          "dynamic": true, "observer": null},
    "weights": {"num_bits": 8, "type": "float", "symmetric": true, "strategy": "channel",
                "group_size": null, "dynamic": false, "observer": "minmax",
                "block_structure": null}}}})json";

TEST(QuantizationConfigTest, CompressedTensorsFp8AndInt8) {
  absl::StatusOr<LlamaConfig> c = ParseQuantized(kCompressedFp8);
  ASSERT_TRUE(c.ok()) << c.status();
  const CheckpointQuantization* q = &c->quantization;
  EXPECT_EQ(q->method, "compressed-tensors");
  EXPECT_TRUE(q->fp8 && q->unpacked && q->activations_quantized);
  EXPECT_EQ(q->bits, 8);
  EXPECT_EQ(q->block_rows, 1);
  EXPECT_EQ(q->group_size, 0);
  EXPECT_EQ(q->scale_suffix, ".weight_scale");
  EXPECT_EQ(q->Describe(), "compressed-tensors fp8 per-channel");
  c = ParseQuantized(kCompressedFp8, [](Json& q) { W4A16Weights(q)["strategy"] = "tensor"; });
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->quantization.block_rows, 0);
  EXPECT_EQ(c->quantization.Describe(), "compressed-tensors fp8 per-tensor");
  for (const char* shape : {"[128, 128]", "\"128x128\""}) {
    c = ParseQuantized(kCompressedFp8, [&](Json& q) {
      W4A16Weights(q)["strategy"] = "block";
      W4A16Weights(q)["block_structure"] = Json::parse(shape);
    });
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->quantization.Describe(), "compressed-tensors fp8 block 128x128") << shape;
  }
  // W8A8 int8 (format int-quantized; naive-quantized stores alike), without activations too.
  c = ParseQuantized(kCompressedFp8, [](Json& q) {
    q["format"] = "int-quantized";
    W4A16Weights(q)["type"] = "int";
    q["config_groups"]["group_0"]["input_activations"] = nullptr;
  });
  ASSERT_TRUE(c.ok()) << c.status();
  q = &c->quantization;
  EXPECT_FALSE(q->fp8);
  EXPECT_TRUE(q->unpacked);
  EXPECT_FALSE(q->activations_quantized);
  EXPECT_EQ(q->Describe(), "compressed-tensors 8-bit per-channel");
  c = ParseQuantized(kCompressedFp8, [](Json& q) {
    q["format"] = "naive-quantized";
    W4A16Weights(q)["type"] = "int";
    W4A16Weights(q)["strategy"] = "group";
    W4A16Weights(q)["group_size"] = 64;
  });
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->quantization.Describe(), "compressed-tensors 8-bit g64");
  // W4A8 (pack-quantized int4 weights, int8 activations): the weights as W4A16's.
  c = ParseQuantized(kCompressedW4A16, [](Json& q) {
    q["config_groups"]["group_0"]["input_activations"] = Json::parse(
        R"({"num_bits": 8, "type": "int", "symmetric": true, "strategy": "token",
            "dynamic": true})");
  });
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->quantization.activations_quantized);
  EXPECT_FALSE(c->quantization.unpacked);
}

TEST(QuantizationConfigTest, CompressedTensorsUnpackedRefusalsNameTheKey) {
  constexpr char kWeights[] = "quantization_config.config_groups.group_0.weights.";
  ExpectError(QuantizedStatus(kCompressedFp8, [](Json& q) { W4A16Weights(q)["num_bits"] = 4; }),
              absl::StatusCode::kUnimplemented, absl::StrCat(kWeights, "num_bits (4)"));
  ExpectError(
      QuantizedStatus(kCompressedFp8, [](Json& q) { W4A16Weights(q)["symmetric"] = false; }),
      absl::StatusCode::kUnimplemented, absl::StrCat(kWeights, "symmetric"));
  ExpectError(
      QuantizedStatus(kCompressedFp8, [](Json& q) { W4A16Weights(q)["actorder"] = "group"; }),
      absl::StatusCode::kUnimplemented, absl::StrCat(kWeights, "actorder"));
  ExpectError(QuantizedStatus(kCompressedFp8,
                              [](Json& q) {
                                W4A16Weights(q)["strategy"] = "block";
                                W4A16Weights(q)["block_structure"] = "128by128";
                              }),
              absl::StatusCode::kInvalidArgument, absl::StrCat(kWeights, "block_structure"));
  ExpectError(
      QuantizedStatus(kCompressedFp8, [](Json& q) { W4A16Weights(q)["strategy"] = "token"; }),
      absl::StatusCode::kUnimplemented, absl::StrCat(kWeights, "strategy \"token\""));
  // Tensor and block scales are for unpacked weights only.
  ExpectError(
      QuantizedStatus(kCompressedW4A16, [](Json& q) { W4A16Weights(q)["strategy"] = "tensor"; }),
      absl::StatusCode::kUnimplemented, absl::StrCat(kWeights, "strategy \"tensor\""));
  // Groups of two schemes (FP8 attention, int8 MLP) are refused.
  ExpectError(QuantizedStatus(kCompressedFp8,
                              [](Json& q) {
                                q["config_groups"]["group_1"] = q["config_groups"]["group_0"];
                                q["config_groups"]["group_1"]["weights"]["type"] = "int";
                                q["config_groups"]["group_1"]["format"] = "int-quantized";
                              }),
              absl::StatusCode::kUnimplemented, "quantization_config.config_groups");
}

// bitsandbytes as Transformers saves it: unsloth's -bnb-4bit repositories (NF4, double
// quantization), FP4 (BitsAndBytesConfig's default type) and LLM.int8().
constexpr char kBnbNf4[] = R"json({
  "_load_in_4bit": true, "_load_in_8bit": false, "bnb_4bit_compute_dtype": "bfloat16",
  "bnb_4bit_quant_storage": "uint8", "bnb_4bit_quant_type": "nf4",
  "bnb_4bit_use_double_quant": true, "llm_int8_enable_fp32_cpu_offload": false,
  "llm_int8_has_fp16_weight": false, "llm_int8_skip_modules": ["lm_head"],
  "llm_int8_threshold": 6.0, "load_in_4bit": true, "load_in_8bit": false,
  "quant_method": "bitsandbytes"})json";

TEST(QuantizationConfigTest, BitsAndBytes) {
  absl::StatusOr<LlamaConfig> c = ParseQuantized(kBnbNf4);
  ASSERT_TRUE(c.ok()) << c.status();
  const CheckpointQuantization* q = &c->quantization;
  EXPECT_EQ(q->method, "bitsandbytes");
  EXPECT_EQ(q->bnb_4bit_type, "nf4");
  EXPECT_EQ(q->bits, 4);
  EXPECT_TRUE(q->unpacked);
  EXPECT_TRUE(q->NonIntegerValues());
  EXPECT_EQ(q->Describe(), "bitsandbytes nf4");
  c = ParseQuantized(kBnbNf4, [](Json& q) { q.erase("bnb_4bit_quant_type"); });
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->quantization.Describe(), "bitsandbytes fp4");
  c = ParseQuantized(R"json({"quant_method": "bitsandbytes", "load_in_8bit": true,
                             "llm_int8_threshold": 6.0})json");
  ASSERT_TRUE(c.ok()) << c.status();
  q = &c->quantization;
  EXPECT_EQ(q->bits, 8);
  EXPECT_TRUE(q->bnb_4bit_type.empty());
  EXPECT_FALSE(q->NonIntegerValues());
  EXPECT_EQ(q->scale_suffix, ".SCB");
  EXPECT_FLOAT_EQ(q->scale_multiplier, 1.0f / 127);
  EXPECT_EQ(q->Describe(), "bitsandbytes 8-bit per-channel");
}

TEST(QuantizationConfigTest, BitsAndBytesRefusalsNameTheKey) {
  ExpectError(QuantizedStatus(kBnbNf4, [](Json& q) { q["load_in_8bit"] = true; }),
              absl::StatusCode::kInvalidArgument, "quantization_config.load_in_4bit");
  ExpectError(QuantizedStatus(kBnbNf4, [](Json& q) { q["load_in_4bit"] = false; }),
              absl::StatusCode::kInvalidArgument, "exactly one must be true");
  ExpectError(QuantizedStatus(kBnbNf4, [](Json& q) { q["bnb_4bit_quant_type"] = "int4"; }),
              absl::StatusCode::kUnimplemented, "quantization_config.bnb_4bit_quant_type \"int4\"");
  ExpectError(QuantizedStatus(kBnbNf4, [](Json& q) { q["bnb_4bit_quant_storage"] = "bfloat16"; }),
              absl::StatusCode::kUnimplemented, "quantization_config.bnb_4bit_quant_storage");
}

}  // namespace
}  // namespace kvrm
