// A read-only weight matrix in its stored dtype, as Hugging Face stores nn.Linear weights:
// [rows = out_features][cols = in_features], row-major, rows `row_stride` elements apart.
//
// A matrix may also carry `panels`: a second copy of the same values laid out for the AVX-512
// kernels (PackPanels in matmul.h). Output rows go in groups of kPanelRows = 16, and each line
// of a panel holds the group's 16 rows at one column (f32, f16) or column pair (bf16):
//   f32, f16: panels[p * PanelStride() + c * 16 + l]         = W[16 p + l][c]
//   bf16:     panels[p * PanelStride() + q * 32 + l * 2 + e] = W[16 p + l][2 q + e]
// (zero past the last row or column). A line is what one FMA (vdpbf16ps for bf16) multiplies by
// a broadcast activation (pair) into 16 output sums, so the product needs no horizontal sums and
// reads the matrix front to back as one stream. Paths that do not use panels read `data`.
//
// q8_0 (WeightFormat::kQ8_0, kernels/cpu/q8_0.h): GGUF's 8-bit format, blocks of 32 input
// features with an f16 scale d each, value d * q for q in [-127, 127]. `data` may hold it
// row-major (a GGUF file's own bytes), and `panels` may hold it as q8_0 panels (panel_format):
// a dense matrix quantized at load time, or a q8_0 one repacked. A matrix with q8_0 panels is
// multiplied from them on every instruction-set path (no path reads q8_0 data row-major).
//
// q4_K and q6_K (WeightFormat::kQ4K, kQ6K, kernels/cpu/q4_k.h): GGUF's 4- and 6-bit super-blocks
// of 256 input features, kept as they are: `data` holds a file's own blocks, and `panels` the
// panels the kernels read (4.6 and 6.6 bits a weight).
#ifndef KVRM_KERNELS_CPU_WEIGHT_MATRIX_H_
#define KVRM_KERNELS_CPU_WEIGHT_MATRIX_H_

#include <cstdint>

#include "common/dtype.h"

namespace kvrm {

enum class WeightFormat : uint8_t {
  kDense,     // `dtype` elements
  kQ8_0,      // q8_0 blocks (kernels/cpu/q8_0.h); `dtype` is then what a dense copy would use
  kQ8Affine,  // q8 affine blocks: f32 s, f32 o, 32 int8 q, value s * q + o (kernels/cpu/q8_0.h)
  kQ8Halves,  // q8 blocks with a scale per half: f32 s0, f32 s1, 32 int8 q, value s0 * q (first
              // 16) or s1 * q (last 16) (kernels/cpu/q8_0.h)
  kQ4K,       // ggml's q4_K super-blocks of 256 values (kernels/cpu/q4_k.h)
  kQ6K,       // ggml's q6_K super-blocks of 256 values (kernels/cpu/q4_k.h)
  kQ4G,       // 4-bit groups: per 32 values an f16 scale s and a u8 zero z, value s * (q - z), in
              // super-blocks of 256 (kernels/cpu/q4_k.h): AWQ / GPTQ / compressed-tensors' 4-bit
              // checkpoints exactly
  kMxfp4,     // OCP MXFP4 (gpt-oss's experts; ggml's block_mxfp4): per 32 values an E8M0
              // exponent e and 16 bytes of FP4 E2M1 codes (value j < 16: the low nibble of byte
              // j, value j + 16: its high nibble), value fp4 * 2^(e - 127); 4.25 bits a weight.
              // Multiplied by the q8 kernels as int8 q = 2 fp4 in [-12, 12] times d = 2^(e - 128)
              // (kernels/cpu/q8_0.h); e in [2, 254] (the loader keeps other blocks as q8)
};

struct WeightMatrix {
  DType dtype = DType::kF32;
  const void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_stride = 0;  // in elements; == cols when dense
  const void* panels = nullptr;  // optional; 64-byte aligned
  WeightFormat format = WeightFormat::kDense;        // of `data`
  WeightFormat panel_format = WeightFormat::kDense;  // of `panels`
  // q4 groups of an act-order checkpoint only (else null): the input features in stored order,
  // stored column c multiplying input feature input_order[c] (`cols` entries). The K-quant
  // kernels gather their activations in this order; WeightRowToFloat returns rows in input
  // order.
  const int32_t* input_order = nullptr;

  static constexpr int64_t kPanelRows = 16;
  // The q8 blocks: 32 values of a row. Row-major, a block is its scales then its 32 int8 q; in a
  // panel, the 16 rows' scales then 16 lines of 16 rows x 2 int8. The scales: an f16 d (q8_0), or
  // two f32 (q8 affine: s and o; q8 halves: s0 and s1), so the two-f32 formats share sizes.
  static constexpr int64_t kQ8Block = 32;
  static constexpr int64_t kQ8BlockBytes = 34;  // q8_0
  static constexpr int64_t kQ8PanelBlockBytes = kPanelRows * 2 + kPanelRows * kQ8Block;
  static constexpr int64_t kQ8AffineBlockBytes = 8 + kQ8Block;  // q8 affine and q8 halves
  static constexpr int64_t kQ8AffinePanelBlockBytes = kPanelRows * 8 + kPanelRows * kQ8Block;

  // q4_K: 256 values a super-block; row-major ggml's block_q4_K (f16 d, f16 dmin, 12 bytes of
  // 6-bit scales and mins, 128 bytes of nibbles); a panel's layout is in kernels/cpu/q4_k.h.
  static constexpr int64_t kQ4KBlock = 256;
  static constexpr int64_t kQ4KBlockBytes = 144;
  static constexpr int64_t kQ4KPanelBlockBytes = kPanelRows * 4 + kPanelRows * 16 +
                                                 kPanelRows * kQ4KBlock / 2;
  // q6_K: ggml's block_q6_K (128 bytes of low nibbles, 64 of high bit pairs, 16 int8 scales, f16
  // d); its panel block: the rows' d padded to 64 bytes, 16 x 16 scales, then 8 x 384 bytes of
  // values (kernels/cpu/q4_k.h).
  static constexpr int64_t kQ6KBlockBytes = 210;
  static constexpr int64_t kQ6KPanelBlockBytes = 64 + kPanelRows * 16 + kPanelRows * kQ4KBlock *
                                                                           6 / 8;

  // q4 groups: a super-block of 256 values is 8 f16 s, 8 u8 z, then 8 x 16 bytes of nibbles
  // (sub-block j's byte i: q[32 j + i] low, q[32 j + 16 + i] high); 4.75 bits a weight. Its panel
  // block: the 16 rows' s per sub-block (256 bytes), their z (128), then q4_K's lines.
  static constexpr int64_t kQ4GBlockBytes = 152;
  static constexpr int64_t kQ4GPanelBlockBytes =
      kPanelRows * 2 * 8 + kPanelRows * 8 + kPanelRows * kQ4KBlock / 2;

  // MXFP4: a block is e then 16 bytes of codes; its panel block the 16 rows' e (16 bytes), then
  // 16 lines of 16 bytes, line p's byte l holding row l's codes of columns 2p (low nibble) and
  // 2p + 1 (high): the q8 lines' order at half the bytes (kernels/cpu/q8_0.h).
  static constexpr int64_t kMxfp4BlockBytes = 17;
  static constexpr int64_t kMxfp4PanelBlockBytes = kPanelRows + kPanelRows * kQ8Block / 2;

  // Block formats (the rest are `dtype` elements).
  static bool IsQuantized(WeightFormat f) { return f != WeightFormat::kDense; }
  // The formats of 256-value super-blocks (the K-quants and q4 groups, which the same kernels
  // multiply) and the 8-bit ones (32 values a block).
  static constexpr bool IsKQuant(WeightFormat f) {
    return f == WeightFormat::kQ4K || f == WeightFormat::kQ6K || f == WeightFormat::kQ4G;
  }
  static bool IsQ8(WeightFormat f) { return IsQuantized(f) && !IsKQuant(f); }
  // A block format's values a block, row-major block bytes and panel block bytes (16 rows).
  static constexpr int64_t BlockCols(WeightFormat f) { return IsKQuant(f) ? kQ4KBlock : kQ8Block; }
  static constexpr int64_t DataBlockSize(WeightFormat f) {
    return f == WeightFormat::kQ8_0    ? kQ8BlockBytes
           : f == WeightFormat::kQ4K   ? kQ4KBlockBytes
           : f == WeightFormat::kQ6K   ? kQ6KBlockBytes
           : f == WeightFormat::kQ4G   ? kQ4GBlockBytes
           : f == WeightFormat::kMxfp4 ? kMxfp4BlockBytes
                                       : kQ8AffineBlockBytes;
  }
  static constexpr int64_t PanelBlockSize(WeightFormat f) {
    return f == WeightFormat::kQ8_0    ? kQ8PanelBlockBytes
           : f == WeightFormat::kQ4K   ? kQ4KPanelBlockBytes
           : f == WeightFormat::kQ6K   ? kQ6KPanelBlockBytes
           : f == WeightFormat::kQ4G   ? kQ4GPanelBlockBytes
           : f == WeightFormat::kMxfp4 ? kMxfp4PanelBlockBytes
                                       : kQ8AffinePanelBlockBytes;
  }
  // Where a q8 format's panel block's lines start (past the 16 rows' scales).
  static constexpr int64_t Q8LinesAt(WeightFormat f) {
    return f == WeightFormat::kMxfp4 ? kPanelRows : PanelBlockSize(f) - kPanelRows * kQ8Block;
  }
  int64_t Q8Blocks() const { return (cols + kQ8Block - 1) / kQ8Block; }
  // Blocks of a panel row in `panel_format` (32 or 256 columns each, the last zero-padded).
  int64_t PanelBlocks() const {
    return (cols + BlockCols(panel_format) - 1) / BlockCols(panel_format);
  }
  // One panel: elements of 16 rows x cols (bf16: cols rounded up to a pair); bytes for the block
  // formats.
  int64_t PanelStride() const {
    if (IsQuantized(panel_format)) return PanelBlocks() * PanelBlockSize(panel_format);
    return (dtype == DType::kBF16 ? (cols + 1) / 2 * 2 : cols) * kPanelRows;
  }
  const char* PanelPtr(int64_t p) const {
    const int64_t unit = IsQuantized(panel_format) ? 1 : static_cast<int64_t>(DTypeSize(dtype));
    return static_cast<const char*>(panels) + p * PanelStride() * unit;
  }

  // Bytes of `n` elements of a row as `data` stores them (block formats: n a multiple of
  // BlockCols(format)).
  int64_t DataBytes(int64_t n) const {
    if (IsQuantized(format)) return n / BlockCols(format) * DataBlockSize(format);
    return n * static_cast<int64_t>(DTypeSize(dtype));
  }
  const char* RowPtr(int64_t r) const {
    return static_cast<const char*>(data) + DataBytes(r * row_stride);
  }
  // Rows [begin, begin + count) as a matrix (a tensor-parallel shard of the output features).
  // The panels come along when `begin` starts a panel.
  WeightMatrix RowSlice(int64_t begin, int64_t count) const {
    const bool keep = panels != nullptr && begin % kPanelRows == 0;
    return WeightMatrix{dtype,      RowPtr(begin),
                        count,      cols,
                        row_stride, keep ? PanelPtr(begin / kPanelRows) : nullptr,
                        format,     keep ? panel_format : WeightFormat::kDense,
                        input_order};
  }
  // Bytes of the values as `data` stores them.
  int64_t bytes() const { return rows * DataBytes(cols); }
};

// Converts row r to float (embedding lookups, references).
void WeightRowToFloat(const WeightMatrix& w, int64_t r, float* out);

}  // namespace kvrm

#endif  // KVRM_KERNELS_CPU_WEIGHT_MATRIX_H_
