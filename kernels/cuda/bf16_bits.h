// f32 -> bf16 rounding on the bit pattern, for host and device alike: the KV-write kernel stores a
// bf16 pool's elements with it, and its CPU test (bf16_bits_test) checks it against the CPU
// backend's FloatToBf16 (common/dtype.h), so both backends' bf16 pools hold the same bits for the
// same f32 keys and values.
//
// Plain C++ (no CUDA headers): built and tested on machines without the toolkit.
#ifndef KVRM_KERNELS_CUDA_BF16_BITS_H_
#define KVRM_KERNELS_CUDA_BF16_BITS_H_

#include <cstdint>

#if !defined(KVRM_HOST_DEVICE)
#if defined(__CUDACC__)
#define KVRM_HOST_DEVICE __host__ __device__
#else
#define KVRM_HOST_DEVICE
#endif
#endif

namespace kvrm::cuda {

// The bf16 bits of the f32 with bits `f`: round to nearest even; a NaN stays NaN with its sign and
// top payload bits and the quiet bit set. (CUDA's __float2bfloat16_rn agrees on every finite
// value and infinity but returns the canonical 0x7fff for every NaN.)
KVRM_HOST_DEVICE inline uint16_t RoundF32BitsToBf16(uint32_t f) {
  if ((f & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((f >> 16) | 0x40u);
  return static_cast<uint16_t>((f + 0x7fffu + ((f >> 16) & 1u)) >> 16);
}

}  // namespace kvrm::cuda

#endif  // KVRM_KERNELS_CUDA_BF16_BITS_H_
