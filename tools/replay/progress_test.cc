#include "tools/replay/progress.h"

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace kvrm::replay {
namespace {

TEST(ProgressTest, BarAndLine) {
  ProgressState s{100, 60, 50, 10, 2, 1234, 3.25};
  EXPECT_EQ(FormatProgress(s, true),
            "[###############...............] 50/100 done, 60 sent, 10 in flight, 2 errors, "
            "1234 tokens, 3.2 s");
  EXPECT_FALSE(absl::StrContains(FormatProgress(s, false), "["));
}

}  // namespace
}  // namespace kvrm::replay
