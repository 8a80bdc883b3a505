// ThinkingPrefix and HarmonyPrefix (regex_builders.h) against their definitions, on every string
// over an alphabet that spells the markers and their near misses, and through the compiler (a
// byte vocabulary): the thinking (analysis) is free, the answer after </think> (in the final
// message) is held to the constraint.
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

// Whether `g` takes `text` byte by byte (a byte vocabulary: token b is byte b) and accepts it.
bool Walks(const Grammar& g, const std::string& text) {
  int32_t s = g.start();
  for (unsigned char c : text) {
    if (!g.Allows(s, c)) return false;
    s = g.Next(s, c);
  }
  return g.accepting(s);
}

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
  EXPECT_TRUE(Walks(**a, "yes"));
  EXPECT_FALSE(Walks(**a, "hmm</think>yes"));
  EXPECT_TRUE(Walks(**b, "hmm, maybe\n</think>\n\nyes"));
  EXPECT_FALSE(Walks(**b, "yes"));
}

// HarmonyPrefix's language written out: messages on the analysis or commentary channel, each
// closed by its first "<|end|>" and followed by the next header's "<|start|>assistant", then the
// final channel's header and one of `answers`.
bool HarmonyExpected(const std::string& s, const std::vector<std::string>& answers) {
  const std::string final_header = "<|channel|>final<|message|>";
  if (s.compare(0, final_header.size(), final_header) == 0) {
    for (const std::string& a : answers) {
      if (s.substr(final_header.size()) == a) return true;
    }
  }
  for (const std::string channel : {"analysis", "commentary"}) {
    const std::string header = "<|channel|>" + channel + "<|message|>";
    if (s.compare(0, header.size(), header) != 0) continue;
    const size_t end = s.find("<|end|>", header.size());
    if (end == std::string::npos) return false;
    const std::string next = s.substr(end + 7);
    const std::string start = "<|start|>assistant";
    return next.compare(0, start.size(), start) == 0 &&
           HarmonyExpected(next.substr(start.size()), answers);
  }
  return false;
}

TEST(HarmonyPrefixTest, MatchesItsDefinitionOnEveryShortString) {
  const std::vector<std::string> answers = {"yes", "no"};
  const std::vector<std::string> alphabet = {
      "<|channel|>", "analysis", "commentary", "final",
      "<|message|>", "<|end|>",  "<|start|>",  "assistant",
      "<|",          "end",      "|>",         "x",
      "yes",         "no",       "<",          "<|channel|>final<|message|>"};
  const Regex answer = Alt({Literal("yes"), Literal("no")});
  absl::StatusOr<Dfa> dfa = Dfa::Compile(Concat({HarmonyPrefix(), answer}));
  ASSERT_TRUE(dfa.ok()) << dfa.status();
  std::mt19937 rng(5);
  auto any = [&] {
    return alphabet[std::uniform_int_distribution<size_t>(0, alphabet.size() - 1)(rng)];
  };
  int matched = 0;
  for (int trial = 0; trial < 40000; ++trial) {
    // Half near a well-formed reply (messages of random pieces, the final header, an answer),
    // one piece then replaced, inserted or dropped half the time; half random pieces.
    std::vector<std::string> pieces;
    if (trial % 2 == 0) {
      for (int m = std::uniform_int_distribution<int>(0, 2)(rng); m > 0; --m) {
        pieces.push_back("<|channel|>");
        pieces.push_back(rng() % 2 ? "analysis" : "commentary");
        pieces.push_back("<|message|>");
        for (int k = std::uniform_int_distribution<int>(0, 3)(rng); k > 0; --k) {
          pieces.push_back(any());
        }
        pieces.push_back("<|end|>");
        pieces.push_back("<|start|>assistant");
      }
      pieces.push_back("<|channel|>final<|message|>");
      pieces.push_back(answers[rng() % 2]);
      if (rng() % 2) {
        const size_t at = std::uniform_int_distribution<size_t>(0, pieces.size() - 1)(rng);
        const int edit = std::uniform_int_distribution<int>(0, 2)(rng);
        if (edit == 0) pieces[at] = any();
        if (edit == 1) pieces.insert(pieces.begin() + at, any());
        if (edit == 2) pieces.erase(pieces.begin() + at);
      }
    } else {
      for (int i = std::uniform_int_distribution<int>(0, 8)(rng); i > 0; --i)
        pieces.push_back(any());
    }
    std::string s;
    for (const std::string& p : pieces) s += p;
    const bool want = HarmonyExpected(s, answers);
    matched += want;
    ASSERT_EQ(dfa->Matches(s), want) << "\"" << s << "\"";
  }
  EXPECT_GT(matched, 5000);  // the draw reaches both sides
  EXPECT_LT(matched, 30000);
}

TEST(HarmonyPrefixTest, ExamplesAsGptOssWritesThem) {
  const Regex json = *ParseRegex(R"(\{"ok": (true|false)\})");
  absl::StatusOr<Dfa> dfa = Dfa::Compile(Concat({HarmonyPrefix(), json}));
  ASSERT_TRUE(dfa.ok());
  EXPECT_TRUE(dfa->Matches(
      "<|channel|>analysis<|message|>User asks if ok. <|end or <| is fine. Answer true."
      "<|end|><|start|>assistant<|channel|>final<|message|>{\"ok\": true}"));
  EXPECT_TRUE(dfa->Matches("<|channel|>final<|message|>{\"ok\": false}"));  // no analysis
  EXPECT_TRUE(dfa->Matches(
      "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>commentary<|message|>"
      "Checking.<|end|><|start|>assistant<|channel|>final<|message|>{\"ok\": true}"));
  EXPECT_FALSE(dfa->Matches("{\"ok\": true}"));  // the answer needs its header
  EXPECT_FALSE(dfa->Matches("<|channel|>analysis<|message|>{\"ok\": true}"));
  EXPECT_FALSE(dfa->Matches(
      "<|channel|>analysis<|message|>a<|end|>b<|end|><|start|>assistant<|channel|>final"
      "<|message|>{\"ok\": true}"));  // the analysis ends at its first <|end|>
  EXPECT_FALSE(dfa->Matches("<|channel|>final<|message|>{\"ok\": maybe}"));
}

// Through the compiler: kHarmony is a grammar of its own, cached apart.
TEST(HarmonyPrefixTest, CompilerPrependsItAndKeysTheCacheOnIt) {
  std::vector<std::optional<std::string>> vocab;
  for (int b = 0; b < 256; ++b) vocab.push_back(std::string(1, static_cast<char>(b)));
  vocab.push_back("<|channel|>");  // a marker token spelling itself, as gpt-oss's
  ConstraintCompiler compiler(vocab);
  ConstraintSpec spec;
  spec.kind = ConstraintSpec::Kind::kChoice;
  spec.choices = {"yes", "no"};
  spec.thinking = ConstraintSpec::Thinking::kHarmony;
  ConstraintSpec inside = spec;
  inside.thinking = ConstraintSpec::Thinking::kInside;
  absl::StatusOr<std::shared_ptr<const Grammar>> a = compiler.Compile(spec);
  absl::StatusOr<std::shared_ptr<const Grammar>> b = compiler.Compile(inside);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->get(), b->get());
  EXPECT_TRUE(compiler.Contains(spec));
  const Grammar& g = **a;
  EXPECT_TRUE(g.Allows(g.start(), 256));  // the marker token
  int32_t s = g.Next(g.start(), 256);
  for (unsigned char c : std::string("final<|message|>no")) {
    ASSERT_TRUE(g.Allows(s, c)) << c;
    s = g.Next(s, c);
  }
  EXPECT_TRUE(g.accepting(s));
  EXPECT_FALSE(g.Allows(g.start(), 'y'));  // not the answer first
}

// kHarmonyToolCalls: gpt-oss's own call to one of the functions, its arguments held to that
// function's schema; after any analysis and commentary messages with thinking kHarmony, at once
// without.
TEST(HarmonyPrefixTest, ToolCallsHoldTheFunctionAndItsArguments) {
  std::vector<std::optional<std::string>> vocab;
  for (int b = 0; b < 256; ++b) vocab.push_back(std::string(1, static_cast<char>(b)));
  ConstraintCompiler compiler(vocab);
  ConstraintSpec spec;
  spec.kind = ConstraintSpec::Kind::kHarmonyToolCalls;
  spec.choices = {"now", "weather"};
  spec.schemas = {R"({"type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}},
                      "required": ["tz"], "additionalProperties": false})",
                  R"({"type": "object", "properties": {"city": {"type": "string"}},
                      "required": ["city"], "additionalProperties": false})"};
  spec.thinking = ConstraintSpec::Thinking::kHarmony;
  ConstraintSpec at_once = spec;
  at_once.thinking = ConstraintSpec::Thinking::kNone;
  ConstraintSpec other = spec;
  other.schemas[1] = R"({"type": "object"})";
  absl::StatusOr<std::shared_ptr<const Grammar>> a = compiler.Compile(spec);
  absl::StatusOr<std::shared_ptr<const Grammar>> b = compiler.Compile(at_once);
  absl::StatusOr<std::shared_ptr<const Grammar>> c = compiler.Compile(other);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok()) << a.status() << b.status() << c.status();
  EXPECT_NE(a->get(), c->get());  // the schemas are part of the key
  const std::string call = HarmonyCallHeader("now") + R"({"tz":"UTC"})";
  EXPECT_EQ(HarmonyCallHeader("now"),
            "<|channel|>commentary to=functions.now <|constrain|>json<|message|>");
  const std::string analysis =
      "<|channel|>analysis<|message|>Need the time.<|end|><|start|>assistant";
  EXPECT_TRUE(Walks(**a, analysis + call));
  EXPECT_TRUE(Walks(**a, call));
  EXPECT_TRUE(Walks(**a, HarmonyCallHeader("weather") + R"({"city":"Lima"})"));
  EXPECT_FALSE(Walks(**a, HarmonyCallHeader("now") + R"({"tz":"PST"})"));         // its schema
  EXPECT_FALSE(Walks(**a, HarmonyCallHeader("weather") + R"({"tz":"UTC"})"));     // the other's
  EXPECT_FALSE(Walks(**a, HarmonyCallHeader("later") + R"({"tz":"UTC"})"));       // not offered
  EXPECT_FALSE(Walks(**a, analysis + "<|channel|>final<|message|>It is noon."));  // no answer
  EXPECT_TRUE(Walks(**b, call));
  EXPECT_FALSE(Walks(**b, analysis + call));  // at once
}

}  // namespace
}  // namespace kvrm::structured
