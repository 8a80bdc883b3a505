#include "kernels/cuda/bf16_bits.h"

#include <cstdint>
#include <cstring>
#include <random>

#include "common/dtype.h"
#include "gtest/gtest.h"

namespace kvrm::cuda {
namespace {

float FromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof(f));
  return f;
}

// The rounding the KV-write kernel stores a bf16 pool with is the CPU pool's, bit for bit: every
// sign, exponent and top mantissa bits (all 65536 upper halves) with the lower halves that decide
// the rounding (zero, just below, at and just above the tie, all ones, NaN payloads), then random
// patterns.
TEST(Bf16BitsTest, RoundsAsTheCpuPoolDoes) {
  const uint32_t lows[] = {0x0000, 0x0001, 0x3fff, 0x7ffe, 0x7fff, 0x8000, 0x8001, 0xbfff, 0xffff};
  for (uint32_t hi = 0; hi <= 0xffff; ++hi) {
    for (uint32_t lo : lows) {
      const uint32_t bits = hi << 16 | lo;
      ASSERT_EQ(RoundF32BitsToBf16(bits), FloatToBf16(FromBits(bits))) << std::hex << bits;
    }
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 1000000; ++i) {
    const uint32_t bits = static_cast<uint32_t>(rng());
    ASSERT_EQ(RoundF32BitsToBf16(bits), FloatToBf16(FromBits(bits))) << std::hex << bits;
  }
}

TEST(Bf16BitsTest, TiesGoToEvenAndSpecialValuesSurvive) {
  EXPECT_EQ(RoundF32BitsToBf16(0x3f808000u), 0x3f80);  // tie, even: down
  EXPECT_EQ(RoundF32BitsToBf16(0x3f818000u), 0x3f82);  // tie, odd: up
  EXPECT_EQ(RoundF32BitsToBf16(0xbf818000u), 0xbf82);  // the sign does not matter
  EXPECT_EQ(RoundF32BitsToBf16(0x3f808001u), 0x3f81);  // past the tie: up
  EXPECT_EQ(RoundF32BitsToBf16(0x00018000u), 0x0002);  // subnormals round alike
  EXPECT_EQ(RoundF32BitsToBf16(0x80008000u), 0x8000);  // to -0
  EXPECT_EQ(RoundF32BitsToBf16(0x7f7fffffu), 0x7f80);  // the largest float rounds to inf
  EXPECT_EQ(RoundF32BitsToBf16(0x7f800000u), 0x7f80);  // inf
  EXPECT_EQ(RoundF32BitsToBf16(0xff800000u), 0xff80);  // -inf
  EXPECT_EQ(RoundF32BitsToBf16(0x7f800001u), 0x7fc0);  // a signalling NaN comes back quiet
  EXPECT_EQ(RoundF32BitsToBf16(0xffc12345u), 0xffc1);  // sign and top payload kept
}

}  // namespace
}  // namespace kvrm::cuda
