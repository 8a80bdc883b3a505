// The vocabulary of the JSON Schema translation (json_schema.h): the schemas in force at one place
// (Loc, Conj), JSON pointers and the INVALID_ARGUMENT errors that name them, what each keyword is
// (translated, ignored, or refused) and the types it implies, and the readers of keyword values
// ("type", numeric bounds, counts).
//
// Readers check what they read and fail with SchemaError naming the pointer they are given, which
// is the keyword's own; they never throw (nlohmann accessors are called on checked types only).
#ifndef KVRM_RUNTIME_STRUCTURED_JSON_SCHEMA_KEYWORDS_H_
#define KVRM_RUNTIME_STRUCTURED_JSON_SCHEMA_KEYWORDS_H_

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace kvrm::structured::json_schema_internal {

// Insertion-ordered, so that properties come out in the order the schema lists them.
using OJson = nlohmann::ordered_json;

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
  uint8_t done = 0;  // DoneBits
};
// All subschemas that the value at one place must satisfy (allOf, $ref and siblings, anyOf
// branch and siblings, properties and additionalProperties of several schemas).
using Conj = std::vector<Loc>;

// JSON pointers one step below `pointer` (the key escaped as ~0 ~1).
std::string Child(const std::string& pointer, const std::string& key);
std::string Child(const std::string& pointer, size_t index);

// INVALID_ARGUMENT "JSON schema <pointer>: <message>" ("(root)" for the empty pointer).
absl::Status SchemaError(const std::string& pointer, absl::string_view message);

// Compact serialization; invalid UTF-8 (only possible in a Json built in code) is replaced
// rather than thrown on.
std::string Dump(const OJson& v);

// Whether `k` is one of `names`.
bool IsOneOf(const std::string& k, std::initializer_list<const char*> names);

enum class KeywordKind {
  kIgnored,      // annotations and unknown keywords, as validators ignore them
  kHandled,      // translated
  kUnsupported,  // an assertion not translated: the schema is refused
};
KeywordKind Classify(const std::string& k);

// The types a type-specific keyword applies to (a schema without "type" is taken to mean those);
// 0 for the others.
uint8_t KeywordTypes(const std::string& k);

// A "type" keyword's value (one name or a non-empty list) as TypeBits.
absl::StatusOr<uint8_t> ParseType(const OJson& v, const std::string& pointer);

// A numeric keyword's value, exact for integers.
struct JsonNumberValue {
  bool integral = false;  // `integer` holds the value
  __int128 integer = 0;
  double real = 0;  // otherwise
};
// Finite numbers only; a draft 4 boolean exclusiveMinimum/exclusiveMaximum is refused here.
absl::StatusOr<JsonNumberValue> ReadNumber(const OJson& v, const std::string& pointer);
// The integers next to a value; magnitudes past 1e30 saturate at +-2^100.
__int128 FloorOf(const JsonNumberValue& n);
__int128 CeilOf(const JsonNumberValue& n);

// A count keyword's value (minLength, maxItems, ...): a non-negative integer, 2.0 included.
absl::StatusOr<uint64_t> ReadCount(const OJson& v, const std::string& pointer);

}  // namespace kvrm::structured::json_schema_internal

#endif  // KVRM_RUNTIME_STRUCTURED_JSON_SCHEMA_KEYWORDS_H_
