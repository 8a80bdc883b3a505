#include "runtime/structured/json_schema.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "runtime/structured/automaton.h"
#include "runtime/structured/json_number_ranges.h"
#include "runtime/structured/json_schema_container_keywords.h"
#include "runtime/structured/json_schema_keywords.h"
#include "runtime/structured/json_schema_refs.h"
#include "runtime/structured/json_schema_scalars.h"
#include "runtime/structured/json_strings.h"

// The schema walker: the schemas in force at each place (a conjunction), expanded through $ref
// and allOf, split by anyOf/oneOf, then translated by type. Strings and numbers are leaves
// (json_schema_scalars.h); arrays and objects recurse into their items and properties, whose
// keywords json_schema_container_keywords.h reads.
namespace kvrm::structured {
namespace json_schema_internal {
namespace {

// Bounds on the work one schema can cause (it comes from a request).
constexpr size_t kMaxEnumValues = 1024;  // per enum keyword
constexpr size_t kMaxEnumBytes = size_t{1} << 20;
constexpr size_t kMaxConjunction = 64;         // schemas in force at one place (allOf, $ref)
constexpr size_t kMaxBranches = 256;           // per anyOf / oneOf
constexpr int64_t kMaxSteps = 20000;           // subschema translations in all
// What Dfa::Compile accepts (DfaLimits::max_nfa_states): alternatives past it fail early.
constexpr int64_t kMaxTranslatedSize = DfaLimits{}.max_nfa_states;
constexpr int32_t kMaxNestedSubschemas = 256;  // recursion of the translator
constexpr int32_t kMaxDepthOption = 64;
// Enum values are checked against their sibling keywords with an automaton each: bounded.
constexpr int32_t kMaxEnumChecks = 128;
constexpr int32_t kMaxEnumCheckStates = 5000;

struct Ctx {
  int32_t level = 0;      // containers around the value being translated
  int32_t recursion = 0;  // re-entries of a $ref target on this path
  int32_t nesting = 0;    // translator recursion
};

Regex L(const char* text) { return Literal(text); }

// --- Conjunctions -----------------------------------------------------------------------------

// The allOf of conj[i] (once): its schemas join the conjunction.
absl::Status AddAllOf(Conj& conj, size_t i) {
  if (conj[i].done & kAllOfDone) return absl::OkStatus();
  conj[i].done |= kAllOfDone;
  const OJson& s = *conj[i].schema;
  auto it = s.find("allOf");
  if (it == s.end()) return absl::OkStatus();
  const std::string pointer = Child(conj[i].pointer, "allOf");
  if (!it->is_array() || it->empty()) {
    return SchemaError(pointer, "must be a non-empty array of schemas");
  }
  size_t j = 0;
  for (const OJson& sub : *it) conj.push_back(Loc{&sub, Child(pointer, j++)});
  return absl::OkStatus();
}

// Refuses the keywords whose constraints are not translated (KeywordKind::kUnsupported).
absl::Status CheckSupported(const Conj& conj) {
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
  return absl::OkStatus();
}

// --- Types and enums --------------------------------------------------------------------------

// What the "type", "enum" and "const" keywords in force say.
struct TypeAndEnum {
  uint8_t types = kAllTypes;  // the allowed types, narrowed by every "type"
  bool explicit_type = false;
  uint8_t implied = 0;  // the types the type-specific keywords apply to
  // The values every enum/const in force holds (each once), if any is in force.
  std::optional<std::vector<const OJson*>> candidates;
  std::string enum_pointer;  // of the first enum/const
};

// The values one "enum" (k == "enum") or "const" keyword allows.
absl::StatusOr<std::vector<const OJson*>> EnumKeywordValues(const std::string& k,
                                                            const OJson& value,
                                                            const std::string& pointer) {
  std::vector<const OJson*> values;
  if (k == "enum") {
    if (!value.is_array()) return SchemaError(pointer, "must be an array");
    if (value.size() > kMaxEnumValues) {
      return SchemaError(pointer, absl::StrCat("more than ", kMaxEnumValues, " values"));
    }
    for (const OJson& v : value) values.push_back(&v);
  } else {
    values.push_back(&value);
  }
  return values;
}

// Several enum/const in force: only values in all of them, without duplicates.
std::vector<const OJson*> CommonValues(const std::optional<std::vector<const OJson*>>& candidates,
                                       const std::vector<const OJson*>& values) {
  std::vector<const OJson*> kept;
  for (const OJson* v : candidates ? *candidates : values) {
    const bool in_all = !candidates || std::any_of(values.begin(), values.end(),
                                                   [&](const OJson* w) { return *w == *v; });
    const bool duplicate =
        std::any_of(kept.begin(), kept.end(), [&](const OJson* w) { return *w == *v; });
    if (in_all && !duplicate) kept.push_back(v);
  }
  return kept;
}

// With `ignore_enum`, enum and const are not read.
absl::StatusOr<TypeAndEnum> ReadTypeAndEnum(const Conj& conj, bool ignore_enum, uint8_t allowed) {
  TypeAndEnum r;
  r.types = allowed;
  for (const Loc& m : conj) {
    if (!m.schema->is_object()) continue;
    for (auto it = m.schema->begin(); it != m.schema->end(); ++it) {
      const std::string& k = it.key();
      r.implied |= KeywordTypes(k);
      if (k == "type") {
        ASSIGN_OR_RETURN(const uint8_t t, ParseType(it.value(), Child(m.pointer, k)));
        r.types &= t;
        r.explicit_type = true;
      } else if ((k == "enum" || k == "const") && !ignore_enum) {
        const std::string pointer = Child(m.pointer, k);
        ASSIGN_OR_RETURN(const std::vector<const OJson*> values,
                         EnumKeywordValues(k, it.value(), pointer));
        r.candidates = CommonValues(r.candidates, values);
        if (r.enum_pointer.empty()) r.enum_pointer = pointer;
      }
    }
  }
  return r;
}

// The types of a value as an enum member. Integers are checked as integers (exact bounds); 2.0 is
// an integer too, but written as a number.
uint8_t ValueTypes(const OJson& v) {
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
}

// The keywords in force beside enum/const: whether any of them constrains the values beyond
// their "type"s, and those types.
struct EnumSiblings {
  bool constrained = false;
  uint8_t types = kAllTypes;
};

absl::StatusOr<EnumSiblings> ReadEnumSiblings(const Conj& conj) {
  EnumSiblings r;
  for (const Loc& m : conj) {
    if (!m.schema->is_object()) continue;
    for (auto it = m.schema->begin(); it != m.schema->end(); ++it) {
      if (it.key() == "type") {
        ASSIGN_OR_RETURN(const uint8_t t, ParseType(it.value(), Child(m.pointer, "type")));
        r.types &= t;
      } else if (Classify(it.key()) == KeywordKind::kHandled &&
                 !IsOneOf(it.key(), {"enum", "const", "$ref", "allOf", "anyOf", "oneOf"})) {
        r.constrained = true;
      }
    }
  }
  return r;
}

// The automaton that checks enum values against their siblings' (compact) language.
// `work` is the translation's: its enum checks share one determinising budget.
absl::StatusOr<Dfa> CompileEnumCheck(const Regex& language, const std::string& pointer,
                                     int64_t* work) {
  DfaLimits limits;
  limits.max_states = kMaxEnumCheckStates;
  limits.work = work;
  absl::StatusOr<Dfa> dfa = Dfa::Compile(language, limits);
  if (!dfa.ok()) {
    return SchemaError(pointer, absl::StrCat("cannot check the values against the other keywords: ",
                                             dfa.status().message()));
  }
  return dfa;
}

// The values of `types` (and in `check`'s language, if given), as literals of their compact form.
absl::StatusOr<Regex> EnumLiterals(const std::vector<const OJson*>& values, uint8_t types,
                                   const Dfa* check, const std::string& pointer) {
  std::vector<Regex> options;
  size_t bytes = 0;
  for (const OJson* v : values) {
    std::string text = Dump(*v);
    if ((ValueTypes(*v) & types) == 0 || (check != nullptr && !check->Matches(text))) continue;
    bytes += text.size();
    if (bytes > kMaxEnumBytes) {
      return SchemaError(pointer,
                         absl::StrCat("values longer than ", kMaxEnumBytes, " bytes in all"));
    }
    options.push_back(Literal(text));
  }
  return Alt(std::move(options));
}

// --- Containers -------------------------------------------------------------------------------

// The schemas in force for item `j` of an array (a positional one, or the rest's).
Conj ItemSchemasAt(const std::vector<ItemSchemas>& parts, int64_t j) {
  Conj c;
  for (const ItemSchemas& p : parts) {
    if (p.prefix != nullptr && static_cast<size_t>(j) < p.prefix->size()) {
      c.push_back(Loc{&(*p.prefix)[static_cast<size_t>(j)],
                      Child(p.prefix_pointer, static_cast<size_t>(j))});
    } else if (p.rest != nullptr) {
      c.push_back(Loc{p.rest, p.rest_pointer});
    }
  }
  return c;
}

// The schemas in force for the items past every positional one.
Conj RestItemSchemas(const std::vector<ItemSchemas>& parts) {
  Conj c;
  for (const ItemSchemas& p : parts) {
    if (p.rest != nullptr) c.push_back(Loc{p.rest, p.rest_pointer});
  }
  return c;
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

  // Translate's steps. Booleans, $ref and allOf: everything they bring is in force here too;
  // false when the conjunction accepts nothing (a false schema, a recursion past max_depth).
  absl::StatusOr<bool> ExpandConjunction(Conj& conj, Ctx& ctx);
  absl::StatusOr<bool> AddRefTarget(Conj& conj, size_t i, Ctx& ctx);
  // anyOf / oneOf: one alternative per branch of the first not yet split, each with everything
  // else in force; nullopt when none is left.
  absl::StatusOr<std::optional<Regex>> SplitAlternatives(Conj& conj, Ctx ctx);

  // The keywords of `conj` other than the combinators (already applied). With `ignore_enum`,
  // also other than enum/const, for the types in `allowed` only, without inferring types.
  absl::StatusOr<Regex> Base(const Conj& conj, Ctx ctx, bool ignore_enum,
                             uint8_t allowed = kAllTypes);
  // The values of each type in `types`.
  absl::StatusOr<Regex> TypedValues(const Conj& conj, Ctx ctx, uint8_t types);
  absl::StatusOr<Regex> EnumValues(const Conj& conj, Ctx ctx,
                                   const std::vector<const OJson*>& values,
                                   const std::string& pointer);
  // The language of the other keywords of `conj` for `types`, without whitespace.
  absl::StatusOr<Regex> CompactSiblings(const Conj& conj, Ctx ctx, uint8_t types,
                                        const std::string& pointer);
  absl::StatusOr<Regex> ArrayValue(const Conj& conj, Ctx ctx);
  // "[" ... "]" from the translated items: `element` for the positional ones, `rest` after them;
  // between `mn` and `hi` items (hi < 0: unbounded).
  Regex ArrayOf(const std::vector<Regex>& element, const Regex& rest, int64_t mn, int64_t hi) const;
  absl::StatusOr<Regex> ObjectValue(const Conj& conj, Ctx ctx);
  // An object whose schemas list no keys, and one whose schemas do; `inner` is the members' Ctx.
  absl::StatusOr<Regex> FreeFormObject(const ObjectKeywords& k, Ctx inner);
  absl::StatusOr<Regex> ListedObject(const ObjectKeywords& k, Ctx inner);

  const OJson& root_;
  const int32_t max_depth_;
  Regex ws_;
  bool compact_ = false;  // ws_ is Empty() while enum values are checked against their siblings
  std::vector<Regex> any_cache_[2];      // AnyValue by budget, [compact_]
  std::vector<const OJson*> ref_stack_;  // $ref targets being expanded on the current path
  int64_t steps_ = 0;
  int32_t enum_checks_ = 0;
  int64_t enum_check_work_ = 0;  // DfaLimits::work of every enum check together
};

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

  ASSIGN_OR_RETURN(const bool satisfiable, ExpandConjunction(conj, ctx));
  if (!satisfiable) return Nothing();
  ASSIGN_OR_RETURN(std::optional<Regex> alternatives, SplitAlternatives(conj, ctx));
  if (alternatives) return *std::move(alternatives);
  RETURN_IF_ERROR(CheckSupported(conj));
  return Base(conj, ctx, /*ignore_enum=*/false);
}

absl::StatusOr<bool> Translator::ExpandConjunction(Conj& conj, Ctx& ctx) {
  for (size_t i = 0; i < conj.size(); ++i) {
    const OJson& s = *conj[i].schema;
    if (s.is_boolean()) {
      if (!s.get<bool>()) return false;
      continue;
    }
    if (!s.is_object()) {
      return SchemaError(conj[i].pointer, "a schema must be an object or a boolean");
    }
    ASSIGN_OR_RETURN(const bool satisfiable, AddRefTarget(conj, i, ctx));
    if (!satisfiable) return false;
    RETURN_IF_ERROR(AddAllOf(conj, i));
    if (conj.size() > kMaxConjunction) {
      return SchemaError(conj[i].pointer,
                         absl::StrCat("more than ", kMaxConjunction,
                                      " schemas in force at one place (allOf, $ref)"));
    }
  }
  return true;
}

// The $ref of conj[i] (once): its target joins the conjunction.
absl::StatusOr<bool> Translator::AddRefTarget(Conj& conj, size_t i, Ctx& ctx) {
  if (conj[i].done & kRefDone) return true;
  conj[i].done |= kRefDone;
  const OJson& s = *conj[i].schema;
  auto it = s.find("$ref");
  if (it == s.end()) return true;
  ASSIGN_OR_RETURN(Loc target, ResolveRef(root_, *it, Child(conj[i].pointer, "$ref")));
  // In force already (and not split by its anyOf/oneOf on this path): adding it again changes
  // nothing. Otherwise it is a recursion, whose alternatives must be taken anew.
  const bool already = std::any_of(conj.begin(), conj.end(), [&](const Loc& l) {
    return l.schema == target.schema && (l.done & (kAnyOfDone | kOneOfDone)) == 0;
  });
  if (already) return true;
  if (std::find(ref_stack_.begin(), ref_stack_.end(), target.schema) != ref_stack_.end()) {
    // Recursion: unfold a bounded number of times, then drop this branch.
    if (ctx.recursion >= max_depth_) return false;
    ++ctx.recursion;
  }
  ref_stack_.push_back(target.schema);
  conj.push_back(std::move(target));
  return true;
}

absl::StatusOr<std::optional<Regex>> Translator::SplitAlternatives(Conj& conj, Ctx ctx) {
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
      int64_t size = 0;
      for (const OJson& branch : *it) {
        Conj with_branch = conj;
        with_branch.push_back(Loc{&branch, Child(pointer, j++)});
        ASSIGN_OR_RETURN(Regex option, Translate(std::move(with_branch), ctx));
        // Refused as soon as the alternatives together are past what an automaton may be built
        // from, not after translating every one ($ref'd branches multiply fast).
        size += option->size;
        if (size > kMaxTranslatedSize) {
          return SchemaError(pointer, absl::StrCat("schema too large: its alternatives need "
                                                   "more than ", kMaxTranslatedSize,
                                                   " automaton states"));
        }
        options.push_back(std::move(option));
      }
      return Alt(std::move(options));
    }
  }
  return std::nullopt;
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
  ASSIGN_OR_RETURN(const TypeAndEnum t, ReadTypeAndEnum(conj, ignore_enum, allowed));
  if (t.candidates) return EnumValues(conj, ctx, *t.candidates, t.enum_pointer);
  uint8_t types = t.types;
  if (!t.explicit_type) {
    // Checking enum values keeps every type: {"enum": ["a", 7], "maxLength": 3} holds 7.
    if (t.implied == 0 && !ignore_enum) return AnyValue(max_depth_ - ctx.level);
    if (!ignore_enum) types = t.implied;
  }
  return TypedValues(conj, ctx, types);
}

absl::StatusOr<Regex> Translator::TypedValues(const Conj& conj, Ctx ctx, uint8_t types) {
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
    ASSIGN_OR_RETURN(Regex r, StringValue(conj, kJsonSchemaMaxCount));
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
  ASSIGN_OR_RETURN(const EnumSiblings siblings, ReadEnumSiblings(conj));
  uint8_t value_types = 0;
  for (const OJson* v : values) value_types |= ValueTypes(*v);
  std::optional<Dfa> check;
  if (siblings.constrained) {
    // Only the values' own types: a smaller automaton to build.
    ASSIGN_OR_RETURN(const Regex rest,
                     CompactSiblings(conj, ctx, value_types & siblings.types, pointer));
    if (rest->kind == RegexNode::Kind::kNothing) return Nothing();
    ASSIGN_OR_RETURN(Dfa dfa, CompileEnumCheck(rest, pointer, &enum_check_work_));
    check.emplace(std::move(dfa));
  }
  return EnumLiterals(values, siblings.types, check ? &*check : nullptr, pointer);
}

absl::StatusOr<Regex> Translator::CompactSiblings(const Conj& conj, Ctx ctx, uint8_t types,
                                                  const std::string& pointer) {
  if (++enum_checks_ > kMaxEnumChecks) {
    return SchemaError(pointer, absl::StrCat("more than ", kMaxEnumChecks,
                                             " enum/const keywords with sibling constraints"));
  }
  const Regex saved_ws = ws_;
  const bool saved_compact = compact_;
  ws_ = Empty();
  compact_ = true;
  absl::StatusOr<Regex> rest = Base(conj, ctx, /*ignore_enum=*/true, types);
  ws_ = saved_ws;
  compact_ = saved_compact;
  return rest;
}

absl::StatusOr<Regex> Translator::ArrayValue(const Conj& conj, Ctx ctx) {
  ASSIGN_OR_RETURN(const ArrayKeywords a, ReadArrayKeywords(conj));
  if (a.max_items && a.min_items > *a.max_items) return Nothing();
  if (!a.unique_pointer.empty() && !(a.max_items && *a.max_items <= 1)) {
    return SchemaError(
        a.unique_pointer,
        "keyword \"uniqueItems\": true is not supported (its constraint could not be enforced)");
  }
  if (a.min_items > static_cast<uint64_t>(kJsonSchemaMaxCount)) {
    return SchemaError(a.min_pointer,
                       absl::StrCat("minItems above ", kJsonSchemaMaxCount, " is not supported"));
  }
  const int64_t mn = static_cast<int64_t>(a.min_items);
  const int64_t hi =
      a.max_items ? static_cast<int64_t>(std::min<uint64_t>(*a.max_items, kJsonSchemaMaxCount))
                  : -1;
  int64_t k = 0;
  for (const ItemSchemas& p : a.parts) {
    if (p.prefix != nullptr) k = std::max<int64_t>(k, static_cast<int64_t>(p.prefix->size()));
  }
  if (hi >= 0) k = std::min(k, hi);  // positions past maxItems are never reached

  Ctx inner = ctx;
  ++inner.level;
  std::vector<Regex> element(k);
  for (int64_t j = 0; j < k; ++j) {
    ASSIGN_OR_RETURN(element[j], Translate(ItemSchemasAt(a.parts, j), inner));
  }
  Regex rest = Nothing();
  if (hi < 0 || hi > k) {
    ASSIGN_OR_RETURN(rest, Translate(RestItemSchemas(a.parts), inner));
  }
  return ArrayOf(element, rest, mn, hi);
}

Regex Translator::ArrayOf(const std::vector<Regex>& element, const Regex& rest, int64_t mn,
                          int64_t hi) const {
  const int64_t k = static_cast<int64_t>(element.size());
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
  ASSIGN_OR_RETURN(const ObjectKeywords k, ReadObjectKeywords(conj));
  if (k.max_properties && k.min_properties > *k.max_properties) return Nothing();
  Ctx inner = ctx;
  ++inner.level;
  if (k.properties.empty()) return FreeFormObject(k, inner);
  return ListedObject(k, inner);
}

// Any keys, values under every additionalProperties in force. Keys are not kept apart, and a
// repeated key counts once where the object is read.
absl::StatusOr<Regex> Translator::FreeFormObject(const ObjectKeywords& k, Ctx inner) {
  if (k.min_properties > 1) {
    return SchemaError(k.min_pointer,
                       "minProperties above 1 is not supported without listed properties");
  }
  const int64_t mn = static_cast<int64_t>(k.min_properties);
  const int64_t mx =
      k.max_properties
          ? static_cast<int64_t>(std::min<uint64_t>(*k.max_properties, kJsonSchemaMaxCount))
          : -1;
  ASSIGN_OR_RETURN(const Regex value, Translate(k.additional, inner));
  const Regex pair = Concat({JsonString(), ws_, L(":"), ws_, value});
  const Regex non_empty = mx == 0
                              ? Nothing()
                              : SeparatedList(pair, static_cast<int32_t>(std::max<int64_t>(1, mn)),
                                              static_cast<int32_t>(mx));
  const Regex open = L("{");
  const Regex close = L("}");
  return Alt({mn == 0 ? Concat({open, ws_, close}) : Nothing(),
              Concat({open, ws_, non_empty, ws_, close})});
}

// Listed keys only, in order, optional ones free to be left out.
absl::StatusOr<Regex> Translator::ListedObject(const ObjectKeywords& k, Ctx inner) {
  const std::vector<ListedProperty>& properties = k.properties;
  size_t required = 0;
  for (const ListedProperty& p : properties) required += p.required ? 1 : 0;
  if (k.max_properties && *k.max_properties < required) return Nothing();
  if (k.min_properties > properties.size()) return Nothing();
  if (k.min_properties > required) {
    return SchemaError(
        k.min_pointer,
        "minProperties above the number of required properties is not supported with "
        "listed properties");
  }
  if (k.max_properties && *k.max_properties < properties.size()) {
    return SchemaError(k.max_pointer,
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
  const Regex sep = Sep();
  std::vector<Regex> tail(n + 1), first(n + 1);
  tail[n] = Empty();
  first[n] = Nothing();
  for (size_t j = n; j-- > 0;) {
    const Regex after_sep = Concat({sep, member[j]});
    tail[j] = Concat({properties[j].required ? after_sep : Optional(after_sep), tail[j + 1]});
    const Regex starting_here = Concat({member[j], tail[j + 1]});
    first[j] = properties[j].required ? starting_here : Alt({starting_here, first[j + 1]});
  }
  const Regex open = L("{");
  const Regex close = L("}");
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
}  // namespace json_schema_internal

using json_schema_internal::JsonDepth;
using json_schema_internal::NullJson;
using json_schema_internal::OJson;
using json_schema_internal::Translate;
using json_schema_internal::Translator;

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
  // Bounded before nlohmann's recursive parser runs; errors say where malformed text goes wrong.
  ASSIGN_OR_RETURN(const OJson schema, ParseOrderedJson(schema_text, "JSON schema"));
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
