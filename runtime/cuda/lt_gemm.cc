#include "runtime/cuda/lt_gemm.h"

#include <string>

#include "runtime/cuda/cuda_raii.h"

namespace kvrm::cuda {

absl::StatusOr<std::unique_ptr<LtGemm>> LtGemm::Create(cublasLtHandle_t handle, int64_t rows,
                                                       int64_t in, int64_t out,
                                                       size_t workspace_bytes) {
  if (rows <= 0 || in <= 0 || out <= 0) {
    return absl::InvalidArgumentError("gemm: every dimension must be positive");
  }
  auto g = std::unique_ptr<LtGemm>(new LtGemm());
  g->handle_ = handle;
  g->rows_ = rows;
  g->in_ = in;
  g->out_ = out;
  g->workspace_bytes_ = workspace_bytes;
  KVRM_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&g->desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
  KVRM_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
      g->desc_, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof(transa)));
  KVRM_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
      g->desc_, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof(transb)));
  KVRM_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&g->a_, CUDA_R_16BF, in, out, in));
  KVRM_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&g->b_, CUDA_R_16BF, in, rows, in));
  KVRM_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&g->c_, CUDA_R_32F, out, rows, out));

  cublasLtMatmulPreference_t pref = nullptr;
  KVRM_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref));
  std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>,
                  cublasStatus_t (*)(cublasLtMatmulPreference_t)>
      pref_owner(pref, cublasLtMatmulPreferenceDestroy);
  KVRM_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes, sizeof(workspace_bytes)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  KVRM_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulAlgoGetHeuristic(handle, g->desc_, g->a_, g->b_,
                                                             g->c_, g->c_, pref, 1, &result,
                                                             &found));
  if (found < 1) {
    return absl::UnimplementedError("cuBLASLt has no algorithm for a " + std::to_string(rows) +
                                    "x" + std::to_string(in) + "x" + std::to_string(out) +
                                    " bf16 product");
  }
  g->algo_ = result.algo;
  return g;
}

LtGemm::~LtGemm() {
  if (c_) cublasLtMatrixLayoutDestroy(c_);
  if (b_) cublasLtMatrixLayoutDestroy(b_);
  if (a_) cublasLtMatrixLayoutDestroy(a_);
  if (desc_) cublasLtMatmulDescDestroy(desc_);
}

absl::Status LtGemm::Run(const __nv_bfloat16* x, const __nv_bfloat16* w, float* y, float beta,
                         void* workspace, cudaStream_t stream) const {
  const float alpha = 1.0f;
  KVRM_CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(handle_, desc_, &alpha, w, a_, x, b_, &beta, y, c_,
                                             y, c_, &algo_, workspace, workspace_bytes_, stream));
  return absl::OkStatus();
}

}  // namespace kvrm::cuda
