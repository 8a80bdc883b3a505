#include "runtime/structured/automaton.h"

#include <random>
#include <set>
#include <regex>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "model/tokenizer_text.h"
#include "runtime/structured/regex_ast.h"
#include "runtime/structured/regex_parser.h"

namespace kvrm::structured {
namespace {

Dfa CompileOrDie(std::string_view pattern) {
  auto regex = ParseRegex(pattern);
  EXPECT_TRUE(regex.ok()) << pattern << ": " << regex.status();
  auto dfa = Dfa::Compile(*regex);
  EXPECT_TRUE(dfa.ok()) << pattern << ": " << dfa.status();
  return *std::move(dfa);
}

// Every string over `alphabet` up to `max_len` characters.
std::vector<std::string> AllStrings(std::string_view alphabet, int max_len) {
  std::vector<std::string> out = {""};
  size_t begin = 0;
  for (int len = 1; len <= max_len; ++len) {
    const size_t end = out.size();
    for (size_t i = begin; i < end; ++i) {
      for (char c : alphabet) out.push_back(out[i] + c);
    }
    begin = end;
  }
  return out;
}

// A random pattern over {a, b, c} in the syntax std::regex (ECMAScript) and ParseRegex share.
std::string RandomPattern(std::mt19937& rng, int depth) {
  std::uniform_int_distribution<int> pick(0, depth <= 0 ? 5 : 11);
  switch (pick(rng)) {
    case 0: return "a";
    case 1: return "b";
    case 2: return "[ab]";
    case 3: return "[^a]";
    case 4: return ".";
    case 5: return "c";
    case 6: return RandomPattern(rng, depth - 1) + RandomPattern(rng, depth - 1);
    case 7: return "(" + RandomPattern(rng, depth - 1) + "|" + RandomPattern(rng, depth - 1) + ")";
    case 8: return "(" + RandomPattern(rng, depth - 1) + ")*";
    case 9: return "(?:" + RandomPattern(rng, depth - 1) + ")+";
    case 10: return "(" + RandomPattern(rng, depth - 1) + ")?";
    default: {
      std::uniform_int_distribution<int> count(0, 3);
      const int lo = count(rng);
      const int hi = lo + count(rng);
      return "(" + RandomPattern(rng, depth - 1) + "){" + std::to_string(lo) + "," +
             std::to_string(hi) + "}";
    }
  }
}

// The end offsets at which `r` can stop matching text[from, ...): the tree's meaning read
// directly (sets of positions, fixpoints for repeats), independent of the automaton.
std::set<size_t> Ends(const Regex& r, std::string_view text, size_t from) {
  switch (r->kind) {
    case RegexNode::Kind::kNothing:
      return {};
    case RegexNode::Kind::kEmpty:
      return {from};
    case RegexNode::Kind::kLiteral:
      if (text.substr(from, r->text.size()) == r->text) return {from + r->text.size()};
      return {};
    case RegexNode::Kind::kClass: {
      // ASCII texts only in these tests: one byte, one character.
      if (from < text.size() && r->set.Contains(static_cast<unsigned char>(text[from]))) {
        return {from + 1};
      }
      return {};
    }
    case RegexNode::Kind::kConcat: {
      std::set<size_t> at = {from};
      for (const Regex& child : r->children) {
        std::set<size_t> next;
        for (size_t p : at) {
          for (size_t e : Ends(child, text, p)) next.insert(e);
        }
        at = std::move(next);
      }
      return at;
    }
    case RegexNode::Kind::kAlt: {
      std::set<size_t> out;
      for (const Regex& child : r->children) {
        for (size_t e : Ends(child, text, from)) out.insert(e);
      }
      return out;
    }
    case RegexNode::Kind::kRepeat: {
      std::set<size_t> out, at = {from};
      if (r->min == 0) out.insert(from);
      const int32_t limit = r->max < 0 ? static_cast<int32_t>(text.size()) + r->min + 1 : r->max;
      for (int32_t k = 1; k <= limit && !at.empty(); ++k) {
        std::set<size_t> next;
        for (size_t p : at) {
          for (size_t e : Ends(r->children[0], text, p)) next.insert(e);
        }
        at = std::move(next);
        if (k >= r->min) out.insert(at.begin(), at.end());
      }
      return out;
    }
  }
  return {};
}

bool TreeMatches(const Regex& r, std::string_view text) { return Ends(r, text, 0).count(text.size()); }

TEST(DfaTest, AgreesWithTheTreeAndWithStdRegexOnEveryShortString) {
  // 300 random patterns, each checked on all 1093 strings of up to 6 letters from {a, b, c}:
  // the automaton against the tree's own meaning, and the parse against std::regex (which
  // backtracks, so only for the shallower patterns).
  std::mt19937 rng(20261202);
  const std::vector<std::string> strings = AllStrings("abc", 6);
  int nonempty_languages = 0;
  for (int k = 0; k < 300; ++k) {
    const int depth = k % 3 == 0 ? 2 : 4;
    const std::string pattern = RandomPattern(rng, depth);
    auto regex = ParseRegex(pattern);
    ASSERT_TRUE(regex.ok()) << pattern << ": " << regex.status();
    auto dfa = Dfa::Compile(*regex);
    if (!dfa.ok()) {
      // Only an empty language is refused at these sizes.
      for (const std::string& s : strings) ASSERT_FALSE(TreeMatches(*regex, s)) << pattern;
      continue;
    }
    int matched = 0;
    for (const std::string& s : strings) {
      const bool want = TreeMatches(*regex, s);
      ASSERT_EQ(dfa->Matches(s), want) << "pattern " << pattern << " text \"" << s << "\"";
      matched += want;
    }
    if (depth == 2) {
      const std::regex oracle(pattern, std::regex::ECMAScript);
      for (const std::string& s : strings) {
        ASSERT_EQ(dfa->Matches(s), std::regex_match(s, oracle))
            << "pattern " << pattern << " text \"" << s << "\"";
      }
    }
    nonempty_languages += matched > 0 && matched < static_cast<int>(strings.size());
    // The tree printed back parses to the same language.
    auto again = ParseRegex(ToPattern(*regex));
    ASSERT_TRUE(again.ok()) << ToPattern(*regex) << ": " << again.status();
    auto dfa2 = Dfa::Compile(*again);
    ASSERT_TRUE(dfa2.ok());
    for (const std::string& s : strings) {
      ASSERT_EQ(dfa2->Matches(s), dfa->Matches(s)) << ToPattern(*regex) << " on \"" << s << "\"";
    }
  }
  // The generator must exercise more than trivial languages.
  EXPECT_GT(nonempty_languages, 150);
}

TEST(DfaTest, DeadEndsArePrunedSoEveryTransitionCanFinish) {
  // "ab|ac" after "a" may go on with b or c only; "a(b|x[^\s\S])" cannot go on with x at all.
  const Dfa dfa = CompileOrDie("a(b|x[^\\s\\S])");
  const int32_t a = dfa.Next(dfa.start(), 'a');
  ASSERT_NE(a, Dfa::kDead);
  EXPECT_EQ(dfa.Next(a, 'x'), Dfa::kDead);
  const int32_t ab = dfa.Next(a, 'b');
  ASSERT_NE(ab, Dfa::kDead);
  EXPECT_TRUE(dfa.accepting(ab));
  EXPECT_FALSE(dfa.HasNext(ab));
  // From every state some accepting state is reachable.
  for (int32_t s = 0; s < dfa.num_states(); ++s) {
    std::vector<int32_t> stack = {s};
    std::vector<bool> seen(dfa.num_states());
    bool reaches = false;
    while (!stack.empty() && !reaches) {
      const int32_t t = stack.back();
      stack.pop_back();
      if (seen[t]) continue;
      seen[t] = true;
      reaches = dfa.accepting(t);
      for (int b = 0; b < 256; ++b) {
        const int32_t u = dfa.Next(t, static_cast<uint8_t>(b));
        if (u != Dfa::kDead) stack.push_back(u);
      }
    }
    EXPECT_TRUE(reaches) << "state " << s;
  }
}

TEST(DfaTest, EmptyLanguageAndOversizedConstraintsAreRefused) {
  auto nothing = ParseRegex("[^\\s\\S]a");
  ASSERT_TRUE(nothing.ok());
  EXPECT_EQ(Dfa::Compile(*nothing).status().code(), absl::StatusCode::kInvalidArgument);

  auto big = ParseRegex("(a{1000}){1000}");
  ASSERT_TRUE(big.ok());
  auto refused = Dfa::Compile(*big);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("too large"), std::string_view::npos)
      << refused.status();

  // 2^k states for "the k-th letter from the end is a": over the state limit at k = 16.
  auto exponential = ParseRegex("[ab]*a[ab]{15}");
  ASSERT_TRUE(exponential.ok());
  auto states = Dfa::Compile(*exponential, DfaLimits{.max_states = 5000});
  EXPECT_EQ(states.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(states.status().message().find("5000"), std::string_view::npos) << states.status();

  // Few states, each a huge set: 20 bytes of regex, within the state and size limits, took
  // 30 s and 7.6 GB before the work budget. Refused now within the budget, quickly.
  auto sets = ParseRegex("(?:(?:a?){1000}){60}");
  ASSERT_TRUE(sets.ok());
  auto work = Dfa::Compile(*sets, DfaLimits{.max_work = 20000000});
  EXPECT_EQ(work.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(work.status().message().find("too much work"), std::string_view::npos)
      << work.status();
  // A shared budget: what one compile spent counts against the next.
  int64_t spent = 0;
  auto small = ParseRegex("[ab]{1,40}");
  ASSERT_TRUE(small.ok());
  ASSERT_TRUE(Dfa::Compile(*small, DfaLimits{.work = &spent}).ok());
  EXPECT_GT(spent, 0);
  EXPECT_FALSE(Dfa::Compile(*small, DfaLimits{.max_work = spent, .work = &spent}).ok());
}

bool MatchesSequence(const std::vector<ByteRange>& seq, const std::string& bytes) {
  if (seq.size() != bytes.size()) return false;
  for (size_t k = 0; k < seq.size(); ++k) {
    const uint8_t b = static_cast<uint8_t>(bytes[k]);
    if (b < seq[k].lo || b > seq[k].hi) return false;
  }
  return true;
}

TEST(Utf8SequencesTest, MatchExactlyTheEncodingsOfTheRange) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> any(0, kMaxCodePoint);
  std::vector<std::pair<uint32_t, uint32_t>> ranges = {
      {0, kMaxCodePoint}, {0x80, 0x7FF}, {0x7F, 0x80}, {0x7FF, 0x800}, {0xFFFF, 0x10000},
      {0x10000, 0x10FFFF}, {0xE000, 0xFFFF}};
  for (int k = 0; k < 200; ++k) {
    uint32_t lo = any(rng), hi = any(rng);
    if (lo > hi) std::swap(lo, hi);
    if (k % 2 == 0) hi = std::min(kMaxCodePoint, lo + (hi - lo) % 5000);
    ranges.push_back({lo, hi});
  }
  for (auto [lo, hi] : ranges) {
    const auto seqs = Utf8Sequences(lo, hi);
    // Probe the ends, their neighbours and random code points.
    std::vector<uint32_t> probes = {lo, hi, lo == 0 ? 0 : lo - 1, std::min(kMaxCodePoint, hi + 1)};
    for (int j = 0; j < 200; ++j) probes.push_back(any(rng));
    for (int j = 0; j < 50; ++j) probes.push_back(lo + (hi - lo) / 50 * j);
    for (uint32_t c : probes) {
      if (c >= 0xD800 && c <= 0xDFFF) continue;  // not characters
      std::string bytes;
      tok::AppendUtf8(c, &bytes);
      int hits = 0;
      for (const auto& seq : seqs) hits += MatchesSequence(seq, bytes);
      EXPECT_EQ(hits, (c >= lo && c <= hi) ? 1 : 0)
          << "U+" << std::hex << c << " in [" << lo << ", " << hi << "]";
    }
  }
}

TEST(DfaTest, ClassesMatchWholeCharactersOnly) {
  const Dfa dfa = CompileOrDie("[α-ω]+é?.\\x{1F600}");
  EXPECT_TRUE(dfa.Matches("αβγéx😀"));
  EXPECT_TRUE(dfa.Matches("ωω\n\xF0\x9F\x98\x80") == false);  // . is not \n
  EXPECT_TRUE(dfa.Matches("ωωé😀"));  // é taken by the dot
  EXPECT_FALSE(dfa.Matches("a😀"));
  // Half a character is never a match, and a lone continuation byte is dead at once.
  EXPECT_FALSE(dfa.Matches("\xCE"));
  EXPECT_EQ(dfa.Next(dfa.start(), 0xB1), Dfa::kDead);
  // Negated classes take any character but those, including multi-byte ones.
  const Dfa negated = CompileOrDie("[^\"\\\\]*");
  EXPECT_TRUE(negated.Matches("日本語 text\n"));
  EXPECT_FALSE(negated.Matches("a\"b"));
  EXPECT_FALSE(negated.Matches("\xFF"));  // not UTF-8
}

TEST(DfaTest, AutomataAreMinimal) {
  // Textbook minimal sizes (live states only: the dead state is implicit).
  EXPECT_EQ(CompileOrDie("(a|b)*abb").num_states(), 4);
  EXPECT_EQ(CompileOrDie("[ab]*a[ab]{3}").num_states(), 16);
  EXPECT_EQ(CompileOrDie("[a-c]{40}").num_states(), 41);
  // Equal languages, written differently, give automata of the same size.
  EXPECT_EQ(CompileOrDie("ab|ac|ad").num_states(), CompileOrDie("a[b-d]").num_states());
  EXPECT_EQ(CompileOrDie("(x|xy)(z|yz)").num_states(), CompileOrDie("xz|xyz|xyyz").num_states());
  // A character class's UTF-8 paths collapse: one position of any character but \n needs the
  // start, the end and one state per continuation byte still owed (plus the lead bytes whose
  // second byte is narrowed: E0, ED, F0, F4), not a state per byte-range sequence.
  EXPECT_LE(CompileOrDie("[^\\n]").num_states(), 9);
  EXPECT_LE(CompileOrDie("[^\\n]{10}").num_states(), 10 * 8 + 1);
}

}  // namespace
}  // namespace kvrm::structured
