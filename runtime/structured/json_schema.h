// JSON Schema -> regex_ast.h tree: the language of JSON texts that are valid under a schema, for
// structured outputs' `json_schema` / `guided_json` constraint (and `json_object`).
//
// The translation is sound: every text in the language is a JSON text the schema accepts
// (checked by the tests against an independent validator). It is not always complete, and says
// where it narrows, so that a model is only ever steered towards valid output:
//   - Whitespace between tokens is JsonSchemaOptions::whitespace; the value starts and ends the
//     text (no leading or trailing whitespace).
//   - An object whose schema lists properties (or requires keys) gets exactly those keys, in the
//     schema's order, each at most once, optional ones free to be left out; keys the schema does
//     not list are never generated, whatever additionalProperties says (as outlines does). Only an
//     object with no listed keys takes free-form "key": value pairs (shaped by
//     additionalProperties).
//   - "pattern" is matched against the whole string (as outlines and xgrammar do, where JSON Schema
//     searches): a full match is also a match. Pattern characters that JSON must escape are
//     generated as their one canonical escape (\" \\ \n ... \u001f, as nlohmann writes them);
//     other escapes are not generated inside patterned strings.
//   - Numbers under bounds are written without an exponent; integers and bounded numbers never
//     as "-0"; integer-valued numbers under "type": "integer" never as 2.0.
//   - oneOf is generated as anyOf (its exclusivity is not enforced).
//   - Count bounds above kJsonSchemaMaxCount (maxLength, maxItems, maxProperties) are lowered to
//     it.
//   - Values the schema leaves open nest at most max_depth levels; recursive $refs unfold at most
//     max_depth times (below that the recursive branch is dropped).
//   - enum/const values are generated in their compact serialization, and only those that the
//     sibling keywords accept in that form (an object value whose keys are not in the schema's
//     order is dropped, say).
//   - A schema without "type" is taken to be of the types its keywords are for ({"properties": ...}
//     is an object, {"minimum": 0} a number); of any type when it has none.
// Keywords are refused (INVALID_ARGUMENT naming the JSON pointer of the keyword) when they
// constrain values in a way not translated (not, if/then/else, patternProperties, multipleOf,
// contains, uniqueItems: true, dependentRequired, propertyNames, unevaluated*, ...), so nobody
// believes a constraint is enforced when it is not. Annotations ($schema, $id, title, description,
// default, examples, $comment, ...), unknown keywords and unsupported "format"s are ignored, as
// validators do.
//
// Supported: type (one or a list), enum, const, true/false/{} schemas; string: minLength,
// maxLength, pattern, format (date-time, date, time, uuid, email, ipv4, uri); integer: exact
// minimum/maximum/exclusiveMinimum/exclusiveMaximum ranges within int64; number: bounds with
// integer values; array: items, prefixItems (and draft 7 items-array/additionalItems), minItems,
// maxItems; object: properties, required, additionalProperties, minProperties/maxProperties
// (maxProperties and minProperties <= 1 on free-form objects; on listed properties only where the
// required and listed keys already satisfy them); anyOf, oneOf, allOf and $ref with siblings (as a
// conjunction: every keyword of every schema in force applies, e.g. one schema's
// additionalProperties to another's properties); $ref to "#", "#/$defs/X", "#/definitions/X" or
// any other JSON pointer into the document (~0 ~1 and %XX decoded). Pattern and length together,
// two different patterns, and non-integer bounds on numbers are refused.
#ifndef KVRM_RUNTIME_STRUCTURED_JSON_SCHEMA_H_
#define KVRM_RUNTIME_STRUCTURED_JSON_SCHEMA_H_

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/json.h"
#include "runtime/structured/regex_ast.h"

namespace kvrm::structured {

// Largest count bound taken as written (a maximum above it is lowered to it, which keeps the output
// valid; a minimum above it is refused): a bounded repeat costs automaton states in proportion to
// its count, about 35 per character of a bounded string (UTF-8 and escape paths), so that
// "maxLength": 256 alone takes some 9000 of the 20000 states a Dfa allows by default.
inline constexpr int32_t kJsonSchemaMaxCount = 256;

struct JsonSchemaOptions {
  // Whitespace allowed wherever JSON allows it (after { [ , : and before } ] , :); must match
  // only JSON whitespace (space, \t, \n, \r). Default: at most one space, as outlines' default,
  // so a model cannot pad forever.
  Regex whitespace = Optional(Literal(" "));
  // Nesting levels allowed for values the schema leaves open (no "type", {}, true,
  // additionalProperties: true, items absent ...), counted from the root of the document, and the
  // number of times a recursive $ref may unfold on one path; past it, such a value can only be a
  // scalar (string, number, boolean, null), and a recursive branch becomes Nothing() so that e.g.
  // a tree with optional or empty children ends. Clamped to [0, 64].
  int32_t max_depth = 4;
};

// The language of JSON texts valid under `schema` (draft 2020-12 / draft 7 subset, see above).
// kvrm::Json keeps object keys sorted, so properties come out in key order here; use
// JsonSchemaTextToRegex to keep the order the schema was written in.
absl::StatusOr<Regex> JsonSchemaToRegex(const Json& schema, const JsonSchemaOptions& options = {});

// The same from the schema's JSON text, keeping its property order (what a model should follow:
// "reasoning" before "answer"). INVALID_ARGUMENT for text that is not JSON.
absl::StatusOr<Regex> JsonSchemaTextToRegex(std::string_view schema_text,
                                            const JsonSchemaOptions& options = {});

// Any JSON value / any JSON object (OpenAI response_format json_object), containers nesting up
// to options.max_depth levels (the object itself is one; at least one for AnyJsonObject).
Regex AnyJsonValue(const JsonSchemaOptions& options);
Regex AnyJsonObject(const JsonSchemaOptions& options);

}  // namespace kvrm::structured

#endif  // KVRM_RUNTIME_STRUCTURED_JSON_SCHEMA_H_
