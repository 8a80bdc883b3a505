// kvrm_replay: replays a request trace (or a synthetic arrival process) against kvrmd, open
// loop, and reports latency, throughput, goodput and per-second latency. See README.md.
//
// Exit status: 0 the replay ran (individual request errors are counted in the summary, not
// fatal); 1 setup failed (trace unreadable, server unreachable, outputs not writable); 2 usage.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "grpcpp/grpcpp.h"
#include "kvrm/v1/kvrm.grpc.pb.h"
#include "tools/replay/progress.h"
#include "tools/replay/prompt.h"
#include "tools/replay/replayer.h"
#include "tools/replay/report.h"
#include "tools/replay/stats.h"
#include "tools/replay/trace.h"
#include "tools/replay/workload.h"

ABSL_FLAG(std::string, server, "localhost:50051", "kvrmd address, host:port");
ABSL_FLAG(std::string, trace, "", "trace file (Azure CSV, Mooncake JSONL or BurstGPT CSV)");
ABSL_FLAG(std::string, format, "auto", "trace format: auto, azure, mooncake, burstgpt");
ABSL_FLAG(double, start, 0, "window start, seconds after the trace's first request");
ABSL_FLAG(double, duration, -1, "window length in seconds (trace time); < 0 = to the end");
ABSL_FLAG(double, time_scale, 1.0, "multiplies inter-arrival gaps; 0.1 = ten times faster");
ABSL_FLAG(double, input_scale, 1.0, "multiplies prompt lengths (and the 512-token hash blocks)");
ABSL_FLAG(double, output_scale, 1.0, "multiplies output lengths");
ABSL_FLAG(int32_t, prefix_len, 0,
          "a shared system prompt: this many tokens, the same for every request without the "
          "trace's hash ids, before its own prompt (as vLLM's benchmark --random-prefix-len)");
ABSL_FLAG(int32_t, max_requests, -1, "send at most this many requests; < 0 = all");
ABSL_FLAG(std::string, arrival, "trace",
          "trace (the trace's own arrival times), poisson or gamma (synthetic)");
ABSL_FLAG(double, rate, 1.0,
          "synthetic arrivals: mean requests per second (inf: all queued at once, to measure "
          "the server's capacity)");
ABSL_FLAG(double, cv, 1.0, "gamma arrivals: coefficient of variation of the gaps");
ABSL_FLAG(int32_t, num_requests, 100, "synthetic arrivals: how many requests");
ABSL_FLAG(std::string, lengths, "",
          "synthetic arrivals: length mix in:out[:weight],... (empty = the trace's empirical "
          "lengths)");
ABSL_FLAG(uint64_t, seed, 1, "seed of synthetic arrivals, length draws and prompt tokens");
ABSL_FLAG(std::string, slo, "", "goodput SLO as ttft_ms,tpot_ms (0 = no bound on that one)");
ABSL_FLAG(double, window_s, 1.0, "width of the per-window latency series, seconds");
ABSL_FLAG(double, request_timeout_s, 0, "deadline of each request; 0 = none");
ABSL_FLAG(double, connect_timeout_s, 30, "how long to wait for the server to answer");
ABSL_FLAG(bool, progress, true, "progress on stderr (a bar on a terminal, else a line per 5 s)");
ABSL_FLAG(std::string, lora_adapters, "",
          "LoRA adapters the requests name in turn, comma-separated (an empty entry: the base "
          "model; \"sql,,chat\" sends a third of the requests to each); empty: none");
ABSL_FLAG(std::string, json, "", "write the summary and windows as JSON here");
ABSL_FLAG(std::string, csv, "", "write one row per request here");
ABSL_FLAG(std::string, svg, "", "write the latency-over-time plot here");

namespace kvrm::replay {
namespace {

constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

int Fail(int code, const absl::Status& status) {
  fprintf(stderr, "error: %s\n", std::string(status.message()).c_str());
  return code;
}

// The requests to send, before clamping to the server.
absl::StatusOr<std::vector<PlannedRequest>> Plan() {
  const std::string arrival = absl::GetFlag(FLAGS_arrival);
  const std::string trace_path = absl::GetFlag(FLAGS_trace);
  std::vector<TraceRequest> trace;
  if (!trace_path.empty()) {
    absl::StatusOr<TraceFormat> format = ParseTraceFormat(absl::GetFlag(FLAGS_format));
    if (!format.ok()) return format.status();
    absl::StatusOr<std::vector<TraceRequest>> rows = ReadTrace(trace_path, *format);
    if (!rows.ok()) return rows.status();
    trace = std::move(*rows);
  }
  if (arrival == "trace") {
    if (trace_path.empty()) return absl::InvalidArgumentError("--arrival=trace needs --trace");
    ShapeOptions o;
    o.start_s = absl::GetFlag(FLAGS_start);
    o.duration_s = absl::GetFlag(FLAGS_duration);
    o.time_scale = absl::GetFlag(FLAGS_time_scale);
    o.input_scale = absl::GetFlag(FLAGS_input_scale);
    o.output_scale = absl::GetFlag(FLAGS_output_scale);
    o.max_requests = absl::GetFlag(FLAGS_max_requests);
    return ShapeTrace(trace, o);
  }
  absl::StatusOr<ArrivalProcess> process = ParseArrivalProcess(arrival);
  if (!process.ok()) return process.status();
  const double rate = absl::GetFlag(FLAGS_rate);
  const int n = absl::GetFlag(FLAGS_num_requests);
  if (!(rate > 0) || n < 1) {
    return absl::InvalidArgumentError("--rate must be > 0 and --num_requests >= 1");
  }
  std::vector<LengthMixEntry> mix;
  if (const std::string lengths = absl::GetFlag(FLAGS_lengths); !lengths.empty()) {
    absl::StatusOr<std::vector<LengthMixEntry>> parsed = ParseLengthMix(lengths);
    if (!parsed.ok()) return parsed.status();
    mix = std::move(*parsed);
  } else if (trace.empty()) {
    return absl::InvalidArgumentError("synthetic arrivals need --lengths or --trace");
  }
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  const std::vector<double> arrivals =
      SyntheticArrivals(*process, rate, absl::GetFlag(FLAGS_cv), n, seed);
  return SyntheticRequests(arrivals, mix, trace, absl::GetFlag(FLAGS_input_scale),
                           absl::GetFlag(FLAGS_output_scale), seed);
}

int Main() {
  absl::StatusOr<Slo> slo = Slo{};
  if (const std::string s = absl::GetFlag(FLAGS_slo); !s.empty()) slo = ParseSlo(s);
  if (!slo.ok()) return Fail(kExitUsage, slo.status());
  if (!(absl::GetFlag(FLAGS_window_s) > 0)) {
    return Fail(kExitUsage, absl::InvalidArgumentError("--window_s must be > 0"));
  }
  if (absl::GetFlag(FLAGS_prefix_len) < 0) {
    return Fail(kExitUsage, absl::InvalidArgumentError("--prefix_len must be >= 0"));
  }
  absl::StatusOr<std::vector<PlannedRequest>> plan = Plan();
  if (plan.ok()) PrependSharedPrefix(absl::GetFlag(FLAGS_prefix_len), &*plan);
  if (!plan.ok()) {
    const bool usage = plan.status().code() == absl::StatusCode::kInvalidArgument &&
                       absl::GetFlag(FLAGS_trace).empty();
    return Fail(usage ? kExitUsage : kExitFailure, plan.status());
  }
  if (plan->empty()) {
    return Fail(kExitFailure, absl::InvalidArgumentError("no requests in the chosen window"));
  }

  auto channel =
      grpc::CreateChannel(absl::GetFlag(FLAGS_server), grpc::InsecureChannelCredentials());
  auto stub = v1::Kvrm::NewStub(channel);
  absl::StatusOr<v1::ModelInfo> info =
      FetchModelInfo(*stub, absl::GetFlag(FLAGS_connect_timeout_s));
  if (!info.ok()) return Fail(kExitFailure, info.status());
  ServerLimits limits;
  limits.max_context = info->max_context();
  limits.max_new_tokens_limit = info->max_new_tokens_limit();
  const int clamped = ClampToServer(limits, &*plan);
  std::vector<int32_t> special(info->eos_token_ids().begin(), info->eos_token_ids().end());
  special.push_back(info->bos_token_id());
  absl::StatusOr<PromptSynthesizer> prompts =
      PromptSynthesizer::Create(info->vocab_size(), special, absl::GetFlag(FLAGS_seed));
  if (!prompts.ok()) return Fail(kExitFailure, prompts.status());
  fprintf(stderr,
          "replay: %zu requests over %.1f s against %s (%s, context %d, vocab %d); %d clamped "
          "to fit\n",
          plan->size(), plan->back().send_at_s, absl::GetFlag(FLAGS_server).c_str(),
          info->name().c_str(), info->max_context(), info->vocab_size(), clamped);

  ProgressReporter progress(stderr, absl::GetFlag(FLAGS_progress), isatty(STDERR_FILENO) != 0);
  ReplayOptions options;
  options.request_timeout_s = absl::GetFlag(FLAGS_request_timeout_s);
  options.progress = &progress;
  if (const std::string list = absl::GetFlag(FLAGS_lora_adapters); !list.empty()) {
    options.lora_adapters = absl::StrSplit(list, ',');
  }
  const std::vector<RequestRecord> records = Replay(*stub, *plan, *prompts, options);

  const Summary summary = Summarize(records, *slo, absl::GetFlag(FLAGS_window_s));
  fputs(FormatTable(summary).c_str(), stdout);
  fflush(stdout);
  const std::string title =
      absl::StrCat("kvrm replay: ",
                   absl::GetFlag(FLAGS_trace).empty() ? absl::GetFlag(FLAGS_arrival)
                                                      : absl::GetFlag(FLAGS_trace),
                   " (", summary.requests, " requests)");
  struct Output {
    std::string path;
    std::string contents;
  };
  const Output outputs[] = {
      {absl::GetFlag(FLAGS_json),
       absl::GetFlag(FLAGS_json).empty() ? "" : SummaryToJson(summary).dump(2) + "\n"},
      {absl::GetFlag(FLAGS_csv), absl::GetFlag(FLAGS_csv).empty() ? "" : RecordsToCsv(records)},
      {absl::GetFlag(FLAGS_svg), absl::GetFlag(FLAGS_svg).empty() ? "" : RenderSvg(summary, title)},
  };
  for (const Output& o : outputs) {
    if (o.path.empty()) continue;
    if (absl::Status s = WriteFile(o.path, o.contents); !s.ok()) return Fail(kExitFailure, s);
  }
  return 0;
}

}  // namespace
}  // namespace kvrm::replay

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "kvrm_replay --server=HOST:PORT --trace=FILE [--time_scale=S --start=S --duration=S ...]");
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    fprintf(stderr, "error: unexpected argument \"%s\"\n", rest[1]);
    return 2;
  }
  return kvrm::replay::Main();
}
