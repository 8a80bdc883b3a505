#include "server/openai_http.h"

#include <microhttpd.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "grpcpp/client_context.h"
#include "metrics/http_server.h"

namespace kvrm {

class ActiveCalls {
 public:
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

 private:
  std::mutex mu_;  // a pthread mutex: ThreadSanitizer sees it (Debian's Abseil is not instrumented)
  std::set<grpc::ClientContext*> calls_;
  bool stopping_ = false;
};

namespace {

constexpr char kJson[] = "application/json";

// The body of a request being uploaded; libmicrohttpd keeps it in the connection's slot from the
// first call of the access handler to the last.
struct Upload {
  std::string body;
  bool too_large = false;
};

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
                      const std::string& message) {
  OpenAiError e;
  e.http_status = http_status;
  e.type = type;
  e.message = message;
  return ReplyError(connection, e);
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

const char* Header(MHD_Connection* connection, const char* name) {
  return MHD_lookup_connection_value(connection, MHD_HEADER_KIND, name);
}

std::string RandomHex() {
  thread_local absl::BitGen gen;
  return absl::StrFormat("%016x%016x", absl::Uniform<uint64_t>(gen),
                         absl::Uniform<uint64_t>(gen));
}

// One streamed reply: the call, and what is left to write of the events so far. Owned by the
// libmicrohttpd response (freed by FreeStream when the response is done or the client gone).
struct Stream {
  ~Stream() {
    if (registered) calls->Remove(context.get());
  }
  ActiveCalls* calls = nullptr;
  bool registered = false;
  OpenAiRequest request;
  std::unique_ptr<grpc::ClientContext> context;
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader;
  std::unique_ptr<OpenAiReply> reply;
  std::string pending;  // events not yet handed to libmicrohttpd
  size_t sent = 0;      // bytes of `pending` handed over
  bool ended = false;   // the call finished and its last events are in `pending`
};

// Refills `s->pending` with the next events, blocking on the call (this connection's thread).
void NextEvents(Stream* s) {
  s->pending.clear();
  s->sent = 0;
  v1::GenerateResponse message;
  while (s->pending.empty() && !s->ended) {
    if (s->reader->Read(&message)) {
      s->pending = s->reply->StreamMessage(message);
      continue;
    }
    const grpc::Status status = s->reader->Finish();
    if (!status.ok()) {
      s->pending = OpenAiReply::StreamError(
          ToOpenAiError(FromGrpc(status), &s->request, RetryAfterMs(*s->context)));
    } else if (!s->reply->engine_error().empty()) {
      OpenAiError e;
      e.message = s->reply->engine_error();
      e.type = "server_error";
      s->pending = OpenAiReply::StreamError(e);
    }
    s->pending += s->reply->StreamEnd();
    s->ended = true;
  }
}

ssize_t ReadStream(void* cls, uint64_t /*pos*/, char* buf, size_t max) {
  auto* s = static_cast<Stream*>(cls);
  if (s->sent == s->pending.size()) {
    if (s->ended) return MHD_CONTENT_READER_END_OF_STREAM;
    NextEvents(s);
    if (s->pending.empty()) return MHD_CONTENT_READER_END_OF_STREAM;
  }
  const size_t n = std::min(max, s->pending.size() - s->sent);
  std::memcpy(buf, s->pending.data() + s->sent, n);
  s->sent += n;
  return static_cast<ssize_t>(n);
}

void FreeStream(void* cls) {
  auto* s = static_cast<Stream*>(cls);
  if (!s->ended) {
    // The client went away (or the server is stopping): cancel, and let the call end.
    s->context->TryCancel();
    v1::GenerateResponse ignored;
    while (s->reader->Read(&ignored)) {
    }
    s->reader->Finish();
  }
  delete s;
}

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

void RequestCompleted(void* /*cls*/, MHD_Connection* /*connection*/, void** state,
                      MHD_RequestTerminationCode /*code*/) {
  delete static_cast<Upload*>(*state);
  *state = nullptr;
}

}  // namespace

OpenAiHttpServer::OpenAiHttpServer(std::shared_ptr<grpc::Channel> channel,
                                   OpenAiHttpOptions options)
    : channel_(std::move(channel)),
      stub_(v1::Kvrm::NewStub(channel_)),
      options_(std::move(options)),
      created_(absl::ToUnixSeconds(absl::Now())),
      calls_(std::make_unique<ActiveCalls>()) {}

int OpenAiHttpServer::Handle(MHD_Connection* connection, const char* url, const char* method,
                             const char* upload_data, size_t* upload_data_size, void** state) {
  if (*state == nullptr) {  // the headers are in: the body (if any) comes in the next calls
    *state = new Upload();
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
  if (path == "/health") {
    if (!get) return ReplyError(connection, 405, "invalid_request_error", "use GET");
    return Queue(connection, MHD_HTTP_OK, Buffer("", "text/plain"));
  }
  if (path == "/v1/models" || absl::StartsWith(path, "/v1/models/")) {
    if (!get) return ReplyError(connection, 405, "invalid_request_error", "use GET");
    return Models(connection, path);
  }
  OpenAiEndpoint endpoint;
  if (path == "/v1/completions") {
    endpoint = OpenAiEndpoint::kCompletions;
  } else if (path == "/v1/chat/completions") {
    endpoint = OpenAiEndpoint::kChatCompletions;
  } else {
    return ReplyError(connection, 404, "not_found_error",
                      absl::StrCat("no route ", path, ": try /v1/chat/completions, "
                                   "/v1/completions, /v1/models"));
  }
  if (!post) return ReplyError(connection, 405, "invalid_request_error", "use POST");
  if (upload->too_large) {
    return ReplyError(connection, 413, "invalid_request_error",
                      absl::StrCat("request body larger than ", options_.max_body_bytes,
                                   " bytes"));
  }
  return Generate(connection, endpoint, upload->body);
}

int OpenAiHttpServer::Models(MHD_Connection* connection, const std::string& path) {
  // Through the service, so that a token check applies here as to the rest of the API.
  grpc::ClientContext context;
  if (const char* auth = Header(connection, MHD_HTTP_HEADER_AUTHORIZATION)) {
    context.AddMetadata("authorization", auth);
  }
  v1::ModelInfo info;
  const grpc::Status status = stub_->GetModelInfo(&context, v1::GetModelInfoRequest(), &info);
  if (!status.ok()) return ReplyError(connection, ToOpenAiError(FromGrpc(status), nullptr));
  OrderedJson model;
  model["id"] = options_.served_model_name;
  model["object"] = "model";
  model["created"] = created_;
  model["owned_by"] = "kvrm";
  model["root"] = info.name();
  model["max_model_len"] = info.max_context();
  if (path != "/v1/models") {
    const std::string id = path.substr(std::strlen("/v1/models/"));
    if (id != options_.served_model_name) {
      return ReplyError(connection, 404, "not_found_error",
                        absl::StrCat("The model `", id, "` does not exist."));
    }
    return Queue(connection, MHD_HTTP_OK, Buffer(model.dump(), kJson));
  }
  OrderedJson list;
  list["object"] = "list";
  list["data"] = OrderedJson::array({std::move(model)});
  return Queue(connection, MHD_HTTP_OK, Buffer(list.dump(), kJson));
}

int OpenAiHttpServer::Generate(MHD_Connection* connection, OpenAiEndpoint endpoint,
                               const std::string& body) {
  absl::StatusOr<OpenAiRequest> parsed = ParseOpenAiRequest(endpoint, body, options_.defaults);
  if (!parsed.ok()) return ReplyError(connection, ToOpenAiError(parsed.status(), nullptr));
  auto stream = std::make_unique<Stream>();
  stream->request = std::move(*parsed);
  OpenAiRequest& request = stream->request;
  if (!request.model.empty() && request.model != options_.served_model_name) {
    OpenAiError e;
    e.http_status = 404;
    e.type = "not_found_error";
    e.param = "model";
    e.message = absl::StrCat("The model `", request.model, "` does not exist (this server serves `",
                             options_.served_model_name, "`).");
    return ReplyError(connection, e);
  }
  const bool chat = endpoint == OpenAiEndpoint::kChatCompletions;
  v1::GenerateRequest& generate = request.generate;
  if (generate.request_id().empty()) {
    if (const char* header = Header(connection, "X-Request-Id"); header != nullptr && *header) {
      generate.set_request_id(header);  // validated by the service like any request_id
    } else {
      generate.set_request_id(absl::StrCat(chat ? "chatcmpl-" : "cmpl-", RandomHex()));
    }
  }
  const std::string& id = generate.request_id();
  std::string prompt_text;
  if (request.echo) {
    prompt_text = generate.has_token_ids() && options_.tokenizer != nullptr
                      ? options_.tokenizer->Decode(generate.token_ids().ids(), false)
                      : generate.text();
  }
  stream->reply = std::make_unique<OpenAiReply>(
      request, options_.tokenizer, id, absl::ToUnixSeconds(absl::Now()),
      request.model.empty() ? options_.served_model_name : request.model, prompt_text);
  stream->context = std::make_unique<grpc::ClientContext>();
  if (const char* auth = Header(connection, MHD_HTTP_HEADER_AUTHORIZATION)) {
    stream->context->AddMetadata("authorization", auth);
  }
  stream->calls = calls_.get();
  if (!calls_->Add(stream->context.get())) {
    return ReplyError(connection, 503, "service_unavailable", "the server is stopping");
  }
  stream->registered = true;
  stream->reader = stub_->Generate(stream->context.get(), generate);

  // The first message decides the status: refusals (bad values, a full queue, a draining
  // server) come before any output.
  v1::GenerateResponse first;
  if (!stream->reader->Read(&first)) {
    const grpc::Status status = stream->reader->Finish();
    stream->ended = true;
    absl::Status st = FromGrpc(status);
    if (st.ok()) st = absl::InternalError("the stream ended without a message");
    return ReplyError(connection,
                      ToOpenAiError(st, &request, RetryAfterMs(*stream->context)));
  }
  if (!request.stream) {
    OpenAiReply& reply = *stream->reply;
    reply.Add(first);
    v1::GenerateResponse message;
    while (stream->reader->Read(&message)) reply.Add(message);
    const grpc::Status status = stream->reader->Finish();
    stream->ended = true;
    if (!status.ok()) {
      return ReplyError(connection,
                        ToOpenAiError(FromGrpc(status), &request, RetryAfterMs(*stream->context)));
    }
    if (!reply.engine_error().empty()) {
      return ReplyError(connection, 500, "server_error", reply.engine_error());
    }
    MHD_Response* response = Buffer(reply.Body(), kJson);
    if (response != nullptr) MHD_add_response_header(response, "X-Request-Id", id.c_str());
    return Queue(connection, MHD_HTTP_OK, response);
  }
  stream->pending = stream->reply->StreamStart() + stream->reply->StreamMessage(first);
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
      {MHD_OPTION_SOCK_ADDR, 0, &addr},
      {MHD_OPTION_CONNECTION_LIMIT, options.connection_limit, nullptr},
      {MHD_OPTION_CONNECTION_TIMEOUT, options.idle_timeout_s, nullptr},
      {MHD_OPTION_NOTIFY_COMPLETED, reinterpret_cast<intptr_t>(&RequestCompleted), nullptr},
      {MHD_OPTION_EXTERNAL_LOGGER, reinterpret_cast<intptr_t>(&LogHttp), nullptr},
  };
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

OpenAiHttpServer::~OpenAiHttpServer() {
  // Calls first: a connection thread blocked on one returns, and the daemon can join it.
  calls_->CancelAll();
  if (daemon_ != nullptr) MHD_stop_daemon(daemon_);
}

}  // namespace kvrm
