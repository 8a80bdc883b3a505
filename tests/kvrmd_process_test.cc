// kvrmd as a process: start-up failures exit non-zero with a message naming the problem, and
// SIGTERM drains (health NOT_SERVING at once, in-flight streams finish within the grace period,
// new requests are refused, exit 0).
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/json.h"
#include "common/subprocess.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "tests/http_client.h"
#include "tests/test_server.h"

namespace kvrm {
namespace {

namespace fs = std::filesystem;

std::string TmpDir() { return TestTmpDir(); }

Subprocess StartKvrmd(const std::vector<std::string>& args, const std::string& name) {
  // Metrics and the HTTP API on free loopback ports, so concurrent test runs never collide on
  // 9400 or 8000.
  std::vector<std::string> argv = {"server/kvrmd", "--metrics_listen=127.0.0.1",
                                   "--metrics_port=0", "--http_listen=127.0.0.1",
                                   "--http_port=0"};
  argv.insert(argv.end(), args.begin(), args.end());
  absl::StatusOr<Subprocess> p = Subprocess::Start(argv, {TmpDir() + "/" + name + ".log", ""});
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? std::move(*p) : Subprocess();
}

TEST(KvrmdProcessTest, MissingModelExitsNonZeroNamingThePath) {
  const std::string dir = TmpDir() + "/no-such-model";
  Subprocess p = StartKvrmd({"--model=" + dir, "--listen=127.0.0.1:0"}, "missing");
  EXPECT_EQ(p.Wait(), 1);
  EXPECT_TRUE(absl::StrContains(p.LogTail(), dir)) << p.LogTail();
}

TEST(KvrmdProcessTest, BrokenConfigExitsNonZeroNamingTheFile) {
  const std::string dir = TmpDir() + "/broken-model";
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(TinyModelDir())) {
    fs::copy_file(e.path(), dir / e.path().filename(), fs::copy_options::overwrite_existing);
  }
  std::ofstream(dir + "/config.json") << "{\"hidden_size\": 128, ";  // truncated JSON
  Subprocess p = StartKvrmd({"--model=" + dir, "--listen=127.0.0.1:0"}, "broken");
  EXPECT_EQ(p.Wait(), 1);
  EXPECT_TRUE(absl::StrContains(p.LogTail(), "config.json")) << p.LogTail();
}

// A model whose tokenizer_config.json is not JSON stops start-up (naming the file); a chat
// template given with --chat_template that does not parse stops it too, naming the flag, the path
// and where the template is wrong.
TEST(KvrmdProcessTest, BrokenTokenizerConfigOrChatTemplateExitsNonZeroNamingIt) {
  const std::string dir = TmpDir() + "/broken-tokenizer-config";
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(TinyModelDir())) {
    fs::copy_file(e.path(), dir / e.path().filename(), fs::copy_options::overwrite_existing);
  }
  std::ofstream(dir + "/tokenizer_config.json") << "{\"chat_template\": ";  // truncated JSON
  Subprocess p = StartKvrmd({"--model=" + dir, "--listen=127.0.0.1:0"}, "broken-tokcfg");
  EXPECT_EQ(p.Wait(), 1);
  EXPECT_TRUE(absl::StrContains(p.LogTail(), "tokenizer_config.json")) << p.LogTail();

  const std::string tmpl = TmpDir() + "/bad.jinja";
  std::ofstream(tmpl) << "{{ bos_token }}\n{% for m in messages %}{{ m.content }";
  Subprocess q = StartKvrmd(
      {"--model=" + TinyModelDir(), "--listen=127.0.0.1:0", "--chat_template=" + tmpl},
      "bad-chat-template");
  EXPECT_EQ(q.Wait(), 1);
  EXPECT_TRUE(absl::StrContains(q.LogTail(), "--chat_template=" + tmpl + ": chat_template: line 2"))
      << q.LogTail();
}

// kvrmd given one bad flag exits 2, naming the flag as given and one of the valid choices.
void ExpectBadFlagExitsTwo(const std::string& flag, const std::string& a_choice) {
  Subprocess p =
      StartKvrmd({"--model=" + TinyModelDir(), "--listen=127.0.0.1:0", "--device=cpu", flag},
                 "bad-" + flag.substr(2, flag.find('=') - 2));
  EXPECT_EQ(p.Wait(), 2) << flag;
  EXPECT_TRUE(absl::StrContains(p.LogTail(), flag)) << p.LogTail();
  EXPECT_TRUE(absl::StrContains(p.LogTail(), a_choice)) << p.LogTail();
}

TEST(KvrmdProcessTest, UnknownCpuIsaExitsTwoNamingTheFlagAndTheChoices) {
  ExpectBadFlagExitsTwo("--cpu_isa=sse9", "generic");
}

TEST(KvrmdProcessTest, UnknownKvDtypeExitsTwoNamingTheFlagAndTheChoices) {
  ExpectBadFlagExitsTwo("--kv_dtype=int8", "f32, bf16, fp8 (fp8_e4m3) or fp8_e5m2");
}

TEST(KvrmdProcessTest, UnknownQuantizationExitsTwoNamingTheFlagAndTheChoices) {
  ExpectBadFlagExitsTwo("--quantization=q4_0", "q8_0, q4_K or none");
}

TEST(KvrmdProcessTest, UnknownToolCallParserExitsTwoNamingTheFlagAndTheChoices) {
  ExpectBadFlagExitsTwo("--tool_call_parser=json", "llama3_json");
}

TEST(KvrmdProcessTest, UnknownReasoningParserExitsTwoNamingTheFlagAndTheChoices) {
  ExpectBadFlagExitsTwo("--reasoning_parser=o1",
                        "none, think, deepseek_r1, qwen3, harmony or openai_gptoss");
}

TEST(KvrmdProcessTest, ANegativeThinkingBudgetExitsTwoNamingTheFlag) {
  ExpectBadFlagExitsTwo("--thinking_budget=-2", "-1 (none) or a number of tokens");
}

TEST(KvrmdProcessTest, AnOffloadShedShareOutsideItsRangeExitsTwoNamingTheFlag) {
  ExpectBadFlagExitsTwo("--prefix_cache_offload_shed=2", "[0, 1)");
}

TEST(KvrmdProcessTest, SpeculativeDecodingFlagsOutsideTheirRangeExitTwoNamingTheFlag) {
  ExpectBadFlagExitsTwo("--speculative_tokens=40", "[0, 32]");
  ExpectBadFlagExitsTwo("--prompt_lookup_min=0", "1 <= min <= max");
  ExpectBadFlagExitsTwo("--prompt_lookup_max=1", "1 <= min <= max");  // below the min's 2
}

TEST(KvrmdProcessTest, MalformedLoraModulesExitTwoNamingTheFlag) {
  ExpectBadFlagExitsTwo("--allow_runtime_lora_updating", "--max_loras");
  ExpectBadFlagExitsTwo("--lora_dtype=float16", "auto, bfloat16 or float32");
  ExpectBadFlagExitsTwo("--lora_dir=" + TmpDir() + "/no-such-dir", "not a directory");
  ExpectBadFlagExitsTwo("--lora_dir=" + TmpDir(), "--max_loras");
  ExpectBadFlagExitsTwo("--lora_modules=sql", "name=DIR");
  ExpectBadFlagExitsTwo("--lora_modules=a=builtin,a=builtin", "given twice");
  ExpectBadFlagExitsTwo("--lora_modules=bad name=builtin", "letters, digits");
}

// An adapter directory that is not there stops kvrmd (exit 1) naming the adapter and the path.
TEST(KvrmdProcessTest, AMissingLoraAdapterExitsOneNamingIt) {
  const std::string dir = TmpDir() + "/no-such-adapter";
  Subprocess p = StartKvrmd({"--model=" + TinyModelDir(), "--listen=127.0.0.1:0", "--device=cpu",
                             "--lora_modules=sql=" + dir},
                            "missing-adapter");
  EXPECT_EQ(p.Wait(), 1);
  EXPECT_TRUE(absl::StrContains(p.LogTail(), "adapter `sql` (" + dir)) << p.LogTail();
}

// --lora_modules=NAME=builtin generates an adapter for the served model into --model_cache and
// serves it: the HTTP API's /v1/models lists it, and a completion naming it answers. With
// --max_loras=2 --allow_runtime_lora_updating the same directory loads again while serving under
// another name, which answers as the first does, and unloads.
TEST(KvrmdProcessTest, BuiltinLoraAdapterIsGeneratedAndServed) {
  const std::string cache = TmpDir() + "/lora-cache";
  const std::string port_file = TmpDir() + "/kvrmd-lora.port";
  const std::string http_port_file = TmpDir() + "/kvrmd-lora.http_port";
  fs::remove(port_file);
  fs::remove(http_port_file);
  Subprocess p =
      StartKvrmd({"--model=" + TinyModelDir(), "--listen=127.0.0.1:0", "--port_file=" + port_file,
                  "--http_port_file=" + http_port_file, "--http_port=0", "--metrics_port=-1",
                  "--model_cache=" + cache, "--lora_modules=sql=builtin", "--slots=2",
                  "--threads=2", "--max_loras=2", "--allow_runtime_lora_updating"},
                 "builtin-lora");
  ASSERT_TRUE(p.WaitForPortFile(port_file, absl::Seconds(60)).ok()) << p.LogTail();
  absl::StatusOr<int> http_port = p.WaitForPortFile(http_port_file, absl::Seconds(5));
  ASSERT_TRUE(http_port.ok()) << http_port.status();
  EXPECT_TRUE(fs::exists(cache + "/lora-" + fs::path(TinyModelDir()).filename().string() +
                         "-sql/adapter_config.json"))
      << p.LogTail();
  HttpReply models = HttpCall(*http_port, "GET", "/v1/models");
  EXPECT_TRUE(absl::StrContains(models.body, "\"id\":\"sql\"")) << models.body;
  HttpReply r = HttpCall(*http_port, "POST", "/v1/completions",
                         R"({"model": "sql", "prompt": "Hi", "max_tokens": 4, "ignore_eos": true})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_TRUE(absl::StrContains(r.body, "\"completion_tokens\":4")) << r.body;
  const std::string dir = cache + "/lora-" + fs::path(TinyModelDir()).filename().string() + "-sql";
  r = HttpCall(*http_port, "POST", "/v1/load_lora_adapter",
               absl::StrCat(R"({"lora_name": "again", "lora_path": ")", dir, R"("})"));
  ASSERT_EQ(r.status, 200) << r.body << p.LogTail();
  auto greedy = [&](const std::string& model) {
    HttpReply reply =
        HttpCall(*http_port, "POST", "/v1/completions",
                 absl::StrCat(R"({"model": ")", model, R"(", "prompt": "Hi", "max_tokens": 8, )",
                              R"("temperature": 0, "ignore_eos": true})"));
    EXPECT_EQ(reply.status, 200) << reply.body;
    return Json::parse(reply.body)["choices"][0]["text"].get<std::string>();
  };
  EXPECT_EQ(greedy("again"), greedy("sql"));
  r = HttpCall(*http_port, "POST", "/v1/unload_lora_adapter", R"({"lora_name": "again"})");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(HttpCall(*http_port, "POST", "/v1/completions",
                     R"({"model": "again", "prompt": "Hi", "max_tokens": 2})")
                .status,
            404);
  p.Signal(SIGTERM);
  EXPECT_EQ(p.Wait(), 0) << p.LogTail();
}

// grpc.health.v1.Health/Check for the whole server (service ""), over a generic stub: Debian
// ships no health.proto. The request is the empty message; the response is field 1 (varint).
// Returns the ServingStatus (1 SERVING, 2 NOT_SERVING), or -1 when the call fails.
int HealthStatus(const std::shared_ptr<grpc::Channel>& channel) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::Slice empty("");
  grpc::ByteBuffer request(&empty, 1);
  grpc::ByteBuffer response;
  grpc::Status status;
  // Completed on this thread (a completion queue, not a callback on a gRPC thread), so the
  // status and response never cross threads (clean under ThreadSanitizer).
  grpc::CompletionQueue cq;
  auto call = stub.PrepareUnaryCall(&context, "/grpc.health.v1.Health/Check", request, &cq);
  call->StartCall();
  call->Finish(&response, &status, nullptr);
  void* tag = nullptr;
  bool ok = false;
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  if (!status.ok()) return -1;
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (response.Dump(&slices).ok()) {
    for (const grpc::Slice& s : slices) {
      bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
  }
  if (bytes.empty()) return 0;  // proto3 default: UNKNOWN
  return bytes.size() == 2 && bytes[0] == 0x08 ? bytes[1] : -1;
}

TEST(KvrmdProcessTest, SigtermDrainsInFlightStreamsAndExitsZero) {
  const std::string port_file = TmpDir() + "/kvrmd.port";
  fs::remove(port_file);
  Subprocess p = StartKvrmd({"--model=" + TinyModelDir(), "--listen=127.0.0.1:0",
                          "--port_file=" + port_file, "--slots=4", "--threads=2",
                          "--drain_grace_s=60"},
                         "drain");
  absl::StatusOr<int> port_or = p.WaitForPortFile(port_file, absl::Seconds(60));
  ASSERT_TRUE(port_or.ok()) << port_or.status();
  const int port = *port_or;
  auto channel =
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials());
  auto stub = v1::Kvrm::NewStub(channel);

  constexpr int kStreams = 8;
  constexpr int kTokens = 150;
  std::vector<std::thread> clients;
  std::atomic<int> first_tokens{0};
  std::vector<StreamResult> results(kStreams);
  for (int i = 0; i < kStreams; ++i) {
    clients.emplace_back([&, i] {
      v1::GenerateRequest req = TextRequest("draining stream " + std::to_string(i), kTokens);
      req.mutable_stopping()->set_ignore_eos(true);
      grpc::ClientContext ctx;
      auto reader = stub->Generate(&ctx, req);
      v1::GenerateResponse msg;
      bool counted = false;
      while (reader->Read(&msg)) {
        if (!counted) {
          counted = true;
          ++first_tokens;
        }
        results[i].tokens.insert(results[i].tokens.end(), msg.token_ids().begin(),
                                 msg.token_ids().end());
        if (msg.has_finished()) results[i].finished = msg.finished();
      }
      results[i].status = reader->Finish();
    });
  }
  // SIGTERM once the first four streams (the slots) are producing.
  for (int i = 0; i < 600 && first_tokens.load() < 4; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_GE(first_tokens.load(), 4);
  EXPECT_EQ(HealthStatus(channel), 1);  // SERVING
  const auto sigterm_at = std::chrono::steady_clock::now();
  p.Signal(SIGTERM);
  // Health flips to NOT_SERVING at once (well inside a readiness probe period).
  int health = HealthStatus(channel);
  while (health != 2 && std::chrono::steady_clock::now() - sigterm_at < std::chrono::seconds(1)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    health = HealthStatus(channel);
  }
  EXPECT_EQ(health, 2) << "health not NOT_SERVING 1 s after SIGTERM";
  // New work is refused with UNAVAILABLE while the in-flight streams finish.
  bool refused = false;
  for (int i = 0; i < 100 && !refused; ++i) {
    StreamResult r = RunGenerate(*stub, TextRequest("late request", 4));
    if (r.status.error_code() == grpc::StatusCode::UNAVAILABLE) refused = true;
    else std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(refused);
  for (auto& t : clients) t.join();
  // Every stream finished on its own, inside --drain_grace_s (60 s).
  EXPECT_LT(std::chrono::steady_clock::now() - sigterm_at, std::chrono::seconds(60));
  for (int i = 0; i < kStreams; ++i) {
    EXPECT_TRUE(results[i].status.ok()) << i << ": " << results[i].status.error_message();
    EXPECT_EQ(results[i].finished.reason(), v1::FINISH_REASON_LENGTH) << i;
    EXPECT_EQ(results[i].tokens.size(), static_cast<size_t>(kTokens)) << i;
  }
  EXPECT_EQ(p.Wait(), 0) << p.LogTail();
  EXPECT_TRUE(absl::StrContains(p.LogTail(), "drained cleanly")) << p.LogTail();
}

// kvrmd's OpenAI-compatible HTTP API: served beside gRPC, and drained with it (a stream in flight
// at SIGTERM runs to its end, a new request and the API port's /health get 503).
TEST(KvrmdProcessTest, HttpApiServesAndDrainsWithTheServer) {
  const std::string port_file = TmpDir() + "/kvrmd-http.port";
  const std::string http_port_file = TmpDir() + "/kvrmd-http.http_port";
  const std::string metrics_port_file = TmpDir() + "/kvrmd-http.metrics_port";
  fs::remove(port_file);
  fs::remove(http_port_file);
  fs::remove(metrics_port_file);
  Subprocess p = StartKvrmd({"--model=" + TinyModelDir(), "--listen=127.0.0.1:0",
                             "--port_file=" + port_file, "--http_port_file=" + http_port_file,
                             "--metrics_port_file=" + metrics_port_file,
                             "--served_model_name=tiny-chat", "--slots=2", "--threads=2",
                             "--drain_grace_s=60"},
                            "http");
  ASSERT_TRUE(p.WaitForPortFile(port_file, absl::Seconds(60)).ok()) << p.LogTail();
  absl::StatusOr<int> http_port = p.WaitForPortFile(http_port_file, absl::Seconds(5));
  ASSERT_TRUE(http_port.ok()) << http_port.status();
  HttpReply models = HttpCall(*http_port, "GET", "/v1/models");
  ASSERT_EQ(models.status, 200) << models.body;
  EXPECT_TRUE(absl::StrContains(models.body, "\"id\":\"tiny-chat\"")) << models.body;
  HttpReply r = HttpCall(*http_port, "POST", "/v1/chat/completions",
                         R"({"model": "tiny-chat", "messages": [{"role": "user", "content": "Hi"}],
                             "max_tokens": 5, "ignore_eos": true})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_TRUE(absl::StrContains(r.body, "\"completion_tokens\":5")) << r.body;
  // kvrmd's /metrics counts the HTTP API's requests by endpoint and status.
  absl::StatusOr<int> metrics_port = p.WaitForPortFile(metrics_port_file, absl::Seconds(5));
  ASSERT_TRUE(metrics_port.ok()) << metrics_port.status();
  std::string scrape;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);  // recorded after the last byte
  while (!absl::StrContains(scrape, R"(handler="chat_completions",code="200"} 1)") &&
         absl::Now() < deadline) {
    scrape = HttpCall(*metrics_port, "GET", "/metrics").body;
  }
  EXPECT_TRUE(absl::StrContains(scrape, R"(handler="chat_completions",code="200"} 1)"))
      << scrape.substr(0, 2000);
  EXPECT_TRUE(absl::StrContains(scrape, R"(handler="models",code="200"} 1)"));

  // A long stream, then SIGTERM while it runs.
  HttpConnection stream(*http_port, "POST", "/v1/completions",
                        R"({"prompt": "x", "max_tokens": 200, "ignore_eos": true,
                            "stream": true})");
  std::string got;
  while (!absl::StrContains(got, "\"text\":")) {
    const std::string more = stream.Read(30000);
    ASSERT_FALSE(more.empty()) << got;
    got += more;
  }
  p.Signal(SIGTERM);
  bool refused = false;
  for (int i = 0; i < 200 && !refused; ++i) {
    HttpReply late = HttpCall(*http_port, "POST", "/v1/completions",
                              R"({"prompt": "late", "max_tokens": 2})");
    if (late.status == 503) refused = true;
    else std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(refused);
  EXPECT_EQ(HttpCall(*http_port, "GET", "/health").status, 503) << "health while draining";
  for (std::string more; !(more = stream.Read(30000)).empty();) got += more;
  EXPECT_TRUE(absl::StrContains(got, "\"finish_reason\":\"length\"")) << got.substr(0, 400);
  EXPECT_TRUE(absl::StrContains(got, "data: [DONE]")) << "the stream was cut at the drain";
  EXPECT_EQ(p.Wait(), 0) << p.LogTail();
  EXPECT_TRUE(absl::StrContains(p.LogTail(), "drained cleanly")) << p.LogTail();
}

}  // namespace
}  // namespace kvrm
