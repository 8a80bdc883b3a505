#include "runtime/structured/regex_parser.h"

#include <string>

#include "gtest/gtest.h"
#include "runtime/structured/automaton.h"

namespace kvrm::structured {
namespace {

bool Matches(std::string_view pattern, std::string_view text) {
  auto regex = ParseRegex(pattern);
  EXPECT_TRUE(regex.ok()) << pattern << ": " << regex.status();
  if (!regex.ok()) return false;
  auto dfa = Dfa::Compile(*regex);
  EXPECT_TRUE(dfa.ok()) << pattern << ": " << dfa.status();
  return dfa.ok() && dfa->Matches(text);
}

// The message of a refused pattern ("" when it parses).
std::string Refusal(std::string_view pattern) {
  auto regex = ParseRegex(pattern);
  if (regex.ok()) return "";
  EXPECT_EQ(regex.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(regex.status().message());
}

TEST(RegexParserTest, EscapesClassesAndQuantifiers) {
  EXPECT_TRUE(Matches("\\d{3}-\\d{4}", "555-1234"));
  EXPECT_FALSE(Matches("\\d{3}-\\d{4}", "555-123"));
  EXPECT_TRUE(Matches("\\w+\\s\\W", "snake_case1 !"));
  EXPECT_FALSE(Matches("\\w+", "tab\there"));
  EXPECT_TRUE(Matches("[\\d\\-a-f]+", "0-9af"));
  EXPECT_TRUE(Matches("[]a]+", "]a]"));          // "]" first in a class is a literal
  EXPECT_TRUE(Matches("[a-]+", "a-a"));          // "-" last is a literal
  EXPECT_TRUE(Matches("[[:alpha:][:digit:]]+", "abc123"));
  EXPECT_FALSE(Matches("[[:alpha:]]+", "abc_"));
  EXPECT_TRUE(Matches("\\x41\\x{1F600}\\u00e9\\u{48}", "A😀éH"));
  EXPECT_TRUE(Matches("a{2,}", "aaaaa"));
  EXPECT_FALSE(Matches("a{2,}", "a"));
  EXPECT_TRUE(Matches("a{,}", "a{,}"));           // not a quantifier: literal braces
  EXPECT_TRUE(Matches("x{", "x{"));
  EXPECT_TRUE(Matches("(a|b)+?c*?", "abba"));     // lazy forms: the same language
  EXPECT_TRUE(Matches("(?P<year>\\d{4})-(?<m>\\d\\d)", "2026-12"));
  EXPECT_TRUE(Matches("^yes|no$", "no"));          // anchors at the ends change nothing
  EXPECT_TRUE(Matches("\\^\\$\\.\\*", "^$.*"));
  EXPECT_TRUE(Matches("a$", "a"));
  EXPECT_TRUE(Matches("a\\$", "a$"));
  EXPECT_TRUE(Matches("[^a]", "\n"));              // negated classes include newline ...
  EXPECT_FALSE(Matches(".", "\n"));                // ... the dot does not
  EXPECT_TRUE(Matches("", ""));
  EXPECT_TRUE(Matches("()", ""));
}

TEST(RegexParserTest, RefusesWhatIsNotRegularOrNotWellFormed) {
  EXPECT_NE(Refusal("(a)\\1").find("backreferences"), std::string::npos);
  EXPECT_NE(Refusal("a(?=b)").find("lookaround"), std::string::npos);
  EXPECT_NE(Refusal("(?<!a)b").find("lookaround"), std::string::npos);
  EXPECT_NE(Refusal("\\bword").find("boundaries"), std::string::npos);
  EXPECT_NE(Refusal("a^b").find("anchors"), std::string::npos);
  EXPECT_NE(Refusal("(?i)abc").find("flags"), std::string::npos);
  EXPECT_NE(Refusal("a*+").find("possessive"), std::string::npos);
  EXPECT_NE(Refusal("a**").find("multiple repeat"), std::string::npos);
  EXPECT_NE(Refusal("*a").find("nothing to repeat"), std::string::npos);
  EXPECT_NE(Refusal("a{1001}").find("1000"), std::string::npos);
  EXPECT_NE(Refusal("a{3,2}").find("below the minimum"), std::string::npos);
  EXPECT_NE(Refusal("a{,3}").find("{0,n}"), std::string::npos) << "Python's and not the others'";
  EXPECT_NE(Refusal("(ab").find("unclosed group"), std::string::npos);
  EXPECT_NE(Refusal("ab)").find("unmatched ')'"), std::string::npos);
  EXPECT_NE(Refusal("[ab").find("unterminated character class"), std::string::npos);
  EXPECT_NE(Refusal("[z-a]").find("out of order"), std::string::npos);
  EXPECT_NE(Refusal("\\q").find("unknown escape"), std::string::npos);
  EXPECT_NE(Refusal("ab\\").find("trailing backslash"), std::string::npos);
  EXPECT_NE(Refusal("\\x{110000}").find("U+10FFFF"), std::string::npos);
  EXPECT_NE(Refusal("\\uD800").find("surrogate"), std::string::npos);
  EXPECT_NE(Refusal("[[:alphabet:]]").find("POSIX"), std::string::npos);
  EXPECT_NE(Refusal("a\xC3").find("UTF-8"), std::string::npos);
  // Offsets are named: the "(" at offset 2.
  EXPECT_NE(Refusal("ab(?=x)").find("offset 2"), std::string::npos) << Refusal("ab(?=x)");
  // Deep nesting is refused, not a stack overflow.
  EXPECT_NE(Refusal(std::string(5000, '(') + std::string(5000, ')')).find("too deep"),
            std::string::npos);
}

}  // namespace
}  // namespace kvrm::structured
