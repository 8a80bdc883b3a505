// RMSNorm on the GPU: out[r][i] = x[r][i] / sqrt(mean(x[r]^2) + eps) * w[i], one block per row.
#ifndef KVRM_KERNELS_CUDA_RMS_NORM_H_
#define KVRM_KERNELS_CUDA_RMS_NORM_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace kvrm::cuda {

// Checked launch: INVALID_ARGUMENT on bad shapes, INTERNAL naming the launch on a CUDA error.
// `T` is float or __nv_bfloat16 (weights); activations are f32.
template <typename T>
absl::Status LaunchRmsNorm(const float* x, const T* weight, float* out, int32_t rows,
                           int32_t dim, float eps, cudaStream_t stream);

}  // namespace kvrm::cuda

#endif  // KVRM_KERNELS_CUDA_RMS_NORM_H_
