// q4_K weights (kernels/cpu/q4_k.h): the super-block format against ggml's layout written out
// by hand, the panel layout, the int8 activations, and the q4_K matmul on every instruction-set
// path against float64 references on random blocks (rows not a multiple of 16, one to several
// passes of activation rows, several activation blocks), bit for bit the same on every path and
// whatever the batch.
#include "kernels/cpu/q4_k.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "gtest/gtest.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_testing.h"
#include "kernels/cpu/thread_pool.h"

namespace kvrm {
namespace {

constexpr int64_t kSuper = WeightMatrix::kQ4KBlock;
constexpr int64_t kBytes = WeightMatrix::kQ4KBlockBytes;
constexpr int64_t kGroup = WeightMatrix::kPanelRows;

std::vector<float> Random(int64_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// A super-block of chosen parts, laid out as ggml's block_q4_K: d, dmin (f16); the 6-bit scales
// and mins of sub-blocks 0-3 in the low 6 bits of bytes 0-3 and 4-7, those of 4-7 as low and high
// nibbles of bytes 8-11 with their top two bits in the top bits of bytes 0-3 (scales) and 4-7
// (mins); sub-blocks 2c and 2c + 1 as the low and high nibbles of qs[32 c, 32 c + 32).
struct Block {
  uint16_t d, dmin;
  uint8_t sc[8], m[8];
  uint8_t q[kSuper];

  void Write(uint8_t* out) const {
    std::memset(out, 0, kBytes);
    std::memcpy(out, &d, 2);
    std::memcpy(out + 2, &dmin, 2);
    uint8_t* scales = out + 4;
    for (int j = 0; j < 4; ++j) {
      scales[j] = static_cast<uint8_t>(sc[j] | (sc[j + 4] >> 4) << 6);
      scales[j + 4] = static_cast<uint8_t>(m[j] | (m[j + 4] >> 4) << 6);
      scales[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xF) | (m[j + 4] & 0xF) << 4);
    }
    for (int j = 0; j < 8; ++j) {
      for (int c = 0; c < 32; ++c) out[16 + j / 2 * 32 + c] |= q[32 * j + c] << (j % 2 ? 4 : 0);
    }
  }
  double Value(int64_t i) const {
    return static_cast<double>(F16ToFloat(d)) * sc[i / 32] * q[i] -
           static_cast<double>(F16ToFloat(dmin)) * m[i / 32];
  }
};

Block RandomBlock(std::mt19937& rng) {
  std::uniform_int_distribution<int> six(0, 63), four(0, 15);
  std::uniform_real_distribution<float> scale(1e-4f, 2e-3f);
  Block b;
  b.d = FloatToF16(scale(rng));
  b.dmin = FloatToF16(scale(rng));
  for (int j = 0; j < 8; ++j) {
    b.sc[j] = static_cast<uint8_t>(six(rng));
    b.m[j] = static_cast<uint8_t>(six(rng));
  }
  for (uint8_t& q : b.q) q = static_cast<uint8_t>(four(rng));
  return b;
}

// A q6_K super-block of chosen parts, laid out as ggml's block_q6_K: per 128-value half, 64
// bytes of low nibbles (ql[l] holds values l (low nibble) and l + 64 (high), ql[l + 32] values
// l + 32 and l + 96) and 32 bytes of high bit pairs (qh[l] holds those of l, l + 32, l + 64,
// l + 96 in bits 0-1, 2-3, 4-5, 6-7); then 16 int8 scales, then d (f16).
struct Block6 {
  uint16_t d;
  int8_t sc[16];
  uint8_t q[kSuper];  // [0, 63]

  void Write(uint8_t* out) const {
    std::memset(out, 0, WeightMatrix::kQ6KBlockBytes);
    for (int half = 0; half < 2; ++half) {
      uint8_t* ql = out + 64 * half;
      uint8_t* qh = out + 128 + 32 * half;
      const uint8_t* v = q + 128 * half;
      for (int l = 0; l < 32; ++l) {
        ql[l] = static_cast<uint8_t>((v[l] & 0xF) | (v[l + 64] & 0xF) << 4);
        ql[l + 32] = static_cast<uint8_t>((v[l + 32] & 0xF) | (v[l + 96] & 0xF) << 4);
        qh[l] = static_cast<uint8_t>(v[l] >> 4 | (v[l + 32] >> 4) << 2 | (v[l + 64] >> 4) << 4 |
                                     (v[l + 96] >> 4) << 6);
      }
    }
    std::memcpy(out + 192, sc, 16);
    std::memcpy(out + 208, &d, 2);
  }
  double Value(int64_t i) const {
    return static_cast<double>(F16ToFloat(d)) * sc[i / 16] * (q[i] - 32);
  }
};

Block6 RandomBlock6(std::mt19937& rng) {
  std::uniform_int_distribution<int> six(0, 63), scale(-128, 127);
  Block6 b;
  b.d = FloatToF16(std::uniform_real_distribution<float>(1e-5f, 2e-4f)(rng));
  for (int8_t& s : b.sc) s = static_cast<int8_t>(scale(rng));
  for (uint8_t& q : b.q) q = static_cast<uint8_t>(six(rng));
  return b;
}

// A random q4_K or q6_K matrix: its bytes, and its values in float64.
struct Matrix {
  std::vector<uint8_t> data;
  std::vector<double> values;  // rows x cols
  WeightMatrix w;
};

Matrix RandomMatrix(int64_t rows, int64_t cols, std::mt19937& rng,
                    WeightFormat format = WeightFormat::kQ4K) {
  Matrix m;
  const int64_t supers = cols / kSuper, bytes = WeightMatrix::DataBlockSize(format);
  m.data.resize(rows * supers * bytes);
  m.values.resize(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t s = 0; s < supers; ++s) {
      uint8_t* out = m.data.data() + (r * supers + s) * bytes;
      double* values = m.values.data() + r * cols + s * kSuper;
      if (format == WeightFormat::kQ4K) {
        const Block b = RandomBlock(rng);
        b.Write(out);
        for (int64_t i = 0; i < kSuper; ++i) values[i] = b.Value(i);
      } else if (format == WeightFormat::kQ4G) {
        // An AWQ / GPTQ group's: an f16 scale, a zero in [0, 16] (GPTQ's v1 zeros reach 16),
        // 4-bit q; the bytes written here by q4_k.h's layout, not by EncodeBlockQ4G.
        std::uniform_int_distribution<int> nibble(0, 15), zero(0, 16);
        for (int j = 0; j < 8; ++j) {
          const uint16_t sc = FloatToF16(std::uniform_real_distribution<float>(1e-4f, 3e-2f)(rng));
          const int z = zero(rng);
          std::memcpy(out + 2 * j, &sc, 2);
          out[16 + j] = static_cast<uint8_t>(z);
          for (int i = 0; i < 16; ++i) {
            const int lo = nibble(rng), hi = nibble(rng);
            out[24 + 16 * j + i] = static_cast<uint8_t>(lo | hi << 4);
            values[32 * j + i] = static_cast<double>(F16ToFloat(sc)) * (lo - z);
            values[32 * j + 16 + i] = static_cast<double>(F16ToFloat(sc)) * (hi - z);
          }
        }
      } else {
        const Block6 b = RandomBlock6(rng);
        b.Write(out);
        for (int64_t i = 0; i < kSuper; ++i) values[i] = b.Value(i);
      }
    }
  }
  m.w = WeightMatrix{DType::kBF16, m.data.data(), rows, cols, cols, nullptr, format};
  return m;
}

TEST(Q6KBlockTest, DecodesGgmlsLayout) {
  std::mt19937 rng(8);
  for (int trial = 0; trial < 200; ++trial) {
    const Block6 b = RandomBlock6(rng);
    uint8_t bytes[WeightMatrix::kQ6KBlockBytes];
    b.Write(bytes);
    float s[16], y[kSuper];
    uint8_t q[kSuper];
    DecodeBlockQ6K(bytes, s, q);
    DequantizeRowQ6K(bytes, kSuper, y);
    for (int g = 0; g < 16; ++g) ASSERT_EQ(s[g], F16ToFloat(b.d) * b.sc[g]);
    for (int64_t i = 0; i < kSuper; ++i) {
      ASSERT_EQ(q[i], b.q[i]) << trial << "," << i;
      ASSERT_EQ(y[i], static_cast<float>(b.Value(i))) << trial << "," << i;  // d * sc exact
    }
  }
}

TEST(Q4KBlockTest, DecodesGgmlsLayout) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const Block b = RandomBlock(rng);
    uint8_t bytes[kBytes];
    b.Write(bytes);
    float s[8], o[8];
    uint8_t q[kSuper];
    DecodeBlockQ4K(bytes, s, o, q);
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      Q4KScaleMin(j, bytes + 4, &sc, &m);
      ASSERT_EQ(sc, b.sc[j]) << trial << "," << j;
      ASSERT_EQ(m, b.m[j]) << trial << "," << j;
      ASSERT_EQ(s[j], F16ToFloat(b.d) * b.sc[j]);
    }
    float y[kSuper];
    DequantizeRowQ4K(bytes, kSuper, y);
    for (int64_t i = 0; i < kSuper; ++i) {
      ASSERT_EQ(q[i], b.q[i]) << trial << "," << i;
      // d * sc * q is exact in f32, so one rounding of the difference.
      ASSERT_EQ(y[i], static_cast<float>(b.Value(i))) << trial << "," << i;
    }
  }
}

// ggml's reference quantizer: on Gaussian rows its weighted search of each sub-block's scale and
// min (with the 6-bit rounding of both) lands closer to the values than the plain min / max fit
// with exact float scales; every value within one step of its block's grid; packing the scales
// and reading them back agree.
TEST(Q4KQuantizeTest, SearchBeatsThePlainFitAndRoundTrips) {
  std::mt19937 rng(21);
  double err_search = 0, err_plain = 0, sum2 = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const std::vector<float> x = Random(kSuper, rng, trial % 2 ? 0.02f : 1.5f);
    uint8_t block[kBytes];
    QuantizeBlockQ4K(x.data(), block);
    float y[kSuper], s[8], o[8];
    uint8_t q[kSuper];
    DequantizeRowQ4K(block, kSuper, y);
    DecodeBlockQ4K(block, s, o, q);
    const double scale2 = trial % 2 ? 0.02 * 0.02 : 1.5 * 1.5;
    for (int j = 0; j < 8; ++j) {
      float lo = 0, hi = x[32 * j];
      for (int i = 0; i < 32; ++i) {
        lo = std::min(lo, x[32 * j + i]);
        hi = std::max(hi, x[32 * j + i]);
      }
      const double step = (hi - lo) / 15.0;
      for (int i = 0; i < 32; ++i) {
        const double v = x[32 * j + i];
        const double plain = lo + step * std::clamp(std::nearbyint((v - lo) / step), 0.0, 15.0);
        err_plain += (plain - v) * (plain - v) / scale2;
        err_search += (y[32 * j + i] - v) * (y[32 * j + i] - v) / scale2;
        sum2 += v * v / scale2;
        // Within one step of the block's own grid (the 6-bit scale rounding moves the grid).
        ASSERT_LE(std::fabs(y[32 * j + i] - v), 1.01 * step + 1e-6) << trial << "," << j;
      }
    }
    uint8_t repacked[12], sc[8], m[8];
    for (int j = 0; j < 8; ++j) Q4KScaleMin(j, block + 4, &sc[j], &m[j]);
    Q4KPackScaleMin(sc, m, repacked);
    ASSERT_EQ(std::memcmp(repacked, block + 4, 12), 0) << trial;
  }
  const double rel_search = std::sqrt(err_search / sum2), rel_plain = std::sqrt(err_plain / sum2);
  std::printf("q4_K relative rms error: search %.4f, plain min/max fit %.4f\n", rel_search,
              rel_plain);
  EXPECT_LT(rel_search, rel_plain);
  EXPECT_LT(rel_search, 0.12);
}

TEST(Q4KQuantizeTest, ZeroAndNonFiniteBlocks) {
  std::vector<float> x(kSuper, 0.0f);
  uint8_t block[kBytes];
  float y[kSuper];
  QuantizeBlockQ4K(x.data(), block);
  DequantizeRowQ4K(block, kSuper, y);
  for (float v : y) EXPECT_EQ(v, 0.0f);
  for (float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    std::mt19937 rng(3);
    x = Random(kSuper, rng);
    x[77] = bad;
    QuantizeBlockQ4K(x.data(), block);
    DequantizeRowQ4K(block, kSuper, y);
    for (float v : y) ASSERT_TRUE(std::isnan(v));
  }
}

// The weights a q4_K or q6_K panel copy holds, read by the layouts of q4_k.h: [rows][cols].
std::vector<double> PanelValues(const WeightMatrix& w, const void* panels,
                                WeightFormat format = WeightFormat::kQ4K) {
  const int64_t supers = w.cols / kSuper, bytes = WeightMatrix::PanelBlockSize(format);
  std::vector<double> out(w.rows * w.cols);
  const uint8_t* base = static_cast<const uint8_t*>(panels);
  for (int64_t r = 0; r < w.rows; ++r) {
    const int64_t l = r % kGroup;
    for (int64_t s = 0; s < supers; ++s) {
      const uint8_t* block = base + (r / kGroup * supers + s) * bytes;
      uint16_t h[2];
      std::memcpy(&h[0], block + 2 * l, 2);
      std::memcpy(&h[1], block + 32 + 2 * l, 2);  // q4_K's dmin
      const double d = F16ToFloat(h[0]);
      for (int64_t c = 0; c < kSuper; ++c) {
        const int64_t j = c / 32, t = c % 32 / 8, e = c % 8, at = 4 * l + e % 4;
        double& v = out[r * w.cols + s * kSuper + c];
        if (format == WeightFormat::kQ4K) {
          const uint8_t byte = block[320 + 256 * j + 64 * t + at];
          const int q = e < 4 ? byte & 0xF : byte >> 4;
          v = d * block[64 + 16 * j + l] * q -
              static_cast<double>(F16ToFloat(h[1])) * block[192 + 16 * j + l];
        } else if (format == WeightFormat::kQ4G) {
          uint16_t sh;
          std::memcpy(&sh, block + 32 * j + 2 * l, 2);
          const uint8_t byte = block[384 + 256 * j + 64 * t + at];
          const int q = e < 4 ? byte & 0xF : byte >> 4;
          v = static_cast<double>(F16ToFloat(sh)) * (q - block[256 + 16 * j + l]);
        } else {
          const uint8_t* sub = block + 320 + 384 * j;
          const int nibble = e < 4 ? sub[64 * t + at] & 0xF : sub[64 * t + at] >> 4;
          const int k = 2 * (t % 2) + (e < 4 ? 0 : 1);
          const int top = (sub[256 + 64 * (t / 2) + at] >> (2 * k)) & 3;
          const int8_t scale = static_cast<int8_t>(block[64 + 16 * (c / 16) + l]);
          v = d * scale * ((nibble | top << 4) - 32);
        }
      }
    }
  }
  return out;
}

// The values read back from a matrix's panels (`panel_values`, by the independent reader above)
// and its row-major blocks (WeightRowToFloat) are the matrix's own.
void ExpectHoldsTheValues(const Matrix& m, const std::vector<double>& panel_values) {
  const int64_t rows = m.w.rows, cols = m.w.cols;
  std::vector<float> row(cols);
  for (int64_t r = 0; r < rows; ++r) {
    WeightRowToFloat(m.w, r, row.data());
    for (int64_t c = 0; c < cols; ++c) {
      ASSERT_EQ(panel_values[r * cols + c], m.values[r * cols + c]) << r << "," << c;
      ASSERT_EQ(row[c], static_cast<float>(m.values[r * cols + c])) << r << "," << c;
    }
  }
}

TEST(Q6KPanelsTest, HoldTheBlocksWhereTheLayoutSays) {
  std::mt19937 rng(15);
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 256}, {17, 512}, {40, 256}}) {
    Matrix m = RandomMatrix(rows, cols, rng, WeightFormat::kQ6K);
    const PanelCopy panels(m.w, WeightFormat::kQ6K);
    ASSERT_EQ(panels.bytes(), (rows + 15) / 16 * cols / 256 * 3392);
    EXPECT_EQ(m.w.bytes(), rows * cols / 256 * 210);
    ExpectHoldsTheValues(m, PanelValues(m.w, panels.data(), WeightFormat::kQ6K));
  }
}

// q4 groups (AWQ / GPTQ's 4-bit groups as they are): the panels hold each row's s, z and q where
// q4_k.h says, and the row-major blocks read back (WeightRowToFloat) the values written.
TEST(Q4GPanelsTest, HoldTheBlocksWhereTheLayoutSays) {
  std::mt19937 rng(25);
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 256}, {17, 512}, {40, 768}}) {
    Matrix m = RandomMatrix(rows, cols, rng, WeightFormat::kQ4G);
    const PanelCopy panels(m.w, WeightFormat::kQ4G);
    ASSERT_EQ(panels.bytes(), (rows + 15) / 16 * cols / 256 * 2432);
    EXPECT_EQ(m.w.bytes(), rows * cols / 256 * 152);
    ExpectHoldsTheValues(m, PanelValues(m.w, panels.data(), WeightFormat::kQ4G));
    // DecodeBlockQ4G and EncodeBlockQ4G are each other's inverse.
    float sc[8];
    uint8_t z[8], q[kSuper], again[WeightMatrix::kQ4GBlockBytes];
    DecodeBlockQ4G(m.data.data(), sc, z, q);
    uint16_t h[8];
    for (int j = 0; j < 8; ++j) h[j] = FloatToF16(sc[j]);
    EncodeBlockQ4G(h, z, q, again);
    EXPECT_EQ(std::memcmp(again, m.data.data(), sizeof(again)), 0);
  }
}

TEST(Q4KPanelsTest, HoldTheBlocksWhereTheLayoutSays) {
  std::mt19937 rng(5);
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 256}, {17, 512}, {40, 256}}) {
    Matrix m = RandomMatrix(rows, cols, rng);
    const PanelCopy panels(m.w, WeightFormat::kQ4K);
    ASSERT_EQ(panels.bytes(), (rows + 15) / 16 * cols / 256 * 2368);
    ASSERT_EQ(panels.bytes(), BlockPanelBytes(m.w));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(panels.data()) % 64, 0u);
    EXPECT_EQ(m.w.bytes(), rows * cols / 256 * 144);
    ExpectHoldsTheValues(m, PanelValues(m.w, panels.data()));
    // The rows past the last (of a partial group) are zero: d = dmin = 0.
    if (rows % kGroup != 0) {
      const uint8_t* last =
          static_cast<const uint8_t*>(panels.data()) + (rows / kGroup) * (cols / 256) * 2368;
      for (int64_t l = rows % kGroup; l < kGroup; ++l) {
        ASSERT_EQ(last[2 * l] | last[2 * l + 1] | last[32 + 2 * l] | last[33 + 2 * l], 0);
      }
    }
    // Dense rows quantized at packing give the panels of their quantized blocks.
    std::vector<float> dense(rows * cols);
    std::vector<uint8_t> blocks(rows * cols / 256 * 144);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) dense[r * cols + c] = std::sin(0.37 * (r * cols + c));
      QuantizeRowQ4K(&dense[r * cols], cols, &blocks[r * cols / 256 * 144]);
    }
    const WeightMatrix dense_w{DType::kF32, dense.data(), rows, cols, cols};
    const WeightMatrix blocks_w{DType::kF32, blocks.data(),     rows, cols, cols,
                                nullptr,     WeightFormat::kQ4K};
    const PanelCopy from_dense(dense_w, WeightFormat::kQ4K),
        from_blocks(blocks_w, WeightFormat::kQ4K);
    ASSERT_EQ(from_dense.bytes(), from_blocks.bytes());
    EXPECT_EQ(std::memcmp(from_dense.data(), from_blocks.data(), from_dense.bytes()), 0);
    // A row slice at a panel keeps its panels and its rows.
    const int64_t at = rows > 16 ? 16 : 0;
    const WeightMatrix slice = m.w.RowSlice(at, 1);
    std::vector<float> row(cols);
    WeightRowToFloat(slice, 0, row.data());
    for (int64_t c = 0; c < cols; ++c) {
      ASSERT_EQ(row[c], static_cast<float>(m.values[at * cols + c]));
    }
  }
}

TEST(Q4KActivationsTest, ScratchNeverShrinksWithMoreColumns) {
  for (int64_t cols = 256; cols < 40000; cols += 256) {
    ASSERT_LE(Q4KScratchBytes(cols), Q4KScratchBytes(cols + 256)) << cols;
    // Two copies of the int8 rows, and two floats per 32 columns a row.
    // Two copies of the int8 rows, two floats per 32 columns and an int32 per 16 a row.
    ASSERT_GE(Q4KScratchBytes(cols), Q4KActivationBlockRows(cols) * (2 * cols + cols / 2)) << cols;
  }
}

TEST(Q4KActivationsTest, RoundsToInt8WithEachBlocksScale) {
  std::mt19937 rng(11);
  const int64_t n = 4, k = 512, blocks = k / 32;
  std::vector<float> x = Random(n * k, rng, 2.0f);
  for (int64_t c = 64; c < 96; ++c) x[1 * k + c] = 0;  // a zero block
  x[2 * k + 300] = std::numeric_limits<float>::quiet_NaN();
  x[3 * k + 5] = std::numeric_limits<float>::infinity();
  std::vector<int8_t> q(n * k, 99);
  std::vector<float> xd(n * blocks), xsum(n * blocks);
  QuantizeActivationsQ4K(x.data(), n, k, k, q.data(), xd.data(), xsum.data());
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t at = i * blocks + b;
      if ((i == 1 && b == 2)) {
        EXPECT_EQ(xd[at], 0.0f);
        EXPECT_EQ(xsum[at], 0.0f);
        continue;
      }
      if ((i == 2 && b == 300 / 32) || (i == 3 && b == 0)) {
        EXPECT_TRUE(std::isnan(xd[at]) && std::isnan(xsum[at])) << i << "," << b;
        continue;
      }
      float amax = 0;
      for (int64_t c = 0; c < 32; ++c) amax = std::max(amax, std::fabs(x[i * k + b * 32 + c]));
      EXPECT_EQ(xd[at], amax / 127.0f);
      int sum = 0;
      for (int64_t c = 0; c < 32; ++c) {
        const int64_t e = i * k + b * 32 + c;
        const double want = static_cast<double>(x[e]) * 127 / amax;
        ASSERT_LE(std::fabs(q[e] - want), 0.5 + 1e-4) << i << "," << b << "," << c;
        sum += q[e];
      }
      EXPECT_EQ(xsum[at], xd[at] * static_cast<float>(sum));
    }
  }
}

class Q4KMatMulTest : public ::testing::TestWithParam<CpuIsa> {};

struct Shape {
  int64_t n, rows, cols;
};

// Against float64 over the stored values times the quantized activations (which the kernel
// computes with exact int32 sums and f32 sums of the scaled sub-blocks), and against the
// stored values times x itself (each term moved by at most half an activation step).
TEST_P(Q4KMatMulTest, MatchesFloat64Reference) {
  const CpuIsa isa = GetParam();
  std::mt19937 rng(1234 + static_cast<int>(isa));
  ThreadPool pool(2);
  const CpuIsa saved = ActiveCpuIsa();
  SetActiveCpuIsa(isa);
  // 1-8 activation rows a pass and more than one pass (9, 20, 40), partial last panels, several
  // activation blocks (40 rows of 8192 columns: 16 rows a block).
  for (Shape s : {Shape{1, 1, 256}, Shape{1, 7, 512}, Shape{3, 33, 256}, Shape{4, 40, 768},
                  Shape{8, 16, 1024}, Shape{9, 48, 256}, Shape{20, 50, 512}, Shape{40, 9, 8192},
                  Shape{2, 130, 2048}}) {
    for (const WeightFormat format : {WeightFormat::kQ4K, WeightFormat::kQ6K, WeightFormat::kQ4G}) {
      Matrix m = RandomMatrix(s.rows, s.cols, rng, format);
      const PanelCopy panels(m.w, format);
      WeightMatrix view = m.w;
      view.panels = panels.data();
      view.panel_format = format;
      const int64_t blocks = s.cols / 32;
      std::vector<float> x = Random(s.n * s.cols, rng);
      std::vector<int8_t> xq(s.n * s.cols);
      std::vector<float> xd(s.n * blocks), xsum(s.n * blocks);
      QuantizeActivationsQ4K(x.data(), s.n, s.cols, s.cols, xq.data(), xd.data(), xsum.data());
      std::vector<float> y(s.n * s.rows, NAN);
      std::vector<float> scratch(pool.num_threads() * MatMulScratchFloats(s.cols));
      MatMul(pool, x.data(), s.n, s.cols, view, y.data(), s.rows, scratch.data());
      for (int64_t i = 0; i < s.n; ++i) {
        for (int64_t r = 0; r < s.rows; ++r) {
          double exact = 0, unquantized = 0, mag = 0, slack = 0;
          for (int64_t c = 0; c < s.cols; ++c) {
            const double wc = m.values[r * s.cols + c];
            const double step = xd[i * blocks + c / 32];
            exact += wc * xq[i * s.cols + c] * step;
            unquantized += wc * x[i * s.cols + c];
            mag += std::fabs(wc * x[i * s.cols + c]);
            slack += std::fabs(wc) * step * 0.5001;
          }
          ASSERT_NEAR(y[i * s.rows + r], exact, 2e-6 * mag + 1e-7)
              << CpuIsaName(isa) << " format " << static_cast<int>(format) << " n=" << s.n
              << " rows=" << s.rows << " cols=" << s.cols << " at " << i << "," << r;
          ASSERT_NEAR(y[i * s.rows + r], unquantized, slack + 2e-6 * mag + 1e-7);
        }
      }
    }
  }
  SetActiveCpuIsa(saved);
}

// Every path computes the same bits, whatever the batch a row is in; a row holding a NaN gives
// NaN and leaves the others.
TEST_P(Q4KMatMulTest, SameBitsOnEveryPathAndBatch) {
  std::mt19937 rng(99);
  for (const WeightFormat format : {WeightFormat::kQ4K, WeightFormat::kQ6K}) {
    Matrix m = RandomMatrix(45, 512, rng, format);
    const PanelCopy panels(m.w, format);
    WeightMatrix view = m.w;
    view.panels = panels.data();
    view.panel_format = format;
    ExpectSameBitsOnEveryPathAndBatch(GetParam(), view, 40, rng);
  }
}

// q4 groups with an input order (an act-order checkpoint's columns in its groups' order): column c
// multiplies x's input_order[c], the activations quantized in blocks of that order; and
// WeightRowToFloat gives the row in input order.
TEST_P(Q4KMatMulTest, Q4GroupsGatherTheirInputOrder) {
  const CpuIsa isa = GetParam();
  std::mt19937 rng(77 + static_cast<int>(isa));
  ThreadPool pool(2);
  const CpuIsa saved = ActiveCpuIsa();
  SetActiveCpuIsa(isa);
  for (Shape s : {Shape{1, 16, 256}, Shape{3, 33, 512}, Shape{9, 20, 768}}) {
    Matrix m = RandomMatrix(s.rows, s.cols, rng, WeightFormat::kQ4G);
    std::vector<int32_t> order(s.cols);
    for (int64_t c = 0; c < s.cols; ++c) order[c] = static_cast<int32_t>(c);
    std::shuffle(order.begin(), order.end(), rng);
    m.w.input_order = order.data();
    const PanelCopy panels(m.w, WeightFormat::kQ4G);
    WeightMatrix view = m.w;
    view.panels = panels.data();
    view.panel_format = WeightFormat::kQ4G;
    std::vector<float> x = Random(s.n * s.cols, rng);
    std::vector<float> gathered(s.n * s.cols);
    for (int64_t i = 0; i < s.n; ++i) {
      for (int64_t c = 0; c < s.cols; ++c) gathered[i * s.cols + c] = x[i * s.cols + order[c]];
    }
    const int64_t blocks = s.cols / 32;
    std::vector<int8_t> xq(s.n * s.cols);
    std::vector<float> xd(s.n * blocks), xsum(s.n * blocks);
    QuantizeActivationsQ4K(gathered.data(), s.n, s.cols, s.cols, xq.data(), xd.data(), xsum.data());
    std::vector<float> y(s.n * s.rows, NAN);
    std::vector<float> scratch(pool.num_threads() * MatMulScratchFloats(s.cols));
    MatMul(pool, x.data(), s.n, s.cols, view, y.data(), s.rows, scratch.data());
    for (int64_t i = 0; i < s.n; ++i) {
      for (int64_t r = 0; r < s.rows; ++r) {
        double exact = 0, mag = 0;
        for (int64_t c = 0; c < s.cols; ++c) {
          const double wc = m.values[r * s.cols + c];  // stored order
          exact += wc * xq[i * s.cols + c] * xd[i * blocks + c / 32];
          mag += std::fabs(wc * x[i * s.cols + order[c]]);
        }
        ASSERT_NEAR(y[i * s.rows + r], exact, 2e-6 * mag + 1e-7)
            << CpuIsaName(isa) << " rows=" << s.rows << " cols=" << s.cols << " at " << i << ","
            << r;
      }
    }
    std::vector<float> row(s.cols);
    WeightRowToFloat(m.w, 1, row.data());
    for (int64_t c = 0; c < s.cols; ++c) {
      ASSERT_EQ(row[order[c]], static_cast<float>(m.values[1 * s.cols + c]));
    }
  }
  SetActiveCpuIsa(saved);
}

INSTANTIATE_TEST_SUITE_P(AllIsas, Q4KMatMulTest, ::testing::ValuesIn(AvailableCpuIsas()),
                         [](const auto& info) { return std::string(CpuIsaName(info.param)); });

}  // namespace
}  // namespace kvrm
