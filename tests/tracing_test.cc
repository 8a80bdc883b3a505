// OpenTelemetry tracing (server/tracing.h): W3C traceparent parsing, the exporter against an
// OTLP/gRPC receiver run by the test (batches, the resource, a receiver that is down), and
// Generate calls, over gRPC and over the HTTP API, becoming spans of the caller's trace with
// the request's attributes and its queue / prefill / decode phases.
#include "server/tracing.h"

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/openai_http.h"
#include "tests/http_client.h"
#include "tests/test_server.h"

namespace kvrm {
namespace {

using ::testing::ElementsAre;

// An OTLP/gRPC receiver: keeps every span it is sent, with its resource's attributes.
class Collector final : public otlp::TraceService::Service {
 public:
  // On a free loopback port, or on `address` ("unix:/path").
  explicit Collector(const std::string& address = "") : address_(address) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort(address.empty() ? "127.0.0.1:0" : address,
                             grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
  }
  ~Collector() override { server_->Shutdown(); }

  grpc::Status Export(grpc::ServerContext*, const otlp::ExportTraceServiceRequest* request,
                      otlp::ExportTraceServiceResponse*) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++calls_;
    for (const otlp::ResourceSpans& rs : request->resource_spans()) {
      for (const otlp::KeyValue& kv : rs.resource().attributes()) {
        resource_[kv.key()] = kv.value().string_value();
      }
      for (const otlp::ScopeSpans& ss : rs.scope_spans()) {
        for (const otlp::Span& s : ss.spans()) spans_.push_back(s);
      }
    }
    cv_.notify_all();
    return grpc::Status::OK;
  }

  // Waits until at least `n` spans came (at most `timeout`); all of them.
  std::vector<otlp::Span> WaitForSpans(size_t n, absl::Duration timeout = absl::Seconds(20)) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), [&] { return spans_.size() >= n; });
    return spans_;
  }
  std::map<std::string, std::string> resource() {
    std::lock_guard<std::mutex> lock(mu_);
    return resource_;
  }
  int calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }
  void Clear() {
    std::lock_guard<std::mutex> lock(mu_);
    spans_.clear();
  }
  std::string endpoint() const {
    return address_.empty() ? absl::StrCat("127.0.0.1:", port_) : address_;
  }

 private:
  std::string address_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<otlp::Span> spans_;
  std::map<std::string, std::string> resource_;
  int calls_ = 0;
};

// A receiver's address known before it starts: the server under test is started first, so
// that gRPC's callback threads it runs calls on are created after it (ThreadSanitizer cannot
// see the hand-off inside Debian's uninstrumented libgrpc when they already exist).
std::string SocketAddress(const std::string& name) {
  // (A socket path is at most 107 bytes: TEST_TMPDIR is too long for one.) A directory of this
  // process's own, made once: sandboxed runs of the test at once may share /tmp and a pid.
  static const std::string dir = [] {
    char tmpl[] = "/tmp/kvrm-otlp-XXXXXX";
    CHECK(mkdtemp(tmpl) != nullptr);
    return std::string(tmpl);
  }();
  return absl::StrCat("unix:", dir, "/", name, ".sock");
}

std::string Bytes(absl::Span<const uint8_t> id) { return std::string(id.begin(), id.end()); }

TEST(TraceParentTest, ParsesW3cTraceContext) {
  const std::optional<TraceParent> p = ParseTraceParent(
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "vendor=a,other=b");
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(HexId(p->trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(HexId(p->span_id), "00f067aa0ba902b7");
  EXPECT_TRUE(p->sampled());
  EXPECT_EQ(p->trace_state, "vendor=a,other=b");
  const std::optional<TraceParent> unsampled =
      ParseTraceParent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00");
  ASSERT_TRUE(unsampled.has_value());
  EXPECT_FALSE(unsampled->sampled());
  // A later version: its first four fields, whatever follows a dash.
  EXPECT_TRUE(ParseTraceParent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra")
                  .has_value());
  for (const char* bad : {
           "",
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",       // no flags
           "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",    // upper case
           "00-00000000000000000000000000000000-00f067aa0ba902b7-01",    // zero trace id
           "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",    // zero span id
           "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",    // version ff
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",  // 00 with more
           "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",    // separator
           "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",    // not hex
           "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",   // later, no dash
       }) {
    EXPECT_FALSE(ParseTraceParent(bad).has_value()) << bad;
  }
  EXPECT_TRUE(ParseTraceParent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                               std::string(513, 'a'))
                  ->trace_state.empty())
      << "a tracestate past 512 bytes is dropped";
}

TEST(TraceParentTest, ResourceAttributesAreKeyValuePairs) {
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> a =
      ParseResourceAttributes("deployment.environment=prod, k8s.pod.name=kvrm-0,note=a%20b");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(*a, ElementsAre(std::pair<std::string, std::string>("deployment.environment", "prod"),
                              std::pair<std::string, std::string>("k8s.pod.name", "kvrm-0"),
                              std::pair<std::string, std::string>("note", "a b")));
  EXPECT_FALSE(ParseResourceAttributes("novalue").ok());
  EXPECT_FALSE(ParseResourceAttributes("=x").ok());
  EXPECT_TRUE(ParseResourceAttributes("")->empty());
}

TEST(TracerTest, BatchesGoToTheReceiverWithTheResource) {
  Collector collector;
  Counter exported, dropped, failures;
  TracerOptions o;
  o.endpoint = collector.endpoint();
  o.service_name = "kvrmd-test";
  o.service_version = "9.9";
  o.resource_attributes = {{"k8s.pod.name", "kvrm-0"}};
  o.max_batch_spans = 4;
  o.flush_interval = absl::Milliseconds(50);
  o.exported = &exported;
  o.dropped = &dropped;
  o.export_failures = &failures;
  absl::StatusOr<std::unique_ptr<Tracer>> tracer = Tracer::Start(o);
  ASSERT_TRUE(tracer.ok()) << tracer.status();
  std::vector<otlp::Span> spans(10);
  for (size_t i = 0; i < spans.size(); ++i) {
    spans[i].set_name(absl::StrCat("s", i));
    AddInt(&spans[i], "i", static_cast<int64_t>(i));
  }
  (*tracer)->Record(spans);
  ASSERT_TRUE((*tracer)->Flush(absl::Seconds(20)));
  const std::vector<otlp::Span> got = collector.WaitForSpans(10);
  ASSERT_EQ(got.size(), 10u);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].name(), absl::StrCat("s", i));
    ASSERT_NE(FindAttribute(got[i], "i"), nullptr);
    EXPECT_EQ(FindAttribute(got[i], "i")->int_value(), static_cast<int64_t>(i));
  }
  EXPECT_GE(collector.calls(), 3) << "batches of at most 4";
  EXPECT_EQ((*tracer)->exported(), 10);
  EXPECT_EQ(exported.Value(), 10);
  EXPECT_EQ(dropped.Value(), 0);
  EXPECT_EQ(failures.Value(), 0);
  const std::map<std::string, std::string> resource = collector.resource();
  EXPECT_EQ(resource.at("service.name"), "kvrmd-test");
  EXPECT_EQ(resource.at("service.version"), "9.9");
  EXPECT_EQ(resource.at("k8s.pod.name"), "kvrm-0");
}

TEST(TracerTest, AReceiverThatIsDownCostsTheCallerNothing) {
  Counter dropped, failures;
  TracerOptions o;
  o.endpoint = SocketAddress("nobody-listens-here");  // a socket that does not exist
  o.max_queue_spans = 8;
  o.max_batch_spans = 8;
  o.flush_interval = absl::Milliseconds(20);
  o.export_timeout = absl::Milliseconds(500);
  o.dropped = &dropped;
  o.export_failures = &failures;
  absl::StatusOr<std::unique_ptr<Tracer>> tracer = Tracer::Start(o);
  ASSERT_TRUE(tracer.ok());
  const absl::Time before = absl::Now();
  for (int i = 0; i < 100; ++i) (*tracer)->Record(std::vector<otlp::Span>(1));
  EXPECT_LT(absl::Now() - before, absl::Seconds(1)) << "Record never waits for the receiver";
  ASSERT_TRUE((*tracer)->Flush(absl::Seconds(30)));
  EXPECT_EQ((*tracer)->exported(), 0);
  EXPECT_EQ((*tracer)->dropped(), 100) << "past the queue, or not accepted";
  EXPECT_EQ(dropped.Value(), 100);
  EXPECT_GE(failures.Value(), 1);
}

// A receiver that hangs: what is queued at shutdown goes within one export_timeout in all (the
// rest dropped), not one per batch, so a stuck collector cannot hold kvrmd past its grace period.
class HangingCollector final : public otlp::TraceService::Service {
 public:
  explicit HangingCollector(const std::string& address) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort(address, grpc::InsecureServerCredentials());
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
  }
  ~HangingCollector() override { server_->Shutdown(absl::ToChronoTime(absl::Now())); }
  grpc::Status Export(grpc::ServerContext* context, const otlp::ExportTraceServiceRequest*,
                      otlp::ExportTraceServiceResponse*) override {
    while (!context->IsCancelled()) absl::SleepFor(absl::Milliseconds(10));
    return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
  }

 private:
  std::unique_ptr<grpc::Server> server_;
};

TEST(TracerTest, ShutdownWithAHangingReceiverTakesOneExportTimeout) {
  const std::string address = SocketAddress("hanging");
  HangingCollector collector(address);
  TracerOptions o;
  o.endpoint = address;
  o.max_batch_spans = 2;
  o.flush_interval = absl::Hours(1);  // nothing goes before the shutdown
  o.export_timeout = absl::Milliseconds(400);
  absl::StatusOr<std::unique_ptr<Tracer>> tracer = Tracer::Start(o);
  ASSERT_TRUE(tracer.ok());
  (*tracer)->Record(std::vector<otlp::Span>(1));  // one batch: no wake-up yet
  const absl::Time start = absl::Now();
  for (int i = 0; i < 19; ++i) (*tracer)->Record(std::vector<otlp::Span>(1));
  tracer->reset();  // 10 batches of 2 queued (some may be in flight)
  const absl::Duration took = absl::Now() - start;
  // 10 batches at 400 ms each would be 4 s (plus retries); one deadline in all is 400 ms, and
  // a batch in flight when the shutdown began may have its own (plus its retries' backoff).
  EXPECT_LT(took, absl::Milliseconds(2500)) << took;
}

TEST(TracerTest, OptionsAreChecked) {
  TracerOptions o;
  EXPECT_FALSE(Tracer::Start(o).ok());
  o.endpoint = "127.0.0.1:1";
  o.sample_ratio = 1.5;
  EXPECT_FALSE(Tracer::Start(o).ok());
  o.sample_ratio = 0;
  absl::StatusOr<std::unique_ptr<Tracer>> t = Tracer::Start(o);
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE((*t)->ShouldTrace(std::nullopt)) << "ratio 0: no root is traced";
  TraceParent sampled;
  sampled.flags = 1;
  EXPECT_TRUE((*t)->ShouldTrace(sampled)) << "a sampled caller's request is, whatever the ratio";
  EXPECT_FALSE((*t)->ShouldTrace(TraceParent{}));
}

EngineOptions Options() {
  EngineOptions o;
  o.slots = 2;
  o.max_new_tokens = 64;
  o.prefill_chunk = 32;
  o.threads = 2;
  o.kv_mode = KvMode::kKvrm;
  return o;
}

const otlp::Span* Named(const std::vector<otlp::Span>& spans, const std::string& name) {
  for (const otlp::Span& s : spans) {
    if (s.name() == name) return &s;
  }
  return nullptr;
}

// A Generate call with a caller's traceparent: a SERVER span of that trace under the caller's
// span, with the request's and the outcome's attributes, and its phases as children within it.
TEST(TracingE2eTest, AGenerateCallIsASpanOfTheCallersTrace) {
  const std::string address = SocketAddress("otlp-grpc");
  TracerOptions to;
  to.endpoint = address;
  to.flush_interval = absl::Milliseconds(20);
  absl::StatusOr<std::unique_ptr<Tracer>> tracer = Tracer::Start(to);
  ASSERT_TRUE(tracer.ok());
  ServerOptions so;
  so.tracer = tracer->get();
  so.info.served_model_name = "tiny";
  TestServer server(Options(), so);
  Collector collector(address);

  const std::string traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
  v1::GenerateRequest req;
  req.set_text("Once upon a time");
  req.set_request_id("traced-1");
  req.mutable_stopping()->set_max_new_tokens(6);
  req.mutable_stopping()->set_ignore_eos(true);
  req.mutable_sampling()->set_temperature(0.5f);
  req.mutable_sampling()->set_top_k(20);
  req.mutable_sampling()->set_seed(1);
  grpc::ClientContext ctx;
  ctx.AddMetadata("traceparent", traceparent);
  ctx.AddMetadata("tracestate", "vendor=x");
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
      server.stub().Generate(&ctx, req);
  v1::GenerateResponse msg;
  v1::Finished finished;
  while (reader->Read(&msg)) {
    if (msg.has_finished()) finished = msg.finished();
  }
  ASSERT_TRUE(reader->Finish().ok());

  const std::vector<otlp::Span> spans = collector.WaitForSpans(4);
  ASSERT_EQ(spans.size(), 4u);
  const otlp::Span* root = Named(spans, "text_completion tiny");
  ASSERT_NE(root, nullptr);
  std::optional<TraceParent> parent = ParseTraceParent(traceparent);
  EXPECT_EQ(root->trace_id(), Bytes(parent->trace_id));
  EXPECT_EQ(root->parent_span_id(), Bytes(parent->span_id));
  EXPECT_EQ(root->span_id().size(), 8u);
  EXPECT_EQ(root->trace_state(), "vendor=x");
  EXPECT_EQ(root->kind(), otlp::Span::SPAN_KIND_SERVER);
  EXPECT_EQ(root->flags(), 0x301u) << "sampled, and OTLP's bits for a remote parent";
  EXPECT_EQ(root->status().code(), otlp::Status::STATUS_CODE_UNSET);
  auto attr = [&](const char* key) {
    const otlp::AnyValue* v = FindAttribute(*root, key);
    EXPECT_NE(v, nullptr) << key;
    return v != nullptr ? *v : otlp::AnyValue();
  };
  EXPECT_EQ(attr("gen_ai.operation.name").string_value(), "text_completion");
  EXPECT_EQ(attr("gen_ai.request.model").string_value(), "tiny");
  EXPECT_EQ(attr("gen_ai.response.id").string_value(), "traced-1");
  EXPECT_EQ(attr("gen_ai.request.max_tokens").int_value(), 6);
  EXPECT_DOUBLE_EQ(attr("gen_ai.request.temperature").double_value(), 0.5);
  EXPECT_EQ(attr("gen_ai.request.top_k").int_value(), 20);
  EXPECT_EQ(attr("gen_ai.usage.input_tokens").int_value(), finished.usage().prompt_tokens());
  EXPECT_EQ(attr("gen_ai.usage.output_tokens").int_value(), 6);
  ASSERT_EQ(attr("gen_ai.response.finish_reasons").array_value().values_size(), 1);
  EXPECT_EQ(attr("gen_ai.response.finish_reasons").array_value().values(0).string_value(),
            "length");
  EXPECT_NEAR(attr("gen_ai.latency.e2e").double_value(), finished.total_time_ms() / 1e3, 1e-9);
  EXPECT_EQ(attr("rpc.grpc.status_code").int_value(), 0);
  // The phases: children of the request's span, one after another, within it.
  const otlp::Span* queue = Named(spans, "kvrm.queue");
  const otlp::Span* prefill = Named(spans, "kvrm.prefill");
  const otlp::Span* decode = Named(spans, "kvrm.decode");
  ASSERT_TRUE(queue != nullptr && prefill != nullptr && decode != nullptr);
  for (const otlp::Span* child : {queue, prefill, decode}) {
    EXPECT_EQ(child->trace_id(), root->trace_id());
    EXPECT_EQ(child->parent_span_id(), root->span_id());
    EXPECT_NE(child->span_id(), root->span_id());
    EXPECT_EQ(child->kind(), otlp::Span::SPAN_KIND_INTERNAL);
    EXPECT_EQ(child->flags(), 0x101u) << "sampled; its parent is local";
    EXPECT_GE(child->start_time_unix_nano(), root->start_time_unix_nano());
    EXPECT_LE(child->end_time_unix_nano(), root->end_time_unix_nano());
  }
  EXPECT_EQ(queue->start_time_unix_nano(), root->start_time_unix_nano());
  EXPECT_EQ(queue->end_time_unix_nano(), prefill->start_time_unix_nano());
  EXPECT_EQ(prefill->end_time_unix_nano(), decode->start_time_unix_nano());
  EXPECT_GT(decode->end_time_unix_nano(), decode->start_time_unix_nano()) << "6 tokens take time";
  EXPECT_NEAR(
      static_cast<double>(decode->end_time_unix_nano() - root->start_time_unix_nano()) / 1e6,
      finished.total_time_ms(), 1e-3);

  // No caller's trace: a trace of its own (a root span). A caller that did not sample: none.
  collector.Clear();
  req.set_request_id("traced-2");
  grpc::ClientContext ctx2;
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> r2 = server.stub().Generate(&ctx2, req);
  while (r2->Read(&msg)) {
  }
  ASSERT_TRUE(r2->Finish().ok());
  grpc::ClientContext ctx3;
  ctx3.AddMetadata("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00");
  req.set_request_id("not-sampled");
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> r3 = server.stub().Generate(&ctx3, req);
  while (r3->Read(&msg)) {
  }
  ASSERT_TRUE(r3->Finish().ok());
  ASSERT_TRUE(server.engine().WaitIdle(absl::Seconds(10)));
  ASSERT_TRUE((*tracer)->Flush(absl::Seconds(20)));
  ASSERT_EQ(collector.WaitForSpans(4).size(), 4u);
  // Spans are recorded as a call's reactor goes, which may be after its client saw the end:
  // given time to come, the unsampled call's still do not.
  absl::SleepFor(absl::Milliseconds(300));
  ASSERT_TRUE((*tracer)->Flush(absl::Seconds(20)));
  const std::vector<otlp::Span> own = collector.WaitForSpans(5, absl::Milliseconds(300));
  ASSERT_EQ(own.size(), 4u) << "the unsampled call made none";
  const otlp::Span* root2 = Named(own, "text_completion tiny");
  ASSERT_NE(root2, nullptr);
  EXPECT_EQ(FindAttribute(*root2, "gen_ai.response.id")->string_value(), "traced-2");
  EXPECT_TRUE(root2->parent_span_id().empty());
  EXPECT_EQ(root2->trace_id().size(), 16u);
  EXPECT_NE(root2->trace_id(), root->trace_id());

  // A refused call is a span too, with the error.
  collector.Clear();
  v1::GenerateRequest bad = req;
  bad.mutable_sampling()->set_top_p(1.5f);
  grpc::ClientContext ctx4;
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> r4 = server.stub().Generate(&ctx4, bad);
  while (r4->Read(&msg)) {
  }
  EXPECT_EQ(r4->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  const std::vector<otlp::Span> refused = collector.WaitForSpans(1);
  ASSERT_EQ(refused.size(), 1u) << "no phases: it never reached the engine";
  EXPECT_EQ(refused[0].status().code(), otlp::Status::STATUS_CODE_ERROR);
  EXPECT_THAT(refused[0].status().message(), ::testing::HasSubstr("top_p"));
  EXPECT_EQ(FindAttribute(refused[0], "rpc.grpc.status_code")->int_value(),
            static_cast<int64_t>(grpc::StatusCode::INVALID_ARGUMENT));

  // A pooling call is a span too: "embeddings {model}", its inputs' prompt tokens.
  collector.Clear();
  v1::EmbedRequest embed;
  embed.add_inputs()->set_text("The cat sat.");
  embed.add_inputs()->set_text("A dog ran far away.");
  grpc::ClientContext ctx5;
  ctx5.AddMetadata("traceparent", traceparent);
  v1::EmbedResponse embedded;
  ASSERT_TRUE(server.stub().Embed(&ctx5, embed, &embedded).ok());
  const std::vector<otlp::Span> pooled = collector.WaitForSpans(1);
  ASSERT_EQ(pooled.size(), 1u);
  EXPECT_EQ(pooled[0].name(), "embeddings tiny");
  EXPECT_EQ(pooled[0].trace_id(), root->trace_id());
  EXPECT_EQ(FindAttribute(pooled[0], "gen_ai.usage.input_tokens")->int_value(),
            embedded.prompt_tokens());
  EXPECT_EQ(FindAttribute(pooled[0], "kvrm.inputs")->int_value(), 2);
  EXPECT_EQ(pooled[0].status().code(), otlp::Status::STATUS_CODE_UNSET);

  // A pooling call refused before it reached the engine is a span of the caller's trace, with
  // the error, as a refused Generate is.
  collector.Clear();
  v1::ScoreRequest score;
  score.add_queries("q");  // and no documents
  grpc::ClientContext ctx6;
  ctx6.AddMetadata("traceparent", traceparent);
  v1::ScoreResponse scored;
  EXPECT_EQ(server.stub().Score(&ctx6, score, &scored).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  const std::vector<otlp::Span> refused_pooling = collector.WaitForSpans(1);
  ASSERT_EQ(refused_pooling.size(), 1u);
  EXPECT_EQ(refused_pooling[0].name(), "score tiny");
  EXPECT_EQ(refused_pooling[0].trace_id(), root->trace_id());
  EXPECT_EQ(refused_pooling[0].status().code(), otlp::Status::STATUS_CODE_ERROR);
  EXPECT_THAT(refused_pooling[0].status().message(), ::testing::HasSubstr("documents"));
  EXPECT_EQ(FindAttribute(refused_pooling[0], "rpc.grpc.status_code")->int_value(),
            static_cast<int64_t>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_GE(refused_pooling[0].end_time_unix_nano(), refused_pooling[0].start_time_unix_nano());
}

// The HTTP API passes its traceparent header on: a chat completion's span joins the caller's
// trace; n completions give each its phases.
TEST(TracingE2eTest, TheHttpApiPassesTheTraceContextOn) {
  const std::string address = SocketAddress("otlp-http");
  TracerOptions to;
  to.endpoint = address;
  to.flush_interval = absl::Milliseconds(20);
  absl::StatusOr<std::unique_ptr<Tracer>> tracer = Tracer::Start(to);
  ASSERT_TRUE(tracer.ok());
  ServerOptions so;
  so.tracer = tracer->get();
  so.info.served_model_name = "tiny";
  TestServer server(Options(), so);
  OpenAiHttpOptions ho;
  ho.host = "127.0.0.1";
  ho.port = 0;
  ho.served_model_name = "tiny";
  ho.tokenizer = server.model().tokenizer.get();
  absl::StatusOr<std::unique_ptr<OpenAiHttpServer>> http =
      OpenAiHttpServer::Start(server.server().InProcessChannel(), ho);
  ASSERT_TRUE(http.ok()) << http.status();
  Collector collector(address);
  const std::string traceparent = "00-1af7651916cd43dd8448eb211c80319d-c7ad6b7169203332-01";
  HttpReply r = HttpCall((*http)->port(), "POST", "/v1/chat/completions",
                         R"({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
                             "n": 2, "temperature": 1, "seed": 5, "ignore_eos": true})",
                         {{"traceparent", traceparent}, {"Content-Type", "application/json"}});
  ASSERT_EQ(r.status, 200) << r.body;
  const std::vector<otlp::Span> spans = collector.WaitForSpans(7);
  ASSERT_EQ(spans.size(), 7u) << "the request's span and 3 phases for each of 2 completions";
  const otlp::Span* root = Named(spans, "chat tiny");
  ASSERT_NE(root, nullptr);
  EXPECT_EQ(root->trace_id(), Bytes(ParseTraceParent(traceparent)->trace_id));
  EXPECT_EQ(FindAttribute(*root, "gen_ai.request.choice.count")->int_value(), 2);
  EXPECT_EQ(FindAttribute(*root, "gen_ai.usage.output_tokens")->int_value(), 6);
  std::vector<int64_t> indices;
  for (const otlp::Span& s : spans) {
    if (s.name() != "kvrm.decode") continue;
    EXPECT_EQ(s.parent_span_id(), root->span_id());
    indices.push_back(FindAttribute(s, "kvrm.completion.index")->int_value());
  }
  std::sort(indices.begin(), indices.end());
  EXPECT_THAT(indices, ElementsAre(0, 1));
}

}  // namespace
}  // namespace kvrm
