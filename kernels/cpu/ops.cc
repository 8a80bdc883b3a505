#include "kernels/cpu/ops.h"

#include <algorithm>
#include <cmath>

#include "common/logging.h"
#include "kernels/cpu/fast_math.h"
#include "kernels/cpu/isa.h"

namespace kvrm {

namespace {

template <typename Widen>
inline void ScaleByWeight(const float* x, float inv, const Widen& w, float offset, int64_t dim,
                          float* out) {
  for (int64_t i = 0; i < dim; ++i) out[i] = x[i] * inv * (offset + w(i));
}

}  // namespace

KVRM_CPU_CLONES
double SumOfSquares(const float* x, int64_t dim) {
  // Squares summed in double (dim up to 8192 without drift), in 8 interleaved partial sums added
  // in a fixed order at the end: the loop vectorises, and the result does not depend on the row.
  constexpr int kLanes = 8;
  double acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= dim; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) acc[j] += static_cast<double>(x[i + j]) * x[i + j];
  }
  double ss = 0;
  for (int j = 0; j < kLanes; ++j) ss += acc[j];
  for (; i < dim; ++i) ss += static_cast<double>(x[i]) * x[i];
  return ss;
}

void RmsNorm(const float* x, const WeightMatrix& weight, int64_t dim, float eps, float* out,
             float weight_offset) {
  const double ss = SumOfSquares(x, dim);
  ScaleByNormWeight(x, 1.0f / std::sqrt(static_cast<float>(ss / dim) + eps), weight, dim, out,
                    weight_offset);
}

KVRM_CPU_CLONES
void ScaleByNormWeight(const float* x, float inv, const WeightMatrix& weight, int64_t dim,
                       float* out, float weight_offset) {
  switch (weight.dtype) {
    case DType::kF32: {
      const float* w = static_cast<const float*>(weight.data);
      ScaleByWeight(
          x, inv, [w](int64_t k) { return w[k]; }, weight_offset, dim, out);
      break;
    }
    case DType::kBF16: {
      const uint16_t* w = static_cast<const uint16_t*>(weight.data);
      ScaleByWeight(
          x, inv, [w](int64_t k) { return Bf16ToFloat(w[k]); }, weight_offset, dim, out);
      break;
    }
    case DType::kF16: {
      const uint16_t* w = static_cast<const uint16_t*>(weight.data);
      ScaleByWeight(
          x, inv, [w](int64_t k) { return F16ToFloat(w[k]); }, weight_offset, dim, out);
      break;
    }
    case DType::kF8E4M3:
    case DType::kF8E5M2:  // KV cache types only
      LOG(FATAL) << "no " << DTypeName(weight.dtype) << " norm weights";
  }
}

void ApplyRope(float* heads, int64_t num_heads, int64_t head_dim, const float* cos_sin) {
  const int64_t half = head_dim / 2;
  const float* c = cos_sin;
  const float* s = cos_sin + half;
  for (int64_t h = 0; h < num_heads; ++h) {
    float* v = heads + h * head_dim;
    for (int64_t i = 0; i < half; ++i) {
      const float a = v[i], b = v[i + half];
      v[i] = a * c[i] - b * s[i];
      v[i + half] = b * c[i] + a * s[i];
    }
  }
}

KVRM_CPU_CLONES
void SiluMul(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + FastExp(-g)) * up[i];
  }
}

KVRM_CPU_CLONES
void ClampedSwiGluMul(const float* gate, const float* up, int64_t n, float limit, float alpha,
                      float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = std::min(gate[i], limit);
    const float u = std::min(std::max(up[i], -limit), limit);
    out[i] = g / (1.0f + FastExp(-alpha * g)) * (u + 1.0f);
  }
}

KVRM_CPU_CLONES
void GeluTanhMul(const float* gate, const float* up, int64_t n, float* out) {
  constexpr float kTwoSqrt2OverPi = 1.5957691216057308f;  // 2 sqrt(2 / pi)
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    const float z = kTwoSqrt2OverPi * (g + 0.044715f * g * g * g);
    out[i] = g / (1.0f + FastExp(-z)) * up[i];
  }
}

void SoftmaxInPlace(float* x, int64_t n) {
  float mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, x[i]);
  float sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = 1.0f / sum;
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void AddInPlace(float* dst, const float* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

void AddScaledInPlace(float* dst, const float* src, float scale, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] += scale * src[i];
}

KVRM_CPU_CLONES
void SoftcapInPlace(float* x, float cap, int64_t n) {
  const float inv2 = 2.0f / cap;
  for (int64_t i = 0; i < n; ++i) {
    const float t = 1.0f - 2.0f / (FastExp(std::fabs(x[i]) * inv2) + 1.0f);  // tanh(|x| / cap)
    x[i] = std::copysign(cap * t, x[i]);
  }
}

void ScaleInPlace(float* x, float scale, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= scale;
}

}  // namespace kvrm
