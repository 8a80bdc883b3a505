// The matmul kernel compiled for the avx512 instruction set (see matmul_impl.inc).
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "common/dtype.h"
#include "kernels/cpu/weight_matrix.h"

namespace kvrm {
namespace matmul_avx512 {
#include "kernels/cpu/matmul_impl.inc"
}  // namespace matmul_avx512

void MatMulRows_avx512(const float* x, int64_t n, int64_t ldx, const WeightMatrix& w,
                      int64_t row_begin, int64_t row_end, float* y, int64_t ldy, float* scratch) {
  matmul_avx512::MatMulRowsImpl(x, n, ldx, w, row_begin, row_end, y, ldy, scratch);
}

}  // namespace kvrm
