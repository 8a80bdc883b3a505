// ThinkingPrefix (regex_builders.h) against its definition, on every string over an alphabet
// that spells the markers and their near misses, and through the compiler (a byte vocabulary):
// the thinking is free, the answer after </think> is held to the constraint.
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/structured/automaton.h"
#include "runtime/structured/compiler.h"
#include "runtime/structured/regex_builders.h"
#include "runtime/structured/regex_parser.h"

namespace kvrm::structured {
namespace {

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// The language written out: thinking without "</think>", the marker, at most 4 whitespace
// characters, then the answer, which must be one of `answers`; with !inside, also an optional
// opening ("<think>") and the answer alone.
bool Expected(const std::string& s, bool inside, const std::vector<std::string>& answers) {
  auto answer = [&](const std::string& a) {
    for (const std::string& x : answers) {
      if (a == x) return true;
    }
    return false;
  };
  auto block = [&](const std::string& t) {
    // Every split at an occurrence of "</think>" whose text before it has none.
    const size_t end = t.find("</think>");
    if (end == std::string::npos) return false;
    // Whitespace after the marker belongs to the prefix, or (when the answer starts with it) to
    // the answer: try each split.
    for (size_t at = end + 8; at <= end + 12; ++at) {
      if (answer(t.substr(at))) return true;
      if (at >= t.size() || !IsSpace(t[at])) return false;
    }
    return false;
  };
  if (inside) return block(s);
  if (answer(s)) return true;
  return s.compare(0, 7, "<think>") == 0 && block(s.substr(7));
}

TEST(ThinkingPrefixTest, MatchesItsDefinitionOnEveryShortString) {
  const std::vector<std::string> answers = {"yes", "no"};
  const std::vector<std::string> alphabet = {
      "<", "/", "think", ">", "\n", "x", "yes", "no", "</think>", "<think>", "<<", " ", "\n\n\n"};
  for (bool inside : {true, false}) {
    const Regex answer = Alt({Literal("yes"), Literal("no")});
    absl::StatusOr<Dfa> dfa = Dfa::Compile(Concat({ThinkingPrefix(inside), answer}));
    ASSERT_TRUE(dfa.ok()) << dfa.status();
    std::mt19937 rng(inside ? 3 : 4);
    int matched = 0;
    for (int trial = 0; trial < 20000; ++trial) {
      std::string s;
      const int n = std::uniform_int_distribution<int>(0, 6)(rng);
      for (int i = 0; i < n; ++i) {
        s += alphabet[std::uniform_int_distribution<size_t>(0, alphabet.size() - 1)(rng)];
      }
      const bool want = Expected(s, inside, answers);
      matched += want;
      ASSERT_EQ(dfa->Matches(s), want) << "\"" << s << "\" inside " << inside;
    }
    EXPECT_GT(matched, 100);  // the draw reaches both sides
  }
}

TEST(ThinkingPrefixTest, ExamplesAsModelsWriteThem) {
  const Regex json = *ParseRegex(R"(\{"ok": (true|false)\})");
  absl::StatusOr<Dfa> inside = Dfa::Compile(Concat({ThinkingPrefix(true), json}));
  absl::StatusOr<Dfa> may = Dfa::Compile(Concat({ThinkingPrefix(false), json}));
  ASSERT_TRUE(inside.ok() && may.ok());
  // DeepSeek-R1: the prompt opened the block.
  EXPECT_TRUE(inside->Matches("Okay, <b> is a tag.\n</think>\n\n{\"ok\": true}"));
  EXPECT_FALSE(inside->Matches("{\"ok\": true}"));  // the answer cannot skip the thinking
  EXPECT_FALSE(inside->Matches("a</think>b</think>{\"ok\": true}"));
  // Qwen3: the reply may think first, or not at all.
  EXPECT_TRUE(may->Matches("<think>\nhmm\n</think>\n\n{\"ok\": false}"));
  EXPECT_TRUE(may->Matches("{\"ok\": false}"));
  EXPECT_FALSE(may->Matches("<think>\nhmm\n</think>\n\nmaybe"));
  EXPECT_FALSE(may->Matches("hmm {\"ok\": false}"));
}

// Through the compiler: the spec's `thinking` makes its own grammar (cached apart), whose
// token walk lets the thinking through and holds the answer.
TEST(ThinkingPrefixTest, CompilerPrependsItAndKeysTheCacheOnIt) {
  std::vector<std::optional<std::string>> vocab;
  for (int b = 0; b < 256; ++b) vocab.push_back(std::string(1, static_cast<char>(b)));
  ConstraintCompiler compiler(vocab);
  ConstraintSpec plain;
  plain.kind = ConstraintSpec::Kind::kChoice;
  plain.choices = {"yes", "no"};
  ConstraintSpec thinking = plain;
  thinking.thinking = ConstraintSpec::Thinking::kInside;
  absl::StatusOr<std::shared_ptr<const Grammar>> a = compiler.Compile(plain);
  absl::StatusOr<std::shared_ptr<const Grammar>> b = compiler.Compile(thinking);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->get(), b->get());
  EXPECT_TRUE(compiler.Contains(thinking));
  auto walk = [](const Grammar& g, const std::string& text) {
    int32_t s = g.start();
    for (unsigned char c : text) {
      if (!g.Allows(s, c)) return false;
      s = g.Next(s, c);
    }
    return g.accepting(s);
  };
  EXPECT_TRUE(walk(**a, "yes"));
  EXPECT_FALSE(walk(**a, "hmm</think>yes"));
  EXPECT_TRUE(walk(**b, "hmm, maybe\n</think>\n\nyes"));
  EXPECT_FALSE(walk(**b, "yes"));
}

}  // namespace
}  // namespace kvrm::structured
