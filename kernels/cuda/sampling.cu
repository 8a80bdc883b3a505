// Sampling on the device: one block per row over the row's logits (penalties, temperature,
// top-k / top-p / min-p as probability thresholds found by bisection on the float bit pattern,
// inverse CDF at the row's uniform). Device template, checked launch wrapper.
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/llama_kernels.h"

namespace kvrm::cuda {
namespace {

constexpr int kThreads = 1024;

// Largest threshold t (as non-negative float bits) with mass_or_count(p >= t) >= need: the
// predicate falls as t grows, so bisect over [0, bits(1.0f)].
template <bool kMass>
__device__ float Bisect(const float* p, int32_t vocab, float floor_threshold, float need,
                        float* shared) {
  uint32_t lo = __float_as_uint(floor_threshold), hi = __float_as_uint(1.0f) + 1;
  while (hi - lo > 1) {
    const uint32_t mid = lo + (hi - lo) / 2;
    const float t = __uint_as_float(mid);
    float local = 0.0f;
    for (int32_t v = threadIdx.x; v < vocab; v += blockDim.x) {
      if (p[v] >= t) local += kMass ? p[v] : 1.0f;
    }
    if (BlockSum(local, shared) >= need) lo = mid; else hi = mid;
  }
  return __uint_as_float(lo);
}

__global__ void __launch_bounds__(kThreads)
    SampleKernel(float* __restrict__ logits, StepInputs in, int32_t vocab,
                 const SamplingRow* __restrict__ params, const int32_t* __restrict__ counts,
                 const uint8_t* __restrict__ seen, float* __restrict__ probs,
                 int32_t* __restrict__ tokens_out) {
  __shared__ float shared[32];
  __shared__ float s_chunk[kThreads];
  __shared__ int s_best_id[32];
  __shared__ float s_best_val[32];
  __shared__ int s_first_max;  // lowest id at the max logit: always kept, the draw's fallback
  __shared__ int s_writer;     // the one thread that walks its chunk for the draw
  const int32_t row = blockIdx.x;
  if (!in.active[row]) {
    if (threadIdx.x == 0) tokens_out[row] = 0;
    return;
  }
  const SamplingRow P = params[row];
  if (threadIdx.x == 0) {
    tokens_out[row] = 0;  // overwritten below; only a degenerate row keeps it
    s_first_max = 0x7fffffff;  // published by BlockMax's barriers below
  }
  float* x = logits + static_cast<int64_t>(row) * vocab;
  float* p = probs + static_cast<int64_t>(row) * vocab;
  // No penalty state (null arrays): nothing to read per id but the logit.
  const bool penalize = counts != nullptr && seen != nullptr;
  const int32_t* cnt = penalize ? counts + static_cast<int64_t>(row) * vocab : nullptr;
  const uint8_t* sn = penalize ? seen + static_cast<int64_t>(row) * vocab : nullptr;

  // Penalties; NaN counts as -inf.
  float local_max = -INFINITY;
  for (int32_t v = threadIdx.x; v < vocab; v += blockDim.x) {
    float val = x[v];
    if (isnan(val)) val = -INFINITY;
    if (penalize) {
      if (P.repetition_penalty != 1.0f && sn[v]) {
        val = val > 0.0f ? val / P.repetition_penalty : val * P.repetition_penalty;
      }
      const int32_t c = cnt[v];
      if (c > 0) val -= P.presence_penalty + P.frequency_penalty * static_cast<float>(c);
    }
    x[v] = val;
    local_max = fmaxf(local_max, val);
  }
  const float mx = BlockMax(local_max, shared);

  if (P.temperature == 0.0f || mx == -INFINITY) {
    // Argmax, lowest id on ties.
    float best = -INFINITY;
    int best_id = 0x7fffffff;
    for (int32_t v = threadIdx.x; v < vocab; v += blockDim.x) {
      if (x[v] > best || (x[v] == best && v < best_id)) {
        best = x[v];
        best_id = v;
      }
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, offset);
      const int oi = __shfl_xor_sync(0xffffffffu, best_id, offset);
      if (ob > best || (ob == best && oi < best_id)) {
        best = ob;
        best_id = oi;
      }
    }
    if (threadIdx.x % 32 == 0) {
      s_best_val[threadIdx.x / 32] = best;
      s_best_id[threadIdx.x / 32] = best_id;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < kThreads / 32; ++w) {
        if (s_best_val[w] > best || (s_best_val[w] == best && s_best_id[w] < best_id)) {
          best = s_best_val[w];
          best_id = s_best_id[w];
        }
      }
      tokens_out[row] = best_id == 0x7fffffff ? 0 : best_id;
    }
    return;
  }

  // Unnormalised probabilities, max entry 1 (+inf logits: uniform over them).
  const bool has_inf = mx == INFINITY;
  for (int32_t v = threadIdx.x; v < vocab; v += blockDim.x) {
    p[v] = has_inf ? (x[v] == INFINITY ? 1.0f : 0.0f) : __expf((x[v] - mx) / P.temperature);
    if (x[v] == mx) atomicMin(&s_first_max, v);
  }
  __syncthreads();
  float threshold = 0.0f;
  if (P.top_k > 0 && P.top_k < vocab) {
    threshold = Bisect<false>(p, vocab, 0.0f, static_cast<float>(P.top_k), shared);
  }
  if (P.top_p < 1.0f) {
    float kept = 0.0f;
    for (int32_t v = threadIdx.x; v < vocab; v += blockDim.x) kept += p[v] >= threshold ? p[v] : 0.0f;
    kept = BlockSum(kept, shared);
    threshold = Bisect<true>(p, vocab, threshold, P.top_p * kept, shared);
  }
  if (P.min_p > 0.0f) threshold = fmaxf(threshold, P.min_p);  // relative to the max entry, 1
  // p == 0 never counts as kept (threshold 0 would keep underflowed entries).
  const float keep = fmaxf(threshold, 1e-38f);

  // Inverse CDF in id order: per-thread contiguous chunks, a block scan, then one thread walks
  // its chunk.
  const int32_t chunk = (vocab + kThreads - 1) / kThreads;
  const int32_t lo = threadIdx.x * chunk, hi = min(vocab, lo + chunk);
  float mine = 0.0f;
  for (int32_t v = lo; v < hi; ++v) mine += p[v] >= keep ? p[v] : 0.0f;
  s_chunk[threadIdx.x] = mine;
  __syncthreads();
  // Inclusive Hillis-Steele scan over kThreads values.
  for (int offset = 1; offset < kThreads; offset *= 2) {
    const float add = threadIdx.x >= offset ? s_chunk[threadIdx.x - offset] : 0.0f;
    __syncthreads();
    s_chunk[threadIdx.x] += add;
    __syncthreads();
  }
  const float total = s_chunk[kThreads - 1];
  const float target = P.uniform * total;
  const float before = threadIdx.x > 0 ? s_chunk[threadIdx.x - 1] : 0.0f;
  const float through = s_chunk[threadIdx.x];
  // Exactly one chunk holds the target (chunks without mass have before == through); when
  // rounding puts the target at the total, the last chunk with mass takes it.
  // The scan's prefix sums come from different addition trees, so a chunk without mass may still
  // span a sliver of rounding; if the target lands there no chunk holds it, and the row keeps
  // the max logit's id (always kept) rather than an id outside the support.
  // Nor are the sums guaranteed monotonic, so two chunks' intervals may overlap at a rounding
  // sliver: the lowest chunk that holds the target is the one that writes.
  if (threadIdx.x == 0) {
    tokens_out[row] = s_first_max == 0x7fffffff ? 0 : s_first_max;
    s_writer = kThreads;
  }
  __syncthreads();
  const bool holds = mine > 0.0f && before <= target && target < through;
  const bool last = mine > 0.0f && target >= total && through >= total && before < total;
  if (holds || last) atomicMin(&s_writer, static_cast<int>(threadIdx.x));
  __syncthreads();
  if (static_cast<int>(threadIdx.x) == s_writer) {
    float c = before;
    int32_t pick = -1;
    for (int32_t v = lo; v < hi; ++v) {
      if (p[v] < keep) continue;
      pick = v;
      c += p[v];
      if (c > target) break;
    }
    if (pick >= 0) tokens_out[row] = pick;
  }
  // The processed logits, as the CPU sampler leaves them.
  for (int32_t v = threadIdx.x; v < vocab; v += blockDim.x) {
    x[v] = p[v] >= keep ? (has_inf ? 0.0f : (x[v] - mx) / P.temperature) : -INFINITY;
  }
}

__global__ void InterleaveShardsKernel(const float* __restrict__ gathered, int32_t ranks,
                                       int32_t rows, int32_t share, float* __restrict__ full) {
  const int64_t per_rank = static_cast<int64_t>(rows) * share;
  const int64_t total = per_rank * ranks;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t k = i / per_rank, rest = i - k * per_rank;
    const int64_t row = rest / share, j = rest - row * share;
    full[row * (static_cast<int64_t>(ranks) * share) + k * share + j] = gathered[i];
  }
}

__global__ void AcceptKernel(const int32_t* __restrict__ tokens, StepInputs in, int32_t vocab,
                             int32_t* __restrict__ counts, uint8_t* __restrict__ seen) {
  const int32_t row = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= in.rows || !in.active[row]) return;
  const int32_t t = tokens[row];
  if (t < 0 || t >= vocab) return;
  counts[static_cast<int64_t>(row) * vocab + t] += 1;
  seen[static_cast<int64_t>(row) * vocab + t] = 1;
}

}  // namespace

absl::Status LaunchSample(float* logits, StepInputs in, int32_t vocab, const SamplingRow* params,
                          const int32_t* counts, const uint8_t* seen, float* probs,
                          int32_t* tokens_out, cudaStream_t stream) {
  if (in.rows <= 0 || vocab <= 0) return absl::InvalidArgumentError("sample: empty shape");
  SampleKernel<<<in.rows, kThreads, 0, stream>>>(logits, in, vocab, params, counts, seen, probs,
                                                 tokens_out);
  KVRM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status LaunchInterleaveShards(const float* gathered, int32_t ranks, int32_t rows,
                                    int32_t share, float* full, cudaStream_t stream) {
  if (ranks <= 0 || rows <= 0 || share <= 0) {
    return absl::InvalidArgumentError("interleave shards: empty shape");
  }
  const int64_t total = static_cast<int64_t>(ranks) * rows * share;
  const int blocks = static_cast<int>(std::min<int64_t>((total + 255) / 256, 4096));
  InterleaveShardsKernel<<<blocks, 256, 0, stream>>>(gathered, ranks, rows, share, full);
  KVRM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status LaunchAcceptTokens(const int32_t* tokens, StepInputs in, int32_t vocab,
                                int32_t* counts, uint8_t* seen, cudaStream_t stream) {
  if (in.rows <= 0 || vocab <= 0) return absl::InvalidArgumentError("accept: empty shape");
  AcceptKernel<<<(in.rows + 127) / 128, 128, 0, stream>>>(tokens, in, vocab, counts, seen);
  KVRM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace kvrm::cuda
