#include "kernels/cpu/lora.h"

#include "kernels/cpu/isa.h"

namespace kvrm {
namespace {

constexpr int kLanes = kLoraRankLanes;

// Inlined into each clone of LoraShrink / LoraExpand, so compiled for its instruction set.
template <int N>
inline __attribute__((always_inline)) void ShrinkRows(const float* __restrict x, int64_t ldx,
                                                      const float* __restrict at, int64_t in,
                                                      int32_t rank_stride, float* __restrict mid) {
  for (int32_t k0 = 0; k0 < rank_stride; k0 += kLanes) {
    float acc[N][kLanes] = {};
    for (int64_t c = 0; c < in; ++c) {
      const float* __restrict a = at + c * rank_stride + k0;
      for (int i = 0; i < N; ++i) {
        const float v = x[i * ldx + c];
        for (int l = 0; l < kLanes; ++l) acc[i][l] += v * a[l];
      }
    }
    for (int i = 0; i < N; ++i) {
      for (int l = 0; l < kLanes; ++l) mid[i * rank_stride + k0 + l] = acc[i][l];
    }
  }
}

template <int N>
inline __attribute__((always_inline)) void ExpandRows(const float* __restrict mid, int32_t rank,
                                                      int32_t rank_stride,
                                                      const float* __restrict bt, int64_t out,
                                                      int64_t begin, int64_t end,
                                                      float* __restrict y, int64_t ldy) {
  int64_t o = begin;
  for (; o + kLanes <= end; o += kLanes) {
    float acc[N][kLanes];
    for (int i = 0; i < N; ++i) {
      for (int l = 0; l < kLanes; ++l) acc[i][l] = y[i * ldy + o + l];
    }
    for (int32_t k = 0; k < rank; ++k) {
      const float* __restrict b = bt + k * out + o;
      for (int i = 0; i < N; ++i) {
        const float m = mid[i * rank_stride + k];
        for (int l = 0; l < kLanes; ++l) acc[i][l] += m * b[l];
      }
    }
    for (int i = 0; i < N; ++i) {
      for (int l = 0; l < kLanes; ++l) y[i * ldy + o + l] = acc[i][l];
    }
  }
  for (; o < end; ++o) {  // the same sums, one column at a time
    for (int i = 0; i < N; ++i) {
      float acc = y[i * ldy + o];
      for (int32_t k = 0; k < rank; ++k) acc += mid[i * rank_stride + k] * bt[k * out + o];
      y[i * ldy + o] = acc;
    }
  }
}

}  // namespace

KVRM_CPU_CLONES void LoraShrink(const float* x, int64_t ldx, int32_t n, const float* at, int64_t in,
                                int32_t rank_stride, float* mid) {
  switch (n) {
    case 1:
      return ShrinkRows<1>(x, ldx, at, in, rank_stride, mid);
    case 2:
      return ShrinkRows<2>(x, ldx, at, in, rank_stride, mid);
    case 3:
      return ShrinkRows<3>(x, ldx, at, in, rank_stride, mid);
    case 4:
      return ShrinkRows<4>(x, ldx, at, in, rank_stride, mid);
    default:
      return;
  }
}

KVRM_CPU_CLONES void LoraExpand(const float* mid, int32_t n, int32_t rank, int32_t rank_stride,
                                const float* bt, int64_t out, int64_t begin, int64_t end, float* y,
                                int64_t ldy) {
  switch (n) {
    case 1:
      return ExpandRows<1>(mid, rank, rank_stride, bt, out, begin, end, y, ldy);
    case 2:
      return ExpandRows<2>(mid, rank, rank_stride, bt, out, begin, end, y, ldy);
    case 3:
      return ExpandRows<3>(mid, rank, rank_stride, bt, out, begin, end, y, ldy);
    case 4:
      return ExpandRows<4>(mid, rank, rank_stride, bt, out, begin, end, y, ldy);
    default:
      return;
  }
}

}  // namespace kvrm
