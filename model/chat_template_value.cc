#include "model/chat_template_value.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvrm::jinja {
namespace {

absl::Status TooLong(size_t limit) {
  return absl::InvalidArgumentError(Cat("string exceeds ", limit, " bytes"));
}

absl::Status Append(std::string_view s, size_t limit, std::string* out) {
  if (out->size() + s.size() > limit) return TooLong(limit);
  out->append(s);
  return absl::OkStatus();
}

// Decodes the code point at s[i]; *len gets its byte length (1 for an invalid byte, which
// decodes as U+FFFD).
uint32_t DecodeAt(std::string_view s, size_t i, size_t* len) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  *len = 1;
  if (b0 < 0x80) return b0;
  int n = 0;
  uint32_t cp = 0;
  if ((b0 & 0xE0) == 0xC0) {
    n = 1;
    cp = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    n = 2;
    cp = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0) {
    n = 3;
    cp = b0 & 0x07;
  } else {
    return 0xFFFD;
  }
  if (i + n >= s.size()) return 0xFFFD;
  for (int k = 1; k <= n; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) return 0xFFFD;
    cp = (cp << 6) | (b & 0x3F);
  }
  static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
  if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0xFFFD;
  *len = n + 1;
  return cp;
}

// The start of the code point ending at `end` (> begin): the byte before `end` unless it ends
// a valid multi-byte sequence, as DecodeAt would have read it going forward.
size_t CodePointStartBefore(std::string_view s, size_t begin, size_t end) {
  size_t at = end - 1;
  while (at > begin && end - at < 4 && (static_cast<unsigned char>(s[at]) & 0xC0) == 0x80) --at;
  size_t len;
  DecodeAt(s, at, &len);
  return at + len == end ? at : end - 1;
}

// Python's str.isspace().
bool IsPySpace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

void AppendHex4(uint32_t u, std::string* out) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(u));
  out->append(buf);
}

void AppendJsonString(std::string_view s, bool ensure_ascii, std::string* out) {
  out->push_back('"');
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      size_t len;
      const uint32_t cp = DecodeAt(s, i, &len);
      if (!ensure_ascii) {
        out->append(s.substr(i, len));
      } else if (cp >= 0x10000) {
        AppendHex4(0xD800 + ((cp - 0x10000) >> 10), out);
        AppendHex4(0xDC00 + ((cp - 0x10000) & 0x3FF), out);
      } else {
        AppendHex4(cp, out);
      }
      i += len;
      continue;
    }
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      case '\b':
        out->append("\\b");
        break;
      case '\f':
        out->append("\\f");
        break;
      default:
        if (c < 0x20) {
          AppendHex4(c, out);
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
    ++i;
  }
  out->push_back('"');
}

void AppendReprString(std::string_view s, std::string* out) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = (has_single && !has_double) ? '"' : '\'';
  out->push_back(quote);
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (ch == quote || ch == '\\') {
      out->push_back('\\');
      out->push_back(ch);
    } else if (ch == '\n') {
      out->append("\\n");
    } else if (ch == '\r') {
      out->append("\\r");
    } else if (ch == '\t') {
      out->append("\\t");
    } else if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out->append(buf);
    } else {
      out->push_back(ch);
    }
  }
  out->push_back(quote);
}

absl::Status AppendJsonImpl(const Value& v, const JsonOptions& o, int level, size_t limit,
                            std::string* out) {
  if (out->size() > limit) return TooLong(limit);
  auto newline = [&](int lvl) {
    if (!o.indent.has_value()) return;
    out->push_back('\n');
    for (int i = 0; i < lvl && out->size() <= limit; ++i) out->append(*o.indent);
  };
  switch (v.kind()) {
    case Value::Kind::kNone:
      out->append("null");
      return absl::OkStatus();
    case Value::Kind::kBool:
      out->append(v.as_bool() ? "true" : "false");
      return absl::OkStatus();
    case Value::Kind::kInt:
      out->append(std::to_string(v.as_int()));
      return absl::OkStatus();
    case Value::Kind::kFloat: {
      const double d = v.as_float();
      if (std::isnan(d)) {
        out->append("NaN");
      } else if (std::isinf(d)) {
        out->append(d > 0 ? "Infinity" : "-Infinity");
      } else {
        out->append(FormatFloat(d));
      }
      return absl::OkStatus();
    }
    case Value::Kind::kString:
      if (out->size() + v.as_string().size() > limit) return TooLong(limit);
      AppendJsonString(v.as_string(), o.ensure_ascii, out);
      return absl::OkStatus();
    case Value::Kind::kList: {
      const auto& items = v.as_list();
      if (items.empty()) {
        out->append("[]");
        return absl::OkStatus();
      }
      out->push_back('[');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out->append(o.item_separator);
        newline(level + 1);
        if (auto s = AppendJsonImpl(items[i], o, level + 1, limit, out); !s.ok()) return s;
      }
      newline(level);
      out->push_back(']');
      return absl::OkStatus();
    }
    case Value::Kind::kDict: {
      const auto& items = v.as_dict();
      if (items.empty()) {
        out->append("{}");
        return absl::OkStatus();
      }
      std::vector<const std::pair<std::string, Value>*> order;
      for (const auto& kv : items) order.push_back(&kv);
      if (o.sort_keys) {
        std::stable_sort(order.begin(), order.end(),
                         [](const auto* a, const auto* b) { return a->first < b->first; });
      }
      out->push_back('{');
      for (size_t i = 0; i < order.size(); ++i) {
        if (i > 0) out->append(o.item_separator);
        newline(level + 1);
        if (out->size() + order[i]->first.size() > limit) return TooLong(limit);
        AppendJsonString(order[i]->first, o.ensure_ascii, out);
        out->append(o.key_separator);
        if (auto s = AppendJsonImpl(order[i]->second, o, level + 1, limit, out); !s.ok()) {
          return s;
        }
      }
      newline(level);
      out->push_back('}');
      return absl::OkStatus();
    }
    default:
      return absl::InvalidArgumentError(
          Cat("Object of type ", TypeName(v), " is not JSON serializable"));
  }
}

}  // namespace

Value Value::List(std::vector<Value> items) {
  auto data = std::make_shared<ListData>();
  for (const Value& item : items) data->depth = std::max(data->depth, item.depth() + 1);
  data->items = std::move(items);
  return Value(std::in_place_type<std::shared_ptr<const ListData>>, std::move(data));
}

Value Value::Dict(Attrs items) {
  auto data = std::make_shared<DictData>();
  for (const auto& kv : items) data->depth = std::max(data->depth, kv.second.depth() + 1);
  data->items = std::move(items);
  return Value(std::in_place_type<std::shared_ptr<const DictData>>, std::move(data));
}

double Value::as_double() const {
  switch (kind()) {
    case Kind::kBool:
      return as_bool() ? 1.0 : 0.0;
    case Kind::kInt:
      return static_cast<double>(as_int());
    case Kind::kFloat:
      return as_float();
    default:
      return 0.0;
  }
}

int Value::depth() const {
  if (is_list()) return std::get<std::shared_ptr<const ListData>>(v_)->depth;
  if (is_dict()) return std::get<std::shared_ptr<const DictData>>(v_)->depth;
  return 0;
}

const Value* FindAttr(const Attrs& attrs, std::string_view key) {
  for (const auto& kv : attrs) {
    if (kv.first == key) return &kv.second;
  }
  return nullptr;
}

void SetAttr(Attrs& attrs, std::string key, Value value) {
  for (auto& kv : attrs) {
    if (kv.first == key) {
      kv.second = std::move(value);
      return;
    }
  }
  attrs.emplace_back(std::move(key), std::move(value));
}

std::string_view TypeName(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "Undefined";
    case Value::Kind::kNone:
      return "NoneType";
    case Value::Kind::kBool:
      return "bool";
    case Value::Kind::kInt:
      return "int";
    case Value::Kind::kFloat:
      return "float";
    case Value::Kind::kString:
      return "str";
    case Value::Kind::kList:
      return "list";
    case Value::Kind::kDict:
      return "dict";
    case Value::Kind::kNamespace:
      return "Namespace";
    case Value::Kind::kCallable:
      return "function";
  }
  return "object";
}

bool Truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return false;
    case Value::Kind::kBool:
      return v.as_bool();
    case Value::Kind::kInt:
      return v.as_int() != 0;
    case Value::Kind::kFloat:
      return v.as_float() != 0.0;
    case Value::Kind::kString:
      return !v.as_string().empty();
    case Value::Kind::kList:
      return !v.as_list().empty();
    case Value::Kind::kDict:
      return !v.as_dict().empty();
    default:
      return true;
  }
}

std::string FormatFloat(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-tripping digits, as Python's repr.
  char buf[64];
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof(buf), "%.*e", prec - 1, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  // buf: [-]D[.DDD]e[+-]XX
  std::string s(buf);
  const bool neg = s[0] == '-';
  if (neg) s.erase(0, 1);
  const size_t e = s.find('e');
  std::string digits = s.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exp = std::atoi(s.c_str() + e + 1);
  std::string out = neg ? "-" : "";
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out += "0." + std::string(-exp - 1, '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exp + 1) {
      out += digits + std::string(exp + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof(eb), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += eb;
  }
  return out;
}

absl::Status AppendStr(const Value& v, size_t limit, std::string* out) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return absl::OkStatus();
    case Value::Kind::kNone:
      return Append("None", limit, out);
    case Value::Kind::kBool:
      return Append(v.as_bool() ? "True" : "False", limit, out);
    case Value::Kind::kInt:
      return Append(std::to_string(v.as_int()), limit, out);
    case Value::Kind::kFloat:
      return Append(FormatFloat(v.as_float()), limit, out);
    case Value::Kind::kString:
      return Append(v.as_string(), limit, out);
    default:
      return AppendRepr(v, limit, out);
  }
}

absl::Status AppendRepr(const Value& v, size_t limit, std::string* out) {
  if (out->size() > limit) return TooLong(limit);
  switch (v.kind()) {
    case Value::Kind::kString:
      if (out->size() + v.as_string().size() > limit) return TooLong(limit);
      AppendReprString(v.as_string(), out);
      return absl::OkStatus();
    case Value::Kind::kList: {
      out->push_back('[');
      bool first = true;
      for (const Value& item : v.as_list()) {
        if (!first) out->append(", ");
        first = false;
        if (auto s = AppendRepr(item, limit, out); !s.ok()) return s;
      }
      out->push_back(']');
      return absl::OkStatus();
    }
    case Value::Kind::kDict: {
      out->push_back('{');
      bool first = true;
      for (const auto& kv : v.as_dict()) {
        if (!first) out->append(", ");
        first = false;
        if (out->size() + kv.first.size() > limit) return TooLong(limit);
        AppendReprString(kv.first, out);
        out->append(": ");
        if (auto s = AppendRepr(kv.second, limit, out); !s.ok()) return s;
      }
      out->push_back('}');
      return absl::OkStatus();
    }
    case Value::Kind::kNamespace:
      return Append("<Namespace>", limit, out);
    case Value::Kind::kCallable:
      return Append(Cat("<function ", v.as_callable().name, ">"), limit, out);
    default:
      return AppendStr(v, limit, out);
  }
}

bool Equals(const Value& a, const Value& b, int64_t* budget) {
  if (budget != nullptr && --*budget < 0) return false;
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    const int64_t x = a.is_bool() ? a.as_bool() : a.as_int();
    const int64_t y = b.is_bool() ? b.as_bool() : b.as_int();
    return x == y;
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.as_string() == b.as_string();
    case Value::Kind::kList: {
      const auto& x = a.as_list();
      const auto& y = b.as_list();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!Equals(x[i], y[i], budget)) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      const auto& x = a.as_dict();
      const auto& y = b.as_dict();
      if (x.size() != y.size()) return false;
      for (const auto& kv : x) {
        if (budget != nullptr && (*budget -= static_cast<int64_t>(y.size())) < 0) return false;
        const Value* other = FindAttr(y, kv.first);
        if (other == nullptr || !Equals(kv.second, *other, budget)) return false;
      }
      return true;
    }
    case Value::Kind::kNamespace:
      return a.as_namespace() == b.as_namespace();
    case Value::Kind::kCallable:
      return a.as_callable().builtin == b.as_callable().builtin &&
             a.as_callable().macro == b.as_callable().macro;
    default:
      return false;
  }
}

absl::StatusOr<int> Compare(const Value& a, const Value& b, int64_t* budget) {
  if (budget != nullptr && --*budget < 0) {
    return absl::InvalidArgumentError("evaluation exceeds the work limit");
  }
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      const double x = a.as_double(), y = b.as_double();
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    const int64_t x = a.is_bool() ? a.as_bool() : a.as_int();
    const int64_t y = b.is_bool() ? b.as_bool() : b.as_int();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.as_string().compare(b.as_string());
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_list() && b.is_list()) {
    const auto& x = a.as_list();
    const auto& y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (Equals(x[i], y[i], budget)) continue;
      if (budget != nullptr && *budget < 0) {
        return absl::InvalidArgumentError("evaluation exceeds the work limit");
      }
      return Compare(x[i], y[i], budget);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  return absl::InvalidArgumentError(Cat("ordering not supported between instances of '",
                                        TypeName(a), "' and '", TypeName(b), "'"));
}

absl::Status AppendJson(const Value& v, const JsonOptions& options, size_t limit,
                        std::string* out) {
  return AppendJsonImpl(v, options, 0, limit, out);
}

std::vector<std::string_view> CodePoints(std::string_view s) {
  std::vector<std::string_view> out;
  for (size_t i = 0; i < s.size();) {
    size_t len;
    DecodeAt(s, i, &len);
    out.push_back(s.substr(i, len));
    i += len;
  }
  return out;
}

size_t CodePointCount(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); ++n) {
    size_t len;
    DecodeAt(s, i, &len);
    i += len;
  }
  return n;
}

std::string_view PyStrip(std::string_view s, const std::optional<std::string>& chars, bool left,
                         bool right) {
  std::vector<std::string_view> set;
  if (chars.has_value()) set = CodePoints(*chars);
  auto strip_cp = [&](size_t at, size_t len) {
    if (!chars.has_value()) {
      size_t n;
      return IsPySpace(DecodeAt(s, at, &n));
    }
    return std::find(set.begin(), set.end(), s.substr(at, len)) != set.end();
  };
  size_t begin = 0, end = s.size();
  if (left) {
    while (begin < end) {
      size_t len;
      DecodeAt(s, begin, &len);
      if (!strip_cp(begin, len)) break;
      begin += len;
    }
  }
  if (right) {
    while (end > begin) {
      const size_t at = CodePointStartBefore(s, begin, end);
      if (!strip_cp(at, end - at)) break;
      end = at;
    }
  }
  return s.substr(begin, end - begin);
}

std::vector<std::string> PySplit(std::string_view s, const std::optional<std::string>& sep,
                                 int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep.has_value()) {
    size_t pos = 0;
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      const size_t hit = s.find(*sep, pos);
      if (hit == std::string_view::npos) break;
      out.emplace_back(s.substr(pos, hit - pos));
      pos = hit + sep->size();
    }
    out.emplace_back(s.substr(pos));
    return out;
  }
  // Runs of whitespace separate; leading/trailing whitespace yields no empty strings.
  auto space_at = [&](size_t i, size_t* len) { return IsPySpace(DecodeAt(s, i, len)); };
  size_t i = 0, len = 0;
  while (i < s.size()) {
    while (i < s.size() && space_at(i, &len)) i += len;
    if (i == s.size()) break;
    const size_t start = i;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      out.emplace_back(PyStrip(s.substr(start), std::nullopt, false, true));
      break;
    }
    while (i < s.size() && !space_at(i, &len)) i += len;
    out.emplace_back(s.substr(start, i - start));
  }
  return out;
}

std::string AsciiLower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

std::string AsciiUpper(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  }
  return out;
}

std::string PyCapitalize(std::string_view s) {
  std::string out = AsciiLower(s);
  if (!out.empty() && out[0] >= 'a' && out[0] <= 'z') out[0] = static_cast<char>(out[0] - 32);
  return out;
}

std::string PyTitle(std::string_view s) {
  std::string out(s);
  bool prev_cased = false;
  for (char& c : out) {
    const bool lower = c >= 'a' && c <= 'z';
    const bool upper = c >= 'A' && c <= 'Z';
    if (lower && !prev_cased) c = static_cast<char>(c - 32);
    if (upper && prev_cased) c = static_cast<char>(c + 32);
    // Non-ASCII bytes count as letters so a word's ASCII tail is not capitalized.
    prev_cased = lower || upper || static_cast<unsigned char>(c) >= 0x80;
  }
  return out;
}

}  // namespace kvrm::jinja
