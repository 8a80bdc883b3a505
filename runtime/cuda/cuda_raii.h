// Move-only owners for CUDA, cuBLASLt and NCCL handles (unique_ptr with a deleter, as the
// TensorRT-LLM runtime does), and the checking macros for cuBLASLt and NCCL calls.
//
// Destruction never throws or aborts: a failing free during shutdown is logged and ignored.
#ifndef KVRM_RUNTIME_CUDA_CUDA_RAII_H_
#define KVRM_RUNTIME_CUDA_CUDA_RAII_H_

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/cuda_check.h"

namespace kvrm::cuda {

inline absl::Status CublasStatus(cublasStatus_t st, const char* expr, const char* file,
                                 int line) {
  if (st == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(std::string(expr) + " failed at " + file + ":" +
                             std::to_string(line) + ": cuBLAS status " +
                             std::to_string(static_cast<int>(st)));
}

inline absl::Status NcclStatus(ncclResult_t st, const char* expr, const char* file, int line) {
  if (st == ncclSuccess || st == ncclInProgress) return absl::OkStatus();
  return absl::InternalError(std::string(expr) + " failed at " + file + ":" +
                             std::to_string(line) + ": " + ncclGetErrorString(st));
}

}  // namespace kvrm::cuda

#define KVRM_CUBLAS_RETURN_IF_ERROR(expr)                                                    \
  do {                                                                                      \
    ::absl::Status kvrm_cublas_status_ =                                                    \
        ::kvrm::cuda::CublasStatus((expr), #expr, __FILE__, __LINE__);                      \
    if (!kvrm_cublas_status_.ok()) return kvrm_cublas_status_;                              \
  } while (0)

#define KVRM_NCCL_RETURN_IF_ERROR(expr)                                                      \
  do {                                                                                      \
    ::absl::Status kvrm_nccl_status_ = ::kvrm::cuda::NcclStatus((expr), #expr, __FILE__, __LINE__); \
    if (!kvrm_nccl_status_.ok()) return kvrm_nccl_status_;                                  \
  } while (0)

namespace kvrm::cuda {

struct DeviceFree {
  void operator()(void* p) const { cudaFree(p); }
};
struct HostFree {
  void operator()(void* p) const { cudaFreeHost(p); }
};
struct StreamDestroy {
  void operator()(cudaStream_t s) const { cudaStreamDestroy(s); }
};
struct EventDestroy {
  void operator()(cudaEvent_t e) const { cudaEventDestroy(e); }
};
struct GraphDestroy {
  void operator()(cudaGraph_t g) const { cudaGraphDestroy(g); }
};
struct GraphExecDestroy {
  void operator()(cudaGraphExec_t g) const { cudaGraphExecDestroy(g); }
};
struct LtDestroy {
  void operator()(cublasLtHandle_t h) const { cublasLtDestroy(h); }
};

using DevicePtr = std::unique_ptr<void, DeviceFree>;
using PinnedPtr = std::unique_ptr<void, HostFree>;
using StreamPtr = std::unique_ptr<std::remove_pointer_t<cudaStream_t>, StreamDestroy>;
using EventPtr = std::unique_ptr<std::remove_pointer_t<cudaEvent_t>, EventDestroy>;
using GraphPtr = std::unique_ptr<std::remove_pointer_t<cudaGraph_t>, GraphDestroy>;
using GraphExecPtr = std::unique_ptr<std::remove_pointer_t<cudaGraphExec_t>, GraphExecDestroy>;
using LtHandlePtr = std::unique_ptr<std::remove_pointer_t<cublasLtHandle_t>, LtDestroy>;

// Device memory of `bytes` on the current device; RESOURCE_EXHAUSTED when it cannot be had.
inline absl::StatusOr<DevicePtr> DeviceAlloc(size_t bytes, const char* what) {
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error state
    return absl::ResourceExhaustedError(std::string("cannot allocate ") + std::to_string(bytes) +
                                        " bytes of device memory for " + what + ": " +
                                        cudaGetErrorString(err));
  }
  return DevicePtr(p);
}

// Pinned host memory reachable from every device (portable).
inline absl::StatusOr<PinnedPtr> PinnedAlloc(size_t bytes, const char* what) {
  void* p = nullptr;
  const cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(std::string("cannot pin ") + std::to_string(bytes) +
                                        " bytes of host memory for " + what + ": " +
                                        cudaGetErrorString(err));
  }
  return PinnedPtr(p);
}

inline absl::StatusOr<StreamPtr> NewStream() {
  cudaStream_t s = nullptr;
  KVRM_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return StreamPtr(s);
}

inline absl::StatusOr<EventPtr> NewEvent(bool timing) {
  cudaEvent_t e = nullptr;
  KVRM_CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
  return EventPtr(e);
}

}  // namespace kvrm::cuda

#endif  // KVRM_RUNTIME_CUDA_CUDA_RAII_H_
