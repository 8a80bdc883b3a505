// What llama.cpp's GGUF vocabularies and kvrm's tokenizer.json translation of them share: the
// token types (llama.h's llama_token_type) and the split regexes of the byte-level BPEs whose
// tokenizer.ggml.pre names them (as Transformers writes them in tokenizer.json; llama.cpp's
// spelling of the contractions, '[sS] for (?i:'s), matches the same text).
#ifndef KVRM_MODEL_GGUF_VOCAB_H_
#define KVRM_MODEL_GGUF_VOCAB_H_

#include "absl/strings/string_view.h"

namespace kvrm::gguf_vocab {

enum TokenType : int {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

// "llama-bpe" (Llama 3): also takes a word that is a whole token as it is (ignore_merges).
constexpr absl::string_view kLlama3Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// "qwen2": Llama 3's with single digits.
constexpr absl::string_view kQwen2Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// "gpt-2" (ByteLevel's use_regex split), also the last of "smollm" and "default".
constexpr absl::string_view kGpt2Split =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";

// "gpt-4o" (o200k: gpt-oss's o200k_harmony; llama.cpp also takes llama4's by it): words split
// by case, contractions case-insensitive, up to three digits, "/" kept with punctuation.
constexpr absl::string_view kGpt4oSplit =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

}  // namespace kvrm::gguf_vocab

#endif  // KVRM_MODEL_GGUF_VOCAB_H_
