// A model's chat template and the special-token strings it is rendered with.
//
// Hugging Face keeps the template in tokenizer_config.json (`chat_template`: a string, or a list
// of {name, template} of which "default" is used) or, since transformers 4.43, in its own file
// `chat_template.jinja` (which wins, as in transformers); `bos_token` and `eos_token` there are
// strings or AddedToken objects ({"content": ...}). A template that does not parse does not stop
// the model from loading: text and token-id prompts still work, and chat requests get the parse
// error (`status`).
#ifndef KVRM_MODEL_CHAT_CONFIG_H_
#define KVRM_MODEL_CHAT_CONFIG_H_

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/chat_template.h"
#include "model/reasoning.h"
#include "model/tool_calls.h"

namespace kvrm {

struct ChatConfig {
  std::shared_ptr<const ChatTemplate> chat_template;  // null: chat requests fail with `status`
  absl::Status status = absl::NotFoundError("the model has no chat template");
  std::string source;  // the file it came from, for logs
  std::string bos_token;
  std::string eos_token;
  // tokenizer_config.json's tokenizer_class, add_bos_token and add_eos_token: Transformers'
  // Llama tokenizers rebuild the post-processor from the two flags (see
  // ModelBundle::Load).
  std::string tokenizer_class;
  std::optional<bool> add_bos_token;
  std::optional<bool> add_eos_token;
  // How the template's model writes function calls (detected from the template's text; kvrmd's
  // --tool_call_parser overrides it): what tool_choice "auto" parses.
  ToolCallFormat tool_call_format = ToolCallFormat::kNone;
  // Whether the template's model thinks in <think> blocks (detected from the template's text;
  // kvrmd's --reasoning_parser overrides it): chat replies are split into reasoning and answer
  // (model/reasoning.h).
  ReasoningFormat reasoning_format = ReasoningFormat::kNone;

  // Renders `inputs` (bos_token and eos_token filled from this config); the error of a missing
  // or unparsable template, or the template's own (raise_exception), as INVALID_ARGUMENT.
  absl::StatusOr<std::string> Render(ChatTemplateInputs inputs) const;
};

// Reads `dir`/chat_template.jinja and `dir`/tokenizer_config.json when present. Errors only for
// a tokenizer_config.json that is not JSON or whose fields have the wrong types (naming the file
// and key); no template, or one that does not parse, is a ChatConfig whose `status` says so.
absl::StatusOr<ChatConfig> LoadChatConfig(const std::string& dir);

// Sets the config's template from its source text (`where` names it in logs and errors): a
// template that does not parse leaves chat requests failing with that error.
void SetChatTemplate(std::string_view source, std::string where, ChatConfig* config);

// Replaces the template with the file at `path` (kvrmd's --chat_template). The operator asked for
// it: a missing file or a template that does not parse is an error here (naming the path).
absl::Status OverrideChatTemplate(const std::string& path, ChatConfig* config);

}  // namespace kvrm

#endif  // KVRM_MODEL_CHAT_CONFIG_H_
