#include "bench/engine_run.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace kvrm::bench {
namespace {

using Clock = std::chrono::steady_clock;

// How many of a run's requests have finished, under `mu`.
struct Progress {
  absl::Mutex mu;
  int32_t done = 0;
  int32_t want = 0;
};

bool AllDone(Progress* p) { return p->done == p->want; }

// One request's tokens and their times (seconds since the run's first submit). Called on the
// engine thread; the fields are read once Progress counts the request done.
class TimingSink final : public RequestSink {
 public:
  TimingSink(Clock::time_point t0, Progress* progress) : t0_(t0), progress_(progress) {}

  void OnChunk(StreamChunk chunk) override {
    const double t = std::chrono::duration<double>(Clock::now() - t0_).count();
    for (int32_t id : chunk.token_ids) {
      if (tokens.empty()) first_s = t;
      last_s = t;
      tokens.push_back(id);
    }
  }
  void OnFinished(StreamChunk last, const FinishInfo& info) override {
    end_s = std::chrono::duration<double>(Clock::now() - t0_).count();
    embedding_size = static_cast<int32_t>(last.embedding.size());
    OnChunk(std::move(last));
    absl::MutexLock lock(&progress_->mu);
    reason = info.reason;
    error = info.error;
    ++progress_->done;
  }

  std::vector<int32_t> tokens;
  double first_s = 0, last_s = 0, end_s = 0;
  int32_t embedding_size = 0;
  FinishReason reason = FinishReason::kError;
  std::string error;

 private:
  const Clock::time_point t0_;
  Progress* const progress_;
};

// CPU seconds since boot: this process's, and every core's busy time (the machine's).
struct CpuTimes {
  double self_s = 0, machine_s = 0;
};

CpuTimes ReadCpuTimes() {
  CpuTimes t;
  rusage u;
  if (getrusage(RUSAGE_SELF, &u) == 0) {
    t.self_s =
        u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
  }
  std::ifstream f("/proc/stat");
  std::string cpu;
  // user nice system idle iowait irq softirq steal
  uint64_t v[8] = {};
  if (f >> cpu && cpu == "cpu") {
    for (uint64_t& x : v) f >> x;
  }
  const double tick = 1.0 / static_cast<double>(sysconf(_SC_CLK_TCK));
  t.machine_s = tick * static_cast<double>(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]);
  return t;
}

}  // namespace

IdSource::IdSource(const ModelBundle& model, uint64_t seed)
    : rng_(seed), vocab_(model.config.vocab_size) {
  specials_.insert(model.config.eos_token_ids.begin(), model.config.eos_token_ids.end());
  if (model.config.bos_token_id.has_value()) specials_.insert(*model.config.bos_token_id);
}

int32_t IdSource::Next() {
  for (;;) {
    const int32_t id = static_cast<int32_t>(rng_() % static_cast<uint32_t>(vocab_));
    if (!specials_.count(id)) return id;
  }
}

absl::StatusOr<EngineRun> RunQueued(const ModelBundle& model, const EngineOptions& options,
                                    std::vector<std::unique_ptr<GenerationRequest>> requests,
                                    int32_t max_new_tokens, const BesideRun& beside) {
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(&model, options));
  return RunQueuedOn(engine.get(), std::move(requests), max_new_tokens, /*start=*/true, beside);
}

absl::StatusOr<EngineRun> RunQueuedOn(Engine* engine,
                                      std::vector<std::unique_ptr<GenerationRequest>> requests,
                                      int32_t max_new_tokens, bool start, const BesideRun& beside) {
  const int32_t n = static_cast<int32_t>(requests.size());
  const uint64_t tokens_before = engine->Stats().tokens_generated_total;
  Progress progress;
  progress.want = n;
  std::vector<std::shared_ptr<TimingSink>> sinks;
  const CpuTimes cpu0 = ReadCpuTimes();
  const Clock::time_point t0 = Clock::now();
  for (std::unique_ptr<GenerationRequest>& r : requests) {
    r->arrival = absl::Now();
    sinks.push_back(std::make_shared<TimingSink>(t0, &progress));
    r->sink = sinks.back();
    RETURN_IF_ERROR(engine->Submit(std::move(r)).status());
  }
  if (start) engine->Start();
  std::atomic<bool> done{false};
  std::thread beside_thread;
  if (beside) beside_thread = std::thread([&] { beside(engine, &done); });
  {
    absl::MutexLock lock(&progress.mu);
    progress.mu.Await(absl::Condition(&AllDone, &progress));
  }
  done = true;
  if (beside_thread.joinable()) beside_thread.join();
  const double window_s = std::chrono::duration<double>(Clock::now() - t0).count();
  const CpuTimes cpu1 = ReadCpuTimes();
  // The stats are published after the step whose tokens finished the last request.
  if (!engine->WaitIdle(absl::Seconds(30))) return absl::DeadlineExceededError("engine not idle");
  EngineRun run;
  run.stats = engine->Stats();
  for (int i = 0; i < 1000 && run.stats.tokens_generated_total <
                                  tokens_before + static_cast<uint64_t>(n) * max_new_tokens;
       ++i) {
    absl::SleepFor(absl::Milliseconds(1));
    run.stats = engine->Stats();
  }
  double tpot_sum = 0, ttft_sum = 0;
  for (int32_t i = 0; i < n; ++i) {
    const TimingSink& s = *sinks[i];
    if (max_new_tokens == 0) {
      // Embeddings: each ends with its vector, no token; its "first token" is its end.
      if (s.reason != FinishReason::kStop || !s.tokens.empty() || s.embedding_size == 0) {
        return absl::InternalError(absl::StrCat("embedding ", i, " finished ",
                                                FinishReasonName(s.reason), " with ",
                                                s.embedding_size, " components: ", s.error));
      }
      run.wall_s = std::max(run.wall_s, s.end_s);
      ttft_sum += s.end_s;
      continue;
    }
    if (s.reason != FinishReason::kLength ||
        static_cast<int32_t>(s.tokens.size()) != max_new_tokens) {
      return absl::InternalError(absl::StrCat("request ", i, " finished ",
                                              FinishReasonName(s.reason), " after ",
                                              s.tokens.size(), " tokens: ", s.error));
    }
    run.wall_s = std::max(run.wall_s, s.last_s);
    run.tokens += s.tokens.size();
    ttft_sum += s.first_s;
    if (max_new_tokens > 1) tpot_sum += (s.last_s - s.first_s) / (max_new_tokens - 1);
    run.outputs.push_back(s.tokens);
  }
  run.tpot_ms = 1e3 * tpot_sum / n;
  run.ttft_s = ttft_sum / n;
  run.tokens_per_s = run.wall_s > 0 ? run.tokens / run.wall_s : 0;
  run.steps = run.stats.steps_total;
  run.mixed_steps = run.stats.mixed_steps_total;
  CHECK(run.stats.tokens_generated_total == tokens_before + run.tokens)
      << "every token reached its sink";
  const double self_s = cpu1.self_s - cpu0.self_s;
  run.cpu_share = self_s / (window_s * std::max(1u, std::thread::hardware_concurrency()));
  run.others_cores = std::max(0.0, (cpu1.machine_s - cpu0.machine_s - self_s) / window_s);
  return run;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

nlohmann::json RunsJson(const std::vector<const EngineRun*>& runs) {
  auto median = [&](auto field) {
    std::vector<double> v;
    for (const EngineRun* r : runs) v.push_back(static_cast<double>(field(*r)));
    return Median(v);
  };
  nlohmann::json j;
  j["wall_s"] = median([](const EngineRun& r) { return r.wall_s; });
  j["tokens_per_s"] = median([](const EngineRun& r) { return r.tokens_per_s; });
  j["tpot_ms"] = median([](const EngineRun& r) { return r.tpot_ms; });
  j["ttft_s"] = median([](const EngineRun& r) { return r.ttft_s; });
  j["steps"] = median([](const EngineRun& r) { return r.steps; });
  j["mixed_steps"] = median([](const EngineRun& r) { return r.mixed_steps; });
  j["tokens"] = runs.empty() ? 0 : runs[0]->tokens;
  j["cpu_share"] = median([](const EngineRun& r) { return r.cpu_share; });
  double others = 0;
  for (const EngineRun* r : runs) others = std::max(others, r->others_cores);
  j["others_cores_max"] = others;
  nlohmann::json each = nlohmann::json::array();
  for (const EngineRun* r : runs) {
    each.push_back({{"wall_s", r->wall_s},
                    {"tokens_per_s", r->tokens_per_s},
                    {"tpot_ms", r->tpot_ms},
                    {"ttft_s", r->ttft_s},
                    {"steps", r->steps},
                    {"mixed_steps", r->mixed_steps},
                    {"cpu_share", r->cpu_share},
                    {"others_cores", r->others_cores}});
  }
  j["runs"] = each;
  return j;
}

std::string CpuModelName() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  }
  return "unknown";
}

nlohmann::json MachineJson(const ModelBundle& model, const std::string& size, int32_t threads) {
  return {{"date", UtcNow()},
          {"cpu", CpuModelName()},
          {"cores", std::thread::hardware_concurrency()},
          {"model", size},
          {"vocab", model.config.vocab_size},
          {"threads", threads}};
}

std::string UtcNow() {
  const std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return buf;
}

bool ParseCounts(const char* flag, const std::string& list, std::vector<int32_t>* out) {
  for (absl::string_view part : absl::StrSplit(list, ',')) {
    int32_t n = 0;
    if (!absl::SimpleAtoi(part, &n) || n < 1) {
      std::fprintf(stderr, "--%s: '%s' is not a positive integer\n", flag,
                   std::string(part).c_str());
      return false;
    }
    out->push_back(n);
  }
  return true;
}

}  // namespace kvrm::bench
