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

// One thread per pair of elements (i, i + half) of a head: a Q pair is rotated in place, a K
// pair rotated in place and stored to the pool, a V pair stored. Grid (items / kThreads, rows):
// no loop and no barrier, so a 64-row step is one round of loads and one of stores.
template <typename Kv>
__global__ void RopeAndStoreKvKernel(float* __restrict__ qkv, StepInputs in,
                                     const float* __restrict__ rope, int32_t heads,
                                     int32_t kv_heads, KvLayer<Kv> kv) {
  const int32_t row = blockIdx.y;
  if (!in.active[row]) return;
  const int32_t hd = kv.head_dim, half = hd / 2;
  const int32_t p = blockIdx.x * blockDim.x + threadIdx.x;
  const int32_t rotated = (heads + kv_heads) * half;  // Q and K pairs; V pairs after them
  if (p >= rotated + kv_heads * half) return;
  const int32_t position = in.position[row];
  float* q = qkv + static_cast<int64_t>(row) * (heads + 2 * kv_heads) * hd;
  if (p < rotated) {
    const int32_t head = p / half, i = p % half;
    float* h = q + head * hd;  // K heads follow the Q heads contiguously
    float ra = h[i], rb = h[i + half];
    if (rope != nullptr) {  // (null: a NoPE layer, SmolLM3's, stores K as it is)
      const float* cs = rope + static_cast<int64_t>(position) * hd;
      const float a = ra, b = rb;
      ra = a * cs[i] - b * cs[half + i];
      rb = b * cs[i] + a * cs[half + i];
      h[i] = ra;
      h[i + half] = rb;
    }
    if (head < heads) return;
    const int64_t phys = in.PhysicalToken(in.table[row], position, kv.block_tokens);
    if (phys < 0) return;  // the host packer guarantees a target; never write out of bounds
    const int64_t at = (head - heads) * kv.head_stride + phys * hd;
    StoreKvElement(kv.k + at + i, ra);
    StoreKvElement(kv.k + at + i + half, rb);
  } else {
    const int32_t g = (p - rotated) / half, i = (p - rotated) % half;
    const int64_t phys = in.PhysicalToken(in.table[row], position, kv.block_tokens);
    if (phys < 0) return;
    const float* v = q + (heads + kv_heads + g) * hd;
    const int64_t at = g * kv.head_stride + phys * hd;
    StoreKvElement(kv.v + at + i, v[i]);
    StoreKvElement(kv.v + at + i + half, v[i + half]);
  }
}

}  // namespace

template <typename Kv>
absl::Status LaunchRopeAndStoreKv(float* qkv, StepInputs in, const float* rope, int32_t heads,
                                  int32_t kv_heads, KvLayer<Kv> kv, cudaStream_t stream) {
  if (in.rows <= 0 || heads <= 0 || kv_heads <= 0 || kv.head_dim <= 0 || kv.head_dim % 2) {
    return absl::InvalidArgumentError("rope_kv: bad shape");
  }
  const int32_t items = (heads + 2 * kv_heads) * (kv.head_dim / 2);
  const dim3 grid((items + kThreads - 1) / kThreads, in.rows);
  RopeAndStoreKvKernel<Kv><<<grid, kThreads, 0, stream>>>(qkv, in, rope, heads, kv_heads, kv);
  KVRM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template absl::Status LaunchRopeAndStoreKv<float>(float*, StepInputs, const float*, int32_t,
                                                  int32_t, KvLayer<float>, cudaStream_t);
template absl::Status LaunchRopeAndStoreKv<bf16>(float*, StepInputs, const float*, int32_t,
                                                 int32_t, KvLayer<bf16>, cudaStream_t);

}  // namespace kvrm::cuda
