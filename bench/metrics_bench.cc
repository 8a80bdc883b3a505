// Cost of recording metrics on the engine's step path: a histogram observation (the bucket
// search, one relaxed fetch_add and a compare-exchange add to the sum) must stay well under
// 50 ns, or per-token metrics would show up in inter-token latency.
//
//   bazel run -c opt //bench:metrics_bench
#include <random>
#include <vector>

#include "absl/time/time.h"
#include "benchmark/benchmark.h"
#include "metrics/kvrm_metrics.h"
#include "metrics/registry.h"

namespace kvrm {
namespace {

// Latencies spread over the buckets, so the bucket search is not always the same branch path.
std::vector<double> Values() {
  std::mt19937 rng(1);
  std::lognormal_distribution<double> dist(-4.0, 1.5);  // median ~18 ms
  std::vector<double> v(4096);
  for (double& x : v) x = dist(rng);
  return v;
}

void BM_HistogramObserve(benchmark::State& state) {
  static MetricRegistry* registry = new MetricRegistry;
  static Histogram* h = &registry
                             ->AddHistogram("h", "h", {"model_name", "kv_mode"},
                                            TtftBuckets())
                             .WithLabels({"m", "static"});
  const std::vector<double> values = Values();
  size_t i = 0;
  for (auto _ : state) {
    h->Observe(values[i++ & 4095]);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_HistogramObserve);
BENCHMARK(BM_HistogramObserve)->Threads(2);  // two threads on one cell: contended atomics

void BM_CounterAdd(benchmark::State& state) {
  MetricRegistry registry;
  Counter& c = registry.AddCounter("c_total", "c").WithLabels({});
  for (auto _ : state) c.Add();
}
BENCHMARK(BM_CounterAdd);

// The per-token hook: two histogram observations and a counter increment.
void BM_KvrmMetricsOnNextToken(benchmark::State& state) {
  MetricRegistry registry;
  KvrmMetrics metrics(&registry, {"m", "static"});
  GenerationRequest request;
  for (auto _ : state) metrics.OnNextToken(request, absl::Microseconds(1500));
}
BENCHMARK(BM_KvrmMetricsOnNextToken);

// The per-step stats hook: ~20 gauge and counter updates and three observations.
void BM_KvrmMetricsOnStats(benchmark::State& state) {
  MetricRegistry registry;
  KvrmMetrics metrics(&registry, {"m", "static"});
  EngineStats s;
  s.slots_total = 8;
  s.kv.blocks_total = 1024;
  for (auto _ : state) {
    ++s.steps_total;
    metrics.OnStats(s);
  }
}
BENCHMARK(BM_KvrmMetricsOnStats);

// A scrape of the full kvrm set (not on the step path; for scale).
void BM_RenderKvrmMetrics(benchmark::State& state) {
  MetricRegistry registry;
  KvrmMetrics metrics(&registry, {"m", "static"});
  for (auto _ : state) benchmark::DoNotOptimize(registry.Render());
}
BENCHMARK(BM_RenderKvrmMetrics);

}  // namespace
}  // namespace kvrm

BENCHMARK_MAIN();
