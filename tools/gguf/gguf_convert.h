// Converts a Hugging Face model directory (Llama, Mistral, Phi-3, Qwen2 / 3, Granite, Gemma 2 / 3,
// Mixtral, Qwen2 / 3-MoE, gpt-oss) into one GGUF file, as llama.cpp's convert_hf_to_gguf.py (and
// llama-quantize, for the quantized types) lay it out: "llama", "qwen2", ..., "gpt-oss" metadata
// with the types llama.cpp reads, the tokenizer embedded
// (tokenizer.ggml.*), attn_q and attn_k rows (and biases) reordered for RoPE on adjacent pairs in
// llama files only, 1-D tensors (norms, attention biases, Q/K norms) in f32, Llama 3.1's RoPE
// scaling as rope_freqs.weight. kvrm's GGUF loader reads it back (model/gguf_model.h); the tests
// use it to check that loader against the safetensors one on the same weights, and to make GGUF
// files of the built-in models (`bazel run //tools/gguf:to_gguf`).
#ifndef KVRM_TOOLS_GGUF_GGUF_CONVERT_H_
#define KVRM_TOOLS_GGUF_GGUF_CONVERT_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/json.h"
#include "model/gguf.h"
#include "model/gguf_writer.h"

namespace kvrm {

struct GgufConvertOptions {
  // The type of every matrix but those FallbackType changes; norms are always f32.
  GgmlType type = GgmlType::kF16;
  // llama-quantize's Q4_K_M mix instead of one type: q6_K for the output matrix (the embedding
  // when tied) and for attn_v and ffn_down in the layers use_more_bits picks (the first and last
  // eighth, and every third in between), q4_K for the others (`type` is then ignored).
  bool q4_k_m = false;
  // The experts' matrices' type (ffn_gate_exps, ffn_up_exps, ffn_down_exps); unset: mxfp4 where
  // the checkpoint's experts are MXFP4 (gpt-oss's own: their values exactly, as llama.cpp's
  // converter keeps them), else as the other matrices.
  std::optional<GgmlType> experts_type;
};

// Whether llama-quantize gives layer `layer` of `layers` more bits in its _M mixes
// (use_more_bits: the first and last eighth of the layers, and every third in between).
bool UseMoreBits(int layer, int layers);

// The type a matrix with rows of `cols` elements takes for `type`: itself when its rows are whole
// blocks; else what llama-quantize falls back to (q4_K -> q5_0, q5_K -> q5_1, q6_K -> q8_0: a
// 128-wide model has no whole 256-element K-quant block), and f16 when that does not fit either.
GgmlType FallbackType(GgmlType type, int64_t cols);

absl::Status ConvertToGguf(const std::string& model_dir, const std::string& out_path,
                           const GgufConvertOptions& options = {});

// The tokenizer.ggml.* metadata of a tokenizer.json (`tokenizer`): "gpt2" for a byte-level BPE
// (the pre-tokenizer named after its split: "llama-bpe", "qwen2" or "gpt-2"), "llama" for a
// SentencePiece-style BPE with byte fallback (scores from the merge order: a piece scores minus
// the rank of the first merge that makes it). Ids the vocabulary skips become "[PAD<id>]" tokens.
// `bos_id`, `eos_id` (-1: none) become the special-token keys; add_bos_token is whether the
// post-processor adds BOS. The token list is padded with "[PAD<id>]" tokens (type unused) up to
// `vocab_size` (config.json's, the embedding's rows) where the tokenizer has fewer, as
// convert_hf_to_gguf pads Qwen's 151,936 rows over ~151,665 tokens: llama.cpp takes the
// vocabulary's size from the list.
absl::Status AddGgufTokenizer(const Json& tokenizer, int64_t bos_id, int64_t eos_id,
                              GgufWriter* writer, int64_t vocab_size = 0);

}  // namespace kvrm

#endif  // KVRM_TOOLS_GGUF_GGUF_CONVERT_H_
