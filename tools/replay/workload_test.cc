#include "tools/replay/workload.h"

#include <cmath>
#include <limits>
#include <numeric>

#include "gtest/gtest.h"

namespace kvrm::replay {
namespace {

std::vector<TraceRequest> Trace() {
  // Arrivals 0, 1, 2, ..., 9 s; lengths grow with the index.
  std::vector<TraceRequest> t;
  for (int i = 0; i < 10; ++i)
    t.push_back({static_cast<double>(i), 100 * (i + 1), 10 * (i + 1), {}});
  return t;
}

TEST(ShapeTraceTest, WindowIsHalfOpenAndRelativeToItsFirstRow) {
  ShapeOptions o;
  o.start_s = 2.5;
  o.duration_s = 4;  // [2.5, 6.5): rows at 3, 4, 5, 6
  auto plan = ShapeTrace(Trace(), o);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->size(), 4u);
  EXPECT_DOUBLE_EQ((*plan)[0].send_at_s, 0);
  EXPECT_DOUBLE_EQ((*plan)[0].trace_s, 3);
  EXPECT_DOUBLE_EQ((*plan)[3].send_at_s, 3);
  EXPECT_EQ((*plan)[3].index, 3);
  EXPECT_EQ((*plan)[0].input_tokens, 400);

  o.start_s = 3;
  o.duration_s = 3;  // [3, 6): the row at 6 is out
  EXPECT_EQ(ShapeTrace(Trace(), o)->size(), 3u);
  o.duration_s = -1;  // to the end
  EXPECT_EQ(ShapeTrace(Trace(), o)->size(), 7u);
  o.max_requests = 2;
  EXPECT_EQ(ShapeTrace(Trace(), o)->size(), 2u);
}

TEST(ShapeTraceTest, TimeScaleCompressesGaps) {
  ShapeOptions o;
  o.time_scale = 0.1;
  auto plan = ShapeTrace(Trace(), o);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->size(), 10u);
  EXPECT_NEAR((*plan)[9].send_at_s, 0.9, 1e-12);
  EXPECT_DOUBLE_EQ((*plan)[9].trace_s, 9);  // the trace clock is kept for reports
  o.time_scale = 0;
  EXPECT_FALSE(ShapeTrace(Trace(), o).ok());
}

TEST(ShapeTraceTest, LengthScalingRoundsAndKeepsAtLeastOneToken) {
  ShapeOptions o;
  o.input_scale = 0.125;
  o.output_scale = 0.01;
  auto plan = ShapeTrace(Trace(), o);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ((*plan)[0].input_tokens, 13);       // 100 * 0.125 = 12.5 rounds to 13
  EXPECT_EQ((*plan)[0].output_tokens, 1);       // 10 * 0.01 = 0.1, at least one
  EXPECT_EQ((*plan)[9].output_tokens, 1);       // 100 * 0.01 = 1
  EXPECT_EQ((*plan)[0].hash_block_tokens, 64);  // 512 * 0.125: prefix blocks shrink too

  std::vector<TraceRequest> zero = {{0, 0, 0, {}}};
  plan = ShapeTrace(zero, ShapeOptions{});
  EXPECT_EQ((*plan)[0].input_tokens, 1);
  EXPECT_EQ((*plan)[0].output_tokens, 1);
}

TEST(ClampTest, OutputKeptPromptCutToFitContext) {
  std::vector<PlannedRequest> plan(4);
  plan[0].input_tokens = 100, plan[0].output_tokens = 50;   // fits
  plan[1].input_tokens = 500, plan[1].output_tokens = 100;  // prompt cut to 412
  plan[2].input_tokens = 10, plan[2].output_tokens = 5000;  // output capped by the server limit
  plan[3].input_tokens = 10, plan[3].output_tokens = 600;   // output over the context
  ServerLimits limits{512, 300};
  EXPECT_EQ(ClampToServer(limits, &plan), 3);
  EXPECT_FALSE(plan[0].clamped);
  EXPECT_EQ(plan[0].input_tokens, 100);
  EXPECT_EQ(plan[1].input_tokens, 412);
  EXPECT_EQ(plan[1].output_tokens, 100);
  EXPECT_TRUE(plan[1].clamped);
  EXPECT_EQ(plan[2].output_tokens, 300);
  EXPECT_EQ(plan[2].input_tokens, 10);
  EXPECT_EQ(plan[3].output_tokens, 300);
  for (const PlannedRequest& r : plan) EXPECT_LE(r.input_tokens + r.output_tokens, 512);

  // Without a max_new_tokens limit the output may take all but one position.
  std::vector<PlannedRequest> big(1);
  big[0].input_tokens = 50, big[0].output_tokens = 1000;
  ClampToServer({512, 0}, &big);
  EXPECT_EQ(big[0].output_tokens, 511);
  EXPECT_EQ(big[0].input_tokens, 1);
}

TEST(SyntheticTest, PoissonRateAndGammaBurstiness) {
  constexpr int kN = 20000;
  for (auto [process, cv] :
       {std::pair{ArrivalProcess::kPoisson, 1.0}, std::pair{ArrivalProcess::kGamma, 3.0},
        std::pair{ArrivalProcess::kGamma, 0.5}}) {
    const std::vector<double> t = SyntheticArrivals(process, 4.0, cv, kN, 7);
    ASSERT_EQ(t.size(), static_cast<size_t>(kN));
    std::vector<double> gaps(kN);
    std::adjacent_difference(t.begin(), t.end(), gaps.begin());
    const double mean = std::accumulate(gaps.begin(), gaps.end(), 0.0) / kN;
    double var = 0;
    for (double g : gaps) var += (g - mean) * (g - mean);
    const double measured_cv = std::sqrt(var / kN) / mean;
    EXPECT_NEAR(mean, 0.25, 0.25 * 0.05) << cv;  // rate 4/s
    EXPECT_NEAR(measured_cv, cv, cv * 0.1);
    EXPECT_TRUE(std::is_sorted(t.begin(), t.end()));
  }
  // Same seed, same arrivals.
  EXPECT_EQ(SyntheticArrivals(ArrivalProcess::kGamma, 2, 2, 50, 3),
            SyntheticArrivals(ArrivalProcess::kGamma, 2, 2, 50, 3));
}

TEST(SyntheticArrivalsTest, InfiniteRateQueuesEverythingAtOnce) {
  const double inf = std::numeric_limits<double>::infinity();
  for (ArrivalProcess process : {ArrivalProcess::kPoisson, ArrivalProcess::kGamma}) {
    EXPECT_EQ(SyntheticArrivals(process, inf, 2, 5, 3), std::vector<double>(5, 0.0));
  }
}

TEST(SyntheticTest, LengthsFromMixOrTrace) {
  auto mix = ParseLengthMix("100:10:3,2000:20:1");
  ASSERT_TRUE(mix.ok());
  ASSERT_EQ(mix->size(), 2u);
  EXPECT_EQ((*mix)[1].input_tokens, 2000);
  EXPECT_DOUBLE_EQ((*mix)[0].weight, 3);
  EXPECT_FALSE(ParseLengthMix("100").ok());
  EXPECT_FALSE(ParseLengthMix("100:0").ok());
  EXPECT_FALSE(ParseLengthMix("").ok());

  std::vector<double> arrivals(4000);
  std::iota(arrivals.begin(), arrivals.end(), 0.0);
  auto plan = SyntheticRequests(arrivals, *mix, {}, 1.0, 1.0, 5);
  ASSERT_TRUE(plan.ok());
  int short_ones = 0;
  for (const PlannedRequest& r : *plan) {
    ASSERT_TRUE((r.input_tokens == 100 && r.output_tokens == 10) ||
                (r.input_tokens == 2000 && r.output_tokens == 20));
    short_ones += r.input_tokens == 100;
  }
  EXPECT_NEAR(short_ones / 4000.0, 0.75, 0.03);

  // Empirical: every drawn pair is a row of the trace, scaled.
  const std::vector<TraceRequest> trace = Trace();
  plan = SyntheticRequests(arrivals, {}, trace, 0.5, 2.0, 5);
  ASSERT_TRUE(plan.ok());
  for (const PlannedRequest& r : *plan) {
    EXPECT_EQ(r.input_tokens % 50, 0);
    EXPECT_EQ(r.output_tokens, r.input_tokens / 50 * 20);
  }
  EXPECT_FALSE(SyntheticRequests(arrivals, {}, {}, 1, 1, 5).ok());
}

}  // namespace
}  // namespace kvrm::replay
