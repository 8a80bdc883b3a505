// End to end: kvrmd (the tiny model, 8 slots) started as a process, kvrm_replay run against it on
// 30 seconds of the Azure conversation trace, time-compressed about three times with lengths
// scaled to the tiny model. Every request of the window must be accounted for in the summary.
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/json.h"
#include "common/subprocess.h"
#include "gtest/gtest.h"
#include "tools/replay/trace.h"
#include "tools/replay/trace_files.h"

namespace kvrm::replay {
namespace {

namespace fs = std::filesystem;

std::string TmpDir() { return TestTmpDir(); }

// kvrm_replay's per-request deadline: 60 s, times TestTimeoutScale() (raised under
// ThreadSanitizer, where kvrmd runs 5-15x slower).
std::string RequestTimeoutFlag() {
  return absl::StrCat("--request_timeout_s=", 60 * TestTimeoutScale());
}

std::string ReadAll(const std::string& path) {
  absl::StatusOr<std::string> s = ReadFileToString(path);
  return s.ok() ? *s : "";
}

// Runs argv to completion with stderr to `log` (and stdout too, unless `out` is given); its exit
// code.
int RunToExit(const std::vector<std::string>& args, const std::string& log,
              const std::string& out = "") {
  absl::StatusOr<Subprocess> p = Subprocess::Start(args, {log, out});
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? p->Wait() : -1;
}

// Rows of the Azure CSV whose timestamp is within `seconds` of the first, counted directly from
// the text (independently of the replay's own windowing).
int RowsInFirstSeconds(const std::string& path, double seconds) {
  const std::string text = ReadAll(path);
  std::vector<std::string> lines = absl::StrSplit(text, '\n', absl::SkipEmpty());
  double first = -1;
  int n = 0;
  for (size_t i = 1; i < lines.size(); ++i) {
    absl::StatusOr<double> t = ParseAzureTimestamp(lines[i].substr(0, lines[i].find(',')));
    if (!t.ok()) continue;
    if (first < 0) first = *t;
    if (*t - first < seconds) ++n;
  }
  return n;
}

class KvrmdProcess {
 public:
  explicit KvrmdProcess(int slots = 8, int max_queue = 256,
                        const std::vector<std::string>& more_flags = {}) {
    const std::string port_file = TmpDir() + "/kvrmd.port";
    fs::remove(port_file);
    std::vector<std::string> args = {
        "server/kvrmd", "--model=builtin:tiny", "--model_cache=" + TmpDir() + "/models",
        "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1", "--metrics_port=0",
        "--http_port=-1", "--port_file=" + port_file, "--slots=" + std::to_string(slots),
        "--max_queue=" + std::to_string(max_queue), "--threads=2"};
    args.insert(args.end(), more_flags.begin(), more_flags.end());
    absl::StatusOr<Subprocess> p = Subprocess::Start(args, {TmpDir() + "/kvrmd.log", ""});
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return;
    process_ = std::move(*p);
    absl::StatusOr<int> port = process_.WaitForPortFile(port_file, absl::Seconds(60));
    EXPECT_TRUE(port.ok()) << port.status();
    port_ = port.ok() ? *port : 0;
  }
  ~KvrmdProcess() {
    process_.Signal(SIGTERM);
    process_.Wait();
  }
  int port() const { return port_; }
  std::string Log() const { return process_.LogTail(1 << 20); }

 private:
  Subprocess process_;
  int port_ = 0;
};


TEST(ReplayE2eTest, ThirtySecondsOfAzureTraceAllAccountedFor) {
  const std::string traces = FindTracesDir();
  if (traces.empty()) GTEST_SKIP() << "no shared/traces beside the checkout; set KVRM_TRACES_DIR";
  const std::string trace = traces + "/azure-conv-2023/AzureLLMInferenceTrace_conv.csv";
  const int expected = RowsInFirstSeconds(trace, 30);
  ASSERT_GT(expected, 20);

  KvrmdProcess kvrmd;
  ASSERT_GT(kvrmd.port(), 0) << kvrmd.Log();

  const std::string json = TmpDir() + "/summary.json";
  const std::string csv = TmpDir() + "/requests.csv";
  const std::string svg = TmpDir() + "/latency.svg";
  const std::string log = TmpDir() + "/replay.log";
  const std::string out = TmpDir() + "/replay.out";
  const auto start = std::chrono::steady_clock::now();
  const int replay_exit =
      RunToExit({"tools/replay/kvrm_replay", "--server=127.0.0.1:" + std::to_string(kvrmd.port()),
             "--trace=" + trace, "--start=0", "--duration=30", "--time_scale=0.33",
             "--input_scale=0.1", "--output_scale=0.1", "--slo=1000,100", "--json=" + json,
             "--csv=" + csv, "--svg=" + svg, RequestTimeoutFlag()},
          log, out);
  ASSERT_EQ(replay_exit, 0) << ReadAll(log) << ReadAll(out);
  const double wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Open loop: the run lasts about the compressed window, 30 s * 0.33.
  EXPECT_GT(wall_s, 8.0);
  EXPECT_LT(wall_s, 40.0);

  absl::StatusOr<Json> summary = ReadJsonFile(json);
  ASSERT_TRUE(summary.ok()) << summary.status();
  const Json& s = *summary;
  EXPECT_EQ(s["requests"].get<int>(), expected) << s.dump(2);
  // Each request either completed or was refused for a full queue; nothing else went wrong.
  EXPECT_EQ(s["completed"].get<int>() + s["refused"].get<int>(), expected) << s.dump(2);
  EXPECT_EQ(s["failed"].get<int>(), 0) << s.dump(2);
  EXPECT_GT(s["completed"].get<int>(), 0);
  EXPECT_GT(s["output_tokens"].get<int64_t>(), 0);
  EXPECT_GT(s["ttft_ms"]["count"].get<int>(), 0);
  EXPECT_GE(s["windows"].size(), 9u);
  int arrivals = 0;
  for (const Json& w : s["windows"]) arrivals += w["arrivals"].get<int>();
  EXPECT_EQ(arrivals, expected);

  // Per request: a completed request produced exactly the tokens it asked for (ignore_eos), and
  // its prompt plus output fit the tiny model's 512 positions.
  const std::vector<std::string> rows = absl::StrSplit(ReadAll(csv), '\n', absl::SkipEmpty());
  ASSERT_EQ(rows.size(), static_cast<size_t>(expected) + 1);
  for (size_t i = 1; i < rows.size(); ++i) {
    const std::vector<std::string> f = absl::StrSplit(rows[i], ',');
    ASSERT_GE(f.size(), 16u) << rows[i];
    int input = 0, requested = 0, got = 0, cached = -1;
    ASSERT_TRUE(absl::SimpleAtoi(f[6], &input) && absl::SimpleAtoi(f[7], &requested) &&
                absl::SimpleAtoi(f[8], &got) && absl::SimpleAtoi(f[10], &cached))
        << rows[i];
    EXPECT_LE(input + requested, 512) << rows[i];
    // Azure rows carry no hash ids: the synthesized prompts share no 16-token block.
    EXPECT_EQ(cached, 0) << rows[i];
    if (f[14] == "OK") {
      EXPECT_EQ(got, requested) << rows[i];
      EXPECT_EQ(f[9], std::to_string(requested)) << rows[i];  // the server's own count
      EXPECT_EQ(f[15], "LENGTH") << rows[i];
    } else {
      EXPECT_EQ(f[14], "RESOURCE_EXHAUSTED") << rows[i];
    }
  }
  const std::string plot = ReadAll(svg);
  EXPECT_NE(plot.find("</svg>"), std::string::npos);
  EXPECT_NE(ReadAll(out).find("time to first token"), std::string::npos);
}

// Conversations in Mooncake's format (testdata/mooncake_conversations.jsonl): two of them whose
// turns repeat the previous turn's hash ids (the same 512-token blocks, 32 tokens at
// --input_scale=0.0625) and share block 0 (a system prompt). Against kvrmd (prefix caching on by
// default) each turn finds what came before it in the server's prefix cache, 16-token blocks
// at a time: B1 the system prompt (32), A2 and B2 their first turns' prompts (96 each; the
// outputs that followed differ from the new blocks), A3 A2's prompt (160). The summary says so.
TEST(ReplayE2eTest, ConversationTurnsHitThePrefixCache) {
  KvrmdProcess kvrmd;
  ASSERT_GT(kvrmd.port(), 0) << kvrmd.Log();
  const std::string json = TmpDir() + "/conversations.json";
  const std::string csv = TmpDir() + "/conversations.csv";
  const std::string log = TmpDir() + "/conversations.log";
  ASSERT_EQ(RunToExit({"tools/replay/kvrm_replay",
                       "--server=127.0.0.1:" + std::to_string(kvrmd.port()),
                       "--trace=tools/replay/testdata/mooncake_conversations.jsonl",
                       "--input_scale=0.0625", "--output_scale=0.0625", "--json=" + json,
                       "--csv=" + csv, RequestTimeoutFlag()},
                      log),
            0)
      << ReadAll(log);
  absl::StatusOr<Json> summary = ReadJsonFile(json);
  ASSERT_TRUE(summary.ok()) << summary.status() << ReadAll(log);
  const Json& s = *summary;
  EXPECT_EQ(s["completed"].get<int>(), 5) << s.dump(2);
  EXPECT_EQ(s["input_tokens"].get<int64_t>(), 96 + 96 + 160 + 128 + 224) << s.dump(2);
  EXPECT_EQ(s["cached_input_tokens"].get<int64_t>(), 32 + 96 + 96 + 160) << s.dump(2);
  const std::vector<std::string> rows = absl::StrSplit(ReadAll(csv), '\n', absl::SkipEmpty());
  ASSERT_EQ(rows.size(), 6u);
  const std::vector<std::string> expected = {"0", "32", "96", "96", "160"};
  for (size_t i = 0; i < expected.size(); ++i) {
    const std::vector<std::string> f = absl::StrSplit(rows[i + 1], ',');
    ASSERT_GT(f.size(), 10u) << rows[i + 1];
    EXPECT_EQ(f[10], expected[i]) << rows[i + 1];
  }
}

// Runs kvrm_replay with synthetic arrivals and returns its JSON summary.
Json RunSynthetic(int port, const std::vector<std::string>& flags) {
  const std::string json = TmpDir() + "/synthetic.json";
  const std::string log = TmpDir() + "/synthetic.log";
  std::vector<std::string> args = {"tools/replay/kvrm_replay",
                                   "--server=127.0.0.1:" + std::to_string(port), "--json=" + json,
                                   RequestTimeoutFlag()};
  args.insert(args.end(), flags.begin(), flags.end());
  EXPECT_EQ(RunToExit(args, log), 0) << ReadAll(log);
  absl::StatusOr<Json> summary = ReadJsonFile(json);
  EXPECT_TRUE(summary.ok()) << summary.status() << ReadAll(log);
  return summary.ok() ? *summary : Json::object();
}

// A burst far beyond 8 slots with a deep queue: all 250 streams are open at once on the one
// replay thread, and every one completes with all its tokens.
//
// Seed 2: with --seed=1 request 101's final message carries text with an incomplete UTF-8
// character, which protobuf refuses to parse, so the client loses that message (a server bug,
// reported with this tool; the replay counts such a stream as failed, "NONE" finish reason).
TEST(ReplayE2eTest, HundredsOfConcurrentStreamsComplete) {
  KvrmdProcess kvrmd(8, 400);
  ASSERT_GT(kvrmd.port(), 0) << kvrmd.Log();
  const Json s = RunSynthetic(kvrmd.port(), {"--arrival=gamma", "--cv=2", "--rate=2000",
                                             "--num_requests=250", "--lengths=16:16", "--seed=2"});
  EXPECT_EQ(s["requests"], 250) << s.dump(2);
  EXPECT_EQ(s["completed"], 250) << s.dump(2);
  EXPECT_EQ(s["output_tokens"], 250 * 16) << s.dump(2);
}

// A shallow queue refuses part of a burst with RESOURCE_EXHAUSTED; the summary counts them.
TEST(ReplayE2eTest, RefusalsAreCounted) {
  KvrmdProcess kvrmd(2, 4);
  ASSERT_GT(kvrmd.port(), 0) << kvrmd.Log();
  const Json s = RunSynthetic(
      kvrmd.port(), {"--arrival=poisson", "--rate=1000", "--num_requests=100", "--lengths=16:32"});
  EXPECT_EQ(s["requests"], 100) << s.dump(2);
  EXPECT_GT(s["refused"].get<int>(), 0) << s.dump(2);
  EXPECT_GT(s["completed"].get<int>(), 0) << s.dump(2);
  EXPECT_EQ(s["completed"].get<int>() + s["refused"].get<int>(), 100) << s.dump(2);
  EXPECT_EQ(s["status_codes"]["RESOURCE_EXHAUSTED"], s["refused"]) << s.dump(2);
}

// --lora_adapters: the requests name the adapters in turn ("" the base model); a name kvrmd
// does not serve is refused (INVALID_ARGUMENT) and counted, the others complete.
TEST(ReplayE2eTest, RequestsNameLoraAdaptersInTurn) {
  KvrmdProcess kvrmd(8, 256, {"--lora_modules=sql=builtin,chat=builtin"});
  ASSERT_GT(kvrmd.port(), 0) << kvrmd.Log();
  const Json s = RunSynthetic(kvrmd.port(), {"--arrival=poisson", "--rate=200",
                                             "--num_requests=40", "--lengths=16:8",
                                             "--lora_adapters=sql,,chat,nope"});
  EXPECT_EQ(s["requests"], 40) << s.dump(2);
  EXPECT_EQ(s["completed"], 30) << s.dump(2);
  EXPECT_EQ(s["status_codes"]["INVALID_ARGUMENT"], 10) << s.dump(2);
}

}  // namespace
}  // namespace kvrm::replay
