// Attention over run tables, split over the KV length then reduced (flash-decoding style):
// device templates (per KV element type and head size), checked launch wrapper (a template on the
// KV element type), explicit instantiations for f32 and bf16 pools, each instantiating its head
// sizes through the head-size dispatch.
//
// Split kernel: one block per (split, KV head, row). Its warps stride over the split's positions
// run by run (each run is contiguous memory per head), keep an online softmax per query head of
// the group, then combine through shared memory into one partial (max, sum, output) per head.
// Reduce kernel: one block per (query head, row) merges the splits. The grid covers every split
// of max context, so the shape never changes; blocks past a row's length exit after writing an
// empty partial.
//
// K and V are loaded as E = head_dim / 32 consecutive elements per lane (lane * E onwards) and
// widened to f32 (exactly, for bf16): f32 pools with float2/float4 loads, bf16 pools with one
// 32-bit (E = 2) or 64-bit (E = 4) load, aligned because a token's row starts at a multiple of
// head_dim elements from a 256-byte aligned pool and each lane's E elements at lane * E. All
// arithmetic is f32 whatever the pool's type.
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/llama_kernels.h"

namespace kvrm::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxGroup = 8;

// E consecutive floats (Q, f32 K/V) or bf16 (bf16 K/V) at p, widened to f32.
template <typename T, int E>
struct Vec;
template <>
struct Vec<float, 2> {
  __device__ static void Load(const float* p, float* out) {
    const float2 v = *reinterpret_cast<const float2*>(p);
    out[0] = v.x;
    out[1] = v.y;
  }
};
template <>
struct Vec<float, 4> {
  __device__ static void Load(const float* p, float* out) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    out[0] = v.x;
    out[1] = v.y;
    out[2] = v.z;
    out[3] = v.w;
  }
};
template <>
struct Vec<bf16, 2> {  // 4 bytes: p is 4-byte aligned (an even element index)
  __device__ static void Load(const bf16* p, float* out) {
    WidenBf16x2(*reinterpret_cast<const unsigned int*>(p), out);
  }
};
template <>
struct Vec<bf16, 4> {  // 8 bytes: p is 8-byte aligned (an element index that is a multiple of 4)
  __device__ static void Load(const bf16* p, float* out) {
    const uint2 w = *reinterpret_cast<const uint2*>(p);
    WidenBf16x2(w.x, out);
    WidenBf16x2(w.y, out + 2);
  }
};

template <typename Kv, int kHeadDim>
__global__ void __launch_bounds__(kWarps * 32)
    AttentionSplitKernel(const float* __restrict__ qkv, StepInputs in, KvLayer<Kv> kv,
                         int32_t heads, int32_t kv_heads, int32_t group, float scale,
                         AttentionWorkspace ws) {
  constexpr int E = kHeadDim / 32;
  const int32_t split = blockIdx.x, g = blockIdx.y, row = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t len = in.active[row] ? in.position[row] + 1 : 0;
  const int32_t begin = split * ws.split_tokens;
  const int32_t end = min(len, begin + ws.split_tokens);
  if (begin >= end) {
    // A split past the row's length (the whole block alike): only its -inf marker, on which the
    // reduce skips it without reading its partial_out (64 slots at 4096 context would otherwise
    // write ~6 MB of zeros a layer).
    for (int j = threadIdx.x; j < group; j += blockDim.x) {
      const int64_t slot =
          (static_cast<int64_t>(row) * heads + g * group + j) * ws.splits + split;
      ws.partial_ml[slot * 2] = -INFINITY;
      ws.partial_ml[slot * 2 + 1] = 0.0f;
    }
    return;
  }

  float m[kMaxGroup], l[kMaxGroup], acc[kMaxGroup][E], q[kMaxGroup][E];
#pragma unroll
  for (int j = 0; j < kMaxGroup; ++j) {
    m[j] = -INFINITY;
    l[j] = 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) acc[j][e] = q[j][e] = 0.0f;
  }
  if (begin < end) {
    const float* qrow = qkv + static_cast<int64_t>(row) * (heads + 2 * kv_heads) * kHeadDim +
                        static_cast<int64_t>(g) * group * kHeadDim;
#pragma unroll
    for (int j = 0; j < kMaxGroup; ++j) {
      if (j < group) {
        Vec<float, E>::Load(qrow + j * kHeadDim + lane * E, q[j]);
#pragma unroll
        for (int e = 0; e < E; ++e) q[j][e] *= scale;
      }
    }
    const int32_t table = in.table[row];
    const int64_t base = static_cast<int64_t>(table) * in.max_runs;
    const Kv* kbase = kv.k + g * kv.head_stride;
    const Kv* vbase = kv.v + g * kv.head_stride;
    for (int32_t r = 0; r < in.num_runs[table]; ++r) {
      const int32_t rs = in.run_start[base + r];
      const int32_t re = rs + in.run_blocks[base + r] * kv.block_tokens;
      const int32_t lo = max(rs, begin), hi = min(re, end);
      if (lo >= hi) continue;
      // phys(pos) = run_first * block_tokens + (pos - rs)
      const int64_t shift = static_cast<int64_t>(in.run_first[base + r]) * kv.block_tokens - rs;
      for (int32_t pos = lo + warp; pos < hi; pos += kWarps) {
        const int64_t at = (shift + pos) * kHeadDim + lane * E;
        float kr[E], vr[E];
        Vec<Kv, E>::Load(kbase + at, kr);
        Vec<Kv, E>::Load(vbase + at, vr);
#pragma unroll
        for (int j = 0; j < kMaxGroup; ++j) {
          if (j < group) {
            float s = 0.0f;
#pragma unroll
            for (int e = 0; e < E; ++e) s += q[j][e] * kr[e];
            s = WarpSum(s);
            const float nm = fmaxf(m[j], s);
            const float corr = __expf(m[j] - nm);  // m = -inf: 0
            const float p = __expf(s - nm);
            l[j] = l[j] * corr + p;
#pragma unroll
            for (int e = 0; e < E; ++e) acc[j][e] = acc[j][e] * corr + p * vr[e];
            m[j] = nm;
          }
        }
      }
    }
  }
  __shared__ float s_m[kWarps][kMaxGroup], s_l[kWarps][kMaxGroup];
  __shared__ float s_acc[kWarps][kMaxGroup][kHeadDim];
#pragma unroll
  for (int j = 0; j < kMaxGroup; ++j) {
    if (j < group) {
      if (lane == 0) {
        s_m[warp][j] = m[j];
        s_l[warp][j] = l[j];
      }
#pragma unroll
      for (int e = 0; e < E; ++e) s_acc[warp][j][lane * E + e] = acc[j][e];
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < group * kHeadDim; idx += blockDim.x) {
    const int j = idx / kHeadDim, d = idx % kHeadDim;
    float mx = -INFINITY;
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, s_m[w][j]);
    float sum = 0.0f, out = 0.0f;
    if (mx != -INFINITY) {
      for (int w = 0; w < kWarps; ++w) {
        const float f = s_m[w][j] == -INFINITY ? 0.0f : __expf(s_m[w][j] - mx);
        sum += f * s_l[w][j];
        out += f * s_acc[w][j][d];
      }
    }
    const int64_t slot =
        (static_cast<int64_t>(row) * heads + g * group + j) * ws.splits + split;
    ws.partial_out[slot * kHeadDim + d] = out;
    if (d == 0) {
      ws.partial_ml[slot * 2] = mx;
      ws.partial_ml[slot * 2 + 1] = sum;
    }
  }
}

template <int kHeadDim>
__global__ void AttentionReduceKernel(AttentionWorkspace ws, int32_t heads, bf16* __restrict__ out) {
  const int32_t h = blockIdx.x, row = blockIdx.y, d = threadIdx.x;
  const int64_t first = (static_cast<int64_t>(row) * heads + h) * ws.splits;
  float mx = -INFINITY;
  for (int32_t s = 0; s < ws.splits; ++s) mx = fmaxf(mx, ws.partial_ml[(first + s) * 2]);
  float sum = 0.0f, acc = 0.0f;
  if (mx != -INFINITY) {
    for (int32_t s = 0; s < ws.splits; ++s) {
      const float ms = ws.partial_ml[(first + s) * 2];
      if (ms == -INFINITY) continue;
      const float f = __expf(ms - mx);
      sum += f * ws.partial_ml[(first + s) * 2 + 1];
      acc += f * ws.partial_out[(first + s) * kHeadDim + d];
    }
  }
  out[(static_cast<int64_t>(row) * heads + h) * kHeadDim + d] =
      __float2bfloat16_rn(sum > 0.0f ? acc / sum : 0.0f);
}

template <typename Kv, int kHeadDim>
absl::Status Run(const float* qkv, StepInputs in, KvLayer<Kv> kv, int32_t heads,
                 int32_t kv_heads, float scale, AttentionWorkspace ws, bf16* out,
                 cudaStream_t stream) {
  const dim3 grid(ws.splits, kv_heads, in.rows);
  AttentionSplitKernel<Kv, kHeadDim><<<grid, kWarps * 32, 0, stream>>>(
      qkv, in, kv, heads, kv_heads, heads / kv_heads, scale, ws);
  KVRM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  AttentionReduceKernel<kHeadDim><<<dim3(heads, in.rows), kHeadDim, 0, stream>>>(ws, heads, out);
  KVRM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace

template <typename Kv>
absl::Status LaunchAttention(const float* qkv, StepInputs in, KvLayer<Kv> kv, int32_t heads,
                             int32_t kv_heads, float scale, AttentionWorkspace ws, bf16* out,
                             cudaStream_t stream) {
  if (in.rows <= 0 || kv_heads <= 0 || heads % kv_heads != 0 ||
      heads / kv_heads > kMaxGroup || ws.splits <= 0 || ws.split_tokens <= 0) {
    return absl::InvalidArgumentError("attention: heads must be a multiple of KV heads (at most " +
                                      std::to_string(kMaxGroup) + " per KV head)");
  }
  // The vector loads: every head's rows start 16-byte aligned (a pool from cudaMalloc, strides
  // in whole rows of 64 or 128 elements).
  if (reinterpret_cast<uintptr_t>(kv.k) % 16 != 0 || reinterpret_cast<uintptr_t>(kv.v) % 16 != 0 ||
      (kv.head_stride * static_cast<int64_t>(sizeof(Kv))) % 16 != 0) {
    return absl::InvalidArgumentError("attention: K/V not 16-byte aligned");
  }
  switch (kv.head_dim) {
    case 64: return Run<Kv, 64>(qkv, in, kv, heads, kv_heads, scale, ws, out, stream);
    case 128: return Run<Kv, 128>(qkv, in, kv, heads, kv_heads, scale, ws, out, stream);
    default:
      return absl::InvalidArgumentError("attention: head_dim " + std::to_string(kv.head_dim) +
                                        " (the CUDA kernels take 64 or 128)");
  }
}

template absl::Status LaunchAttention<float>(const float*, StepInputs, KvLayer<float>, int32_t,
                                             int32_t, float, AttentionWorkspace, bf16*,
                                             cudaStream_t);
template absl::Status LaunchAttention<bf16>(const float*, StepInputs, KvLayer<bf16>, int32_t,
                                            int32_t, float, AttentionWorkspace, bf16*,
                                            cudaStream_t);

}  // namespace kvrm::cuda
