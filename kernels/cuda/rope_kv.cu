// RoPE on Q and K and the KV write through the run table: device template (on the pool's element
// type), checked launch wrapper, explicit instantiations (f32 and bf16 pools).
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/llama_kernels.h"

namespace kvrm::cuda {
namespace {

constexpr int kThreads = 128;

// A K or V element as the pool stores it: f32 as is; bf16 rounded as the CPU pool rounds.
__device__ __forceinline__ void StoreKvElement(float* dst, float v) { *dst = v; }
__device__ __forceinline__ void StoreKvElement(bf16* dst, float v) { *dst = RoundToBf16(v); }

template <typename Kv>
__global__ void RopeAndStoreKvKernel(float* __restrict__ qkv, StepInputs in,
                                     const float* __restrict__ rope, int32_t heads,
                                     int32_t kv_heads, KvLayer<Kv> kv) {
  const int32_t row = blockIdx.x;
  if (!in.active[row]) return;
  const int32_t hd = kv.head_dim, half = hd / 2;
  const int32_t position = in.position[row];
  float* q = qkv + static_cast<int64_t>(row) * (heads + 2 * kv_heads) * hd;
  float* k = q + heads * hd;
  const float* v = k + kv_heads * hd;
  const float* cs = rope + static_cast<int64_t>(position) * hd;
  // Rotate-half pairs (i, i + half) of every Q and K head.
  for (int32_t p = threadIdx.x; p < (heads + kv_heads) * half; p += blockDim.x) {
    const int32_t head = p / half, i = p % half;
    float* h = q + head * hd;  // K heads follow the Q heads contiguously
    const float a = h[i], b = h[i + half];
    h[i] = a * cs[i] - b * cs[half + i];
    h[i + half] = b * cs[i] + a * cs[half + i];
  }
  __syncthreads();
  const int64_t phys = in.PhysicalToken(in.table[row], position, kv.block_tokens);
  if (phys < 0) return;  // the host packer guarantees a target; never write out of bounds
  for (int32_t e = threadIdx.x; e < kv_heads * hd; e += blockDim.x) {
    const int32_t g = e / hd, d = e % hd;
    const int64_t at = g * kv.head_stride + phys * hd + d;
    StoreKvElement(kv.k + at, k[e]);
    StoreKvElement(kv.v + at, v[e]);
  }
}

}  // namespace

template <typename Kv>
absl::Status LaunchRopeAndStoreKv(float* qkv, StepInputs in, const float* rope, int32_t heads,
                                  int32_t kv_heads, KvLayer<Kv> kv, cudaStream_t stream) {
  if (in.rows <= 0 || heads <= 0 || kv_heads <= 0 || kv.head_dim <= 0 || kv.head_dim % 2) {
    return absl::InvalidArgumentError("rope_kv: bad shape");
  }
  RopeAndStoreKvKernel<Kv><<<in.rows, kThreads, 0, stream>>>(qkv, in, rope, heads, kv_heads, kv);
  KVRM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template absl::Status LaunchRopeAndStoreKv<float>(float*, StepInputs, const float*, int32_t,
                                                  int32_t, KvLayer<float>, cudaStream_t);
template absl::Status LaunchRopeAndStoreKv<bf16>(float*, StepInputs, const float*, int32_t,
                                                 int32_t, KvLayer<bf16>, cudaStream_t);

}  // namespace kvrm::cuda
