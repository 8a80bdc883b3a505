#include "metrics/exposition.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace kvrm {
namespace {

TEST(ExpositionTest, HelpEscapesBackslashAndNewlineButNotQuotes) {
  EXPECT_EQ(EscapeHelp("plain text"), "plain text");
  EXPECT_EQ(EscapeHelp("a\\b"), "a\\\\b");
  EXPECT_EQ(EscapeHelp("line1\nline2"), "line1\\nline2");
  EXPECT_EQ(EscapeHelp("say \"hi\""), "say \"hi\"");
}

TEST(ExpositionTest, LabelValuesEscapeBackslashQuoteAndNewline) {
  EXPECT_EQ(EscapeLabelValue("device"), "device");
  EXPECT_EQ(EscapeLabelValue("C:\\models"), "C:\\\\models");
  EXPECT_EQ(EscapeLabelValue("a\"b"), "a\\\"b");
  EXPECT_EQ(EscapeLabelValue("x\ny"), "x\\ny");
  EXPECT_EQ(EscapeLabelValue("\\\"\n"), "\\\\\\\"\\n");
  // UTF-8 passes through untouched.
  EXPECT_EQ(EscapeLabelValue("mod\xc3\xa8le"), "mod\xc3\xa8le");
}

TEST(ExpositionTest, FormatsIntegersSpecialsAndShortestDecimals) {
  EXPECT_EQ(FormatValue(0), "0");
  EXPECT_EQ(FormatValue(42), "42");
  EXPECT_EQ(FormatValue(-3), "-3");
  EXPECT_EQ(FormatValue(1e15), "1000000000000000");
  EXPECT_EQ(FormatValue(0.25), "0.25");
  EXPECT_EQ(FormatValue(0.1), "0.1");
  EXPECT_EQ(FormatValue(0.0025), "0.0025");
  EXPECT_EQ(FormatValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(FormatValue(std::nan("")), "NaN");
  // Round trip of an awkward value.
  const double v = 1.0 / 3.0;
  EXPECT_EQ(std::stod(FormatValue(v)), v);
}

TEST(ExpositionTest, NameValidation) {
  EXPECT_TRUE(IsValidMetricName("kvrm:time_to_first_token_seconds"));
  EXPECT_TRUE(IsValidMetricName("_x9"));
  EXPECT_FALSE(IsValidMetricName("9x"));
  EXPECT_FALSE(IsValidMetricName("a-b"));
  EXPECT_FALSE(IsValidMetricName(""));
  EXPECT_TRUE(IsValidLabelName("kv_mode"));
  EXPECT_FALSE(IsValidLabelName("kv:mode"));
  EXPECT_FALSE(IsValidLabelName("__name__"));
}

TEST(ExpositionTest, HeaderLines) {
  std::string out;
  AppendHeader(&out, "kvrm:x_total", "Counts \\ things\nacross lines.", "counter");
  EXPECT_EQ(out,
            "# HELP kvrm:x_total Counts \\\\ things\\nacross lines.\n"
            "# TYPE kvrm:x_total counter\n");
}

TEST(ExpositionTest, SampleLinesKeepLabelOrderAndPutLeLast) {
  const std::vector<std::string> names = {"zeta", "alpha"};
  const std::vector<std::string> values = {"1", "quote\"d"};
  std::string out;
  AppendSample(&out, "m", names, values, "", 7);
  AppendSample(&out, "m_bucket", names, values, "0.5", 3);
  AppendSample(&out, "plain", {}, {}, "", 1.5);
  AppendSample(&out, "only_le_bucket", {}, {}, "+Inf", 2);
  EXPECT_EQ(out,
            "m{zeta=\"1\",alpha=\"quote\\\"d\"} 7\n"
            "m_bucket{zeta=\"1\",alpha=\"quote\\\"d\",le=\"0.5\"} 3\n"
            "plain 1.5\n"
            "only_le_bucket{le=\"+Inf\"} 2\n");
}

}  // namespace
}  // namespace kvrm
