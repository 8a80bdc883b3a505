// The two small products of a LoRA adapter's delta, y += B (A x), for a few rows at a time
// (runtime/cpu_rank.h LoraShare). Both are written as axpys over contiguous rows of the
// transposed factors, with each row's sums in registers across the whole reduction:
//   LoraShrink: mid[i][k] = sum_c x[i][c] * at[c][k]       (at = A^T, [in][rank_stride])
//   LoraExpand: y[i][o] += sum_k mid[i][k] * bt[k][o]        (bt = B^T, [rank][out])
// Every row's result depends on that row alone (not on n or the other rows), and the summation
// order is fixed: a row gives the same bits in any batch. Compiled for AVX-512, AVX2 and the
// baseline (KVRM_CPU_CLONES); plain C++ the compiler vectorises.
#ifndef KVRM_KERNELS_CPU_LORA_H_
#define KVRM_KERNELS_CPU_LORA_H_

#include <cstdint>

namespace kvrm {

// Rows a call takes at once (their sums stay in registers).
inline constexpr int32_t kLoraRowBlock = 4;
// at's rows are padded to a multiple of this many ranks (zeros past the rank).
inline constexpr int32_t kLoraRankLanes = 16;

// Rows x[i * ldx, + in) for i < n <= kLoraRowBlock; `at` [in][rank_stride] with rank_stride a
// multiple of kLoraRankLanes >= rank; writes mid[i * rank_stride + k] for k < rank_stride.
void LoraShrink(const float* x, int64_t ldx, int32_t n, const float* at, int64_t in,
                int32_t rank_stride, float* mid);

// y[i * ldy + o] += sum_{k < rank} mid[i * rank_stride + k] * bt[k * out + o] for o in
// [begin, end), i < n <= kLoraRowBlock.
void LoraExpand(const float* mid, int32_t n, int32_t rank, int32_t rank_stride, const float* bt,
                int64_t out, int64_t begin, int64_t end, float* y, int64_t ldy);

}  // namespace kvrm

#endif  // KVRM_KERNELS_CPU_LORA_H_
