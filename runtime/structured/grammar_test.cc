#include "runtime/structured/grammar.h"

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/testing/alloc_counter.h"
#include "gtest/gtest.h"
#include "runtime/structured/regex_parser.h"

namespace kvrm::structured {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Every single byte, then random strings over a small alphabet (some multi-byte UTF-8, some
// duplicates), a hole, an empty token and a "special" one.
std::vector<std::optional<std::string>> RandomVocabulary(std::mt19937& rng, int extra) {
  std::vector<std::optional<std::string>> v;
  for (int b = 0; b < 256; ++b) v.push_back(std::string(1, static_cast<char>(b)));
  const std::vector<std::string> pieces = {"a", "b", "c", "{", "}", "\"", ":", ",", " ",
                                           "1", "0", "é", "true", "ab", "\\"};
  std::uniform_int_distribution<int> len(1, 5);
  std::uniform_int_distribution<size_t> pick(0, pieces.size() - 1);
  for (int k = 0; k < extra; ++k) {
    std::string s;
    for (int j = len(rng); j > 0; --j) s += pieces[pick(rng)];
    v.push_back(s);
  }
  v.push_back(std::nullopt);     // a hole
  v.push_back(std::string());    // adds no text: never allowed
  v.push_back(std::nullopt);     // "special"
  return v;
}

std::shared_ptr<const Grammar> CompileOrDie(std::string_view pattern,
                                            std::shared_ptr<const TokenTrie> trie) {
  auto regex = ParseRegex(pattern);
  EXPECT_TRUE(regex.ok()) << regex.status();
  auto g = Grammar::Compile(*regex, std::move(trie));
  EXPECT_TRUE(g.ok()) << pattern << ": " << g.status();
  return *std::move(g);
}

// Token-level reachability by brute force: a state is finishable when it accepts or some token
// leads from it to a finishable state (least fixpoint); a token is allowed when its bytes keep
// the automaton alive and end in a finishable state.
std::vector<std::vector<bool>> ReferenceAllowed(const Dfa& dfa,
                                                const std::vector<std::optional<std::string>>& v) {
  const int32_t n = dfa.num_states();
  auto walk = [&](int32_t s, const std::string& b) {
    for (char c : b) {
      s = dfa.Next(s, static_cast<uint8_t>(c));
      if (s == Dfa::kDead) return s;
    }
    return s;
  };
  std::vector<bool> finishable(n);
  for (int32_t s = 0; s < n; ++s) finishable[s] = dfa.accepting(s);
  for (bool changed = true; changed;) {
    changed = false;
    for (int32_t s = 0; s < n; ++s) {
      if (finishable[s]) continue;
      for (const auto& b : v) {
        if (!b || b->empty()) continue;
        const int32_t t = walk(s, *b);
        if (t != Dfa::kDead && finishable[t]) {
          finishable[s] = true;
          changed = true;
          break;
        }
      }
    }
  }
  std::vector<std::vector<bool>> allowed(n, std::vector<bool>(v.size()));
  for (int32_t s = 0; s < n; ++s) {
    for (size_t id = 0; id < v.size(); ++id) {
      if (!v[id] || v[id]->empty()) continue;
      const int32_t t = walk(s, *v[id]);
      allowed[s][id] = t != Dfa::kDead && finishable[t];
    }
  }
  return allowed;
}

TEST(GrammarTest, MasksAreExactlyTheTokensThatKeepAMatchFinishable) {
  std::mt19937 rng(11);
  const auto vocab = RandomVocabulary(rng, 400);
  auto trie = std::make_shared<const TokenTrie>(vocab);
  for (std::string_view pattern :
       {"\\{\"a\": (true|[0-9]+)(, \"b\": \"[a-c]*\")?\\}", "(ab|c)*é{2,3}", "[^\"\\\\]{0,6}\"",
        "(a|b)*abb", "true|truth|tr?ue",
        // More states than one batch of the parallel walk (256).
        "\\{\"k\": \"[a-c]{0,300}\"\\}"}) {
    auto regex = ParseRegex(pattern);
    ASSERT_TRUE(regex.ok());
    auto dfa = Dfa::Compile(*regex);
    ASSERT_TRUE(dfa.ok());
    const auto want = ReferenceAllowed(*dfa, vocab);
    const auto g = CompileOrDie(pattern, trie);
    ASSERT_EQ(g->num_states(), dfa->num_states());
    int64_t allowed_total = 0;
    for (int32_t s = 0; s < g->num_states(); ++s) {
      int32_t count = 0;
      for (int32_t id = 0; id < static_cast<int32_t>(vocab.size()); ++id) {
        ASSERT_EQ(g->Allows(s, id), want[s][id])
            << pattern << " state " << s << " token " << id << " \"" << vocab[id].value_or("-")
            << "\"";
        count += want[s][id];
      }
      EXPECT_EQ(g->allowed_count(s), count);
      allowed_total += count;
    }
    EXPECT_GT(allowed_total, g->num_states()) << pattern;  // not trivially empty
    // Walking the states on several threads gives the same grammar, masks numbered alike.
    auto parallel = Grammar::Compile(*regex, trie, GrammarLimits{.threads = 3});
    ASSERT_TRUE(parallel.ok()) << parallel.status();
    ASSERT_EQ((*parallel)->num_distinct_masks(), g->num_distinct_masks());
    for (int32_t s = 0; s < g->num_states(); ++s) {
      ASSERT_EQ((*parallel)->allowed_count(s), g->allowed_count(s));
      for (int32_t id = 0; id < static_cast<int32_t>(vocab.size()); ++id) {
        ASSERT_EQ((*parallel)->Allows(s, id), g->Allows(s, id)) << pattern << " " << s;
      }
    }
  }
}

TEST(GrammarTest, TokensThatWouldStrandTheMatchAreNotAllowed) {
  // The vocabulary cannot write "b" or "d" alone, so after the token "a" nothing could finish
  // "ab|ad": "a" must not be allowed at the start, and "ab" must.
  const std::vector<std::optional<std::string>> vocab = {"a", "ab", "x"};
  auto trie = std::make_shared<const TokenTrie>(vocab);
  const auto g = CompileOrDie("ab|ad", trie);
  EXPECT_FALSE(g->Allows(g->start(), 0));
  EXPECT_TRUE(g->Allows(g->start(), 1));
  EXPECT_FALSE(g->Allows(g->start(), 2));
  const int32_t after = g->Next(g->start(), 1);
  ASSERT_NE(after, Grammar::kDead);
  EXPECT_TRUE(g->terminal(after));
  EXPECT_EQ(g->Next(g->start(), 0), Grammar::kDead);

  // Nothing this vocabulary writes matches "ad".
  auto regex = ParseRegex("ad");
  ASSERT_TRUE(regex.ok());
  auto refused = Grammar::Compile(*regex, trie);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GrammarTest, MaskLogitsKeepsAllowedTokensAndTheEndOnlyWhereTheMatchIsWhole) {
  std::mt19937 rng(3);
  auto vocab = RandomVocabulary(rng, 300);
  const int32_t eos = static_cast<int32_t>(vocab.size()) - 1;  // the "special" one
  auto trie = std::make_shared<const TokenTrie>(vocab);
  const auto g = CompileOrDie("[0-9]+(\\.[0-9]+)?", trie);
  std::uniform_real_distribution<float> logit(-5, 5);
  std::vector<float> logits(vocab.size()), original(vocab.size());
  const std::vector<int32_t> end = {eos};
  int32_t state = g->start();
  for (int step = 0; step < 6; ++step) {
    for (float& x : original) x = logit(rng);
    for (bool allow_end : {true, false}) {
      logits = original;
      g->MaskLogits(state, absl::MakeSpan(logits), end, allow_end);
      for (int32_t id = 0; id < static_cast<int32_t>(vocab.size()); ++id) {
        const bool keep = id == eos ? allow_end && g->accepting(state) : g->Allows(state, id);
        ASSERT_EQ(logits[id], keep ? original[id] : kNegInf) << "step " << step << " id " << id;
      }
    }
    // Go on with the digit token "7", then "." once.
    const int32_t next = step == 2 ? '.' : '7';
    state = g->Next(state, next);
    ASSERT_NE(state, Grammar::kDead);
  }
  EXPECT_TRUE(g->accepting(state));
  EXPECT_FALSE(g->terminal(state));  // more digits may follow
  // Digits allow few tokens; a free string most of them (whole words of the mask are -inf in
  // the first case, single bits in the second): both must mask exactly.
  EXPECT_LE(g->allowed_count(g->start()), g->vocab_size() / 16);
  const auto dense = CompileOrDie("[^\"]{0,30}", trie);
  EXPECT_GT(dense->allowed_count(dense->start()), g->vocab_size() / 16);
  for (int32_t s = 0; s < dense->num_states(); s += 7) {
    for (float& x : original) x = logit(rng);
    logits = original;
    dense->MaskLogits(s, absl::MakeSpan(logits), end, true);
    for (int32_t id = 0; id < static_cast<int32_t>(vocab.size()); ++id) {
      const bool keep = id == eos ? dense->accepting(s) : dense->Allows(s, id);
      ASSERT_EQ(logits[id], keep ? original[id] : kNegInf) << "state " << s << " id " << id;
    }
  }
}

TEST(GrammarTest, MaskLogitsDoesNotAllocate) {
  if (!alloc_counter::kAvailable) GTEST_SKIP() << "allocation counting needs the normal build";
  std::mt19937 rng(5);
  auto trie = std::make_shared<const TokenTrie>(RandomVocabulary(rng, 200));
  const auto g = CompileOrDie("\\{\"[a-c]{1,8}\": [01]\\}", trie);
  std::vector<float> logits(g->vocab_size(), 1.0f);
  const std::vector<int32_t> end = {g->vocab_size() - 1};
  const int64_t before = alloc_counter::AllocationCount();
  int32_t state = g->start();
  for (char c : std::string("{\"ab\": 1}")) {
    g->MaskLogits(state, absl::MakeSpan(logits), end, true);
    state = g->Next(state, static_cast<uint8_t>(c));
  }
  EXPECT_EQ(alloc_counter::AllocationCount(), before);
  EXPECT_TRUE(g->terminal(state));
}

TEST(GrammarTest, RandomTokenWalksSpellMatchesAndEndOnlyWhenWhole) {
  std::mt19937 rng(99);
  const auto vocab = RandomVocabulary(rng, 500);
  auto trie = std::make_shared<const TokenTrie>(vocab);
  const std::string pattern = "\\{(\"[abc]+\": (true|[0-9]{1,3}))(, \"[abc]+\": (true|[0-9]{1,3}))*\\}";
  const auto g = CompileOrDie(pattern, trie);
  auto regex = ParseRegex(pattern);
  auto dfa = Dfa::Compile(*regex);
  ASSERT_TRUE(dfa.ok());
  int ended = 0;
  for (int walk = 0; walk < 300; ++walk) {
    int32_t state = g->start();
    std::string text;
    for (int step = 0; step < 60; ++step) {
      if (g->terminal(state)) break;
      std::vector<int32_t> options;
      for (int32_t id = 0; id < g->vocab_size(); ++id) {
        if (g->Allows(state, id)) options.push_back(id);
      }
      ASSERT_FALSE(options.empty()) << "a non-terminal state must have a way on: " << text;
      const int32_t id = options[std::uniform_int_distribution<size_t>(0, options.size() - 1)(rng)];
      text += *vocab[id];
      state = g->Next(state, id);
      ASSERT_NE(state, Grammar::kDead);
    }
    if (g->accepting(state)) {
      ++ended;
      EXPECT_TRUE(dfa->Matches(text)) << text;
    }
  }
  EXPECT_GT(ended, 30);
}

// Jump-forward drafts: along random walks of a JSON-like pattern, ForcedTokens spells (token by
// token, each allowed where it stands, each the longest allowed prefix) a prefix of the text the
// automaton forces from that state (read byte by byte off the DFA), and stops only where the
// forced text ends or no allowed token spells a prefix of what is left.
TEST(GrammarTest, ForcedTokensSpellThePrefixTheConstraintForces) {
  std::mt19937 rng(123);
  const auto vocab = RandomVocabulary(rng, 500);
  auto trie = std::make_shared<const TokenTrie>(vocab);
  const std::string pattern = "\\{\"abc\": (true|[0-9]{1,3}), \"b\": \"(a|b)c\"\\}";
  const auto g = CompileOrDie(pattern, trie);
  auto regex = ParseRegex(pattern);
  auto dfa = Dfa::Compile(*regex);
  ASSERT_TRUE(dfa.ok());
  const auto forced_text = [&](int32_t s, bool allow_end) {
    std::string f;
    while (s != Dfa::kDead && !(allow_end && dfa->accepting(s))) {
      int live = 0, byte = -1;
      for (int b = 0; b < 256; ++b) {
        if (dfa->Next(s, static_cast<uint8_t>(b)) != Dfa::kDead) ++live, byte = b;
      }
      if (live != 1) break;
      f += static_cast<char>(byte);
      s = dfa->Next(s, static_cast<uint8_t>(byte));
    }
    return f;
  };
  int drafted = 0;
  for (int walk = 0; walk < 100; ++walk) {
    int32_t state = g->start();
    for (int step = 0; step < 40 && !g->terminal(state); ++step) {
      for (bool allow_end : {true, false}) {
        int32_t out[8];
        const int32_t n = g->ForcedTokens(state, allow_end, 8, out);
        drafted += n;
        std::string f = forced_text(state, allow_end);
        int32_t s = state;
        for (int32_t k = 0; k < n; ++k) {
          ASSERT_TRUE(g->Allows(s, out[k])) << walk << " " << step << " token " << k;
          const std::string& t = *vocab[out[k]];
          ASSERT_EQ(f.compare(0, t.size(), t), 0) << "'" << t << "' is not a prefix of '" << f
                                                  << "'";
          // The longest: no allowed token spells a longer prefix of the forced text.
          for (int32_t id = 0; id < g->vocab_size(); ++id) {
            if (!g->Allows(s, id) || !vocab[id] || vocab[id]->size() <= t.size()) continue;
            EXPECT_NE(f.compare(0, vocab[id]->size(), *vocab[id]), 0) << *vocab[id];
          }
          f = f.substr(t.size());
          s = g->Next(s, out[k]);
          f = forced_text(s, allow_end);  // the forced text from the new state
        }
        if (n < 8 && !f.empty()) {
          // Stopped with text still forced: no allowed token spells a prefix of it.
          for (int32_t id = 0; id < g->vocab_size(); ++id) {
            if (g->Allows(s, id) && vocab[id] && !vocab[id]->empty()) {
              EXPECT_NE(f.compare(0, vocab[id]->size(), *vocab[id]), 0) << *vocab[id];
            }
          }
        }
      }
      std::vector<int32_t> options;
      for (int32_t id = 0; id < g->vocab_size(); ++id) {
        if (g->Allows(state, id)) options.push_back(id);
      }
      if (options.empty()) break;
      state = g->Next(state,
                      options[std::uniform_int_distribution<size_t>(0, options.size() - 1)(rng)]);
    }
  }
  EXPECT_GT(drafted, 100);
  // A free choice forces nothing.
  int32_t out[4];
  const auto free = CompileOrDie("[ab]+", trie);
  EXPECT_EQ(free->ForcedTokens(free->start(), true, 4, out), 0);
}

TEST(GrammarTest, EqualMasksAreStoredOnce) {
  std::mt19937 rng(1);
  auto trie = std::make_shared<const TokenTrie>(RandomVocabulary(rng, 100));
  // 40 positions of a free string: all but the last few see the same tokens.
  const auto g = CompileOrDie("[a-c]{40}", trie);
  EXPECT_EQ(g->num_states(), 41);
  EXPECT_LT(g->num_distinct_masks(), 12);
}

TEST(GrammarTest, MaskBuildingPastItsWorkBudgetIsRefused) {
  // Every state of a long free string reaches every token: states x trie nodes of work.
  std::mt19937 rng(2);
  auto trie = std::make_shared<const TokenTrie>(RandomVocabulary(rng, 200));
  auto regex = ParseRegex("[a-c]{300}");
  ASSERT_TRUE(regex.ok());
  GrammarLimits tight;
  tight.max_mask_work = 10000;
  auto refused = Grammar::Compile(*regex, trie, tight);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("too much work"), std::string_view::npos)
      << refused.status();
  EXPECT_TRUE(Grammar::Compile(*regex, trie, GrammarLimits{}).ok());
}

}  // namespace
}  // namespace kvrm::structured
