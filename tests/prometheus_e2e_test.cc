// kvrmd's metrics against Prometheus' own tools: a running kvrmd is scraped by promtool's
// linter and by a real Prometheus server on loopback, and the p99 time to first token read back
// through Prometheus' HTTP API agrees with what the client measured, within one bucket. Also
// checks /healthz and /readyz through a SIGTERM drain.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/json.h"
#include "common/subprocess.h"
#include "gtest/gtest.h"
#include "metrics/http_get.h"
#include "metrics/kvrm_metrics.h"
#include "tests/test_server.h"

namespace kvrm {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string TmpDir() { return TestTmpDir(); }

Subprocess Spawn(const std::vector<std::string>& argv, const std::string& name) {
  absl::StatusOr<Subprocess> p = Subprocess::Start(argv, {TmpDir() + "/" + name + ".log", ""});
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? std::move(*p) : Subprocess();
}

// Runs a shell command, returning its exit status and output.
std::pair<int, std::string> Shell(const std::string& command) {
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

int ReadPortFile(const std::string& path, Subprocess& c) {
  absl::StatusOr<int> port = c.WaitForPortFile(path, absl::Seconds(20));
  EXPECT_TRUE(port.ok()) << port.status();
  return port.ok() ? *port : 0;
}

// A port that was free a moment ago (Prometheus takes a fixed --web.listen-address).
int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

// An instant query's single scalar result; NaN when there is none yet.
double QueryPrometheus(int port, const std::string& promql) {
  absl::StatusOr<HttpResponse> r =
      HttpGet("127.0.0.1", port, "/api/v1/query?query=" + UrlEncode(promql), absl::Seconds(5));
  if (!r.ok() || r->code != 200) return std::nan("");
  absl::StatusOr<Json> j = ParseJson(r->body, "prometheus response");
  if (!j.ok() || !j->contains("data")) return std::nan("");
  const Json& result = (*j)["data"].value("result", Json::array());
  if (!result.is_array() || result.size() != 1 || !result[0].contains("value")) {
    return std::nan("");
  }
  const Json& value = result[0]["value"];
  double v = std::nan("");
  if (value.is_array() && value.size() == 2 && value[1].is_string()) {
    if (!absl::SimpleAtod(value[1].get_ref<const std::string&>(), &v)) v = std::nan("");
  }
  return v;
}

// Index of the bucket (bounds[i-1], bounds[i]] holding `v`; bounds.size() for +Inf.
int BucketIndex(const std::vector<double>& bounds, double v) {
  return static_cast<int>(std::lower_bound(bounds.begin(), bounds.end(), v) - bounds.begin());
}

// Time to first token of one request, in seconds: as the client sees it (from the call to the
// first streamed message) and as the server reports it in the final message (arrival to first
// token: what kvrm:time_to_first_token_seconds observes).
struct Ttft {
  double client = -1;
  double server = -1;
};

Ttft MeasuredTtft(v1::Kvrm::Stub& stub, const v1::GenerateRequest& req) {
  grpc::ClientContext ctx;
  const Clock::time_point start = Clock::now();
  auto reader = stub.Generate(&ctx, req);
  v1::GenerateResponse msg;
  Ttft t;
  while (reader->Read(&msg)) {
    if (t.client < 0 && msg.token_ids_size() > 0) {
      t.client = std::chrono::duration<double>(Clock::now() - start).count();
    }
    if (msg.has_finished()) t.server = msg.finished().time_to_first_token_ms() / 1e3;
  }
  EXPECT_TRUE(reader->Finish().ok());
  return t;
}

// The p99 of `v` (sorted in place), interpolated between ranks as numpy's default.
double P99(std::vector<double>& v) {
  std::sort(v.begin(), v.end());
  const double rank = 0.99 * (static_cast<double>(v.size()) - 1);
  const size_t lo = static_cast<size_t>(rank), hi = std::min(v.size() - 1, lo + 1);
  return v[lo] + (rank - std::floor(rank)) * (v[hi] - v[lo]);
}

// The p99 histogram_quantile places: in the bucket where the cumulative count reaches
// 0.99 * count, i.e. the bucket of the nearest-rank p99 (of 12 observations, the largest). The
// interpolated P99 above can sit a bucket lower when the two largest straddle a boundary.
double NearestRankP99(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(0.99 * static_cast<double>(v.size())));
  return v[std::max<size_t>(rank, 1) - 1];
}

TEST(PrometheusE2eTest, RealPrometheusScrapesKvrmdAndAgreesOnP99Ttft) {
  const std::string tmp = TmpDir();
  const std::string grpc_port_file = tmp + "/grpc.port";
  const std::string metrics_port_file = tmp + "/metrics.port";
  Subprocess kvrmd =
      Spawn({"server/kvrmd", "--model=" + TinyModelDir(), "--listen=127.0.0.1:0",
         "--port_file=" + grpc_port_file, "--metrics_listen=127.0.0.1", "--metrics_port=0",
         "--http_port=-1", "--metrics_port_file=" + metrics_port_file, "--slots=2", "--threads=2",
         "--drain_grace_s=30"},
        "kvrmd");
  const int grpc_port = ReadPortFile(grpc_port_file, kvrmd);
  const int metrics_port = ReadPortFile(metrics_port_file, kvrmd);
  ASSERT_GT(grpc_port, 0);
  ASSERT_GT(metrics_port, 0);
  auto probe = [&](const std::string& path) {
    absl::StatusOr<HttpResponse> r = HttpGet("127.0.0.1", metrics_port, path);
    return r.ok() ? r->code : -1;
  };
  EXPECT_EQ(probe("/healthz"), 200);
  EXPECT_EQ(probe("/readyz"), 200);

  // Prometheus, scraping every second, storing under TEST_TMPDIR, listening on loopback.
  const int prom_port = FreeLoopbackPort();
  const std::string config = tmp + "/prometheus.yml";
  std::ofstream(config) << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                        << "scrape_configs:\n  - job_name: kvrmd\n    static_configs:\n"
                        << "      - targets: ['127.0.0.1:" << metrics_port << "']\n";
  Subprocess prometheus =
      Spawn({"/usr/bin/prometheus", "--config.file=" + config, "--storage.tsdb.path=" + tmp + "/tsdb",
         "--web.listen-address=127.0.0.1:" + std::to_string(prom_port)},
        "prometheus");

  // A few generations, TTFT measured by the client.
  auto stub = v1::Kvrm::NewStub(grpc::CreateChannel(absl::StrCat("127.0.0.1:", grpc_port),
                                                    grpc::InsecureChannelCredentials()));
  constexpr int kRequests = 12;
  std::vector<double> client_ttfts, server_ttfts;
  for (int i = 0; i < kRequests; ++i) {
    v1::GenerateRequest req =
        TextRequest(absl::StrCat("metrics request ", i, std::string(i * 8, 'x')), 8);
    req.mutable_stopping()->set_ignore_eos(true);
    const Ttft t = MeasuredTtft(*stub, req);
    ASSERT_GT(t.client, 0);
    ASSERT_GT(t.server, 0);
    client_ttfts.push_back(t.client);
    server_ttfts.push_back(t.server);
  }

  // promtool lints a real scrape. The vLLM-style "kvrm:" names trip exactly one lint rule
  // (colons are meant for recording rules); everything else must be clean, which the same
  // scrape with the prefix renamed proves with exit status 0.
  absl::StatusOr<HttpResponse> scrape = HttpGet("127.0.0.1", metrics_port, "/metrics");
  ASSERT_TRUE(scrape.ok() && scrape->code == 200);
  EXPECT_TRUE(absl::StrContains(scrape->body, "kvrm:request_success_total{"));
  std::ofstream(tmp + "/scrape.txt") << scrape->body;
  std::ofstream(tmp + "/scrape_renamed.txt")
      << absl::StrReplaceAll(scrape->body, {{"kvrm:", "kvrm_"}});
  auto [raw_rc, raw_out] = Shell("/usr/bin/promtool check metrics < " + tmp + "/scrape.txt");
  EXPECT_TRUE(raw_rc == 0 || raw_rc == 3) << raw_rc << ": " << raw_out;  // 1: unparseable
  for (absl::string_view line : absl::StrSplit(raw_out, '\n', absl::SkipEmpty())) {
    EXPECT_TRUE(absl::StrContains(line, "metric names should not contain ':'")) << line;
  }
  auto [rc, out] = Shell("/usr/bin/promtool check metrics < " + tmp + "/scrape_renamed.txt");
  EXPECT_EQ(rc, 0) << out;

  // Wait (bounded) until Prometheus has scraped every request's TTFT.
  const std::string count_query = "sum(kvrm:time_to_first_token_seconds_count{job=\"kvrmd\"})";
  double seen = std::nan("");
  for (int i = 0; i < 300 && !(seen == kRequests); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    seen = QueryPrometheus(prom_port, count_query);
  }
  ASSERT_EQ(seen, kRequests) << prometheus.LogTail();

  // Over the raw cumulative counts (all requests so far), the p99 Prometheus computes must
  // fall in the bucket of the p99 of the TTFTs the server reported per request (what the
  // histogram observed; histogram_quantile interpolates inside that bucket) or a neighbouring
  // one. The client's figure adds the RPC and tokenization: on a busy 2-core machine with tiny-
  // model TTFTs of a few ms that can be two buckets up, so it is only checked to sit at or above
  // the server's.
  const double prom_p99 = QueryPrometheus(
      prom_port, "histogram_quantile(0.99, sum by (le) (kvrm:time_to_first_token_seconds_bucket))");
  ASSERT_FALSE(std::isnan(prom_p99));
  const double server_rank_p99 = NearestRankP99(server_ttfts);
  const double server_p99 = P99(server_ttfts), client_p99 = P99(client_ttfts);
  const std::vector<double>& bounds = TtftBuckets();
  EXPECT_LE(std::abs(BucketIndex(bounds, prom_p99) - BucketIndex(bounds, server_rank_p99)), 1)
      << "prometheus p99 " << prom_p99 << " s, server-reported p99 (nearest rank) "
      << server_rank_p99 << " s";
  EXPECT_GE(BucketIndex(bounds, client_p99), BucketIndex(bounds, server_p99))
      << "client p99 " << client_p99 << " s, server-reported p99 " << server_p99 << " s";
  // Prometheus' figure never exceeds the upper bound of the server-reported p99's bucket.
  EXPECT_LE(prom_p99,
            bounds[std::min<size_t>(BucketIndex(bounds, server_rank_p99), bounds.size() - 1)])
      << "server-reported p99 (nearest rank) " << server_rank_p99 << " s";
  // Tokens counted by the server match what the client asked for.
  EXPECT_EQ(QueryPrometheus(prom_port, "sum(kvrm:generation_tokens_total)"), kRequests * 8);
  EXPECT_EQ(
      QueryPrometheus(prom_port, "sum(kvrm:request_success_total{finished_reason=\"length\"})"),
      kRequests);

  // Drain: readiness flips to 503 while an in-flight stream finishes; health stays 200.
  std::atomic<bool> first{false};
  grpc::Status long_status;
  std::thread client([&] {
    v1::GenerateRequest req = TextRequest("a long stream during the drain", 400);
    req.mutable_stopping()->set_ignore_eos(true);
    grpc::ClientContext ctx;
    auto reader = stub->Generate(&ctx, req);
    v1::GenerateResponse msg;
    while (reader->Read(&msg)) first = true;
    long_status = reader->Finish();
  });
  for (int i = 0; i < 500 && !first; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(first.load());
  kvrmd.Signal(SIGTERM);
  int ready = 200;
  for (int i = 0; i < 400 && ready == 200; ++i) {
    ready = probe("/readyz");
    if (ready == 200) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // The stream may outrun the probe on a fast machine: then the process has gone (-1).
  EXPECT_TRUE(ready == 503 || ready == -1) << ready;
  if (ready == 503) {
    EXPECT_EQ(probe("/healthz"), 200);
  }
  client.join();
  EXPECT_TRUE(long_status.ok()) << long_status.error_message();
  EXPECT_EQ(kvrmd.Wait(), 0) << kvrmd.LogTail();

  prometheus.Signal(SIGTERM);
  EXPECT_EQ(prometheus.Wait(), 0) << prometheus.LogTail();
}

}  // namespace
}  // namespace kvrm
