// Calibrated FP8 KV cache scales: the amax the engine records is the float64 reference's over
// the same tokens, and the scales written into a one-file or a sharded checkpoint are what the
// loader then reads, the rest of the checkpoint unchanged.
#include "tools/kv_scales/kv_scales.h"

#include <filesystem>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/safetensors.h"
#include "runtime/engine.h"
#include "tests/reference_llama.h"
#include "tools/modelgen/model_writer.h"

namespace kvrm {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string NewModel(const std::string& name, int shards) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = (fs::path(tmp != nullptr ? tmp : "/tmp") / name).string();
  fs::remove_all(dir);
  modelgen::MakeModelOptions o;
  o.size = "tiny";
  o.out_dir = dir;
  o.shards = shards;
  o.seed = 3;
  o.dtype = DType::kF32;  // (bf16 weights: the avx512_bf16 path rounds activations, ~1e-3)
  CHECK_OK(modelgen::MakeModel(o).status());
  return dir;
}

std::unique_ptr<ModelBundle> Load(const std::string& dir) {
  absl::StatusOr<std::unique_ptr<ModelBundle>> m = ModelBundle::Load(dir);
  CHECK_OK(m.status());
  return std::move(*m);
}

std::vector<std::vector<int32_t>> RandomSequences(int32_t vocab) {
  std::mt19937 rng(17);
  std::vector<std::vector<int32_t>> out;
  for (int len : {40, 300, 7}) {  // 300: two chunks of 256
    std::vector<int32_t>& s = out.emplace_back();
    for (int i = 0; i < len; ++i) s.push_back(static_cast<int32_t>(rng() % vocab));
  }
  return out;
}

// The engine's amax (f32, after RoPE) against the reference's (float64) over the same tokens,
// f32 weights: within 1e-5 relative; the scales are amax / 448.
TEST(KvScalesTest, AmaxIsTheReferencesOverTheSameTokens) {
  const std::string dir = NewModel("kv_scales_amax", 1);
  std::unique_ptr<ModelBundle> m = Load(dir);
  const std::vector<std::vector<int32_t>> seqs = RandomSequences(m->config.vocab_size);
  absl::StatusOr<KvScaleCalibration> c = CalibrateKvScales(*m, seqs, KvScaleOptions{});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sequences, 3);
  EXPECT_EQ(c->tokens, 347);
  absl::StatusOr<std::unique_ptr<ReferenceLlama>> ref =
      ReferenceLlama::Create(m->config, *m->files);
  ASSERT_TRUE(ref.ok()) << ref.status();
  for (const auto& s : seqs) (*ref)->Forward(s);
  const std::vector<std::pair<double, double>> want = (*ref)->kv_amax();
  ASSERT_EQ(want.size(), c->amax.size());
  for (size_t l = 0; l < want.size(); ++l) {
    EXPECT_NEAR(c->amax[l].first, want[l].first, 1e-5 * want[l].first) << l;
    EXPECT_NEAR(c->amax[l].second, want[l].second, 1e-5 * want[l].second) << l;
    EXPECT_EQ(c->scales[l].first, c->amax[l].first / 448.0f);
    EXPECT_EQ(c->scales[l].second, c->amax[l].second / 448.0f);
  }
  KvScaleOptions e5m2;
  e5m2.format = DType::kF8E5M2;
  c = CalibrateKvScales(*m, seqs, e5m2);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->scales[0].first, c->amax[0].first / 57344.0f);
  // Nothing to calibrate on, or a text longer than the model's positions: refused.
  EXPECT_EQ(CalibrateKvScales(*m, {}, KvScaleOptions{}).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<std::vector<int32_t>> too_long = {
      std::vector<int32_t>(m->config.max_position_embeddings + 1, 5)};
  EXPECT_EQ(CalibrateKvScales(*m, too_long, KvScaleOptions{}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

void ExpectWrittenScalesLoad(int shards) {
  const std::string dir = NewModel(absl::StrCat("kv_scales_write_", shards), shards);
  std::unique_ptr<ModelBundle> before = Load(dir);
  absl::StatusOr<KvScaleCalibration> c =
      CalibrateKvScales(*before, RandomSequences(before->config.vocab_size), KvScaleOptions{});
  ASSERT_TRUE(c.ok()) << c.status();
  const std::vector<std::string> names_before = before->files->TensorNames();
  const float embed_before = FloatElement(*before->files->Get("model.embed_tokens.weight"), 77);
  ASSERT_TRUE(WriteKvScales(*before, *c).ok());
  before.reset();

  std::unique_ptr<ModelBundle> after = Load(dir);
  EXPECT_EQ(after->weights.kv_cache_scales, "self_attn.k_scale / v_scale");
  for (int32_t l = 0; l < after->config.num_hidden_layers; ++l) {
    EXPECT_EQ(after->weights.layers[l].k_cache_scale, c->scales[l].first) << l;
    EXPECT_EQ(after->weights.layers[l].v_cache_scale, c->scales[l].second) << l;
  }
  EXPECT_EQ(after->files->TensorNames().size(),
            names_before.size() + 2 * static_cast<size_t>(after->config.num_hidden_layers));
  EXPECT_EQ(FloatElement(*after->files->Get("model.embed_tokens.weight"), 77), embed_before);
  EXPECT_EQ(fs::exists(dir + "/kv_cache_scales.safetensors"), shards > 1);
  // The engine serves an FP8 cache with them; a second calibration is refused.
  EngineOptions o;
  o.slots = 1;
  o.max_context = 64;
  o.threads = 1;
  o.kv_dtype = DType::kF8E4M3;
  EXPECT_TRUE(Engine::Create(after.get(), o).ok());
  const absl::Status again = WriteKvScales(*after, *c);
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(again.message(), HasSubstr("already has KV cache scales"));
}

TEST(KvScalesTest, WrittenIntoOneFileTheLoaderReadsThem) { ExpectWrittenScalesLoad(1); }
TEST(KvScalesTest, WrittenAsANewShardTheLoaderReadsThem) { ExpectWrittenScalesLoad(2); }

}  // namespace
}  // namespace kvrm
