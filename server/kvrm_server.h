// kvrmd's gRPC server: the kvrm.v1 service, grpc.health.v1 and server reflection, over an
// engine; and the drain sequence SIGTERM runs.
//
// Transport security (docs/security.md): TLS when tls_cert/tls_key are set, mutual TLS (client
// certificates required and verified) when tls_client_ca is set too; bearer tokens for the
// kvrm.v1.Kvrm methods when auth_tokens_file is set. Health and reflection stay open.
#ifndef KVRM_SERVER_KVRM_SERVER_H_
#define KVRM_SERVER_KVRM_SERVER_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/server.h"
#include "runtime/engine.h"
#include "server/auth.h"
#include "server/kvrm_service.h"

namespace kvrm {

struct ServerOptions {
  std::string listen = "0.0.0.0:50051";  // port 0 picks a free port (see KvrmServer::port)
  int32_t max_message_bytes = 4 << 20;
  int32_t max_concurrent_streams = 1024;  // per HTTP/2 connection
  // After this long a connection gets a GOAWAY: the streams on it finish, new calls open a new
  // connection, and a client's DNS resolution (the headless Service's pod list) is redone, so
  // that pods added later receive traffic from clients connected before. 0: never.
  int32_t max_connection_age_s = 0;
  // PEM files, read once by Start(). Empty: plaintext. The field names are kvrmd's flag names,
  // and errors name them with the path ("--tls_cert=/x: ...").
  std::string tls_cert;       // server certificate chain (needs tls_key)
  std::string tls_key;        // its private key
  std::string tls_client_ca;  // CA bundle that client certificates must chain to (needs TLS)
  std::string auth_tokens_file;  // one bearer token per line; empty: no token check
  ServiceInfo info;
  // Counts output chunks merged into a queued message for clients reading slower than their
  // tokens come (kvrm:stream_chunks_merged_total); not owned, may be null.
  Counter* merged_chunks_counter = nullptr;
  // Structured-output requests and compiles (kvrm:structured_output_*); not owned, may be null.
  const StructuredOutputMetrics* structured_metrics = nullptr;
  // Tool-calling requests, calls and parse failures (kvrm:tool_call*); not owned, may be null.
  const ToolCallMetrics* tool_call_metrics = nullptr;
  // LoadLoraAdapter / UnloadLoraAdapter allowed (kvrmd --allow_runtime_lora_updating).
  bool runtime_lora_updating = false;
  // ResetPrefixCache allowed (kvrmd --allow_prefix_cache_reset).
  bool prefix_cache_reset = false;
  // On-demand LoRA adapters' directory (kvrmd --lora_dir; KvrmService::SetLoraDirectory).
  std::string lora_dir;
  // Spans of Generate calls (kvrmd --otlp_traces_endpoint); not owned, must outlive the server;
  // null: none.
  Tracer* tracer = nullptr;
};

class KvrmServer {
 public:
  // Reads the TLS and token files, binds and starts serving; health reports SERVING once this
  // returns. INVALID_ARGUMENT naming the option and path for a missing or malformed file.
  static absl::StatusOr<std::unique_ptr<KvrmServer>> Start(Engine* engine,
                                                           const ServerOptions& options);
  ~KvrmServer();

  int port() const { return port_; }

  // Health flips to NOT_SERVING at once and new Generate calls get UNAVAILABLE; in-flight
  // requests get `grace` to finish, then are cancelled; then `before_shutdown` runs (kvrmd's
  // HTTP API reads its calls' last messages there), then the server shuts down.
  // Returns true when everything finished within the grace period.
  bool Drain(absl::Duration grace, const std::function<void()>& before_shutdown = nullptr);

  void Wait() { server_->Wait(); }

  // A channel to this server's services that bypasses the network (the HTTP API's): calls on it
  // are admitted, authenticated and drained as any other. No message size limit.
  std::shared_ptr<grpc::Channel> InProcessChannel();

 private:
  KvrmServer() = default;

  Engine* engine_ = nullptr;
  std::unique_ptr<TokenAuthenticator> auth_;  // outlives service_ (declared first)
  std::unique_ptr<KvrmService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace kvrm

#endif  // KVRM_SERVER_KVRM_SERVER_H_
