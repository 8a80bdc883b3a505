// The matmul kernel compiled for the generic instruction set (see matmul_impl.inc).
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "common/dtype.h"
#include "kernels/cpu/weight_matrix.h"

namespace kvrm {
namespace matmul_generic {
#include "kernels/cpu/matmul_impl.inc"
}  // namespace matmul_generic

void MatMulRows_generic(const float* x, int64_t n, int64_t ldx, const WeightMatrix& w,
                      int64_t row_begin, int64_t row_end, float* y, int64_t ldy, float* scratch) {
  matmul_generic::MatMulRowsImpl(x, n, ldx, w, row_begin, row_end, y, ldy, scratch);
}

}  // namespace kvrm
