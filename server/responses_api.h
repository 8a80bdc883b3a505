// OpenAI's Responses API (POST /v1/responses), as vLLM serves it, translated to and from
// kvrm.v1: a request becomes the chat completion it means (ParseOpenAiRequest does the rest:
// validation, tools, structured outputs), and ResponsesReply writes the service's stream as a
// `response` object, or as the API's typed server-sent events (response.created, ...
// response.output_text.delta, ... response.completed). No I/O here: server/openai_http.h
// serves it.
//
// Stateless, as vLLM is without its store: `store` is accepted and answered false, and
// `previous_response_id` (a stored conversation) is refused by name; a client sends the
// conversation as `input` items (messages, function_call, function_call_output; reasoning items
// are dropped, as the chat templates drop past turns' thinking).
#ifndef KVRM_SERVER_RESPONSES_API_H_
#define KVRM_SERVER_RESPONSES_API_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/json.h"
#include "kvrm/v1/kvrm.pb.h"
#include "model/tokenizer.h"
#include "server/openai_api.h"

namespace kvrm {

// A parsed /v1/responses body: the chat request it means, and what the reply echoes back.
struct ResponsesRequest {
  OpenAiRequest chat;
  // Echoed in the response object as sent (null where absent): instructions,
  // max_output_tokens, metadata, temperature, top_p, tools, tool_choice, parallel_tool_calls,
  // text, reasoning, user.
  OrderedJson echo;
};

// INVALID_ARGUMENT naming the Responses parameter (`input[2].content[0].type: ...`) for a
// malformed body, a wrong type, or what this server does not do (previous_response_id,
// background, tools other than functions, images).
absl::StatusOr<ResponsesRequest> ParseResponsesRequest(absl::string_view body,
                                                       const OpenAiDefaults& defaults);

class ResponsesReply final : public GenerationReply {
 public:
  // `id` is the response's id ("resp_..."), `created` Unix seconds, `model` the name served;
  // `tokenizer` spells the tokens of logprobs (top_logprobs; null: empty strings).
  ResponsesReply(const ResponsesRequest& request, std::string id, int64_t created,
                 std::string model, const Tokenizer* tokenizer = nullptr);

  // Streaming: response.created and response.in_progress; then each message's events
  // (output_item.added, content_part.added, output_text.delta, reasoning_text.delta,
  // function_call_arguments.delta, and the matching .done events as items close); at the end
  // response.completed (response.incomplete when cut by max_output_tokens, response.failed
  // after an error event). No [DONE]: the Responses API ends with its last event.
  std::string StreamStart() override;
  std::string StreamMessage(const v1::GenerateResponse& message, int prompt) override;
  std::string StreamEnd() override;
  std::string ErrorEvent(const OpenAiError& error) override;

  void Add(const v1::GenerateResponse& message, int prompt) override;
  std::string Body() const override;
  const std::string& engine_error() const override { return engine_error_; }

 private:
  struct Item {
    enum class Kind { kReasoning, kMessage, kFunctionCall };
    Kind kind = Kind::kMessage;
    std::string id;
    std::string text;  // reasoning or message text
    std::string call_id, name, arguments;
    int32_t tool_index = -1;  // the ToolCallDelta index that opened it
    bool done = false;
    // A message's tokens' logprobs (with top_logprobs): those of the service's messages that
    // carried its text.
    std::vector<v1::TokenLogprob> logprobs;
  };
  OrderedJson Logprobs(absl::Span<const v1::TokenLogprob> entries) const;
  // Applies one message; with `events`, appends the events it makes.
  void Process(const v1::GenerateResponse& message, std::string* events);
  // The open item of `kind` (a new function call always opens one), closing another first.
  Item& Open(Item::Kind kind, std::string* events);
  void Close(std::string* events);
  void Event(const char* type, OrderedJson data, std::string* events);
  OrderedJson ItemJson(const Item& item) const;
  // The response object: status "in_progress" until the last message came.
  OrderedJson ResponseJson() const;
  std::string Status() const;

  OrderedJson echo_;
  const Tokenizer* tokenizer_;
  bool logprobs_;
  std::string id_;
  int64_t created_;
  std::string model_;
  std::vector<Item> items_;
  int open_ = -1;  // the item deltas go to
  bool finished_ = false;
  v1::Finished finish_;
  int64_t sequence_ = 0;
  std::string engine_error_;
  bool failed_ = false;
  OpenAiError error_;
};

}  // namespace kvrm

#endif  // KVRM_SERVER_RESPONSES_API_H_
