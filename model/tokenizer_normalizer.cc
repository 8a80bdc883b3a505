#include "model/tokenizer_normalizer.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "unicode/locid.h"
#include "unicode/normalizer2.h"
#include "unicode/unistr.h"

namespace kvrm::tok {
namespace {

// Sequences nest; the JSON depth bound already limits this, but stay explicit.
constexpr int kMaxNesting = 16;

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
      : steps_(std::move(steps)) {}
  absl::Status Normalize(std::string* text) const override {
    for (const auto& step : steps_) RETURN_IF_ERROR(step->Normalize(text));
    return absl::OkStatus();
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

// HF prepends only to non-empty text.
class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  absl::Status Normalize(std::string* text) const override {
    if (!text->empty()) text->insert(0, prefix_);
    return absl::OkStatus();
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(std::unique_ptr<Pattern> pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  absl::Status Normalize(std::string* text) const override {
    *text = ReplaceAll(*pattern_, *text, content_);
    return absl::OkStatus();
  }

 private:
  std::unique_ptr<Pattern> pattern_;
  std::string content_;
};

// Unicode normalization forms through ICU (the Normalizer2 singletons are thread-safe).
class IcuNormalizer : public Normalizer {
 public:
  IcuNormalizer(const icu::Normalizer2* n, std::string name) : n_(n), name_(std::move(name)) {}
  absl::Status Normalize(std::string* text) const override {
    UErrorCode err = U_ZERO_ERROR;
    const icu::UnicodeString in = icu::UnicodeString::fromUTF8(*text);
    if (n_->isNormalized(in, err) && U_SUCCESS(err)) return absl::OkStatus();
    err = U_ZERO_ERROR;
    const icu::UnicodeString out = n_->normalize(in, err);
    if (U_FAILURE(err)) {
      return absl::InternalError(absl::StrCat(name_, " normalization failed: ", u_errorName(err)));
    }
    text->clear();
    out.toUTF8String(*text);
    return absl::OkStatus();
  }

 private:
  const icu::Normalizer2* n_;
  std::string name_;
};

// Lowercases one character at a time, as Rust's char::to_lowercase (which HF maps over the
// text) does: full mappings such as U+0130 -> "i\u0307", but no context, so a word-final capital
// sigma becomes U+03C3, not the final form ICU would choose for the whole string.
class LowercaseNormalizer : public Normalizer {
 public:
  absl::Status Normalize(std::string* text) const override {
    std::string out;
    out.reserve(text->size());
    for (size_t i = 0; i < text->size();) {
      const uint32_t cp = NextCodePoint(*text, &i);
      if (cp < 0x80) {
        out.push_back(static_cast<char>(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp));
        continue;
      }
      icu::UnicodeString c(static_cast<UChar32>(cp));
      c.toLower(icu::Locale::getRoot());
      c.toUTF8String(out);
    }
    *text = std::move(out);
    return absl::OkStatus();
  }
};

class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  absl::Status Normalize(std::string* text) const override {
    size_t begin = 0, end = text->size();
    if (left_) {
      while (begin < end) {
        size_t next = begin;
        if (!IsWhitespace(NextCodePoint(*text, &next))) break;
        begin = next;
      }
    }
    if (right_) {
      while (end > begin) {
        const uint32_t cp = PrevCodePoint(*text, end);
        if (!IsWhitespace(cp)) break;
        std::string tmp;
        AppendUtf8(cp, &tmp);
        end -= tmp.size();
      }
    }
    *text = text->substr(begin, end - begin);
    return absl::OkStatus();
  }

 private:
  bool left_, right_;
};

absl::StatusOr<std::unique_ptr<Normalizer>> MakeIcu(std::string_view type, const JsonPath& at) {
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* n = nullptr;
  if (type == "NFC") n = icu::Normalizer2::getNFCInstance(err);
  if (type == "NFD") n = icu::Normalizer2::getNFDInstance(err);
  if (type == "NFKC") n = icu::Normalizer2::getNFKCInstance(err);
  if (type == "NFKD") n = icu::Normalizer2::getNFKDInstance(err);
  if (n == nullptr || U_FAILURE(err)) {
    return at.Unimplemented(absl::StrCat("ICU has no ", std::string(type), " normalizer"));
  }
  return std::make_unique<IcuNormalizer>(n, std::string(type));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const Json& j, const JsonPath& at,
                                                            int depth) {
  if (depth > kMaxNesting) return at.Invalid("normalizers nested too deep");
  if (!j.is_object()) return at.Invalid("expected an object");
  ASSIGN_OR_RETURN(const std::string type, RequiredString(j, "type", at));
  if (type == "Sequence") {
    const Json* list = Member(j, "normalizers");
    if (list == nullptr || !list->is_array()) return at.Key("normalizers").Invalid("expected an array");
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (size_t i = 0; i < list->size(); ++i) {
      ASSIGN_OR_RETURN(auto step, ParseNormalizer((*list)[i], at.Key("normalizers").Index(i), depth + 1));
      steps.push_back(std::move(step));
    }
    return std::make_unique<SequenceNormalizer>(std::move(steps));
  }
  if (type == "Prepend") {
    ASSIGN_OR_RETURN(std::string prefix, RequiredString(j, "prepend", at));
    return std::make_unique<PrependNormalizer>(std::move(prefix));
  }
  if (type == "Replace") {
    ASSIGN_OR_RETURN(auto pattern, ParsePattern(j, "pattern", at));
    ASSIGN_OR_RETURN(std::string content, RequiredString(j, "content", at));
    return std::make_unique<ReplaceNormalizer>(std::move(pattern), std::move(content));
  }
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") return MakeIcu(type, at);
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "Strip") {
    ASSIGN_OR_RETURN(const bool left, OptionalBool(j, "strip_left", at, false));
    ASSIGN_OR_RETURN(const bool right, OptionalBool(j, "strip_right", at, false));
    return std::make_unique<StripNormalizer>(left, right);
  }
  return at.Key("type").Unimplemented(absl::StrCat("normalizer type \"", type, "\" is not supported"));
}

}  // namespace kvrm::tok
