#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <cstring>

#include "common/logging.h"

namespace kvrm {

// Defined in matmul_{generic,avx2,avx512}.cc, each compiled with its own -m flags.
void MatMulRows_generic(const float*, int64_t, int64_t, const WeightMatrix&, int64_t, int64_t,
                        float*, int64_t, float*);
void MatMulRows_avx2(const float*, int64_t, int64_t, const WeightMatrix&, int64_t, int64_t,
                     float*, int64_t, float*);
void MatMulRows_avx512(const float*, int64_t, int64_t, const WeightMatrix&, int64_t, int64_t,
                       float*, int64_t, float*);
void MatMulRows_avx512_bf16(const float*, int64_t, int64_t, const WeightMatrix&, int64_t,
                            int64_t, float*, int64_t, float*);
int64_t MatMulScratchFloats_avx512_bf16(int64_t cols);

int64_t MatMulScratchFloats(int64_t cols) {
  // Enough for every path, so a caller may switch paths (tests and benchmarks do).
  return std::max<int64_t>(4 * cols + 16, MatMulScratchFloats_avx512_bf16(cols));
}

void MatMulRows(CpuIsa isa, const float* x, int64_t n, int64_t ldx, const WeightMatrix& w,
                int64_t row_begin, int64_t row_end, float* y, int64_t ldy, float* scratch) {
  switch (isa) {
    case CpuIsa::kGeneric:
      return MatMulRows_generic(x, n, ldx, w, row_begin, row_end, y, ldy, scratch);
    case CpuIsa::kAvx2:
      return MatMulRows_avx2(x, n, ldx, w, row_begin, row_end, y, ldy, scratch);
    case CpuIsa::kAvx512:
      return MatMulRows_avx512(x, n, ldx, w, row_begin, row_end, y, ldy, scratch);
    case CpuIsa::kAvx512Bf16:
      return MatMulRows_avx512_bf16(x, n, ldx, w, row_begin, row_end, y, ldy, scratch);
  }
  LOG(FATAL) << "unsupported instruction set " << static_cast<int>(isa);
}

void MatMulShareBounds(int64_t rows, int thread, int num_threads, int64_t* begin, int64_t* end) {
  constexpr int64_t kGroup = WeightMatrix::kPanelRows;
  const int64_t groups = (rows + kGroup - 1) / kGroup;
  *begin = std::min(rows, groups * thread / num_threads * kGroup);
  *end = std::min(rows, groups * (thread + 1) / num_threads * kGroup);
}

void MatMulShare(CpuIsa isa, const float* x, int64_t n, int64_t ldx, const WeightMatrix& w,
                 float* y, int64_t ldy, int thread, int num_threads, float* scratch) {
  int64_t begin, end;
  MatMulShareBounds(w.rows, thread, num_threads, &begin, &end);
  if (begin < end) MatMulRows(isa, x, n, ldx, w, begin, end, y, ldy, scratch);
}

void MatMul(ThreadPool& pool, const float* x, int64_t n, int64_t ldx, const WeightMatrix& w,
            float* y, int64_t ldy, float* scratch) {
  const CpuIsa isa = ActiveCpuIsa();
  const int64_t per_thread = MatMulScratchFloats(w.cols);
  pool.RunOnAll([&](int t) {
    MatMulShare(isa, x, n, ldx, w, y, ldy, t, pool.num_threads(), scratch + t * per_thread);
  });
}

int64_t PanelBytes(const WeightMatrix& w) {
  return (w.rows + WeightMatrix::kPanelRows - 1) / WeightMatrix::kPanelRows * w.PanelStride() *
         static_cast<int64_t>(DTypeSize(w.dtype));
}

namespace {

// kPerLine columns of the group's 16 rows per line: 2 for bf16 (vdpbf16ps pairs), else 1.
template <typename Elem, int64_t kPerLine>
void PackPanelsOf(const WeightMatrix& w, Elem* out) {
  constexpr int64_t kGroup = WeightMatrix::kPanelRows;
  const int64_t stride = w.PanelStride();
  std::memset(out, 0, PanelBytes(w));
  for (int64_t r = 0; r < w.rows; ++r) {
    const Elem* row = reinterpret_cast<const Elem*>(w.RowPtr(r));
    Elem* lane = out + r / kGroup * stride + r % kGroup * kPerLine;
    for (int64_t c = 0; c < w.cols; ++c) {
      lane[c / kPerLine * kGroup * kPerLine + c % kPerLine] = row[c];
    }
  }
}

}  // namespace

void PackPanels(const WeightMatrix& w, void* out) {
  switch (w.dtype) {
    case DType::kF32: return PackPanelsOf<float, 1>(w, static_cast<float*>(out));
    case DType::kF16: return PackPanelsOf<uint16_t, 1>(w, static_cast<uint16_t*>(out));
    case DType::kBF16: return PackPanelsOf<uint16_t, 2>(w, static_cast<uint16_t*>(out));
  }
}

PanelCopy::PanelCopy(const WeightMatrix& w)
    : memory_(new uint8_t[PanelBytes(w) + 64]), bytes_(PanelBytes(w)) {  // PackPanels fills it
  data_ = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(memory_.get()) + 63) / 64 * 64);
  PackPanels(w, data_);
}

void WeightRowToFloat(const WeightMatrix& w, int64_t r, float* out) {
  const char* row = w.RowPtr(r);
  switch (w.dtype) {
    case DType::kF32:
      std::memcpy(out, row, w.cols * sizeof(float));
      return;
    case DType::kF16:
      for (int64_t i = 0; i < w.cols; ++i) {
        out[i] = F16ToFloat(reinterpret_cast<const uint16_t*>(row)[i]);
      }
      return;
    case DType::kBF16:
      for (int64_t i = 0; i < w.cols; ++i) {
        out[i] = Bf16ToFloat(reinterpret_cast<const uint16_t*>(row)[i]);
      }
      return;
  }
}

}  // namespace kvrm
