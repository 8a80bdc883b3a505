// kvrmd's OpenAI-compatible HTTP API (kvrmd --http_port, default 8000): POST /v1/completions and
// /v1/chat/completions (JSON, or server-sent events with "stream": true), the Responses API
// (/v1/responses), Anthropic's Messages API (/v1/messages), GET /v1/models, vLLM's
// POST /tokenize and /detokenize, GET /health, /ping, /version and /metrics, on libmicrohttpd
// with a thread per connection (docs/api.md).
//
// Every request goes to the kvrm.v1 service through an in-process gRPC channel, so that it is
// admitted, validated, authenticated (the Authorization header is passed on as metadata), counted
// and drained exactly as a gRPC call is. The service's status becomes the HTTP status
// (INVALID_ARGUMENT 400, UNAUTHENTICATED 401, RESOURCE_EXHAUSTED 429 with Retry-After,
// UNAVAILABLE 503) before any byte of a reply is sent: the first message of the service's stream
// is awaited before the response starts. A client that goes away mid-stream cancels its call
// (its slot and KV blocks are freed at the next token); so does one that hangs up while waiting
// for a whole (non-streamed) reply, noticed by watching its socket (every 10 ms while tokens come,
// 50 ms while queued). A completions request with a list of prompts is one call per prompt, run at
// once, in one reply.
#ifndef KVRM_SERVER_OPENAI_HTTP_H_
#define KVRM_SERVER_OPENAI_HTTP_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "kvrm/v1/kvrm.grpc.pb.h"
#include "metrics/kvrm_metrics.h"
#include "metrics/registry.h"
#include "model/tokenizer.h"
#include "server/openai_api.h"
#include "server/responses_api.h"

struct MHD_Daemon;
struct MHD_Connection;

namespace kvrm {

class ActiveCalls;  // the calls in flight, cancelled when the server stops

struct OpenAiHttpOptions {
  std::string host = "0.0.0.0";  // numeric address or a resolvable name
  int port = 8000;               // 0 picks a free port (see OpenAiHttpServer::port)
  // Connections served at once (one thread each); beyond it new connections are refused.
  int connection_limit = 512;
  int idle_timeout_s = 120;  // a keep-alive connection with no request is closed after this
  // Larger bodies get 413 (announced ones before they are sent). kvrmd passes its
  // --max_message_bytes: a body within it makes calls within the service's message limit.
  size_t max_body_bytes = 8 << 20;
  // A list of prompts is one call per prompt, each repeating the request's parameters: their
  // bytes together, beyond which the request gets 413 rather than being fanned out.
  size_t max_fanout_bytes = 64 << 20;
  // A streamed reply with nothing to send for this long gets an SSE comment (": keep-alive"; the
  // Messages API's, once started, Anthropic's ping event: GenerationReply::KeepAliveEvent), so
  // that neither the idle timeout nor a proxy closes it while text is held back (tool calls) or
  // the request waits for a slot.
  absl::Duration sse_keepalive = absl::Seconds(15);
  // The model's id in requests and /v1/models; a request naming another model gets 404.
  std::string served_model_name;
  // More names the model answers to (kvrmd --served_model_name's after the first, as vLLM's
  // --served-model-name takes several): accepted in requests, listed by /v1/models.
  std::vector<std::string> served_model_aliases;
  // The names of the LoRA adapters served now (kvrmd --lora_modules, and those loaded since):
  // a request whose `model` names one runs with it (GenerateRequest.lora_adapter), as vLLM
  // serves LoRA modules; /v1/models lists them (from GetModelInfo). Any thread; null: none.
  std::function<std::vector<std::string>()> lora_adapters;
  // Whether a `model` that is none of those names an adapter the server loads on demand (kvrmd
  // --lora_dir): such a request goes through, as one naming a served adapter. Null: none.
  std::function<bool(const std::string&)> lora_adapter_loadable;
  int32_t max_context = 0;  // /v1/models' max_model_len
  OpenAiDefaults defaults;
  const Tokenizer* tokenizer = nullptr;  // spells logprob tokens; must outlive the server
  // kvrm:http_* series (requests by endpoint and status, durations, connections, hang-ups);
  // null records none. Must outlive the server.
  const HttpApiMetrics* metrics = nullptr;
  // GET /metrics on this port too (vLLM serves its metrics beside its API), when set.
  const MetricRegistry* registry = nullptr;
  std::string version;  // GET /version
  // The Responses API's store (kvrmd --responses_store): responses kept for
  // previous_response_id and GET / DELETE /v1/responses/{id}, at most this many and this many
  // bytes together (least recently used out); 0: none kept, the API is stateless.
  int32_t responses_store_entries = 0;
  int64_t responses_store_bytes = int64_t{256} << 20;
  // PEM texts: HTTPS when both are set (kvrmd passes its --tls_cert / --tls_key).
  std::string tls_cert_pem;
  std::string tls_key_pem;
};

class OpenAiHttpServer {
 public:
  // Binds and starts serving requests on `channel` (kvrmd's in-process channel).
  static absl::StatusOr<std::unique_ptr<OpenAiHttpServer>> Start(
      std::shared_ptr<grpc::Channel> channel, const OpenAiHttpOptions& options);
  // Closes the listening socket and every connection; waits for their threads (calls in flight
  // are cancelled first).
  ~OpenAiHttpServer();
  OpenAiHttpServer(const OpenAiHttpServer&) = delete;
  OpenAiHttpServer& operator=(const OpenAiHttpServer&) = delete;

  int port() const { return port_; }

  // SIGTERM: /health and /ping answer 503 from now on (the service refuses new calls itself).
  void BeginDrain();
  // Waits until no HTTP request is in flight (each reply sent whole, or its client gone), at most
  // `timeout`; whether none is. kvrmd calls it once the engine is idle, before the gRPC server
  // shuts down, so that streams end with their last events and [DONE].
  bool WaitIdle(absl::Duration timeout);

  // The libmicrohttpd access handler (public only for the C callback's trampoline).
  int Handle(MHD_Connection* connection, const char* url, const char* method,
             const char* upload_data, size_t* upload_data_size, void** state);

 private:
  OpenAiHttpServer(std::shared_ptr<grpc::Channel> channel, OpenAiHttpOptions options);

  int Models(MHD_Connection* connection, const std::string& path);
  // POST /v1/completions, /v1/chat/completions, /v1/responses and /v1/messages.
  int Generate(MHD_Connection* connection, HttpRoute route, const std::string& body);
  int Tokenize(MHD_Connection* connection, const std::string& body);
  // POST /v1/embeddings, /classify, /score and /rerank: the service's Embed, Classify and Score.
  int Embeddings(MHD_Connection* connection, const std::string& body);
  int Classify(MHD_Connection* connection, const std::string& body);
  int Score(MHD_Connection* connection, const std::string& body, bool rerank);
  // A pooling call (`start`: the stub's AsyncEmbed, AsyncClassify or AsyncScore) made
  // asynchronously, the client's socket watched meanwhile: a client that hangs up cancels the
  // call (and with it every input's prefill), as a completion's does. `request` gets the
  // adapter `names.model` names and the X-Request-Id header's id where it has none; the reply is
  // `json(response, model, created)`.
  template <typename Request, typename Response>
  int PoolingCall(
      MHD_Connection* connection, Request* request, const OpenAiRequest& names,
      std::unique_ptr<grpc::ClientAsyncResponseReader<Response>> (v1::Kvrm::Stub::*start)(
          grpc::ClientContext*, const Request&, grpc::CompletionQueue*),
      const std::function<std::string(const Response&, const std::string&, int64_t)>& json);
  // POST /reset_prefix_cache (vLLM's): the service's ResetPrefixCache; 200 with the blocks
  // freed in each tier.
  int ResetPrefixCache(MHD_Connection* connection);
  // POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's): the service's
  // LoadLoraAdapter / UnloadLoraAdapter; 200 with a line of text, as vLLM replies.
  int LoraAdapterUpdate(MHD_Connection* connection, bool load, const std::string& body);
  int Detokenize(MHD_Connection* connection, const std::string& body);
  // POST /v1/messages/count_tokens (Anthropic's): the conversation's prompt tokens, counted by
  // the service's Tokenize as a message's prompt is rendered.
  int CountTokens(MHD_Connection* connection, const std::string& body);
  // GET and DELETE /v1/responses/{id}: the stored response, or its removal.
  int StoredResponse(MHD_Connection* connection, const std::string& id, bool remove);
  // GetModelInfo with the request's Authorization header: the model, or the service's refusal
  // (a bad token), for routes answered without a call of their own.
  absl::StatusOr<v1::ModelInfo> ModelInfo(MHD_Connection* connection);
  // Whether `model` names the served model (empty, its name or an alias), not an adapter.
  bool ServedName(const std::string& model) const;
  // A request naming a model other than the served one: the 404 to send (else nullopt).
  std::optional<OpenAiError> WrongModel(const std::string& model) const;

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Kvrm::Stub> stub_;
  OpenAiHttpOptions options_;
  int64_t created_ = 0;  // /v1/models' "created": when the server started
  std::unique_ptr<ActiveCalls> calls_;
  std::unique_ptr<ResponseStore> store_;  // null: no --responses_store
  std::atomic<bool> draining_{false};
  MHD_Daemon* daemon_ = nullptr;
  int port_ = 0;
};

}  // namespace kvrm

#endif  // KVRM_SERVER_OPENAI_HTTP_H_
