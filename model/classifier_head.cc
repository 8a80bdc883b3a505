#include "model/classifier_head.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/json.h"
#include "common/status_macros.h"

namespace kvrm {
namespace {

absl::Status Invalid(const std::string& file, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(file, ": ", why));
}

const Json* Member(const Json& j, const char* key) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}

double Sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

}  // namespace

std::vector<double> ClassifierHead::Logits(absl::Span<const float> hidden) const {
  std::vector<double> out(num_labels, 0.0);
  const size_t d = std::min(hidden.size(), static_cast<size_t>(hidden_size));
  for (int32_t l = 0; l < num_labels; ++l) {
    const double* w = weight.data() + static_cast<size_t>(l) * hidden_size;
    double sum = bias.empty() ? 0.0 : bias[l];
    for (size_t c = 0; c < d; ++c) sum += w[c] * hidden[c];
    out[l] = sum;
  }
  return out;
}

double ClassifierHead::Score(double logit) const {
  return score_activation == Activation::kIdentity ? logit : Sigmoid(logit);
}

std::vector<double> ClassifierHead::Probabilities(const std::vector<double>& logits) const {
  std::vector<double> p = logits;
  switch (classify_activation) {
    case Activation::kIdentity:
      break;
    case Activation::kSigmoid:
      for (double& v : p) v = Sigmoid(v);
      break;
    case Activation::kSoftmax: {
      if (p.empty()) break;
      const double top = *std::max_element(p.begin(), p.end());
      double sum = 0;
      for (double& v : p) sum += v = std::exp(v - top);
      for (double& v : p) v /= sum;
      break;
    }
  }
  return p;
}

absl::StatusOr<std::optional<ClassifierHead>> LoadClassifierHead(const std::string& dir,
                                                                 const SafetensorsSet& files,
                                                                 int32_t hidden_size) {
  if (!files.Contains("score.weight")) return std::nullopt;
  ASSIGN_OR_RETURN(const TensorView t, files.GetAny("score.weight"));
  if (!t.is_float() || t.shape.size() != 2 || t.shape[1] != hidden_size || t.shape[0] < 1 ||
      t.shape[0] > kMaxClassifierLabels) {
    return Invalid(t.file, absl::StrCat("score.weight: ", std::string(StorageTypeName(t.type)), " ",
                                        ShapeToString(t.shape), "; a classification head is ",
                                        "float [labels <= ", kMaxClassifierLabels,
                                        "][hidden_size = ", hidden_size, "]"));
  }
  ClassifierHead head;
  head.num_labels = static_cast<int32_t>(t.shape[0]);
  head.hidden_size = hidden_size;
  head.source = "score.weight";
  head.weight.resize(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) head.weight[i] = FloatElement(t, i);
  if (files.Contains("score.bias")) {
    ASSIGN_OR_RETURN(const TensorView b, files.GetAny("score.bias"));
    if (!b.is_float() || b.shape != std::vector<int64_t>{head.num_labels}) {
      return Invalid(b.file, absl::StrCat("score.bias: ", std::string(StorageTypeName(b.type)), " ",
                                          ShapeToString(b.shape), "; expected float [",
                                          head.num_labels, "] as score.weight's rows"));
    }
    for (int64_t i = 0; i < b.numel(); ++i) head.bias.push_back(FloatElement(b, i));
  }
  for (int32_t l = 0; l < head.num_labels; ++l) head.labels.push_back(absl::StrCat("LABEL_", l));

  const std::string config_path = (std::filesystem::path(dir) / "config.json").string();
  ASSIGN_OR_RETURN(const Json config, ReadJsonFile(config_path));
  if (const Json* id2label = Member(config, "id2label"); id2label != nullptr) {
    if (!id2label->is_object()) return Invalid(config_path, "id2label: not an object");
    if (static_cast<int32_t>(id2label->size()) != head.num_labels) {
      return Invalid(config_path, absl::StrCat("id2label: ", id2label->size(),
                                               " labels; score.weight has ", head.num_labels));
    }
    for (const auto& [key, value] : id2label->items()) {
      int32_t id;
      if (!absl::SimpleAtoi(key, &id) || id < 0 || id >= head.num_labels || !value.is_string()) {
        return Invalid(config_path, absl::StrCat("id2label.", key, ": expected \"<id below ",
                                                 head.num_labels, ">\": \"<label>\""));
      }
      head.labels[id] = value.get<std::string>();
    }
  }
  // sentence-transformers' CrossEncoder writes the activation it applies to scores.
  std::string activation;
  std::string activation_key;
  if (const Json* st = Member(config, "sentence_transformers"); st != nullptr && st->is_object()) {
    if (const Json* fn = Member(*st, "activation_fn"); fn != nullptr && fn->is_string()) {
      activation = fn->get<std::string>();
      activation_key = "sentence_transformers.activation_fn";
    }
  }
  if (const Json* fn = Member(config, "sbert_ce_default_activation_function");
      activation.empty() && fn != nullptr && fn->is_string()) {
    activation = fn->get<std::string>();
    activation_key = "sbert_ce_default_activation_function";
  }
  if (absl::EndsWith(activation, "Identity")) {
    head.score_activation = ClassifierHead::Activation::kIdentity;
  } else if (!activation.empty() && !absl::EndsWith(activation, "Sigmoid")) {
    return Invalid(config_path, absl::StrCat(activation_key, ": ", activation,
                                             " is not applied by kvrm (Sigmoid and Identity are)"));
  }
  // Classify's activation follows the loss Transformers trains the head with.
  std::string problem;
  if (const Json* p = Member(config, "problem_type"); p != nullptr && p->is_string()) {
    problem = p->get<std::string>();
  }
  if (problem == "regression") {
    head.classify_activation = ClassifierHead::Activation::kIdentity;
  } else if (problem == "multi_label_classification" || (problem.empty() && head.num_labels == 1)) {
    head.classify_activation = ClassifierHead::Activation::kSigmoid;
  } else {
    // single_label_classification, or (as vLLM) anything else: softmax, one label's sigmoid.
    head.classify_activation = head.num_labels == 1 ? ClassifierHead::Activation::kSigmoid
                                                    : ClassifierHead::Activation::kSoftmax;
  }
  return head;
}

absl::StatusOr<ClassifierHead> ClassifierFromTokens(const WeightMatrix& lm_head,
                                                    const Tokenizer& tokenizer,
                                                    const std::vector<std::string>& tokens) {
  if (tokens.empty()) return absl::InvalidArgumentError("classifier tokens: none given");
  if (static_cast<int32_t>(tokens.size()) > kMaxClassifierLabels) {
    return absl::InvalidArgumentError(
        absl::StrCat("classifier tokens: ", tokens.size(), "; at most ", kMaxClassifierLabels));
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (tokens[i] == tokens[j]) {
        return absl::InvalidArgumentError(
            absl::StrCat("classifier tokens: \"", tokens[i], "\" is named twice"));
      }
    }
  }
  ClassifierHead head;
  head.hidden_size = static_cast<int32_t>(lm_head.cols);
  std::vector<std::vector<double>> rows;
  for (const std::string& token : tokens) {
    const std::optional<int32_t> id = tokenizer.TokenToId(token);
    if (!id || *id >= lm_head.rows) {
      return absl::InvalidArgumentError(
          absl::StrCat("classifier tokens: \"", token, "\" is not a token of the vocabulary"));
    }
    std::vector<float> row(lm_head.cols);
    WeightRowToFloat(lm_head, *id, row.data());
    rows.emplace_back(row.begin(), row.end());
  }
  // Probabilities as vLLM's for such heads: one label's sigmoid, several labels' softmax.
  head.classify_activation = rows.size() == 2 || rows.size() == 1
                                 ? ClassifierHead::Activation::kSigmoid
                                 : ClassifierHead::Activation::kSoftmax;
  if (rows.size() == 2) {
    // sigmoid(l_b - l_a) = exp(l_b) / (exp(l_a) + exp(l_b)): b's probability of the two.
    for (size_t c = 0; c < rows[0].size(); ++c) rows[0][c] = rows[1][c] - rows[0][c];
    rows.resize(1);
    head.labels = {tokens[1]};
  } else {
    head.labels = tokens;
  }
  head.num_labels = static_cast<int32_t>(rows.size());
  for (const std::vector<double>& r : rows)
    head.weight.insert(head.weight.end(), r.begin(), r.end());
  head.source = absl::StrCat("LM head rows ", absl::StrJoin(tokens, ", "));
  return head;
}

}  // namespace kvrm
