// q8_0 weights on the CPU: GGUF's 8-bit block format (ggml's block_q8_0) and what the kernels
// need around it.
//
// A block is 32 consecutive input features of one output row: an f16 scale d and 32 int8 q in
// [-127, 127], value d * q (exact in float). 8.5 bits a weight against bf16's 16, so a decode step,
// which reads every weight once, reads about half the bytes.
//
// The matmul (kernels/cpu/matmul.h, every instruction-set path) reads q8_0 panels: per group of
// 16 output rows (WeightMatrix::kPanelRows), per block of 32 columns, WeightMatrix::
// kQ8PanelBlockBytes bytes: the 16 rows' scales (f16), then 16 lines of 32 bytes, line p holding
// q[row l][2p + e] at byte 2 l + e. Activations are quantized per row to int16 (scale amax /
// 32767: an error of at most amax / 65534 per element, finer than bf16's rounding for all but
// the row's smallest values). Each block's sum of q x products is an exact int32; the block sums
// are scaled and added in block order in float (one fused multiply-add each), and the row's sum is
// multiplied by its activation scale. So every path computes the same bits.
#ifndef KVRM_KERNELS_CPU_Q8_0_H_
#define KVRM_KERNELS_CPU_Q8_0_H_

#include <cstdint>

#include "kernels/cpu/weight_matrix.h"

namespace kvrm {

// ggml's reference quantize_row_q8_0 on one block of 32: d = amax / 127 (stored as f16), q =
// round(x / d) half away from zero. A block holding a NaN or an infinity gets d = NaN and q = 0,
// so products with it are NaN, as they would be in float.
void QuantizeBlockQ8_0(const float* x, uint8_t* block);
// y[j] = d * q[j] for the block's 32 values.
void DequantizeBlockQ8_0(const uint8_t* block, float* y);

// A row of `n` values (n a multiple of 32) to and from its n / 32 blocks.
void QuantizeRowQ8_0(const float* x, int64_t n, uint8_t* blocks);
void DequantizeRowQ8_0(const uint8_t* blocks, int64_t n, float* y);

// q8 affine blocks (WeightFormat::kQ8Affine): 32 values s * q + o (one fused multiply-add: exact
// for the GGUF types that become them, whose s * q needs at most 24 bits) with f32 s and o and
// int8 q. What a GGUF file's q4_1, q5_1, q4_K and q5_K matrices hold, exactly (d * q + m per
// block; per 32-value sub-block d * scale * q - dmin * min). Their panels hold the 16 rows' s,
// then their o, then the lines as q8_0's; the product adds o times the block's sum of the
// activation row.
void DequantizeRowQ8Affine(const uint8_t* blocks, int64_t n, float* y);

// q8 halves blocks (WeightFormat::kQ8Halves): 32 values s0 * q (the first 16) and s1 * q (the
// last 16), f32 s0 and s1, int8 q: what a GGUF file's q6_K matrices hold, exactly (d * scale per
// 16 values, q - 32 in [-32, 31]). Their panels hold the 16 rows' s0, then their s1, then the
// lines as q8_0's; the product sums each half apart.
void DequantizeRowQ8Halves(const uint8_t* blocks, int64_t n, float* y);

// MXFP4 blocks (WeightFormat::kMxfp4, weight_matrix.h): twice each FP4 E2M1 code's value, the
// int8 q the q8 kernels multiply (0, 1, 2, 3, 4, 6, 8, 12 and their negatives), and a block's
// d = 2^(e - 128) as the kernels form it: the float whose bits are (e - 1) << 23 (e in [2, 254]).
inline constexpr int8_t kMxfp4Twice[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
inline bool Mxfp4KernelScale(uint8_t e) { return e >= 2 && e <= 254; }
// Whether a block of scale e holds finite values: e <= 252 (from 253, 6 x 2^(e - 127) is past
// float's range; 255 is E8M0's NaN). The loaders refuse blocks of other scales.
inline bool Mxfp4FiniteScale(uint8_t e) { return e <= 252; }
float Mxfp4HalfScale(uint8_t e);
// The n values (n a multiple of 32) of a row of MXFP4 blocks, exactly (any e but 255).
void DequantizeRowMxfp4(const uint8_t* blocks, int64_t n, float* y);

// Columns of a q8_0 panel row: `cols` rounded up to whole blocks.
inline int64_t Q8PaddedCols(int64_t cols) {
  return (cols + WeightMatrix::kQ8Block - 1) / WeightMatrix::kQ8Block * WeightMatrix::kQ8Block;
}

// The activations of a q8_0 product: row i of x (k columns, rows ldx apart) as int16
// q[i * kp + c] = round(x * 32767 / amax) (ties to even), zero-padded to kp columns, with
// scale[i] = amax / 32767 (0 for a row of zeros; NaN when the row holds a NaN or an infinity, so
// its products are NaN). With `block_sums`, also each row's sum of q over every 32 columns
// (exact in float), kp / 32 a row (the q8 affine product's offsets multiply them).
void QuantizeActivationsQ8(const float* x, int64_t n, int64_t ldx, int64_t k, int64_t kp,
                           int16_t* q, float* scale, float* block_sums = nullptr);

// Activation rows the q8_0 kernels quantize at a time for `cols` columns (a block that stays in
// L2 while the panels stream by), and the scratch bytes a thread needs for them (the int16 rows,
// twice, and their scales): never less for more columns, so one scratch sized for the widest
// matrix serves the others.
int64_t Q8ActivationBlockRows(int64_t cols);
int64_t Q8ScratchBytes(int64_t cols);

}  // namespace kvrm

#endif  // KVRM_KERNELS_CPU_Q8_0_H_
