#include "tests/test_server.h"

#include <mutex>

#include "common/logging.h"
#include "tools/modelgen/model_writer.h"

namespace kvrm {

const std::string& TinyModelDir() {
  static std::once_flag once;
  static std::string dir;
  std::call_once(once, [] {
    dir = TestTmpDir() + "/kvrm-tiny";
    modelgen::MakeModelOptions o;
    o.size = "tiny";
    o.out_dir = dir;
    o.dtype = DType::kF32;
    CHECK_OK(modelgen::MakeModel(o).status());
  });
  return dir;
}

ModelBundle* LoadTinyModel() {
  absl::StatusOr<std::unique_ptr<ModelBundle>> model = ModelBundle::Load(TinyModelDir());
  CHECK_OK(model.status());
  return model->release();
}

TestServer::TestServer(EngineOptions options, ServerOptions so)
    : TestServer(std::unique_ptr<ModelBundle>(LoadTinyModel()), std::move(options),
                 std::move(so)) {}

TestServer::TestServer(std::unique_ptr<ModelBundle> model, EngineOptions options,
                       ServerOptions so) {
  model_ = std::move(model);
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(model_.get(), options);
  CHECK_OK(engine.status());
  engine_ = std::move(*engine);
  engine_->Start();
  so.listen = "127.0.0.1:0";
  so.info.version = "test";
  absl::StatusOr<std::unique_ptr<KvrmServer>> server = KvrmServer::Start(engine_.get(), so);
  CHECK_OK(server.status());
  server_ = std::move(*server);
  stub_ = v1::Kvrm::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(server_->port()), grpc::InsecureChannelCredentials()));
}

TestServer::~TestServer() {
  server_.reset();
  engine_.reset();
}

StreamResult RunGenerate(v1::Kvrm::Stub& stub, const v1::GenerateRequest& request) {
  StreamResult out;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::seconds(120 * TestTimeoutScale()));
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader = stub.Generate(&ctx, request);
  v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
    out.tokens.insert(out.tokens.end(), msg.token_ids().begin(), msg.token_ids().end());
    out.text += msg.text();
    if (msg.has_finished()) out.finished = msg.finished();
    out.messages.push_back(msg);
  }
  out.status = reader->Finish();
  for (const auto& [k, v] : ctx.GetServerTrailingMetadata()) {
    out.trailers.emplace(std::string(k.data(), k.size()), std::string(v.data(), v.size()));
  }
  return out;
}

v1::GenerateRequest TextRequest(const std::string& prompt, int max_new_tokens) {
  v1::GenerateRequest r;
  r.set_text(prompt);
  r.mutable_stopping()->set_max_new_tokens(max_new_tokens);
  return r;
}

void CollectingSink::Add(StreamChunk& c) {
  stream_.token_ids.insert(stream_.token_ids.end(), c.token_ids.begin(), c.token_ids.end());
  stream_.text += c.text;
  stream_.logprobs.insert(stream_.logprobs.end(), c.logprobs.begin(), c.logprobs.end());
  prompt_logprob_chunks_ += !c.prompt_logprobs.empty();
  stream_.prompt_logprobs.insert(stream_.prompt_logprobs.end(), c.prompt_logprobs.begin(),
                                 c.prompt_logprobs.end());
  if (!c.embedding.empty()) stream_.embedding = c.embedding;
}

void CollectingSink::OnChunk(StreamChunk chunk) {
  std::lock_guard<std::mutex> lock(mu_);
  Add(chunk);
}

void CollectingSink::OnFinished(StreamChunk last, const FinishInfo& info) {
  std::lock_guard<std::mutex> lock(mu_);
  Add(last);
  info_ = info;
  done_ = true;
  cv_.notify_all();
}

bool CollectingSink::done() {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

std::vector<int32_t> CollectingSink::Wait(FinishInfo* info) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_; });
  *info = info_;
  return stream_.token_ids;
}

StreamChunk CollectingSink::stream() {
  std::lock_guard<std::mutex> lock(mu_);
  return stream_;
}

int CollectingSink::prompt_logprob_chunks() {
  std::lock_guard<std::mutex> lock(mu_);
  return prompt_logprob_chunks_;
}

}  // namespace kvrm
