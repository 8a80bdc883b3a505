// OpenTelemetry tracing of requests (kvrmd --otlp_traces_endpoint, as vLLM's flag): each
// Generate call becomes a span of the caller's trace (W3C Trace Context: the `traceparent` /
// `tracestate` gRPC metadata, or the HTTP API's headers of those names, passed on), with the
// GenAI semantic conventions' attributes and one child span per phase (queue, prefill, decode);
// spans are batched and sent to an OTLP/gRPC receiver (the OpenTelemetry Collector, Jaeger,
// Tempo) by a thread of their own. Recording never blocks a request: a full queue drops spans
// (counted), and a receiver that is down costs the requests nothing.
#ifndef KVRM_SERVER_TRACING_H_
#define KVRM_SERVER_TRACING_H_

#include <array>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "grpcpp/support/status.h"
#include "metrics/registry.h"
#include "otlp/trace_export.grpc.pb.h"

namespace kvrm {

namespace otlp = ::opentelemetry::proto::collector::trace::v1;

using TraceId = std::array<uint8_t, 16>;
using SpanId = std::array<uint8_t, 8>;

// A caller's trace context (W3C Trace Context's traceparent and tracestate).
struct TraceParent {
  TraceId trace_id{};
  SpanId span_id{};   // the caller's span: the parent of the request's span
  uint8_t flags = 0;  // bit 0: sampled
  std::string trace_state;
  bool sampled() const { return (flags & 1) != 0; }
};

// A traceparent value: "00-<32 hex trace id>-<16 hex span id>-<2 hex flags>", lower-case hex, ids
// not all zero; a later version's value is read by those four fields (W3C's forward
// compatibility), version ff is invalid. nullopt for a malformed one: the request then starts a
// trace of its own, as W3C asks. `tracestate` is kept as it came (at most 512 bytes, else
// dropped).
std::optional<TraceParent> ParseTraceParent(absl::string_view traceparent,
                                            absl::string_view tracestate = "");
std::string HexId(absl::Span<const uint8_t> id);  // lower-case hex

struct TracerOptions {
  // An OTLP/gRPC receiver: host:port, or with a scheme: http:// (plaintext, the default) or
  // https:// (TLS with the system's roots).
  std::string endpoint;
  // The resource's service.name (OTEL_SERVICE_NAME), and more resource attributes
  // (OTEL_RESOURCE_ATTRIBUTES' key=value pairs).
  std::string service_name = "kvrmd";
  std::string service_version;
  std::vector<std::pair<std::string, std::string>> resource_attributes;
  // Requests with no sampled caller's trace: the fraction traced (a caller's sampled flag decides
  // for its requests, parent-based as OpenTelemetry's default sampler).
  double sample_ratio = 1.0;
  int32_t max_queue_spans = 8192;  // more recorded and not yet sent: dropped
  int32_t max_batch_spans = 512;
  absl::Duration flush_interval = absl::Seconds(1);  // a partial batch waits at most this long
  absl::Duration export_timeout = absl::Seconds(10);
  // kvrm:otlp_spans_exported_total, kvrm:otlp_spans_dropped_total (queue full, or the receiver
  // refused or unreachable after the retries), kvrm:otlp_export_failures_total; not owned, null:
  // not counted.
  Counter* exported = nullptr;
  Counter* dropped = nullptr;
  Counter* export_failures = nullptr;
};

// Parses OTEL_RESOURCE_ATTRIBUTES ("k1=v1,k2=v2", values percent-decoded); INVALID_ARGUMENT
// naming the pair for one without '='.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ParseResourceAttributes(
    absl::string_view text);

class Tracer {
 public:
  // Checks the options and starts the export thread (the channel connects lazily: a receiver
  // that is not up yet is not an error).
  static absl::StatusOr<std::unique_ptr<Tracer>> Start(TracerOptions options);
  // Sends what was recorded (within one export_timeout in all; the rest is dropped), then stops.
  ~Tracer();
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  // Whether a request whose caller's context is `parent` (nullopt: none) is traced.
  bool ShouldTrace(const std::optional<TraceParent>& parent);
  // Random ids, never all zero.
  static TraceId NewTraceId();
  static SpanId NewSpanId();

  // Queues finished spans for export. Thread-safe, never blocks on the receiver: past
  // max_queue_spans they are dropped and counted.
  void Record(std::vector<otlp::Span> spans);
  // Waits until every span recorded before the call was sent or dropped, at most `timeout`;
  // whether all were.
  bool Flush(absl::Duration timeout);

  int64_t exported() const;
  int64_t dropped() const;

 private:
  explicit Tracer(TracerOptions options);
  void Run();
  // One Export call of `batch`, retried (with backoff) while the receiver is unavailable;
  // whether it was accepted.
  bool Export(const std::vector<otlp::Span>& batch);

  const TracerOptions options_;
  otlp::Resource resource_;
  std::unique_ptr<otlp::TraceService::Stub> stub_;
  mutable std::mutex mu_;
  std::condition_variable wake_;      // the thread: spans, a flush, or stopping
  std::condition_variable progress_;  // Flush: a batch done
  std::deque<otlp::Span> queue_;      // guarded by mu_
  int64_t recorded_ = 0;              // guarded by mu_: spans ever queued
  int64_t done_ = 0;                  // guarded by mu_: of those, sent or dropped
  int64_t exported_ = 0;              // guarded by mu_
  int64_t dropped_ = 0;               // guarded by mu_
  bool flush_ = false;                // guarded by mu_: send a partial batch now
  bool stopping_ = false;             // guarded by mu_
  absl::Time stop_deadline_;          // guarded by mu_: once stopping, the last export's end
  bool give_up_ = false;              // guarded by mu_: an export failed while stopping
  absl::Time last_warning_ = absl::InfinitePast();  // the export thread's
  std::thread thread_;
};

// Span helpers: an attribute of each value type, and a span's times.
void AddString(otlp::Span* span, absl::string_view key, absl::string_view value);
void AddInt(otlp::Span* span, absl::string_view key, int64_t value);
void AddDouble(otlp::Span* span, absl::string_view key, double value);
void AddBool(otlp::Span* span, absl::string_view key, bool value);
void AddStrings(otlp::Span* span, absl::string_view key, const std::vector<std::string>& values);
void SetTimes(otlp::Span* span, absl::Time start, absl::Time end);
// A call's outcome on its span: rpc.grpc.status_code, and status ERROR with the message when the
// call failed, or else when `engine_error` (a completion's own failure) is not empty.
void SetCallOutcome(otlp::Span* span, const grpc::Status& status,
                    absl::string_view engine_error = "");
// The attribute `key`'s value, or null (tests, and whoever reads spans back).
const otlp::AnyValue* FindAttribute(const otlp::Span& span, absl::string_view key);

}  // namespace kvrm

#endif  // KVRM_SERVER_TRACING_H_
