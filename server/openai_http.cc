#include "server/openai_http.h"

#include <microhttpd.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "grpc/support/time.h"
#include "grpcpp/client_context.h"
#include "grpcpp/completion_queue.h"
#include "metrics/http_server.h"
#include "server/messages_api.h"
#include "server/responses_api.h"

namespace kvrm {

// Whether the peer of `fd` closed or reset its end, or shut down its sending side (POLLRDHUP:
// HTTP/1.1 clients do not after a request, so it is taken as gone, as nginx takes it). Bytes it
// sent (a pipelined next request) are not a hang-up and are left to libmicrohttpd.
namespace {
bool ClientHungUp(int fd) {
  pollfd p{fd, POLLRDHUP, 0};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}
}  // namespace

class ActiveCalls {
 public:
  explicit ActiveCalls(const HttpApiMetrics* metrics) : metrics_(metrics) {}

  // False once the server is stopping: the call must not start.
  bool Add(grpc::ClientContext* context) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return false;
    calls_.insert(context);
    return true;
  }
  void Remove(grpc::ClientContext* context) {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.erase(context);
  }
  void CancelAll() {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    for (grpc::ClientContext* c : calls_) c->TryCancel();
  }

  // HTTP requests from their headers to RequestCompleted (their reply sent, or the client gone).
  void RequestStarted() {
    std::lock_guard<std::mutex> lock(mu_);
    ++requests_;
  }
  void RequestEnded() {
    std::lock_guard<std::mutex> lock(mu_);
    if (--requests_ == 0) idle_.notify_all();
  }
  bool WaitNoRequests(absl::Duration timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return idle_.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                          [this] { return requests_ == 0; });
  }

  const HttpApiMetrics* metrics() const { return metrics_; }

 private:
  const HttpApiMetrics* const metrics_;
  std::mutex mu_;  // a pthread mutex: ThreadSanitizer sees it (Debian's Abseil is not instrumented)
  std::condition_variable idle_;
  std::set<grpc::ClientContext*> calls_;
  int64_t requests_ = 0;
  bool stopping_ = false;
};

namespace {

constexpr char kJson[] = "application/json";

// One request: its body as it is uploaded, and what its metrics need. libmicrohttpd keeps it in
// the request's slot from the first call of the access handler to RequestCompleted.
struct Upload {
  std::string body;
  bool too_large = false;
  HttpRoute route = HttpRoute::kOther;
  absl::Time start;
};

// The one place a path is matched: Handle dispatches on the route found here, and the metrics
// label it. /metrics is a route only where this server serves it.
HttpRoute RouteOf(absl::string_view path, bool serves_metrics) {
  if (path == "/v1/chat/completions") return HttpRoute::kChatCompletions;
  if (path == "/v1/completions") return HttpRoute::kCompletions;
  if (path == "/v1/responses" || absl::StartsWith(path, "/v1/responses/")) {
    return HttpRoute::kResponses;
  }
  if (path == "/v1/models" || absl::StartsWith(path, "/v1/models/")) return HttpRoute::kModels;
  if (path == "/v1/embeddings") return HttpRoute::kEmbeddings;
  if (path == "/classify" || path == "/v1/classify") return HttpRoute::kClassify;
  if (path == "/score" || path == "/v1/score") return HttpRoute::kScore;
  if (path == "/rerank" || path == "/v1/rerank" || path == "/v2/rerank") return HttpRoute::kRerank;
  if (path == "/v1/messages" || path == "/v1/messages/count_tokens") return HttpRoute::kMessages;
  if (path == "/tokenize") return HttpRoute::kTokenize;
  if (path == "/detokenize") return HttpRoute::kDetokenize;
  if (path == "/health" || path == "/ping") return HttpRoute::kHealth;
  if (path == "/version") return HttpRoute::kVersion;
  if (path == "/v1/load_lora_adapter" || path == "/v1/unload_lora_adapter") {
    return HttpRoute::kLoraAdapters;
  }
  if (path == "/reset_prefix_cache") return HttpRoute::kResetPrefixCache;
  if (path == "/metrics" && serves_metrics) return HttpRoute::kMetrics;
  return HttpRoute::kOther;
}

MHD_Result Queue(MHD_Connection* connection, unsigned int code, MHD_Response* response) {
  if (response == nullptr) return MHD_NO;
  const MHD_Result r = MHD_queue_response(connection, code, response);
  MHD_destroy_response(response);
  return r;
}

MHD_Response* Buffer(const std::string& body, const char* content_type) {
  MHD_Response* response = MHD_create_response_from_buffer(
      body.size(), const_cast<char*>(body.data()), MHD_RESPMEM_MUST_COPY);
  if (response != nullptr) {
    MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
  }
  return response;
}

MHD_Result ReplyError(MHD_Connection* connection, const OpenAiError& error) {
  MHD_Response* response = Buffer(error.Json(), kJson);
  if (response != nullptr && error.retry_after_ms > 0) {
    // Retry-After is in whole seconds: round up, so that a client never comes back early.
    const std::string seconds = std::to_string((error.retry_after_ms + 999) / 1000);
    MHD_add_response_header(response, "Retry-After", seconds.c_str());
  }
  if (response != nullptr && error.http_status == 405) {
    MHD_add_response_header(response, MHD_HTTP_HEADER_ALLOW,
                            "GET, POST");  // /v1/models is GET, the generate endpoints POST
  }
  return Queue(connection, static_cast<unsigned int>(error.http_status), response);
}

MHD_Result ReplyError(MHD_Connection* connection, int http_status, const std::string& type,
                      const std::string& message,
                      OpenAiError::Shape shape = OpenAiError::Shape::kOpenAi) {
  OpenAiError e;
  e.http_status = http_status;
  e.type = type;
  e.message = message;
  e.shape = shape;
  return ReplyError(connection, e);
}

// The error shape of a route's replies: Anthropic's for the Messages API, else OpenAI's.
OpenAiError::Shape ShapeOf(HttpRoute route) {
  return route == HttpRoute::kMessages ? OpenAiError::Shape::kAnthropic
                                       : OpenAiError::Shape::kOpenAi;
}

absl::Status FromGrpc(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

int64_t RetryAfterMs(const grpc::ClientContext& context) {
  const auto& trailers = context.GetServerTrailingMetadata();
  auto it = trailers.find("retry-after-ms");
  int64_t ms = 0;
  if (it == trailers.end() ||
      !absl::SimpleAtoi(absl::string_view(it->second.data(), it->second.size()), &ms)) {
    return 0;
  }
  return ms;
}

const char* Header(MHD_Connection* connection, const char* name);

// The request's credentials as the service's authorization metadata: its Authorization
// header, or else its x-api-key header (Anthropic's clients send the key there) as a bearer
// token; empty when it has neither.
std::string Authorization(MHD_Connection* connection) {
  if (const char* auth = Header(connection, MHD_HTTP_HEADER_AUTHORIZATION);
      auth != nullptr && *auth != '\0') {
    return auth;
  }
  if (const char* key = Header(connection, "x-api-key"); key != nullptr && *key != '\0') {
    return absl::StrCat("Bearer ", key);
  }
  return "";
}

bool PrintableAscii(const char* s);

// A generation call's metadata: the request's credentials and its W3C trace context
// (traceparent, tracestate: the service's span joins the caller's trace), where they are
// printable ASCII (gRPC metadata's alphabet; a credential that is not was refused before).
std::vector<std::pair<std::string, std::string>> CallMetadata(MHD_Connection* connection) {
  std::vector<std::pair<std::string, std::string>> metadata;
  if (std::string auth = Authorization(connection); !auth.empty()) {
    metadata.emplace_back("authorization", std::move(auth));
  }
  for (const char* name : {"traceparent", "tracestate"}) {
    if (const char* value = Header(connection, name); value != nullptr && PrintableAscii(value)) {
      metadata.emplace_back(name, value);
    }
  }
  return metadata;
}

// The request's credentials, passed on to the service as the call's metadata (the token check
// there applies to every route that calls it).
void PassAuthorization(MHD_Connection* connection, grpc::ClientContext* context) {
  if (std::string auth = Authorization(connection); !auth.empty()) {
    context->AddMetadata("authorization", auth);
  }
}

const char* Header(MHD_Connection* connection, const char* name) {
  return MHD_lookup_connection_value(connection, MHD_HEADER_KIND, name);
}

std::string RandomHex() {
  thread_local absl::BitGen gen;
  return absl::StrFormat("%016x%016x", absl::Uniform<uint64_t>(gen),
                         absl::Uniform<uint64_t>(gen));
}

// The calls of one HTTP request (one per prompt) on their own completion queue, driven by the
// connection's thread. While it waits it watches the client's socket: a client that hangs up
// (or resets) cancels every call, streaming or not, so that a request nobody will read does not
// keep its slots and KV blocks until max_tokens.
class CallGroup {
 public:
  // What Next() hands back: call `call`'s next message, or its end with `status`; or, when
  // `idle`, only that nothing came for the `idle_after` Next was given.
  struct Event {
    int call = 0;
    bool message = false;
    bool idle = false;
    v1::GenerateResponse response;
    grpc::Status status;
  };

  // `disconnects` (may be null) counts the requests cancelled because the client hung up.
  CallGroup(ActiveCalls* active, int client_fd, Counter* disconnects)
      : active_(active), client_fd_(client_fd), disconnects_(disconnects) {}
  CallGroup(const CallGroup&) = delete;
  CallGroup& operator=(const CallGroup&) = delete;

  ~CallGroup() {
    client_fd_ = -1;  // the connection may be closed by now, its number another connection's
    if (!calls_.empty()) {
      Cancel();
      Event ignored;
      while (Next(&ignored)) {
      }
      cq_.Shutdown();
      void* tag;
      bool ok;
      while (cq_.Next(&tag, &ok)) {
      }
    }
    for (Call& c : calls_) active_->Remove(c.context.get());
  }

  // Starts one call per request; false (nothing started) when the server is stopping.
  bool Start(v1::Kvrm::Stub* stub, const std::vector<v1::GenerateRequest>& requests,
             const std::vector<std::pair<std::string, std::string>>& metadata) {
    calls_.resize(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      Call& c = calls_[i];
      c.context = std::make_unique<grpc::ClientContext>();
      for (const auto& [key, value] : metadata) c.context->AddMetadata(key, value);
      if (!active_->Add(c.context.get())) {
        for (size_t j = 0; j < i; ++j) active_->Remove(calls_[j].context.get());
        calls_.clear();
        return false;
      }
    }
    for (size_t i = 0; i < requests.size(); ++i) {
      Call& c = calls_[i];
      c.reader = stub->PrepareAsyncGenerate(c.context.get(), requests[i], &cq_);
      c.reader->StartCall(Tag(i));
    }
    live_ = static_cast<int>(calls_.size());
    return true;
  }

  // Waits for the next event; false once every call has ended. With a finite `idle_at`, an
  // idle event comes when that time passes before Next returns anything else.
  bool Next(Event* e, absl::Time idle_at = absl::InfiniteFuture()) {
    e->idle = false;
    while (live_ > 0) {
      const absl::Time now = absl::Now();
      if (now >= idle_at && !client_gone_) {
        e->idle = true;
        e->message = false;
        return true;
      }
      void* tag = nullptr;
      bool ok = false;
      const int64_t wait_ms =
          std::clamp<int64_t>(absl::ToInt64Milliseconds(idle_at - now), 0, kIdleMs);
      const gpr_timespec deadline = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                                 gpr_time_from_millis(wait_ms, GPR_TIMESPAN));
      const grpc::CompletionQueue::NextStatus got = cq_.AsyncNext(&tag, &ok, deadline);
      WatchClient();
      if (got == grpc::CompletionQueue::TIMEOUT) continue;
      if (got == grpc::CompletionQueue::SHUTDOWN) return false;
      const size_t i = reinterpret_cast<uintptr_t>(tag) - 1;
      Call& c = calls_[i];
      switch (c.state) {
        case Call::kStarting:
        case Call::kReading:
          if (ok && c.state == Call::kReading) {
            e->call = static_cast<int>(i);
            e->message = true;
            e->response = std::move(c.message);
            c.message.Clear();
            c.reader->Read(&c.message, Tag(i));  // the next one, while this one is handled
            return true;
          }
          if (ok) {  // started
            c.state = Call::kReading;
            c.reader->Read(&c.message, Tag(i));
          } else {  // the stream is over (or never began): its status
            c.state = Call::kFinishing;
            c.reader->Finish(&c.status, Tag(i));
          }
          break;
        case Call::kFinishing:
          c.state = Call::kDone;
          --live_;
          e->call = static_cast<int>(i);
          e->message = false;
          e->status = c.status;
          return true;
        case Call::kDone:
          break;
      }
    }
    return false;
  }

  void Cancel() {
    for (Call& c : calls_) c.context->TryCancel();
  }

  size_t size() const { return calls_.size(); }
  const grpc::ClientContext& context(int call) const { return *calls_[call].context; }
  // The client hung up while a call ran (its calls were cancelled).
  bool client_gone() const { return client_gone_; }

 private:
  // The client's socket is looked at after each event, at most every kWatchMs, and at least every
  // kIdleMs while no event comes (a request waiting in the queue).
  static constexpr int64_t kWatchMs = 10;
  static constexpr int64_t kIdleMs = 50;

  struct Call {
    enum State { kStarting, kReading, kFinishing, kDone };
    std::unique_ptr<grpc::ClientContext> context;
    std::unique_ptr<grpc::ClientAsyncReader<v1::GenerateResponse>> reader;
    v1::GenerateResponse message;
    grpc::Status status;
    State state = kStarting;
  };

  static void* Tag(size_t call) { return reinterpret_cast<void*>(call + 1); }

  // A client that hung up (ClientHungUp) cancels the calls.
  void WatchClient() {
    if (client_fd_ < 0 || client_gone_) return;
    const absl::Time now = absl::Now();
    if (now - last_watch_ < absl::Milliseconds(kWatchMs)) return;
    last_watch_ = now;
    if (ClientHungUp(client_fd_)) {
      client_gone_ = true;
      if (disconnects_ != nullptr) disconnects_->Add();
      Cancel();
    }
  }

  ActiveCalls* active_;
  int client_fd_;
  Counter* disconnects_;
  grpc::CompletionQueue cq_;
  std::vector<Call> calls_;
  int live_ = 0;
  bool client_gone_ = false;
  absl::Time last_watch_ = absl::InfinitePast();
};

// One reply being made: the request, its calls and the reply built from their messages. For a
// stream, owned by the libmicrohttpd response (freed by FreeStream when it is done or the client
// gone) and refilled by ReadStream on the connection's thread.
struct Stream {
  Stream(ActiveCalls* active, int client_fd, Counter* disconnects)
      : calls(active, client_fd, disconnects) {}
  OpenAiRequest request;
  CallGroup calls;
  std::unique_ptr<GenerationReply> reply;
  // /v1/responses with a store: where a completed response goes (`reply` is a ResponsesReply).
  ResponseStore* store = nullptr;
  // Keeps a completed response (not a failed or cancelled one), `body` its whole JSON.
  void SaveResponse(std::string body) {
    if (store == nullptr || failed || !reply->engine_error().empty()) return;
    const auto& r = static_cast<const ResponsesReply&>(*reply);
    store->Put(r.id(), r.StoreEntry(std::move(body)));
  }
  std::string pending;  // events not yet handed to libmicrohttpd
  size_t sent = 0;      // bytes of `pending` handed over
  bool ended = false;   // every call finished and the last events are in `pending`
  // GenerationReply::KeepAliveEvent after this long idle.
  absl::Duration keepalive = absl::InfiniteDuration();
  OpenAiError error;    // the first call that failed after output began
  bool failed = false;
};

// The error a call's end means, or nullopt when it ended well.
std::optional<OpenAiError> EndError(const CallGroup& calls, const CallGroup::Event& e,
                                    const OpenAiRequest& request) {
  if (e.status.ok()) return std::nullopt;
  return ToOpenAiError(FromGrpc(e.status), &request, RetryAfterMs(calls.context(e.call)));
}

// Refills `s->pending` with the next events, blocking on the calls (this connection's thread).
void NextEvents(Stream* s) {
  s->pending.clear();
  s->sent = 0;
  CallGroup::Event e;
  // Counted from the last bytes handed over: messages that add nothing to send (held tool-call
  // text) do not put it off.
  const absl::Time idle_at = absl::Now() + s->keepalive;
  while (s->pending.empty() && !s->ended) {
    if (s->calls.Next(&e, idle_at)) {
      if (e.idle) {
        s->pending = s->reply->KeepAliveEvent();  // (clients skip it)
      } else if (e.message) {
        s->pending = s->reply->StreamMessage(e.response, e.call);
      } else if (std::optional<OpenAiError> error = EndError(s->calls, e, s->request);
                 error && !s->failed) {
        s->failed = true;
        s->error = *std::move(error);
        s->calls.Cancel();  // one prompt failing fails the request
      }
      continue;
    }
    if (s->calls.client_gone()) return;  // nobody to write to
    if (s->failed) {
      s->pending = s->reply->ErrorEvent(s->error);
    } else if (!s->reply->engine_error().empty()) {
      OpenAiError error;
      error.message = s->reply->engine_error();
      error.type = "server_error";
      s->pending = s->reply->ErrorEvent(error);
    }
    s->pending += s->reply->StreamEnd();
    s->ended = true;
    if (s->store != nullptr) s->SaveResponse(s->reply->Body());
  }
}

ssize_t ReadStream(void* cls, uint64_t /*pos*/, char* buf, size_t max) {
  auto* s = static_cast<Stream*>(cls);
  if (s->sent == s->pending.size()) {
    if (s->ended) return MHD_CONTENT_READER_END_OF_STREAM;
    NextEvents(s);
    if (s->pending.empty()) return MHD_CONTENT_READER_END_WITH_ERROR;  // the client is gone
  }
  const size_t n = std::min(max, s->pending.size() - s->sent);
  std::memcpy(buf, s->pending.data() + s->sent, n);
  s->sent += n;
  return static_cast<ssize_t>(n);
}

// The client went away, the stream ended, or the server is stopping: ~CallGroup cancels what is
// still running and lets it end.
void FreeStream(void* cls) { delete static_cast<Stream*>(cls); }

MHD_Result AccessHandler(void* cls, MHD_Connection* connection, const char* url,
                         const char* method, const char* /*version*/, const char* upload_data,
                         size_t* upload_data_size, void** state) {
  return static_cast<MHD_Result>(static_cast<OpenAiHttpServer*>(cls)->Handle(
      connection, url, method, upload_data, upload_data_size, state));
}

// libmicrohttpd's own messages (a client gone mid-reply, a malformed request) into our log.
void LogHttp(void* /*cls*/, const char* format, va_list args) {
  char line[512];
  std::vsnprintf(line, sizeof(line), format, args);
  std::string text(line);
  while (!text.empty() && text.back() == '\n') text.pop_back();
  LOG(INFO) << "http: " << text;
}

// The request is done (its reply sent, or the connection gone): its metrics, then its state.
void RequestCompleted(void* cls, MHD_Connection* connection, void** state,
                      MHD_RequestTerminationCode /*code*/) {
  auto* upload = static_cast<Upload*>(*state);
  if (upload == nullptr) return;
  auto* active = static_cast<ActiveCalls*>(cls);
  if (const HttpApiMetrics* metrics = active->metrics()) {
    const MHD_ConnectionInfo* info =
        MHD_get_connection_info(connection, MHD_CONNECTION_INFO_HTTP_STATUS);
    // No status queued: the client hung up before the reply began.
    const int status = info != nullptr && info->http_status != 0 ? info->http_status : 499;
    metrics->Record(upload->route, status, absl::ToDoubleSeconds(absl::Now() - upload->start));
  }
  delete upload;
  *state = nullptr;
  active->RequestEnded();
}

// A header value gRPC metadata can carry (printable ASCII): anything else would fail the call's
// start, which gRPC's C++ API treats as a bug and aborts on.
bool PrintableAscii(const char* s) {
  for (; *s != '\0'; ++s) {
    if (*s < 0x20 || *s > 0x7e) return false;
  }
  return true;
}

// The 400 / 401 for headers that are passed on to the service but cannot be.
std::optional<OpenAiError> BadHeaders(MHD_Connection* connection) {
  OpenAiError e;
  // The credential passed on (Authorization, else x-api-key) must be one gRPC can carry.
  const char* auth = Header(connection, MHD_HTTP_HEADER_AUTHORIZATION);
  const char* name = MHD_HTTP_HEADER_AUTHORIZATION;
  if (auth == nullptr || *auth == '\0') {
    auth = Header(connection, "x-api-key");
    name = "x-api-key";
  }
  if (auth != nullptr && !PrintableAscii(auth)) {
    e.http_status = 401;
    e.type = "authentication_error";
    e.message = absl::StrCat("the ", name, " header holds bytes outside printable ASCII");
    return e;
  }
  if (const char* id = Header(connection, "X-Request-Id"); id != nullptr && !PrintableAscii(id)) {
    e.http_status = 400;
    e.type = "invalid_request_error";
    e.param = "request_id";
    e.message = "the X-Request-Id header holds bytes outside printable ASCII";
    return e;
  }
  return std::nullopt;
}

void ConnectionChanged(void* cls, MHD_Connection* /*connection*/, void** /*socket_context*/,
                       MHD_ConnectionNotificationCode code) {
  Gauge* open = static_cast<Gauge*>(cls);
  open->Add(code == MHD_CONNECTION_NOTIFY_STARTED ? 1.0 : -1.0);
}

}  // namespace

OpenAiHttpServer::OpenAiHttpServer(std::shared_ptr<grpc::Channel> channel,
                                   OpenAiHttpOptions options)
    : channel_(std::move(channel)),
      stub_(v1::Kvrm::NewStub(channel_)),
      options_(std::move(options)),
      created_(absl::ToUnixSeconds(absl::Now())),
      calls_(std::make_unique<ActiveCalls>(options_.metrics)),
      store_(options_.responses_store_entries > 0
                 ? std::make_unique<ResponseStore>(options_.responses_store_entries,
                                                   options_.responses_store_bytes)
                 : nullptr) {}

int OpenAiHttpServer::Handle(MHD_Connection* connection, const char* url, const char* method,
                             const char* upload_data, size_t* upload_data_size, void** state) {
  if (*state == nullptr) {  // the headers are in: the body (if any) comes in the next calls
    auto* upload = new Upload();
    upload->route = RouteOf(url, options_.registry != nullptr);
    upload->start = absl::Now();
    *state = upload;
    calls_->RequestStarted();
    // A body announced larger than the limit is refused now, before "100 Continue" invites it.
    uint64_t announced = 0;
    if (const char* length = Header(connection, MHD_HTTP_HEADER_CONTENT_LENGTH);
        length != nullptr && absl::SimpleAtoi(length, &announced) &&
        announced > options_.max_body_bytes) {
      upload->too_large = true;
      return ReplyError(connection, 413, "invalid_request_error",
                        absl::StrCat("request body of ", announced, " bytes is larger than ",
                                     options_.max_body_bytes, " bytes"),
                        ShapeOf(upload->route));
    }
    return MHD_YES;
  }
  auto* upload = static_cast<Upload*>(*state);
  if (*upload_data_size > 0) {
    if (upload->body.size() + *upload_data_size > options_.max_body_bytes) {
      upload->too_large = true;  // keep reading (and dropping) it: the reply comes at the end
    } else {
      upload->body.append(upload_data, *upload_data_size);
    }
    *upload_data_size = 0;
    return MHD_YES;
  }
  const std::string path = url;
  const bool get = std::strcmp(method, MHD_HTTP_METHOD_GET) == 0;
  const bool post = std::strcmp(method, MHD_HTTP_METHOD_POST) == 0;
  const OpenAiError::Shape shape = ShapeOf(upload->route);
  auto use = [&](const char* method_name) {
    return ReplyError(connection, 405, "invalid_request_error", absl::StrCat("use ", method_name),
                      shape);
  };
  auto too_large = [&] {
    return ReplyError(connection, 413, "invalid_request_error",
                      absl::StrCat("request body larger than ", options_.max_body_bytes, " bytes"),
                      shape);
  };
  switch (upload->route) {
    case HttpRoute::kHealth:  // /ping is SageMaker's: GET or POST
      if (!get && !(post && path == "/ping")) return use("GET");
      // Draining (SIGTERM): a balancer probing this port stops sending here.
      return Queue(connection, draining_ ? MHD_HTTP_SERVICE_UNAVAILABLE : MHD_HTTP_OK,
                   Buffer("", "text/plain"));
    case HttpRoute::kVersion: {
      if (!get) return use("GET");
      OrderedJson version;
      version["version"] = options_.version;
      return Queue(connection, MHD_HTTP_OK, Buffer(version.dump(), kJson));
    }
    case HttpRoute::kMetrics:
      if (!get) return use("GET");
      return Queue(connection, MHD_HTTP_OK,
                   Buffer(options_.registry->Render(), "text/plain; version=0.0.4; charset=utf-8"));
    case HttpRoute::kModels:
      if (!get) return use("GET");
      if (std::optional<OpenAiError> e = BadHeaders(connection)) return ReplyError(connection, *e);
      return Models(connection, path);
    case HttpRoute::kEmbeddings:
      if (!post) return use("POST");
      if (upload->too_large) return too_large();
      if (std::optional<OpenAiError> e = BadHeaders(connection)) return ReplyError(connection, *e);
      return Embeddings(connection, upload->body);
    case HttpRoute::kClassify:
    case HttpRoute::kScore:
    case HttpRoute::kRerank:
      if (!post) return use("POST");
      if (upload->too_large) return too_large();
      if (std::optional<OpenAiError> e = BadHeaders(connection)) return ReplyError(connection, *e);
      if (upload->route == HttpRoute::kClassify) return Classify(connection, upload->body);
      return Score(connection, upload->body, upload->route == HttpRoute::kRerank);
    case HttpRoute::kTokenize:
    case HttpRoute::kDetokenize:
      if (!post) return use("POST");
      if (upload->too_large) return too_large();
      if (std::optional<OpenAiError> e = BadHeaders(connection)) return ReplyError(connection, *e);
      return upload->route == HttpRoute::kTokenize ? Tokenize(connection, upload->body)
                                                   : Detokenize(connection, upload->body);
    case HttpRoute::kResponses:
      if (path != "/v1/responses") {  // /v1/responses/{id}
        const bool remove = std::strcmp(method, MHD_HTTP_METHOD_DELETE) == 0;
        if (!get && !remove) return use("GET or DELETE");
        if (std::optional<OpenAiError> e = BadHeaders(connection)) {
          return ReplyError(connection, *e);
        }
        return StoredResponse(connection, path.substr(std::strlen("/v1/responses/")), remove);
      }
      [[fallthrough]];
    case HttpRoute::kCompletions:
    case HttpRoute::kChatCompletions:
      if (!post) return use("POST");
      if (upload->too_large) return too_large();
      if (std::optional<OpenAiError> e = BadHeaders(connection)) return ReplyError(connection, *e);
      return Generate(connection, upload->route, upload->body);
    case HttpRoute::kMessages:
      if (!post) return use("POST");
      if (upload->too_large) return too_large();
      if (std::optional<OpenAiError> e = BadHeaders(connection)) {
        e->shape = shape;
        return ReplyError(connection, *e);
      }
      if (path == "/v1/messages/count_tokens") return CountTokens(connection, upload->body);
      return Generate(connection, upload->route, upload->body);
    case HttpRoute::kLoraAdapters:
      if (!post) return use("POST");
      if (upload->too_large) return too_large();
      if (std::optional<OpenAiError> e = BadHeaders(connection)) return ReplyError(connection, *e);
      return LoraAdapterUpdate(connection, path == "/v1/load_lora_adapter", upload->body);
    case HttpRoute::kResetPrefixCache:
      if (!post) return use("POST");
      if (std::optional<OpenAiError> e = BadHeaders(connection)) return ReplyError(connection, *e);
      return ResetPrefixCache(connection);
    case HttpRoute::kOther:
      break;
  }
  return ReplyError(
      connection, 404, "not_found_error",
      absl::StrCat("no route ", path,
                   ": try /v1/chat/completions, "
                   "/v1/completions, /v1/responses, /v1/messages, /v1/embeddings, /v1/models, "
                   "/classify, "
                   "/score, /rerank, /tokenize, "
                   "/detokenize, "
                   "/v1/load_lora_adapter, /v1/unload_lora_adapter, /reset_prefix_cache"));
}

int OpenAiHttpServer::ResetPrefixCache(MHD_Connection* connection) {
  grpc::ClientContext context;
  PassAuthorization(connection, &context);
  v1::ResetPrefixCacheResponse response;
  const grpc::Status status =
      stub_->ResetPrefixCache(&context, v1::ResetPrefixCacheRequest(), &response);
  if (!status.ok()) return ReplyError(connection, ToOpenAiError(FromGrpc(status), nullptr));
  OrderedJson body;
  body["device_blocks_freed"] = response.device_blocks_freed();
  body["host_blocks_freed"] = response.host_blocks_freed();
  return Queue(connection, MHD_HTTP_OK, Buffer(body.dump(), kJson));
}

absl::StatusOr<v1::ModelInfo> OpenAiHttpServer::ModelInfo(MHD_Connection* connection) {
  grpc::ClientContext context;
  PassAuthorization(connection, &context);
  v1::ModelInfo info;
  const grpc::Status status = stub_->GetModelInfo(&context, v1::GetModelInfoRequest(), &info);
  if (!status.ok()) return FromGrpc(status);
  return info;
}

int OpenAiHttpServer::Models(MHD_Connection* connection, const std::string& path) {
  // Through the service, so that a token check applies here as to the rest of the API.
  absl::StatusOr<v1::ModelInfo> model_info = ModelInfo(connection);
  if (!model_info.ok()) return ReplyError(connection, ToOpenAiError(model_info.status(), nullptr));
  const v1::ModelInfo& info = *model_info;
  // The base model, then each LoRA adapter with the base as its parent (vLLM's listing).
  std::vector<OrderedJson> models;
  auto add = [&](const std::string& id, const std::string& root, const std::string& parent) {
    OrderedJson& model = models.emplace_back();
    model["id"] = id;
    model["object"] = "model";
    model["created"] = created_;
    model["owned_by"] = "kvrm";
    model["root"] = root;
    model["parent"] = parent.empty() ? OrderedJson(nullptr) : OrderedJson(parent);
    model["max_model_len"] = info.max_context();
  };
  add(options_.served_model_name, info.name(), "");
  for (const std::string& alias : options_.served_model_aliases) add(alias, info.name(), "");
  for (const v1::LoraAdapterInfo& a : info.lora_adapters()) {
    add(a.name(), a.path(), options_.served_model_name);
  }
  if (path != "/v1/models") {
    const std::string id = path.substr(std::strlen("/v1/models/"));
    for (OrderedJson& model : models) {
      if (model["id"] == id) return Queue(connection, MHD_HTTP_OK, Buffer(model.dump(), kJson));
    }
    return ReplyError(connection, 404, "not_found_error",
                      absl::StrCat("The model `", id, "` does not exist."));
  }
  OrderedJson list;
  list["object"] = "list";
  list["data"] = OrderedJson::array();
  for (OrderedJson& model : models) list["data"].push_back(std::move(model));
  return Queue(connection, MHD_HTTP_OK, Buffer(list.dump(), kJson));
}

bool OpenAiHttpServer::ServedName(const std::string& model) const {
  return model.empty() || model == options_.served_model_name ||
         std::find(options_.served_model_aliases.begin(), options_.served_model_aliases.end(),
                   model) != options_.served_model_aliases.end();
}

std::optional<OpenAiError> OpenAiHttpServer::WrongModel(const std::string& model) const {
  if (ServedName(model)) return std::nullopt;
  const std::vector<std::string> adapters =
      options_.lora_adapters ? options_.lora_adapters() : std::vector<std::string>();
  if (std::find(adapters.begin(), adapters.end(), model) != adapters.end()) return std::nullopt;
  if (options_.lora_adapter_loadable && options_.lora_adapter_loadable(model)) return std::nullopt;
  OpenAiError e;
  e.http_status = 404;
  e.type = "not_found_error";
  e.param = "model";
  e.message = absl::StrCat("The model `", model, "` does not exist (this server serves `",
                           options_.served_model_name, "`",
                           adapters.empty() ? "" : " and the LoRA adapters `",
                           absl::StrJoin(adapters, "`, `"), adapters.empty() ? "" : "`", ").");
  return e;
}

namespace {

// A unary call on the service for an HTTP request, its Authorization header passed on: the
// error reply (parameters named as `names` spells them), or 200 with what `json` makes of the
// response.
template <typename Request, typename Response, typename ToJson>
int UnaryCall(MHD_Connection* connection, v1::Kvrm::Stub* stub,
              grpc::Status (v1::Kvrm::Stub::*rpc)(grpc::ClientContext*, const Request&, Response*),
              const Request& request, const OpenAiRequest& names, ToJson json,
              OpenAiError::Shape shape = OpenAiError::Shape::kOpenAi) {
  grpc::ClientContext context;
  PassAuthorization(connection, &context);
  Response response;
  const grpc::Status status = (stub->*rpc)(&context, request, &response);
  if (!status.ok()) {
    OpenAiError e = ToOpenAiError(FromGrpc(status), &names);
    e.shape = shape;
    return ReplyError(connection, e);
  }
  return Queue(connection, MHD_HTTP_OK, Buffer(json(response), kJson));
}

}  // namespace

int OpenAiHttpServer::StoredResponse(MHD_Connection* connection, const std::string& id,
                                     bool remove) {
  // Through the service, so that a token check applies here as to the rest of the API.
  if (absl::StatusOr<v1::ModelInfo> info = ModelInfo(connection); !info.ok()) {
    return ReplyError(connection, ToOpenAiError(info.status(), nullptr));
  }
  if (store_ == nullptr) {
    return ReplyError(connection, 404, "not_found_error",
                      "this server stores no responses (kvrmd --responses_store)");
  }
  if (remove) {
    if (!store_->Erase(id)) {
      return ReplyError(connection, 404, "not_found_error",
                        absl::StrCat("no stored response '", id, "'"));
    }
    OrderedJson deleted = {{"id", id}, {"object", "response.deleted"}, {"deleted", true}};
    return Queue(connection, MHD_HTTP_OK, Buffer(deleted.dump(), kJson));
  }
  std::optional<ResponseStore::Entry> entry = store_->Get(id);
  if (!entry) {
    return ReplyError(connection, 404, "not_found_error",
                      absl::StrCat("no stored response '", id, "'"));
  }
  return Queue(connection, MHD_HTTP_OK, Buffer(entry->response, kJson));
}

int OpenAiHttpServer::Tokenize(MHD_Connection* connection, const std::string& body) {
  absl::StatusOr<OpenAiTokenize> parsed = ParseTokenizeRequest(body);
  if (!parsed.ok()) return ReplyError(connection, ToOpenAiError(parsed.status(), nullptr));
  if (std::optional<OpenAiError> e = WrongModel(parsed->request.model)) {
    return ReplyError(connection, *e);
  }
  const bool strs = parsed->tokenize.return_pieces();
  return UnaryCall(connection, stub_.get(), &v1::Kvrm::Stub::Tokenize, parsed->tokenize,
                   parsed->request, [&](const v1::TokenizeResponse& r) {
                     return TokenizeReplyJson(r, options_.max_context, strs);
                   });
}

template <typename Request, typename Response>
int OpenAiHttpServer::PoolingCall(
    MHD_Connection* connection, Request* request, const OpenAiRequest& names,
    std::unique_ptr<grpc::ClientAsyncResponseReader<Response>> (v1::Kvrm::Stub::*start)(
        grpc::ClientContext*, const Request&, grpc::CompletionQueue*),
    const std::function<std::string(const Response&, const std::string&, int64_t)>& json) {
  const std::string& model = names.model;
  if (std::optional<OpenAiError> e = WrongModel(model)) return ReplyError(connection, *e);
  if (!ServedName(model)) {
    request->set_lora_adapter(model);  // WrongModel let it through: an adapter's name
  }
  if (request->request_id().empty()) {
    if (const char* header = Header(connection, "X-Request-Id"); header != nullptr && *header) {
      request->set_request_id(header);
    }
  }
  const std::string reply_model = model.empty() ? options_.served_model_name : model;
  const int64_t created = absl::ToUnixSeconds(absl::Now());
  grpc::ClientContext context;
  PassAuthorization(connection, &context);
  if (!calls_->Add(&context)) {
    return ReplyError(connection, 503, "service_unavailable", "the server is shutting down");
  }
  const MHD_ConnectionInfo* fd_info =
      MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD);
  const int client_fd = fd_info != nullptr ? fd_info->connect_fd : -1;
  grpc::CompletionQueue cq;
  Response response;
  grpc::Status status;
  std::unique_ptr<grpc::ClientAsyncResponseReader<Response>> call =
      (stub_.get()->*start)(&context, *request, &cq);
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  bool gone = false;
  for (;;) {
    void* tag = nullptr;
    bool ok = false;
    const grpc::CompletionQueue::NextStatus next =
        cq.AsyncNext(&tag, &ok, std::chrono::system_clock::now() + std::chrono::milliseconds(50));
    if (next != grpc::CompletionQueue::TIMEOUT) break;  // the call ended (or was cancelled)
    if (!gone && client_fd >= 0 && ClientHungUp(client_fd)) {
      gone = true;
      if (options_.metrics != nullptr) options_.metrics->client_disconnects()->Add();
      context.TryCancel();
    }
  }
  calls_->Remove(&context);
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
  if (gone) return MHD_NO;  // nobody to reply to
  if (!status.ok()) {
    return ReplyError(connection, ToOpenAiError(FromGrpc(status), &names, RetryAfterMs(context)));
  }
  return Queue(connection, MHD_HTTP_OK, Buffer(json(response, reply_model, created), kJson));
}

int OpenAiHttpServer::Embeddings(MHD_Connection* connection, const std::string& body) {
  absl::StatusOr<OpenAiEmbeddings> parsed = ParseEmbeddingsRequest(body);
  if (!parsed.ok()) return ReplyError(connection, ToOpenAiError(parsed.status(), nullptr));
  const bool base64 = parsed->base64;
  return PoolingCall<v1::EmbedRequest, v1::EmbedResponse>(
      connection, &parsed->embed, parsed->request, &v1::Kvrm::Stub::AsyncEmbed,
      [base64](const v1::EmbedResponse& r, const std::string& model, int64_t created) {
        return EmbeddingsReplyJson(r, model, created, base64);
      });
}

int OpenAiHttpServer::Classify(MHD_Connection* connection, const std::string& body) {
  absl::StatusOr<OpenAiClassify> parsed = ParseClassifyRequest(body);
  if (!parsed.ok()) return ReplyError(connection, ToOpenAiError(parsed.status(), nullptr));
  return PoolingCall<v1::ClassifyRequest, v1::ClassifyResponse>(
      connection, &parsed->classify, parsed->request, &v1::Kvrm::Stub::AsyncClassify,
      &ClassifyReplyJson);
}

int OpenAiHttpServer::Score(MHD_Connection* connection, const std::string& body, bool rerank) {
  absl::StatusOr<OpenAiScore> parsed = ParseScoreRequest(body, rerank);
  if (!parsed.ok()) return ReplyError(connection, ToOpenAiError(parsed.status(), nullptr));
  const OpenAiScore& request = *parsed;
  return PoolingCall<v1::ScoreRequest, v1::ScoreResponse>(
      connection, &parsed->score, parsed->request, &v1::Kvrm::Stub::AsyncScore,
      [&request](const v1::ScoreResponse& r, const std::string& model, int64_t created) {
        return ScoreReplyJson(r, request, model, created);
      });
}

int OpenAiHttpServer::LoraAdapterUpdate(MHD_Connection* connection, bool load,
                                        const std::string& body) {
  // {"lora_name": "...", "lora_path": "..."} (load) or {"lora_name": "..."} (unload).
  OpenAiRequest names;  // for the error replies' `param`
  absl::StatusOr<Json> parsed = ParseJson(body, "request body");
  std::string name, lora_path;
  absl::Status bad;
  if (!parsed.ok()) {
    bad = parsed.status();
  } else if (!parsed->is_object()) {
    bad = absl::InvalidArgumentError("request body: not a JSON object");
  } else {
    for (const auto& [key, value] : parsed->items()) {
      if (key != "lora_name" && !(load && key == "lora_path")) {
        bad = absl::InvalidArgumentError(
            absl::StrCat(key, ": unknown field (expected lora_name", load ? ", lora_path)" : ")"));
        break;
      }
      if (!value.is_string()) {
        bad = absl::InvalidArgumentError(absl::StrCat(key, ": not a string"));
        break;
      }
      (key == "lora_name" ? name : lora_path) = value.get<std::string>();
    }
    if (bad.ok() && name.empty()) bad = absl::InvalidArgumentError("lora_name: missing");
    if (bad.ok() && load && lora_path.empty()) {
      bad = absl::InvalidArgumentError("lora_path: missing");
    }
  }
  if (!bad.ok()) {
    OpenAiError e = ToOpenAiError(bad, nullptr);
    const std::string message(bad.message());
    for (const char* field : {"lora_name", "lora_path"}) {
      if (absl::StartsWith(message, absl::StrCat(field, ":"))) e.param = field;
    }
    return ReplyError(connection, e);
  }
  grpc::ClientContext context;
  PassAuthorization(connection, &context);
  grpc::Status status;
  std::string reply;
  if (load) {
    v1::LoadLoraAdapterRequest request;
    request.set_lora_name(name);
    request.set_lora_path(lora_path);
    v1::LoraAdapterInfo info;
    status = stub_->LoadLoraAdapter(&context, request, &info);
    reply = absl::StrCat("Success: LoRA adapter '", name, "' added successfully.");
  } else {
    v1::UnloadLoraAdapterRequest request;
    request.set_lora_name(name);
    v1::UnloadLoraAdapterResponse response;
    status = stub_->UnloadLoraAdapter(&context, request, &response);
    reply = absl::StrCat("Success: LoRA adapter '", name, "' removed successfully.");
  }
  if (!status.ok()) {
    const absl::Status error = FromGrpc(status);
    OpenAiError e = ToOpenAiError(error, nullptr);
    const std::string message(error.message());
    for (const char* field : {"lora_name", "lora_path"}) {
      if (absl::StartsWith(message, absl::StrCat(field, ":"))) e.param = field;
    }
    // An adapter of that name already served: a conflict, as vLLM's 400 says in its message.
    if (error.code() == absl::StatusCode::kAlreadyExists) {
      e.http_status = 400;
      e.type = "invalid_request_error";
      e.param = "lora_name";
    }
    return ReplyError(connection, e);
  }
  return Queue(connection, MHD_HTTP_OK, Buffer(reply, "text/plain; charset=utf-8"));
}

int OpenAiHttpServer::Detokenize(MHD_Connection* connection, const std::string& body) {
  absl::StatusOr<OpenAiDetokenize> parsed = ParseDetokenizeRequest(body);
  if (!parsed.ok()) return ReplyError(connection, ToOpenAiError(parsed.status(), nullptr));
  if (std::optional<OpenAiError> e = WrongModel(parsed->request.model)) {
    return ReplyError(connection, *e);
  }
  return UnaryCall(connection, stub_.get(), &v1::Kvrm::Stub::Detokenize, parsed->detokenize,
                   parsed->request, &DetokenizeReplyJson);
}

int OpenAiHttpServer::CountTokens(MHD_Connection* connection, const std::string& body) {
  auto fail = [&](OpenAiError e) {
    e.shape = OpenAiError::Shape::kAnthropic;
    return ReplyError(connection, e);
  };
  absl::StatusOr<OpenAiTokenize> parsed = ParseCountTokensRequest(body);
  if (!parsed.ok()) return fail(ToOpenAiError(parsed.status(), nullptr));
  if (std::optional<OpenAiError> e = WrongModel(parsed->request.model)) return fail(*e);
  return UnaryCall(connection, stub_.get(), &v1::Kvrm::Stub::Tokenize, parsed->tokenize,
                   parsed->request, &CountTokensReplyJson, OpenAiError::Shape::kAnthropic);
}

int OpenAiHttpServer::Generate(MHD_Connection* connection, HttpRoute route,
                               const std::string& body) {
  // Errors in the route's shape (the Messages API's are Anthropic's).
  auto fail = [&](OpenAiError e) {
    e.shape = ShapeOf(route);
    return ReplyError(connection, e);
  };
  auto fail_with = [&](int http_status, const char* type, const std::string& message) {
    return ReplyError(connection, http_status, type, message, ShapeOf(route));
  };
  // /v1/responses and /v1/messages: the chat completion each means, and its own reply.
  std::optional<ResponsesRequest> responses;
  std::optional<MessagesRequest> messages;
  absl::StatusOr<OpenAiRequest> parsed;
  if (route == HttpRoute::kResponses) {
    absl::StatusOr<ResponsesRequest> r =
        ParseResponsesRequest(body, options_.defaults, store_.get());
    if (!r.ok()) return fail(ToOpenAiError(r.status(), nullptr));
    responses = *std::move(r);
    parsed = std::move(responses->chat);
  } else if (route == HttpRoute::kMessages) {
    absl::StatusOr<MessagesRequest> r = ParseMessagesRequest(body, options_.defaults);
    if (!r.ok()) return fail(ToOpenAiError(r.status(), nullptr));
    messages = *std::move(r);
    parsed = std::move(messages->chat);
  } else {
    parsed = ParseOpenAiRequest(route == HttpRoute::kCompletions ? OpenAiEndpoint::kCompletions
                                                                 : OpenAiEndpoint::kChatCompletions,
                                body, options_.defaults);
  }
  if (!parsed.ok()) return fail(ToOpenAiError(parsed.status(), nullptr));
  const MHD_ConnectionInfo* fd_info =
      MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD);
  auto stream = std::make_unique<Stream>(
      calls_.get(), fd_info != nullptr ? fd_info->connect_fd : -1,
      options_.metrics != nullptr ? options_.metrics->client_disconnects() : nullptr);
  stream->request = std::move(*parsed);
  OpenAiRequest& request = stream->request;
  if (std::optional<OpenAiError> e = WrongModel(request.model)) return fail(*e);
  const bool chat = route != HttpRoute::kCompletions;
  v1::GenerateRequest& generate = request.generate;
  if (!ServedName(request.model)) {
    generate.set_lora_adapter(request.model);  // WrongModel let it through: an adapter's name
  }
  if (generate.request_id().empty()) {
    if (const char* header = Header(connection, "X-Request-Id"); header != nullptr && *header) {
      generate.set_request_id(header);  // validated by the service like any request_id
    } else {
      generate.set_request_id(absl::StrCat(responses ? "resp_"
                                           : messages ? "msg_"
                                           : chat     ? "chatcmpl-"
                                                      : "cmpl-",
                                           RandomHex()));
    }
  }
  const std::string id = generate.request_id();
  if (!request.more_prompts.empty()) {
    // Each call repeats the parameters: bounded before they are copied (the service would refuse
    // most such requests, but only after the copies were made and sent).
    size_t bytes = 0;
    for (const v1::GenerateRequest& p : request.more_prompts) bytes += p.ByteSizeLong();
    bytes += generate.ByteSizeLong() * (1 + request.more_prompts.size());
    if (bytes > options_.max_fanout_bytes) {
      return fail_with(413, "invalid_request_error",
                        absl::StrCat("the ", 1 + request.more_prompts.size(),
                                     " prompts make calls of ", bytes, " bytes together (each "
                                     "repeats the parameters); at most ",
                                     options_.max_fanout_bytes, ": send fewer prompts a request"));
    }
  }
  const std::vector<v1::GenerateRequest> calls = OpenAiCalls(request);
  std::vector<std::string> prompt_texts;
  if (request.echo) {
    for (const v1::GenerateRequest& call : calls) {
      prompt_texts.push_back(call.has_token_ids() && options_.tokenizer != nullptr
                                 ? options_.tokenizer->Decode(call.token_ids().ids(), false)
                                 : call.text());
    }
  }
  const std::string model = request.model.empty() ? options_.served_model_name : request.model;
  if (messages) {
    stream->reply = std::make_unique<MessagesReply>(*messages, id, model);
  } else if (responses) {
    if (responses->store) stream->store = store_.get();
    stream->reply = std::make_unique<ResponsesReply>(
        *responses, id, absl::ToUnixSeconds(absl::Now()), model, options_.tokenizer);
  } else {
    stream->reply = std::make_unique<OpenAiReply>(request, options_.tokenizer, id,
                                                  absl::ToUnixSeconds(absl::Now()), model,
                                                  std::move(prompt_texts));
  }
  if (!stream->calls.Start(stub_.get(), calls, CallMetadata(connection))) {
    return fail_with(503, "service_unavailable", "the server is stopping");
  }

  // Each call's first message decides the status: refusals (bad values, a full queue, a draining
  // server) come before any output. One prompt refused refuses the request.
  std::vector<CallGroup::Event> firsts;
  std::vector<bool> started(calls.size(), false);
  size_t waiting = calls.size();
  CallGroup::Event e;
  while (waiting > 0 && stream->calls.Next(&e)) {
    if (e.message) {
      if (!started[e.call]) {
        started[e.call] = true;
        --waiting;
      }
      firsts.push_back(std::move(e));
      continue;
    }
    if (stream->calls.client_gone()) return MHD_NO;
    absl::Status st = FromGrpc(e.status);
    if (st.ok() && !started[e.call]) st = absl::InternalError("the stream ended without a message");
    if (!st.ok()) {
      const OpenAiError error =
          ToOpenAiError(st, &request, RetryAfterMs(stream->calls.context(e.call)));
      stream.reset();  // cancels the others and waits for them
      return fail(error);
    }
  }
  if (stream->calls.client_gone()) return MHD_NO;

  if (!request.stream) {
    GenerationReply& reply = *stream->reply;
    for (const CallGroup::Event& f : firsts) reply.Add(f.response, f.call);
    std::optional<OpenAiError> failed;
    while (stream->calls.Next(&e)) {
      if (e.message) {
        reply.Add(e.response, e.call);
      } else if (std::optional<OpenAiError> error = EndError(stream->calls, e, request);
                 error && !failed) {
        failed = std::move(error);
        stream->calls.Cancel();
      }
    }
    // A client that hung up gets nothing: closing the connection is the whole answer.
    if (stream->calls.client_gone()) return MHD_NO;
    if (failed) return fail(*failed);
    if (!reply.engine_error().empty()) {
      return fail_with(500, "server_error", reply.engine_error());
    }
    const std::string reply_body = reply.Body();
    stream->SaveResponse(reply_body);
    MHD_Response* response = Buffer(reply_body, kJson);
    if (response != nullptr) MHD_add_response_header(response, "X-Request-Id", id.c_str());
    return Queue(connection, MHD_HTTP_OK, response);
  }
  stream->keepalive = options_.sse_keepalive;
  stream->pending = stream->reply->StreamStart();
  for (const CallGroup::Event& f : firsts) {
    stream->pending += stream->reply->StreamMessage(f.response, f.call);
  }
  Stream* s = stream.release();
  MHD_Response* response =
      MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 << 10, &ReadStream, s, &FreeStream);
  if (response == nullptr) {
    FreeStream(s);
    return MHD_NO;
  }
  MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
  MHD_add_response_header(response, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
  MHD_add_response_header(response, "X-Request-Id", id.c_str());
  return Queue(connection, MHD_HTTP_OK, response);
}

absl::StatusOr<std::unique_ptr<OpenAiHttpServer>> OpenAiHttpServer::Start(
    std::shared_ptr<grpc::Channel> channel, const OpenAiHttpOptions& options) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--http_port=", options.port, " out of range"));
  }
  if (options.connection_limit < 1 || options.connection_limit > 65536) {
    return absl::InvalidArgumentError(absl::StrCat("--http_max_connections=",
                                                   options.connection_limit,
                                                   " must be in [1, 65536]"));
  }
  if (options.idle_timeout_s < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--http_idle_timeout_s=", options.idle_timeout_s, " must be at least 1"));
  }
  if (options.tls_cert_pem.empty() != options.tls_key_pem.empty()) {
    return absl::InvalidArgumentError("HTTPS needs both a certificate and its key");
  }
  sockaddr_storage addr{};
  bool ipv6 = false;
  if (absl::Status s = ResolveListenAddress(options.host, options.port, "--http_listen", &addr,
                                            &ipv6);
      !s.ok()) {
    return s;
  }

  std::unique_ptr<OpenAiHttpServer> server(new OpenAiHttpServer(std::move(channel), options));
  // A thread per connection: a streamed reply blocks its thread on the call between tokens.
  unsigned int flags =
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ERROR_LOG;
  if (ipv6) flags |= MHD_USE_IPv6;
  const bool tls = !options.tls_cert_pem.empty();
  if (tls) {
    if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
      return absl::FailedPreconditionError(
          "this libmicrohttpd has no TLS: cannot serve the HTTP API over HTTPS");
    }
    flags |= MHD_USE_TLS;
  }
  // The HTTPS options are refused without MHD_USE_TLS, hence a list built to fit.
  std::vector<MHD_OptionItem> items = {
      // First, so that libmicrohttpd's messages about the other options come here too.
      {MHD_OPTION_EXTERNAL_LOGGER, reinterpret_cast<intptr_t>(&LogHttp), nullptr},
      {MHD_OPTION_SOCK_ADDR, 0, &addr},
      {MHD_OPTION_CONNECTION_LIMIT, options.connection_limit, nullptr},
      {MHD_OPTION_CONNECTION_TIMEOUT, options.idle_timeout_s, nullptr},
      {MHD_OPTION_NOTIFY_COMPLETED, reinterpret_cast<intptr_t>(&RequestCompleted),
       server->calls_.get()},
  };
  if (options.metrics != nullptr) {
    items.push_back({MHD_OPTION_NOTIFY_CONNECTION, reinterpret_cast<intptr_t>(&ConnectionChanged),
                     options.metrics->connections()});
  }
  if (tls) {
    items.push_back({MHD_OPTION_HTTPS_MEM_CERT, 0, const_cast<char*>(options.tls_cert_pem.c_str())});
    items.push_back({MHD_OPTION_HTTPS_MEM_KEY, 0, const_cast<char*>(options.tls_key_pem.c_str())});
  }
  items.push_back({MHD_OPTION_END, 0, nullptr});
  server->daemon_ = MHD_start_daemon(flags, static_cast<uint16_t>(options.port), nullptr, nullptr,
                                     &AccessHandler, server.get(), MHD_OPTION_ARRAY, items.data(),
                                     MHD_OPTION_END);
  if (server->daemon_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot listen for HTTP on ", options.host, ":",
                                               options.port, " (port in use?)"));
  }
  const MHD_DaemonInfo* info = MHD_get_daemon_info(server->daemon_, MHD_DAEMON_INFO_BIND_PORT);
  server->port_ = info != nullptr ? info->port : options.port;
  return server;
}

void OpenAiHttpServer::BeginDrain() { draining_ = true; }

bool OpenAiHttpServer::WaitIdle(absl::Duration timeout) { return calls_->WaitNoRequests(timeout); }

OpenAiHttpServer::~OpenAiHttpServer() {
  // Calls first: a connection thread blocked on one returns, and the daemon can join it.
  calls_->CancelAll();
  if (daemon_ != nullptr) MHD_stop_daemon(daemon_);
}

}  // namespace kvrm
