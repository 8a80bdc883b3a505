#include "runtime/structured/json_number_ranges.h"

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/structured/automaton.h"
#include "runtime/structured/regex_ast.h"

// The pieces on their own; json_schema_test.cc checks them through schemas (random int64 ranges,
// decimals near bounds).
namespace kvrm::structured {
namespace {

Dfa CompileOrDie(const Regex& regex) {
  absl::StatusOr<Dfa> dfa = Dfa::Compile(regex);
  EXPECT_TRUE(dfa.ok()) << dfa.status();
  return *std::move(dfa);
}

std::string TwoDigits(int v) { return absl::StrCat(v / 10, v % 10); }

TEST(JsonNumberRangesTest, SameLengthNumeralsAreExact) {
  for (int x = 0; x < 100; ++x) {
    for (int y = x; y < 100; y += 7) {
      const Dfa dfa = CompileOrDie(SameLengthNumerals(TwoDigits(x), TwoDigits(y)));
      for (int z = 0; z < 100; ++z) {
        ASSERT_EQ(dfa.Matches(TwoDigits(z)), x <= z && z <= y) << x << ".." << y << " on " << z;
      }
      EXPECT_FALSE(dfa.Matches(std::to_string(x % 10))) << "one digit";
    }
  }
}

TEST(JsonNumberRangesTest, IntegerRangesAreExact) {
  std::vector<std::optional<int64_t>> bounds = {std::nullopt, -100, -10, 0, 9, 10, 99, 100};
  for (int64_t b = -12; b <= 12; b += 3) bounds.push_back(b);
  for (const std::optional<int64_t>& lo : bounds) {
    for (const std::optional<int64_t>& hi : bounds) {
      const Regex regex = IntegerRange(lo, hi);
      if (lo && hi && *lo > *hi) {
        EXPECT_EQ(regex->kind, RegexNode::Kind::kNothing);
        continue;
      }
      const Dfa dfa = CompileOrDie(regex);
      for (int64_t v = -250; v <= 250; ++v) {
        const bool in_range = (!lo || v >= *lo) && (!hi || v <= *hi);
        ASSERT_EQ(dfa.Matches(std::to_string(v)), in_range)
            << (lo ? *lo : -999) << ".." << (hi ? *hi : 999) << " on " << v;
      }
      for (const char* never : {"-0", "00", "01", "+1", "1.0", "1e1", ""}) {
        EXPECT_FALSE(dfa.Matches(never)) << never;
      }
    }
  }
}

TEST(JsonNumberRangesTest, IntegerRangeInt64Limits) {
  const Dfa all = CompileOrDie(
      IntegerRange(std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()));
  EXPECT_TRUE(all.Matches("-9223372036854775808"));
  EXPECT_TRUE(all.Matches("9223372036854775807"));
  EXPECT_FALSE(all.Matches("-9223372036854775809"));
  EXPECT_FALSE(all.Matches("9223372036854775808"));
  const Dfa open = CompileOrDie(IntegerRange(std::nullopt, std::nullopt));
  EXPECT_TRUE(open.Matches("-123456789012345678901234567890"));
  EXPECT_FALSE(open.Matches("-0"));
}

// Decimals in thousandths around small integer bounds: accepted iff in range, never "-0...".
TEST(JsonNumberRangesTest, BoundedNumbersAreExact) {
  const std::vector<std::pair<std::string, int>> fractions = {
      {"", 0}, {".0", 0}, {".00", 0}, {".5", 500}, {".001", 1}, {".999", 999}};
  std::vector<std::optional<NumberBound>> bounds = {std::nullopt};
  for (int64_t v = -3; v <= 3; ++v) {
    bounds.push_back(NumberBound{v, false});
    bounds.push_back(NumberBound{v, true});
  }
  for (const std::optional<NumberBound>& lo : bounds) {
    for (const std::optional<NumberBound>& hi : bounds) {
      const Regex regex = BoundedNumber(lo, hi);
      if (regex->kind == RegexNode::Kind::kNothing) {
        // Only an empty interval: [a, b] with a > b, or a single point with an exclusive end.
        ASSERT_TRUE(lo && hi);
        EXPECT_TRUE(lo->value > hi->value ||
                    (lo->value == hi->value && (lo->exclusive || hi->exclusive)));
        continue;
      }
      const Dfa dfa = CompileOrDie(regex);
      for (int64_t whole = -5; whole <= 5; ++whole) {
        for (const bool negative_zero : {false, true}) {
          if (negative_zero && whole != 0) continue;
          for (const auto& [fraction, thousandths] : fractions) {
            const int64_t magnitude = (whole < 0 ? -whole : whole) * 1000 + thousandths;
            const bool negative = whole < 0 || negative_zero;
            const int64_t value = negative ? -magnitude : magnitude;
            const std::string text =
                (negative ? "-" : "") + std::to_string(whole < 0 ? -whole : whole) + fraction;
            bool expected = !(negative && magnitude == 0);
            if (lo && (lo->exclusive ? value <= lo->value * 1000 : value < lo->value * 1000)) {
              expected = false;
            }
            if (hi && (hi->exclusive ? value >= hi->value * 1000 : value > hi->value * 1000)) {
              expected = false;
            }
            ASSERT_EQ(dfa.Matches(text), expected) << text;
          }
        }
      }
      EXPECT_FALSE(dfa.Matches("1e0"));
    }
  }
}

TEST(JsonNumberRangesTest, JsonNumber) {
  const Dfa dfa = CompileOrDie(JsonNumber());
  for (const char* text : {"0", "-0", "12", "-1.5", "1e9", "2E-3", "0.25e+10"}) {
    EXPECT_TRUE(dfa.Matches(text)) << text;
  }
  for (const char* text : {"", "01", "+1", ".5", "1.", "1e", "--1", "Infinity"}) {
    EXPECT_FALSE(dfa.Matches(text)) << text;
  }
}

}  // namespace
}  // namespace kvrm::structured
