// The LoRA products (kernels/cpu/lora.h) for AVX-512, compiled with their own -m flags and called
// only where the processor has it (ActiveCpuIsa).
//
// Factors in f32 or bf16 (widened exactly as they are loaded: the same products).
// Shrink: a slab of A^T's columns (at most 16 KB) at a time; for it, every row in turn, four
// rows at once, each row's rank lanes in registers (up to 64 at once: independent chains), its
// sums carried over from the slab before through `mid`. Expand: 64 output columns at a time (B^T's
// slab of them, at most 16 KB at rank 64, stays in L1), every row in turn, four at once, each row's
// 64 columns in four registers, the ranks added in order. A row's sums are the same fused
// multiply-adds in the same order whatever rows share the call.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

namespace kvrm {
namespace lora_avx512 {
namespace {

constexpr int kLanes = 16;
constexpr int kRowGroup = 4;

// 16 factor values as floats (bf16 widened exactly), the lanes outside `mask` zero.
inline __m512 Load16(const float* p, __mmask16 mask = 0xffff) {
  return _mm512_maskz_loadu_ps(mask, p);
}
inline __m512 Load16(const uint16_t* p, __mmask16 mask = 0xffff) {
  const __m256i h = _mm256_maskz_loadu_epi16(mask, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// Rows rows[0, R) over A^T's columns [c0, c1) and rank lanes [k0, k0 + 16 KB): KB independent
// chains a row (one per 16 lanes), interleaved so that one row at a high rank is not bound by
// the multiply-add's latency.
template <int R, int KB, typename T>
inline void ShrinkGroup(const float* x, int64_t ldx, const int32_t* rows, const T* at,
                        int64_t c0, int64_t c1, int32_t stride, int32_t k0, float* mid) {
  const float* xr[R];
  __m512 acc[R][KB];
  for (int r = 0; r < R; ++r) {
    xr[r] = x + int64_t{rows[r]} * ldx;
    for (int b = 0; b < KB; ++b) {
      acc[r][b] = c0 == 0 ? _mm512_setzero_ps()
                          : _mm512_loadu_ps(mid + int64_t{r} * stride + k0 + b * kLanes);
    }
  }
  for (int64_t c = c0; c < c1; ++c) {
    for (int b = 0; b < KB; ++b) {
      const __m512 a = Load16(at + c * stride + k0 + b * kLanes);
      for (int r = 0; r < R; ++r) {
        acc[r][b] = _mm512_fmadd_ps(_mm512_set1_ps(xr[r][c]), a, acc[r][b]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int b = 0; b < KB; ++b) {
      _mm512_storeu_ps(mid + int64_t{r} * stride + k0 + b * kLanes, acc[r][b]);
    }
  }
}

template <int KB, typename T>
void ShrinkRows(const float* x, int64_t ldx, const int32_t* rows, int32_t n, const T* at,
                int64_t c0, int64_t c1, int32_t stride, int32_t k0, float* mid) {
  int32_t j = 0;
  for (; j + kRowGroup <= n; j += kRowGroup) {
    ShrinkGroup<kRowGroup, KB, T>(x, ldx, rows + j, at, c0, c1, stride, k0, mid + int64_t{j} * stride);
  }
  for (; j < n; ++j) {
    ShrinkGroup<1, KB, T>(x, ldx, rows + j, at, c0, c1, stride, k0, mid + int64_t{j} * stride);
  }
}

// Rows rows[0, R) over columns [o, o + 16 * B) (the last block masked by `tail`).
template <int R, int B, typename T>
inline void ExpandGroup(const float* mid, const int32_t* rows, int32_t rank, int32_t stride,
                        const T* bt, int64_t out, int64_t o, __mmask16 tail, float* y,
                        int64_t ldy) {
  float* yr[R];
  __m512 acc[R][B];
  for (int r = 0; r < R; ++r) {
    yr[r] = y + int64_t{rows[r]} * ldy + o;
    for (int b = 0; b < B; ++b) {
      acc[r][b] = _mm512_maskz_loadu_ps(b + 1 == B ? tail : 0xffff, yr[r] + b * kLanes);
    }
  }
  for (int32_t k = 0; k < rank; ++k) {
    const T* row = bt + k * out + o;
    for (int b = 0; b < B; ++b) {
      const __m512 v = Load16(row + b * kLanes, b + 1 == B ? tail : 0xffff);
      for (int r = 0; r < R; ++r) {
        acc[r][b] = _mm512_fmadd_ps(_mm512_set1_ps(mid[int64_t{r} * stride + k]), v, acc[r][b]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int b = 0; b < B; ++b) {
      _mm512_mask_storeu_ps(yr[r] + b * kLanes, b + 1 == B ? tail : 0xffff, acc[r][b]);
    }
  }
}

template <int B, typename T>
void ExpandRows(const float* mid, const int32_t* rows, int32_t n, int32_t rank, int32_t stride,
                const T* bt, int64_t out, int64_t o, __mmask16 tail, float* y, int64_t ldy) {
  int32_t j = 0;
  for (; j + kRowGroup <= n; j += kRowGroup) {
    ExpandGroup<kRowGroup, B, T>(mid + int64_t{j} * stride, rows + j, rank, stride, bt, out, o, tail,
                              y, ldy);
  }
  for (; j < n; ++j) {
    ExpandGroup<1, B, T>(mid + int64_t{j} * stride, rows + j, rank, stride, bt, out, o, tail, y, ldy);
  }
}

}  // namespace

// The entry points (kernels/cpu/lora.cc): for f32 factors and for bf16 ones.
template <typename T>
void LoraShrink(const float* x, int64_t ldx, const int32_t* rows, int32_t n, const T* at,
                int64_t in, int32_t stride, float* mid) {
  // Columns per slab: 16 KB of A^T.
  const int64_t slab = std::max<int64_t>(8, 16384 / (int64_t{stride} * int64_t{sizeof(T)}));
  for (int64_t c0 = 0; c0 < in; c0 += slab) {
    const int64_t c1 = std::min(in, c0 + slab);
    int32_t k0 = 0;
    for (; k0 + 4 * kLanes <= stride; k0 += 4 * kLanes) {
      ShrinkRows<4>(x, ldx, rows, n, at, c0, c1, stride, k0, mid);
    }
    for (; k0 + 2 * kLanes <= stride; k0 += 2 * kLanes) {
      ShrinkRows<2>(x, ldx, rows, n, at, c0, c1, stride, k0, mid);
    }
    for (; k0 < stride; k0 += kLanes) ShrinkRows<1>(x, ldx, rows, n, at, c0, c1, stride, k0, mid);
  }
}

template <typename T>
void LoraExpand(const float* mid, const int32_t* rows, int32_t n, int32_t rank, int32_t stride,
                const T* bt, int64_t out, int64_t begin, int64_t end, float* y, int64_t ldy) {
  constexpr int kBlocks = 4;
  int64_t o = begin;
  for (; o + kBlocks * kLanes <= end; o += kBlocks * kLanes) {
    ExpandRows<kBlocks>(mid, rows, n, rank, stride, bt, out, o, 0xffff, y, ldy);
  }
  for (; o < end; o += kLanes) {  // one block at a time, the last one masked
    const int64_t left = std::min<int64_t>(kLanes, end - o);
    ExpandRows<1>(mid, rows, n, rank, stride, bt, out, o, static_cast<__mmask16>((1u << left) - 1),
                  y, ldy);
  }
}

template void LoraShrink(const float*, int64_t, const int32_t*, int32_t, const float*, int64_t,
                         int32_t, float*);
template void LoraShrink(const float*, int64_t, const int32_t*, int32_t, const uint16_t*, int64_t,
                         int32_t, float*);
template void LoraExpand(const float*, const int32_t*, int32_t, int32_t, int32_t, const float*,
                         int64_t, int64_t, int64_t, float*, int64_t);
template void LoraExpand(const float*, const int32_t*, int32_t, int32_t, int32_t, const uint16_t*,
                         int64_t, int64_t, int64_t, float*, int64_t);

}  // namespace lora_avx512
}  // namespace kvrm
