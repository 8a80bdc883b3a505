#include "runtime/structured/json_schema.h"

#include <cstdint>
#include <iostream>
#include <limits>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/json.h"
#include "common/xoshiro.h"
#include "gtest/gtest.h"
#include "runtime/structured/automaton.h"
#include "runtime/structured/regex_ast.h"

namespace kvrm::structured {
namespace {

absl::StatusOr<Dfa> SchemaDfa(const std::string& schema, const JsonSchemaOptions& options = {}) {
  absl::StatusOr<Regex> regex = JsonSchemaTextToRegex(schema, options);
  if (!regex.ok()) return regex.status();
  return Dfa::Compile(*regex);
}

// Every text of `accept` is in the schema's language and none of `reject` is.
void ExpectLanguage(const std::string& schema, const std::vector<std::string>& accept,
                    const std::vector<std::string>& reject, const JsonSchemaOptions& options = {}) {
  absl::StatusOr<Dfa> dfa = SchemaDfa(schema, options);
  ASSERT_TRUE(dfa.ok()) << schema << ": " << dfa.status();
  for (const std::string& text : accept) {
    EXPECT_TRUE(dfa->Matches(text)) << schema << " should accept " << text;
  }
  for (const std::string& text : reject) {
    EXPECT_FALSE(dfa->Matches(text)) << schema << " should reject " << text;
  }
}

std::string SchemaError(const std::string& schema, const JsonSchemaOptions& options = {}) {
  absl::StatusOr<Regex> regex = JsonSchemaTextToRegex(schema, options);
  EXPECT_FALSE(regex.ok()) << schema << " should be refused";
  if (regex.ok()) return "";
  EXPECT_EQ(regex.status().code(), absl::StatusCode::kInvalidArgument) << regex.status();
  return std::string(regex.status().message());
}

// --- (a) Each feature: valid instances in, invalid ones out -----------------------------------

TEST(JsonSchemaTest, Scalars) {
  ExpectLanguage(
      R"({"type":"string"})",
      {R"("")", R"("abc")", R"("a\"b")", R"("\\")", R"("\/")", R"("\u00e9")", R"("\u00E9")",
       R"("\ud83d\ude00")", "\"\xC3\xA9\"", "\"\xF0\x9F\x98\x80\"", R"("\b\f\n\r\t")"},
      {"abc", R"("a)", R"("\x")", R"("\u12")", R"("\ud800")", R"("\ude00")", "\"a\nb\"",
       "\"a\x01\"", R"("a""b")", R"("\")", "1", "null", " \"a\""});
  ExpectLanguage(R"({"type":"integer"})", {"0", "-1", "123", "-9876543210123456789012"},
                 {"01", "-01", "1.0", "1e2", "+1", "", "-", "0x1", " 1", "--1", "-0"});
  ExpectLanguage(R"({"type":"number"})",
                 {"0", "-0", "-0.5", "1e10", "1.5E-3", "2e+7", "10.25", "123"},
                 {"01", ".5", "1.", "1e", "--1", "0x10", "1e+", "+1", "NaN", "Infinity", "1.5.2"});
  ExpectLanguage(R"({"type":"boolean"})", {"true", "false"}, {"True", "1", "null", "\"true\""});
  ExpectLanguage(R"({"type":"null"})", {"null"}, {"Null", "nil", "0", "\"\""});
  ExpectLanguage(R"({"type":["string","null"]})", {R"("a")", "null"}, {"1", "true", "[]"});
  for (const char* open :
       {"true", "{}", R"({"description":"anything","title":"x","$comment":"c"})"}) {
    ExpectLanguage(open, {"1", "null", R"("s")", R"({"a":[1,{"b":null}]})", "[true,false]", "{}"},
                   {"", "nul", "[1,]", "{\"a\"}", "{1:2}"});
  }
  EXPECT_NE(SchemaError("false").find("accepts no JSON value"), std::string::npos);
}

TEST(JsonSchemaTest, EnumAndConst) {
  ExpectLanguage(R"({"enum":["red","green",1,null,{"a":[1,2]},2.5,true]})",
                 {R"("red")", R"("green")", "1", "null", R"({"a":[1,2]})", "2.5", "true"},
                 {R"("blue")", "2", R"({"a":[1]})", "false", R"("Red")", "1.0"});
  ExpectLanguage(R"({"const":"x"})", {R"("x")"}, {R"("y")", "x", R"("x" )"});
  ExpectLanguage(R"({"const":{"k":[true,{"n":null}]}})", {R"({"k":[true,{"n":null}]})"},
                 {R"({"k":[true]})"});
  // Values the sibling keywords refuse are left out.
  ExpectLanguage(R"({"type":"string","enum":["a",1,"bb"]})", {R"("a")", R"("bb")"}, {"1"});
  ExpectLanguage(R"({"enum":["a","abcdef",7],"maxLength":3})", {R"("a")", "7"}, {R"("abcdef")"});
  ExpectLanguage(R"({"type":"integer","enum":[1,50,99],"maximum":60})", {"1", "50"}, {"99"});
  ExpectLanguage(R"({"type":"integer","enum":[1,2.0,2.5,"3"]})", {"1", "2.0"}, {"2.5", R"("3")"});
  ExpectLanguage(R"({"type":"number","enum":[1,2.5,"3"]})", {"1", "2.5"}, {R"("3")"});
  ExpectLanguage(R"({"enum":[1,2,3],"minimum":1.5})", {"2", "3"}, {"1"});
  ExpectLanguage(R"({"enum":[{"a":1},{"a":"x"},[1]],"properties":{"a":{"type":"integer"}}})",
                 {R"({"a":1})", "[1]"}, {R"({"a":"x"})"});
  // Several enums in force: the values they share.
  ExpectLanguage(R"({"allOf":[{"enum":[1,2,3]},{"enum":[2,3,4]}]})", {"2", "3"}, {"1", "4"});
  EXPECT_NE(SchemaError(R"({"type":"string","enum":[1,2]})").find("accepts no JSON value"),
            std::string::npos);
}

TEST(JsonSchemaTest, StringLengthCountsCharacters) {
  ExpectLanguage(
      R"({"type":"string","minLength":2,"maxLength":3})",
      {R"("ab")", R"("abc")", R"("a\nb")", R"("\ud83d\ude00x")", "\"\xC3\xA9\xC3\xA9\"",
       R"("\u0041\"")", "\"\xF0\x9F\x98\x80\xF0\x9F\x98\x80\""},
      {R"("a")", R"("abcd")", R"("\n\n\n\n")", R"("")", "\"\xC3\xA9\"", R"("\ud83d\ude00")"});
  ExpectLanguage(R"({"type":"string","maxLength":0})", {R"("")"}, {R"("a")"});
  // Above kJsonSchemaMaxCount the bound is lowered to it: still never longer than asked.
  absl::StatusOr<Dfa> dfa = SchemaDfa(R"({"type":"string","maxLength":100000})");
  ASSERT_TRUE(dfa.ok()) << dfa.status();
  EXPECT_TRUE(dfa->Matches("\"" + std::string(kJsonSchemaMaxCount, 'a') + "\""));
  EXPECT_FALSE(dfa->Matches("\"" + std::string(kJsonSchemaMaxCount + 1, 'a') + "\""));
  EXPECT_NE(SchemaError(R"({"type":"string","minLength":5000})").find("/minLength"),
            std::string::npos);
}

TEST(JsonSchemaTest, Pattern) {
  ExpectLanguage(
      R"({"type":"string","pattern":"^[a-z]+@[a-z]+\\.com$"})", {R"("ab@cd.com")"},
      {R"("AB@cd.com")", R"("ab@.com")", R"("ab@cd.comx")", R"("xab@cd.com ")", "ab@cd.com"});
  // Characters JSON escapes come out escaped, the canonical way.
  ExpectLanguage(R"({"type":"string","pattern":"a\"b\\\\c"})", {R"("a\"b\\c")"},
                 {R"("a"b\\c")", R"("a\"b\c")", R"("a\u0022b\\c")"});
  ExpectLanguage(R"({"type":"string","pattern":"a.b"})",
                 {R"("axb")", R"("a\tb")", R"("a\u0001b")", R"("a\"b")",
                  "\"a\xC3\xA9"
                  "b\""},
                 {R"("a\nb")", R"("a\rb")",
                  "\"a\xE2\x80\xA8"
                  "b\"",
                  R"("ab")", R"("a\u0009b")"});
  ExpectLanguage(R"({"type":"string","pattern":"[0-9]{3}","format":"date"})", {R"("123")"},
                 {R"("2024-01-01")"});
  EXPECT_NE(SchemaError(R"({"type":"string","pattern":"(a"})").find("/pattern"), std::string::npos);
  EXPECT_NE(SchemaError(R"({"type":"string","pattern":"a","maxLength":3})").find("/pattern"),
            std::string::npos);
}

TEST(JsonSchemaTest, Formats) {
  ExpectLanguage(R"({"type":"string","format":"date"})",
                 {R"("2024-02-29")", R"("2023-12-31")", R"("2000-02-29")", R"("0000-02-29")",
                  R"("2023-04-30")"},
                 {R"("2023-02-29")", R"("1900-02-29")", R"("2023-04-31")", R"("2023-13-01")",
                  R"("2023-00-10")", R"("2023-01-00")", R"("2023-1-01")", R"("20230101")"});
  ExpectLanguage(R"({"type":"string","format":"date-time"})",
                 {R"("2024-01-01T12:34:56Z")", R"("2024-01-01T23:59:59.789+05:30")",
                  R"("1999-12-31T00:00:00-12:00")"},
                 {R"("2024-01-01 12:34:56Z")", R"("2024-01-01T24:00:00Z")",
                  R"("2024-01-01T12:60:00Z")", R"("2024-01-01T12:00:00")", R"("2024-01-01")"});
  ExpectLanguage(R"({"type":"string","format":"time"})",
                 {R"("08:30:00Z")", R"("08:30:00.5+01:00")"}, {R"("8:30:00Z")", R"("08:30Z")"});
  ExpectLanguage(
      R"({"type":"string","format":"uuid"})", {R"("123e4567-e89b-12d3-A456-426614174000")"},
      {R"("123e4567e89b12d3a456426614174000")", R"("123e4567-e89b-12d3-a456-42661417400")",
       R"("g23e4567-e89b-12d3-a456-426614174000")"});
  ExpectLanguage(R"({"type":"string","format":"email"})",
                 {R"("a.b+c@example.co.uk")", R"("x@y.z")"},
                 {R"("a@b")", R"("@b.com")", R"("a..b@c.com")", R"("a@-b.com")", R"("a b@c.com")"});
  ExpectLanguage(R"({"type":"string","format":"ipv4"})",
                 {R"("192.168.0.1")", R"("0.0.0.0")", R"("255.255.255.255")"},
                 {R"("256.1.1.1")", R"("01.1.1.1")", R"("1.1.1")", R"("1.1.1.1.")"});
  ExpectLanguage(R"({"type":"string","format":"uri"})",
                 {R"("https://example.com/a?b=c#d")", R"("urn:isbn:123")"},
                 {R"("no scheme")", R"("/relative/path")", R"("http://a b")"});
  // Unknown formats are annotations.
  ExpectLanguage(R"({"type":"string","format":"hostname"})", {R"("any thing")"}, {"1"});
  // A format fits inside the lengths: kept; cut by them: the lengths win.
  ExpectLanguage(R"({"type":"string","format":"date","maxLength":10})", {R"("2024-01-31")"},
                 {R"("abc")"});
  ExpectLanguage(R"({"type":"string","format":"date","maxLength":3})", {R"("abc")"},
                 {R"("2024-01-31")"});
  // No "type": a string keyword means a string.
  ExpectLanguage(R"({"format":"date"})", {R"("2024-01-31")"}, {"1", "null"});
}

TEST(JsonSchemaTest, IntegerBounds) {
  ExpectLanguage(R"({"type":"integer","minimum":5})",
                 {"5", "9", "10", "12345", "99999999999999999999"}, {"4", "0", "-5", "05", "-10"});
  ExpectLanguage(R"({"type":"integer","exclusiveMinimum":-3,"exclusiveMaximum":12})",
                 {"-2", "-1", "0", "9", "11"}, {"-3", "12", "-4", "13", "100"});
  ExpectLanguage(R"({"type":"integer","minimum":1.5,"maximum":3.5})", {"2", "3"}, {"1", "4"});
  ExpectLanguage(R"({"type":"integer","maximum":-10})", {"-10", "-11", "-100000000000000000000"},
                 {"-9", "0", "10"});
}

TEST(JsonSchemaTest, NumberBounds) {
  ExpectLanguage(R"({"type":"number","minimum":0,"maximum":1})",
                 {"0", "1", "0.5", "1.0", "1.000", "0.0001", "0.999999999"},
                 {"1.1", "1.0001", "-0.1", "2", "1e-3", "-0", "10"});
  ExpectLanguage(R"({"type":"number","exclusiveMinimum":0})", {"0.1", "7", "0.001", "123.5"},
                 {"0", "0.0", "-1", "-0.5"});
  ExpectLanguage(R"({"type":"number","maximum":-2})", {"-2", "-2.0", "-3.5", "-100"},
                 {"-1.99", "0", "-1", "2"});
  ExpectLanguage(R"({"minimum":-1})", {"-1", "-0.5", "0", "5.25"}, {"-1.5", "-2", "\"a\""});
  EXPECT_NE(SchemaError(R"({"type":"number","minimum":0.5})").find("/minimum"), std::string::npos);
  EXPECT_NE(SchemaError(R"({"type":"number","exclusiveMinimum":true,"minimum":0})")
                .find("/exclusiveMinimum"),
            std::string::npos);
  // Draft 4's false is no constraint.
  ExpectLanguage(R"({"type":"integer","minimum":0,"exclusiveMinimum":false})", {"0"}, {"-1"});
}

TEST(JsonSchemaTest, Arrays) {
  ExpectLanguage(R"({"type":"array","items":{"type":"integer"},"minItems":1,"maxItems":3})",
                 {"[1]", "[1,2,3]", "[1, 2]", "[ 1 ]", "[1 ,2]"},
                 {"[]", "[1,2,3,4]", "[1,]", "[,1]", R"(["a"])", "[1  ,2]", "[  1]", "[1 2]", "1"});
  ExpectLanguage(
      R"({"type":"array","prefixItems":[{"type":"string"},{"type":"integer"}],"items":false})",
      {"[]", R"(["a"])", R"(["a",1])"}, {"[1]", R"(["a",1,2])", R"(["a","b"])"});
  ExpectLanguage(
      R"({"type":"array","prefixItems":[{"type":"string"},{"type":"integer"}],"minItems":2,
                     "items":{"type":"boolean"}})",
      {R"(["a",1])", R"(["a",1,true,false])"}, {R"(["a"])", R"(["a",1,2])"});
  ExpectLanguage(R"({"type":"array","items":[{"type":"null"}],"additionalItems":false})",
                 {"[]", "[null]"}, {"[null,null]", "[1]"});
  ExpectLanguage(R"({"type":"array"})", {"[]", R"([1,"a",[{}],null])"}, {"[1,]", "{}"});
  ExpectLanguage(R"({"type":"array","maxItems":0})", {"[]"}, {"[1]"});
  ExpectLanguage(R"({"type":"array","uniqueItems":false,"maxItems":2})", {"[1,1]"}, {"[1,1,1]"});
  EXPECT_NE(SchemaError(R"({"type":"array","uniqueItems":true})").find("/uniqueItems"),
            std::string::npos);
}

TEST(JsonSchemaTest, Objects) {
  const std::string person =
      R"({"type":"object",
          "properties":{"name":{"type":"string"},"age":{"type":"integer","minimum":0}},
          "required":["name"]})";
  ExpectLanguage(person,
                 {R"({"name":"a"})", R"({"name":"a","age":3})", R"({ "name" : "a" , "age" : 3 })"},
                 {"{}", R"({"age":3})", R"({"name":"a","extra":1})", R"({"name":"a","age":-1})",
                  R"({"age":3,"name":"a"})", R"({"name":"a",})", R"({"name":"a","name":"b"})",
                  R"({"name":1})", R"({"name":"a"  })",
                  R"({"name":"a"})"
                  " "});
  // All optional: any subset, in order, commas right. No "type": the keywords say object.
  ExpectLanguage(
      R"({"properties":{"a":{"type":"integer"},"b":{"type":"integer"},"c":{"type":"integer"}}})",
      {"{}", R"({"a":1})", R"({"b":1})", R"({"c":1})", R"({"a":1,"c":2})", R"({"b":1,"c":2})",
       R"({"a":1,"b":2,"c":3})"},
      {R"({,"a":1})", R"({"a":1,})", R"({"c":1,"a":2})", R"({"a":1,,"b":2})", "1", R"({"d":1})"});
  // A required property after optional ones.
  ExpectLanguage(
      R"({"properties":{"a":{"type":"integer"},"b":{"type":"integer"},"c":{"type":"integer"}},
                     "required":["c"]})",
      {R"({"c":1})", R"({"a":1,"c":2})", R"({"b":1,"c":2})", R"({"a":1,"b":2,"c":3})"},
      {"{}", R"({"a":1})", R"({"a":1,"b":2})", R"({"c":1,"a":2})"});
  // Free-form objects.
  ExpectLanguage(R"({"type":"object","additionalProperties":{"type":"integer"}})",
                 {"{}", R"({"x":1,"y":2})", R"({"":0,"x\"y":1})"}, {R"({"x":"a"})", R"({"x":1,})"});
  ExpectLanguage(R"({"type":"object","additionalProperties":false})", {"{}"}, {R"({"x":1})"});
  ExpectLanguage(R"({"type":"object"})", {"{}", R"({"a":[1,{"b":null}],"c":"d"})"},
                 {"[]", R"({"a"})"});
  ExpectLanguage(R"({"type":"object","minProperties":1,"maxProperties":2})",
                 {R"({"a":1})", R"({"a":1,"b":2})"}, {"{}", R"({"a":1,"b":2,"c":3})"});
  // A repeated key would count once: more than one property cannot be promised.
  EXPECT_NE(SchemaError(R"({"type":"object","minProperties":2})").find("/minProperties"),
            std::string::npos);
  // Required keys the properties do not list are still generated (with additionalProperties).
  ExpectLanguage(R"({"type":"object","required":["id"],"additionalProperties":{"type":"integer"}})",
                 {R"({"id":1})"}, {"{}", R"({"id":"x"})", R"({"id":1,"x":2})"});
  // Keys that need escaping.
  ExpectLanguage(R"({"properties":{"a\"b":{"type":"null"}},"required":["a\"b"]})",
                 {R"({"a\"b":null})"}, {R"({"a"b":null})", "{}"});
  // Properties come out in the schema's order with the text API, in key order with Json.
  ExpectLanguage(R"({"properties":{"z":{"type":"null"},"a":{"type":"null"}},"required":["z","a"]})",
                 {R"({"z":null,"a":null})"}, {R"({"a":null,"z":null})"});
  absl::StatusOr<Json> schema = ParseJson(
      R"({"properties":{"z":{"type":"null"},"a":{"type":"null"}},"required":["z","a"]})", "test");
  ASSERT_TRUE(schema.ok());
  absl::StatusOr<Regex> sorted = JsonSchemaToRegex(*schema);
  ASSERT_TRUE(sorted.ok()) << sorted.status();
  absl::StatusOr<Dfa> dfa = Dfa::Compile(*sorted);
  ASSERT_TRUE(dfa.ok());
  EXPECT_TRUE(dfa->Matches(R"({"a":null,"z":null})"));
  EXPECT_NE(
      SchemaError(R"({"properties":{"a":{},"b":{}},"maxProperties":1})").find("/maxProperties"),
      std::string::npos);
}

TEST(JsonSchemaTest, Combinators) {
  ExpectLanguage(R"({"anyOf":[{"type":"integer"},{"type":"string","maxLength":1}]})",
                 {"1", R"("a")"}, {R"("ab")", "1.5", "null"});
  ExpectLanguage(R"({"oneOf":[{"type":"boolean"},{"type":"null"}]})", {"true", "null"}, {"1"});
  ExpectLanguage(
      R"({"allOf":[{"type":"object","properties":{"a":{"type":"integer"}}},{"required":["a"]}]})",
      {R"({"a":1})"}, {"{}", R"({"a":"x"})"});
  // additionalProperties of one conjunct applies to the properties of another.
  ExpectLanguage(R"({"allOf":[{"properties":{"a":{}}},{"additionalProperties":false}]})", {"{}"},
                 {R"({"a":1})"});
  ExpectLanguage(R"({"type":"integer","allOf":[{"minimum":0},{"maximum":10}]})", {"0", "10"},
                 {"-1", "11"});
  ExpectLanguage(R"({"allOf":[{"type":["string","integer"]},{"type":["integer","null"]}]})", {"1"},
                 {R"("a")", "null"});
  ExpectLanguage(R"({"type":"number","allOf":[{"type":"integer"}]})", {"3"}, {"1.5"});
  // Siblings of anyOf hold in every branch.
  ExpectLanguage(R"({"type":"object","properties":{"k":{"type":"string"}},"required":["k"],
                     "anyOf":[{"properties":{"k":{"maxLength":1}}},
                              {"properties":{"k":{"minLength":3}}}]})",
                 {R"({"k":"a"})", R"({"k":"abc"})"}, {R"({"k":"ab"})", R"({"k":1})"});
  ExpectLanguage(R"({"anyOf":[{"type":"string"},{"type":"null"}],"default":null,"title":"Opt"})",
                 {"null", R"("x")"}, {"1"});
}

TEST(JsonSchemaTest, References) {
  ExpectLanguage(R"({"$defs":{"pos":{"type":"integer","minimum":1}},"type":"object",
                     "properties":{"n":{"$ref":"#/$defs/pos"}},"required":["n"]})",
                 {R"({"n":1})"}, {R"({"n":0})", "{}"});
  ExpectLanguage(
      R"({"definitions":{"a/b":{"type":"null"},"c~d":{"type":"boolean"},"e f":{"const":5}},
                     "properties":{"x":{"$ref":"#/definitions/a~1b"},
                                   "y":{"$ref":"#/definitions/c~0d"},
                                   "z":{"$ref":"#/definitions/e%20f"}},
                     "required":["x","y","z"]})",
      {R"({"x":null,"y":true,"z":5})"}, {R"({"x":1,"y":true,"z":5})"});
  // $ref with siblings: both hold.
  ExpectLanguage(R"({"$defs":{"s":{"type":"string"}},"$ref":"#/$defs/s","maxLength":2})",
                 {R"("ab")"}, {R"("abc")", "1"});
  // Recursion unfolds max_depth times: a tree three nodes deep at max_depth 2, not four.
  const std::string tree =
      R"({"type":"object",
          "properties":{"v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#"}}},
          "required":["v"]})";
  JsonSchemaOptions depth2;
  depth2.max_depth = 2;
  ExpectLanguage(tree,
                 {R"({"v":1})", R"({"v":1,"kids":[{"v":2,"kids":[{"v":3},{"v":4,"kids":[]}]}]})"},
                 {R"({"v":1,"kids":[{"v":2,"kids":[{"v":3,"kids":[{"v":4}]}]}]})"}, depth2);
  // A recursion that nests nothing still ends.
  ExpectLanguage(
      R"({"$defs":{"a":{"anyOf":[{"type":"null"},{"$ref":"#/$defs/a"}]}},"$ref":"#/$defs/a"})",
      {"null"}, {"1"});
  // An infinite list has no finite instance.
  EXPECT_NE(
      SchemaError(R"({"type":"object","properties":{"next":{"$ref":"#"}},"required":["next"]})")
          .find("accepts no JSON value"),
      std::string::npos);
}

TEST(JsonSchemaTest, OpenValuesNestToMaxDepth) {
  JsonSchemaOptions depth2;
  depth2.max_depth = 2;
  // "meta" is one level down: one more level of containers, then scalars.
  ExpectLanguage(R"({"type":"object","properties":{"meta":{}},"required":["meta"]})",
                 {R"({"meta":1})", R"({"meta":{"a":"b"}})", R"({"meta":[1,2]})"},
                 {R"({"meta":{"a":{}}})", R"({"meta":[[1]]})"}, depth2);
}

// --- (b) Exact integer ranges -----------------------------------------------------------------

std::string Int128ToString(__int128 v) {
  if (v == 0) return "0";
  const bool negative = v < 0;
  unsigned __int128 m =
      negative ? -static_cast<unsigned __int128>(v) : static_cast<unsigned __int128>(v);
  std::string digits;
  while (m > 0) {
    digits.push_back(static_cast<char>('0' + static_cast<int>(m % 10)));
    m /= 10;
  }
  if (negative) digits.push_back('-');
  return std::string(digits.rbegin(), digits.rend());
}

TEST(JsonSchemaIntegerTest, RandomRangesAreExact) {
  Xoshiro256 rng(20240601);
  auto random_bound = [&]() -> int64_t {
    const int digits = static_cast<int>(rng.Next() % 19) + 1;
    uint64_t scale = 1;
    for (int i = 0; i < digits && i < 18; ++i) scale *= 10;
    const uint64_t magnitude = digits == 19 ? rng.Next() >> 1 : rng.Next() % scale;
    const int64_t v = static_cast<int64_t>(magnitude);
    return rng.Next() % 2 == 0 ? v : -v;
  };
  constexpr __int128 kMin = std::numeric_limits<int64_t>::min();
  constexpr __int128 kMax = std::numeric_limits<int64_t>::max();
  for (int trial = 0; trial < 160; ++trial) {
    std::optional<int64_t> lo, hi;
    bool lo_exclusive = false, hi_exclusive = false;
    switch (trial % 6) {
      case 0:
        lo = random_bound();
        hi = random_bound();
        break;
      case 1:
        lo = random_bound();
        break;
      case 2:
        hi = random_bound();
        break;
      case 3:
        lo = static_cast<int64_t>(rng.Next() % 200) - 100;
        hi = *lo + static_cast<int64_t>(rng.Next() % 300);
        break;
      case 4:
        lo = random_bound();
        hi = random_bound();
        lo_exclusive = true;
        hi_exclusive = rng.Next() % 2 == 0;
        break;
      default:
        lo = static_cast<int64_t>(rng.Next() % 2000) - 1000;
        lo_exclusive = rng.Next() % 2 == 0;
        break;
    }
    if (lo && hi && *lo > *hi) std::swap(lo, hi);
    std::string schema = R"({"type":"integer")";
    if (lo) {
      absl::StrAppend(&schema, lo_exclusive ? R"(,"exclusiveMinimum":)" : R"(,"minimum":)", *lo);
    }
    if (hi) {
      absl::StrAppend(&schema, hi_exclusive ? R"(,"exclusiveMaximum":)" : R"(,"maximum":)", *hi);
    }
    schema += "}";
    auto in_range = [&](__int128 v) {
      if (lo && (lo_exclusive ? v <= *lo : v < *lo)) return false;
      if (hi && (hi_exclusive ? v >= *hi : v > *hi)) return false;
      return true;
    };
    const bool empty =
        lo && hi &&
        (static_cast<__int128>(*hi) - *lo < (lo_exclusive ? 1 : 0) + (hi_exclusive ? 1 : 0));
    absl::StatusOr<Dfa> dfa = SchemaDfa(schema);
    if (empty) {
      EXPECT_FALSE(dfa.ok()) << schema;
      continue;
    }
    ASSERT_TRUE(dfa.ok()) << schema << ": " << dfa.status();
    // Around both bounds, zero, the powers of ten near the bounds and the int64 limits.
    std::vector<__int128> centers = {0, kMin, kMax};
    for (const std::optional<int64_t>& b : {lo, hi}) {
      if (!b) continue;
      centers.push_back(*b);
      __int128 p = 1;
      while (p <= (*b < 0 ? -static_cast<__int128>(*b) : static_cast<__int128>(*b))) p *= 10;
      centers.push_back(p);
      centers.push_back(-p);
      centers.push_back(p / 10);
      centers.push_back(-p / 10);
    }
    int checked = 0;
    for (__int128 c : centers) {
      for (__int128 v = c - 25; v <= c + 25; ++v) {
        const std::string text = Int128ToString(v);
        ASSERT_EQ(dfa->Matches(text), in_range(v)) << schema << " on " << text;
        ++checked;
      }
    }
    // And random values in [lo, hi].
    const __int128 a = lo ? static_cast<__int128>(*lo) : kMin;
    const __int128 b = hi ? static_cast<__int128>(*hi) : kMax;
    for (int i = 0; i < 50; ++i) {
      const __int128 v = a + static_cast<__int128>(rng.Next()) % (b - a + 1);
      ASSERT_EQ(dfa->Matches(Int128ToString(v)), in_range(v))
          << schema << " on " << Int128ToString(v);
    }
    EXPECT_GT(checked, 0);
  }
}

TEST(JsonSchemaIntegerTest, Int64Limits) {
  ExpectLanguage(
      R"({"type":"integer","minimum":-9223372036854775808,"maximum":9223372036854775807})",
      {"9223372036854775807", "-9223372036854775808", "0"},
      {"9223372036854775808", "-9223372036854775809", "10000000000000000000"});
  // Beyond the 64-bit range, bounds narrow to it.
  ExpectLanguage(R"({"type":"integer","maximum":1e300})", {"9223372036854775807"},
                 {"9223372036854775808"});
  EXPECT_NE(SchemaError(R"({"type":"integer","minimum":1e20})").find("/minimum"),
            std::string::npos);
}

// Decimals near integer bounds, compared in thousandths: accepted iff in range (and not "-0...",
// which is never generated).
TEST(JsonSchemaNumberTest, DecimalsNearBoundsAreExact) {
  Xoshiro256 rng(77);
  const std::vector<std::pair<std::string, int>> fractions = {
      {"", 0}, {".0", 0}, {".000", 0}, {".5", 500}, {".001", 1}, {".999", 999}, {".10", 100}};
  for (int trial = 0; trial < 120; ++trial) {
    std::optional<int64_t> lo, hi;
    const bool lo_exclusive = rng.Next() % 2 == 0, hi_exclusive = rng.Next() % 2 == 0;
    if (trial % 3 != 1) lo = static_cast<int64_t>(rng.Next() % 41) - 20;
    if (trial % 3 != 2) hi = static_cast<int64_t>(rng.Next() % 41) - 20;
    if (lo && hi && *lo > *hi) std::swap(lo, hi);
    std::string schema = R"({"type":"number")";
    if (lo) {
      absl::StrAppend(&schema, lo_exclusive ? R"(,"exclusiveMinimum":)" : R"(,"minimum":)", *lo);
    }
    if (hi) {
      absl::StrAppend(&schema, hi_exclusive ? R"(,"exclusiveMaximum":)" : R"(,"maximum":)", *hi);
    }
    schema += "}";
    absl::StatusOr<Dfa> dfa = SchemaDfa(schema);
    if (lo && hi && *lo == *hi && (lo_exclusive || hi_exclusive)) {
      EXPECT_FALSE(dfa.ok()) << schema;
      continue;
    }
    ASSERT_TRUE(dfa.ok()) << schema << ": " << dfa.status();
    for (int64_t whole = -25; whole <= 25; ++whole) {
      for (const bool negative_zero : {false, true}) {
        if (negative_zero && whole != 0) continue;
        for (const auto& [fraction, thousandths] : fractions) {
          const int64_t magnitude = (whole < 0 ? -whole : whole) * 1000 + thousandths;
          const bool negative = whole < 0 || negative_zero;
          const int64_t value = negative ? -magnitude : magnitude;
          const std::string text =
              (negative ? "-" : "") + std::to_string(whole < 0 ? -whole : whole) + fraction;
          bool expected = true;
          if (lo && (lo_exclusive ? value <= *lo * 1000 : value < *lo * 1000)) expected = false;
          if (hi && (hi_exclusive ? value >= *hi * 1000 : value > *hi * 1000)) expected = false;
          if (negative && magnitude == 0) expected = false;
          ASSERT_EQ(dfa->Matches(text), expected) << schema << " on " << text;
        }
      }
    }
  }
}

// --- (c) Random walks through the automaton produce valid instances ---------------------------

// A validator for the subset the walks exercise, written from the specification, independent of
// the translation.
class Validator {
 public:
  explicit Validator(const Json& root) : root_(root) {}

  bool Valid(const Json& v, const Json& s) const {
    if (s.is_boolean()) return s.get<bool>();
    if (auto it = s.find("$ref"); it != s.end()) {
      const Json* target = Resolve(it->get<std::string>());
      if (target == nullptr || !Valid(v, *target)) return false;
    }
    if (auto it = s.find("anyOf"); it != s.end()) {
      bool any = false;
      for (const Json& branch : *it) any = any || Valid(v, branch);
      if (!any) return false;
    }
    if (auto it = s.find("allOf"); it != s.end()) {
      for (const Json& branch : *it) {
        if (!Valid(v, branch)) return false;
      }
    }
    if (auto it = s.find("type"); it != s.end()) {
      bool any = false;
      if (it->is_string()) {
        any = HasType(v, it->get<std::string>());
      } else {
        for (const Json& t : *it) any = any || HasType(v, t.get<std::string>());
      }
      if (!any) return false;
    }
    if (auto it = s.find("enum"); it != s.end()) {
      bool found = false;
      for (const Json& e : *it) found = found || e == v;
      if (!found) return false;
    }
    if (auto it = s.find("const"); it != s.end() && *it != v) return false;
    if (v.is_string()) {
      const std::string& text = v.get_ref<const std::string&>();
      size_t length = 0;
      for (unsigned char c : text) length += (c & 0xC0) != 0x80 ? 1 : 0;
      if (auto it = s.find("minLength"); it != s.end() && length < it->get<uint64_t>()) {
        return false;
      }
      if (auto it = s.find("maxLength"); it != s.end() && length > it->get<uint64_t>()) {
        return false;
      }
      if (auto it = s.find("pattern");
          it != s.end() &&
          !std::regex_search(text, std::regex(it->get<std::string>(), std::regex::ECMAScript))) {
        return false;
      }
      if (auto it = s.find("format"); it != s.end() && *it == "date" && !IsDate(text)) return false;
    }
    if (v.is_number()) {
      const double x = v.get<double>();
      if (auto it = s.find("minimum"); it != s.end() && x < it->get<double>()) return false;
      if (auto it = s.find("maximum"); it != s.end() && x > it->get<double>()) return false;
      if (auto it = s.find("exclusiveMinimum"); it != s.end() && x <= it->get<double>()) {
        return false;
      }
      if (auto it = s.find("exclusiveMaximum"); it != s.end() && x >= it->get<double>()) {
        return false;
      }
    }
    if (v.is_array()) {
      if (auto it = s.find("minItems"); it != s.end() && v.size() < it->get<uint64_t>()) {
        return false;
      }
      if (auto it = s.find("maxItems"); it != s.end() && v.size() > it->get<uint64_t>()) {
        return false;
      }
      size_t prefix = 0;
      if (auto it = s.find("prefixItems"); it != s.end()) {
        prefix = it->size();
        for (size_t i = 0; i < v.size() && i < prefix; ++i) {
          if (!Valid(v[i], (*it)[i])) return false;
        }
      }
      if (auto it = s.find("items"); it != s.end()) {
        for (size_t i = prefix; i < v.size(); ++i) {
          if (!Valid(v[i], *it)) return false;
        }
      }
    }
    if (v.is_object()) {
      if (auto it = s.find("minProperties"); it != s.end() && v.size() < it->get<uint64_t>()) {
        return false;
      }
      if (auto it = s.find("maxProperties"); it != s.end() && v.size() > it->get<uint64_t>()) {
        return false;
      }
      if (auto it = s.find("required"); it != s.end()) {
        for (const Json& key : *it) {
          if (!v.contains(key.get<std::string>())) return false;
        }
      }
      const auto properties = s.find("properties");
      const auto additional = s.find("additionalProperties");
      for (auto p = v.begin(); p != v.end(); ++p) {
        if (properties != s.end() && properties->contains(p.key())) {
          if (!Valid(p.value(), (*properties)[p.key()])) return false;
        } else if (additional != s.end() && !Valid(p.value(), *additional)) {
          return false;
        }
      }
    }
    return true;
  }

 private:
  static bool HasType(const Json& v, const std::string& type) {
    if (type == "null") return v.is_null();
    if (type == "boolean") return v.is_boolean();
    if (type == "string") return v.is_string();
    if (type == "array") return v.is_array();
    if (type == "object") return v.is_object();
    if (type == "number") return v.is_number();
    if (type == "integer") return v.is_number_integer();
    return false;
  }

  static bool IsDate(const std::string& text) {
    if (text.size() != 10 || text[4] != '-' || text[7] != '-') return false;
    for (int i : {0, 1, 2, 3, 5, 6, 8, 9}) {
      if (text[i] < '0' || text[i] > '9') return false;
    }
    const int year = std::stoi(text.substr(0, 4));
    const int month = std::stoi(text.substr(5, 2));
    const int day = std::stoi(text.substr(8, 2));
    const bool leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    const int days[] = {31, leap ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    return month >= 1 && month <= 12 && day >= 1 && day <= days[month - 1];
  }

  const Json* Resolve(const std::string& ref) const {
    if (ref == "#") return &root_;
    const std::string prefix = "#/$defs/";
    if (ref.rfind(prefix, 0) != 0) return nullptr;
    auto defs = root_.find("$defs");
    if (defs == root_.end()) return nullptr;
    auto it = defs->find(ref.substr(prefix.size()));
    return it == defs->end() ? nullptr : &*it;
  }

  const Json& root_;
};

// A random text of the automaton's language: from the start, a uniformly chosen byte class that
// leads to a live state (then a uniform byte of it) at each step; where the text may end, it ends
// with probability 1/2. Nullopt past `max_length` bytes.
std::optional<std::string> RandomWalk(const Dfa& dfa, Xoshiro256& rng, size_t max_length) {
  std::vector<std::vector<uint8_t>> bytes_of_class(dfa.num_classes());
  for (int b = 0; b < 256; ++b) {
    bytes_of_class[dfa.class_of()[b]].push_back(static_cast<uint8_t>(b));
  }
  std::string text;
  int32_t state = dfa.start();
  std::vector<int32_t> live;
  while (true) {
    if (dfa.accepting(state) && (!dfa.HasNext(state) || rng.NextDouble() < 0.5)) return text;
    if (text.size() >= max_length) return std::nullopt;
    live.clear();
    for (int32_t c = 0; c < dfa.num_classes(); ++c) {
      if (dfa.NextByClass(state, c) != Dfa::kDead) live.push_back(c);
    }
    if (live.empty()) {
      ADD_FAILURE() << "dead end after " << text;
      return std::nullopt;
    }
    const int32_t c = live[rng.Next() % live.size()];
    const std::vector<uint8_t>& bytes = bytes_of_class[c];
    text.push_back(static_cast<char>(bytes[rng.Next() % bytes.size()]));
    state = dfa.NextByClass(state, c);
  }
}

TEST(JsonSchemaPropertyTest, RandomWalksAreValidInstances) {
  const std::vector<std::string> schemas = {
      // Five typed properties.
      R"({"type":"object","properties":{"name":{"type":"string","maxLength":8},
            "age":{"type":"integer","minimum":0,"maximum":150},
            "score":{"type":"number","minimum":-1,"maximum":1},
            "active":{"type":"boolean"},"tag":{"enum":["a","b",null,3]}},
          "required":["name","age"],"additionalProperties":false})",
      // Tuples, dates, nullable bounded strings.
      R"({"type":"array","prefixItems":[{"type":"string","format":"date"},
          {"type":"integer","exclusiveMinimum":-5,"exclusiveMaximum":5}],
          "items":{"type":"object",
                   "properties":{"k":{"type":["string","null"],"minLength":1,"maxLength":3}},
                   "required":["k"]},
          "minItems":1,"maxItems":5})",
      // Recursion through $defs.
      R"({"$defs":{"node":{"type":"object","properties":{"value":{"type":"integer"},
          "children":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":3}},
          "required":["value"]}},
          "anyOf":[{"$ref":"#/$defs/node"},{"type":"null"}]})",
      // Patterns, escapes inside them, lengths.
      R"({"type":"object","properties":{
            "code":{"type":"string","pattern":"^[A-Z]{2}-[0-9]{3}$"},
            "quote":{"type":"string","pattern":"^a[\"\\\\\\n]b$"},
            "any":{"type":"string","minLength":2,"maxLength":4}},
          "required":["code","quote","any"]})",
      // Alternatives of ranges and constants.
      R"({"type":"array","items":{"anyOf":[{"type":"integer","minimum":-1000,"maximum":-10},
          {"type":"integer","minimum":10},{"const":{"x":[1,"y"]}}]},"maxItems":6})",
      // Free-form object with bounded count.
      R"({"type":"object","additionalProperties":{"type":"integer","maximum":0},
          "maxProperties":3})",
      // allOf and optional properties.
      R"({"allOf":[{"type":"object","properties":{"a":{"type":"string","maxLength":2},
                                                   "b":{"type":"null"},"c":{"type":"boolean"}}},
                   {"required":["b"]}]})",
  };
  Xoshiro256 rng(4242);
  for (const std::string& text : schemas) {
    absl::StatusOr<Json> schema = ParseJson(text, "schema");
    ASSERT_TRUE(schema.ok()) << schema.status();
    absl::StatusOr<Dfa> dfa = SchemaDfa(text);
    ASSERT_TRUE(dfa.ok()) << text << ": " << dfa.status();
    const Validator validator(*schema);
    int finished = 0;
    for (int walk = 0; walk < 300; ++walk) {
      std::optional<std::string> instance = RandomWalk(*dfa, rng, 4000);
      if (!instance) continue;
      ++finished;
      const Json value = Json::parse(*instance, nullptr, /*allow_exceptions=*/false);
      ASSERT_FALSE(value.is_discarded())
          << text << "\nproduced text that is not JSON: " << *instance;
      ASSERT_TRUE(validator.Valid(value, *schema))
          << text << "\nproduced an invalid instance: " << *instance;
    }
    EXPECT_GT(finished, 250) << text;
  }
}

// Nesting of containers in JSON text (strings skipped).
int TextDepth(const std::string& text) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    if (in_string) {
      if (text[i] == '\\') {
        ++i;
      } else if (text[i] == '"') {
        in_string = false;
      }
    } else if (text[i] == '"') {
      in_string = true;
    } else if (text[i] == '[' || text[i] == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (text[i] == ']' || text[i] == '}') {
      --depth;
    }
  }
  return deepest;
}

// nlohmann's SAX interface reports a number beyond a double (1e400: valid JSON, not
// representable) apart from syntax errors, without exceptions.
class SyntaxCheck : public nlohmann::json_sax<Json> {
 public:
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    error_id = e.id;
    return false;
  }
  int error_id = 0;
};

TEST(JsonSchemaPropertyTest, AnyJsonValueWalksAreJsonWithinDepth) {
  for (const int32_t depth : {0, 2, 4}) {
    JsonSchemaOptions options;
    options.max_depth = depth;
    for (const bool object : {false, true}) {
      absl::StatusOr<Dfa> dfa =
          Dfa::Compile(object ? AnyJsonObject(options) : AnyJsonValue(options));
      ASSERT_TRUE(dfa.ok()) << dfa.status();
      Xoshiro256 rng(depth * 2 + object);
      int finished = 0;
      for (int walk = 0; walk < 300; ++walk) {
        std::optional<std::string> text = RandomWalk(*dfa, rng, 4000);
        if (!text) continue;
        ++finished;
        SyntaxCheck check;
        const bool parsed = Json::sax_parse(*text, &check);
        // 406: a number beyond a double (only exponents get there).
        ASSERT_TRUE(parsed || check.error_id == 406) << "not JSON: " << *text;
        EXPECT_LE(TextDepth(*text), std::max(depth, object ? 1 : 0)) << *text;
        if (object) {
          EXPECT_EQ((*text)[0], '{') << *text;
        }
      }
      EXPECT_GT(finished, 250);
    }
  }
}

// --- (d) Errors name the offending keyword ----------------------------------------------------

TEST(JsonSchemaTest, ErrorsNameThePointer) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"properties":{"a":{"not":{}}}})", "/properties/a/not"},
      {R"({"type":"strin"})", "/type"},
      {R"({"type":["string",3]})", "/type/1"},
      {R"({"$ref":"#/$defs/missing"})", "/$ref"},
      {R"({"$ref":"other.json#/a"})", "/$ref"},
      {R"({"$ref":"#anchor"})", "/$ref"},
      {R"({"anyOf":[{"type":"string"},{"multipleOf":2}]})", "/anyOf/1/multipleOf"},
      {R"({"type":"array","items":{"if":{}}})", "/items/if"},
      {R"({"$defs":{"x":{"patternProperties":{}}},"$ref":"#/$defs/x"})",
       "/$defs/x/patternProperties"},
      {R"({"type":"object","dependentRequired":{}})", "/dependentRequired"},
      {R"({"type":"object","propertyNames":{}})", "/propertyNames"},
      {R"({"type":"array","contains":{}})", "/contains"},
      {R"({"type":"object","unevaluatedProperties":false})", "/unevaluatedProperties"},
      {R"({"properties":{"a/b":{"type":"string","pattern":"(("}}})", "/properties/a~1b/pattern"},
      {R"({"type":"string","minLength":-1})", "/minLength"},
      {R"({"type":"object","required":"a"})", "/required"},
      {R"({"properties":{"a":3}})", "/properties/a"},
      {R"({"allOf":[]})", "/allOf"},
      {R"({"enum":3})", "/enum"},
      {R"({"type":"array","prefixItems":{}})", "/prefixItems"},
      {R"({"type":"number","maximum":"1"})", "/maximum"},
  };
  for (const auto& [schema, pointer] : cases) {
    const std::string message = SchemaError(schema);
    EXPECT_NE(message.find(pointer + ":"), std::string::npos) << schema << " -> " << message;
  }
  EXPECT_FALSE(JsonSchemaTextToRegex("{\"type\":").ok());
  // Bounds on the work a schema can cause.
  std::string many_values = R"({"enum":[)";
  for (int i = 0; i < 2000; ++i) absl::StrAppend(&many_values, i == 0 ? "" : ",", i);
  EXPECT_NE(SchemaError(many_values + "]}").find("/enum"), std::string::npos);
  std::string many_properties = R"({"properties":{)";
  for (int i = 0; i < 300; ++i) {
    absl::StrAppend(&many_properties, i == 0 ? "" : ",", "\"p", i, "\":{}");
  }
  EXPECT_NE(SchemaError(many_properties + "}}").find("/properties"), std::string::npos);
  // A tree with two recursive children per node at a large max_depth is refused, not built.
  JsonSchemaOptions deep;
  deep.max_depth = 64;
  const std::string message =
      SchemaError(R"({"type":"object","properties":{"l":{"$ref":"#"},"r":{"$ref":"#"}}})", deep);
  EXPECT_NE(message.find("too complex"), std::string::npos) << message;
}

// --- (e) AnyJsonObject ------------------------------------------------------------------------

TEST(JsonSchemaTest, AnyJsonObjectNestsToMaxDepth) {
  absl::StatusOr<Dfa> dfa = Dfa::Compile(AnyJsonObject(JsonSchemaOptions{}));
  ASSERT_TRUE(dfa.ok()) << dfa.status();
  for (const char* ok :
       {"{}", R"({"a":1})", R"({"a":{"b":{"c":{"d":1}}}})", R"({"a":[[[1]]]})",
        R"({ "a" : [ 1 , { "b" : null } ] , "c" : "\u00e9" })", R"({"a":1,"a":2})"}) {
    EXPECT_TRUE(dfa->Matches(ok)) << ok;
  }
  for (const char* bad :
       {R"({"a":{"b":{"c":{"d":{}}}}})", R"({"a":[[[[1]]]]})", "[1]", "1", R"("s")", "null",
        R"({"a":1,})", R"({a:1})", R"({"a":01})", "{}  ", R"({"a" 1})", R"({"a"  :1})",
        R"({"a":  1})", R"({"a":1  ,"b":2})", R"({  })", R"({"a":[1,  2]})"}) {
    EXPECT_FALSE(dfa->Matches(bad)) << bad;
  }
  absl::StatusOr<Dfa> value = Dfa::Compile(AnyJsonValue(JsonSchemaOptions{}));
  ASSERT_TRUE(value.ok());
  EXPECT_TRUE(value->Matches("[[[[1]]]]"));
  EXPECT_TRUE(value->Matches("-1.5e3"));
  EXPECT_FALSE(value->Matches("[[[[[1]]]]]"));
  JsonSchemaOptions flat;
  flat.max_depth = 0;
  absl::StatusOr<Dfa> scalars = Dfa::Compile(AnyJsonObject(flat));
  ASSERT_TRUE(scalars.ok());
  EXPECT_TRUE(scalars->Matches(R"({"a":1})"));
  EXPECT_FALSE(scalars->Matches(R"({"a":[]})"));
}

// --- (f) Whitespace ---------------------------------------------------------------------------

TEST(JsonSchemaTest, CustomWhitespaceAllowsPrettyPrinting) {
  const std::string schema =
      R"({"type":"object","properties":{"a":{"type":"integer"},
                                        "b":{"type":"array","items":{"type":"string"}},
                                        "c":{"type":"object"}},
          "required":["a","b"]})";
  absl::StatusOr<Json> instance =
      ParseJson(R"({"a":1,"b":["x","y"],"c":{"d":[true,{}]}})", "instance");
  ASSERT_TRUE(instance.ok());
  const std::string pretty = instance->dump(2);
  ASSERT_NE(pretty.find('\n'), std::string::npos);
  JsonSchemaOptions options;
  options.whitespace = Star(Class([] {
    CodePointSet s;
    for (char c : {' ', '\n', '\t', '\r'}) s.Add(c, c);
    return s;
  }()));
  ExpectLanguage(schema, {pretty, instance->dump(), "{\n\t\"a\" :\n1 ,\"b\":[ ]\n}"}, {}, options);
  ExpectLanguage(schema, {instance->dump(), R"({ "a": 1, "b": [ "x", "y" ] })"}, {pretty});
  absl::StatusOr<Dfa> any = Dfa::Compile(AnyJsonObject(options));
  ASSERT_TRUE(any.ok());
  EXPECT_TRUE(any->Matches(pretty));
  // No whitespace at all.
  JsonSchemaOptions compact;
  compact.whitespace = Empty();
  ExpectLanguage(schema, {instance->dump()}, {R"({ "a":1,"b":[]})", R"({"a": 1,"b":[]})"}, compact);
}

// --- Sizes ------------------------------------------------------------------------------------

TEST(JsonSchemaTest, StateCounts) {
  const std::vector<std::pair<std::string, std::string>> schemas = {
      {"object, 5 typed properties",
       R"({"type":"object","properties":{"name":{"type":"string","maxLength":32},
             "age":{"type":"integer","minimum":0,"maximum":150},
             "email":{"type":"string","format":"email"},
             "score":{"type":"number"},"active":{"type":"boolean"}},
           "required":["name","age","email"]})"},
      {"object, 5 properties, all optional",
       R"({"type":"object","properties":{"a":{"type":"string"},"b":{"type":"integer"},
             "c":{"type":"number"},"d":{"type":"boolean"},"e":{"type":"null"}}})"},
      {"date-time string", R"({"type":"string","format":"date-time"})"},
      {"integer in [-1000, 12345]", R"({"type":"integer","minimum":-1000,"maximum":12345})"},
      {"recursive tree (max_depth 4)",
       R"({"$defs":{"node":{"type":"object","properties":{"value":{"type":"integer"},
             "children":{"type":"array","items":{"$ref":"#/$defs/node"}}},
             "required":["value"]}},
           "$ref":"#/$defs/node"})"},
      {"array of 1-10 objects",
       R"({"type":"array","items":{"type":"object","properties":{"id":{"type":"integer"},
             "tags":{"type":"array","items":{"type":"string"}}},"required":["id"]},
           "minItems":1,"maxItems":10})"},
  };
  for (const auto& [name, schema] : schemas) {
    absl::StatusOr<Dfa> dfa = SchemaDfa(schema);
    ASSERT_TRUE(dfa.ok()) << name << ": " << dfa.status();
    EXPECT_LT(dfa->num_states(), 5000) << name;
    std::cout << "states: " << dfa->num_states() << " classes: " << dfa->num_classes() << "  "
              << name << "\n";
  }
  for (const int32_t depth : {2, 4}) {
    JsonSchemaOptions options;
    options.max_depth = depth;
    absl::StatusOr<Dfa> object = Dfa::Compile(AnyJsonObject(options));
    absl::StatusOr<Dfa> value = Dfa::Compile(AnyJsonValue(options));
    ASSERT_TRUE(object.ok() && value.ok());
    std::cout << "states: " << object->num_states() << "  AnyJsonObject depth " << depth << "\n";
    std::cout << "states: " << value->num_states() << "  AnyJsonValue depth " << depth << "\n";
  }
}

}  // namespace
}  // namespace kvrm::structured
