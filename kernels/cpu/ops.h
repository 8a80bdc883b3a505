// Elementwise and normalisation kernels of the Llama block, f32 activations.
#ifndef KVRM_KERNELS_CPU_OPS_H_
#define KVRM_KERNELS_CPU_OPS_H_

#include <cstdint>

#include "kernels/cpu/weight_matrix.h"

namespace kvrm {

// out[i] = x[i] / sqrt(mean(x^2) + eps) * weight[i] for one row of `dim` (HF LlamaRMSNorm:
// the mean is taken in f32, the weight applied after normalising). `weight` is a 1 x dim matrix.
// `weight_offset` is added to every weight first (Gemma's norms multiply by 1 + w); 0 leaves the
// result bit for bit as without it.
void RmsNorm(const float* x, const WeightMatrix& weight, int64_t dim, float eps, float* out,
             float weight_offset = 0);
// RmsNorm's two halves, for a norm whose mean spans ranks (OLMo 2's over every head of Q): the
// row's sum of squares (in double, a fixed order), and out[i] = x[i] * inv * (offset + w[i]).
double SumOfSquares(const float* x, int64_t dim);
void ScaleByNormWeight(const float* x, float inv, const WeightMatrix& weight, int64_t dim,
                       float* out, float weight_offset = 0);

// Rotary embedding in HF's rotate_half layout: pairs (i, i + head_dim/2). `cos_sin` holds
// [head_dim/2] cos values followed by [head_dim/2] sin values for this position.
void ApplyRope(float* heads, int64_t num_heads, int64_t head_dim, const float* cos_sin);

// out[i] = silu(gate[i]) * up[i].
void SiluMul(const float* gate, const float* up, int64_t n, float* out);

// out = gelu_tanh(gate) * up, GELU's tanh approximation (Gemma's gelu_pytorch_tanh):
// 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))), computed as g * sigmoid(2 * that argument).
void GeluTanhMul(const float* gate, const float* up, int64_t n, float* out);

// gpt-oss's clamped GLU (GptOssExperts): with g = min(gate, limit),
// out = (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g).
void ClampedSwiGluMul(const float* gate, const float* up, int64_t n, float limit, float alpha,
                      float* out);

// In-place softmax over n values; returns the max (for log-sum-exp users).
void SoftmaxInPlace(float* x, int64_t n);

// dst[i] += src[i].
void AddInPlace(float* dst, const float* src, int64_t n);
// dst[i] += scale * src[i] (Granite's residual multiplier).
void AddScaledInPlace(float* dst, const float* src, float scale, int64_t n);
// x[i] *= scale.
void ScaleInPlace(float* x, float scale, int64_t n);

// Gemma 2's softcapping in place: x = cap * tanh(x / cap), tanh as 1 - 2 / (exp(2|x|) + 1) with
// the sign restored (FastExp: within ~2e-7 of tanh absolutely, vectorisable, no libm call).
void SoftcapInPlace(float* x, float cap, int64_t n);

}  // namespace kvrm

#endif  // KVRM_KERNELS_CPU_OPS_H_
