#include "model/pooling_config.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace kvrm {
namespace {

namespace fs = std::filesystem;

// A fresh model directory holding the given files (paths may name a subdirectory).
std::string ModelDir(const std::string& name,
                     const std::vector<std::pair<std::string, std::string>>& files) {
  const char* base = std::getenv("TEST_TMPDIR");
  const fs::path dir = fs::path(base != nullptr ? base : "/tmp") / ("pooling_config_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& [file, text] : files) {
    fs::create_directories((dir / file).parent_path());
    std::ofstream(dir / file) << text;
  }
  return dir.string();
}

constexpr char kModules[] = R"([
  {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
  {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
  {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
])";

TEST(PoolingConfigTest, ReadsQwen3EmbeddingsLastTokenPoolingAndNormalize) {
  // Qwen3-Embedding-0.6B's files, as published.
  const std::string dir =
      ModelDir("qwen3", {{"modules.json", kModules},
                         {"1_Pooling/config.json",
                          R"({"word_embedding_dimension": 1024, "pooling_mode_cls_token": false,
                     "pooling_mode_mean_tokens": false, "pooling_mode_max_tokens": false,
                     "pooling_mode_mean_sqrt_len_tokens": false,
                     "pooling_mode_weightedmean_tokens": false, "pooling_mode_lasttoken": true,
                     "include_prompt": true})"}});
  absl::StatusOr<std::optional<PoolingConfig>> c = LoadPoolingConfig(dir);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(c->has_value());
  EXPECT_EQ((*c)->pooling, "last");
  EXPECT_TRUE((*c)->normalize);
  EXPECT_TRUE(absl::EndsWith((*c)->source, "1_Pooling/config.json")) << (*c)->source;
}

TEST(PoolingConfigTest, MeanWithoutNormalize) {
  const std::string dir =
      ModelDir("mean", {{"modules.json",
                         R"([{"path": "", "type": "sentence_transformers.models.Transformer"},
                    {"path": "pool", "type": "sentence_transformers.models.Pooling"}])"},
                        {"pool/config.json", R"({"pooling_mode_mean_tokens": true})"}});
  absl::StatusOr<std::optional<PoolingConfig>> c = LoadPoolingConfig(dir);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(c->has_value());
  EXPECT_EQ((*c)->pooling, "mean");
  EXPECT_FALSE((*c)->normalize);
}

TEST(PoolingConfigTest, NoModulesJsonIsNotASentenceTransformersModel) {
  absl::StatusOr<std::optional<PoolingConfig>> c =
      LoadPoolingConfig(ModelDir("plain", {{"config.json", "{}"}}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->has_value());
}

TEST(PoolingConfigTest, WhatKvrmDoesNotComputeIsRefusedByName) {
  const std::vector<std::pair<std::string, std::vector<std::pair<std::string, std::string>>>>
      cases = {
          {"pooling_mode_max_tokens",
           {{"modules.json", kModules},
            {"1_Pooling/config.json", R"({"pooling_mode_max_tokens": true})"}}},
          {"a second pooling mode",
           {{"modules.json", kModules},
            {"1_Pooling/config.json",
             R"({"pooling_mode_lasttoken": true, "pooling_mode_mean_tokens": true})"}}},
          {"no pooling_mode_* is true",
           {{"modules.json", kModules}, {"1_Pooling/config.json", R"({"include_prompt": true})"}}},
          {"sentence_transformers.models.Dense",
           {{"modules.json",
             R"([{"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                 {"path": "2_Dense", "type": "sentence_transformers.models.Dense"}])"},
            {"1_Pooling/config.json", R"({"pooling_mode_mean_tokens": true})"}}},
          {"no sentence_transformers.models.Pooling",
           {{"modules.json", R"([{"type": "sentence_transformers.models.Transformer"}])"}}},
          {"not a list", {{"modules.json", R"({"type": "x"})"}}},
          {"include_prompt",
           {{"modules.json", kModules},
            {"1_Pooling/config.json",
             R"({"pooling_mode_mean_tokens": true, "include_prompt": false})"}}},
      };
  int i = 0;
  for (const auto& [want, files] : cases) {
    absl::StatusOr<std::optional<PoolingConfig>> c =
        LoadPoolingConfig(ModelDir("bad" + std::to_string(i++), files));
    ASSERT_FALSE(c.ok()) << want;
    EXPECT_TRUE(absl::IsInvalidArgument(c.status())) << c.status();
    EXPECT_TRUE(absl::StrContains(c.status().message(), want)) << c.status();
  }
}

}  // namespace
}  // namespace kvrm
