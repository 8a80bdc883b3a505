// Embedding, RMSNorm and SwiGLU: device template, checked launch wrapper, explicit
// instantiations.
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

template <typename Out>
__global__ void RmsNormKernel(const float* __restrict__ x, const bf16* __restrict__ weight,
                              Out* __restrict__ out, int32_t dim, float eps,
                              const int32_t* __restrict__ row_select) {
  __shared__ float shared[32];
  const int64_t src_row = row_select ? *row_select : blockIdx.x;
  const float* row = x + src_row * dim;
  Out* dst = out + static_cast<int64_t>(blockIdx.x) * dim;
  float ss = 0.0f;
  for (int32_t i = threadIdx.x; i < dim; i += blockDim.x) ss += row[i] * row[i];
  ss = BlockSum(ss, shared);
  const float inv = rsqrtf(ss / dim + eps);
  for (int32_t i = threadIdx.x; i < dim; i += blockDim.x) {
    dst[i] = FromFloat<Out>(row[i] * inv * __bfloat162float(weight[i]));
  }
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
  RmsNormKernel<Out><<<rows, kThreads, 0, stream>>>(x, weight, out, dim, eps, row_select);
  KVRM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template absl::Status LaunchRmsNorm<float>(const float*, const bf16*, float*, int32_t, int32_t,
                                           float, const int32_t*, cudaStream_t);
template absl::Status LaunchRmsNorm<bf16>(const float*, const bf16*, bf16*, int32_t, int32_t,
                                          float, const int32_t*, cudaStream_t);

absl::Status LaunchSwiGlu(const float* gate_up, int32_t rows, int32_t ffn, bf16* out,
                          cudaStream_t stream) {
  if (rows <= 0 || ffn <= 0) return absl::InvalidArgumentError("swiglu: empty shape");
  const dim3 grid((ffn + kThreads - 1) / kThreads, rows);
  SwiGluKernel<<<grid, kThreads, 0, stream>>>(gate_up, ffn, out);
  KVRM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace kvrm::cuda
