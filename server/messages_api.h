// Anthropic's Messages API (POST /v1/messages and /v1/messages/count_tokens), as vLLM serves it,
// translated to and from kvrm.v1: a request becomes the chat completion it means
// (ParseOpenAiRequest does the rest: validation, tools, structured outputs), and MessagesReply
// writes the service's stream as a `message` object, or as the API's typed server-sent events
// (message_start, content_block_start / _delta / _stop, message_delta, message_stop). Errors are
// Anthropic's {"type": "error", "error": {"type", "message"}} (OpenAiError::Shape::kAnthropic).
// No I/O here: server/openai_http.h serves it.
//
// Content blocks: text, tool_use and tool_result (a user message's results become the chat's
// tool messages, in order), thinking (a past turn's, taken back as reasoning_content;
// redacted_thinking dropped); images and documents are refused by name. Consecutive messages of
// one role are one turn, as Anthropic combines them; a final assistant message is continued
// (prefill). Tools are custom tools (input_schema); tool_choice auto / any / tool / none and
// disable_parallel_tool_use; `thinking` enabled / disabled reaches the chat template as
// enable_thinking; `output_format` json_schema is a structured output.
#ifndef KVRM_SERVER_MESSAGES_API_H_
#define KVRM_SERVER_MESSAGES_API_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/json.h"
#include "kvrm/v1/kvrm.pb.h"
#include "server/openai_api.h"

namespace kvrm {

struct MessagesRequest {
  OpenAiRequest chat;
  // stop_sequences as sent: a stop that is one of them ends the message with stop_reason
  // "stop_sequence" (another stop, a stop_token_ids one, is "end_turn").
  std::vector<std::string> stop_sequences;
};

// INVALID_ARGUMENT naming the Messages parameter (`messages[2].content[0].type: ...`) for a
// malformed body, a wrong type, or what this server does not do (images, documents, server
// tools, MCP servers, containers). `count_tokens`: /v1/messages/count_tokens' body (no
// max_tokens needed; the chat request is built as for a message).
absl::StatusOr<MessagesRequest> ParseMessagesRequest(absl::string_view body,
                                                     const OpenAiDefaults& defaults,
                                                     bool count_tokens = false);

// /v1/messages/count_tokens: the Tokenize request of the same conversation (its template
// rendered as a message would be) and the names for errors.
absl::StatusOr<OpenAiTokenize> ParseCountTokensRequest(absl::string_view body);
// {"input_tokens": N}.
std::string CountTokensReplyJson(const v1::TokenizeResponse& response);

// "end_turn", "max_tokens", "stop_sequence", "tool_use" or "pause_turn" (the call was cut by
// the server's drain or its time_limit_ms: sent again as it stands, it continues).
std::string AnthropicStopReason(const v1::Finished& finished,
                                const std::vector<std::string>& stop_sequences);

class MessagesReply final : public GenerationReply {
 public:
  // `id` is the message's id ("msg_..."), `model` the name served.
  MessagesReply(const MessagesRequest& request, std::string id, std::string model);

  // Streaming: message_start (with the prompt's usage, from the first message) before the first
  // block; each block's content_block_start, its deltas (text_delta, thinking_delta,
  // input_json_delta) and content_block_stop; message_delta (stop_reason, usage) and
  // message_stop at the end. After an `error` event the stream ends with it.
  std::string StreamStart() override;
  std::string StreamMessage(const v1::GenerateResponse& message, int prompt) override;
  std::string StreamEnd() override;
  std::string ErrorEvent(const OpenAiError& error) override;
  // Anthropic's `ping` event once message_start is out (its streams carry pings); before it, the
  // SSE comment (a stream's first event is message_start).
  std::string KeepAliveEvent() override;

  void Add(const v1::GenerateResponse& message, int prompt) override;
  std::string Body() const override;
  const std::string& engine_error() const override { return engine_error_; }

 private:
  struct Block {
    enum class Kind { kThinking, kText, kToolUse };
    Kind kind = Kind::kText;
    std::string text;  // thinking or text
    std::string id, name;
    std::string input;        // tool_use: the arguments' JSON text as it came
    int32_t tool_index = -1;  // the ToolCallDelta index that opened it
  };
  // Applies one message; with `events`, appends the events it makes.
  void Process(const v1::GenerateResponse& message, std::string* events);
  // The open block of `kind` (a tool_use always opens one), closing another first.
  Block& Open(Block::Kind kind, std::string* events);
  void Close(std::string* events);
  void Event(const char* type, OrderedJson data, std::string* events) const;
  void MessageStart(std::string* events);
  OrderedJson BlockJson(const Block& block, bool whole) const;
  OrderedJson Usage() const;
  // {"stop_reason", "stop_sequence"} of the end (pause_turn when the calls ended without one).
  OrderedJson StopFields() const;
  OrderedJson MessageJson() const;

  std::vector<std::string> stop_sequences_;
  std::string id_;
  std::string model_;
  std::vector<Block> blocks_;
  int open_ = -1;  // the block deltas go to
  bool started_ = false;
  bool finished_ = false;
  bool failed_ = false;
  v1::Usage usage_;  // the prompt's (from prompt_usage), then the whole (Finished.usage)
  v1::Finished finish_;
  std::string engine_error_;
};

}  // namespace kvrm

#endif  // KVRM_SERVER_MESSAGES_API_H_
