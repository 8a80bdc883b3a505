// kvrm's Prometheus metric set, fed by the engine's observer hooks.
//
// Names follow vLLM's (`vllm:` -> `kvrm:`) with vLLM's bucket bounds, extended below 300 ms, so
// dashboards written for vLLM work after a prefix change; the KV-RM figures (KV bytes per tier,
// transfer groups, descriptor commits, transport waits, slots by state) are kvrm's own. Every
// series carries `model_name` and `kv_mode`. docs/metrics.md lists them all.
//
// Threading: the hooks run on the engine's owner thread except OnRejected (any thread); every
// child is created in the constructor (a LoRA adapter's when it takes a slot, OnLoraAdapter,
// never on the step path) and recording only touches atomics, so no other hook locks or
// allocates. The owner-thread-only fields below are marked.
#ifndef KVRM_METRICS_KVRM_METRICS_H_
#define KVRM_METRICS_KVRM_METRICS_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "metrics/registry.h"
#include "runtime/engine.h"
#include "runtime/engine_observer.h"

namespace kvrm {

struct KvrmMetricsOptions {
  std::string model_name;
  std::string kv_mode = "static";
  bool far_history = false;  // --far_history: kvrm:far_history_enabled reads 1
  // LoRA adapter slots (the engine's max_loras): kvrm:lora_* series per adapter, made as
  // adapters take slots (OnLoraAdapter); 0: none.
  int32_t lora_slots = 0;
};

// Structured outputs, recorded by the server where requests are validated (any thread).
struct StructuredOutputMetrics {
  // kvrm:structured_output_requests_total{kind}: [regex, json_schema, json_object, choice,
  // grammar].
  std::array<Counter*, 5> requests{};
  Counter* compiles = nullptr;    // constraints compiled (cache misses), refusals included
  Counter* refusals = nullptr;    // of those, refused (INVALID_ARGUMENT)
  Counter* cache_hits = nullptr;  // constraints found compiled in the cache
  Histogram* compile_seconds = nullptr;
};

// Tool calling (chat.tools), recorded by the server (any thread).
struct ToolCallMetrics {
  // kvrm:tool_call_requests_total{choice}: [auto, none, required, function].
  std::array<Counter*, 4> requests{};
  Counter* calls = nullptr;           // kvrm:tool_calls_total: calls returned in replies
  Counter* parse_failures = nullptr;  // kvrm:tool_call_parse_failures_total: held call text that
                                      // did not parse, returned as text
};

// The OpenAI-compatible HTTP API (server/openai_http.h), recorded by its connection threads.
enum class HttpRoute {
  kChatCompletions,
  kCompletions,
  kModels,
  kTokenize,
  kDetokenize,
  kHealth,            // /health, /ping
  kMetrics,           // /metrics on the API port (when --http_metrics serves it)
  kVersion,           // /version
  kLoraAdapters,      // /v1/load_lora_adapter, /v1/unload_lora_adapter
  kResponses,         // /v1/responses
  kEmbeddings,        // /v1/embeddings
  kClassify,          // /classify, /v1/classify
  kScore,             // /score, /v1/score
  kRerank,            // /rerank, /v1/rerank, /v2/rerank
  kMessages,          // /v1/messages, /v1/messages/count_tokens (Anthropic's Messages API)
  kResetPrefixCache,  // /reset_prefix_cache (vLLM's)
  kOther,             // unknown paths
};
constexpr int kHttpRoutes = 17;
const char* HttpRouteName(HttpRoute route);  // "chat_completions", ... (the `handler` label)

class HttpApiMetrics {
 public:
  // The statuses the server sends, created up front; 499 is nginx's "client closed request": the
  // client hung up before the reply began.
  static constexpr std::array<int, 10> kCodes = {200, 400, 401, 404, 405, 413, 429, 499, 500, 503};

  // One finished request: kvrm:http_requests_total{handler, code} and
  // kvrm:http_request_duration_seconds{handler}. Thread-safe; a status outside kCodes creates
  // its series on first use (under the registry's lock).
  void Record(HttpRoute route, int code, double seconds) const;
  // kvrm:http_connections: open connections, against the server's connection limit.
  Gauge* connections() const { return connections_; }
  // kvrm:http_client_disconnects_total: calls cancelled because their client hung up.
  Counter* client_disconnects() const { return client_disconnects_; }

 private:
  friend class KvrmMetrics;
  Family<Counter>* requests_family_ = nullptr;
  std::vector<std::string> base_values_;  // model_name, kv_mode
  std::array<std::array<Counter*, kCodes.size()>, kHttpRoutes> requests_{};
  std::array<Histogram*, kHttpRoutes> duration_{};
  Gauge* connections_ = nullptr;
  Counter* client_disconnects_ = nullptr;
};

// Bucket bounds, exposed for tests and the documentation.
const std::vector<double>& TtftBuckets();
const std::vector<double>& InterTokenBuckets();
const std::vector<double>& RequestLatencyBuckets();
const std::vector<double>& StepDurationBuckets();
const std::vector<double>& CompileBuckets();

class KvrmMetrics : public EngineObserver {
 public:
  // Registers every family in `registry` (which must outlive this) and creates all children.
  KvrmMetrics(MetricRegistry* registry, const KvrmMetricsOptions& options);

  void OnAdmitted(const GenerationRequest& request, absl::Duration queue_time) override;
  void OnFirstToken(const GenerationRequest& request, absl::Duration ttft) override;
  void OnNextToken(const GenerationRequest& request, absl::Duration gap) override;
  void OnFinished(const GenerationRequest& request, const FinishInfo& info) override;
  void OnRejected(const absl::Status& status) override;
  void OnPrefillChunk(int32_t tokens, absl::Duration duration) override;
  void OnDecodeStep(int32_t active_slots, absl::Duration duration) override;
  void OnMixedStep(int32_t active_slots, int32_t chunk_tokens, absl::Duration duration) override;
  void OnStats(const EngineStats& stats) override;
  void OnLoraAdapter(int32_t slot, const LoraAdapter* adapter) override;

  // The server's: output chunks merged into a queued message because a client read slower than
  // its tokens came (server/response_queue.h). Thread-safe.
  Counter* stream_chunks_merged() const { return stream_chunks_merged_; }
  const StructuredOutputMetrics& structured_outputs() const { return structured_; }
  const ToolCallMetrics& tool_calls() const { return tool_calls_; }
  const HttpApiMetrics& http_api() const { return http_api_; }

 private:
  // vLLM-compatible request figures.
  Histogram* ttft_;
  Histogram* inter_token_;
  Histogram* time_per_output_token_;  // vLLM's former name for the inter-token latency
  Histogram* e2e_;
  Histogram* queue_time_;
  Histogram* prefill_time_;
  Histogram* decode_time_;
  Gauge* running_;
  Gauge* waiting_;
  Gauge* kv_usage_;
  Counter* prompt_tokens_;
  Counter* generation_tokens_;
  std::array<Counter*, 6> success_;  // [FinishReason]
  // By LoRA slot, the slot's adapter's kvrm:lora_requests_total and
  // kvrm:lora_generation_tokens_total (null: empty slot); owner thread.
  std::vector<Counter*> lora_requests_, lora_tokens_;
  Family<Counter>* lora_requests_family_ = nullptr;
  Family<Counter>* lora_tokens_family_ = nullptr;
  Gauge* lora_loaded_ = nullptr;            // kvrm:lora_adapters_loaded
  const std::string model_name_, kv_mode_;  // the labels every series carries
  Counter* lora_loads_ = nullptr;           // kvrm:lora_adapter_loads_total
  Counter* embeddings_ = nullptr;           // kvrm:embedding_requests_total
  Counter* embedding_tokens_ = nullptr;     // kvrm:embedding_prompt_tokens_total
  Counter* preemptions_;
  Counter* stream_chunks_merged_;
  StructuredOutputMetrics structured_;
  ToolCallMetrics tool_calls_;
  HttpApiMetrics http_api_;
  Counter* device_sampled_;
  std::array<Counter*, 3> rejected_;  // queue_full, draining, other

  // KV-RM figures.
  struct Tier {
    Gauge* reserved;
    Gauge* used;
    Gauge* free;
  };
  Tier device_;
  Tier host_;
  Counter* transfer_groups_;
  Counter* transfer_bytes_;
  Histogram* transfer_groups_per_step_;
  Histogram* transfer_bytes_per_step_;
  Counter* descriptor_commits_;
  Counter* transport_wait_;
  Counter* transport_drain_wait_;
  Histogram* transport_wait_per_step_;
  Histogram* prefill_step_;
  Histogram* decode_step_;
  Histogram* mixed_step_;
  Counter* steps_;
  Gauge* slots_free_;
  Gauge* slots_prefilling_;
  Gauge* slots_decoding_;
  Counter* far_summarized_;
  Counter* window_released_;
  Counter* prefix_queries_;
  Counter* prefix_hits_;
  Counter* prefix_evictions_;
  Gauge* prefix_cached_;
  Counter* prefix_host_hits_;
  Counter* prefix_copied_;
  Counter* spec_drafts_;
  Counter* spec_draft_tokens_;
  Counter* spec_accepted_;
  Counter* thinking_budget_ends_;
  Counter* prefill_chunks_;
  Counter* prefix_resets_;
  Counter* prefix_offloaded_;
  Gauge* prefix_host_cached_;

  // Owner thread only: the cumulative totals of the last OnStats (counters advance by the
  // difference) and of the last one in which steps ran (the per-step histograms' baseline);
  // requests past their first token and not yet finished.
  EngineStats last_;
  EngineStats step_base_;
  int32_t decoding_ = 0;
};

}  // namespace kvrm

#endif  // KVRM_METRICS_KVRM_METRICS_H_
