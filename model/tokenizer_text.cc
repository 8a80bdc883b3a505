#include "model/tokenizer_text.h"

// Keep onig from #defining UChar, which ICU declares too.
#define ONIG_ESCAPE_UCHAR_COLLISION 1
#include <oniguruma.h>

#include <mutex>

#include "absl/strings/str_cat.h"
#include "unicode/uchar.h"

namespace kvrm::tok {
namespace {

bool InRange(unsigned char b, unsigned char lo, unsigned char hi) { return b >= lo && b <= hi; }

// Length of the valid UTF-8 sequence at s[i], or -(bytes to drop) for an ill-formed one, using
// the "maximal subpart" rule Rust's Utf8Chunks follows.
int ValidSequenceAt(std::string_view s, size_t i) {
  const auto b = static_cast<unsigned char>(s[i]);
  if (b < 0x80) return 1;
  int width = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (InRange(b, 0xC2, 0xDF)) {
    width = 2;
  } else if (InRange(b, 0xE0, 0xEF)) {
    width = 3;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
  } else if (InRange(b, 0xF0, 0xF4)) {
    width = 4;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    return -1;
  }
  for (int k = 1; k < width; ++k) {
    if (i + k >= s.size()) return -k;
    const auto c = static_cast<unsigned char>(s[i + k]);
    const bool ok = k == 1 ? InRange(c, lo, hi) : InRange(c, 0x80, 0xBF);
    if (!ok) return -k;
  }
  return width;
}

void InitOnigOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    OnigEncoding encodings[1] = {ONIG_ENCODING_UTF8};
    onig_initialize(encodings, 1);
  });
}

}  // namespace

bool IsValidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const int n = ValidSequenceAt(s, i);
    if (n < 0) return false;
    i += n;
  }
  return true;
}

std::string Utf8Lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    const int n = ValidSequenceAt(bytes, i);
    if (n > 0) {
      out.append(bytes.substr(i, n));
      i += n;
    } else {
      out.append("\xEF\xBF\xBD");
      i += -n;
    }
  }
  return out;
}

uint32_t NextCodePoint(std::string_view s, size_t* i) {
  const auto b = static_cast<unsigned char>(s[*i]);
  const size_t n = Utf8Len(b);
  uint32_t cp = n == 1 ? b : n == 2 ? (b & 0x1F) : n == 3 ? (b & 0x0F) : (b & 0x07);
  for (size_t k = 1; k < n && *i + k < s.size(); ++k) {
    cp = (cp << 6) | (static_cast<unsigned char>(s[*i + k]) & 0x3F);
  }
  *i += n;
  return cp;
}

uint32_t PrevCodePoint(std::string_view s, size_t end) {
  size_t start = end - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  return NextCodePoint(s, &start);
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t Utf8Count(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

bool IsWhitespace(uint32_t cp) { return u_hasBinaryProperty(cp, UCHAR_WHITE_SPACE); }

bool IsWordChar(uint32_t cp) {
  if (cp < 0x80) {
    return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || (cp >= '0' && cp <= '9') ||
           cp == '_';
  }
  if (u_hasBinaryProperty(cp, UCHAR_ALPHABETIC) || u_hasBinaryProperty(cp, UCHAR_JOIN_CONTROL)) {
    return true;
  }
  const int8_t type = u_charType(cp);
  return type == U_NON_SPACING_MARK || type == U_COMBINING_SPACING_MARK ||
         type == U_ENCLOSING_MARK || type == U_DECIMAL_DIGIT_NUMBER ||
         type == U_CONNECTOR_PUNCTUATION;
}

bool IsNumeric(uint32_t cp) {
  const int8_t type = u_charType(cp);
  return type == U_DECIMAL_DIGIT_NUMBER || type == U_LETTER_NUMBER || type == U_OTHER_NUMBER;
}

namespace {

struct ByteTables {
  std::array<std::string, 256> to_char;
  std::array<int16_t, 512> to_byte;  // the mapped code points are all below 0x144
};

const ByteTables& Tables() {
  static const ByteTables* tables = [] {
    auto* t = new ByteTables;
    t->to_byte.fill(-1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const int cp = printable ? b : next++;
      AppendUtf8(cp, &t->to_char[b]);
      t->to_byte[cp] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return *tables;
}

}  // namespace

const std::array<std::string, 256>& ByteToChar() { return Tables().to_char; }

int CharToByte(uint32_t cp) { return cp < 512 ? Tables().to_byte[cp] : -1; }

absl::StatusOr<std::unique_ptr<Pattern>> Pattern::Literal(std::string literal) {
  std::unique_ptr<Pattern> p(new Pattern);
  p->literal_ = std::move(literal);
  return p;
}

absl::StatusOr<std::unique_ptr<Pattern>> Pattern::Regex(std::string_view regex) {
  InitOnigOnce();
  std::unique_ptr<Pattern> p(new Pattern);
  OnigErrorInfo einfo;
  const auto* begin = reinterpret_cast<const OnigUChar*>(regex.data());
  const int r = onig_new(&p->regex_, begin, begin + regex.size(), ONIG_OPTION_NONE,
                         ONIG_ENCODING_UTF8, ONIG_SYNTAX_DEFAULT, &einfo);
  if (r != ONIG_NORMAL) {
    OnigUChar msg[ONIG_MAX_ERROR_MESSAGE_LEN];
    onig_error_code_to_str(msg, r, &einfo);
    p->regex_ = nullptr;
    return absl::InvalidArgumentError(
        absl::StrCat("bad regex \"", std::string(regex), "\": ", reinterpret_cast<char*>(msg)));
  }
  return p;
}

Pattern::~Pattern() {
  if (regex_ != nullptr) onig_free(regex_);
}

std::vector<std::pair<size_t, size_t>> Pattern::MatchRanges(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> out;
  if (regex_ == nullptr) {
    if (literal_.empty()) return out;
    for (size_t pos = text.find(literal_); pos != std::string_view::npos;
         pos = text.find(literal_, pos + literal_.size())) {
      out.emplace_back(pos, pos + literal_.size());
    }
    return out;
  }
  // The onig crate's find_iter, which HF iterates: an empty match right after the previous match
  // is skipped by stepping one character.
  const auto* str = reinterpret_cast<const OnigUChar*>(text.data());
  const OnigUChar* end = str + text.size();
  OnigRegion* region = onig_region_new();
  size_t last_end = 0;
  bool have_last = false;
  size_t last_match_end = 0;
  while (last_end <= text.size()) {
    onig_region_clear(region);
    const int r = onig_search(regex_, str, end, str + last_end, end, region, ONIG_OPTION_NONE);
    if (r < 0) break;  // ONIG_MISMATCH, or a retry-limit error: treat as no more matches
    const auto s = static_cast<size_t>(region->beg[0]);
    const auto e = static_cast<size_t>(region->end[0]);
    if (s == e && have_last && last_match_end == e) {
      last_end += last_end < text.size() ? Utf8Len(static_cast<unsigned char>(text[last_end])) : 1;
      continue;
    }
    last_end = e;
    have_last = true;
    last_match_end = e;
    out.emplace_back(s, e);
  }
  onig_region_free(region, 1);
  return out;
}

std::vector<Span> Pattern::FindMatches(std::string_view text) const {
  if (text.empty()) return {{0, 0, false}};
  std::vector<Span> out;
  size_t prev = 0;
  for (const auto& [s, e] : MatchRanges(text)) {
    if (prev != s) out.push_back({prev, s, false});
    out.push_back({s, e, true});
    prev = e;
  }
  if (prev != text.size()) out.push_back({prev, text.size(), false});
  return out;
}

std::string ReplaceAll(const Pattern& pattern, std::string_view s, std::string_view content) {
  std::string out;
  out.reserve(s.size());
  for (const Span& span : pattern.FindMatches(s)) {
    if (span.is_match) {
      out.append(content);
    } else {
      out.append(s.substr(span.start, span.end - span.start));
    }
  }
  return out;
}

JsonPath JsonPath::Key(std::string_view key) const {
  return JsonPath(what_, path_.empty() ? std::string(key) : absl::StrCat(path_, ".", std::string(key)));
}

JsonPath JsonPath::Index(size_t i) const { return JsonPath(what_, absl::StrCat(path_, "[", i, "]")); }

absl::Status JsonPath::Invalid(std::string_view message) const {
  return absl::InvalidArgumentError(absl::StrCat(what_, ": ", path_, ": ", std::string(message)));
}

absl::Status JsonPath::Unimplemented(std::string_view message) const {
  return absl::UnimplementedError(absl::StrCat(what_, ": ", path_, ": ", std::string(message)));
}

const Json* Member(const Json& obj, std::string_view key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(std::string(key));
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::StatusOr<std::string> RequiredString(const Json& obj, std::string_view key,
                                           const JsonPath& at) {
  const Json* v = Member(obj, key);
  if (v == nullptr) return at.Key(key).Invalid("missing");
  if (!v->is_string()) return at.Key(key).Invalid("expected a string");
  return v->get_ref<const std::string&>();
}

absl::StatusOr<std::string> OptionalString(const Json& obj, std::string_view key,
                                           const JsonPath& at, std::string fallback) {
  const Json* v = Member(obj, key);
  if (v == nullptr) return fallback;
  if (!v->is_string()) return at.Key(key).Invalid("expected a string");
  return v->get_ref<const std::string&>();
}

absl::StatusOr<bool> OptionalBool(const Json& obj, std::string_view key, const JsonPath& at,
                                  bool fallback) {
  const Json* v = Member(obj, key);
  if (v == nullptr) return fallback;
  if (!v->is_boolean()) return at.Key(key).Invalid("expected a boolean");
  return v->get<bool>();
}

absl::StatusOr<int64_t> OptionalInt(const Json& obj, std::string_view key, const JsonPath& at,
                                    int64_t fallback) {
  const Json* v = Member(obj, key);
  if (v == nullptr) return fallback;
  if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) return at.Key(key).Invalid("integer out of range");
    return static_cast<int64_t>(u);
  }
  if (!v->is_number_integer()) return at.Key(key).Invalid("expected an integer");
  return v->get<int64_t>();
}

absl::StatusOr<uint32_t> RequiredChar(const Json& obj, std::string_view key, const JsonPath& at) {
  auto s = RequiredString(obj, key, at);
  if (!s.ok()) return s.status();
  if (s->empty() || Utf8Count(*s) != 1) return at.Key(key).Invalid("expected one character");
  size_t i = 0;
  return NextCodePoint(*s, &i);
}

absl::StatusOr<std::unique_ptr<Pattern>> ParsePattern(const Json& obj, std::string_view key,
                                                      const JsonPath& at) {
  const JsonPath here = at.Key(key);
  const Json* p = Member(obj, key);
  if (p == nullptr || !p->is_object()) return here.Invalid("expected {\"String\": ...} or {\"Regex\": ...}");
  if (const Json* s = Member(*p, "String")) {
    if (!s->is_string()) return here.Key("String").Invalid("expected a string");
    return Pattern::Literal(s->get<std::string>());
  }
  if (const Json* r = Member(*p, "Regex")) {
    if (!r->is_string()) return here.Key("Regex").Invalid("expected a string");
    auto pattern = Pattern::Regex(r->get_ref<const std::string&>());
    if (!pattern.ok()) return here.Key("Regex").Invalid(std::string(pattern.status().message()));
    return pattern;
  }
  return here.Invalid("expected {\"String\": ...} or {\"Regex\": ...}");
}

}  // namespace kvrm::tok
