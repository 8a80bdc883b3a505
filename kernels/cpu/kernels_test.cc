// CPU kernels against float64 references on random shapes (odd sizes, not multiples of the
// vector width), for each weight dtype and each instruction set this processor runs.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
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

TEST_P(MatMulTest, MatchesFloat64Reference) {
  const auto [isa, dtype] = GetParam();
  std::mt19937 rng(1234 + static_cast<int>(isa) * 7 + static_cast<int>(dtype));
  ThreadPool pool(2);
  const CpuIsa saved = ActiveCpuIsa();
  SetActiveCpuIsa(isa);
  struct Shape { int64_t n, rows, cols; };
  // Decode-sized n (in-register widening), prefill-sized n (widened tiles), several L2 activation
  // blocks (70 rows of 4099), short row tiles and k tails shorter than a vector.
  for (Shape s : {Shape{1, 1, 1}, Shape{1, 7, 13}, Shape{3, 33, 31}, Shape{5, 130, 257},
                  Shape{16, 67, 768}, Shape{2, 5, 1000}, Shape{4, 6, 23}, Shape{70, 9, 4099},
                  Shape{33, 13, 129}}) {
    StoredMatrix w = RandomMatrix(dtype, s.rows, s.cols, rng);
    std::vector<float> x = RandomVector(s.n * s.cols, rng);
    std::vector<float> y(s.n * s.rows, NAN);
    std::vector<float> scratch(pool.num_threads() * MatMulScratchFloats(s.cols));
    MatMul(pool, x.data(), s.n, s.cols, w.view, y.data(), s.rows, scratch.data());
    for (int64_t i = 0; i < s.n; ++i) {
      for (int64_t r = 0; r < s.rows; ++r) {
        double ref = 0, mag = 0;
        for (int64_t c = 0; c < s.cols; ++c) {
          ref += static_cast<double>(x[i * s.cols + c]) * w.exact[r * s.cols + c];
          mag += std::abs(x[i * s.cols + c] * w.exact[r * s.cols + c]);
        }
        // f32 accumulation: error bounded by ~cols * eps * sum|terms|; 1e-6 relative to the
        // magnitude sum is well inside that for these sizes.
        ASSERT_NEAR(y[i * s.rows + r], ref, 2e-6 * mag + 1e-6)
            << "isa=" << CpuIsaName(isa) << " dtype=" << DTypeName(dtype) << " n=" << s.n
            << " rows=" << s.rows << " cols=" << s.cols << " at " << i << "," << r;
      }
    }
  }
  SetActiveCpuIsa(saved);
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
