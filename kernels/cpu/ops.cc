#include "kernels/cpu/ops.h"

#include <algorithm>
#include <cmath>

namespace kvrm {

void RmsNorm(const float* x, const WeightMatrix& weight, int64_t dim, float eps, float* out) {
  double ss = 0;  // double: dim up to 8192 squares summed without drift
  for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = 1.0f / std::sqrt(static_cast<float>(ss / dim) + eps);
  switch (weight.dtype) {
    case DType::kF32: {
      const float* w = static_cast<const float*>(weight.data);
      for (int64_t i = 0; i < dim; ++i) out[i] = x[i] * inv * w[i];
      break;
    }
    default:
      for (int64_t i = 0; i < dim; ++i) out[i] = x[i] * inv * WeightAt(weight, 0, i);
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

void SiluMul(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
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

}  // namespace kvrm
