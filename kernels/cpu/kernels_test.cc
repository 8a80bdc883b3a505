// CPU kernels against float64 references on random shapes (odd sizes, not multiples of the
// vector width), for each weight dtype and each instruction set this processor runs.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/thread_pool.h"

namespace kvrm {
namespace {

struct StoredMatrix {
  std::vector<uint16_t> half;
  std::vector<float> f32;
  std::vector<double> exact;  // the values the stored dtype represents, in double
  WeightMatrix view;
};

StoredMatrix RandomMatrix(DType dtype, int64_t rows, int64_t cols, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  StoredMatrix m;
  m.exact.resize(rows * cols);
  if (dtype == DType::kF32) m.f32.resize(rows * cols);
  else m.half.resize(rows * cols);
  for (int64_t i = 0; i < rows * cols; ++i) {
    const float v = dist(rng);
    if (dtype == DType::kF32) {
      m.f32[i] = v;
      m.exact[i] = v;
    } else if (dtype == DType::kBF16) {
      m.half[i] = FloatToBf16(v);
      m.exact[i] = Bf16ToFloat(m.half[i]);
    } else {
      m.half[i] = FloatToF16(v);
      m.exact[i] = F16ToFloat(m.half[i]);
    }
  }
  m.view = WeightMatrix{dtype,
                        dtype == DType::kF32 ? static_cast<const void*>(m.f32.data())
                                             : static_cast<const void*>(m.half.data()),
                        rows, cols, cols};
  return m;
}

std::vector<float> RandomVector(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

class MatMulTest : public ::testing::TestWithParam<std::tuple<CpuIsa, DType>> {};

// A stored matrix's view, with its panel copy (WeightMatrix::panels) when `panels`.
struct Laid {
  std::optional<PanelCopy> copy;
  WeightMatrix view;
  Laid(const StoredMatrix& m, bool panels) : view(m.view) {
    if (!panels) return;
    copy.emplace(m.view);
    view.panels = copy->data();
  }
};

TEST_P(MatMulTest, MatchesFloat64Reference) {
  const auto [isa, dtype] = GetParam();
  std::mt19937 rng(1234 + static_cast<int>(isa) * 7 + static_cast<int>(dtype));
  ThreadPool pool(2);
  const CpuIsa saved = ActiveCpuIsa();
  SetActiveCpuIsa(isa);
  struct Shape { int64_t n, rows, cols; };
  // Decode-sized n (in-register widening), prefill-sized n (widened tiles), several L2 activation
  // blocks (70 rows of 4099), short row tiles and k tails shorter than a vector; for the panels,
  // partial last panels (rows not a multiple of 16), odd columns, 1-16 activation rows per pass
  // and more than one pass (17, 33, 70).
  for (Shape s : {Shape{1, 1, 1}, Shape{1, 7, 13}, Shape{3, 33, 31}, Shape{5, 130, 257},
                  Shape{16, 67, 768}, Shape{2, 5, 1000}, Shape{4, 6, 23}, Shape{70, 9, 4099},
                  Shape{33, 13, 129}, Shape{17, 50, 77}, Shape{11, 48, 64}, Shape{9, 21, 2}}) {
    StoredMatrix w = RandomMatrix(dtype, s.rows, s.cols, rng);
    std::vector<float> x = RandomVector(s.n * s.cols, rng);
    // Without and with panels: read where the path has a panel kernel (MatMulReadsPanels),
    // ignored elsewhere (also checked).
    for (bool panels : {false, true}) {
      const Laid laid(w, panels);
      const WeightMatrix& view = laid.view;
      std::vector<float> y(s.n * s.rows, NAN);
      std::vector<float> scratch(pool.num_threads() * MatMulScratchFloats(s.cols));
      MatMul(pool, x.data(), s.n, s.cols, view, y.data(), s.rows, scratch.data());
      // The avx512_bf16 path rounds the activations to bf16 (to nearest even) for bf16 weights:
      // its exact reference uses the rounded activations, and it stays within bf16 rounding
      // (2^-8 of the magnitude sum) of the unrounded product.
      const bool rounds = MatMulRoundsActivations(isa, dtype);
      for (int64_t i = 0; i < s.n; ++i) {
        for (int64_t r = 0; r < s.rows; ++r) {
          double ref = 0, unrounded = 0, mag = 0;
          for (int64_t c = 0; c < s.cols; ++c) {
            const float xc = x[i * s.cols + c];
            const double xr = rounds ? Bf16ToFloat(FloatToBf16(xc)) : xc;
            ref += xr * w.exact[r * s.cols + c];
            unrounded += static_cast<double>(xc) * w.exact[r * s.cols + c];
            mag += std::abs(xc * w.exact[r * s.cols + c]);
          }
          // f32 accumulation: error bounded by ~cols * eps * sum|terms|; 1e-6 relative to the
          // magnitude sum is well inside that for these sizes.
          ASSERT_NEAR(y[i * s.rows + r], ref, 2e-6 * mag + 1e-6)
              << "isa=" << CpuIsaName(isa) << " dtype=" << DTypeName(dtype) << " n=" << s.n
              << " rows=" << s.rows << " cols=" << s.cols << " panels=" << panels << " at " << i
              << "," << r;
          ASSERT_NEAR(y[i * s.rows + r], unrounded, (rounds ? 1.0 / 256 : 2e-6) * mag + 1e-6);
        }
      }
    }
  }
  SetActiveCpuIsa(saved);
}

// A row's product does not depend on the batch it was computed in: the same bits alone, in a
// decode-sized batch and in a prefill-sized one (so a request's tokens do not change with the
// load), on every path and layout.
TEST_P(MatMulTest, RowResultDoesNotDependOnTheBatch) {
  const auto [isa, dtype] = GetParam();
  std::mt19937 rng(99 + static_cast<int>(isa) * 5 + static_cast<int>(dtype));
  ThreadPool pool(2);
  const CpuIsa saved = ActiveCpuIsa();
  SetActiveCpuIsa(isa);
  const int64_t rows = 45, cols = 301, n = 40;
  StoredMatrix w = RandomMatrix(dtype, rows, cols, rng);
  std::vector<float> x = RandomVector(n * cols, rng);
  for (bool panels : {false, true}) {
    const Laid laid(w, panels);
    const WeightMatrix& view = laid.view;
    std::vector<float> scratch(pool.num_threads() * MatMulScratchFloats(cols));
    std::vector<float> all(n * rows);
    MatMul(pool, x.data(), n, cols, view, all.data(), rows, scratch.data());
    for (int64_t batch : {1, 3, 4, 7, 16}) {
      for (int64_t i0 = 0; i0 + batch <= n; i0 += 13) {
        std::vector<float> part(batch * rows);
        MatMul(pool, x.data() + i0 * cols, batch, cols, view, part.data(), rows,
               scratch.data());
        for (int64_t i = 0; i < batch * rows; ++i) {
          ASSERT_EQ(part[i], all[i0 * rows + i])
              << CpuIsaName(isa) << " " << DTypeName(dtype) << " panels=" << panels
              << " batch " << batch << " at row " << i0 + i / rows << ", output " << i % rows;
        }
      }
    }
  }
  SetActiveCpuIsa(saved);
}

// Every element of a matrix lands where WeightMatrix::panels says, zeros elsewhere; a row slice
// starting a panel keeps its panels.
TEST(PanelTest, PackingPlacesEveryElement) {
  std::mt19937 rng(5);
  for (DType dtype : {DType::kBF16, DType::kF32, DType::kF16}) {
    const int64_t per_line = dtype == DType::kBF16 ? 2 : 1;  // columns per line
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{37, 45}, {16, 2}, {1, 1}, {48, 64}}) {
      StoredMatrix w = RandomMatrix(dtype, rows, cols, rng);
      const Laid laid(w, /*panels=*/true);
      const WeightMatrix& view = laid.view;
      const int64_t lines = (cols + per_line - 1) / per_line, stride = view.PanelStride();
      EXPECT_EQ(stride, lines * per_line * 16);
      const int64_t elem = static_cast<int64_t>(DTypeSize(dtype));
      EXPECT_EQ(PanelBytes(view), (rows + 15) / 16 * stride * elem);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(view.panels) % 64, 0u);
      for (int64_t p = 0; p < (rows + 15) / 16; ++p) {
        for (int64_t q = 0; q < lines; ++q) {
          for (int64_t l = 0; l < 16; ++l) {
            for (int64_t e = 0; e < per_line; ++e) {
              const int64_t r = 16 * p + l, c = q * per_line + e;
              const int64_t at = p * stride + q * 16 * per_line + l * per_line + e;
              if (dtype != DType::kF32) {
                const uint16_t want = r < rows && c < cols ? w.half[r * cols + c] : 0;
                ASSERT_EQ(static_cast<const uint16_t*>(view.panels)[at], want) << r << "," << c;
              } else {
                const float want = r < rows && c < cols ? w.f32[r * cols + c] : 0.0f;
                ASSERT_EQ(static_cast<const float*>(view.panels)[at], want) << r << "," << c;
              }
            }
          }
        }
      }
      if (rows > 16) {
        EXPECT_EQ(view.RowSlice(16, rows - 16).panels, view.PanelPtr(1));
        EXPECT_EQ(view.RowSlice(3, 5).panels, nullptr);  // not at a panel: row-major only
      }
    }
  }
}

std::vector<std::tuple<CpuIsa, DType>> AllPaths() {
  std::vector<std::tuple<CpuIsa, DType>> out;
  for (CpuIsa isa : AvailableCpuIsas()) {
    for (DType d : {DType::kF32, DType::kF16, DType::kBF16}) out.emplace_back(isa, d);
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(
    AllIsasAndDtypes, MatMulTest, ::testing::ValuesIn(AllPaths()),
    [](const ::testing::TestParamInfo<std::tuple<CpuIsa, DType>>& info) {
      return std::string(CpuIsaName(std::get<0>(info.param))) + "_" +
             std::string(DTypeName(std::get<1>(info.param)));
    });

// A product split into shares over any number of threads gives the same bits as MatMul: every
// output row is one dot product whatever the split.
TEST(MatMulShareTest, SharesCoverRowsOnceAndMatchMatMul) {
  std::mt19937 rng(77);
  ThreadPool pool(2);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t n : {1, 9}) {
      StoredMatrix w = RandomMatrix(dtype, 29, 45, rng);
      std::vector<float> x = RandomVector(n * 45, rng);
      std::vector<float> want(n * 29), got(n * 29, NAN);
      std::vector<float> scratch(3 * MatMulScratchFloats(45));
      MatMul(pool, x.data(), n, 45, w.view, want.data(), 29, scratch.data());
      int64_t covered = 0;
      for (int t = 0; t < 3; ++t) {
        int64_t b, e;
        MatMulShareBounds(29, t, 3, &b, &e);
        EXPECT_EQ(b, covered);
        covered = std::max(covered, e);
        MatMulShare(ActiveCpuIsa(), x.data(), n, 45, w.view, got.data(), 29, t, 3,
                    scratch.data() + t * MatMulScratchFloats(45));
      }
      EXPECT_EQ(covered, 29);
      for (int64_t i = 0; i < n * 29; ++i) ASSERT_EQ(got[i], want[i]) << i;
    }
  }
}

TEST(OpsTest, RmsNormMatchesReference) {
  std::mt19937 rng(7);
  for (int64_t dim : {1, 17, 768}) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      StoredMatrix w = RandomMatrix(dtype, 1, dim, rng);
      std::vector<float> x = RandomVector(dim, rng), out(dim);
      RmsNorm(x.data(), w.view, dim, 1e-5f, out.data());
      double ss = 0;
      for (float v : x) ss += static_cast<double>(v) * v;
      const double inv = 1.0 / std::sqrt(ss / dim + 1e-5);
      for (int64_t i = 0; i < dim; ++i) {
        ASSERT_NEAR(out[i], x[i] * inv * w.exact[i], 1e-5 * (1 + std::abs(x[i] * inv * w.exact[i])));
      }
    }
  }
}

// Gemma's norms multiply by 1 + w (weights stored as w - 1); offset 0 is the plain norm, bit for
// bit.
TEST(OpsTest, RmsNormWeightOffset) {
  std::mt19937 rng(17);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    StoredMatrix w = RandomMatrix(dtype, 1, 300, rng);
    std::vector<float> x = RandomVector(300, rng), out(300), plain(300), zero(300);
    RmsNorm(x.data(), w.view, 300, 1e-6f, out.data(), 1.0f);
    RmsNorm(x.data(), w.view, 300, 1e-6f, plain.data());
    RmsNorm(x.data(), w.view, 300, 1e-6f, zero.data(), 0.0f);
    EXPECT_EQ(plain, zero);
    double ss = 0;
    for (float v : x) ss += static_cast<double>(v) * v;
    const double inv = 1.0 / std::sqrt(ss / 300 + 1e-6);
    for (int i = 0; i < 300; ++i) {
      const double ref = x[i] * inv * (1 + w.exact[i]);
      ASSERT_NEAR(out[i], ref, 1e-5 * (1 + std::abs(ref))) << i;
    }
  }
}

// GELU's tanh approximation (gelu_pytorch_tanh) times up, against float64, including the tails
// where the sigmoid form saturates (|g| up to 30).
TEST(OpsTest, GeluTanhMulMatchesFloat64) {
  std::mt19937 rng(18);
  std::vector<float> g = RandomVector(200, rng), u = RandomVector(200, rng), out(200);
  for (int i = 0; i < 20; ++i) g[i] *= 15;
  GeluTanhMul(g.data(), u.data(), 200, out.data());
  for (int i = 0; i < 200; ++i) {
    const double x = g[i];
    const double ref =
        0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))) * u[i];
    ASSERT_NEAR(out[i], ref, 2e-6 * (1 + std::abs(ref))) << "g=" << x;
  }
}

// gpt-oss's clamped GLU against float64, with gates and ups well beyond the limit on both sides
// (the clamps matter) and limits 7 (gpt-oss's) and 1.5.
TEST(OpsTest, ClampedSwiGluMulMatchesFloat64) {
  std::mt19937 rng(23);
  std::vector<float> g = RandomVector(300, rng), u = RandomVector(300, rng), out(300);
  for (int i = 0; i < 300; ++i) {
    g[i] *= 6;
    u[i] *= 6;
  }
  int clamped = 0;
  for (const float limit : {7.0f, 1.5f}) {
    ClampedSwiGluMul(g.data(), u.data(), 300, limit, 1.702f, out.data());
    for (int i = 0; i < 300; ++i) {
      const double x = std::min<double>(g[i], limit);
      const double y = std::clamp<double>(u[i], -limit, limit);
      clamped += g[i] > limit || std::abs(u[i]) > limit;
      const double ref = x / (1 + std::exp(-1.702 * x)) * (y + 1);
      ASSERT_NEAR(out[i], ref, 2e-6 * (1 + std::abs(ref))) << "g=" << g[i] << " u=" << u[i];
    }
  }
  EXPECT_GT(clamped, 100);
}

// Softcapping against float64's cap * tanh(x / cap), over small, large and negative scores:
// within 2e-7 of the cap absolutely (tanh's own scale), odd, and saturating at +-cap.
TEST(OpsTest, SoftcapMatchesTanh) {
  std::mt19937 rng(19);
  std::vector<float> x = RandomVector(500, rng);
  for (int i = 0; i < 100; ++i) x[i] *= 200;      // past the cap: saturates
  for (int i = 100; i < 200; ++i) x[i] *= 1e-4f;  // near zero: no cancellation blow-up
  x.push_back(0.0f);
  std::vector<float> y = x;
  const float cap = 30.0f;
  SoftcapInPlace(y.data(), cap, static_cast<int64_t>(y.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    const double ref = cap * std::tanh(static_cast<double>(x[i]) / cap);
    ASSERT_NEAR(y[i], ref, 2e-7 * cap) << "x=" << x[i];
    ASSERT_LE(std::abs(y[i]), cap);
  }
  EXPECT_EQ(y.back(), 0.0f);
}

TEST(OpsTest, RopeRotatesHalfPairs) {
  std::mt19937 rng(8);
  const int64_t heads = 3, hd = 10, half = 5;
  std::vector<float> x = RandomVector(heads * hd, rng), y = x;
  std::vector<float> cs(hd);
  std::vector<double> angle(half);
  for (int i = 0; i < half; ++i) {
    angle[i] = 0.37 * (i + 1);
    cs[i] = static_cast<float>(std::cos(angle[i]));
    cs[half + i] = static_cast<float>(std::sin(angle[i]));
  }
  ApplyRope(y.data(), heads, hd, cs.data());
  for (int64_t h = 0; h < heads; ++h) {
    for (int i = 0; i < half; ++i) {
      const double a = x[h * hd + i], b = x[h * hd + i + half];
      EXPECT_NEAR(y[h * hd + i], a * std::cos(angle[i]) - b * std::sin(angle[i]), 1e-5);
      EXPECT_NEAR(y[h * hd + i + half], b * std::cos(angle[i]) + a * std::sin(angle[i]), 1e-5);
    }
  }
}

TEST(OpsTest, SiluMulAndSoftmax) {
  std::mt19937 rng(9);
  std::vector<float> g = RandomVector(37, rng), u = RandomVector(37, rng), out(37);
  SiluMul(g.data(), u.data(), 37, out.data());
  for (int i = 0; i < 37; ++i) {
    const double ref = g[i] / (1 + std::exp(-static_cast<double>(g[i]))) * u[i];
    EXPECT_NEAR(out[i], ref, 1e-6 * (1 + std::abs(ref)));
  }
  std::vector<float> s = RandomVector(29, rng);
  std::vector<double> e(29);
  double sum = 0;
  for (int i = 0; i < 29; ++i) sum += (e[i] = std::exp(static_cast<double>(s[i])));
  SoftmaxInPlace(s.data(), 29);
  for (int i = 0; i < 29; ++i) EXPECT_NEAR(s[i], e[i] / sum, 1e-6);
}

// Attention over a fragmented run table equals the float64 reference over the logical history.
TEST(AttentionTest, RunTableMatchesContiguousReference) {
  std::mt19937 rng(10);
  const int32_t block = 4, hd = 24, kv_heads = 2, pool_blocks = 32;
  const int64_t pool_tokens = pool_blocks * block;
  std::vector<float> k = RandomVector(kv_heads * pool_tokens * hd, rng);
  std::vector<float> v = RandomVector(kv_heads * pool_tokens * hd, rng);
  KvLayerView view{k.data(), v.data(), pool_tokens * hd, block, hd};
  const KvRun runs[] = {{9, 2}, {2, 3}, {20, 1}, {14, 4}};  // 10 blocks = 40 tokens
  for (int64_t seq_len : {1, 5, 23, 40}) {
    for (int32_t h = 0; h < kv_heads; ++h) {
      std::vector<float> q = RandomVector(hd, rng), out(hd), scores(seq_len);
      const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
      AttendOneHead(q.data(), view, h, runs, 4, seq_len, scale, scores.data(), out.data());
      std::vector<double> p(seq_len);
      double mx = -1e300, sum = 0;
      for (int64_t t = 0; t < seq_len; ++t) {
        const float* kt = view.KeyAt(h, PhysicalToken(runs, 4, block, t));
        double dot = 0;
        for (int i = 0; i < hd; ++i) dot += static_cast<double>(q[i]) * kt[i];
        p[t] = dot * scale;
        mx = std::max(mx, p[t]);
      }
      for (double& x : p) sum += (x = std::exp(x - mx));
      for (int i = 0; i < hd; ++i) {
        double ref = 0;
        for (int64_t t = 0; t < seq_len; ++t) {
          ref += p[t] / sum * view.ValueAt(h, PhysicalToken(runs, 4, block, t))[i];
        }
        ASSERT_NEAR(out[i], ref, 1e-5) << "seq_len=" << seq_len << " head=" << h << " i=" << i;
      }
    }
  }
}

// Grouped-query attention gives each head exactly what AttendOneHead gives it (same sums, same
// order), over a fragmented run table.
TEST(AttentionTest, GroupEqualsOneHeadAtATime) {
  std::mt19937 rng(11);
  const int32_t block = 4, hd = 40, kv_heads = 2, group = 3;
  const int64_t pool_tokens = 32 * block;
  std::vector<float> k = RandomVector(kv_heads * pool_tokens * hd, rng);
  std::vector<float> v = RandomVector(kv_heads * pool_tokens * hd, rng);
  KvLayerView view{k.data(), v.data(), pool_tokens * hd, block, hd};
  const KvRun runs[] = {{9, 2}, {2, 3}, {20, 1}, {14, 4}};
  for (int64_t seq_len : {1, 6, 40}) {
    std::vector<float> q = RandomVector(group * hd, rng), grouped(group * hd);
    std::vector<float> scores(group * seq_len);
    AttendGroup(q.data(), group, view, 1, runs, 4, seq_len, 0.125f, scores.data(), grouped.data());
    for (int32_t g = 0; g < group; ++g) {
      std::vector<float> one(hd), s1(seq_len);
      AttendOneHead(&q[g * hd], view, 1, runs, 4, seq_len, 0.125f, s1.data(), one.data());
      for (int i = 0; i < hd; ++i) ASSERT_EQ(grouped[g * hd + i], one[i]) << g << " " << i;
    }
  }
}

// Every instruction-set path at the head sizes models use (AVX-512 has its own attention loops
// for multiples of 16 up to 128; 40 takes the portable loops everywhere), several query-head
// groups and history lengths around the 16-key batches, against float64: each head's output
// within 2e-5 (values are N(0, 1): outputs are O(1)).
// A KV layer over k and v: f32 as given, or a bf16 or FP8 copy (k and v are then replaced in
// place by what the pool holds, for the float64 reference). FP8 pools get scales other than 1
// (E4M3: keys / 0.05 and values / 0.02 reach 80 and 200 of its 448; E5M2: / 0.5), so the
// reference checks that the kernels apply them.
struct TestKv {
  std::vector<uint16_t> kb, vb;
  std::vector<uint8_t> k8, v8;
  KvLayerView view;
  TestKv(std::vector<float>& k, std::vector<float>& v, int64_t head_stride, int32_t block,
         int32_t hd, DType dtype)
      : view{k.data(), v.data(), head_stride, block, hd} {
    if (dtype == DType::kBF16) {
      kb.resize(k.size());
      vb.resize(v.size());
      for (size_t i = 0; i < k.size(); ++i) {
        kb[i] = FloatToBf16(k[i]);
        vb[i] = FloatToBf16(v[i]);
        k[i] = Bf16ToFloat(kb[i]);
        v[i] = Bf16ToFloat(vb[i]);
      }
      view = KvLayerView{kb.data(), vb.data(), head_stride, block, hd, DType::kBF16};
    } else if (IsFp8(dtype)) {
      const bool e4m3 = dtype == DType::kF8E4M3;
      const float ks = e4m3 ? 0.05f : 0.5f, vs = e4m3 ? 0.02f : 0.5f;
      k8.resize(k.size());
      v8.resize(v.size());
      for (size_t i = 0; i < k.size(); ++i) {
        k8[i] = e4m3 ? FloatToF8E4M3(k[i] / ks) : FloatToF8E5M2(k[i] / ks);
        v8[i] = e4m3 ? FloatToF8E4M3(v[i] / vs) : FloatToF8E5M2(v[i] / vs);
        const double kd = e4m3 ? F8E4M3ToFloat(k8[i]) : F8E5M2ToFloat(k8[i]);
        const double vd = e4m3 ? F8E4M3ToFloat(v8[i]) : F8E5M2ToFloat(v8[i]);
        k[i] = static_cast<float>(kd * ks);  // (the reference's values, held in float)
        v[i] = static_cast<float>(vd * vs);
      }
      view = KvLayerView{k8.data(), v8.data(), head_stride, block, hd, dtype, ks, vs};
    }
  }
};

constexpr DType kAllKvDtypes[] = {DType::kF32, DType::kBF16, DType::kF8E4M3, DType::kF8E5M2};

TEST(AttentionTest, EveryPathMatchesFloat64AtModelHeadSizes) {
  const CpuIsa saved = ActiveCpuIsa();
  std::mt19937 rng(12);
  const int32_t block = 16, kv_heads = 2;
  const int64_t pool_tokens = 24 * block;
  for (CpuIsa isa : AvailableCpuIsas()) {
    SetActiveCpuIsa(isa);
    // bf16 and FP8 pools (--kv_dtype=bf16, fp8, fp8_e5m2) against float64 over the values they
    // hold.
    for (DType kv_dtype : kAllKvDtypes) {
      for (int32_t hd : {64, 128, 48, 40}) {
        std::vector<float> k = RandomVector(kv_heads * pool_tokens * hd, rng);
        std::vector<float> v = RandomVector(kv_heads * pool_tokens * hd, rng);
        const TestKv kv(k, v, pool_tokens * hd, block, hd, kv_dtype);
        const KvLayerView& view = kv.view;
        const KvRun runs[] = {{17, 3}, {2, 5}, {11, 1}, {7, 4}};  // 13 blocks = 208 tokens
        for (int32_t group : {1, 3, 8}) {
          for (int64_t seq_len : {1, 15, 16, 17, 100, 208}) {
            std::vector<float> q = RandomVector(group * hd, rng), out(group * hd);
            std::vector<float> scores(group * seq_len);
            const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
            AttendGroup(q.data(), group, view, 1, runs, 4, seq_len, scale, scores.data(),
                        out.data());
            for (int32_t g = 0; g < group; ++g) {
              std::vector<double> p(seq_len);
              double mx = -1e300, sum = 0;
              for (int64_t t = 0; t < seq_len; ++t) {
                const float* kt = k.data() + view.Offset(1, PhysicalToken(runs, 4, block, t));
                double dot = 0;
                for (int i = 0; i < hd; ++i) dot += static_cast<double>(q[g * hd + i]) * kt[i];
                mx = std::max(mx, p[t] = dot * scale);
              }
              for (double& x : p) sum += (x = std::exp(x - mx));
              for (int i = 0; i < hd; ++i) {
                double ref = 0;
                for (int64_t t = 0; t < seq_len; ++t) {
                  ref += p[t] / sum * v[view.Offset(1, PhysicalToken(runs, 4, block, t)) + i];
                }
                ASSERT_NEAR(out[g * hd + i], ref, 2e-5)
                    << CpuIsaName(isa) << " kv " << DTypeName(kv_dtype) << " hd=" << hd
                    << " group=" << group << " seq_len=" << seq_len << " head=" << g
                    << " i=" << i;
              }
            }
          }
        }
      }
    }
  }
  SetActiveCpuIsa(saved);
}

// Sliding-window attention (the last `window` positions, starting mid-block and mid-run) and
// Gemma 2's softcapping, on every path and KV dtype, against float64 over a fragmented run
// table: within 2e-5. A window no shorter than the history is the full attention, bit for bit;
// a run table that lacks whole blocks behind the window (released) gives the bits of the full one.
TEST(AttentionTest, WindowAndSoftcapMatchFloat64) {
  const CpuIsa saved = ActiveCpuIsa();
  std::mt19937 rng(21);
  const int32_t block = 16, kv_heads = 2, hd = 64, group = 2;
  const int64_t pool_tokens = 24 * block;
  for (CpuIsa isa : AvailableCpuIsas()) {
    SetActiveCpuIsa(isa);
    for (DType kv_dtype : kAllKvDtypes) {
      std::vector<float> k = RandomVector(kv_heads * pool_tokens * hd, rng);
      std::vector<float> v = RandomVector(kv_heads * pool_tokens * hd, rng);
      const TestKv kv(k, v, pool_tokens * hd, block, hd, kv_dtype);
      const KvRun runs[] = {{17, 3}, {2, 5}, {11, 1}, {7, 4}};  // 13 blocks = 208 tokens
      // gpt-oss's sinks: one logit a query head in the denominator, drawn as large as the
      // scores (they take a visible share of the weight).
      std::vector<float> sinks = RandomVector(group, rng);
      for (float& x : sinks) x *= 2;
      for (int64_t window : {1, 5, 16, 37, 100}) {
        for (float softcap : {0.0f, 0.5f}) {
          for (int64_t seq_len : {3, 48, 101, 208}) {
            for (const bool sink : {false, true}) {
              AttentionScoring scoring;
              scoring.scale = 0.125f;
              scoring.softcap = softcap;
              scoring.window = window;
              if (sink) scoring.sinks = sinks.data();
              std::vector<float> q = RandomVector(group * hd, rng), out(group * hd);
              std::vector<float> scores(group * seq_len);
              AttendGroup(q.data(), group, kv.view, 1, runs, 4, seq_len, scoring, scores.data(),
                          out.data());
              const int64_t first = std::max<int64_t>(0, seq_len - window);
              for (int32_t g = 0; g < group; ++g) {
                std::vector<double> p(seq_len - first);
                double mx = -1e300, sum = 0;
                for (int64_t t = first; t < seq_len; ++t) {
                  const float* kt = k.data() + kv.view.Offset(1, PhysicalToken(runs, 4, block, t));
                  double dot = 0;
                  for (int i = 0; i < hd; ++i) dot += static_cast<double>(q[g * hd + i]) * kt[i];
                  double s = dot * scoring.scale;
                  if (softcap > 0) s = softcap * std::tanh(s / softcap);
                  mx = std::max(mx, p[t - first] = s);
                }
                if (sink) mx = std::max(mx, static_cast<double>(sinks[g]));
                for (double& x : p) sum += (x = std::exp(x - mx));
                if (sink) sum += std::exp(sinks[g] - mx);
                for (int i = 0; i < hd; ++i) {
                  double ref = 0;
                  for (int64_t t = first; t < seq_len; ++t) {
                    ref += p[t - first] / sum *
                           v[kv.view.Offset(1, PhysicalToken(runs, 4, block, t)) + i];
                  }
                  ASSERT_NEAR(out[g * hd + i], ref, 2e-5)
                      << CpuIsaName(isa) << " kv " << DTypeName(kv_dtype) << " window=" << window
                      << " softcap=" << softcap << " seq_len=" << seq_len << " head=" << g
                      << " sink=" << sink;
                }
              }
              if (window >= seq_len && softcap == 0 && !sink) {
                std::vector<float> full(group * hd);
                AttendGroup(q.data(), group, kv.view, 1, runs, 4, seq_len, scoring.scale,
                            scores.data(), full.data());
                ASSERT_EQ(out, full) << "window " << window << " seq_len " << seq_len;
              }
              // The run table without whole blocks behind the window (released: the table
              // starts at their end) gives the same bits.
              for (int32_t released = 1; released * block <= seq_len - window; ++released) {
                std::vector<KvRun> kept;
                int32_t skip = released;
                for (const KvRun& r : runs) {
                  if (skip >= r.num_blocks) {
                    skip -= r.num_blocks;
                    continue;
                  }
                  kept.push_back({r.first_block + skip, r.num_blocks - skip});
                  skip = 0;
                }
                AttentionScoring trimmed = scoring;
                trimmed.released_tokens = int64_t{released} * block;
                std::vector<float> from_kept(group * hd);
                AttendGroup(q.data(), group, kv.view, 1, kept.data(),
                            static_cast<int32_t>(kept.size()), seq_len, trimmed, scores.data(),
                            from_kept.data());
                ASSERT_EQ(from_kept, out) << "window " << window << " seq_len " << seq_len
                                          << " released blocks " << released;
              }
            }
          }
        }
      }
    }
  }
  SetActiveCpuIsa(saved);
}

// StoreKv rounds to the pool's dtype (to nearest even for bf16); SummarizeBlock of a bf16 pool
// is the mean of the values it holds.
TEST(AttentionTest, Bf16PoolStoresRoundedAndSummarizesWhatItHolds) {
  std::mt19937 rng(31);
  const int32_t block = 8, hd = 24;
  const int64_t pool_tokens = 4 * block;
  std::vector<uint16_t> kb(2 * pool_tokens * hd), vb(kb.size());
  const KvLayerView view{kb.data(), vb.data(), pool_tokens * hd, block, hd, DType::kBF16};
  std::vector<std::vector<float>> keys, values;
  for (int32_t t = 0; t < block; ++t) {
    keys.push_back(RandomVector(hd, rng));
    values.push_back(RandomVector(hd, rng));
    StoreKv(view, 1, 2 * block + t, keys.back().data(), values.back().data());
  }
  std::vector<float> mk(hd), mv(hd);
  SummarizeBlock(view, 1, 2 * block, mk.data(), mv.data());
  for (int32_t i = 0; i < hd; ++i) {
    double sk = 0, sv = 0;
    for (int32_t t = 0; t < block; ++t) {
      const int64_t at = view.Offset(1, 2 * block + t) + i;
      ASSERT_EQ(kb[at], FloatToBf16(keys[t][i]));
      ASSERT_EQ(vb[at], FloatToBf16(values[t][i]));
      sk += Bf16ToFloat(kb[at]);
      sv += Bf16ToFloat(vb[at]);
    }
    EXPECT_NEAR(mk[i], sk / block, 1e-6);
    EXPECT_NEAR(mv[i], sv / block, 1e-6);
  }
  EXPECT_EQ(kb[view.Offset(0, 2 * block)], 0);  // head 0 untouched
}

// StoreKv into an FP8 pool holds key / k_scale and value / v_scale rounded to the nearest code,
// saturating at the format's largest finite value; SummarizeBlock is the mean of what it holds,
// scaled back. Error against the unquantized rows, measured: E4M3 at most 2^-4 of a value
// (3 mantissa bits, to nearest), E5M2 2^-3, for values in the formats' normal range.
TEST(AttentionTest, Fp8PoolStoresScaledRoundedAndSummarizesWhatItHolds) {
  std::mt19937 rng(32);
  const int32_t block = 8, hd = 32;
  const int64_t pool_tokens = 4 * block;
  for (DType dtype : {DType::kF8E4M3, DType::kF8E5M2}) {
    const bool e4m3 = dtype == DType::kF8E4M3;
    const float ks = 0.03f, vs = 0.007f;
    std::vector<uint8_t> kb(2 * pool_tokens * hd), vb(kb.size());
    const KvLayerView view{kb.data(), vb.data(), pool_tokens * hd, block, hd, dtype, ks, vs};
    auto decode = [&](uint8_t b) { return e4m3 ? F8E4M3ToFloat(b) : F8E5M2ToFloat(b); };
    std::vector<std::vector<float>> keys, values;
    for (int32_t t = 0; t < block; ++t) {
      keys.push_back(RandomVector(hd, rng));
      values.push_back(RandomVector(hd, rng));
      if (t == 3) keys.back()[5] = 1e4f;  // past 448 * 0.03: saturates, is not NaN or inf
      StoreKv(view, 1, 2 * block + t, keys.back().data(), values.back().data());
    }
    std::vector<float> mk(hd), mv(hd);
    SummarizeBlock(view, 1, 2 * block, mk.data(), mv.data());
    const double rel = e4m3 ? 0x1p-4 : 0x1p-3;
    for (int32_t i = 0; i < hd; ++i) {
      double sk = 0, sv = 0;
      for (int32_t t = 0; t < block; ++t) {
        const int64_t at = view.Offset(1, 2 * block + t) + i;
        const uint8_t want_k =
            e4m3 ? FloatToF8E4M3(keys[t][i] / ks) : FloatToF8E5M2(keys[t][i] / ks);
        ASSERT_EQ(kb[at], want_k) << t << " " << i;
        ASSERT_EQ(vb[at],
                  e4m3 ? FloatToF8E4M3(values[t][i] / vs) : FloatToF8E5M2(values[t][i] / vs));
        const double k_held = double{decode(kb[at])} * ks, v_held = double{decode(vb[at])} * vs;
        if (t == 3 && i == 5) {
          EXPECT_EQ(k_held, double{e4m3 ? 448.0f : 57344.0f} * ks);
        } else if (std::abs(keys[t][i]) > 0.05) {
          EXPECT_LE(std::abs(k_held - keys[t][i]), rel * std::abs(keys[t][i]) + 1e-7);
        }
        if (std::abs(values[t][i]) > 0.05) {
          EXPECT_LE(std::abs(v_held - values[t][i]), rel * std::abs(values[t][i]) + 1e-7);
        }
        sk += k_held;
        sv += v_held;
      }
      EXPECT_NEAR(mk[i], sk / block, 1e-5 * std::max(1.0, std::abs(sk / block)));
      EXPECT_NEAR(mv[i], sv / block, 1e-6);
    }
    EXPECT_EQ(kb[view.Offset(0, 2 * block)], 0);  // head 0 untouched
  }
}

// On every path the result does not depend on how the history is cut into runs: the same 100
// tokens attended through a fragmented run table and through one contiguous run give the same
// bits (a compaction must not change what a request generates).
TEST(AttentionTest, RunLayoutDoesNotChangeTheBits) {
  const CpuIsa saved = ActiveCpuIsa();
  std::mt19937 rng(13);
  const int32_t block = 4, hd = 64, group = 3;
  const int64_t pool_tokens = 64 * block, seq_len = 100;  // 25 blocks
  const KvRun fragmented[] = {{40, 3}, {1, 9}, {30, 2}, {12, 11}};
  const KvRun contiguous[] = {{0, 25}};
  std::vector<float> k = RandomVector(pool_tokens * hd, rng);
  std::vector<float> v = RandomVector(pool_tokens * hd, rng);
  // Copy the fragmented history's tokens, in logical order, to blocks 0..24 of a second pool.
  std::vector<float> k2(k.size()), v2(v.size());
  for (int64_t t = 0; t < seq_len; ++t) {
    const int64_t from = PhysicalToken(fragmented, 4, block, t);
    std::copy_n(&k[from * hd], hd, &k2[t * hd]);
    std::copy_n(&v[from * hd], hd, &v2[t * hd]);
  }
  KvLayerView a{k.data(), v.data(), pool_tokens * hd, block, hd};
  KvLayerView b{k2.data(), v2.data(), pool_tokens * hd, block, hd};
  std::vector<float> q = RandomVector(group * hd, rng);
  for (CpuIsa isa : AvailableCpuIsas()) {
    SetActiveCpuIsa(isa);
    std::vector<float> scores(group * seq_len), out_a(group * hd), out_b(group * hd);
    AttendGroup(q.data(), group, a, 0, fragmented, 4, seq_len, 0.125f, scores.data(),
                out_a.data());
    AttendGroup(q.data(), group, b, 0, contiguous, 1, seq_len, 0.125f, scores.data(),
                out_b.data());
    for (int i = 0; i < group * hd; ++i) {
      ASSERT_EQ(out_a[i], out_b[i]) << CpuIsaName(isa) << " i=" << i;
    }
  }
  SetActiveCpuIsa(saved);
}

// ---- far-history summaries ----------------------------------------------------------------------

// Physical blocks of a history's logical blocks -> run table of the kept ones: the first
// `sinks`, then those from sinks + dropped on.
std::vector<KvRun> KeptRuns(const std::vector<int32_t>& logical, int32_t sinks, int32_t dropped) {
  std::vector<KvRun> runs;
  for (size_t b = 0; b < logical.size(); ++b) {
    if (b >= static_cast<size_t>(sinks) && b < static_cast<size_t>(sinks + dropped)) continue;
    if (!runs.empty() && runs.back().first_block + runs.back().num_blocks == logical[b]) {
      ++runs.back().num_blocks;
    } else {
      runs.push_back(KvRun{logical[b], 1});
    }
  }
  return runs;
}

// The kernel over sinks + summaries + window against a float64 implementation of the same
// approximate computation (summaries as float64 means of the blocks' keys and values, score
// + log(block tokens)), on a shuffled pool, every combination of dropped blocks the engine
// produces (all summarized blocks freed, or the newest one still in the run table).
//
// Tolerance: the kernel keeps scores, softmax and sums in f32 (its exp is ~1 ulp), the
// reference in double, over <= 120 columns of N(0, 1) data: measured max |diff| ~2e-7 (printed);
// we allow 2e-6, while a wrong column (a summary without its log weight, an off-by-one block of
// the window) moves outputs by > 1e-2.
// Sinks, summaries and window against float64, over an f32 pool and a bf16 one (the reference
// reads the values the pool holds; summaries stay f32).
void FarHistoryMatchesFloat64(DType kv_dtype) {
  std::mt19937 rng(12);
  const int32_t block = 4, hd = 24, kv_heads = 2, group = 3, pool_blocks = 40;
  const int64_t pool_tokens = pool_blocks * block;
  std::vector<float> k = RandomVector(kv_heads * pool_tokens * hd, rng);
  std::vector<float> v = RandomVector(kv_heads * pool_tokens * hd, rng);
  const TestKv kv(k, v, pool_tokens * hd, block, hd, kv_dtype);
  const KvLayerView& view = kv.view;
  auto key = [&](int64_t head, int64_t phys) { return k.data() + view.Offset(head, phys); };
  auto value = [&](int64_t head, int64_t phys) { return v.data() + view.Offset(head, phys); };
  std::vector<int32_t> logical(pool_blocks);  // a shuffled pool: runs of 1-3 blocks
  for (int32_t b = 0; b < pool_blocks; ++b) logical[b] = b;
  for (int32_t b = 0; b + 3 < pool_blocks; b += 3) std::swap(logical[b], logical[b + 3]);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const double log_w = std::log(static_cast<double>(block));
  double max_err = 0;
  int cases = 0;
  struct Case {
    int64_t seq_len;
    int32_t sinks, summaries;
  };
  for (const Case c : {Case{33, 1, 3}, Case{57, 2, 5}, Case{160, 1, 30}, Case{158, 0, 36},
                       Case{121, 3, 1}, Case{80, 0, 1}}) {
    for (int32_t dropped : {c.summaries, c.summaries - 1, 0}) {
      const std::vector<KvRun> runs = KeptRuns(logical, c.sinks, dropped);
      const int32_t nr = static_cast<int32_t>(runs.size());
      for (int32_t h = 0; h < kv_heads; ++h) {
        std::vector<float> ks(c.summaries * hd), vs(c.summaries * hd);
        for (int32_t j = 0; j < c.summaries; ++j) {
          const int64_t first = int64_t{logical[c.sinks + j]} * block;
          SummarizeBlock(view, h, first, &ks[j * hd], &vs[j * hd]);
        }
        FarAttention far;
        far.sink_blocks = c.sinks;
        far.dropped = dropped;
        far.num_summaries = c.summaries;
        far.k_summary = ks.data();
        far.v_summary = vs.data();
        far.log_weight = static_cast<float>(log_w);
        std::vector<float> q = RandomVector(group * hd, rng), out(group * hd, NAN);
        std::vector<float> scores(group * c.seq_len);
        AttendGroupFar(q.data(), group, view, h, runs.data(), nr, c.seq_len, far, scale,
                       scores.data(), out.data());
        // Reference columns: (key, value, weight) in double over the logical history.
        std::vector<std::vector<double>> col_k, col_v;
        std::vector<double> col_bias;
        auto add_token = [&](int64_t t) {
          const int64_t phys = int64_t{logical[t / block]} * block + t % block;
          col_k.emplace_back(key(h, phys), key(h, phys) + hd);
          col_v.emplace_back(value(h, phys), value(h, phys) + hd);
          col_bias.push_back(0);
        };
        for (int64_t t = 0; t < int64_t{c.sinks} * block; ++t) add_token(t);
        for (int32_t j = 0; j < c.summaries; ++j) {
          std::vector<double> mk(hd, 0), mv(hd, 0);
          for (int32_t t = 0; t < block; ++t) {
            const int64_t phys = int64_t{logical[c.sinks + j]} * block + t;
            for (int32_t i = 0; i < hd; ++i) {
              mk[i] += key(h, phys)[i] / block;
              mv[i] += value(h, phys)[i] / block;
            }
          }
          col_k.push_back(mk);
          col_v.push_back(mv);
          col_bias.push_back(log_w);
        }
        for (int64_t t = int64_t{c.sinks + c.summaries} * block; t < c.seq_len; ++t) add_token(t);
        for (int32_t g = 0; g < group; ++g) {
          std::vector<double> p(col_k.size());
          double mx = -1e300, sum = 0;
          for (size_t j = 0; j < p.size(); ++j) {
            double dot = 0;
            for (int32_t i = 0; i < hd; ++i) dot += double{q[g * hd + i]} * col_k[j][i];
            p[j] = dot * scale + col_bias[j];
            mx = std::max(mx, p[j]);
          }
          for (double& x : p) sum += (x = std::exp(x - mx));
          for (int32_t i = 0; i < hd; ++i) {
            double ref = 0;
            for (size_t j = 0; j < p.size(); ++j) ref += p[j] / sum * col_v[j][i];
            const double err = std::abs(out[g * hd + i] - ref);
            max_err = std::max(max_err, std::isnan(err) ? 1e300 : err);
            ASSERT_NEAR(out[g * hd + i], ref, 2e-6)
                << "seq_len " << c.seq_len << " sinks " << c.sinks << " summaries "
                << c.summaries << " dropped " << dropped << " head " << h << " g " << g;
          }
        }
        ++cases;
      }
    }
  }
  std::printf("[far history, %s KV] %d cases: max |kernel - float64 reference| %.3g (tol 2e-6)\n",
              std::string(DTypeName(kv_dtype)).c_str(), cases, max_err);
}

TEST(AttentionTest, FarHistoryMatchesFloat64Reference) { FarHistoryMatchesFloat64(DType::kF32); }
TEST(AttentionTest, FarHistoryOverBf16KvMatchesFloat64Reference) {
  FarHistoryMatchesFloat64(DType::kBF16);
}
// FP8 pools: the summaries are means of the scaled values the pool holds.
TEST(AttentionTest, FarHistoryOverFp8KvMatchesFloat64Reference) {
  FarHistoryMatchesFloat64(DType::kF8E4M3);
  FarHistoryMatchesFloat64(DType::kF8E5M2);
}

// No summaries and nothing dropped: AttendGroupFar is AttendGroup, bit for bit (far history
// off, or on while a history is shorter than sinks + window).
TEST(AttentionTest, FarHistoryWithoutSummariesIsAttendGroup) {
  std::mt19937 rng(13);
  const int32_t block = 4, hd = 40, group = 2;
  const int64_t pool_tokens = 32 * block;
  std::vector<float> k = RandomVector(pool_tokens * hd, rng);
  std::vector<float> v = RandomVector(pool_tokens * hd, rng);
  KvLayerView view{k.data(), v.data(), pool_tokens * hd, block, hd};
  const KvRun runs[] = {{9, 2}, {2, 3}, {20, 1}, {14, 4}};
  FarAttention far;
  far.sink_blocks = 1;
  for (int64_t seq_len : {1, 17, 40}) {
    std::vector<float> q = RandomVector(group * hd, rng), a(group * hd), b(group * hd);
    std::vector<float> scores(group * seq_len);
    AttendGroup(q.data(), group, view, 0, runs, 4, seq_len, 0.2f, scores.data(), a.data());
    AttendGroupFar(q.data(), group, view, 0, runs, 4, seq_len, far, 0.2f, scores.data(),
                   b.data());
    for (int32_t i = 0; i < group * hd; ++i) ASSERT_EQ(a[i], b[i]) << seq_len << " " << i;
  }
}

TEST(AttentionTest, SummarizeBlockIsTheMean) {
  std::mt19937 rng(14);
  const int32_t block = 16, hd = 33;
  std::vector<float> k = RandomVector(2 * 8 * block * hd, rng);
  std::vector<float> v = RandomVector(2 * 8 * block * hd, rng);
  KvLayerView view{k.data(), v.data(), 8 * block * hd, block, hd};
  std::vector<float> ks(hd), vs(hd);
  SummarizeBlock(view, 1, 5 * block, ks.data(), vs.data());
  for (int32_t i = 0; i < hd; ++i) {
    double mk = 0, mv = 0;
    for (int32_t t = 0; t < block; ++t) {
      mk += view.KeyAt(1, 5 * block + t)[i];
      mv += view.ValueAt(1, 5 * block + t)[i];
    }
    EXPECT_NEAR(ks[i], mk / block, 1e-6);
    EXPECT_NEAR(vs[i], mv / block, 1e-6);
  }
}

// Many regions back to back (workers spinning) and regions after the workers fell asleep.
TEST(ThreadPoolTest, RunOnAllWakesSpinningAndSleepingWorkers) {
  ThreadPool pool(3);
  std::vector<int> runs(3, 0);
  for (int k = 0; k < 2000; ++k) pool.RunOnAll([&](int t) { ++runs[t]; });
  for (int k = 0; k < 3; ++k) {
    std::this_thread::sleep_for(std::chrono::microseconds(3 * ThreadPool::kSpinMicros));
    pool.RunOnAll([&](int t) { ++runs[t]; });
  }
  EXPECT_EQ(runs, std::vector<int>(3, 2003));
}

TEST(ThreadPoolTest, ParallelForCoversRangeOnce) {
  ThreadPool pool(3);
  for (int64_t n : {0, 1, 2, 7, 100, 1001}) {
    std::vector<int> hits(n, 0);
    pool.ParallelFor(n, 4, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) ++hits[i];
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i], 1) << "n=" << n << " i=" << i;
  }
}

}  // namespace
}  // namespace kvrm
