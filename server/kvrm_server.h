// kvrmd's gRPC server: the kvrm.v1 service, grpc.health.v1 and server reflection, over an
// engine; and the drain sequence SIGTERM runs.
#ifndef KVRM_SERVER_KVRM_SERVER_H_
#define KVRM_SERVER_KVRM_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/server.h"
#include "runtime/engine.h"
#include "server/kvrm_service.h"

namespace kvrm {

struct ServerOptions {
  std::string listen = "0.0.0.0:50051";  // port 0 picks a free port (see KvrmServer::port)
  int32_t max_message_bytes = 4 << 20;
  int32_t max_concurrent_streams = 1024;
  ServiceInfo info;
};

class KvrmServer {
 public:
  // Binds and starts serving; health reports SERVING once this returns.
  static absl::StatusOr<std::unique_ptr<KvrmServer>> Start(Engine* engine,
                                                           const ServerOptions& options);
  ~KvrmServer();

  int port() const { return port_; }

  // Health flips to NOT_SERVING at once and new Generate calls get UNAVAILABLE; in-flight
  // requests get `grace` to finish, then are cancelled; then the server shuts down.
  // Returns true when everything finished within the grace period.
  bool Drain(absl::Duration grace);

  void Wait() { server_->Wait(); }

 private:
  KvrmServer() = default;

  Engine* engine_ = nullptr;
  std::unique_ptr<KvrmService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace kvrm

#endif  // KVRM_SERVER_KVRM_SERVER_H_
