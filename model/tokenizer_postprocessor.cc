#include "model/tokenizer_postprocessor.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/tokenizer_bpe.h"

namespace kvrm::tok {
namespace {

constexpr int kMaxNesting = 16;

// The single-sequence template as a list of parts: fixed ids, or the sequence itself.
class TemplateProcessor : public PostProcessor {
 public:
  struct Part {
    bool is_sequence = false;
    std::vector<int32_t> ids;
  };
  explicit TemplateProcessor(std::vector<Part> parts) : parts_(std::move(parts)) {}

  void Process(std::vector<int32_t>* ids) const override {
    std::vector<int32_t> out;
    out.reserve(ids->size() + 4);
    for (const Part& p : parts_) {
      if (p.is_sequence) {
        out.insert(out.end(), ids->begin(), ids->end());
      } else {
        out.insert(out.end(), p.ids.begin(), p.ids.end());
      }
    }
    *ids = std::move(out);
  }
  std::optional<int32_t> bos_id() const override {
    if (parts_.empty() || parts_[0].is_sequence || parts_[0].ids.empty()) return std::nullopt;
    return parts_[0].ids[0];
  }
  void InsertedIds(std::vector<int32_t>* out) const override {
    for (const Part& p : parts_) out->insert(out->end(), p.ids.begin(), p.ids.end());
  }

 private:
  std::vector<Part> parts_;
};

class IdentityProcessor : public PostProcessor {
 public:
  void Process(std::vector<int32_t>*) const override {}
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

absl::StatusOr<std::unique_ptr<PostProcessor>> ParseTemplate(const Json& j, const JsonPath& at) {
  const Json* single = Member(j, "single");
  if (single == nullptr || !single->is_array()) return at.Key("single").Invalid("expected an array");
  const Json* specials = Member(j, "special_tokens");
  std::vector<TemplateProcessor::Part> parts;
  for (size_t i = 0; i < single->size(); ++i) {
    const JsonPath here = at.Key("single").Index(i);
    const Json& item = (*single)[i];
    if (const Json* seq = Member(item, "Sequence")) {
      ASSIGN_OR_RETURN(const std::string which, RequiredString(*seq, "id", here.Key("Sequence")));
      if (which == "A") parts.push_back({true, {}});
      continue;  // "B" never occurs in a single-sequence encode
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
  return std::make_unique<TemplateProcessor>(std::move(parts));
}

// RobertaProcessing / BertProcessing: "cls": [token, id], "sep": [token, id] -> cls A sep.
absl::StatusOr<std::unique_ptr<PostProcessor>> ParseClsSep(const Json& j, const JsonPath& at) {
  int32_t ids[2];
  const char* keys[2] = {"cls", "sep"};
  for (int k = 0; k < 2; ++k) {
    const Json* pair = Member(j, keys[k]);
    if (pair == nullptr || !pair->is_array() || pair->size() != 2) {
      return at.Key(keys[k]).Invalid("expected [token, id]");
    }
    ASSIGN_OR_RETURN(ids[k], CheckedId((*pair)[1], at.Key(keys[k]).Index(1)));
  }
  std::vector<TemplateProcessor::Part> parts = {{false, {ids[0]}}, {true, {}}, {false, {ids[1]}}};
  return std::make_unique<TemplateProcessor>(std::move(parts));
}

}  // namespace

std::unique_ptr<PostProcessor> MakeSingleTemplate(std::optional<int32_t> prefix,
                                                  std::optional<int32_t> suffix) {
  std::vector<TemplateProcessor::Part> parts;
  if (prefix) parts.push_back({false, {*prefix}});
  parts.push_back({true, {}});
  if (suffix) parts.push_back({false, {*suffix}});
  return std::make_unique<TemplateProcessor>(std::move(parts));
}

absl::StatusOr<std::unique_ptr<PostProcessor>> ParsePostProcessor(const Json& j, const JsonPath& at,
                                                                  int depth) {
  if (depth > kMaxNesting) return at.Invalid("post-processors nested too deep");
  if (!j.is_object()) return at.Invalid("expected an object");
  ASSIGN_OR_RETURN(const std::string type, RequiredString(j, "type", at));
  if (type == "TemplateProcessing") return ParseTemplate(j, at);
  if (type == "ByteLevel") return std::make_unique<IdentityProcessor>();
  if (type == "RobertaProcessing" || type == "BertProcessing") return ParseClsSep(j, at);
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
