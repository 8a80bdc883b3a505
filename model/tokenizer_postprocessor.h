// tokenizer.json "post_processor": the special tokens added around an encoded sequence when
// add_special_tokens is set (HF `processors`), around one sequence or a pair (a cross-encoder's
// query and document: HF `tokenizer(text, text_pair)`).
#ifndef KVRM_MODEL_TOKENIZER_POSTPROCESSOR_H_
#define KVRM_MODEL_TOKENIZER_POSTPROCESSOR_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "common/json.h"
#include "model/tokenizer_text.h"

namespace kvrm::tok {

// Immutable after parsing; Process is thread-safe.
class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  virtual void Process(std::vector<int32_t>* ids) const = 0;
  // The pair (A, B) joined with this processor's pair template: TemplateProcessing's "pair"
  // (without one, A B as HF's template builder defaults to), [CLS] A [SEP] B [SEP] (Bert),
  // <s> A </s></s> B </s> (Roberta), A B (ByteLevel).
  virtual std::vector<int32_t> ProcessPair(const std::vector<int32_t>& a,
                                           const std::vector<int32_t>& b) const = 0;
  // The first id put before the sequence, if any (the BOS token).
  virtual std::optional<int32_t> bos_id() const = 0;
  // Adds nothing to any sequence (ByteLevel): a pair stays two sequences through it.
  virtual bool identity() const { return false; }
  // Appends every id this processor can insert (for the loader to check against the vocabulary:
  // an id beyond it would index past the embedding table).
  virtual void InsertedIds(std::vector<int32_t>* out) const = 0;
};

// The single-sequence template [prefix] $A [suffix] (Transformers' Llama tokenizers build it from
// add_bos_token / add_eos_token).
std::unique_ptr<PostProcessor> MakeSingleTemplate(std::optional<int32_t> prefix,
                                                  std::optional<int32_t> suffix);

// Supported: TemplateProcessing, ByteLevel (ids unchanged), Sequence, RobertaProcessing,
// BertProcessing; other types are UNIMPLEMENTED naming the type.
absl::StatusOr<std::unique_ptr<PostProcessor>> ParsePostProcessor(const Json& j, const JsonPath& at,
                                                                  int depth = 0);

}  // namespace kvrm::tok

#endif  // KVRM_MODEL_TOKENIZER_POSTPROCESSOR_H_
