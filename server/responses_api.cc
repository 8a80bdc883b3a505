#include "server/responses_api.h"

#include <cstddef>
#include <cstring>
#include <iterator>
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

// Sampling and vLLM parameters a Responses body may carry that mean the same in a chat
// completion (the chat parser checks them under these names).
constexpr const char* kPassThrough[] = {"temperature",
                                        "top_p",
                                        "top_k",
                                        "min_p",
                                        "repetition_penalty",
                                        "presence_penalty",
                                        "frequency_penalty",
                                        "seed",
                                        "stop",
                                        "user",
                                        "cache_salt",
                                        "priority",
                                        "request_id",
                                        "parallel_tool_calls",
                                        "stream",
                                        "chat_template_kwargs",
                                        "min_tokens",
                                        "ignore_eos",
                                        "stop_token_ids",
                                        "logit_bias",
                                        "bad_words"};

// What is refused by name rather than ignored (a client relying on it learns at once).
absl::Status RefuseUnsupported(const Json& body, const ResponseStore* store) {
  if (Find(body, "previous_response_id") != nullptr && store == nullptr) {
    return Bad("previous_response_id",
               "is not supported: this server stores no responses (kvrmd --responses_store); "
               "send the conversation as input items");
  }
  if (const Json* b = Find(body, "background"); b != nullptr && !(b->is_boolean() && !*b)) {
    return Bad("background", "is not supported: a response is generated while the call waits");
  }
  for (const char* key : {"conversation", "prompt"}) {
    if (Find(body, key) != nullptr) {
      return Bad(key, "is not supported: this server stores no conversations or prompts");
    }
  }
  if (const Json* t = Find(body, "truncation");
      t != nullptr && !(t->is_string() && t->get<std::string>() == "disabled")) {
    return Bad("truncation",
               "only \"disabled\" is supported: an input past the context is "
               "refused, never cut");
  }
  return absl::OkStatus();
}

// A content list's text: input_text / output_text / text parts, joined.
absl::StatusOr<std::string> PartsText(const Json& content, const std::string& at) {
  return openai_json::TextParts(content, at, {"input_text", "output_text", "text"});
}

constexpr int kFromInstructions = -1;
constexpr int kFromPreviousResponse = -2;

// The chat messages `input` means (after `instructions`, a system message, and the stored
// conversation `prior` continues, if any), and for each the input item it came from
// (kFromInstructions, kFromPreviousResponse), to name input items in errors.
absl::Status ChatMessages(const Json& body, const OrderedJson* prior, OrderedJson* messages,
                          std::vector<int>* from) {
  if (const Json* instructions = Find(body, "instructions")) {
    if (!instructions->is_string()) return WrongType("instructions", "a string", *instructions);
    messages->push_back({{"role", "system"}, {"content", instructions->get<std::string>()}});
    from->push_back(kFromInstructions);
  }
  if (prior != nullptr) {
    for (const OrderedJson& m : *prior) {
      messages->push_back(m);
      from->push_back(kFromPreviousResponse);
    }
  }
  const Json* input = Find(body, "input");
  if (input == nullptr) return Bad("input", "is required");
  if (input->is_string()) {
    messages->push_back({{"role", "user"}, {"content", input->get<std::string>()}});
    from->push_back(0);
    return absl::OkStatus();
  }
  if (!input->is_array()) return WrongType("input", "a string or an array of items", *input);
  for (size_t i = 0; i < input->size(); ++i) {
    const std::string at = absl::StrCat("input[", i, "]");
    const Json& item = (*input)[i];
    if (!item.is_object()) return WrongType(at, "an object", item);
    std::string type = "message";
    if (const Json* t = Find(item, "type")) {
      if (!t->is_string()) return WrongType(absl::StrCat(at, ".type"), "a string", *t);
      type = t->get<std::string>();
    }
    if (type == "message") {
      ASSIGN_OR_RETURN(std::string role, RequiredString(item, "role", at));
      if (role == "developer") role = "system";  // the chat templates' name for it
      const Json* content = Find(item, "content");
      if (content == nullptr) return Bad(absl::StrCat(at, ".content"), "is required");
      ASSIGN_OR_RETURN(std::string text, PartsText(*content, absl::StrCat(at, ".content")));
      messages->push_back({{"role", role}, {"content", std::move(text)}});
      from->push_back(static_cast<int>(i));
    } else if (type == "function_call") {
      ASSIGN_OR_RETURN(std::string call_id, RequiredString(item, "call_id", at));
      ASSIGN_OR_RETURN(std::string name, RequiredString(item, "name", at));
      std::string arguments = "{}";
      if (const Json* a = Find(item, "arguments")) {
        if (!a->is_string()) return WrongType(absl::StrCat(at, ".arguments"), "a string", *a);
        arguments = a->get<std::string>();
      }
      OrderedJson call = {{"id", call_id},
                          {"type", "function"},
                          {"function", {{"name", name}, {"arguments", arguments}}}};
      // Calls made in one turn follow their assistant message (or each other): one message.
      if (!messages->empty() && messages->back()["role"] == "assistant" && from->back() >= 0) {
        (*messages)[messages->size() - 1]["tool_calls"].push_back(std::move(call));
      } else {
        messages->push_back({{"role", "assistant"}, {"tool_calls", OrderedJson::array({call})}});
        from->push_back(static_cast<int>(i));
      }
    } else if (type == "function_call_output") {
      ASSIGN_OR_RETURN(std::string call_id, RequiredString(item, "call_id", at));
      const Json* output = Find(item, "output");
      if (output == nullptr) return Bad(absl::StrCat(at, ".output"), "is required");
      ASSIGN_OR_RETURN(std::string text, PartsText(*output, absl::StrCat(at, ".output")));
      messages->push_back({{"role", "tool"}, {"tool_call_id", call_id}, {"content", text}});
      from->push_back(static_cast<int>(i));
    } else if (type == "reasoning") {
      // A past turn's thinking: the chat templates leave it out of the prompt.
    } else {
      return Bad(absl::StrCat(at, ".type"),
                 absl::StrCat("\"", type,
                              "\" is not supported (message, function_call, "
                              "function_call_output and reasoning items are)"));
    }
  }
  if (messages->empty()) return Bad("input", "has no messages");
  return absl::OkStatus();
}

// Function tools in the chat API's shape ({"type": "function", "function": {...}}).
absl::Status ChatTools(const Json& body, const OrderedJson& ordered, OrderedJson* chat) {
  const Json* tools = Find(body, "tools");
  if (tools == nullptr) return absl::OkStatus();
  if (!tools->is_array()) return WrongType("tools", "an array", *tools);
  OrderedJson out = OrderedJson::array();
  for (size_t i = 0; i < tools->size(); ++i) {
    const std::string at = absl::StrCat("tools[", i, "]");
    const Json& tool = (*tools)[i];
    if (!tool.is_object()) return WrongType(at, "an object", tool);
    const Json* type = Find(tool, "type");
    const std::string t = type != nullptr && type->is_string() ? type->get<std::string>() : "";
    if (t != "function") {
      return Bad(absl::StrCat(at, ".type"),
                 absl::StrCat("\"", t, "\" is not supported: only function tools"));
    }
    RETURN_IF_ERROR(RequiredString(tool, "name", at).status());
    OrderedJson fn;
    for (const auto& [key, value] : ordered["tools"][i].items()) {
      if (key != "type") fn[key] = value;
    }
    out.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  (*chat)["tools"] = std::move(out);
  if (const Json* choice = Find(body, "tool_choice")) {
    if (choice->is_object()) {
      const Json* name = Find(*choice, "name");
      if (name == nullptr || !name->is_string()) return Bad("tool_choice.name", "is required");
      (*chat)["tool_choice"] = {{"type", "function"},
                                {"function", {{"name", name->get<std::string>()}}}};
    } else {
      (*chat)["tool_choice"] = ordered["tool_choice"];
    }
  }
  return absl::OkStatus();
}

// A chat parameter's name as the Responses body spells it; `from` maps chat messages to input
// items.
std::string ResponsesParam(const std::string& p, const std::vector<int>& from) {
  auto after = [&](absl::string_view prefix, std::string* rest) {
    if (!absl::StartsWith(p, prefix)) return false;
    *rest = p.substr(prefix.size());
    return true;
  };
  std::string rest;
  if (p == "max_completion_tokens" || p == "max_tokens") return "max_output_tokens";
  if (p == "reasoning_effort") return "reasoning.effort";
  if (p == "logprobs") return "top_logprobs";
  if (after("response_format.json_schema.schema", &rest)) return "text.format.schema" + rest;
  if (after("response_format.json_schema", &rest)) return "text.format" + rest;
  if (after("response_format", &rest)) return "text.format" + rest;
  if (after("tool_choice.function", &rest)) return "tool_choice" + rest;
  if (after("tools[", &rest)) {
    const size_t close = rest.find(']');
    if (close != std::string::npos && absl::StartsWith(rest.substr(close), "].function")) {
      return absl::StrCat("tools[", rest.substr(0, close), "]",
                          rest.substr(close + std::strlen("].function")));
    }
  }
  if (after("messages[", &rest)) {
    const size_t close = rest.find(']');
    int index = -1;
    if (close != std::string::npos && absl::SimpleAtoi(rest.substr(0, close), &index) &&
        index >= 0 && index < static_cast<int>(from.size())) {
      if (from[index] == kFromInstructions) return "instructions";
      if (from[index] == kFromPreviousResponse) return "previous_response_id";
      return absl::StrCat("input[", from[index], "]", rest.substr(close + 1));
    }
    return "input";
  }
  if (p == "messages") return "input";
  return p;
}

std::string Hex(absl::string_view id) {
  const size_t underscore = id.find('_');
  return std::string(underscore == absl::string_view::npos ? id : id.substr(underscore + 1));
}

}  // namespace

absl::StatusOr<ResponsesRequest> ParseResponsesRequest(absl::string_view body,
                                                       const OpenAiDefaults& defaults,
                                                       ResponseStore* store) {
  const std::string_view text(body.data(), body.size());
  ASSIGN_OR_RETURN(Json j, ParseJson(text, "request body"));
  if (!j.is_object()) return Bad("request body", "must be a JSON object");
  ASSIGN_OR_RETURN(OrderedJson o, ParseOrderedJson(text, "request body"));
  RETURN_IF_ERROR(RefuseUnsupported(j, store));
  std::optional<ResponseStore::Entry> previous;
  if (const Json* id = Find(j, "previous_response_id")) {
    if (!id->is_string()) return WrongType("previous_response_id", "a string", *id);
    previous = store->Get(id->get<std::string>());
    if (!previous) {
      return Bad("previous_response_id",
                 absl::StrCat("no stored response '", id->get<std::string>(),
                              "' (never stored, stored with store: false, deleted, or "
                              "evicted: the store keeps the most recent)"));
    }
  }
  bool keep = store != nullptr;
  if (const Json* s = Find(j, "store")) {
    if (!s->is_boolean()) return WrongType("store", "a boolean", *s);
    keep = keep && s->get<bool>();
  }

  OrderedJson chat = OrderedJson::object();
  if (Find(j, "model") != nullptr) chat["model"] = o["model"];
  OrderedJson messages = OrderedJson::array();
  std::vector<int> from;
  RETURN_IF_ERROR(ChatMessages(j, previous ? &previous->conversation : nullptr, &messages, &from));
  OrderedJson conversation = OrderedJson::array();
  for (size_t k = 0; k < messages.size(); ++k) {
    if (from[k] != kFromInstructions) conversation.push_back(messages[k]);
  }
  chat["messages"] = std::move(messages);
  for (const char* key : kPassThrough) {
    if (Find(j, key) != nullptr) chat[key] = o[key];
  }
  if (const Json* max = Find(j, "max_output_tokens")) {
    if (!max->is_number_integer()) return WrongType("max_output_tokens", "an integer", *max);
    chat["max_completion_tokens"] = o["max_output_tokens"];
  }
  if (const Json* top = Find(j, "top_logprobs")) {
    if (!top->is_number_integer()) return WrongType("top_logprobs", "an integer", *top);
    chat["logprobs"] = true;
    chat["top_logprobs"] = o["top_logprobs"];
  }
  // `include`: "message.output_text.logprobs" asks for the output tokens' logprobs (with
  // top_logprobs' alternatives, if given); the other values name what this server does not
  // write (encrypted reasoning, tool outputs) and change nothing, as clients send them routinely.
  if (const Json* include = Find(j, "include")) {
    if (!include->is_array()) return WrongType("include", "an array of strings", *include);
    for (size_t i = 0; i < include->size(); ++i) {
      const Json& v = (*include)[i];
      if (!v.is_string()) return WrongType(absl::StrCat("include[", i, "]"), "a string", v);
      if (v.get<std::string>() == "message.output_text.logprobs") chat["logprobs"] = true;
    }
  }
  RETURN_IF_ERROR(ChatTools(j, o, &chat));
  if (const Json* t = Find(j, "text")) {
    if (!t->is_object()) return WrongType("text", "an object", *t);
    if (const Json* format = Find(*t, "format")) {
      if (!format->is_object()) return WrongType("text.format", "an object", *format);
      const Json* type = Find(*format, "type");
      const std::string ft = type != nullptr && type->is_string() ? type->get<std::string>() : "";
      if (ft == "json_schema") {
        const Json* schema = Find(*format, "schema");
        if (schema == nullptr) return Bad("text.format.schema", "is required");
        OrderedJson spec = {{"schema", o["text"]["format"]["schema"]}};
        if (Find(*format, "name") != nullptr) spec["name"] = o["text"]["format"]["name"];
        chat["response_format"] = {{"type", "json_schema"}, {"json_schema", std::move(spec)}};
      } else if (ft == "json_object") {
        chat["response_format"] = {{"type", "json_object"}};
      } else if (ft != "text") {
        return Bad("text.format.type",
                   absl::StrCat("\"", ft, "\": use text, json_object or json_schema"));
      }
    }
  }
  if (const Json* reasoning = Find(j, "reasoning")) {
    if (!reasoning->is_object()) return WrongType("reasoning", "an object", *reasoning);
    if (Find(*reasoning, "effort") != nullptr) {
      chat["reasoning_effort"] = o["reasoning"]["effort"];
    }
  }
  if (const Json* metadata = Find(j, "metadata"); metadata != nullptr && !metadata->is_object()) {
    return WrongType("metadata", "an object", *metadata);
  }

  ResponsesRequest out;
  ASSIGN_OR_RETURN(
      out.chat, openai_json::ParseTranslatedChat(
                    chat, defaults, [&](const std::string& p) { return ResponsesParam(p, from); }));
  out.store = keep;
  out.conversation = std::move(conversation);
  for (const char* key : {"instructions", "max_output_tokens", "metadata", "temperature", "top_p",
                          "tools", "tool_choice", "parallel_tool_calls", "text", "reasoning",
                          "user", "top_logprobs", "previous_response_id"}) {
    out.echo[key] = o.contains(key) ? o[key] : OrderedJson(nullptr);
  }
  return out;
}

ResponsesReply::ResponsesReply(const ResponsesRequest& request, std::string id, int64_t created,
                               std::string model, const Tokenizer* tokenizer)
    : echo_(request.echo),
      conversation_(request.store ? request.conversation : OrderedJson::array()),
      tokenizer_(tokenizer),
      logprobs_(request.chat.logprobs >= 0),
      store_(request.store),
      id_(std::move(id)),
      created_(created),
      model_(std::move(model)) {}

OrderedJson ResponsesReply::Logprobs(absl::Span<const v1::TokenLogprob> entries) const {
  if (!logprobs_) return OrderedJson::array();
  return openai_json::LogprobEntries(entries, [this](int32_t id, bool bytes) {
    return openai_json::TokenText(tokenizer_, id, bytes);
  });
}

void ResponsesReply::Event(const char* type, OrderedJson data, std::string* events) {
  OrderedJson event;
  event["type"] = type;
  event["sequence_number"] = sequence_++;
  for (auto& [key, value] : data.items()) event[key] = std::move(value);
  absl::StrAppend(events, "event: ", type, "\ndata: ", Dump(event), "\n\n");
}

OrderedJson ResponsesReply::ItemJson(const Item& item) const {
  OrderedJson j;
  j["id"] = item.id;
  const std::string status = !item.done ? "in_progress"
                             : finished_ && Status() == "incomplete" && &item == &items_.back()
                                 ? "incomplete"
                                 : "completed";
  switch (item.kind) {
    case Item::Kind::kReasoning:
      j["type"] = "reasoning";
      j["summary"] = OrderedJson::array();
      j["content"] = OrderedJson::array();
      if (item.done) j["content"].push_back({{"type", "reasoning_text"}, {"text", item.text}});
      j["status"] = status;
      break;
    case Item::Kind::kMessage:
      j["type"] = "message";
      j["status"] = status;
      j["role"] = "assistant";
      j["content"] = OrderedJson::array();
      if (item.done) {
        j["content"].push_back({{"type", "output_text"},
                                {"text", item.text},
                                {"annotations", OrderedJson::array()},
                                {"logprobs", Logprobs(item.logprobs)}});
      }
      break;
    case Item::Kind::kFunctionCall:
      j["type"] = "function_call";
      j["status"] = status;
      j["call_id"] = item.call_id;
      j["name"] = item.name;
      j["arguments"] = item.done ? item.arguments : "";
      break;
  }
  return j;
}

std::string ResponsesReply::Status() const {
  if (failed_ || !engine_error_.empty()) return "failed";
  if (!finished_) return "in_progress";
  switch (finish_.reason()) {
    case v1::FINISH_REASON_LENGTH:
    case v1::FINISH_REASON_TIME_LIMIT:
      return "incomplete";
    case v1::FINISH_REASON_CANCELLED:
      return "cancelled";
    case v1::FINISH_REASON_ERROR:
      return "failed";
    default:
      return "completed";
  }
}

OrderedJson ResponsesReply::ResponseJson() const {
  OrderedJson r;
  const std::string status = Status();
  r["id"] = id_;
  r["object"] = "response";
  r["created_at"] = created_;
  r["status"] = status;
  r["background"] = false;
  if (failed_ || !engine_error_.empty()) {
    r["error"] = {{"code", failed_ ? error_.type : "server_error"},
                  {"message", failed_ ? error_.message : engine_error_}};
  } else {
    r["error"] = nullptr;
  }
  if (status == "incomplete") {
    r["incomplete_details"] = {{"reason", finish_.reason() == v1::FINISH_REASON_TIME_LIMIT
                                              ? "time_limit"
                                              : "max_output_tokens"}};
  } else {
    r["incomplete_details"] = nullptr;
  }
  r["instructions"] = echo_["instructions"];
  r["max_output_tokens"] = echo_["max_output_tokens"];
  r["metadata"] = echo_["metadata"].is_null() ? OrderedJson::object() : echo_["metadata"];
  r["model"] = model_;
  r["output"] = OrderedJson::array();
  for (const Item& item : items_) r["output"].push_back(ItemJson(item));
  r["parallel_tool_calls"] =
      echo_["parallel_tool_calls"].is_null() ? OrderedJson(true) : echo_["parallel_tool_calls"];
  r["previous_response_id"] = echo_["previous_response_id"];
  OrderedJson reasoning = {{"effort", nullptr}, {"summary", nullptr}};
  if (echo_["reasoning"].is_object() && echo_["reasoning"].contains("effort")) {
    reasoning["effort"] = echo_["reasoning"]["effort"];
  }
  r["reasoning"] = std::move(reasoning);
  r["store"] = store_;
  r["temperature"] = echo_["temperature"];
  r["text"] =
      echo_["text"].is_null() ? OrderedJson({{"format", {{"type", "text"}}}}) : echo_["text"];
  r["tool_choice"] = echo_["tool_choice"].is_null() ? OrderedJson("auto") : echo_["tool_choice"];
  r["tools"] = echo_["tools"].is_null() ? OrderedJson::array() : echo_["tools"];
  r["top_logprobs"] = echo_["top_logprobs"];
  r["top_p"] = echo_["top_p"];
  r["truncation"] = "disabled";
  if (finished_) {
    const v1::Usage& u = finish_.usage();
    r["usage"] = {{"input_tokens", u.prompt_tokens()},
                  {"input_tokens_details", {{"cached_tokens", u.cached_prompt_tokens()}}},
                  {"output_tokens", u.completion_tokens()},
                  {"output_tokens_details", {{"reasoning_tokens", u.reasoning_tokens()}}},
                  {"total_tokens", u.prompt_tokens() + u.completion_tokens()}};
  } else {
    r["usage"] = nullptr;
  }
  r["user"] = echo_["user"];
  return r;
}

ResponsesReply::Item& ResponsesReply::Open(Item::Kind kind, std::string* events) {
  if (open_ >= 0 && items_[open_].kind == kind && kind != Item::Kind::kFunctionCall) {
    return items_[open_];
  }
  Close(events);
  Item& item = items_.emplace_back();
  item.kind = kind;
  const std::string hex = Hex(id_);
  const int n = static_cast<int>(items_.size()) - 1;
  item.id = absl::StrCat(kind == Item::Kind::kReasoning ? "rs_"
                         : kind == Item::Kind::kMessage ? "msg_"
                                                        : "fc_",
                         hex, "_", n);
  open_ = n;
  if (events != nullptr) {
    // (The call's id and name are set by the caller before the item is first written.)
    if (kind != Item::Kind::kFunctionCall) {
      Event("response.output_item.added", {{"output_index", n}, {"item", ItemJson(item)}}, events);
    }
    if (kind == Item::Kind::kMessage) {
      Event("response.content_part.added",
            {{"item_id", item.id},
             {"output_index", n},
             {"content_index", 0},
             {"part",
              {{"type", "output_text"}, {"text", ""}, {"annotations", OrderedJson::array()}}}},
            events);
    }
  }
  return items_[n];
}

void ResponsesReply::Close(std::string* events) {
  if (open_ < 0) return;
  Item& item = items_[open_];
  const int n = open_;
  open_ = -1;
  item.done = true;
  if (events == nullptr) return;
  switch (item.kind) {
    case Item::Kind::kReasoning:
      Event("response.reasoning_text.done",
            {{"item_id", item.id}, {"output_index", n}, {"content_index", 0}, {"text", item.text}},
            events);
      break;
    case Item::Kind::kMessage:
      Event("response.output_text.done",
            {{"item_id", item.id},
             {"output_index", n},
             {"content_index", 0},
             {"text", item.text},
             {"logprobs", Logprobs(item.logprobs)}},
            events);
      Event(
          "response.content_part.done",
          {{"item_id", item.id},
           {"output_index", n},
           {"content_index", 0},
           {"part",
            {{"type", "output_text"}, {"text", item.text}, {"annotations", OrderedJson::array()}}}},
          events);
      break;
    case Item::Kind::kFunctionCall:
      Event("response.function_call_arguments.done",
            {{"item_id", item.id}, {"output_index", n}, {"arguments", item.arguments}}, events);
      break;
  }
  Event("response.output_item.done", {{"output_index", n}, {"item", ItemJson(item)}}, events);
}

void ResponsesReply::Process(const v1::GenerateResponse& m, std::string* events) {
  if (!m.reasoning_text().empty()) {
    Item& item = Open(Item::Kind::kReasoning, events);
    item.text += m.reasoning_text();
    if (events != nullptr) {
      Event("response.reasoning_text.delta",
            {{"item_id", item.id},
             {"output_index", open_},
             {"content_index", 0},
             {"delta", m.reasoning_text()}},
            events);
    }
  }
  auto open_call = [&](const std::string& call_id, const std::string& name, int32_t index) {
    Item& item = Open(Item::Kind::kFunctionCall, events);
    item.call_id = call_id;
    item.name = name;
    item.tool_index = index;
    if (events != nullptr) {
      Event("response.output_item.added", {{"output_index", open_}, {"item", ItemJson(item)}},
            events);
    }
    return open_;
  };
  auto call_item = [&](int32_t index) {
    for (size_t k = 0; k < items_.size(); ++k) {
      if (items_[k].kind == Item::Kind::kFunctionCall && items_[k].tool_index == index) {
        return static_cast<int>(k);
      }
    }
    return -1;
  };
  auto arguments_delta = [&](int at, const std::string& piece) {
    Item& item = items_[at];
    item.arguments += piece;
    if (events != nullptr && !piece.empty()) {
      Event("response.function_call_arguments.delta",
            {{"item_id", item.id}, {"output_index", at}, {"delta", piece}}, events);
    }
  };
  // The pieces of a call already open come before the message's text (the end's message carries
  // a streamed call's last piece and the text written after it), new calls after it.
  for (const v1::ToolCallDelta& d : m.tool_call_deltas()) {
    if (const int at = call_item(d.index()); at >= 0) arguments_delta(at, d.arguments());
  }
  if (!m.text().empty()) {
    Item& item = Open(Item::Kind::kMessage, events);
    item.text += m.text();
    if (logprobs_)
      item.logprobs.insert(item.logprobs.end(), m.logprobs().begin(), m.logprobs().end());
    if (events != nullptr) {
      Event("response.output_text.delta",
            {{"item_id", item.id},
             {"output_index", open_},
             {"content_index", 0},
             {"delta", m.text()},
             {"logprobs",
              Logprobs(std::vector<v1::TokenLogprob>(m.logprobs().begin(), m.logprobs().end()))}},
            events);
    }
  }
  for (const v1::ToolCallDelta& d : m.tool_call_deltas()) {
    if (call_item(d.index()) >= 0) continue;
    arguments_delta(open_call(d.id(), d.name(), d.index()), d.arguments());
  }
  if (!m.has_finished()) return;
  finish_ = m.finished();
  // Calls that came whole with the end rather than as deltas (the non-streaming path).
  for (const v1::ToolCall& call : finish_.tool_calls()) {
    bool seen = false;
    for (Item& item : items_) {
      if (item.kind != Item::Kind::kFunctionCall || item.call_id != call.id()) continue;
      seen = true;
      item.arguments = call.arguments();  // the call as parsed (compact)
    }
    if (seen) continue;
    const int at = open_call(call.id(), call.name(), -1);
    items_[at].arguments = call.arguments();
    if (events != nullptr) {
      Event("response.function_call_arguments.delta",
            {{"item_id", items_[at].id}, {"output_index", at}, {"delta", call.arguments()}},
            events);
    }
  }
  if (finish_.reason() == v1::FINISH_REASON_ERROR) engine_error_ = finish_.error();
  Close(events);
  finished_ = true;
}

std::string ResponsesReply::StreamStart() {
  std::string events;
  Event("response.created", {{"response", ResponseJson()}}, &events);
  Event("response.in_progress", {{"response", ResponseJson()}}, &events);
  return events;
}

std::string ResponsesReply::StreamMessage(const v1::GenerateResponse& message, int /*prompt*/) {
  std::string events;
  Process(message, &events);
  return events;
}

std::string ResponsesReply::ErrorEvent(const OpenAiError& error) {
  failed_ = true;
  error_ = error;
  std::string events;
  Event("error",
        {{"code", error.type},
         {"message", error.message},
         {"param", error.param.empty() ? OrderedJson(nullptr) : OrderedJson(error.param)}},
        &events);
  return events;
}

std::string ResponsesReply::StreamEnd() {
  std::string events;
  Close(&events);
  const std::string status = Status();
  const char* type = status == "failed"       ? "response.failed"
                     : status == "incomplete" ? "response.incomplete"
                                              : "response.completed";
  Event(type, {{"response", ResponseJson()}}, &events);
  return events;
}

void ResponsesReply::Add(const v1::GenerateResponse& message, int /*prompt*/) {
  Process(message, nullptr);
}

std::string ResponsesReply::Body() const { return Dump(ResponseJson()); }

ResponseStore::Entry ResponsesReply::StoreEntry(std::string body) const {
  std::string text;
  OrderedJson calls = OrderedJson::array();
  for (const Item& item : items_) {
    if (item.kind == Item::Kind::kMessage) text += item.text;
    if (item.kind == Item::Kind::kFunctionCall) {
      calls.push_back({{"id", item.call_id},
                       {"type", "function"},
                       {"function", {{"name", item.name}, {"arguments", item.arguments}}}});
    }
  }
  OrderedJson m = {{"role", "assistant"}, {"content", text}};
  if (!calls.empty()) m["tool_calls"] = std::move(calls);
  ResponseStore::Entry entry;
  entry.conversation = conversation_;
  entry.conversation.push_back(std::move(m));
  entry.response = std::move(body);
  return entry;
}

ResponseStore::ResponseStore(int32_t max_entries, int64_t max_bytes)
    : max_entries_(max_entries), max_bytes_(max_bytes) {}

void ResponseStore::Remove(std::list<Node>::iterator it) {
  bytes_ -= it->bytes;
  index_.erase(it->id);
  lru_.erase(it);
}

void ResponseStore::Put(const std::string& id, Entry entry) {
  const int64_t bytes =
      static_cast<int64_t>(Dump(entry.conversation).size() + entry.response.size());
  if (max_entries_ <= 0 || bytes > max_bytes_) return;  // never fits: not kept
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = index_.find(id); it != index_.end()) Remove(it->second);
  lru_.push_front(Node{id, std::move(entry), bytes});
  index_[id] = lru_.begin();
  bytes_ += bytes;
  while (static_cast<int32_t>(lru_.size()) > max_entries_ || bytes_ > max_bytes_) {
    Remove(std::prev(lru_.end()));
  }
}

std::optional<ResponseStore::Entry> ResponseStore::Get(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(id);
  if (it == index_.end()) return std::nullopt;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->entry;
}

bool ResponseStore::Erase(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(id);
  if (it == index_.end()) return false;
  Remove(it->second);
  return true;
}

int32_t ResponseStore::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int32_t>(lru_.size());
}

}  // namespace kvrm
