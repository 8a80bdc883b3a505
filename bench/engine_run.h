// What the in-process engine benchmarks (speculative_bench, lora_bench) share: random prompt
// ids, one timed run of requests queued at once, and the bits of their tables (medians, the
// machine's name and noise).
#ifndef KVRM_BENCH_ENGINE_RUN_H_
#define KVRM_BENCH_ENGINE_RUN_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "runtime/engine.h"
#include "runtime/model_bundle.h"
#include "runtime/request.h"

namespace kvrm::bench {

// Prompt ids: uniform over the vocabulary but for the model's EOS and BOS ids.
class IdSource {
 public:
  IdSource(const ModelBundle& model, uint64_t seed);
  int32_t Next();
  uint32_t Below(uint32_t n) { return rng_() % n; }

 private:
  std::mt19937 rng_;
  int32_t vocab_;
  std::set<int32_t> specials_;
};

// One run's figures. Times are seconds since the first request was queued (every request is
// queued then, before the engine starts, so that it admits them in the same order every run).
struct EngineRun {
  double wall_s = 0;  // to the last token
  double tokens_per_s = 0;
  double tpot_ms = 0;  // mean over requests of (last - first token) / (tokens - 1)
  double ttft_s = 0;   // mean over requests of the first token's time
  uint64_t tokens = 0, steps = 0, mixed_steps = 0;
  // Over the run: this process's CPU time over (wall x cores), and the cores other processes
  // kept busy on average (from /proc/stat: the shared machine's noise, 0 on a quiet machine).
  double cpu_share = 0, others_cores = 0;
  std::vector<std::vector<int32_t>> outputs;  // each request's tokens, in request order
  EngineStats stats;                          // after the last request finished
};

// Work run on its own thread beside a run, from the engine's start until every request ended
// (`done` then reads true; it must return soon after).
using BesideRun = std::function<void(Engine* engine, const std::atomic<bool>* done)>;

// Creates an engine for `model` with `options`, queues `requests` (their sinks are replaced; each
// must generate exactly `max_new_tokens`: ignore_eos), starts it and waits for all of them (with
// `beside`, if given, running meanwhile). INTERNAL naming the request when one finished otherwise.
// `max_new_tokens` 0: embedding requests (GenerationRequest::pooling), each ending with its vector
// and no token (wall_s is the last one's end, ttft_s the mean end).
absl::StatusOr<EngineRun> RunQueued(const ModelBundle& model, const EngineOptions& options,
                                    std::vector<std::unique_ptr<GenerationRequest>> requests,
                                    int32_t max_new_tokens, const BesideRun& beside = nullptr);
// The same on an engine that lives on (a conversation's turns one after another): `engine` is
// started first when `start`; the run's stats are the engine's totals after it.
absl::StatusOr<EngineRun> RunQueuedOn(Engine* engine,
                                      std::vector<std::unique_ptr<GenerationRequest>> requests,
                                      int32_t max_new_tokens, bool start,
                                      const BesideRun& beside = nullptr);

double Median(std::vector<double> v);

// Runs of one mode as JSON: the medians of wall_s, tokens_per_s, tpot_ms, ttft_s, steps,
// mixed_steps and cpu_share, the tokens of a run, the most others_cores of any run
// ("others_cores_max"), and every run's figures under "runs".
nlohmann::json RunsJson(const std::vector<const EngineRun*>& runs);
template <typename Run>  // EngineRun or a struct derived from it
nlohmann::json RunsJson(const std::vector<Run>& runs) {
  std::vector<const EngineRun*> all;
  for (const Run& r : runs) all.push_back(&r);
  return RunsJson(all);
}
// The run's machine and model as JSON fields: date, cpu, cores, model (`size`, the generated
// model's shape), vocab, threads.
nlohmann::json MachineJson(const ModelBundle& model, const std::string& size, int32_t threads);
// /proc/cpuinfo's model name ("unknown" without one).
std::string CpuModelName();
// The time now, as 2026-12-05T12:00:00Z.
std::string UtcNow();
// A comma-separated list of positive integers, or false after naming the flag on stderr.
bool ParseCounts(const char* flag, const std::string& list, std::vector<int32_t>* out);

}  // namespace kvrm::bench

#endif  // KVRM_BENCH_ENGINE_RUN_H_
