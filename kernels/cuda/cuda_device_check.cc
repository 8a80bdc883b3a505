// Reports the CUDA devices this process can use and runs one kernel against the CPU reference.
// On a machine without a GPU it says so and exits 2 (a CPU-only machine is not an error of the
// build; CI only builds this binary).
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/rms_norm.h"

namespace {

absl::Status CheckRmsNorm() {
  const int rows = 7, dim = 1000;
  std::mt19937 rng(1);
  std::normal_distribution<float> dist;
  std::vector<float> x(rows * dim), w(dim), out(rows * dim);
  for (float& v : x) v = dist(rng);
  for (float& v : w) v = 1.0f + 0.1f * dist(rng);
  float *dx, *dw, *dout;
  KVRM_CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&dx), x.size() * 4));
  KVRM_CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&dw), w.size() * 4));
  KVRM_CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&dout), out.size() * 4));
  KVRM_CUDA_RETURN_IF_ERROR(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
  KVRM_CUDA_RETURN_IF_ERROR(cudaMemcpy(dw, w.data(), w.size() * 4, cudaMemcpyHostToDevice));
  absl::Status st = kvrm::cuda::LaunchRmsNorm<float>(dx, dw, dout, rows, dim, 1e-5f, nullptr);
  if (!st.ok()) return st;
  KVRM_CUDA_RETURN_IF_ERROR(cudaMemcpy(out.data(), dout, out.size() * 4, cudaMemcpyDeviceToHost));
  cudaFree(dx);
  cudaFree(dw);
  cudaFree(dout);
  double max_err = 0;
  for (int r = 0; r < rows; ++r) {
    double ss = 0;
    for (int i = 0; i < dim; ++i) ss += double(x[r * dim + i]) * x[r * dim + i];
    const double inv = 1.0 / std::sqrt(ss / dim + 1e-5);
    for (int i = 0; i < dim; ++i) {
      max_err = std::max(max_err, std::abs(out[r * dim + i] - x[r * dim + i] * inv * w[i]));
    }
  }
  std::printf("rms_norm f32: max abs error %.3g vs float64\n", max_err);
  if (max_err > 1e-4) return absl::InternalError("rms_norm error above 1e-4");
  return absl::OkStatus();
}

}  // namespace

int main() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::printf("no usable CUDA device: %s\n", err == cudaSuccess ? "none" : cudaGetErrorString(err));
    return 2;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp p;
    cudaGetDeviceProperties(&p, i);
    std::printf("device %d: %s, sm_%d%d, %.1f GiB\n", i, p.name, p.major, p.minor,
                p.totalGlobalMem / 1073741824.0);
  }
  const absl::Status st = CheckRmsNorm();
  if (!st.ok()) {
    std::printf("FAILED: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  return 0;
}
