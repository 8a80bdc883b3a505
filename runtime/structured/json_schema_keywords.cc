#include "runtime/structured/json_schema_keywords.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kvrm::structured::json_schema_internal {
namespace {

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

constexpr __int128 kHuge = static_cast<__int128>(1) << 100;

}  // namespace

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

std::string Dump(const OJson& v) { return v.dump(-1, ' ', false, OJson::error_handler_t::replace); }

bool IsOneOf(const std::string& k, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (k == name) return true;
  }
  return false;
}

KeywordKind Classify(const std::string& k) {
  if (IsOneOf(k, {"type",
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
  if (IsOneOf(k, {"not",
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

uint8_t KeywordTypes(const std::string& k) {
  if (IsOneOf(k, {"minLength", "maxLength", "pattern", "format"})) return kString;
  if (IsOneOf(k, {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})) {
    return kNumber | kInteger;
  }
  if (IsOneOf(k, {"properties", "required", "additionalProperties", "minProperties",
                  "maxProperties"})) {
    return kObject;
  }
  if (IsOneOf(k,
              {"items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems"})) {
    return kArray;
  }
  return 0;
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

}  // namespace kvrm::structured::json_schema_internal
