#include "tools/replay/trace.h"

#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "tools/replay/trace_files.h"

namespace kvrm::replay {
namespace {

constexpr char kTestdata[] = "tools/replay/testdata/";

void ExpectErrorAt(const absl::StatusOr<std::vector<TraceRequest>>& result,
                   const std::string& where, const std::string& words) {
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(result.status().message(), where)) << result.status();
  EXPECT_TRUE(absl::StrContains(result.status().message(), words)) << result.status();
}

TEST(AzureTimestampTest, SevenFractionDigitsAndCalendar) {
  EXPECT_DOUBLE_EQ(*ParseAzureTimestamp("1970-01-02 00:00:01.5"), 86401.5);
  EXPECT_DOUBLE_EQ(*ParseAzureTimestamp("1970-01-01 00:00:00.0000001"), 1e-7);
  // Years whose nanoseconds would overflow int64 (found by the trace fuzzer) are rejected.
  EXPECT_FALSE(ParseAzureTimestamp("9023-11-16 00:00:00").ok());
  EXPECT_FALSE(ParseAzureTimestamp("1969-12-31 23:59:59").ok());
  // 2024 is a leap year: Feb 29 then Mar 1 are one day apart.
  EXPECT_DOUBLE_EQ(
      *ParseAzureTimestamp("2024-03-01 00:00:00") - *ParseAzureTimestamp("2024-02-29 00:00:00"),
      86400);
  EXPECT_DOUBLE_EQ(*ParseAzureTimestamp("2023-11-16 18:15:46"), 1700158546);
  EXPECT_FALSE(ParseAzureTimestamp("2023-11-16T18:15:46").ok());
  EXPECT_FALSE(ParseAzureTimestamp("2023-11-16 18:15:46.").ok());
  EXPECT_FALSE(ParseAzureTimestamp("2023-11-16 18:15:4x").ok());
  EXPECT_FALSE(ParseAzureTimestamp("2023-13-16 18:15:46").ok());
}

TEST(AzureCsvTest, ParsesFileWithoutFinalNewline) {
  absl::StatusOr<std::vector<TraceRequest>> rows =
      ReadTrace(std::string(kTestdata) + "azure_small.csv", TraceFormat::kAuto);
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 5u);  // the last row has no '\n' and still counts
  EXPECT_EQ((*rows)[0].arrival_s, 0);
  EXPECT_EQ((*rows)[0].input_tokens, 374);
  EXPECT_EQ((*rows)[0].output_tokens, 44);
  EXPECT_NEAR((*rows)[1].arrival_s, 4.3145790, 1e-9);
  // Rows 3 and 4 are 100 ns apart: the seventh fractional digit survives.
  EXPECT_NEAR((*rows)[3].arrival_s - (*rows)[2].arrival_s, 1e-7, 1e-9);
  EXPECT_GT((*rows)[3].arrival_s, (*rows)[2].arrival_s);
  // Across midnight: 5 h 44 min 13.3194100 s after the first row.
  EXPECT_NEAR((*rows)[4].arrival_s, 5 * 3600 + 44 * 60 + 13.31941, 1e-6);
  EXPECT_EQ((*rows)[4].output_tokens, 1);
  EXPECT_TRUE((*rows)[4].hash_ids.empty());
}

TEST(AzureCsvTest, CrlfAndTrailingNewlineAreAccepted) {
  auto rows = ParseAzureCsv(
      "TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-01-01 00:00:00.5,3,4\r\n"
      "2023-01-01 00:00:01.25,5,6\r\n",
      "x.csv");
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 2u);
  EXPECT_DOUBLE_EQ((*rows)[1].arrival_s, 0.75);
  EXPECT_EQ((*rows)[1].output_tokens, 6);
}

TEST(AzureCsvTest, MalformedLinesNameFileAndLine) {
  const std::string header = "TIMESTAMP,ContextTokens,GeneratedTokens\n";
  ExpectErrorAt(
      ParseAzureCsv(header + "2023-01-01 00:00:00,1,2\n2023-01-01 00:00:01,12\n", "a.csv"),
      "a.csv:3", "expected 3 fields");
  ExpectErrorAt(
      ParseAzureCsv(header + "2023-01-01 00:00:00,1,2\n\n2023-01-01 25:00:00,1,2", "a.csv"),
      "a.csv:4", "timestamp");
  ExpectErrorAt(ParseAzureCsv(header + "2023-01-01 00:00:00,-5,2\n", "a.csv"), "a.csv:2",
                "ContextTokens");
  ExpectErrorAt(ParseAzureCsv(header + "2023-01-01 00:00:00,5,x\n", "a.csv"), "a.csv:2",
                "GeneratedTokens");
  ExpectErrorAt(ParseAzureCsv("2023-01-01 00:00:00,5,1\n", "a.csv"), "a.csv:1", "header");
}

TEST(MooncakeTest, ParsesHashIdsAndSortsByTimestamp) {
  absl::StatusOr<std::vector<TraceRequest>> rows =
      ReadTrace(std::string(kTestdata) + "mooncake_small.jsonl", TraceFormat::kAuto);
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 3u);
  EXPECT_EQ((*rows)[0].hash_ids, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_DOUBLE_EQ((*rows)[1].arrival_s, 1.5);  // the third line, sorted into place
  EXPECT_EQ((*rows)[1].input_tokens, 300);
  EXPECT_EQ((*rows)[1].hash_ids, (std::vector<int64_t>{4}));
  EXPECT_DOUBLE_EQ((*rows)[2].arrival_s, 3.0);
  EXPECT_EQ((*rows)[2].output_tokens, 7);
  EXPECT_EQ((*rows)[2].hash_ids, (std::vector<int64_t>{0, 1, 3}));
}

TEST(MooncakeTest, MalformedLinesNameFileAndLine) {
  const std::string ok = R"({"timestamp": 0, "input_length": 5, "output_length": 2})";
  ExpectErrorAt(ParseMooncakeJsonl(ok + "\n{\"timestamp\": 1, \"input_length\"\n", "m.jsonl"),
                "m.jsonl:2", "");
  ExpectErrorAt(
      ParseMooncakeJsonl(ok + "\n" + R"({"timestamp": 1, "output_length": 2})", "m.jsonl"),
      "m.jsonl:2", "input_length");
  ExpectErrorAt(
      ParseMooncakeJsonl(
          R"({"timestamp": 1, "input_length": 5, "output_length": 2, "hash_ids": [1, "a"]})",
          "m.jsonl"),
      "m.jsonl:1", "hash_ids");
  ExpectErrorAt(
      ParseMooncakeJsonl(R"({"timestamp": "x", "input_length": 5, "output_length": 2})", "m.jsonl"),
      "m.jsonl:1", "timestamp");
  ExpectErrorAt(ParseMooncakeJsonl("[1, 2]", "m.jsonl"), "m.jsonl:1", "object");
}

TEST(BurstGptTest, ParsesRowsKeepingZeroOutputs) {
  absl::StatusOr<std::vector<TraceRequest>> rows =
      ReadTrace(std::string(kTestdata) + "burstgpt_small.csv", TraceFormat::kAuto);
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 3u);
  EXPECT_DOUBLE_EQ((*rows)[1].arrival_s, 40);
  EXPECT_DOUBLE_EQ((*rows)[2].arrival_s, 113);
  EXPECT_EQ((*rows)[1].input_tokens, 1087);
  EXPECT_EQ((*rows)[1].output_tokens, 0);  // a failed request in the log; the replay clamps it
  EXPECT_EQ((*rows)[2].output_tokens, 276);
}

TEST(BurstGptTest, MalformedLinesNameFileAndLine) {
  const std::string header =
      "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n";
  ExpectErrorAt(ParseBurstGptCsv(header + "5,ChatGPT,1,2,3\n", "b.csv"), "b.csv:2",
                "expected 6 fields");
  ExpectErrorAt(ParseBurstGptCsv(header + "5,ChatGPT,1,2,3,x\nnow,ChatGPT,1,2,3,x\n", "b.csv"),
                "b.csv:3", "Timestamp");
  ExpectErrorAt(ParseBurstGptCsv(header + "5,ChatGPT,1,two,3,x\n", "b.csv"), "b.csv:2",
                "Response tokens");
}

TEST(TraceFormatTest, NamesAndDetection) {
  EXPECT_EQ(*ParseTraceFormat("mooncake"), TraceFormat::kMooncake);
  EXPECT_FALSE(ParseTraceFormat("sharegpt").ok());
  ExpectErrorAt(ParseTrace("hello\n", "h.txt", TraceFormat::kAuto), "h.txt:1", "format");
  // An explicit format wins over detection.
  ExpectErrorAt(ParseTrace("{\"timestamp\": 0}\n", "j.csv", TraceFormat::kAzure), "j.csv:1",
                "header");
}

// The real traces, when the checkout has them beside it: row counts from their README.
TEST(RealTracesTest, RowCountsAndSpans) {
  const std::string dir = FindTracesDir();
  if (dir.empty()) GTEST_SKIP() << "no shared/traces beside the checkout; set KVRM_TRACES_DIR";
  auto azure =
      ReadTrace(dir + "/azure-conv-2023/AzureLLMInferenceTrace_conv.csv", TraceFormat::kAuto);
  ASSERT_TRUE(azure.ok()) << azure.status();
  EXPECT_EQ(azure->size(), 19366u);
  EXPECT_NEAR(azure->back().arrival_s, 3502, 2);
  auto mooncake =
      ReadTrace(dir + "/mooncake-conversation/conversation_trace.jsonl", TraceFormat::kAuto);
  ASSERT_TRUE(mooncake.ok()) << mooncake.status();
  EXPECT_EQ(mooncake->size(), 12031u);
  EXPECT_NEAR(mooncake->back().arrival_s, 3537, 5);
  EXPECT_FALSE(mooncake->front().hash_ids.empty());
}

}  // namespace
}  // namespace kvrm::replay
