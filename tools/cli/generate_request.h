// Builds a kvrm.v1.GenerateRequest from kvrm_cli's generate flags.
//
// Only what the command line itself can get wrong is checked here (a prompt given twice, an id that
// is not a number); ranges such as top_p in (0, 1] are the server's to check, so that the client
// never disagrees with it.
#ifndef KVRM_TOOLS_CLI_GENERATE_REQUEST_H_
#define KVRM_TOOLS_CLI_GENERATE_REQUEST_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kvrm/v1/kvrm.pb.h"

namespace kvrm::cli {

// The generate flags, as plain values (see kvrm_cli.cc for their help).
struct GenerateOptions {
  std::string prompt;
  std::string token_ids;  // "1,2,3"; exclusive with prompt
  // Chat turns, each "role:content" in order (one per --message given); exclusive with prompt
  // and token_ids. `system`, when set, is a first "system" turn.
  std::vector<std::string> messages;
  std::string system;
  bool continue_final_message = false;  // the model goes on with the last --message
  bool skip_bos = false;
  int32_t max_new_tokens = 64;
  float temperature = 0;
  int32_t top_k = 0;
  float top_p = 0;
  float min_p = 0;
  std::optional<uint64_t> seed;
  float repetition_penalty = 0;
  float presence_penalty = 0;
  float frequency_penalty = 0;
  // One entry per --stop given; each a comma-separated list of C-escaped sequences.
  std::vector<std::string> stop;
  std::string stop_token_ids;  // "1,2"
  bool ignore_eos = false;
  int32_t min_tokens = 0;
  bool include_stop_str_in_output = false;
  int32_t truncate_prompt_tokens = 0;  // 0 keeps the whole prompt, -1 what leaves room
  std::string logit_bias;  // "id:bias,..." e.g. "13:-100,42:2.5"
  std::string allowed_token_ids;  // "1,2"
  std::vector<std::string> bad_words;  // each as written (vLLM's bad_words)
  // < 0: off; 0: the sampled token's logprob; N > 0: also the top N alternatives.
  int32_t logprobs = -1;
  // < 0: off; N >= 0: score the prompt (ResponseOptions.prompt_logprobs) with N alternatives.
  int32_t prompt_logprobs = -1;
  int32_t n = 1;  // completions (GenerateRequest.n)
  // Beam search with n beams (GenerateRequest.beam_search); no length_penalty: the server's 1.
  bool beam_search = false;
  std::optional<float> length_penalty;
  int32_t priority = 0;
  std::string cache_salt;
  std::string lora_adapter;  // GenerateRequest.lora_adapter ("": the base model)
  uint32_t time_limit_ms = 0;
  std::string request_id;
  // Structured output: at most one of regex, json_schema (JSON text, or @FILE), json_object,
  // choice (one entry per --choice given, each a comma-separated C-escaped list as --stop) and
  // grammar (GBNF text, or @FILE).
  std::string regex;
  std::string json_schema;
  std::string grammar;
  bool json_object = false;
  std::vector<std::string> choice;
  std::string whitespace_pattern;
  // A thinking model's chat reply: the constraint holds the thinking too (StructuredOutput.
  // include_thinking), not only the answer after it.
  bool include_thinking = false;
  // Tool calling (chat only): tools as a JSON array (inline, or @FILE) of OpenAI tools
  // ({"type": "function", "function": {...}}) or bare {"name", "description", "parameters"};
  // tool_choice "auto", "none", "required" or a function's name; template_kwargs a JSON object.
  std::string tools;
  std::string tool_choice;
  std::string template_kwargs;
  std::optional<bool> parallel_tool_calls;  // unset: the server's default (true)
  std::optional<int32_t> thinking_budget;   // chat.thinking_budget; unset: none
};

// Parses "1, 2,3" into ids. `flag` names the flag in errors. Empty text gives no ids.
absl::StatusOr<std::vector<int32_t>> ParseIdList(absl::string_view text, absl::string_view flag);

// Splits each --stop value at commas and C-unescapes the pieces ("\n" is a newline, "\x2c" a
// comma). Empty values are skipped; an empty piece inside a list is an error.
absl::StatusOr<std::vector<std::string>> ParseStopSequences(absl::Span<const std::string> values);

// Parses "13:-100, 42:2.5" into (token id, bias) pairs. Empty text gives none.
absl::StatusOr<std::vector<std::pair<int32_t, float>>> ParseLogitBias(absl::string_view text);

// The chat prompt of --system and --message values ("role:content", split at the first colon)
// and --continue_final_message.
absl::StatusOr<v1::ChatPrompt> BuildChatPrompt(const std::string& system,
                                               absl::Span<const std::string> messages,
                                               bool continue_final_message);

// Adds --tools, --tool_choice and --template_kwargs to a chat prompt (usage errors name the flag).
absl::Status AddToolOptions(const std::string& tools, const std::string& tool_choice,
                            const std::string& template_kwargs, v1::ChatPrompt* prompt);

// InvalidArgument (a usage error) when the options cannot form a request.
absl::StatusOr<v1::GenerateRequest> BuildGenerateRequest(const GenerateOptions& options);

}  // namespace kvrm::cli

#endif  // KVRM_TOOLS_CLI_GENERATE_REQUEST_H_
