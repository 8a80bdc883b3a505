// A sequence-classification head: the linear layer Transformers' *ForSequenceClassification
// models (LlamaForSequenceClassification, Qwen2/Qwen3ForSequenceClassification: rerankers,
// reward models, classifiers) put on the last token's final hidden state, `score.weight`
// [num_labels][hidden] with no bias, as vLLM serves them (/classify, /score, /rerank); or one made
// from LM-head rows of named tokens (vLLM's `classifier_from_token`: Qwen3-Reranker's "no" /
// "yes", bge-reranker-v2-gemma's "Yes").
#ifndef KVRM_MODEL_CLASSIFIER_HEAD_H_
#define KVRM_MODEL_CLASSIFIER_HEAD_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/cpu/weight_matrix.h"
#include "model/safetensors.h"
#include "model/tokenizer.h"

namespace kvrm {

struct ClassifierHead {
  enum class Activation { kSoftmax, kSigmoid, kIdentity };

  int32_t num_labels = 0;
  int32_t hidden_size = 0;
  std::vector<double> weight;       // [num_labels][hidden_size]
  std::vector<double> bias;         // [num_labels], or empty (Transformers' heads have none)
  std::vector<std::string> labels;  // config.json's id2label, else "LABEL_<i>"
  // What Classify's probabilities are, as vLLM derives them from config.json's problem_type
  // (Transformers' loss): softmax over the labels (single_label_classification, or unset with
  // several labels), a sigmoid per label (multi_label_classification, or unset with one label),
  // the logits themselves (regression: a reward model's score).
  Activation classify_activation = Activation::kSoftmax;
  // What a one-label head's logit becomes as Score's relevance: sentence-transformers'
  // CrossEncoder activation_fn (Sigmoid or Identity), else a sigmoid.
  Activation score_activation = Activation::kSigmoid;
  std::string source;  // for logs and ModelInfo: "score.weight", "LM head rows no, yes"

  // W h + b, in double. `hidden` has hidden_size values (the last token's final-norm output).
  std::vector<double> Logits(absl::Span<const float> hidden) const;
  // Classify's probabilities of `logits` (classify_activation).
  std::vector<double> Probabilities(const std::vector<double>& logits) const;
  // A one-label head's score (score_activation of its logit).
  double Score(double logit) const;
};

// At most this many labels (a head is held in double: 1024 x 16384 is 128 MiB).
inline constexpr int32_t kMaxClassifierLabels = 1024;

// The head of a *ForSequenceClassification checkpoint in `dir`: `score.weight` from `files`
// (float, [labels][hidden_size]) and `score.bias` if there is one, labels from config.json's
// id2label, the activations from its problem_type and `sentence_transformers.activation_fn` (or
// `sbert_ce_default_activation_function`). nullopt when the checkpoint has no score.weight.
// INVALID_ARGUMENT naming the file and tensor or key for a shape, type or setting kvrm does not
// follow (the caller serves the model without a head then: Classify and Score refused).
absl::StatusOr<std::optional<ClassifierHead>> LoadClassifierHead(const std::string& dir,
                                                                 const SafetensorsSet& files,
                                                                 int32_t hidden_size);

// A head from the LM head's rows of `tokens` (each a token of the vocabulary, as written in
// tokenizer.json): one token, one label whose logit is that token's; two (a, b), one label whose
// logit is logit(b) - logit(a), so that its sigmoid is b's probability against a (Qwen3-Reranker:
// "no", "yes"); more, one label each (probabilities: their softmax). INVALID_ARGUMENT naming a
// token that is not in the vocabulary.
absl::StatusOr<ClassifierHead> ClassifierFromTokens(const WeightMatrix& lm_head,
                                                    const Tokenizer& tokenizer,
                                                    const std::vector<std::string>& tokens);

}  // namespace kvrm

#endif  // KVRM_MODEL_CLASSIFIER_HEAD_H_
