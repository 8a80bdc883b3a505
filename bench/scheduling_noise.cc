// How long a fixed piece of work takes, over and over, on every core at once: the machine's own
// scheduling noise (co-tenants, the hypervisor, interrupts), against which the claims' burst
// metric (the worst one-second window's p99 inter-token latency over the run's median) is read.
// A one-second window's p99 is its worst gap or two, so a core that stalls for a few times the
// unit of work now and then makes a spike with no server in the picture.
//
//   bazel build //bench:scheduling_noise
//   bazel-bin/bench/scheduling_noise --unit_ms=10 --repeats=2000 --json=/tmp/noise.json
//
// One thread per core (--threads, default all), each timing --repeats runs of a calibrated
// arithmetic loop of about --unit_ms; per thread p50 / p99 / max, the worst one-second window's
// p99 over the p50 (the claims' ratio, for a server whose every step were this loop), and the
// same over all threads.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "tools/replay/stats.h"

ABSL_FLAG(int, threads, 0, "threads, one per core (0: all cores)");
ABSL_FLAG(double, unit_ms, 10, "the unit of work, calibrated to about this many milliseconds");
ABSL_FLAG(int, repeats, 2000, "timed units per thread");
ABSL_FLAG(std::string, json, "", "write the figures as JSON");

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// A dependent chain of floating-point adds: no memory traffic, no vectorisation across
// iterations, the same work every time.
double Work(long iterations) {
  volatile double acc = 0;
  for (long k = 0; k < iterations; ++k) acc = acc + static_cast<double>(k) * 1e-9;
  return acc;
}

struct ThreadResult {
  std::vector<double> ms;      // each unit's duration
  std::vector<double> end_s;   // when it ended, from the common start
};

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int threads = absl::GetFlag(FLAGS_threads) > 0
                          ? absl::GetFlag(FLAGS_threads)
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int repeats = std::max(10, absl::GetFlag(FLAGS_repeats));
  // Calibrate on one thread: iterations for unit_ms.
  long iterations = 100000;
  for (;;) {
    const Clock::time_point t0 = Clock::now();
    Work(iterations);
    const double ms = Seconds(t0, Clock::now()) * 1e3;
    if (ms > 50) {
      iterations = static_cast<long>(iterations * absl::GetFlag(FLAGS_unit_ms) / ms);
      break;
    }
    iterations *= 2;
  }
  std::vector<ThreadResult> results(threads);
  const Clock::time_point start = Clock::now();
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      ThreadResult& r = results[t];
      r.ms.reserve(repeats);
      r.end_s.reserve(repeats);
      for (int i = 0; i < repeats; ++i) {
        const Clock::time_point a = Clock::now();
        Work(iterations);
        const Clock::time_point b = Clock::now();
        r.ms.push_back(Seconds(a, b) * 1e3);
        r.end_s.push_back(Seconds(start, b));
      }
    });
  }
  for (std::thread& w : workers) w.join();

  // The claims' ratio: per one-second window (by end time) the p99 of the units that ended in
  // it, over the p50 of all of them.
  const auto burst_ratio = [](const std::vector<double>& ms, const std::vector<double>& end_s,
                              double p50) {
    double worst = 0;
    const int windows = static_cast<int>(*std::max_element(end_s.begin(), end_s.end())) + 1;
    std::vector<std::vector<double>> in(windows);
    for (size_t i = 0; i < ms.size(); ++i) in[static_cast<int>(end_s[i])].push_back(ms[i]);
    for (auto& w : in) {
      if (w.empty()) continue;
      std::sort(w.begin(), w.end());
      worst = std::max(worst, kvrm::replay::Percentile(w, 99) / p50);
    }
    return worst;
  };
  nlohmann::json out;
  out["unit_ms"] = absl::GetFlag(FLAGS_unit_ms);
  out["repeats"] = repeats;
  out["threads"] = threads;
  std::printf("scheduling noise: %d threads x %d units of ~%.1f ms\n\n", threads, repeats,
              absl::GetFlag(FLAGS_unit_ms));
  std::printf("| thread | p50 ms | p99 ms | max ms | max / p50 | worst 1-s p99 / p50 |\n");
  std::printf("|---|---|---|---|---|---|\n");
  std::vector<double> all_ms, all_end;
  for (int t = 0; t <= threads; ++t) {
    const bool total = t == threads;
    const std::vector<double>& ms = total ? all_ms : results[t].ms;
    const std::vector<double>& end_s = total ? all_end : results[t].end_s;
    const kvrm::replay::Distribution d = kvrm::replay::Distribute(ms);
    const double ratio = burst_ratio(ms, end_s, d.p50);
    std::printf("| %s | %.2f | %.2f | %.2f | %.2fx | %.2fx |\n",
                total ? "all" : absl::StrFormat("%d", t).c_str(), d.p50, d.p99, d.max,
                d.max / d.p50, ratio);
    out[total ? "all" : "per_thread"] += nlohmann::json{
        {"p50_ms", d.p50}, {"p99_ms", d.p99}, {"max_ms", d.max}, {"worst_window_p99_over_p50", ratio}};
    if (!total) {
      all_ms.insert(all_ms.end(), results[t].ms.begin(), results[t].ms.end());
      all_end.insert(all_end.end(), results[t].end_s.begin(), results[t].end_s.end());
    }
  }
  if (!absl::GetFlag(FLAGS_json).empty()) {
    std::ofstream(absl::GetFlag(FLAGS_json)) << out.dump(2) << "\n";
  }
  return 0;
}
