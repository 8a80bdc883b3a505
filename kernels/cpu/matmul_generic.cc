// The portable matmul kernel: an 8-lane vector of plain floats with element loops, which the
// compiler maps to whatever SIMD the baseline target has (SSE2 on x86-64, NEON on arm64).
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
namespace matmul_generic {

struct V {
  static constexpr int kLanes = 8;
  struct T {
    float v[kLanes];
  };
  static T Zero() { return T{}; }
  static T LoadF32(const float* p) {
    T t;
    std::memcpy(t.v, p, sizeof(t.v));
    return t;
  }
  static T LoadBf16(const uint16_t* p) {
    T t;
    for (int i = 0; i < kLanes; ++i) {
      const uint32_t bits = static_cast<uint32_t>(p[i]) << 16;
      std::memcpy(&t.v[i], &bits, 4);
    }
    return t;
  }
  static T LoadF16(const uint16_t* p) {
    T t;
    for (int i = 0; i < kLanes; ++i) t.v[i] = F16ToFloat(p[i]);
    return t;
  }
  static void StoreF32(float* p, T v) { std::memcpy(p, v.v, sizeof(v.v)); }
  static T Fma(T a, T b, T c) {
    for (int i = 0; i < kLanes; ++i) c.v[i] += a.v[i] * b.v[i];
    return c;
  }
  static float Sum(T v) {
    float s = 0;
    for (int i = 0; i < kLanes; ++i) s += v.v[i];
    return s;
  }
};
constexpr int kMaxActs = 2;

#include "kernels/cpu/matmul_impl.inc"
#include "kernels/cpu/matmul_q8_portable.inc"
#include "kernels/cpu/matmul_q4k_portable.inc"
}  // namespace matmul_generic

void MatMulRows_generic(const float* x, int64_t n, int64_t ldx, const WeightMatrix& w,
                        int64_t row_begin, int64_t row_end, float* y, int64_t ldy,
                        float* scratch) {
  if (WeightMatrix::IsKQuant(w.panel_format)) {
    return matmul_generic::KQuantPanelMatMul(x, n, ldx, w, row_begin, row_end, y, ldy, scratch);
  }
  if (WeightMatrix::IsQ8(w.panel_format)) {
    return matmul_generic::Q8PanelMatMul(x, n, ldx, w, row_begin, row_end, y, ldy, scratch);
  }
  matmul_generic::MatMulRowsImpl(x, n, ldx, w, row_begin, row_end, y, ldy, scratch);
}

}  // namespace kvrm
