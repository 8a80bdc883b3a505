#include "server/request_validation.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/json.h"
#include "common/status_macros.h"
#include "model/harmony.h"
#include "model/reasoning.h"

namespace kvrm {
namespace {

absl::Status Invalid(const char* field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}
absl::Status Invalid(const std::string& field, const std::string& why) {
  return Invalid(field.c_str(), why);
}

// An optional identifier-like string: at most `max` printable ASCII bytes.
absl::Status CheckPrintable(const std::string& field, const std::string& value, size_t max) {
  if (value.size() > max) return Invalid(field, absl::StrCat("longer than ", max, " bytes"));
  for (unsigned char c : value) {
    if (c < 0x20 || c > 0x7e) return Invalid(field, "must be printable ASCII");
  }
  return absl::OkStatus();
}

// OpenAI's rule for function names: ^[A-Za-z0-9_-]{1,64}$.
absl::Status CheckFunctionName(const std::string& field, const std::string& name) {
  if (name.empty() || name.size() > 64) return Invalid(field, "must be 1 to 64 bytes");
  for (unsigned char c : name) {
    if (!absl::ascii_isalnum(c) && c != '_' && c != '-') {
      return Invalid(field, "may hold only letters, digits, '_' and '-'");
    }
  }
  return absl::OkStatus();
}

// Empty, or a JSON object of at most `max` bytes.
absl::Status CheckJsonObject(const std::string& field, const std::string& text, int32_t max) {
  if (text.empty()) return absl::OkStatus();
  if (static_cast<int64_t>(text.size()) > max) {
    return Invalid(field, absl::StrCat(text.size(), " bytes; at most ", max));
  }
  absl::StatusOr<OrderedJson> json = ParseOrderedJson(text, "JSON");
  if (!json.ok()) return Invalid(field, std::string(json.status().message()));
  if (!json->is_object()) return Invalid(field, "must be a JSON object");
  return absl::OkStatus();
}

// The template's own variables and functions, which template_kwargs may not replace (a
// variable named raise_exception would turn a template's guard into a render error).
constexpr const char* kStandardTemplateVariables[] = {
    "messages",        "tools",     "add_generation_prompt", "bos_token", "eos_token",
    "documents",       "raise_exception", "namespace",       "strftime_now", "range",
    "dict"};

bool NamesFunction(const v1::ToolChoice& choice) {
  return choice.choice_case() == v1::ToolChoice::kFunction;
}
// OpenAI's parallel_tool_calls false: at most one call (unset is true).
bool SingleToolCall(const v1::ChatPrompt& chat) {
  return chat.has_parallel_tool_calls() && !chat.parallel_tool_calls();
}
bool ForcesCalls(const v1::ChatPrompt& chat) {
  return chat.has_tool_choice() &&
         (NamesFunction(chat.tool_choice()) ||
          chat.tool_choice().mode() == v1::TOOL_CHOICE_MODE_REQUIRED);
}

bool Finite(float v) { return std::isfinite(v); }

absl::Status ValidateRequestId(const std::string& id) {
  if (id.size() > 128) return Invalid("request_id", "longer than 128 bytes");
  for (unsigned char c : id) {
    if (c < 0x20 || c > 0x7e) return Invalid("request_id", "must be printable ASCII");
  }
  return absl::OkStatus();
}

// Each of `ids` in the vocabulary, or INVALID_ARGUMENT naming `field` and the first that is not.
absl::Status CheckTokenIds(const std::string& field,
                           const google::protobuf::RepeatedField<int32_t>& ids,
                           int32_t vocab_size) {
  for (int i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size) {
      return Invalid(field, absl::StrCat("id ", ids[i], " at index ", i,
                                         " is outside the vocabulary [0, ", vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

// The fields Generate and Embed share: priority in [-100, 100], cache_salt and lora_adapter
// (resolved by the engine, which knows the adapters served at that moment) at most 256 bytes.
absl::Status CheckSharedFields(int32_t priority, const std::string& cache_salt,
                               const std::string& lora_adapter) {
  if (priority < -100 || priority > 100) {
    return Invalid("priority", absl::StrCat(priority, " is outside [-100, 100]"));
  }
  if (cache_salt.size() > 256) {
    return Invalid("cache_salt", absl::StrCat(cache_salt.size(), " bytes; at most 256"));
  }
  if (lora_adapter.size() > 256) {
    return Invalid("lora_adapter", absl::StrCat(lora_adapter.size(), " bytes; at most 256"));
  }
  return absl::OkStatus();
}

absl::Status ValidateSampling(const v1::SamplingParams& s, int32_t vocab_size,
                              SamplingConfig* out) {
  if (!Finite(s.temperature()) || s.temperature() < 0 || s.temperature() > 100) {
    return Invalid("sampling.temperature", absl::StrCat(s.temperature(), " is outside [0, 100]"));
  }
  if (s.top_k() < 0) return Invalid("sampling.top_k", absl::StrCat(s.top_k(), " is negative"));
  // 0 means unset (disabled); anything else must lie in (0, 1].
  if (!Finite(s.top_p()) || s.top_p() < 0 || s.top_p() > 1) {
    return Invalid("sampling.top_p", absl::StrCat(s.top_p(), " is outside (0, 1]"));
  }
  if (!Finite(s.min_p()) || s.min_p() < 0 || s.min_p() > 1) {
    return Invalid("sampling.min_p", absl::StrCat(s.min_p(), " is outside [0, 1]"));
  }
  if (!Finite(s.repetition_penalty()) || s.repetition_penalty() < 0 ||
      s.repetition_penalty() > 10) {
    return Invalid("sampling.repetition_penalty",
                   absl::StrCat(s.repetition_penalty(), " is outside (0, 10]"));
  }
  if (!Finite(s.presence_penalty()) || std::abs(s.presence_penalty()) > 2) {
    return Invalid("sampling.presence_penalty",
                   absl::StrCat(s.presence_penalty(), " is outside [-2, 2]"));
  }
  if (!Finite(s.frequency_penalty()) || std::abs(s.frequency_penalty()) > 2) {
    return Invalid("sampling.frequency_penalty",
                   absl::StrCat(s.frequency_penalty(), " is outside [-2, 2]"));
  }
  if (s.logit_bias_size() > kMaxLogitBias) {
    return Invalid("sampling.logit_bias",
                   absl::StrCat(s.logit_bias_size(), " entries; at most ", kMaxLogitBias));
  }
  out->num_logit_bias = 0;
  for (const auto& [token, bias] : s.logit_bias()) {
    if (token < 0 || token >= vocab_size) {
      return Invalid("sampling.logit_bias", absl::StrCat("token id ", token,
                                                         " is outside the vocabulary [0, ",
                                                         vocab_size, ")"));
    }
    if (!Finite(bias) || std::abs(bias) > 100) {
      return Invalid("sampling.logit_bias",
                     absl::StrCat("value ", bias, " for token ", token, " is outside [-100, 100]"));
    }
    out->logit_bias[out->num_logit_bias++] = LogitBias{token, bias};
  }
  out->allowed_tokens.reset();
  if (s.allowed_token_ids_size() > 0) {
    if (s.allowed_token_ids_size() > vocab_size) {
      return Invalid("sampling.allowed_token_ids",
                     absl::StrCat(s.allowed_token_ids_size(), " ids; at most the vocabulary's ",
                                  vocab_size));
    }
    RETURN_IF_ERROR(
        CheckTokenIds("sampling.allowed_token_ids", s.allowed_token_ids(), vocab_size));
    // Sorted and without repeats: at most the vocabulary, which is what the sampler holds.
    std::vector<int32_t> ids(s.allowed_token_ids().begin(), s.allowed_token_ids().end());
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    out->allowed_tokens = std::make_shared<const std::vector<int32_t>>(std::move(ids));
  }
  out->temperature = s.temperature();
  out->top_k = s.top_k();
  out->top_p = s.top_p() == 0 ? 1.0f : s.top_p();
  out->min_p = s.min_p();
  out->repetition_penalty = s.repetition_penalty() == 0 ? 1.0f : s.repetition_penalty();
  out->presence_penalty = s.presence_penalty();
  out->frequency_penalty = s.frequency_penalty();
  // Seed 0 would mean "draw one" to the engine; an explicit 0 is remapped to a fixed constant
  // so that it stays reproducible.
  if (s.has_seed()) out->seed = s.seed() == 0 ? 0x9e3779b97f4a7c15ull : s.seed();
  return absl::OkStatus();
}

// vLLM's bad_words as token sequences (SamplingParams.update_from_tokenizer): each word with its
// leading spaces dropped, and with one space before it where that gives another first token and
// as many tokens (the word inside a text, where a tokenizer spells the space into the token).
// Null for none.
absl::StatusOr<std::shared_ptr<const std::vector<std::vector<int32_t>>>> BadWordSequences(
    const v1::SamplingParams& s, const Tokenizer& tokenizer, const RequestLimits& limits) {
  if (s.bad_words().empty()) return nullptr;
  if (s.bad_words_size() > kMaxBadWords) {
    return Invalid("sampling.bad_words",
                   absl::StrCat(s.bad_words_size(), " words; at most ", kMaxBadWords));
  }
  auto words = std::make_shared<std::vector<std::vector<int32_t>>>();
  for (int i = 0; i < s.bad_words_size(); ++i) {
    const std::string field = absl::StrCat("sampling.bad_words[", i, "]");
    const std::string& word = s.bad_words(i);
    if (word.size() > 1024) return Invalid(field, "longer than 1024 bytes");
    const std::string bare(absl::StripLeadingAsciiWhitespace(word));
    if (bare.empty()) return Invalid(field, "empty");
    // vLLM's rule: the word as written; with a space before it, only where that is another
    // first token and as many tokens. Only the sequences kept must fit the limits.
    std::vector<int32_t> first;
    for (const std::string& text : {bare, " " + bare}) {
      absl::StatusOr<std::vector<int32_t>> ids = tokenizer.Encode(text, false);
      if (!ids.ok()) return Invalid(field, std::string(ids.status().message()));
      const bool spaced = !first.empty();
      if (!spaced && ids->empty()) return Invalid(field, "encodes to no tokens");
      if (spaced && (ids->empty() || (*ids)[0] == first[0] || ids->size() != first.size())) {
        continue;
      }
      if (ids->size() > static_cast<size_t>(kMaxBadWordTokens)) {
        return Invalid(field, absl::StrCat(ids->size(), " tokens; at most ", kMaxBadWordTokens));
      }
      for (int32_t id : *ids) {
        if (id < 0 || id >= limits.vocab_size) {
          return Invalid(field, absl::StrCat("token ", id, " is outside the model's vocabulary"));
        }
      }
      if (!spaced) first = *ids;
      words->push_back(*std::move(ids));
    }
  }
  return std::shared_ptr<const std::vector<std::vector<int32_t>>>(std::move(words));
}

// A tool call's id as the chat template sees it. Mistral's templates refuse ids that are not 9
// alphanumerics ("call_" and 24 hex digits, kvrm's and OpenAI's, among them): for a model in
// the Mistral format a longer id is cut to its last 9 characters, as vLLM cuts them, the same
// way in the call and in the tool turn that answers it.
std::string TemplateToolCallId(const std::string& id, const ChatConfig* config) {
  if (config == nullptr || config->tool_call_format != ToolCallFormat::kMistral || id.size() <= 9) {
    return id;
  }
  return id.substr(id.size() - 9);
}

}  // namespace

absl::StatusOr<std::string> RenderChatPrompt(const v1::ChatPrompt& chat, const ChatConfig* config,
                                             const RequestLimits& limits) {
  if (chat.messages_size() == 0) return Invalid("chat.messages", "no messages");
  if (chat.messages_size() > limits.max_chat_messages) {
    return Invalid("chat.messages", absl::StrCat(chat.messages_size(), " messages; at most ",
                                                 limits.max_chat_messages));
  }
  ChatTemplateInputs inputs;
  if (chat.continue_final_message() && chat.add_generation_prompt()) {
    return Invalid("chat.continue_final_message", "not with add_generation_prompt true");
  }
  inputs.add_generation_prompt = chat.has_add_generation_prompt()
                                     ? chat.add_generation_prompt()
                                     : !chat.continue_final_message();
  int64_t bytes = 0;
  for (int i = 0; i < chat.messages_size(); ++i) {
    const v1::ChatMessage& m = chat.messages(i);
    const std::string at = absl::StrCat("chat.messages[", i, "]");
    const std::string field = at + ".role";
    if (m.role().empty() || m.role().size() > 64) {
      return Invalid(field.c_str(), "must be 1 to 64 bytes");
    }
    for (unsigned char c : m.role()) {
      if (c < 0x20 || c > 0x7e) return Invalid(field.c_str(), "must be printable ASCII");
    }
    ChatMessage message{m.role(), m.content()};
    RETURN_IF_ERROR(CheckPrintable(at + ".tool_call_id", m.tool_call_id(), 64));
    RETURN_IF_ERROR(CheckPrintable(at + ".name", m.name(), 64));
    message.tool_call_id = TemplateToolCallId(m.tool_call_id(), config);
    message.name = m.name();
    message.reasoning_content = m.reasoning_content();
    if (m.tool_calls_size() > limits.max_tools) {
      return Invalid(at + ".tool_calls",
                     absl::StrCat(m.tool_calls_size(), " calls; at most ", limits.max_tools));
    }
    for (int j = 0; j < m.tool_calls_size(); ++j) {
      const v1::ToolCall& c = m.tool_calls(j);
      const std::string call = absl::StrCat(at, ".tool_calls[", j, "]");
      RETURN_IF_ERROR(CheckFunctionName(call + ".name", c.name()));
      RETURN_IF_ERROR(CheckPrintable(call + ".id", c.id(), 64));
      RETURN_IF_ERROR(CheckJsonObject(call + ".arguments", c.arguments(),
                                      limits.max_tool_json_bytes));
      message.tool_calls.push_back(
          ChatToolCall{TemplateToolCallId(c.id(), config), c.name(), c.arguments()});
      bytes += static_cast<int64_t>(c.name().size() + c.id().size() + c.arguments().size());
    }
    bytes +=
        static_cast<int64_t>(m.content().size() + m.role().size() + m.reasoning_content().size());
    inputs.messages.push_back(std::move(message));
  }
  ASSIGN_OR_RETURN(const std::vector<ToolSpec> tools, ToolsFromProto(chat, limits));
  for (const ToolSpec& tool : tools) {
    inputs.tools.push_back(ToolTemplateJson(tool));
    bytes += static_cast<int64_t>(inputs.tools.back().size());
  }
  RETURN_IF_ERROR(CheckJsonObject("chat.template_kwargs", chat.template_kwargs(),
                                  limits.max_tool_json_bytes));
  if (!chat.template_kwargs().empty()) {
    const OrderedJson kwargs = *ParseOrderedJson(chat.template_kwargs(), "JSON");
    for (const char* name : kStandardTemplateVariables) {
      if (kwargs.contains(name)) {
        return Invalid("chat.template_kwargs",
                       absl::StrCat("may not set the template's own variable '", name, "'"));
      }
    }
    inputs.extra_variables = chat.template_kwargs();
  }
  if (bytes > limits.max_prompt_bytes) {
    return Invalid("chat.messages", absl::StrCat("messages of ", bytes,
                                                 " bytes exceed the limit of ",
                                                 limits.max_prompt_bytes));
  }
  if (config == nullptr) return Invalid("chat", "the server has no chat template");
  // Errors from here name "chat: ..." (a missing template, or the template's own message).
  ASSIGN_OR_RETURN(std::string text, config->Render(std::move(inputs)));
  if (chat.continue_final_message()) {
    // vLLM's rule: cut after the last occurrence of the final message's stripped content.
    const absl::string_view content =
        absl::StripAsciiWhitespace(chat.messages(chat.messages_size() - 1).content());
    const size_t at =
        content.empty() ? std::string::npos : text.rfind(content.data(), std::string::npos,
                                                         content.size());
    if (at == std::string::npos) {
      return Invalid("chat.continue_final_message",
                     "the chat template does not write the last message's content verbatim");
    }
    text.resize(at + content.size());
  }
  if (text.empty()) return Invalid("chat", "the template rendered an empty prompt");
  return text;
}

absl::StatusOr<StructuredField> StructuredSpecFromProto(const v1::StructuredOutput& proto) {
  using Kind = structured::ConstraintSpec::Kind;
  StructuredField out;
  structured::ConstraintSpec& spec = out.spec;
  switch (proto.constraint_case()) {
    case v1::StructuredOutput::kRegex:
      spec.kind = Kind::kRegex;
      spec.text = proto.regex();
      out.field = "structured.regex";
      break;
    case v1::StructuredOutput::kJsonSchema:
      spec.kind = Kind::kJsonSchema;
      spec.text = proto.json_schema();
      out.field = "structured.json_schema";
      break;
    case v1::StructuredOutput::kJsonObject:
      if (!proto.json_object()) return Invalid("structured.json_object", "set it to true");
      spec.kind = Kind::kJsonObject;
      out.field = "structured.json_object";
      break;
    case v1::StructuredOutput::kChoice:
      spec.kind = Kind::kChoice;
      spec.choices.assign(proto.choice().choices().begin(), proto.choice().choices().end());
      out.field = "structured.choice";
      break;
    case v1::StructuredOutput::kGrammar:
      spec.kind = Kind::kGrammar;
      spec.text = proto.grammar();
      out.field = "structured.grammar";
      break;
    default:
      return Invalid("structured", "set regex, json_schema, json_object, choice or grammar");
  }
  spec.whitespace_pattern = proto.whitespace_pattern();
  return out;
}

absl::StatusOr<std::vector<ToolSpec>> ToolsFromProto(const v1::ChatPrompt& chat,
                                                     const RequestLimits& limits) {
  if (chat.tools_size() > limits.max_tools) {
    return Invalid("chat.tools",
                   absl::StrCat(chat.tools_size(), " tools; at most ", limits.max_tools));
  }
  std::vector<ToolSpec> tools;
  tools.reserve(chat.tools_size());
  for (int i = 0; i < chat.tools_size(); ++i) {
    const v1::Tool& t = chat.tools(i);
    const std::string at = absl::StrCat("chat.tools[", i, "]");
    RETURN_IF_ERROR(CheckFunctionName(at + ".name", t.name()));
    for (int k = 0; k < i; ++k) {
      if (chat.tools(k).name() == t.name()) {
        return Invalid(at + ".name", absl::StrCat("'", t.name(), "' is also chat.tools[", k, "]"));
      }
    }
    if (static_cast<int64_t>(t.description().size()) > limits.max_tool_json_bytes) {
      return Invalid(at + ".description", absl::StrCat(t.description().size(), " bytes; at most ",
                                                       limits.max_tool_json_bytes));
    }
    RETURN_IF_ERROR(
        CheckJsonObject(at + ".parameters", t.parameters(), limits.max_tool_json_bytes));
    tools.push_back(ToolSpec{t.name(), t.description(), t.parameters()});
  }
  return tools;
}

absl::StatusOr<std::optional<ToolCalling>> ToolCallingFromProto(const v1::GenerateRequest& proto,
                                                                ToolCallFormat format,
                                                                const RequestLimits& limits,
                                                                bool harmony) {
  if (!proto.has_chat()) return std::nullopt;
  const v1::ChatPrompt& chat = proto.chat();
  if (chat.tools_size() == 0) {
    if (ForcesCalls(chat)) return Invalid("chat.tool_choice", "needs chat.tools");
    return std::nullopt;
  }
  ToolCalling out;
  out.single_call = SingleToolCall(chat);
  if (chat.has_tool_choice() && NamesFunction(chat.tool_choice())) {
    ASSIGN_OR_RETURN(const std::vector<ToolSpec> tools, ToolsFromProto(chat, limits));
    const std::string& name = chat.tool_choice().function();
    if (std::none_of(tools.begin(), tools.end(),
                     [&](const ToolSpec& t) { return t.name == name; })) {
      return Invalid("chat.tool_choice.function",
                     absl::StrCat("'", name, "' is not one of chat.tools"));
    }
    out.mode = ToolCallStream::Mode::kNamed;
    out.function = name;
    out.choice = 3;
    if (harmony) {  // the call in gpt-oss's own form, read as an auto one (HarmonyStream)
      out.mode = ToolCallStream::Mode::kAuto;
      out.tools = tools;
    }
    return out;
  }
  switch (chat.tool_choice().mode()) {
    case v1::TOOL_CHOICE_MODE_NONE: out.choice = 1; out.parse = false; return out;
    case v1::TOOL_CHOICE_MODE_REQUIRED:
      out.mode = ToolCallStream::Mode::kRequired;
      out.choice = 2;
      if (harmony) {
        out.mode = ToolCallStream::Mode::kAuto;
        ASSIGN_OR_RETURN(out.tools, ToolsFromProto(chat, limits));
      }
      return out;
    case v1::TOOL_CHOICE_MODE_AUTO: {
      if (format == ToolCallFormat::kNone) {
        return Invalid("chat.tool_choice",
                       "AUTO needs the model's tool-call format, and this server has none (kvrmd "
                       "--tool_call_parser); use REQUIRED, a named function or NONE");
      }
      ASSIGN_OR_RETURN(out.tools, ToolsFromProto(chat, limits));
      return out;
    }
    default:
      return Invalid("chat.tool_choice.mode",
                     absl::StrCat(static_cast<int>(chat.tool_choice().mode()), " is not a mode"));
  }
}

absl::StatusOr<std::optional<StructuredField>> RequestConstraint(const v1::GenerateRequest& proto,
                                                                 const RequestLimits& limits,
                                                                 bool harmony) {
  const bool forced = proto.has_chat() && ForcesCalls(proto.chat());
  if (forced && proto.has_structured()) {
    return Invalid("structured", "not with chat.tool_choice REQUIRED or a named function");
  }
  if (proto.has_structured()) {
    ASSIGN_OR_RETURN(StructuredField f, StructuredSpecFromProto(proto.structured()));
    return f;
  }
  if (!forced) return std::nullopt;
  const v1::ChatPrompt& chat = proto.chat();
  if (chat.tools_size() == 0) return Invalid("chat.tool_choice", "needs chat.tools");
  ASSIGN_OR_RETURN(const std::vector<ToolSpec> tools, ToolsFromProto(chat, limits));
  StructuredField f;
  f.spec.kind = structured::ConstraintSpec::Kind::kJsonSchema;
  f.field = "chat.tool_choice";
  auto it = tools.end();
  if (NamesFunction(chat.tool_choice())) {
    it = std::find_if(tools.begin(), tools.end(),
                      [&](const ToolSpec& t) { return t.name == chat.tool_choice().function(); });
    if (it == tools.end()) {
      return Invalid("chat.tool_choice.function",
                     absl::StrCat("'", chat.tool_choice().function(), "' is not one of chat.tools"));
    }
  }
  if (harmony) {
    // gpt-oss's own call ("<|channel|>commentary to=functions.NAME ..."): one of the functions
    // (the named one), its arguments held to its schema.
    f.spec.kind = structured::ConstraintSpec::Kind::kHarmonyToolCalls;
    for (const ToolSpec& t : tools) {
      if (it != tools.end() && &t != &*it) continue;
      f.spec.choices.push_back(t.name);
      f.spec.schemas.push_back(NamedToolCallSchema(t));
    }
  } else if (it != tools.end()) {
    f.spec.text = NamedToolCallSchema(*it);
  } else {
    f.spec.text = RequiredToolCallsSchema(tools, SingleToolCall(chat));
  }
  return f;
}

absl::StatusOr<std::shared_ptr<const structured::Grammar>> CompileConstraint(
    const StructuredField& f, structured::ConstraintCompiler* compiler) {
  if (compiler == nullptr) return Invalid("structured", "this server has no structured outputs");
  absl::StatusOr<std::shared_ptr<const structured::Grammar>> grammar = compiler->Compile(f.spec);
  if (!grammar.ok()) {
    // The compiler's messages about the whitespace pattern name it ("whitespace_pattern: ...").
    const absl::string_view why = grammar.status().message();
    return absl::InvalidArgumentError(absl::StartsWith(why, "whitespace_pattern")
                                          ? absl::StrCat("structured.", why)
                                          : absl::StrCat(f.field, ": ", why));
  }
  return grammar;
}

absl::StatusOr<std::shared_ptr<const structured::Grammar>> CompileStructuredOutput(
    const v1::StructuredOutput& proto, structured::ConstraintCompiler* compiler) {
  ASSIGN_OR_RETURN(const StructuredField f, StructuredSpecFromProto(proto));
  return CompileConstraint(f, compiler);
}

bool IsHarmonyChat(const v1::GenerateRequest& proto, const ChatConfig* chat) {
  return proto.has_chat() && chat != nullptr && chat->reasoning_format == ReasoningFormat::kHarmony;
}

bool ConstraintFollowsThinking(const v1::GenerateRequest& proto, const ChatConfig* chat) {
  return proto.has_chat() && chat != nullptr &&
         (chat->reasoning_format == ReasoningFormat::kThink ||
          chat->reasoning_format == ReasoningFormat::kHarmony) &&
         !proto.structured().include_thinking();
}

namespace {

// Beam search's own limits, and the fields it has no use for, refused by name rather than
// ignored (a client relying on one learns at once).
absl::Status CheckBeamSearch(const v1::GenerateRequest& proto) {
  if (proto.n() > kMaxBeamWidth) {
    return Invalid(
        "n", absl::StrCat(proto.n(), " beams; beam search keeps at most ", kMaxBeamWidth,
                          " (each step scores the top 2n tokens, at most ", kMaxTopLogprobs, ")"));
  }
  const float penalty = proto.beam_search().length_penalty();
  if (!std::isfinite(penalty) || penalty < -10 || penalty > 10) {
    return Invalid("beam_search.length_penalty", absl::StrCat(penalty, " is outside [-10, 10]"));
  }
  const char* why = "not with beam_search (it scores every token; it does not sample)";
  const v1::SamplingParams& s = proto.sampling();
  if (s.top_k() != 0) return Invalid("sampling.top_k", why);
  if (s.top_p() != 0 && s.top_p() != 1) return Invalid("sampling.top_p", why);
  if (s.min_p() != 0) return Invalid("sampling.min_p", why);
  const char* history = "not with beam_search (each beam's tokens reach the model as its prompt)";
  if (s.presence_penalty() != 0) return Invalid("sampling.presence_penalty", history);
  if (s.frequency_penalty() != 0) return Invalid("sampling.frequency_penalty", history);
  if (s.bad_words_size() > 0) return Invalid("sampling.bad_words", history);
  const v1::StoppingCriteria& st = proto.stopping();
  const char* stops = "not with beam_search (a beam ends at an end-of-sequence token or the limit)";
  if (st.stop_sequences_size() > 0) return Invalid("stopping.stop_sequences", stops);
  if (st.stop_token_ids_size() > 0) return Invalid("stopping.stop_token_ids", stops);
  if (st.min_tokens() != 0) return Invalid("stopping.min_tokens", stops);
  if (st.time_limit_ms() != 0) return Invalid("stopping.time_limit_ms", stops);
  if (proto.has_structured()) return Invalid("structured", "not with beam_search");
  if (proto.has_chat() && proto.chat().tools_size() > 0) {
    return Invalid("chat.tools", "not with beam_search");
  }
  if (proto.has_chat() && proto.chat().has_thinking_budget()) {
    return Invalid("chat.thinking_budget", "not with beam_search");
  }
  const v1::ResponseOptions& ro = proto.response();
  if (ro.logprobs() || ro.top_logprobs() != 0) {
    return Invalid("response.logprobs",
                   "not with beam_search (Finished.cumulative_logprob scores each beam)");
  }
  if (ro.prompt_logprobs() || ro.prompt_top_logprobs() != 0) {
    return Invalid("response.prompt_logprobs", "not with beam_search");
  }
  return absl::OkStatus();
}

// chat.thinking_budget as the engine keeps it: the reasoning format's markers as the tokenizer
// writes them (`thinking` says whether the reply starts inside the block). A model that does not
// think has no budget to keep.
absl::StatusOr<ThinkingBudget> ChatThinkingBudget(const v1::ChatPrompt& chat,
                                                  structured::ConstraintSpec::Thinking thinking,
                                                  const Tokenizer& tokenizer,
                                                  int32_t default_budget) {
  using Thinking = structured::ConstraintSpec::Thinking;
  ThinkingBudget budget;
  if (chat.has_thinking_budget() && chat.thinking_budget() < 0) {
    return Invalid("chat.thinking_budget", absl::StrCat(chat.thinking_budget(), " is negative"));
  }
  const int32_t max_tokens = chat.has_thinking_budget() ? chat.thinking_budget() : default_budget;
  if (max_tokens < 0 || thinking == Thinking::kNone) return budget;
  std::string start(kThinkStart), end(kThinkEnd), forced(kThinkEnd);
  if (thinking == Thinking::kHarmony) {
    // gpt-oss thinks in its analysis channel; the budget ends that message and opens the final
    // one.
    start = HarmonyText({kHarmonyChannel, "analysis", kHarmonyMessage});
    end = std::string(kHarmonyEnd);
    forced = HarmonyText(
        {kHarmonyEnd, kHarmonyStart, "assistant", kHarmonyChannel, "final", kHarmonyMessage});
  }
  for (auto [text, seq] : {std::pair{start, &budget.start}, std::pair{end, &budget.end},
                           std::pair{forced, &budget.forced}}) {
    absl::StatusOr<std::vector<int32_t>> ids = tokenizer.Encode(text, /*add_bos=*/false);
    if (!ids.ok() || ids->empty()) {
      // The server's default is not the request's fault: it goes without.
      if (!chat.has_thinking_budget()) return ThinkingBudget{};
      return Invalid("chat.thinking_budget",
                     absl::StrCat("the tokenizer cannot write the thinking's marker \"",
                                  std::string(text), "\""));
    }
    *seq = std::move(*ids);
  }
  budget.starts_inside = thinking == Thinking::kInside;
  budget.max_tokens = max_tokens;
  return budget;
}

}  // namespace

absl::StatusOr<std::unique_ptr<GenerationRequest>> ValidateGenerateRequest(
    const v1::GenerateRequest& proto, const Tokenizer& tokenizer, const RequestLimits& limits,
    const ChatConfig* chat, structured::ConstraintCompiler* structured,
    structured::ConstraintSpec::Thinking* thinking_out) {
  auto r = std::make_unique<GenerationRequest>();
  structured::ConstraintSpec::Thinking thinking = structured::ConstraintSpec::Thinking::kNone;
  RETURN_IF_ERROR(ValidateRequestId(proto.request_id()));
  r->request_id = proto.request_id();

  switch (proto.prompt_case()) {
    case v1::GenerateRequest::kText: {
      if (proto.text().empty()) return Invalid("text", "prompt is empty");
      if (static_cast<int64_t>(proto.text().size()) > limits.max_prompt_bytes) {
        return Invalid("text", absl::StrCat("prompt of ", proto.text().size(),
                                            " bytes exceeds the limit of ",
                                            limits.max_prompt_bytes));
      }
      absl::StatusOr<std::vector<int32_t>> ids = tokenizer.Encode(proto.text(), !proto.skip_bos());
      if (!ids.ok()) return Invalid("text", std::string(ids.status().message()));
      r->prompt = std::move(*ids);
      if (r->prompt.empty()) return Invalid("text", "prompt encodes to no tokens");
      break;
    }
    case v1::GenerateRequest::kTokenIds: {
      const auto& ids = proto.token_ids().ids();
      if (ids.empty()) return Invalid("token_ids", "prompt is empty");
      RETURN_IF_ERROR(CheckTokenIds("token_ids", ids, limits.vocab_size));
      r->prompt.assign(ids.begin(), ids.end());
      break;
    }
    case v1::GenerateRequest::kChat: {
      ASSIGN_OR_RETURN(std::string text, RenderChatPrompt(proto.chat(), chat, limits));
      if (chat->reasoning_format == ReasoningFormat::kThink) {
        thinking = PromptOpensReasoning(text) ? structured::ConstraintSpec::Thinking::kInside
                                              : structured::ConstraintSpec::Thinking::kMayOpen;
      } else if (chat->reasoning_format == ReasoningFormat::kHarmony) {
        thinking = structured::ConstraintSpec::Thinking::kHarmony;
      }
      // The template writes BOS and every other special token itself (transformers tokenizes
      // apply_chat_template's text with add_special_tokens=False).
      absl::StatusOr<std::vector<int32_t>> ids = tokenizer.Encode(text, /*add_bos=*/false);
      if (!ids.ok()) return Invalid("chat", std::string(ids.status().message()));
      r->prompt = std::move(*ids);
      if (r->prompt.empty()) return Invalid("chat", "the rendered prompt encodes to no tokens");
      break;
    }
    default:
      return Invalid("prompt", "set text, token_ids or chat");
  }
  if (const int32_t k = proto.truncate_prompt_tokens(); k != 0) {
    int64_t keep = k;
    if (k == -1) {
      keep = std::max<int64_t>(1, limits.max_context - std::max(1, proto.stopping().max_new_tokens()));
    } else if (k < 1 || k >= limits.max_context) {
      return Invalid("truncate_prompt_tokens",
                     absl::StrCat(k, " is outside [1, max context - 1 = ", limits.max_context - 1,
                                  "] (or -1: what leaves room for max_new_tokens)"));
    }
    if (static_cast<int64_t>(r->prompt.size()) > keep) {
      r->prompt.erase(r->prompt.begin(), r->prompt.end() - keep);
    }
  }
  if (static_cast<int64_t>(r->prompt.size()) >= limits.max_context) {
    return Invalid(proto.has_token_ids() ? "token_ids" : proto.has_chat() ? "chat" : "text",
                   absl::StrCat("prompt of ", r->prompt.size(),
                                " tokens does not fit the max context of ", limits.max_context,
                                " (at least one token must be generated)"));
  }

  RETURN_IF_ERROR(ValidateSampling(proto.sampling(), limits.vocab_size, &r->sampling));
  ASSIGN_OR_RETURN(r->sampling.bad_words, BadWordSequences(proto.sampling(), tokenizer, limits));

  const v1::StoppingCriteria& st = proto.stopping();
  if (st.max_new_tokens() < 1 || st.max_new_tokens() > limits.max_new_tokens) {
    return Invalid("stopping.max_new_tokens",
                   absl::StrCat(st.max_new_tokens(), " is outside [1, ", limits.max_new_tokens,
                                "]"));
  }
  r->max_new_tokens = st.max_new_tokens();
  if (st.min_tokens() < 0 || st.min_tokens() > st.max_new_tokens()) {
    return Invalid("stopping.min_tokens",
                   absl::StrCat(st.min_tokens(), " is outside [0, max_new_tokens = ",
                                st.max_new_tokens(), "]"));
  }
  r->min_tokens = st.min_tokens();
  if (st.stop_sequences_size() > limits.max_stop_sequences) {
    return Invalid("stopping.stop_sequences",
                   absl::StrCat("more than ", limits.max_stop_sequences, " sequences"));
  }
  for (const std::string& s : st.stop_sequences()) {
    if (s.empty() || static_cast<int32_t>(s.size()) > limits.max_stop_sequence_bytes) {
      return Invalid("stopping.stop_sequences",
                     absl::StrCat("each must be 1 to ", limits.max_stop_sequence_bytes, " bytes"));
    }
    r->stop_sequences.push_back(s);
  }
  r->include_stop_str_in_output = st.include_stop_str_in_output();
  if (st.stop_token_ids_size() > limits.max_stop_token_ids) {
    return Invalid("stopping.stop_token_ids",
                   absl::StrCat("more than ", limits.max_stop_token_ids, " ids"));
  }
  for (int32_t id : st.stop_token_ids()) {
    if (id < 0 || id >= limits.vocab_size) {
      return Invalid("stopping.stop_token_ids",
                     absl::StrCat("id ", id, " is outside the vocabulary"));
    }
    r->stop_token_ids.push_back(id);
  }
  r->ignore_eos = st.ignore_eos();
  r->time_limit = absl::Milliseconds(st.time_limit_ms());

  const v1::ResponseOptions& ro = proto.response();
  if (ro.top_logprobs() < 0 || ro.top_logprobs() > kMaxTopLogprobs) {
    return Invalid("response.top_logprobs",
                   absl::StrCat(ro.top_logprobs(), " is outside [0, ", kMaxTopLogprobs, "]"));
  }
  r->sampling.logprobs = ro.logprobs() || ro.top_logprobs() > 0;
  r->sampling.top_logprobs = ro.top_logprobs();
  if (ro.prompt_top_logprobs() < 0 || ro.prompt_top_logprobs() > kMaxTopLogprobs) {
    return Invalid("response.prompt_top_logprobs", absl::StrCat(ro.prompt_top_logprobs(),
                                                                " is outside [0, ",
                                                                kMaxTopLogprobs, "]"));
  }
  r->prompt_logprobs =
      ro.prompt_logprobs() || ro.prompt_top_logprobs() > 0 ? ro.prompt_top_logprobs() : -1;

  RETURN_IF_ERROR(CheckSharedFields(proto.priority(), proto.cache_salt(), proto.lora_adapter()));
  r->priority = proto.priority();
  r->cache_salt = CacheSaltKey(proto.cache_salt());
  r->lora_name = proto.lora_adapter();
  if (proto.n() < 0 || proto.n() > limits.max_n) {
    return Invalid("n", absl::StrCat(proto.n(), " is outside [1, ", limits.max_n, "] (0: 1)"));
  }
  if (proto.has_beam_search()) RETURN_IF_ERROR(CheckBeamSearch(proto));
  RETURN_IF_ERROR(ValidateSamplingConfig(r->sampling));
  if (thinking_out != nullptr) *thinking_out = thinking;
  if (proto.has_chat()) {
    // (A beam search takes no budget: the server's default does not apply to one.)
    ASSIGN_OR_RETURN(
        r->thinking_budget,
        ChatThinkingBudget(proto.chat(), thinking, tokenizer,
                           proto.has_beam_search() ? -1 : limits.default_thinking_budget));
  }
  ASSIGN_OR_RETURN(std::optional<StructuredField> constraint,
                   RequestConstraint(proto, limits, IsHarmonyChat(proto, chat)));
  if (constraint) {
    if (ConstraintFollowsThinking(proto, chat)) constraint->spec.thinking = thinking;
    ASSIGN_OR_RETURN(r->grammar, CompileConstraint(*constraint, structured));
  }
  return r;
}

namespace {

// truncate_prompt_tokens of the pooling calls: 0 (off), -1 (as much as fits), or [1, context).
absl::Status CheckTruncation(int32_t k, const RequestLimits& limits) {
  if (k != 0 && k != -1 && (k < 1 || k >= limits.max_context)) {
    return Invalid("truncate_prompt_tokens",
                   absl::StrCat(k, " is outside [1, max context - 1 = ", limits.max_context - 1,
                                "] (or -1: as many as the context holds)"));
  }
  return absl::OkStatus();
}

// A pooled prompt's last `k` tokens (0: all), which must fit the context: the engine's context
// holds a prompt of max context - 1 tokens (room for the token it would sample; a pooled prompt
// samples none, but takes its slot as a prompt does).
absl::Status FitPooledPrompt(const std::string& field, int32_t k, const RequestLimits& limits,
                             std::vector<int32_t>* prompt) {
  const int64_t fits = limits.max_context - 1;
  const int64_t keep = k == -1 ? fits : k;
  if (k != 0 && static_cast<int64_t>(prompt->size()) > keep) {
    prompt->erase(prompt->begin(), prompt->end() - keep);
  }
  if (static_cast<int64_t>(prompt->size()) > fits) {
    return Invalid(field, absl::StrCat(prompt->size(), " tokens do not fit the max context of ",
                                       limits.max_context,
                                       " (truncate_prompt_tokens: -1 keeps the last ", fits, ")"));
  }
  return absl::OkStatus();
}

std::unique_ptr<GenerationRequest> PoolingRequest(std::vector<int32_t> prompt, Pooling pooling,
                                                  int32_t priority, uint64_t salt,
                                                  const std::string& lora) {
  auto r = std::make_unique<GenerationRequest>();
  r->prompt = std::move(prompt);
  r->pooling = pooling;
  r->max_new_tokens = 1;
  r->priority = priority;
  r->cache_salt = salt;
  r->lora_name = lora;
  return r;
}

// Adds `text`'s bytes to the call's count, bounded as one prompt's text is.
absl::Status CountText(const std::string& field, const std::string& text,
                       const RequestLimits& limits, int64_t* bytes) {
  if (text.empty()) return Invalid(field, "empty");
  *bytes += static_cast<int64_t>(text.size());
  if (*bytes > limits.max_prompt_bytes) {
    return Invalid(field, absl::StrCat("the call's text exceeds the limit of ",
                                       limits.max_prompt_bytes, " bytes"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> EncodeField(const std::string& field, const std::string& text,
                                                 const Tokenizer& tokenizer, bool special) {
  absl::StatusOr<std::vector<int32_t>> ids = tokenizer.Encode(text, special);
  if (!ids.ok()) return Invalid(field, std::string(ids.status().message()));
  if (ids->empty()) return Invalid(field, "encodes to no tokens");
  return ids;
}

// What Embed and Classify share: their inputs (EmbedInput), each one engine request pooled by
// `pooling`, and the fields of the same names (the request id is the caller's to check first).
template <typename Proto>
absl::StatusOr<std::vector<std::unique_ptr<GenerationRequest>>> PooledInputs(
    const Proto& proto, const Tokenizer& tokenizer, const RequestLimits& limits, Pooling pooling) {
  if (proto.inputs().empty()) return Invalid("inputs", "empty");
  if (proto.inputs_size() > limits.max_embed_inputs) {
    return Invalid("inputs",
                   absl::StrCat(proto.inputs_size(), " inputs; at most ", limits.max_embed_inputs));
  }
  RETURN_IF_ERROR(CheckSharedFields(proto.priority(), proto.cache_salt(), proto.lora_adapter()));
  RETURN_IF_ERROR(CheckTruncation(proto.truncate_prompt_tokens(), limits));
  const uint64_t salt = CacheSaltKey(proto.cache_salt());
  std::vector<std::unique_ptr<GenerationRequest>> out;
  int64_t bytes = 0;
  for (int i = 0; i < proto.inputs_size(); ++i) {
    const v1::EmbedInput& in = proto.inputs(i);
    std::vector<int32_t> prompt;
    std::string field;
    switch (in.input_case()) {
      case v1::EmbedInput::kText: {
        field = absl::StrCat("inputs[", i, "].text");
        RETURN_IF_ERROR(CountText(field, in.text(), limits, &bytes));
        ASSIGN_OR_RETURN(prompt,
                         EncodeField(field, in.text(), tokenizer, !proto.skip_special_tokens()));
        break;
      }
      case v1::EmbedInput::kTokenIds: {
        field = absl::StrCat("inputs[", i, "].token_ids");
        const auto& ids = in.token_ids().ids();
        if (ids.empty()) return Invalid(field, "empty");
        RETURN_IF_ERROR(CheckTokenIds(field, ids, limits.vocab_size));
        prompt.assign(ids.begin(), ids.end());
        break;
      }
      default:
        return Invalid(absl::StrCat("inputs[", i, "]"), "set text or token_ids");
    }
    RETURN_IF_ERROR(FitPooledPrompt(field, proto.truncate_prompt_tokens(), limits, &prompt));
    out.push_back(
        PoolingRequest(std::move(prompt), pooling, proto.priority(), salt, proto.lora_adapter()));
  }
  return out;
}

}  // namespace

absl::StatusOr<EmbedPlan> ValidateEmbedRequest(const v1::EmbedRequest& proto,
                                               const Tokenizer& tokenizer,
                                               const RequestLimits& limits, Pooling default_pooling,
                                               bool default_normalize, int32_t hidden_size) {
  RETURN_IF_ERROR(ValidateRequestId(proto.request_id()));
  EmbedPlan plan;
  switch (proto.pooling()) {
    case v1::POOLING_UNSPECIFIED:
      plan.pooling = default_pooling;
      break;
    case v1::POOLING_LAST:
      plan.pooling = Pooling::kLast;
      break;
    case v1::POOLING_MEAN:
      plan.pooling = Pooling::kMean;
      break;
    case v1::POOLING_CLS:
      plan.pooling = Pooling::kCls;
      break;
    default:
      return Invalid("pooling", absl::StrCat("unknown value ", proto.pooling()));
  }
  plan.normalize = proto.has_normalize() ? proto.normalize() : default_normalize;
  if (proto.dimensions() < 0 || proto.dimensions() > hidden_size) {
    return Invalid("dimensions", absl::StrCat(proto.dimensions(), " is outside [1, hidden size = ",
                                              hidden_size, "] (0: all)"));
  }
  plan.dimensions = proto.dimensions();
  ASSIGN_OR_RETURN(plan.inputs, PooledInputs(proto, tokenizer, limits, plan.pooling));
  return plan;
}

absl::StatusOr<std::vector<std::unique_ptr<GenerationRequest>>> ValidateClassifyRequest(
    const v1::ClassifyRequest& proto, const Tokenizer& tokenizer, const RequestLimits& limits) {
  RETURN_IF_ERROR(ValidateRequestId(proto.request_id()));
  // Transformers' *ForSequenceClassification reads the last token's hidden state.
  return PooledInputs(proto, tokenizer, limits, Pooling::kLast);
}

absl::StatusOr<ScorePlan> ValidateScoreRequest(const v1::ScoreRequest& proto,
                                               const Tokenizer& tokenizer,
                                               const RequestLimits& limits, bool cross_encoder,
                                               Pooling pooling) {
  RETURN_IF_ERROR(ValidateRequestId(proto.request_id()));
  const int32_t docs = proto.documents_size();
  if (docs == 0) return Invalid("documents", "empty");
  if (docs > limits.max_embed_inputs) {
    return Invalid("documents",
                   absl::StrCat(docs, " documents; at most ", limits.max_embed_inputs));
  }
  const int32_t queries = proto.queries_size();
  if (queries != 1 && queries != docs) {
    return Invalid("queries", absl::StrCat(queries, " queries for ", docs,
                                           " documents: give one, or one per document"));
  }
  RETURN_IF_ERROR(CheckSharedFields(proto.priority(), proto.cache_salt(), proto.lora_adapter()));
  const int32_t k = proto.truncate_prompt_tokens();
  RETURN_IF_ERROR(CheckTruncation(k, limits));
  const uint64_t salt = CacheSaltKey(proto.cache_salt());
  const bool special = !proto.skip_special_tokens();
  ScorePlan plan;
  plan.cross_encoder = cross_encoder;
  plan.queries = queries;
  plan.documents = docs;
  int64_t bytes = 0;
  auto add = [&](std::vector<int32_t> prompt) {
    plan.inputs.push_back(PoolingRequest(std::move(prompt),
                                         cross_encoder ? Pooling::kLast : pooling, proto.priority(),
                                         salt, proto.lora_adapter()));
  };
  if (!cross_encoder) {
    // Each distinct text embedded as Embed would: the queries, then the documents.
    for (int32_t i = 0; i < queries + docs; ++i) {
      const bool query = i < queries;
      const std::string field =
          query ? absl::StrCat("queries[", i, "]") : absl::StrCat("documents[", i - queries, "]");
      const std::string& text = query ? proto.queries(i) : proto.documents(i - queries);
      RETURN_IF_ERROR(CountText(field, text, limits, &bytes));
      ASSIGN_OR_RETURN(std::vector<int32_t> prompt, EncodeField(field, text, tokenizer, special));
      RETURN_IF_ERROR(FitPooledPrompt(field, k, limits, &prompt));
      add(std::move(prompt));
    }
    return plan;
  }
  // Each (query, document) pair joined as the tokenizer joins pairs; a pair too long for the
  // cap loses the document's end (the query is what the document is scored against).
  const int64_t fits = limits.max_context - 1;
  const int64_t cap = k > 0 ? std::min<int64_t>(k, fits) : fits;
  std::vector<std::vector<int32_t>> query_ids(queries);
  for (int32_t q = 0; q < queries; ++q) {
    const std::string field = absl::StrCat("queries[", q, "]");
    RETURN_IF_ERROR(CountText(field, proto.queries(q), limits, &bytes));
    ASSIGN_OR_RETURN(query_ids[q], EncodeField(field, proto.queries(q), tokenizer, false));
  }
  for (int32_t d = 0; d < docs; ++d) {
    const std::string field = absl::StrCat("documents[", d, "]");
    const int32_t q = queries == 1 ? 0 : d;
    RETURN_IF_ERROR(CountText(field, proto.documents(d), limits, &bytes));
    ASSIGN_OR_RETURN(std::vector<int32_t> doc,
                     EncodeField(field, proto.documents(d), tokenizer, false));
    std::vector<int32_t> pair = tokenizer.JoinPair(query_ids[q], doc, special);
    if (static_cast<int64_t>(pair.size()) > cap) {
      const int64_t excess = static_cast<int64_t>(pair.size()) - cap;
      if (k == 0) {
        return Invalid(field,
                       absl::StrCat("with queries[", q, "], ", pair.size(),
                                    " tokens do not fit the max context of ", limits.max_context,
                                    " (truncate_prompt_tokens: -1 cuts the document)"));
      }
      if (excess >= static_cast<int64_t>(doc.size())) {
        return Invalid(absl::StrCat("queries[", q, "]"),
                       absl::StrCat(query_ids[q].size(), " tokens leave no room for ", field,
                                    " within ", cap, " tokens"));
      }
      doc.resize(doc.size() - excess);
      pair = tokenizer.JoinPair(query_ids[q], doc, special);
    }
    add(std::move(pair));
  }
  return plan;
}

void FinishEmbedding(int32_t dimensions, bool normalize, std::vector<float>* v) {
  if (dimensions > 0 && static_cast<size_t>(dimensions) < v->size()) v->resize(dimensions);
  if (!normalize) return;
  double sum = 0;
  for (float x : *v) sum += static_cast<double>(x) * x;
  if (sum <= 0) return;
  const double inv = 1.0 / std::sqrt(sum);
  for (float& x : *v) x = static_cast<float>(x * inv);
}

}  // namespace kvrm
