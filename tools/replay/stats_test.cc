#include "tools/replay/stats.h"

#include <cmath>

#include "gtest/gtest.h"

namespace kvrm::replay {
namespace {

constexpr double kTol = 1e-6;

RequestRecord Ok(int index, double send, std::vector<double> tokens) {
  RequestRecord r;
  r.index = index;
  r.scheduled_s = send;
  r.send_s = send;
  r.token_times_s = std::move(tokens);
  r.first_token_s = r.token_times_s.empty() ? -1 : r.token_times_s.front();
  r.finish_s = r.token_times_s.empty() ? send : r.token_times_s.back();
  r.input_tokens = 10;
  r.finish_reason = "LENGTH";
  return r;
}

RequestRecord Failed(int index, double send, double finish, int code, std::string reason = "") {
  RequestRecord r;
  r.index = index;
  r.scheduled_s = send;
  r.send_s = send;
  r.finish_s = finish;
  r.grpc_code = code;
  r.finish_reason = std::move(reason);
  return r;
}

// Known latencies:
//   A  send 0.0, tokens 0.1 0.2 0.3 0.4    TTFT 100, TPOT 100, ITL 100 x3, e2e 400
//   B  send 1.0 (due 0.98), tokens 1.5 1.55  TTFT 500, TPOT 50, ITL 50, e2e 550
//   C  send 1.2, token 1.3                  TTFT 100, no TPOT, e2e 100
//   D  RESOURCE_EXHAUSTED at 2.0; E  finished with reason ERROR; F  UNAVAILABLE, ends at 3.0
std::vector<RequestRecord> KnownRun() {
  std::vector<RequestRecord> r = {
      Ok(0, 0.0, {0.1, 0.2, 0.3, 0.4}), Ok(1, 1.0, {1.5, 1.55}),         Ok(2, 1.2, {1.3}),
      Failed(3, 2.0, 2.001, 8),         Failed(4, 2.5, 2.6, 0, "ERROR"), Failed(5, 2.7, 3.0, 14)};
  r[1].scheduled_s = 0.98;
  r[2].clamped = true;
  r[1].server_cached_prompt_tokens = 8;
  r[4].server_cached_prompt_tokens = 16;  // failed: not counted
  return r;
}

TEST(PercentileTest, LinearInterpolationBetweenRanks) {
  const std::vector<double> v = {10, 20, 30, 40, 50};
  EXPECT_DOUBLE_EQ(Percentile(v, 0), 10);
  EXPECT_DOUBLE_EQ(Percentile(v, 50), 30);
  EXPECT_DOUBLE_EQ(Percentile(v, 90), 46);  // rank 3.6
  EXPECT_DOUBLE_EQ(Percentile(v, 99), 49.6);
  EXPECT_DOUBLE_EQ(Percentile(v, 100), 50);
  EXPECT_DOUBLE_EQ(Percentile(std::vector<double>{7}, 99), 7);
  EXPECT_DOUBLE_EQ(Percentile(std::vector<double>{}, 50), 0);
  // 1..100: p99 is 99.01 by interpolation.
  std::vector<double> h;
  for (int i = 1; i <= 100; ++i) h.push_back(i);
  EXPECT_NEAR(Percentile(h, 99), 99.01, 1e-9);
  const Distribution d = Distribute({3, 1, 2});
  EXPECT_EQ(d.count, 3);
  EXPECT_DOUBLE_EQ(d.mean, 2);
  EXPECT_DOUBLE_EQ(d.max, 3);
}

TEST(SummaryTest, CountsLatenciesAndThroughput) {
  const Summary s = Summarize(KnownRun(), Slo{});
  EXPECT_EQ(s.requests, 6);
  EXPECT_EQ(s.completed, 3);
  EXPECT_EQ(s.refused, 1);
  EXPECT_EQ(s.failed, 2);
  EXPECT_EQ(s.clamped, 1);
  EXPECT_EQ(s.status_codes.at("RESOURCE_EXHAUSTED"), 1);
  EXPECT_EQ(s.status_codes.at("UNAVAILABLE"), 1);
  EXPECT_EQ(s.finish_reasons.at("LENGTH"), 3);
  EXPECT_EQ(s.finish_reasons.at("ERROR"), 1);
  EXPECT_EQ(s.output_tokens, 7);
  EXPECT_EQ(s.input_tokens, 30);
  EXPECT_EQ(s.cached_input_tokens, 8);
  EXPECT_NEAR(s.duration_s, 3.0, kTol);
  EXPECT_NEAR(s.output_tokens_per_s, 7 / 3.0, kTol);
  EXPECT_NEAR(s.requests_per_s, 1.0, kTol);
  EXPECT_NEAR(s.max_send_lag_ms, 20, kTol);
  // First to last token: A 0.3 s, B 0.05 s, C 0; over 3 s.
  EXPECT_NEAR(s.mean_decoding, 0.35 / 3.0, kTol);

  // TTFT {100, 100, 500}
  EXPECT_EQ(s.ttft_ms.count, 3);
  EXPECT_NEAR(s.ttft_ms.mean, 700 / 3.0, kTol);
  EXPECT_NEAR(s.ttft_ms.p50, 100, kTol);
  EXPECT_NEAR(s.ttft_ms.p90, 420, kTol);
  EXPECT_NEAR(s.ttft_ms.p99, 492, kTol);
  EXPECT_NEAR(s.ttft_ms.max, 500, kTol);
  // TPOT {100, 50}: C's single token has none.
  EXPECT_EQ(s.tpot_ms.count, 2);
  EXPECT_NEAR(s.tpot_ms.mean, 75, kTol);
  EXPECT_NEAR(s.tpot_ms.max, 100, kTol);
  // ITL {50, 100, 100, 100}
  EXPECT_EQ(s.itl_ms.count, 4);
  EXPECT_NEAR(s.itl_ms.mean, 87.5, kTol);
  EXPECT_NEAR(s.itl_ms.p50, 100, kTol);
  // E2E {100, 400, 550}
  EXPECT_NEAR(s.e2e_ms.p50, 400, kTol);
  EXPECT_NEAR(s.e2e_ms.p99, 400 + 150 * 0.98, kTol);
}

TEST(SummaryTest, GoodputUnderSlo) {
  // TTFT <= 200 and TPOT <= 80: A fails TPOT, B fails TTFT, C passes.
  Summary s = Summarize(KnownRun(), Slo{200, 80});
  EXPECT_EQ(s.good, 1);
  EXPECT_NEAR(s.goodput_rps, 1 / 3.0, kTol);
  // TPOT bound only: all three completed requests pass; errors never count.
  s = Summarize(KnownRun(), Slo{0, 120});
  EXPECT_EQ(s.good, 3);
  s = Summarize(KnownRun(), Slo{99, 0});
  EXPECT_EQ(s.good, 0);

  EXPECT_TRUE(ParseSlo("200,50").ok());
  EXPECT_DOUBLE_EQ(ParseSlo("200,50")->tpot_ms, 50);
  EXPECT_FALSE(ParseSlo("200").ok());
  EXPECT_FALSE(ParseSlo("a,b").ok());
  EXPECT_FALSE(ParseSlo("-1,5").ok());
}

TEST(SummaryTest, OneSecondWindows) {
  const Summary s = Summarize(KnownRun(), Slo{});
  ASSERT_EQ(s.windows.size(), 3u);      // [0,1) [1,2) [2,3]; the last finish at 3.0 is in the last
  EXPECT_EQ(s.windows[0].arrivals, 2);  // A, and B which was due at 0.98
  EXPECT_EQ(s.windows[1].arrivals, 1);
  EXPECT_EQ(s.windows[2].arrivals, 3);
  EXPECT_EQ(s.windows[0].tokens, 4);
  EXPECT_EQ(s.windows[1].tokens, 3);
  EXPECT_EQ(s.windows[2].tokens, 0);
  EXPECT_EQ(s.windows[0].itl_ms.count, 3);
  EXPECT_NEAR(s.windows[0].itl_ms.p99, 100, kTol);
  EXPECT_EQ(s.windows[1].itl_ms.count, 1);
  EXPECT_NEAR(s.windows[1].itl_ms.p99, 50, kTol);
  EXPECT_EQ(s.windows[2].itl_ms.count, 0);
  // TTFT by arrival window: A and B arrived in window 0, C in window 1.
  EXPECT_NEAR(s.windows[0].ttft_ms.p50, 300, kTol);
  EXPECT_NEAR(s.windows[0].ttft_ms.max, 500, kTol);
  EXPECT_NEAR(s.windows[1].ttft_ms.p50, 100, kTol);
  EXPECT_NEAR(s.worst_window_itl_p99_over_median, 1.0, kTol);

  // A spike: one 1-second gap in window 2 of a steady 100 ms stream.
  std::vector<RequestRecord> spiky = {
      Ok(0, 0, {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 2.2})};
  const Summary t = Summarize(spiky, Slo{});
  EXPECT_NEAR(t.itl_ms.p50, 100, kTol);
  ASSERT_EQ(t.windows.size(), 3u);
  EXPECT_NEAR(t.windows[2].itl_ms.max, 1000, kTol);
  EXPECT_NEAR(t.worst_window_itl_p99_over_median, 10, kTol);

  // Half-second windows.
  EXPECT_EQ(Summarize(KnownRun(), Slo{}, 0.5).windows.size(), 6u);
}

TEST(SummaryTest, StreamWithoutFinalMessageIsAFailure) {
  RequestRecord lost = Ok(0, 0, {0.1, 0.2});
  lost.finish_reason = "";  // status OK, but the final message never arrived
  const Summary s = Summarize({lost}, Slo{});
  EXPECT_EQ(s.completed, 0);
  EXPECT_EQ(s.failed, 1);
  EXPECT_EQ(s.finish_reasons.at("NONE"), 1);
  EXPECT_EQ(s.good, 0);
  EXPECT_EQ(s.ttft_ms.count, 0);
}

TEST(SummaryTest, CancelledTimedOutAndTokenlessStreamsDidNotComplete) {
  // Status OK and a final message, but not what was asked: a drain's CANCELLED, a TIME_LIMIT,
  // and a LENGTH with no token. None is completed, none is good, none has a TTFT of 0.
  RequestRecord cancelled = Ok(0, 0, {0.1});
  cancelled.finish_reason = "CANCELLED";
  RequestRecord timed_out = Ok(1, 0, {0.1, 0.2});
  timed_out.finish_reason = "TIME_LIMIT";
  RequestRecord tokenless = Ok(2, 0, {});
  const RequestRecord fine = Ok(3, 0, {0.3, 0.4});
  const Summary s = Summarize({cancelled, timed_out, tokenless, fine}, Slo{1000, 1000});
  EXPECT_EQ(s.completed, 1);
  EXPECT_EQ(s.failed, 3);
  EXPECT_EQ(s.good, 1);
  EXPECT_EQ(s.finish_reasons.at("CANCELLED"), 1);
  EXPECT_EQ(s.finish_reasons.at("TIME_LIMIT"), 1);
  EXPECT_EQ(s.ttft_ms.count, 1);
  EXPECT_NEAR(s.ttft_ms.p50, 300, kTol);
  for (const char* reason : {"EOS", "STOP", "TOOL_CALLS", "LENGTH"}) {
    RequestRecord r = Ok(0, 0, {0.1});
    r.finish_reason = reason;
    EXPECT_TRUE(Completed(r)) << reason;
  }
}

TEST(SummaryTest, TpotEndsAtTheLastTokenNotTheStatus) {
  // The status comes 300 ms after the last token: E2E includes it, TPOT does not.
  RequestRecord r = Ok(0, 0, {0.1, 0.2, 0.3});
  r.finish_s = 0.6;
  EXPECT_NEAR(TpotMs(r), 100, kTol);
  EXPECT_NEAR(E2eMs(r), 600, kTol);
}

TEST(SummaryTest, BurstRatioIsUndefinedWithoutAPositiveMedian) {
  // Most tokens arrived together (one merged message each): the median gap is 0, and a ratio
  // to it says nothing; it must not read as a pass (0).
  const Summary merged = Summarize({Ok(0, 0, {0.1, 0.1, 0.1, 0.1, 0.9})}, Slo{});
  EXPECT_DOUBLE_EQ(merged.itl_ms.p50, 0);
  EXPECT_TRUE(std::isnan(merged.worst_window_itl_p99_over_median));
  // One-token outputs: no gaps at all.
  EXPECT_TRUE(std::isnan(Summarize({Ok(0, 0, {0.1}), Ok(1, 0, {0.2})}, Slo{})
                             .worst_window_itl_p99_over_median));
}

TEST(SummaryTest, EmptyRun) {
  const Summary s = Summarize({}, Slo{});
  EXPECT_EQ(s.requests, 0);
  EXPECT_TRUE(s.windows.empty());
}

}  // namespace
}  // namespace kvrm::replay
