// K-quant weights on the CPU: GGUF's 4-bit and 6-bit super-block formats (ggml's block_q4_K and
// block_q6_K, the two types of a Q4_K_M file), multiplied as they are, ggml's reference q4_K
// quantizer, and what the kernels need around them. q4_K first; q6_K below.
//
// A super-block is 256 consecutive input features of one output row, in 8 sub-blocks of 32: an
// f16 d and an f16 dmin, 6-bit scale sc[j] and min m[j] per sub-block (12 bytes), and 4-bit q
// (128 bytes); value d * sc[j] * q - dmin * m[j] (144 bytes: 4.5 bits a weight against bf16's 16
// and the q8 affine form's 10, so a decode step, which reads every weight once, reads under a
// third of bf16's bytes).
//
// Panels (WeightMatrix::panels, panel_format kQ4K): per group of 16 output rows, per
// super-block, WeightMatrix::kQ4KPanelBlockBytes = 2368 bytes:
//   [0, 32)      the 16 rows' d (f16)
//   [32, 64)     the 16 rows' dmin (f16)
//   [64, 192)    sc: sub-block j's 16 rows at 64 + 16 j (u8)
//   [192, 320)   m:  sub-block j's 16 rows at 192 + 16 j (u8)
//   [320, 2368)  the nibbles: sub-block j's 4 lines of 64 bytes at 320 + 256 j; byte 4 l + e of
//                line t holds q[row l][32 j + 8 t + e] in its low nibble and
//                q[row l][32 j + 8 t + 4 + e] in its high nibble (e < 4)
// so one line, masked or shifted, is 16 rows x 4 u8 that AVX512_VNNI's vpdpbusd multiplies by a
// broadcast group of 4 int8 activations into the 16 rows' int32 sums.
//
// Activations are quantized per 32 columns to int8 (xd = amax / 127, q = round(x / xd): the
// q8_0 rounding with an f32 scale, as llama.cpp's dot products with K-quants take them), with
// each block's xd * sum(q) for the mins. Per sub-block, the product of q and the activations is
// an exact int32; it is scaled by (d * sc) * xd and the min's term -(dmin * m) * xd * sum(q) is
// added, in float, in sub-block order (two fused multiply-adds). So every path computes the same
// bits.
#ifndef KVRM_KERNELS_CPU_Q4_K_H_
#define KVRM_KERNELS_CPU_Q4_K_H_

#include <cstdint>

#include "kernels/cpu/weight_matrix.h"

namespace kvrm {

// Sub-block j's 6-bit scale and min from a super-block's 12 packed bytes (ggml's
// get_scale_min_k4), and the inverse: 8 scales and mins (each < 64) into 12 bytes.
void Q4KScaleMin(int j, const uint8_t* scales, uint8_t* sc, uint8_t* m);
void Q4KPackScaleMin(const uint8_t* sc, const uint8_t* m, uint8_t* scales);

// The K-quants' fit of one sub-block of n values (ggml's make_qkx2_quants): the scale s and the
// min m >= 0 with q = clamp(round((x + m) / s), 0, nmax) that minimize sum_i w_i (s q_i - m -
// x_i)^2 among the least-squares fits of the roundings at nstep + 1 trial scales (nmax + rmin +
// rdelta k) / (max - min), starting from the plain min / max fit; as in ggml, once a trial beats
// the fit so far, later trials round from its min (the search's min moves). ggml's float
// operations in its order: the same bits (//model:ggml_quants_test). Writes q and m; returns s.
float FitKQuantSubBlock(int n, int nmax, const float* x, const float* weights, uint8_t* q,
                        float* min, float rmin, float rdelta, int nstep);
// A K-quant super-block's header (f16 d, f16 dmin, 12 bytes of 6-bit scales and mins: q4_K's
// and q5_K's first 16 bytes) for 256 values, and their q in [0, nmax] under the stored scales:
// each 32-value sub-block fitted with weights rms + |x| (FitKQuantSubBlock with rmin, 0.1,
// nstep), the scales and mins as 6-bit multiples of d = max scale / 63 and dmin = max min / 63,
// then every q rounded again under them (ggml's quantize_row_q4_K_ref / q5_K_ref). A super-block
// holding a NaN or an infinity gets d = NaN (its values read back NaN).
void QuantizeKSuperBlock(const float* x, int nmax, float rmin, int nstep, uint8_t* header,
                         uint8_t* q);
// One q4_K super-block (144 bytes) of 256 values: ggml's reference quantizer (QuantizeKSuperBlock
// with nmax 15, rmin -1, 20 steps). A row of `n` values (a multiple of 256).
void QuantizeBlockQ4K(const float* x, uint8_t* block);
void QuantizeRowQ4K(const float* x, int64_t n, uint8_t* blocks);

// One super-block: sub-block j's scale s[j] = d * sc[j] and offset o[j] = -(dmin * m[j]) (both
// exact in f32) and the 256 q in [0, 15], value s[j] * q + o[j] (ggml's dequantize_row_q4_K).
void DecodeBlockQ4K(const uint8_t* block, float* s, float* o, uint8_t* q);
// A row of `n` values (a multiple of 256) from its n / 256 super-blocks.
void DequantizeRowQ4K(const uint8_t* blocks, int64_t n, float* y);

// q4 groups (WeightFormat::kQ4G, weight_matrix.h): what a 4-bit AWQ, GPTQ or compressed-tensors
// checkpoint holds, per 32 values an f16 scale s and a u8 zero z, value s * (q - z). One
// super-block: sub-block j's scale s[j] and offset o[j] = -(s[j] * z[j]) (exact in f32: 11 bits
// times 8), z[j], and the 256 q in [0, 15]. A row. EncodeBlockQ4G writes a super-block from them.
void DecodeBlockQ4G(const uint8_t* block, float* s, uint8_t* z, uint8_t* q);
void DequantizeRowQ4G(const uint8_t* blocks, int64_t n, float* y);
void EncodeBlockQ4G(const uint16_t* s_f16, const uint8_t* z, const uint8_t* q, uint8_t* block);
// Its panels (panel_format kQ4G): per group of 16 output rows, per super-block,
// WeightMatrix::kQ4GPanelBlockBytes = 2432 bytes:
//   [0, 256)     s: sub-block j's 16 rows at 32 j (f16)
//   [256, 384)   z: sub-block j's 16 rows at 256 + 16 j (u8)
//   [384, 2432)  the nibbles, laid out as q4_K's lines (sub-block j's at 384 + 256 j)
// multiplied as q4_K's are (the same activations), with s * xd for d * sc * xd and s * z for
// dmin * m.

// q6_K (WeightFormat::kQ6K): ggml's block_q6_K, 256 values in 16 groups of 16: 128 bytes of low
// nibbles, 64 of high bit pairs, 16 int8 scales, an f16 d; value d * scale[g] * (q - 32), q in
// [0, 63] (6.56 bits a weight). One super-block: group g's scale s[g] = d * scale[g] (exact) and
// the 256 q in [0, 63] (ggml's dequantize_row_q6_K: element l, l + 32, l + 64, l + 96 of each
// 128-value half from ql[l] and ql[l + 32]'s nibbles and qh[l]'s four bit pairs). A row.
void DecodeBlockQ6K(const uint8_t* block, float* s, uint8_t* q);
void DequantizeRowQ6K(const uint8_t* blocks, int64_t n, float* y);
// q6_K panels (panel_format kQ6K): per group of 16 output rows, per super-block,
// WeightMatrix::kQ6KPanelBlockBytes = 3392 bytes:
//   [0, 32)      the 16 rows' d (f16), then 32 bytes of padding
//   [64, 320)    the scales: group g's 16 rows at 64 + 16 g (int8)
//   [320, 3392)  sub-block j (32 columns) at 320 + 384 j: 4 nibble lines of 64 bytes as q4_K's
//                (line t, byte 4 l + e: the low 4 bits of q[row l][32 j + 8 t + e] and of
//                q[row l][32 j + 8 t + 4 + e]), then 2 high lines of 64 bytes: byte 4 l + e of
//                high line h holds in bits 2k, 2k + 1 (k < 4) the top 2 bits of the value whose
//                low bits are in line 2 h + k / 2, low nibble (k even) or high (k odd).
// The product adds per group of 16 the exact int32 sum of q times the int8 activations, less 32
// times the activations' sum (sums16), scaled by d * scale * xd (one fused multiply-add).

// The activations of a q4_K or q6_K product: row i of x (k columns, a multiple of 256; rows ldx
// apart) as int8 q[i * k + c], per 32 columns b an f32 scale xd[i * k / 32 + b] = amax / 127 and
// xsum[...] = xd * sum(q) (0 for a block of zeros; NaN for a block holding a NaN or an infinity,
// so the row's products are NaN); with `sums16`, also 32 * sum(q) over every 16 columns
// (sums16[i * k / 16 + g]: the q6_K product's offset). With `order` (a matrix's input_order),
// column c is x's column order[c].
void QuantizeActivationsQ4K(const float* x, int64_t n, int64_t ldx, int64_t k, int8_t* q, float* xd,
                            float* xsum, int32_t* sums16 = nullptr, const int32_t* order = nullptr);

// Activation rows the q4_K and q6_K kernels quantize at a time for `cols` columns, and the
// scratch bytes a thread needs for them (the int8 rows, twice, their scales and sums): never less
// for more columns.
int64_t Q4KActivationBlockRows(int64_t cols);
int64_t Q4KScratchBytes(int64_t cols);

}  // namespace kvrm

#endif  // KVRM_KERNELS_CPU_Q4_K_H_
