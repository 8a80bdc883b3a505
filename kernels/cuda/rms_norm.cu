// The three layers of the house style: device template, checked launch wrapper, explicit
// instantiations.
#include <cuda_bf16.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/rms_norm.h"

namespace kvrm::cuda {
namespace {

constexpr int kThreads = 256;

__device__ inline float ToFloat(float v) { return v; }
__device__ inline float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__global__ void RmsNormKernel(const float* __restrict__ x, const T* __restrict__ weight,
                              float* __restrict__ out, int32_t dim, float eps) {
  const float* row = x + static_cast<int64_t>(blockIdx.x) * dim;
  float* dst = out + static_cast<int64_t>(blockIdx.x) * dim;
  float ss = 0.0f;
  for (int32_t i = threadIdx.x; i < dim; i += blockDim.x) ss += row[i] * row[i];
  // Warp reduction, then one value per warp through shared memory.
  for (int offset = 16; offset > 0; offset /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, offset);
  __shared__ float warp_sums[kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    ss = threadIdx.x < kThreads / 32 ? warp_sums[threadIdx.x] : 0.0f;
    for (int offset = 16; offset > 0; offset /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, offset);
    if (threadIdx.x == 0) warp_sums[0] = ss;
  }
  __syncthreads();
  const float inv = rsqrtf(warp_sums[0] / dim + eps);
  for (int32_t i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = row[i] * inv * ToFloat(weight[i]);
}

}  // namespace

template <typename T>
absl::Status LaunchRmsNorm(const float* x, const T* weight, float* out, int32_t rows,
                           int32_t dim, float eps, cudaStream_t stream) {
  if (rows <= 0 || dim <= 0) return absl::InvalidArgumentError("rms_norm: rows and dim must be positive");
  RmsNormKernel<T><<<rows, kThreads, 0, stream>>>(x, weight, out, dim, eps);
  KVRM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template absl::Status LaunchRmsNorm<float>(const float*, const float*, float*, int32_t, int32_t,
                                           float, cudaStream_t);
template absl::Status LaunchRmsNorm<__nv_bfloat16>(const float*, const __nv_bfloat16*, float*,
                                                   int32_t, int32_t, float, cudaStream_t);

}  // namespace kvrm::cuda
