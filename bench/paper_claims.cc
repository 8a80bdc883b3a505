// The headline benchmark: the paper's four claims, kvrm vs the static baseline, side by side in
// one run, at the same KV memory budget and the same slot count (the decode step has the same
// rows in both modes; the static baseline reserves max context per slot, so the budget backs
// only budget / max_context of them, which is what a static-graph executor does).
//
//   bazel build -c opt //bench:paper_claims //server:kvrmd
//   bazel-bin/bench/paper_claims --kvrmd=bazel-bin/server/kvrmd --model=builtin:tiny \
//       --traces=../shared/traces --json=docs/results-claims.json --markdown=docs/claims.md
//
// For each workload (three token-length families with Poisson arrivals, and windows of the two
// real traces, time-compressed and length-scaled to the model) and each mode, it starts kvrmd,
// replays the workload open loop (tools/replay), samples the server's reserved KV blocks every
// 50 ms, stops kvrmd, and then prints the claims:
//   1. decode throughput (output tokens/s) on the mixed family: kvrm / static, at saturation
//      (the family's requests all queued at once, so each mode runs at its capacity; at the
//      family's own rate a mode that keeps up serves the offered load, which the first table
//      also shows);
//   2. p99 TTFT and p99 TPOT: kvrm vs static;
//   3. reserved KV memory (mean over the run): kvrm / static;
//   4. burst spikes: the worst one-second p99 inter-token latency over the run's median.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/families.h"
#include "common/status_macros.h"
#include "common/subprocess.h"
#include "grpcpp/grpcpp.h"
#include "kvrm/v1/kvrm.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "tools/replay/prompt.h"
#include "tools/replay/replayer.h"
#include "tools/replay/report.h"
#include "tools/replay/stats.h"
#include "tools/replay/trace.h"
#include "tools/replay/workload.h"

ABSL_FLAG(std::string, kvrmd, "bazel-bin/server/kvrmd", "the kvrmd binary");
ABSL_FLAG(std::string, model, "builtin:tiny", "model for both modes");
ABSL_FLAG(std::string, model_cache, "/tmp/kvrm-claims-models", "where builtin models go");
ABSL_FLAG(std::string, traces, "../shared/traces", "folder with the two production traces");
ABSL_FLAG(int32_t, slots, 16, "decode slots (both modes)");
ABSL_FLAG(double, budget_fraction, 0.35,
          "KV budget as a fraction of slots x max context (both modes)");
ABSL_FLAG(int32_t, threads, 2, "kvrmd threads");
ABSL_FLAG(std::string, kv_reserve, "prompt_output", "kvrm mode's --kv_reserve");
ABSL_FLAG(std::string, kv_dtype, "f32",
          "kvrmd --kv_dtype (both modes): f32, bf16, fp8 or fp8_e5m2");
ABSL_FLAG(int32_t, prefill_chunk, 32,
          "kvrmd --prefill_chunk (both modes; small chunks keep inter-token latency smooth)");
ABSL_FLAG(bool, fuse_prefill, true, "kvrmd --fuse_prefill (both modes)");
ABSL_FLAG(int32_t, prefix_len, 0,
          "a shared system prompt of this many tokens before every prompt of the three "
          "families (replay --prefix_len); the traces keep their own");
ABSL_FLAG(bool, prefix_caching, true,
          "kvrmd --prefix_caching (kvrm mode; the static baseline has no block table to share)");
ABSL_FLAG(double, duration_s, 20, "seconds of arrivals per workload");
ABSL_FLAG(double, rate, 0, "synthetic arrivals per second (0: chosen per family)");
ABSL_FLAG(std::string, workloads, "short,mixed,long,azure,mooncake", "which workloads to run");
ABSL_FLAG(double, input_scale, 1.0, "extra factor on every prompt length (CPU runs: < 1)");
ABSL_FLAG(double, output_scale, 1.0, "extra factor on every output length");
ABSL_FLAG(double, trace_time_scale, 1.0, "time compression of the trace windows");
ABSL_FLAG(int32_t, repeats, 1,
          "runs of each workload in both modes (their order alternating); the table shows the "
          "run with the median throughput ratio, the JSON and a line per workload all of them");
ABSL_FLAG(bool, saturation, true,
          "also measure claim 1's throughput at saturation: each family's requests all queued at "
          "once (vLLM's --request-rate inf), so the figure is each mode's capacity; at the "
          "families' own rates a mode that keeps up serves only the offered load");
ABSL_FLAG(std::string, json, "", "write every summary and the claims as JSON");
ABSL_FLAG(std::string, markdown, "", "write the claims table as Markdown");

namespace kvrm {
namespace {

using replay::PlannedRequest;

struct Workload {
  std::string name;
  std::string description;
  std::vector<PlannedRequest> plan;
  bool family = false;  // a synthetic token-length family (measured at saturation too)
};

struct ModeResult {
  replay::Summary summary;
  double reserved_mean_bytes = 0;
  double reserved_peak_bytes = 0;
};

// ---- kvrmd as a child process ---------------------------------------------------------------

struct Daemon {
  Subprocess process;
  int port = 0;
};

absl::StatusOr<Daemon> StartKvrmd(const std::string& mode, int64_t kv_blocks) {
  const std::string dir = std::filesystem::temp_directory_path() / "kvrm-claims";
  std::filesystem::create_directories(dir);
  const std::string port_file = dir + "/port-" + mode;
  std::filesystem::remove(port_file);
  std::vector<std::string> args = {
      absl::GetFlag(FLAGS_kvrmd),
      "--model=" + absl::GetFlag(FLAGS_model),
      "--model_cache=" + absl::GetFlag(FLAGS_model_cache),
      "--listen=127.0.0.1:0",
      "--port_file=" + port_file,
      "--metrics_listen=127.0.0.1",
      "--metrics_port=0",
      "--http_port=-1",
      "--kv_mode=" + mode,
      "--kv_reserve=" + absl::GetFlag(FLAGS_kv_reserve),
      "--kv_dtype=" + absl::GetFlag(FLAGS_kv_dtype),
      absl::StrCat("--slots=", absl::GetFlag(FLAGS_slots)),
      absl::StrCat("--kv_blocks=", kv_blocks),
      absl::StrCat("--threads=", absl::GetFlag(FLAGS_threads)),
      absl::StrCat("--prefill_chunk=", absl::GetFlag(FLAGS_prefill_chunk)),
      absl::StrCat("--fuse_prefill=", absl::GetFlag(FLAGS_fuse_prefill) ? "true" : "false"),
      absl::StrCat("--prefix_caching=", absl::GetFlag(FLAGS_prefix_caching) ? "true" : "false"),
      "--max_queue=100000",
      "--log_level=warning",
  };
  Daemon d;
  ASSIGN_OR_RETURN(d.process, Subprocess::Start(args, {dir + "/kvrmd-" + mode + ".log", ""}));
  ASSIGN_OR_RETURN(d.port, d.process.WaitForPortFile(port_file, absl::Seconds(60)));
  return d;
}

void StopKvrmd(Daemon& d) {
  d.process.Signal(SIGTERM);
  d.process.Wait();
}

// ---- workloads ------------------------------------------------------------------------------

absl::StatusOr<std::vector<PlannedRequest>> Family(const std::string& mix, double rate,
                                                   double duration_s, double input_scale,
                                                   double output_scale, uint64_t seed) {
  auto entries = replay::ParseLengthMix(mix);
  if (!entries.ok()) return entries.status();
  const int n = std::max(1, static_cast<int>(rate * duration_s));
  const std::vector<double> arrivals =
      replay::SyntheticArrivals(replay::ArrivalProcess::kPoisson, rate, 1.0, n, seed);
  return replay::SyntheticRequests(arrivals, *entries, {}, input_scale, output_scale, seed);
}

// The busiest `duration_s` window of a trace (most arrivals), compressed by `time_scale`.
absl::StatusOr<std::vector<PlannedRequest>> TraceWindow(const std::string& path,
                                                        replay::TraceFormat format,
                                                        double duration_s, double time_scale,
                                                        double input_scale, double output_scale,
                                                        int max_requests) {
  auto trace = replay::ReadTrace(path, format);
  if (!trace.ok()) return trace.status();
  const double span = duration_s / time_scale;  // window length in the trace's own clock
  double best_start = 0;
  size_t best = 0;
  for (size_t i = 0, j = 0; i < trace->size(); ++i) {
    while (j < trace->size() && (*trace)[j].arrival_s < (*trace)[i].arrival_s + span) ++j;
    if (j - i > best) {
      best = j - i;
      best_start = (*trace)[i].arrival_s;
    }
  }
  replay::ShapeOptions o;
  o.start_s = best_start - (*trace)[0].arrival_s;
  o.duration_s = span;
  o.time_scale = time_scale;
  o.input_scale = input_scale;
  o.output_scale = output_scale;
  o.max_requests = max_requests;
  return replay::ShapeTrace(*trace, o);
}

// ---- one replay -----------------------------------------------------------------------------

absl::StatusOr<ModeResult> RunMode(const std::string& mode, int64_t kv_blocks,
                                   std::vector<PlannedRequest> plan) {
  auto daemon = StartKvrmd(mode, kv_blocks);
  if (!daemon.ok()) return daemon.status();
  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", daemon->port),
                                     grpc::InsecureChannelCredentials());
  auto stub = v1::Kvrm::NewStub(channel);
  auto info = replay::FetchModelInfo(*stub, 30);
  if (!info.ok()) {
    StopKvrmd(*daemon);
    return info.status();
  }
  replay::ServerLimits limits;
  limits.max_context = info->max_context();
  limits.max_new_tokens_limit = info->max_new_tokens_limit();
  replay::ClampToServer(limits, &plan);
  std::vector<int32_t> specials(info->eos_token_ids().begin(), info->eos_token_ids().end());
  specials.push_back(info->bos_token_id());
  auto prompts = replay::PromptSynthesizer::Create(info->vocab_size(), specials, 17);
  if (!prompts.ok()) {
    StopKvrmd(*daemon);
    return prompts.status();
  }
  // Reserved KV sampled while the replay runs.
  std::atomic<bool> done{false};
  ModeResult result;
  std::thread sampler([&] {
    auto s = v1::Kvrm::NewStub(channel);
    int samples = 0;
    double sum = 0;
    while (!done.load()) {
      grpc::ClientContext ctx;
      v1::ServerInfo si;
      if (s->GetServerInfo(&ctx, v1::GetServerInfoRequest(), &si).ok()) {
        const double bytes =
            static_cast<double>(si.kv().blocks_reserved()) * si.kv().bytes_per_block();
        sum += bytes;
        ++samples;
        result.reserved_peak_bytes = std::max(result.reserved_peak_bytes, bytes);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    result.reserved_mean_bytes = samples > 0 ? sum / samples : 0;
  });
  replay::ReplayOptions ro;
  ro.request_timeout_s = 600;
  const std::vector<replay::RequestRecord> records = replay::Replay(*stub, plan, *prompts, ro);
  done = true;
  sampler.join();
  StopKvrmd(*daemon);
  result.summary = replay::Summarize(records, replay::Slo{});
  return result;
}

// (static, kvrm) per run, and the run with the median throughput ratio.
struct PairedRuns {
  std::vector<std::pair<ModeResult, ModeResult>> runs;
  size_t median = 0;
  bool kvrm_first = false;  // the first run started with kvrm
};

double ThroughputRatio(const std::pair<ModeResult, ModeResult>& run) {
  const double s = run.first.summary.output_tokens_per_s;
  return s > 0 ? run.second.summary.output_tokens_per_s / s : 0;
}

// Both modes on the same plan, `repeats` times; the mode that goes first alternates from run to
// run, starting with kvrm when `kvrm_first`, so a drift of the machine's speed during a
// workload does not favour one mode (and with one run each, the callers alternate it from one
// workload to the next).
absl::StatusOr<PairedRuns> RunPaired(int64_t kv_blocks, const std::vector<PlannedRequest>& plan,
                                     int32_t repeats, bool kvrm_first) {
  PairedRuns out;
  out.kvrm_first = kvrm_first;
  for (int32_t r = 0; r < repeats; ++r) {
    absl::StatusOr<ModeResult> st, kv;
    if ((r % 2 == 0) != kvrm_first) {
      st = RunMode("static", kv_blocks, plan);
      kv = RunMode("kvrm", kv_blocks, plan);
    } else {
      kv = RunMode("kvrm", kv_blocks, plan);
      st = RunMode("static", kv_blocks, plan);
    }
    if (!st.ok()) return st.status();
    if (!kv.ok()) return kv.status();
    out.runs.emplace_back(std::move(*st), std::move(*kv));
  }
  std::vector<size_t> order(out.runs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    return ThroughputRatio(out.runs[x]) < ThroughputRatio(out.runs[y]);
  });
  out.median = order[(order.size() - 1) / 2];
  return out;
}

// A mode's summary and the KV it reserved (mean and peak of the samples).
nlohmann::json ModeJson(const ModeResult& m) {
  nlohmann::json j = replay::SummaryToJson(m.summary);
  j["reserved_mean_bytes"] = m.reserved_mean_bytes;
  j["reserved_peak_bytes"] = m.reserved_peak_bytes;
  return j;
}

// A workload's paired runs as JSON (the median run's summaries and throughput ratio; with
// several runs, all of them), and with several runs a line of every run's ratio, labelled
// `label`, on `spread`.
nlohmann::json PairedJson(const Workload& w, const PairedRuns& paired, const std::string& label,
                          std::string* spread) {
  const std::pair<ModeResult, ModeResult>& median = paired.runs[paired.median];
  nlohmann::json j;
  j["workload"] = w.name;
  j["description"] = w.description;
  j["static"] = ModeJson(median.first);
  j["kvrm"] = ModeJson(median.second);
  j["kvrm_first"] = paired.kvrm_first;
  j["throughput_kvrm_over_static"] = ThroughputRatio(median);
  if (paired.runs.size() > 1) {
    j["median_run"] = paired.median;
    absl::StrAppend(spread, label, ": kvrm/static throughput");
    for (const auto& run : paired.runs) {
      absl::StrAppend(spread, absl::StrFormat(" %.2fx", ThroughputRatio(run)));
      j["runs"].push_back({{"static", ModeJson(run.first)},
                           {"kvrm", ModeJson(run.second)},
                           {"throughput_kvrm_over_static", ThroughputRatio(run)}});
    }
    absl::StrAppend(spread, absl::StrFormat(" (run %d of %d in the table)\n", paired.median + 1,
                                            paired.runs.size()));
  }
  return j;
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int32_t slots = absl::GetFlag(FLAGS_slots);
  const double duration = absl::GetFlag(FLAGS_duration_s);
  // The model's context decides the budget: ask a short-lived kvrmd.
  auto probe = StartKvrmd("kvrm", 0);
  if (!probe.ok()) {
    std::fprintf(stderr, "%s\n", probe.status().ToString().c_str());
    return 1;
  }
  auto probe_stub = v1::Kvrm::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", probe->port), grpc::InsecureChannelCredentials()));
  auto info = replay::FetchModelInfo(*probe_stub, 30);
  StopKvrmd(*probe);
  if (!info.ok()) {
    std::fprintf(stderr, "%s\n", info.status().ToString().c_str());
    return 1;
  }
  const int ctx = info->max_context();
  const bench::KvBudget budget =
      bench::ClaimsKvBudget(ctx, slots, absl::GetFlag(FLAGS_budget_fraction));
  const int64_t blocks_per_slot = budget.blocks_per_slot;
  const int64_t kv_blocks = budget.kv_blocks;
  // Lengths relative to the context (512 for tiny, 4096 for small).
  const double k = ctx / 4096.0;
  const double rate_flag = absl::GetFlag(FLAGS_rate);
  std::vector<Workload> workloads;
  const std::set<std::string> wanted = absl::StrSplit(absl::GetFlag(FLAGS_workloads), ',');
  for (const bench::Family& f : bench::PaperFamilies(ctx)) {
    if (!wanted.count(f.name)) continue;
    auto plan = Family(f.mix, rate_flag > 0 ? rate_flag : f.rate, duration,
                       absl::GetFlag(FLAGS_input_scale), absl::GetFlag(FLAGS_output_scale), 42);
    if (!plan.ok()) {
      std::fprintf(stderr, "%s: %s\n", f.name.c_str(), plan.status().ToString().c_str());
      continue;
    }
    replay::PrependSharedPrefix(absl::GetFlag(FLAGS_prefix_len), &*plan);
    workloads.push_back({f.name, f.description, *plan, /*family=*/true});
  }
  const std::string traces = absl::GetFlag(FLAGS_traces);
  if (wanted.count("azure")) {
    auto plan = TraceWindow(traces + "/azure-conv-2023/AzureLLMInferenceTrace_conv.csv",
                            replay::TraceFormat::kAzure, duration,
                            absl::GetFlag(FLAGS_trace_time_scale),
                            k * absl::GetFlag(FLAGS_input_scale),
                            k * absl::GetFlag(FLAGS_output_scale), -1);
    if (plan.ok()) {
      workloads.push_back({"azure", "Azure conv 2023, busiest window", *plan});
    } else {
      std::fprintf(stderr, "azure: %s\n", plan.status().ToString().c_str());
    }
  }
  if (wanted.count("mooncake")) {
    auto plan = TraceWindow(traces + "/mooncake-conversation/conversation_trace.jsonl",
                            replay::TraceFormat::kMooncake, duration,
                            absl::GetFlag(FLAGS_trace_time_scale),
                            k * 0.1 * absl::GetFlag(FLAGS_input_scale),
                            k * absl::GetFlag(FLAGS_output_scale), -1);
    if (plan.ok()) {
      workloads.push_back({"mooncake", "Mooncake conversation, busiest window", *plan});
    } else {
      std::fprintf(stderr, "mooncake: %s\n", plan.status().ToString().c_str());
    }
  }

  nlohmann::json out;
  out["date"] = absl::FormatTime("%Y-%m-%d", absl::Now(), absl::UTCTimeZone());
  out["model"] = info->name();
  out["slots"] = slots;
  out["max_context"] = ctx;
  out["kv_blocks"] = kv_blocks;
  out["static_usable_slots"] = kv_blocks / blocks_per_slot;
  std::string md = absl::StrFormat(
      "| workload | requests | tokens/s static | tokens/s kvrm | kvrm/static | p99 TTFT ms "
      "static / kvrm | p99 TPOT ms static / kvrm | reserved KV kvrm/static | worst 1-s p99 ITL / "
      "median, static / kvrm |\n|---|---|---|---|---|---|---|---|---|\n");
  // Little's law behind claim 2's TPOT: mean TPOT (token-weighted) = requests decoding at once
  // / tokens per second after the first, so kvrm's TPOT is lower only if its throughput grows
  // more than the number of requests it decodes at once.
  std::string little = absl::StrFormat(
      "| workload | requests decoding static / kvrm | kvrm/static | tokens/s kvrm/static | "
      "TPOT ms static / kvrm (mean per request) | prompt tokens from kvrm's prefix cache |\n"
      "|---|---|---|---|---|---|\n");
  const int32_t repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  int runs_started = 0;  // workloads run so far: which mode goes first alternates over them
  int rows = 0;          // rows of the table printed so far
  std::string spread;  // with --repeats: every run's throughput ratio per workload
  std::string saturated;
  // The files are rewritten after every workload ("complete": false until the last), so that a
  // run cut short (a timeout, a lost machine) keeps what it measured. Each write replaces the
  // file whole (a temporary and a rename): a reader never sees half of one.
  const auto write_outputs = [&](bool complete) {
    out["complete"] = complete;
    const auto replace = [](const std::string& path, const std::string& text) {
      if (path.empty()) return;
      const std::string tmp = path + ".tmp";
      std::ofstream f(tmp);
      f << text;
      f.close();  // a flush that fails (a full disk) shows here: the old file stays
      if (!f) {
        std::fprintf(stderr, "cannot write %s\n", tmp.c_str());
        return;
      }
      if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        std::fprintf(stderr, "cannot rename %s to %s\n", tmp.c_str(), path.c_str());
      }
    };
    replace(absl::GetFlag(FLAGS_json), out.dump(2));
    replace(absl::GetFlag(FLAGS_markdown),
            absl::StrCat(md, "\n", little, "\n", saturated, "\n", spread));
  };
  for (const Workload& w : workloads) {
    std::fprintf(stderr, "== %s: %zu requests\n", w.name.c_str(), w.plan.size());
    auto paired = RunPaired(kv_blocks, w.plan, repeats, /*kvrm_first=*/(runs_started++ % 2) == 1);
    if (!paired.ok()) {
      std::fprintf(stderr, "%s failed: %s\n", w.name.c_str(), paired.status().ToString().c_str());
      continue;
    }
    const std::pair<ModeResult, ModeResult>& median = paired->runs[paired->median];
    const ModeResult* st = &median.first;
    const ModeResult* kv = &median.second;
    const replay::Summary& a = st->summary;
    const replay::Summary& b = kv->summary;
    const double tput = ThroughputRatio(median);
    const double mem = st->reserved_mean_bytes > 0 ? kv->reserved_mean_bytes / st->reserved_mean_bytes : 0;
    const std::string row = absl::StrFormat(
        "| %s | %d | %.0f | %.0f | %.2fx | %.0f / %.0f | %.1f / %.1f | %.0f%% | %.2f / %.2f |\n",
        w.description, a.requests, a.output_tokens_per_s, b.output_tokens_per_s, tput,
        a.ttft_ms.p99, b.ttft_ms.p99, a.tpot_ms.p99, b.tpot_ms.p99, 100 * mem,
        a.worst_window_itl_p99_over_median, b.worst_window_itl_p99_over_median);
    // The header with the first row, then each new row (the whole table is printed at the end).
    std::printf("%s%s", rows == 0 ? md.c_str() : "", row.c_str());
    md += row;
    ++rows;
    nlohmann::json j = PairedJson(w, *paired, w.description, &spread);
    j["reserved_kvrm_over_static"] = mem;
    out["workloads"].push_back(j);
    little += absl::StrFormat(
        "| %s | %.1f / %.1f | %.2fx | %.2fx | %.1f / %.1f | %.0f%% |\n", w.description,
        a.mean_decoding, b.mean_decoding,
        a.mean_decoding > 0 ? b.mean_decoding / a.mean_decoding : 0, tput, a.tpot_ms.mean,
        b.tpot_ms.mean,
        b.input_tokens > 0 ? 100.0 * b.cached_input_tokens / b.input_tokens : 0.0);
    std::fflush(stdout);
    write_outputs(false);
  }
  // Claim 1 at saturation: the same requests, all queued at t = 0, so each mode decodes as many
  // rows as it can hold until the queue drains and the throughput is its capacity. At a
  // family's own rate a mode that keeps up finishes about when the arrivals stop, and its
  // tokens/s is the offered load, whatever its capacity.
  int saturated_rows = 0;
  if (absl::GetFlag(FLAGS_saturation)) {
    saturated = absl::StrFormat(
        "| workload at saturation | requests | makespan s static / kvrm | requests decoding "
        "static / kvrm | tokens/s static | tokens/s kvrm | kvrm/static |\n"
        "|---|---|---|---|---|---|---|\n");
    for (const Workload& w : workloads) {
      if (!w.family) continue;
      std::vector<PlannedRequest> plan = w.plan;
      for (PlannedRequest& r : plan) r.send_at_s = 0;
      std::fprintf(stderr, "== %s at saturation: %zu requests queued at once\n", w.name.c_str(),
                   plan.size());
      auto paired = RunPaired(kv_blocks, plan, repeats, /*kvrm_first=*/(runs_started++ % 2) == 1);
      if (!paired.ok()) {
        std::fprintf(stderr, "%s at saturation failed: %s\n", w.name.c_str(),
                     paired.status().ToString().c_str());
        continue;
      }
      const std::pair<ModeResult, ModeResult>& run = paired->runs[paired->median];
      const replay::Summary& a = run.first.summary;
      const replay::Summary& b = run.second.summary;
      const std::string row = absl::StrFormat(
          "| %s | %d | %.1f / %.1f | %.1f / %.1f | %.0f | %.0f | %.2fx |\n", w.description,
          a.requests, a.duration_s, b.duration_s, a.mean_decoding, b.mean_decoding,
          a.output_tokens_per_s, b.output_tokens_per_s, ThroughputRatio(run));
      std::printf("%s%s", saturated_rows == 0 ? saturated.c_str() : "", row.c_str());
      saturated += row;
      ++saturated_rows;
      out["saturation"].push_back(
          PairedJson(w, *paired, absl::StrCat(w.description, " at saturation"), &spread));
      std::fflush(stdout);
      write_outputs(false);
    }
  }
  std::printf("\n%s\n%s\n%s\n%s", md.c_str(), little.c_str(), saturated.c_str(), spread.c_str());
  write_outputs(true);
  return 0;
}

}  // namespace
}  // namespace kvrm

int main(int argc, char** argv) { return kvrm::Main(argc, argv); }
