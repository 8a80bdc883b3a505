#include "model/tokenizer_decoder.h"

#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kvrm::tok {
namespace {

constexpr int kMaxNesting = 16;

// What NextUnit returns for an ill-formed byte: no code point, so no decoder's character matches.
constexpr uint32_t kIllFormed = 0xFFFFFFFF;

// NextCodePoint for text that may be ill-formed (non-lossy decoding): a byte that starts no
// well-formed character is one unit of its own, so the raw bytes survive a step unchanged and are
// never mistaken for (or merged into) a character. Identical to NextCodePoint on valid UTF-8.
uint32_t NextUnit(std::string_view s, size_t* i) {
  const size_t n = Utf8Len(static_cast<unsigned char>(s[*i]));
  if (*i + n > s.size() || !IsValidUtf8(s.substr(*i, n))) {
    ++*i;
    return kIllFormed;
  }
  return NextCodePoint(s, i);
}

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps) : steps_(std::move(steps)) {}
  void DecodeChain(std::vector<std::string>* tokens, bool lossy) const override {
    for (const auto& step : steps_) step->DecodeChain(tokens, lossy);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

// Maps byte-level characters back to bytes; a token with any character outside the byte alphabet
// (an added token like "<|eot_id|>" is fine, "héllo" is not) passes through as its UTF-8. The
// bytes of all tokens are joined and, when lossy, made valid UTF-8 the way Rust's
// from_utf8_lossy does.
class ByteLevelDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens, bool lossy) const override {
    std::string bytes;
    std::string token_bytes;
    for (const std::string& t : *tokens) {
      token_bytes.clear();
      bool all_mapped = true;
      for (size_t i = 0; i < t.size() && all_mapped;) {
        const int b = CharToByte(NextUnit(t, &i));
        if (b < 0) {
          all_mapped = false;
        } else {
          token_bytes.push_back(static_cast<char>(b));
        }
      }
      bytes += all_mapped ? token_bytes : t;
    }
    tokens->assign(1, lossy ? Utf8Lossy(bytes) : std::move(bytes));
  }
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(std::unique_ptr<Pattern> pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void DecodeChain(std::vector<std::string>* tokens, bool /*lossy*/) const override {
    for (std::string& t : *tokens) {
      t = IsValidUtf8(t) ? ReplaceAll(*pattern_, t, content_) : ReplaceInValidRuns(t);
    }
  }

 private:
  // Only non-lossy decoding gets here. Oniguruma must not scan ill-formed UTF-8, and a match can
  // never span an ill-formed byte anyway, so each maximal well-formed run is replaced on its own
  // and the ill-formed bytes pass through.
  std::string ReplaceInValidRuns(std::string_view t) const {
    std::string out;
    size_t run_start = 0;
    for (size_t i = 0; i < t.size();) {
      const size_t begin = i;
      if (NextUnit(t, &i) == kIllFormed) {
        out += ReplaceAll(*pattern_, t.substr(run_start, begin - run_start), content_);
        out.append(t, begin, i - begin);
        run_start = i;
      }
    }
    out += ReplaceAll(*pattern_, t.substr(run_start), content_);
    return out;
  }

  std::unique_ptr<Pattern> pattern_;
  std::string content_;
};

// Runs of "<0xAB>" tokens become their bytes when those form valid UTF-8, else one U+FFFD per
// byte (HF's rule, not from_utf8_lossy's) when lossy, or one token per raw byte when not: a token
// per byte either way, so later steps see the same token positions.
class ByteFallbackDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens, bool lossy) const override {
    std::vector<std::string> out;
    out.reserve(tokens->size());
    std::string pending;
    auto flush = [&] {
      if (pending.empty()) return;
      if (IsValidUtf8(pending)) {
        out.push_back(pending);
      } else if (lossy) {
        for (size_t i = 0; i < pending.size(); ++i) out.push_back("\xEF\xBF\xBD");
      } else {
        for (const char byte : pending) out.push_back(std::string(1, byte));
      }
      pending.clear();
    };
    for (std::string& t : *tokens) {
      int byte = -1;
      if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') byte = ParseHexByte(t[3], t[4]);
      if (byte >= 0) {
        pending.push_back(static_cast<char>(byte));
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    *tokens = std::move(out);
  }

 private:
  static int HexDigit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  static int ParseHexByte(char hi, char lo) {
    const int h = HexDigit(hi), l = HexDigit(lo);
    return h < 0 || l < 0 ? -1 : h * 16 + l;
  }
};

class FuseDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens, bool /*lossy*/) const override {
    std::string joined;
    for (const std::string& t : *tokens) joined += t;
    tokens->assign(1, std::move(joined));
  }
};

// Removes up to `start` leading and `stop` trailing `content` characters from each token.
class StripDecoder : public Decoder {
 public:
  StripDecoder(uint32_t content, int64_t start, int64_t stop)
      : content_(content), start_(start), stop_(stop) {}
  void DecodeChain(std::vector<std::string>* tokens, bool /*lossy*/) const override {
    for (std::string& t : *tokens) {
      std::vector<size_t> bounds;  // byte offset of each character, plus the end
      for (size_t i = 0; i < t.size();) {
        bounds.push_back(i);
        NextUnit(t, &i);
      }
      const size_t n = bounds.size();
      bounds.push_back(t.size());
      auto char_at = [&](size_t k) {
        size_t i = bounds[k];
        return NextUnit(t, &i);
      };
      size_t start_cut = 0;
      for (size_t k = 0; k < n && static_cast<int64_t>(k) < start_; ++k) {
        if (char_at(k) != content_) break;
        start_cut = k + 1;
      }
      size_t stop_cut = n;
      for (int64_t k = 0; k < stop_ && static_cast<size_t>(k) < n; ++k) {
        const size_t index = n - 1 - k;
        if (char_at(index) != content_) break;
        stop_cut = index;
      }
      if (stop_cut < start_cut) stop_cut = start_cut;
      t = t.substr(bounds[start_cut], bounds[stop_cut] - bounds[start_cut]);
    }
  }

 private:
  uint32_t content_;
  int64_t start_, stop_;
};

// Replacement characters become spaces, except that in the first token they are dropped when
// the pre-tokenizer prepends one (HF's rule: every one of them in that token).
class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(uint32_t replacement, bool prepends) : replacement_(replacement), prepends_(prepends) {}
  void DecodeChain(std::vector<std::string>* tokens, bool /*lossy*/) const override {
    for (size_t k = 0; k < tokens->size(); ++k) {
      std::string& t = (*tokens)[k];
      std::string out;
      out.reserve(t.size());
      for (size_t i = 0; i < t.size();) {
        const size_t begin = i;
        if (NextUnit(t, &i) == replacement_) {
          if (!(k == 0 && prepends_)) out.push_back(' ');
        } else {
          out.append(t, begin, i - begin);
        }
      }
      t = std::move(out);
    }
  }

 private:
  uint32_t replacement_;
  bool prepends_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Decoder>> ParseDecoder(const Json& j, const JsonPath& at, int depth) {
  if (depth > kMaxNesting) return at.Invalid("decoders nested too deep");
  if (!j.is_object()) return at.Invalid("expected an object");
  ASSIGN_OR_RETURN(const std::string type, RequiredString(j, "type", at));
  if (type == "Sequence") {
    const Json* list = Member(j, "decoders");
    if (list == nullptr || !list->is_array()) return at.Key("decoders").Invalid("expected an array");
    std::vector<std::unique_ptr<Decoder>> steps;
    for (size_t i = 0; i < list->size(); ++i) {
      ASSIGN_OR_RETURN(auto step, ParseDecoder((*list)[i], at.Key("decoders").Index(i), depth + 1));
      steps.push_back(std::move(step));
    }
    return std::make_unique<SequenceDecoder>(std::move(steps));
  }
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Replace") {
    ASSIGN_OR_RETURN(auto pattern, ParsePattern(j, "pattern", at));
    ASSIGN_OR_RETURN(std::string content, RequiredString(j, "content", at));
    return std::make_unique<ReplaceDecoder>(std::move(pattern), std::move(content));
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    ASSIGN_OR_RETURN(const uint32_t content, RequiredChar(j, "content", at));
    ASSIGN_OR_RETURN(const int64_t start, OptionalInt(j, "start", at, 0));
    ASSIGN_OR_RETURN(const int64_t stop, OptionalInt(j, "stop", at, 0));
    if (start < 0 || stop < 0) return at.Invalid("Strip start/stop must be >= 0");
    return std::make_unique<StripDecoder>(content, start, stop);
  }
  if (type == "Metaspace") {
    ASSIGN_OR_RETURN(const uint32_t replacement, RequiredChar(j, "replacement", at));
    bool prepends = true;
    if (Member(j, "prepend_scheme") != nullptr) {
      ASSIGN_OR_RETURN(const std::string scheme, RequiredString(j, "prepend_scheme", at));
      prepends = scheme != "never";
    } else {
      ASSIGN_OR_RETURN(prepends, OptionalBool(j, "add_prefix_space", at, true));
    }
    return std::make_unique<MetaspaceDecoder>(replacement, prepends);
  }
  return at.Key("type").Unimplemented(absl::StrCat("decoder type \"", type, "\" is not supported"));
}

}  // namespace kvrm::tok
