// A strided copy done by the SMs: `height` rows of `width` bytes, row r from src + r * src_pitch
// to dst + r * dst_pitch. What cudaMemcpy2DAsync does on a copy engine, for a transfer group
// whose rows are narrow (one KV block of one (layer, K|V, head) is 4 KB on the `small` shape):
// either side may be pinned host memory mapped into the device's address space, which the
// kernel reads or writes over PCIe with 16-byte accesses, many rows in flight at once, instead of
// one DMA descriptor per row. Checked launch: INVALID_ARGUMENT on a bad shape.
#ifndef KVRM_KERNELS_CUDA_COPY_ROWS_H_
#define KVRM_KERNELS_CUDA_COPY_ROWS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace kvrm::cuda {

// 16-byte accesses when both bases, both pitches and the width are multiples of 16; else bytes.
absl::Status LaunchCopyRows(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch,
                            int64_t width, int64_t height, cudaStream_t stream);

}  // namespace kvrm::cuda

#endif  // KVRM_KERNELS_CUDA_COPY_ROWS_H_
