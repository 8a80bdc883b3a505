// Attention over run tables, split over the KV length then reduced (flash-decoding style), in
// one launch: device template (per KV element type, head size, query heads per KV head and
// token sets in flight), checked launch wrapper (a template on the KV element type), explicit
// instantiations for f32 and bf16 pools, each instantiating the rest through the dispatch.
//
// One block per (split, KV head, row). A token's K (and V) row is read by a group of
// head_dim / 8 lanes, 8 consecutive elements each (one 16-byte load for bf16, two for f32), so
// a warp covers 32 / (head_dim / 8) tokens at once (4 at head_dim 64, 2 at 128), and each pass
// of the loop issues the loads of kSets such sets before using any: the memory system sees
// 8 to 16 tokens' K and V in flight per warp instead of one, which is what the decode step's
// time is made of. A token's score is reduced over its lane group only (3 or 4 shuffles); each
// lane keeps an online softmax per query head of the group for its tokens, one correction per
// pass. Lane groups then merge within the warp (shuffles), warps through shared memory, into
// one partial (max, sum, output) per head and split. The grid covers every split of max
// context, so the shape never changes; a split past a row's length writes an empty partial.
//
// The reduction: each block counts itself done for its (row, KV head) after its partials are
// visible (a fence, then an atomic add); the block that brings the count to `splits` merges
// every split's partials of its query heads into the bf16 output and puts the count back to
// zero for the next launch (no second kernel, no reset between graph replays).
//
// The run cursor needs each table's runs in logical order, each starting where the last ended
// (run_start[r + 1] = run_start[r] + run_blocks[r] * block_tokens), as PackTable
// (runtime/cuda/step_packing.cc) lays them out.
//
// Loads are aligned: a token's row starts at a multiple of head_dim elements from a 256-byte
// aligned pool, and each lane's 8 elements at a multiple of 8 (32 bytes f32, 16 bytes bf16).
// All arithmetic is f32 whatever the pool's type (bf16 is widened exactly).
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/llama_kernels.h"

namespace kvrm::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxGroup = 8;
constexpr int kLaneElems = 8;  // K/V (and Q) elements one lane holds of a token's row

// 8 consecutive elements at p (32-byte aligned f32, 16-byte aligned bf16), widened to f32.
__device__ __forceinline__ void Load8(const float* p, float* out) {
  const float4 a = *reinterpret_cast<const float4*>(p);
  const float4 b = *reinterpret_cast<const float4*>(p + 4);
  out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
  out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
}
__device__ __forceinline__ void Load8(const bf16* p, float* out) {
  const uint4 w = *reinterpret_cast<const uint4*>(p);
  WidenBf16x2(w.x, out);
  WidenBf16x2(w.y, out + 2);
  WidenBf16x2(w.z, out + 4);
  WidenBf16x2(w.w, out + 6);
}

// Folds state (om, ol, oacc) into (m, l, acc): the merge of two online softmaxes.
__device__ __forceinline__ void Merge(float& m, float& l, float* acc, float om, float ol,
                                      const float* oacc) {
  const float nm = fmaxf(m, om);
  if (nm == -INFINITY) return;  // both empty
  const float a = __expf(m - nm), b = __expf(om - nm);  // an empty side (-inf) weighs 0
  l = l * a + ol * b;
#pragma unroll
  for (int e = 0; e < kLaneElems; ++e) acc[e] = acc[e] * a + oacc[e] * b;
  m = nm;
}

template <typename Kv, int kHeadDim, int kGroup, int kSets>
__global__ void __launch_bounds__(kWarps * 32)
    AttentionKernel(const float* __restrict__ qkv, StepInputs in, KvLayer<Kv> kv, int32_t heads,
                    int32_t kv_heads, float scale, int32_t window, AttentionWorkspace ws,
                    bf16* __restrict__ out) {
  constexpr int kLanesPerToken = kHeadDim / kLaneElems;  // 8 or 16
  constexpr int kTokensPerWarp = 32 / kLanesPerToken;    // 4 or 2
  constexpr int kStride = kWarps * kTokensPerWarp;       // tokens one set of the block covers
  const int32_t split = blockIdx.x, g = blockIdx.y, row = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int tg = lane / kLanesPerToken;              // the lane's token in the warp's set
  const int li = lane % kLanesPerToken;              // its slice of the row: li * 8 onwards
  const int32_t len = in.active[row] ? in.position[row] + 1 : 0;
  // A sliding-window layer reads the row's last `window` positions: the splits before them are
  // empty, the one they start in begins there (its tokens still go to lanes from that start,
  // whatever the layout).
  const int32_t lo = window > 0 && len > window ? len - window : 0;
  const int32_t end = min(len, (split + 1) * ws.split_tokens);
  const int32_t begin = max(split * ws.split_tokens, lo);
  const int64_t first_slot = (static_cast<int64_t>(row) * heads + g * kGroup) * ws.splits;
  if (begin >= end) {
    // A split past the row's length or before its window (the whole block alike): only its -inf
    // marker, on which the reduction skips it without reading its partial_out (64 slots at 4096
    // context would otherwise write ~6 MB of zeros a layer).
    for (int j = threadIdx.x; j < kGroup; j += blockDim.x) {
      const int64_t slot = first_slot + j * ws.splits + split;
      ws.partial_ml[slot * 2] = -INFINITY;
      ws.partial_ml[slot * 2 + 1] = 0.0f;
    }
  } else {
    float m[kGroup], l[kGroup], acc[kGroup][kLaneElems], q[kGroup][kLaneElems];
    const float* qrow = qkv + static_cast<int64_t>(row) * (heads + 2 * kv_heads) * kHeadDim +
                        static_cast<int64_t>(g) * kGroup * kHeadDim;
#pragma unroll
    for (int j = 0; j < kGroup; ++j) {
      m[j] = -INFINITY;
      l[j] = 0.0f;
      Load8(qrow + j * kHeadDim + li * kLaneElems, q[j]);
#pragma unroll
      for (int e = 0; e < kLaneElems; ++e) {
        q[j][e] *= scale;
        acc[j][e] = 0.0f;
      }
    }
    const int32_t table = in.table[row];
    const int64_t base = static_cast<int64_t>(table) * in.max_runs;
    const int32_t num_runs = in.num_runs[table];
    const Kv* kbase = kv.k + g * kv.head_stride + li * kLaneElems;
    const Kv* vbase = kv.v + g * kv.head_stride + li * kLaneElems;
    // Tokens go to lanes, sets and passes by logical position from the split's start, never by
    // where the runs break: the sums are then added in the same order whatever the physical
    // layout (one run, or fragments after compaction and swaps), so a row's output does not
    // depend on it, bit for bit. Each lane follows its (rising) positions through the run table
    // with a cursor: run, its logical [rs, re), and phys(pos) = pos + shift.
    int32_t run = -1, rs = 0, re = 0;
    int64_t shift = 0;
    // Warp-uniform bounds (every lane takes part in the shuffles); a lane past the end, or on a
    // position no run holds, loads nothing and scores -inf.
    for (int32_t set = begin + warp * kTokensPerWarp; set < end; set += kSets * kStride) {
      float kr[kSets][kLaneElems], vr[kSets][kLaneElems];
      bool ok[kSets];
#pragma unroll
      for (int t = 0; t < kSets; ++t) {
        const int32_t p = set + t * kStride + tg;
        ok[t] = p < end;
        if (ok[t]) {
          while (p >= re && run + 1 < num_runs) {
            ++run;
            rs = in.run_start[base + run];
            re = rs + in.run_blocks[base + run] * kv.block_tokens;
            shift = static_cast<int64_t>(in.run_first[base + run]) * kv.block_tokens - rs;
          }
          ok[t] = p >= rs && p < re;
        }
#pragma unroll
        for (int e = 0; e < kLaneElems; ++e) kr[t][e] = vr[t][e] = 0.0f;
        if (ok[t]) {
          Load8(kbase + (shift + p) * kHeadDim, kr[t]);
          Load8(vbase + (shift + p) * kHeadDim, vr[t]);
        }
      }
      {
#pragma unroll
        for (int j = 0; j < kGroup; ++j) {
          float sc[kSets];
#pragma unroll
          for (int t = 0; t < kSets; ++t) {
            sc[t] = 0.0f;
#pragma unroll
            for (int e = 0; e < kLaneElems; ++e) sc[t] += q[j][e] * kr[t][e];
          }
#pragma unroll
          for (int off = kLanesPerToken / 2; off > 0; off /= 2) {
#pragma unroll
            for (int t = 0; t < kSets; ++t) sc[t] += __shfl_xor_sync(0xffffffffu, sc[t], off);
          }
          float nm = m[j];
#pragma unroll
          for (int t = 0; t < kSets; ++t) {
            sc[t] = ok[t] ? sc[t] : -INFINITY;
            nm = fmaxf(nm, sc[t]);
          }
          if (nm != -INFINITY) {
            const float corr = __expf(m[j] - nm);  // m = -inf: 0
            l[j] *= corr;
#pragma unroll
            for (int e = 0; e < kLaneElems; ++e) acc[j][e] *= corr;
#pragma unroll
            for (int t = 0; t < kSets; ++t) {
              const float w = __expf(sc[t] - nm);  // -inf (no token): 0
              l[j] += w;
#pragma unroll
              for (int e = 0; e < kLaneElems; ++e) acc[j][e] += w * vr[t][e];
            }
            m[j] = nm;
          }
        }
      }
    }
    // The warp's lane groups hold the same slices of different tokens: merge them (lanes li,
    // li + kLanesPerToken, ... end alike).
#pragma unroll
    for (int off = kLanesPerToken; off < 32; off *= 2) {
#pragma unroll
      for (int j = 0; j < kGroup; ++j) {
        float oacc[kLaneElems];
        const float om = __shfl_xor_sync(0xffffffffu, m[j], off);
        const float ol = __shfl_xor_sync(0xffffffffu, l[j], off);
#pragma unroll
        for (int e = 0; e < kLaneElems; ++e) {
          oacc[e] = __shfl_xor_sync(0xffffffffu, acc[j][e], off);
        }
        Merge(m[j], l[j], acc[j], om, ol, oacc);
      }
    }
    __shared__ float s_m[kWarps][kGroup], s_l[kWarps][kGroup];
    __shared__ float s_acc[kWarps][kGroup][kHeadDim];
    if (tg == 0) {
#pragma unroll
      for (int j = 0; j < kGroup; ++j) {
        if (li == 0) {
          s_m[warp][j] = m[j];
          s_l[warp][j] = l[j];
        }
#pragma unroll
        for (int e = 0; e < kLaneElems; ++e) s_acc[warp][j][li * kLaneElems + e] = acc[j][e];
      }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < kGroup * kHeadDim; idx += blockDim.x) {
      const int j = idx / kHeadDim, d = idx % kHeadDim;
      float mx = -INFINITY;
      for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, s_m[w][j]);
      float sum = 0.0f, o = 0.0f;
      if (mx != -INFINITY) {
        for (int w = 0; w < kWarps; ++w) {
          const float f = s_m[w][j] == -INFINITY ? 0.0f : __expf(s_m[w][j] - mx);
          sum += f * s_l[w][j];
          o += f * s_acc[w][j][d];
        }
      }
      const int64_t slot = first_slot + j * ws.splits + split;
      ws.partial_out[slot * kHeadDim + d] = o;
      if (d == 0) {
        ws.partial_ml[slot * 2] = mx;
        ws.partial_ml[slot * 2 + 1] = sum;
      }
    }
  }

  // Done: the last of the (row, KV head)'s splits to finish merges them all.
  __shared__ bool s_last;
  __threadfence();  // this block's partials, visible device-wide before it counts itself done
  __syncthreads();
  int32_t* const done = ws.done + static_cast<int64_t>(row) * kv_heads + g;
  if (threadIdx.x == 0) {
    // Release by the counting thread too (after the barrier: cumulative over the block's writes),
    // as the PTX memory model has it, not only by each writer before the barrier.
    __threadfence();
    s_last = atomicAdd(done, 1) == ws.splits - 1;
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();  // the other blocks' partials: read below from L2 (__ldcg), never a stale L1
  for (int idx = threadIdx.x; idx < kGroup * kHeadDim; idx += blockDim.x) {
    const int j = idx / kHeadDim, d = idx % kHeadDim;
    const int64_t first = first_slot + j * ws.splits;
    float mx = -INFINITY;
    for (int32_t sp = 0; sp < ws.splits; ++sp) mx = fmaxf(mx, __ldcg(ws.partial_ml + (first + sp) * 2));
    float sum = 0.0f, o = 0.0f;
    if (mx != -INFINITY) {
      for (int32_t sp = 0; sp < ws.splits; ++sp) {
        const float ms = __ldcg(ws.partial_ml + (first + sp) * 2);
        if (ms == -INFINITY) continue;
        const float f = __expf(ms - mx);
        sum += f * __ldcg(ws.partial_ml + (first + sp) * 2 + 1);
        o += f * __ldcg(ws.partial_out + (first + sp) * kHeadDim + d);
      }
    }
    out[(static_cast<int64_t>(row) * heads + g * kGroup + j) * kHeadDim + d] =
        __float2bfloat16_rn(sum > 0.0f ? o / sum : 0.0f);
  }
  if (threadIdx.x == 0) *done = 0;  // for the next launch (kernel boundaries order it)
}

template <typename Kv, int kHeadDim, int kGroup>
absl::Status Run(const float* qkv, StepInputs in, KvLayer<Kv> kv, int32_t heads,
                 int32_t kv_heads, float scale, int32_t window, AttentionWorkspace ws, bf16* out,
                 cudaStream_t stream) {
  const dim3 grid(ws.splits, kv_heads, in.rows);
  if (ws.token_sets == 4) {
    AttentionKernel<Kv, kHeadDim, kGroup, 4><<<grid, kWarps * 32, 0, stream>>>(
        qkv, in, kv, heads, kv_heads, scale, window, ws, out);
  } else {
    AttentionKernel<Kv, kHeadDim, kGroup, 2><<<grid, kWarps * 32, 0, stream>>>(
        qkv, in, kv, heads, kv_heads, scale, window, ws, out);
  }
  KVRM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

// The query heads per KV head as a compile-time constant (the registers a lane holds scale
// with it): 1 to kMaxGroup.
template <typename Kv, int kHeadDim>
absl::Status RunGroup(const float* qkv, StepInputs in, KvLayer<Kv> kv, int32_t heads,
                      int32_t kv_heads, float scale, int32_t window, AttentionWorkspace ws,
                      bf16* out, cudaStream_t stream) {
  switch (heads / kv_heads) {
    case 1: return Run<Kv, kHeadDim, 1>(qkv, in, kv, heads, kv_heads, scale, window, ws, out, stream);
    case 2: return Run<Kv, kHeadDim, 2>(qkv, in, kv, heads, kv_heads, scale, window, ws, out, stream);
    case 3: return Run<Kv, kHeadDim, 3>(qkv, in, kv, heads, kv_heads, scale, window, ws, out, stream);
    case 4: return Run<Kv, kHeadDim, 4>(qkv, in, kv, heads, kv_heads, scale, window, ws, out, stream);
    case 5: return Run<Kv, kHeadDim, 5>(qkv, in, kv, heads, kv_heads, scale, window, ws, out, stream);
    case 6: return Run<Kv, kHeadDim, 6>(qkv, in, kv, heads, kv_heads, scale, window, ws, out, stream);
    case 7: return Run<Kv, kHeadDim, 7>(qkv, in, kv, heads, kv_heads, scale, window, ws, out, stream);
    case 8: return Run<Kv, kHeadDim, 8>(qkv, in, kv, heads, kv_heads, scale, window, ws, out, stream);
    default:
      return absl::InvalidArgumentError("attention: more than 8 query heads per KV head");
  }
}

}  // namespace

template <typename Kv>
absl::Status LaunchAttention(const float* qkv, StepInputs in, KvLayer<Kv> kv, int32_t heads,
                             int32_t kv_heads, float scale, int32_t window, AttentionWorkspace ws,
                             bf16* out, cudaStream_t stream) {
  if (in.rows <= 0 || kv_heads <= 0 || heads % kv_heads != 0 ||
      heads / kv_heads > kMaxGroup || ws.splits <= 0 || ws.split_tokens <= 0 ||
      ws.done == nullptr || (ws.token_sets != 2 && ws.token_sets != 4) || window < 0) {
    return absl::InvalidArgumentError(
        "attention: heads must be a multiple of KV heads (at most " + std::to_string(kMaxGroup) +
        " per KV head), with a workspace of splits, split counters and 2 or 4 token sets");
  }
  // The vector loads: every head's rows start 16-byte aligned (a pool from cudaMalloc, strides
  // in whole rows of 64 or 128 elements), and so do Q's.
  if (reinterpret_cast<uintptr_t>(kv.k) % 16 != 0 || reinterpret_cast<uintptr_t>(kv.v) % 16 != 0 ||
      (kv.head_stride * static_cast<int64_t>(sizeof(Kv))) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(qkv) % 16 != 0) {
    return absl::InvalidArgumentError("attention: Q, K or V not 16-byte aligned");
  }
  switch (kv.head_dim) {
    case 64: return RunGroup<Kv, 64>(qkv, in, kv, heads, kv_heads, scale, window, ws, out, stream);
    case 128: return RunGroup<Kv, 128>(qkv, in, kv, heads, kv_heads, scale, window, ws, out, stream);
    default:
      return absl::InvalidArgumentError("attention: head_dim " + std::to_string(kv.head_dim) +
                                        " (the CUDA kernels take 64 or 128)");
  }
}

template absl::Status LaunchAttention<float>(const float*, StepInputs, KvLayer<float>, int32_t,
                                             int32_t, float, int32_t, AttentionWorkspace, bf16*,
                                             cudaStream_t);
template absl::Status LaunchAttention<bf16>(const float*, StepInputs, KvLayer<bf16>, int32_t,
                                            int32_t, float, int32_t, AttentionWorkspace, bf16*,
                                            cudaStream_t);

}  // namespace kvrm::cuda
