// The LoRA shrink and expand products against float64 sums on random inputs: every row count a
// call takes, ranks that are and are not multiples of the lanes, column ranges with tails; and a
// row's result is the same bits whatever rows share the call.
#include "kernels/cpu/lora.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace kvrm {
namespace {

std::vector<float> Random(std::mt19937* rng, size_t n) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(*rng);
  return v;
}

TEST(LoraKernelsTest, ShrinkAndExpandMatchFloat64) {
  std::mt19937 rng(17);
  for (int32_t rank : {1, 8, 13, 16, 40, 64}) {
    const int32_t stride = (rank + kLoraRankLanes - 1) / kLoraRankLanes * kLoraRankLanes;
    for (const auto& [in, out] : {std::pair<int64_t, int64_t>{64, 48}, {96, 200}, {130, 33}}) {
      for (int32_t n = 1; n <= kLoraRowBlock; ++n) {
        const int64_t ldx = in + 3, ldy = out + 5;  // strides wider than the rows
        const std::vector<float> x = Random(&rng, n * ldx);
        std::vector<float> at = Random(&rng, in * stride);
        for (int64_t c = 0; c < in; ++c) {
          for (int32_t k = rank; k < stride; ++k) at[c * stride + k] = 0;  // the padding
        }
        const std::vector<float> bt = Random(&rng, rank * out);
        const std::vector<float> y0 = Random(&rng, n * ldy);
        std::vector<float> mid(kLoraRowBlock * stride, NAN), y = y0;
        LoraShrink(x.data(), ldx, n, at.data(), in, stride, mid.data());
        // Columns [7, out - 2): a range that starts and ends off the lanes.
        const int64_t begin = 7, end = out - 2;
        LoraExpand(mid.data(), n, rank, stride, bt.data(), out, begin, end, y.data(), ldy);
        for (int32_t i = 0; i < n; ++i) {
          std::vector<double> m(rank);
          for (int32_t k = 0; k < rank; ++k) {
            double sum = 0, mag = 0;
            for (int64_t c = 0; c < in; ++c) {
              sum += double{x[i * ldx + c]} * at[c * stride + k];
              mag += std::fabs(double{x[i * ldx + c]} * at[c * stride + k]);
            }
            m[k] = sum;
            // f32 sums of `in` products: within a few ulps of the magnitude summed.
            EXPECT_NEAR(mid[i * stride + k], sum, 1e-5 * mag + 1e-6)
                << "rank " << rank << " in " << in << " n " << n << " row " << i << " k " << k;
          }
          for (int64_t o = 0; o < out; ++o) {
            const float got = y[i * ldy + o];
            if (o < begin || o >= end) {
              EXPECT_EQ(got, y0[i * ldy + o]) << "column " << o << " outside the range";
              continue;
            }
            double want = y0[i * ldy + o], mag = std::fabs(want);
            for (int32_t k = 0; k < rank; ++k) {
              want += double{mid[i * stride + k]} * bt[k * out + o];
              mag += std::fabs(double{mid[i * stride + k]} * bt[k * out + o]);
            }
            EXPECT_NEAR(got, want, 1e-5 * mag + 1e-6)
                << "rank " << rank << " out " << out << " n " << n << " row " << i << " o " << o;
          }
        }
      }
    }
  }
}

TEST(LoraKernelsTest, ARowsResultDoesNotDependOnTheOtherRows) {
  std::mt19937 rng(5);
  const int64_t in = 200, out = 150;
  const int32_t rank = 24, stride = 32;
  std::vector<float> at = Random(&rng, in * stride);
  for (int64_t c = 0; c < in; ++c) {
    for (int32_t k = rank; k < stride; ++k) at[c * stride + k] = 0;
  }
  const std::vector<float> bt = Random(&rng, rank * out);
  const std::vector<float> x = Random(&rng, kLoraRowBlock * in);
  const std::vector<float> y0 = Random(&rng, kLoraRowBlock * out);
  // Row r of a call of n rows against row r alone.
  for (int32_t n = 2; n <= kLoraRowBlock; ++n) {
    std::vector<float> mid(kLoraRowBlock * stride), y = y0;
    LoraShrink(x.data(), in, n, at.data(), in, stride, mid.data());
    LoraExpand(mid.data(), n, rank, stride, bt.data(), out, 0, out, y.data(), out);
    for (int32_t r = 0; r < n; ++r) {
      std::vector<float> mid1(stride), y1(y0.begin() + r * out, y0.begin() + (r + 1) * out);
      LoraShrink(x.data() + r * in, in, 1, at.data(), in, stride, mid1.data());
      LoraExpand(mid1.data(), 1, rank, stride, bt.data(), out, 0, out, y1.data(), out);
      EXPECT_EQ(std::memcmp(y1.data(), y.data() + r * out, out * sizeof(float)), 0)
          << "row " << r << " of " << n;
    }
  }
}

}  // namespace
}  // namespace kvrm
