// The matmul kernel for AVX-512 (F, BW, VL, DQ) with F16C: 16 lanes, 4 x 4 register tiles
// (16 of the 32 zmm registers hold accumulators). bf16 is widened exactly with a shift;
// vdpbf16ps is not used because it would round the activations to bf16.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common/dtype.h"
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
}  // namespace matmul_avx512

void MatMulRows_avx512(const float* x, int64_t n, int64_t ldx, const WeightMatrix& w,
                       int64_t row_begin, int64_t row_end, float* y, int64_t ldy, float* scratch) {
  matmul_avx512::MatMulRowsImpl(x, n, ldx, w, row_begin, row_end, y, ldy, scratch);
}

}  // namespace kvrm
