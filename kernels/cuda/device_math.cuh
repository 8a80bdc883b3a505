// Device helpers shared by the kernels: dtype loads, warp and block reductions.
#ifndef KVRM_KERNELS_CUDA_DEVICE_MATH_CUH_
#define KVRM_KERNELS_CUDA_DEVICE_MATH_CUH_

#include <cuda_bf16.h>

#include "kernels/cuda/bf16_bits.h"

namespace kvrm::cuda {

__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// f32 -> bf16 bit for bit as the CPU's FloatToBf16 (common/dtype.h): RoundF32BitsToBf16
// (kernels/cuda/bf16_bits.h, tested against it on the CPU). What the KV write stores in a bf16
// pool; not __float2bfloat16_rn, whose NaN differs.
__device__ __forceinline__ __nv_bfloat16 RoundToBf16(float f) {
  return __ushort_as_bfloat16(RoundF32BitsToBf16(__float_as_uint(f)));
}

// Two bf16 packed in a 32-bit word (the lower address in the low half), widened exactly.
__device__ __forceinline__ void WidenBf16x2(unsigned int w, float* out) {
  out[0] = __uint_as_float(w << 16);
  out[1] = __uint_as_float(w & 0xffff0000u);
}

__device__ __forceinline__ float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `shared` holds 32 floats. Contains __syncthreads: every thread of the block must call it.
__device__ __forceinline__ float BlockSum(float v, float* shared) {
  v = WarpSum(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // `shared` may still be read by a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < blockDim.x / 32 ? shared[lane] : 0.0f;
  return WarpSum(v);
}

__device__ __forceinline__ float BlockMax(float v, float* shared) {
  v = WarpMax(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < blockDim.x / 32 ? shared[lane] : -INFINITY;
  return WarpMax(v);
}

}  // namespace kvrm::cuda

#endif  // KVRM_KERNELS_CUDA_DEVICE_MATH_CUH_
