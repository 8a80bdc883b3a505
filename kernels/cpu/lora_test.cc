// The LoRA shrink and expand products against float64 sums on random inputs, on every path this
// processor runs and with f32 and bf16 factors: row sets of every size and order (not
// consecutive rows), ranks that are and are not multiples of the lanes, inputs longer than a
// slab, column ranges with tails; a row's result is the same bits whatever rows share the call;
// and bf16 factors give the bits f32 factors of the same values give.
#include "kernels/cpu/lora.h"

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/dtype.h"
#include "gtest/gtest.h"
#include "kernels/cpu/isa.h"

namespace kvrm {
namespace {

std::vector<float> Random(std::mt19937* rng, size_t n) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(*rng);
  return v;
}

int32_t Stride(int32_t rank) {
  return (rank + kLoraRankLanes - 1) / kLoraRankLanes * kLoraRankLanes;
}

// A^T with zeros past the rank, as the runtime lays it out.
std::vector<float> RandomAt(std::mt19937* rng, int64_t in, int32_t rank) {
  const int32_t stride = Stride(rank);
  std::vector<float> at = Random(rng, in * stride);
  for (int64_t c = 0; c < in; ++c) {
    for (int32_t k = rank; k < stride; ++k) at[c * stride + k] = 0;
  }
  return at;
}

// The factors rounded to bf16 (their float values, and their bits).
void RoundToBf16(std::vector<float>* v, std::vector<uint16_t>* bits) {
  bits->resize(v->size());
  for (size_t i = 0; i < v->size(); ++i) {
    (*bits)[i] = FloatToBf16((*v)[i]);
    (*v)[i] = Bf16ToFloat((*bits)[i]);
  }
}

// (ISA, bf16 factors).
class LoraKernelsTest : public testing::TestWithParam<std::tuple<CpuIsa, bool>> {
 protected:
  void SetUp() override { SetActiveCpuIsa(std::get<0>(GetParam())); }
  void TearDown() override { SetActiveCpuIsa(AvailableCpuIsas().back()); }
  bool bf16() const { return std::get<1>(GetParam()); }
  // The products with f32 factors `at`, `bt`, or (bf16()) the same values as bf16.
  void Shrink(const float* x, int64_t ldx, const int32_t* rows, int32_t n,
              const std::vector<float>& at, int64_t in, int32_t stride, float* mid) {
    if (!bf16()) return LoraShrink(x, ldx, rows, n, at.data(), in, stride, mid);
    std::vector<float> rounded = at;
    std::vector<uint16_t> bits;
    RoundToBf16(&rounded, &bits);
    ExpectBf16Values(rounded, at);
    LoraShrink(x, ldx, rows, n, bits.data(), in, stride, mid);
  }
  void Expand(const float* mid, const int32_t* rows, int32_t n, int32_t rank, int32_t stride,
              const std::vector<float>& bt, int64_t out, int64_t begin, int64_t end, float* y,
              int64_t ldy) {
    if (!bf16()) return LoraExpand(mid, rows, n, rank, stride, bt.data(), out, begin, end, y, ldy);
    std::vector<float> rounded = bt;
    std::vector<uint16_t> bits;
    RoundToBf16(&rounded, &bits);
    ExpectBf16Values(rounded, bt);
    LoraExpand(mid, rows, n, rank, stride, bits.data(), out, begin, end, y, ldy);
  }
  // Random factors, already bf16 values when bf16() (so the f64 sums below use what the kernels
  // read).
  std::vector<float> Factors(std::vector<float> v) {
    if (bf16()) {
      std::vector<uint16_t> bits;
      RoundToBf16(&v, &bits);
    }
    return v;
  }
  static void ExpectBf16Values(const std::vector<float>& a, const std::vector<float>& b) {
    ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
        << "factors not bf16 values";
  }
};

TEST_P(LoraKernelsTest, ShrinkAndExpandMatchFloat64) {
  std::mt19937 rng(17);
  constexpr int32_t kRows = 13;  // of x and y; the calls take some of them, in some order
  for (int32_t rank : {1, 8, 13, 16, 40, 64}) {
    const int32_t stride = Stride(rank);
    // 1100 inputs: more than one slab of A^T at every rank.
    for (const auto& [in, out] : {std::pair<int64_t, int64_t>{64, 48}, {1100, 200}, {130, 33}}) {
      for (const std::vector<int32_t>& rows : std::vector<std::vector<int32_t>>{
               {5}, {0, 1}, {12, 3, 7}, {2, 4, 6, 8, 10}, {11, 0, 9, 1, 8, 2, 7, 3, 6}}) {
        const int32_t n = static_cast<int32_t>(rows.size());
        const int64_t ldx = in + 3, ldy = out + 5;  // strides wider than the rows
        const std::vector<float> x = Random(&rng, kRows * ldx);
        const std::vector<float> at = Factors(RandomAt(&rng, in, rank));
        const std::vector<float> bt = Factors(Random(&rng, rank * out));
        const std::vector<float> y0 = Random(&rng, kRows * ldy);
        std::vector<float> mid(n * stride, NAN), y = y0;
        Shrink(x.data(), ldx, rows.data(), n, at, in, stride, mid.data());
        // Columns [7, out - 2): a range that starts and ends off the lanes.
        const int64_t begin = 7, end = out - 2;
        Expand(mid.data(), rows.data(), n, rank, stride, bt, out, begin, end, y.data(), ldy);
        std::vector<bool> called(kRows, false);
        for (int32_t j = 0; j < n; ++j) {
          const int32_t i = rows[j];
          called[i] = true;
          for (int32_t k = 0; k < stride; ++k) {
            double sum = 0, mag = 0;
            for (int64_t c = 0; c < in; ++c) {
              sum += double{x[i * ldx + c]} * at[c * stride + k];
              mag += std::fabs(double{x[i * ldx + c]} * at[c * stride + k]);
            }
            // f32 sums of `in` products: within a few ulps of the magnitude summed.
            EXPECT_NEAR(mid[j * stride + k], sum, 1e-5 * mag + 1e-6)
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
              want += double{mid[j * stride + k]} * bt[k * out + o];
              mag += std::fabs(double{mid[j * stride + k]} * bt[k * out + o]);
            }
            EXPECT_NEAR(got, want, 1e-5 * mag + 1e-6)
                << "rank " << rank << " out " << out << " n " << n << " row " << i << " o " << o;
          }
        }
        for (int32_t i = 0; i < kRows; ++i) {  // rows not in the call are left alone
          if (!called[i]) {
            EXPECT_EQ(std::memcmp(&y[i * ldy], &y0[i * ldy], ldy * sizeof(float)), 0) << i;
          }
        }
      }
    }
  }
}

TEST_P(LoraKernelsTest, ARowsResultDoesNotDependOnTheOtherRows) {
  std::mt19937 rng(5);
  const int64_t in = 900, out = 150;
  const int32_t rank = 24, stride = Stride(rank);
  const std::vector<float> at = Factors(RandomAt(&rng, in, rank));
  const std::vector<float> bt = Factors(Random(&rng, rank * out));
  constexpr int32_t kRows = 9;
  const std::vector<float> x = Random(&rng, kRows * in);
  const std::vector<float> y0 = Random(&rng, kRows * out);
  std::vector<int32_t> all(kRows);
  for (int32_t i = 0; i < kRows; ++i) all[i] = kRows - 1 - i;  // backwards
  for (int32_t n = 2; n <= kRows; ++n) {
    std::vector<float> mid(n * stride), y = y0;
    Shrink(x.data(), in, all.data(), n, at, in, stride, mid.data());
    Expand(mid.data(), all.data(), n, rank, stride, bt, out, 0, out, y.data(), out);
    for (int32_t j = 0; j < n; ++j) {
      const int32_t i = all[j];
      std::vector<float> mid1(stride), y1 = y0;
      Shrink(x.data(), in, &i, 1, at, in, stride, mid1.data());
      Expand(mid1.data(), &i, 1, rank, stride, bt, out, 0, out, y1.data(), out);
      if (bf16() && n == kRows) {  // the f32 kernels on the same values: the same bits
        std::vector<float> mid2(stride), y2 = y0;
        LoraShrink(x.data(), in, &i, 1, at.data(), in, stride, mid2.data());
        LoraExpand(mid2.data(), &i, 1, rank, stride, bt.data(), out, 0, out, y2.data(), out);
        EXPECT_EQ(std::memcmp(&y1[i * out], &y2[i * out], out * sizeof(float)), 0) << i;
      }
      EXPECT_EQ(std::memcmp(&y1[i * out], &y[i * out], out * sizeof(float)), 0)
          << "row " << i << " among " << n;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(IsasAndFactors, LoraKernelsTest,
                         testing::Combine(testing::ValuesIn(AvailableCpuIsas()), testing::Bool()),
                         [](const auto& info) {
                           return std::string(CpuIsaName(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) ? "_bf16" : "_f32");
                         });

}  // namespace
}  // namespace kvrm
