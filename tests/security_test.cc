// Transport security end to end on a loopback port: TLS, mutual TLS and bearer tokens, with
// certificates made by this test (openssl), plus the gRPC message-size and concurrent-stream
// limits and start-up errors for bad files. See docs/security.md.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "runtime/engine.h"
#include "runtime/model_bundle.h"
#include "server/kvrm_server.h"
#include "tests/test_server.h"

namespace kvrm {
namespace {

constexpr char kOpenssl[] = "/usr/bin/openssl";

std::string TmpDir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return std::string(tmp ? tmp : "/tmp") + "/kvrm-security";
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFile(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// PEM material made once per test binary: two unrelated CAs; a server certificate for
// 127.0.0.1/localhost and a client certificate signed by the first; a client certificate signed
// by the second.
struct Pki {
  std::string dir;
  std::string ca, other_ca;                         // paths
  std::string server_cert, server_key;              // paths
  std::string client_cert, client_key;              // PEM text (for the client)
  std::string other_client_cert, other_client_key;  // PEM text
  std::string ca_pem, other_ca_pem;                 // PEM text
};

void Run(const std::string& cmd) {
  const std::string full = absl::StrCat("cd ", TmpDir(), " && ", cmd, " >>openssl.log 2>&1");
  CHECK(std::system(full.c_str()) == 0)
      << "failed: " << cmd << "\n" << ReadAll(TmpDir() + "/openssl.log");
}

Pki MakePki() {
  Pki p;
  p.dir = TmpDir();
  CHECK(std::system(("mkdir -p " + p.dir).c_str()) == 0);
  WriteFile(p.dir + "/openssl.cnf",
            "[req]\ndistinguished_name=dn\n[dn]\n"
            "[ca]\nbasicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\n"
            "subjectKeyIdentifier=hash\n"
            "[server]\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n"
            "[client]\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\n"
            "extendedKeyUsage=clientAuth\n");
  const std::string o = kOpenssl;
  const std::string ec = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  for (const char* ca : {"ca", "other_ca"}) {
    Run(absl::StrCat(o, " req -x509 -config openssl.cnf -extensions ca", ec, " -keyout ", ca,
                     ".key -out ", ca, ".pem -days 2 -subj /CN=kvrm-test-", ca));
  }
  auto leaf = [&](const std::string& name, const std::string& ca, const std::string& ext) {
    Run(absl::StrCat(o, " req -new -config openssl.cnf", ec, " -keyout ", name, ".key -out ",
                     name, ".csr -subj /CN=", name));
    Run(absl::StrCat(o, " x509 -req -in ", name, ".csr -CA ", ca, ".pem -CAkey ", ca,
                     ".key -CAcreateserial -days 2 -extfile openssl.cnf -extensions ", ext,
                     " -out ", name, ".pem"));
  };
  leaf("server", "ca", "server");
  leaf("client", "ca", "client");
  leaf("other_client", "other_ca", "client");
  p.ca = p.dir + "/ca.pem";
  p.other_ca = p.dir + "/other_ca.pem";
  p.server_cert = p.dir + "/server.pem";
  p.server_key = p.dir + "/server.key";
  p.ca_pem = ReadAll(p.ca);
  p.other_ca_pem = ReadAll(p.other_ca);
  p.client_cert = ReadAll(p.dir + "/client.pem");
  p.client_key = ReadAll(p.dir + "/client.key");
  p.other_client_cert = ReadAll(p.dir + "/other_client.pem");
  p.other_client_key = ReadAll(p.dir + "/other_client.key");
  return p;
}

class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_EQ(access(kOpenssl, X_OK), 0) << kOpenssl << " is needed to make test certificates";
    pki_ = new Pki(MakePki());
    absl::StatusOr<std::unique_ptr<ModelBundle>> model = ModelBundle::Load(TinyModelDir());
    CHECK_OK(model.status());
    model_ = model->release();
    EngineOptions eo;
    eo.slots = 2;
    eo.max_new_tokens = 16;
    eo.prefill_chunk = 32;
    eo.threads = 2;
    absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(model_, eo);
    CHECK_OK(engine.status());
    engine_ = engine->release();
    engine_->Start();
  }
  static void TearDownTestSuite() {
    delete engine_;
    delete model_;
    delete pki_;
  }

  // Starts a server on a free loopback port with `o` (listen and info filled in here).
  std::unique_ptr<KvrmServer> Start(ServerOptions o) {
    o.listen = "127.0.0.1:0";
    o.info.version = "test";
    absl::StatusOr<std::unique_ptr<KvrmServer>> server = KvrmServer::Start(engine_, o);
    CHECK_OK(server.status());
    return std::move(*server);
  }

  static std::unique_ptr<v1::Kvrm::Stub> Connect(
      int port, std::shared_ptr<grpc::ChannelCredentials> creds) {
    return v1::Kvrm::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), std::move(creds)));
  }

  static std::shared_ptr<grpc::ChannelCredentials> Tls(const std::string& root,
                                                       const std::string& cert = "",
                                                       const std::string& key = "") {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = root;
    o.pem_cert_chain = cert;
    o.pem_private_key = key;
    return grpc::SslCredentials(o);
  }

  // One GetModelInfo call (a unary RPC of kvrm.v1.Kvrm); `token` empty sends no metadata.
  static grpc::Status Call(v1::Kvrm::Stub& stub, const std::string& token = "") {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
    v1::ModelInfo info;
    grpc::Status s = stub.GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info);
    if (s.ok()) EXPECT_GT(info.vocab_size(), 0);
    return s;
  }

  static Pki* pki_;
  static ModelBundle* model_;
  static Engine* engine_;
};
Pki* SecurityTest::pki_ = nullptr;
ModelBundle* SecurityTest::model_ = nullptr;
Engine* SecurityTest::engine_ = nullptr;

ServerOptions TlsOptions(const Pki& p) {
  ServerOptions o;
  o.tls_cert = p.server_cert;
  o.tls_key = p.server_key;
  return o;
}

TEST_F(SecurityTest, TlsWorksWithTheRightCaAndFailsWithTheWrongOne) {
  std::unique_ptr<KvrmServer> server = Start(TlsOptions(*pki_));
  auto good = Connect(server->port(), Tls(pki_->ca_pem));
  EXPECT_TRUE(Call(*good).ok()) << Call(*good).error_message();
  StreamResult r = RunGenerate(*good, TextRequest("Hello over TLS", 4));
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_FALSE(r.tokens.empty());
  // Trusting another CA: the server's certificate does not verify.
  auto wrong_ca = Connect(server->port(), Tls(pki_->other_ca_pem));
  EXPECT_EQ(Call(*wrong_ca).error_code(), grpc::StatusCode::UNAVAILABLE);
  // A plaintext client cannot talk to the TLS port.
  auto plain = Connect(server->port(), grpc::InsecureChannelCredentials());
  EXPECT_EQ(Call(*plain).error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(SecurityTest, MutualTlsRequiresAClientCertificateFromTheConfiguredCa) {
  ServerOptions o = TlsOptions(*pki_);
  o.tls_client_ca = pki_->ca;
  std::unique_ptr<KvrmServer> server = Start(o);
  auto no_cert = Connect(server->port(), Tls(pki_->ca_pem));
  EXPECT_EQ(Call(*no_cert).error_code(), grpc::StatusCode::UNAVAILABLE);
  auto wrong_ca_cert = Connect(server->port(), Tls(pki_->ca_pem, pki_->other_client_cert,
                                                   pki_->other_client_key));
  EXPECT_EQ(Call(*wrong_ca_cert).error_code(), grpc::StatusCode::UNAVAILABLE);
  auto good = Connect(server->port(), Tls(pki_->ca_pem, pki_->client_cert, pki_->client_key));
  grpc::Status s = Call(*good);
  EXPECT_TRUE(s.ok()) << s.error_code() << " " << s.error_message();
}

// grpc.health.v1.Health/Check with an empty request ("" = the whole server) as raw bytes, so
// the test needs no generated health stubs; returns the serialized HealthCheckResponse.
grpc::Status HealthCheck(const std::shared_ptr<grpc::Channel>& channel, std::string* out) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::CompletionQueue cq;
  grpc::ByteBuffer request, response;
  grpc::Slice empty("");
  request = grpc::ByteBuffer(&empty, 1);
  auto call = stub.PrepareUnaryCall(&ctx, "/grpc.health.v1.Health/Check", request, &cq);
  call->StartCall();
  grpc::Status status;
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  CHECK(cq.Next(&tag, &ok));
  std::vector<grpc::Slice> slices;
  if (status.ok()) {
    CHECK(response.Dump(&slices).ok());
    for (const grpc::Slice& s : slices) {
      out->append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
  }
  cq.Shutdown();
  return status;
}

TEST_F(SecurityTest, BearerTokensGuardTheServiceButNotHealth) {
  const std::string tokens = pki_->dir + "/tokens.txt";
  WriteFile(tokens, "# test tokens\nfirst-token\n\nsecond-token\n");
  ServerOptions o;
  o.auth_tokens_file = tokens;
  std::unique_ptr<KvrmServer> server = Start(o);
  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server->port()),
                                     grpc::InsecureChannelCredentials());
  auto stub = v1::Kvrm::NewStub(channel);
  EXPECT_EQ(Call(*stub).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Call(*stub, "third-token").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Call(*stub, "first-toke").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(Call(*stub, "first-token").ok());
  EXPECT_TRUE(Call(*stub, "second-token").ok());
  // Every method checks, the streaming one included.
  StreamResult denied = RunGenerate(*stub, TextRequest("no token", 4));
  EXPECT_EQ(denied.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(denied.tokens.empty());
  {
    grpc::ClientContext ctx;
    v1::TokenizeRequest req;
    req.set_text("hi");
    v1::TokenizeResponse resp;
    EXPECT_EQ(stub->Tokenize(&ctx, req, &resp).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    grpc::ClientContext ctx;
    v1::ServerInfo resp;
    EXPECT_EQ(stub->GetServerInfo(&ctx, v1::GetServerInfoRequest(), &resp).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer second-token");
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    v1::GenerateRequest req = TextRequest("with a token", 4);
    auto reader = stub->Generate(&ctx, req);
    v1::GenerateResponse msg;
    int messages = 0;
    while (reader->Read(&msg)) ++messages;
    grpc::Status s = reader->Finish();
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_GT(messages, 0);
  }
  // Health stays open without a token: SERVING is field 1 = 1 (bytes 08 01).
  std::string health;
  grpc::Status hs = HealthCheck(channel, &health);
  ASSERT_TRUE(hs.ok()) << hs.error_message();
  EXPECT_EQ(health, std::string("\x08\x01", 2));
}

TEST_F(SecurityTest, TokensAndMutualTlsTogether) {
  const std::string tokens = pki_->dir + "/tokens2.txt";
  WriteFile(tokens, "only-token\n");
  ServerOptions o = TlsOptions(*pki_);
  o.tls_client_ca = pki_->ca;
  o.auth_tokens_file = tokens;
  std::unique_ptr<KvrmServer> server = Start(o);
  auto stub = Connect(server->port(), Tls(pki_->ca_pem, pki_->client_cert, pki_->client_key));
  EXPECT_EQ(Call(*stub).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(Call(*stub, "only-token").ok());
}

TEST_F(SecurityTest, OversizedMessageIsResourceExhausted) {
  ServerOptions o;
  o.max_message_bytes = 64 << 10;
  std::unique_ptr<KvrmServer> server = Start(o);
  auto stub = Connect(server->port(), grpc::InsecureChannelCredentials());
  grpc::ClientContext ctx;
  v1::TokenizeRequest req;
  req.set_text(std::string(100 << 10, 'a'));
  v1::TokenizeResponse resp;
  grpc::Status s = stub->Tokenize(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  StreamResult r = RunGenerate(*stub, TextRequest(std::string(100 << 10, 'b'), 4));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  // Under the limit the same connection still works.
  req.set_text(std::string(1000, 'a'));
  grpc::ClientContext ctx2;
  EXPECT_TRUE(stub->Tokenize(&ctx2, req, &resp).ok());
}

// --max_concurrent_streams=2 with five Generate streams on one connection: the server never
// holds more than two of them, and the other three start only as earlier ones finish. The
// engine here is not started; the test steps it by hand, so a request stays open at the server
// (counted by Stats(): queued plus in a slot) until the test lets it finish, however slow the
// machine. The count is a lower bound of the open HTTP/2 streams, so "at most 2" holds by
// construction when the limit works and never depends on timing.
TEST_F(SecurityTest, MaxConcurrentStreamsLimitsStreamsPerConnection) {
  constexpr int kLimit = 2;
  constexpr int kStreams = 5;
  EngineOptions eo;
  eo.slots = kStreams;  // the engine is not what limits them
  eo.max_queue = kStreams;
  eo.max_new_tokens = 16;
  eo.prefill_chunk = 32;
  eo.threads = 1;
  absl::StatusOr<std::unique_ptr<Engine>> created = Engine::Create(model_, eo);
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<Engine> engine = std::move(*created);
  ServerOptions o;
  o.listen = "127.0.0.1:0";
  o.info.version = "test";
  o.max_concurrent_streams = kLimit;
  absl::StatusOr<std::unique_ptr<KvrmServer>> started = KvrmServer::Start(engine.get(), o);
  ASSERT_TRUE(started.ok()) << started.status();
  std::unique_ptr<KvrmServer> server = std::move(*started);
  // One channel is one HTTP/2 connection. A unary call completes first, so the client has the
  // server's SETTINGS (and the server its acknowledgement) before the streams open.
  auto stub = Connect(server->port(), grpc::InsecureChannelCredentials());
  ASSERT_TRUE(Call(*stub).ok());

  std::vector<StreamResult> results(kStreams);
  std::atomic<int> done{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < kStreams; ++i) {
    clients.emplace_back([&, i] {
      results[i] = RunGenerate(*stub, TextRequest(absl::StrCat("stream ", i), 8));
      done.fetch_add(1);
    });
  }
  auto held = [&] {
    const EngineStats s = engine->Stats();  // queue_depth is live; slots as of the last step
    return s.slots_in_use + s.queue_depth;
  };
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  // Nothing is generated until the server holds the first kLimit requests.
  while (held() < kLimit && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  int most = held();
  EXPECT_EQ(most, kLimit);
  // Then one step at a time until every stream has finished; after each step, the requests the
  // server holds (received and not finished) never exceed the limit.
  while (done.load() < kStreams && most <= kLimit && absl::Now() < deadline) {
    if (!engine->StepForTest()) absl::SleepFor(absl::Milliseconds(1));
    most = std::max(most, held());
  }
  EXPECT_LE(most, kLimit) << "more streams reached the server than --max_concurrent_streams";
  if (most <= kLimit) {
    EXPECT_EQ(done.load(), kStreams) << "streams did not finish in time";
  }
  // Whatever happened above, let the owner thread end what is left so the clients return.
  engine->Start();
  for (std::thread& t : clients) t.join();
  for (int i = 0; i < kStreams; ++i) {
    EXPECT_TRUE(results[i].status.ok()) << i << ": " << results[i].status.error_message();
    EXPECT_TRUE(results[i].finished.reason() == v1::FINISH_REASON_LENGTH ||
                results[i].finished.reason() == v1::FINISH_REASON_EOS)
        << i << ": " << results[i].finished.reason();
  }
  EXPECT_EQ(engine->Stats().requests_total, static_cast<uint64_t>(kStreams));
  server.reset();
}

TEST_F(SecurityTest, BadFilesFailStartUpNamingTheFlagAndPath) {
  auto start_error = [&](const ServerOptions& o) {
    ServerOptions with = o;
    with.listen = "127.0.0.1:0";
    absl::StatusOr<std::unique_ptr<KvrmServer>> s = KvrmServer::Start(engine_, with);
    EXPECT_FALSE(s.ok());
    return s.ok() ? std::string() : std::string(s.status().message());
  };
  ServerOptions o = TlsOptions(*pki_);
  o.tls_cert = "/nonexistent/server.pem";
  EXPECT_TRUE(absl::StartsWith(start_error(o), "--tls_cert=/nonexistent/server.pem:"));
  o = TlsOptions(*pki_);
  o.tls_key = pki_->dir + "/openssl.cnf";  // exists, but holds no key
  EXPECT_TRUE(absl::StartsWith(start_error(o), "--tls_key=" + o.tls_key + ":"));
  o = TlsOptions(*pki_);
  o.tls_key = pki_->dir + "/client.key";  // a key, but not the certificate's
  EXPECT_TRUE(absl::StrContains(start_error(o), "does not match"));
  o = TlsOptions(*pki_);
  o.tls_cert = pki_->server_key;  // a key where the certificate should be
  EXPECT_TRUE(absl::StartsWith(start_error(o), "--tls_cert="));
  o = TlsOptions(*pki_);
  o.tls_client_ca = pki_->dir + "/openssl.cnf";
  EXPECT_TRUE(absl::StartsWith(start_error(o), "--tls_client_ca="));
  o = ServerOptions();
  o.tls_client_ca = pki_->ca;
  EXPECT_TRUE(absl::StrContains(start_error(o), "--tls_client_ca needs --tls_cert"));
  o = ServerOptions();
  o.auth_tokens_file = "/nonexistent/tokens";
  EXPECT_TRUE(absl::StartsWith(start_error(o), "--auth_tokens_file=/nonexistent/tokens:"));
}

}  // namespace
}  // namespace kvrm
