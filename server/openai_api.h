// The OpenAI-compatible HTTP API's JSON, translated to and from kvrm.v1 (docs/api.md, "OpenAI-
// compatible HTTP API"). No I/O here: server/openai_http.h serves it.
//
// Requests: POST /v1/completions and /v1/chat/completions bodies become a GenerateRequest (one
// per prompt when a completions request sends a list of them), with
// OpenAI's parameters, vLLM's extra sampling parameters (top_k, min_p, repetition_penalty,
// min_tokens, ignore_eos, stop_token_ids, guided_json / guided_regex / guided_choice,
// chat_template_kwargs, ...) and kvrm's own (cache_salt, priority). A parameter of the wrong
// JSON type, or one kvrm cannot honour (suffix, images), is refused naming
// it; values are checked by the same validation as gRPC requests, whose messages are then
// written with the OpenAI name of the field (`top_p: 1.5 is outside (0, 1]`, param "top_p").
//
// Responses: OpenAiReply turns the stream of GenerateResponse messages into either one
// `text_completion` / `chat.completion` object, or server-sent events of `chat.completion.chunk`
// / `text_completion` chunks ending with `data: [DONE]`, as OpenAI's and vLLM's servers write
// them (choices by index, finish_reason, usage, logprobs in each endpoint's own shape, tool calls).
#ifndef KVRM_SERVER_OPENAI_API_H_
#define KVRM_SERVER_OPENAI_API_H_

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/json.h"
#include "kvrm/v1/kvrm.pb.h"
#include "model/tokenizer.h"

namespace kvrm {

enum class OpenAiEndpoint { kCompletions, kChatCompletions };

// What a request body leaves to the server.
struct OpenAiDefaults {
  // Completions default to OpenAI's 16 tokens; chat completions to as many as the server allows
  // (the context cuts them short with finish_reason "length").
  int32_t completion_max_tokens = 16;
  int32_t chat_max_tokens = 4096;
  // Completions: a list of prompts is one call per prompt, run at once; at most this many.
  int32_t max_prompts = 64;
  int32_t max_n = 16;         // n per prompt (the service's limit)
  int32_t max_choices = 256;  // prompts times n: the completions of one request
};

struct OpenAiRequest {
  OpenAiEndpoint endpoint = OpenAiEndpoint::kCompletions;
  v1::GenerateRequest generate;
  // Completions with a list of prompts: the second and later prompts (only text or token_ids
  // set), each one more call with `generate`'s parameters (OpenAiCalls).
  std::vector<v1::GenerateRequest> more_prompts;
  std::string model;  // as sent; empty when absent
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with usage
  // stream_options.continuous_usage_stats (vLLM; with include_usage): each chunk after the role
  // chunks carries its prompt's and its choice's usage so far.
  bool continuous_usage = false;
  bool echo = false;           // completions: the prompt's text before the completion
  // vLLM's return_token_ids: the prompt's token ids (chat: on the response, or streamed on each
  // choice's first chunk after they arrive; completions: on each choice) and each choice's
  // generated ids (streamed: each chunk's).
  bool return_token_ids = false;
  // vLLM's return_tokens_as_token_ids: logprobs spell each token "token_id:<id>".
  bool tokens_as_ids = false;
  // Completions: `logprobs` = n (0..20) gives per-token logprobs and the top n; -1 none.
  // Chat: `logprobs: true` gives them, `top_logprobs` the alternatives.
  int32_t logprobs = -1;
  // vLLM's `prompt_logprobs` = n (0..20): every prompt token's logprob and the top n, as
  // `prompt_logprobs` (completions: per choice; chat: on the response); -1 none. Completions'
  // `echo` with `logprobs` also scores the prompt (its tokens lead the logprobs object).
  int32_t prompt_logprobs = -1;
  // Which OpenAI parameter set each GenerateRequest field, for error messages: "sampling.top_p"
  // -> "top_p", "stopping.max_new_tokens" -> "max_completion_tokens" when that was the one sent.
  std::map<std::string, std::string> params;
};

// Parses a request body. INVALID_ARGUMENT naming the parameter (`messages[1].content: ...`)
// for malformed JSON, a wrong type, or a parameter that is not supported.
absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(OpenAiEndpoint endpoint, absl::string_view body,
                                                 const OpenAiDefaults& defaults);

// vLLM's POST /tokenize: {"prompt": "..."} (add_special_tokens, default true: BOS) or a chat
// {"messages": [...]} with the chat parameters (tools, add_generation_prompt,
// continue_final_message, chat_template_kwargs), and return_token_strs. `request` keeps the
// parameter names for errors (ToOpenAiError).
struct OpenAiTokenize {
  v1::TokenizeRequest tokenize;
  OpenAiRequest request;
};
absl::StatusOr<OpenAiTokenize> ParseTokenizeRequest(absl::string_view body);
// {"count", "max_model_len", "tokens", "token_strs" (null unless asked for)}.
std::string TokenizeReplyJson(const v1::TokenizeResponse& response, int32_t max_model_len,
                              bool token_strs);

// OpenAI's POST /v1/embeddings: `input` (a string, an array of strings, an array of token ids,
// or an array of those), `encoding_format` ("float" or "base64": each vector's float32 values,
// little-endian, base64-encoded, as OpenAI's SDKs ask for by default), `dimensions`, `user`
// (ignored); vLLM's `truncate_prompt_tokens`, `add_special_tokens` (default true) and
// `normalize`; kvrm's `priority`, `cache_salt`, `request_id`.
struct OpenAiEmbeddings {
  v1::EmbedRequest embed;
  bool base64 = false;
  OpenAiRequest request;  // model, and the parameter names for errors
};
absl::StatusOr<OpenAiEmbeddings> ParseEmbeddingsRequest(absl::string_view body);
// {"id", "object": "list", "created", "model", "data": [{"object": "embedding", "index",
// "embedding"}], "usage": {"prompt_tokens", "total_tokens"}}.
std::string EmbeddingsReplyJson(const v1::EmbedResponse& response, const std::string& model,
                                int64_t created, bool base64);

// vLLM's POST /classify: `input` as /v1/embeddings' and the same `truncate_prompt_tokens`,
// `add_special_tokens`, `priority`, `cache_salt`, `request_id`.
struct OpenAiClassify {
  v1::ClassifyRequest classify;
  OpenAiRequest request;  // model, and the parameter names for errors
};
absl::StatusOr<OpenAiClassify> ParseClassifyRequest(absl::string_view body);
// {"id", "object": "list", "created", "model", "data": [{"index", "label", "probs",
// "num_classes"}], "usage": {"prompt_tokens", "total_tokens"}}, as vLLM's.
std::string ClassifyReplyJson(const v1::ClassifyResponse& response, const std::string& model,
                              int64_t created);

// vLLM's POST /score: `text_1` (a string or an array: the queries) and `text_2` (the
// documents); or (`rerank`) vLLM's / Jina's / Cohere's POST /rerank: `query`, `documents`
// (strings, or Cohere's {"text": ...}), `top_n` (0 or absent: all), `return_documents` (default
// true). Both take the pooling endpoints' `truncate_prompt_tokens`, `add_special_tokens`,
// `priority`, `cache_salt`, `request_id`.
struct OpenAiScore {
  v1::ScoreRequest score;
  bool rerank = false;
  int32_t top_n = 0;
  bool return_documents = true;
  OpenAiRequest request;  // model, and the parameter names for errors
};
absl::StatusOr<OpenAiScore> ParseScoreRequest(absl::string_view body, bool rerank);
// /score: {"id", "object": "list", "created", "model", "data": [{"index", "object": "score",
// "score"}], "usage"}. /rerank: {"id", "model", "usage": {"total_tokens"}, "results": [{"index",
// "document": {"text"}, "relevance_score"}]}, most relevant first, the first top_n.
std::string ScoreReplyJson(const v1::ScoreResponse& response, const OpenAiScore& request,
                           const std::string& model, int64_t created);

// vLLM's POST /detokenize: {"tokens": [ids]} -> {"prompt": "text"}.
struct OpenAiDetokenize {
  v1::DetokenizeRequest detokenize;
  OpenAiRequest request;  // model, and the parameter names for errors
};
absl::StatusOr<OpenAiDetokenize> ParseDetokenizeRequest(absl::string_view body);
std::string DetokenizeReplyJson(const v1::DetokenizeResponse& response);

// The calls a request makes, one per prompt: `generate` itself, then for each of `more_prompts`
// a copy of it with that prompt and the request id "<id>-<p>" (the first keeps "<id>-0" too, so
// that a batch's calls are told apart in logs; a lone prompt keeps `generate`'s id unchanged).
std::vector<v1::GenerateRequest> OpenAiCalls(const OpenAiRequest& request);

// An error as OpenAI writes it: HTTP status and {"error": {message, type, param, code}}.
struct OpenAiError {
  int http_status = 500;
  std::string message;
  std::string type;   // invalid_request_error, authentication_error, not_found_error, ...
  std::string param;  // the OpenAI parameter at fault, when known
  int64_t retry_after_ms = 0;  // 429 / 503: when to try again (a Retry-After header)
  // The body's shape: OpenAI's {"error": {...}}, or Anthropic's {"type": "error", "error":
  // {"type", "message"}} (the Messages API, server/messages_api.h), its type from the status.
  enum class Shape { kOpenAi, kAnthropic };
  Shape shape = Shape::kOpenAi;

  std::string Json() const;  // the body
};

// Maps a status (from parsing, or the gRPC service) to the HTTP error. A message that starts with
// a kvrm.v1 field path ("sampling.top_p: ...") is rewritten with the OpenAI name the request used
// for it, and `param` set; `request` may be null (the body did not parse).
OpenAiError ToOpenAiError(const absl::Status& status, const OpenAiRequest* request,
                          int64_t retry_after_ms = 0);

// JSON helpers of the HTTP API's parsers (this file's and server/responses_api.h's).
namespace openai_json {
// INVALID_ARGUMENT "param: why".
absl::Status Bad(absl::string_view param, absl::string_view why);
// The member `key` of an object, or null where it is absent or null (OpenAI clients send null
// for what they leave unset).
const Json* Find(const Json& object, const char* key);
// Bad(param, "must be <want>, not <got's type>").
absl::Status WrongType(absl::string_view param, absl::string_view want, const Json& got);
// A message's content: a string, or a list of parts whose `type` is one of `types` ("text" for
// the chat API; the Responses API's "input_text", "output_text"), their text joined; another
// part type (an image) is refused naming it.
absl::StatusOr<std::string> TextParts(const Json& content, const std::string& param,
                                      std::initializer_list<const char*> types);
// A token as text (`bytes` false: partial UTF-8 repaired) or as its exact bytes, special tokens
// included; "" without a tokenizer.
std::string TokenText(const Tokenizer* tokenizer, int32_t id, bool bytes);
// Chat's (and the Responses API's) per-token logprobs: [{token, logprob, bytes, top_logprobs:
// [{token, logprob, bytes}]}]; `text(id, bytes)` spells a token as text (partial UTF-8
// repaired) or as its exact bytes.
OrderedJson LogprobEntries(absl::Span<const v1::TokenLogprob> entries,
                           const std::function<std::string(int32_t, bool)>& text);
// Compact JSON text; invalid UTF-8 (a model's bytes, a client's) is written as U+FFFD rather
// than thrown on.
std::string Dump(const OrderedJson& j);
// The string member `key` of an object: Bad("<at>.<key>", "is required") when absent (or null),
// WrongType when not a string.
absl::StatusOr<std::string> RequiredString(const Json& o, const char* key, const std::string& at);
// How the Responses and Messages APIs reuse the chat parser: the chat completions body `chat`
// they translated a request into, parsed, with every parameter name (in an error's message and
// in `params`) rewritten by `rename` into their own API's spelling.
absl::StatusOr<OpenAiRequest> ParseTranslatedChat(
    const OrderedJson& chat, const OpenAiDefaults& defaults,
    const std::function<std::string(const std::string&)>& rename);
}  // namespace openai_json

// What the HTTP server builds a generation endpoint's reply with, from the service's stream:
// OpenAiReply (completions, chat completions) or ResponsesReply (server/responses_api.h).
class GenerationReply {
 public:
  virtual ~GenerationReply() = default;
  // Streaming: the events that start the stream, those of one message of prompt `prompt`'s
  // call, those that end it, and one for an error after the stream started.
  virtual std::string StreamStart() = 0;
  virtual std::string StreamMessage(const v1::GenerateResponse& message, int prompt) = 0;
  virtual std::string StreamEnd() = 0;
  virtual std::string ErrorEvent(const OpenAiError& error) = 0;
  // What a stream with nothing to send for a while gets (OpenAiHttpOptions::sse_keepalive): an
  // SSE comment, which clients skip.
  virtual std::string KeepAliveEvent() { return ": keep-alive\n\n"; }
  // Non-streaming: every message, then the whole body.
  virtual void Add(const v1::GenerateResponse& message, int prompt) = 0;
  virtual std::string Body() const = 0;
  // A completion that ended with FINISH_REASON_ERROR (the engine's message), if any.
  virtual const std::string& engine_error() const = 0;
};

// Builds the response from the service's stream. Not thread-safe: one per request.
class OpenAiReply final : public GenerationReply {
 public:
  // `id` is the response's id ("cmpl-..." / "chatcmpl-..."), `created` Unix seconds, `model` the
  // served model's name; `tokenizer` spells the tokens of logprobs. `prompt_texts` are what echo
  // writes before each prompt's completions.
  //
  // A request of P prompts with n completions each has P*n choices: prompt p's completion j is
  // choice p*n+j, as OpenAI and vLLM number them; the messages of prompt p's call are passed
  // with `prompt` = p.
  OpenAiReply(const OpenAiRequest& request, const Tokenizer* tokenizer, std::string id,
              int64_t created, std::string model, std::vector<std::string> prompt_texts = {});

  // Streaming: the server-sent events for the start of the stream (chat: each choice's role),
  // for one message of the service's stream, and for its end (the usage chunk when asked for,
  // then `data: [DONE]`). An error after the stream started is one event {"error": ...}.
  std::string StreamStart() override;
  std::string StreamMessage(const v1::GenerateResponse& message, int prompt = 0) override;
  std::string StreamEnd() override;
  static std::string StreamError(const OpenAiError& error);
  std::string ErrorEvent(const OpenAiError& error) override { return StreamError(error); }

  // Non-streaming: every message, then the whole object.
  void Add(const v1::GenerateResponse& message, int prompt = 0) override;
  std::string Body() const override;

  // A completion that ended with FINISH_REASON_ERROR (the engine's message), if any.
  const std::string& engine_error() const override { return engine_error_; }

 private:
  struct Choice {
    std::string text;
    std::string reasoning;  // chat: the model's thinking (GenerateResponse.reasoning_text)
    std::vector<v1::TokenLogprob> logprobs;
    v1::Finished finished;
    bool done = false;
    bool echoed = false;  // streaming: the echo has been sent
    bool prompt_scored = false;  // streaming: the prompt's logprobs have been sent
    bool prompt_ids_sent = false;    // streaming: return_token_ids' prompt ids have been sent
    std::vector<int32_t> token_ids;  // return_token_ids, not streaming
    int64_t tokens = 0;              // generated so far (continuous_usage_stats)
    // Streaming: the calls whose deltas were sent, by id, and the indices they used.
    std::set<std::string> streamed_ids;
    std::set<int32_t> streamed_indices;
  };
  // Prompt `prompt`'s completion `index` (clamped to the request's shape).
  int ChoiceIndex(int prompt, int index) const;
  // id, object ("text_completion", "chat.completion" or, streamed, "chat.completion.chunk"),
  // created, model: the fields every reply and chunk starts with.
  OrderedJson Head(bool chunk) const;
  // Keeps a finishing message's Finished (and an engine error) for its choice.
  void NoteFinish(Choice& c, const v1::GenerateResponse& m);
  std::string Chunk(int prompt, int index, const v1::GenerateResponse& message);
  const std::string& PromptText(int prompt) const;
  OrderedJson Usage() const;
  // continuous_usage_stats: a chunk's usage, prompt `prompt`'s tokens and choice `index`'s so far.
  OrderedJson UsageSoFar(int prompt, int index) const;
  // The token as text (bytes = false: partial UTF-8 repaired) or as its exact bytes.
  std::string TokenText(int32_t id, bool bytes) const;
  // The scores of prompt `prompt` (empty until completion 0's first message brought them).
  const std::vector<v1::TokenLogprob>& ScoredPrompt(int prompt) const;
  // Keeps the prompt's scores and token ids when `m` carries them (a completion's first
  // message), and counts its tokens.
  void NotePrompt(int prompt, const v1::GenerateResponse& m);
  // return_token_ids: prompt `prompt`'s ids (empty until a first message brought them), and as
  // JSON (null until then).
  const std::vector<int32_t>& PromptIds(int prompt) const;
  OrderedJson PromptIdsJson(int prompt) const;
  // vLLM's prompt_logprobs list for prompt `prompt`: null, then per token a map of token id to
  // {logprob, rank, decoded_token} holding the prompt token and its top alternatives.
  OrderedJson PromptLogprobsJson(int prompt) const;
  // Completions with echo and logprobs: the logprobs object of the prompt's tokens (the first
  // with null logprob) followed by the completion's `entries`, text offsets from 0.
  OrderedJson EchoedLogprobs(int prompt, const std::vector<v1::TokenLogprob>& entries) const;
  bool echo_scores_prompt() const;

  const OpenAiRequest& request_;
  const Tokenizer* tokenizer_;
  std::string id_;
  int64_t created_;
  std::string model_;
  std::vector<std::string> prompt_texts_;
  int prompts_ = 1;  // P
  int n_ = 1;        // completions per prompt
  std::vector<Choice> choices_;  // P*n
  std::vector<std::vector<v1::TokenLogprob>> prompt_logprobs_;  // [P], as they arrive
  std::vector<std::vector<int32_t>> prompt_ids_;                // [P], as they arrive
  std::vector<int64_t> prompt_tokens_;                          // [P], as they arrive
  std::string engine_error_;
};

// "stop", "length", "tool_calls", "abort" (cancelled); "" while running.
std::string OpenAiFinishReason(v1::FinishReason reason);

}  // namespace kvrm

#endif  // KVRM_SERVER_OPENAI_API_H_
