#include "tools/cli/arg_parser.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

ABSL_FLAG(std::string, t_name, "dflt", "a string");
ABSL_FLAG(int, t_count, 7, "an int");
ABSL_FLAG(bool, t_on, false, "a bool");
ABSL_FLAG(std::optional<uint64_t>, t_seed, std::nullopt, "an optional");
ABSL_FLAG(std::string, t_other, "", "a flag no test command allows");

namespace kvrm::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr absl::string_view kAllowed[] = {"t_name", "t_count", "t_on", "t_seed"};

class ArgParserTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::SetFlag(&FLAGS_t_name, "dflt");
    absl::SetFlag(&FLAGS_t_count, 7);
    absl::SetFlag(&FLAGS_t_on, false);
    absl::SetFlag(&FLAGS_t_seed, std::nullopt);
  }

  static absl::StatusOr<ParsedFlags> Parse(std::vector<std::string> args) {
    return ParseFlags(args, kAllowed);
  }
};

TEST_F(ArgParserTest, AcceptsEveryForm) {
  absl::StatusOr<ParsedFlags> parsed =
      Parse({"--t_name=a b", "-t_count", "12", "--t_on", "--t_seed=99"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_FALSE(parsed->help);
  EXPECT_EQ(absl::GetFlag(FLAGS_t_name), "a b");
  EXPECT_EQ(absl::GetFlag(FLAGS_t_count), 12);
  EXPECT_TRUE(absl::GetFlag(FLAGS_t_on));
  EXPECT_EQ(absl::GetFlag(FLAGS_t_seed), std::optional<uint64_t>(99));
  EXPECT_THAT(parsed->given.at("t_on"), ElementsAre("true"));
}

TEST_F(ArgParserTest, NegatedBoolAndExplicitFalse) {
  ASSERT_TRUE(Parse({"--t_on"}).ok());
  ASSERT_TRUE(Parse({"--not_on"}).ok());
  EXPECT_FALSE(absl::GetFlag(FLAGS_t_on));
  ASSERT_TRUE(Parse({"--t_on=true", "--t_on=false"}).ok());
  EXPECT_FALSE(absl::GetFlag(FLAGS_t_on));
}

TEST_F(ArgParserTest, KeepsEveryValueOfARepeatedFlag) {
  absl::StatusOr<ParsedFlags> parsed = Parse({"--t_name=x,y", "--t_name", "", "--t_name=z"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_THAT(parsed->given.at("t_name"), ElementsAre("x,y", "", "z"));
  EXPECT_EQ(absl::GetFlag(FLAGS_t_name), "z");  // the flag holds the last
}

TEST_F(ArgParserTest, ValueMayStartWithADash) {
  ASSERT_TRUE(Parse({"--t_count", "-3", "--t_name", "--x"}).ok());
  EXPECT_EQ(absl::GetFlag(FLAGS_t_count), -3);
  EXPECT_EQ(absl::GetFlag(FLAGS_t_name), "--x");
}

TEST_F(ArgParserTest, Help) {
  absl::StatusOr<ParsedFlags> parsed = Parse({"--t_count=1", "-h"});
  ASSERT_TRUE(parsed.ok());
  EXPECT_TRUE(parsed->help);
  EXPECT_TRUE(Parse({"--help"})->help);
}

TEST_F(ArgParserTest, RejectsMistakesWithoutTouchingTheFlag) {
  const struct {
    std::vector<std::string> args;
    const char* message;
  } cases[] = {
      {{"--t_count=abc"}, "t_count"},
      {{"--t_count"}, "--t_count needs a value"},
      {{"--nope=1"}, "unknown flag --nope"},
      {{"--t_other=1"}, "--t_other does not apply"},
      {{"--not_other"}, "unknown flag --not_other"},  // not a bool: no negated form
      {{"positional"}, "unexpected argument 'positional'"},
      {{"--", "after"}, "unexpected argument 'after'"},
      {{"--t_on", "false"}, "unexpected argument 'false'"},
      {{"--t_seed=-1"}, "t_seed"},
  };
  for (const auto& c : cases) {
    absl::StatusOr<ParsedFlags> parsed = Parse(c.args);
    ASSERT_FALSE(parsed.ok()) << c.args[0];
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr(c.message));
  }
  EXPECT_EQ(absl::GetFlag(FLAGS_t_count), 7);
  EXPECT_EQ(absl::GetFlag(FLAGS_t_other), "");
}

TEST_F(ArgParserTest, TrailingDoubleDashIsFine) {
  EXPECT_TRUE(Parse({"--t_count=3", "--"}).ok());
  EXPECT_EQ(absl::GetFlag(FLAGS_t_count), 3);
}

TEST(FlagsHelpTest, ListsDefaultsAndHelpAligned) {
  const std::string help = FlagsHelp(kAllowed);
  EXPECT_THAT(help, HasSubstr("  --t_name=dflt  a string\n"));
  EXPECT_THAT(help, HasSubstr("  --t_count=7    an int\n"));
  EXPECT_THAT(help, HasSubstr("  --t_on=false   a bool\n"));
}

}  // namespace
}  // namespace kvrm::cli
