#include "runtime/model_bundle.h"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <string_view>

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
  // Transformers' LlamaTokenizer and LlamaTokenizerFast (Llama 2, Mistral v0.1-v0.2, CodeLlama,
  // TinyLlama) rebuild the post-processor when they load: BOS unless add_bos_token is false, EOS
  // when add_eos_token is true, whatever tokenizer.json's post_processor says. Prompts here are
  // encoded as theirs are.
  static constexpr std::string_view kLlamaTokenizers[] = {
      "LlamaTokenizer", "LlamaTokenizerFast", "CodeLlamaTokenizer", "CodeLlamaTokenizerFast"};
  const ChatConfig& chat = bundle->chat;
  if (std::find(std::begin(kLlamaTokenizers), std::end(kLlamaTokenizers), chat.tokenizer_class) !=
      std::end(kLlamaTokenizers)) {
    const bool add_bos = chat.add_bos_token.value_or(true);
    const bool add_eos = chat.add_eos_token.value_or(false);
    if (absl::Status st = bundle->tokenizer->SetSpecialTokensTemplate(
            add_bos ? std::optional<std::string_view>(chat.bos_token) : std::nullopt,
            add_eos ? std::optional<std::string_view>(chat.eos_token) : std::nullopt);
        !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(dir, "/tokenizer_config.json (",
                                                     chat.tokenizer_class, "): ", st.message()));
    }
  }
  return bundle;
}

}  // namespace kvrm
