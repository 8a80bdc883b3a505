// The scalar values of the JSON Schema translation (json_schema.h): the language of the strings,
// integers or numbers that every schema in force at one place accepts, from their string keywords
// (minLength, maxLength, pattern, format) or numeric ones (minimum, maximum, exclusiveMinimum,
// exclusiveMaximum).
//
// Each reads only its own type's keywords and ignores the rest (the translator dispatches by
// type). Nothing() when the keywords leave no value; INVALID_ARGUMENT naming the keyword's pointer
// for a malformed value or a combination not translated (see json_schema.h for which).
#ifndef KVRM_RUNTIME_STRUCTURED_JSON_SCHEMA_SCALARS_H_
#define KVRM_RUNTIME_STRUCTURED_JSON_SCHEMA_SCALARS_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "runtime/structured/json_schema_keywords.h"
#include "runtime/structured/regex_ast.h"

namespace kvrm::structured::json_schema_internal {

// A JSON string, quotes included. Lengths count characters; a maxLength above `max_count` is
// lowered to it, a minLength above it refused (the caller passes kJsonSchemaMaxCount).
absl::StatusOr<Regex> StringValue(const Conj& conj, int32_t max_count);
// A JSON integer, exact within int64 (bounds beyond it are narrowed to it).
absl::StatusOr<Regex> IntegerValue(const Conj& conj);
// A JSON number (integers included); bounds must be integers within int64.
absl::StatusOr<Regex> NumberValue(const Conj& conj);

}  // namespace kvrm::structured::json_schema_internal

#endif  // KVRM_RUNTIME_STRUCTURED_JSON_SCHEMA_SCALARS_H_
