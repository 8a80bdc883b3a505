// Q/K/V biases and the per-head Q/K RMSNorm (Qwen2, Qwen3, biased Llama) on the fused QKV
// product's rows, before RoPE: device kernel, checked launch wrapper. Launched only for models
// that have them; a plain Llama step launches nothing of this file.
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/llama_kernels.h"

namespace kvrm::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxPerLane = 4;  // head_dim up to 128

// One warp per (row, head), grid (heads / kWarps, rows): lane l holds elements l, l + 32, ... of
// the head in registers (coalesced: a warp reads 128 contiguous bytes at a time), adds the bias,
// and for a Q or K head with a norm sums the squares in f32 (a warp reduction, no barrier) and
// scales as the CPU's RmsNorm does (x * inv * w, inv = 1 / sqrt(mean + eps)).
__global__ void __launch_bounds__(kWarps * 32)
    QkvBiasAndNormKernel(float* __restrict__ qkv, int32_t heads, int32_t kv_heads, int32_t head_dim,
                         int32_t items, const float* __restrict__ bias,
                         const float* __restrict__ q_norm, const float* __restrict__ k_norm,
                         float eps) {
  const int32_t head = blockIdx.x * kWarps + threadIdx.x / 32;
  if (head >= items) return;  // the whole warp
  const int lane = threadIdx.x % 32;
  const int per = head_dim / 32;
  float* h = qkv + static_cast<int64_t>(blockIdx.y) * (heads + 2 * kv_heads) * head_dim +
             static_cast<int64_t>(head) * head_dim;
  const float* b = bias != nullptr ? bias + static_cast<int64_t>(head) * head_dim : nullptr;
  float v[kMaxPerLane];
#pragma unroll
  for (int j = 0; j < kMaxPerLane; ++j) {
    if (j < per) {
      v[j] = h[lane + 32 * j];
      if (b != nullptr) v[j] += b[lane + 32 * j];
    }
  }
  const float* w = head < heads ? q_norm : head < heads + kv_heads ? k_norm : nullptr;
  if (w != nullptr) {
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxPerLane; ++j) {
      if (j < per) ss += v[j] * v[j];
    }
    ss = WarpSum(ss);
    const float inv = 1.0f / sqrtf(ss / static_cast<float>(head_dim) + eps);
#pragma unroll
    for (int j = 0; j < kMaxPerLane; ++j) {
      if (j < per) v[j] = v[j] * inv * w[lane + 32 * j];
    }
  }
#pragma unroll
  for (int j = 0; j < kMaxPerLane; ++j) {
    if (j < per) h[lane + 32 * j] = v[j];
  }
}

}  // namespace

absl::Status LaunchQkvBiasAndNorm(float* qkv, int32_t rows, int32_t heads, int32_t kv_heads,
                                  int32_t head_dim, const float* bias, const float* q_norm,
                                  const float* k_norm, float eps, cudaStream_t stream) {
  if (rows <= 0 || heads <= 0 || kv_heads <= 0 || head_dim <= 0 || head_dim % 32 != 0 ||
      head_dim > 32 * kMaxPerLane) {
    return absl::InvalidArgumentError(
        "qkv_bias_norm: bad shape (head_dim a multiple of 32, <= 128)");
  }
  if ((q_norm == nullptr) != (k_norm == nullptr)) {
    return absl::InvalidArgumentError("qkv_bias_norm: Q and K norms come together");
  }
  if (bias == nullptr && q_norm == nullptr) {
    return absl::InvalidArgumentError("qkv_bias_norm: neither biases nor norms");
  }
  // V heads only carry a bias: without one the warps stop at the K heads.
  const int32_t items = bias != nullptr ? heads + 2 * kv_heads : heads + kv_heads;
  const dim3 grid((items + kWarps - 1) / kWarps, rows);
  QkvBiasAndNormKernel<<<grid, kWarps * 32, 0, stream>>>(qkv, heads, kv_heads, head_dim, items,
                                                         bias, q_norm, k_norm, eps);
  KVRM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace kvrm::cuda
