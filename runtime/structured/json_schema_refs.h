// "$ref" resolution for the JSON Schema translation (json_schema.h): references into the schema
// document itself, "#" followed by a JSON pointer ("#", "#/$defs/X", "#/definitions/X", any other
// path, array indices included), URI-decoded (%XX) and then pointer-decoded (~0 ~1).
//
// Remote references and anchors ("#name") are refused with INVALID_ARGUMENT, as is a pointer that
// does not resolve; errors name `pointer`, the "$ref" keyword's own location.
#ifndef KVRM_RUNTIME_STRUCTURED_JSON_SCHEMA_REFS_H_
#define KVRM_RUNTIME_STRUCTURED_JSON_SCHEMA_REFS_H_

#include <string>

#include "absl/status/statusor.h"
#include "runtime/structured/json_schema_keywords.h"

namespace kvrm::structured::json_schema_internal {

// The subschema of `root` that `ref` (the value of a "$ref" at `pointer`) names, located at its
// decoded JSON pointer; it points into `root`, which must outlive it.
absl::StatusOr<Loc> ResolveRef(const OJson& root, const OJson& ref, const std::string& pointer);

}  // namespace kvrm::structured::json_schema_internal

#endif  // KVRM_RUNTIME_STRUCTURED_JSON_SCHEMA_REFS_H_
