// A read-only weight matrix in its stored dtype, as Hugging Face stores nn.Linear weights:
// [rows = out_features][cols = in_features], row-major, rows `row_stride` elements apart.
#ifndef KVRM_KERNELS_CPU_WEIGHT_MATRIX_H_
#define KVRM_KERNELS_CPU_WEIGHT_MATRIX_H_

#include <cstdint>

#include "common/dtype.h"

namespace kvrm {

struct WeightMatrix {
  DType dtype = DType::kF32;
  const void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_stride = 0;  // in elements; == cols when dense

  const char* RowPtr(int64_t r) const {
    return static_cast<const char*>(data) + r * row_stride * DTypeSize(dtype);
  }
  // Rows [begin, begin + count) as a matrix (a tensor-parallel shard of the output features).
  WeightMatrix RowSlice(int64_t begin, int64_t count) const {
    return WeightMatrix{dtype, RowPtr(begin), count, cols, row_stride};
  }
  int64_t bytes() const { return rows * cols * static_cast<int64_t>(DTypeSize(dtype)); }
};

// Converts row r to float (embedding lookups, references).
void WeightRowToFloat(const WeightMatrix& w, int64_t r, float* out);

}  // namespace kvrm

#endif  // KVRM_KERNELS_CPU_WEIGHT_MATRIX_H_
