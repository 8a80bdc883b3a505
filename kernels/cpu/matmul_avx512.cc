// The matmul kernel for AVX-512 (F, BW, VL, DQ) with F16C: 16 lanes, 4 x 4 register tiles
// (16 of the 32 zmm registers hold accumulators). bf16 is widened exactly with a shift;
// vdpbf16ps is not used because it would round the activations to bf16.
//
// f32 and f16 weights with panels (WeightMatrix::panels, packed by the CPU backend at load time)
// take the panel kernel below instead: each line (64 bytes; 32 for f16, widened with vcvtph2ps)
// holds one column of a 16-row group, and one FMA against the broadcast activation adds it into
// the group's 16 output sums (up to 12
// activation rows per pass; no horizontal sums; the matrix read front to back with the next
// panel prefetched), as the bf16 panels in matmul_avx512_bf16.cc.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common/dtype.h"
#include "kernels/cpu/q4_k.h"
#include "kernels/cpu/q8_0.h"
#include "kernels/cpu/weight_matrix.h"

namespace kvrm {
namespace matmul_avx512 {

struct V {
  using T = __m512;
  static constexpr int kLanes = 16;
  static T Zero() { return _mm512_setzero_ps(); }
  static T LoadF32(const float* p) { return _mm512_loadu_ps(p); }
  static T LoadBf16(const uint16_t* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static T LoadF16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static void StoreF32(float* p, T v) { _mm512_storeu_ps(p, v); }
  static T Fma(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  static float Sum(T v) { return _mm512_reduce_add_ps(v); }
};
constexpr int kMaxActs = 4;

#include "kernels/cpu/matmul_impl.inc"

constexpr int64_t kGroup = WeightMatrix::kPanelRows;
// Activation rows per pass, and two chains per output (even and odd columns), as the bf16 panel
// kernel: one FMA latency per two lines for a single row, and the same sums whatever the pass.
constexpr int kPassRows = 12;

// One line of a panel widened to f32: 16 floats, or 16 halves (f16 panels, 32 bytes a line).
inline __m512 LoadLine(const float* line) { return _mm512_load_ps(line); }
inline __m512 LoadLine(const uint16_t* line) {
  return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(line)));
}

// y[i * ldy + l] = sum over c < k of panel[c][l] * x[i * ldx + c] for l < nr; `ahead` elements
// past each line are prefetched (the next panel), 0 for none.
template <int R, typename Elem>
inline void PanelTile(const Elem* panel, int64_t k, const float* x, int64_t ldx, float* y,
                      int64_t ldy, int nr, int64_t ahead) {
  __m512 even[R], odd[R];
#pragma GCC unroll 16
  for (int i = 0; i < R; ++i) even[i] = odd[i] = _mm512_setzero_ps();
  int64_t c = 0;
  for (; c + 2 <= k; c += 2) {
    const Elem* line = panel + c * kGroup;
    if (ahead != 0) {
      __builtin_prefetch(line + ahead, 0, 0);
      __builtin_prefetch(line + kGroup + ahead, 0, 0);
    }
    const __m512 w0 = LoadLine(line), w1 = LoadLine(line + kGroup);
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i) {
      even[i] = _mm512_fmadd_ps(w0, _mm512_set1_ps(x[i * ldx + c]), even[i]);
      odd[i] = _mm512_fmadd_ps(w1, _mm512_set1_ps(x[i * ldx + c + 1]), odd[i]);
    }
  }
  if (c < k) {
    const __m512 w0 = LoadLine(panel + c * kGroup);
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i) {
      even[i] = _mm512_fmadd_ps(w0, _mm512_set1_ps(x[i * ldx + c]), even[i]);
    }
  }
  const __mmask16 mask = static_cast<__mmask16>((1u << nr) - 1);
#pragma GCC unroll 16
  for (int i = 0; i < R; ++i) {
    _mm512_mask_storeu_ps(y + i * ldy, mask, _mm512_add_ps(even[i], odd[i]));
  }
}

#include "kernels/cpu/matmul_panels.inc"

// q8_0 panels: vpmaddwd + vpaddd (AVX512BW).
inline __m512i Q8Dot(__m512i acc, __m512i w, __m512i x) {
  return _mm512_add_epi32(acc, _mm512_madd_epi16(w, x));
}
#include "kernels/cpu/matmul_q8_avx512.inc"

// q4_K panels: vpmaddubsw + vpmaddwd + vpaddd (AVX512BW).
inline __m512i Q4Dot(__m512i acc, __m512i w, __m512i x) {
  return _mm512_add_epi32(
      acc, _mm512_madd_epi16(_mm512_maddubs_epi16(w, x), _mm512_set1_epi16(1)));
}
#include "kernels/cpu/matmul_q4k_avx512.inc"

// Rows [row_begin, row_end) from the f32 or f16 panels; row_begin starts a panel.
template <typename Elem>
void PanelMatMul(const float* x, int64_t n, int64_t ldx, const WeightMatrix& w, int64_t row_begin,
                 int64_t row_end, float* y, int64_t ldy) {
  const int64_t k = w.cols;
  const int64_t block = std::max<int64_t>(kGroup, kActBlockBytes / (k * 4) / kGroup * kGroup);
  PanelMatMulBlocks<Elem>(
      w, n, block, k, ldx, [&](int64_t i0, int64_t) { return x + i0 * ldx; }, row_begin, row_end,
      y, ldy);
}

}  // namespace matmul_avx512

void MatMulRows_avx512(const float* x, int64_t n, int64_t ldx, const WeightMatrix& w,
                       int64_t row_begin, int64_t row_end, float* y, int64_t ldy, float* scratch) {
  if (WeightMatrix::IsKQuant(w.panel_format)) {
    return matmul_avx512::KQuantPanelMatMul(x, n, ldx, w, row_begin, row_end, y, ldy, scratch);
  }
  if (WeightMatrix::IsQ8(w.panel_format)) {
    return matmul_avx512::Q8PanelMatMul(x, n, ldx, w, row_begin, row_end, y, ldy, scratch);
  }
  if (w.panels != nullptr && row_begin % WeightMatrix::kPanelRows == 0) {
    if (w.dtype == DType::kF32) {
      return matmul_avx512::PanelMatMul<float>(x, n, ldx, w, row_begin, row_end, y, ldy);
    }
    if (w.dtype == DType::kF16) {
      return matmul_avx512::PanelMatMul<uint16_t>(x, n, ldx, w, row_begin, row_end, y, ldy);
    }
  }
  matmul_avx512::MatMulRowsImpl(x, n, ldx, w, row_begin, row_end, y, ldy, scratch);
}

}  // namespace kvrm
