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

#include "absl/strings/str_cat.h"
#include "common/json.h"
#include "gtest/gtest.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "model/tokenizer.h"
#include "tools/modelgen/model_spec.h"
#include "tools/modelgen/model_writer.h"
#include "tools/modelgen/tokenizer_json.h"

namespace kvrm::modelgen {
namespace {

namespace fs = std::filesystem;

std::string TmpDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  return (fs::path(base != nullptr ? base : "/tmp") / name).string();
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
  EXPECT_NE(*ReadFileToString(a + "/model.safetensors"), *ReadFileToString(c + "/model.safetensors"));
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

// ---- A minimal f32 Llama forward pass (HF semantics), only to measure output statistics. ----

class ReferenceLlama {
 public:
  ReferenceLlama(const LlamaConfig& c, const SafetensorsSet& w) : c_(c), w_(w) {
    inv_freq_ = RopeInverseFrequencies(c);
  }

  // Logits [vocab] after the last token of `ids`.
  std::vector<float> LastLogits(const std::vector<int32_t>& ids) {
    const int d = c_.hidden_size, n = static_cast<int>(ids.size());
    const std::vector<float> embed = W("model.embed_tokens.weight");
    std::vector<std::vector<float>> x(n);
    for (int t = 0; t < n; ++t) x[t].assign(embed.begin() + ids[t] * d, embed.begin() + (ids[t] + 1) * d);
    for (int l = 0; l < c_.num_hidden_layers; ++l) Layer(l, &x);
    const std::vector<float> h = RmsNorm(x.back(), W("model.norm.weight"));
    return MatVec(c_.tie_word_embeddings ? embed : W("lm_head.weight"), h, c_.vocab_size);
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
    for (size_t i = 0; i < v.size(); ++i) out[i] = v[i] * r * g[i];
    return out;
  }
  static std::vector<float> MatVec(const std::vector<float>& m, const std::vector<float>& v, int rows) {
    const size_t cols = v.size();
    std::vector<float> out(rows);
    for (int r = 0; r < rows; ++r) {
      double s = 0;
      for (size_t k = 0; k < cols; ++k) s += double(m[r * cols + k]) * v[k];
      out[r] = float(s);
    }
    return out;
  }
  void Rope(float* head, int pos) const {  // rotate_half convention
    const int half = c_.head_dim / 2;
    for (int i = 0; i < half; ++i) {
      const double a = pos * inv_freq_[i];
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
    std::vector<std::vector<float>> q(n), k(n), v(n);
    for (int t = 0; t < n; ++t) {
      const auto h = RmsNorm((*x)[t], g_in);
      q[t] = MatVec(wq, h, nh * hd);
      k[t] = MatVec(wk, h, nkv * hd);
      v[t] = MatVec(wv, h, nkv * hd);
      for (int i = 0; i < nh; ++i) Rope(&q[t][i * hd], t);
      for (int i = 0; i < nkv; ++i) Rope(&k[t][i * hd], t);
    }
    for (int t = 0; t < n; ++t) {
      std::vector<float> attn(nh * hd, 0.0f);
      for (int i = 0; i < nh; ++i) {
        const int kvh = i / (nh / nkv);
        std::vector<double> s(t + 1);
        double mx = -1e300, sum = 0;
        for (int u = 0; u <= t; ++u) {
          double dot = 0;
          for (int e = 0; e < hd; ++e) dot += double(q[t][i * hd + e]) * k[u][kvh * hd + e];
          s[u] = dot / std::sqrt(double(hd));
          mx = std::max(mx, s[u]);
        }
        for (double& e : s) sum += (e = std::exp(e - mx));
        for (int u = 0; u <= t; ++u)
          for (int e = 0; e < hd; ++e) attn[i * hd + e] += float(s[u] / sum) * v[u][kvh * hd + e];
      }
      const auto o = MatVec(wo, attn, d);
      for (int e = 0; e < d; ++e) (*x)[t][e] += o[e];
    }
    const auto g_post = W(p + "post_attention_layernorm.weight");
    const auto wg = W(p + "mlp.gate_proj.weight"), wu = W(p + "mlp.up_proj.weight");
    const auto wd = W(p + "mlp.down_proj.weight");
    for (int t = 0; t < n; ++t) {
      const auto h = RmsNorm((*x)[t], g_post);
      auto g = MatVec(wg, h, c_.intermediate_size);
      const auto u = MatVec(wu, h, c_.intermediate_size);
      for (size_t e = 0; e < g.size(); ++e) g[e] = g[e] / (1.0f + std::exp(-g[e])) * u[e];
      const auto down = MatVec(wd, g, d);
      for (int e = 0; e < d; ++e) (*x)[t][e] += down[e];
    }
  }

  const LlamaConfig& c_;
  const SafetensorsSet& w_;
  std::vector<double> inv_freq_;
};

TEST(MakeModelTest, RandomModelHasVariedNextTokenDistributions) {
  const std::string dir = MakeTiny("forward", DType::kF32);
  auto config = LoadLlamaConfig(dir);
  auto set = SafetensorsSet::OpenDirectory(dir);
  auto tok = Tokenizer::FromFile(dir + "/tokenizer.json");
  ASSERT_TRUE(config.ok() && set.ok() && tok.ok());
  ReferenceLlama model(*config, **set);
  const std::vector<std::string> prompts = {
      "The quick brown fox", "It was the best of times", "Numbers matter: 3.14",
      "Please don't forget", "In the beginning there was", "A language model reads",
      "x = buf[3];", "Café crème"};
  std::set<int> argmaxes;
  int repeats_last = 0;
  double max_prob_sum = 0, std_sum = 0;
  for (const std::string& p : prompts) {
    const std::vector<int32_t> ids = *(*tok)->Encode(p, true);
    const std::vector<float> logits = model.LastLogits(ids);
    double mean = 0, sq = 0, mx = -1e30, z = 0;
    int arg = 0;
    for (size_t i = 0; i < logits.size(); ++i) {
      mean += logits[i];
      if (logits[i] > mx) mx = logits[i], arg = static_cast<int>(i);
    }
    mean /= logits.size();
    for (float l : logits) sq += (l - mean) * (l - mean), z += std::exp(l - mx);
    std_sum += std::sqrt(sq / logits.size());
    max_prob_sum += 1.0 / z;
    argmaxes.insert(arg);
    repeats_last += arg == ids.back();
  }
  const double n = prompts.size();
  EXPECT_GT(std_sum / n, 1.0);
  EXPECT_LT(std_sum / n, 4.0);
  EXPECT_LT(max_prob_sum / n, 0.8) << "next-token distributions are nearly one-hot";
  EXPECT_GE(argmaxes.size(), prompts.size() / 2) << "the model ignores its input";
  EXPECT_LE(repeats_last, 2) << "the model mostly repeats the last token";
  std::printf("logit std %.2f, mean top-1 prob %.3f, %zu distinct argmaxes, %d repeats\n",
              std_sum / n, max_prob_sum / n, argmaxes.size(), repeats_last);
}

}  // namespace
}  // namespace kvrm::modelgen
