// Embedding, RMSNorm (also after a bias add) and SwiGLU: device template, checked launch
// wrapper, explicit instantiations.
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/llama_kernels.h"

namespace kvrm::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void EmbedKernel(const bf16* __restrict__ embed, StepInputs in, int32_t hidden,
                            float* __restrict__ x) {
  const int32_t row = blockIdx.x;
  const int64_t token = in.active[row] ? in.token[row] : 0;
  const bf16* src = embed + token * hidden;
  float* dst = x + static_cast<int64_t>(row) * hidden;
  for (int32_t i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = __bfloat162float(src[i]);
}

// One warp per row (no block barrier: the step's norms are 64-row, latency-bound launches).
// kVec: dim % 4 == 0, so each lane moves 4 elements at a time (16-byte x loads).
constexpr int kNormWarps = 4;

template <typename Out>
__device__ __forceinline__ void Store4(Out* dst, float a, float b, float c, float d);
template <>
__device__ __forceinline__ void Store4<float>(float* dst, float a, float b, float c, float d) {
  *reinterpret_cast<float4*>(dst) = make_float4(a, b, c, d);
}
template <>
__device__ __forceinline__ void Store4<bf16>(bf16* dst, float a, float b, float c, float d) {
  __nv_bfloat162 lo = __floats2bfloat162_rn(a, b), hi = __floats2bfloat162_rn(c, d);
  uint2 w;
  w.x = *reinterpret_cast<unsigned int*>(&lo);
  w.y = *reinterpret_cast<unsigned int*>(&hi);
  *reinterpret_cast<uint2*>(dst) = w;
}

// The second pass of a norm: dst = row * inv * weight over the lane's elements of the first
// pass (a lane reads back only what it read, or wrote, itself). `row` is not __restrict__: the
// bias kernel has just written it, so its loads must not take the read-only path.
template <typename Out, bool kVec>
__device__ __forceinline__ void ScaleRow(const float* row, const bf16* __restrict__ weight,
                                         Out* __restrict__ dst, int32_t dim, float inv, int lane) {
  if constexpr (kVec) {
#pragma unroll 4
    for (int32_t i = lane * 4; i < dim; i += 128) {
      const float4 v = *reinterpret_cast<const float4*>(row + i);
      const uint2 w = *reinterpret_cast<const uint2*>(weight + i);
      float wf[4];
      WidenBf16x2(w.x, wf);
      WidenBf16x2(w.y, wf + 2);
      Store4<Out>(dst + i, v.x * inv * wf[0], v.y * inv * wf[1], v.z * inv * wf[2],
                  v.w * inv * wf[3]);
    }
  } else {
    for (int32_t i = lane; i < dim; i += 32) {
      dst[i] = FromFloat<Out>(row[i] * inv * __bfloat162float(weight[i]));
    }
  }
}

template <typename Out, bool kVec>
__global__ void __launch_bounds__(kNormWarps * 32)
    RmsNormKernel(const float* __restrict__ x, const bf16* __restrict__ weight,
                  Out* __restrict__ out, int32_t rows, int32_t dim, float eps,
                  const int32_t* __restrict__ row_select) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t r = blockIdx.x * kNormWarps + warp;
  if (r >= rows) return;
  const int64_t src_row = row_select ? *row_select : r;
  const float* row = x + src_row * dim;
  Out* dst = out + static_cast<int64_t>(r) * dim;
  float ss = 0.0f;
  // Unrolled: the loads of a row (6 a lane at dim 768) go out together, not one per trip.
  if constexpr (kVec) {
#pragma unroll 4
    for (int32_t i = lane * 4; i < dim; i += 128) {
      const float4 v = *reinterpret_cast<const float4*>(row + i);
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
  } else {
#pragma unroll 4
    for (int32_t i = lane; i < dim; i += 32) ss += row[i] * row[i];
  }
  ss = WarpSum(ss);
  const float inv = rsqrtf(ss / dim + eps);
  ScaleRow<Out, kVec>(row, weight, dst, dim, inv, lane);
}

// RmsNormKernel (bf16 out) with a bias added to each row first and kept: x[r] += bias, written
// back, then normalised. The O projection's bias, once the all-reduce has summed the ranks'
// partials onto the residual: no launch of its own.
template <bool kVec>
__global__ void __launch_bounds__(kNormWarps * 32)
    AddBiasRmsNormKernel(float* __restrict__ x, const float* __restrict__ bias,
                         const bf16* __restrict__ weight, bf16* __restrict__ out, int32_t rows,
                         int32_t dim, float eps) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t r = blockIdx.x * kNormWarps + warp;
  if (r >= rows) return;
  float* row = x + static_cast<int64_t>(r) * dim;
  float ss = 0.0f;
  if constexpr (kVec) {
#pragma unroll 4
    for (int32_t i = lane * 4; i < dim; i += 128) {
      float4 v = *reinterpret_cast<const float4*>(row + i);
      const float4 b = *reinterpret_cast<const float4*>(bias + i);
      v.x += b.x;
      v.y += b.y;
      v.z += b.z;
      v.w += b.w;
      *reinterpret_cast<float4*>(row + i) = v;
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
  } else {
#pragma unroll 4
    for (int32_t i = lane; i < dim; i += 32) {
      const float v = row[i] + bias[i];
      row[i] = v;
      ss += v * v;
    }
  }
  ss = WarpSum(ss);
  const float inv = rsqrtf(ss / dim + eps);
  ScaleRow<bf16, kVec>(row, weight, out + static_cast<int64_t>(r) * dim, dim, inv, lane);
}

__global__ void SwiGluKernel(const float* __restrict__ gate_up, int32_t ffn,
                             bf16* __restrict__ out) {
  const float* g = gate_up + static_cast<int64_t>(blockIdx.y) * 2 * ffn;
  const float* u = g + ffn;
  bf16* dst = out + static_cast<int64_t>(blockIdx.y) * ffn;
  for (int32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < ffn; i += gridDim.x * blockDim.x) {
    const float a = g[i];
    dst[i] = __float2bfloat16_rn(a / (1.0f + __expf(-a)) * u[i]);
  }
}

}  // namespace

absl::Status LaunchEmbed(const bf16* embed, StepInputs in, int32_t hidden, float* x,
                         cudaStream_t stream) {
  if (in.rows <= 0 || hidden <= 0) return absl::InvalidArgumentError("embed: empty shape");
  EmbedKernel<<<in.rows, kThreads, 0, stream>>>(embed, in, hidden, x);
  KVRM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template <typename Out>
absl::Status LaunchRmsNorm(const float* x, const bf16* weight, Out* out, int32_t rows,
                           int32_t dim, float eps, const int32_t* row_select,
                           cudaStream_t stream) {
  if (rows <= 0 || dim <= 0) return absl::InvalidArgumentError("rms_norm: empty shape");
  if (row_select != nullptr && rows != 1) {
    return absl::InvalidArgumentError("rms_norm: row_select normalises exactly one row");
  }
  const int blocks = (rows + kNormWarps - 1) / kNormWarps;
  // The 4-wide path needs every row (and the weight) 16-byte aligned: dim % 4 and aligned bases.
  const bool vec = dim % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(out) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(weight) % 8 == 0;
  if (vec) {
    RmsNormKernel<Out, true><<<blocks, kNormWarps * 32, 0, stream>>>(x, weight, out, rows, dim, eps,
                                                                    row_select);
  } else {
    RmsNormKernel<Out, false><<<blocks, kNormWarps * 32, 0, stream>>>(x, weight, out, rows, dim,
                                                                     eps, row_select);
  }
  KVRM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template absl::Status LaunchRmsNorm<float>(const float*, const bf16*, float*, int32_t, int32_t,
                                           float, const int32_t*, cudaStream_t);
template absl::Status LaunchRmsNorm<bf16>(const float*, const bf16*, bf16*, int32_t, int32_t,
                                          float, const int32_t*, cudaStream_t);

absl::Status LaunchAddBiasAndRmsNorm(float* x, const float* bias, const bf16* weight, bf16* out,
                                     int32_t rows, int32_t dim, float eps, cudaStream_t stream) {
  if (rows <= 0 || dim <= 0) return absl::InvalidArgumentError("add_bias_rms_norm: empty shape");
  if (bias == nullptr) return absl::InvalidArgumentError("add_bias_rms_norm: no bias");
  const int blocks = (rows + kNormWarps - 1) / kNormWarps;
  const bool vec = dim % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(bias) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(out) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(weight) % 8 == 0;
  if (vec) {
    AddBiasRmsNormKernel<true>
        <<<blocks, kNormWarps * 32, 0, stream>>>(x, bias, weight, out, rows, dim, eps);
  } else {
    AddBiasRmsNormKernel<false>
        <<<blocks, kNormWarps * 32, 0, stream>>>(x, bias, weight, out, rows, dim, eps);
  }
  KVRM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status LaunchSwiGlu(const float* gate_up, int32_t rows, int32_t ffn, bf16* out,
                          cudaStream_t stream) {
  if (rows <= 0 || ffn <= 0) return absl::InvalidArgumentError("swiglu: empty shape");
  const dim3 grid((ffn + kThreads - 1) / kThreads, rows);
  SwiGluKernel<<<grid, kThreads, 0, stream>>>(gate_up, ffn, out);
  KVRM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace kvrm::cuda
