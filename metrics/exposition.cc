#include "metrics/exposition.h"

#include <charconv>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace kvrm {

std::string EscapeHelp(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string EscapeLabelValue(absl::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  // Integral values up to 2^53 print exactly without an exponent (counts, bytes).
  if (value == std::trunc(value) && std::fabs(value) < 9007199254740992.0) {
    return absl::StrCat(static_cast<int64_t>(value));
  }
  char buf[32];
  // Shortest representation that parses back to the same double.
  const std::to_chars_result r = std::to_chars(buf, buf + sizeof(buf), value);
  return std::string(buf, r.ptr);
}

namespace {

bool IsNameChar(char c, bool first, bool allow_colon) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') return true;
  if (allow_colon && c == ':') return true;
  return !first && c >= '0' && c <= '9';
}

bool IsValidName(absl::string_view name, bool allow_colon) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    if (!IsNameChar(name[i], i == 0, allow_colon)) return false;
  }
  return true;
}

}  // namespace

bool IsValidMetricName(absl::string_view name) { return IsValidName(name, true); }

bool IsValidLabelName(absl::string_view name) {
  // Names starting with "__" are reserved for Prometheus' internal use.
  return IsValidName(name, false) && name.substr(0, 2) != "__";
}

void AppendHeader(std::string* out, absl::string_view name, absl::string_view help,
                  absl::string_view type) {
  absl::StrAppend(out, "# HELP ", name, " ", EscapeHelp(help), "\n# TYPE ", name, " ", type, "\n");
}

void AppendSample(std::string* out, absl::string_view name,
                  absl::Span<const std::string> label_names,
                  absl::Span<const std::string> label_values, absl::string_view le, double value) {
  out->append(name.data(), name.size());
  const bool braces = !label_names.empty() || !le.empty();
  if (braces) out->push_back('{');
  for (size_t i = 0; i < label_names.size(); ++i) {
    if (i > 0) out->push_back(',');
    absl::StrAppend(out, label_names[i], "=\"", EscapeLabelValue(label_values[i]), "\"");
  }
  if (!le.empty()) {
    if (!label_names.empty()) out->push_back(',');
    absl::StrAppend(out, "le=\"", le, "\"");
  }
  if (braces) out->push_back('}');
  absl::StrAppend(out, " ", FormatValue(value), "\n");
}

}  // namespace kvrm
