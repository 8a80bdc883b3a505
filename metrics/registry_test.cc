#include "metrics/registry.h"

#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace kvrm {
namespace {

TEST(RegistryTest, RendersCountersAndGaugesWithHelpTypeAndLabels) {
  MetricRegistry r;
  Family<Counter>& c = r.AddCounter("kvrm:requests_total", "Requests.\nAll of them.", {"code"});
  Family<Gauge>& g = r.AddGauge("kvrm:slots", "Slots by state.", {"kv_mode", "state"});
  Family<Gauge>& plain = r.AddGauge("up_ish", "No labels.");
  c.WithLabels({"ok"}).Add(3);
  c.WithLabels({"ok"}).Add();
  c.WithLabels({"bad\\\"x\n"}).Add(0.5);
  c.WithLabels({"ok"}).Add(-10);  // ignored: counters only go up
  g.WithLabels({"static", "free"}).Set(6);
  g.WithLabels({"static", "decoding"}).Set(2);
  g.WithLabels({"static", "decoding"}).Add(-1);
  plain.WithLabels({}).Set(0.125);
  EXPECT_EQ(r.Render(),
            "# HELP kvrm:requests_total Requests.\\nAll of them.\n"
            "# TYPE kvrm:requests_total counter\n"
            "kvrm:requests_total{code=\"ok\"} 4\n"
            "kvrm:requests_total{code=\"bad\\\\\\\"x\\n\"} 0.5\n"
            "# HELP kvrm:slots Slots by state.\n"
            "# TYPE kvrm:slots gauge\n"
            "kvrm:slots{kv_mode=\"static\",state=\"free\"} 6\n"
            "kvrm:slots{kv_mode=\"static\",state=\"decoding\"} 1\n"
            "# HELP up_ish No labels.\n"
            "# TYPE up_ish gauge\n"
            "up_ish 0.125\n");
}

TEST(RegistryTest, WithLabelsReturnsTheSameChild) {
  MetricRegistry r;
  Family<Counter>& c = r.AddCounter("x_total", "x", {"a", "b"});
  Counter& one = c.WithLabels({"1", "2"});
  EXPECT_EQ(&one, &c.WithLabels({"1", "2"}));
  EXPECT_NE(&one, &c.WithLabels({"2", "1"}));
}

TEST(RegistryTest, HistogramBucketsAreCumulativeWithInfSumAndCount) {
  MetricRegistry r;
  Family<Histogram>& f =
      r.AddHistogram("kvrm:lat_seconds", "Latency.", {"kv_mode"}, {0.01, 0.1, 1});
  Histogram& h = f.WithLabels({"static"});
  for (double v : {0.005, 0.01, 0.05, 0.1, 0.1, 0.5, 2.0, 100.0}) h.Observe(v);
  // Upper bounds are inclusive: 0.01 lands in le=0.01 and 0.1 in le=0.1.
  EXPECT_EQ(h.CumulativeCounts(), (std::vector<uint64_t>{2, 5, 6, 8}));
  EXPECT_EQ(h.Count(), 8u);
  EXPECT_DOUBLE_EQ(h.Sum(), 102.765);
  EXPECT_EQ(r.Render(),
            "# HELP kvrm:lat_seconds Latency.\n"
            "# TYPE kvrm:lat_seconds histogram\n"
            "kvrm:lat_seconds_bucket{kv_mode=\"static\",le=\"0.01\"} 2\n"
            "kvrm:lat_seconds_bucket{kv_mode=\"static\",le=\"0.1\"} 5\n"
            "kvrm:lat_seconds_bucket{kv_mode=\"static\",le=\"1\"} 6\n"
            "kvrm:lat_seconds_bucket{kv_mode=\"static\",le=\"+Inf\"} 8\n"
            "kvrm:lat_seconds_sum{kv_mode=\"static\"} 102.765\n"
            "kvrm:lat_seconds_count{kv_mode=\"static\"} 8\n");
}

TEST(RegistryTest, EmptyHistogramRendersZeros) {
  MetricRegistry r;
  r.AddHistogram("h", "h", {}, {1}).WithLabels({});
  EXPECT_EQ(r.Render(),
            "# HELP h h\n# TYPE h histogram\n"
            "h_bucket{le=\"1\"} 0\nh_bucket{le=\"+Inf\"} 0\nh_sum 0\nh_count 0\n");
}

TEST(RegistryTest, HistogramMatchesANaiveCountOnRandomValues) {
  MetricRegistry r;
  const std::vector<double> bounds = {0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5};
  Histogram& h = r.AddHistogram("h", "h", {}, bounds).WithLabels({});
  std::mt19937 rng(7);
  std::exponential_distribution<double> dist(10.0);
  std::vector<double> values(5000);
  double sum = 0;
  for (double& v : values) {
    v = dist(rng);
    h.Observe(v);
    sum += v;
  }
  const std::vector<uint64_t> cum = h.CumulativeCounts();
  for (size_t i = 0; i < bounds.size(); ++i) {
    uint64_t expected = 0;
    for (double v : values) expected += v <= bounds[i];
    EXPECT_EQ(cum[i], expected) << "le=" << bounds[i];
  }
  EXPECT_EQ(cum.back(), values.size());
  EXPECT_NEAR(h.Sum(), sum, 1e-9 * sum);
}

TEST(RegistryTest, ConcurrentRecordingLosesNothing) {
  MetricRegistry r;
  Counter& c = r.AddCounter("c_total", "c").WithLabels({});
  Histogram& h = r.AddHistogram("h", "h", {}, {0.5}).WithLabels({});
  constexpr int kThreads = 4;
  constexpr int kEach = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        c.Add();
        h.Observe(t % 2 == 0 ? 0.25 : 1.0);
      }
    });
  }
  // Scrapes while recording must see consistent cumulative counts.
  for (int i = 0; i < 50; ++i) {
    const std::string text = r.Render();
    EXPECT_NE(text.find("h_bucket{le=\"+Inf\"}"), std::string::npos);
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(c.Value(), kThreads * kEach);
  EXPECT_EQ(h.CumulativeCounts(), (std::vector<uint64_t>{2 * kEach, 4 * kEach}));
  EXPECT_DOUBLE_EQ(h.Sum(), 2 * kEach * 0.25 + 2 * kEach * 1.0);
}

TEST(RegistryDeathTest, RejectsBadNamesDuplicatesAndBuckets) {
  MetricRegistry r;
  r.AddCounter("dup_total", "x");
  EXPECT_DEATH(r.AddCounter("dup_total", "again"), "registered twice");
  EXPECT_DEATH(r.AddGauge("bad-name", "x"), "invalid metric name");
  EXPECT_DEATH(r.AddGauge("g", "x", {"bad:label"}), "invalid label name");
  EXPECT_DEATH(r.AddHistogram("h1", "x", {"le"}, {1}), "reserved");
  EXPECT_DEATH(r.AddHistogram("h2", "x", {}, {1, 1}), "increase");
  Family<Gauge>& g = r.AddGauge("g2", "x", {"a"});
  EXPECT_DEATH(g.WithLabels({"1", "2"}), "label values");
}

}  // namespace
}  // namespace kvrm
