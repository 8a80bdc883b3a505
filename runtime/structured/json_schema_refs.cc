#include "runtime/structured/json_schema_refs.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kvrm::structured::json_schema_internal {
namespace {

int HexValue(char c) {
  return c >= '0' && c <= '9'   ? c - '0'
         : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                : -1;
}

// The reference's fragment (after the "#"), %XX-decoded.
absl::StatusOr<std::string> DecodeFragment(const std::string& text, const std::string& pointer) {
  std::string fragment;
  for (size_t i = 1; i < text.size(); ++i) {
    if (text[i] != '%') {
      fragment.push_back(text[i]);
      continue;
    }
    if (i + 2 >= text.size() || HexValue(text[i + 1]) < 0 || HexValue(text[i + 2]) < 0) {
      return SchemaError(pointer, absl::StrCat("\"", text, "\": bad %-escape"));
    }
    fragment.push_back(static_cast<char>(HexValue(text[i + 1]) * 16 + HexValue(text[i + 2])));
    i += 2;
  }
  return fragment;
}

// One reference token of a JSON pointer, ~0 and ~1 decoded.
absl::StatusOr<std::string> DecodeToken(const std::string& raw, const std::string& text,
                                        const std::string& pointer) {
  std::string token;
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] != '~') {
      token.push_back(raw[i]);
    } else if (i + 1 < raw.size() && (raw[i + 1] == '0' || raw[i + 1] == '1')) {
      token.push_back(raw[++i] == '0' ? '~' : '/');
    } else {
      return SchemaError(pointer, absl::StrCat("\"", text, "\": bad ~ escape in the JSON pointer"));
    }
  }
  return token;
}

// The member `token` of an object, or the element of an array at a decimal index; null if none.
const OJson* Step(const OJson& node, const std::string& token) {
  if (node.is_object()) {
    auto it = node.find(token);
    if (it != node.end()) return &*it;
  } else if (node.is_array() && !token.empty() && token.size() < 10 &&
             std::all_of(token.begin(), token.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    size_t index = 0;
    for (char c : token) index = index * 10 + static_cast<size_t>(c - '0');
    if (index < node.size()) return &node[index];
  }
  return nullptr;
}

}  // namespace

absl::StatusOr<Loc> ResolveRef(const OJson& root, const OJson& ref, const std::string& pointer) {
  if (!ref.is_string()) return SchemaError(pointer, "must be a string");
  const std::string& text = ref.get_ref<const std::string&>();
  if (text.empty() || text[0] != '#') {
    return SchemaError(pointer,
                       absl::StrCat("\"", text,
                                    "\": only references into this schema (\"#\", "
                                    "\"#/$defs/...\", \"#/definitions/...\") are supported"));
  }
  // The fragment is URI-encoded: %XX first, then the JSON pointer's ~0 ~1.
  const absl::StatusOr<std::string> decoded = DecodeFragment(text, pointer);
  if (!decoded.ok()) return decoded.status();
  const std::string& fragment = *decoded;
  if (!fragment.empty() && fragment[0] != '/') {
    return SchemaError(
        pointer, absl::StrCat("\"", text, "\": anchors are not supported, only JSON pointers"));
  }
  const OJson* node = &root;
  size_t pos = 0;
  while (pos < fragment.size()) {
    const size_t next = fragment.find('/', pos + 1);
    const std::string raw =
        fragment.substr(pos + 1, next == std::string::npos ? std::string::npos : next - pos - 1);
    ASSIGN_OR_RETURN(const std::string token, DecodeToken(raw, text, pointer));
    const OJson* child = Step(*node, token);
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

}  // namespace kvrm::structured::json_schema_internal
