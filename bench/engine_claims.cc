// The paper's claims in process: the same requests through the engine in --kv_mode=static and
// --kv_mode=kvrm, at the same KV budget and slot count, on one backend (--device=cpu|cuda|auto).
// paper_claims measures the same thing through kvrmd and gRPC on the CPU machines; this one needs
// no gRPC, so the prepared GPU check (tools/device_check.sh) runs it on a lent GPU, where it is
// also the engine's end-to-end test on the device: chunked prefill, decode graphs, the pager's
// transfer groups on the copy stream, sampling, all driven by the real scheduler.
//
//   bazel build -c opt //bench:engine_claims
//   bazel-bin/bench/engine_claims --device=cpu --families=mixed --input_scale=0.1
//       --output_scale=0.5 --prefill_chunk=32 --json=/tmp/engine-claims.json
//
// Each family's requests (lengths drawn from the paper_claims mixes, prompts of random ids) are
// queued at once by default (--rate=0: saturation, the decode throughput of claim 1), then sent
// again as Poisson arrivals at --load_factor (1.2) times the request rate static sustained there:
// a load static cannot keep up with and kvrm may, where the latency claims are about. --rate=R
// sends them at R per second instead (one pass). Per mode it reports output tokens/s, p99 TTFT and TPOT,
// requests decoding at once, reserved KV (sampled every 5 ms) and the worst one-second p99
// inter-token latency over the run's median; then the kvrm / static ratios, and how many greedy
// outputs are identical in the two modes (all of them on the CPU, whose kernels give a row the
// same result in any batch; on a GPU the products' reduction order may depend on the batch).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "bench/families.h"
#include "bench/generated_model.h"
#include "bench/null_backend.h"
#include "common/dtype.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "runtime/engine.h"
#include "runtime/kv_pool.h"
#include "runtime/model_bundle.h"
#include "server/device_backend.h"
#include "tools/replay/prompt.h"
#include "tools/replay/record.h"
#include "tools/replay/report.h"
#include "tools/replay/stats.h"
#include "tools/replay/workload.h"

ABSL_FLAG(std::string, device, "auto",
          "backend: cpu, cuda or auto; or null (bench/null_backend.h: computes nothing, so the "
          "schedule's counts (steps, preemptions, transfers, recomputed prompt tokens) come in "
          "seconds; its times are the engine's own)");
ABSL_FLAG(std::string, device_timing, "none",
          "with --device=null: none (no time), or h200 (each call takes what it takes on the H200 "
          "of docs/cuda.md: a model of that GPU's run, bench/null_backend.h DeviceTiming)");
ABSL_FLAG(double, timing_copy_host_gbs, 0,
          "with --device_timing: the host<->device copy rate in GB/s instead of the preset's (its "
          "least certain figure: what the sensitivity of a result to it is read from)");
ABSL_FLAG(std::string, size, "small", "generated model shape (tools/modelgen): tiny or small");
ABSL_FLAG(std::string, model_dir, "", "where to generate the model (default: a temp dir)");
ABSL_FLAG(int32_t, slots, 16, "decode slots (both modes)");
ABSL_FLAG(double, budget_fraction, 0.35,
          "KV budget as a fraction of slots x max context (both modes), as paper_claims");
ABSL_FLAG(int32_t, requests, 200, "requests per family");
ABSL_FLAG(std::string, families, "short,mixed", "families to run: short, mixed, long");
ABSL_FLAG(double, input_scale, 1.0, "factor on every prompt length");
ABSL_FLAG(double, output_scale, 1.0, "factor on every output length");
ABSL_FLAG(double, rate, 0, "Poisson arrivals per second; 0: every request queued at once");
ABSL_FLAG(double, load_factor, 1.2,
          "with --rate=0, also replay each family as Poisson arrivals at this multiple of the "
          "request rate static sustained at saturation (latency between the two capacities); "
          "0: skip");
ABSL_FLAG(int32_t, prefill_chunk, 256, "engine prefill chunk (both modes)");
ABSL_FLAG(double, max_prefill_stall, 0.5, "engine max_prefill_stall (kvrmd's default)");
ABSL_FLAG(int32_t, max_prefills_per_step, 0,
          "engine max_prefills_per_step (both modes; 0, kvrmd's default: as many as fit)");
ABSL_FLAG(bool, prefix_caching, true, "engine prefix_caching (kvrm mode; kvrmd's default)");
ABSL_FLAG(double, offload_shed_wait_share, 0,
          "engine offload_shed_wait_share (kvrmd's --prefix_cache_offload_shed; 0: never)");
ABSL_FLAG(bool, prefix_cache_offload, true,
          "engine prefix_cache_offload: evicted cache blocks copied to the host tier (kvrmd's "
          "default)");
ABSL_FLAG(bool, device_sampling, true,
          "engine device_sampling: greedy rows sampled inside the CUDA decode graph (kvrmd's "
          "default; no effect on the CPU)");
ABSL_FLAG(int32_t, tp, 1, "tensor-parallel ranks");
ABSL_FLAG(std::string, kv_dtype, "f32",
          "KV cache element type (both modes): f32, bf16 (half the bytes per token, same block "
          "count), fp8 or fp8_e5m2 (a quarter)");
ABSL_FLAG(int32_t, threads, 0, "CPU backend threads (0: all cores)");
ABSL_FLAG(std::string, json, "", "also write the results as JSON");

namespace kvrm {
namespace {

struct Mode {
  replay::Summary summary;
  double reserved_mean_blocks = 0;
  uint64_t transfer_groups = 0;
  uint64_t transfer_blocks = 0;
  uint64_t offloaded_blocks = 0;  // of those, evicted prefix-cache blocks copied to the host
  uint64_t offload_shed_blocks = 0;  // evicted blocks not offloaded: the transport's backlog
  uint64_t preemptions = 0;
  // Where a mode's time went: steps run (those with a prefill chunk in the decode pass), the
  // time the step waited on pre-staged copies and KV growth on copies in flight, and the
  // prompt tokens prefilled (looked up in the prefix cache at admission or at a recompute and
  // not found: above the input tokens, what recomputing paused requests cost).
  uint64_t steps = 0, mixed_steps = 0;
  double transport_wait_s = 0, drain_wait_s = 0;
  uint64_t prefilled_tokens = 0;
  uint64_t device_sampled = 0;  // tokens sampled inside the step (CUDA, --device_sampling)
  // --device=null with a timing: the modelled device time, and how far the waits overshot it.
  double modelled_s = 0, overshoot_s = 0;
  std::vector<std::vector<int32_t>> tokens;  // per request
};

// Keeps one request's token times (seconds since `t0`) and tokens. Called on the engine thread.
class TimingSink final : public RequestSink {
 public:
  TimingSink(std::chrono::steady_clock::time_point t0, replay::RequestRecord* record,
             std::vector<int32_t>* tokens, absl::Mutex* mu, int* done)
      : t0_(t0), record_(record), tokens_(tokens), mu_(mu), done_(done) {}

  void OnChunk(StreamChunk chunk) override {
    const double t = Now();
    for (int32_t id : chunk.token_ids) {
      if (record_->first_token_s < 0) record_->first_token_s = t;
      record_->token_times_s.push_back(t);
      tokens_->push_back(id);
    }
  }
  void OnFinished(StreamChunk last, const FinishInfo& info) override {
    OnChunk(std::move(last));
    absl::MutexLock lock(mu_);
    record_->finish_s = Now();
    record_->server_completion_tokens = info.completion_tokens;
    record_->server_cached_prompt_tokens = info.cached_prompt_tokens;
    record_->finish_reason = absl::AsciiStrToUpper(FinishReasonName(info.reason));
    record_->error = info.error;
    ++*done_;
  }

 private:
  double Now() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }
  const std::chrono::steady_clock::time_point t0_;
  replay::RequestRecord* const record_;
  std::vector<int32_t>* const tokens_;
  absl::Mutex* const mu_;
  int* const done_;
};

// The null backend of the engine running now (--device=null), for its modelled time.
std::atomic<bench::NullBackend*> g_null{nullptr};

absl::StatusOr<Mode> RunMode(const ModelBundle& model, EngineOptions options,
                             const std::vector<replay::PlannedRequest>& plan,
                             const std::vector<std::vector<int32_t>>& prompts) {
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(&model, options));
  // Requests all sent at 0 are queued before the engine starts: it admits them in the same
  // order each run, rather than as fast as this thread submits them (on the null backend a
  // race that changes the schedule from run to run).
  const bool at_once = std::all_of(plan.begin(), plan.end(),
                                   [](const replay::PlannedRequest& r) { return r.send_at_s <= 0; });
  if (!at_once) engine->Start();
  const size_t n = plan.size();
  std::vector<replay::RequestRecord> records(n);
  Mode mode;
  mode.tokens.resize(n);
  absl::Mutex mu;
  int done = 0;
  const auto t0 = std::chrono::steady_clock::now();
  auto now = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  double reserved_sum = 0;
  int samples = 0;
  auto sample = [&] {
    reserved_sum += static_cast<double>(engine->Stats().kv.blocks_reserved);
    ++samples;
  };
  for (size_t i = 0; i < n; ++i) {
    while (now() < plan[i].send_at_s) {
      sample();
      std::this_thread::sleep_for(std::chrono::microseconds(
          std::clamp<int64_t>(static_cast<int64_t>((plan[i].send_at_s - now()) * 1e6), 1, 5000)));
    }
    replay::RequestRecord& rec = records[i];
    rec.index = static_cast<int>(i);
    rec.scheduled_s = plan[i].send_at_s;
    rec.input_tokens = plan[i].input_tokens;
    rec.output_tokens_requested = plan[i].output_tokens;
    auto r = std::make_unique<GenerationRequest>();
    r->request_id = absl::StrCat("r", i);
    r->prompt = prompts[i];
    r->max_new_tokens = plan[i].output_tokens;
    r->ignore_eos = true;  // exact output lengths, as the replay asks
    r->arrival = absl::Now();
    r->sink = std::make_shared<TimingSink>(t0, &rec, &mode.tokens[i], &mu, &done);
    rec.send_s = now();
    absl::StatusOr<uint64_t> handle = engine->Submit(std::move(r));
    if (!handle.ok()) {
      absl::MutexLock lock(&mu);
      rec.grpc_code = static_cast<int>(handle.status().code());
      rec.error = std::string(handle.status().message());
      rec.finish_s = now();
      ++done;
    }
  }
  if (at_once) engine->Start();
  for (;;) {
    {
      absl::MutexLock lock(&mu);
      if (done == static_cast<int>(n)) break;
    }
    sample();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const EngineStats stats = engine->Stats();
  mode.transfer_groups = stats.transfer_groups_total;
  mode.transfer_blocks = stats.transfer_blocks_total;
  mode.offloaded_blocks = stats.prefix_cache_offloaded_blocks_total;
  mode.offload_shed_blocks = stats.prefix_cache_offload_shed_blocks_total;
  mode.preemptions = stats.preemptions_total;
  mode.steps = stats.steps_total;
  mode.mixed_steps = stats.mixed_steps_total;
  mode.transport_wait_s = stats.transport_wait_seconds_total;
  mode.drain_wait_s = stats.transport_drain_wait_seconds_total;
  // (Counted by the pager's prefix lookups; static mode has neither: it prefills each prompt
  // once.)
  if (options.kv_mode == KvMode::kKvrm && options.prefix_caching) {
    mode.prefilled_tokens = stats.prefix_cache_queries_total - stats.prefix_cache_hits_total;
  } else {
    for (const std::vector<int32_t>& p : prompts) mode.prefilled_tokens += p.size();
  }
  mode.device_sampled = stats.device_sampled_tokens_total;
  if (bench::NullBackend* null = g_null.exchange(nullptr)) {
    mode.modelled_s = null->modelled_seconds();
    mode.overshoot_s = null->overshoot_seconds();
  }
  engine.reset();
  mode.summary = replay::Summarize(records, replay::Slo{});
  mode.reserved_mean_blocks = samples > 0 ? reserved_sum / samples : 0;
  return mode;
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // The model: generated in the Hugging Face layout and loaded by the real loader.
  auto model = bench::LoadGeneratedModel(absl::GetFlag(FLAGS_model_dir),
                                         absl::GetFlag(FLAGS_size), "kvrm-engine-claims");
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<DeviceChoice> device;
  absl::StatusOr<bench::DeviceTiming> timing =
      bench::DeviceTiming::Preset(absl::GetFlag(FLAGS_device_timing));
  if (!timing.ok()) {
    std::fprintf(stderr, "%s\n", timing.status().ToString().c_str());
    return 1;
  }
  if (const double gbs = absl::GetFlag(FLAGS_timing_copy_host_gbs); gbs > 0) {
    timing->copy_host_gbs = gbs;
  }
  if (absl::GetFlag(FLAGS_device) == "null") {
    const bench::DeviceTiming t = *timing;
    device = DeviceChoice{
        t.enabled() ? "null (h200 timing)" : "null",
        [t](const ModelBundle& m,
            const EngineOptions& o) -> absl::StatusOr<std::unique_ptr<Backend>> {
          bench::DeviceTiming timed = t;
          timed.bytes_per_block = int64_t{2} * m.config.num_hidden_layers *
                                  m.config.num_key_value_heads * m.config.head_dim *
                                  o.block_tokens * static_cast<int64_t>(DTypeSize(o.kv_dtype));
          // (The CUDA backend's handoff spin where the steps take a GPU's time.)
          auto b = std::make_unique<bench::NullBackend>(
              m.config.vocab_size, o.kv_blocks, o.block_tokens, o.prefill_chunk,
              o.device_sampling, t.enabled() ? absl::Milliseconds(2) : absl::ZeroDuration(),
              timed);
          g_null = b.get();
          return b;
        }};
  } else if (timing->enabled()) {
    std::fprintf(stderr, "--device_timing is for --device=null\n");
    return 1;
  } else {
    device = ChooseDevice(absl::GetFlag(FLAGS_device));
  }
  if (!device.ok()) {
    std::fprintf(stderr, "%s\n", device.status().ToString().c_str());
    return 1;
  }
  const absl::StatusOr<DType> parsed_kv = ParseKvDtype(absl::GetFlag(FLAGS_kv_dtype));
  if (!parsed_kv.ok()) {
    std::fprintf(stderr, "%s\n", std::string(parsed_kv.status().message()).c_str());
    return 1;
  }
  const DType kv_dtype = *parsed_kv;
  const int32_t slots = absl::GetFlag(FLAGS_slots);
  const int32_t ctx = (*model)->config.max_position_embeddings;
  const bench::KvBudget budget =
      bench::ClaimsKvBudget(ctx, slots, absl::GetFlag(FLAGS_budget_fraction));
  const int64_t blocks_per_slot = budget.blocks_per_slot;
  const int64_t kv_blocks = budget.kv_blocks;

  const std::set<std::string> wanted = absl::StrSplit(absl::GetFlag(FLAGS_families), ',');
  const double rate = absl::GetFlag(FLAGS_rate);
  std::vector<int32_t> specials((*model)->config.eos_token_ids.begin(),
                                (*model)->config.eos_token_ids.end());
  if ((*model)->config.bos_token_id.has_value()) {
    specials.push_back(*(*model)->config.bos_token_id);
  }
  auto synth = replay::PromptSynthesizer::Create((*model)->config.vocab_size, specials, 17);
  if (!synth.ok()) {
    std::fprintf(stderr, "%s\n", synth.status().ToString().c_str());
    return 1;
  }

  std::printf("engine claims: %s model, device %s, tp %d, %d slots, KV budget %lld %s blocks "
              "(static backs %lld slots of %d tokens), %s\n",
              absl::GetFlag(FLAGS_size).c_str(), device->device.c_str(),
              absl::GetFlag(FLAGS_tp), slots, static_cast<long long>(kv_blocks),
              std::string(DTypeName(kv_dtype)).c_str(),
              static_cast<long long>(kv_blocks / blocks_per_slot), ctx,
              rate > 0 ? absl::StrFormat("Poisson arrivals at %.1f/s", rate).c_str()
                       : "every request queued at once");
  std::printf("| family | mode | tokens/s | p99 TTFT ms | p99 TPOT ms | mean TPOT ms | decoding | "
              "reserved KV blocks | worst 1-s p99 ITL / median | transfer groups / blocks (offloaded) | "
              "preemptions | steps (mixed) | transport wait s (drain) | prefilled tokens |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  nlohmann::json out;
  out["device"] = device->device;
  if (timing->enabled()) {
    out["device_timing"] = {{"preset", absl::GetFlag(FLAGS_device_timing)},
                            {"decode_fixed_us", timing->decode_fixed_us},
                            {"decode_row_us", timing->decode_row_us},
                            {"decode_kv_token_ns", timing->decode_kv_token_ns},
                            {"chunk_apart_us", timing->chunk_apart_us},
                            {"chunk_in_pass_us", timing->chunk_in_pass_us},
                            {"chunk_attention_ns", timing->chunk_attention_ns},
                            {"copy_group_us", timing->copy_group_us},
                            {"copy_device_gbs", timing->copy_device_gbs},
                            {"copy_host_gbs", timing->copy_host_gbs}};
  }
  out["model"] = absl::GetFlag(FLAGS_size);
  out["slots"] = slots;
  out["kv_blocks"] = kv_blocks;
  out["kv_dtype"] = std::string(DTypeName(kv_dtype));
  out["rate"] = rate;
  std::string ratios;
  bool all_completed = true;
  for (const bench::Family& family : bench::PaperFamilies(ctx)) {
    const std::string& name = family.name;
    if (!wanted.count(name)) continue;
    auto entries = replay::ParseLengthMix(family.mix);
    CHECK_OK(entries.status());
    const int n = absl::GetFlag(FLAGS_requests);
    const std::vector<double> arrivals = replay::SyntheticArrivals(
        replay::ArrivalProcess::kPoisson,
        rate > 0 ? rate : std::numeric_limits<double>::infinity(), 1.0, n, 42);
    auto plan = replay::SyntheticRequests(arrivals, *entries, {}, absl::GetFlag(FLAGS_input_scale),
                                          absl::GetFlag(FLAGS_output_scale), 42);
    CHECK_OK(plan.status());
    // The replay's clamp (prompt + output within the context), so that both harnesses send
    // the same requests.
    replay::ClampToServer({ctx, 0}, &*plan);
    std::vector<std::vector<int32_t>> prompts;
    for (const replay::PlannedRequest& r : *plan) prompts.push_back(synth->Synthesize(r));
    nlohmann::json fam;
    fam["family"] = name;
    Mode modes[2];
    // Both modes on `p`; rows labelled `label`, summaries into `j`, ratios into `ratios`.
    auto run_pair = [&](const std::string& label, const std::vector<replay::PlannedRequest>& p,
                        nlohmann::json& j) -> bool {
      for (int m = 0; m < 2; ++m) {
        EngineOptions o;
        o.kv_mode = m == 0 ? KvMode::kStatic : KvMode::kKvrm;
        o.reserve = ReservePolicy::kPromptAndOutput;  // as paper_claims' --kv_reserve
        o.slots = slots;
        o.kv_blocks = kv_blocks;
        o.max_queue = n + 1;
        o.prefill_chunk = absl::GetFlag(FLAGS_prefill_chunk);
        o.max_prefills_per_step = absl::GetFlag(FLAGS_max_prefills_per_step);
        // (Off on the null backend: the limit works from timed steps, and the null backend's
        // times are the engine's own, so the chunk sizes would follow the noise of this machine
        // and the schedule would change from run to run.)
        o.max_prefill_stall =
            device->device == "null" ? 0 : absl::GetFlag(FLAGS_max_prefill_stall);
        o.prefix_caching = absl::GetFlag(FLAGS_prefix_caching);
        o.prefix_cache_offload = absl::GetFlag(FLAGS_prefix_cache_offload);
        o.offload_shed_wait_share = absl::GetFlag(FLAGS_offload_shed_wait_share);
        o.device_sampling = absl::GetFlag(FLAGS_device_sampling);
        o.tensor_parallel = absl::GetFlag(FLAGS_tp);
        o.kv_dtype = kv_dtype;
        o.threads = absl::GetFlag(FLAGS_threads);
        o.backend_factory = device->factory;
        auto result = RunMode(**model, o, p, prompts);
        if (!result.ok()) {
          std::fprintf(stderr, "%s %s: %s\n", label.c_str(), KvModeName(o.kv_mode),
                       result.status().ToString().c_str());
          return false;
        }
        modes[m] = std::move(*result);
        const replay::Summary& s = modes[m].summary;
        all_completed = all_completed && s.completed == s.requests;
        std::printf("| %s | %s | %.0f | %.1f | %.2f | %.2f | %.1f | %.0f | %.2f | %llu / %llu (%llu) | "
                    "%llu | %llu (%llu) | %.2f (%.2f) | %llu |\n",
                    label.c_str(), KvModeName(o.kv_mode), s.output_tokens_per_s, s.ttft_ms.p99,
                    s.tpot_ms.p99, s.tpot_ms.mean, s.mean_decoding, modes[m].reserved_mean_blocks,
                    s.worst_window_itl_p99_over_median,
                    static_cast<unsigned long long>(modes[m].transfer_groups),
                    static_cast<unsigned long long>(modes[m].transfer_blocks),
                    static_cast<unsigned long long>(modes[m].offloaded_blocks),
                    static_cast<unsigned long long>(modes[m].preemptions),
                    static_cast<unsigned long long>(modes[m].steps),
                    static_cast<unsigned long long>(modes[m].mixed_steps),
                    modes[m].transport_wait_s, modes[m].drain_wait_s,
                    static_cast<unsigned long long>(modes[m].prefilled_tokens));
        std::fflush(stdout);
        nlohmann::json js = replay::SummaryToJson(s);
        js["reserved_mean_blocks"] = modes[m].reserved_mean_blocks;
        js["transfer_groups"] = modes[m].transfer_groups;
        js["transfer_blocks"] = modes[m].transfer_blocks;
        js["offloaded_blocks"] = modes[m].offloaded_blocks;
        js["offload_shed_blocks"] = modes[m].offload_shed_blocks;
        js["preemptions"] = modes[m].preemptions;
        js["steps"] = modes[m].steps;
        js["mixed_steps"] = modes[m].mixed_steps;
        js["transport_wait_s"] = modes[m].transport_wait_s;
        js["transport_drain_wait_s"] = modes[m].drain_wait_s;
        js["prefilled_tokens"] = modes[m].prefilled_tokens;
        js["device_sampled_tokens"] = modes[m].device_sampled;
        if (modes[m].modelled_s > 0) {
          js["modelled_device_s"] = modes[m].modelled_s;
          js["timing_overshoot_s"] = modes[m].overshoot_s;
        }
        j[KvModeName(o.kv_mode)] = js;
      }
      int same = 0;
      for (size_t i = 0; i < prompts.size(); ++i) same += modes[0].tokens[i] == modes[1].tokens[i];
      const replay::Summary &a = modes[0].summary, &b = modes[1].summary;
      const double tput =
          a.output_tokens_per_s > 0 ? b.output_tokens_per_s / a.output_tokens_per_s : 0;
      const double mem = modes[0].reserved_mean_blocks > 0
                             ? modes[1].reserved_mean_blocks / modes[0].reserved_mean_blocks
                             : 0;
      absl::StrAppend(&ratios,
                      absl::StrFormat("%s: kvrm/static throughput %.2fx, p99 TTFT %.2fx, p99 "
                                      "TPOT %.2fx, reserved KV %.0f%%; greedy outputs identical "
                                      "in both modes: %d of %zu\n",
                                      label, tput,
                                      a.ttft_ms.p99 > 0 ? b.ttft_ms.p99 / a.ttft_ms.p99 : 0,
                                      a.tpot_ms.p99 > 0 ? b.tpot_ms.p99 / a.tpot_ms.p99 : 0,
                                      100 * mem, same, prompts.size()));
      j["throughput_kvrm_over_static"] = tput;
      j["reserved_kvrm_over_static"] = mem;
      j["identical_outputs"] = same;
      return true;
    };
    if (!run_pair(name, *plan, fam)) return 1;
    // Latency at a load between the two capacities: Poisson arrivals at load_factor times the
    // request rate static sustained at saturation (static falls behind, kvrm need not).
    const double factor = absl::GetFlag(FLAGS_load_factor);
    if (rate <= 0 && factor > 0 && modes[0].summary.requests_per_s > 0) {
      const double load = factor * modes[0].summary.requests_per_s;
      const std::vector<double> at = replay::SyntheticArrivals(replay::ArrivalProcess::kPoisson,
                                                               load, 1.0, n, 43);
      std::vector<replay::PlannedRequest> loaded = *plan;
      for (size_t i = 0; i < loaded.size(); ++i) loaded[i].send_at_s = at[i];
      nlohmann::json j;
      j["rate"] = load;
      j["load_factor"] = factor;
      if (!run_pair(absl::StrFormat("%s at %.1f req/s", name, load), loaded, j)) return 1;
      fam["at_load"] = j;
    }
    out["families"].push_back(fam);
  }
  std::printf("\n%s", ratios.c_str());
  if (!absl::GetFlag(FLAGS_json).empty()) std::ofstream(absl::GetFlag(FLAGS_json)) << out.dump(2);
  return all_completed ? 0 : 1;
}

}  // namespace
}  // namespace kvrm

int main(int argc, char** argv) { return kvrm::Main(argc, argv); }
