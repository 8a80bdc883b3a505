// The matmul kernel for AVX2 + FMA + F16C: 8 lanes, 4 x 2 register tiles (8 of the 16 ymm
// registers hold accumulators, leaving room for 4 weight vectors and an activation).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common/dtype.h"
#include "kernels/cpu/q4_k.h"
#include "kernels/cpu/q8_0.h"
#include "kernels/cpu/weight_matrix.h"

namespace kvrm {
namespace matmul_avx2 {

struct V {
  using T = __m256;
  static constexpr int kLanes = 8;
  static T Zero() { return _mm256_setzero_ps(); }
  static T LoadF32(const float* p) { return _mm256_loadu_ps(p); }
  static T LoadBf16(const uint16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static T LoadF16(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static void StoreF32(float* p, T v) { _mm256_storeu_ps(p, v); }
  static T Fma(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static float Sum(T v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
};
constexpr int kMaxActs = 2;

#include "kernels/cpu/matmul_impl.inc"
#include "kernels/cpu/matmul_q8_portable.inc"
#include "kernels/cpu/matmul_q4k_portable.inc"
}  // namespace matmul_avx2

void MatMulRows_avx2(const float* x, int64_t n, int64_t ldx, const WeightMatrix& w,
                     int64_t row_begin, int64_t row_end, float* y, int64_t ldy, float* scratch) {
  if (WeightMatrix::IsKQuant(w.panel_format)) {
    return matmul_avx2::KQuantPanelMatMul(x, n, ldx, w, row_begin, row_end, y, ldy, scratch);
  }
  if (WeightMatrix::IsQ8(w.panel_format)) {
    return matmul_avx2::Q8PanelMatMul(x, n, ldx, w, row_begin, row_end, y, ldy, scratch);
  }
  matmul_avx2::MatMulRowsImpl(x, n, ldx, w, row_begin, row_end, y, ldy, scratch);
}

}  // namespace kvrm
