#include "model/tokenizer_postprocessor.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/tokenizer_bpe.h"

namespace kvrm::tok {
namespace {

constexpr int kMaxNesting = 16;

// The templates as lists of parts: fixed ids, or a sequence (A, or a pair's B).
class TemplateProcessor : public PostProcessor {
 public:
  struct Part {
    int sequence = 0;  // 0: `ids`; 1: A; 2: B
    std::vector<int32_t> ids;
  };
  // `pair` empty: "$A $B", no special tokens (HF's TemplateProcessingBuilder default; its
  // tokenizer.json files always write a pair template).
  TemplateProcessor(std::vector<Part> single, std::vector<Part> pair)
      : single_(std::move(single)), pair_(std::move(pair)) {
    if (pair_.empty()) pair_ = {{1, {}}, {2, {}}};
  }

  void Process(std::vector<int32_t>* ids) const override { *ids = Apply(single_, *ids, {}); }
  std::vector<int32_t> ProcessPair(const std::vector<int32_t>& a,
                                   const std::vector<int32_t>& b) const override {
    return Apply(pair_, a, b);
  }
  std::optional<int32_t> bos_id() const override {
    if (single_.empty() || single_[0].sequence != 0 || single_[0].ids.empty()) {
      return std::nullopt;
    }
    return single_[0].ids[0];
  }
  void InsertedIds(std::vector<int32_t>* out) const override {
    for (const std::vector<Part>* parts : {&single_, &pair_}) {
      for (const Part& p : *parts) out->insert(out->end(), p.ids.begin(), p.ids.end());
    }
  }

 private:
  static std::vector<int32_t> Apply(const std::vector<Part>& parts, const std::vector<int32_t>& a,
                                    const std::vector<int32_t>& b) {
    std::vector<int32_t> out;
    out.reserve(a.size() + b.size() + 8);
    for (const Part& p : parts) {
      const std::vector<int32_t>& add = p.sequence == 1 ? a : p.sequence == 2 ? b : p.ids;
      out.insert(out.end(), add.begin(), add.end());
    }
    return out;
  }

  std::vector<Part> single_;
  std::vector<Part> pair_;
};

class IdentityProcessor : public PostProcessor {
 public:
  void Process(std::vector<int32_t>*) const override {}
  std::vector<int32_t> ProcessPair(const std::vector<int32_t>& a,
                                   const std::vector<int32_t>& b) const override {
    std::vector<int32_t> out = a;
    out.insert(out.end(), b.begin(), b.end());
    return out;
  }
  bool identity() const override { return true; }
  std::optional<int32_t> bos_id() const override { return std::nullopt; }
  void InsertedIds(std::vector<int32_t>*) const override {}
};

class SequenceProcessor : public PostProcessor {
 public:
  explicit SequenceProcessor(std::vector<std::unique_ptr<PostProcessor>> steps)
      : steps_(std::move(steps)) {}
  void Process(std::vector<int32_t>* ids) const override {
    for (const auto& step : steps_) step->Process(ids);
  }
  // As HF runs a pair through a sequence: steps that add nothing (ByteLevel) keep the two apart,
  // the first that adds ids joins them with its pair template, the rest see one sequence.
  std::vector<int32_t> ProcessPair(const std::vector<int32_t>& a,
                                   const std::vector<int32_t>& b) const override {
    size_t i = 0;
    while (i < steps_.size() && steps_[i]->identity()) ++i;
    if (i == steps_.size()) return IdentityProcessor().ProcessPair(a, b);
    std::vector<int32_t> out = steps_[i]->ProcessPair(a, b);
    for (++i; i < steps_.size(); ++i) steps_[i]->Process(&out);
    return out;
  }
  bool identity() const override {
    for (const auto& step : steps_) {
      if (!step->identity()) return false;
    }
    return true;
  }
  void InsertedIds(std::vector<int32_t>* out) const override {
    for (const auto& step : steps_) step->InsertedIds(out);
  }
  std::optional<int32_t> bos_id() const override {
    for (const auto& step : steps_) {
      if (auto id = step->bos_id()) return id;
    }
    return std::nullopt;
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> steps_;
};

absl::StatusOr<int32_t> CheckedId(const Json& v, const JsonPath& at) {
  if (!v.is_number_integer()) return at.Invalid("expected an integer id");
  if (v.is_number_unsigned() ? v.get<uint64_t>() >= uint64_t{kMaxTokenId}
                             : (v.get<int64_t>() < 0 || v.get<int64_t>() >= kMaxTokenId)) {
    return at.Invalid(absl::StrCat("id ", v.dump(), " out of range [0, ", kMaxTokenId, ")"));
  }
  return static_cast<int32_t>(v.get<int64_t>());
}

// One of TemplateProcessing's templates ("single" or "pair").
absl::StatusOr<std::vector<TemplateProcessor::Part>> ParseTemplateParts(const Json& j,
                                                                        const char* key,
                                                                        const JsonPath& at) {
  const Json* list = Member(j, key);
  if (list == nullptr || !list->is_array()) return at.Key(key).Invalid("expected an array");
  const Json* specials = Member(j, "special_tokens");
  std::vector<TemplateProcessor::Part> parts;
  for (size_t i = 0; i < list->size(); ++i) {
    const JsonPath here = at.Key(key).Index(i);
    const Json& item = (*list)[i];
    if (const Json* seq = Member(item, "Sequence")) {
      ASSIGN_OR_RETURN(const std::string which, RequiredString(*seq, "id", here.Key("Sequence")));
      if (which != "A" && which != "B") {
        return here.Key("Sequence")
            .Key("id")
            .Invalid(absl::StrCat("\"", which, "\" is not A or B"));
      }
      parts.push_back({which == "A" ? 1 : 2, {}});
      continue;
    }
    const Json* special = Member(item, "SpecialToken");
    if (special == nullptr) return here.Invalid("expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
    ASSIGN_OR_RETURN(const std::string name, RequiredString(*special, "id", here.Key("SpecialToken")));
    const JsonPath entry_at = at.Key("special_tokens").Key(name);
    const Json* entry = specials == nullptr ? nullptr : Member(*specials, name);
    if (entry == nullptr) return entry_at.Invalid("missing (used by the template)");
    const Json* ids = Member(*entry, "ids");
    if (ids == nullptr || !ids->is_array()) return entry_at.Key("ids").Invalid("expected an array");
    TemplateProcessor::Part part;
    for (size_t k = 0; k < ids->size(); ++k) {
      ASSIGN_OR_RETURN(const int32_t id, CheckedId((*ids)[k], entry_at.Key("ids").Index(k)));
      part.ids.push_back(id);
    }
    parts.push_back(std::move(part));
  }
  return parts;
}

absl::StatusOr<std::unique_ptr<PostProcessor>> ParseTemplate(const Json& j, const JsonPath& at) {
  ASSIGN_OR_RETURN(std::vector<TemplateProcessor::Part> single,
                   ParseTemplateParts(j, "single", at));
  // A single template's B never occurs (HF fills it from nothing).
  single.erase(std::remove_if(single.begin(), single.end(),
                              [](const TemplateProcessor::Part& p) { return p.sequence == 2; }),
               single.end());
  std::vector<TemplateProcessor::Part> pair;
  if (const Json* p = Member(j, "pair"); p != nullptr && !p->is_null()) {
    ASSIGN_OR_RETURN(pair, ParseTemplateParts(j, "pair", at));
  }
  return std::make_unique<TemplateProcessor>(std::move(single), std::move(pair));
}

// RobertaProcessing / BertProcessing: "cls": [token, id], "sep": [token, id] -> cls A sep.
absl::StatusOr<std::unique_ptr<PostProcessor>> ParseClsSep(const Json& j, const JsonPath& at,
                                                           bool roberta) {
  int32_t ids[2];
  const char* keys[2] = {"cls", "sep"};
  for (int k = 0; k < 2; ++k) {
    const Json* pair = Member(j, keys[k]);
    if (pair == nullptr || !pair->is_array() || pair->size() != 2) {
      return at.Key(keys[k]).Invalid("expected [token, id]");
    }
    ASSIGN_OR_RETURN(ids[k], CheckedId((*pair)[1], at.Key(keys[k]).Index(1)));
  }
  std::vector<TemplateProcessor::Part> single = {{0, {ids[0]}}, {1, {}}, {0, {ids[1]}}};
  // Bert: [CLS] A [SEP] B [SEP]; Roberta: <s> A </s> </s> B </s>.
  std::vector<TemplateProcessor::Part> pair = single;
  if (roberta) pair.push_back({0, {ids[1]}});
  pair.push_back({2, {}});
  pair.push_back({0, {ids[1]}});
  return std::make_unique<TemplateProcessor>(std::move(single), std::move(pair));
}

}  // namespace

std::unique_ptr<PostProcessor> MakeSingleTemplate(std::optional<int32_t> prefix,
                                                  std::optional<int32_t> suffix) {
  // Transformers' LlamaTokenizerFast builds the pair template as bos A eos bos B eos.
  std::vector<TemplateProcessor::Part> single, pair;
  for (int seq : {1, 2}) {
    std::vector<TemplateProcessor::Part>& parts = seq == 1 ? single : pair;
    for (int s = 1; s <= seq; ++s) {
      if (prefix) parts.push_back({0, {*prefix}});
      parts.push_back({s, {}});
      if (suffix) parts.push_back({0, {*suffix}});
    }
  }
  return std::make_unique<TemplateProcessor>(std::move(single), std::move(pair));
}

absl::StatusOr<std::unique_ptr<PostProcessor>> ParsePostProcessor(const Json& j, const JsonPath& at,
                                                                  int depth) {
  if (depth > kMaxNesting) return at.Invalid("post-processors nested too deep");
  if (!j.is_object()) return at.Invalid("expected an object");
  ASSIGN_OR_RETURN(const std::string type, RequiredString(j, "type", at));
  if (type == "TemplateProcessing") return ParseTemplate(j, at);
  if (type == "ByteLevel") return std::make_unique<IdentityProcessor>();
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    return ParseClsSep(j, at, type == "RobertaProcessing");
  }
  if (type == "Sequence") {
    const Json* list = Member(j, "processors");
    if (list == nullptr || !list->is_array()) return at.Key("processors").Invalid("expected an array");
    std::vector<std::unique_ptr<PostProcessor>> steps;
    for (size_t i = 0; i < list->size(); ++i) {
      ASSIGN_OR_RETURN(auto step,
                       ParsePostProcessor((*list)[i], at.Key("processors").Index(i), depth + 1));
      steps.push_back(std::move(step));
    }
    return std::make_unique<SequenceProcessor>(std::move(steps));
  }
  return at.Key("type").Unimplemented(
      absl::StrCat("post-processor type \"", type, "\" is not supported"));
}

}  // namespace kvrm::tok
