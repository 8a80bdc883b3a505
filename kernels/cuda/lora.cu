// LoRA adapters' shrink and expand products on a projection's rows (the two small products of
// y += scale B (A x), over each row's own adapter as punica's SGMV does): device kernels,
// checked launch wrappers. Launched only in the graphs captured with adapters
// (runtime/cuda/cuda_backend.cc); a step whose rows run none replays graphs without them.
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/llama_kernels.h"

namespace kvrm::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerBlock = 8;

// The adapter row r runs for `target`, or null (base model, empty slot, projection not adapted).
// The same for every thread of a block: the branches on it do not split a barrier.
__device__ __forceinline__ const LoraFactors* RowFactors(const StepInputs& in, int32_t r,
                                                         const LoraFactors* factors, int32_t target,
                                                         int32_t slots) {
  const int32_t a = in.adapter[r] - 1;
  if (a < 0 || a >= slots) return nullptr;
  const LoraFactors* f = factors + static_cast<int64_t>(target) * slots + a;
  return f->rank > 0 ? f : nullptr;
}

// Grid (splits, targets, row groups of kRowsPerBlock). For each row of the group that runs an
// adapter, the block's threads are `lanes` ranks (consecutive k: coalesced loads of at's rows)
// by kThreads / lanes groups of features (each a stride of the split's features, x's value a
// broadcast within a warp); the groups' sums meet in shared memory.
__global__ void __launch_bounds__(kThreads)
    LoraShrinkKernel(const bf16* __restrict__ x, int32_t in, StepInputs rows,
                     const LoraFactors* __restrict__ factors, int32_t slots, int32_t max_rank,
                     int32_t splits, float* __restrict__ partial) {
  __shared__ float sums[kThreads];
  const int32_t split = blockIdx.x, target = blockIdx.y;
  const int32_t per = (in + splits - 1) / splits;
  const int32_t c_begin = split * per;
  const int32_t c_end = min(in, c_begin + per);
  const int32_t r_end = min(rows.rows, static_cast<int32_t>(blockIdx.z + 1) * kRowsPerBlock);
  for (int32_t r = blockIdx.z * kRowsPerBlock; r < r_end; ++r) {
    const LoraFactors* f = RowFactors(rows, r, factors, target, slots);
    if (f == nullptr) continue;
    const int32_t rank = f->rank, stride = f->stride;
    const bf16* __restrict__ at = f->at;
    const int32_t lanes = rank <= 32 ? 32 : rank <= 64 ? 64 : rank <= 128 ? 128 : kThreads;
    const int32_t groups = kThreads / lanes;
    const int32_t lane = threadIdx.x % lanes, group = threadIdx.x / lanes;
    const bf16* __restrict__ xr = x + static_cast<int64_t>(r) * in;
    float* out =
        partial + ((static_cast<int64_t>(target) * splits + split) * rows.rows + r) * max_rank;
    for (int32_t k0 = 0; k0 < rank; k0 += lanes) {
      const int32_t k = k0 + lane;
      float acc = 0.0f;
      if (k < rank) {
        for (int32_t c = c_begin + group; c < c_end; c += groups) {
          acc +=
              __bfloat162float(xr[c]) * __bfloat162float(at[static_cast<int64_t>(c) * stride + k]);
        }
      }
      sums[threadIdx.x] = acc;
      __syncthreads();
      if (group == 0 && k < rank) {
        float total = 0.0f;
        for (int32_t g = 0; g < groups; ++g) total += sums[g * lanes + lane];
        out[k] = total;
      }
      __syncthreads();
    }
  }
}

// Grid (column tiles of kThreads over the widest target, targets, row groups). Per row that runs
// an adapter: its rank's sums (the shrink's splits added) into shared memory, then each thread
// one output column: the rank's products in order, bt's rows read coalesced.
__global__ void __launch_bounds__(kThreads)
    LoraExpandKernel(const float* __restrict__ partial, StepInputs rows,
                     const LoraFactors* __restrict__ factors, int32_t slots, int32_t max_rank,
                     int32_t splits, LoraOutputs outputs, float* y, int64_t ldy) {
  extern __shared__ float mid[];  // [max_rank]
  const int32_t target = blockIdx.y;
  const int32_t out = outputs.out[target];
  if (static_cast<int32_t>(blockIdx.x) * kThreads >= out) return;  // the whole block
  const int32_t o = blockIdx.x * kThreads + threadIdx.x;
  const int32_t r_end = min(rows.rows, static_cast<int32_t>(blockIdx.z + 1) * kRowsPerBlock);
  for (int32_t r = blockIdx.z * kRowsPerBlock; r < r_end; ++r) {
    const LoraFactors* f = RowFactors(rows, r, factors, target, slots);
    if (f == nullptr) continue;
    const int32_t rank = f->rank;
    for (int32_t k = threadIdx.x; k < rank; k += kThreads) {
      float s = 0.0f;
      for (int32_t sp = 0; sp < splits; ++sp) {
        s += partial[((static_cast<int64_t>(target) * splits + sp) * rows.rows + r) * max_rank + k];
      }
      mid[k] = s;
    }
    __syncthreads();
    if (o < out) {
      const bf16* __restrict__ bt = f->bt;
      float acc = 0.0f;
      for (int32_t k = 0; k < rank; ++k) {
        acc += mid[k] * __bfloat162float(bt[static_cast<int64_t>(k) * out + o]);
      }
      y[static_cast<int64_t>(r) * ldy + outputs.col[target] + o] += acc;
    }
    __syncthreads();
  }
}

absl::Status CheckLoraShape(int32_t in, const StepInputs& rows, const LoraFactors* factors,
                            int32_t targets, int32_t slots, int32_t max_rank,
                            const float* partial) {
  if (in < 1 || rows.rows < 1 || targets < 1 || targets > kLoraMaxTargets || slots < 1 ||
      max_rank < 1 || factors == nullptr || partial == nullptr || rows.adapter == nullptr) {
    return absl::InvalidArgumentError("lora: bad shape or missing buffer");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status LaunchLoraShrink(const bf16* x, int32_t in, StepInputs rows,
                              const LoraFactors* factors, int32_t targets, int32_t slots,
                              int32_t max_rank, float* partial, cudaStream_t stream) {
  if (absl::Status st = CheckLoraShape(in, rows, factors, targets, slots, max_rank, partial);
      !st.ok()) {
    return st;
  }
  const int32_t splits = LoraSplits(in);
  const dim3 grid(splits, targets, (rows.rows + kRowsPerBlock - 1) / kRowsPerBlock);
  LoraShrinkKernel<<<grid, kThreads, 0, stream>>>(x, in, rows, factors, slots, max_rank, splits,
                                                  partial);
  KVRM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status LaunchLoraExpand(const float* partial, int32_t in, StepInputs rows,
                              const LoraFactors* factors, int32_t targets, int32_t slots,
                              int32_t max_rank, LoraOutputs outputs, float* y, int64_t ldy,
                              cudaStream_t stream) {
  if (absl::Status st = CheckLoraShape(in, rows, factors, targets, slots, max_rank, partial);
      !st.ok()) {
    return st;
  }
  int32_t widest = 0;
  for (int32_t t = 0; t < targets; ++t) {
    if (outputs.out[t] < 1 || outputs.col[t] < 0 || outputs.col[t] + outputs.out[t] > ldy) {
      return absl::InvalidArgumentError("lora: an output's columns are outside y's rows");
    }
    widest = outputs.out[t] > widest ? outputs.out[t] : widest;
  }
  const dim3 grid((widest + kThreads - 1) / kThreads, targets,
                  (rows.rows + kRowsPerBlock - 1) / kRowsPerBlock);
  LoraExpandKernel<<<grid, kThreads, max_rank * sizeof(float), stream>>>(
      partial, rows, factors, slots, max_rank, LoraSplits(in), outputs, y, ldy);
  KVRM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace kvrm::cuda
