#include "common/json.h"

#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace kvrm {
namespace {

TEST(JsonTest, ParsesValidJson) {
  absl::StatusOr<Json> j = ParseJson(R"({"a": [1, 2.5, "x"], "b": {"c": null}})", "t.json");
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ((*j)["a"][2], "x");
}

// Every failure of untrusted JSON is a Status naming the source, never an exception: including
// numbers beyond a double, which nlohmann reports as out_of_range rather than parse_error.
TEST(JsonTest, MalformedInputIsAnErrorNamingTheSource) {
  for (const std::string& text :
       {std::string("{\"a\": 1e999}"), std::string("[-1e400]"), std::string("{\"a\": }"),
        std::string("\x00{}", 3), std::string("{\"a\": \"\\ud800\"}"), std::string("")}) {
    absl::StatusOr<Json> j = ParseJson(text, "model/config.json");
    ASSERT_FALSE(j.ok()) << text;
    EXPECT_EQ(j.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_TRUE(absl::StrContains(j.status().message(), "model/config.json")) << j.status();
  }
}

TEST(JsonTest, NestingDepthIsBoundedBeforeParsing) {
  const std::string deep = std::string(100, '[') + std::string(100, ']');
  absl::StatusOr<Json> j = ParseJson(deep, "deep.json", /*max_depth=*/64);
  ASSERT_FALSE(j.ok());
  EXPECT_TRUE(absl::StrContains(j.status().message(), "nested deeper than 64")) << j.status();
  // Brackets inside strings do not count.
  EXPECT_TRUE(ParseJson("[\"" + std::string(100, '[') + "\"]", "s.json", 4).ok());
}

}  // namespace
}  // namespace kvrm
