#include "tools/replay/prompt.h"

#include <algorithm>

#include "gtest/gtest.h"

namespace kvrm::replay {
namespace {

PlannedRequest Request(int index, int input, std::vector<int64_t> hashes = {}, int block = 512) {
  PlannedRequest r;
  r.index = index;
  r.input_tokens = input;
  r.hash_ids = std::move(hashes);
  r.hash_block_tokens = block;
  return r;
}

TEST(PromptTest, ExactLengthsWithinVocabAndNoSpecialIds) {
  // A small vocabulary makes any leak of the special ids very likely to show.
  const std::vector<int32_t> special = {0, 2, 7};
  auto prompts = PromptSynthesizer::Create(8, special, 42);
  ASSERT_TRUE(prompts.ok());
  for (int len : {1, 2, 17, 511, 512, 513, 3000}) {
    for (const auto& hashes : {std::vector<int64_t>{}, std::vector<int64_t>{5, 6}}) {
      const std::vector<int32_t> ids = prompts->Synthesize(Request(len, len, hashes));
      ASSERT_EQ(ids.size(), static_cast<size_t>(len));
      for (int32_t id : ids) {
        ASSERT_GE(id, 0);
        ASSERT_LT(id, 8);
        ASSERT_TRUE(std::find(special.begin(), special.end(), id) == special.end()) << id;
      }
    }
  }
  // All five allowed ids are used (uniform draws, not a constant).
  const std::vector<int32_t> ids = prompts->Synthesize(Request(0, 1000));
  for (int32_t id : {1, 3, 4, 5, 6}) {
    EXPECT_NE(std::find(ids.begin(), ids.end(), id), ids.end()) << id;
  }
  EXPECT_FALSE(PromptSynthesizer::Create(2, std::vector<int32_t>{0, 1}, 1).ok());
}

TEST(PromptTest, EqualLeadingHashIdsGiveIdenticalLeadingBlocks) {
  auto prompts = PromptSynthesizer::Create(1024, std::vector<int32_t>{1, 2}, 3);
  ASSERT_TRUE(prompts.ok());
  constexpr int kBlock = 64;
  const auto a = prompts->Synthesize(Request(0, 200, {10, 11, 12, 13}, kBlock));
  const auto b = prompts->Synthesize(Request(1, 230, {10, 11, 99, 100}, kBlock));
  const auto c = prompts->Synthesize(Request(2, 40, {10}, kBlock));  // a short last block
  ASSERT_EQ(a.size(), 200u);
  ASSERT_EQ(b.size(), 230u);
  ASSERT_EQ(c.size(), 40u);
  // Two shared blocks: the first 128 tokens agree, the third block differs.
  EXPECT_TRUE(std::equal(a.begin(), a.begin() + 2 * kBlock, b.begin()));
  EXPECT_FALSE(std::equal(a.begin() + 2 * kBlock, a.begin() + 3 * kBlock, b.begin() + 2 * kBlock));
  EXPECT_TRUE(std::equal(c.begin(), c.end(), a.begin()));
  // Requests without hash ids do not share prefixes, and the same request is reproducible.
  const auto d = prompts->Synthesize(Request(3, 100));
  const auto e = prompts->Synthesize(Request(4, 100));
  EXPECT_NE(d, e);
  EXPECT_EQ(d, prompts->Synthesize(Request(3, 100)));
  // Another seed, other prompts.
  auto other = PromptSynthesizer::Create(1024, std::vector<int32_t>{1, 2}, 4);
  EXPECT_NE(other->Synthesize(Request(3, 100)), d);
}

// --prefix_len: every request without hash ids starts with the same tokens, then its own.
TEST(PromptTest, SharedPrefixLeadsEveryPromptWithoutHashIds) {
  auto prompts = PromptSynthesizer::Create(1024, std::vector<int32_t>{1, 2}, 3);
  ASSERT_TRUE(prompts.ok());
  std::vector<PlannedRequest> plan = {Request(0, 50), Request(1, 80), Request(2, 70, {5, 6}, 32)};
  PrependSharedPrefix(100, &plan);
  EXPECT_EQ(plan[0].input_tokens, 150);
  EXPECT_EQ(plan[1].input_tokens, 180);
  EXPECT_EQ(plan[2].input_tokens, 70) << "a trace's own hash ids are kept";
  const auto a = prompts->Synthesize(plan[0]);
  const auto b = prompts->Synthesize(plan[1]);
  ASSERT_EQ(a.size(), 150u);
  ASSERT_EQ(b.size(), 180u);
  EXPECT_TRUE(std::equal(a.begin(), a.begin() + 100, b.begin()));
  EXPECT_NE(std::vector<int32_t>(a.begin() + 100, a.begin() + 150),
            std::vector<int32_t>(b.begin() + 100, b.begin() + 150));
  const auto c = prompts->Synthesize(plan[2]);
  EXPECT_FALSE(std::equal(c.begin(), c.begin() + 32, a.begin()));
}

}  // namespace
}  // namespace kvrm::replay
