// A Llama-family model from one GGUF file (llama.cpp's format: general.architecture "llama",
// which Llama 1-3 and Mistral 7B are converted to, "qwen2" or "qwen3"), as the safetensors loader
// would have it.
//
// The file is translated into the Hugging Face forms the rest of kvrm already checks: its
// metadata into a config.json (ParseLlamaConfig validates it), its embedded tokenizer into a
// tokenizer.json (model/gguf_tokenizer.h), its tensors into the HF weight set:
// - f32, f16 and bf16 tensors are used in place (memory-mapped), except a llama file's attn_q
//   and attn_k (and their biases): llama.cpp's converter reorders their rows for RoPE on
//   adjacent pairs, and the loader puts them back in HF's order (rotate_half) in a copy. qwen2
//   and qwen3 files keep HF's order (llama.cpp rotates halves for them, "NEOX" RoPE);
// - attention biases (attn_q/k/v.bias: qwen2's always, llama's and qwen3's where layer 0 has
//   them; attn_output.bias: llama's and qwen3's where layer 0 has it) and qwen3's per-head
//   attn_q_norm / attn_k_norm; any other tensor the model does not use is UNIMPLEMENTED naming
//   it, as llama.cpp refuses a file with tensors its architecture does not create;
// - quantized tensors (q4_0, q4_1, q5_0, q5_1, q8_0, q4_K, q5_K, q6_K) are dequantized once at
//   load, with ggml's formulas, into GgufLoadOptions::dequantized (bf16 by default: the CUDA
//   backend's type, and half the memory of f32). bf16 keeps 8 significant bits, so the engine
//   computes with the file's values rounded (a q8_0 element moves by up to a quarter of its
//   step; f32 keeps them exact), and in its own arithmetic (llama.cpp multiplies the blocks
//   themselves).
// - rope_freqs.weight (Llama 3.1's RoPE scaling, as the converter writes it) becomes
//   RopeScaling "freq_factors".
// Architectures, tokenizers, tensor types and split files it does not implement are
// UNIMPLEMENTED naming the key or tensor; anything malformed is INVALID_ARGUMENT naming the file
// and the key or tensor.
#ifndef KVRM_MODEL_GGUF_MODEL_H_
#define KVRM_MODEL_GGUF_MODEL_H_

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "model/config.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "model/weights.h"

namespace kvrm {

struct GgufLoadOptions {
  DType dequantized = DType::kBF16;  // what quantized tensors become (kF32 or kBF16)
  // Quantized matrices stay in a block format of exactly their values instead of becoming
  // `dequantized` (the CPU backend multiplies them as they are, the CUDA backend widens them to
  // bf16 at upload): q8_0, q4_K and q6_K ones as they are (WeightFormat::kQ8_0, kQ4K and kQ6K
  // views of the file, kernels/cpu/q8_0.h and q4_k.h), q4_0 ones in rows of whole 256-value
  // super-blocks as q4 groups (WeightFormat::kQ4G: the same d, nibbles and a zero of 8, 4.75 bits
  // a weight), other q4_0 and q5_0 ones as q8_0 blocks (ToQ8_0Exactly: 8.5 bits a weight),
  // q4_1 / q5_1 / q5_K ones as q8 affine blocks
  // (ToQ8AffineExactly: 10 bits a weight). Their values read through WeightRowToFloat are the
  // file's exactly in f32 either way.
  bool as_q8 = true;
  // With as_q8, mxfp4 matrices (gpt-oss's experts) as they are (WeightFormat::kMxfp4 views of the
  // file, 4.25 bits a weight) where the kernels take their scales; false: as q8 affine blocks of
  // the same values (10 bits a weight).
  bool mxfp4 = true;
  // Threads that dequantize (and reorder) a tensor's rows; the default is every core.
  int threads = static_cast<int>(std::thread::hardware_concurrency());
};

struct GgufModel {
  LlamaConfig config;
  LlamaWeights weights;                  // views into `file`, or into `converted`
  std::unique_ptr<Tokenizer> tokenizer;  // the embedded one (model/gguf_tokenizer.h)
  std::string chat_template;             // tokenizer.chat_template; empty when the file has none
  std::string file_type;                 // the most common matrix type by parameters ("q4_K")
  std::string bos_token;  // the BOS and EOS texts (chat templates use them); empty if none
  std::string eos_token;
  std::unique_ptr<GgufFile> file;
  std::vector<std::vector<std::byte>> converted;  // dequantized or reordered tensors
};

absl::StatusOr<std::unique_ptr<GgufModel>> LoadGgufModel(const std::string& path,
                                                         const GgufLoadOptions& options = {});

// The model's config.json, from the file's metadata and tensors (exposed for tests).
absl::StatusOr<LlamaConfig> GgufLlamaConfig(const GgufFile& file);

// The row of the Hugging Face layout that row `row` of a converted attn_q / attn_k tensor holds:
// the converter wrote HF row h*hd + t*hd/2 + j as row h*hd + 2*j + t (`head_dim` = hd).
int64_t GgufRopeRowToHf(int64_t row, int64_t head_dim);

// Whether llama.cpp stores an architecture's attn_q / attn_k rows (and biases) so reordered: the
// ones it rotates on adjacent pairs ("NORM" RoPE), llama, granite and smollm3; qwen2, qwen3,
// phi3 and gpt-oss rotate halves as Transformers does ("NEOX") and keep HF's order.
bool GgufPermutesQk(std::string_view architecture);

// What llama.cpp's gemma2 / gemma3 graphs take from a model's shape rather than from the file:
// - the size whose inverse square root scales attention scores: the head size, or hidden /
//   heads at the 27B models' layer counts (46 for gemma2, 62 for gemma3);
// - which layers slide, from a period p (attention.sliding_window_pattern, Gemma 2's and
//   gpt-oss's 2 and Gemma 3's 6 by default): layer l when p == 0 or l % p < p - 1.
int64_t GgufGemmaAttentionScaleSize(const LlamaConfig& config);
inline bool GgufLayerSlides(uint64_t layer, uint64_t period) {
  return period == 0 || layer % period < period - 1;
}

}  // namespace kvrm

#endif  // KVRM_MODEL_GGUF_MODEL_H_
