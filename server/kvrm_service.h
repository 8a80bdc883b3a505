// The kvrm.v1.Kvrm gRPC service on the callback API.
//
// One reactor per call holds that call's state; reactors never block and only post into the
// engine (Submit / Cancel). Output comes back from the engine thread through the reactor's sink,
// which queues responses and keeps at most one write in flight (server/response_queue.h).
#ifndef KVRM_SERVER_KVRM_SERVICE_H_
#define KVRM_SERVER_KVRM_SERVICE_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "kvrm/v1/kvrm.grpc.pb.h"
#include "metrics/kvrm_metrics.h"
#include "metrics/registry.h"
#include "runtime/engine.h"
#include "server/auth.h"
#include "server/request_validation.h"
#include "server/tracing.h"
#include "server/work_queue.h"

namespace kvrm {

class GenerateReactor;

struct ServiceInfo {
  std::string version;
  std::string device = "cpu";
  std::string kv_mode = "static";
  int32_t tensor_parallel = 1;
  // The model's id in the HTTP API (kvrmd --served_model_name) and its other names there; a LoRA
  // adapter may take none of them.
  std::string served_model_name;
  std::vector<std::string> served_model_aliases;
  // Embed's defaults (kvrmd --pooling, --embedding_normalize; docs/api.md "Embeddings").
  Pooling pooling = Pooling::kLast;
  bool embedding_normalize = true;
  // Non-empty: why Embed is refused (FAILED_PRECONDITION): the model's sentence-transformers
  // files ask for what kvrm does not compute, and kvrmd was not told the pooling instead.
  std::string embed_refusal;
  // chat.thinking_budget of chat requests that set none (kvrmd --thinking_budget); -1: none.
  int32_t default_thinking_budget = -1;
};

class PoolingReactor;  // kvrm_service.cc: Embed's, Classify's and Score's calls

class KvrmService final : public v1::Kvrm::CallbackService {
 public:
  KvrmService(Engine* engine, ServiceInfo info);

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Embed(grpc::CallbackServerContext* context,
                                  const v1::EmbedRequest* request,
                                  v1::EmbedResponse* response) override;
  grpc::ServerUnaryReactor* Classify(grpc::CallbackServerContext* context,
                                     const v1::ClassifyRequest* request,
                                     v1::ClassifyResponse* response) override;
  grpc::ServerUnaryReactor* Score(grpc::CallbackServerContext* context,
                                  const v1::ScoreRequest* request,
                                  v1::ScoreResponse* response) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const v1::TokenizeRequest* request,
                                     v1::TokenizeResponse* response) override;
  grpc::ServerUnaryReactor* Detokenize(grpc::CallbackServerContext* context,
                                       const v1::DetokenizeRequest* request,
                                       v1::DetokenizeResponse* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const v1::GetModelInfoRequest* request,
                                         v1::ModelInfo* response) override;
  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* context,
                                          const v1::GetServerInfoRequest* request,
                                          v1::ServerInfo* response) override;
  // Loads run on the service's adapter thread (reading and copying an adapter takes a while),
  // one at a time, a few waiting at most (then RESOURCE_EXHAUSTED).
  grpc::ServerUnaryReactor* LoadLoraAdapter(grpc::CallbackServerContext* context,
                                            const v1::LoadLoraAdapterRequest* request,
                                            v1::LoraAdapterInfo* response) override;
  grpc::ServerUnaryReactor* UnloadLoraAdapter(grpc::CallbackServerContext* context,
                                              const v1::UnloadLoraAdapterRequest* request,
                                              v1::UnloadLoraAdapterResponse* response) override;
  grpc::ServerUnaryReactor* ResetPrefixCache(grpc::CallbackServerContext* context,
                                             const v1::ResetPrefixCacheRequest* request,
                                             v1::ResetPrefixCacheResponse* response) override;

  // Before the server starts: whether LoadLoraAdapter / UnloadLoraAdapter are allowed (kvrmd
  // --allow_runtime_lora_updating; off: FAILED_PRECONDITION naming the flag).
  void SetRuntimeLoraUpdating(bool allowed) { runtime_lora_updating_ = allowed; }
  // Before the server starts: whether ResetPrefixCache is allowed (kvrmd
  // --allow_prefix_cache_reset; off: FAILED_PRECONDITION naming the flag).
  void SetPrefixCacheReset(bool allowed) { prefix_cache_reset_ = allowed; }

  // Before the server starts: a request naming an adapter that is not served, whose name is a
  // directory of `dir` holding a PEFT adapter, has it loaded first (on the adapter thread) into
  // a free slot, or the least recently used on-demand adapter's slot (kvrmd --lora_dir).
  void SetLoraDirectory(std::string dir) { lora_dir_ = std::move(dir); }

  // Structured outputs' compiler and grammar cache for the served model (stats for metrics).
  const structured::ConstraintCompiler& structured_outputs() const { return *structured_; }

  // Marks the service as draining (GetServerInfo reports it).
  void SetDraining() { draining_.store(true); }

  // When set (before the server starts), every RPC of this service needs a valid bearer token.
  void SetAuthenticator(const TokenAuthenticator* auth) { auth_ = auth; }

  // When set (before the server starts), counts the chunks merged into a queued message because
  // a client read slower than its tokens came (server/response_queue.h).
  void SetMergedChunksCounter(Counter* counter) { merged_chunks_counter_ = counter; }

  // When set (before the server starts), records structured-output requests and compiles.
  void SetStructuredOutputMetrics(const StructuredOutputMetrics* metrics);

  // When set (before the server starts), records tool-calling requests, calls and parse failures.
  void SetToolCallMetrics(const ToolCallMetrics* metrics) { tool_metrics_ = metrics; }
  // OpenTelemetry spans of Generate calls (server/tracing.h); not owned, null: none.
  void SetTracer(Tracer* tracer) { tracer_ = tracer; }

  // Before the server starts: the most serialized bytes of output merged into one message
  // (kept under the server's send limit).
  void SetMaxMergedMessageBytes(size_t bytes) { max_merged_bytes_ = bytes; }

 private:
  // Constraints compile on these threads, this many calls waiting at most (then
  // RESOURCE_EXHAUSTED): a burst of new schemas cannot take the gRPC threads.
  static constexpr int32_t kCompileThreads = 2;
  static constexpr int32_t kCompileQueue = 64;

  // A validated beam-search request (GenerateRequest.beam_search): its search started, or the
  // call refused.
  void StartBeamSearch(grpc::CallbackServerContext* context, const v1::GenerateRequest& request,
                       std::unique_ptr<GenerationRequest> r, GenerateReactor* reactor);
  // A traced Generate call's span (when the tracer samples it): its ids from the caller's
  // traceparent metadata or new ones, and the request's attributes.
  void StartTrace(const grpc::CallbackServerContext& context, const v1::GenerateRequest& request,
                  const std::string& id, absl::Time arrival, GenerateReactor* reactor);
  // Generate's rest on `queue`'s thread: `first` (if set; its error rejects the call), then
  // ValidateAndSubmit. RESOURCE_EXHAUSTED `when_full` (with retry-after-ms) when the queue is.
  void SubmitOffThread(WorkQueue* queue, const char* when_full, std::function<absl::Status()> first,
                       grpc::CallbackServerContext* context, const v1::GenerateRequest* request,
                       GenerateReactor* reactor, std::string id, absl::Time arrival);

  // Validates `request` (compiling its constraint) and submits it to the engine, or rejects the
  // call. On the gRPC thread, or on a compile thread for a constraint not yet compiled.
  void ValidateAndSubmit(grpc::CallbackServerContext* context, const v1::GenerateRequest& request,
                         GenerateReactor* reactor, std::string id, absl::Time arrival);

  // OK, or UNAUTHENTICATED when an authenticator is set and the call's token is not valid.
  grpc::Status CheckAuth(const grpc::CallbackServerContext* context) const;

  // The pooling calls (Embed, Classify, Score): UNIMPLEMENTED where the device returns no hidden
  // states; whether `inputs` engine requests fit the queue bound (INVALID_ARGUMENT naming `field`
  // beyond it, RESOURCE_EXHAUSTED with retry-after-ms when they do not fit now).
  grpc::Status PoolingRefusal(const char* rpc) const;
  grpc::Status CheckQueueRoom(grpc::CallbackServerContext* context, int32_t inputs,
                              const char* field) const;
  // What Score computes for the served model (ModelInfo.score_method).
  v1::ScoreMethod score_method() const;
  // The span of a call the tracer samples (nullopt: not traced): ids from the caller's
  // traceparent metadata or new ones, named "{operation} {model}" with the common attributes.
  std::optional<otlp::Span> TraceRoot(const grpc::CallbackServerContext& context,
                                      const char* operation, const std::string& lora_adapter);
  // Ends a pooling call refused before its inputs were submitted (bad input, a full queue, a
  // model that cannot serve it) with `status`; traced as a call that failed so, as a refused
  // Generate is. `operation` names the call in its span (embeddings, classify, score).
  grpc::ServerUnaryReactor* RefusePooling(grpc::CallbackServerContext* context,
                                          const grpc::Status& status, const char* operation,
                                          const std::string& lora_adapter, absl::Time arrival);
  // Starts a pooling call's inputs, after loading `lora_adapter` from --lora_dir on the adapter
  // thread where it is not served yet (the call fails with the load's error otherwise).
  // `operation` names the call in its span.
  void StartPooling(grpc::CallbackServerContext* context, PoolingReactor* reactor,
                    std::vector<std::unique_ptr<GenerationRequest>> inputs, const std::string& id,
                    absl::Time arrival, const std::string& lora_adapter, const char* operation);

  Engine* engine_;
  const ServiceInfo info_;
  RequestLimits limits_;
  std::unique_ptr<structured::ConstraintCompiler> structured_;
  const absl::Time started_;
  std::atomic<bool> draining_{false};
  std::atomic<uint64_t> next_id_{1};
  const TokenAuthenticator* auth_ = nullptr;  // not owned; null: no authentication
  Counter* merged_chunks_counter_ = nullptr;  // not owned; null: not counted
  const StructuredOutputMetrics* structured_metrics_ = nullptr;  // not owned; null: not counted
  const ToolCallMetrics* tool_metrics_ = nullptr;                // not owned; null: not counted
  Tracer* tracer_ = nullptr;                                     // not owned; null: no spans
  ToolCallSyntax tool_syntax_;  // the served model's call format (tool_choice AUTO)
  // <think> and </think> where they are special tokens (kept in a thinking model's chat replies).
  std::vector<int32_t> reasoning_marker_tokens_;
  size_t max_merged_bytes_ = 64 << 10;
  // Loads `name` from lora_dir_ for a request (evictable); OK when it is served after.
  // INVALID_ARGUMENT naming lora_adapter when lora_dir_ has no adapter of that name.
  absl::Status LoadOnDemand(const std::string& name);

  bool runtime_lora_updating_ = false;
  bool prefix_cache_reset_ = false;
  std::string lora_dir_;  // on-demand adapters; "": none
  // LoadLoraAdapter's and on-demand loads' thread (one load at a time; kLoraLoadQueue calls
  // waiting at most).
  static constexpr int32_t kLoraLoadQueue = 64;
  std::unique_ptr<WorkQueue> lora_queue_;
  // Last: destroyed first, so that calls still waiting to compile finish while the rest exists.
  std::unique_ptr<WorkQueue> compile_queue_;
};

// Converts an absl::Status to a grpc::Status (same codes).
grpc::Status ToGrpcStatus(const absl::Status& status);

// `root`/`name` when `name` is 1-256 letters, digits, '-', '_' or '.' (not first) and that
// directory holds an adapter_config.json; "" otherwise (a name never leaves `root`).
std::string OnDemandLoraPath(const std::string& root, const std::string& name);

// GetModelInfo's description of an adapter the engine serves.
void LoraAdapterInfoOf(const ServedLoraAdapter& served, v1::LoraAdapterInfo* info);

}  // namespace kvrm

#endif  // KVRM_SERVER_KVRM_SERVICE_H_
