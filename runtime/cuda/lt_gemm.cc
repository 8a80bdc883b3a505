#include "runtime/cuda/lt_gemm.h"

#include <algorithm>
#include <string>

#include "common/status_macros.h"
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
  cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
  int found = 0;
  KVRM_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulAlgoGetHeuristic(handle, g->desc_, g->a_, g->b_,
                                                             g->c_, g->c_, pref, kCandidates,
                                                             results, &found));
  for (int i = 0; i < found; ++i) {
    if (results[i].state == CUBLAS_STATUS_SUCCESS) g->candidates_.push_back(results[i].algo);
  }
  if (g->candidates_.empty()) {
    return absl::UnimplementedError("cuBLASLt has no algorithm for a " + std::to_string(rows) +
                                    "x" + std::to_string(in) + "x" + std::to_string(out) +
                                    " bf16 product");
  }
  g->algo_ = g->candidates_[0];
  return g;
}

absl::StatusOr<double> LtGemm::Tune(const __nv_bfloat16* x,
                                    const std::vector<const __nv_bfloat16*>& weights, float* y,
                                    void* workspace, cudaStream_t stream) {
  if (weights.empty()) return absl::InvalidArgumentError("gemm tune: no weights");
  constexpr int kWarmup = 3;
  const int timed = std::max<int>(24, 2 * static_cast<int>(weights.size()));
  ASSIGN_OR_RETURN(EventPtr start, NewEvent(true));
  ASSIGN_OR_RETURN(EventPtr stop, NewEvent(true));
  const float alpha = 1.0f, beta = 0.0f;
  double best_us = -1;
  for (size_t i = 0; i < candidates_.size(); ++i) {
    auto run = [&](int k) {
      return cublasLtMatmul(handle_, desc_, &alpha, weights[k % weights.size()], a_, x, b_, &beta,
                            y, c_, y, c_, &candidates_[i], workspace, workspace_bytes_, stream);
    };
    // A candidate the library turns down on these operands is skipped, not an error.
    if (run(0) != CUBLAS_STATUS_SUCCESS) continue;
    for (int k = 1; k < kWarmup; ++k) KVRM_CUBLAS_RETURN_IF_ERROR(run(k));
    KVRM_CUDA_RETURN_IF_ERROR(cudaEventRecord(start.get(), stream));
    for (int k = 0; k < timed; ++k) KVRM_CUBLAS_RETURN_IF_ERROR(run(k));
    KVRM_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop.get(), stream));
    KVRM_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop.get()));
    float ms = 0;
    KVRM_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start.get(), stop.get()));
    const double us = ms * 1e3 / timed;
    if (best_us < 0 || us < best_us) {
      best_us = us;
      chosen_ = static_cast<int>(i);
    }
  }
  if (best_us < 0) {
    return absl::InternalError("cuBLASLt ran none of its candidates for a " +
                               std::to_string(rows_) + "x" + std::to_string(in_) + "x" +
                               std::to_string(out_) + " bf16 product");
  }
  algo_ = candidates_[chosen_];
  return best_us;
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
