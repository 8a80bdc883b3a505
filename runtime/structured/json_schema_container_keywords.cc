#include "runtime/structured/json_schema_container_keywords.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kvrm::structured::json_schema_internal {
namespace {

// Bounds on the work one schema can cause (it comes from a request): per object, and prefixItems
// per array.
constexpr size_t kMaxProperties = 256;

// prefixItems / items / additionalItems of one schema object.
absl::StatusOr<ItemSchemas> ReadItemSchemas(const Loc& m) {
  const OJson& s = *m.schema;
  ItemSchemas p;
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
  return p;
}

// The listed keys, in first-listed order, each once.
class PropertyList {
 public:
  // The entry for `key`, added at the end if new. INVALID_ARGUMENT (naming `pointer`) past
  // kMaxProperties keys.
  absl::StatusOr<ListedProperty*> Get(const std::string& key, const std::string& pointer) {
    auto [it, inserted] = index_.emplace(key, properties_.size());
    if (inserted) properties_.push_back(ListedProperty{key, {}, false});
    if (properties_.size() > kMaxProperties) {
      return SchemaError(pointer, absl::StrCat("more than ", kMaxProperties, " properties"));
    }
    return &properties_[it->second];
  }
  std::vector<ListedProperty> Take() { return std::move(properties_); }

 private:
  std::vector<ListedProperty> properties_;
  std::map<std::string, size_t> index_;
};

absl::Status ReadProperties(const Conj& conj, PropertyList& list) {
  for (const Loc& m : conj) {
    if (!m.schema->is_object()) continue;
    auto it = m.schema->find("properties");
    if (it == m.schema->end()) continue;
    const std::string pointer = Child(m.pointer, "properties");
    if (!it->is_object()) return SchemaError(pointer, "must be an object of schemas");
    for (auto p = it->begin(); p != it->end(); ++p) {
      ASSIGN_OR_RETURN(ListedProperty* const property, list.Get(p.key(), pointer));
      property->schemas.push_back(Loc{&p.value(), Child(pointer, p.key())});
    }
  }
  return absl::OkStatus();
}

absl::Status ReadRequired(const Conj& conj, PropertyList& list) {
  for (const Loc& m : conj) {
    if (!m.schema->is_object()) continue;
    auto it = m.schema->find("required");
    if (it == m.schema->end()) continue;
    const std::string pointer = Child(m.pointer, "required");
    if (!it->is_array()) return SchemaError(pointer, "must be an array of strings");
    size_t j = 0;
    for (const OJson& key : *it) {
      if (!key.is_string()) return SchemaError(Child(pointer, j), "must be a string");
      ASSIGN_OR_RETURN(ListedProperty* const property,
                       list.Get(key.get_ref<const std::string&>(), pointer));
      property->required = true;
      ++j;
    }
  }
  return absl::OkStatus();
}

// A schema's additionalProperties applies to the keys its own properties do not list.
void ApplyAdditionalProperties(const Conj& conj, ObjectKeywords& k) {
  for (const Loc& m : conj) {
    if (!m.schema->is_object()) continue;
    auto it = m.schema->find("additionalProperties");
    if (it == m.schema->end()) continue;
    const Loc schema{&*it, Child(m.pointer, "additionalProperties")};
    k.additional.push_back(schema);
    auto own = m.schema->find("properties");
    for (ListedProperty& p : k.properties) {
      if (own == m.schema->end() || !own->is_object() || !own->contains(p.key)) {
        p.schemas.push_back(schema);
      }
    }
  }
}

absl::Status ReadPropertyCounts(const Conj& conj, ObjectKeywords& k) {
  for (const Loc& m : conj) {
    if (!m.schema->is_object()) continue;
    if (auto it = m.schema->find("minProperties"); it != m.schema->end()) {
      ASSIGN_OR_RETURN(const uint64_t n, ReadCount(*it, Child(m.pointer, "minProperties")));
      if (n > k.min_properties) {
        k.min_properties = n;
        k.min_pointer = Child(m.pointer, "minProperties");
      }
    }
    if (auto it = m.schema->find("maxProperties"); it != m.schema->end()) {
      ASSIGN_OR_RETURN(const uint64_t n, ReadCount(*it, Child(m.pointer, "maxProperties")));
      if (!k.max_properties || n < *k.max_properties) {
        k.max_properties = n;
        k.max_pointer = Child(m.pointer, "maxProperties");
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ArrayKeywords> ReadArrayKeywords(const Conj& conj) {
  ArrayKeywords k;
  for (const Loc& m : conj) {
    if (!m.schema->is_object()) continue;
    const OJson& s = *m.schema;
    ASSIGN_OR_RETURN(ItemSchemas p, ReadItemSchemas(m));
    if (auto it = s.find("minItems"); it != s.end()) {
      ASSIGN_OR_RETURN(const uint64_t n, ReadCount(*it, Child(m.pointer, "minItems")));
      if (n > k.min_items) {
        k.min_items = n;
        k.min_pointer = Child(m.pointer, "minItems");
      }
    }
    if (auto it = s.find("maxItems"); it != s.end()) {
      ASSIGN_OR_RETURN(const uint64_t n, ReadCount(*it, Child(m.pointer, "maxItems")));
      k.max_items = std::min(n, k.max_items.value_or(n));
    }
    if (auto it = s.find("uniqueItems"); it != s.end()) {
      if (!it->is_boolean()) {
        return SchemaError(Child(m.pointer, "uniqueItems"), "must be a boolean");
      }
      if (it->get<bool>()) k.unique_pointer = Child(m.pointer, "uniqueItems");
    }
    if (p.prefix != nullptr && p.prefix->size() > kMaxProperties) {
      return SchemaError(p.prefix_pointer,
                         absl::StrCat("more than ", kMaxProperties, " positions"));
    }
    k.parts.push_back(std::move(p));
  }
  return k;
}

absl::StatusOr<ObjectKeywords> ReadObjectKeywords(const Conj& conj) {
  ObjectKeywords k;
  PropertyList list;
  RETURN_IF_ERROR(ReadProperties(conj, list));
  RETURN_IF_ERROR(ReadRequired(conj, list));
  k.properties = list.Take();
  ApplyAdditionalProperties(conj, k);
  RETURN_IF_ERROR(ReadPropertyCounts(conj, k));
  return k;
}

}  // namespace kvrm::structured::json_schema_internal
