// The two small products of a LoRA adapter's delta, y += B (A x), for the rows of one adapter in
// a pass (runtime/cpu_rank.h LoraShare), with the transposed factors (f32, or bf16: below):
//   LoraShrink: mid[j][k] = sum_c x[rows[j]][c] * at[c][k]     (at = A^T, [in][rank_stride])
//   LoraExpand: y[rows[j]][o] += sum_k mid[j][k] * bt[k][o]      (bt = B^T, [rank][out])
// The factors are read from memory once per call whatever the number of rows: the loops walk
// them in slabs that stay in L1 while every row takes its turn. AVX-512 (lora_avx512.cc) where
// ActiveCpuIsa has it, plain loops elsewhere. Each row's sums run in a fixed order (over c for
// shrink, over k for expand, one after the other), whatever rows share the call and however the
// loops are cut: a row gives the same bits in any batch.
#ifndef KVRM_KERNELS_CPU_LORA_H_
#define KVRM_KERNELS_CPU_LORA_H_

#include <cstdint>

namespace kvrm {

// at's rows are padded to a multiple of this many ranks (zeros past the rank).
inline constexpr int32_t kLoraRankLanes = 16;

// Rows x + rows[j] * ldx (each `in` values) for j < n; `at` [in][rank_stride] with rank_stride a
// multiple of kLoraRankLanes; writes mid[j * rank_stride + k] for k < rank_stride.
void LoraShrink(const float* x, int64_t ldx, const int32_t* rows, int32_t n, const float* at,
                int64_t in, int32_t rank_stride, float* mid);

// y[rows[j] * ldy + o] += sum_{k < rank} mid[j * rank_stride + k] * bt[k * out + o] for o in
// [begin, end), j < n.
void LoraExpand(const float* mid, const int32_t* rows, int32_t n, int32_t rank,
                int32_t rank_stride, const float* bt, int64_t out, int64_t begin, int64_t end,
                float* y, int64_t ldy);

// The same with the factors in bf16 (each uint16_t a bf16's bits; half the bytes to read): each
// product is the f32 one with the factor's value widened exactly, so a row's sums are those of
// the f32 kernels given the same values.
void LoraShrink(const float* x, int64_t ldx, const int32_t* rows, int32_t n, const uint16_t* at,
                int64_t in, int32_t rank_stride, float* mid);
void LoraExpand(const float* mid, const int32_t* rows, int32_t n, int32_t rank,
                int32_t rank_stride, const uint16_t* bt, int64_t out, int64_t begin, int64_t end,
                float* y, int64_t ldy);

}  // namespace kvrm

#endif  // KVRM_KERNELS_CPU_LORA_H_
