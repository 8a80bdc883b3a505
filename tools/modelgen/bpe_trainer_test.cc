#include "tools/modelgen/bpe_trainer.h"

#include <algorithm>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"
#include "tools/modelgen/pretokenizer.h"
#include "tools/modelgen/synthetic_corpus.h"

namespace kvrm::modelgen {
namespace {

using Merge = std::pair<std::string, std::string>;

std::vector<Merge> MergeStrings(const BpeModel& m) {
  std::vector<Merge> out;
  for (const auto& [a, b] : m.merges) out.emplace_back(m.tokens[a], m.tokens[b]);
  return out;
}

// Structural invariants every trained model must satisfy.
void ExpectValid(const BpeModel& m) {
  ASSERT_EQ(m.tokens.size(), 256 + m.merges.size());
  for (int b = 0; b < 256; ++b) EXPECT_EQ(m.tokens[b], std::string(1, static_cast<char>(b)));
  absl::flat_hash_set<std::string> tokens(m.tokens.begin(), m.tokens.end());
  EXPECT_EQ(tokens.size(), m.tokens.size()) << "duplicate token";
  std::set<std::pair<int32_t, int32_t>> merges(m.merges.begin(), m.merges.end());
  EXPECT_EQ(merges.size(), m.merges.size()) << "duplicate merge";
  for (size_t i = 0; i < m.merges.size(); ++i) {
    const auto [a, b] = m.merges[i];
    const int32_t id = static_cast<int32_t>(256 + i);
    EXPECT_LT(a, id) << "merge " << i << " uses a later token";
    EXPECT_LT(b, id) << "merge " << i << " uses a later token";
    EXPECT_EQ(m.tokens[id], m.tokens[a] + m.tokens[b]);
  }
}

// The Hugging Face course example, worked by hand:
//   pairs: ug 10+5+5=20, pu 5+12=17, un 12+4=16, hu 10+5=15, gs 5, bu 4
//   1. (u,g) 20 -> h ug | p ug | p u n | b u n | h ug s; now un 16, h-ug 15, pu 12
//   2. (u,n) 16 -> p un | b un; now h-ug 15, p-un 12, p-ug 5, ug-s 5, b-un 4
//   3. (h,ug) 15 -> hug | hug s; now p-un 12
//   4. (p,un) 12
TEST(BpeTrainerTest, FirstMergesMatchHandComputation) {
  const WordCounts words = {{"hug", 10}, {"pug", 5}, {"pun", 12}, {"bun", 4}, {"hugs", 5}};
  auto m = TrainBpe(words, {.num_merges = 4, .min_frequency = 2});
  ASSERT_TRUE(m.ok()) << m.status();
  ExpectValid(*m);
  EXPECT_EQ(MergeStrings(*m), (std::vector<Merge>{{"u", "g"}, {"u", "n"}, {"h", "ug"}, {"p", "un"}}));
}

TEST(BpeTrainerTest, TiesGoToTheLexicographicallySmallestPair) {
  // Every pair occurs 3 times; (a,b) < (b,c) < (x,y) byte-wise.
  const WordCounts words = {{"xy", 3}, {"bc", 3}, {"ab", 3}};
  auto m = TrainBpe(words, {.num_merges = 3, .min_frequency = 1});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(MergeStrings(*m), (std::vector<Merge>{{"a", "b"}, {"b", "c"}, {"x", "y"}}));
}

TEST(BpeTrainerTest, OverlappingPairsMergeLeftToRight) {
  // "aaa" -> (a,a) once per word, leaving "aa a": the next pair is (aa,a) with count 2.
  auto m = TrainBpe({{"aaa", 2}}, {.num_merges = 2, .min_frequency = 2});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(MergeStrings(*m), (std::vector<Merge>{{"a", "a"}, {"aa", "a"}}));
}

TEST(BpeTrainerTest, FailsWhenTheCorpusRunsOutOfPairs) {
  auto m = TrainBpe({{"ab", 5}, {"cd", 1}}, {.num_merges = 2, .min_frequency = 2});
  EXPECT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(TrainBpe({{"ab", 0}}, {.num_merges = 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(BpeTrainerTest, ByteLevelAlphabetIsGpt2s) {
  const auto& a = ByteLevelAlphabet();
  EXPECT_EQ(a['a'], "a");
  EXPECT_EQ(a['!'], "!");
  EXPECT_EQ(a[' '], "Ġ");     // U+0120
  EXPECT_EQ(a['\n'], "Ċ");    // U+010A
  EXPECT_EQ(a[0], "Ā");       // U+0100
  EXPECT_EQ(a[0xAD], "Ń");    // U+0143, the soft hyphen is remapped
  EXPECT_EQ(a[0xE9], "é");    // printable Latin-1 maps to itself
  absl::flat_hash_set<std::string> distinct(a.begin(), a.end());
  EXPECT_EQ(distinct.size(), 256u);
  EXPECT_EQ(ToByteLevel("a b\n"), "aĠbĊ");
}

TEST(PreTokenizerTest, SplitsLikeLlama3) {
  auto pre = PreTokenizer::Create();
  ASSERT_TRUE(pre.ok()) << pre.status();
  std::vector<std::string> pieces;
  (*pre)->Split("Hello, world! It's 12345 dogs.\n\n  x = été日本", [&](std::string_view p) {
    pieces.emplace_back(p);
  });
  EXPECT_EQ(pieces, (std::vector<std::string>{"Hello", ",", " world", "!", " It", "'s", " ",
                                              "123", "45", " dogs", ".\n\n", " ", " x", " =",
                                              " été日本"}));
}

TEST(BpeTrainerTest, SyntheticCorpusTrainingIsDeterministicAndValid) {
  const std::string corpus = BuildSyntheticCorpus(CorpusOptionsForMerges(77, 2000));
  EXPECT_EQ(corpus, BuildSyntheticCorpus(CorpusOptionsForMerges(77, 2000)));
  EXPECT_NE(corpus, BuildSyntheticCorpus(CorpusOptionsForMerges(78, 2000)));
  auto pre = PreTokenizer::Create();
  ASSERT_TRUE(pre.ok());
  WordCounts counts;
  (*pre)->Count(corpus, &counts);
  auto first = TrainBpe(counts, {.num_merges = 2000});
  ASSERT_TRUE(first.ok()) << first.status();
  ExpectValid(*first);
  // Same result from a shuffled (reversed) input: training must not depend on input order.
  std::reverse(counts.begin(), counts.end());
  auto second = TrainBpe(counts, {.num_merges = 2000});
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(first->tokens, second->tokens);
  EXPECT_EQ(first->merges, second->merges);
  // The corpus is varied: merges include multi-byte UTF-8, digits, and space-prefixed words.
  bool utf8 = false, digits = false, spaced = false;
  for (const std::string& t : first->tokens) {
    if (t.size() >= 2 && static_cast<unsigned char>(t[0]) >= 0xC0) utf8 = true;
    if (t.size() >= 2 && std::isdigit(static_cast<unsigned char>(t[0])) &&
        std::isdigit(static_cast<unsigned char>(t[1])))
      digits = true;
    if (t.size() >= 3 && t[0] == ' ') spaced = true;
  }
  EXPECT_TRUE(utf8);
  EXPECT_TRUE(digits);
  EXPECT_TRUE(spaced);
}

}  // namespace
}  // namespace kvrm::modelgen
