// A read-only weight matrix in its stored dtype, as Hugging Face stores nn.Linear weights:
// [rows = out_features][cols = in_features], row-major, rows `row_stride` elements apart.
//
// A matrix may also carry `panels`: a second copy of the same values laid out for the AVX-512
// kernels (PackPanels in matmul.h). Output rows go in groups of kPanelRows = 16, and each line
// of a panel holds the group's 16 rows at one column (f32, f16) or column pair (bf16):
//   f32, f16: panels[p * PanelStride() + c * 16 + l]         = W[16 p + l][c]
//   bf16:     panels[p * PanelStride() + q * 32 + l * 2 + e] = W[16 p + l][2 q + e]
// (zero past the last row or column). A line is what one FMA (vdpbf16ps for bf16) multiplies by
// a broadcast activation (pair) into 16 output sums, so the product needs no horizontal sums and
// reads the matrix front to back as one stream. Paths that do not use panels read `data`.
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
  const void* panels = nullptr;  // optional; 64-byte aligned

  static constexpr int64_t kPanelRows = 16;
  // Elements of one panel: 16 rows x cols (bf16: cols rounded up to a pair).
  int64_t PanelStride() const {
    return (dtype == DType::kBF16 ? (cols + 1) / 2 * 2 : cols) * kPanelRows;
  }
  const char* PanelPtr(int64_t p) const {
    return static_cast<const char*>(panels) + p * PanelStride() * DTypeSize(dtype);
  }

  const char* RowPtr(int64_t r) const {
    return static_cast<const char*>(data) + r * row_stride * DTypeSize(dtype);
  }
  // Rows [begin, begin + count) as a matrix (a tensor-parallel shard of the output features).
  // The panels come along when `begin` starts a panel.
  WeightMatrix RowSlice(int64_t begin, int64_t count) const {
    const void* sliced =
        panels != nullptr && begin % kPanelRows == 0 ? PanelPtr(begin / kPanelRows) : nullptr;
    return WeightMatrix{dtype, RowPtr(begin), count, cols, row_stride, sliced};
  }
  int64_t bytes() const { return rows * cols * static_cast<int64_t>(DTypeSize(dtype)); }
};

// Converts row r to float (embedding lookups, references).
void WeightRowToFloat(const WeightMatrix& w, int64_t r, float* out);

}  // namespace kvrm

#endif  // KVRM_KERNELS_CPU_WEIGHT_MATRIX_H_
