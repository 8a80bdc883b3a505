// A loaded model: config, memory-mapped weights, and tokenizer, from a Hugging Face directory or
// a GGUF file.
#ifndef KVRM_RUNTIME_MODEL_BUNDLE_H_
#define KVRM_RUNTIME_MODEL_BUNDLE_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/chat_config.h"
#include "model/classifier_head.h"
#include "model/config.h"
#include "model/gguf_model.h"
#include "model/lora.h"
#include "model/safetensors.h"
#include "model/tokenizer.h"
#include "model/weights.h"

namespace kvrm {

struct ModelBundle {
  std::string name;  // the directory's base name, or the GGUF file's without ".gguf"
  std::string dir;   // the path it was loaded from
  LlamaConfig config;
  std::unique_ptr<SafetensorsSet> files;  // a Hugging Face directory's
  std::unique_ptr<GgufModel> gguf;        // a GGUF file's
  LlamaWeights weights;                   // views into `files`, `gguf` or `converted`
  // A quantized checkpoint's linear weights, unpacked (model/quantized_checkpoint.h).
  std::vector<std::vector<std::byte>> converted;
  // "safetensors", "awq 4-bit g128" (a quantized checkpoint: its method, bits and group size),
  // or "gguf <type>" (GgufModel::file_type): ModelInfo.weights_format.
  std::string weights_format = "safetensors";
  std::unique_ptr<Tokenizer> tokenizer;
  // A *ForSequenceClassification checkpoint's head (score.weight: a reranker's, a reward
  // model's), or one kvrmd --classifier_from_tokens made from LM-head rows: Classify and
  // cross-encoder Score read the last token's final hidden state through it. nullopt: none.
  std::optional<ClassifierHead> classifier;
  // Non-empty: the checkpoint's head could not be read (why; Classify and Score are refused with
  // it, the rest is served).
  std::string classifier_error;
  ChatConfig chat;  // tokenizer_config.json / chat_template.jinja; kvrmd's --chat_template
  // LoRA adapters served beside the base model (kvrmd --lora_modules), in the order requests
  // index them (GenerationRequest::lora_adapter). The CPU backend keeps each rank's share in its
  // own layout, so these values are held twice (rank 16 on a 7B model: about 80 MB an adapter
  // here); small next to the weights, not freed.
  std::vector<LoraAdapter> lora_adapters;

  struct LoadOptions {
    // A GGUF file's q8_0 matrices stay q8_0 and its q4_0 / q5_0 ones become q8_0 blocks of
    // exactly their values (GgufLoadOptions::as_q8), and a quantized checkpoint's (AWQ, GPTQ,
    // compressed-tensors) become 8-bit blocks (QuantizedLoadOptions::as_q8); else all become
    // bf16.
    bool as_q8 = true;
    // With as_q8, also a checkpoint whose values are not 8-bit integers of one scale (FP8,
    // bitsandbytes NF4 / FP4: CheckpointQuantization::NonIntegerValues), quantized again to
    // q8_0. kvrmd clears it for CUDA, which widens every weight to bf16: those values times their
    // scales go to bf16 directly (rounded once, by 2^-9 at most), not through q8_0.
    bool requantize_non_integer = true;
    // What those matrices (and the others that are not exactly blocks: act-order 8-bit, groups
    // across blocks of 32) are quantized again to: q8_0, or q4_K where rows are whole 256-value
    // super-blocks (kvrmd --quantization=q4_K; QuantizedLoadOptions::requantize_as).
    WeightFormat requantize_as = WeightFormat::kQ8_0;
    // What a quantized checkpoint's matrices become when not 8-bit blocks: bf16, or f32 (their
    // values exactly: tools/gguf's converter).
    DType dense = DType::kBF16;
    // With as_q8, MXFP4 weights (gpt-oss's experts) kept as MXFP4 blocks (4.25 bits a weight),
    // else held as 8-bit blocks of the same values (QuantizedLoadOptions::mxfp4: q8_0 or q8
    // affine; GgufLoadOptions::mxfp4: q8 affine).
    bool mxfp4 = true;
  };
  // `path`: a Hugging Face model directory (config.json, safetensors, tokenizer.json), a GGUF
  // file, or a directory with no config.json and one .gguf file. Every error names the file and
  // what is wrong with it.
  static absl::StatusOr<std::unique_ptr<ModelBundle>> Load(const std::string& path,
                                                           const LoadOptions& options);
  static absl::StatusOr<std::unique_ptr<ModelBundle>> Load(const std::string& path) {
    return Load(path, LoadOptions());
  }
};

// What each token adds to the text, as structured outputs see it: TokenContinuationBytes sized to
// the model's logits (ids the tokenizer lacks add nothing), the end-of-sequence tokens apart
// (they end the text instead of adding to it), and a harmony model's message markers (special
// tokens, "<|channel|>", ...) their own text.
std::vector<std::optional<std::string>> StructuredTokenBytes(const ModelBundle& model);

}  // namespace kvrm

#endif  // KVRM_RUNTIME_MODEL_BUNDLE_H_
