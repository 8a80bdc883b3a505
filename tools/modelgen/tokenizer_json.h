// Serialises a trained byte-level BPE as Hugging Face tokenizer.json / tokenizer_config.json in
// the Llama 3 layout (Split regex + ByteLevel pre-tokenizer, TemplateProcessing adding
// <|begin_of_text|>, ByteLevel decoder).
#ifndef KVRM_TOOLS_MODELGEN_TOKENIZER_JSON_H_
#define KVRM_TOOLS_MODELGEN_TOKENIZER_JSON_H_

#include <array>
#include <string>
#include <string_view>

#include "tools/modelgen/bpe_trainer.h"

namespace kvrm::modelgen {

// Appended after the BPE tokens, in this order, taking the last ids of the vocabulary.
inline constexpr std::array<std::string_view, 4> kSpecialTokens = {
    "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|pad|>"};
inline constexpr int kBosIndex = 0;  // into kSpecialTokens
inline constexpr int kEosIndex = 1;
inline constexpr int kEotIndex = 2;
inline constexpr int kPadIndex = 3;

// Id of special token `index` given the BPE model (they follow its tokens).
inline int SpecialTokenId(const BpeModel& bpe, int index) {
  return static_cast<int>(bpe.tokens.size()) + index;
}

// Pretty-printed, deterministic (keys in a fixed order, vocab in id order), UTF-8 JSON.
std::string BuildTokenizerJson(const BpeModel& bpe);
std::string BuildTokenizerConfigJson(const BpeModel& bpe, int model_max_length);

}  // namespace kvrm::modelgen

#endif  // KVRM_TOOLS_MODELGEN_TOKENIZER_JSON_H_
