// An in-process kvrmd for end-to-end tests: the tiny model generated into TEST_TMPDIR, an engine,
// and the gRPC server on a free loopback port, plus a stub connected to it.
#ifndef KVRM_TESTS_TEST_SERVER_H_
#define KVRM_TESTS_TEST_SERVER_H_

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/subprocess.h"
#include "grpcpp/grpcpp.h"
#include "kvrm/v1/kvrm.grpc.pb.h"
#include "runtime/engine.h"
#include "runtime/model_bundle.h"
#include "server/kvrm_server.h"

namespace kvrm {

// Generates (once per process) the tiny model and returns its directory.
const std::string& TinyModelDir();
// Loads the tiny model (CHECK-fails on error); the caller owns it (test suites keep one for all
// their tests).
ModelBundle* LoadTinyModel();

class TestServer {
 public:
  // `server`: options for the gRPC server beyond its address and version (metrics hooks ...).
  explicit TestServer(EngineOptions options, ServerOptions server = {});
  // The same serving `model` (another model directory's bundle).
  TestServer(std::unique_ptr<ModelBundle> model, EngineOptions options, ServerOptions server = {});
  ~TestServer();

  v1::Kvrm::Stub& stub() { return *stub_; }
  Engine& engine() { return *engine_; }
  KvrmServer& server() { return *server_; }
  const ModelBundle& model() const { return *model_; }
  int port() const { return server_->port(); }

 private:
  std::unique_ptr<ModelBundle> model_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<KvrmServer> server_;
  std::unique_ptr<v1::Kvrm::Stub> stub_;
};

struct StreamResult {
  grpc::Status status;
  std::vector<v1::GenerateResponse> messages;
  std::vector<int32_t> tokens;
  std::string text;
  v1::Finished finished;
  std::multimap<std::string, std::string> trailers;  // copied: the context owns the refs
};

// Runs one Generate call to completion (deadline 120 s x TestTimeoutScale()).
StreamResult RunGenerate(v1::Kvrm::Stub& stub, const v1::GenerateRequest& request);

v1::GenerateRequest TextRequest(const std::string& prompt, int max_new_tokens);

// An engine-level sink that keeps everything a request streams and its finish, for tests that
// submit straight to an Engine.
class CollectingSink : public RequestSink {
 public:
  void OnChunk(StreamChunk chunk) override;
  void OnFinished(StreamChunk last, const FinishInfo& info) override;
  bool done();
  // Blocks until the request finished; its tokens, and *info its finish.
  std::vector<int32_t> Wait(FinishInfo* info);
  // After Wait: the whole stream as one chunk (token ids, text, logprobs and prompt logprobs in
  // order), and how many chunks carried prompt logprobs.
  StreamChunk stream();
  int prompt_logprob_chunks();

 private:
  void Add(StreamChunk& chunk);  // under mu_
  std::mutex mu_;
  std::condition_variable cv_;
  StreamChunk stream_;
  int prompt_logprob_chunks_ = 0;
  FinishInfo info_;
  bool done_ = false;
};

}  // namespace kvrm

#endif  // KVRM_TESTS_TEST_SERVER_H_
