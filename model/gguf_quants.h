// ggml's block formats: dequantization (the loader) and quantization (tools/gguf's converter and
// the tests), for the types GgmlType lists.
//
// Dequantization follows ggml's reference dequantize_row_* exactly (ggml-quants.c), and
// quantization its quantize_row_*_ref (q4_K and q5_K: the weighted search of each sub-block's
// scale and min, kernels/cpu/q4_k.h; q6_K: the least-squares search of each sub-block's signed
// scale): the same bits, the same float operations in the same order, checked against ggml's
// own output by //model:ggml_quants_test. llama-quantize's importance-matrix variants are not
// implemented.
#ifndef KVRM_MODEL_GGUF_QUANTS_H_
#define KVRM_MODEL_GGUF_QUANTS_H_

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/weight_matrix.h"
#include "model/gguf.h"

namespace kvrm {

// Dequantizes `n` elements (a whole number of blocks of `type`) from `src` into `out`.
void DequantizeRow(GgmlType type, const std::byte* src, int64_t n, float* out);

// The q8_0 blocks (kernels/cpu/q8_0.h) holding exactly the values of `n` elements (a whole
// number of blocks) of `type` at `src`: q8_0 copied, q4_0 and q5_0 (d * (q - 8), d * (q - 16)) as
// the same d and the offset q, which fit int8. `dst` holds n / 32 * 34 bytes. Other types: false.
bool ToQ8_0Exactly(GgmlType type, const std::byte* src, int64_t n, std::byte* dst);

// The q8 affine blocks (kernels/cpu/q8_0.h) holding exactly the values of `n` elements (a whole
// number of blocks) of `type` at `src`: q4_1 and q5_1 (d * q + m) and q4_K and q5_K (per 32-value
// sub-block d * scale * q - dmin * min) and mxfp4 (2^(e - 127) * the FP4 value: s = 2^(e - 128),
// o = 0, q twice the value) as s, o and q per 32 values. `dst` holds n / 32 * 40 bytes. Other
// types: false.
bool ToQ8AffineExactly(GgmlType type, const std::byte* src, int64_t n, std::byte* dst);

// The q8 halves blocks (kernels/cpu/q8_0.h) holding exactly the values of `n` elements (whole
// blocks) of q6_K at `src` (d * scale per 16 values, q - 32): s0, s1 and q per 32 values. `dst`
// holds n / 32 * 40 bytes. Other types: false.
bool ToQ8HalvesExactly(GgmlType type, const std::byte* src, int64_t n, std::byte* dst);

// The q4 groups (WeightFormat::kQ4G, kernels/cpu/q4_k.h) holding exactly the values of `n`
// elements (a multiple of 256) of q4_0 at `src`: q4_0's blocks are q4 groups already (per 32
// values the f16 d as the scale, a zero of 8, the same 16 bytes of nibbles). `dst` holds
// n / 256 * 152 bytes. Other types: false.
bool ToQ4GroupsExactly(GgmlType type, const std::byte* src, int64_t n, std::byte* dst);

// The kernels' block formats (kernels/cpu/weight_matrix.h) for a GGUF type:
// - StoredBlockFormat: the format that is the type's own bytes (q8_0: kQ8_0, q4_K: kQ4K, q6_K:
//   kQ6K, mxfp4: kMxfp4, whose kernels take E8M0 scales of 2 to 254 only; kDense for the
//   others), and GgmlTypeOf its inverse (kQ8_0, kQ4K, kQ6K, kMxfp4);
// - Exact8BitFormat: the 8-bit format holding exactly the type's values (kQ8_0 for q8_0, q4_0
//   and q5_0; kQ8Affine for q4_1, q5_1, q4_K, q5_K and mxfp4; kQ8Halves for q6_K; kDense for the
//   others), into which ToExact8Bit converts `n` elements (ToQ8_0Exactly, ToQ8AffineExactly or
//   ToQ8HalvesExactly; false for a type without one).
WeightFormat StoredBlockFormat(GgmlType type);
GgmlType GgmlTypeOf(WeightFormat stored);
WeightFormat Exact8BitFormat(GgmlType type);
bool ToExact8Bit(GgmlType type, const std::byte* src, int64_t n, std::byte* dst);

// Quantizes `n` elements (a whole number of blocks) of `x` into `dst`, which holds
// n / block_elems * block_bytes bytes. f32, f16 and bf16 are stored as they are (rounded to
// nearest even for the 16-bit types).
void QuantizeRow(GgmlType type, const float* x, int64_t n, std::byte* dst);

}  // namespace kvrm

#endif  // KVRM_MODEL_GGUF_QUANTS_H_
