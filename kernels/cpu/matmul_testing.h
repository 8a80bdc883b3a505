// Test helpers shared by the block-format matmul tests (q8_0_test, q4_k_test).
#ifndef KVRM_KERNELS_CPU_MATMUL_TESTING_H_
#define KVRM_KERNELS_CPU_MATMUL_TESTING_H_

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/thread_pool.h"

namespace kvrm {

// MatMul of `w` (with its panels) over n >= 8 random activation rows, row 7 holding a NaN, on
// `isa`: the generic path's bits exactly, NaN in row 7's outputs and nowhere else, and the same
// bits again when the rows go in batches of 1, 3, 8, 9 and 16 (a row's result does not depend on
// the batch it is in). Leaves the active path as it found it.
inline void ExpectSameBitsOnEveryPathAndBatch(CpuIsa isa, const WeightMatrix& w, int64_t n,
                                              std::mt19937& rng) {
  const int64_t rows = w.rows, cols = w.cols;
  ThreadPool pool(2);
  const CpuIsa saved = ActiveCpuIsa();
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(n * cols);
  for (float& v : x) v = dist(rng);
  x[7 * cols + 3] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> scratch(pool.num_threads() * MatMulScratchFloats(cols));
  SetActiveCpuIsa(CpuIsa::kGeneric);
  std::vector<float> generic(n * rows);
  MatMul(pool, x.data(), n, cols, w, generic.data(), rows, scratch.data());
  SetActiveCpuIsa(isa);
  std::vector<float> all(n * rows);
  MatMul(pool, x.data(), n, cols, w, all.data(), rows, scratch.data());
  for (int64_t i = 0; i < n * rows; ++i) {
    if (i / rows == 7) {
      ASSERT_TRUE(std::isnan(all[i])) << i;
      continue;
    }
    ASSERT_FALSE(std::isnan(all[i])) << i;
    ASSERT_EQ(all[i], generic[i]) << CpuIsaName(isa) << " at " << i / rows << "," << i % rows;
  }
  for (int64_t batch : {1, 3, 8, 9, 16}) {
    for (int64_t i0 = 0; i0 + batch <= n; i0 += 13) {
      std::vector<float> part(batch * rows);
      MatMul(pool, x.data() + i0 * cols, batch, cols, w, part.data(), rows, scratch.data());
      for (int64_t i = 0; i < batch * rows; ++i) {
        if (i0 + i / rows == 7) continue;
        ASSERT_EQ(part[i], all[i0 * rows + i])
            << CpuIsaName(isa) << " batch " << batch << " at row " << i0 + i / rows;
      }
    }
  }
  SetActiveCpuIsa(saved);
}

}  // namespace kvrm

#endif  // KVRM_KERNELS_CPU_MATMUL_TESTING_H_
