#include "runtime/ngram_proposer.h"

#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace kvrm {
namespace {

std::vector<int32_t> Propose(std::vector<int32_t> seq, int32_t max_draft, int32_t min_n = 2,
                             int32_t max_n = 4) {
  const int32_t last = seq.back();
  seq.pop_back();
  std::vector<int32_t> draft(max_draft, -1);
  const int32_t n =
      ProposeNgramDraft(seq, last, NgramDraftOptions{min_n, max_n}, max_draft, draft.data());
  draft.resize(n);
  return draft;
}

TEST(NgramProposerTest, ProposesWhatFollowedTheSuffixEarlier) {
  // "5 6" occurred before, followed by 7 8 9.
  EXPECT_EQ(Propose({1, 5, 6, 7, 8, 9, 2, 3, 5, 6}, 3), (std::vector<int32_t>{7, 8, 9}));
}

TEST(NgramProposerTest, NoMatchNoDraft) {
  EXPECT_TRUE(Propose({1, 2, 3, 4, 5, 6}, 4).empty());
  // Only the last token repeats: below min_ngram 2.
  EXPECT_TRUE(Propose({7, 1, 2, 3, 7}, 4).empty());
  // ... which min_ngram 1 takes.
  EXPECT_EQ(Propose({7, 1, 2, 3, 7}, 2, 1, 4), (std::vector<int32_t>{1, 2}));
  EXPECT_TRUE(Propose({5}, 4, 1, 4).empty());
  EXPECT_TRUE(Propose({1, 5, 6, 7, 5, 6}, 0).empty());
}

TEST(NgramProposerTest, LongestSuffixWinsOverAMoreRecentShorterOne) {
  // "2 3 4" matches at the start (followed by 10); "3 4" alone matches later (followed by 20).
  EXPECT_EQ(Propose({2, 3, 4, 10, 11, 3, 4, 20, 21, 2, 3, 4}, 1), (std::vector<int32_t>{10}));
  // With max_ngram 2 both are 2-grams: the most recent wins.
  EXPECT_EQ(Propose({2, 3, 4, 10, 11, 3, 4, 20, 21, 2, 3, 4}, 1, 2, 2), (std::vector<int32_t>{20}));
}

TEST(NgramProposerTest, MostRecentOccurrenceOfTheLongestSuffix) {
  EXPECT_EQ(Propose({8, 9, 1, 8, 9, 2, 8, 9}, 1), (std::vector<int32_t>{2}));
}

TEST(NgramProposerTest, ARepeatingPatternDraftsItsOwnContinuation) {
  // Period 3: a b c a b c a b -> c a b c a.
  EXPECT_EQ(Propose({1, 2, 3, 1, 2, 3, 1, 2}, 5), (std::vector<int32_t>{3, 1, 2, 3, 1}));
  // A token repeated: period 1.
  EXPECT_EQ(Propose({4, 9, 9, 9}, 3), (std::vector<int32_t>{9, 9, 9}));
}

TEST(NgramProposerTest, AgreesWithABruteForceReading) {
  // Random short alphabets repeat often: compare with a direct transcription of the rule.
  std::mt19937 rng(7);
  for (int iter = 0; iter < 3000; ++iter) {
    const int len = 1 + rng() % 40;
    const int alphabet = 2 + rng() % 4;
    std::vector<int32_t> seq(len);
    for (int32_t& t : seq) t = rng() % alphabet;
    const int32_t min_n = 1 + rng() % 3, max_n = min_n + rng() % 3, k = rng() % 6;
    // Expected: longest n in [min_n, max_n] with an earlier occurrence; most recent one.
    std::vector<int32_t> want;
    for (int32_t n = std::min<int32_t>(max_n, len - 1); n >= min_n && want.empty() && k > 0; --n) {
      for (int e = len - 2; e >= n - 1; --e) {
        bool match = true;
        for (int j = 0; j < n && match; ++j) match = seq[e - j] == seq[len - 1 - j];
        if (!match) continue;
        std::vector<int32_t> ext = seq;  // the loop: ext[i] = ext[i - period] past the end
        const int period = len - 1 - e;
        for (int i = 0; i < k; ++i) ext.push_back(ext[ext.size() - period]);
        want.assign(ext.begin() + len, ext.end());
        break;
      }
    }
    EXPECT_EQ(Propose(seq, k, min_n, max_n), want) << "iteration " << iter;
  }
}

}  // namespace
}  // namespace kvrm
