#include "server/messages_api.h"

#include <cstddef>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kvrm {
namespace {

using openai_json::Bad;
using openai_json::Dump;
using openai_json::Find;
using openai_json::RequiredString;
using openai_json::WrongType;

// kvrm's and vLLM's own sampling parameters, which a Messages body may carry under the chat
// API's names (Anthropic's own are translated below).
constexpr const char* kPassThrough[] = {
    "top_k",      "min_p",      "repetition_penalty", "presence_penalty", "frequency_penalty",
    "seed",       "cache_salt", "priority",           "request_id",       "chat_template_kwargs",
    "min_tokens", "ignore_eos", "stop_token_ids",     "logit_bias",       "bad_words"};

constexpr int kFromSystem = -1;

// What is refused by name rather than ignored (a client relying on it learns at once).
absl::Status RefuseUnsupported(const Json& body) {
  // (context_management, a beta's server-side clearing of old tool results, is ignored: the
  // conversation is served as sent.)
  for (const char* key : {"mcp_servers", "container"}) {
    if (Find(body, key) != nullptr) {
      return Bad(key, "is not supported: this server runs no server-side tools or containers");
    }
  }
  return absl::OkStatus();
}

// A text-only block list's text (system, tool_result content): text blocks joined; another
// block type (an image, a document) is refused naming it.
absl::StatusOr<std::string> TextBlocks(const Json& content, const std::string& at) {
  return openai_json::TextParts(content, at, {"text"});
}

// The chat conversation `messages` means, with `system` first; for each chat message the
// Anthropic message it came from (kFromSystem), to name messages in errors. Consecutive
// messages of one role are one turn, as Anthropic combines them.
class Conversation {
 public:
  absl::Status Build(const Json& body, const OrderedJson& ordered) {
    if (const Json* system = Find(body, "system")) {
      ASSIGN_OR_RETURN(std::string text, TextBlocks(*system, "system"));
      // An empty system prompt is none (a template would write an empty system block).
      if (!text.empty()) Append(kFromSystem, {{"role", "system"}, {"content", std::move(text)}});
    }
    const Json* messages = Find(body, "messages");
    if (messages == nullptr) return Bad("messages", "is required");
    if (!messages->is_array()) return WrongType("messages", "an array", *messages);
    if (messages->empty()) return Bad("messages", "has no messages");
    for (size_t i = 0; i < messages->size(); ++i) {
      const std::string at = absl::StrCat("messages[", i, "]");
      const Json& m = (*messages)[i];
      if (!m.is_object()) return WrongType(at, "an object", m);
      ASSIGN_OR_RETURN(std::string role, RequiredString(m, "role", at));
      if (role != "user" && role != "assistant") {
        return Bad(absl::StrCat(at, ".role"),
                   absl::StrCat("\"", role,
                                "\": use user or assistant (the system prompt is "
                                "the top-level `system`)"));
      }
      const Json* content = Find(m, "content");
      if (content == nullptr) return Bad(absl::StrCat(at, ".content"), "is required");
      last_role_ = role;
      if (content->is_string()) {
        Turn(static_cast<int>(i), role, content->get<std::string>());
        continue;
      }
      if (!content->is_array()) {
        return WrongType(absl::StrCat(at, ".content"), "a string or an array of blocks", *content);
      }
      RETURN_IF_ERROR(Blocks(static_cast<int>(i), role, *content, ordered["messages"][i]["content"],
                             absl::StrCat(at, ".content")));
    }
    return absl::OkStatus();
  }

  OrderedJson& messages() { return messages_; }
  const std::vector<int>& from() const { return from_; }
  // The last Anthropic message's role: an assistant's is continued (prefill).
  const std::string& last_role() const { return last_role_; }

 private:
  void Append(int from, OrderedJson message) {
    messages_.push_back(std::move(message));
    from_.push_back(from);
  }

  // `text` as the content of a turn of `role`: joined to the turn before when it is the same
  // role's (a tool message is not a user turn), else a new message.
  void Turn(int from, const std::string& role, const std::string& text) {
    if (!messages_.empty() && from_.back() != kFromSystem && messages_.back()["role"] == role) {
      OrderedJson& previous = messages_.back();
      std::string joined =
          previous["content"].is_string() ? previous["content"].get<std::string>() : std::string();
      if (!joined.empty() && !text.empty()) joined += "\n\n";
      joined += text;
      previous["content"] = std::move(joined);
      return;
    }
    Append(from, {{"role", role}, {"content", text}});
  }

  absl::Status Blocks(int index, const std::string& role, const Json& content,
                      const OrderedJson& ordered, const std::string& at) {
    std::string text;
    std::string thinking;
    OrderedJson calls = OrderedJson::array();
    auto flush_text = [&] {
      if (!text.empty()) Turn(index, role, text);
      text.clear();
    };
    for (size_t b = 0; b < content.size(); ++b) {
      const std::string bat = absl::StrCat(at, "[", b, "]");
      const Json& block = content[b];
      if (!block.is_object()) return WrongType(bat, "an object", block);
      ASSIGN_OR_RETURN(std::string type, RequiredString(block, "type", bat));
      if (type == "text") {
        ASSIGN_OR_RETURN(std::string t, RequiredString(block, "text", bat));
        text += t;  // blocks joined as the chat API joins parts: without a separator
      } else if (type == "tool_use" && role == "assistant") {
        ASSIGN_OR_RETURN(std::string id, RequiredString(block, "id", bat));
        ASSIGN_OR_RETURN(std::string name, RequiredString(block, "name", bat));
        const Json* input = Find(block, "input");
        if (input != nullptr && !input->is_object()) {
          return WrongType(absl::StrCat(bat, ".input"), "an object", *input);
        }
        calls.push_back({{"id", id},
                         {"type", "function"},
                         {"function",
                          {{"name", name},
                           {"arguments", input != nullptr ? Dump(ordered[b]["input"]) : "{}"}}}});
      } else if (type == "tool_result" && role == "user") {
        ASSIGN_OR_RETURN(std::string id, RequiredString(block, "tool_use_id", bat));
        std::string result;
        if (const Json* c = Find(block, "content")) {
          ASSIGN_OR_RETURN(result, TextBlocks(*c, absl::StrCat(bat, ".content")));
        }
        if (const Json* e = Find(block, "is_error"); e != nullptr && !e->is_boolean()) {
          return WrongType(absl::StrCat(bat, ".is_error"), "a boolean", *e);
        }
        flush_text();  // text before a result is its own turn, before it
        Append(index, {{"role", "tool"}, {"tool_call_id", id}, {"content", std::move(result)}});
      } else if (type == "thinking" && role == "assistant") {
        ASSIGN_OR_RETURN(std::string t, RequiredString(block, "thinking", bat));
        thinking += t;
      } else if (type == "redacted_thinking" && role == "assistant") {
        // Another server's encrypted thinking: nothing a template can show.
      } else if (type == "tool_use" || type == "tool_result" || type == "thinking" ||
                 type == "redacted_thinking") {
        return Bad(absl::StrCat(bat, ".type"),
                   absl::StrCat("\"", type, "\" blocks belong in ",
                                role == "user" ? "assistant" : "user", " messages"));
      } else {
        return Bad(absl::StrCat(bat, ".type"),
                   absl::StrCat("\"", type,
                                "\" is not supported: this server's models take text only "
                                "(text, tool_use, tool_result and thinking blocks are)"));
      }
    }
    if (role == "assistant" && (!calls.empty() || !thinking.empty())) {
      if (!messages_.empty() && from_.back() != kFromSystem &&
          messages_.back()["role"] == "assistant" && text.empty() && thinking.empty()) {
        for (OrderedJson& c : calls) messages_.back()["tool_calls"].push_back(std::move(c));
        return absl::OkStatus();
      }
      OrderedJson m = {{"role", "assistant"}, {"content", text}};
      if (!thinking.empty()) m["reasoning_content"] = std::move(thinking);
      if (!calls.empty()) m["tool_calls"] = std::move(calls);
      Append(index, std::move(m));
      return absl::OkStatus();
    }
    if (!text.empty() || content.empty()) Turn(index, role, text);
    return absl::OkStatus();
  }

  OrderedJson messages_ = OrderedJson::array();
  std::vector<int> from_;
  std::string last_role_;
};

// Custom tools in the chat API's shape ({"type": "function", "function": {...}}), and
// tool_choice.
absl::Status ChatTools(const Json& body, const OrderedJson& ordered, OrderedJson* chat) {
  if (const Json* tools = Find(body, "tools")) {
    if (!tools->is_array()) return WrongType("tools", "an array", *tools);
    OrderedJson out = OrderedJson::array();
    for (size_t i = 0; i < tools->size(); ++i) {
      const std::string at = absl::StrCat("tools[", i, "]");
      const Json& tool = (*tools)[i];
      if (!tool.is_object()) return WrongType(at, "an object", tool);
      if (const Json* type = Find(tool, "type")) {
        const std::string t = type->is_string() ? type->get<std::string>() : "";
        if (t != "custom") {
          return Bad(absl::StrCat(at, ".type"),
                     absl::StrCat("\"", t,
                                  "\" is not supported: only custom tools (a name and an "
                                  "input_schema); this server runs no server tools"));
        }
      }
      ASSIGN_OR_RETURN(std::string name, RequiredString(tool, "name", at));
      OrderedJson fn = {{"name", name}};
      if (Find(tool, "description") != nullptr)
        fn["description"] = ordered["tools"][i]["description"];
      const Json* schema = Find(tool, "input_schema");
      if (schema == nullptr) return Bad(absl::StrCat(at, ".input_schema"), "is required");
      fn["parameters"] = ordered["tools"][i]["input_schema"];
      out.push_back({{"type", "function"}, {"function", std::move(fn)}});
    }
    (*chat)["tools"] = std::move(out);
  }
  if (const Json* choice = Find(body, "tool_choice")) {
    if (!choice->is_object()) return WrongType("tool_choice", "an object", *choice);
    ASSIGN_OR_RETURN(std::string type, RequiredString(*choice, "type", "tool_choice"));
    if (type == "auto") {
      (*chat)["tool_choice"] = "auto";
    } else if (type == "any") {
      (*chat)["tool_choice"] = "required";
    } else if (type == "none") {
      (*chat)["tool_choice"] = "none";
    } else if (type == "tool") {
      ASSIGN_OR_RETURN(std::string name, RequiredString(*choice, "name", "tool_choice"));
      (*chat)["tool_choice"] = {{"type", "function"}, {"function", {{"name", name}}}};
    } else {
      return Bad("tool_choice.type", absl::StrCat("\"", type, "\": use auto, any, tool or none"));
    }
    if (const Json* d = Find(*choice, "disable_parallel_tool_use")) {
      if (!d->is_boolean()) {
        return WrongType("tool_choice.disable_parallel_tool_use", "a boolean", *d);
      }
      (*chat)["parallel_tool_calls"] = !d->get<bool>();
    }
  }
  return absl::OkStatus();
}

// A chat parameter's name as the Messages body spells it; `from` maps chat messages to
// Anthropic messages.
std::string MessagesParam(const std::string& p, const std::vector<int>& from) {
  auto after = [&](absl::string_view prefix, std::string* rest) {
    if (!absl::StartsWith(p, prefix)) return false;
    *rest = p.substr(prefix.size());
    return true;
  };
  std::string rest;
  if (p == "max_completion_tokens" || p == "max_tokens") return "max_tokens";
  if (p == "stop") return "stop_sequences";
  if (after("stop[", &rest)) return "stop_sequences[" + rest;
  if (p == "user") return "metadata.user_id";
  if (p == "thinking_token_budget") return "thinking.budget_tokens";
  if (p == "parallel_tool_calls") return "tool_choice.disable_parallel_tool_use";
  if (p == "continue_final_message") return "messages";
  if (after("response_format.json_schema.schema", &rest)) return "output_format.schema" + rest;
  if (after("response_format", &rest)) return "output_format";
  if (after("tool_choice.function", &rest)) return "tool_choice" + rest;
  if (after("tools[", &rest)) {
    const size_t close = rest.find(']');
    if (close != std::string::npos) {
      std::string field = rest.substr(close + 1);
      if (absl::StartsWith(field, ".function.parameters")) {
        field = ".input_schema" + field.substr(std::strlen(".function.parameters"));
      } else if (absl::StartsWith(field, ".function")) {
        field = field.substr(std::strlen(".function"));
      }
      return absl::StrCat("tools[", rest.substr(0, close), "]", field);
    }
  }
  if (after("messages[", &rest)) {
    const size_t close = rest.find(']');
    int index = -1;
    if (close != std::string::npos && absl::SimpleAtoi(rest.substr(0, close), &index) &&
        index >= 0 && index < static_cast<int>(from.size())) {
      if (from[index] == kFromSystem) return "system";
      return absl::StrCat("messages[", from[index], "]",
                          absl::StartsWith(rest.substr(close + 1), ".content") ? ".content" : "");
    }
    return "messages";
  }
  return p;
}

}  // namespace

absl::StatusOr<MessagesRequest> ParseMessagesRequest(absl::string_view body,
                                                     const OpenAiDefaults& defaults,
                                                     bool count_tokens) {
  const std::string_view text(body.data(), body.size());
  ASSIGN_OR_RETURN(Json j, ParseJson(text, "request body"));
  if (!j.is_object()) return Bad("request body", "must be a JSON object");
  ASSIGN_OR_RETURN(OrderedJson o, ParseOrderedJson(text, "request body"));
  RETURN_IF_ERROR(RefuseUnsupported(j));

  OrderedJson chat = OrderedJson::object();
  if (Find(j, "model") != nullptr) chat["model"] = o["model"];
  Conversation conversation;
  RETURN_IF_ERROR(conversation.Build(j, o));
  std::vector<int> from = conversation.from();
  const bool prefill = conversation.last_role() == "assistant" &&
                       !conversation.messages().empty() &&
                       conversation.messages().back()["role"] == "assistant";
  chat["messages"] = std::move(conversation.messages());
  if (prefill) {
    // Prefill: the reply continues the last assistant message.
    chat["add_generation_prompt"] = false;
    chat["continue_final_message"] = true;
  }
  for (const char* key : kPassThrough) {
    if (Find(j, key) != nullptr) chat[key] = o[key];
  }
  for (const char* key : {"temperature", "top_p", "stream"}) {
    if (Find(j, key) != nullptr) chat[key] = o[key];
  }
  if (count_tokens) chat.erase("stream");
  if (const Json* max = Find(j, "max_tokens")) {
    if (!max->is_number_integer()) return WrongType("max_tokens", "an integer", *max);
    chat["max_completion_tokens"] = o["max_tokens"];
  } else if (!count_tokens) {
    return Bad("max_tokens", "is required");
  }
  MessagesRequest out;
  if (const Json* stops = Find(j, "stop_sequences")) {
    if (!stops->is_array()) return WrongType("stop_sequences", "an array of strings", *stops);
    for (size_t i = 0; i < stops->size(); ++i) {
      const Json& s = (*stops)[i];
      if (!s.is_string()) return WrongType(absl::StrCat("stop_sequences[", i, "]"), "a string", s);
      out.stop_sequences.push_back(s.get<std::string>());
    }
    chat["stop"] = o["stop_sequences"];
  }
  if (const Json* metadata = Find(j, "metadata")) {
    if (!metadata->is_object()) return WrongType("metadata", "an object", *metadata);
    if (const Json* user = Find(*metadata, "user_id")) {
      if (!user->is_string()) return WrongType("metadata.user_id", "a string", *user);
      chat["user"] = o["metadata"]["user_id"];
    }
  }
  RETURN_IF_ERROR(ChatTools(j, o, &chat));
  if (const Json* thinking = Find(j, "thinking")) {
    if (!thinking->is_object()) return WrongType("thinking", "an object", *thinking);
    ASSIGN_OR_RETURN(std::string type, RequiredString(*thinking, "type", "thinking"));
    if (type != "enabled" && type != "disabled") {
      return Bad("thinking.type", absl::StrCat("\"", type, "\": use enabled or disabled"));
    }
    if (const Json* budget = Find(*thinking, "budget_tokens")) {
      if (!budget->is_number_integer()) {
        return WrongType("thinking.budget_tokens", "an integer", *budget);
      }
      // Kept as vLLM's thinking_token_budget is (for a model that thinks).
      if (type == "enabled") chat["thinking_token_budget"] = o["thinking"]["budget_tokens"];
    }
    // The chat templates' switch (Qwen3's, DeepSeek's); a chat_template_kwargs' own wins.
    if (!chat.contains("chat_template_kwargs"))
      chat["chat_template_kwargs"] = OrderedJson::object();
    if (chat["chat_template_kwargs"].is_object() &&
        !chat["chat_template_kwargs"].contains("enable_thinking")) {
      chat["chat_template_kwargs"]["enable_thinking"] = type == "enabled";
    }
  }
  if (const Json* format = Find(j, "output_format")) {
    if (!format->is_object()) return WrongType("output_format", "an object", *format);
    ASSIGN_OR_RETURN(std::string type, RequiredString(*format, "type", "output_format"));
    if (type != "json_schema") {
      return Bad("output_format.type", absl::StrCat("\"", type, "\": use json_schema"));
    }
    if (Find(*format, "schema") == nullptr) return Bad("output_format.schema", "is required");
    chat["response_format"] = {
        {"type", "json_schema"},
        {"json_schema", {{"name", "output"}, {"schema", o["output_format"]["schema"]}}}};
  }

  ASSIGN_OR_RETURN(
      out.chat, openai_json::ParseTranslatedChat(
                    chat, defaults, [&](const std::string& p) { return MessagesParam(p, from); }));
  return out;
}

absl::StatusOr<OpenAiTokenize> ParseCountTokensRequest(absl::string_view body) {
  ASSIGN_OR_RETURN(MessagesRequest parsed, ParseMessagesRequest(body, {}, /*count_tokens=*/true));
  OpenAiTokenize out;
  out.request = std::move(parsed.chat);
  *out.tokenize.mutable_chat() = out.request.generate.chat();
  return out;
}

std::string CountTokensReplyJson(const v1::TokenizeResponse& response) {
  OrderedJson out;
  out["input_tokens"] = response.token_ids_size();
  return Dump(out);
}

std::string AnthropicStopReason(const v1::Finished& finished,
                                const std::vector<std::string>& stop_sequences) {
  switch (finished.reason()) {
    case v1::FINISH_REASON_LENGTH:
      return "max_tokens";
    case v1::FINISH_REASON_TOOL_CALLS:
      return "tool_use";
    case v1::FINISH_REASON_CANCELLED:
    case v1::FINISH_REASON_TIME_LIMIT:
      return "pause_turn";
    case v1::FINISH_REASON_STOP:
      for (const std::string& s : stop_sequences) {
        if (s == finished.matched_stop()) return "stop_sequence";
      }
      return "end_turn";
    default:
      return "end_turn";
  }
}

MessagesReply::MessagesReply(const MessagesRequest& request, std::string id, std::string model)
    : stop_sequences_(request.stop_sequences), id_(std::move(id)), model_(std::move(model)) {}

void MessagesReply::Event(const char* type, OrderedJson data, std::string* events) const {
  OrderedJson event;
  event["type"] = type;
  for (auto& [key, value] : data.items()) event[key] = std::move(value);
  absl::StrAppend(events, "event: ", type, "\ndata: ", Dump(event), "\n\n");
}

OrderedJson MessagesReply::Usage() const {
  // Anthropic's input_tokens are those not read from a cache; the cache's are apart (kvrm's
  // prefix cache is written as a prompt is prefilled, at no cost: no cache_creation tokens).
  const int32_t cached = usage_.cached_prompt_tokens();
  return {{"input_tokens", usage_.prompt_tokens() - cached},
          {"cache_creation_input_tokens", 0},
          {"cache_read_input_tokens", cached},
          {"output_tokens", usage_.completion_tokens()}};
}

OrderedJson MessagesReply::BlockJson(const Block& block, bool whole) const {
  switch (block.kind) {
    case Block::Kind::kThinking:
      return {{"type", "thinking"}, {"thinking", whole ? block.text : ""}, {"signature", ""}};
    case Block::Kind::kText:
      return {{"type", "text"}, {"text", whole ? block.text : ""}};
    case Block::Kind::kToolUse: {
      OrderedJson input = OrderedJson::object();
      if (whole && !block.input.empty()) {
        // The service's calls are JSON objects (model/tool_calls.h); anything else stays {}.
        absl::StatusOr<OrderedJson> parsed = ParseOrderedJson(block.input, "input");
        if (parsed.ok() && parsed->is_object()) input = *std::move(parsed);
      }
      return {{"type", "tool_use"}, {"id", block.id}, {"name", block.name}, {"input", input}};
    }
  }
  return OrderedJson::object();
}

OrderedJson MessagesReply::StopFields() const {
  OrderedJson stop;
  if (!finished_) {
    // Not ended by the model or a limit: the server cut it (its calls ended without a finish).
    stop["stop_reason"] = "pause_turn";
    stop["stop_sequence"] = nullptr;
    return stop;
  }
  stop["stop_reason"] = AnthropicStopReason(finish_, stop_sequences_);
  stop["stop_sequence"] = stop["stop_reason"] == "stop_sequence"
                              ? OrderedJson(finish_.matched_stop())
                              : OrderedJson(nullptr);
  return stop;
}

OrderedJson MessagesReply::MessageJson() const {
  OrderedJson m;
  m["id"] = id_;
  m["type"] = "message";
  m["role"] = "assistant";
  m["model"] = model_;
  m["content"] = OrderedJson::array();
  for (const Block& block : blocks_) m["content"].push_back(BlockJson(block, true));
  if (finished_) {
    OrderedJson stop = StopFields();  // (held: items() iterates it in place)
    for (auto& [key, value] : stop.items()) m[key] = std::move(value);
  } else {
    m["stop_reason"] = nullptr;
    m["stop_sequence"] = nullptr;
  }
  m["usage"] = Usage();
  return m;
}

void MessagesReply::MessageStart(std::string* events) {
  if (started_) return;
  started_ = true;
  if (events == nullptr) return;
  OrderedJson message = MessageJson();
  message["content"] = OrderedJson::array();
  message["stop_reason"] = nullptr;
  message["stop_sequence"] = nullptr;
  Event("message_start", {{"message", std::move(message)}}, events);
}

MessagesReply::Block& MessagesReply::Open(Block::Kind kind, std::string* events) {
  if (open_ >= 0 && blocks_[open_].kind == kind && kind != Block::Kind::kToolUse) {
    return blocks_[open_];
  }
  Close(events);
  blocks_.emplace_back().kind = kind;
  open_ = static_cast<int>(blocks_.size()) - 1;
  // (A tool_use's id and name are set by the caller, which writes its start.)
  if (events != nullptr && kind != Block::Kind::kToolUse) {
    Event("content_block_start",
          {{"index", open_}, {"content_block", BlockJson(blocks_[open_], false)}}, events);
  }
  return blocks_[open_];
}

void MessagesReply::Close(std::string* events) {
  if (open_ < 0) return;
  if (events != nullptr) Event("content_block_stop", {{"index", open_}}, events);
  open_ = -1;
}

void MessagesReply::Process(const v1::GenerateResponse& m, std::string* events) {
  if (m.has_prompt_usage()) usage_ = m.prompt_usage();
  if (m.has_finished()) usage_ = m.finished().usage();
  MessageStart(events);
  if (!m.reasoning_text().empty()) {
    Block& block = Open(Block::Kind::kThinking, events);
    block.text += m.reasoning_text();
    if (events != nullptr) {
      Event("content_block_delta",
            {{"index", open_},
             {"delta", {{"type", "thinking_delta"}, {"thinking", m.reasoning_text()}}}},
            events);
    }
  }
  auto open_call = [&](const std::string& id, const std::string& name, int32_t index) {
    Block& block = Open(Block::Kind::kToolUse, events);
    block.id = id;
    block.name = name;
    block.tool_index = index;
    if (events != nullptr) {
      Event("content_block_start", {{"index", open_}, {"content_block", BlockJson(block, false)}},
            events);
    }
    return open_;
  };
  auto input_delta = [&](int at, const std::string& piece) {
    blocks_[at].input += piece;
    if (events != nullptr && !piece.empty()) {
      Event("content_block_delta",
            {{"index", at}, {"delta", {{"type", "input_json_delta"}, {"partial_json", piece}}}},
            events);
    }
  };
  auto call_block = [&](int32_t index) {
    for (size_t k = 0; k < blocks_.size(); ++k) {
      if (blocks_[k].kind == Block::Kind::kToolUse && blocks_[k].tool_index == index) {
        return static_cast<int>(k);
      }
    }
    return -1;
  };
  // The pieces of a call already open come before the message's text (the end's message carries
  // a streamed call's last piece and the text written after it), new calls after it.
  for (const v1::ToolCallDelta& d : m.tool_call_deltas()) {
    if (const int at = call_block(d.index()); at >= 0) input_delta(at, d.arguments());
  }
  if (!m.text().empty()) {
    Block& block = Open(Block::Kind::kText, events);
    block.text += m.text();
    if (events != nullptr) {
      Event("content_block_delta",
            {{"index", open_}, {"delta", {{"type", "text_delta"}, {"text", m.text()}}}}, events);
    }
  }
  for (const v1::ToolCallDelta& d : m.tool_call_deltas()) {
    if (call_block(d.index()) >= 0) continue;
    input_delta(open_call(d.id(), d.name(), d.index()), d.arguments());
  }
  if (!m.has_finished()) return;
  finish_ = m.finished();
  // Calls that came whole with the end rather than as deltas (the non-streaming path, or a call
  // the service could not stream).
  for (const v1::ToolCall& call : finish_.tool_calls()) {
    bool seen = false;
    for (Block& block : blocks_) {
      if (block.kind != Block::Kind::kToolUse || block.id != call.id()) continue;
      seen = true;
      block.input = call.arguments();  // the call as parsed (compact)
    }
    if (!seen) input_delta(open_call(call.id(), call.name(), -1), call.arguments());
  }
  if (finish_.reason() == v1::FINISH_REASON_ERROR) engine_error_ = finish_.error();
  Close(events);
  finished_ = true;
}

std::string MessagesReply::StreamStart() {
  // message_start waits for the first message: it carries the prompt's usage.
  return "";
}

std::string MessagesReply::StreamMessage(const v1::GenerateResponse& message, int /*prompt*/) {
  std::string events;
  Process(message, &events);
  return events;
}

std::string MessagesReply::KeepAliveEvent() {
  if (!started_) return GenerationReply::KeepAliveEvent();
  std::string events;
  Event("ping", OrderedJson::object(), &events);
  return events;
}

std::string MessagesReply::ErrorEvent(const OpenAiError& error) {
  failed_ = true;
  std::string events;
  OpenAiError shaped = error;
  shaped.shape = OpenAiError::Shape::kAnthropic;
  absl::StrAppend(&events, "event: error\ndata: ", shaped.Json(), "\n\n");
  return events;
}

std::string MessagesReply::StreamEnd() {
  if (failed_ || !engine_error_.empty()) return "";  // the error event ends the stream
  std::string events;
  MessageStart(&events);
  Close(&events);
  Event("message_delta", {{"delta", StopFields()}, {"usage", Usage()}}, &events);
  Event("message_stop", OrderedJson::object(), &events);
  return events;
}

void MessagesReply::Add(const v1::GenerateResponse& message, int /*prompt*/) {
  Process(message, nullptr);
}

std::string MessagesReply::Body() const { return Dump(MessageJson()); }

}  // namespace kvrm
