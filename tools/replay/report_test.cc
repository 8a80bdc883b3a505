#include "tools/replay/report.h"

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace kvrm::replay {
namespace {

std::vector<RequestRecord> Records() {
  RequestRecord a;
  a.index = 0;
  a.send_s = 0;
  a.token_times_s = {0.1, 0.2, 0.3};
  a.first_token_s = 0.1;
  a.finish_s = 0.3;
  a.finish_reason = "LENGTH";
  RequestRecord b;
  b.index = 1;
  b.scheduled_s = b.send_s = 1.5;
  b.finish_s = 1.6;
  b.grpc_code = 8;
  b.error = "queue full, \"retry\"";
  return {a, b};
}

TEST(ReportTest, TableNamesTheNumbers) {
  const std::string t = FormatTable(Summarize(Records(), Slo{150, 0}));
  EXPECT_TRUE(absl::StrContains(t, "requests 2: completed 1, refused (RESOURCE_EXHAUSTED) 1")) << t;
  EXPECT_TRUE(absl::StrContains(t, "time to first token")) << t;
  EXPECT_TRUE(absl::StrContains(t, "goodput (TTFT <= 150 ms")) << t;
}

TEST(ReportTest, JsonHasSummaryAndWindowsWithNullsForEmptyWindows) {
  const Json j = SummaryToJson(Summarize(Records(), Slo{}));
  EXPECT_EQ(j["requests"], 2);
  EXPECT_EQ(j["refused"], 1);
  EXPECT_NEAR(j["ttft_ms"]["p50"].get<double>(), 100, 1e-6);
  EXPECT_TRUE(j["slo"].is_null());
  ASSERT_EQ(j["windows"].size(), 2u);
  EXPECT_EQ(j["windows"][0]["tokens"], 3);
  EXPECT_TRUE(j["windows"][1]["itl_ms"].is_null());
  EXPECT_EQ(j["windows"][1]["arrivals"], 1);
}

TEST(ReportTest, CsvOneRowPerRequestWithQuoting) {
  const std::string csv = RecordsToCsv(Records());
  const std::vector<std::string> lines = absl::StrSplit(csv, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_TRUE(absl::StartsWith(lines[0], "index,trace_s,"));
  EXPECT_TRUE(absl::StrContains(lines[1], ",OK,LENGTH,,0.100000 0.200000 0.300000")) << lines[1];
  EXPECT_TRUE(absl::StrContains(lines[2], ",RESOURCE_EXHAUSTED,,\"queue full, \"\"retry\"\"\","))
      << lines[2];
}

TEST(ReportTest, SvgHasSeriesBarsAndEscapedTitle) {
  const std::string svg = RenderSvg(Summarize(Records(), Slo{}), "a <b> & c");
  EXPECT_TRUE(absl::StartsWith(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\""));
  EXPECT_TRUE(absl::EndsWith(svg, "</svg>\n"));
  EXPECT_TRUE(absl::StrContains(svg, "a &lt;b&gt; &amp; c"));
  for (const char* label : {"ITL p50", "ITL p99", "TTFT p50", "TTFT p99"}) {
    EXPECT_TRUE(absl::StrContains(svg, label)) << label;
  }
  // One arrival bar per window (2) plus the background rectangle.
  int rects = 0;
  for (size_t p = 0; (p = svg.find("<rect", p)) != std::string::npos; ++p) ++rects;
  EXPECT_EQ(rects, 3);
  EXPECT_FALSE(absl::StrContains(svg, "nan"));
  EXPECT_FALSE(absl::StrContains(svg, "inf"));
}

}  // namespace
}  // namespace kvrm::replay
