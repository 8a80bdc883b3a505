#include "runtime/structured/gbnf.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/structured/automaton.h"
#include "runtime/structured/regex_parser.h"

namespace kvrm::structured {
namespace {

// `max_states`: ConstraintCompiler's for grammars (CompilerOptions::grammar_max_dfa_states):
// unfolded recursion determinises into many states that minimising merges again.
Dfa MustCompile(std::string_view grammar, int32_t max_depth = 4, int32_t max_states = 100000) {
  GbnfOptions options;
  options.max_depth = max_depth;
  absl::StatusOr<Regex> regex = GbnfToRegex(grammar, options);
  EXPECT_TRUE(regex.ok()) << grammar << "\n" << regex.status();
  if (!regex.ok()) return *Dfa::Compile(Literal("\x01unreachable"));
  absl::StatusOr<Dfa> dfa = Dfa::Compile(*regex, DfaLimits{.max_states = max_states});
  EXPECT_TRUE(dfa.ok()) << grammar << "\n" << dfa.status();
  return dfa.ok() ? *std::move(dfa) : *Dfa::Compile(Literal("\x01unreachable"));
}

// The message of a refused grammar ("" when it compiles).
std::string Refusal(std::string_view grammar, GbnfOptions options = {}) {
  absl::StatusOr<Regex> regex = GbnfToRegex(grammar, options);
  if (regex.ok()) return "";
  EXPECT_EQ(regex.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(regex.status().message());
}

// Checks that `a` and `b` agree on every string over `alphabet` up to `max_len` bytes; returns
// how many `a` matched.
int64_t ExpectSameLanguage(const Dfa& a, const Dfa& b, const std::string& alphabet, int max_len,
                           const std::string& what) {
  int64_t matched = 0;
  std::vector<int> digits;
  for (int len = 0; len <= max_len; ++len) {
    digits.assign(len, 0);
    for (;;) {
      std::string s;
      for (int d : digits) s.push_back(alphabet[d]);
      EXPECT_EQ(a.Matches(s), b.Matches(s)) << what << " on \"" << s << "\"";
      if (a.Matches(s) != b.Matches(s)) return matched;
      matched += a.Matches(s);
      int i = 0;
      while (i < len && ++digits[i] == static_cast<int>(alphabet.size())) digits[i++] = 0;
      if (i == len) break;
    }
  }
  return matched;
}

TEST(GbnfTest, TerminalsSequencesAndAlternatives) {
  const Dfa d =
      MustCompile(R"(root ::= "yes" | "no" | [0-9]+ "." [0-9]{2} | 'it''s' | [^a-z\n] "x")");
  for (const char* ok : {"yes", "no", "12.50", "0.00", "its", "Qx", "éx", "😀x"}) {
    EXPECT_TRUE(d.Matches(ok)) << ok;
  }
  for (const char* bad : {"", "ye", "yesno", "12.5", ".50", "ax", "\nx", "it's"}) {
    EXPECT_FALSE(d.Matches(bad)) << bad;
  }
}

TEST(GbnfTest, EscapesAndTheDot) {
  const Dfa d =
      MustCompile(R"(root ::= "\"q\" \\ \t\n\r \x41\u00e9\U0001F600 \[\]" [\]\[\x30-\x39] . "\'")");
  EXPECT_TRUE(
      d.Matches("\"q\" \\ \t\n\r Aé😀 []"
                "7"
                "\n"
                "'"));
  EXPECT_TRUE(
      d.Matches("\"q\" \\ \t\n\r Aé😀 []"
                "]"
                "日"
                "'"));
  EXPECT_FALSE(
      d.Matches("\"q\" \\ \t\n\r Aé😀 []"
                "a"
                "x"
                "'"));
  // The dot is any code point, newline included (as llama.cpp's), and one of them only.
  const Dfa dot = MustCompile("root ::= . .");
  EXPECT_TRUE(dot.Matches("\n\n"));
  EXPECT_TRUE(dot.Matches("日本"));
  EXPECT_FALSE(dot.Matches("abc"));
}

TEST(GbnfTest, RepetitionsApplyToTheItemBeforeThem) {
  const Dfa d =
      MustCompile(R"(root ::= "ab"* "c"+ ("d" | "e")? "f"{2} "g"{1,} "h"{0,2} ("i" "j"){1,2})");
  EXPECT_TRUE(d.Matches("cffgij"));
  EXPECT_TRUE(d.Matches("ababcccdffggghhijij"));
  EXPECT_FALSE(d.Matches("aabcffgij"));   // "ab"* repeats the whole literal
  EXPECT_FALSE(d.Matches("cffgijijij"));  // {1,2}
  EXPECT_FALSE(d.Matches("cfgij"));       // {2}
  EXPECT_FALSE(d.Matches("cffghhhij"));   // {0,2}
  EXPECT_FALSE(d.Matches("ffgij"));       // + needs one
  // Spaces before an operator, and an operator on an operator ((x?)*).
  const Dfa spaced = MustCompile(R"(root ::= "x" ? * "y" { 1 , 3 })");
  EXPECT_TRUE(spaced.Matches("xxxyyy"));
  EXPECT_FALSE(spaced.Matches("yyyy"));
}

TEST(GbnfTest, RulesCommentsAndLines) {
  // A rule's body may go on over lines, with comments anywhere; the next "name ::=" ends it.
  const Dfa d = MustCompile(R"(# a list of greetings
root ::= greeting ( "," ws greeting )*   # one or more
greeting ::=
    "hello"
  | "hi"   # short
  | name-1_x
name-1_x ::= [A-Z] [a-z]*
ws ::= " "?
)");
  EXPECT_TRUE(d.Matches("hello"));
  EXPECT_TRUE(d.Matches("hi, hello,Bob, Ann"));
  EXPECT_FALSE(d.Matches("hi,, hello"));
  EXPECT_FALSE(d.Matches("bob"));
  // Rules may come in any order, and rules root does not reach are checked but unused.
  const Dfa order = MustCompile("b ::= \"B\"\nunused ::= \"U\"\nroot ::= a b\na ::= \"A\"");
  EXPECT_TRUE(order.Matches("AB"));
  EXPECT_FALSE(order.Matches("U"));
  // Empty alternatives and an empty literal match the empty text.
  const Dfa empty = MustCompile(R"(root ::= "a" opt "" "b"
opt ::= "x" | )");
  EXPECT_TRUE(empty.Matches("ab"));
  EXPECT_TRUE(empty.Matches("axb"));
}

// Without recursion the grammar means exactly its regex: every string over a small alphabet up to
// length 7 is matched alike.
TEST(GbnfTest, NonRecursiveGrammarsMatchTheirRegexExhaustively) {
  struct Pair {
    const char* grammar;
    const char* regex;
  };
  const Pair pairs[] = {
      {R"(root ::= a b* | c
a ::= "ab" | [c-d]
b ::= ("a" c){1,2}
c ::= [^ab] "b"?)",
       "(ab|[c-d])(a[^ab]b?){0,}|[^ab]b?"},
      {R"(root ::= x{2,3} y? x
x ::= "a" | "bc"
y ::= "d"+)",
       "(a|bc){2,3}d*(a|bc)"},
  };
  const std::string alphabet = "abcd";
  for (const Pair& p : pairs) {
    const Dfa g = MustCompile(p.grammar);
    absl::StatusOr<Regex> re = ParseRegex(p.regex);
    ASSERT_TRUE(re.ok()) << re.status();
    absl::StatusOr<Dfa> r = Dfa::Compile(*re);
    ASSERT_TRUE(r.ok());
    const int64_t matched = ExpectSameLanguage(g, *r, alphabet, 7, p.grammar);
    EXPECT_GT(matched, 10) << p.grammar;  // the comparison saw both outcomes
  }
}

TEST(GbnfTest, RecursionUnfoldsToTheDepthLimit) {
  const char* nested = R"g(root ::= "(" root ")" | "x")g";
  const Dfa d3 = MustCompile(nested, 3);
  EXPECT_TRUE(d3.Matches("x"));
  EXPECT_TRUE(d3.Matches("((x))"));
  EXPECT_FALSE(d3.Matches("(((x)))"));  // root open 4 times
  EXPECT_FALSE(d3.Matches("((x)"));
  const Dfa d5 = MustCompile(nested, 5);
  EXPECT_TRUE(d5.Matches("((((x))))"));
  EXPECT_FALSE(d5.Matches("(((((x)))))"));
  // Left recursion unfolds like any other (llama.cpp refuses it).
  const Dfa left = MustCompile(R"(root ::= root "+" n | n
n ::= [0-9]+)",
                               3);
  EXPECT_TRUE(left.Matches("1+22+3"));
  EXPECT_FALSE(left.Matches("1+2+3+4"));
  EXPECT_FALSE(left.Matches("1+"));
}

// A JSON grammar in the shape of llama.cpp's grammars/json.gbnf: mutually recursive value,
// object and array.
constexpr char kJson[] = R"(
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
)";

TEST(GbnfTest, JsonGrammarHoldsNestedValuesToTheDepthLimit) {
  const Dfa d = MustCompile(kJson, 4);
  for (const char* ok :
       {R"({})", R"({"a": 1})", R"({"a": [1, 2.5e+3, "x\n\u00e9"], "b": {"c": null}})",
        "{\"k\": true,\n  \"l\": [[], {}]}", R"({"d1": {"d2": {"d3": {"d4": []}}}})"}) {
    EXPECT_TRUE(d.Matches(ok)) << ok;
  }
  for (const char* bad :
       {R"([])", R"({"a": })", R"({"a": 01})", R"({"a" 1})", R"({'a': 1})", "{\"a\": \"\x01\"}",
        R"({"a": [1,]})", R"({"d1": {"d2": {"d3": {"d4": {"d5": 1}}}}})"}) {  // object open 5 times
    EXPECT_FALSE(d.Matches(bad)) << bad;
  }
  // Deeper limits take deeper values (with a simpler ws, whose indent does not multiply the
  // states).
  std::string simple = kJson;
  simple = simple.substr(0, simple.find("ws ::=")) + "ws ::= [ \\t\\n]*\n";
  const Dfa d5 = MustCompile(simple, 5, 200000);
  EXPECT_TRUE(d5.Matches("{\"d1\":\n\t{\"d2\": {\"d3\": {\"d4\": {\"d5\": 1}}}}}"));
  EXPECT_FALSE(d5.Matches(R"({"d1": {"d2": {"d3": {"d4": {"d5": {"d6": 1}}}}}})"));
}

// Random grammars over a few rules, built from pieces whose languages are known, cross-checked
// against the same language written as a regex: the recursion-free cases must agree on every
// short string.
TEST(GbnfTest, RandomGrammarsAgreeWithTheirRegexes) {
  std::mt19937 rng(20261206);
  const char* atoms[][2] = {{"\"a\"", "a"},       {"\"bc\"", "bc"}, {"[a-b]", "[a-b]"},
                            {"[^a-c]", "[^a-c]"}, {"\"\"", "()"},   {".", "[\\s\\S]"}};
  const char* ops[][2] = {{"", ""}, {"*", "*"}, {"+", "+"}, {"?", "?"}, {"{1,2}", "{1,2}"}};
  const std::string alphabet = "abcd";
  for (int trial = 0; trial < 40; ++trial) {
    // Rule r1 .. r3 each a sequence of two atoms; root an alternation of sequences of rules.
    std::string grammar = "root ::= ";
    std::string regex;
    std::string rule_regex[4];
    std::string rules;
    for (int r = 1; r <= 3; ++r) {
      std::string body, re;
      for (int i = 0; i < 2; ++i) {
        const auto& a = atoms[rng() % 6];
        const auto& o = ops[rng() % 5];
        body += std::string(a[0]) + o[0] + " ";
        re += "(" + std::string(a[1]) + ")" + o[1];
      }
      rules += "r" + std::to_string(r) + " ::= " + body + "\n";
      rule_regex[r] = "(" + re + ")";
    }
    for (int alt = 0; alt < 2; ++alt) {
      if (alt) {
        grammar += " | ";
        regex += "|";
      }
      for (int i = 0; i < 2; ++i) {
        const int r = 1 + rng() % 3;
        const auto& o = ops[rng() % 5];
        grammar += "r" + std::to_string(r) + o[0] + " ";
        regex += rule_regex[r] + o[1];
      }
    }
    grammar += "\n" + rules;
    const Dfa g = MustCompile(grammar);
    absl::StatusOr<Regex> re = ParseRegex(regex);
    ASSERT_TRUE(re.ok()) << regex << ": " << re.status();
    absl::StatusOr<Dfa> r = Dfa::Compile(*re);
    ASSERT_TRUE(r.ok());
    ExpectSameLanguage(g, *r, alphabet, 5, grammar + "vs " + regex);
  }
}

TEST(GbnfTest, RefusalsNameTheLineAndColumn) {
  EXPECT_EQ(Refusal("root ::= \"a\" b\nc ::= \"x\""),
            "grammar: line 1 column 14: undefined rule b");
  EXPECT_EQ(Refusal("a ::= \"x\""), "grammar: no rule named root");
  EXPECT_EQ(Refusal("root ::= \"a\"\nroot ::= \"b\""),
            "grammar: line 2 column 1: rule root is defined twice (first at line 1 column 1)");
  EXPECT_EQ(Refusal("root ::= \"abc"), "grammar: line 1 column 10: unterminated literal");
  EXPECT_EQ(Refusal("root ::= [a-z"), "grammar: line 1 column 10: unterminated character class");
  EXPECT_EQ(Refusal("root ::= \"\\q\""), "grammar: line 1 column 11: unknown escape \\q");
  EXPECT_EQ(Refusal("root ::= \"\\x4\""), "grammar: line 1 column 11: \\x needs 2 hex digits");
  EXPECT_EQ(Refusal("root ::= \"\\uD800\""),
            "grammar: line 1 column 11: escape \\u is not a Unicode scalar value");
  EXPECT_EQ(Refusal("root ::= [z-a]"),
            "grammar: line 1 column 11: a range whose end is before its start");
  EXPECT_EQ(Refusal("root ::= \"a\"{3,1}"), "grammar: line 1 column 17: repetition {3,1}: 1 < 3");
  EXPECT_EQ(Refusal("root ::= \"a\"{2001}"),
            "grammar: line 1 column 14: repetition count 2001 is above 2000");
  EXPECT_EQ(Refusal("root ::= \"a\"{,3}"),
            "grammar: line 1 column 14: expecting a count after '{', not ','");
  EXPECT_EQ(Refusal("root ::= * \"a\""),
            "grammar: line 1 column 10: '*' with nothing before it to repeat");
  EXPECT_EQ(Refusal("root ::= (\"a\" | \"b\"\n"),
            "grammar: line 2 column 1: expecting ')' to close the group at line 1 column 10, not "
            "the end of the grammar");
  EXPECT_EQ(Refusal("root ::= \"a\" ; \"b\""), "grammar: line 1 column 14: unexpected ';'");
  EXPECT_EQ(Refusal("root = \"a\""),
            "grammar: line 1 column 6: expecting ::= after the rule name root");
  EXPECT_EQ(Refusal("root ::= \"a\"\n  ::= \"b\""), "grammar: line 2 column 3: unexpected ':'");
  EXPECT_EQ(Refusal("root ::= \"\xff\""), "grammar: not valid UTF-8");
  // Recursion with no way out matches nothing once unfolded.
  EXPECT_EQ(Refusal("root ::= \"a\" root"),
            "grammar: root matches no text (a rule that can reach itself unfolds at most 4 levels "
            "deep)");
  EXPECT_EQ(Refusal("root ::= [^\\x00-\\U0010FFFF]"), "grammar: root matches no text");
  // A fan-out past max_nodes is refused rather than built.
  GbnfOptions small;
  small.max_nodes = 200;
  EXPECT_NE(Refusal(kJson, small).find("unfolds into more than 200 nodes"), std::string::npos);
  // A chain of rules deeper than the unfolding's frames (each rule one more).
  std::string chain = "root ::= r1\n";
  for (int i = 1; i < 3000; ++i) chain += "r" + std::to_string(i) + " ::= r" + std::to_string(i + 1) + "\n";
  chain += "r3000 ::= \"end\"\n";
  EXPECT_NE(Refusal(chain).find("rules nest more than 2000 deep"), std::string::npos);
  // Groups nested past the limit.
  EXPECT_NE(Refusal("root ::= " + std::string(300, '(') + "\"a\"" + std::string(300, ')'))
                .find("groups nest deeper than 200"),
            std::string::npos);
}

TEST(GbnfTest, AnotherStartRule) {
  GbnfOptions options;
  options.root = "start";
  absl::StatusOr<Regex> regex = GbnfToRegex("start ::= \"s\" | other\nother ::= \"o\"", options);
  ASSERT_TRUE(regex.ok()) << regex.status();
  absl::StatusOr<Dfa> d = Dfa::Compile(*regex);
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(d->Matches("o"));
}

}  // namespace
}  // namespace kvrm::structured
