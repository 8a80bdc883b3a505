// One way to check every CUDA runtime call: the failing expression, file and line become an
// absl::Status (INTERNAL), so callers propagate errors instead of aborting.
#ifndef KVRM_KERNELS_CUDA_CUDA_CHECK_H_
#define KVRM_KERNELS_CUDA_CUDA_CHECK_H_

#include <cuda_runtime_api.h>

#include <string>

#include "absl/status/status.h"

namespace kvrm {

inline absl::Status CudaStatus(cudaError_t err, const char* expr, const char* file, int line) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(std::string(expr) + " failed at " + file + ":" +
                             std::to_string(line) + ": " + cudaGetErrorName(err) + ": " +
                             cudaGetErrorString(err));
}

}  // namespace kvrm

#define KVRM_CUDA_RETURN_IF_ERROR(expr)                                                   \
  do {                                                                                    \
    ::absl::Status kvrm_cuda_status_ = ::kvrm::CudaStatus((expr), #expr, __FILE__, __LINE__); \
    if (!kvrm_cuda_status_.ok()) return kvrm_cuda_status_;                                \
  } while (0)

#endif  // KVRM_KERNELS_CUDA_CUDA_CHECK_H_
