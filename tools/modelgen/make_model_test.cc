// End-to-end checks of make_model's output with the project's own loaders: determinism, config,
// tensor names/shapes/dtypes, the tokenizer, and that the random model is a non-degenerate
// language model (checked with a small f32 reference forward pass over the tiny model).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/json.h"
#include "gtest/gtest.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "model/tokenizer.h"
#include "tools/modelgen/hf_config.h"
#include "tools/modelgen/model_spec.h"
#include "tools/modelgen/model_writer.h"
#include "tools/modelgen/quantized_writer.h"
#include "tools/modelgen/tokenizer_json.h"

namespace kvrm::modelgen {
namespace {

namespace fs = std::filesystem;

std::string TmpDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  return (fs::path(base != nullptr ? base : "/tmp") / name).string();
}

std::string MakeSized(const std::string& size, const std::string& name, DType dtype) {
  MakeModelOptions options;
  options.size = size;
  options.out_dir = TmpDir(name);
  options.dtype = dtype;
  auto summary = MakeModel(options);
  EXPECT_TRUE(summary.ok()) << summary.status();
  return options.out_dir;
}

std::string MakeTiny(const std::string& name, DType dtype, int shards = 1, uint64_t seed = 0,
                     int threads = 2) {
  MakeModelOptions options;
  options.size = "tiny";
  options.out_dir = TmpDir(name);
  options.dtype = dtype;
  options.shards = shards;
  options.seed = seed;
  options.threads = threads;
  auto summary = MakeModel(options);
  EXPECT_TRUE(summary.ok()) << summary.status();
  return options.out_dir;
}

std::vector<std::string> SortedFiles(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

void ExpectSameFiles(const std::string& a, const std::string& b) {
  const std::vector<std::string> names = SortedFiles(a);
  ASSERT_EQ(names, SortedFiles(b));
  for (const std::string& n : names) {
    auto x = ReadFileToString(a + "/" + n);
    auto y = ReadFileToString(b + "/" + n);
    ASSERT_TRUE(x.ok() && y.ok());
    EXPECT_TRUE(*x == *y) << n << " differs between " << a << " and " << b;
  }
}

TEST(MakeModelTest, OutputIsByteIdenticalAcrossRunsAndThreadCounts) {
  const std::string a = MakeTiny("det_a", DType::kBF16, 1, 0, /*threads=*/2);
  const std::string b = MakeTiny("det_b", DType::kBF16, 1, 0, /*threads=*/1);
  EXPECT_EQ(SortedFiles(a),
            (std::vector<std::string>{"config.json", "generation_config.json", "model.safetensors",
                                      "tokenizer.json", "tokenizer_config.json"}));
  ExpectSameFiles(a, b);
  // A different seed changes the weights and the tokenizer.
  const std::string c = MakeTiny("det_c", DType::kBF16, 1, /*seed=*/1);
  EXPECT_NE(*ReadFileToString(a + "/model.safetensors"),
            *ReadFileToString(c + "/model.safetensors"));
  EXPECT_NE(*ReadFileToString(a + "/tokenizer.json"), *ReadFileToString(c + "/tokenizer.json"));
}

TEST(MakeModelTest, RegeneratingReplacesTheEarlierModelWhole) {
  // Two shards, then one file of another seed into the same directory: the shards and their
  // index go, so no loader can pick the old weights with the new config and tokenizer.
  const std::string dir = MakeTiny("regen", DType::kBF16, /*shards=*/2, /*seed=*/0);
  EXPECT_TRUE(fs::exists(dir + "/model.safetensors.index.json"));
  MakeTiny("regen", DType::kF16, /*shards=*/1, /*seed=*/7);
  const std::string fresh = MakeTiny("regen_fresh", DType::kF16, 1, 7);
  ExpectSameFiles(dir, fresh);  // the same file list too: nothing left over, no temporaries
}

TEST(MakeModelTest, BinaryMatchesLibrary) {
  const std::string lib = MakeTiny("lib_f16", DType::kF16, 1, 3);
  const std::string bin = TmpDir("bin_f16");
  const std::string cmd = absl::StrCat("tools/modelgen/make_model --size=tiny --dtype=f16 --seed=3",
                                       " --out=", bin, " > /dev/null");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  ExpectSameFiles(lib, bin);
  EXPECT_NE(std::system("tools/modelgen/make_model --size=huge --out=/dev/null 2>/dev/null"), 0);
}

TEST(MakeModelTest, ConfigLoadsWithTinyValues) {
  const std::string dir = MakeTiny("config", DType::kBF16);
  auto config = LoadLlamaConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->model_type, "llama");
  EXPECT_EQ(config->vocab_size, 1024);
  EXPECT_EQ(config->hidden_size, 128);
  EXPECT_EQ(config->intermediate_size, 352);
  EXPECT_EQ(config->num_hidden_layers, 4);
  EXPECT_EQ(config->num_attention_heads, 4);
  EXPECT_EQ(config->num_key_value_heads, 2);
  EXPECT_EQ(config->head_dim, 32);
  EXPECT_EQ(config->max_position_embeddings, 512);
  EXPECT_DOUBLE_EQ(config->rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(config->rope_theta, 10000);
  EXPECT_EQ(config->rope_scaling.type, "llama3");
  EXPECT_DOUBLE_EQ(config->rope_scaling.factor, 8);
  EXPECT_DOUBLE_EQ(config->rope_scaling.low_freq_factor, 1);
  EXPECT_DOUBLE_EQ(config->rope_scaling.high_freq_factor, 4);
  EXPECT_EQ(config->rope_scaling.original_max_position_embeddings, 128);
  EXPECT_TRUE(config->tie_word_embeddings);
  EXPECT_EQ(config->bos_token_id, 1020);
  EXPECT_EQ(config->eos_token_ids, (std::vector<int32_t>{1021, 1022}));
  EXPECT_EQ(config->torch_dtype, "bfloat16");

  auto raw = ReadJsonFile(dir + "/config.json");
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ((*raw)["architectures"], Json::array({"LlamaForCausalLM"}));
  EXPECT_EQ((*raw)["hidden_act"], "silu");
  auto tok_config = ReadJsonFile(dir + "/tokenizer_config.json");
  ASSERT_TRUE(tok_config.ok());
  EXPECT_EQ((*tok_config)["tokenizer_class"], "PreTrainedTokenizerFast");
  EXPECT_EQ((*tok_config)["bos_token"], "<|begin_of_text|>");
  EXPECT_EQ((*tok_config)["eos_token"], "<|end_of_text|>");
  EXPECT_EQ((*tok_config)["chat_template"], std::string(kChatTemplate));
}

// A directory written before the chat template existed gets it, and nothing else changes.
TEST(MakeModelTest, UpgradeAddsTheChatTemplateToAnOlderDirectoryOnce) {
  const std::string dir = MakeTiny("upgrade", DType::kBF16);
  const std::string path = dir + "/tokenizer_config.json";
  auto current = ReadJsonFile(path);
  ASSERT_TRUE(current.ok());
  EXPECT_FALSE(*UpgradeModelDir(dir)) << "a current directory is left as it is";
  Json old = *current;
  old.erase("chat_template");
  std::ofstream(path) << old.dump(2);
  absl::StatusOr<bool> upgraded = UpgradeModelDir(dir);
  ASSERT_TRUE(upgraded.ok()) << upgraded.status();
  EXPECT_TRUE(*upgraded);
  auto after = ReadJsonFile(path);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(*after, *current);
  EXPECT_FALSE(*UpgradeModelDir(dir));
  // The template from before tools is replaced; any other is someone's choice and stays.
  Json v1 = *current;
  v1["chat_template"] = std::string(kChatTemplateV1);
  std::ofstream(path) << v1.dump(2);
  ASSERT_TRUE(*UpgradeModelDir(dir));
  EXPECT_EQ(*ReadJsonFile(path), *current);
  Json custom = *current;
  custom["chat_template"] = "{{ messages[0]['content'] }}";
  std::ofstream(path) << custom.dump(2);
  EXPECT_FALSE(*UpgradeModelDir(dir));
  EXPECT_EQ(*ReadJsonFile(path), custom);
  std::ofstream(path) << "[1, 2]";
  EXPECT_FALSE(UpgradeModelDir(dir).ok());
}

struct Expected {
  std::string name;
  std::vector<int64_t> shape;
};

std::vector<Expected> ExpectedTensors(const ModelSpec& s) {
  const int64_t d = s.hidden_size, hd = s.head_dim, ffn = s.intermediate_size;
  std::vector<Expected> out = {{"model.embed_tokens.weight", {s.vocab_size, d}},
                               {"model.norm.weight", {d}}};
  for (int i = 0; i < s.num_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    out.push_back({p + "input_layernorm.weight", {d}});
    out.push_back({p + "post_attention_layernorm.weight", {d}});
    out.push_back({p + "self_attn.q_proj.weight", {s.num_heads * hd, d}});
    out.push_back({p + "self_attn.k_proj.weight", {s.num_kv_heads * hd, d}});
    out.push_back({p + "self_attn.v_proj.weight", {s.num_kv_heads * hd, d}});
    out.push_back({p + "self_attn.o_proj.weight", {d, s.num_heads * hd}});
    if (s.qkv_bias()) {
      out.push_back({p + "self_attn.q_proj.bias", {s.num_heads * hd}});
      out.push_back({p + "self_attn.k_proj.bias", {s.num_kv_heads * hd}});
      out.push_back({p + "self_attn.v_proj.bias", {s.num_kv_heads * hd}});
    }
    if (s.o_bias()) out.push_back({p + "self_attn.o_proj.bias", {d}});
    if (s.gpt_oss()) out.push_back({p + "self_attn.sinks", {s.num_heads}});
    if (s.qk_norm()) {
      out.push_back({p + "self_attn.q_norm.weight", {hd}});
      out.push_back({p + "self_attn.k_norm.weight", {hd}});
    }
    if (s.sandwich_norms()) {
      out.push_back({p + "pre_feedforward_layernorm.weight", {d}});
      out.push_back({p + "post_feedforward_layernorm.weight", {d}});
    }
    if (s.IsMoeLayer(i) && s.gpt_oss()) {
      const int64_t experts = s.num_experts, expert_ffn = s.moe_intermediate_size;
      out.push_back({p + "mlp.router.weight", {experts, d}});
      out.push_back({p + "mlp.router.bias", {experts}});
      out.push_back({p + "mlp.experts.gate_up_proj", {experts, d, 2 * expert_ffn}});
      out.push_back({p + "mlp.experts.gate_up_proj_bias", {experts, 2 * expert_ffn}});
      out.push_back({p + "mlp.experts.down_proj", {experts, expert_ffn, d}});
      out.push_back({p + "mlp.experts.down_proj_bias", {experts, d}});
      continue;
    }
    if (s.IsMoeLayer(i)) {
      const int64_t experts = s.num_experts, expert_ffn = s.moe_intermediate_size;
      const bool m = s.mixtral();
      const std::string moe = p + (m ? "block_sparse_moe." : "mlp.");
      out.push_back({moe + "gate.weight", {experts, d}});
      for (int64_t e = 0; e < experts; ++e) {
        const std::string x = absl::StrCat(moe, "experts.", e, ".");
        out.push_back({x + (m ? "w1" : "gate_proj") + ".weight", {expert_ffn, d}});
        out.push_back({x + (m ? "w3" : "up_proj") + ".weight", {expert_ffn, d}});
        out.push_back({x + (m ? "w2" : "down_proj") + ".weight", {d, expert_ffn}});
      }
      if (const int64_t shared = s.shared_expert_intermediate_size; shared > 0) {
        out.push_back({moe + "shared_expert.gate_proj.weight", {shared, d}});
        out.push_back({moe + "shared_expert.up_proj.weight", {shared, d}});
        out.push_back({moe + "shared_expert.down_proj.weight", {d, shared}});
        out.push_back({moe + "shared_expert_gate.weight", {1, d}});
      }
      continue;
    }
    out.push_back({p + "mlp.gate_proj.weight", {ffn, d}});
    out.push_back({p + "mlp.up_proj.weight", {ffn, d}});
    out.push_back({p + "mlp.down_proj.weight", {d, ffn}});
  }
  if (!s.tie_word_embeddings) out.push_back({"lm_head.weight", {s.vocab_size, d}});
  return out;
}

void ExpectTensors(const std::string& dir, DType dtype) {
  const ModelSpec spec = *FindModelSpec("tiny");
  auto set = SafetensorsSet::OpenDirectory(dir);
  ASSERT_TRUE(set.ok()) << set.status();
  const std::vector<Expected> expected = ExpectedTensors(spec);
  EXPECT_EQ(set->get()->TensorNames().size(), expected.size());
  int64_t params = 0;
  for (const Expected& e : expected) {
    auto t = (*set)->Get(e.name, e.shape);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->dtype, dtype) << e.name;
    params += t->numel();
  }
  EXPECT_EQ(params, spec.NumParameters());
  EXPECT_FALSE((*set)->Get("lm_head.weight").ok()) << "tiny ties lm_head to embed_tokens";
}

TEST(MakeModelTest, TensorsHaveHfNamesShapesAndDtype) {
  ExpectTensors(MakeTiny("tensors_bf16", DType::kBF16), DType::kBF16);
  const std::string sharded = MakeTiny("tensors_f32_sharded", DType::kF32, /*shards=*/3);
  EXPECT_TRUE(fs::exists(sharded + "/model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(sharded + "/model.safetensors"));
  ExpectTensors(sharded, DType::kF32);
}

// The Gemma 2 / Gemma 3 / sliding-window Mistral shapes: config.json as BuildConfigJson writes
// it reads back (model/config.cc) as the architecture the spec means.
TEST(MakeModelTest, GemmaAndMistralConfigsParseIntoTheirFeatures) {
  const SpecialIds ids{.bos = 1020, .eos = {1021, 1022}, .pad = 1023};
  const auto parse = [&](std::string_view size) {
    const ModelSpec spec = *FindModelSpec(size);
    const std::string json = BuildConfigJson(spec, DType::kBF16, ids);
    absl::StatusOr<LlamaConfig> c = ParseLlamaConfig(json, size);
    EXPECT_TRUE(c.ok()) << c.status() << "\n" << json;
    return c.ok() ? *c : LlamaConfig{};
  };
  const std::vector<bool> even_slide = {true, false, true, false};

  const LlamaConfig g2 = parse("tiny-gemma2");
  EXPECT_EQ(g2.model_type, "gemma2");
  EXPECT_EQ(g2.hidden_size, 128);
  EXPECT_EQ(g2.num_hidden_layers, 4);
  EXPECT_EQ(g2.num_attention_heads, 4);
  EXPECT_EQ(g2.num_key_value_heads, 2);
  EXPECT_EQ(g2.head_dim, 64);
  EXPECT_EQ(g2.max_position_embeddings, 512);
  EXPECT_DOUBLE_EQ(g2.rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(g2.rope_theta, 10000);
  EXPECT_EQ(g2.rope_scaling.type, "");
  EXPECT_DOUBLE_EQ(g2.rope_local_theta, 0);
  EXPECT_TRUE(g2.tie_word_embeddings);
  EXPECT_EQ(g2.sliding_window, 48);
  EXPECT_EQ(g2.sliding_layers, even_slide);
  EXPECT_DOUBLE_EQ(g2.attn_logit_softcapping, 2.0);
  EXPECT_DOUBLE_EQ(g2.final_logit_softcapping, 5.0);
  EXPECT_DOUBLE_EQ(g2.norm_weight_offset, 1);
  EXPECT_TRUE(g2.sandwich_norms);
  EXPECT_FALSE(g2.qk_norm);
  EXPECT_FALSE(g2.qkv_bias);
  EXPECT_FALSE(g2.o_bias);
  EXPECT_FALSE(g2.fused_projections);
  EXPECT_DOUBLE_EQ(g2.attention_scale, 1 / std::sqrt(96.0));
  EXPECT_EQ(g2.hidden_act, "gelu_pytorch_tanh");
  EXPECT_TRUE(g2.gelu_tanh());
  EXPECT_DOUBLE_EQ(g2.embedding_multiplier, 11.3125);  // sqrt(128) = 11.31 in bfloat16
  EXPECT_EQ(g2.SlidingWindowOf(0), 48);
  EXPECT_EQ(g2.SlidingWindowOf(1), 0);

  const LlamaConfig g3 = parse("tiny-gemma3");
  EXPECT_EQ(g3.model_type, "gemma3_text");
  EXPECT_FALSE(g3.multimodal_wrapper);
  EXPECT_EQ(g3.head_dim, 64);
  EXPECT_DOUBLE_EQ(g3.rope_theta, 1000000);
  EXPECT_DOUBLE_EQ(g3.rope_local_theta, 10000);
  EXPECT_EQ(g3.rope_scaling.type, "linear");
  EXPECT_DOUBLE_EQ(g3.rope_scaling.factor, 4);
  EXPECT_EQ(LocalRopeConfig(g3).rope_scaling.type, "");
  EXPECT_DOUBLE_EQ(LocalRopeConfig(g3).rope_theta, 10000);
  EXPECT_EQ(g3.sliding_window, 48);
  EXPECT_EQ(g3.sliding_layers, even_slide);
  EXPECT_DOUBLE_EQ(g3.attn_logit_softcapping, 0);
  EXPECT_DOUBLE_EQ(g3.final_logit_softcapping, 0);
  EXPECT_DOUBLE_EQ(g3.norm_weight_offset, 1);
  EXPECT_TRUE(g3.sandwich_norms);
  EXPECT_TRUE(g3.qk_norm);
  EXPECT_DOUBLE_EQ(g3.attention_scale, 1 / std::sqrt(64.0));
  EXPECT_EQ(g3.hidden_act, "gelu_pytorch_tanh");
  EXPECT_TRUE(g3.tie_word_embeddings);

  const LlamaConfig m = parse("tiny-mistral-sw");
  EXPECT_EQ(m.model_type, "mistral");
  EXPECT_EQ(m.head_dim, 32);
  EXPECT_EQ(m.rope_scaling.type, "");
  EXPECT_EQ(m.sliding_window, 48);
  EXPECT_EQ(m.sliding_layers, std::vector<bool>(4, true));
  EXPECT_DOUBLE_EQ(m.norm_weight_offset, 0);
  EXPECT_FALSE(m.sandwich_norms);
  EXPECT_FALSE(m.qk_norm);
  EXPECT_FALSE(m.qkv_bias);
  EXPECT_DOUBLE_EQ(m.attention_scale, 0);
  EXPECT_DOUBLE_EQ(m.attn_logit_softcapping, 0);
  EXPECT_DOUBLE_EQ(m.final_logit_softcapping, 0);
  EXPECT_EQ(m.hidden_act, "silu");

  // The keys as the models' own files have them.
  const Json g2_json =
      *ParseJson(BuildConfigJson(*FindModelSpec("tiny-gemma2"), DType::kBF16, ids), "gemma2");
  EXPECT_EQ(g2_json["architectures"], Json::array({"Gemma2ForCausalLM"}));
  EXPECT_EQ(g2_json["hidden_activation"], "gelu_pytorch_tanh");
  EXPECT_EQ(g2_json["hidden_act"], "gelu_pytorch_tanh");
  EXPECT_EQ(g2_json["query_pre_attn_scalar"], 96);
  EXPECT_TRUE(g2_json["query_pre_attn_scalar"].is_number_integer());
  EXPECT_EQ(g2_json["layer_types"], Json::array({"sliding_attention", "full_attention",
                                                 "sliding_attention", "full_attention"}));
  EXPECT_FALSE(g2_json.contains("mlp_bias"));
  EXPECT_EQ(g2_json["attention_bias"], false);
  const Json g3_json =
      *ParseJson(BuildConfigJson(*FindModelSpec("tiny-gemma3"), DType::kBF16, ids), "gemma3");
  EXPECT_EQ(g3_json["architectures"], Json::array({"Gemma3ForCausalLM"}));
  EXPECT_TRUE(g3_json.contains("attn_logit_softcapping") &&
              g3_json["attn_logit_softcapping"].is_null());
  EXPECT_TRUE(g3_json.contains("final_logit_softcapping") &&
              g3_json["final_logit_softcapping"].is_null());
  EXPECT_EQ(g3_json["sliding_window_pattern"], 2);
  EXPECT_EQ(g3_json["layer_types"], g2_json["layer_types"]);
  EXPECT_EQ(g3_json["rope_scaling"], Json({{"factor", 4.0}, {"rope_type", "linear"}}));
  const Json m_json =
      *ParseJson(BuildConfigJson(*FindModelSpec("tiny-mistral-sw"), DType::kBF16, ids), "mistral");
  EXPECT_EQ(m_json["architectures"], Json::array({"MistralForCausalLM"}));
  EXPECT_FALSE(m_json.contains("rope_scaling"));
  EXPECT_FALSE(m_json.contains("attention_bias"));
  EXPECT_FALSE(m_json.contains("layer_types"));
}

// The new shapes on disk: a model directory that loads, with every tensor (the Gemma sandwich
// norms and Gemma 3's Q/K norms included) counted by NumParameters, and Gemma's norm weights
// stored as w - 1 (around 0).
TEST(MakeModelTest, GemmaAndMistralModelsHaveTheirTensors) {
  for (const std::string size : {"tiny-gemma2", "tiny-gemma3", "tiny-mistral-sw"}) {
    SCOPED_TRACE(size);
    const ModelSpec spec = *FindModelSpec(size);
    const std::string dir = MakeSized(size, size + "_f32", DType::kF32);
    EXPECT_EQ(SortedFiles(dir), (std::vector<std::string>{"config.json", "generation_config.json",
                                                          "model.safetensors", "tokenizer.json",
                                                          "tokenizer_config.json"}));
    auto config = LoadLlamaConfig(dir);
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->model_type, spec.model_type);
    auto set = SafetensorsSet::OpenDirectory(dir);
    ASSERT_TRUE(set.ok()) << set.status();
    const std::vector<Expected> expected = ExpectedTensors(spec);
    EXPECT_EQ((*set)->TensorNames().size(), expected.size());
    int64_t params = 0;
    for (const Expected& e : expected) {
      auto t = (*set)->Get(e.name, e.shape);
      ASSERT_TRUE(t.ok()) << t.status();
      params += t->numel();
      if (e.shape.size() != 1) continue;  // a norm weight
      const float* v = reinterpret_cast<const float*>(t->data);
      double mean = 0;
      for (int64_t i = 0; i < t->numel(); ++i) mean += v[i];
      mean /= static_cast<double>(t->numel());
      const bool post_norm = absl::StrContains(e.name, "post_attention_layernorm") ||
                             absl::StrContains(e.name, "post_feedforward_layernorm");
      EXPECT_NEAR(mean, !spec.gemma() ? 1.0 : post_norm ? 3.0 : 0.0, 0.06) << e.name;
    }
    EXPECT_EQ(params, spec.NumParameters());
  }
  EXPECT_EQ(FindModelSpec("tiny-gemma3")->NumParameters(),
            FindModelSpec("tiny-gemma2")->NumParameters() + 4 * 2 * 64);
}

// The mixtures of experts' config.json: their Transformers config classes' keys, read back by
// model/config.cc as the experts and MoE layers the spec means.
TEST(MakeModelTest, MoeConfigsHaveTheirKeysAndParse) {
  const SpecialIds ids{.bos = 1020, .eos = {1021, 1022}, .pad = 1023};
  const ModelSpec mixtral_spec = *FindModelSpec("tiny-mixtral");
  const ModelSpec qwen_spec = *FindModelSpec("tiny-qwen3-moe");
  EXPECT_EQ(std::vector<bool>({mixtral_spec.IsMoeLayer(0), mixtral_spec.IsMoeLayer(1),
                               mixtral_spec.IsMoeLayer(2), mixtral_spec.IsMoeLayer(3)}),
            std::vector<bool>(4, true));
  EXPECT_EQ(std::vector<bool>({qwen_spec.IsMoeLayer(0), qwen_spec.IsMoeLayer(1),
                               qwen_spec.IsMoeLayer(2), qwen_spec.IsMoeLayer(3)}),
            (std::vector<bool>{true, true, true, false}));
  ModelSpec every_other = qwen_spec;
  every_other.decoder_sparse_step = 2;
  every_other.mlp_only_layers.clear();
  EXPECT_FALSE(every_other.IsMoeLayer(0));
  EXPECT_TRUE(every_other.IsMoeLayer(1));
  EXPECT_FALSE(FindModelSpec("tiny-qwen3")->IsMoeLayer(0));

  const std::string mixtral_text = BuildConfigJson(mixtral_spec, DType::kBF16, ids);
  const Json mixtral = *ParseJson(mixtral_text, "mixtral");
  EXPECT_EQ(mixtral["architectures"], Json::array({"MixtralForCausalLM"}));
  EXPECT_EQ(mixtral["model_type"], "mixtral");
  EXPECT_EQ(mixtral["num_local_experts"], 4);
  EXPECT_EQ(mixtral["num_experts_per_tok"], 2);
  EXPECT_EQ(mixtral["intermediate_size"], 352);
  EXPECT_EQ(mixtral["router_aux_loss_coef"], 0.02);
  EXPECT_EQ(mixtral["router_jitter_noise"], 0.0);
  EXPECT_EQ(mixtral["output_router_logits"], false);
  EXPECT_TRUE(mixtral.contains("sliding_window") && mixtral["sliding_window"].is_null());
  EXPECT_EQ(mixtral["rope_theta"], 1e6);
  // MixtralConfig has none of these (nor Qwen3-MoE's names for the expert fields).
  for (const char* key : {"rope_scaling", "attention_bias", "mlp_bias", "pretraining_tp",
                          "num_experts", "moe_intermediate_size", "norm_topk_prob",
                          "decoder_sparse_step", "mlp_only_layers", "use_sliding_window"}) {
    EXPECT_FALSE(mixtral.contains(key)) << key;
  }

  const std::string qwen_text = BuildConfigJson(qwen_spec, DType::kBF16, ids);
  const Json qwen = *ParseJson(qwen_text, "qwen3_moe");
  EXPECT_EQ(qwen["architectures"], Json::array({"Qwen3MoeForCausalLM"}));
  EXPECT_EQ(qwen["model_type"], "qwen3_moe");
  EXPECT_EQ(qwen["num_experts"], 8);
  EXPECT_EQ(qwen["num_experts_per_tok"], 3);
  EXPECT_EQ(qwen["moe_intermediate_size"], 96);
  EXPECT_EQ(qwen["intermediate_size"], 352);
  EXPECT_EQ(qwen["norm_topk_prob"], false);
  EXPECT_EQ(qwen["decoder_sparse_step"], 1);
  EXPECT_EQ(qwen["mlp_only_layers"], Json::array({3}));
  EXPECT_EQ(qwen["router_aux_loss_coef"], 0.001);
  EXPECT_EQ(qwen["output_router_logits"], false);
  EXPECT_EQ(qwen["use_sliding_window"], false);
  EXPECT_EQ(qwen["head_dim"], 64);
  EXPECT_EQ(qwen["rope_theta"], 1e6);
  EXPECT_EQ(qwen["rms_norm_eps"], 1e-6);
  EXPECT_EQ(qwen["attention_bias"], false);
  EXPECT_FALSE(qwen.contains("num_local_experts"));
  EXPECT_FALSE(qwen.contains("mlp_bias"));

  absl::StatusOr<LlamaConfig> m = ParseLlamaConfig(mixtral_text, "tiny-mixtral");
  ASSERT_TRUE(m.ok()) << m.status() << "\n" << mixtral_text;
  EXPECT_EQ(m->model_type, "mixtral");
  EXPECT_EQ(m->num_experts, 4);
  EXPECT_EQ(m->num_experts_per_tok, 2);
  EXPECT_EQ(m->moe_intermediate_size, 352);
  EXPECT_TRUE(m->norm_topk_prob);
  EXPECT_EQ(m->moe_layers, std::vector<bool>(4, true));
  EXPECT_EQ(m->head_dim, 32);
  EXPECT_FALSE(m->qk_norm);
  EXPECT_FALSE(m->qkv_bias);
  EXPECT_EQ(m->rope_scaling.type, "");
  EXPECT_EQ(m->sliding_window, 0);

  absl::StatusOr<LlamaConfig> q = ParseLlamaConfig(qwen_text, "tiny-qwen3-moe");
  ASSERT_TRUE(q.ok()) << q.status() << "\n" << qwen_text;
  EXPECT_EQ(q->model_type, "qwen3_moe");
  EXPECT_EQ(q->num_experts, 8);
  EXPECT_EQ(q->num_experts_per_tok, 3);
  EXPECT_EQ(q->moe_intermediate_size, 96);
  EXPECT_EQ(q->intermediate_size, 352);
  EXPECT_FALSE(q->norm_topk_prob);
  EXPECT_EQ(q->moe_layers, (std::vector<bool>{true, true, true, false}));
  EXPECT_EQ(q->head_dim, 64);
  EXPECT_TRUE(q->qk_norm);
  EXPECT_FALSE(q->qkv_bias);
  EXPECT_EQ(q->sliding_window, 0);
  EXPECT_EQ(q->shared_expert_intermediate_size, 0);
}

// Qwen2-MoE's config.json: Qwen2MoeConfig's keys (Qwen2's, with the Q/K/V biases implied by the
// architecture rather than an attention_bias key, plus the experts' and the shared expert's),
// read back as every layer a MoE layer with a shared expert of 192.
TEST(MakeModelTest, Qwen2MoeConfigHasItsKeysAndParses) {
  const SpecialIds ids{.bos = 1020, .eos = {1021, 1022}, .pad = 1023};
  const ModelSpec spec = *FindModelSpec("tiny-qwen2-moe");
  for (int i = 0; i < spec.num_layers; ++i) EXPECT_TRUE(spec.IsMoeLayer(i)) << i;
  EXPECT_TRUE(spec.qkv_bias());
  EXPECT_FALSE(spec.o_bias());
  EXPECT_FALSE(spec.qk_norm());
  EXPECT_FALSE(spec.mixtral());

  const std::string text = BuildConfigJson(spec, DType::kBF16, ids);
  const Json j = *ParseJson(text, "qwen2_moe");
  EXPECT_EQ(j["architectures"], Json::array({"Qwen2MoeForCausalLM"}));
  EXPECT_EQ(j["model_type"], "qwen2_moe");
  EXPECT_EQ(j["num_experts"], 4);
  EXPECT_EQ(j["num_experts_per_tok"], 2);
  EXPECT_EQ(j["moe_intermediate_size"], 96);
  EXPECT_EQ(j["shared_expert_intermediate_size"], 192);
  EXPECT_EQ(j["intermediate_size"], 352);
  EXPECT_EQ(j["norm_topk_prob"], false);
  EXPECT_EQ(j["decoder_sparse_step"], 1);
  EXPECT_EQ(j["mlp_only_layers"], Json::array());
  EXPECT_EQ(j["router_aux_loss_coef"], 0.001);
  EXPECT_EQ(j["output_router_logits"], false);
  EXPECT_EQ(j["use_sliding_window"], false);
  EXPECT_TRUE(j.contains("sliding_window") && j["sliding_window"].is_null());
  EXPECT_EQ(j["max_window_layers"], 4);
  EXPECT_EQ(j["head_dim"], 64);
  EXPECT_EQ(j["num_attention_heads"], 4);
  EXPECT_EQ(j["num_key_value_heads"], 2);
  EXPECT_EQ(j["hidden_size"], 128);
  EXPECT_EQ(j["rope_theta"], 1e6);
  EXPECT_TRUE(j.contains("rope_scaling") && j["rope_scaling"].is_null());
  EXPECT_EQ(j["rms_norm_eps"], 1e-6);
  EXPECT_EQ(j["tie_word_embeddings"], true);
  // Qwen2MoeConfig has none of these (tiny-qwen2's config has no attention_bias either).
  for (const char* key : {"attention_bias", "mlp_bias", "pretraining_tp", "num_local_experts",
                          "router_jitter_noise"}) {
    EXPECT_FALSE(j.contains(key)) << key;
  }
  const Json qwen2 =
      *ParseJson(BuildConfigJson(*FindModelSpec("tiny-qwen2"), DType::kBF16, ids), "qwen2");
  EXPECT_FALSE(qwen2.contains("attention_bias"));

  absl::StatusOr<LlamaConfig> c = ParseLlamaConfig(text, "tiny-qwen2-moe");
  ASSERT_TRUE(c.ok()) << c.status() << "\n" << text;
  EXPECT_EQ(c->model_type, "qwen2_moe");
  EXPECT_EQ(c->num_experts, 4);
  EXPECT_EQ(c->num_experts_per_tok, 2);
  EXPECT_EQ(c->moe_intermediate_size, 96);
  EXPECT_EQ(c->shared_expert_intermediate_size, 192);
  EXPECT_EQ(c->intermediate_size, 352);
  EXPECT_FALSE(c->norm_topk_prob);
  EXPECT_EQ(c->moe_layers, std::vector<bool>(4, true));
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->num_attention_heads, 4);
  EXPECT_EQ(c->num_key_value_heads, 2);
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_FALSE(c->o_bias);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_EQ(c->sliding_window, 0);
  EXPECT_EQ(c->rope_theta, 1e6);
  EXPECT_EQ(c->rms_norm_eps, 1e-6);
  EXPECT_EQ(c->rope_scaling.type, "");
  EXPECT_TRUE(c->tie_word_embeddings);
}

// The f32 model's tensors are ExpectedTensors(spec)'s, by name and shape, NumParameters() of them.
void ExpectPlannedTensors(const ModelSpec& spec, const SafetensorsSet& set) {
  const std::vector<Expected> expected = ExpectedTensors(spec);
  std::set<std::string> expected_names;
  for (const Expected& e : expected) expected_names.insert(e.name);
  const std::vector<std::string> names = set.TensorNames();
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), expected_names);
  EXPECT_EQ(names.size(), expected.size());
  int64_t params = 0;
  for (const Expected& e : expected) {
    auto t = set.Get(e.name, e.shape);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->dtype, DType::kF32);
    params += t->numel();
  }
  EXPECT_EQ(params, spec.NumParameters());
}

// The mixtures of experts on disk: exactly the router and expert tensors in the MoE layers and
// the dense MLP in the others (none in tiny-mixtral and tiny-qwen2-moe, layer 3's in
// tiny-qwen3-moe), tiny-qwen2-moe's shared experts and their gates, all counted by NumParameters;
// routers drawn with std 0.25, whose logits on normed inputs are well spread, and shared expert
// gates with std 0.1, whose sigmoids spread over (0, 1).
TEST(MakeModelTest, MoeModelsHaveTheirTensors) {
  for (const std::string size : {"tiny-mixtral", "tiny-qwen3-moe", "tiny-qwen2-moe"}) {
    SCOPED_TRACE(size);
    const ModelSpec spec = *FindModelSpec(size);
    const std::string dir = MakeSized(size, size + "_f32", DType::kF32);
    auto config = LoadLlamaConfig(dir);
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->model_type, spec.model_type);
    EXPECT_EQ(config->num_experts, spec.num_experts);
    auto set = SafetensorsSet::OpenDirectory(dir);
    ASSERT_TRUE(set.ok()) << set.status();
    ExpectPlannedTensors(spec, **set);
    const std::vector<std::string> names = (*set)->TensorNames();
    int dense_mlps = 0;
    for (const std::string& name : names) dense_mlps += absl::StrContains(name, "mlp.gate_proj");
    int shared_experts = 0;
    for (const std::string& name : names) {
      shared_experts += absl::StrContains(name, "shared_expert");
    }
    EXPECT_EQ(shared_experts, spec.shared_expert_intermediate_size > 0 ? 4 * spec.num_layers : 0);
    if (spec.mixtral()) {
      for (const std::string& name : names) EXPECT_FALSE(absl::StrContains(name, "mlp.")) << name;
    } else if (spec.model_type == "qwen2_moe") {
      EXPECT_EQ(dense_mlps, 0);
      for (int i = 0; i < spec.num_layers; ++i) {
        const std::string p = absl::StrCat("model.layers.", i, ".");
        EXPECT_TRUE((*set)->Get(p + "mlp.shared_expert.gate_proj.weight", {192, 128}).ok());
        EXPECT_TRUE((*set)->Get(p + "mlp.shared_expert.up_proj.weight", {192, 128}).ok());
        EXPECT_TRUE((*set)->Get(p + "mlp.shared_expert.down_proj.weight", {128, 192}).ok());
        EXPECT_TRUE((*set)->Get(p + "mlp.shared_expert_gate.weight", {1, 128}).ok());
        EXPECT_TRUE((*set)->Get(p + "self_attn.q_proj.bias", {256}).ok());
        EXPECT_TRUE((*set)->Get(p + "self_attn.k_proj.bias", {128}).ok());
        EXPECT_TRUE((*set)->Get(p + "self_attn.v_proj.bias", {128}).ok());
        EXPECT_FALSE((*set)->Get(p + "self_attn.o_proj.bias").ok());
        EXPECT_FALSE((*set)->Get(p + "mlp.gate_proj.weight").ok());
      }
    } else {
      EXPECT_EQ(dense_mlps, 1);
      EXPECT_TRUE((*set)->Get("model.layers.3.mlp.gate_proj.weight", {352, 128}).ok());
      EXPECT_TRUE((*set)->Get("model.layers.3.mlp.down_proj.weight", {128, 352}).ok());
      EXPECT_FALSE((*set)->Get("model.layers.3.mlp.gate.weight").ok());
    }

    // The routers' std, and their logits on RMS-normalized embedding rows (what an MLP's input
    // looks like): std ~0.25 sqrt(128) = 2.8.
    const TensorView embed = *(*set)->Get("model.embed_tokens.weight");
    const float* rows = reinterpret_cast<const float*>(embed.data);
    const int d = spec.hidden_size, experts = spec.num_experts;
    double sq = 0, logit_sq = 0;
    int64_t n = 0, logits = 0;
    for (int i = 0; i < spec.num_layers; ++i) {
      if (!spec.IsMoeLayer(i)) continue;
      const std::string router = absl::StrCat(
          "model.layers.", i, spec.mixtral() ? ".block_sparse_moe" : ".mlp", ".gate.weight");
      const TensorView t = *(*set)->Get(router, {experts, d});
      const float* w = reinterpret_cast<const float*>(t.data);
      for (int64_t k = 0; k < t.numel(); ++k) sq += double(w[k]) * w[k];
      n += t.numel();
      for (int row = 0; row < 64; ++row) {
        const float* x = rows + int64_t{row} * d;
        double ms = 0;
        for (int k = 0; k < d; ++k) ms += double(x[k]) * x[k];
        const double r = 1 / std::sqrt(ms / d);
        for (int e = 0; e < experts; ++e) {
          double dot = 0;
          for (int k = 0; k < d; ++k) dot += double(w[int64_t{e} * d + k]) * x[k] * r;
          logit_sq += dot * dot, ++logits;
        }
      }
    }
    const double router_std = std::sqrt(sq / n), logit_std = std::sqrt(logit_sq / logits);
    EXPECT_NEAR(router_std, 0.25, 0.025);
    EXPECT_NEAR(logit_std, 0.25 * std::sqrt(128.0), 0.5);
    std::printf("%s: router std %.4f, router logit std %.2f on normed embedding rows\n",
                size.c_str(), router_std, logit_std);
    if (spec.shared_expert_intermediate_size == 0) continue;

    // The shared experts' gates: std ~0.1 over the 4 x 128 values, logits of std ~0.1 sqrt(128)
    // = 1.1 on the same normed rows, so sigmoid(logit) takes values across (0, 1).
    double gate_sq = 0, gate_logit_sq = 0, min_sigmoid = 1, max_sigmoid = 0;
    int64_t gate_n = 0, gate_logits = 0;
    for (int i = 0; i < spec.num_layers; ++i) {
      const TensorView t =
          *(*set)->Get(absl::StrCat("model.layers.", i, ".mlp.shared_expert_gate.weight"), {1, d});
      const float* w = reinterpret_cast<const float*>(t.data);
      for (int k = 0; k < d; ++k) gate_sq += double(w[k]) * w[k];
      gate_n += d;
      for (int row = 0; row < 64; ++row) {
        const float* x = rows + int64_t{row} * d;
        double ms = 0, dot = 0;
        for (int k = 0; k < d; ++k) ms += double(x[k]) * x[k];
        for (int k = 0; k < d; ++k) dot += double(w[k]) * x[k];
        dot /= std::sqrt(ms / d);
        gate_logit_sq += dot * dot, ++gate_logits;
        const double sig = 1 / (1 + std::exp(-dot));
        min_sigmoid = std::min(min_sigmoid, sig), max_sigmoid = std::max(max_sigmoid, sig);
      }
    }
    const double gate_std = std::sqrt(gate_sq / gate_n);
    const double gate_logit_std = std::sqrt(gate_logit_sq / gate_logits);
    EXPECT_NEAR(gate_std, 0.1, 0.015);
    EXPECT_NEAR(gate_logit_std, 0.1 * std::sqrt(128.0), 0.4);
    EXPECT_LT(min_sigmoid, 0.25);
    EXPECT_GT(max_sigmoid, 0.75);
    EXPECT_GT(min_sigmoid, 0.005) << "a shared expert gate saturates";
    EXPECT_LT(max_sigmoid, 0.995) << "a shared expert gate saturates";
    std::printf(
        "%s: shared expert gate std %.4f, logit std %.2f, sigmoid in [%.3f, %.3f] on normed "
        "embedding rows\n",
        size.c_str(), gate_std, gate_logit_std, min_sigmoid, max_sigmoid);
  }
  // Per MoE layer: the router and num_experts experts of 3 * hidden * expert_ffn, in place of
  // the dense MLP.
  const ModelSpec mixtral = *FindModelSpec("tiny-mixtral");
  const ModelSpec mistral = *FindModelSpec("tiny-mistral-sw");
  EXPECT_EQ(mixtral.NumParameters(), mistral.NumParameters() + 4 * (4 * 128 + 3 * 3 * 128 * 352));
  const ModelSpec qwen3_moe = *FindModelSpec("tiny-qwen3-moe");
  EXPECT_EQ(qwen3_moe.NumParameters(), FindModelSpec("tiny-qwen3")->NumParameters() +
                                           3 * (8 * 128 + 8 * 3 * 128 * 96 - 3 * 128 * 352));
  // Qwen2-MoE also has the shared expert (3 * hidden * 192) and its [1][hidden] gate.
  const ModelSpec qwen2_moe = *FindModelSpec("tiny-qwen2-moe");
  EXPECT_EQ(qwen2_moe.NumParameters(),
            FindModelSpec("tiny-qwen2")->NumParameters() +
                4 * (4 * 128 + 4 * 3 * 128 * 96 + 3 * 128 * 192 + 128 - 3 * 128 * 352));
}

// gpt-oss's config.json: GptOssConfig's keys as openai/gpt-oss-20b's file has them (Mixtral's
// num_local_experts, layer_types, YaRN rope_scaling with truncate, swiglu_limit), read back as
// every layer a biased mixture of experts with attention sinks, the even layers sliding.
TEST(MakeModelTest, GptOssConfigHasItsKeysAndParses) {
  const SpecialIds ids{.bos = 1020, .eos = {1021, 1022}, .pad = 1023};
  const ModelSpec spec = *FindModelSpec("tiny-gptoss");
  EXPECT_TRUE(spec.gpt_oss());
  EXPECT_TRUE(spec.qkv_bias());
  EXPECT_TRUE(spec.o_bias());
  EXPECT_FALSE(spec.mixtral());
  EXPECT_EQ(spec.q_dim(), 256);  // != hidden 128
  for (int i = 0; i < spec.num_layers; ++i) {
    EXPECT_TRUE(spec.IsMoeLayer(i)) << i;
    EXPECT_EQ(spec.IsSlidingLayer(i), i % 2 == 0) << i;
  }

  const std::string text = BuildConfigJson(spec, DType::kBF16, ids);
  const Json j = *ParseJson(text, "gpt_oss");
  EXPECT_EQ(j["architectures"], Json::array({"GptOssForCausalLM"}));
  EXPECT_EQ(j["model_type"], "gpt_oss");
  EXPECT_EQ(j["attention_bias"], true);
  EXPECT_EQ(j["attention_dropout"], 0.0);
  EXPECT_EQ(j["head_dim"], 32);
  EXPECT_EQ(j["hidden_act"], "silu");
  EXPECT_EQ(j["hidden_size"], 128);
  EXPECT_EQ(j["intermediate_size"], 128);
  EXPECT_EQ(j["num_attention_heads"], 8);
  EXPECT_EQ(j["num_key_value_heads"], 2);
  EXPECT_EQ(j["num_hidden_layers"], 4);
  EXPECT_EQ(j["num_local_experts"], 8);
  EXPECT_EQ(j["num_experts_per_tok"], 4);
  EXPECT_EQ(j["output_router_logits"], false);
  EXPECT_EQ(j["router_aux_loss_coef"], 0.9);
  EXPECT_EQ(j["swiglu_limit"], 7.0);
  EXPECT_EQ(j["sliding_window"], 16);
  EXPECT_EQ(j["layer_types"], Json::array({"sliding_attention", "full_attention",
                                           "sliding_attention", "full_attention"}));
  EXPECT_EQ(j["max_position_embeddings"], 512);
  EXPECT_EQ(j["rope_theta"], 150000.0);
  EXPECT_EQ(j["rope_scaling"], (Json{{"beta_fast", 32.0},
                                     {"beta_slow", 1.0},
                                     {"factor", 4.0},
                                     {"original_max_position_embeddings", 128},
                                     {"rope_type", "yarn"},
                                     {"truncate", false}}));
  EXPECT_EQ(j["rms_norm_eps"], 1e-5);
  EXPECT_EQ(j["tie_word_embeddings"], false);
  EXPECT_EQ(j["vocab_size"], 1024);
  EXPECT_EQ(j["use_cache"], true);
  EXPECT_EQ(j["torch_dtype"], "bfloat16");
  // GptOssConfig has none of these (nor Qwen's names for the expert fields).
  for (const char* key :
       {"mlp_bias", "pretraining_tp", "router_jitter_noise", "num_experts", "moe_intermediate_size",
        "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers", "use_sliding_window",
        "sliding_window_pattern", "quantization_config"}) {
    EXPECT_FALSE(j.contains(key)) << key;
  }

  absl::StatusOr<LlamaConfig> c = ParseLlamaConfig(text, "tiny-gptoss");
  ASSERT_TRUE(c.ok()) << c.status() << "\n" << text;
  EXPECT_EQ(c->model_type, "gpt_oss");
  EXPECT_EQ(c->hidden_size, 128);
  EXPECT_EQ(c->head_dim, 32);
  EXPECT_EQ(c->num_attention_heads, 8);
  EXPECT_EQ(c->num_key_value_heads, 2);
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_TRUE(c->o_bias);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_TRUE(c->attention_sinks);
  EXPECT_EQ(c->num_experts, 8);
  EXPECT_EQ(c->num_experts_per_tok, 4);
  EXPECT_EQ(c->moe_intermediate_size, 128);
  EXPECT_TRUE(c->norm_topk_prob);
  EXPECT_EQ(c->moe_layers, std::vector<bool>(4, true));
  EXPECT_FALSE(c->HasDenseMlp());
  EXPECT_TRUE(c->moe_biases);
  EXPECT_EQ(c->swiglu_limit, 7.0);
  EXPECT_TRUE(c->clamped_swiglu());
  EXPECT_EQ(c->shared_expert_intermediate_size, 0);
  EXPECT_EQ(c->sliding_layers, (std::vector<bool>{true, false, true, false}));
  EXPECT_EQ(c->sliding_window, 16);
  EXPECT_EQ(c->SlidingWindowOf(0), 16);
  EXPECT_EQ(c->SlidingWindowOf(1), 0);
  EXPECT_EQ(c->rope_local_theta, 0);  // every layer rotates alike, YaRN included
  EXPECT_EQ(c->rope_theta, 150000);
  EXPECT_EQ(c->rope_scaling.type, "yarn");
  EXPECT_EQ(c->rope_scaling.factor, 4.0);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 128);
  EXPECT_EQ(c->rope_scaling.beta_fast, 32.0);
  EXPECT_EQ(c->rope_scaling.beta_slow, 1.0);
  EXPECT_FALSE(c->rope_scaling.truncate);
  EXPECT_DOUBLE_EQ(c->rope_scaling.attention_factor, 0.1 * std::log(4.0) + 1);
  EXPECT_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_FALSE(c->quantization.enabled());
}

// gpt-oss on disk: its HF names and shapes (sinks, the biased router, the experts' fused 3-D
// tensors input x output) counted by NumParameters, and weights drawn so that the clamped GLU's
// limit is reached by a few percent of gate and up values on normed inputs while each expert's
// output keeps ~unit RMS (weight_init.h).
TEST(MakeModelTest, GptOssModelHasItsTensors) {
  const ModelSpec spec = *FindModelSpec("tiny-gptoss");
  const std::string dir = MakeSized("tiny-gptoss", "tiny-gptoss_f32", DType::kF32);
  auto config = LoadLlamaConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->model_type, "gpt_oss");
  auto set = SafetensorsSet::OpenDirectory(dir);
  ASSERT_TRUE(set.ok()) << set.status();
  ExpectPlannedTensors(spec, **set);
  EXPECT_EQ(spec.NumParameters(), 2182336);
  // Per layer, against tiny-biased's attention with 8 heads: the sinks, and instead of the dense
  // MLP the router (weight and bias) and 8 experts' fused matrices and biases.
  ModelSpec dense = *FindModelSpec("tiny-biased");
  dense.num_heads = 8;
  dense.intermediate_size = 128;
  EXPECT_EQ(spec.NumParameters(),
            dense.NumParameters() +
                4 * (8 + 8 * 128 + 8 + 8 * (128 * 256 + 256 + 128 * 128 + 128) - 3 * 128 * 128));

  auto values = [&](const std::string& name) {
    const TensorView t = *(*set)->Get(name);
    std::vector<double> v(t.numel());
    for (int64_t i = 0; i < t.numel(); ++i) v[i] = FloatElement(t, i);
    return v;
  };
  auto rms = [](const std::vector<double>& v) {
    double sq = 0;
    for (double x : v) sq += x * x;
    return std::sqrt(sq / v.size());
  };
  std::vector<double> sinks, router_bias, expert_bias, gate_up, down;
  for (int i = 0; i < spec.num_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    for (auto [name, out] : {std::pair{"self_attn.sinks", &sinks},
                             {"mlp.router.bias", &router_bias},
                             {"mlp.experts.gate_up_proj_bias", &expert_bias},
                             {"mlp.experts.down_proj_bias", &expert_bias},
                             {"mlp.experts.gate_up_proj", &gate_up},
                             {"mlp.experts.down_proj", &down}}) {
      const std::vector<double> v = values(p + name);
      out->insert(out->end(), v.begin(), v.end());
    }
  }
  EXPECT_NEAR(rms(sinks), 1.0, 0.3);
  EXPECT_NEAR(rms(router_bias), 0.5, 0.15);
  EXPECT_NEAR(rms(expert_bias), 0.1, 0.01);
  EXPECT_NEAR(rms(gate_up), 3 / std::sqrt(128.0), 0.005);
  EXPECT_NEAR(rms(down), 1 / (6.5 * std::sqrt(128.0)), 0.0005);

  // Every expert of layer 0 on 64 RMS-normalized embedding rows: gate and up (the even and odd
  // columns of x @ gate_up_proj + bias) past the limit for a few percent of features, the
  // clamped GLU's RMS ~6.5 and the expert's output's ~1.
  const std::vector<double> embed = values("model.embed_tokens.weight");
  const std::vector<double> w1 = values("model.layers.0.mlp.experts.gate_up_proj");
  const std::vector<double> b1 = values("model.layers.0.mlp.experts.gate_up_proj_bias");
  const std::vector<double> w2 = values("model.layers.0.mlp.experts.down_proj");
  const std::vector<double> b2 = values("model.layers.0.mlp.experts.down_proj_bias");
  const int d = spec.hidden_size, ffn = spec.moe_intermediate_size;
  const double limit = spec.swiglu_limit;
  int64_t gates = 0, gates_over = 0, ups_over = 0;
  double glu_sq = 0, out_sq = 0, clamp_sq = 0;
  for (int row = 0; row < 64; ++row) {
    std::vector<double> x(embed.begin() + row * d, embed.begin() + (row + 1) * d);
    const double r = rms(x);
    for (double& v : x) v /= r;
    for (int e = 0; e < spec.num_experts; ++e) {
      std::vector<double> h(ffn);
      for (int f = 0; f < ffn; ++f) {
        double g = b1[e * 2 * ffn + 2 * f], u = b1[e * 2 * ffn + 2 * f + 1];
        for (int k = 0; k < d; ++k) {
          g += x[k] * w1[(int64_t{e} * d + k) * 2 * ffn + 2 * f];
          u += x[k] * w1[(int64_t{e} * d + k) * 2 * ffn + 2 * f + 1];
        }
        ++gates, gates_over += g > limit, ups_over += std::abs(u) > limit;
        const double gc = std::min(g, limit), uc = std::clamp(u, -limit, limit);
        h[f] = (uc + 1) * gc / (1 + std::exp(-1.702 * gc));
        const double unclamped = (u + 1) * g / (1 + std::exp(-1.702 * g));
        glu_sq += h[f] * h[f], clamp_sq += (h[f] - unclamped) * (h[f] - unclamped);
      }
      for (int k = 0; k < d; ++k) {
        double y = b2[e * d + k];
        for (int f = 0; f < ffn; ++f) y += h[f] * w2[(int64_t{e} * ffn + f) * d + k];
        out_sq += y * y;
      }
    }
  }
  const double gate_frac = double(gates_over) / gates, up_frac = double(ups_over) / gates;
  const double glu_rms = std::sqrt(glu_sq / gates), clamp_rms = std::sqrt(clamp_sq / gates);
  const double out_rms = std::sqrt(out_sq / (64 * spec.num_experts * d));
  EXPECT_GT(gate_frac, 0.003);
  EXPECT_LT(gate_frac, 0.03);
  EXPECT_GT(up_frac, 0.007);
  EXPECT_LT(up_frac, 0.05);
  EXPECT_NEAR(glu_rms, 6.5, 1.0);
  EXPECT_GT(clamp_rms / glu_rms, 0.03) << "the clamp hardly changes the GLU";
  EXPECT_NEAR(out_rms, 1.0, 0.3);
  std::printf(
      "tiny-gptoss: sinks rms %.2f, router bias rms %.2f; layer 0 on normed embedding rows: "
      "gate > %g for %.2f%%, |up| > %g for %.2f%% of features, clamped GLU rms %.2f (the clamp "
      "moves it by %.2f rms), expert output rms %.2f\n",
      rms(sinks), rms(router_bias), limit, 100 * gate_frac, limit, 100 * up_frac, glu_rms,
      clamp_rms, out_rms);
}

// The E2M1 value of `code` and an E8M0 scale's power of two, written here from the OCP MX
// specification (not through the writer's table).
double E2M1(int code) {
  static constexpr double kMagnitudes[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return (code & 8 ? -1 : 1) * kMagnitudes[code & 7];
}
double Mxfp4Element(const uint8_t* blocks, const uint8_t* scales, int64_t block, int i) {
  const uint8_t byte = blocks[block * 16 + i / 2];
  return E2M1(i % 2 == 0 ? byte & 15 : byte >> 4) * std::ldexp(1.0, int{scales[block]} - 127);
}

// The quantizer's rounding (nearest E2M1 value, ties to the even mantissa, saturating at 6) and
// block layout (E8M0 scale floor(log2(amax)) - 2, the earlier value in the low nibble) on
// hand-made values.
TEST(MakeModelTest, Mxfp4RoundsToNearestE2M1AndPacksLowNibbleFirst) {
  const std::vector<std::pair<double, int>> cases = {
      {0, 0},    {0.25, 0}, {0.2500001, 1}, {0.5, 1}, {0.75, 2},  {1.25, 2}, {1.4, 3},  {1.75, 4},
      {2.5, 4},  {3.5, 6},  {4.9, 6},       {5.0, 6}, {5.01, 7},  {6, 7},    {7.99, 7}, {1e9, 7},
      {-0.1, 0}, {-0.5, 9}, {-0.75, 10},    {-5, 14}, {-5.5, 15}, {-100, 15}};
  for (const auto& [x, code] : cases) EXPECT_EQ(NearestE2M1(x), code) << x;
  for (int c = 0; c < 16; ++c) EXPECT_EQ(double(kE2M1Values[c]), E2M1(c)) << c;

  // amax 6: exponent floor(log2 6) - 2 = 0 (scale byte 127), values as they are.
  float x[32] = {1.0f, -0.5f, 6.0f, 0.0f, 3.0f, -6.0f, 0.25f, 0.75f};
  uint8_t packed[16], scale = 0;
  QuantizeMxfp4Block(x, packed, &scale);
  EXPECT_EQ(scale, 127);
  EXPECT_EQ(packed[0], 0x92);  // 1.0 (code 2) low, -0.5 (code 9) high
  EXPECT_EQ(packed[1], 0x07);  // 6.0 (7), 0 (0)
  EXPECT_EQ(packed[2], 0xF5);  // 3.0 (5), -6.0 (15)
  EXPECT_EQ(packed[3], 0x20);  // 0.25 -> 0 (the tie to even), 0.75 -> 1.0 (2)
  for (int j = 4; j < 16; ++j) EXPECT_EQ(packed[j], 0) << j;
  const float want[8] = {1.0f, -0.5f, 6.0f, 0.0f, 3.0f, -6.0f, 0.0f, 1.0f};
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(Mxfp4Element(packed, &scale, 0, i), i < 8 ? want[i] : 0.0f) << i;
  }

  // amax 0.75 / 64: exponent -7 - 2 = -9 (scale 118), so 0.75 / 64 is 6 steps of 2^-9 and
  // 2^-10 half of one; the largest value last, in a high nibble.
  float y[32] = {};
  y[31] = 0.75f / 64, y[0] = std::ldexp(1.0f, -10), y[1] = -std::ldexp(1.0f, -12);
  QuantizeMxfp4Block(y, packed, &scale);
  EXPECT_EQ(scale, 118);
  EXPECT_EQ(packed[15], 0x70);
  EXPECT_EQ(packed[0], 0x01);  // 2^-10 -> 0.5 (code 1); -2^-12 -> -0.125 rounds to +0
  EXPECT_EQ(Mxfp4Element(packed, &scale, 0, 31), 0.75 / 64);
  EXPECT_EQ(Mxfp4Element(packed, &scale, 0, 0), std::ldexp(1.0, -10));

  // amax 7.9: exponent 0, 7.9 saturates to 6 and 5 ties down to 4.
  float z[32] = {7.9f, 5.0f, -7.9f};
  QuantizeMxfp4Block(z, packed, &scale);
  EXPECT_EQ(scale, 127);
  EXPECT_EQ(packed[0], 0x67);
  EXPECT_EQ(packed[1], 0x0F);

  // All zeros: scale 127 (2^0), zero codes.
  float zeros[32] = {};
  QuantizeMxfp4Block(zeros, packed, &scale);
  EXPECT_EQ(scale, 127);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(packed[j], 0) << j;

  // Scales clamp at 0 (2^-127; 255 would be NaN): a block of 2^-140 (a subnormal float) has
  // exponent -142, clamped to -127, and rounds to zero. The largest floats take scale 252.
  float tiny[32] = {std::ldexp(1.0f, -140)};
  QuantizeMxfp4Block(tiny, packed, &scale);
  EXPECT_EQ(scale, 0);
  EXPECT_EQ(packed[0], 0);
  float huge[32] = {3e38f, -1e38f};
  QuantizeMxfp4Block(huge, packed, &scale);
  EXPECT_EQ(scale, 252);  // floor(log2(3e38)) = 127
  EXPECT_EQ(Mxfp4Element(packed, &scale, 0, 0), std::ldexp(1.0, 125) * 6);   // 3e38 / 2^125 = 7.05
  EXPECT_EQ(Mxfp4Element(packed, &scale, 0, 1), -std::ldexp(1.0, 125) * 2);  // -2.35 -> -2
}

// make_model --quantize=mxfp4 on tiny-gptoss: openai's layout (the experts' fused tensors as
// U8 *_blocks [experts][out][in / 32][16] and *_scales [experts][out][in / 32], everything else
// as it was, quantization_config as gpt-oss-20b's), each block's scale by the OCP rule, and a
// twin whose experts (bf16, as the source) hold exactly the values the blocks decode to here.
// Only gpt_oss models take mxfp4, and they take nothing else.
TEST(MakeModelTest, Mxfp4CheckpointDecodesToItsTwin) {
  const ModelSpec spec = *FindModelSpec("tiny-gptoss");
  const std::string src = MakeSized("tiny-gptoss", "gptoss_mxfp4_src", DType::kBF16);
  const std::string mx = TmpDir("gptoss_mxfp4"), twin = TmpDir("gptoss_mxfp4_twin");
  QuantizeOptions options;
  options.method = "mxfp4";
  ASSERT_TRUE(QuantizeModelDir(src, mx, twin, options).ok());

  const Json src_config = *ReadJsonFile(src + "/config.json");
  Json want_config = src_config;
  want_config["quantization_config"] = {
      {"modules_to_not_convert",
       {"model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"}},
      {"quant_method", "mxfp4"}};
  EXPECT_EQ(*ReadJsonFile(mx + "/config.json"), want_config);
  EXPECT_EQ(*ReadJsonFile(twin + "/config.json"), src_config);
  auto mx_config = LoadLlamaConfig(mx);
  ASSERT_TRUE(mx_config.ok()) << mx_config.status();
  EXPECT_EQ(mx_config->quantization.method, "mxfp4");
  EXPECT_TRUE(LoadLlamaConfig(twin).ok());
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
    EXPECT_EQ(*ReadFileToString(mx + "/" + file), *ReadFileToString(src + "/" + file));
  }

  auto src_set = SafetensorsSet::OpenDirectory(src);
  auto mx_set = SafetensorsSet::OpenDirectory(mx);
  auto twin_set = SafetensorsSet::OpenDirectory(twin);
  ASSERT_TRUE(src_set.ok() && mx_set.ok() && twin_set.ok());
  const auto bytes = [](const TensorView& t) {
    return std::string(reinterpret_cast<const char*>(t.data), t.nbytes);
  };
  const int64_t experts = spec.num_experts, d = spec.hidden_size;
  const int64_t ffn = spec.moe_intermediate_size;
  std::set<std::string> want_names;
  int quantized = 0;
  double err_sq = 0, ref_sq = 0;
  for (const std::string& name : (*src_set)->TensorNames()) {
    const TensorView s = *(*src_set)->Get(name);
    const TensorView t = *(*twin_set)->Get(name, s.shape);
    const bool gate_up = absl::EndsWith(name, "mlp.experts.gate_up_proj");
    if (!gate_up && !absl::EndsWith(name, "mlp.experts.down_proj")) {
      want_names.insert(name);
      EXPECT_EQ(bytes(*(*mx_set)->Get(name, s.shape)), bytes(s)) << name;
      EXPECT_EQ(bytes(t), bytes(s)) << name;
      continue;
    }
    ++quantized;
    want_names.insert(name + "_blocks");
    want_names.insert(name + "_scales");
    EXPECT_EQ(t.dtype, DType::kBF16) << name;
    // [experts][in][out]: gate_up_proj's inputs are the hidden features, down_proj's the ffn.
    const int64_t in = gate_up ? d : ffn, out = gate_up ? 2 * ffn : d, nb = in / 32;
    auto blocks = (*mx_set)->GetAny(name + "_blocks", {experts, out, nb, 16});
    auto scales = (*mx_set)->GetAny(name + "_scales", {experts, out, nb});
    ASSERT_TRUE(blocks.ok() && scales.ok()) << name;
    EXPECT_EQ(blocks->type, StorageType::kU8);
    EXPECT_EQ(scales->type, StorageType::kU8);
    const auto* b = reinterpret_cast<const uint8_t*>(blocks->data);
    const auto* sc = reinterpret_cast<const uint8_t*>(scales->data);
    for (int64_t e = 0; e < experts; ++e) {
      for (int64_t r = 0; r < out; ++r) {
        for (int64_t k = 0; k < nb; ++k) {
          const int64_t block = (e * out + r) * nb + k;
          double amax = 0;
          for (int i = 0; i < 32; ++i) {
            const int64_t at = (e * in + k * 32 + i) * out + r;
            const double v = FloatElement(s, at), q = FloatElement(t, at);
            ASSERT_EQ(Mxfp4Element(b, sc, block, i), q) << name << " " << e << " " << r << " " << i;
            amax = std::max(amax, std::abs(v));
            err_sq += (q - v) * (q - v), ref_sq += v * v;
          }
          ASSERT_NE(sc[block], 255);
          ASSERT_EQ(int{sc[block]}, std::ilogb(amax) - 2 + 127) << name << " block " << block;
        }
      }
    }
  }
  EXPECT_EQ(quantized, 2 * spec.num_layers);
  const std::vector<std::string> mx_names = (*mx_set)->TensorNames();
  EXPECT_EQ(std::set<std::string>(mx_names.begin(), mx_names.end()), want_names);
  EXPECT_EQ(mx_names.size(), want_names.size());
  // E2M1's one mantissa bit: ~10% RMS error (a wrong scale or nibble order would be ~100%).
  const double rel = std::sqrt(err_sq / ref_sq);
  EXPECT_GT(rel, 0.02);
  EXPECT_LT(rel, 0.2);
  std::printf("tiny-gptoss mxfp4: experts' relative RMS error %.3f\n", rel);

  // The binary writes the same files; the other methods refuse gpt_oss and mxfp4 refuses other
  // models.
  const std::string bin = TmpDir("gptoss_mxfp4_bin");
  const std::string cmd =
      absl::StrCat("tools/modelgen/make_model --size=tiny-gptoss --out=", bin, " --quantize=mxfp4",
                   " --quantize_out=", bin, "_q --quantize_twin_out=", bin, "_twin > /dev/null");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  ExpectSameFiles(mx, bin + "_q");
  ExpectSameFiles(twin, bin + "_twin");
  QuantizeOptions awq;
  awq.method = "awq";
  const absl::Status refused = QuantizeModelDir(src, TmpDir("gptoss_awq"), "", awq);
  EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "mxfp4")) << refused;
  const std::string tiny = MakeTiny("tiny_for_mxfp4", DType::kBF16);
  const absl::Status not_gpt_oss = QuantizeModelDir(tiny, TmpDir("tiny_mxfp4"), "", options);
  EXPECT_TRUE(absl::IsInvalidArgument(not_gpt_oss)) << not_gpt_oss;
  EXPECT_TRUE(absl::StrContains(not_gpt_oss.message(), "gpt_oss")) << not_gpt_oss;
  EXPECT_NE(std::system(absl::StrCat("tools/modelgen/make_model --size=tiny --out=", bin,
                                     "_tiny --quantize=mxfp4 --quantize_out=", bin,
                                     "_tiny_q > /dev/null 2>&1")
                            .c_str()),
            0);
}

TEST(MakeModelTest, TokenizerLoadsAndRoundTrips) {
  const std::string dir = MakeTiny("tokenizer", DType::kBF16);
  auto tok = Tokenizer::FromFile(dir + "/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->vocab_size(), 1024);
  EXPECT_EQ((*tok)->bos_id(), 1020);
  EXPECT_EQ((*tok)->TokenToId("<|end_of_text|>"), 1021);
  EXPECT_EQ((*tok)->TokenToId("<|eot_id|>"), 1022);
  EXPECT_EQ((*tok)->TokenToId("Ġ"), 32);  // byte-level ids are the byte values
  const std::vector<std::string> samples = {
      "The quick brown fox jumps over the lazy dog.",
      "Hello, world! It's 12345 dogs at 10:30 -- don't panic.\n\n    x = buf[3];\n",
      "Café crème, naïve façade; 日本語のテキスト. ∑ 😀 tabs\there",
      "",
  };
  int64_t bytes = 0, tokens = 0;
  for (const std::string& text : samples) {
    auto ids = (*tok)->Encode(text, /*add_special_tokens=*/true);
    ASSERT_TRUE(ids.ok()) << ids.status();
    ASSERT_FALSE(ids->empty());
    EXPECT_EQ(ids->front(), 1020);
    for (int32_t id : *ids) EXPECT_LT(id, 1024);
    EXPECT_EQ((*tok)->Decode(*ids, /*skip_special_tokens=*/true), text);
    bytes += static_cast<int64_t>(text.size());
    tokens += static_cast<int64_t>(ids->size()) - 1;
  }
  // Learned merges compress: well under one token per byte even at 764 merges.
  EXPECT_LT(tokens * 10, bytes * 7) << tokens << " tokens for " << bytes << " bytes";
}

// ---- A minimal f32 Llama / Gemma forward pass (HF semantics), only to measure output
// statistics. ----

double SoftCap(double x, double cap) { return cap > 0 ? cap * std::tanh(x / cap) : x; }

class ReferenceLlama {
 public:
  ReferenceLlama(const LlamaConfig& c, const SafetensorsSet& w) : c_(c), w_(w) {
    inv_freq_ = RopeInverseFrequencies(c);
    local_inv_freq_ = RopeInverseFrequencies(LocalRopeConfig(c));
  }

  // Attention scores (scaled, before any soft cap and mask) and logits before the final soft
  // cap, as the last LastLogits call computed them.
  std::vector<double> raw_scores, raw_logits;
  // Mixtures of experts: every (layer, expert) a token was routed to, and the smallest gap
  // between the last kept and the first dropped router logit, over every LastLogits call.
  std::set<std::string> expert_picks;
  double min_router_gap = 1e300;
  // Qwen2-MoE: the smallest and largest shared expert gate, sigmoid(shared_expert_gate . h).
  double shared_gate_min = 1, shared_gate_max = 0;

  // Logits [vocab] after the last token of `ids`.
  std::vector<float> LastLogits(const std::vector<int32_t>& ids) {
    const int d = c_.hidden_size, n = static_cast<int>(ids.size());
    const std::vector<float> embed = W("model.embed_tokens.weight");
    raw_scores.clear();
    std::vector<std::vector<float>> x(n);
    for (int t = 0; t < n; ++t) {
      x[t].assign(embed.begin() + ids[t] * d, embed.begin() + (ids[t] + 1) * d);
      for (float& e : x[t]) e *= static_cast<float>(c_.embedding_multiplier);
    }
    for (int l = 0; l < c_.num_hidden_layers; ++l) Layer(l, &x);
    const std::vector<float> h = RmsNorm(x.back(), W("model.norm.weight"));
    std::vector<float> logits =
        MatVec(c_.tie_word_embeddings ? embed : W("lm_head.weight"), h, c_.vocab_size);
    raw_logits.assign(logits.begin(), logits.end());
    for (float& e : logits) e = static_cast<float>(SoftCap(e, c_.final_logit_softcapping));
    return logits;
  }

 private:
  std::vector<float> W(const std::string& name) const {
    const TensorView t = *w_.Get(name);
    std::vector<float> out(t.numel());
    std::memcpy(out.data(), t.data, out.size() * sizeof(float));  // f32 model
    return out;
  }
  std::vector<float> RmsNorm(const std::vector<float>& v, const std::vector<float>& g) const {
    double ss = 0;
    for (float a : v) ss += double(a) * a;
    const float r = 1.0f / std::sqrt(float(ss / v.size()) + float(c_.rms_norm_eps));
    std::vector<float> out(v.size());
    const float offset = static_cast<float>(c_.norm_weight_offset);
    for (size_t i = 0; i < v.size(); ++i) out[i] = v[i] * r * (offset + g[i]);
    return out;
  }
  static std::vector<float> MatVec(const std::vector<float>& m, const std::vector<float>& v,
                                   int rows) {
    const size_t cols = v.size();
    std::vector<float> out(rows);
    for (int r = 0; r < rows; ++r) {
      double s = 0;
      for (size_t k = 0; k < cols; ++k) s += double(m[r * cols + k]) * v[k];
      out[r] = float(s);
    }
    return out;
  }
  void Rope(float* head, int pos, const std::vector<double>& inv_freq) const {  // rotate_half
    const int half = c_.head_dim / 2;
    for (int i = 0; i < half; ++i) {
      const double a = pos * inv_freq[i];
      const float x0 = head[i], x1 = head[i + half];
      head[i] = float(x0 * std::cos(a) - x1 * std::sin(a));
      head[i + half] = float(x1 * std::cos(a) + x0 * std::sin(a));
    }
  }
  void Layer(int l, std::vector<std::vector<float>>* x) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    const int n = static_cast<int>(x->size()), hd = c_.head_dim, nh = c_.num_attention_heads;
    const int nkv = c_.num_key_value_heads, d = c_.hidden_size;
    const auto wq = W(p + "self_attn.q_proj.weight"), wk = W(p + "self_attn.k_proj.weight");
    const auto wv = W(p + "self_attn.v_proj.weight"), wo = W(p + "self_attn.o_proj.weight");
    const auto g_in = W(p + "input_layernorm.weight");
    const int window = c_.SlidingWindowOf(l);
    const std::vector<double>& inv_freq = window > 0 ? local_inv_freq_ : inv_freq_;
    const double scale = c_.attention_scale > 0 ? c_.attention_scale : 1 / std::sqrt(double(hd));
    std::vector<float> gq, gk;
    if (c_.qk_norm) gq = W(p + "self_attn.q_norm.weight"), gk = W(p + "self_attn.k_norm.weight");
    const auto head_norm = [&](float* head, const std::vector<float>& g) {
      if (g.empty()) return;
      const auto normed = RmsNorm(std::vector<float>(head, head + hd), g);
      std::copy(normed.begin(), normed.end(), head);
    };
    std::vector<float> bq, bk, bv;  // Qwen2's Q/K/V biases
    if (c_.qkv_bias) {
      bq = W(p + "self_attn.q_proj.bias"), bk = W(p + "self_attn.k_proj.bias");
      bv = W(p + "self_attn.v_proj.bias");
    }
    const auto add = [](std::vector<float>* y, const std::vector<float>& b) {
      for (size_t e = 0; e < b.size(); ++e) (*y)[e] += b[e];
    };
    std::vector<std::vector<float>> q(n), k(n), v(n);
    for (int t = 0; t < n; ++t) {
      const auto h = RmsNorm((*x)[t], g_in);
      q[t] = MatVec(wq, h, nh * hd);
      k[t] = MatVec(wk, h, nkv * hd);
      v[t] = MatVec(wv, h, nkv * hd);
      add(&q[t], bq), add(&k[t], bk), add(&v[t], bv);
      for (int i = 0; i < nh; ++i) head_norm(&q[t][i * hd], gq), Rope(&q[t][i * hd], t, inv_freq);
      for (int i = 0; i < nkv; ++i) head_norm(&k[t][i * hd], gk), Rope(&k[t][i * hd], t, inv_freq);
    }
    for (int t = 0; t < n; ++t) {
      std::vector<float> attn(nh * hd, 0.0f);
      for (int i = 0; i < nh; ++i) {
        const int kvh = i / (nh / nkv);
        const int first = window > 0 ? std::max(0, t - window + 1) : 0;
        std::vector<double> s(t + 1, 0.0);
        double mx = -1e300, sum = 0;
        for (int u = first; u <= t; ++u) {
          double dot = 0;
          for (int e = 0; e < hd; ++e) dot += double(q[t][i * hd + e]) * k[u][kvh * hd + e];
          raw_scores.push_back(dot * scale);
          s[u] = SoftCap(dot * scale, c_.attn_logit_softcapping);
          mx = std::max(mx, s[u]);
        }
        for (int u = first; u <= t; ++u) sum += (s[u] = std::exp(s[u] - mx));
        for (int u = first; u <= t; ++u)
          for (int e = 0; e < hd; ++e) attn[i * hd + e] += float(s[u] / sum) * v[u][kvh * hd + e];
      }
      auto o = MatVec(wo, attn, d);
      if (c_.o_bias) add(&o, W(p + "self_attn.o_proj.bias"));
      if (c_.sandwich_norms) o = RmsNorm(o, W(p + "post_attention_layernorm.weight"));
      for (int e = 0; e < d; ++e) (*x)[t][e] += o[e];
    }
    const auto g_post = W(p + (c_.sandwich_norms ? "pre_feedforward_layernorm.weight"
                                                 : "post_attention_layernorm.weight"));
    for (int t = 0; t < n; ++t) {
      const auto h = RmsNorm((*x)[t], g_post);
      auto down = c_.IsMoeLayer(l) ? Experts(p, h) : Mlp(p + "mlp.", h, c_.intermediate_size);
      if (c_.sandwich_norms) down = RmsNorm(down, W(p + "post_feedforward_layernorm.weight"));
      for (int e = 0; e < d; ++e) (*x)[t][e] += down[e];
    }
  }
  // One (gated) MLP whose gate, up and down matrices are named prefix + gate_proj / up_proj /
  // down_proj (Mixtral's experts: w1, w3, w2).
  std::vector<float> Mlp(const std::string& prefix, const std::vector<float>& h, int ffn) const {
    const bool w123 = c_.model_type == "mixtral" && absl::StrContains(prefix, "experts.");
    const auto wg = W(prefix + (w123 ? "w1" : "gate_proj") + ".weight");
    const auto wu = W(prefix + (w123 ? "w3" : "up_proj") + ".weight");
    const auto wd = W(prefix + (w123 ? "w2" : "down_proj") + ".weight");
    auto g = MatVec(wg, h, ffn);
    const auto u = MatVec(wu, h, ffn);
    for (size_t e = 0; e < g.size(); ++e) {
      const double a = g[e];
      const double act =
          c_.gelu_tanh()
              ? 0.5 * a * (1 + std::tanh(std::sqrt(2 / M_PI) * (a + 0.044715 * a * a * a)))
              : a / (1 + std::exp(-a));
      g[e] = float(act) * u[e];
    }
    return MatVec(wd, g, c_.hidden_size);
  }
  // A mixture of experts (Transformers' MixtralSparseMoeBlock / Qwen2MoeSparseMoeBlock /
  // Qwen3MoeSparseMoeBlock): softmax of the router's logits, the top num_experts_per_tok kept
  // (renormalized when norm_topk_prob), their experts' outputs summed with those weights, plus
  // (Qwen2-MoE) the shared expert's output times sigmoid(shared_expert_gate . h). Records the
  // choices in expert_picks, the gap between the last kept and the first dropped logit in
  // min_router_gap, and the shared expert gates' range in shared_gate_min / shared_gate_max.
  std::vector<float> Experts(const std::string& layer, const std::vector<float>& h) {
    const std::string moe = layer + (c_.model_type == "mixtral" ? "block_sparse_moe." : "mlp.");
    const int experts = c_.num_experts, k = c_.num_experts_per_tok;
    const std::vector<float> logits = MatVec(W(moe + "gate.weight"), h, experts);
    std::vector<int> order(experts);
    for (int e = 0; e < experts; ++e) order[e] = e;
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return logits[a] > logits[b]; });
    min_router_gap = std::min(min_router_gap, double(logits[order[k - 1]]) - logits[order[k]]);
    double z = 0, kept = 0;
    for (float v : logits) z += std::exp(double(v) - logits[order[0]]);
    std::vector<double> p(k);
    for (int j = 0; j < k; ++j) {
      kept += p[j] = std::exp(double(logits[order[j]]) - logits[order[0]]) / z;
    }
    std::vector<float> out(c_.hidden_size, 0.0f);
    for (int j = 0; j < k; ++j) {
      expert_picks.insert(layer + std::to_string(order[j]));
      const double weight = c_.norm_topk_prob ? p[j] / kept : p[j];
      const auto y = Mlp(absl::StrCat(moe, "experts.", order[j], "."), h, c_.moe_intermediate_size);
      for (int e = 0; e < c_.hidden_size; ++e) out[e] += float(weight * y[e]);
    }
    if (c_.shared_expert_intermediate_size > 0) {
      const double logit = MatVec(W(moe + "shared_expert_gate.weight"), h, 1)[0];
      const double gate = 1 / (1 + std::exp(-logit));
      shared_gate_min = std::min(shared_gate_min, gate);
      shared_gate_max = std::max(shared_gate_max, gate);
      const auto y = Mlp(moe + "shared_expert.", h, c_.shared_expert_intermediate_size);
      for (int e = 0; e < c_.hidden_size; ++e) out[e] += float(gate * y[e]);
    }
    return out;
  }

  const LlamaConfig& c_;
  const SafetensorsSet& w_;
  std::vector<double> inv_freq_, local_inv_freq_;
};

// Logit statistics of one model over prompts.
struct LogitStats {
  double std = 0, top1 = 0;  // means over the prompts
  std::set<int> argmaxes;
  int repeats_last = 0;  // prompts whose argmax is their last token
};

LogitStats Measure(ReferenceLlama& model, const std::vector<std::vector<int32_t>>& prompts) {
  LogitStats out;
  for (const std::vector<int32_t>& ids : prompts) {
    const std::vector<float> logits = model.LastLogits(ids);
    double mean = 0, sq = 0, mx = -1e30, z = 0;
    int arg = 0;
    for (size_t i = 0; i < logits.size(); ++i) {
      mean += logits[i];
      if (logits[i] > mx) mx = logits[i], arg = static_cast<int>(i);
    }
    mean /= logits.size();
    for (float l : logits) sq += (l - mean) * (l - mean), z += std::exp(l - mx);
    out.std += std::sqrt(sq / logits.size()) / prompts.size();
    out.top1 += 1.0 / z / prompts.size();
    out.argmaxes.insert(arg);
    out.repeats_last += arg == ids.back();
  }
  return out;
}

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double(a[i]) - b[i]));
  return m;
}

// Short prompts of several kinds, for the random models' next-token statistics.
const std::vector<std::string> kPrompts = {"The quick brown fox",
                                           "It was the best of times",
                                           "Numbers matter: 3.14",
                                           "Please don't forget",
                                           "In the beginning there was",
                                           "A language model reads",
                                           "x = buf[3];",
                                           "Café crème"};

// tiny-mixtral, tiny-qwen3-moe and tiny-qwen2-moe through the reference forward pass with their
// experts: varied next-token distributions, every expert of every MoE layer chosen by some token,
// the router logits' top-k choices never near a tie, and tiny-qwen2-moe's shared expert gates
// neither closed nor fully open, with the shared experts moving the logits.
TEST(MakeModelTest, RandomMoeModelsAreVariedAndUseEveryExpert) {
  for (const std::string size : {"tiny-mixtral", "tiny-qwen3-moe", "tiny-qwen2-moe"}) {
    SCOPED_TRACE(size);
    const ModelSpec spec = *FindModelSpec(size);
    const std::string dir = MakeSized(size, size + "_forward", DType::kF32);
    auto config = LoadLlamaConfig(dir);
    auto set = SafetensorsSet::OpenDirectory(dir);
    auto tok = Tokenizer::FromFile(dir + "/tokenizer.json");
    ASSERT_TRUE(config.ok() && set.ok() && tok.ok());
    ASSERT_TRUE(config->moe());
    std::vector<std::vector<int32_t>> prompts;
    for (const std::string& t : kPrompts) prompts.push_back(*(*tok)->Encode(t, true));
    ReferenceLlama model(*config, **set);
    const LogitStats stats = Measure(model, prompts);
    EXPECT_GT(stats.std, 1.0);
    EXPECT_LT(stats.std, 4.0);
    EXPECT_LT(stats.top1, 0.8) << "next-token distributions are nearly one-hot";
    EXPECT_GE(stats.argmaxes.size(), prompts.size() / 2) << "the model ignores its input";
    EXPECT_LE(stats.repeats_last, 2) << "the model mostly repeats the last token";
    int moe_layers = 0;
    for (int i = 0; i < spec.num_layers; ++i) moe_layers += spec.IsMoeLayer(i);
    EXPECT_EQ(model.expert_picks.size(), size_t(moe_layers * spec.num_experts))
        << "some expert is never chosen";
    EXPECT_GT(model.min_router_gap, 1e-4) << "a top-k choice is nearly tied";
    std::printf(
        "%s: logit std %.2f, mean top-1 prob %.3f, %zu distinct argmaxes, %d repeats; %zu of %d "
        "experts chosen, smallest router gap %.4f\n",
        size.c_str(), stats.std, stats.top1, stats.argmaxes.size(), stats.repeats_last,
        model.expert_picks.size(), moe_layers * spec.num_experts, model.min_router_gap);
    if (spec.shared_expert_intermediate_size == 0) continue;
    EXPECT_LT(model.shared_gate_min, 0.3);
    EXPECT_GT(model.shared_gate_max, 0.7);
    // Without the shared experts the logits move by O(1).
    LlamaConfig unshared = *config;
    unshared.shared_expert_intermediate_size = 0;
    ReferenceLlama without(unshared, **set);
    double effect = 0;
    for (const auto& ids : prompts) {
      const std::vector<float> a = model.LastLogits(ids), b = without.LastLogits(ids);
      effect = std::max(effect, MaxAbsDiff(a, b));
    }
    EXPECT_GT(effect, 0.5) << "the shared experts hardly matter";
    std::printf("%s: shared expert gates in [%.3f, %.3f]; max logit change without them %.2f\n",
                size.c_str(), model.shared_gate_min, model.shared_gate_max, effect);
  }
}

TEST(MakeModelTest, RandomModelHasVariedNextTokenDistributions) {
  const std::string dir = MakeTiny("forward", DType::kF32);
  auto config = LoadLlamaConfig(dir);
  auto set = SafetensorsSet::OpenDirectory(dir);
  auto tok = Tokenizer::FromFile(dir + "/tokenizer.json");
  ASSERT_TRUE(config.ok() && set.ok() && tok.ok());
  ReferenceLlama model(*config, **set);
  const std::vector<std::string>& prompts = kPrompts;
  std::vector<std::vector<int32_t>> ids;
  for (const std::string& p : prompts) ids.push_back(*(*tok)->Encode(p, true));
  const LogitStats stats = Measure(model, ids);
  EXPECT_GT(stats.std, 1.0);
  EXPECT_LT(stats.std, 4.0);
  EXPECT_LT(stats.top1, 0.8) << "next-token distributions are nearly one-hot";
  EXPECT_GE(stats.argmaxes.size(), prompts.size() / 2) << "the model ignores its input";
  EXPECT_LE(stats.repeats_last, 2) << "the model mostly repeats the last token";
  std::printf("logit std %.2f, mean top-1 prob %.3f, %zu distinct argmaxes, %d repeats\n",
              stats.std, stats.top1, stats.argmaxes.size(), stats.repeats_last);
}

// tiny-gemma2 and tiny-gemma3 through the reference Gemma forward pass: varied next-token
// distributions, and every Gemma feature that a test of an engine relies on moves the logits:
// the 48-position window on prompts longer than it, and tiny-gemma2's soft caps (which must bend
// the values these random weights produce, unlike Gemma 2's real caps of 50 and 30).
TEST(MakeModelTest, RandomGemmaModelsAreVariedAndTheirSoftCapsMatter) {
  for (const std::string size : {"tiny-gemma2", "tiny-gemma3"}) {
    SCOPED_TRACE(size);
    const std::string dir = MakeSized(size, size + "_forward", DType::kF32);
    auto config = LoadLlamaConfig(dir);
    auto set = SafetensorsSet::OpenDirectory(dir);
    auto tok = Tokenizer::FromFile(dir + "/tokenizer.json");
    ASSERT_TRUE(config.ok() && set.ok() && tok.ok());
    const std::vector<std::string>& texts = kPrompts;
    std::vector<std::vector<int32_t>> prompts;
    for (const std::string& t : texts) prompts.push_back(*(*tok)->Encode(t, true));
    // Two prompts past the window (~100 and ~200 tokens).
    std::string long_text;
    for (int i = 0; long_text.size() < 700; ++i) {
      long_text += absl::StrCat(texts[i % texts.size()], " and ", i * 37, ", ");
    }
    std::vector<int32_t> long_ids = *(*tok)->Encode(long_text, true);
    ASSERT_GT(long_ids.size(), 200u);
    long_ids.resize(200);
    prompts.push_back(std::vector<int32_t>(long_ids.begin(), long_ids.begin() + 100));
    prompts.push_back(long_ids);

    ReferenceLlama model(*config, **set);
    const LogitStats stats = Measure(model, prompts);
    EXPECT_GT(stats.std, 1.0);
    EXPECT_LT(stats.std, 4.0);
    EXPECT_LT(stats.top1, 0.8) << "next-token distributions are nearly one-hot";
    EXPECT_GE(stats.argmaxes.size(), prompts.size() / 2) << "the model ignores its input";
    EXPECT_LE(stats.repeats_last, 2) << "the model mostly repeats the last token";

    // Raw (uncapped) score and logit magnitudes over the long prompt.
    const std::vector<float> logits = model.LastLogits(long_ids);
    double score_rms = 0, score_max = 0, logit_rms = 0, logit_max = 0;
    for (double x : model.raw_scores) {
      score_rms += x * x, score_max = std::max(score_max, std::abs(x));
    }
    for (double x : model.raw_logits) {
      logit_rms += x * x, logit_max = std::max(logit_max, std::abs(x));
    }
    score_rms = std::sqrt(score_rms / model.raw_scores.size());
    logit_rms = std::sqrt(logit_rms / model.raw_logits.size());

    // Without the window, the long prompt's logits move.
    LlamaConfig no_window = *config;
    no_window.sliding_window = 0;
    ReferenceLlama unwindowed(no_window, **set);
    const double window_effect = MaxAbsDiff(logits, unwindowed.LastLogits(long_ids));
    EXPECT_GT(window_effect, 0.1) << "the sliding window changes nothing";

    // Without the soft caps.
    LlamaConfig no_caps = *config;
    no_caps.attn_logit_softcapping = no_caps.final_logit_softcapping = 0;
    ReferenceLlama uncapped(no_caps, **set);
    const LogitStats uncapped_stats = Measure(uncapped, prompts);
    double cap_effect = 0;
    for (const auto& ids : prompts) {
      cap_effect =
          std::max(cap_effect, MaxAbsDiff(model.LastLogits(ids), uncapped.LastLogits(ids)));
    }
    LlamaConfig attn_cap_only = *config;
    attn_cap_only.final_logit_softcapping = 0;
    ReferenceLlama attn_capped(attn_cap_only, **set);
    const double attn_cap_effect =
        MaxAbsDiff(attn_capped.LastLogits(long_ids), uncapped.LastLogits(long_ids));
    if (size == "tiny-gemma2") {
      EXPECT_GT(cap_effect, 1.0);
      EXPECT_GT(attn_cap_effect, 0.3) << "the attention soft cap hardly matters";
      EXPECT_GT(uncapped_stats.top1 - stats.top1, 0.02) << "the final soft cap hardly matters";
    } else {
      EXPECT_EQ(cap_effect, 0);
    }
    std::printf(
        "%s: logit std %.2f, mean top-1 prob %.3f (uncapped %.3f), %zu distinct argmaxes of %zu, "
        "%d repeats; "
        "long prompt: raw scores rms %.2f max %.2f, raw logits rms %.2f max %.2f; max logit "
        "change without the window %.2f, without the caps %.2f (attention cap alone %.2f)\n",
        size.c_str(), stats.std, stats.top1, uncapped_stats.top1, stats.argmaxes.size(),
        prompts.size(), stats.repeats_last, score_rms, score_max, logit_rms, logit_max,
        window_effect, cap_effect, attn_cap_effect);
  }
}

}  // namespace
}  // namespace kvrm::modelgen
