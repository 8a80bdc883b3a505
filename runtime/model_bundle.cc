#include "runtime/model_bundle.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kvrm {

absl::StatusOr<std::unique_ptr<ModelBundle>> ModelBundle::Load(const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat(dir, ": not a model directory"));
  }
  auto bundle = std::make_unique<ModelBundle>();
  bundle->dir = dir;
  bundle->name = std::filesystem::path(dir).lexically_normal().filename().string();
  if (bundle->name.empty()) {
    bundle->name = std::filesystem::path(dir).lexically_normal().parent_path().filename();
  }
  ASSIGN_OR_RETURN(bundle->config, LoadLlamaConfig(dir));
  ASSIGN_OR_RETURN(bundle->files, SafetensorsSet::OpenDirectory(dir));
  ASSIGN_OR_RETURN(bundle->weights, BindLlamaWeights(bundle->config, *bundle->files));
  ASSIGN_OR_RETURN(bundle->tokenizer,
                   Tokenizer::FromFile(dir + "/tokenizer.json", bundle->config.vocab_size));
  if (bundle->tokenizer->vocab_size() > bundle->config.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, "/tokenizer.json: ", bundle->tokenizer->vocab_size(),
                     " tokens but config.json vocab_size is ", bundle->config.vocab_size));
  }
  ASSIGN_OR_RETURN(bundle->chat, LoadChatConfig(dir));
  return bundle;
}

}  // namespace kvrm
