#include "model/tokenizer_pretokenizer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kvrm::tok {
namespace {

constexpr int kMaxNesting = 16;

// The GPT-2 pattern HF's ByteLevel pre-tokenizer uses when use_regex is true.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Replaces each piece by the non-empty sub-pieces `split(piece)` returns, in order.
template <typename F>
void SplitEach(std::vector<Piece>* pieces, F split) {
  std::vector<Piece> out;
  out.reserve(pieces->size());
  for (const Piece& piece : *pieces) {
    for (auto& sub : split(piece)) {
      if (!sub.text.empty()) out.push_back(std::move(sub));
    }
  }
  *pieces = std::move(out);
}

std::vector<Piece> SplitBySpans(const Piece& piece, const std::vector<Span>& spans,
                                SplitBehavior behavior) {
  std::vector<Piece> out;
  for (const auto& [start, end] : ApplySplitBehavior(spans, behavior)) {
    out.push_back({piece.text.substr(start, end - start), piece.at_start && start == 0});
  }
  return out;
}

// Spans of single characters satisfying `pred` (HF's `impl Pattern for Fn(char) -> bool`).
template <typename Pred>
std::vector<Span> CharSpans(std::string_view text, Pred pred) {
  if (text.empty()) return {{0, 0, false}};
  std::vector<Span> out;
  size_t last = 0;
  for (size_t i = 0; i < text.size();) {
    const size_t begin = i;
    const uint32_t cp = NextCodePoint(text, &i);
    if (pred(cp)) {
      if (last < begin) out.push_back({last, begin, false});
      out.push_back({begin, i, true});
      last = i;
    }
  }
  if (last < text.size()) out.push_back({last, text.size(), false});
  return out;
}

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps)
      : steps_(std::move(steps)) {}
  void PreTokenize(std::vector<Piece>* pieces) const override {
    for (const auto& step : steps_) step->PreTokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(std::unique_ptr<Pattern> pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  void PreTokenize(std::vector<Piece>* pieces) const override {
    SplitEach(pieces, [this](const Piece& piece) {
      std::vector<Span> spans = pattern_->FindMatches(piece.text);
      if (invert_) {
        for (Span& s : spans) s.is_match = !s.is_match;
      }
      return SplitBySpans(piece, spans, behavior_);
    });
  }

 private:
  std::unique_ptr<Pattern> pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::unique_ptr<Pattern> regex)
      : add_prefix_space_(add_prefix_space), regex_(std::move(regex)) {}
  void PreTokenize(std::vector<Piece>* pieces) const override {
    SplitEach(pieces, [this](const Piece& piece) {
      Piece p = piece;
      if (add_prefix_space_ && (p.text.empty() || p.text[0] != ' ')) p.text.insert(0, " ");
      if (regex_ == nullptr) return std::vector<Piece>{std::move(p)};
      return SplitBySpans(p, regex_->FindMatches(p.text), SplitBehavior::kIsolated);
    });
    const auto& table = ByteToChar();
    for (Piece& piece : *pieces) {
      std::string mapped;
      mapped.reserve(piece.text.size() * 2);
      for (char c : piece.text) mapped += table[static_cast<unsigned char>(c)];
      piece.text = std::move(mapped);
    }
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Pattern> regex_;  // null when use_regex is false
};

enum class PrependScheme { kFirst, kAlways, kNever };

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  MetaspacePreTokenizer(uint32_t replacement, PrependScheme scheme, bool split)
      : replacement_(replacement), scheme_(scheme), split_(split) {
    AppendUtf8(replacement, &rep_);
  }
  void PreTokenize(std::vector<Piece>* pieces) const override {
    SplitEach(pieces, [this](const Piece& piece) {
      Piece p{std::string(), piece.at_start};
      p.text.reserve(piece.text.size() + rep_.size());
      for (char c : piece.text) {
        if (c == ' ') {
          p.text += rep_;
        } else {
          p.text.push_back(c);
        }
      }
      const bool starts_with_rep = p.text.compare(0, rep_.size(), rep_) == 0;
      if (!starts_with_rep && (scheme_ == PrependScheme::kAlways ||
                               (scheme_ == PrependScheme::kFirst && p.at_start))) {
        p.text.insert(0, rep_);
      }
      if (!split_) return std::vector<Piece>{std::move(p)};
      const uint32_t rep = replacement_;
      return SplitBySpans(p, CharSpans(p.text, [rep](uint32_t cp) { return cp == rep; }),
                          SplitBehavior::kMergedWithNext);
    });
  }

 private:
  uint32_t replacement_;
  std::string rep_;
  PrependScheme scheme_;
  bool split_;
};

class DigitsPreTokenizer : public PreTokenizer {
 public:
  explicit DigitsPreTokenizer(bool individual) : individual_(individual) {}
  void PreTokenize(std::vector<Piece>* pieces) const override {
    SplitEach(pieces, [this](const Piece& piece) {
      return SplitBySpans(piece, CharSpans(piece.text, IsNumeric),
                          individual_ ? SplitBehavior::kIsolated : SplitBehavior::kContiguous);
    });
  }

 private:
  bool individual_;
};

class WhitespaceSplitPreTokenizer : public PreTokenizer {
 public:
  void PreTokenize(std::vector<Piece>* pieces) const override {
    SplitEach(pieces, [](const Piece& piece) {
      return SplitBySpans(piece, CharSpans(piece.text, IsWhitespace), SplitBehavior::kRemoved);
    });
  }
};

absl::StatusOr<SplitBehavior> ParseBehavior(const Json& j, const JsonPath& at) {
  ASSIGN_OR_RETURN(const std::string b, RequiredString(j, "behavior", at));
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  return at.Key("behavior").Invalid(absl::StrCat("unknown split behavior \"", b, "\""));
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> ParseMetaspace(const Json& j, const JsonPath& at) {
  ASSIGN_OR_RETURN(const uint32_t replacement, RequiredChar(j, "replacement", at));
  ASSIGN_OR_RETURN(const bool split, OptionalBool(j, "split", at, true));
  PrependScheme scheme = PrependScheme::kAlways;
  if (Member(j, "prepend_scheme") != nullptr) {
    ASSIGN_OR_RETURN(const std::string s, RequiredString(j, "prepend_scheme", at));
    if (s == "first") {
      scheme = PrependScheme::kFirst;
    } else if (s == "always") {
      scheme = PrependScheme::kAlways;
    } else if (s == "never") {
      scheme = PrependScheme::kNever;
    } else {
      return at.Key("prepend_scheme").Invalid(absl::StrCat("unknown prepend scheme \"", s, "\""));
    }
  } else {
    // Files written before prepend_scheme existed.
    ASSIGN_OR_RETURN(const bool add_prefix_space, OptionalBool(j, "add_prefix_space", at, true));
    scheme = add_prefix_space ? PrependScheme::kAlways : PrependScheme::kNever;
  }
  return std::make_unique<MetaspacePreTokenizer>(replacement, scheme, split);
}

}  // namespace

std::vector<std::pair<size_t, size_t>> ApplySplitBehavior(const std::vector<Span>& spans,
                                                          SplitBehavior behavior) {
  std::vector<std::pair<size_t, size_t>> out;
  out.reserve(spans.size());
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const Span& s : spans) {
        if (!s.is_match) out.emplace_back(s.start, s.end);
      }
      break;
    case SplitBehavior::kIsolated:
      for (const Span& s : spans) out.emplace_back(s.start, s.end);
      break;
    case SplitBehavior::kContiguous:
      for (const Span& s : spans) {
        if (s.is_match == previous_match && !out.empty()) {
          out.back().second = s.end;
        } else {
          out.emplace_back(s.start, s.end);
        }
        previous_match = s.is_match;
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const Span& s : spans) {
        if (s.is_match && !previous_match && !out.empty()) {
          out.back().second = s.end;
        } else {
          out.emplace_back(s.start, s.end);
        }
        previous_match = s.is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !out.empty()) {
          out.back().first = it->start;
        } else {
          out.emplace_back(it->start, it->end);
        }
        previous_match = it->is_match;
      }
      std::reverse(out.begin(), out.end());
      break;
  }
  return out;
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const Json& j, const JsonPath& at,
                                                                int depth) {
  if (depth > kMaxNesting) return at.Invalid("pre-tokenizers nested too deep");
  if (!j.is_object()) return at.Invalid("expected an object");
  ASSIGN_OR_RETURN(const std::string type, RequiredString(j, "type", at));
  if (type == "Sequence") {
    const Json* list = Member(j, "pretokenizers");
    if (list == nullptr || !list->is_array()) {
      return at.Key("pretokenizers").Invalid("expected an array");
    }
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (size_t i = 0; i < list->size(); ++i) {
      ASSIGN_OR_RETURN(auto step,
                       ParsePreTokenizer((*list)[i], at.Key("pretokenizers").Index(i), depth + 1));
      steps.push_back(std::move(step));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(steps));
  }
  if (type == "Split") {
    ASSIGN_OR_RETURN(auto pattern, ParsePattern(j, "pattern", at));
    ASSIGN_OR_RETURN(const SplitBehavior behavior, ParseBehavior(j, at));
    ASSIGN_OR_RETURN(const bool invert, OptionalBool(j, "invert", at, false));
    return std::make_unique<SplitPreTokenizer>(std::move(pattern), behavior, invert);
  }
  if (type == "ByteLevel") {
    ASSIGN_OR_RETURN(const bool add_prefix_space, OptionalBool(j, "add_prefix_space", at, true));
    ASSIGN_OR_RETURN(const bool use_regex, OptionalBool(j, "use_regex", at, true));
    std::unique_ptr<Pattern> regex;
    if (use_regex) {
      ASSIGN_OR_RETURN(regex, Pattern::Regex(kGpt2Pattern));
    }
    return std::make_unique<ByteLevelPreTokenizer>(add_prefix_space, std::move(regex));
  }
  if (type == "Metaspace") return ParseMetaspace(j, at);
  if (type == "Digits") {
    ASSIGN_OR_RETURN(const bool individual, OptionalBool(j, "individual_digits", at, false));
    return std::make_unique<DigitsPreTokenizer>(individual);
  }
  if (type == "WhitespaceSplit") return std::make_unique<WhitespaceSplitPreTokenizer>();
  return at.Key("type").Unimplemented(
      absl::StrCat("pre-tokenizer type \"", type, "\" is not supported"));
}

}  // namespace kvrm::tok
