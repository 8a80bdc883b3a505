#include "metrics/http_server.h"

#include <microhttpd.h>
#include <netdb.h>
#include <sys/socket.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvrm {
namespace {

constexpr char kExpositionType[] = "text/plain; version=0.0.4; charset=utf-8";

MHD_Result Reply(MHD_Connection* connection, unsigned int code, const std::string& body,
                 const char* content_type) {
  MHD_Response* response = MHD_create_response_from_buffer(
      body.size(), const_cast<char*>(body.data()), MHD_RESPMEM_MUST_COPY);
  if (response == nullptr) return MHD_NO;
  MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
  MHD_add_response_header(response, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
  if (code == MHD_HTTP_METHOD_NOT_ALLOWED) {
    MHD_add_response_header(response, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
  }
  const MHD_Result r = MHD_queue_response(connection, code, response);
  MHD_destroy_response(response);
  return r;
}

MHD_Result AccessHandler(void* cls, MHD_Connection* connection, const char* url, const char* method,
                         const char* /*version*/, const char* /*upload_data*/,
                         size_t* /*upload_data_size*/, void** /*con_cls*/) {
  return static_cast<MHD_Result>(
      static_cast<MetricsHttpServer*>(cls)->Handle(connection, url, method));
}

}  // namespace

absl::Status ResolveListenAddress(const std::string& host, int port, const std::string& what,
                                  sockaddr_storage* addr, bool* ipv6) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const int gai = getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
  if (gai != 0 || found == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve ", what, " '", host, "': ", gai_strerror(gai)));
  }
  *addr = sockaddr_storage{};
  std::memcpy(addr, found->ai_addr, found->ai_addrlen);
  *ipv6 = found->ai_family == AF_INET6;
  freeaddrinfo(found);
  return absl::OkStatus();
}

int MetricsHttpServer::Handle(MHD_Connection* connection, const char* url, const char* method) {
  constexpr char kText[] = "text/plain; charset=utf-8";
  const bool get = std::strcmp(method, MHD_HTTP_METHOD_GET) == 0 ||
                   std::strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
  const std::string path = url;
  if (path != "/metrics" && path != "/healthz" && path != "/readyz") {
    return Reply(connection, MHD_HTTP_NOT_FOUND, "not found: try /metrics, /healthz, /readyz\n",
                 kText);
  }
  // Probes and scrapes never carry a body; refusing other methods at once means an upload is
  // never read.
  if (!get) return Reply(connection, MHD_HTTP_METHOD_NOT_ALLOWED, "method not allowed\n", kText);
  if (path == "/metrics") {
    return Reply(connection, MHD_HTTP_OK, registry_->Render(), kExpositionType);
  }
  if (path == "/healthz") return Reply(connection, MHD_HTTP_OK, "ok\n", kText);
  return ready() ? Reply(connection, MHD_HTTP_OK, "ready\n", kText)
                 : Reply(connection, MHD_HTTP_SERVICE_UNAVAILABLE, "not ready\n", kText);
}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const MetricRegistry* registry, const HttpServerOptions& options) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("metrics port ", options.port, " out of range"));
  }
  sockaddr_storage addr{};
  bool ipv6 = false;
  if (absl::Status s = ResolveListenAddress(options.host, options.port, "metrics host", &addr,
                                            &ipv6);
      !s.ok()) {
    return s;
  }

  std::unique_ptr<MetricsHttpServer> server(new MetricsHttpServer(registry));
  unsigned int flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ERROR_LOG;
  if (ipv6) flags |= MHD_USE_IPv6;
  server->daemon_ = MHD_start_daemon(
      flags, static_cast<uint16_t>(options.port), nullptr, nullptr, &AccessHandler, server.get(),
      MHD_OPTION_SOCK_ADDR, reinterpret_cast<sockaddr*>(&addr), MHD_OPTION_CONNECTION_LIMIT,
      static_cast<unsigned int>(options.connection_limit), MHD_OPTION_CONNECTION_TIMEOUT,
      static_cast<unsigned int>(options.connection_timeout_s), MHD_OPTION_END);
  if (server->daemon_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot listen for metrics on ", options.host, ":",
                                               options.port, " (port in use?)"));
  }
  const MHD_DaemonInfo* info = MHD_get_daemon_info(server->daemon_, MHD_DAEMON_INFO_BIND_PORT);
  server->port_ = info != nullptr ? info->port : options.port;
  return server;
}

MetricsHttpServer::~MetricsHttpServer() {
  if (daemon_ != nullptr) MHD_stop_daemon(daemon_);
}

}  // namespace kvrm
