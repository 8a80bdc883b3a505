// A cuBLASLt product of fixed shape, planned once at start-up:
//   Y[rows][out] (f32) = X[rows][in] (bf16) . W[out][in]^T (bf16) + beta * Y
// with f32 accumulation. W is the Hugging Face [out][in] layout. Descriptors, layouts and the
// algorithm (the heuristic's first choice for this shape) are fixed here, the workspace is
// preallocated by the caller, so Run only enqueues: it can be captured into a CUDA graph.
//
// In cuBLASLt's column-major terms: D (out x rows, ld out) = op(A) . B with A = W viewed as
// (in x out, ld in) transposed and B = X viewed as (in x rows, ld in).
#ifndef KVRM_RUNTIME_CUDA_LT_GEMM_H_
#define KVRM_RUNTIME_CUDA_LT_GEMM_H_

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"

namespace kvrm::cuda {

class LtGemm {
 public:
  static absl::StatusOr<std::unique_ptr<LtGemm>> Create(cublasLtHandle_t handle, int64_t rows,
                                                        int64_t in, int64_t out,
                                                        size_t workspace_bytes);
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // beta is 0 (Y = X W^T) or 1 (Y += X W^T: the residual add of O and down).
  absl::Status Run(const __nv_bfloat16* x, const __nv_bfloat16* w, float* y, float beta,
                   void* workspace, cudaStream_t stream) const;

  int64_t rows() const { return rows_; }
  int64_t in() const { return in_; }
  int64_t out() const { return out_; }

 private:
  LtGemm() = default;
  cublasLtHandle_t handle_ = nullptr;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, c_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
  size_t workspace_bytes_ = 0;
  int64_t rows_ = 0, in_ = 0, out_ = 0;
};

}  // namespace kvrm::cuda

#endif  // KVRM_RUNTIME_CUDA_LT_GEMM_H_
