#include "kernels/cpu/lora.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/isa.h"

namespace kvrm {
namespace lora_avx512 {  // lora_avx512.cc, for T = float and uint16_t (bf16)
template <typename T>
void LoraShrink(const float* x, int64_t ldx, const int32_t* rows, int32_t n, const T* at,
                int64_t in, int32_t stride, float* mid);
template <typename T>
void LoraExpand(const float* mid, const int32_t* rows, int32_t n, int32_t rank, int32_t stride,
                const T* bt, int64_t out, int64_t begin, int64_t end, float* y, int64_t ldy);
}  // namespace lora_avx512

namespace {

bool UseAvx512() {
  const CpuIsa isa = ActiveCpuIsa();
  return isa == CpuIsa::kAvx512 || isa == CpuIsa::kAvx512Bf16;
}

inline float Widen(float v) { return v; }
inline float Widen(uint16_t bf16) {  // exact: a bf16 is a float's top half
  const uint32_t bits = uint32_t{bf16} << 16;
  float v;
  std::memcpy(&v, &bits, sizeof(v));
  return v;
}

// The other paths: a row at a time, each sum in order (axpys the compiler vectorises).
template <typename T>
void ShrinkPortable(const float* x, int64_t ldx, const int32_t* rows, int32_t n, const T* at,
                    int64_t in, int32_t stride, float* mid) {
  for (int32_t j = 0; j < n; ++j) {
    float* __restrict m = mid + int64_t{j} * stride;
    const float* xr = x + int64_t{rows[j]} * ldx;
    std::fill(m, m + stride, 0.0f);
    for (int64_t c = 0; c < in; ++c) {
      const float v = xr[c];
      const T* __restrict a = at + c * stride;
      for (int32_t k = 0; k < stride; ++k) m[k] += v * Widen(a[k]);
    }
  }
}

template <typename T>
void ExpandPortable(const float* mid, const int32_t* rows, int32_t n, int32_t rank, int32_t stride,
                    const T* bt, int64_t out, int64_t begin, int64_t end, float* y, int64_t ldy) {
  for (int32_t j = 0; j < n; ++j) {
    float* __restrict yr = y + int64_t{rows[j]} * ldy;
    for (int32_t k = 0; k < rank; ++k) {
      const float m = mid[int64_t{j} * stride + k];
      const T* __restrict b = bt + k * out;
      for (int64_t o = begin; o < end; ++o) yr[o] += m * Widen(b[o]);
    }
  }
}

template <typename T>
void Shrink(const float* x, int64_t ldx, const int32_t* rows, int32_t n, const T* at, int64_t in,
            int32_t rank_stride, float* mid) {
  if (n <= 0) return;
  if (UseAvx512()) return lora_avx512::LoraShrink(x, ldx, rows, n, at, in, rank_stride, mid);
  ShrinkPortable(x, ldx, rows, n, at, in, rank_stride, mid);
}

template <typename T>
void Expand(const float* mid, const int32_t* rows, int32_t n, int32_t rank, int32_t rank_stride,
            const T* bt, int64_t out, int64_t begin, int64_t end, float* y, int64_t ldy) {
  if (n <= 0 || begin >= end) return;
  if (UseAvx512()) {
    return lora_avx512::LoraExpand(mid, rows, n, rank, rank_stride, bt, out, begin, end, y, ldy);
  }
  ExpandPortable(mid, rows, n, rank, rank_stride, bt, out, begin, end, y, ldy);
}

}  // namespace

void LoraShrink(const float* x, int64_t ldx, const int32_t* rows, int32_t n, const float* at,
                int64_t in, int32_t rank_stride, float* mid) {
  Shrink(x, ldx, rows, n, at, in, rank_stride, mid);
}

void LoraShrink(const float* x, int64_t ldx, const int32_t* rows, int32_t n, const uint16_t* at,
                int64_t in, int32_t rank_stride, float* mid) {
  Shrink(x, ldx, rows, n, at, in, rank_stride, mid);
}

void LoraExpand(const float* mid, const int32_t* rows, int32_t n, int32_t rank, int32_t rank_stride,
                const float* bt, int64_t out, int64_t begin, int64_t end, float* y, int64_t ldy) {
  Expand(mid, rows, n, rank, rank_stride, bt, out, begin, end, y, ldy);
}

void LoraExpand(const float* mid, const int32_t* rows, int32_t n, int32_t rank, int32_t rank_stride,
                const uint16_t* bt, int64_t out, int64_t begin, int64_t end, float* y,
                int64_t ldy) {
  Expand(mid, rows, n, rank, rank_stride, bt, out, begin, end, y, ldy);
}

}  // namespace kvrm
