#include "server/kvrm_server.h"

#include <algorithm>
#include <limits>

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/json.h"
#include "common/logging.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"

namespace kvrm {
namespace {

constexpr char kServiceName[] = "kvrm.v1.Kvrm";

// "--flag=path: why"; `why` from a file helper often starts with the path (and a line) already.
absl::Status BadFile(absl::string_view flag, const std::string& path, absl::string_view why) {
  if (absl::StartsWith(why, path)) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", why));
  }
  return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", path, ": ", why));
}

// Reads a PEM file named by `flag`; errors name the flag and the path.
absl::StatusOr<std::string> ReadPem(absl::string_view flag, const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) return BadFile(flag, path, text.status().message());
  if (text->empty()) return BadFile(flag, path, "empty file");
  return text;
}

// Counts the X.509 certificates in a PEM bundle (0 when the first one does not parse).
int CountCertificates(const std::string& pem) {
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  int n = 0;
  while (X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr)) {
    X509_free(cert);
    ++n;
  }
  BIO_free(bio);
  return n;
}

// gRPC only logs a malformed certificate or key when the port is bound, so check them here
// where the error can name the file: the chain parses, the key parses and belongs to it.
absl::Status CheckCertificateAndKey(const ServerOptions& o, const std::string& cert_pem,
                                    const std::string& key_pem) {
  BIO* cert_bio = BIO_new_mem_buf(cert_pem.data(), static_cast<int>(cert_pem.size()));
  X509* cert = PEM_read_bio_X509(cert_bio, nullptr, nullptr, nullptr);
  BIO_free(cert_bio);
  if (cert == nullptr) return BadFile("tls_cert", o.tls_cert, "no PEM certificate");
  BIO* key_bio = BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size()));
  EVP_PKEY* key = PEM_read_bio_PrivateKey(key_bio, nullptr, nullptr, nullptr);
  BIO_free(key_bio);
  absl::Status status;
  if (key == nullptr) {
    status = BadFile("tls_key", o.tls_key, "no PEM private key (or it is encrypted)");
  } else if (X509_check_private_key(cert, key) != 1) {
    status = BadFile("tls_key", o.tls_key,
                     absl::StrCat("does not match the certificate in --tls_cert=", o.tls_cert));
  }
  EVP_PKEY_free(key);
  X509_free(cert);
  return status;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeCredentials(
    const ServerOptions& o) {
  if (o.tls_cert.empty() != o.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key must be given together");
  }
  if (o.tls_cert.empty()) {
    if (!o.tls_client_ca.empty()) {
      return absl::InvalidArgumentError("--tls_client_ca needs --tls_cert and --tls_key");
    }
    return grpc::InsecureServerCredentials();
  }
  absl::StatusOr<std::string> cert = ReadPem("tls_cert", o.tls_cert);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem("tls_key", o.tls_key);
  if (!key.ok()) return key.status();
  if (absl::Status s = CheckCertificateAndKey(o, *cert, *key); !s.ok()) return s;
  grpc::SslServerCredentialsOptions ssl;
  ssl.pem_key_cert_pairs.push_back({*key, *cert});
  if (!o.tls_client_ca.empty()) {
    absl::StatusOr<std::string> ca = ReadPem("tls_client_ca", o.tls_client_ca);
    if (!ca.ok()) return ca.status();
    if (CountCertificates(*ca) == 0) {
      return BadFile("tls_client_ca", o.tls_client_ca, "no PEM certificate");
    }
    ssl.pem_root_certs = *ca;
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

}  // namespace

absl::StatusOr<std::unique_ptr<KvrmServer>> KvrmServer::Start(Engine* engine,
                                                              const ServerOptions& options) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  auto server = std::unique_ptr<KvrmServer>(new KvrmServer());
  server->engine_ = engine;
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials = MakeCredentials(options);
  if (!credentials.ok()) return credentials.status();
  server->service_ = std::make_unique<KvrmService>(engine, options.info);
  server->service_->SetMergedChunksCounter(options.merged_chunks_counter);
  server->service_->SetStructuredOutputMetrics(options.structured_metrics);
  server->service_->SetToolCallMetrics(options.tool_call_metrics);
  server->service_->SetTracer(options.tracer);
  server->service_->SetRuntimeLoraUpdating(options.runtime_lora_updating);
  server->service_->SetPrefixCacheReset(options.prefix_cache_reset);
  server->service_->SetLoraDirectory(options.lora_dir);
  // Output merged for a slow reader stays far below the send limit.
  server->service_->SetMaxMergedMessageBytes(
      std::min<size_t>(64 << 10, std::max(options.max_message_bytes, 4) / 4));
  if (!options.auth_tokens_file.empty()) {
    absl::StatusOr<std::unique_ptr<TokenAuthenticator>> auth =
        TokenAuthenticator::FromFile(options.auth_tokens_file);
    if (!auth.ok()) {
      return BadFile("auth_tokens_file", options.auth_tokens_file, auth.status().message());
    }
    server->auth_ = std::move(*auth);
    server->service_->SetAuthenticator(server->auth_.get());
  }
  if (options.max_message_bytes <= 0 || options.max_concurrent_streams <= 0) {
    return absl::InvalidArgumentError(
        "--max_message_bytes and --max_concurrent_streams must be positive");
  }
  // gRPC takes milliseconds in an int: at most 2147483 s (24.8 days).
  constexpr int32_t kMaxAgeS = std::numeric_limits<int32_t>::max() / 1000;
  if (options.max_connection_age_s < 0 || options.max_connection_age_s > kMaxAgeS) {
    return absl::InvalidArgumentError(
        absl::StrCat("--grpc_max_connection_age_s must be in [0, ", kMaxAgeS, "]"));
  }
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, *credentials, &server->port_);
  builder.RegisterService(server->service_.get());
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, options.max_concurrent_streams);
  if (options.max_connection_age_s > 0) {
    // gRPC adds +-10% jitter, so that clients connected together do not all reconnect together.
    // The grace after the GOAWAY stays unlimited: a long generation is never cut by it.
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS, options.max_connection_age_s * 1000);
  }
  server->server_ = builder.BuildAndStart();
  if (!server->server_ || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen));
  }
  grpc::HealthCheckServiceInterface* health = server->server_->GetHealthCheckService();
  health->SetServingStatus(true);
  health->SetServingStatus(kServiceName, true);
  LOG(INFO) << "gRPC on port " << server->port_ << ": "
            << (options.tls_cert.empty()        ? "plaintext"
                : options.tls_client_ca.empty() ? "TLS"
                                                : "mutual TLS")
            << (server->auth_ ? absl::StrCat(", bearer tokens (", server->auth_->num_tokens(), ")")
                              : std::string(", no token check"))
            << ", max message " << options.max_message_bytes << " B, max "
            << options.max_concurrent_streams << " streams per connection";
  return server;
}

std::shared_ptr<grpc::Channel> KvrmServer::InProcessChannel() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  return server_->InProcessChannel(args);
}

KvrmServer::~KvrmServer() {
  if (server_) server_->Shutdown(std::chrono::system_clock::now());
}

bool KvrmServer::Drain(absl::Duration grace, const std::function<void()>& before_shutdown) {
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
  if (before_shutdown) before_shutdown();
  // Streams have their final messages queued; give them a moment to flush, then close.
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  // Every call is done, but a client may not have read its last frames (the status) yet: a
  // process that exits now closes sockets with the client's own frames unread, which resets
  // them and can discard what the client had not read ("Broken pipe" instead of OK on a
  // stream that got all its tokens). A moment keeps them open.
  absl::SleepFor(absl::Milliseconds(500));
  LOG(INFO) << "drained " << (clean ? "cleanly" : "after cancelling stragglers");
  return clean;
}

}  // namespace kvrm
