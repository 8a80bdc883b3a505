// q8_0 weights (kernels/cpu/q8_0.h): the block format against ggml's reference formulas, the
// panel layout, and the q8_0 matmul on every instruction-set path against float64 references on
// random shapes (rows not a multiple of 16, columns not a multiple of 32, several activation
// blocks), bit for bit the same on every path and whatever the batch.
#include "kernels/cpu/q8_0.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_testing.h"
#include "kernels/cpu/thread_pool.h"

namespace kvrm {
namespace {

constexpr int64_t kBlock = WeightMatrix::kQ8Block;
constexpr int64_t kGroup = WeightMatrix::kPanelRows;

std::vector<float> Random(int64_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

float Half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return F16ToFloat(h);
}

TEST(Q8BlockTest, QuantizesAsGgmlsReference) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<float> x = Random(kBlock, rng, trial % 3 == 0 ? 0.01f : 3.0f);
    if (trial % 50 == 0) x[trial % kBlock] = 0.5f * 127 / 127;  // exact halves occur too
    uint8_t block[WeightMatrix::kQ8BlockBytes];
    QuantizeBlockQ8_0(x.data(), block);
    // ggml: d = amax / 127 stored as f16; q = roundf(x * (1 / d)) with the unrounded d.
    double amax = 0;
    for (float v : x) amax = std::max(amax, std::fabs(static_cast<double>(v)));
    const float d = static_cast<float>(amax) / 127;
    EXPECT_EQ(Half(block), static_cast<float>(static_cast<_Float16>(d)));
    const int8_t* q = reinterpret_cast<const int8_t*>(block + 2);
    float y[kBlock];
    DequantizeBlockQ8_0(block, y);
    for (int64_t j = 0; j < kBlock; ++j) {
      ASSERT_EQ(q[j], static_cast<int8_t>(std::roundf(x[j] * (1 / d)))) << trial << "," << j;
      ASSERT_EQ(y[j], q[j] * Half(block));
      // Within half a step (and the f16 rounding of d) of the value.
      ASSERT_NEAR(y[j], x[j], 0.5 * d * (1 + 1.0 / 1024) + 127 * d / 2048) << trial << "," << j;
    }
  }
}

TEST(Q8BlockTest, ZeroAndNonFiniteBlocks) {
  std::vector<float> x(kBlock, 0.0f);
  uint8_t block[WeightMatrix::kQ8BlockBytes];
  float y[kBlock];
  QuantizeBlockQ8_0(x.data(), block);
  DequantizeBlockQ8_0(block, y);
  for (float v : y) EXPECT_EQ(v, 0.0f);
  for (float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    std::mt19937 rng(3);
    x = Random(kBlock, rng);
    x[5] = bad;
    QuantizeBlockQ8_0(x.data(), block);
    DequantizeBlockQ8_0(block, y);
    for (float v : y) EXPECT_TRUE(std::isnan(v));
  }
}

// A scratch sized for a matrix's columns serves every narrower one (callers size one scratch by
// their widest matrix), and holds the block's rows.
TEST(Q8ActivationsTest, ScratchNeverShrinksWithMoreColumns) {
  for (int64_t cols = 1; cols < 20000; cols += cols < 300 ? 1 : 97) {
    ASSERT_LE(Q8ScratchBytes(cols), Q8ScratchBytes(cols + 1)) << cols;
    ASSERT_GE(Q8ScratchBytes(cols),
              Q8ActivationBlockRows(cols) * (Q8PaddedCols(cols) * 4 + 4))
        << cols;  // two copies
  }
}

TEST(Q8ActivationsTest, RoundsToInt16WithTheRowsScale) {
  std::mt19937 rng(11);
  const int64_t n = 5, k = 77, kp = Q8PaddedCols(k);
  std::vector<float> x = Random(n * k, rng, 2.0f);
  for (int64_t c = 0; c < k; ++c) x[1 * k + c] = 0;  // a zero row
  x[3 * k + 10] = std::numeric_limits<float>::quiet_NaN();
  std::vector<int16_t> q(n * kp, 99);
  std::vector<float> scale(n);
  QuantizeActivationsQ8(x.data(), n, k, k, kp, q.data(), scale.data());
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t c = k; c < kp; ++c) ASSERT_EQ(q[i * kp + c], 0);
    if (i == 1) {
      EXPECT_EQ(scale[i], 0.0f);
      continue;
    }
    if (i == 3) {
      EXPECT_TRUE(std::isnan(scale[i]));
      continue;
    }
    float amax = 0;
    for (int64_t c = 0; c < k; ++c) amax = std::max(amax, std::fabs(x[i * k + c]));
    EXPECT_EQ(scale[i], amax / 32767.0f);
    for (int64_t c = 0; c < k; ++c) {
      const double want = static_cast<double>(x[i * k + c]) * 32767 / amax;
      ASSERT_LE(std::fabs(q[i * kp + c] - want), 0.5 + 1e-3) << i << "," << c;
    }
  }
}

// A dense matrix of `dtype` with random values, and its q8_0 blocks as row-major data.
struct Matrix {
  std::vector<float> values;    // rows x cols
  std::vector<uint8_t> blocks;  // rows x Q8Blocks, when cols % 32 == 0
  WeightMatrix dense, q8;
};

Matrix RandomMatrix(int64_t rows, int64_t cols, std::mt19937& rng) {
  Matrix m;
  m.values = Random(rows * cols, rng, 0.05f);
  m.dense = WeightMatrix{DType::kF32, m.values.data(), rows, cols, cols};
  if (cols % kBlock == 0) {
    m.blocks.resize(rows * cols / kBlock * WeightMatrix::kQ8BlockBytes);
    for (int64_t r = 0; r < rows; ++r) {
      QuantizeRowQ8_0(m.values.data() + r * cols, cols,
                      m.blocks.data() + r * cols / kBlock * WeightMatrix::kQ8BlockBytes);
    }
    m.q8 =
        WeightMatrix{DType::kBF16, m.blocks.data(), rows, cols, cols, nullptr, WeightFormat::kQ8_0};
  }
  return m;
}

// The weights a q8_0 panel copy of `w` holds, dequantized: [rows][Q8PaddedCols].
std::vector<double> PanelValues(const WeightMatrix& w, const void* panels) {
  const int64_t blocks = w.Q8Blocks(), kp = blocks * kBlock;
  std::vector<double> out(w.rows * kp);
  const uint8_t* base = static_cast<const uint8_t*>(panels);
  for (int64_t r = 0; r < w.rows; ++r) {
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* block = base + (r / kGroup * blocks + b) * WeightMatrix::kQ8PanelBlockBytes;
      const double d = Half(block + 2 * (r % kGroup));
      const int8_t* lines = reinterpret_cast<const int8_t*>(block + 2 * kGroup);
      for (int64_t c = 0; c < kBlock; ++c) {
        out[r * kp + b * kBlock + c] = d * lines[c / 2 * 2 * kGroup + 2 * (r % kGroup) + c % 2];
      }
    }
  }
  return out;
}

TEST(Q8PanelsTest, HoldTheBlocksWhereTheLayoutSays) {
  std::mt19937 rng(5);
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 32}, {17, 64}, {40, 96}, {16, 320}}) {
    Matrix m = RandomMatrix(rows, cols, rng);
    const PanelCopy from_blocks(m.q8, WeightFormat::kQ8_0);
    const PanelCopy from_dense(m.dense, WeightFormat::kQ8_0);
    ASSERT_EQ(from_blocks.bytes(), BlockPanelBytes(m.q8));
    ASSERT_EQ(from_blocks.bytes(), (rows + 15) / 16 * cols / 32 * 544);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(from_blocks.data()) % 64, 0u);
    // Quantizing the dense rows gives the same panels as packing their blocks.
    ASSERT_EQ(std::memcmp(from_blocks.data(), from_dense.data(), from_blocks.bytes()), 0);
    const std::vector<double> got = PanelValues(m.q8, from_blocks.data());
    std::vector<float> row(cols);
    for (int64_t r = 0; r < rows; ++r) {
      WeightRowToFloat(m.q8, r, row.data());  // q8_0 data dequantized
      for (int64_t c = 0; c < cols; ++c) ASSERT_EQ(got[r * cols + c], row[c]) << r << "," << c;
    }
    // Row slices of the data and of the panels.
    const WeightMatrix slice = m.q8.RowSlice(rows > 16 ? 16 : 0, 1);
    WeightRowToFloat(slice, 0, row.data());
    for (int64_t c = 0; c < cols; ++c) {
      ASSERT_EQ(row[c], got[(rows > 16 ? 16 : 0) * cols + c]);
    }
    EXPECT_EQ(m.q8.bytes(), rows * cols / 32 * 34);
  }
}

TEST(Q8PanelsTest, PadTheLastBlockOfDenseRowsWithZeros) {
  std::mt19937 rng(6);
  Matrix m = RandomMatrix(5, 45, rng);  // 2 blocks, the second 13 columns long
  const PanelCopy panels(m.dense, WeightFormat::kQ8_0);
  const std::vector<double> got = PanelValues(m.dense, panels.data());
  for (int64_t r = 0; r < 5; ++r) {
    for (int64_t c = 45; c < 64; ++c) ASSERT_EQ(got[r * 64 + c], 0.0);
    for (int64_t c = 0; c < 45; ++c) {
      ASSERT_NEAR(got[r * 64 + c], m.values[r * 45 + c], 0.2 / 127 * 1.01);  // half a step
    }
  }
}

class Q8MatMulTest : public ::testing::TestWithParam<CpuIsa> {};

struct Shape {
  int64_t n, rows, cols;
};

TEST_P(Q8MatMulTest, MatchesFloat64Reference) {
  const CpuIsa isa = GetParam();
  std::mt19937 rng(1234 + static_cast<int>(isa));
  ThreadPool pool(2);
  const CpuIsa saved = ActiveCpuIsa();
  SetActiveCpuIsa(isa);
  // 1-8 activation rows per pass and more than one pass (9, 17, 70), partial last panels,
  // columns not a multiple of 32 (dense rows quantized with a padded block), several activation
  // blocks (70 rows of 4099 columns: 16 rows a block).
  for (Shape s : {Shape{1, 1, 32}, Shape{1, 7, 13}, Shape{3, 33, 64}, Shape{5, 130, 257},
                  Shape{16, 67, 768}, Shape{2, 5, 1000}, Shape{8, 16, 96}, Shape{70, 9, 4099},
                  Shape{9, 48, 64}, Shape{17, 50, 77}}) {
    Matrix m = RandomMatrix(s.rows, s.cols, rng);
    const PanelCopy panels(m.dense, WeightFormat::kQ8_0);
    WeightMatrix view = m.dense;
    view.panels = panels.data();
    view.panel_format = WeightFormat::kQ8_0;
    const std::vector<double> w = PanelValues(view, panels.data());
    const int64_t kp = Q8PaddedCols(s.cols);
    std::vector<float> x = Random(s.n * s.cols, rng);
    std::vector<int16_t> xq(s.n * kp);
    std::vector<float> xs(s.n);
    QuantizeActivationsQ8(x.data(), s.n, s.cols, s.cols, kp, xq.data(), xs.data());
    std::vector<float> y(s.n * s.rows, NAN);
    std::vector<float> scratch(pool.num_threads() * MatMulScratchFloats(s.cols));
    MatMul(pool, x.data(), s.n, s.cols, view, y.data(), s.rows, scratch.data());
    for (int64_t i = 0; i < s.n; ++i) {
      for (int64_t r = 0; r < s.rows; ++r) {
        // `exact`: the stored weights times the quantized activations, which the kernel
        // computes with exact int32 block sums and f32 sums of the scaled blocks (error well
        // under 1e-6 of the magnitude). `unquantized`: the stored weights times x itself; the
        // activations' rounding moves each term by at most half a step, amax / 65534.
        double exact = 0, unquantized = 0, mag = 0, wsum = 0;
        for (int64_t c = 0; c < s.cols; ++c) {
          const double wc = w[r * kp + c];
          exact += wc * xq[i * kp + c] * static_cast<double>(xs[i]);
          unquantized += wc * x[i * s.cols + c];
          mag += std::fabs(wc * x[i * s.cols + c]);
          wsum += std::fabs(wc);
        }
        ASSERT_NEAR(y[i * s.rows + r], exact, 1e-6 * mag + 1e-7)
            << CpuIsaName(isa) << " n=" << s.n << " rows=" << s.rows << " cols=" << s.cols << " at "
            << i << "," << r;
        ASSERT_NEAR(y[i * s.rows + r], unquantized, wsum * xs[i] * 0.5001 + 2e-6 * mag + 1e-7);
      }
    }
  }
  SetActiveCpuIsa(saved);
}

// Every path computes the same bits (exact block sums, the same float operations in the same
// order), whatever the batch a row is in; a row holding a NaN gives NaN and leaves the others.
TEST_P(Q8MatMulTest, SameBitsOnEveryPathAndBatch) {
  std::mt19937 rng(99);
  Matrix m = RandomMatrix(45, 320, rng);
  const PanelCopy panels(m.q8, WeightFormat::kQ8_0);
  WeightMatrix view = m.q8;
  view.panels = panels.data();
  view.panel_format = WeightFormat::kQ8_0;
  ExpectSameBitsOnEveryPathAndBatch(GetParam(), view, 40, rng);
}

// `w` (with its panels) times n random activation rows on `isa`: within 2e-6 of float64 over
// `value` ([rows][cols], what w holds) times the quantized activations, the same bits as the
// generic path's, and the same bits for each row alone. Leaves `isa` active.
void ExpectProductOfValues(CpuIsa isa, const WeightMatrix& w, const std::vector<double>& value,
                           int64_t n, std::mt19937& rng) {
  ThreadPool pool(2);
  const int64_t rows = w.rows, cols = w.cols;
  std::vector<float> x = Random(n * cols, rng);
  std::vector<int16_t> xq(n * cols);
  std::vector<float> xs(n);
  QuantizeActivationsQ8(x.data(), n, cols, cols, cols, xq.data(), xs.data());
  std::vector<float> scratch(pool.num_threads() * MatMulScratchFloats(cols));
  SetActiveCpuIsa(CpuIsa::kGeneric);
  std::vector<float> generic(n * rows);
  MatMul(pool, x.data(), n, cols, w, generic.data(), rows, scratch.data());
  SetActiveCpuIsa(isa);
  std::vector<float> y(n * rows, NAN);
  MatMul(pool, x.data(), n, cols, w, y.data(), rows, scratch.data());
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t r = 0; r < rows; ++r) {
      double exact = 0, mag = 0;
      for (int64_t c = 0; c < cols; ++c) {
        const double term = value[r * cols + c] * xq[i * cols + c] * xs[i];
        exact += term;
        mag += std::fabs(term);
      }
      ASSERT_NEAR(y[i * rows + r], exact, 2e-6 * mag + 1e-7)
          << CpuIsaName(isa) << " n=" << n << " rows=" << rows << " at " << i << "," << r;
      ASSERT_EQ(y[i * rows + r], generic[i * rows + r]) << CpuIsaName(isa);
    }
  }
  for (int64_t i0 = 0; i0 < n; ++i0) {  // one row at a time: the same bits
    std::vector<float> one(rows);
    MatMul(pool, x.data() + i0 * cols, 1, cols, w, one.data(), rows, scratch.data());
    for (int64_t r = 0; r < rows; ++r) ASSERT_EQ(one[r], y[i0 * rows + r]) << i0 << "," << r;
  }
}

// q8 affine matrices (what GGUF's q4_1, q5_1, q4_K and q5_K hold: random s, o and q in 0..31, as
// q5's) and q8 halves ones (q6_K's: a signed scale per 16 values, q in -32..31), rows not a
// multiple of 16. Against float64 over the values (s * q + o; s0 * q or s1 * q) times the
// quantized activations; the same bits on every path and whatever the batch.
TEST_P(Q8MatMulTest, AffineAndHalvesMatchFloat64ReferenceWithTheSameBitsEverywhere) {
  const CpuIsa isa = GetParam();
  std::mt19937 rng(4321);
  const CpuIsa saved = ActiveCpuIsa();
  std::normal_distribution<float> sd(0.0f, 0.01f);
  for (const WeightFormat format : {WeightFormat::kQ8Affine, WeightFormat::kQ8Halves}) {
    const bool halves = format == WeightFormat::kQ8Halves;
    std::uniform_int_distribution<int> qd(halves ? -32 : 0, 31);
    for (Shape s : {Shape{1, 7, 32}, Shape{5, 50, 256}, Shape{13, 33, 96}, Shape{30, 20, 64}}) {
      const int64_t blocks = s.cols / kBlock;
      std::vector<uint8_t> data(s.rows * blocks * WeightMatrix::kQ8AffineBlockBytes);
      std::vector<double> value(s.rows * s.cols);
      for (int64_t r = 0; r < s.rows; ++r) {
        for (int64_t b = 0; b < blocks; ++b) {
          uint8_t* block = data.data() + (r * blocks + b) * WeightMatrix::kQ8AffineBlockBytes;
          // affine: s, o; halves: s0, s1 (either sign).
          const float first = halves ? sd(rng) : std::fabs(sd(rng));
          const float second = halves ? sd(rng) : -8 * std::fabs(sd(rng));
          std::memcpy(block, &first, 4);
          std::memcpy(block + 4, &second, 4);
          for (int64_t j = 0; j < kBlock; ++j) {
            const int q = qd(rng);
            block[8 + j] = static_cast<uint8_t>(static_cast<int8_t>(q));
            value[r * s.cols + b * kBlock + j] =
                halves ? static_cast<double>(j < 16 ? first : second) * q
                       : static_cast<double>(first) * q + second;
          }
        }
      }
      WeightMatrix w{DType::kBF16, data.data(), s.rows, s.cols, s.cols, nullptr, format};
      std::vector<float> row(s.cols);
      WeightRowToFloat(w, s.rows - 1, row.data());
      for (int64_t c = 0; c < s.cols; ++c) {
        // One rounding of s * q + o (a fused multiply-add), or of s0 * q / s1 * q.
        ASSERT_EQ(row[c], static_cast<float>(value[(s.rows - 1) * s.cols + c])) << c;
      }
      const PanelCopy panels(w, format);
      ASSERT_EQ(panels.bytes(), (s.rows + 15) / 16 * blocks * 640);
      w.panels = panels.data();
      w.panel_format = format;
      ExpectProductOfValues(isa, w, value, s.n, rng);
    }
  }
  SetActiveCpuIsa(saved);
}

// MXFP4 matrices (gpt-oss's experts: ggml's block_mxfp4, e and 16 bytes of FP4 codes, value
// j < 16 in byte j's low nibble and j + 16 in its high one): every code, scales over a range
// of binades, rows not a multiple of 16. The rows read back exactly; the panels hold the codes
// where weight_matrix.h says; the product against float64 over the values times the quantized
// activations, the same bits on every path and whatever the batch.
TEST_P(Q8MatMulTest, Mxfp4MatchesFloat64ReferenceWithTheSameBitsEverywhere) {
  const CpuIsa isa = GetParam();
  std::mt19937 rng(777);
  const CpuIsa saved = ActiveCpuIsa();
  constexpr float kFp4[16] = {0,     0.5f,  1,  1.5f,  2,  3,  4,  6,
                              -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  std::uniform_int_distribution<int> byte(0, 255), exponent(118, 130);
  for (Shape s : {Shape{1, 7, 32}, Shape{5, 50, 256}, Shape{13, 33, 96}, Shape{30, 20, 64}}) {
    const int64_t blocks = s.cols / kBlock;
    std::vector<uint8_t> data(s.rows * blocks * WeightMatrix::kMxfp4BlockBytes);
    std::vector<double> value(s.rows * s.cols);
    for (int64_t r = 0; r < s.rows; ++r) {
      for (int64_t b = 0; b < blocks; ++b) {
        uint8_t* block = data.data() + (r * blocks + b) * WeightMatrix::kMxfp4BlockBytes;
        block[0] = static_cast<uint8_t>(exponent(rng));
        for (int j = 0; j < 16; ++j) block[1 + j] = static_cast<uint8_t>(byte(rng));
        for (int j = 0; j < 32; ++j) {
          const int code = j < 16 ? block[1 + j] & 15 : block[1 + j - 16] >> 4;
          value[r * s.cols + b * kBlock + j] = std::ldexp(kFp4[code], block[0] - 127);
        }
      }
    }
    WeightMatrix w{DType::kBF16, data.data(),         s.rows, s.cols, s.cols,
                   nullptr,      WeightFormat::kMxfp4};
    std::vector<float> row(s.cols);
    for (int64_t r = 0; r < s.rows; ++r) {
      WeightRowToFloat(w, r, row.data());
      for (int64_t c = 0; c < s.cols; ++c)
        ASSERT_EQ(row[c], value[r * s.cols + c]) << r << "," << c;
    }
    const PanelCopy panels(w, WeightFormat::kMxfp4);
    ASSERT_EQ(panels.bytes(), (s.rows + 15) / 16 * blocks * 272);
    {  // row 3's block 0: its e, and columns 4 and 5 in line 2's byte 3
      const uint8_t* p = static_cast<const uint8_t*>(panels.data());
      const uint8_t* from = data.data() + 3 * blocks * WeightMatrix::kMxfp4BlockBytes;
      EXPECT_EQ(p[3], from[0]);
      EXPECT_EQ(p[16 + 2 * 16 + 3], (from[1 + 4] & 15) | (from[1 + 5] & 15) << 4);
    }
    w.panels = panels.data();
    w.panel_format = WeightFormat::kMxfp4;
    ExpectProductOfValues(isa, w, value, s.n, rng);
  }
  SetActiveCpuIsa(saved);
}

INSTANTIATE_TEST_SUITE_P(AllIsas, Q8MatMulTest, ::testing::ValuesIn(AvailableCpuIsas()),
                         [](const auto& info) { return std::string(CpuIsaName(info.param)); });

}  // namespace
}  // namespace kvrm
