#include "tools/cli/generate_request.h"

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/json.h"
#include "common/status_macros.h"

namespace kvrm::cli {

absl::StatusOr<std::vector<int32_t>> ParseIdList(absl::string_view text, absl::string_view flag) {
  std::vector<int32_t> ids;
  if (absl::StripAsciiWhitespace(text).empty()) return ids;
  for (absl::string_view piece : absl::StrSplit(text, ',')) {
    int32_t id = 0;
    if (!absl::SimpleAtoi(piece, &id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": '", piece, "' is not a token id"));
    }
    ids.push_back(id);
  }
  return ids;
}

absl::StatusOr<std::vector<std::string>> ParseStopSequences(absl::Span<const std::string> values) {
  std::vector<std::string> stops;
  for (const std::string& value : values) {
    if (value.empty()) continue;
    for (absl::string_view piece : absl::StrSplit(value, ',')) {
      std::string stop;
      std::string error;
      if (!absl::CUnescape(piece, &stop, &error)) {
        return absl::InvalidArgumentError(absl::StrCat("--stop: '", piece, "': ", error));
      }
      if (stop.empty()) {
        return absl::InvalidArgumentError(absl::StrCat("--stop: empty sequence in '", value, "'"));
      }
      stops.push_back(std::move(stop));
    }
  }
  return stops;
}

absl::StatusOr<std::vector<std::pair<int32_t, float>>> ParseLogitBias(absl::string_view text) {
  std::vector<std::pair<int32_t, float>> bias;
  if (absl::StripAsciiWhitespace(text).empty()) return bias;
  for (absl::string_view piece : absl::StrSplit(text, ',')) {
    const std::vector<absl::string_view> f = absl::StrSplit(piece, ':');
    int32_t id = 0;
    float value = 0;
    if (f.size() != 2 || !absl::SimpleAtoi(f[0], &id) || !absl::SimpleAtof(f[1], &value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--logit_bias: '", piece, "' is not token_id:bias"));
    }
    bias.emplace_back(id, value);
  }
  return bias;
}

absl::StatusOr<v1::ChatPrompt> BuildChatPrompt(const std::string& system,
                                               absl::Span<const std::string> messages,
                                               bool continue_final_message) {
  if (messages.empty()) return absl::InvalidArgumentError("--system needs a --message after it");
  v1::ChatPrompt prompt;
  if (!system.empty()) {
    v1::ChatMessage* m = prompt.add_messages();
    m->set_role("system");
    m->set_content(system);
  }
  for (const std::string& turn : messages) {
    const size_t colon = turn.find(':');
    if (colon == std::string::npos || colon == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--message: '", turn, "' is not role:content (user:Hello)"));
    }
    v1::ChatMessage* m = prompt.add_messages();
    m->set_role(turn.substr(0, colon));
    m->set_content(turn.substr(colon + 1));
  }
  prompt.set_continue_final_message(continue_final_message);
  return prompt;
}

namespace {

// A flag's value, or the file it names with a leading '@'.
absl::StatusOr<std::string> InlineOrFile(const std::string& value, absl::string_view flag) {
  if (value.empty() || value[0] != '@') return value;
  absl::StatusOr<std::string> text = ReadFileToString(value.substr(1));
  if (!text.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", text.status().message()));
  }
  return text;
}

}  // namespace

absl::Status AddToolOptions(const std::string& tools, const std::string& tool_choice,
                            const std::string& template_kwargs, v1::ChatPrompt* prompt) {
  if (!tools.empty()) {
    ASSIGN_OR_RETURN(const std::string text, InlineOrFile(tools, "tools"));
    // In order: the server keeps a schema's properties in the order they are written.
    absl::StatusOr<OrderedJson> json = ParseOrderedJson(text, "--tools");
    if (!json.ok()) return json.status();
    if (!json->is_array()) return absl::InvalidArgumentError("--tools: expected a JSON array");
    for (size_t i = 0; i < json->size(); ++i) {
      const OrderedJson& entry = (*json)[i];
      // OpenAI's {"type": "function", "function": {...}}, or the function object alone.
      const OrderedJson& f =
          entry.is_object() && entry.contains("function") ? entry["function"] : entry;
      if (!f.is_object() || !f.contains("name") || !f["name"].is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--tools: entry ", i, " has no \"name\" string"));
      }
      v1::Tool* tool = prompt->add_tools();
      tool->set_name(f["name"].get<std::string>());
      if (f.contains("description") && f["description"].is_string()) {
        tool->set_description(f["description"].get<std::string>());
      }
      if (f.contains("parameters")) tool->set_parameters(f["parameters"].dump());
    }
  }
  if (!tool_choice.empty()) {
    v1::ToolChoice* choice = prompt->mutable_tool_choice();
    if (tool_choice == "auto") {
      choice->set_mode(v1::TOOL_CHOICE_MODE_AUTO);
    } else if (tool_choice == "none") {
      choice->set_mode(v1::TOOL_CHOICE_MODE_NONE);
    } else if (tool_choice == "required") {
      choice->set_mode(v1::TOOL_CHOICE_MODE_REQUIRED);
    } else {
      choice->set_function(tool_choice);
    }
  }
  if (!template_kwargs.empty()) {
    ASSIGN_OR_RETURN(std::string text, InlineOrFile(template_kwargs, "template_kwargs"));
    prompt->set_template_kwargs(std::move(text));
  }
  return absl::OkStatus();
}

namespace {

absl::Status SetStructuredOutput(const GenerateOptions& options, v1::StructuredOutput* out) {
  const int given = !options.regex.empty() + !options.json_schema.empty() + options.json_object +
                    !options.choice.empty() + !options.grammar.empty();
  if (given > 1) {
    return absl::InvalidArgumentError(
        "give at most one of --regex, --json_schema, --json_object, --choice and --grammar");
  }
  if (!options.whitespace_pattern.empty() && options.json_schema.empty() &&
      !options.json_object) {
    return absl::InvalidArgumentError(
        "--whitespace_pattern goes with --json_schema or --json_object");
  }
  if (!options.regex.empty()) out->set_regex(options.regex);
  if (options.json_object) out->set_json_object(true);
  if (!options.json_schema.empty()) {
    ASSIGN_OR_RETURN(*out->mutable_json_schema(), InlineOrFile(options.json_schema, "json_schema"));
  }
  if (!options.grammar.empty()) {
    ASSIGN_OR_RETURN(*out->mutable_grammar(), InlineOrFile(options.grammar, "grammar"));
  }
  if (!options.choice.empty()) {
    absl::StatusOr<std::vector<std::string>> choices = ParseStopSequences(options.choice);
    if (!choices.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--choice", absl::StripPrefix(choices.status().message(), "--stop")));
    }
    for (std::string& c : *choices) out->mutable_choice()->add_choices(std::move(c));
  }
  if (options.include_thinking && given == 0) {
    return absl::InvalidArgumentError(
        "--include_thinking goes with --regex, --json_schema, --json_object, --choice or "
        "--grammar");
  }
  if (!options.whitespace_pattern.empty()) out->set_whitespace_pattern(options.whitespace_pattern);
  out->set_include_thinking(options.include_thinking);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::GenerateRequest> BuildGenerateRequest(const GenerateOptions& options) {
  v1::GenerateRequest request;
  const bool chat = !options.messages.empty() || !options.system.empty();
  if (static_cast<int>(!options.prompt.empty()) + static_cast<int>(!options.token_ids.empty()) +
          static_cast<int>(chat) != 1) {
    return absl::InvalidArgumentError(
        "give exactly one of --prompt, --token_ids and --message (with --system)");
  }
  if (chat) {
    ASSIGN_OR_RETURN(*request.mutable_chat(),
                     BuildChatPrompt(options.system, options.messages,
                                     options.continue_final_message));
    RETURN_IF_ERROR(AddToolOptions(options.tools, options.tool_choice, options.template_kwargs,
                                   request.mutable_chat()));
    if (options.parallel_tool_calls) {
      request.mutable_chat()->set_parallel_tool_calls(*options.parallel_tool_calls);
    }
    if (options.thinking_budget)
      request.mutable_chat()->set_thinking_budget(*options.thinking_budget);
  } else if (!options.tools.empty() || !options.tool_choice.empty() ||
             !options.template_kwargs.empty() || options.parallel_tool_calls ||
             options.thinking_budget) {
    return absl::InvalidArgumentError(
        "--tools, --tool_choice, --parallel_tool_calls, --template_kwargs and --thinking_budget "
        "need --message");
  } else if (options.continue_final_message) {
    return absl::InvalidArgumentError("--continue_final_message needs --message");
  } else if (!options.prompt.empty()) {
    request.set_text(options.prompt);
  } else {
    ASSIGN_OR_RETURN(std::vector<int32_t> ids, ParseIdList(options.token_ids, "token_ids"));
    if (ids.empty()) return absl::InvalidArgumentError("--token_ids: no ids given");
    request.mutable_token_ids()->mutable_ids()->Add(ids.begin(), ids.end());
  }
  request.set_request_id(options.request_id);
  request.set_skip_bos(options.skip_bos);
  request.set_priority(options.priority);
  request.set_cache_salt(options.cache_salt);
  request.set_lora_adapter(options.lora_adapter);

  v1::SamplingParams* sampling = request.mutable_sampling();
  sampling->set_temperature(options.temperature);
  sampling->set_top_k(options.top_k);
  sampling->set_top_p(options.top_p);
  sampling->set_min_p(options.min_p);
  if (options.seed.has_value()) sampling->set_seed(*options.seed);
  sampling->set_repetition_penalty(options.repetition_penalty);
  sampling->set_presence_penalty(options.presence_penalty);
  sampling->set_frequency_penalty(options.frequency_penalty);
  ASSIGN_OR_RETURN(const auto bias, ParseLogitBias(options.logit_bias));
  for (const auto& [id, value] : bias) (*sampling->mutable_logit_bias())[id] = value;
  ASSIGN_OR_RETURN(const std::vector<int32_t> allowed,
                   ParseIdList(options.allowed_token_ids, "allowed_token_ids"));
  sampling->mutable_allowed_token_ids()->Add(allowed.begin(), allowed.end());
  for (const std::string& word : options.bad_words) sampling->add_bad_words(word);

  v1::StoppingCriteria* stopping = request.mutable_stopping();
  stopping->set_max_new_tokens(options.max_new_tokens);
  ASSIGN_OR_RETURN(std::vector<std::string> stops, ParseStopSequences(options.stop));
  for (std::string& stop : stops) stopping->add_stop_sequences(std::move(stop));
  ASSIGN_OR_RETURN(std::vector<int32_t> stop_ids,
                   ParseIdList(options.stop_token_ids, "stop_token_ids"));
  stopping->mutable_stop_token_ids()->Add(stop_ids.begin(), stop_ids.end());
  stopping->set_ignore_eos(options.ignore_eos);
  stopping->set_min_tokens(options.min_tokens);
  stopping->set_include_stop_str_in_output(options.include_stop_str_in_output);
  request.set_truncate_prompt_tokens(options.truncate_prompt_tokens);
  stopping->set_time_limit_ms(options.time_limit_ms);
  if (options.n != 1) request.set_n(options.n);  // the server checks the range
  if (options.beam_search) {
    v1::BeamSearch* beam = request.mutable_beam_search();
    if (options.length_penalty) beam->set_length_penalty(*options.length_penalty);
  } else if (options.length_penalty) {
    return absl::InvalidArgumentError("--length_penalty: only with --beam_search");
  }

  if (options.logprobs >= 0) {
    request.mutable_response()->set_logprobs(true);
    request.mutable_response()->set_top_logprobs(options.logprobs);
  }
  if (options.prompt_logprobs >= 0) {
    request.mutable_response()->set_prompt_logprobs(true);
    request.mutable_response()->set_prompt_top_logprobs(options.prompt_logprobs);
  }
  RETURN_IF_ERROR(SetStructuredOutput(options, request.mutable_structured()));
  if (request.structured().constraint_case() == v1::StructuredOutput::CONSTRAINT_NOT_SET) {
    request.clear_structured();
  }
  return request;
}

}  // namespace kvrm::cli
