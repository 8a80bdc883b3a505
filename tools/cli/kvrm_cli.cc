// kvrm_cli: command-line client of kvrmd's kvrm.v1 gRPC API. See tools/cli/README.md.
//
// Exit status: 0 success; 1 an RPC failed, the generation failed, or health is not SERVING; 2 a
// usage error; 130 interrupted by Ctrl-C.
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/notification.h"
#include "absl/types/span.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "kvrm/v1/kvrm.grpc.pb.h"
#include "tools/cli/arg_parser.h"
#include "tools/cli/format.h"
#include "tools/cli/generate_request.h"
#include "tools/cli/health_wire.h"
#include "tools/cli/interrupt.h"

ABSL_FLAG(std::string, server, "localhost:50051", "kvrmd address, host:port");
ABSL_FLAG(double, timeout_s, 0, "deadline of each RPC in seconds; 0 = none");
ABSL_FLAG(bool, json, false, "print each response message as one line of JSON");

ABSL_FLAG(std::string, prompt, "", "prompt text (or give --token_ids)");
ABSL_FLAG(std::string, token_ids, "", "prompt as token ids, e.g. 1,2,3 (no BOS is added)");
ABSL_FLAG(std::string, message, "",
          "a chat turn, role:content (user:Hello), rendered by the model's chat template; "
          "repeatable, in order (instead of --prompt)");
ABSL_FLAG(std::string, system, "", "with --message: a first system turn");
ABSL_FLAG(bool, continue_final_message, false,
          "with --message: the model continues the last message (e.g. a partial "
          "assistant:... reply) instead of starting a new turn");
ABSL_FLAG(bool, skip_bos, false, "do not prepend the BOS token to a text prompt");
ABSL_FLAG(int32_t, max_new_tokens, 64, "upper bound on generated tokens");
ABSL_FLAG(float, temperature, 0, "softmax temperature; 0 = greedy");
ABSL_FLAG(int32_t, top_k, 0, "keep the k most likely tokens; 0 = off");
ABSL_FLAG(float, top_p, 0, "nucleus sampling mass in (0, 1]; 0 = off");
ABSL_FLAG(float, min_p, 0, "drop tokens below min_p times the best one's probability");
ABSL_FLAG(std::optional<uint64_t>, seed, std::nullopt,
          "random seed; unset = server-drawn (not reproducible)");
ABSL_FLAG(float, repetition_penalty, 0, "CTRL-style penalty over prompt and output; 0 = off");
ABSL_FLAG(float, presence_penalty, 0, "OpenAI-style presence penalty in [-2, 2]");
ABSL_FLAG(float, frequency_penalty, 0, "OpenAI-style frequency penalty in [-2, 2]");
ABSL_FLAG(std::string, stop, "",
          "stop sequences, comma-separated and C-escaped (\\n, \\x2c for a comma); repeatable");
ABSL_FLAG(std::string, stop_token_ids, "", "token ids that end generation, e.g. 13,42");
ABSL_FLAG(bool, ignore_eos, false, "keep generating past end-of-sequence tokens");
ABSL_FLAG(int32_t, min_tokens, 0,
          "generate at least this many tokens before EOS, stop ids or stop sequences end it");
ABSL_FLAG(bool, include_stop_str_in_output, false,
          "end the text with the matched stop sequence instead of cutting it off");
ABSL_FLAG(int32_t, truncate_prompt_tokens, 0,
          "keep only the prompt's last N tokens; -1: what leaves room for --max_new_tokens");
ABSL_FLAG(std::string, allowed_token_ids, "",
          "only these token ids can be sampled, e.g. 13,42");
ABSL_FLAG(std::string, bad_word, "", "a word never to generate (vLLM's bad_words); repeatable");
ABSL_FLAG(std::string, logit_bias, "",
          "token_id:bias pairs added to the logits, e.g. 13:-100,42:2.5 (bias in [-100, 100])");
ABSL_FLAG(int32_t, logprobs, -1,
          "-1 off; 0 the sampled token's logprob; N also the top N alternatives (<= 20)");
ABSL_FLAG(int32_t, prompt_logprobs, -1,
          "-1 off; N >= 0: score every prompt token (logprob, rank, top N alternatives, <= 20) "
          "and print the prompt's perplexity to stderr (CPU device)");
ABSL_FLAG(int32_t, n, 1,
          "completions of the prompt, in [1, 16] (prefilled once); with n > 1 each is printed "
          "after the call, under a header, with its own summary");
ABSL_FLAG(bool, beam_search, false,
          "beam search instead of sampling: the --n best beams (1-10), best first, each with its "
          "cumulative logprob");
ABSL_FLAG(double, length_penalty, 1,
          "with --beam_search: score = cumulative logprob / length^length_penalty (0: the "
          "cumulative logprob alone)");
ABSL_FLAG(int32_t, priority, 0, "scheduling priority in [-100, 100]; higher runs first");
ABSL_FLAG(std::string, cache_salt, "",
          "prefix-cache namespace: cached KV is shared only with requests of the same salt");
ABSL_FLAG(std::string, lora_adapter, "",
          "run with this LoRA adapter (a name kvrmd serves: --lora_modules, or load-lora; `info` "
          "lists them)");
ABSL_FLAG(uint32_t, time_limit_ms, 0, "server-side wall-clock limit in ms; 0 = none");
ABSL_FLAG(std::string, request_id, "", "request id echoed in responses and server logs");
ABSL_FLAG(std::string, regex, "", "structured output: the completion must match this regex");
ABSL_FLAG(std::string, json_schema, "",
          "structured output: a JSON Schema (inline JSON, or @FILE) the completion must be an "
          "instance of");
ABSL_FLAG(bool, json_object, false, "structured output: the completion is a JSON object");
ABSL_FLAG(std::string, grammar, "",
          "structured output: a GBNF grammar (llama.cpp's syntax, from rule root; inline, or "
          "@FILE) the completion must match");
ABSL_FLAG(std::string, choice, "",
          "structured output: the completion is exactly one of these, comma-separated and "
          "C-escaped as --stop; repeatable");
ABSL_FLAG(std::string, whitespace_pattern, "",
          "with --json_schema / --json_object: a regex for the whitespace between JSON tokens "
          "(default: at most one space)");
ABSL_FLAG(bool, include_thinking, false,
          "with a structured-output flag, for a model that thinks (<think> blocks): the "
          "constraint holds the whole reply, thinking included (default: only the answer)");
ABSL_FLAG(std::string, tools, "",
          "with --message: functions the model may call, a JSON array (inline, or @FILE) of "
          "OpenAI tools ({\"type\": \"function\", \"function\": {\"name\", \"description\", "
          "\"parameters\"}}); calls print as 'tool call NAME ARGUMENTS (ID)'");
ABSL_FLAG(std::string, tool_choice, "",
          "with --tools: auto (default), none, required, or the name of the function to call");
ABSL_FLAG(bool, parallel_tool_calls, true,
          "with --tools: false holds the reply to at most one call");
ABSL_FLAG(int32_t, thinking_budget, 0,
          "with --message: at most this many tokens of thinking (a model that thinks); then the "
          "server writes the block's end and the model answers");
ABSL_FLAG(std::string, template_kwargs, "",
          "with --message: more chat-template variables, a JSON object (inline, or @FILE), e.g. "
          "{\"enable_thinking\": false}");

ABSL_FLAG(std::string, text, "", "text to tokenize (embed, classify: repeat for more inputs)");
ABSL_FLAG(std::string, query, "", "score: the query the documents are scored against");
ABSL_FLAG(std::string, document, "", "score: a document to score; repeat for more");
ABSL_FLAG(std::string, pooling, "",
          "embed: last, mean or cls (default: the server's, ModelInfo.pooling)");
ABSL_FLAG(int32_t, dimensions, 0, "embed: keep the first N components (then normalize)");
ABSL_FLAG(std::string, normalize, "", "embed: true or false (default: the server's)");
ABSL_FLAG(bool, add_bos, false, "prepend the BOS token as generate does");
ABSL_FLAG(bool, pieces, false, "also print each token's text");
ABSL_FLAG(std::string, tokens, "",
          "token ids to detokenize, comma- or space-separated, e.g. 1,450,3");
ABSL_FLAG(bool, skip_special_tokens, false, "leave BOS/EOS and other special tokens out");

ABSL_FLAG(std::string, service, "", "service to ask about; empty = the whole server");

ABSL_FLAG(std::string, lora_name, "", "load-lora / unload-lora: the adapter's name");
ABSL_FLAG(std::string, lora_path, "",
          "load-lora: the PEFT adapter directory, as the server sees its file system");

namespace kvrm::cli {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;
constexpr int kExitInterrupted = 130;

struct Command {
  absl::string_view name;
  absl::string_view summary;
  absl::Span<const absl::string_view> flags;
  int (*run)(const ParsedFlags& flags);
};

int UsageError(absl::string_view message) {
  fprintf(stderr, "error: %s\n", std::string(message).c_str());
  return kExitUsage;
}

std::shared_ptr<grpc::Channel> MakeChannel() {
  return grpc::CreateChannel(absl::GetFlag(FLAGS_server), grpc::InsecureChannelCredentials());
}

void SetDeadline(grpc::ClientContext* context) {
  const double timeout_s = absl::GetFlag(FLAGS_timeout_s);
  if (timeout_s <= 0) return;
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::microseconds(static_cast<int64_t>(timeout_s * 1e6)));
}

// Prints a failed call as "error: CODE: message" (with the server's retry hint when it gave one)
// and returns the exit status.
int ReportRpcError(const grpc::Status& status, const grpc::ClientContext& context,
                   const CancelOnInterrupt& cancel) {
  if (cancel.interrupted() && status.error_code() == grpc::StatusCode::CANCELLED) {
    fprintf(stderr, "interrupted\n");
    return kExitInterrupted;
  }
  std::string line = absl::StrCat(
      "error: ", absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code())), ": ",
      status.error_message());
  const auto& trailers = context.GetServerTrailingMetadata();
  if (auto it = trailers.find("retry-after-ms"); it != trailers.end()) {
    absl::StrAppend(&line, " (retry after ",
                    absl::string_view(it->second.data(), it->second.size()), " ms)");
  }
  fprintf(stderr, "%s\n", line.c_str());
  return kExitFailure;
}

// Writes `text` to stdout and flushes, so tokens show as they arrive even through a pipe.
void Emit(absl::string_view text) {
  fwrite(text.data(), 1, text.size(), stdout);
  fflush(stdout);
}

GenerateOptions GenerateOptionsFromFlags(const ParsedFlags& flags) {
  GenerateOptions options;
  options.prompt = absl::GetFlag(FLAGS_prompt);
  options.token_ids = absl::GetFlag(FLAGS_token_ids);
  if (auto it = flags.given.find("message"); it != flags.given.end()) options.messages = it->second;
  options.system = absl::GetFlag(FLAGS_system);
  options.continue_final_message = absl::GetFlag(FLAGS_continue_final_message);
  options.skip_bos = absl::GetFlag(FLAGS_skip_bos);
  options.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  options.temperature = absl::GetFlag(FLAGS_temperature);
  options.top_k = absl::GetFlag(FLAGS_top_k);
  options.top_p = absl::GetFlag(FLAGS_top_p);
  options.min_p = absl::GetFlag(FLAGS_min_p);
  options.seed = absl::GetFlag(FLAGS_seed);
  options.repetition_penalty = absl::GetFlag(FLAGS_repetition_penalty);
  options.presence_penalty = absl::GetFlag(FLAGS_presence_penalty);
  options.frequency_penalty = absl::GetFlag(FLAGS_frequency_penalty);
  if (auto it = flags.given.find("stop"); it != flags.given.end()) options.stop = it->second;
  options.stop_token_ids = absl::GetFlag(FLAGS_stop_token_ids);
  options.ignore_eos = absl::GetFlag(FLAGS_ignore_eos);
  options.min_tokens = absl::GetFlag(FLAGS_min_tokens);
  options.include_stop_str_in_output = absl::GetFlag(FLAGS_include_stop_str_in_output);
  options.truncate_prompt_tokens = absl::GetFlag(FLAGS_truncate_prompt_tokens);
  if (flags.given.contains("thinking_budget")) {
    options.thinking_budget = absl::GetFlag(FLAGS_thinking_budget);
  }
  if (flags.given.contains("parallel_tool_calls")) {
    options.parallel_tool_calls = absl::GetFlag(FLAGS_parallel_tool_calls);
  }
  options.logit_bias = absl::GetFlag(FLAGS_logit_bias);
  options.allowed_token_ids = absl::GetFlag(FLAGS_allowed_token_ids);
  if (auto it = flags.given.find("bad_word"); it != flags.given.end())
    options.bad_words = it->second;
  options.logprobs = absl::GetFlag(FLAGS_logprobs);
  options.prompt_logprobs = absl::GetFlag(FLAGS_prompt_logprobs);
  options.n = absl::GetFlag(FLAGS_n);
  options.beam_search = absl::GetFlag(FLAGS_beam_search);
  if (flags.given.contains("length_penalty")) {
    options.length_penalty = static_cast<float>(absl::GetFlag(FLAGS_length_penalty));
  }
  options.priority = absl::GetFlag(FLAGS_priority);
  options.cache_salt = absl::GetFlag(FLAGS_cache_salt);
  options.lora_adapter = absl::GetFlag(FLAGS_lora_adapter);
  options.time_limit_ms = absl::GetFlag(FLAGS_time_limit_ms);
  options.request_id = absl::GetFlag(FLAGS_request_id);
  options.regex = absl::GetFlag(FLAGS_regex);
  options.json_schema = absl::GetFlag(FLAGS_json_schema);
  options.json_object = absl::GetFlag(FLAGS_json_object);
  options.grammar = absl::GetFlag(FLAGS_grammar);
  if (auto it = flags.given.find("choice"); it != flags.given.end()) options.choice = it->second;
  options.whitespace_pattern = absl::GetFlag(FLAGS_whitespace_pattern);
  options.include_thinking = absl::GetFlag(FLAGS_include_thinking);
  options.tools = absl::GetFlag(FLAGS_tools);
  options.tool_choice = absl::GetFlag(FLAGS_tool_choice);
  options.template_kwargs = absl::GetFlag(FLAGS_template_kwargs);
  return options;
}

int RunGenerate(const ParsedFlags& flags) {
  absl::StatusOr<v1::GenerateRequest> request =
      BuildGenerateRequest(GenerateOptionsFromFlags(flags));
  if (!request.ok()) return UsageError(request.status().message());
  const bool json = absl::GetFlag(FLAGS_json);

  auto stub = v1::Kvrm::NewStub(MakeChannel());
  grpc::ClientContext context;
  SetDeadline(&context);
  CancelOnInterrupt cancel(&context);
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
      stub->Generate(&context, *request);

  // One completion streams to stdout as it arrives; n > 1 are collected and printed after.
  // The server refuses n outside [1, 16] before any message: sized from the clamped value.
  const int32_t n = std::clamp(request->n(), 1, 16);
  struct Completion {
    std::string text;
    std::string reasoning;  // a thinking model's (GenerateResponse.reasoning_text)
    std::optional<v1::Finished> finished;
    std::vector<v1::TokenLogprob> logprobs;
    std::vector<v1::TokenLogprob> prompt_logprobs;  // completion 0's first message
  };
  std::vector<Completion> completions(n);
  v1::GenerateResponse response;
  std::string last_text;  // only its last byte matters: did the output end a line?
  while (reader->Read(&response)) {
    const int32_t index = response.index();
    if (index < 0 || index >= n) {
      fprintf(stderr, "error: a message for completion %d of %d\n", index, n);
      continue;
    }
    Completion& c = completions[index];
    if (json) {
      absl::StatusOr<std::string> line = ToJsonLine(response);
      if (line.ok()) {
        Emit(absl::StrCat(*line, "\n"));
      } else {
        fprintf(stderr, "error: %s\n", line.status().ToString().c_str());
      }
    } else {
      // The thinking goes to stderr as it streams, so stdout stays the answer alone.
      if (n == 1 && !response.reasoning_text().empty()) {
        fputs(response.reasoning_text().c_str(), stderr);
      }
      if (n == 1 && c.text.empty() && !c.reasoning.empty() && !response.text().empty()) {
        fputs("\n", stderr);  // the thinking ended
      }
      c.reasoning += response.reasoning_text();
      if (n == 1) Emit(response.text());
      c.text += response.text();
      if (!response.text().empty()) last_text = response.text();
      c.logprobs.insert(c.logprobs.end(), response.logprobs().begin(), response.logprobs().end());
      c.prompt_logprobs.insert(c.prompt_logprobs.end(), response.prompt_logprobs().begin(),
                               response.prompt_logprobs().end());
    }
    if (response.has_finished()) c.finished = response.finished();
  }
  const grpc::Status status = reader->Finish();
  // End the line for a terminal only: piped output stays byte-exact.
  if (!json && n == 1 && isatty(STDOUT_FILENO) && !last_text.empty() && last_text.back() != '\n') {
    Emit("\n");
  }
  if (!status.ok()) return ReportRpcError(status, context, cancel);
  bool failed = false;
  for (int32_t i = 0; i < n; ++i) {
    const Completion& c = completions[i];
    if (!c.finished.has_value()) {
      fprintf(stderr, "error: completion %d ended without a finished message\n", i);
      return kExitFailure;
    }
    failed = failed || c.finished->reason() == v1::FINISH_REASON_ERROR;
    if (json) continue;
    if (n > 1) {
      if (!c.reasoning.empty()) fprintf(stderr, "[%d] reasoning: %s\n", i, c.reasoning.c_str());
      Emit(absl::StrCat("--- completion ", i, " ---\n", c.text,
                        !c.text.empty() && c.text.back() != '\n' ? "\n" : ""));
    }
    Emit(FormatToolCalls(*c.finished));
    fputs(FormatPromptLogprobs(c.prompt_logprobs).c_str(), stderr);
    fputs(FormatLogprobs(c.logprobs).c_str(), stderr);
    fprintf(stderr, "%s%s\n", n > 1 ? absl::StrCat("[", i, "] ").c_str() : "",
            FormatSummary(*c.finished).c_str());
  }
  return failed ? kExitFailure : kExitOk;
}

// One unary call of the service: its response as a JSON line with --json, else what `text`
// makes of it; RPC errors reported as every command reports them.
template <typename Request, typename Response>
int UnaryCommand(grpc::Status (v1::Kvrm::Stub::*rpc)(grpc::ClientContext*, const Request&,
                                                    Response*),
                 const Request& request,
                 const std::function<std::string(const Response&)>& text) {
  auto stub = v1::Kvrm::NewStub(MakeChannel());
  grpc::ClientContext context;
  SetDeadline(&context);
  CancelOnInterrupt cancel(&context);
  Response response;
  const grpc::Status status = ((*stub).*rpc)(&context, request, &response);
  if (!status.ok()) return ReportRpcError(status, context, cancel);
  if (absl::GetFlag(FLAGS_json)) {
    absl::StatusOr<std::string> line = ToJsonLine(response);
    if (!line.ok()) {
      fprintf(stderr, "error: %s\n", line.status().ToString().c_str());
      return kExitFailure;
    }
    Emit(absl::StrCat(*line, "\n"));
  } else {
    Emit(text(response));
  }
  return kExitOk;
}

int RunTokenize(const ParsedFlags& flags) {
  const bool chat = flags.given.contains("message") || flags.given.contains("system");
  if (flags.given.contains("text") == chat) {
    return UsageError("tokenize needs --text, or --message (with --system) for a chat prompt");
  }
  v1::TokenizeRequest request;
  if (chat) {
    std::vector<std::string> messages;
    if (auto it = flags.given.find("message"); it != flags.given.end()) messages = it->second;
    absl::StatusOr<v1::ChatPrompt> prompt = BuildChatPrompt(
        absl::GetFlag(FLAGS_system), messages, absl::GetFlag(FLAGS_continue_final_message));
    if (!prompt.ok()) return UsageError(std::string(prompt.status().message()));
    if (absl::Status st = AddToolOptions(absl::GetFlag(FLAGS_tools),
                                         absl::GetFlag(FLAGS_tool_choice),
                                         absl::GetFlag(FLAGS_template_kwargs), &*prompt);
        !st.ok()) {
      return UsageError(std::string(st.message()));
    }
    *request.mutable_chat() = *std::move(prompt);
  } else {
    request.set_text(absl::GetFlag(FLAGS_text));
  }
  request.set_add_bos(absl::GetFlag(FLAGS_add_bos));
  request.set_return_pieces(absl::GetFlag(FLAGS_pieces));

  return UnaryCommand<v1::TokenizeRequest, v1::TokenizeResponse>(
      &v1::Kvrm::Stub::Tokenize, request, [&](const v1::TokenizeResponse& response) {
        // A chat prompt: the text the template rendered, then its tokens.
        return absl::StrCat(chat ? absl::StrCat(response.prompt(), "\n") : "",
                            FormatTokens(response, request.return_pieces()));
      });
}

// classify and embed: --text (repeatable) and --tokens, each one input.
template <typename Request>
bool AddPoolingInputs(const ParsedFlags& flags, Request* request, std::string* error) {
  if (auto it = flags.given.find("text"); it != flags.given.end()) {
    for (const std::string& text : it->second) request->add_inputs()->set_text(text);
  }
  if (flags.given.contains("tokens")) {
    const std::string tokens = absl::GetFlag(FLAGS_tokens);  // (the pieces view it)
    const std::vector<absl::string_view> pieces =
        absl::StrSplit(tokens, absl::ByAnyChar(", \t\n"), absl::SkipEmpty());
    absl::StatusOr<std::vector<int32_t>> ids = ParseIdList(absl::StrJoin(pieces, ","), "tokens");
    if (!ids.ok()) {
      *error = std::string(ids.status().message());
      return false;
    }
    request->add_inputs()->mutable_token_ids()->mutable_ids()->Add(ids->begin(), ids->end());
  }
  return true;
}

int RunEmbed(const ParsedFlags& flags) {
  v1::EmbedRequest request;
  std::string error;
  if (!AddPoolingInputs(flags, &request, &error)) return UsageError(error);
  if (request.inputs().empty()) return UsageError("embed needs --text (repeatable) or --tokens");
  const std::string pooling = absl::GetFlag(FLAGS_pooling);
  if (pooling == "last") {
    request.set_pooling(v1::POOLING_LAST);
  } else if (pooling == "mean") {
    request.set_pooling(v1::POOLING_MEAN);
  } else if (pooling == "cls") {
    request.set_pooling(v1::POOLING_CLS);
  } else if (!pooling.empty()) {
    return UsageError(absl::StrCat("--pooling=", pooling, ": use last, mean or cls"));
  }
  const std::string normalize = absl::GetFlag(FLAGS_normalize);
  if (normalize == "true" || normalize == "false") {
    request.set_normalize(normalize == "true");
  } else if (!normalize.empty()) {
    return UsageError(absl::StrCat("--normalize=", normalize, ": use true or false"));
  }
  request.set_dimensions(absl::GetFlag(FLAGS_dimensions));
  request.set_truncate_prompt_tokens(absl::GetFlag(FLAGS_truncate_prompt_tokens));
  return UnaryCommand<v1::EmbedRequest, v1::EmbedResponse>(
      &v1::Kvrm::Stub::Embed, request, [](const v1::EmbedResponse& response) {
        // One line per input: its token count, then its components.
        std::string out;
        for (const v1::Embedding& e : response.embeddings()) {
          absl::StrAppend(&out, e.prompt_tokens(), " tokens:");
          for (float v : e.values()) absl::StrAppend(&out, " ", absl::StrFormat("%.6g", v));
          absl::StrAppend(&out, "\n");
        }
        return out;
      });
}

int RunClassify(const ParsedFlags& flags) {
  v1::ClassifyRequest request;
  std::string error;
  if (!AddPoolingInputs(flags, &request, &error)) return UsageError(error);
  if (request.inputs().empty()) return UsageError("classify needs --text (repeatable) or --tokens");
  request.set_truncate_prompt_tokens(absl::GetFlag(FLAGS_truncate_prompt_tokens));
  return UnaryCommand<v1::ClassifyRequest, v1::ClassifyResponse>(
      &v1::Kvrm::Stub::Classify, request, [](const v1::ClassifyResponse& response) {
        // One line per input: the label, then every label's probability.
        std::string out;
        for (const v1::Classification& c : response.classifications()) {
          absl::StrAppend(&out, c.label_name(), "\t");
          for (int i = 0; i < c.probs_size(); ++i) {
            absl::StrAppend(&out, i > 0 ? " " : "", absl::StrFormat("%.6g", c.probs(i)));
          }
          absl::StrAppend(&out, "\n");
        }
        return out;
      });
}

int RunScore(const ParsedFlags& flags) {
  v1::ScoreRequest request;
  if (!flags.given.contains("query")) return UsageError("score needs --query");
  request.add_queries(absl::GetFlag(FLAGS_query));
  if (auto it = flags.given.find("document"); it != flags.given.end()) {
    for (const std::string& d : it->second) request.add_documents(d);
  }
  if (request.documents().empty()) return UsageError("score needs --document (repeatable)");
  request.set_truncate_prompt_tokens(absl::GetFlag(FLAGS_truncate_prompt_tokens));
  return UnaryCommand<v1::ScoreRequest, v1::ScoreResponse>(
      &v1::Kvrm::Stub::Score, request, [request](const v1::ScoreResponse& response) {
        // Most relevant first: score, the document's index, the document.
        std::vector<int> order(response.scores_size());
        for (int i = 0; i < response.scores_size(); ++i) order[i] = i;
        std::stable_sort(order.begin(), order.end(),
                         [&](int a, int b) { return response.scores(a) > response.scores(b); });
        std::string out;
        for (int i : order) {
          absl::StrAppend(&out, absl::StrFormat("%.6f", response.scores(i)), "\t", i, "\t",
                          request.documents(i), "\n");
        }
        return out;
      });
}

int RunDetokenize(const ParsedFlags& flags) {
  if (!flags.given.contains("tokens")) return UsageError("detokenize needs --tokens");
  // Commas or whitespace between ids, so that tokenize's output can be passed back as it is.
  const std::string tokens = absl::GetFlag(FLAGS_tokens);
  const std::vector<absl::string_view> pieces =
      absl::StrSplit(tokens, absl::ByAnyChar(", \t\n"), absl::SkipEmpty());
  absl::StatusOr<std::vector<int32_t>> ids = ParseIdList(absl::StrJoin(pieces, ","), "tokens");
  if (!ids.ok()) return UsageError(ids.status().message());
  v1::DetokenizeRequest request;
  request.mutable_token_ids()->Add(ids->begin(), ids->end());
  request.set_skip_special_tokens(absl::GetFlag(FLAGS_skip_special_tokens));

  return UnaryCommand<v1::DetokenizeRequest, v1::DetokenizeResponse>(
      &v1::Kvrm::Stub::Detokenize, request,
      [](const v1::DetokenizeResponse& response) { return absl::StrCat(response.text(), "\n"); });
}

int RunInfo(const ParsedFlags&) {
  auto stub = v1::Kvrm::NewStub(MakeChannel());
  v1::ModelInfo model;
  v1::ServerInfo server;
  {
    grpc::ClientContext context;
    SetDeadline(&context);
    CancelOnInterrupt cancel(&context);
    const grpc::Status status = stub->GetModelInfo(&context, v1::GetModelInfoRequest(), &model);
    if (!status.ok()) return ReportRpcError(status, context, cancel);
  }
  {
    grpc::ClientContext context;
    SetDeadline(&context);
    CancelOnInterrupt cancel(&context);
    const grpc::Status status = stub->GetServerInfo(&context, v1::GetServerInfoRequest(), &server);
    if (!status.ok()) return ReportRpcError(status, context, cancel);
  }
  if (!absl::GetFlag(FLAGS_json)) {
    Emit(FormatInfo(model, server));
    return kExitOk;
  }
  absl::StatusOr<std::string> model_json = ToJsonLine(model);
  absl::StatusOr<std::string> server_json = ToJsonLine(server);
  if (!model_json.ok() || !server_json.ok()) {
    fprintf(stderr, "error: JSON conversion failed\n");
    return kExitFailure;
  }
  Emit(absl::StrCat("{\"model\":", *model_json, ",\"server\":", *server_json, "}\n"));
  return kExitOk;
}

int RunLoadLora(const ParsedFlags& flags) {
  if (!flags.given.contains("lora_name") || !flags.given.contains("lora_path")) {
    return UsageError("load-lora needs --lora_name and --lora_path");
  }
  v1::LoadLoraAdapterRequest request;
  request.set_lora_name(absl::GetFlag(FLAGS_lora_name));
  request.set_lora_path(absl::GetFlag(FLAGS_lora_path));
  return UnaryCommand<v1::LoadLoraAdapterRequest, v1::LoraAdapterInfo>(
      &v1::Kvrm::Stub::LoadLoraAdapter, request, [](const v1::LoraAdapterInfo& a) {
        return absl::StrCat("loaded LoRA adapter ", a.name(), " (rank ", a.rank(), ", ",
                            absl::StrJoin(a.target_modules(), ","), ") from ", a.path(), "\n");
      });
}

int RunUnloadLora(const ParsedFlags& flags) {
  if (!flags.given.contains("lora_name")) return UsageError("unload-lora needs --lora_name");
  v1::UnloadLoraAdapterRequest request;
  request.set_lora_name(absl::GetFlag(FLAGS_lora_name));
  return UnaryCommand<v1::UnloadLoraAdapterRequest, v1::UnloadLoraAdapterResponse>(
      &v1::Kvrm::Stub::UnloadLoraAdapter, request, [&](const v1::UnloadLoraAdapterResponse& r) {
        return absl::StrCat("unloaded LoRA adapter ", request.lora_name(),
                            r.running_requests() > 0
                                ? absl::StrCat(" (", r.running_requests(),
                                               " requests still running finish with it)")
                                : std::string(),
                            "\n");
      });
}

int RunResetPrefixCache(const ParsedFlags&) {
  return UnaryCommand<v1::ResetPrefixCacheRequest, v1::ResetPrefixCacheResponse>(
      &v1::Kvrm::Stub::ResetPrefixCache, v1::ResetPrefixCacheRequest(),
      [](const v1::ResetPrefixCacheResponse& r) {
        return absl::StrCat("prefix cache reset: ", r.device_blocks_freed(), " device and ",
                            r.host_blocks_freed(), " host blocks freed\n");
      });
}

int RunHealth(const ParsedFlags&) {
  grpc::GenericStub stub(MakeChannel());
  grpc::ClientContext context;
  SetDeadline(&context);
  CancelOnInterrupt cancel(&context);
  grpc::Slice slice(EncodeHealthCheckRequest(absl::GetFlag(FLAGS_service)));
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::Status status;
  // Completed on this thread (a completion queue, not a callback on a gRPC thread), so
  // `status` and `response` are written and read here; ThreadSanitizer cannot see the
  // hand-over a callback would need (absl::Notification is not built with it).
  grpc::CompletionQueue cq;
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> call =
      stub.PrepareUnaryCall(&context, kHealthCheckMethod, request, &cq);
  call->StartCall();
  call->Finish(&response, &status, nullptr);
  void* tag = nullptr;
  bool ok = false;
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  if (!status.ok()) return ReportRpcError(status, context, cancel);

  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (response.Dump(&slices).ok()) {
    for (const grpc::Slice& s : slices) {
      bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
  }
  absl::StatusOr<int> serving = DecodeHealthCheckResponse(bytes);
  if (!serving.ok()) {
    fprintf(stderr, "error: %s\n", std::string(serving.status().message()).c_str());
    return kExitFailure;
  }
  Emit(absl::StrCat(ServingStatusName(*serving), "\n"));
  return *serving == static_cast<int>(ServingStatus::kServing) ? kExitOk : kExitFailure;
}

constexpr absl::string_view kGenerateFlags[] = {"prompt",
                                                "token_ids",
                                                "message",
                                                "system",
                                                "continue_final_message",
                                                "skip_bos",
                                                "max_new_tokens",
                                                "temperature",
                                                "top_k",
                                                "top_p",
                                                "min_p",
                                                "seed",
                                                "repetition_penalty",
                                                "presence_penalty",
                                                "frequency_penalty",
                                                "stop",
                                                "stop_token_ids",
                                                "ignore_eos",
                                                "min_tokens",
                                                "include_stop_str_in_output",
                                                "truncate_prompt_tokens",
                                                "logit_bias",
                                                "allowed_token_ids",
                                                "bad_word",
                                                "logprobs",
                                                "prompt_logprobs",
                                                "n",
                                                "priority",
                                                "cache_salt",
                                                "lora_adapter",
                                                "time_limit_ms",
                                                "request_id",
                                                "regex",
                                                "json_schema",
                                                "json_object",
                                                "grammar",
                                                "choice",
                                                "whitespace_pattern",
                                                "include_thinking",
                                                "tools",
                                                "tool_choice",
                                                "parallel_tool_calls",
                                                "template_kwargs",
                                                "thinking_budget",
                                                "json",
                                                "server",
                                                "timeout_s"};
constexpr absl::string_view kTokenizeFlags[] = {"text",   "message", "system",
                                                "continue_final_message", "tools",
                                                "tool_choice", "template_kwargs",
                                                "add_bos", "pieces", "json",
                                                "server", "timeout_s"};
constexpr absl::string_view kEmbedFlags[] = {"text",       "tokens",    "pooling",
                                             "dimensions", "normalize", "truncate_prompt_tokens",
                                             "json",       "server",    "timeout_s"};
constexpr absl::string_view kClassifyFlags[] = {"text", "tokens", "truncate_prompt_tokens",
                                                "json", "server", "timeout_s"};
constexpr absl::string_view kScoreFlags[] = {"query", "document", "truncate_prompt_tokens",
                                             "json",  "server",   "timeout_s"};
constexpr absl::string_view kDetokenizeFlags[] = {"tokens", "skip_special_tokens", "json",
                                                  "server", "timeout_s"};
constexpr absl::string_view kInfoFlags[] = {"json", "server", "timeout_s"};
constexpr absl::string_view kHealthFlags[] = {"service", "server", "timeout_s"};
constexpr absl::string_view kLoadLoraFlags[] = {"lora_name", "lora_path", "json", "server",
                                                "timeout_s"};
constexpr absl::string_view kUnloadLoraFlags[] = {"lora_name", "json", "server", "timeout_s"};
constexpr absl::string_view kResetPrefixCacheFlags[] = {"json", "server", "timeout_s"};

constexpr Command kCommands[] = {
    {"generate", "stream a completion: text to stdout, a summary line to stderr", kGenerateFlags,
     RunGenerate},
    {"tokenize",
     "encode text with the served model's tokenizer (or a chat prompt: --message, with the text "
     "its template renders)",
     kTokenizeFlags, RunTokenize},
    {"detokenize", "decode token ids to text with the served model's tokenizer", kDetokenizeFlags,
     RunDetokenize},
    {"embed",
     "embed texts (--text, repeatable) or token ids (--tokens): one line per input, its token "
     "count and vector",
     kEmbedFlags, RunEmbed},
    {"classify",
     "classify texts (--text, repeatable) or token ids (--tokens) with the model's "
     "classification head: one line per input, its label and every label's probability",
     kClassifyFlags, RunClassify},
    {"score",
     "score documents (--document, repeatable) against --query (a reranker's relevance, or "
     "embedding similarity): most relevant first, score, index, document",
     kScoreFlags, RunScore},
    {"info", "describe the served model and the server's live state", kInfoFlags, RunInfo},
    {"health", "grpc.health.v1 check: prints SERVING or NOT_SERVING, exit 0 only if SERVING",
     kHealthFlags, RunHealth},
    {"load-lora",
     "load a LoRA adapter into the server (kvrmd --allow_runtime_lora_updating, a free "
     "--max_loras slot)",
     kLoadLoraFlags, RunLoadLora},
    {"unload-lora",
     "stop serving a LoRA adapter (running requests finish with it, then its slot is free)",
     kUnloadLoraFlags, RunUnloadLora},
    {"reset-prefix-cache",
     "empty the server's prefix cache, so later prompts prefill cold (kvrmd "
     "--allow_prefix_cache_reset)",
     kResetPrefixCacheFlags, RunResetPrefixCache},
};

void PrintUsage(FILE* out) {
  fprintf(out, "usage: kvrm_cli <command> [flags]\n\ncommands:\n");
  for (const Command& command : kCommands) {
    fprintf(out, "  %-18s %s\n", std::string(command.name).c_str(),
            std::string(command.summary).c_str());
  }
  fprintf(out, "\nkvrm_cli <command> --help lists the command's flags.\n");
}

void PrintCommandHelp(const Command& command) {
  printf("usage: kvrm_cli %s [flags]\n%s\n\nflags:\n%s", std::string(command.name).c_str(),
         std::string(command.summary).c_str(), FlagsHelp(command.flags).c_str());
}

const Command* FindCommand(absl::string_view name) {
  for (const Command& command : kCommands) {
    if (command.name == name) return &command;
  }
  return nullptr;
}

int Main(const std::vector<std::string>& args) {
  if (args.empty()) {
    PrintUsage(stderr);
    return kExitUsage;
  }
  if (args[0] == "help" || args[0] == "--help" || args[0] == "-h") {
    const Command* command = args.size() > 1 ? FindCommand(args[1]) : nullptr;
    command != nullptr ? PrintCommandHelp(*command) : PrintUsage(stdout);
    return kExitOk;
  }
  const Command* command = FindCommand(args[0]);
  if (command == nullptr) {
    UsageError(absl::StrCat("unknown command '", args[0], "'"));
    PrintUsage(stderr);
    return kExitUsage;
  }
  absl::StatusOr<ParsedFlags> flags =
      ParseFlags(absl::MakeConstSpan(args).subspan(1), command->flags);
  if (!flags.ok()) {
    return UsageError(
        absl::StrCat(flags.status().message(), " (see kvrm_cli ", command->name, " --help)"));
  }
  if (flags->help) {
    PrintCommandHelp(*command);
    return kExitOk;
  }
  return command->run(*flags);
}

}  // namespace
}  // namespace kvrm::cli

int main(int argc, char** argv) {
  // Before any thread exists, so that gRPC's threads inherit the mask too.
  kvrm::cli::BlockInterruptSignals();
  return kvrm::cli::Main(std::vector<std::string>(argv + 1, argv + argc));
}
