#include "model/chat_config.h"

#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/json.h"
#include "common/status_macros.h"

namespace kvrm {
namespace {

// A special token as tokenizer_config.json writes it: a string, an AddedToken object, or null.
absl::StatusOr<std::string> TokenString(const Json& config, const char* key,
                                        const std::string& file) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::string();
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto content = it->find("content");
    if (content != it->end() && content->is_string()) return content->get<std::string>();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(file, ": ", key, ": expected a string or an object with a string \"content\""));
}

// The template text in tokenizer_config.json, or "" when there is none.
absl::StatusOr<std::string> TemplateSource(const Json& config, const std::string& file) {
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) return std::string();
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    for (const Json& entry : *it) {
      if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") ||
          !entry["name"].is_string() || !entry["template"].is_string()) {
        return absl::InvalidArgumentError(absl::StrCat(
            file, ": chat_template: a list's entries must be {\"name\": ..., \"template\": ...}"));
      }
      if (entry["name"].get<std::string>() == "default") {
        return entry["template"].get<std::string>();
      }
    }
    return std::string();  // named templates only (tool use, RAG): no default to render
  }
  return absl::InvalidArgumentError(
      absl::StrCat(file, ": chat_template: expected a string or a list of named templates"));
}

// The tool-call format of a template: gpt-oss's harmony calls reach the tool-call stream as
// the Hermes markup HarmonyStream writes (model/harmony.h).
ToolCallFormat HarmonyAwareToolCallFormat(std::string_view source, ReasoningFormat reasoning) {
  return reasoning == ReasoningFormat::kHarmony ? ToolCallFormat::kHermes
                                                : DetectToolCallFormat(source);
}

}  // namespace

void SetChatTemplate(std::string_view source, std::string where, ChatConfig* config) {
  config->source = std::move(where);
  absl::StatusOr<ChatTemplate> parsed = ChatTemplate::Parse(source);
  config->reasoning_format = DetectReasoningFormat(source);
  config->tool_call_format = HarmonyAwareToolCallFormat(source, config->reasoning_format);
  if (parsed.ok()) {
    config->chat_template = std::make_shared<const ChatTemplate>(*std::move(parsed));
    config->status = absl::OkStatus();
  } else {
    config->chat_template.reset();
    config->status = absl::InvalidArgumentError(absl::StrCat(
        "the model's chat template (", config->source, ") is not usable: ",
        parsed.status().message()));
  }
}

absl::StatusOr<std::string> ChatConfig::Render(ChatTemplateInputs inputs) const {
  if (chat_template == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("chat: ", status.message()));
  }
  inputs.bos_token = bos_token;
  inputs.eos_token = eos_token;
  absl::StatusOr<std::string> text = chat_template->Render(inputs);
  if (!text.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("chat: ", text.status().message()));
  }
  return text;
}

absl::StatusOr<ChatConfig> LoadChatConfig(const std::string& dir) {
  ChatConfig config;
  const std::string config_path = dir + "/tokenizer_config.json";
  std::error_code ec;
  std::string source;
  if (std::filesystem::exists(config_path, ec)) {
    ASSIGN_OR_RETURN(Json json, ReadJsonFile(config_path));
    if (!json.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(config_path, ": expected a JSON object"));
    }
    ASSIGN_OR_RETURN(config.bos_token, TokenString(json, "bos_token", config_path));
    ASSIGN_OR_RETURN(config.eos_token, TokenString(json, "eos_token", config_path));
    if (auto it = json.find("tokenizer_class"); it != json.end() && !it->is_null()) {
      if (!it->is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(config_path, ": tokenizer_class: expected a string"));
      }
      config.tokenizer_class = it->get<std::string>();
    }
    for (const auto& [key, out] : {std::pair{"add_bos_token", &config.add_bos_token},
                                   std::pair{"add_eos_token", &config.add_eos_token}}) {
      auto it = json.find(key);
      if (it == json.end() || it->is_null()) continue;
      if (!it->is_boolean()) {
        return absl::InvalidArgumentError(
            absl::StrCat(config_path, ": ", key, ": expected true or false"));
      }
      *out = it->get<bool>();
    }
    ASSIGN_OR_RETURN(source, TemplateSource(json, config_path));
    if (!source.empty()) SetChatTemplate(source, "tokenizer_config.json", &config);
  }
  const std::string jinja_path = dir + "/chat_template.jinja";
  if (std::filesystem::exists(jinja_path, ec)) {
    ASSIGN_OR_RETURN(source, ReadFileToString(jinja_path));
    SetChatTemplate(source, "chat_template.jinja", &config);
  }
  return config;
}

absl::Status OverrideChatTemplate(const std::string& path, ChatConfig* config) {
  absl::StatusOr<std::string> source = ReadFileToString(path);
  if (!source.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--chat_template=", path, ": ", source.status().message()));
  }
  absl::StatusOr<ChatTemplate> parsed = ChatTemplate::Parse(*source);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--chat_template=", path, ": ", parsed.status().message()));
  }
  config->chat_template = std::make_shared<const ChatTemplate>(*std::move(parsed));
  config->status = absl::OkStatus();
  config->source = path;
  config->reasoning_format = DetectReasoningFormat(*source);
  config->tool_call_format = HarmonyAwareToolCallFormat(*source, config->reasoning_format);
  return absl::OkStatus();
}

}  // namespace kvrm
