// Loading a model directory as a whole: what tokenizer_config.json changes about the tokenizer.
#include "runtime/model_bundle.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/safetensors_writer.h"
#include "model/tokenizer.h"
#include "runtime/engine.h"
#include "tests/test_server.h"

namespace kvrm {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// A copy of the tiny model whose tokenizer_config.json is `edit`ed.
std::string EditedTinyModel(const std::string& name, const std::function<void(Json&)>& edit) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const fs::path dir = fs::path(tmp != nullptr ? tmp : "/tmp") / name;
  fs::remove_all(dir);
  fs::copy(TinyModelDir(), dir, fs::copy_options::recursive);
  absl::StatusOr<Json> config = ReadJsonFile((dir / "tokenizer_config.json").string());
  CHECK_OK(config.status());
  edit(*config);
  std::ofstream((dir / "tokenizer_config.json").string()) << config->dump(2);
  return dir.string();
}

// Transformers' LlamaTokenizer(Fast) builds its post-processor from add_bos_token (default
// true) and add_eos_token (default false) when it loads, whatever tokenizer.json says; other
// tokenizer classes take tokenizer.json's.
TEST(ModelBundleTest, LlamaTokenizersTakeAddBosAndAddEosFromTokenizerConfig) {
  std::unique_ptr<ModelBundle> plain(LoadTinyModel());
  const std::string bos_text = plain->chat.bos_token, eos_text = plain->chat.eos_token;
  const std::optional<int32_t> bos = plain->tokenizer->TokenToId(bos_text);
  const std::optional<int32_t> eos = plain->tokenizer->TokenToId(eos_text);
  ASSERT_TRUE(bos && eos);
  const std::vector<int32_t> body = *plain->tokenizer->Encode("hello there", false);
  ASSERT_FALSE(body.empty());
  const auto encode = [&](const std::string& dir) {
    absl::StatusOr<std::unique_ptr<ModelBundle>> m = ModelBundle::Load(dir);
    CHECK_OK(m.status());
    return *(*m)->tokenizer->Encode("hello there", true);
  };
  std::vector<int32_t> want = body;
  want.insert(want.begin(), *bos);
  want.push_back(*eos);
  EXPECT_EQ(encode(EditedTinyModel("llama_eos", [](Json& j) {
              j["tokenizer_class"] = "LlamaTokenizerFast";
              j["add_eos_token"] = true;
            })),
            want);
  EXPECT_EQ(encode(EditedTinyModel("llama_no_bos", [](Json& j) {
              j["tokenizer_class"] = "LlamaTokenizer";
              j["add_bos_token"] = false;
            })),
            body);
  // Another class: tokenizer.json's post-processor stands, flags or not.
  EXPECT_EQ(encode(EditedTinyModel("fast_flags", [](Json& j) { j["add_eos_token"] = true; })),
            *plain->tokenizer->Encode("hello there", true));
  // A BOS the vocabulary does not have, or a flag of the wrong type, is refused naming it.
  absl::Status s = ModelBundle::Load(EditedTinyModel("llama_bad_bos", [](Json& j) {
                     j["tokenizer_class"] = "LlamaTokenizerFast";
                     j["bos_token"] = "<no such token>";
                   })).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("bos_token \"<no such token>\""));
  // No bos_token named: the class's default "<s>"; the tiny vocabulary has none, so
  // tokenizer.json's post-processor stands (the model loads).
  EXPECT_EQ(encode(EditedTinyModel("llama_no_named_bos", [](Json& j) {
              j["tokenizer_class"] = "LlamaTokenizerFast";
              j.erase("bos_token");
            })),
            *plain->tokenizer->Encode("hello there", true));
  s = ModelBundle::Load(EditedTinyModel("bad_flag", [](Json& j) { j["add_bos_token"] = "yes"; }))
          .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("add_bos_token"));
}

// A copy of the tiny model whose model.safetensors also holds `extra`: one-element f32 tensors
// of shape [] (as torch.save writes a scalar).
std::string TinyModelWithScalars(const std::string& name,
                                 const std::vector<std::pair<std::string, float>>& extra) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const fs::path dir = fs::path(tmp != nullptr ? tmp : "/tmp") / name;
  fs::remove_all(dir);
  fs::copy(TinyModelDir(), dir, fs::copy_options::recursive);
  const std::string path = (dir / "model.safetensors").string();
  CHECK(fs::exists(path)) << "the tiny model is one file";
  std::vector<float> values;
  values.reserve(extra.size());
  std::vector<TensorToWrite> tensors;
  for (const auto& [n, v] : extra) {
    values.push_back(v);
    tensors.push_back({n,
                       DType::kF32,
                       {},
                       absl::MakeConstSpan(reinterpret_cast<const std::byte*>(&values.back()), 4)});
  }
  CHECK_OK(AppendToSafetensors(path, tensors));
  return dir.string();
}

// A checkpoint's FP8 KV cache scales (compressed-tensors' and Transformers' self_attn.k_scale /
// v_scale, AutoFP8's one kv_scale) reach each layer's weights, which --kv_dtype=fp8 divides by;
// a checkpoint without them leaves 1. A scale that is not positive, or half a pair, leaves the
// model loadable (f32 and bf16 caches never read them) but an FP8 cache refused, naming the
// tensor.
TEST(ModelBundleTest, ReadsKvCacheScales) {
  std::unique_ptr<ModelBundle> plain(LoadTinyModel());
  const int32_t layers = plain->config.num_hidden_layers;
  EXPECT_EQ(plain->weights.kv_cache_scales, "");
  for (const LayerWeights& l : plain->weights.layers) {
    EXPECT_EQ(l.k_cache_scale, 1.0f);
    EXPECT_EQ(l.v_cache_scale, 1.0f);
  }
  const auto name = [](int32_t i, const char* what) {
    return absl::StrCat("model.layers.", i, ".self_attn.", what);
  };
  std::vector<std::pair<std::string, float>> pairs, single;
  for (int32_t i = 0; i < layers; ++i) {
    pairs.emplace_back(name(i, "k_scale"), 0.01f * (i + 1));
    pairs.emplace_back(name(i, "v_scale"), 0.002f * (i + 1));
    single.emplace_back(name(i, "kv_scale"), 0.03f + i);
  }
  absl::StatusOr<std::unique_ptr<ModelBundle>> m =
      ModelBundle::Load(TinyModelWithScalars("kv_scales", pairs));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->weights.kv_cache_scales, "self_attn.k_scale / v_scale");
  for (int32_t i = 0; i < layers; ++i) {
    EXPECT_EQ((*m)->weights.layers[i].k_cache_scale, 0.01f * (i + 1)) << i;
    EXPECT_EQ((*m)->weights.layers[i].v_cache_scale, 0.002f * (i + 1)) << i;
  }
  m = ModelBundle::Load(TinyModelWithScalars("kv_scale_one", single));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->weights.kv_cache_scales, "self_attn.kv_scale");
  EXPECT_EQ((*m)->weights.layers[1].k_cache_scale, 1.03f);
  EXPECT_EQ((*m)->weights.layers[1].v_cache_scale, 1.03f);

  // Only layer 0's: the others stay 1, and the description says so.
  m = ModelBundle::Load(TinyModelWithScalars("kv_scale_layer0", {pairs[0], pairs[1]}));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->weights.kv_cache_scales,
            absl::StrCat("self_attn.k_scale / v_scale, 1 of ", layers, " layers (the rest 1)"));
  EXPECT_EQ((*m)->weights.layers[1].k_cache_scale, 1.0f);

  const auto engine = [](const ModelBundle& model, DType kv) {
    EngineOptions o;
    o.slots = 1;
    o.max_context = 64;
    o.threads = 1;
    o.kv_dtype = kv;
    return Engine::Create(&model, o).status();
  };
  std::vector<std::pair<std::string, float>> zero = pairs;
  zero[3].second = 0;  // layer 1's v_scale
  std::vector<std::pair<std::string, float>> half = pairs;
  half.erase(half.begin() + 1);  // layer 0's v_scale
  for (const auto& [dir, what, tensor] :
       {std::tuple{"kv_scale_zero", &zero, "model.layers.1.self_attn.v_scale"},
        std::tuple{"kv_scale_half", &half, "model.layers.0.self_attn.v_scale"}}) {
    m = ModelBundle::Load(TinyModelWithScalars(dir, *what));
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_THAT((*m)->weights.kv_cache_scales_error.message(), HasSubstr(tensor));
    EXPECT_EQ((*m)->weights.kv_cache_scales, "");
    EXPECT_EQ((*m)->weights.layers[0].k_cache_scale, 1.0f);
    EXPECT_TRUE(engine(**m, DType::kBF16).ok()) << dir;
    const absl::Status fp8 = engine(**m, DType::kF8E4M3);
    EXPECT_FALSE(fp8.ok()) << dir;
    EXPECT_THAT(fp8.message(), HasSubstr("--kv_dtype=fp8_e4m3"));
    EXPECT_THAT(fp8.message(), HasSubstr(tensor));
  }
  EXPECT_THAT(ModelBundle::Load(TinyModelWithScalars("kv_scale_zero", zero))
                  .value()
                  ->weights.kv_cache_scales_error.message(),
              HasSubstr("must be positive"));
}

}  // namespace
}  // namespace kvrm
