// The linear weights of quantized Hugging Face checkpoints (config.json's quantization_config,
// CheckpointQuantization): AWQ (AutoAWQ's GEMM layout), GPTQ (AutoGPTQ / GPTQModel, formats gptq
// and gptq_v2) and compressed-tensors' pack-quantized integer weights (llm-compressor's W4A16 /
// W8A16). Each stores, for an nn.Linear of K input and N output features, `bits`-bit integers q
// packed into int32 words, and per group of input features of an output row a scale s and (when
// asymmetric) a zero z: the weight is s * (q - z).
//
//   AWQ   qweight [K][N / 8] I32, eight output features a word, nibble i holding feature
//         8 j + {0, 2, 4, 6, 1, 3, 5, 7}[i]; qzeros [K / g][N / 8] I32 packed alike;
//         scales [K / g][N] F16.
//   GPTQ  qweight [K * bits / 32][N] I32, 32 / bits input features a word from the low bits up;
//         qzeros [G][N * bits / 32] I32, output features from the low bits up, each stored one
//         less in format "gptq" (v1); scales [G][N] F16; g_idx [K] I32, each input feature's group
//         (k / g unless desc_act); G = K / g, or 1 for group_size -1.
//   compressed-tensors (pack-quantized)
//         weight_packed [N][K * bits / 32] I32, input features from the low bits up, each stored
//         as q + 2^(bits-1) (q signed); weight_scale [N][G] (the model's float type);
//         weight_zero_point [N * bits / 32][G] I32 packed alike along N (asymmetric only);
//         weight_shape [2] I64 = [N, K]; weight_g_idx [K] I32 (actorder "group").
//
// What they become (LoadQuantizedLinear), with `as_q8` (the CPU's and the default):
// - 4-bit schemes whose groups are whole blocks of 32 input features in rows of whole
//   256-feature super-blocks: q4 groups (WeightFormat::kQ4G, kernels/cpu/q4_k.h), per 32
//   features the f16 s, the u8 z and the 4-bit q as they are, 4.75 bits a weight, multiplied by
//   the K-quant kernels. Act-order groups (g_idx; GPTQ's desc_act, compressed-tensors' actorder)
//   are such blocks once the input features are sorted by group, when each group's size is a
//   multiple of 32 (GPTQ's are the group size): the columns are stored in that order and
//   WeightMatrix::input_order says which input each multiplies, exactly as well;
// - otherwise, where every block of 32 input features lies in one group, exactly their
//   values: q8_0 blocks (kernels/cpu/q8_0.h) with d = s and the
//   int8 q - z, when every s is an f16 and every q - z fits int8 (4-bit schemes; 8-bit
//   symmetric ones); else q8 affine blocks, s * (q - 2^(bits-1)) + s * (2^(bits-1) - z). 8.5 or
//   10 bits a weight, twice and more a 4-bit checkpoint's, for the speed and the exactness of
//   8-bit blocks;
// - otherwise (act-order 8-bit schemes, or 4-bit ones whose rows are not whole super-blocks;
//   group sizes not a multiple of 32) the values, exact in f32, quantized again to q8_0 (ggml's
//   reference quantizer: within half a step, amax / 254, of each block's largest value): NOT
//   exact.
// Without `as_q8` (kvrmd --quantization=none): `dense` elements, rounded to nearest (bf16).
//
// Unpacked schemes (CheckpointQuantization::unpacked: Transformers' fp8, fbgemm_fp8,
// compressed-tensors' float-quantized / int-quantized / naive-quantized) store q itself, one
// element each, in `.weight` [N][K] (F8_E4M3 / F8_E5M2 numbers, or I8 integers), and a float
// scale per block_rows x group_size tile in `.weight_scale` (fp8 blocks: `.weight_scale_inv`,
// which despite its name multiplies too) [ceil(N / rows)][ceil(K / cols)], or one for the
// tensor (any shape of one element). The weight is s * q. With `as_q8`, int8 ones become q8_0
// blocks of exactly their values (q8 affine with offset 0 where a scale is not an f16) when every
// block of 32 input features has one scale, else are requantized; FP8 ones are requantized to
// q8_0 (FP8 numbers are not integers of one scale). A NaN or infinite weight is refused.
// bitsandbytes' LLM.int8() rows are such I8 weights with `.SCB` (s = SCB / 127); its 4-bit NF4 /
// FP4 codes (two a byte, a quant_map, an absmax per block, maybe double-quantized) are read as
// LoadBnb4Linear in the .cc says, and requantized like FP8. "Requantized" is q8_0, or q4_K with
// QuantizedLoadOptions::requantize_as where rows are whole 256-value super-blocks.
#ifndef KVRM_MODEL_QUANTIZED_CHECKPOINT_H_
#define KVRM_MODEL_QUANTIZED_CHECKPOINT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "kernels/cpu/weight_matrix.h"
#include "model/config.h"
#include "model/safetensors.h"

namespace kvrm {

struct QuantizedLoadOptions {
  bool as_q8 = true;
  // With as_q8: 4-bit checkpoints whose groups fill whole 256-value super-blocks as q4 groups
  // (WeightFormat::kQ4G: their own scales, zeros and nibbles, 4.75 bits a weight) instead of q8_0.
  bool q4_groups = true;
  DType dense = DType::kBF16;  // without as_q8: kF32 (exact) or kBF16
  // With as_q8, what matrices whose values are not blocks of one scale are quantized again to:
  // kQ8_0, or kQ4K (kvrmd --quantization=q4_K: ggml's reference q4_K quantizer, 4.5 bits a
  // weight, where rows are whole 256-value super-blocks; q8_0 elsewhere).
  WeightFormat requantize_as = WeightFormat::kQ8_0;
  // With as_q8, MXFP4 weights (gpt-oss's experts) as they are (WeightFormat::kMxfp4, 4.25 bits a
  // weight) where every scale suits the kernels, instead of q8_0 blocks of the same values.
  bool mxfp4 = true;
  int threads = static_cast<int>(std::thread::hardware_concurrency());
};

// What the linear weights of a checkpoint became, for logs and ModelInfo.
struct QuantizedLoadStats {
  int64_t exact = 0;        // matrices held as exactly their values (q4 groups, q8 blocks, f32)
  int64_t q4_groups = 0;    // of which as q4 groups
  int64_t mxfp4 = 0;        // of which as MXFP4 blocks
  int64_t requantized = 0;  // matrices whose values were rounded (requantized to q8_0, or bf16)
};

// Whether `files` hold the linear weight `base` ("model.layers.0.mlp.down_proj") in the packed
// form of `q` (its qweight / weight_packed tensor).
bool HasQuantizedLinear(const SafetensorsSet& files, const CheckpointQuantization& q,
                        const std::string& base);

// The [rows = N][cols = K] matrix of `base`, unpacked as above into a new buffer appended to
// `converted` (which must outlive the view). Every tensor is checked against the shapes and
// dtypes the format gives for N, K and the config's bits and group size, and every g_idx
// against the groups: INVALID_ARGUMENT naming the tensor and its file.
absl::StatusOr<WeightMatrix> LoadQuantizedLinear(const SafetensorsSet& files,
                                                 const CheckpointQuantization& q,
                                                 const std::string& base, int64_t rows,
                                                 int64_t cols, const QuantizedLoadOptions& options,
                                                 std::vector<std::vector<std::byte>>* converted,
                                                 QuantizedLoadStats* stats = nullptr);

// MXFP4 (OCP microscaling, gpt-oss's experts): `blocks` U8 [..][rows_total][cols / 32][16], two
// FP4 E2M1 values a byte (the low nibble first), and `scales` U8 [..][rows_total][cols / 32], an
// E8M0 exponent per 32 values (value = fp4 * 2^(scale - 127); 255, E8M0's NaN, is refused).
// Returns the [rows][cols] matrix whose row r is stored row first_row + r * row_step (gpt-oss
// interleaves gate and up rows: step 2), in a buffer appended to `converted`. Exactly its
// values in every form: with `as_q8` and `mxfp4`, MXFP4 blocks (WeightFormat::kMxfp4: the same
// codes, ggml's order) where every scale is in [2, 254]; else with `as_q8`, q8_0 blocks (int8 q =
// 2 fp4 in [-12, 12], d = 2^(scale - 128)) where every d is an f16, else q8 affine ones (f32 s,
// offset 0); without, `dense` elements (bf16 holds every MXFP4 value). INVALID_ARGUMENT naming
// the tensor for a bad shape or dtype, or a scale past 252 (255 is E8M0's NaN; 253 and 254 put
// the largest values past float's range).
absl::StatusOr<WeightMatrix> LoadMxfp4Rows(const TensorView& blocks, const TensorView& scales,
                                           int64_t first_row, int64_t row_step, int64_t rows,
                                           int64_t cols, const QuantizedLoadOptions& options,
                                           std::vector<std::vector<std::byte>>* converted,
                                           QuantizedLoadStats* stats = nullptr);

}  // namespace kvrm

#endif  // KVRM_MODEL_QUANTIZED_CHECKPOINT_H_
