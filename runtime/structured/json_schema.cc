#include "runtime/structured/json_schema.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "runtime/structured/automaton.h"
#include "runtime/structured/regex_parser.h"

namespace kvrm::structured {
namespace {

// Insertion-ordered, so that properties come out in the order the schema lists them.
using OJson = nlohmann::ordered_json;

// Bounds on the work one schema can cause (it comes from a request).
constexpr size_t kMaxProperties = 256;   // per object, and prefixItems per array
constexpr size_t kMaxEnumValues = 1024;  // per enum keyword
constexpr size_t kMaxEnumBytes = size_t{1} << 20;
constexpr size_t kMaxConjunction = 64;         // schemas in force at one place (allOf, $ref)
constexpr size_t kMaxBranches = 256;           // per anyOf / oneOf
constexpr int64_t kMaxSteps = 20000;           // subschema translations in all
constexpr int32_t kMaxNestedSubschemas = 256;  // recursion of the translator
constexpr int32_t kMaxDepthOption = 64;
// Enum values are checked against their sibling keywords with an automaton each: bounded.
constexpr int32_t kMaxEnumChecks = 128;
constexpr int32_t kMaxEnumCheckStates = 5000;

// JSON types as bits. "number" is kNumber | kInteger, so intersecting the two gives integer.
enum TypeBits : uint8_t {
  kNull = 1,
  kBoolean = 2,
  kInteger = 4,
  kNumber = 8,
  kString = 16,
  kArray = 32,
  kObject = 64,
  kAllTypes = 127,
};

// Which keywords of a schema object this translation already acted on (it revisits the objects
// after anyOf/oneOf split the conjunction).
enum DoneBits : uint8_t {
  kRefDone = 1,
  kAllOfDone = 2,
  kAnyOfDone = 4,
  kOneOfDone = 8,
};

// A subschema in force at the place being translated: where it is, for error messages.
struct Loc {
  const OJson* schema = nullptr;
  std::string pointer;
  uint8_t done = 0;
};
// All subschemas that the value at one place must satisfy (allOf, $ref and siblings, anyOf
// branch and siblings, properties and additionalProperties of several schemas).
using Conj = std::vector<Loc>;

struct Ctx {
  int32_t level = 0;      // containers around the value being translated
  int32_t recursion = 0;  // re-entries of a $ref target on this path
  int32_t nesting = 0;    // translator recursion
};

std::string EscapeToken(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out.push_back(c);
    }
  }
  return out;
}
std::string Child(const std::string& pointer, const std::string& key) {
  return absl::StrCat(pointer, "/", EscapeToken(key));
}
std::string Child(const std::string& pointer, size_t index) {
  return absl::StrCat(pointer, "/", index);
}

absl::Status SchemaError(const std::string& pointer, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(
      "JSON schema ", pointer.empty() ? std::string("(root)") : pointer, ": ", message));
}

// Compact serialization; invalid UTF-8 (only possible in a Json built in code) is replaced
// rather than thrown on.
std::string Dump(const OJson& v) { return v.dump(-1, ' ', false, OJson::error_handler_t::replace); }

// --- Character-level pieces -------------------------------------------------------------------

Regex L(const char* text) { return Literal(text); }

CodePointSet SetOf(const char* chars) {
  CodePointSet s;
  for (const char* p = chars; *p != '\0'; ++p) {
    s.Add(static_cast<uint8_t>(*p), static_cast<uint8_t>(*p));
  }
  return s;
}
Regex Chars(const char* chars) { return Class(SetOf(chars)); }
Regex Range(uint32_t lo, uint32_t hi) { return Class(CodePointSet::Range(lo, hi)); }
Regex Digit() { return Range('0', '9'); }
CodePointSet HexSet() {
  CodePointSet s = CodePointSet::Range('0', '9');
  s.Add('a', 'f');
  s.Add('A', 'F');
  return s;
}
Regex HexDigit() { return Class(HexSet()); }
Regex Times(Regex r, int32_t n) { return Repeat(std::move(r), n, n); }
Regex Quote(Regex content) { return Concat({L("\""), std::move(content), L("\"")}); }

CodePointSet Intersect(const CodePointSet& a, const CodePointSet& b) {
  CodePointSet either = a.Complement();
  either.AddSet(b.Complement());
  return either.Complement();
}

bool SameSet(const CodePointSet& a, const CodePointSet& b) {
  if (a.ranges().size() != b.ranges().size()) return false;
  for (size_t i = 0; i < a.ranges().size(); ++i) {
    if (a.ranges()[i].lo != b.ranges()[i].lo || a.ranges()[i].hi != b.ranges()[i].hi) return false;
  }
  return true;
}

// Characters a JSON string holds as themselves: all but ", \ and U+0000-U+001F.
CodePointSet UnescapedSet() {
  CodePointSet s;
  s.Add(0x20, 0x21);
  s.Add(0x23, 0x5B);
  s.Add(0x5D, kMaxCodePoint);
  return s;
}

// One character of a JSON string: itself, a two-character escape, \uXXXX for a code point outside
// the surrogates, or a surrogate pair \uD8xx\uDCxx (one character, as JSON Schema counts them).
// Lone surrogates are grammatical JSON but not text; parsers (nlohmann's too) reject them.
Regex JsonStringChar() {
  static const Regex* const kChar = new Regex([] {
    const Regex hex = HexDigit();
    CodePointSet not_d = HexSet();
    not_d = Intersect(not_d, SetOf("dD").Complement());
    const Regex bmp = Alt(
        {Concat({Class(not_d), hex, hex, hex}), Concat({Chars("dD"), Range('0', '7'), hex, hex})});
    const Regex high = Concat({Chars("dD"), Chars("89abAB"), hex, hex});
    const Regex low = Concat({Chars("dD"), Chars("cdefCDEF"), hex, hex});
    return Alt({Class(UnescapedSet()), Concat({L("\\"), Chars("\"\\/bfnrt")}),
                Concat({L("\\u"), bmp}), Concat({L("\\u"), high, L("\\u"), low})});
  }());
  return *kChar;
}

Regex JsonString() {
  static const Regex* const kString = new Regex(Quote(Star(JsonStringChar())));
  return *kString;
}

Regex JsonNumber() {
  static const Regex* const kNumberRegex = new Regex([] {
    const Regex integer = Alt({L("0"), Concat({Range('1', '9'), Star(Digit())})});
    const Regex fraction = Concat({L("."), Plus(Digit())});
    const Regex exponent = Concat({Chars("eE"), Optional(Chars("+-")), Plus(Digit())});
    return Concat({Optional(L("-")), integer, Optional(fraction), Optional(exponent)});
  }());
  return *kNumberRegex;
}

void AppendUtf8(uint32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

// Decodes one code point of valid UTF-8 (a literal's text is) at text[*i].
uint32_t NextUtf8(const std::string& text, size_t* i) {
  const auto b0 = static_cast<unsigned char>(text[*i]);
  const int len = b0 < 0x80 ? 1 : b0 < 0xE0 ? 2 : b0 < 0xF0 ? 3 : 4;
  uint32_t c = len == 1 ? b0 : len == 2 ? (b0 & 0x1F) : len == 3 ? (b0 & 0x0F) : (b0 & 0x07);
  for (int k = 1; k < len && *i + k < text.size(); ++k) {
    c = (c << 6) | (static_cast<unsigned char>(text[*i + k]) & 0x3F);
  }
  *i += len;
  return c;
}

// A character as it stands inside a JSON string, escaped the one way nlohmann writes it.
void AppendJsonChar(uint32_t c, std::string* out) {
  switch (c) {
    case '"':
      *out += "\\\"";
      return;
    case '\\':
      *out += "\\\\";
      return;
    case '\b':
      *out += "\\b";
      return;
    case '\f':
      *out += "\\f";
      return;
    case '\n':
      *out += "\\n";
      return;
    case '\r':
      *out += "\\r";
      return;
    case '\t':
      *out += "\\t";
      return;
    default:
      break;
  }
  if (c < 0x20) {
    static constexpr char kHex[] = "0123456789abcdef";
    *out += "\\u00";
    out->push_back(kHex[c >> 4]);
    out->push_back(kHex[c & 0xF]);
    return;
  }
  AppendUtf8(c, out);
}

// A pattern's tree over decoded characters -> the same language as JSON string content: characters
// JSON must escape become their canonical escape, the rest stand for themselves.
Regex PatternContent(const Regex& r) {
  switch (r->kind) {
    case RegexNode::Kind::kNothing:
    case RegexNode::Kind::kEmpty:
      return r;
    case RegexNode::Kind::kLiteral: {
      std::string out;
      for (size_t i = 0; i < r->text.size();) AppendJsonChar(NextUtf8(r->text, &i), &out);
      return Literal(out);
    }
    case RegexNode::Kind::kClass: {
      CodePointSet set = r->set;
      // ParseRegex reads "." as anything but \n; in ECMAScript (JSON Schema's dialect) it also
      // excludes \r, U+2028 and U+2029. Narrowing keeps every generated string a match.
      if (SameSet(set, CodePointSet::Single('\n').Complement())) {
        CodePointSet line_ends = SetOf("\n\r");
        line_ends.Add(0x2028, 0x2029);
        set = line_ends.Complement();
      }
      std::vector<Regex> options = {Class(Intersect(set, UnescapedSet()))};
      for (uint32_t c = 0; c <= 0x5C; ++c) {
        if ((c < 0x20 || c == '"' || c == '\\') && set.Contains(c)) {
          std::string escape;
          AppendJsonChar(c, &escape);
          options.push_back(Literal(escape));
        }
      }
      return Alt(std::move(options));
    }
    case RegexNode::Kind::kConcat:
    case RegexNode::Kind::kAlt: {
      std::vector<Regex> children;
      children.reserve(r->children.size());
      for (const Regex& child : r->children) children.push_back(PatternContent(child));
      return r->kind == RegexNode::Kind::kConcat ? Concat(std::move(children))
                                                 : Alt(std::move(children));
    }
    case RegexNode::Kind::kRepeat:
      return Repeat(PatternContent(r->children[0]), r->min, r->max);
  }
  return Nothing();
}

// --- Formats ----------------------------------------------------------------------------------

// Fixed-width numerals from x to y (equal lengths, x <= y, leading zeros as written): the classic
// digit-by-digit decomposition (equal leading digit; else the low edge, the full middle, the high
// edge).
Regex SameLength(const std::string& x, const std::string& y) {
  if (x.empty()) return Empty();
  const std::string x_rest = x.substr(1);
  const std::string y_rest = y.substr(1);
  if (x[0] == y[0]) return Concat({Literal(x.substr(0, 1)), SameLength(x_rest, y_rest)});
  const size_t n = x_rest.size();
  const bool low_full = x_rest == std::string(n, '0');
  const bool high_full = y_rest == std::string(n, '9');
  const char mid_lo = low_full ? x[0] : static_cast<char>(x[0] + 1);
  const char mid_hi = high_full ? y[0] : static_cast<char>(y[0] - 1);
  std::vector<Regex> options;
  if (!low_full) {
    options.push_back(Concat({Literal(x.substr(0, 1)), SameLength(x_rest, std::string(n, '9'))}));
  }
  if (mid_lo <= mid_hi) {
    options.push_back(Concat({Range(mid_lo, mid_hi), Times(Digit(), static_cast<int32_t>(n))}));
  }
  if (!high_full) {
    options.push_back(Concat({Literal(y.substr(0, 1)), SameLength(std::string(n, '0'), y_rest)}));
  }
  return Alt(std::move(options));
}

struct Format {
  Regex regex;
  uint64_t min_length = 0;
  uint64_t max_length = std::numeric_limits<uint64_t>::max();
};

Regex DateRegex() {
  const Regex year = Times(Digit(), 4);
  // Two-digit multiples of 4 other than 00.
  const Regex by4 = Alt({Concat({L("0"), Chars("48")}), Concat({Chars("2468"), Chars("048")}),
                         Concat({Chars("13579"), Chars("26")})});
  // Gregorian: divisible by 4, and centuries only when divisible by 400.
  const Regex leap_year =
      Alt({Concat({Digit(), Digit(), by4}), Concat({Alt({by4, L("00")}), L("00")})});
  const Regex long_month = Alt({L("01"), L("03"), L("05"), L("07"), L("08"), L("10"), L("12")});
  const Regex short_month = Alt({L("04"), L("06"), L("09"), L("11")});
  return Alt({Concat({year, L("-"), long_month, L("-"), SameLength("01", "31")}),
              Concat({year, L("-"), short_month, L("-"), SameLength("01", "30")}),
              Concat({year, L("-02-"), SameLength("01", "28")}), Concat({leap_year, L("-02-29")})});
}

// RFC 3339 full-time. Leap seconds (:60) are left out: validators accept them only at 23:59 UTC.
Regex TimeRegex() {
  const Regex hour = SameLength("00", "23");
  const Regex minute = SameLength("00", "59");
  return Concat({hour, L(":"), minute, L(":"), minute, Optional(Concat({L("."), Plus(Digit())})),
                 Alt({L("Z"), Concat({Chars("+-"), hour, L(":"), minute})})});
}

std::optional<Format> FormatRegex(const std::string& name) {
  if (name == "date") return Format{DateRegex(), 10, 10};
  if (name == "time") return Format{TimeRegex(), 9};
  if (name == "date-time") return Format{Concat({DateRegex(), L("T"), TimeRegex()}), 20};
  if (name == "uuid") {
    const Regex hex = HexDigit();
    return Format{Concat({Times(hex, 8), L("-"), Times(hex, 4), L("-"), Times(hex, 4), L("-"),
                          Times(hex, 4), L("-"), Times(hex, 12)}),
                  36, 36};
  }
  if (name == "ipv4") {
    const Regex octet =
        Alt({Concat({L("25"), Range('0', '5')}), Concat({L("2"), Range('0', '4'), Digit()}),
             Concat({L("1"), Digit(), Digit()}), Concat({Range('1', '9'), Digit()}), Digit()});
    return Format{Concat({octet, L("."), octet, L("."), octet, L("."), octet}), 7, 15};
  }
  CodePointSet alnum = CodePointSet::Range('0', '9');
  alnum.Add('a', 'z');
  alnum.Add('A', 'Z');
  if (name == "email") {
    // RFC 5322 dot-atom local part; a domain of at least two LDH labels.
    CodePointSet atext = alnum;
    atext.AddSet(SetOf("!#$%&'*+/=?^_`{|}~-"));
    const Regex atom = Plus(Class(atext));
    CodePointSet ldh = alnum;
    ldh.Add('-', '-');
    const Regex label = Concat({Class(alnum), Optional(Concat({Star(Class(ldh)), Class(alnum)}))});
    return Format{
        Concat({atom, Star(Concat({L("."), atom})), L("@"), label, Plus(Concat({L("."), label}))}),
        5};
  }
  if (name == "uri") {
    // Loose: a scheme, then unreserved, reserved and %-encoded characters, one optional fragment.
    CodePointSet scheme_char = alnum;
    scheme_char.AddSet(SetOf("+-."));
    CodePointSet uri_char = alnum;
    uri_char.AddSet(SetOf("-._~:/?@!$&'()*+,;="));
    const Regex uchar = Alt({Class(uri_char), Concat({L("%"), HexDigit(), HexDigit()})});
    CodePointSet alpha = CodePointSet::Range('a', 'z');
    alpha.Add('A', 'Z');
    return Format{Concat({Class(alpha), Star(Class(scheme_char)), L(":"), Plus(uchar),
                          Optional(Concat({L("#"), Star(uchar)}))}),
                  3};
  }
  return std::nullopt;
}

// --- Numbers ----------------------------------------------------------------------------------

// No upper bound, for UnsignedRange (magnitudes here never exceed 2^63).
constexpr uint64_t kUnbounded = std::numeric_limits<uint64_t>::max();

// Decimal numerals (no leading zeros) of the integers in [a, b]; b == kUnbounded: no bound.
Regex UnsignedRange(uint64_t a, uint64_t b) {
  if (a > b) return Nothing();
  const bool bounded = b != kUnbounded;
  const std::string low = std::to_string(a);
  const std::string high = bounded ? std::to_string(b) : std::string();
  const size_t last = bounded ? high.size() : low.size();
  std::vector<Regex> options;
  for (size_t len = low.size(); len <= last; ++len) {
    const std::string from = len == low.size() ? low : "1" + std::string(len - 1, '0');
    const std::string to = bounded && len == last ? high : std::string(len, '9');
    options.push_back(SameLength(from, to));
  }
  if (!bounded) {
    options.push_back(
        Concat({Range('1', '9'), Repeat(Digit(), static_cast<int32_t>(low.size()), -1)}));
  }
  return Alt(std::move(options));
}

// |v| for negative v, INT64_MIN included.
uint64_t Magnitude(int64_t v) { return static_cast<uint64_t>(-(v + 1)) + 1; }

// JSON integers in [lo, hi] (absent: unbounded), exactly. "-0" is not generated.
Regex IntegerRange(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  if (lo && hi && *lo > *hi) return Nothing();
  std::vector<Regex> options;
  if (!hi || *hi >= 0) {
    const uint64_t a = lo && *lo > 0 ? static_cast<uint64_t>(*lo) : 0;
    options.push_back(UnsignedRange(a, hi ? static_cast<uint64_t>(*hi) : kUnbounded));
  }
  if (!lo || *lo < 0) {
    const uint64_t m_lo = hi && *hi < 0 ? Magnitude(*hi) : 1;
    const uint64_t m_hi = lo ? Magnitude(*lo) : kUnbounded;
    options.push_back(Concat({L("-"), UnsignedRange(m_lo, m_hi)}));
  }
  return Alt(std::move(options));
}

struct MagnitudeBound {
  uint64_t value = 0;
  bool exclusive = false;
};

// Non-negative decimals I(.F)? (no exponent) with a <= m <= b, each bound inclusive or exclusive,
// a and b integers: cut by the integer part.
Regex DecimalMagnitude(MagnitudeBound a, std::optional<MagnitudeBound> b) {
  const Regex any_fraction = Optional(Concat({L("."), Plus(Digit())}));
  const Regex zero_fraction = Optional(Concat({L("."), Plus(L("0"))}));
  const Regex nonzero_fraction = Concat({L("."), Star(Digit()), Range('1', '9'), Star(Digit())});
  const Regex at_a = Literal(std::to_string(a.value));
  if (b) {
    if (a.value > b->value) return Nothing();
    if (a.value == b->value) {
      return !a.exclusive && !b->exclusive ? Concat({at_a, zero_fraction}) : Nothing();
    }
  }
  std::vector<Regex> options = {Concat({at_a, a.exclusive ? nonzero_fraction : any_fraction})};
  if (!b) {
    options.push_back(Concat({UnsignedRange(a.value + 1, kUnbounded), any_fraction}));
  } else {
    if (a.value + 1 <= b->value - 1) {
      options.push_back(Concat({UnsignedRange(a.value + 1, b->value - 1), any_fraction}));
    }
    if (!b->exclusive) {
      options.push_back(Concat({Literal(std::to_string(b->value)), zero_fraction}));
    }
  }
  return Alt(std::move(options));
}

struct NumberBound {
  int64_t value = 0;
  bool exclusive = false;
};

// JSON numbers x with lo <= x <= hi (integer bounds, each inclusive or exclusive), without
// exponents: non-negative ones by magnitude, negative ones as "-" and a positive magnitude.
Regex BoundedNumber(std::optional<NumberBound> lo, std::optional<NumberBound> hi) {
  std::vector<Regex> options;
  if (!hi || hi->value > 0 || (hi->value == 0 && !hi->exclusive)) {
    const MagnitudeBound a = lo && lo->value >= 0
                                 ? MagnitudeBound{static_cast<uint64_t>(lo->value), lo->exclusive}
                                 : MagnitudeBound{0, false};
    std::optional<MagnitudeBound> b;
    if (hi) b = MagnitudeBound{static_cast<uint64_t>(hi->value), hi->exclusive};
    options.push_back(DecimalMagnitude(a, b));
  }
  if (!lo || lo->value < 0) {
    const MagnitudeBound a = hi && hi->value < 0
                                 ? MagnitudeBound{Magnitude(hi->value), hi->exclusive}
                                 : MagnitudeBound{0, true};
    std::optional<MagnitudeBound> b;
    if (lo) b = MagnitudeBound{Magnitude(lo->value), lo->exclusive};
    options.push_back(Concat({L("-"), DecimalMagnitude(a, b)}));
  }
  return Alt(std::move(options));
}

// A numeric keyword's value, exact for integers.
struct JsonNumberValue {
  bool integral = false;  // `integer` holds the value
  __int128 integer = 0;
  double real = 0;  // otherwise
};

absl::StatusOr<JsonNumberValue> ReadNumber(const OJson& v, const std::string& pointer) {
  if (v.is_number_unsigned()) {
    return JsonNumberValue{true, static_cast<__int128>(v.get<uint64_t>())};
  }
  if (v.is_number_integer()) return JsonNumberValue{true, static_cast<__int128>(v.get<int64_t>())};
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!std::isfinite(d)) return SchemaError(pointer, "must be a finite number");
    if (std::floor(d) == d && std::fabs(d) < 0x1p62) {
      return JsonNumberValue{true, static_cast<__int128>(d)};
    }
    return JsonNumberValue{false, 0, d};
  }
  if (v.is_boolean()) {
    return SchemaError(
        pointer,
        "a boolean exclusiveMinimum/exclusiveMaximum (draft 4) is not supported; use "
        "the bound itself as the keyword's value (draft 6 and later)");
  }
  return SchemaError(pointer, "must be a number");
}

constexpr __int128 kHuge = static_cast<__int128>(1) << 100;

__int128 FloorOf(const JsonNumberValue& n) {
  if (n.integral) return n.integer;
  const double f = std::floor(n.real);
  return f > 1e30 ? kHuge : f < -1e30 ? -kHuge : static_cast<__int128>(f);
}
__int128 CeilOf(const JsonNumberValue& n) {
  if (n.integral) return n.integer;
  const double c = std::ceil(n.real);
  return c > 1e30 ? kHuge : c < -1e30 ? -kHuge : static_cast<__int128>(c);
}

absl::StatusOr<uint64_t> ReadCount(const OJson& v, const std::string& pointer) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (i >= 0) return static_cast<uint64_t>(i);
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    if (d >= 0 && d < 1e19 && std::floor(d) == d) return static_cast<uint64_t>(d);
  }
  return SchemaError(pointer, "must be a non-negative integer");
}

// --- Keywords ---------------------------------------------------------------------------------

enum class KeywordKind { kIgnored, kHandled, kUnsupported };

bool OneOf(const std::string& k, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (k == name) return true;
  }
  return false;
}

KeywordKind Classify(const std::string& k) {
  if (OneOf(k, {"type",
                "enum",
                "const",
                "$ref",
                "allOf",
                "anyOf",
                "oneOf",
                "properties",
                "required",
                "additionalProperties",
                "minProperties",
                "maxProperties",
                "items",
                "prefixItems",
                "additionalItems",
                "minItems",
                "maxItems",
                "uniqueItems",
                "minLength",
                "maxLength",
                "pattern",
                "format",
                "minimum",
                "maximum",
                "exclusiveMinimum",
                "exclusiveMaximum"})) {
    return KeywordKind::kHandled;
  }
  // Assertions this translation does not express: refused rather than ignored, so that nobody
  // believes the output obeys them.
  if (OneOf(k, {"not",
                "if",
                "then",
                "else",
                "patternProperties",
                "dependentRequired",
                "dependentSchemas",
                "dependencies",
                "multipleOf",
                "divisibleBy",
                "contains",
                "minContains",
                "maxContains",
                "propertyNames",
                "unevaluatedProperties",
                "unevaluatedItems",
                "$dynamicRef",
                "$recursiveRef",
                "extends",
                "disallow"})) {
    return KeywordKind::kUnsupported;
  }
  // Annotations ($schema, $id, title, description, default, examples, $comment, deprecated,
  // readOnly, contentMediaType, $defs, ...) and keywords unknown to JSON Schema, which validators
  // ignore too.
  return KeywordKind::kIgnored;
}

// The types a type-specific keyword applies to (a schema without "type" is taken to mean those).
uint8_t KeywordTypes(const std::string& k) {
  if (OneOf(k, {"minLength", "maxLength", "pattern", "format"})) return kString;
  if (OneOf(k, {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})) {
    return kNumber | kInteger;
  }
  if (OneOf(k,
            {"properties", "required", "additionalProperties", "minProperties", "maxProperties"})) {
    return kObject;
  }
  if (OneOf(k,
            {"items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems"})) {
    return kArray;
  }
  return 0;
}

absl::StatusOr<uint8_t> ParseTypeName(const OJson& v, const std::string& pointer) {
  if (!v.is_string()) return SchemaError(pointer, "a type must be a string");
  const std::string& name = v.get_ref<const std::string&>();
  if (name == "null") return kNull;
  if (name == "boolean") return kBoolean;
  if (name == "integer") return kInteger;
  if (name == "number") return kNumber | kInteger;
  if (name == "string") return kString;
  if (name == "array") return kArray;
  if (name == "object") return kObject;
  return SchemaError(pointer, absl::StrCat("unknown type \"", name, "\""));
}

absl::StatusOr<uint8_t> ParseType(const OJson& v, const std::string& pointer) {
  if (!v.is_array()) return ParseTypeName(v, pointer);
  if (v.empty()) return SchemaError(pointer, "must not be an empty list");
  uint8_t types = 0;
  size_t i = 0;
  for (const OJson& t : v) {
    ASSIGN_OR_RETURN(const uint8_t one, ParseTypeName(t, Child(pointer, i++)));
    types |= one;
  }
  return types;
}

// --- The translator ---------------------------------------------------------------------------

class Translator {
 public:
  Translator(const OJson& root, const JsonSchemaOptions& options)
      : root_(root),
        max_depth_(std::clamp(options.max_depth, 0, kMaxDepthOption)),
        ws_(options.whitespace != nullptr ? options.whitespace : Empty()) {}

  // The language of values satisfying every schema of `conj`.
  absl::StatusOr<Regex> Translate(Conj conj, Ctx ctx);

  // The root schema counts as expanded: a "#" reference inside it is its first recursion.
  absl::StatusOr<Regex> TranslateRoot() {
    ref_stack_.assign(1, &root_);
    return Translate(Conj{Loc{&root_, ""}}, Ctx{});
  }

  // Any value with containers nested at most `budget` levels.
  Regex AnyValue(int32_t budget);
  Regex AnyObjectOf(const Regex& value) const {
    const Regex pair = Concat({JsonString(), ws_, L(":"), ws_, value});
    return Concat({L("{"), ws_, Optional(Concat({SeparatedList(pair), ws_})), L("}")});
  }
  int32_t max_depth() const { return max_depth_; }

 private:
  Regex Sep() const { return Concat({ws_, L(","), ws_}); }
  // One or more `item`s between separators, written (item sep)* item rather than
  // item (sep item)*: the automaton has no minimisation, and in this form the two copies of
  // `item` are read in lockstep (one state set) where the other form gives each copy its own
  // states, doubling them at every level of nesting.
  Regex SeparatedList(const Regex& item, int32_t min = 1, int32_t max = -1) const {
    return Concat(
        {Repeat(Concat({item, Sep()}), std::max(0, min - 1), max < 0 ? -1 : max - 1), item});
  }
  absl::StatusOr<Loc> ResolveRef(const OJson& ref, const std::string& pointer) const;
  // The keywords of `conj` other than the combinators (already applied). With `ignore_enum`,
  // also other than enum/const, for the types in `allowed` only, without inferring types.
  absl::StatusOr<Regex> Base(const Conj& conj, Ctx ctx, bool ignore_enum,
                             uint8_t allowed = kAllTypes);
  absl::StatusOr<Regex> EnumValues(const Conj& conj, Ctx ctx,
                                   const std::vector<const OJson*>& values,
                                   const std::string& pointer);
  absl::StatusOr<Regex> StringValue(const Conj& conj);
  absl::StatusOr<Regex> IntegerValue(const Conj& conj);
  absl::StatusOr<Regex> NumberValue(const Conj& conj);
  absl::StatusOr<Regex> ArrayValue(const Conj& conj, Ctx ctx);
  absl::StatusOr<Regex> ObjectValue(const Conj& conj, Ctx ctx);

  const OJson& root_;
  const int32_t max_depth_;
  Regex ws_;
  bool compact_ = false;  // ws_ is Empty() while enum values are checked against their siblings
  std::vector<Regex> any_cache_[2];      // AnyValue by budget, [compact_]
  std::vector<const OJson*> ref_stack_;  // $ref targets being expanded on the current path
  int64_t steps_ = 0;
  int32_t enum_checks_ = 0;
};

absl::StatusOr<Loc> Translator::ResolveRef(const OJson& ref, const std::string& pointer) const {
  if (!ref.is_string()) return SchemaError(pointer, "must be a string");
  const std::string& text = ref.get_ref<const std::string&>();
  if (text.empty() || text[0] != '#') {
    return SchemaError(pointer,
                       absl::StrCat("\"", text,
                                    "\": only references into this schema (\"#\", "
                                    "\"#/$defs/...\", \"#/definitions/...\") are supported"));
  }
  // The fragment is URI-encoded: %XX first, then the JSON pointer's ~0 ~1.
  std::string fragment;
  for (size_t i = 1; i < text.size(); ++i) {
    if (text[i] != '%') {
      fragment.push_back(text[i]);
      continue;
    }
    auto hex = [](char c) {
      return c >= '0' && c <= '9'   ? c - '0'
             : c >= 'a' && c <= 'f' ? c - 'a' + 10
             : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                    : -1;
    };
    if (i + 2 >= text.size() || hex(text[i + 1]) < 0 || hex(text[i + 2]) < 0) {
      return SchemaError(pointer, absl::StrCat("\"", text, "\": bad %-escape"));
    }
    fragment.push_back(static_cast<char>(hex(text[i + 1]) * 16 + hex(text[i + 2])));
    i += 2;
  }
  if (!fragment.empty() && fragment[0] != '/') {
    return SchemaError(
        pointer, absl::StrCat("\"", text, "\": anchors are not supported, only JSON pointers"));
  }
  const OJson* node = &root_;
  size_t pos = 0;
  while (pos < fragment.size()) {
    const size_t next = fragment.find('/', pos + 1);
    const std::string raw =
        fragment.substr(pos + 1, next == std::string::npos ? std::string::npos : next - pos - 1);
    std::string token;
    for (size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] != '~') {
        token.push_back(raw[i]);
      } else if (i + 1 < raw.size() && (raw[i + 1] == '0' || raw[i + 1] == '1')) {
        token.push_back(raw[++i] == '0' ? '~' : '/');
      } else {
        return SchemaError(pointer,
                           absl::StrCat("\"", text, "\": bad ~ escape in the JSON pointer"));
      }
    }
    const OJson* child = nullptr;
    if (node->is_object()) {
      auto it = node->find(token);
      if (it != node->end()) child = &*it;
    } else if (node->is_array() && !token.empty() && token.size() < 10 &&
               std::all_of(token.begin(), token.end(),
                           [](char c) { return c >= '0' && c <= '9'; })) {
      size_t index = 0;
      for (char c : token) index = index * 10 + static_cast<size_t>(c - '0');
      if (index < node->size()) child = &(*node)[index];
    }
    if (child == nullptr) {
      return SchemaError(pointer,
                         absl::StrCat("\"", text, "\" does not resolve inside the schema"));
    }
    node = child;
    if (next == std::string::npos) break;
    pos = next;
  }
  return Loc{node, fragment, 0};
}

absl::StatusOr<Regex> Translator::Translate(Conj conj, Ctx ctx) {
  const std::string where = conj.empty() ? std::string() : conj[0].pointer;
  if (++steps_ > kMaxSteps) {
    return SchemaError(where, absl::StrCat("schema too complex: more than ", kMaxSteps,
                                           " subschemas to translate"));
  }
  if (++ctx.nesting > kMaxNestedSubschemas) {
    return SchemaError(where, "subschemas nested too deeply");
  }
  // The $ref targets this call expands stay on the stack for the values inside it.
  struct PopRefs {
    std::vector<const OJson*>* stack;
    size_t size;
    ~PopRefs() { stack->resize(size); }
  } pop_refs{&ref_stack_, ref_stack_.size()};

  // Booleans, $ref and allOf: everything they bring is in force here too.
  for (size_t i = 0; i < conj.size(); ++i) {
    const OJson& s = *conj[i].schema;
    if (s.is_boolean()) {
      if (!s.get<bool>()) return Nothing();
      continue;
    }
    if (!s.is_object()) {
      return SchemaError(conj[i].pointer, "a schema must be an object or a boolean");
    }
    if (!(conj[i].done & kRefDone)) {
      conj[i].done |= kRefDone;
      auto it = s.find("$ref");
      if (it != s.end()) {
        ASSIGN_OR_RETURN(Loc target, ResolveRef(*it, Child(conj[i].pointer, "$ref")));
        // In force already (and not split by its anyOf/oneOf on this path): adding it again
        // changes nothing. Otherwise it is a recursion, whose alternatives must be taken anew.
        const bool already = std::any_of(conj.begin(), conj.end(), [&](const Loc& l) {
          return l.schema == target.schema && (l.done & (kAnyOfDone | kOneOfDone)) == 0;
        });
        if (!already) {
          if (std::find(ref_stack_.begin(), ref_stack_.end(), target.schema) != ref_stack_.end()) {
            // Recursion: unfold a bounded number of times, then drop this branch.
            if (ctx.recursion >= max_depth_) return Nothing();
            ++ctx.recursion;
          }
          ref_stack_.push_back(target.schema);
          conj.push_back(std::move(target));
        }
      }
    }
    if (!(conj[i].done & kAllOfDone)) {
      conj[i].done |= kAllOfDone;
      auto it = s.find("allOf");
      if (it != s.end()) {
        const std::string pointer = Child(conj[i].pointer, "allOf");
        if (!it->is_array() || it->empty()) {
          return SchemaError(pointer, "must be a non-empty array of schemas");
        }
        size_t j = 0;
        for (const OJson& sub : *it) conj.push_back(Loc{&sub, Child(pointer, j++)});
      }
    }
    if (conj.size() > kMaxConjunction) {
      return SchemaError(conj[i].pointer,
                         absl::StrCat("more than ", kMaxConjunction,
                                      " schemas in force at one place (allOf, $ref)"));
    }
  }

  // anyOf / oneOf: one alternative per branch, each with everything else in force.
  for (size_t i = 0; i < conj.size(); ++i) {
    const OJson& s = *conj[i].schema;
    if (!s.is_object()) continue;
    for (const auto& [keyword, bit] : {std::pair<const char*, uint8_t>{"anyOf", kAnyOfDone},
                                       std::pair<const char*, uint8_t>{"oneOf", kOneOfDone}}) {
      if (conj[i].done & bit) continue;
      auto it = s.find(keyword);
      if (it == s.end()) continue;
      const std::string pointer = Child(conj[i].pointer, keyword);
      if (!it->is_array() || it->empty()) {
        return SchemaError(pointer, "must be a non-empty array of schemas");
      }
      if (it->size() > kMaxBranches) {
        return SchemaError(pointer, absl::StrCat("more than ", kMaxBranches, " alternatives"));
      }
      conj[i].done |= bit;
      std::vector<Regex> options;
      size_t j = 0;
      for (const OJson& branch : *it) {
        Conj with_branch = conj;
        with_branch.push_back(Loc{&branch, Child(pointer, j++)});
        ASSIGN_OR_RETURN(Regex option, Translate(std::move(with_branch), ctx));
        options.push_back(std::move(option));
      }
      return Alt(std::move(options));
    }
  }

  for (const Loc& m : conj) {
    if (!m.schema->is_object()) continue;
    for (auto it = m.schema->begin(); it != m.schema->end(); ++it) {
      if (Classify(it.key()) == KeywordKind::kUnsupported) {
        return SchemaError(
            Child(m.pointer, it.key()),
            absl::StrCat("keyword \"", it.key(),
                         "\" is not supported (its constraint could not be enforced)"));
      }
    }
  }
  return Base(conj, ctx, /*ignore_enum=*/false);
}

Regex Translator::AnyValue(int32_t budget) {
  budget = std::clamp(budget, 0, max_depth_);
  std::vector<Regex>& cache = any_cache_[compact_ ? 1 : 0];
  if (cache.size() <= static_cast<size_t>(budget)) cache.resize(budget + 1);
  if (cache[budget] != nullptr) return cache[budget];
  Regex value = Alt({JsonString(), JsonNumber(), L("true"), L("false"), L("null")});
  if (budget > 0) {
    const Regex inner = AnyValue(budget - 1);
    const Regex array =
        Concat({L("["), ws_, Optional(Concat({SeparatedList(inner), ws_})), L("]")});
    value = Alt({value, AnyObjectOf(inner), array});
  }
  any_cache_[compact_ ? 1 : 0][budget] = value;
  return value;
}

absl::StatusOr<Regex> Translator::Base(const Conj& conj, Ctx ctx, bool ignore_enum,
                                       uint8_t allowed) {
  uint8_t types = allowed;
  bool explicit_type = false;
  uint8_t implied = 0;
  std::optional<std::vector<const OJson*>> candidates;
  std::string enum_pointer;
  for (const Loc& m : conj) {
    if (!m.schema->is_object()) continue;
    for (auto it = m.schema->begin(); it != m.schema->end(); ++it) {
      const std::string& k = it.key();
      implied |= KeywordTypes(k);
      if (k == "type") {
        ASSIGN_OR_RETURN(const uint8_t t, ParseType(it.value(), Child(m.pointer, k)));
        types &= t;
        explicit_type = true;
      } else if ((k == "enum" || k == "const") && !ignore_enum) {
        const std::string pointer = Child(m.pointer, k);
        std::vector<const OJson*> values;
        if (k == "enum") {
          if (!it.value().is_array()) return SchemaError(pointer, "must be an array");
          if (it.value().size() > kMaxEnumValues) {
            return SchemaError(pointer, absl::StrCat("more than ", kMaxEnumValues, " values"));
          }
          for (const OJson& v : it.value()) values.push_back(&v);
        } else {
          values.push_back(&it.value());
        }
        // Several enum/const in force: only values in all of them.
        std::vector<const OJson*> kept;
        for (const OJson* v : candidates ? *candidates : values) {
          const bool in_all = !candidates || std::any_of(values.begin(), values.end(),
                                                         [&](const OJson* w) { return *w == *v; });
          const bool duplicate =
              std::any_of(kept.begin(), kept.end(), [&](const OJson* w) { return *w == *v; });
          if (in_all && !duplicate) kept.push_back(v);
        }
        candidates = std::move(kept);
        if (enum_pointer.empty()) enum_pointer = pointer;
      }
    }
  }
  if (candidates) return EnumValues(conj, ctx, *candidates, enum_pointer);
  if (!explicit_type) {
    // Checking enum values keeps every type: {"enum": ["a", 7], "maxLength": 3} holds 7.
    if (implied == 0 && !ignore_enum) return AnyValue(max_depth_ - ctx.level);
    if (!ignore_enum) types = implied;
  }
  std::vector<Regex> options;
  if (types & kNull) options.push_back(L("null"));
  if (types & kBoolean) options.push_back(Alt({L("true"), L("false")}));
  if (types & kNumber) {
    // Integers are numbers: one alternative covers both.
    ASSIGN_OR_RETURN(Regex r, NumberValue(conj));
    options.push_back(std::move(r));
  } else if (types & kInteger) {
    ASSIGN_OR_RETURN(Regex r, IntegerValue(conj));
    options.push_back(std::move(r));
  }
  if (types & kString) {
    ASSIGN_OR_RETURN(Regex r, StringValue(conj));
    options.push_back(std::move(r));
  }
  if (types & kArray) {
    ASSIGN_OR_RETURN(Regex r, ArrayValue(conj, ctx));
    options.push_back(std::move(r));
  }
  if (types & kObject) {
    ASSIGN_OR_RETURN(Regex r, ObjectValue(conj, ctx));
    options.push_back(std::move(r));
  }
  return Alt(std::move(options));
}

absl::StatusOr<Regex> Translator::EnumValues(const Conj& conj, Ctx ctx,
                                             const std::vector<const OJson*>& values,
                                             const std::string& pointer) {
  // The other keywords in force still apply: keep the values whose compact form their language
  // holds (the language of compact texts, without whitespace). Conservative where a value is
  // valid but written otherwise than the translation generates (e.g. keys out of schema order).
  // The common case, "type" and "enum" together, is checked directly.
  bool constrained = false;
  uint8_t types = kAllTypes;
  for (const Loc& m : conj) {
    if (!m.schema->is_object()) continue;
    for (auto it = m.schema->begin(); it != m.schema->end(); ++it) {
      if (it.key() == "type") {
        ASSIGN_OR_RETURN(const uint8_t t, ParseType(it.value(), Child(m.pointer, "type")));
        types &= t;
      } else if (Classify(it.key()) == KeywordKind::kHandled &&
                 !OneOf(it.key(), {"enum", "const", "$ref", "allOf", "anyOf", "oneOf"})) {
        constrained = true;
      }
    }
  }
  // Integers are checked as integers (exact bounds); 2.0 is an integer too, but written as a
  // number.
  auto type_of = [](const OJson& v) -> uint8_t {
    if (v.is_null()) return kNull;
    if (v.is_boolean()) return kBoolean;
    if (v.is_number_integer()) return kInteger;
    if (v.is_number_float()) {
      const double d = v.get<double>();
      return std::isfinite(d) && std::floor(d) == d ? kInteger | kNumber : kNumber;
    }
    if (v.is_string()) return kString;
    if (v.is_array()) return kArray;
    return kObject;
  };
  uint8_t value_types = 0;
  for (const OJson* v : values) value_types |= type_of(*v);
  std::optional<Dfa> others;
  if (constrained) {
    if (++enum_checks_ > kMaxEnumChecks) {
      return SchemaError(pointer, absl::StrCat("more than ", kMaxEnumChecks,
                                               " enum/const keywords with sibling constraints"));
    }
    const Regex saved_ws = ws_;
    const bool saved_compact = compact_;
    ws_ = Empty();
    compact_ = true;
    // Only the values' own types: a smaller automaton to build.
    absl::StatusOr<Regex> rest = Base(conj, ctx, /*ignore_enum=*/true, value_types & types);
    ws_ = saved_ws;
    compact_ = saved_compact;
    if (!rest.ok()) return rest.status();
    if ((*rest)->kind == RegexNode::Kind::kNothing) return Nothing();
    DfaLimits limits;
    limits.max_states = kMaxEnumCheckStates;
    absl::StatusOr<Dfa> dfa = Dfa::Compile(*rest, limits);
    if (!dfa.ok()) {
      return SchemaError(pointer,
                         absl::StrCat("cannot check the values against the other keywords: ",
                                      dfa.status().message()));
    }
    others.emplace(*std::move(dfa));
  }
  std::vector<Regex> options;
  size_t bytes = 0;
  for (const OJson* v : values) {
    std::string text = Dump(*v);
    if ((type_of(*v) & types) == 0 || (others && !others->Matches(text))) continue;
    bytes += text.size();
    if (bytes > kMaxEnumBytes) {
      return SchemaError(pointer,
                         absl::StrCat("values longer than ", kMaxEnumBytes, " bytes in all"));
    }
    options.push_back(Literal(text));
  }
  return Alt(std::move(options));
}

absl::StatusOr<Regex> Translator::StringValue(const Conj& conj) {
  uint64_t min_length = 0;
  std::optional<uint64_t> max_length;
  std::string min_pointer;
  const OJson* pattern = nullptr;
  std::string pattern_pointer;
  const std::string* format = nullptr;
  for (const Loc& m : conj) {
    if (!m.schema->is_object()) continue;
    const OJson& s = *m.schema;
    if (auto it = s.find("minLength"); it != s.end()) {
      ASSIGN_OR_RETURN(const uint64_t n, ReadCount(*it, Child(m.pointer, "minLength")));
      if (n > min_length) {
        min_length = n;
        min_pointer = Child(m.pointer, "minLength");
      }
    }
    if (auto it = s.find("maxLength"); it != s.end()) {
      ASSIGN_OR_RETURN(const uint64_t n, ReadCount(*it, Child(m.pointer, "maxLength")));
      max_length = std::min(n, max_length.value_or(n));
    }
    if (auto it = s.find("pattern"); it != s.end()) {
      const std::string pointer = Child(m.pointer, "pattern");
      if (!it->is_string()) return SchemaError(pointer, "must be a string");
      if (pattern != nullptr && *pattern != *it) {
        return SchemaError(pointer, "two different patterns on one string are not supported");
      }
      pattern = &*it;
      pattern_pointer = pointer;
    }
    if (auto it = s.find("format"); it != s.end() && it->is_string() && format == nullptr) {
      format = &it->get_ref<const std::string&>();
    }
  }
  if (max_length && min_length > *max_length) return Nothing();
  if (pattern != nullptr) {
    if (min_length > 0 || max_length) {
      return SchemaError(pattern_pointer,
                         "pattern together with minLength/maxLength is not supported");
    }
    const std::string& text = pattern->get_ref<const std::string&>();
    absl::StatusOr<Regex> tree = ParseRegex(text);
    if (!tree.ok()) return SchemaError(pattern_pointer, tree.status().message());
    // "format" is an annotation; the pattern is what the string must match.
    return Quote(PatternContent(*tree));
  }
  if (format != nullptr) {
    // A format is kept where the lengths cannot cut into it; otherwise the lengths (assertions)
    // win over the format (an annotation by default).
    std::optional<Format> f = FormatRegex(*format);
    if (f && f->min_length >= min_length && (!max_length || f->max_length <= *max_length)) {
      return Quote(f->regex);
    }
  }
  if (min_length > static_cast<uint64_t>(kJsonSchemaMaxCount)) {
    return SchemaError(min_pointer,
                       absl::StrCat("minLength above ", kJsonSchemaMaxCount, " is not supported"));
  }
  const int32_t max =
      max_length ? static_cast<int32_t>(std::min<uint64_t>(*max_length, kJsonSchemaMaxCount)) : -1;
  return Quote(Repeat(JsonStringChar(), static_cast<int32_t>(min_length), max));
}

absl::StatusOr<Regex> Translator::IntegerValue(const Conj& conj) {
  std::optional<__int128> lo, hi;
  std::string lo_pointer, hi_pointer;
  for (const Loc& m : conj) {
    if (!m.schema->is_object()) continue;
    for (const char* keyword : {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"}) {
      auto it = m.schema->find(keyword);
      if (it == m.schema->end()) continue;
      // Draft 4's "exclusiveMinimum": false says the bound is inclusive: no constraint of its own.
      if (it->is_boolean() && !it->get<bool>()) continue;
      const std::string pointer = Child(m.pointer, keyword);
      ASSIGN_OR_RETURN(const JsonNumberValue n, ReadNumber(*it, pointer));
      const std::string k = keyword;
      if (k == "minimum" || k == "exclusiveMinimum") {
        const __int128 b = k == "minimum" ? CeilOf(n) : FloorOf(n) + 1;
        if (!lo || b > *lo) {
          lo = b;
          lo_pointer = pointer;
        }
      } else {
        const __int128 b = k == "maximum" ? FloorOf(n) : CeilOf(n) - 1;
        if (!hi || b < *hi) {
          hi = b;
          hi_pointer = pointer;
        }
      }
    }
  }
  constexpr __int128 kMin = std::numeric_limits<int64_t>::min();
  constexpr __int128 kMax = std::numeric_limits<int64_t>::max();
  if (lo && hi && *lo > *hi) return Nothing();
  if (lo && *lo > kMax) {
    return SchemaError(lo_pointer, "a lower bound above the 64-bit range is not supported");
  }
  if (hi && *hi < kMin) {
    return SchemaError(hi_pointer, "an upper bound below the 64-bit range is not supported");
  }
  // Bounds beyond the 64-bit range are narrowed to it: every integer generated still satisfies
  // them.
  std::optional<int64_t> lo64, hi64;
  if (lo) lo64 = static_cast<int64_t>(std::max(*lo, kMin));
  if (hi) hi64 = static_cast<int64_t>(std::min(*hi, kMax));
  return IntegerRange(lo64, hi64);
}

absl::StatusOr<Regex> Translator::NumberValue(const Conj& conj) {
  std::optional<NumberBound> lo, hi;
  for (const Loc& m : conj) {
    if (!m.schema->is_object()) continue;
    for (const char* keyword : {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"}) {
      auto it = m.schema->find(keyword);
      if (it == m.schema->end()) continue;
      // Draft 4's "exclusiveMinimum": false says the bound is inclusive: no constraint of its own.
      if (it->is_boolean() && !it->get<bool>()) continue;
      const std::string pointer = Child(m.pointer, keyword);
      ASSIGN_OR_RETURN(const JsonNumberValue n, ReadNumber(*it, pointer));
      if (!n.integral || n.integer < std::numeric_limits<int64_t>::min() ||
          n.integer > std::numeric_limits<int64_t>::max()) {
        return SchemaError(pointer,
                           "bounds on numbers are only supported when they are integers within 64 "
                           "bits (use \"type\": \"integer\" or an integer bound)");
      }
      const std::string k = keyword;
      const NumberBound b{static_cast<int64_t>(n.integer),
                          k == "exclusiveMinimum" || k == "exclusiveMaximum"};
      if (k == "minimum" || k == "exclusiveMinimum") {
        if (!lo || b.value > lo->value || (b.value == lo->value && b.exclusive)) lo = b;
      } else {
        if (!hi || b.value < hi->value || (b.value == hi->value && b.exclusive)) hi = b;
      }
    }
  }
  if (!lo && !hi) return JsonNumber();
  return BoundedNumber(lo, hi);
}

absl::StatusOr<Regex> Translator::ArrayValue(const Conj& conj, Ctx ctx) {
  // Per schema in force: the positional schemas and the schema of the items after them.
  struct Positional {
    const OJson* prefix = nullptr;
    std::string prefix_pointer;
    const OJson* rest = nullptr;
    std::string rest_pointer;
  };
  std::vector<Positional> parts;
  uint64_t min_items = 0;
  std::optional<uint64_t> max_items;
  std::string min_pointer;
  std::string unique_pointer;
  for (const Loc& m : conj) {
    if (!m.schema->is_object()) continue;
    const OJson& s = *m.schema;
    Positional p;
    if (auto it = s.find("prefixItems"); it != s.end()) {
      p.prefix_pointer = Child(m.pointer, "prefixItems");
      if (!it->is_array()) return SchemaError(p.prefix_pointer, "must be an array of schemas");
      p.prefix = &*it;
    }
    if (auto it = s.find("items"); it != s.end()) {
      const std::string pointer = Child(m.pointer, "items");
      if (it->is_array()) {
        // Draft 7 tuples: items as an array, additionalItems for the rest.
        if (p.prefix != nullptr) {
          return SchemaError(pointer, "an array of items together with prefixItems");
        }
        p.prefix = &*it;
        p.prefix_pointer = pointer;
        if (auto extra = s.find("additionalItems"); extra != s.end()) {
          p.rest = &*extra;
          p.rest_pointer = Child(m.pointer, "additionalItems");
        }
      } else {
        p.rest = &*it;
        p.rest_pointer = pointer;
      }
    }
    if (auto it = s.find("minItems"); it != s.end()) {
      ASSIGN_OR_RETURN(const uint64_t n, ReadCount(*it, Child(m.pointer, "minItems")));
      if (n > min_items) {
        min_items = n;
        min_pointer = Child(m.pointer, "minItems");
      }
    }
    if (auto it = s.find("maxItems"); it != s.end()) {
      ASSIGN_OR_RETURN(const uint64_t n, ReadCount(*it, Child(m.pointer, "maxItems")));
      max_items = std::min(n, max_items.value_or(n));
    }
    if (auto it = s.find("uniqueItems"); it != s.end()) {
      if (!it->is_boolean()) {
        return SchemaError(Child(m.pointer, "uniqueItems"), "must be a boolean");
      }
      if (it->get<bool>()) unique_pointer = Child(m.pointer, "uniqueItems");
    }
    if (p.prefix != nullptr && p.prefix->size() > kMaxProperties) {
      return SchemaError(p.prefix_pointer,
                         absl::StrCat("more than ", kMaxProperties, " positions"));
    }
    parts.push_back(std::move(p));
  }
  if (max_items && min_items > *max_items) return Nothing();
  if (!unique_pointer.empty() && !(max_items && *max_items <= 1)) {
    return SchemaError(
        unique_pointer,
        "keyword \"uniqueItems\": true is not supported (its constraint could not be enforced)");
  }
  if (min_items > static_cast<uint64_t>(kJsonSchemaMaxCount)) {
    return SchemaError(min_pointer,
                       absl::StrCat("minItems above ", kJsonSchemaMaxCount, " is not supported"));
  }
  const int64_t mn = static_cast<int64_t>(min_items);
  const int64_t hi =
      max_items ? static_cast<int64_t>(std::min<uint64_t>(*max_items, kJsonSchemaMaxCount)) : -1;
  int64_t k = 0;
  for (const Positional& p : parts) {
    if (p.prefix != nullptr) k = std::max<int64_t>(k, static_cast<int64_t>(p.prefix->size()));
  }
  if (hi >= 0) k = std::min(k, hi);  // positions past maxItems are never reached

  Ctx inner = ctx;
  ++inner.level;
  std::vector<Regex> element(k);
  for (int64_t j = 0; j < k; ++j) {
    Conj c;
    for (const Positional& p : parts) {
      if (p.prefix != nullptr && static_cast<size_t>(j) < p.prefix->size()) {
        c.push_back(Loc{&(*p.prefix)[static_cast<size_t>(j)],
                        Child(p.prefix_pointer, static_cast<size_t>(j))});
      } else if (p.rest != nullptr) {
        c.push_back(Loc{p.rest, p.rest_pointer});
      }
    }
    ASSIGN_OR_RETURN(element[j], Translate(std::move(c), inner));
  }
  Regex rest = Nothing();
  if (hi < 0 || hi > k) {
    Conj c;
    for (const Positional& p : parts) {
      if (p.rest != nullptr) c.push_back(Loc{p.rest, p.rest_pointer});
    }
    ASSIGN_OR_RETURN(rest, Translate(std::move(c), inner));
  }
  const Regex sep = Sep();
  // Items j, j+1, ... (past the positional ones), each after a separator, j items already there.
  auto rest_from = [&](int64_t j) {
    if (hi >= 0 && j >= hi) return Empty();
    return Repeat(Concat({sep, rest}), static_cast<int32_t>(std::max<int64_t>(0, mn - j)),
                  hi < 0 ? -1 : static_cast<int32_t>(hi - j));
  };
  Regex non_empty = Nothing();
  if (k > 0) {
    Regex tail = rest_from(k);
    for (int64_t j = k - 1; j >= 1; --j) {
      const Regex item = Concat({sep, element[j], tail});
      tail = j >= mn ? Optional(item) : item;
    }
    non_empty = Concat({element[0], tail});
  } else if (hi != 0) {
    non_empty = SeparatedList(rest, static_cast<int32_t>(std::max<int64_t>(1, mn)),
                              static_cast<int32_t>(hi));
  }
  return Alt({mn == 0 ? Concat({L("["), ws_, L("]")}) : Nothing(),
              hi != 0 ? Concat({L("["), ws_, non_empty, ws_, L("]")}) : Nothing()});
}

absl::StatusOr<Regex> Translator::ObjectValue(const Conj& conj, Ctx ctx) {
  struct Property {
    std::string key;
    Conj schemas;
    bool required = false;
  };
  std::vector<Property> properties;
  std::map<std::string, size_t> index;
  auto property = [&](const std::string& key) -> Property& {
    auto [it, inserted] = index.emplace(key, properties.size());
    if (inserted) properties.push_back(Property{key, {}, false});
    return properties[it->second];
  };
  for (const Loc& m : conj) {
    if (!m.schema->is_object()) continue;
    auto it = m.schema->find("properties");
    if (it == m.schema->end()) continue;
    const std::string pointer = Child(m.pointer, "properties");
    if (!it->is_object()) return SchemaError(pointer, "must be an object of schemas");
    for (auto p = it->begin(); p != it->end(); ++p) {
      property(p.key()).schemas.push_back(Loc{&p.value(), Child(pointer, p.key())});
      if (properties.size() > kMaxProperties) {
        return SchemaError(pointer, absl::StrCat("more than ", kMaxProperties, " properties"));
      }
    }
  }
  for (const Loc& m : conj) {
    if (!m.schema->is_object()) continue;
    auto it = m.schema->find("required");
    if (it == m.schema->end()) continue;
    const std::string pointer = Child(m.pointer, "required");
    if (!it->is_array()) return SchemaError(pointer, "must be an array of strings");
    size_t j = 0;
    for (const OJson& key : *it) {
      if (!key.is_string()) return SchemaError(Child(pointer, j), "must be a string");
      property(key.get_ref<const std::string&>()).required = true;
      if (properties.size() > kMaxProperties) {
        return SchemaError(pointer, absl::StrCat("more than ", kMaxProperties, " properties"));
      }
      ++j;
    }
  }
  // A schema's additionalProperties applies to the keys its own properties do not list.
  Conj additional;
  for (const Loc& m : conj) {
    if (!m.schema->is_object()) continue;
    auto it = m.schema->find("additionalProperties");
    if (it == m.schema->end()) continue;
    const Loc schema{&*it, Child(m.pointer, "additionalProperties")};
    additional.push_back(schema);
    auto own = m.schema->find("properties");
    for (Property& p : properties) {
      if (own == m.schema->end() || !own->is_object() || !own->contains(p.key)) {
        p.schemas.push_back(schema);
      }
    }
  }
  uint64_t min_properties = 0;
  std::optional<uint64_t> max_properties;
  std::string min_pointer, max_pointer;
  for (const Loc& m : conj) {
    if (!m.schema->is_object()) continue;
    if (auto it = m.schema->find("minProperties"); it != m.schema->end()) {
      ASSIGN_OR_RETURN(const uint64_t n, ReadCount(*it, Child(m.pointer, "minProperties")));
      if (n > min_properties) {
        min_properties = n;
        min_pointer = Child(m.pointer, "minProperties");
      }
    }
    if (auto it = m.schema->find("maxProperties"); it != m.schema->end()) {
      ASSIGN_OR_RETURN(const uint64_t n, ReadCount(*it, Child(m.pointer, "maxProperties")));
      if (!max_properties || n < *max_properties) {
        max_properties = n;
        max_pointer = Child(m.pointer, "maxProperties");
      }
    }
  }
  if (max_properties && min_properties > *max_properties) return Nothing();

  Ctx inner = ctx;
  ++inner.level;
  const Regex sep = Sep();
  const Regex open = L("{");
  const Regex close = L("}");
  if (properties.empty()) {
    // Free-form: any keys, values under every additionalProperties in force. Keys are not kept
    // apart, and a repeated key counts once where the object is read.
    if (min_properties > 1) {
      return SchemaError(min_pointer,
                         "minProperties above 1 is not supported without listed properties");
    }
    const int64_t mn = static_cast<int64_t>(min_properties);
    const int64_t mx =
        max_properties
            ? static_cast<int64_t>(std::min<uint64_t>(*max_properties, kJsonSchemaMaxCount))
            : -1;
    ASSIGN_OR_RETURN(const Regex value, Translate(std::move(additional), inner));
    const Regex pair = Concat({JsonString(), ws_, L(":"), ws_, value});
    const Regex non_empty =
        mx == 0 ? Nothing()
                : SeparatedList(pair, static_cast<int32_t>(std::max<int64_t>(1, mn)),
                                static_cast<int32_t>(mx));
    return Alt({mn == 0 ? Concat({open, ws_, close}) : Nothing(),
                Concat({open, ws_, non_empty, ws_, close})});
  }

  // Listed keys only, in order, optional ones free to be left out.
  size_t required = 0;
  for (const Property& p : properties) required += p.required ? 1 : 0;
  if (max_properties && *max_properties < required) return Nothing();
  if (min_properties > properties.size()) return Nothing();
  if (min_properties > required) {
    return SchemaError(
        min_pointer,
        "minProperties above the number of required properties is not supported with "
        "listed properties");
  }
  if (max_properties && *max_properties < properties.size()) {
    return SchemaError(max_pointer,
                       "maxProperties below the number of listed properties is not supported");
  }
  const size_t n = properties.size();
  std::vector<Regex> member(n);
  for (size_t j = 0; j < n; ++j) {
    ASSIGN_OR_RETURN(const Regex value, Translate(properties[j].schemas, inner));
    member[j] = Concat({Literal(Dump(OJson(properties[j].key))), ws_, L(":"), ws_, value});
  }
  // tail[j]: members j.. after one already written (each after a separator);
  // first[j]: members j.. when none is written yet (at least one; O(n^2) in all).
  std::vector<Regex> tail(n + 1), first(n + 1);
  tail[n] = Empty();
  first[n] = Nothing();
  for (size_t j = n; j-- > 0;) {
    const Regex after_sep = Concat({sep, member[j]});
    tail[j] = Concat({properties[j].required ? after_sep : Optional(after_sep), tail[j + 1]});
    const Regex starting_here = Concat({member[j], tail[j + 1]});
    first[j] = properties[j].required ? starting_here : Alt({starting_here, first[j + 1]});
  }
  return Alt({required == 0 ? Concat({open, ws_, close}) : Nothing(),
              Concat({open, ws_, first[0], ws_, close})});
}

absl::StatusOr<Regex> Translate(const OJson& schema, const JsonSchemaOptions& options) {
  Translator translator(schema, options);
  ASSIGN_OR_RETURN(Regex r, translator.TranslateRoot());
  if (r->kind == RegexNode::Kind::kNothing) {
    return SchemaError("", "the schema accepts no JSON value");
  }
  return r;
}

// Nesting of a Json built in code (parsed ones are bounded at parse), without recursion.
int JsonDepth(const Json& json) {
  int deepest = 0;
  std::vector<std::pair<const Json*, int>> stack = {{&json, 0}};
  while (!stack.empty()) {
    auto [node, depth] = stack.back();
    stack.pop_back();
    if (!node->is_structured()) continue;
    deepest = std::max(deepest, depth + 1);
    if (deepest > kMaxJsonDepth) return deepest;
    for (const Json& child : *node) stack.push_back({&child, depth + 1});
  }
  return deepest;
}

const OJson& NullJson() {
  static const OJson* const kNull = new OJson();
  return *kNull;
}

}  // namespace

absl::StatusOr<Regex> JsonSchemaToRegex(const Json& schema, const JsonSchemaOptions& options) {
  // The conversion below recurses.
  if (JsonDepth(schema) > kMaxJsonDepth) {
    return absl::InvalidArgumentError(
        absl::StrCat("JSON schema: nested deeper than ", kMaxJsonDepth, " levels"));
  }
  return Translate(OJson(schema), options);
}

absl::StatusOr<Regex> JsonSchemaTextToRegex(std::string_view schema_text,
                                            const JsonSchemaOptions& options) {
  // ParseJson bounds the nesting before nlohmann's recursive parser runs, and says where malformed
  // text goes wrong; the second parse keeps the keys in order.
  ASSIGN_OR_RETURN(const Json checked, ParseJson(schema_text, "JSON schema"));
  (void)checked;
  const OJson schema = OJson::parse(schema_text.begin(), schema_text.end(), /*cb=*/nullptr,
                                    /*allow_exceptions=*/false);
  if (schema.is_discarded()) return absl::InvalidArgumentError("JSON schema: invalid JSON");
  return Translate(schema, options);
}

Regex AnyJsonValue(const JsonSchemaOptions& options) {
  Translator translator(NullJson(), options);
  return translator.AnyValue(translator.max_depth());
}

Regex AnyJsonObject(const JsonSchemaOptions& options) {
  Translator translator(NullJson(), options);
  // The object is one level; its values get the rest.
  return translator.AnyObjectOf(translator.AnyValue(std::max(1, translator.max_depth()) - 1));
}

}  // namespace kvrm::structured
