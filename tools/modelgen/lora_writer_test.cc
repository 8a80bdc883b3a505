// MakeLoraAdapter: determinism, adapter_config.json as PEFT names its fields, tensor names and
// shapes in PEFT's layout (Phi-3's fused ones too), the documented value scales, refused options,
// and make_model's --lora_* flags. Loading is model/lora_test's.
#include "tools/modelgen/lora_writer.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/json.h"
#include "gtest/gtest.h"
#include "model/config.h"
#include "model/lora.h"
#include "model/safetensors.h"
#include "tools/modelgen/prng.h"

namespace kvrm::modelgen {
namespace {

namespace fs = std::filesystem;

std::string TmpDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const fs::path dir = fs::path(base != nullptr ? base : "/tmp") / "lora_writer_test" / name;
  fs::remove_all(dir);
  return dir.string();
}

LlamaConfig ConfigOf(const std::string& size) {
  absl::StatusOr<LlamaConfig> config = LlamaConfigForSize(size);
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

std::string Write(const LlamaConfig& config, const std::string& name, MakeLoraOptions options) {
  options.out_dir = TmpDir(name);
  const absl::Status status = MakeLoraAdapter(config, options);
  EXPECT_TRUE(status.ok()) << status;
  return options.out_dir;
}

std::string Bytes(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? *text : "";
}

std::vector<std::string> Files(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<float> Floats(const TensorView& t) {
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

TEST(LoraWriterTest, SameSeedSameBytesOtherSeedOtherValues) {
  const LlamaConfig config = ConfigOf("tiny");
  MakeLoraOptions options;
  options.seed = 5;
  options.dtype = DType::kBF16;
  const std::string a = Write(config, "det_a", options);
  const std::string b = Write(config, "det_b", options);
  EXPECT_EQ(Files(a),
            (std::vector<std::string>{"adapter_config.json", "adapter_model.safetensors"}));
  EXPECT_EQ(Files(a), Files(b));
  for (const std::string& f : Files(a)) {
    EXPECT_TRUE(Bytes(a + "/" + f) == Bytes(b + "/" + f)) << f;
  }
  // Rewriting into the same directory gives the same bytes again, and nothing left over.
  options.out_dir = a;
  ASSERT_TRUE(MakeLoraAdapter(config, options).ok());
  EXPECT_EQ(Files(a), Files(b));
  EXPECT_TRUE(Bytes(a + "/adapter_model.safetensors") == Bytes(b + "/adapter_model.safetensors"));

  options.seed = 6;
  const std::string c = Write(config, "det_c", options);
  EXPECT_EQ(Bytes(a + "/adapter_config.json"), Bytes(c + "/adapter_config.json"));
  auto fa = SafetensorsFile::Open(a + "/adapter_model.safetensors");
  auto fc = SafetensorsFile::Open(c + "/adapter_model.safetensors");
  ASSERT_TRUE(fa.ok() && fc.ok());
  EXPECT_EQ((*fa)->TensorNames(), (*fc)->TensorNames());
  for (const std::string& name : (*fa)->TensorNames()) {
    EXPECT_NE(Floats(*(*fa)->Find(name)), Floats(*(*fc)->Find(name))) << name;
  }
}

TEST(LoraWriterTest, ValuesDependOnlyOnSeedAndTensorName) {
  const LlamaConfig config = ConfigOf("tiny");
  MakeLoraOptions options;
  options.seed = 9;
  const std::string all = Write(config, "all", options);
  options.target_modules = {"v_proj"};
  options.layers = {2};
  const std::string one = Write(config, "one", options);
  auto fa = SafetensorsFile::Open(all + "/adapter_model.safetensors");
  auto fo = SafetensorsFile::Open(one + "/adapter_model.safetensors");
  ASSERT_TRUE(fa.ok() && fo.ok());
  for (const std::string& name : (*fo)->TensorNames()) {
    ASSERT_NE((*fa)->Find(name), nullptr) << name;
    EXPECT_EQ(Floats(*(*fa)->Find(name)), Floats(*(*fo)->Find(name))) << name;
  }
}

TEST(LoraWriterTest, ConfigHasPeftsFieldsAndNames) {
  const LlamaConfig config = ConfigOf("tiny");
  MakeLoraOptions options;
  options.rank = 16;
  options.alpha = 32;
  options.use_rslora = true;
  options.target_modules = {"v_proj", "q_proj", "down_proj", "q_proj"};
  options.layers = {3, 0};
  options.base_model = "meta-llama/Llama-3.2-1B";
  const std::string dir = Write(config, "config", options);
  absl::StatusOr<Json> json = ReadJsonFile(dir + "/adapter_config.json");
  ASSERT_TRUE(json.ok()) << json.status();
  const Json& c = *json;
  EXPECT_EQ(c["peft_type"], "LORA");
  EXPECT_EQ(c["task_type"], "CAUSAL_LM");
  EXPECT_TRUE(c["r"].is_number_integer());
  EXPECT_EQ(c["r"], 16);
  EXPECT_TRUE(c["lora_alpha"].is_number_integer());  // PEFT writes an int alpha as an int
  EXPECT_EQ(c["lora_alpha"], 32);
  EXPECT_EQ(c["use_rslora"], true);
  EXPECT_EQ(c["target_modules"], Json({"q_proj", "v_proj", "down_proj"}));  // forward order
  EXPECT_EQ(c["layers_to_transform"], Json({0, 3}));
  EXPECT_EQ(c["bias"], "none");
  EXPECT_EQ(c["fan_in_fan_out"], false);
  EXPECT_EQ(c["use_dora"], false);
  EXPECT_EQ(c["lora_dropout"], 0);
  EXPECT_TRUE(c.contains("modules_to_save") && c["modules_to_save"].is_null());
  EXPECT_EQ(c["rank_pattern"], Json::object());
  EXPECT_EQ(c["alpha_pattern"], Json::object());
  EXPECT_EQ(c["base_model_name_or_path"], "meta-llama/Llama-3.2-1B");
  EXPECT_EQ(c["inference_mode"], true);
  // Every layer: layers_to_transform null; a fractional alpha stays a float.
  options.layers.clear();
  options.alpha = 12.5;
  const std::string every = Write(config, "config_every", options);
  json = ReadJsonFile(every + "/adapter_config.json");
  ASSERT_TRUE(json.ok());
  EXPECT_TRUE((*json)["layers_to_transform"].is_null());
  EXPECT_EQ((*json)["lora_alpha"], 12.5);
}

TEST(LoraWriterTest, TensorsHavePeftNamesShapesAndDtype) {
  const LlamaConfig config = ConfigOf("tiny");
  MakeLoraOptions options;
  options.rank = 4;
  options.target_modules = {"o_proj", "gate_proj", "k_proj"};
  options.layers = {1};
  options.dtype = DType::kF16;
  const std::string dir = Write(config, "names", options);
  auto file = SafetensorsFile::Open(dir + "/adapter_model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  const std::string p = "base_model.model.model.layers.1.";
  EXPECT_EQ((*file)->TensorNames(),
            (std::vector<std::string>{
                p + "mlp.gate_proj.lora_A.weight", p + "mlp.gate_proj.lora_B.weight",
                p + "self_attn.k_proj.lora_A.weight", p + "self_attn.k_proj.lora_B.weight",
                p + "self_attn.o_proj.lora_A.weight", p + "self_attn.o_proj.lora_B.weight"}));
  const auto shape = [&](const std::string& name) { return (*file)->Find(p + name)->shape; };
  EXPECT_EQ(shape("self_attn.k_proj.lora_A.weight"), (std::vector<int64_t>{4, 128}));
  EXPECT_EQ(shape("self_attn.k_proj.lora_B.weight"), (std::vector<int64_t>{64, 4}));
  EXPECT_EQ(shape("self_attn.o_proj.lora_A.weight"), (std::vector<int64_t>{4, 128}));
  EXPECT_EQ(shape("self_attn.o_proj.lora_B.weight"), (std::vector<int64_t>{128, 4}));
  EXPECT_EQ(shape("mlp.gate_proj.lora_A.weight"), (std::vector<int64_t>{4, 128}));
  EXPECT_EQ(shape("mlp.gate_proj.lora_B.weight"), (std::vector<int64_t>{352, 4}));
  for (const std::string& name : (*file)->TensorNames()) {
    EXPECT_EQ((*file)->Find(name)->dtype, DType::kF16) << name;
  }
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
}

TEST(LoraWriterTest, Phi3GetsTheFusedModules) {
  const LlamaConfig config = ConfigOf("tiny-phi3");
  MakeLoraOptions options;
  options.target_modules = {"k_proj", "up_proj"};  // what they mean in Phi-3
  options.layers = {0};
  const std::string dir = Write(config, "phi3", options);
  auto file = SafetensorsFile::Open(dir + "/adapter_model.safetensors");
  ASSERT_TRUE(file.ok());
  const std::string p = "base_model.model.model.layers.0.";
  EXPECT_EQ((*file)->TensorNames(),
            (std::vector<std::string>{
                p + "mlp.gate_up_proj.lora_A.weight", p + "mlp.gate_up_proj.lora_B.weight",
                p + "self_attn.qkv_proj.lora_A.weight", p + "self_attn.qkv_proj.lora_B.weight"}));
  EXPECT_EQ((*file)->Find(p + "self_attn.qkv_proj.lora_B.weight")->shape,
            (std::vector<int64_t>{128 + 2 * 64, 8}));
  EXPECT_EQ((*file)->Find(p + "mlp.gate_up_proj.lora_B.weight")->shape,
            (std::vector<int64_t>{2 * 352, 8}));
  absl::StatusOr<Json> json = ReadJsonFile(dir + "/adapter_config.json");
  ASSERT_TRUE(json.ok());
  EXPECT_EQ((*json)["target_modules"], Json({"qkv_proj", "gate_up_proj"}));
  // The default targets: every module a Phi-3 has.
  const std::string all = Write(config, "phi3_all", MakeLoraOptions{});
  json = ReadJsonFile(all + "/adapter_config.json");
  ASSERT_TRUE(json.ok());
  EXPECT_EQ((*json)["target_modules"], Json({"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}));
}

// A's std 1/sqrt(in), B's 0.3 / (scale sqrt(r)): scale * B A x has RMS ~0.3 for unit-RMS x.
TEST(LoraWriterTest, AdaptedOutputHasTheDocumentedRms) {
  const LlamaConfig config = ConfigOf("tiny");
  struct Case {
    int32_t rank;
    double alpha;
    bool rslora;
  };
  for (const Case& c : {Case{8, 16, false}, Case{16, 8, true}, Case{4, 32, false}}) {
    SCOPED_TRACE(absl::StrCat("r ", c.rank, " alpha ", c.alpha, " rslora ", c.rslora));
    MakeLoraOptions options;
    options.rank = c.rank;
    options.alpha = c.alpha;
    options.use_rslora = c.rslora;
    options.seed = 1;
    const std::string dir = Write(config, absl::StrCat("rms", c.rank), options);
    auto file = SafetensorsFile::Open(dir + "/adapter_model.safetensors");
    ASSERT_TRUE(file.ok());
    const double r = c.rank;
    const double scale = c.rslora ? c.alpha / std::sqrt(r) : c.alpha / r;
    Rng rng(42);
    double delta_sq = 0, a_sq = 0, b_sq = 0;
    int64_t delta_n = 0, a_n = 0, b_n = 0;
    for (const std::string& name : (*file)->TensorNames()) {
      if (name.find("lora_A") == std::string::npos) continue;
      std::string b_name = name;
      b_name.replace(b_name.find("lora_A"), 6, "lora_B");
      const TensorView& at = *(*file)->Find(name);
      const TensorView& bt = *(*file)->Find(b_name);
      const std::vector<float> a = Floats(at), b = Floats(bt);
      const int64_t in = at.shape[1], out = bt.shape[0];
      for (float v : a) a_sq += v * v * static_cast<double>(in);  // in units of 1/in
      a_n += a.size();
      for (float v : b) b_sq += v * v;
      b_n += b.size();
      for (int trial = 0; trial < 4; ++trial) {
        std::vector<double> x(in), ax(c.rank, 0.0);
        for (double& v : x) v = rng.Normal();
        for (int64_t k = 0; k < c.rank; ++k) {
          for (int64_t j = 0; j < in; ++j) ax[k] += a[k * in + j] * x[j];
        }
        for (int64_t i = 0; i < out; ++i) {
          double y = 0;
          for (int64_t k = 0; k < c.rank; ++k) y += b[i * c.rank + k] * ax[k];
          delta_sq += (scale * y) * (scale * y);
        }
        delta_n += out;
      }
    }
    EXPECT_NEAR(std::sqrt(a_sq / a_n), 1.0, 0.02);
    const double b_std = kLoraRelativeRms / (scale * std::sqrt(r));
    EXPECT_NEAR(std::sqrt(b_sq / b_n), b_std, 0.02 * b_std);
    EXPECT_NEAR(std::sqrt(delta_sq / delta_n), kLoraRelativeRms, 0.1 * kLoraRelativeRms);
  }
}

TEST(LoraWriterTest, RefusesBadOptions) {
  const LlamaConfig config = ConfigOf("tiny");
  const auto code = [&](const std::function<void(MakeLoraOptions&)>& edit) {
    MakeLoraOptions options;
    options.out_dir = TmpDir("refused");
    edit(options);
    return MakeLoraAdapter(config, options).code();
  };
  constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(code([](MakeLoraOptions& o) { o.out_dir.clear(); }), kInvalid);
  EXPECT_EQ(code([](MakeLoraOptions& o) { o.rank = 0; }), kInvalid);
  EXPECT_EQ(code([](MakeLoraOptions& o) { o.rank = kMaxLoraRank + 1; }), kInvalid);
  EXPECT_EQ(code([](MakeLoraOptions& o) { o.alpha = 0; }), kInvalid);
  EXPECT_EQ(code([](MakeLoraOptions& o) { o.alpha = NAN; }), kInvalid);
  EXPECT_EQ(code([](MakeLoraOptions& o) { o.target_modules = {}; }), kInvalid);
  EXPECT_EQ(code([](MakeLoraOptions& o) { o.target_modules = {"lm_head"}; }), kInvalid);
  EXPECT_EQ(code([](MakeLoraOptions& o) { o.target_modules = {"qkv_proj"}; }), kInvalid);
  EXPECT_EQ(code([](MakeLoraOptions& o) { o.layers = {4}; }), kInvalid);
  EXPECT_EQ(code([](MakeLoraOptions& o) { o.layers = {-1}; }), kInvalid);
  EXPECT_FALSE(fs::exists(TmpDir("refused")));  // nothing written
  EXPECT_EQ(LlamaConfigForSize("huge").status().code(), kInvalid);
}

TEST(LoraWriterTest, MakeModelWritesOnlyTheAdapterWithLoraOut) {
  const std::string dir = TmpDir("cli");
  const std::string cmd =
      absl::StrCat("tools/modelgen/make_model --size=tiny --lora_out=", dir,
                   " --lora_rank=4 --lora_alpha=8 --lora_targets=q_proj,v_proj --lora_layers=0,2"
                   " --lora_seed=3 --lora_dtype=bf16 > /dev/null");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  EXPECT_EQ(Files(dir),
            (std::vector<std::string>{"adapter_config.json", "adapter_model.safetensors"}));
  // The same as the library writes.
  MakeLoraOptions options;
  options.rank = 4;
  options.alpha = 8;
  options.target_modules = {"q_proj", "v_proj"};
  options.layers = {0, 2};
  options.seed = 3;
  options.dtype = DType::kBF16;
  options.base_model = "tiny";
  const std::string lib = Write(ConfigOf("tiny"), "cli_lib", options);
  for (const std::string& f : Files(lib)) {
    EXPECT_TRUE(Bytes(lib + "/" + f) == Bytes(dir + "/" + f)) << f;
  }
  EXPECT_NE(std::system(absl::StrCat("tools/modelgen/make_model --size=tiny --lora_out=", dir,
                                     "_bad --lora_targets=r_proj 2>/dev/null")
                            .c_str()),
            0);
  EXPECT_NE(std::system(absl::StrCat("tools/modelgen/make_model --size=tiny --lora_out=", dir,
                                     "_bad --lora_layers=x 2>/dev/null")
                            .c_str()),
            0);
}

}  // namespace
}  // namespace kvrm::modelgen
