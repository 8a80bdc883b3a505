// The tokenizer a GGUF file embeds (tokenizer.ggml.*), as kvrm's tokenizer.json tokenizer:
// - "gpt2" (byte-level BPE: Llama 3, Qwen2, GPT-2): the vocabulary and merges as they are, and the
//   pre-tokenizer llama.cpp uses for tokenizer.ggml.pre ("llama-bpe" also takes a word that is a
//   whole token as it is, as Llama 3's tokenizer.json does);
// - "llama" (SentencePiece BPE: Llama 2, Mistral): merges made from the scores as Transformers'
//   converter makes them (every split of a piece into two pieces, by the merged piece's score,
//   highest first: llama.cpp's merge order too, but for ties of score, which it breaks by
//   position), spaces as U+2581 with one prepended unless add_space_prefix is false, unknown
//   bytes as <0xXX> tokens.
// Control, user-defined and unknown tokens are added tokens (control and unknown special); where
// two tokens have the same text the later id is the text's, as in llama.cpp. BOS and EOS are
// added as tokenizer.ggml.add_bos_token / add_eos_token say (llama.cpp's defaults otherwise).
#ifndef KVRM_MODEL_GGUF_TOKENIZER_H_
#define KVRM_MODEL_GGUF_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/gguf.h"
#include "model/tokenizer.h"

namespace kvrm {

// The special tokens of a GGUF vocabulary as llama.cpp takes them: the id keys, else its defaults
// (a SentencePiece vocabulary's BOS 1 and EOS 2); an id outside the vocabulary is ignored, as
// llama.cpp ignores it (with a warning).
struct GgufSpecialTokens {
  int64_t bos = -1;  // -1: none
  int64_t eos = -1;
  // What ends a generation: EOS, EOT and EOM, and every token whose text llama.cpp takes as an
  // end of generation (<|eot_id|>, <|eom_id|>, <|end_of_text|>, <|im_end|>, <end_of_turn>, ...),
  // which files converted before their model's tokenizer_config named the turn's end need.
  std::vector<int32_t> end_of_generation;
  bool add_bos = false;
  bool add_eos = false;
};

absl::StatusOr<GgufSpecialTokens> ReadGgufSpecialTokens(const GgufFile& file);

// INVALID_ARGUMENT naming the key for a malformed vocabulary (texts that are not UTF-8, arrays of
// the wrong length, scores that are not finite, a merge without its space), UNIMPLEMENTED naming
// it for a tokenizer model or pre-tokenizer this translation does not know. `vocab_limit` as
// Tokenizer::FromJson's.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadGgufTokenizer(
    const GgufFile& file, int32_t vocab_limit = kTokenizerMaxIds);

}  // namespace kvrm

#endif  // KVRM_MODEL_GGUF_TOKENIZER_H_
