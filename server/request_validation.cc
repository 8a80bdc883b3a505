#include "server/request_validation.h"

#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kvrm {
namespace {

absl::Status Invalid(const char* field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

bool Finite(float v) { return std::isfinite(v); }

absl::Status ValidateRequestId(const std::string& id) {
  if (id.size() > 128) return Invalid("request_id", "longer than 128 bytes");
  for (unsigned char c : id) {
    if (c < 0x20 || c > 0x7e) return Invalid("request_id", "must be printable ASCII");
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
    const std::string field = absl::StrCat("chat.messages[", i, "].role");
    if (m.role().empty() || m.role().size() > 64) {
      return Invalid(field.c_str(), "must be 1 to 64 bytes");
    }
    for (unsigned char c : m.role()) {
      if (c < 0x20 || c > 0x7e) return Invalid(field.c_str(), "must be printable ASCII");
    }
    bytes += static_cast<int64_t>(m.content().size() + m.role().size());
    inputs.messages.push_back(ChatMessage{m.role(), m.content()});
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
    default:
      return Invalid("structured", "set regex, json_schema, json_object or choice");
  }
  spec.whitespace_pattern = proto.whitespace_pattern();
  return out;
}

absl::StatusOr<std::shared_ptr<const structured::Grammar>> CompileStructuredOutput(
    const v1::StructuredOutput& proto, structured::ConstraintCompiler* compiler) {
  ASSIGN_OR_RETURN(const StructuredField f, StructuredSpecFromProto(proto));
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

absl::StatusOr<std::unique_ptr<GenerationRequest>> ValidateGenerateRequest(
    const v1::GenerateRequest& proto, const Tokenizer& tokenizer, const RequestLimits& limits,
    const ChatConfig* chat, structured::ConstraintCompiler* structured) {
  auto r = std::make_unique<GenerationRequest>();
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
      for (int i = 0; i < ids.size(); ++i) {
        if (ids[i] < 0 || ids[i] >= limits.vocab_size) {
          return Invalid("token_ids", absl::StrCat("id ", ids[i], " at index ", i,
                                                   " is outside the vocabulary [0, ",
                                                   limits.vocab_size, ")"));
        }
      }
      r->prompt.assign(ids.begin(), ids.end());
      break;
    }
    case v1::GenerateRequest::kChat: {
      ASSIGN_OR_RETURN(std::string text, RenderChatPrompt(proto.chat(), chat, limits));
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
  if (static_cast<int64_t>(r->prompt.size()) >= limits.max_context) {
    return Invalid(proto.has_token_ids() ? "token_ids" : proto.has_chat() ? "chat" : "text",
                   absl::StrCat("prompt of ", r->prompt.size(),
                                " tokens does not fit the max context of ", limits.max_context,
                                " (at least one token must be generated)"));
  }

  RETURN_IF_ERROR(ValidateSampling(proto.sampling(), limits.vocab_size, &r->sampling));

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

  if (proto.priority() < -100 || proto.priority() > 100) {
    return Invalid("priority", absl::StrCat(proto.priority(), " is outside [-100, 100]"));
  }
  r->priority = proto.priority();
  if (proto.cache_salt().size() > 256) {
    return Invalid("cache_salt", absl::StrCat(proto.cache_salt().size(), " bytes; at most 256"));
  }
  r->cache_salt = CacheSaltKey(proto.cache_salt());
  if (proto.n() < 0 || proto.n() > limits.max_n) {
    return Invalid("n", absl::StrCat(proto.n(), " is outside [1, ", limits.max_n, "] (0: 1)"));
  }
  RETURN_IF_ERROR(ValidateSamplingConfig(r->sampling));
  if (proto.has_structured()) {
    ASSIGN_OR_RETURN(r->grammar, CompileStructuredOutput(proto.structured(), structured));
  }
  return r;
}

}  // namespace kvrm
