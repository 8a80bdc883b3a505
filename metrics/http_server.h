// The plain-HTTP side of kvrmd: GET /metrics (Prometheus text exposition), /healthz (200 while
// the process is up) and /readyz (200 while serving, 503 before start and while draining), on
// libmicrohttpd with one internal polling thread.
//
// Threading: libmicrohttpd's thread renders the registry (taking its mutex) and reads `ready_`;
// SetReady may be called from any thread.
#ifndef KVRM_METRICS_HTTP_SERVER_H_
#define KVRM_METRICS_HTTP_SERVER_H_

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "metrics/registry.h"

struct MHD_Daemon;
struct MHD_Connection;
struct sockaddr_storage;

namespace kvrm {

// Resolves the address an HTTP listener binds (a numeric address or a name, and a port) for
// libmicrohttpd's MHD_OPTION_SOCK_ADDR; *ipv6 says whether it needs MHD_USE_IPv6.
// INVALID_ARGUMENT naming `what` (the flag) when the host does not resolve.
absl::Status ResolveListenAddress(const std::string& host, int port, const std::string& what,
                                  sockaddr_storage* addr, bool* ipv6);

struct HttpServerOptions {
  std::string host = "0.0.0.0";  // numeric IPv4/IPv6 address or a resolvable name
  int port = 9400;               // 0 picks a free port (see MetricsHttpServer::port)
  int connection_limit = 64;
  int connection_timeout_s = 10;
};

class MetricsHttpServer {
 public:
  // Binds and starts serving. `registry` must outlive the server. Starts not ready.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const MetricRegistry* registry,
                                                                  const HttpServerOptions& options);
  ~MetricsHttpServer();  // stops the daemon: no handler runs after it returns
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  int port() const { return port_; }
  void SetReady(bool ready) { ready_.store(ready, std::memory_order_relaxed); }
  bool ready() const { return ready_.load(std::memory_order_relaxed); }

  // The libmicrohttpd access handler (public only for the C callback's trampoline).
  int Handle(MHD_Connection* connection, const char* url, const char* method);

 private:
  explicit MetricsHttpServer(const MetricRegistry* registry) : registry_(registry) {}

  const MetricRegistry* registry_;
  MHD_Daemon* daemon_ = nullptr;
  int port_ = 0;
  std::atomic<bool> ready_{false};
};

}  // namespace kvrm

#endif  // KVRM_METRICS_HTTP_SERVER_H_
