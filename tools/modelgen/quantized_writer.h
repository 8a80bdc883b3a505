// Writes quantized checkpoints of a model directory in the layouts AutoAWQ, AutoGPTQ / GPTQModel
// and llm-compressor save (model/quantized_checkpoint.h describes them), by round to nearest:
// the fixtures kvrm's loader is tested on, and a way to try a quantized checkpoint of any model
// directory without the Python tools (make_model --quantize).
//
// Every scheme works on unsigned integers u in [0, 2^bits) with an unsigned zero zu per group,
// weight s * (u - zu):
// - asymmetric (AWQ; GPTQ with sym false; compressed-tensors with symmetric false): the group's
//   range [min(w, 0), max(w, 0)] over 2^bits - 1 steps, zu = round(-min / s);
// - symmetric: s = 2 max|w| / (2^bits - 1), zu = 2^(bits-1).
// s is rounded to the scale dtype first (f16; compressed-tensors: the model's), and u = clamp(
// round(w / s) + zu). With act_order, the groups are those of a random permutation of the input
// features (seeded per tensor), as GPTQ's desc_act leaves them: g_idx says which.
//
// The unpacked schemes (compressed-tensors' int-quantized and float-quantized, fp8, fbgemm_fp8)
// store q itself, symmetric, one scale per tile of block_rows x group_size weights, as
// llm-compressor computes it: s = amax / 127.5 and q = clamp(round(w / s), -128, 127) (int8), or
// s = amax / 448 and q = w / s rounded to the nearest e4m3 number (FP8).
//
// bitsandbytes: 4-bit codes, the nearest of the type's 16 values (NF4's or FP4's, as
// bitsandbytes defines them) to w / absmax per block of group_size weights of the flattened
// matrix; with double_quant the absmax less their mean, quantized per 256 to the nearest of a
// 256-value map (here a uniform one over [-1, 1]; bitsandbytes writes its dynamic map, which the
// loader reads the same way) times the block's largest. load_in_8bit: q = round(127 w / SCB),
// SCB each row's largest magnitude.
//
// mxfp4 (gpt-oss's own checkpoints; gpt_oss models only, which take no other method): only the
// experts' fused tensors are quantized, as OCP MXFP4 (Microscaling v1.0): mlp.experts.gate_up_proj
// [experts][hidden][2 ffn] and mlp.experts.down_proj [experts][ffn][hidden] (input x output) become
// <name>_blocks U8 [experts][out][in / 32][16] and <name>_scales U8 [experts][out][in / 32]: per
// output feature (row r of gate_up_proj_blocks is gate_up_proj's column r: even r gate feature
// r / 2, odd r up), blocks of 32 consecutive inputs, each with a shared E8M0 exponent (scale byte
// s, the block's values times 2^(s - 127)) and 32 FP4 E2M1 values, two a byte, the earlier in the
// low nibble. The OCP rule: s = floor(log2(amax)) - 2 + 127 (2: E2M1's largest exponent), clamped
// to [0, 254] (255 is NaN), and each value the E2M1 number nearest x / 2^(s - 127), ties to the
// even mantissa, saturating at +-6; an all-zero block gets s = 127. The biases, the attention,
// router, embeddings and LM head stay as they are (quantization_config's
// modules_to_not_convert, as openai/gpt-oss-20b's).
#ifndef KVRM_TOOLS_MODELGEN_QUANTIZED_WRITER_H_
#define KVRM_TOOLS_MODELGEN_QUANTIZED_WRITER_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "common/dtype.h"

namespace kvrm::modelgen {

struct QuantizeOptions {
  // awq, gptq, compressed-tensors, fp8, fbgemm_fp8, bitsandbytes or mxfp4 (which fixes its own
  // grid: the options below do not apply to it)
  std::string method = "awq";
  // compressed-tensors: pack-quantized (int 4 / 8 bits, packed in int32 words), int-quantized
  // (int8 weights, W8A8) or float-quantized (FP8 e4m3 weights). bitsandbytes: nf4, fp4
  // (load_in_4bit, blocks of group_size) or int8 (load_in_8bit, LLM.int8()).
  std::string format = "pack-quantized";
  bool double_quant = false;        // bitsandbytes 4-bit: bnb_4bit_use_double_quant
  int bits = 4;                     // awq: 4; gptq, compressed-tensors: 4 or 8; FP8: 8
  int group_size = 128;             // input features per scale; -1: one scale per output row
  // Output features per scale, for int-quantized, float-quantized and fp8: 1 (by channel or
  // group), a block's rows (blocks block_rows x group_size), or 0 for one scale a tensor.
  int block_rows = 1;
  bool zero_point = true;           // asymmetric (awq: always)
  bool act_order = false;           // gptq's desc_act, compressed-tensors' actorder "group"
  bool gptq_v2 = false;             // gptq: checkpoint_format gptq_v2 (zeros stored as they are)
  DType scale_dtype = DType::kF16;  // awq, gptq: f16; compressed-tensors: the model's
  uint64_t seed = 0;                // act_order's permutations
};

// Quantizes every linear weight of the decoder layers of the model directory `src` (not the
// embeddings, the LM head, norms, biases or mixture-of-experts routers) and writes the checkpoint
// to `out`: model.safetensors with the method's tensors, config.json with its
// quantization_config, and src's other files (tokenizer, templates) as they are. With
// `dequantized` non-empty, also writes there the same model with float32 weights holding exactly
// the values `out` stands for (s * (u - zu), computed here from the integers written), for
// references to compare the loader against. mxfp4 (gpt_oss models only; every other method
// refuses them): the experts' fused tensors as described above; the twin holds them under their
// own names and shapes, in the source's dtype when that is bf16 or f32 (which hold every MXFP4
// value exactly), else in f32.
absl::Status QuantizeModelDir(const std::string& src, const std::string& out,
                              const std::string& dequantized, const QuantizeOptions& options);

// FP4 E2M1 by code (bit 3 the sign): 0, 0.5, 1, 1.5, 2, 3, 4, 6, then their negatives (code 8
// is -0).
inline constexpr float kE2M1Values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                          -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// The E2M1 code nearest x: on a tie the one with the even mantissa (the even code), beyond +-6
// the largest magnitude (saturating); a value that rounds to zero is +0 (code 0) whatever its
// sign.
uint8_t NearestE2M1(double x);

// One MXFP4 block: 32 values x[0..31] into the E8M0 scale byte `*scale` and 16 bytes `packed`
// (x[2 j] in the low nibble of packed[j], x[2 j + 1] in the high), by the OCP rule above.
void QuantizeMxfp4Block(const float* x, uint8_t* packed, uint8_t* scale);

}  // namespace kvrm::modelgen

#endif  // KVRM_TOOLS_MODELGEN_QUANTIZED_WRITER_H_
