// LoadLoraAdapter against adapters from tools/modelgen's writer (values checked against the
// safetensors read back independently, the scale computed from the JSON here) and against
// hand-written broken ones (every refusal's code and the field or tensor its message names).
#include "model/lora.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "model/safetensors_writer.h"
#include "tools/modelgen/lora_writer.h"

namespace kvrm {
namespace {

namespace fs = std::filesystem;
using modelgen::LlamaConfigForSize;
using modelgen::MakeLoraAdapter;
using modelgen::MakeLoraOptions;
using ::testing::HasSubstr;

constexpr LoraTarget kAllTargets[] = {LoraTarget::kQ,   LoraTarget::kK,    LoraTarget::kV,
                                      LoraTarget::kO,   LoraTarget::kGate, LoraTarget::kUp,
                                      LoraTarget::kDown};

// A fresh directory under TEST_TMPDIR.
std::string TmpDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const fs::path dir = fs::path(base != nullptr ? base : "/tmp") / "lora_test" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

LlamaConfig ConfigOf(const std::string& size) {
  absl::StatusOr<LlamaConfig> config = LlamaConfigForSize(size);
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

std::string Generate(const LlamaConfig& config, const std::string& name, MakeLoraOptions options) {
  options.out_dir = TmpDir(name);
  const absl::Status status = MakeLoraAdapter(config, options);
  EXPECT_TRUE(status.ok()) << status;
  return options.out_dir;
}

LoraAdapter Load(const LlamaConfig& config, const std::string& dir, const std::string& name = "a") {
  absl::StatusOr<LoraAdapter> adapter = LoadLoraAdapter(config, name, dir);
  EXPECT_TRUE(adapter.ok()) << adapter.status();
  return adapter.ok() ? *std::move(adapter) : LoraAdapter{};
}

// The file's values, decoded here rather than by the loader.
std::vector<float> FileFloats(const TensorView& t) {
  std::vector<float> out(t.numel());
  for (size_t i = 0; i < out.size(); ++i) {
    if (t.dtype == DType::kF32) {
      std::memcpy(&out[i], t.data + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, t.data + 2 * i, 2);
      out[i] = t.dtype == DType::kBF16 ? Bf16ToFloat(h) : F16ToFloat(h);
    }
  }
  return out;
}

// alpha / r or alpha / sqrt(r), from adapter_config.json as PEFT reads it.
double ScaleFromConfig(const std::string& dir) {
  absl::StatusOr<Json> json = ReadJsonFile(dir + "/adapter_config.json");
  EXPECT_TRUE(json.ok()) << json.status();
  const double r = (*json)["r"].get<double>();
  const double alpha = json->contains("lora_alpha") ? (*json)["lora_alpha"].get<double>() : 8.0;
  const bool rslora = json->value("use_rslora", false);
  return rslora ? alpha / std::sqrt(r) : alpha / r;
}


// Every matrix of `adapter` equals what <dir>/adapter_model.safetensors holds under `prefix`
// (A as stored, B times the scale, fused B split by rows); projections without tensors are
// unadapted. Returns the number of values in the file.
int64_t ExpectMatchesFile(const LlamaConfig& config, const LoraAdapter& adapter,
                          const std::string& dir, const std::string& prefix = "base_model.model.",
                          const std::string& suffix = "weight") {
  auto file = SafetensorsFile::Open(dir + "/adapter_model.safetensors");
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return 0;
  const double scale = ScaleFromConfig(dir);
  EXPECT_DOUBLE_EQ(adapter.scale, scale);
  EXPECT_EQ(adapter.layers.size(), static_cast<size_t>(config.num_hidden_layers));
  int64_t values = 0;
  for (int32_t l = 0; l < config.num_hidden_layers && l < adapter.layers.size(); ++l) {
    for (const LoraModule& module : LoraModulesOf(config)) {
      const std::string base =
          absl::StrCat(prefix, "model.layers.", l, ".", std::string(module.path), ".");
      const TensorView* a = (*file)->Find(base + "lora_A." + suffix);
      const TensorView* b = (*file)->Find(base + "lora_B." + suffix);
      SCOPED_TRACE(base);
      if (a == nullptr) {
        EXPECT_EQ(b, nullptr);
        for (LoraTarget t : module.targets) {
          const LoraMatrix& m = adapter.layers[l].at(t);
          EXPECT_EQ(m.rank, 0);
          EXPECT_TRUE(m.a.empty());
          EXPECT_TRUE(m.b.empty());
        }
        continue;
      }
      if (b == nullptr) {
        ADD_FAILURE() << "lora_A without lora_B";
        continue;
      }
      values += a->numel() + b->numel();
      const std::vector<float> fa = FileFloats(*a), fb = FileFloats(*b);
      const int64_t r = a->shape[0];
      int64_t row = 0;
      for (LoraTarget t : module.targets) {
        const LoraMatrix& m = adapter.layers[l].at(t);
        const auto [out, in] = LoraTargetShape(config, t);
        EXPECT_EQ(m.rank, adapter.rank);
        EXPECT_EQ(m.rank, r);
        EXPECT_EQ(m.in, in);
        EXPECT_EQ(m.out, out);
        EXPECT_EQ(m.a, fa) << LoraTargetName(t);
        EXPECT_EQ(m.b.size(), static_cast<size_t>(out * r));
        int64_t first_mismatch = -1;
        for (int64_t i = 0; i < out * r && i < m.b.size() && (row + out) * r <= fb.size(); ++i) {
          if (m.b[i] != static_cast<float>(static_cast<double>(fb[row * r + i]) * scale)) {
            first_mismatch = i;
            break;
          }
        }
        EXPECT_EQ(first_mismatch, -1) << LoraTargetName(t) << ": b differs from the file's rows "
                                      << row << ".. times " << scale;
        row += out;
      }
      EXPECT_EQ(row, b->shape[0]);
    }
  }
  return values;
}

TEST(LoraTest, TargetNames) {
  std::vector<std::string> names;
  for (LoraTarget t : kAllTargets) names.emplace_back(LoraTargetName(t));
  EXPECT_EQ(names, (std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                             "up_proj", "down_proj"}));
}

TEST(LoraTest, LoadsEveryProjectionOfEveryLayerTimesTheScale) {
  const LlamaConfig config = ConfigOf("tiny");
  MakeLoraOptions options;
  options.seed = 7;
  options.base_model = "kvrm/tiny";
  const std::string dir = Generate(config, "all", options);
  const LoraAdapter adapter = Load(config, dir, "sql-expert");
  EXPECT_EQ(adapter.name, "sql-expert");
  EXPECT_EQ(adapter.path, dir);
  EXPECT_EQ(adapter.rank, 8);
  EXPECT_EQ(adapter.alpha, 16);
  EXPECT_EQ(adapter.scale, 2);
  EXPECT_EQ(adapter.base_model, "kvrm/tiny");
  EXPECT_EQ(adapter.target_modules,
            (std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                      "up_proj", "down_proj"}));
  const int64_t values = ExpectMatchesFile(config, adapter, dir);
  EXPECT_EQ(adapter.num_parameters, values);
  // tiny: hidden 128, q 4 x 32, kv 2 x 32, ffn 352; rank 8, 4 layers.
  EXPECT_EQ(values, 4 * 8 * ((128 + 128) + (128 + 64) * 2 + (128 + 128) + (128 + 352) * 3));
  const LoraMatrix& k = adapter.layers[2].at(LoraTarget::kK);
  EXPECT_EQ(k.out, 64);
  EXPECT_EQ(k.in, 128);
  const LoraMatrix& down = adapter.layers[3].at(LoraTarget::kDown);
  EXPECT_EQ(down.out, 128);
  EXPECT_EQ(down.in, 352);
}

TEST(LoraTest, RsLoraScalesByAlphaOverSqrtRank) {
  const LlamaConfig config = ConfigOf("tiny");
  MakeLoraOptions options;
  options.rank = 4;
  options.alpha = 6;
  options.use_rslora = true;
  const std::string dir = Generate(config, "rslora", options);
  const LoraAdapter adapter = Load(config, dir);
  EXPECT_EQ(adapter.scale, 3);  // 6 / sqrt(4), not 6 / 4
  ExpectMatchesFile(config, adapter, dir);
}

TEST(LoraTest, Bf16AndF16AreConvertedToFloat) {
  const LlamaConfig config = ConfigOf("tiny");
  MakeLoraOptions options;
  options.seed = 3;
  options.target_modules = {"q_proj", "down_proj"};
  const LoraAdapter f32 = Load(config, Generate(config, "f32", options));
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(std::string(DTypeName(dtype)));
    options.dtype = dtype;
    const std::string dir = Generate(config, std::string(DTypeName(dtype)), options);
    auto file = SafetensorsFile::Open(dir + "/adapter_model.safetensors");
    ASSERT_TRUE(file.ok());
    EXPECT_EQ(
        (*file)->Find("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight")->dtype,
        dtype);
    const LoraAdapter adapter = Load(config, dir);
    ExpectMatchesFile(config, adapter, dir);
    // The same draws as the f32 adapter's, rounded once to 8 (bf16) or 11 (f16) bits.
    const double tolerance = dtype == DType::kBF16 ? 0x1.0p-8 : 0x1.0p-11;
    for (int32_t l = 0; l < config.num_hidden_layers; ++l) {
      for (LoraTarget t : {LoraTarget::kQ, LoraTarget::kDown}) {
        const LoraMatrix& x = adapter.layers[l].at(t);
        const LoraMatrix& y = f32.layers[l].at(t);
        ASSERT_EQ(x.a.size(), y.a.size());
        ASSERT_EQ(x.b.size(), y.b.size());
        for (size_t i = 0; i < x.a.size(); ++i) {
          ASSERT_NEAR(x.a[i], y.a[i], tolerance * std::abs(y.a[i]) + 1e-7);
        }
        for (size_t i = 0; i < x.b.size(); ++i) {
          ASSERT_NEAR(x.b[i], y.b[i], tolerance * std::abs(y.b[i]) + 1e-7);
        }
      }
    }
  }
}

TEST(LoraTest, SubsetOfTargetsAndLayersLeavesTheRestUnadapted) {
  const LlamaConfig config = ConfigOf("tiny");
  MakeLoraOptions options;
  options.target_modules = {"down_proj", "v_proj", "q_proj"};
  options.layers = {3, 1};
  const std::string dir = Generate(config, "subset", options);
  const LoraAdapter adapter = Load(config, dir);
  EXPECT_EQ(adapter.target_modules, (std::vector<std::string>{"q_proj", "v_proj", "down_proj"}));
  ASSERT_EQ(adapter.layers.size(), 4u);
  for (int32_t l = 0; l < 4; ++l) {
    for (LoraTarget t : kAllTargets) {
      const bool adapted = (l == 1 || l == 3) &&
                           (t == LoraTarget::kQ || t == LoraTarget::kV || t == LoraTarget::kDown);
      EXPECT_EQ(adapter.layers[l].at(t).rank, adapted ? 8 : 0) << l << " " << LoraTargetName(t);
    }
  }
  EXPECT_EQ(adapter.num_parameters, ExpectMatchesFile(config, adapter, dir));
}

TEST(LoraTest, Phi3FusedProjectionsShareAAndSplitBByRows) {
  const LlamaConfig config = ConfigOf("tiny-phi3");
  ASSERT_TRUE(config.fused_projections);
  MakeLoraOptions options;
  options.seed = 11;
  const std::string dir = Generate(config, "phi3", options);
  auto file = SafetensorsFile::Open(dir + "/adapter_model.safetensors");
  ASSERT_TRUE(file.ok());
  const TensorView* qkv_b =
      (*file)->Find("base_model.model.model.layers.0.self_attn.qkv_proj.lora_B.weight");
  ASSERT_NE(qkv_b, nullptr);
  EXPECT_EQ(qkv_b->shape, (std::vector<int64_t>{128 + 2 * 64, 8}));
  const LoraAdapter adapter = Load(config, dir);
  EXPECT_EQ(adapter.target_modules,
            (std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                      "up_proj", "down_proj"}));
  // The values as stored: a fused projection's A once.
  EXPECT_EQ(adapter.num_parameters, ExpectMatchesFile(config, adapter, dir));
  const LoraLayer& layer = adapter.layers[1];
  EXPECT_EQ(layer.at(LoraTarget::kQ).a, layer.at(LoraTarget::kK).a);
  EXPECT_EQ(layer.at(LoraTarget::kQ).a, layer.at(LoraTarget::kV).a);
  EXPECT_EQ(layer.at(LoraTarget::kGate).a, layer.at(LoraTarget::kUp).a);
  EXPECT_EQ(layer.at(LoraTarget::kQ).out, 128);
  EXPECT_EQ(layer.at(LoraTarget::kV).out, 64);
  EXPECT_EQ(layer.at(LoraTarget::kUp).out, 352);
  // k's rows are rows [128, 192) of the fused B (ExpectMatchesFile checked them all; one by hand).
  const std::vector<float> fb = FileFloats(
      *(*file)->Find("base_model.model.model.layers.1.self_attn.qkv_proj.lora_B.weight"));
  EXPECT_EQ(layer.at(LoraTarget::kK).b[0], fb[128 * 8] * 2.0f);
  EXPECT_EQ(layer.at(LoraTarget::kV).b.back(), fb.back() * 2.0f);
}

// ---- hand-written adapters -----------------------------------------------------------------

struct HandTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;  // empty: random normal values
};

// Writes adapter_config.json (`config_json`, verbatim) and adapter_model.safetensors (f32).
std::string WriteAdapter(const std::string& name, const std::string& config_json,
                         std::vector<HandTensor> tensors) {
  const std::string dir = TmpDir(name);
  std::ofstream(dir + "/adapter_config.json") << config_json;
  std::mt19937 gen(static_cast<uint32_t>(std::hash<std::string>()(name)));
  std::normal_distribution<float> normal(0.0f, 0.1f);
  std::vector<TensorToWrite> writes;
  for (HandTensor& t : tensors) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    if (t.values.empty()) {
      t.values.resize(n);
      for (float& v : t.values) v = normal(gen);
    }
    EXPECT_EQ(t.values.size(), static_cast<size_t>(n)) << t.name;
    writes.push_back({t.name, DType::kF32, t.shape,
                      absl::MakeConstSpan(reinterpret_cast<const std::byte*>(t.values.data()),
                                          t.values.size() * sizeof(float))});
  }
  const absl::Status status = WriteSafetensors(dir + "/adapter_model.safetensors", writes);
  EXPECT_TRUE(status.ok()) << status;
  return dir;
}

constexpr char kConfigR4[] = R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8,
  "target_modules": ["q_proj"], "bias": "none", "task_type": "CAUSAL_LM"})";

// q_proj's A and B for tiny at rank 4, named `prefix` + layers.{layer}.self_attn.q_proj.lora_X
// + `suffix`.
std::vector<HandTensor> QPair(int layer, const std::string& prefix = "base_model.model.model.",
                              const std::string& suffix = ".weight") {
  const std::string base = absl::StrCat(prefix, "layers.", layer, ".self_attn.q_proj.");
  return {{base + "lora_A" + suffix, {4, 128}, {}}, {base + "lora_B" + suffix, {128, 4}, {}}};
}

// The A and B values QPair(2)'s adapter in `dir` holds.
std::pair<std::vector<float>, std::vector<float>> QPairValues(const std::string& dir) {
  auto file = SafetensorsFile::Open(dir + "/adapter_model.safetensors");
  if (!file.ok()) {
    ADD_FAILURE() << file.status();
    return {};
  }
  const std::string base = "base_model.model.model.layers.2.self_attn.q_proj.";
  return {FileFloats(*(*file)->Find(base + "lora_A.weight")),
          FileFloats(*(*file)->Find(base + "lora_B.weight"))};
}

TEST(LoraTest, AcceptsNamesWithoutThePeftPrefixAndWithAnAdapterName) {
  const LlamaConfig config = ConfigOf("tiny");
  const std::string canonical = WriteAdapter("canonical", kConfigR4, QPair(2));
  const LoraAdapter expected = Load(config, canonical);
  EXPECT_EQ(expected.scale, 2);
  EXPECT_EQ(expected.target_modules, std::vector<std::string>{"q_proj"});
  ExpectMatchesFile(config, expected, canonical);
  // The same values under the other spellings.
  const auto [a, b] = QPairValues(canonical);
  const struct {
    std::string prefix, suffix;
  } spellings[] = {{"model.", ".weight"},
                   {"base_model.model.model.", ".default.weight"},
                   {"model.", ".default.weight"}};
  int n = 0;
  for (const auto& [prefix, suffix] : spellings) {
    SCOPED_TRACE(prefix + suffix);
    std::vector<HandTensor> tensors = QPair(2, prefix, suffix);
    tensors[0].values = a;
    tensors[1].values = b;
    const std::string dir = WriteAdapter(absl::StrCat("spelling", n++), kConfigR4, tensors);
    const LoraAdapter adapter = Load(config, dir);
    EXPECT_EQ(ExpectMatchesFile(config, adapter, dir,
                                prefix.substr(0, prefix.size() - std::string("model.").size()),
                                suffix.substr(1)),
              4 * 128 * 2);
    EXPECT_EQ(adapter.layers[2].at(LoraTarget::kQ).a, expected.layers[2].at(LoraTarget::kQ).a);
    EXPECT_EQ(adapter.layers[2].at(LoraTarget::kQ).b, expected.layers[2].at(LoraTarget::kQ).b);
  }
}

TEST(LoraTest, AlphaDefaultsToPeftsEight) {
  const LlamaConfig config = ConfigOf("tiny");
  const std::string dir = WriteAdapter("default_alpha", R"({"r": 4})", QPair(0));
  const LoraAdapter adapter = Load(config, dir);
  EXPECT_EQ(adapter.alpha, 8);
  EXPECT_EQ(adapter.scale, 2);
  EXPECT_EQ(adapter.base_model, "");
  ExpectMatchesFile(config, adapter, dir);
}

TEST(LoraTest, AcceptsEmptyAndNullForRefusedFeatures) {
  const LlamaConfig config = ConfigOf("tiny");
  const std::string dir = WriteAdapter("empty_features", R"({
    "peft_type": "LORA", "r": 4, "lora_alpha": 8.0, "use_rslora": false, "use_dora": false,
    "fan_in_fan_out": false, "bias": "none", "modules_to_save": [], "rank_pattern": {},
    "alpha_pattern": null, "layer_replication": null, "lora_bias": false,
    "base_model_name_or_path": null, "target_modules": "q_proj|v_proj", "megatron_core": "x",
    "some_future_key": {"a": [1, 2]}})",
                                       QPair(1));
  const LoraAdapter adapter = Load(config, dir);
  EXPECT_EQ(adapter.scale, 2);
}

void ExpectError(const absl::StatusOr<LoraAdapter>& result, absl::StatusCode code,
                 const std::vector<std::string>& substrings) {
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), code) << result.status();
  for (const std::string& s : substrings) {
    EXPECT_THAT(std::string(result.status().message()), HasSubstr(s));
  }
}

TEST(LoraTest, RefusesMissingFiles) {
  const LlamaConfig config = ConfigOf("tiny");
  ExpectError(LoadLoraAdapter(config, "a", TmpDir("missing") + "/nothing"),
              absl::StatusCode::kNotFound, {"adapter_config.json"});
  const std::string dir = TmpDir("no_weights");
  std::ofstream(dir + "/adapter_config.json") << kConfigR4;
  ExpectError(LoadLoraAdapter(config, "a", dir), absl::StatusCode::kNotFound,
              {"adapter_model.safetensors"});
  std::ofstream(dir + "/adapter_model.bin") << "pickle";
  ExpectError(LoadLoraAdapter(config, "a", dir), absl::StatusCode::kNotFound,
              {"adapter_model.bin"});
}

TEST(LoraTest, RefusesConfigsNamingTheField) {
  const LlamaConfig config = ConfigOf("tiny");
  constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;
  constexpr auto kUnimplemented = absl::StatusCode::kUnimplemented;
  const struct {
    std::string json;
    absl::StatusCode code;
    std::string field;
  } cases[] = {
      {"{", kInvalid, "adapter_config.json"},
      {"[1]", kInvalid, "not a JSON object"},
      {R"({"lora_alpha": 8})", kInvalid, "r is missing"},
      {R"({"r": 0})", kInvalid, "r (0)"},
      {R"({"r": -4})", kInvalid, "r (-4)"},
      {R"({"r": 513})", kInvalid, "r (513) must be in [1, 512]"},
      {R"({"r": 18446744073709551615})", kInvalid, "r (18446744073709551615)"},
      {R"({"r": 4.5})", kInvalid, "r must be an integer"},
      {R"({"r": "4"})", kInvalid, "r must be an integer"},
      {R"({"r": 4, "lora_alpha": 0})", kInvalid, "lora_alpha (0)"},
      {R"({"r": 4, "lora_alpha": -8})", kInvalid, "lora_alpha (-8)"},
      {R"({"r": 4, "lora_alpha": "8"})", kInvalid, "lora_alpha must be a number"},
      {R"({"r": 4, "use_rslora": "yes"})", kInvalid, "use_rslora"},
      {R"({"r": 4, "peft_type": "PREFIX_TUNING"})", kUnimplemented, "peft_type \"PREFIX_TUNING\""},
      {R"({"r": 4, "peft_type": 1})", kInvalid, "peft_type"},
      {R"({"r": 4, "fan_in_fan_out": true})", kUnimplemented, "fan_in_fan_out"},
      {R"({"r": 4, "fan_in_fan_out": 1})", kInvalid, "fan_in_fan_out"},
      {R"({"r": 4, "use_dora": true})", kUnimplemented, "use_dora"},
      {R"({"r": 4, "lora_bias": true})", kUnimplemented, "lora_bias"},
      {R"({"r": 4, "bias": "all"})", kUnimplemented, "bias \"all\""},
      {R"({"r": 4, "bias": "lora_only"})", kUnimplemented, "bias \"lora_only\""},
      {R"({"r": 4, "bias": false})", kInvalid, "bias must be a string"},
      {R"({"r": 4, "modules_to_save": ["lm_head"]})", kUnimplemented, "modules_to_save"},
      {R"({"r": 4, "modules_to_save": "lm_head"})", kInvalid, "modules_to_save"},
      {R"({"r": 4, "rank_pattern": {"q_proj": 16}})", kUnimplemented, "rank_pattern"},
      {R"({"r": 4, "rank_pattern": []})", kInvalid, "rank_pattern"},
      {R"({"r": 4, "alpha_pattern": {"v_proj": 32}})", kUnimplemented, "alpha_pattern"},
      {R"({"r": 4, "layer_replication": [[0, 2], [1, 3]]})", kUnimplemented, "layer_replication"},
      {R"({"r": 4, "base_model_name_or_path": 3})", kInvalid, "base_model_name_or_path"},
  };
  int n = 0;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.json);
    const std::string dir = WriteAdapter(absl::StrCat("config", n++), c.json, QPair(0));
    ExpectError(LoadLoraAdapter(config, "a", dir), c.code, {"adapter_config.json", c.field});
  }
}

TEST(LoraTest, RefusesTensorsNamingThem) {
  constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;
  constexpr auto kUnimplemented = absl::StatusCode::kUnimplemented;
  const std::string p = "base_model.model.model.layers.";
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> a_with_nan(4 * 128, 0.25f), b_with_inf(128 * 4, -0.5f);
  a_with_nan[77] = nan;
  b_with_inf[300] = inf;
  const auto plus = [](std::vector<HandTensor> x, const std::vector<HandTensor>& y) {
    x.insert(x.end(), y.begin(), y.end());
    return x;
  };
  const struct {
    std::string label;
    std::string size;
    std::vector<HandTensor> tensors;
    absl::StatusCode code;
    std::vector<std::string> message;
  } cases[] = {
      {"no tensors", "tiny", {}, kInvalid, {"holds no tensors"}},
      {"embedding",
       "tiny",
       plus(QPair(0), {{"base_model.model.model.embed_tokens.lora_embedding_A", {4, 1024}, {}}}),
       kUnimplemented,
       {"base_model.model.model.embed_tokens.lora_embedding_A", "embedding"}},
      {"lm_head",
       "tiny",
       plus(QPair(0), {{"base_model.model.lm_head.lora_A.weight", {4, 128}, {}},
                       {"base_model.model.lm_head.lora_B.weight", {1024, 4}, {}}}),
       kUnimplemented,
       {"base_model.model.lm_head.lora_A.weight", "lm_head"}},
      {"dora",
       "tiny",
       plus(QPair(0), {{p + "0.self_attn.q_proj.lora_magnitude_vector", {128}, {}}}),
       kUnimplemented,
       {p + "0.self_attn.q_proj.lora_magnitude_vector", "DoRA"}},
      {"lora bias",
       "tiny",
       plus(QPair(0), {{p + "0.self_attn.q_proj.lora_B.bias", {128}, {}}}),
       kUnimplemented,
       {p + "0.self_attn.q_proj.lora_B.bias", "bias"}},
      {"base weight (modules_to_save)",
       "tiny",
       plus(QPair(0), {{p + "0.mlp.down_proj.weight", {128, 352}, {}}}),
       kInvalid,
       {p + "0.mlp.down_proj.weight", "not a LoRA weight"}},
      {"unknown module",
       "tiny",
       {{p + "0.self_attn.r_proj.lora_A.weight", {4, 128}, {}},
        {p + "0.self_attn.r_proj.lora_B.weight", {128, 4}, {}}},
       kInvalid,
       {p + "0.self_attn.r_proj.lora_A.weight", "self_attn.r_proj"}},
      {"module under the wrong parent",
       "tiny",
       {{p + "0.mlp.q_proj.lora_A.weight", {4, 128}, {}}},
       kInvalid,
       {p + "0.mlp.q_proj.lora_A.weight", "mlp.q_proj"}},
      {"fused module in a llama",
       "tiny",
       {{p + "0.self_attn.qkv_proj.lora_A.weight", {4, 128}, {}},
        {p + "0.self_attn.qkv_proj.lora_B.weight", {256, 4}, {}}},
       kInvalid,
       {p + "0.self_attn.qkv_proj.lora_A.weight", "self_attn.qkv_proj"}},
      {"separate module in a phi3",
       "tiny-phi3",
       QPair(0),
       kInvalid,
       {p + "0.self_attn.q_proj.lora_A.weight", "self_attn.q_proj"}},
      {"layer past the model",
       "tiny",
       plus(QPair(0), QPair(4)),
       kInvalid,
       {p + "4.self_attn.q_proj.lora_A.weight", "layer 4"}},
      {"layer not a number",
       "tiny",
       {{p + "x.self_attn.q_proj.lora_A.weight", {4, 128}, {}}},
       kInvalid,
       {p + "x.self_attn.q_proj.lora_A.weight", "layer index"}},
      {"A without B",
       "tiny",
       plus(QPair(0), {{p + "1.mlp.up_proj.lora_A.weight", {4, 128}, {}}}),
       kInvalid,
       {p + "1.mlp.up_proj.lora_A.weight", "no matching lora_B"}},
      {"B without A",
       "tiny",
       plus(QPair(0), {{p + "3.self_attn.o_proj.lora_B.weight", {128, 4}, {}}}),
       kInvalid,
       {p + "3.self_attn.o_proj.lora_B.weight", "no matching lora_A"}},
      {"A too wide",
       "tiny",
       {{p + "0.self_attn.k_proj.lora_A.weight", {4, 129}, {}},
        {p + "0.self_attn.k_proj.lora_B.weight", {64, 4}, {}}},
       kInvalid,
       {p + "0.self_attn.k_proj.lora_A.weight", "[4, 129]", "expected [4, 128]"}},
      {"B with q's rows for k",
       "tiny",
       {{p + "0.self_attn.k_proj.lora_A.weight", {4, 128}, {}},
        {p + "0.self_attn.k_proj.lora_B.weight", {128, 4}, {}}},
       kInvalid,
       {p + "0.self_attn.k_proj.lora_B.weight", "[128, 4]", "expected [64, 4]"}},
      {"rank other than r",
       "tiny",
       {{p + "0.mlp.down_proj.lora_A.weight", {8, 352}, {}},
        {p + "0.mlp.down_proj.lora_B.weight", {128, 8}, {}}},
       kInvalid,
       {p + "0.mlp.down_proj.lora_A.weight", "[8, 352]", "expected [4, 352]", "r = 4"}},
      {"1-D",
       "tiny",
       {{p + "0.self_attn.q_proj.lora_A.weight", {512}, {}},
        {p + "0.self_attn.q_proj.lora_B.weight", {128, 4}, {}}},
       kInvalid,
       {p + "0.self_attn.q_proj.lora_A.weight", "[512]", "expected [4, 128]"}},
      {"fused B of the wrong height",
       "tiny-phi3",
       {{p + "0.mlp.gate_up_proj.lora_A.weight", {4, 128}, {}},
        {p + "0.mlp.gate_up_proj.lora_B.weight", {352, 4}, {}}},
       kInvalid,
       {p + "0.mlp.gate_up_proj.lora_B.weight", "expected [704, 4]"}},
      {"NaN in A",
       "tiny",
       {{p + "0.self_attn.q_proj.lora_A.weight", {4, 128}, a_with_nan},
        {p + "0.self_attn.q_proj.lora_B.weight", {128, 4}, {}}},
       kInvalid,
       {p + "0.self_attn.q_proj.lora_A.weight", "not finite", "index 77"}},
      {"infinity in B",
       "tiny",
       {{p + "0.self_attn.q_proj.lora_A.weight", {4, 128}, {}},
        {p + "0.self_attn.q_proj.lora_B.weight", {128, 4}, b_with_inf}},
       kInvalid,
       {p + "0.self_attn.q_proj.lora_B.weight", "not finite", "index 300"}},
      {"the same weight twice",
       "tiny",
       plus(QPair(0), {{"model.layers.0.self_attn.q_proj.lora_A.weight", {4, 128}, {}}}),
       kInvalid,
       {"the same weight as"}},
      {"two adapter names",
       "tiny",
       {{p + "0.self_attn.q_proj.lora_A.default.weight", {4, 128}, {}},
        {p + "0.self_attn.q_proj.lora_B.other.weight", {128, 4}, {}}},
       kInvalid,
       {"adapter name \"other\""}},
  };
  int n = 0;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.label);
    const std::string dir = WriteAdapter(absl::StrCat("tensors", n++), kConfigR4, c.tensors);
    ExpectError(LoadLoraAdapter(ConfigOf(c.size), "a", dir), c.code, c.message);
  }
}

TEST(LoraTest, RefusesAScaleThatOverflowsFloat) {
  const std::string dir = WriteAdapter("overflow", R"({"r": 4, "lora_alpha": 1e300})", QPair(0));
  ExpectError(LoadLoraAdapter(ConfigOf("tiny"), "a", dir), absl::StatusCode::kInvalidArgument,
              {"base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight", "scale"});
}

// Gemma 3's multimodal models (config.json's gemma3: its language model served): PEFT names the
// language model's projections under language_model.model. (or model.language_model.), read as
// the text model's; the vision tower's and projector's adapters are skipped, since text-only
// serving never runs them; an adapter of nothing else is refused.
TEST(LoraTest, MultimodalGemma3AdaptersNameTheLanguageModel) {
  LlamaConfig config = ConfigOf("tiny");
  config.multimodal_wrapper = true;
  const std::string canonical = WriteAdapter("mm_canonical", kConfigR4, QPair(2));
  config.multimodal_wrapper = false;
  const LoraAdapter expected = Load(config, canonical);
  config.multimodal_wrapper = true;
  const auto [a, b] = QPairValues(canonical);
  int n = 0;
  for (const std::string prefix :
       {"base_model.model.language_model.model.", "base_model.model.model.language_model."}) {
    SCOPED_TRACE(prefix);
    std::vector<HandTensor> tensors = QPair(2, prefix);
    tensors[0].values = a;
    tensors[1].values = b;
    tensors.push_back(
        {"base_model.model.vision_tower.vision_model.encoder.layers.0.self_attn."
         "q_proj.lora_A.weight",
         {4, 32},
         {}});
    tensors.push_back(
        {"base_model.model.multi_modal_projector.mm_input_projection.lora_B.weight", {32, 4}, {}});
    const LoraAdapter adapter =
        Load(config, WriteAdapter(absl::StrCat("mm", n++), kConfigR4, tensors));
    EXPECT_EQ(adapter.layers[2].at(LoraTarget::kQ).a, expected.layers[2].at(LoraTarget::kQ).a);
    EXPECT_EQ(adapter.layers[2].at(LoraTarget::kQ).b, expected.layers[2].at(LoraTarget::kQ).b);
    EXPECT_EQ(adapter.layers[1].at(LoraTarget::kQ).rank, 0);
  }
  const std::string vision_only = WriteAdapter(
      "mm_vision", kConfigR4,
      {{"base_model.model.vision_tower.vision_model.encoder.layers.0.self_attn.q_proj.lora_A."
        "weight",
        {4, 32},
        {}}});
  ExpectError(LoadLoraAdapter(config, "a", vision_only), absl::StatusCode::kInvalidArgument,
              {"adapts only the vision tower"});
  // A text model reads such names as any other unknown name: refused.
  config.multimodal_wrapper = false;
  std::vector<HandTensor> tensors = QPair(2, "base_model.model.language_model.model.");
  EXPECT_FALSE(LoadLoraAdapter(config, "a", WriteAdapter("mm_text", kConfigR4, tensors)).ok());
}

// A mixture of experts' attention may be adapted; its experts may not (refused by name, as
// their products are the experts', not one MLP's), except in its dense layers.
TEST(LoraTest, MixtureOfExpertsAdaptsAttentionAndDenseLayersOnly) {
  const LlamaConfig mixtral = ConfigOf("tiny-mixtral");
  ASSERT_TRUE(mixtral.IsMoeLayer(0));
  const LoraAdapter attention = Load(mixtral, WriteAdapter("moe_q", kConfigR4, QPair(2)));
  EXPECT_EQ(attention.layers[2].at(LoraTarget::kQ).rank, 4);
  const auto mlp_pair = [](int layer, const char* module, int64_t in, int64_t out) {
    const std::string base = absl::StrCat("base_model.model.model.layers.", layer, ".", module);
    return std::vector<HandTensor>{{base + ".lora_A.weight", {4, in}, {}},
                                   {base + ".lora_B.weight", {out, 4}, {}}};
  };
  ExpectError(
      LoadLoraAdapter(mixtral, "a",
                      WriteAdapter("moe_gate", kConfigR4, mlp_pair(1, "mlp.gate_proj", 128, 352))),
      absl::StatusCode::kUnimplemented,
      {"layers.1.mlp.gate_proj.lora_A.weight",
       "adapts the MLP of layer 1, a mixture of "
       "experts"});
  for (const char* module :
       {"block_sparse_moe.experts.0.w1", "mlp.experts.3.gate_proj", "block_sparse_moe.gate"}) {
    ExpectError(
        LoadLoraAdapter(mixtral, "a",
                        WriteAdapter("moe_expert", kConfigR4, mlp_pair(0, module, 128, 352))),
        absl::StatusCode::kUnimplemented,
        {module, "adapts a mixture of experts' expert or router"});
  }
  // tiny-qwen3-moe's last layer is dense: its MLP is adapted like any model's.
  const LlamaConfig qwen = ConfigOf("tiny-qwen3-moe");
  ASSERT_FALSE(qwen.IsMoeLayer(3));
  const LoraAdapter dense =
      Load(qwen, WriteAdapter("moe_dense_down", kConfigR4, mlp_pair(3, "mlp.down_proj", 352, 128)));
  EXPECT_EQ(dense.layers[3].at(LoraTarget::kDown).rank, 4);
  ExpectError(
      LoadLoraAdapter(qwen, "a",
                      WriteAdapter("moe_down", kConfigR4, mlp_pair(2, "mlp.down_proj", 352, 128))),
      absl::StatusCode::kUnimplemented, {"adapts the MLP of layer 2"});
}

}  // namespace
}  // namespace kvrm
