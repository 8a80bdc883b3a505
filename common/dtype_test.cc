// The FP8 conversions against the formats' definitions, computed independently in double: every
// one of the 256 codes of each, and the rounding of floats between them.
#include "common/dtype.h"

#include <cmath>
#include <cstdint>
#include <random>

#include "gtest/gtest.h"

namespace kvrm {
namespace {

// (-1)^s 2^(e - bias) (1 + m / 2^mbits), or 2^(1 - bias) m / 2^mbits for e == 0.
double Reference(int code, int ebits, int mbits) {
  const int bias = (1 << (ebits - 1)) - 1;
  const int s = code >> 7, e = (code >> mbits) & ((1 << ebits) - 1), m = code & ((1 << mbits) - 1);
  const double mag =
      e == 0 ? std::ldexp(m, 1 - bias - mbits) : std::ldexp(1.0 + std::ldexp(m, -mbits), e - bias);
  return s ? -mag : mag;
}

TEST(F8Test, E4M3DecodesEveryCode) {
  for (int c = 0; c < 256; ++c) {
    const float got = F8E4M3ToFloat(static_cast<uint8_t>(c));
    if ((c & 0x7f) == 0x7f) {  // S.1111.111: NaN; "fn" has no infinities
      EXPECT_TRUE(std::isnan(got)) << c;
      continue;
    }
    EXPECT_EQ(static_cast<double>(got), Reference(c, 4, 3)) << c;
  }
  EXPECT_EQ(F8E4M3ToFloat(0x7e), 448.0f);
  EXPECT_EQ(F8E4M3ToFloat(0x38), 1.0f);
  EXPECT_EQ(F8E4M3ToFloat(0x01), 0x1p-9f);
  EXPECT_EQ(F8E4M3ToFloat(0xc0), -2.0f);
  EXPECT_TRUE(std::signbit(F8E4M3ToFloat(0x80)));
}

TEST(F8Test, E5M2DecodesEveryCode) {
  for (int c = 0; c < 256; ++c) {
    const float got = F8E5M2ToFloat(static_cast<uint8_t>(c));
    const int e = (c >> 2) & 31, m = c & 3;
    if (e == 31) {
      EXPECT_TRUE(m == 0 ? std::isinf(got) : std::isnan(got)) << c;
      continue;
    }
    EXPECT_EQ(static_cast<double>(got), Reference(c, 5, 2)) << c;
  }
  EXPECT_EQ(F8E5M2ToFloat(0x7b), 57344.0f);
  EXPECT_EQ(F8E5M2ToFloat(0x3c), 1.0f);
}

// Every finite code round-trips; a float rounds to the nearest code (ties to the even mantissa),
// saturating at 448; NaN stays NaN.
TEST(F8Test, E4M3EncodesToTheNearestCode) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    EXPECT_EQ(FloatToF8E4M3(F8E4M3ToFloat(static_cast<uint8_t>(c))), c) << c;
  }
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> exponent(-12, 9.2);
  for (int i = 0; i < 200000; ++i) {
    const float x = static_cast<float>((i & 1 ? -1 : 1) * std::exp2(exponent(rng)));
    const uint8_t got = FloatToF8E4M3(x);
    const double err = std::abs(Reference(got, 4, 3) - x);
    ASSERT_NE(got & 0x7f, 0x7f) << x;
    ASSERT_EQ(got >> 7, x < 0 ? 1 : 0) << x;
    if (std::abs(x) >= 448) {
      ASSERT_EQ(got & 0x7f, 0x7e) << x;
      continue;
    }
    // No other finite code of the same sign is nearer; an equally near one has an odd mantissa.
    for (int c = (got & 0x80); c < (got & 0x80) + 0x7f; ++c) {
      const double other = std::abs(Reference(c, 4, 3) - x);
      ASSERT_TRUE(other > err || c == got || (other == err && (c & 1) == 1 && (got & 1) == 0))
          << x << " -> " << int{got} << ", but " << c << " is as near";
    }
  }
  // Ties: 1 + 1/16 lies halfway between 1 (mantissa 0) and 1.125 (mantissa 1).
  EXPECT_EQ(FloatToF8E4M3(1.0625f), 0x38);
  EXPECT_EQ(FloatToF8E4M3(1.1875f), 0x3a);   // between 1.125 (1) and 1.25 (2): up to even
  EXPECT_EQ(FloatToF8E4M3(0x1p-10f), 0x00);  // half the smallest subnormal: to 0 (even)
  EXPECT_EQ(FloatToF8E4M3(3 * 0x1p-10f), 0x02);
  EXPECT_EQ(FloatToF8E4M3(1e6f), 0x7e);
  EXPECT_EQ(FloatToF8E4M3(-INFINITY), 0xfe);
  EXPECT_EQ(FloatToF8E4M3(NAN) & 0x7f, 0x7f);
}

// The same for E5M2 (2 mantissa bits, largest finite 57344): saturating, never infinite, since
// a KV cache element that overflowed would poison every score it entered.
TEST(F8Test, E5M2EncodesToTheNearestCode) {
  for (int c = 0; c < 256; ++c) {
    if (((c >> 2) & 31) == 31) continue;
    EXPECT_EQ(FloatToF8E5M2(F8E5M2ToFloat(static_cast<uint8_t>(c))), c) << c;
  }
  std::mt19937 rng(12);
  std::uniform_real_distribution<double> exponent(-19, 16.2);
  for (int i = 0; i < 200000; ++i) {
    const float x = static_cast<float>((i & 1 ? -1 : 1) * std::exp2(exponent(rng)));
    const uint8_t got = FloatToF8E5M2(x);
    const double err = std::abs(Reference(got, 5, 2) - x);
    ASSERT_LT((got >> 2) & 31, 31) << x;
    ASSERT_EQ(got >> 7, x < 0 ? 1 : 0) << x;
    if (std::abs(x) >= 57344) {
      ASSERT_EQ(got & 0x7f, 0x7b) << x;
      continue;
    }
    for (int c = (got & 0x80); c < (got & 0x80) + 0x7c; ++c) {
      const double other = std::abs(Reference(c, 5, 2) - x);
      ASSERT_TRUE(other > err || c == got || (other == err && (c & 1) == 1 && (got & 1) == 0))
          << x << " -> " << int{got} << ", but " << c << " is as near";
    }
  }
  EXPECT_EQ(FloatToF8E5M2(1.125f), 0x3c);  // halfway between 1 and 1.25: to 1 (even)
  EXPECT_EQ(FloatToF8E5M2(0x1p-17f), 0x00);
  EXPECT_EQ(FloatToF8E5M2(1e9f), 0x7b);
  EXPECT_EQ(FloatToF8E5M2(-INFINITY), 0xfb);
  EXPECT_TRUE(std::isnan(F8E5M2ToFloat(FloatToF8E5M2(NAN))));
}

// Between every two neighbouring finite codes of either format: the midpoint goes to the code
// with the even mantissa, a float one ulp either side to the nearer code (the encoders are
// branch-free selects; this pins each select's edge).
TEST(F8Test, MidpointsRoundToEvenAndNeighboursToTheNearer) {
  struct Format {
    float (*decode)(uint8_t);
    uint8_t (*encode)(float);
    int last;  // largest finite positive code
  };
  for (const Format& f :
       {Format{F8E4M3ToFloat, FloatToF8E4M3, 0x7e}, Format{F8E5M2ToFloat, FloatToF8E5M2, 0x7b}}) {
    for (int sign : {0, 0x80}) {
      for (int c = 0; c < f.last; ++c) {
        const uint8_t lo = static_cast<uint8_t>(sign | c),
                      hi = static_cast<uint8_t>(sign | (c + 1));
        const float a = f.decode(lo), b = f.decode(hi);
        const float mid = (a + b) / 2;  // exact: the codes have few bits
        ASSERT_EQ(static_cast<double>(mid), (static_cast<double>(a) + b) / 2);
        EXPECT_EQ(f.encode(mid), (c & 1) ? hi : lo) << "midpoint of " << int{lo};
        EXPECT_EQ(f.encode(std::nextafter(mid, a)), lo) << int{lo};
        EXPECT_EQ(f.encode(std::nextafter(mid, b)), hi) << int{lo};
      }
    }
  }
}

// What the CPU attention widens: an FP8 byte read as an f16, times the format's unit, is the
// byte's value, for every finite code of both formats.
TEST(F8Test, HalfViewTimesItsUnitIsTheValue) {
  for (int c = 0; c < 256; ++c) {
    const uint8_t b = static_cast<uint8_t>(c);
    if ((c & 0x7f) != 0x7f) {
      EXPECT_EQ(F16ToFloat(Fp8AsHalf(DType::kF8E4M3, b)) * Fp8HalfUnit(DType::kF8E4M3),
                F8E4M3ToFloat(b))
          << c;
    }
    if (((c >> 2) & 31) != 31) {
      EXPECT_EQ(F16ToFloat(Fp8AsHalf(DType::kF8E5M2, b)) * Fp8HalfUnit(DType::kF8E5M2),
                F8E5M2ToFloat(b))
          << c;
    }
  }
  EXPECT_EQ(DTypeSize(DType::kF8E4M3), 1u);
  EXPECT_EQ(DTypeName(DType::kF8E5M2), "fp8_e5m2");
}

}  // namespace
}  // namespace kvrm
