#include "kernels/cuda/copy_rows.h"

#include <algorithm>

#include "kernels/cuda/cuda_check.h"

namespace kvrm::cuda {
namespace {

constexpr int kThreads = 256;

// One row per blockIdx.y (grid-strided), its elements over blockIdx.x and the threads.
template <typename T>
__global__ void CopyRowsKernel(char* __restrict__ dst, int64_t dst_pitch,
                               const char* __restrict__ src, int64_t src_pitch, int64_t n,
                               int64_t height) {
  for (int64_t r = blockIdx.y; r < height; r += gridDim.y) {
    const T* from = reinterpret_cast<const T*>(src + r * src_pitch);
    T* to = reinterpret_cast<T*>(dst + r * dst_pitch);
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      to[i] = from[i];
    }
  }
}

}  // namespace

absl::Status LaunchCopyRows(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch,
                            int64_t width, int64_t height, cudaStream_t stream) {
  if (width <= 0 || height <= 0 || dst_pitch < width || src_pitch < width) {
    return absl::InvalidArgumentError("copy_rows: empty rows or a pitch below the width");
  }
  const bool wide = (reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) |
                     static_cast<uintptr_t>(dst_pitch) | static_cast<uintptr_t>(src_pitch) |
                     static_cast<uintptr_t>(width)) %
                        16 ==
                    0;
  const int64_t n = wide ? width / 16 : width;
  const unsigned x = static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, 64));
  const unsigned y = static_cast<unsigned>(std::min<int64_t>(height, 65535));
  const dim3 grid(x, y);
  if (wide) {
    CopyRowsKernel<uint4><<<grid, kThreads, 0, stream>>>(static_cast<char*>(dst), dst_pitch,
                                                          static_cast<const char*>(src),
                                                          src_pitch, n, height);
  } else {
    CopyRowsKernel<char><<<grid, kThreads, 0, stream>>>(static_cast<char*>(dst), dst_pitch,
                                                         static_cast<const char*>(src), src_pitch,
                                                         n, height);
  }
  KVRM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace kvrm::cuda
