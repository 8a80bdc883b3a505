// OpenAI's Responses API (POST /v1/responses), as vLLM serves it, translated to and from
// kvrm.v1: a request becomes the chat completion it means (ParseOpenAiRequest does the rest:
// validation, tools, structured outputs), and ResponsesReply writes the service's stream as a
// `response` object, or as the API's typed server-sent events (response.created, ...
// response.output_text.delta, ... response.completed). No I/O here: server/openai_http.h
// serves it.
//
// Stateless by default, as vLLM is without its store: `store` is answered false and
// `previous_response_id` is refused by name; a client sends the conversation as `input` items
// (messages, function_call, function_call_output; reasoning items are dropped, as the chat
// templates drop past turns' thinking). With a ResponseStore (kvrmd --responses_store), a
// response made with `store` (the default) keeps its conversation and object, so that a later
// request continues it by `previous_response_id` and GET /v1/responses/{id} returns it.
#ifndef KVRM_SERVER_RESPONSES_API_H_
#define KVRM_SERVER_RESPONSES_API_H_

#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/json.h"
#include "kvrm/v1/kvrm.pb.h"
#include "model/tokenizer.h"
#include "server/openai_api.h"

namespace kvrm {

// The responses kept for previous_response_id and GET /v1/responses/{id}: at most
// `max_entries` of them and `max_bytes` together, the least recently stored or read first out.
// In memory only (gone with the process), like vLLM's. Thread-safe.
class ResponseStore {
 public:
  ResponseStore(int32_t max_entries, int64_t max_bytes);
  struct Entry {
    // The chat messages so far (the input of every turn and the replies, instructions left out:
    // they are not carried over, as OpenAI's are not), and the response object's JSON.
    OrderedJson conversation;
    std::string response;
  };
  void Put(const std::string& id, Entry entry);
  std::optional<Entry> Get(const std::string& id);
  bool Erase(const std::string& id);
  int32_t size() const;

 private:
  struct Node {
    std::string id;
    Entry entry;
    int64_t bytes = 0;  // the entry's, as counted against max_bytes (measured once, at Put)
  };
  // Takes a node out of the list, the index and the byte count.
  void Remove(std::list<Node>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int32_t max_entries_;
  const int64_t max_bytes_;
  mutable std::mutex mu_;
  std::list<Node> lru_ ABSL_GUARDED_BY(mu_);  // most recent first
  absl::flat_hash_map<std::string, std::list<Node>::iterator> index_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

// A parsed /v1/responses body: the chat request it means, and what the reply echoes back.
struct ResponsesRequest {
  OpenAiRequest chat;
  // Whether the response is to be kept (`store`, default true, and a store to keep it in), and
  // the conversation it continues: the chat messages the store keeps with it.
  bool store = false;
  OrderedJson conversation;
  // Echoed in the response object as sent (null where absent): instructions,
  // max_output_tokens, metadata, temperature, top_p, tools, tool_choice, parallel_tool_calls,
  // text, reasoning, user, previous_response_id.
  OrderedJson echo;
};

// INVALID_ARGUMENT naming the Responses parameter (`input[2].content[0].type: ...`) for a
// malformed body, a wrong type, or what this server does not do (background, tools other than
// functions, images; previous_response_id without a store, or naming none it holds).
absl::StatusOr<ResponsesRequest> ParseResponsesRequest(absl::string_view body,
                                                       const OpenAiDefaults& defaults,
                                                       ResponseStore* store = nullptr);

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
  const std::string& id() const { return id_; }
  // What the store keeps of this response: the conversation it continued and the reply as one
  // assistant message (its text and calls; thinking left out), and `body` (its whole JSON).
  ResponseStore::Entry StoreEntry(std::string body) const;
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
  OrderedJson conversation_;  // ResponsesRequest::conversation
  const Tokenizer* tokenizer_;
  bool logprobs_;
  bool store_;
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
