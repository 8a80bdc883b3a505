// Loading a model directory as a whole: what tokenizer_config.json changes about the tokenizer.
#include "runtime/model_bundle.h"

#include <filesystem>
#include <fstream>

#include "common/json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/tokenizer.h"
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

}  // namespace
}  // namespace kvrm
