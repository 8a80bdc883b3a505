#include "server/kvrm_server.h"

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"

namespace kvrm {
namespace {

constexpr char kServiceName[] = "kvrm.v1.Kvrm";

}  // namespace

absl::StatusOr<std::unique_ptr<KvrmServer>> KvrmServer::Start(Engine* engine,
                                                              const ServerOptions& options) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  auto server = std::unique_ptr<KvrmServer>(new KvrmServer());
  server->engine_ = engine;
  server->service_ = std::make_unique<KvrmService>(engine, options.info);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, grpc::InsecureServerCredentials(), &server->port_);
  builder.RegisterService(server->service_.get());
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, options.max_concurrent_streams);
  server->server_ = builder.BuildAndStart();
  if (!server->server_ || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen));
  }
  grpc::HealthCheckServiceInterface* health = server->server_->GetHealthCheckService();
  health->SetServingStatus(true);
  health->SetServingStatus(kServiceName, true);
  return server;
}

KvrmServer::~KvrmServer() {
  if (server_) server_->Shutdown(std::chrono::system_clock::now());
}

bool KvrmServer::Drain(absl::Duration grace) {
  LOG(INFO) << "draining: NOT_SERVING, refusing new requests, grace " << grace;
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  health->SetServingStatus(kServiceName, false);
  health->SetServingStatus(false);
  service_->SetDraining();
  engine_->BeginDrain();
  bool clean = engine_->WaitIdle(grace);
  if (!clean) {
    LOG(WARNING) << "grace period over: cancelling in-flight requests";
    engine_->CancelAll();
    engine_->WaitIdle(absl::Seconds(5));
  }
  // Streams have their final messages queued; give them a moment to flush, then close.
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  LOG(INFO) << "drained " << (clean ? "cleanly" : "after cancelling stragglers");
  return clean;
}

}  // namespace kvrm
