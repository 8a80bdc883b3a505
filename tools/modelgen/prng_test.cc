#include "tools/modelgen/prng.h"

#include <cmath>
#include <cstdint>

#include "gtest/gtest.h"

namespace kvrm::modelgen {
namespace {

// Golden values pin the exact streams: a change here changes every generated model.
TEST(RngTest, XoshiroMatchesReferenceStream) {
  Rng rng(0);  // xoshiro256** seeded by SplitMix64(0), the reference seeding
  EXPECT_EQ(rng.Next(), 0x99ec5f36cb75f2b4ull);
  EXPECT_EQ(rng.Next(), 0xbf6e1f784956452aull);
  EXPECT_EQ(rng.Next(), 0x1a5f849d4933e6e0ull);
}

TEST(RngTest, NormalStreamIsPinned) {
  Rng rng(42);
  EXPECT_EQ(rng.Normal(), -0.72621913824478568);
  EXPECT_EQ(rng.Normal(), -0.21119691823195985);
  EXPECT_EQ(rng.Normal(), 0.22162270150359337);
}

TEST(RngTest, DeriveSeedDependsOnSeedAndName) {
  EXPECT_EQ(DeriveSeed(7, "model.norm.weight"), 0x5c0c33a226966883ull);
  EXPECT_NE(DeriveSeed(7, "model.norm.weight"), DeriveSeed(8, "model.norm.weight"));
  EXPECT_NE(DeriveSeed(7, "model.norm.weight"), DeriveSeed(7, "model.norm.weighs"));
}

TEST(RngTest, NormalMomentsAreStandard) {
  Rng rng(123);
  constexpr int kN = 200000;
  double sum = 0, sum2 = 0, sum4 = 0;
  for (int i = 0; i < kN; ++i) {
    const double x = rng.Normal();
    sum += x;
    sum2 += x * x;
    sum4 += x * x * x * x;
  }
  const double mean = sum / kN, var = sum2 / kN - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.01);       // 4.5 standard errors
  EXPECT_NEAR(var, 1.0, 0.015);       // standard error ~0.0032
  EXPECT_NEAR(sum4 / kN, 3.0, 0.06);  // kurtosis of a normal
}

TEST(RngTest, UniformAndBelowStayInRange) {
  Rng rng(5);
  int counts[10] = {};
  for (int i = 0; i < 100000; ++i) {
    const double u = rng.Uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    const uint32_t b = rng.Below(10);
    ASSERT_LT(b, 10u);
    ++counts[b];
  }
  for (int c : counts) EXPECT_NEAR(c, 10000, 500);
}

TEST(PortableLogTest, MatchesLibmToAFewUlp) {
  Rng rng(9);
  for (int i = 0; i < 100000; ++i) {
    const double x = std::ldexp(0.5 + 0.5 * rng.Uniform(), -static_cast<int>(rng.Below(60)));
    const double want = std::log(x);
    EXPECT_NEAR(PortableLog(x), want, 4 * std::abs(want) * 0x1.0p-52 + 1e-300) << x;
  }
  EXPECT_EQ(PortableLog(1.0), 0.0);
  EXPECT_NEAR(PortableLog(2.0), std::log(2.0), 1e-16);
}

}  // namespace
}  // namespace kvrm::modelgen
