// A cuBLASLt product of fixed shape, planned once at start-up:
//   Y[rows][out] (f32) = X[rows][in] (bf16) . W[out][in]^T (bf16) + beta * Y
// with f32 accumulation. W is the Hugging Face [out][in] layout. Descriptors, layouts and the
// algorithm are fixed at start-up: the heuristic's first choice for this shape, or, after Tune,
// the fastest of its candidates timed on the real operands (the heuristic's first choice is
// often not the fastest for the decode step's skinny products). The workspace is preallocated
// by the caller, so Run only enqueues: it can be captured into a CUDA graph.
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
#include <vector>

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

  // Times each of the heuristic's candidates (up to kCandidates) with beta 0 (y is
  // overwritten) and keeps the fastest for Run. Not during a capture. The timed runs cycle
  // through `weights` (every layer's matrix of this product): a step reads each layer's weights
  // once, from memory, and one matrix timed over and over would sit in L2 and favour the
  // candidate that is fastest on cached weights. Returns the kept algorithm's time in
  // microseconds.
  absl::StatusOr<double> Tune(const __nv_bfloat16* x, const std::vector<const __nv_bfloat16*>& weights,
                              float* y, void* workspace, cudaStream_t stream);
  // Candidates the heuristic offered, and the one Run uses (0: the heuristic's first choice).
  int candidates() const { return static_cast<int>(candidates_.size()); }
  int chosen() const { return chosen_; }

  static constexpr int kCandidates = 8;

  int64_t rows() const { return rows_; }
  int64_t in() const { return in_; }
  int64_t out() const { return out_; }

 private:
  LtGemm() = default;
  cublasLtHandle_t handle_ = nullptr;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, c_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
  std::vector<cublasLtMatmulAlgo_t> candidates_;
  int chosen_ = 0;
  size_t workspace_bytes_ = 0;
  int64_t rows_ = 0, in_ = 0, out_ = 0;
};

}  // namespace kvrm::cuda

#endif  // KVRM_RUNTIME_CUDA_LT_GEMM_H_
