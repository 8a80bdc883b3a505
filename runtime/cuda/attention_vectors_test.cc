#include "runtime/cuda/attention_vectors.h"

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cpu/weight_matrix.h"
#include "runtime/model_bundle.h"
#include "runtime/tp_shard.h"
#include "tools/modelgen/model_writer.h"

namespace kvrm::cuda {
namespace {

std::unique_ptr<ModelBundle> Model(const std::string& size, DType dtype) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  modelgen::MakeModelOptions options;
  options.size = size;
  options.dtype = dtype;
  options.out_dir = (std::filesystem::path(tmp != nullptr ? tmp : "/tmp") /
                     absl::StrCat("attention_vectors_", size, "_", std::string(DTypeName(dtype))))
                        .string();
  EXPECT_TRUE(modelgen::MakeModel(options).ok());
  auto bundle = ModelBundle::Load(options.out_dir);
  EXPECT_TRUE(bundle.ok()) << bundle.status();
  return std::move(*bundle);
}

std::vector<float> Values(const WeightMatrix& v) {
  std::vector<float> out(v.cols);
  WeightRowToFloat(v, 0, out.data());
  return out;
}

// The packed vectors of every rank at TP 1 and 2 against the whole model's tensors: each rank's
// [bq | bk | bv] is its heads' slice of each, the O bias and the norms whole; every vector
// 256-byte aligned; absent ones -1.
void ExpectPacked(const std::string& size, DType dtype) {
  SCOPED_TRACE(absl::StrCat(size, " ", std::string(DTypeName(dtype))));
  const auto model = Model(size, dtype);
  const LlamaConfig& c = model->config;
  const int64_t hd = c.head_dim, d = c.hidden_size;
  for (int32_t tp : {1, 2}) {
    for (int32_t r = 0; r < tp; ++r) {
      SCOPED_TRACE(absl::StrCat("rank ", r, " of ", tp));
      auto w = ShardLlamaWeights(c, model->weights, r, tp);
      ASSERT_TRUE(w.ok()) << w.status();
      auto packed = PackAttentionVectors(c, *w);
      ASSERT_TRUE(packed.ok()) << packed.status();
      ASSERT_EQ(packed->layers.size(), static_cast<size_t>(c.num_hidden_layers));
      const int64_t qw = c.num_attention_heads / tp * hd, kvw = c.num_key_value_heads / tp * hd;
      const float* data = packed->data.data();
      for (int32_t layer = 0; layer < c.num_hidden_layers; ++layer) {
        const LayerWeights& full = model->weights.layers[layer];
        const AttentionVectors::Layer& at = packed->layers[layer];
        for (int64_t offset : {at.qkv_bias, at.o_bias, at.q_norm, at.k_norm}) {
          if (offset >= 0) {
            EXPECT_EQ(offset % 64, 0);
          }
        }
        ASSERT_EQ(at.qkv_bias >= 0, c.qkv_bias);
        ASSERT_EQ(at.o_bias >= 0, c.o_bias);
        ASSERT_EQ(at.q_norm >= 0, c.qk_norm);
        ASSERT_EQ(at.k_norm >= 0, c.qk_norm);
        if (c.qkv_bias) {
          const std::vector<float> bq = Values(full.bq), bk = Values(full.bk), bv = Values(full.bv);
          for (int64_t i = 0; i < qw; ++i) EXPECT_EQ(data[at.qkv_bias + i], bq[r * qw + i]);
          for (int64_t i = 0; i < kvw; ++i) {
            EXPECT_EQ(data[at.qkv_bias + qw + i], bk[r * kvw + i]);
            EXPECT_EQ(data[at.qkv_bias + qw + kvw + i], bv[r * kvw + i]);
          }
        }
        if (c.o_bias) {
          const std::vector<float> bo = Values(full.bo);
          for (int64_t i = 0; i < d; ++i) EXPECT_EQ(data[at.o_bias + i], bo[i]);
        }
        if (c.qk_norm) {
          const std::vector<float> qn = Values(full.q_norm), kn = Values(full.k_norm);
          for (int64_t i = 0; i < hd; ++i) {
            EXPECT_EQ(data[at.q_norm + i], qn[i]);
            EXPECT_EQ(data[at.k_norm + i], kn[i]);
          }
        }
      }
    }
  }
}

TEST(AttentionVectorsTest, Qwen2BiasesCutByHeads) {
  ExpectPacked("tiny-qwen2", DType::kBF16);
  ExpectPacked("tiny-qwen2", DType::kF32);
}

TEST(AttentionVectorsTest, Qwen3Norms) {
  ExpectPacked("tiny-qwen3", DType::kBF16);
  ExpectPacked("tiny-qwen3", DType::kF16);
}

TEST(AttentionVectorsTest, BiasedLlamaWithOBias) { ExpectPacked("tiny-biased", DType::kBF16); }

TEST(AttentionVectorsTest, PlainLlamaHasNone) {
  const auto model = Model("tiny", DType::kBF16);
  auto w = ShardLlamaWeights(model->config, model->weights, 0, 1);
  ASSERT_TRUE(w.ok());
  auto packed = PackAttentionVectors(model->config, *w);
  ASSERT_TRUE(packed.ok());
  EXPECT_TRUE(packed->data.empty());
  ASSERT_EQ(packed->layers.size(), static_cast<size_t>(model->config.num_hidden_layers));
  for (const AttentionVectors::Layer& at : packed->layers) {
    EXPECT_EQ(at.qkv_bias, -1);
    EXPECT_EQ(at.o_bias, -1);
    EXPECT_EQ(at.q_norm, -1);
    EXPECT_EQ(at.k_norm, -1);
  }
}

TEST(AttentionVectorsTest, MissingOrMisshapedVectorIsAnError) {
  const auto model = Model("tiny-qwen2", DType::kBF16);
  auto w = ShardLlamaWeights(model->config, model->weights, 0, 1);
  ASSERT_TRUE(w.ok());
  RankWeights missing = std::move(*w);
  missing.layers[2].bk = WeightMatrix{};
  auto packed = PackAttentionVectors(model->config, missing);
  EXPECT_EQ(packed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(packed.status().message().find("layer 2 k_proj.bias: missing"), std::string::npos)
      << packed.status();
  // A config that asks for an O bias the weights do not have.
  LlamaConfig c = model->config;
  c.o_bias = true;
  auto w2 = ShardLlamaWeights(model->config, model->weights, 0, 1);
  ASSERT_TRUE(w2.ok());
  packed = PackAttentionVectors(c, *w2);
  EXPECT_EQ(packed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(packed.status().message().find("layer 0 o_proj.bias"), std::string::npos)
      << packed.status();
  // Norms of another length than head_dim.
  c = model->config;
  c.qk_norm = true;
  LayerWeights& l0 = w2->layers[0];
  l0.q_norm = l0.bq;  // heads * head_dim values, not head_dim
  l0.k_norm = l0.bk;
  packed = PackAttentionVectors(c, *w2);
  EXPECT_EQ(packed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(packed.status().message().find("layer 0 q_norm: a vector of another length"),
            std::string::npos)
      << packed.status();
}

}  // namespace
}  // namespace kvrm::cuda
