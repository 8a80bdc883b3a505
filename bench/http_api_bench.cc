// What the OpenAI-compatible HTTP API costs over gRPC: one kvrmd (a child process), the same
// streamed requests sent through both APIs in alternating rounds, at each concurrency, and the
// client-side figures set side by side: time to first token, inter-token latency, request time
// and output tokens per second, with the HTTP / gRPC ratio of each (measured in one run, so
// machine noise hits both alike).
//
//   bazel build -c opt //bench:http_api_bench //server:kvrmd
//   bazel-bin/bench/http_api_bench --kvrmd=bazel-bin/server/kvrmd [--model=builtin:small]
//       [--concurrency=1,8] [--requests=16] [--rounds=2] [--max_tokens=64] [--json=FILE]
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/subprocess.h"
#include "grpcpp/grpcpp.h"
#include "kvrm/v1/kvrm.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "tests/http_client.h"

ABSL_FLAG(std::string, kvrmd, "server/kvrmd", "the kvrmd binary");
ABSL_FLAG(std::string, model, "builtin:small", "kvrmd --model");
ABSL_FLAG(std::string, model_cache, "", "kvrmd --model_cache (built-in models)");
ABSL_FLAG(std::string, concurrency, "1,8", "clients at once, comma-separated");
ABSL_FLAG(int32_t, requests, 16, "requests per API per round at each concurrency");
ABSL_FLAG(int32_t, rounds, 2, "alternating rounds (gRPC, HTTP, gRPC, HTTP, ...)");
ABSL_FLAG(int32_t, max_tokens, 64, "output tokens per request (ignore_eos)");
ABSL_FLAG(int32_t, slots, 8, "kvrmd --slots");
ABSL_FLAG(int32_t, threads, 0, "kvrmd --threads (0: all cores)");
ABSL_FLAG(std::string, json, "", "also write the results to this JSON file");

namespace kvrm {
namespace {

using Clock = std::chrono::steady_clock;
double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// One request as the client saw it: when each token (event) arrived, from the send.
struct Sample {
  bool ok = false;
  std::vector<double> arrivals_ms;
  double total_ms = 0;
};

struct Figures {
  int requests = 0, failed = 0;
  double ttft_p50 = 0, ttft_mean = 0, itl_mean = 0, itl_p99 = 0, total_mean = 0;
  double tokens_per_s = 0;  // all output tokens over the wall time of the rounds
};

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * (v.size() - 1) + 0.5));
  return v[i];
}

double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / v.size();
}

// Each request's prompt starts with its own tag (API, round, index), so that no request finds an
// earlier one's blocks in the prefix cache: every prompt is prefilled in full, through both APIs.
std::string Prompt(const std::string& tag) {
  return absl::StrCat(tag, ": tell the story of the printing press, its makers and the ",
                      "books that came from it, in order");
}

Sample GrpcOne(v1::Kvrm::Stub& stub, const std::string& tag, int max_tokens) {
  Sample s;
  v1::GenerateRequest r;
  r.set_text(Prompt(tag));
  r.mutable_stopping()->set_max_new_tokens(max_tokens);
  r.mutable_stopping()->set_ignore_eos(true);
  grpc::ClientContext context;
  const Clock::time_point start = Clock::now();
  auto reader = stub.Generate(&context, r);
  v1::GenerateResponse m;
  // A message with text is one arrival, as an HTTP event is (bytes of a split UTF-8 character
  // are held back by the server in both).
  while (reader->Read(&m)) {
    if (!m.text().empty()) s.arrivals_ms.push_back(Ms(Clock::now() - start));
  }
  s.ok = reader->Finish().ok();
  s.total_ms = Ms(Clock::now() - start);
  return s;
}

// Streams /v1/completions; an event is one token (the stream's first and last events carry one
// each as well: completions send no role chunk), counted as its "data: {" arrives.
Sample HttpOne(int port, const std::string& tag, int max_tokens) {
  Sample s;
  const std::string body = nlohmann::json{{"prompt", Prompt(tag)},
                                          {"max_tokens", max_tokens},
                                          {"temperature", 0},
                                          {"ignore_eos", true},
                                          {"stream", true}}
                               .dump();
  const Clock::time_point start = Clock::now();
  HttpConnection c(port, "POST", "/v1/completions", body);
  std::string raw;
  size_t scanned = 0;
  for (;;) {
    const std::string more = c.Read(120000);
    if (more.empty()) break;
    raw += more;
    const double now = Ms(Clock::now() - start);
    for (size_t at; (at = raw.find("data: {\"id\"", scanned)) != std::string::npos;) {
      // A token event has a non-empty "text" (the tiny vocabulary has no empty tokens); an
      // event whose text is empty only carries the finish.
      if (raw.find("\"text\":\"\"", at) != raw.find("\"text\":", at)) s.arrivals_ms.push_back(now);
      scanned = at + 1;
    }
    if (absl::StrContains(raw, "data: [DONE]")) break;
  }
  s.ok = absl::StartsWith(raw, "HTTP/1.1 200") && absl::StrContains(raw, "data: [DONE]");
  s.total_ms = Ms(Clock::now() - start);
  return s;
}

template <typename Fn>
std::vector<Sample> RunRound(int concurrency, int requests, Fn one, double* wall_ms) {
  std::vector<Sample> samples(requests);
  std::atomic<int> next{0};
  const Clock::time_point start = Clock::now();
  std::vector<std::thread> clients;
  for (int c = 0; c < concurrency; ++c) {
    clients.emplace_back([&] {
      for (int i; (i = next.fetch_add(1)) < requests;) samples[i] = one(i);
    });
  }
  for (std::thread& t : clients) t.join();
  *wall_ms += Ms(Clock::now() - start);
  return samples;
}

Figures Summarise(const std::vector<Sample>& samples, double wall_ms, int max_tokens) {
  Figures f;
  std::vector<double> ttft, itl, total;
  int64_t tokens = 0;
  for (const Sample& s : samples) {
    ++f.requests;
    if (!s.ok || s.arrivals_ms.empty()) {
      ++f.failed;
      continue;
    }
    ttft.push_back(s.arrivals_ms[0]);
    for (size_t i = 1; i < s.arrivals_ms.size(); ++i) {
      itl.push_back(s.arrivals_ms[i] - s.arrivals_ms[i - 1]);
    }
    total.push_back(s.total_ms);
    tokens += max_tokens;  // ignore_eos: every request that ended well made them all
  }
  f.ttft_p50 = Percentile(ttft, 0.5);
  f.ttft_mean = Mean(ttft);
  f.itl_mean = Mean(itl);
  f.itl_p99 = Percentile(itl, 0.99);
  f.total_mean = Mean(total);
  f.tokens_per_s = wall_ms > 0 ? tokens / (wall_ms / 1000) : 0;
  return f;
}

nlohmann::json ToJson(const Figures& f) {
  return {{"requests", f.requests},   {"failed", f.failed},       {"ttft_p50_ms", f.ttft_p50},
          {"ttft_mean_ms", f.ttft_mean}, {"itl_mean_ms", f.itl_mean}, {"itl_p99_ms", f.itl_p99},
          {"request_mean_ms", f.total_mean}, {"tokens_per_s", f.tokens_per_s}};
}

int Run() {
  const std::string dir = std::filesystem::temp_directory_path() / "kvrm-http-bench";
  std::filesystem::create_directories(dir);
  const std::string port_file = dir + "/grpc.port";
  const std::string http_port_file = dir + "/http.port";
  std::filesystem::remove(port_file);
  std::filesystem::remove(http_port_file);
  std::vector<std::string> args = {
      absl::GetFlag(FLAGS_kvrmd),      "--model=" + absl::GetFlag(FLAGS_model),
      "--listen=127.0.0.1:0",          "--port_file=" + port_file,
      "--http_listen=127.0.0.1",       "--http_port=0",
      "--http_port_file=" + http_port_file, "--metrics_port=-1",
      absl::StrCat("--slots=", absl::GetFlag(FLAGS_slots)),
      absl::StrCat("--threads=", absl::GetFlag(FLAGS_threads)),
      "--max_queue=100000",            "--log_level=warning"};
  if (!absl::GetFlag(FLAGS_model_cache).empty()) {
    args.push_back("--model_cache=" + absl::GetFlag(FLAGS_model_cache));
  }
  absl::StatusOr<Subprocess> p = Subprocess::Start(args, {dir + "/kvrmd.log", ""});
  if (!p.ok()) {
    std::fprintf(stderr, "http_api_bench: %s\n", p.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<int> grpc_port = p->WaitForPortFile(port_file, absl::Minutes(5));
  absl::StatusOr<int> http_port = p->WaitForPortFile(http_port_file, absl::Seconds(10));
  if (!grpc_port.ok() || !http_port.ok()) {
    std::fprintf(stderr, "http_api_bench: kvrmd did not start:\n%s\n", p->LogTail().c_str());
    return 1;
  }
  auto stub = v1::Kvrm::NewStub(grpc::CreateChannel(absl::StrCat("127.0.0.1:", *grpc_port),
                                                    grpc::InsecureChannelCredentials()));
  const int max_tokens = absl::GetFlag(FLAGS_max_tokens);
  const int requests = absl::GetFlag(FLAGS_requests);
  // Warm-up through both, so that neither pays first-use costs in the figures.
  GrpcOne(*stub, "warm-up grpc", 4);
  HttpOne(*http_port, "warm-up http", 4);

  nlohmann::json out = {{"model", absl::GetFlag(FLAGS_model)},
                        {"max_tokens", max_tokens},
                        {"requests_per_round", requests},
                        {"rounds", absl::GetFlag(FLAGS_rounds)},
                        {"slots", absl::GetFlag(FLAGS_slots)},
                        {"results", nlohmann::json::array()}};
  std::printf("%-11s | %-5s | %8s | %9s | %8s | %8s | %10s | %8s\n", "concurrency", "api",
              "requests", "TTFT p50", "ITL mean", "ITL p99", "request ms", "tokens/s");
  bool all_ok = true;
  for (absl::string_view c : absl::StrSplit(absl::GetFlag(FLAGS_concurrency), ',')) {
    int concurrency = 0;
    if (!absl::SimpleAtoi(c, &concurrency) || concurrency < 1) continue;
    std::vector<Sample> grpc_samples, http_samples;
    double grpc_wall = 0, http_wall = 0;
    for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
      for (const Sample& s : RunRound(concurrency, requests,
                                      [&](int i) {
                                        return GrpcOne(
                                            *stub, absl::StrCat("grpc c", concurrency, " r", round, " #", i),
                                            max_tokens);
                                      },
                                      &grpc_wall)) {
        grpc_samples.push_back(s);
      }
      for (const Sample& s : RunRound(concurrency, requests,
                                      [&](int i) {
                                        return HttpOne(
                                            *http_port,
                                            absl::StrCat("http c", concurrency, " r", round, " #", i),
                                            max_tokens);
                                      },
                                      &http_wall)) {
        http_samples.push_back(s);
      }
    }
    const Figures g = Summarise(grpc_samples, grpc_wall, max_tokens);
    const Figures h = Summarise(http_samples, http_wall, max_tokens);
    all_ok = all_ok && g.failed == 0 && h.failed == 0;
    for (const auto& [name, f] : {std::pair<const char*, const Figures&>{"grpc", g},
                                  std::pair<const char*, const Figures&>{"http", h}}) {
      std::printf("%11d | %-5s | %8d | %6.2f ms | %5.2f ms | %5.2f ms | %10.1f | %8.1f\n",
                  concurrency, name, f.requests - f.failed, f.ttft_p50, f.itl_mean, f.itl_p99,
                  f.total_mean, f.tokens_per_s);
    }
    const auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
    std::printf("%11d | %-5s | %8s | %8.3fx | %7.3fx | %7.3fx | %9.3fx | %7.3fx\n", concurrency,
                "ratio", "", ratio(h.ttft_p50, g.ttft_p50), ratio(h.itl_mean, g.itl_mean),
                ratio(h.itl_p99, g.itl_p99), ratio(h.total_mean, g.total_mean),
                ratio(h.tokens_per_s, g.tokens_per_s));
    out["results"].push_back({{"concurrency", concurrency},
                              {"grpc", ToJson(g)},
                              {"http", ToJson(h)},
                              {"http_over_grpc",
                               {{"ttft_p50", ratio(h.ttft_p50, g.ttft_p50)},
                                {"itl_mean", ratio(h.itl_mean, g.itl_mean)},
                                {"request_mean", ratio(h.total_mean, g.total_mean)},
                                {"tokens_per_s", ratio(h.tokens_per_s, g.tokens_per_s)}}}});
  }
  if (const std::string path = absl::GetFlag(FLAGS_json); !path.empty()) {
    std::ofstream(path) << out.dump(2) << "\n";
  }
  p->Signal(SIGTERM);
  p->Wait();
  if (!all_ok) std::fprintf(stderr, "http_api_bench: some requests failed\n");
  return all_ok ? 0 : 1;
}

}  // namespace
}  // namespace kvrm

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return kvrm::Run();
}
