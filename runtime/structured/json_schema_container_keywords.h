// The array and object keywords of the schemas in force at one place, read and combined for the
// JSON Schema translator (json_schema.cc), which then translates the subschemas they name and
// assembles the container.
//
// Reading checks each keyword's shape and bounds the work (at most 256 positions or properties),
// failing with INVALID_ARGUMENT naming the keyword's pointer; it translates nothing, and leaves
// the decisions that need the counts (an empty language, a count not supported) to the caller.
#ifndef KVRM_RUNTIME_STRUCTURED_JSON_SCHEMA_CONTAINER_KEYWORDS_H_
#define KVRM_RUNTIME_STRUCTURED_JSON_SCHEMA_CONTAINER_KEYWORDS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/structured/json_schema_keywords.h"

namespace kvrm::structured::json_schema_internal {

// One schema's item keywords: the positional schemas (prefixItems, or draft 7's items array) and
// the schema of the items after them (items, or draft 7's additionalItems); null where absent.
struct ItemSchemas {
  const OJson* prefix = nullptr;  // an array of schemas
  std::string prefix_pointer;
  const OJson* rest = nullptr;
  std::string rest_pointer;
};

struct ArrayKeywords {
  std::vector<ItemSchemas> parts;     // one per schema object in force, in order
  uint64_t min_items = 0;             // the largest minItems (0 if none)
  std::optional<uint64_t> max_items;  // the smallest maxItems
  std::string min_pointer;            // of that minItems
  std::string unique_pointer;         // of a "uniqueItems": true, empty if none
};
absl::StatusOr<ArrayKeywords> ReadArrayKeywords(const Conj& conj);

// A key the schemas list (in "properties" or "required"), with every schema its value must
// satisfy: its "properties" entries, and the additionalProperties of schemas that do not list it.
struct ListedProperty {
  std::string key;
  Conj schemas;
  bool required = false;
};

struct ObjectKeywords {
  // In the order the schemas list them: properties first (schema by schema), then keys only
  // "required" names.
  std::vector<ListedProperty> properties;
  Conj additional;              // every additionalProperties in force, for keys nothing lists
  uint64_t min_properties = 0;  // the largest minProperties
  std::optional<uint64_t> max_properties;  // the smallest maxProperties
  std::string min_pointer, max_pointer;
};
absl::StatusOr<ObjectKeywords> ReadObjectKeywords(const Conj& conj);

}  // namespace kvrm::structured::json_schema_internal

#endif  // KVRM_RUNTIME_STRUCTURED_JSON_SCHEMA_CONTAINER_KEYWORDS_H_
