#include "model/tool_calls.h"

#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvrm {
namespace {

using ::testing::HasSubstr;

TEST(ToolCallFormatTest, NamesRoundTripAndUnknownIsRefused) {
  for (ToolCallFormat f :
       {ToolCallFormat::kNone, ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json,
        ToolCallFormat::kMistral, ToolCallFormat::kGranite, ToolCallFormat::kQwen3Coder,
        ToolCallFormat::kGlm45, ToolCallFormat::kMinimaxM2, ToolCallFormat::kDeepSeekV3,
        ToolCallFormat::kKimiK2, ToolCallFormat::kMinimax, ToolCallFormat::kDeepSeekV32,
        ToolCallFormat::kPythonic}) {
    EXPECT_EQ(*ToolCallFormatFromName(ToolCallFormatName(f)), f);
  }
  EXPECT_EQ(*ToolCallFormatFromName("deepseek_v31"), ToolCallFormat::kDeepSeekV3);
  absl::StatusOr<ToolCallFormat> bad = ToolCallFormatFromName("openai");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("hermes, llama3_json, mistral, granite"));
  EXPECT_THAT(bad.status().message(), HasSubstr("kimi_k2"));
  EXPECT_THAT(bad.status().message(), HasSubstr("pythonic"));
}

TEST(ToolCallFormatTest, DetectedFromTheTemplatesMarker) {
  EXPECT_EQ(DetectToolCallFormat("{{- '\\n<tool_call>\\n{\"name\": \"' }}"), ToolCallFormat::kHermes);
  EXPECT_EQ(DetectToolCallFormat("{%- if builtin_tools %}{{- '<|python_tag|>' }}{% endif %}"),
            ToolCallFormat::kLlama3Json);
  EXPECT_EQ(DetectToolCallFormat("{{- '[TOOL_CALLS][' }}"), ToolCallFormat::kMistral);
  EXPECT_EQ(DetectToolCallFormat("{% for m in messages %}{{ m.content }}{% endfor %}"),
            ToolCallFormat::kNone);
  // <tool_call> with what goes inside it: Qwen3-Coder's XML, GLM's key/value pairs.
  EXPECT_EQ(DetectToolCallFormat("{{- '<tool_call>\\n<function=' + tc.name + '>' }}"),
            ToolCallFormat::kQwen3Coder);
  EXPECT_EQ(DetectToolCallFormat("{{- '<tool_call>' + tc.name }}<arg_key>{{ k }}</arg_key>"),
            ToolCallFormat::kGlm45);
  EXPECT_EQ(DetectToolCallFormat("{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>'}}"),
            ToolCallFormat::kDeepSeekV3);
  EXPECT_EQ(DetectToolCallFormat("<|tool_calls_section_begin|>"), ToolCallFormat::kKimiK2);
  EXPECT_EQ(DetectToolCallFormat("'<minimax:tool_call>' '<invoke name=\"'"),
            ToolCallFormat::kMinimaxM2);
  EXPECT_EQ(DetectToolCallFormat("respond only with <|tool_call|> followed by"),
            ToolCallFormat::kGranite);
  // MiniMax-M3's namespaced <tool_call><invoke ...>: no parser reads it, and hermes must not.
  EXPECT_EQ(DetectToolCallFormat("ns ~ '<tool_call>' ns + '<invoke name=\"'"),
            ToolCallFormat::kNone);
}

// ---- parsers ----------------------------------------------------------------------------------

TEST(ParseToolCallsTest, HermesBlocksKeepArgumentOrderAndTheTextAround) {
  absl::StatusOr<ParsedToolCalls> p = ParseToolCalls(
      ToolCallFormat::kHermes,
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Lima\", \"unit\": "
      "\"c\"}}\n</tool_call>\n<tool_call>{\"name\": \"time\", \"arguments\": {\"b\": 1, \"a\": "
      "[2, {\"z\": null}]}}</tool_call>\nDone.");
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->calls.size(), 2u);
  EXPECT_EQ(p->calls[0].name, "get_weather");
  EXPECT_EQ(p->calls[0].arguments, "{\"city\":\"Lima\",\"unit\":\"c\"}");
  EXPECT_EQ(p->calls[1].name, "time");
  EXPECT_EQ(p->calls[1].arguments, "{\"b\":1,\"a\":[2,{\"z\":null}]}");  // the model's order
  EXPECT_EQ(p->text, "Done.");
  EXPECT_NE(p->calls[0].id, p->calls[1].id);
}

TEST(ParseToolCallsTest, HermesAcceptsAnUnclosedLastBlockAndStringArguments) {
  absl::StatusOr<ParsedToolCalls> p =
      ParseToolCalls(ToolCallFormat::kHermes,
                     "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 1}\"}");
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->calls.size(), 1u);
  EXPECT_EQ(p->calls[0].arguments, "{\"x\":1}");
  // No arguments at all: a call without arguments.
  p = ParseToolCalls(ToolCallFormat::kHermes, "<tool_call>{\"name\": \"now\"}</tool_call>");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->calls[0].arguments, "{}");
}

TEST(ParseToolCallsTest, MalformedCallsAreErrors) {
  for (const char* text : {
           "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}</tool_call>",  // unbalanced
           "<tool_call>{\"arguments\": {}}</tool_call>",                         // no name
           "<tool_call>{\"name\": \"\", \"arguments\": {}}</tool_call>",          // empty name
           "<tool_call>{\"name\": 3}</tool_call>",                               // name not a string
           "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",       // not an object
           "<tool_call>{\"name\": \"f\", \"arguments\": \"[1]\"}</tool_call>",   // string, not object
           "<tool_call>[1, 2]</tool_call>",
           "<tool_call>{\"name\": \"f\"} trailing</tool_call>",
           "no calls here",
       }) {
    absl::StatusOr<ParsedToolCalls> p = ParseToolCalls(ToolCallFormat::kHermes, text);
    EXPECT_FALSE(p.ok()) << text;
  }
  // Nesting is bounded before the recursive parser runs.
  std::string deep = "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": ";
  for (int i = 0; i < 100; ++i) deep += "[";
  for (int i = 0; i < 100; ++i) deep += "]";
  deep += "}}</tool_call>";
  absl::StatusOr<ParsedToolCalls> p = ParseToolCalls(ToolCallFormat::kHermes, deep);
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("nested deeper"));
}

TEST(ParseToolCallsTest, Llama3JsonWithPythonTagAndSemicolons) {
  absl::StatusOr<ParsedToolCalls> p = ParseToolCalls(
      ToolCallFormat::kLlama3Json,
      "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"q\": \"x;y}\"}}; "
      "{\"name\": \"b\", \"parameters\": {}}");
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->calls.size(), 2u);
  EXPECT_EQ(p->calls[0].name, "a");
  EXPECT_EQ(p->calls[0].arguments, "{\"q\":\"x;y}\"}");  // brackets inside strings are text
  EXPECT_EQ(p->calls[1].name, "b");
  EXPECT_EQ(p->calls[1].arguments, "{}");
  EXPECT_TRUE(p->text.empty());
  // A JSON answer that is not a call, and JSON cut short, are errors (released as text).
  EXPECT_FALSE(ParseToolCalls(ToolCallFormat::kLlama3Json, "{\"answer\": 42}").ok());
  EXPECT_FALSE(ParseToolCalls(ToolCallFormat::kLlama3Json, "{\"name\": \"a\", \"para").ok());
}

TEST(ParseToolCallsTest, MistralArrayOrObject) {
  absl::StatusOr<ParsedToolCalls> p = ParseToolCalls(
      ToolCallFormat::kMistral,
      "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"n\": 1}}, {\"name\": \"b\", "
      "\"arguments\": {\"s\": \"]\"}}]");
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->calls.size(), 2u);
  EXPECT_EQ(p->calls[1].arguments, "{\"s\":\"]\"}");
  // After the marker token (skipped in text) the array comes alone.
  p = ParseToolCalls(ToolCallFormat::kMistral, "{\"name\": \"a\", \"arguments\": {}}");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->calls.size(), 1u);
  EXPECT_FALSE(ParseToolCalls(ToolCallFormat::kMistral, "[TOOL_CALLS] sorry").ok());
  EXPECT_FALSE(ParseToolCalls(ToolCallFormat::kMistral, "[]").ok());
}

TEST(ParseToolCallsTest, ForcedModes) {
  absl::StatusOr<std::vector<ToolCall>> calls = ParseRequiredToolCalls(
      " [{\"name\": \"a\", \"parameters\": {\"x\": 1}}, {\"name\": \"b\", \"parameters\": {}}] ");
  ASSERT_TRUE(calls.ok()) << calls.status();
  ASSERT_EQ(calls->size(), 2u);
  EXPECT_EQ((*calls)[0].arguments, "{\"x\":1}");
  EXPECT_FALSE(ParseRequiredToolCalls("[]").ok());
  EXPECT_FALSE(ParseRequiredToolCalls("{\"name\": \"a\"}").ok());
  absl::StatusOr<ToolCall> named = ParseNamedToolCall("get", "{\"k\": [true]}");
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(named->name, "get");
  EXPECT_EQ(named->arguments, "{\"k\":[true]}");
  EXPECT_FALSE(ParseNamedToolCall("get", "[1]").ok());
  EXPECT_FALSE(ParseNamedToolCall("get", "{\"k\": ").ok());
}

TEST(ToolCallIdTest, FreshAndWellFormed) {
  std::set<std::string> ids;
  for (int i = 0; i < 1000; ++i) {
    const std::string id = NewToolCallId();
    ASSERT_EQ(id.size(), 29u) << id;
    EXPECT_EQ(id.substr(0, 5), "call_");
    EXPECT_EQ(id.find_first_not_of("0123456789abcdef", 5), std::string::npos) << id;
    ids.insert(id);
  }
  EXPECT_EQ(ids.size(), 1000u);
}

// ---- schemas and the template's view ------------------------------------------------------------

TEST(ToolSchemaTest, RequiredAndNamedSchemas) {
  const std::vector<ToolSpec> tools = {
      {"get_weather", "Weather now",
       R"({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})"},
      {"now", "", ""}};
  absl::StatusOr<Json> required = ParseJson(RequiredToolCallsSchema(tools), "schema");
  ASSERT_TRUE(required.ok()) << required.status();
  EXPECT_EQ((*required)["type"], "array");
  EXPECT_EQ((*required)["minItems"], 1);
  const Json& any = (*required)["items"]["anyOf"];
  ASSERT_EQ(any.size(), 2u);
  EXPECT_EQ(any[0]["properties"]["name"]["enum"], Json::array({"get_weather"}));
  EXPECT_EQ(any[0]["properties"]["parameters"]["required"], Json::array({"city"}));
  EXPECT_EQ(any[1]["properties"]["parameters"]["additionalProperties"], false);
  EXPECT_EQ(any[0]["required"], Json::array({"name", "parameters"}));
  EXPECT_FALSE(required->contains("maxItems"));
  // parallel_tool_calls false: an array of exactly one call.
  absl::StatusOr<Json> single =
      ParseJson(RequiredToolCallsSchema(tools, /*single_call=*/true), "schema");
  ASSERT_TRUE(single.ok()) << single.status();
  EXPECT_EQ((*single)["minItems"], 1);
  EXPECT_EQ((*single)["maxItems"], 1);
  EXPECT_EQ((*single)["items"], (*required)["items"]);
  // Parameters with "$ref"s into their own document move to the root's $defs, the refs
  // rewritten to point there (else "#/$defs/Unit" would not resolve and "#" would be the array).
  const std::vector<ToolSpec> with_refs = {
      {"convert", "",
       R"({"$defs": {"Unit": {"enum": ["C", "F"]}}, "type": "object",
           "properties": {"unit": {"$ref": "#/$defs/Unit"}, "next": {"$ref": "#"}}})"},
      {"now", "", ""}};
  absl::StatusOr<Json> moved = ParseJson(RequiredToolCallsSchema(with_refs), "schema");
  ASSERT_TRUE(moved.ok()) << moved.status();
  const Json& items = (*moved)["items"]["anyOf"];
  EXPECT_EQ(items[0]["properties"]["parameters"], Json({{"$ref", "#/$defs/kvrm_tool_0"}}));
  const Json& def = (*moved)["$defs"]["kvrm_tool_0"];
  EXPECT_EQ(def["properties"]["unit"]["$ref"], "#/$defs/kvrm_tool_0/$defs/Unit");
  EXPECT_EQ(def["properties"]["next"]["$ref"], "#/$defs/kvrm_tool_0");
  EXPECT_EQ(def["$defs"]["Unit"]["enum"], Json::array({"C", "F"}));
  EXPECT_FALSE((*moved)["$defs"].contains("kvrm_tool_1")) << "no refs: left in place";
  EXPECT_EQ(items[1]["properties"]["parameters"]["type"], "object");
  EXPECT_EQ(NamedToolCallSchema(tools[1]),
            "{\"type\":\"object\",\"properties\":{},\"additionalProperties\":false}");
  // The template sees OpenAI's shape, the schema's keys in their order.
  EXPECT_EQ(ToolTemplateJson(tools[0]),
            "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":"
            "\"Weather now\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{"
            "\"type\":\"string\"}},\"required\":[\"city\"]}}}");
}

// ---- the stream filter ----------------------------------------------------------------------------

// Feeds `text` in random pieces; returns what was released while streaming and the result.
struct Streamed {
  std::string streamed;
  ToolCallStream::Result result;
  std::vector<ToolCallDelta> deltas;  // every delta, in order
  // Per call index: the id and name of its first delta, its arguments joined, its delta count.
  struct Call {
    std::string id, name, arguments;
    int deltas = 0;
  };
  std::map<int, Call> calls;
};
Streamed FeedInPieces(ToolCallStream& s, std::string_view text, std::mt19937& rng,
                      bool parse = true) {
  Streamed out;
  size_t i = 0;
  while (i < text.size()) {
    const size_t n = std::min(text.size() - i, static_cast<size_t>(rng() % 5 + 1));
    const std::string piece(text.substr(i, n));
    const std::string released = s.Feed(piece);
    out.streamed += released;
    for (ToolCallDelta& d : s.TakeDeltas()) {
      Streamed::Call& c = out.calls[d.index];
      if (c.deltas++ == 0) {
        c.id = d.id;
        c.name = d.name;
      } else {
        EXPECT_TRUE(d.id.empty() && d.name.empty()) << "only a call's first delta names it";
      }
      c.arguments += d.arguments;
      out.deltas.push_back(std::move(d));
    }
    i += n;
  }
  out.result = s.Finish(parse);
  // Finish adds a delta only to complete a streamed call the reply's end closed.
  for (ToolCallDelta& d : s.TakeDeltas()) {
    EXPECT_TRUE(d.id.empty() && d.name.empty()) << "a call Finish completes was streamed";
    Streamed::Call& c = out.calls[d.index];
    EXPECT_GT(c.deltas, 0);
    ++c.deltas;
    c.arguments += d.arguments;
    out.deltas.push_back(std::move(d));
  }
  return out;
}

TEST(ToolCallStreamTest, HermesStreamsTheContentAndHoldsTheCall) {
  const ToolCallSyntax syntax = MakeToolCallSyntax(ToolCallFormat::kHermes);
  const std::string content = "Let me check <tools> for you. ";
  const std::string call =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Lima\"}}\n</tool_call>";
  std::mt19937 rng(1);
  for (int trial = 0; trial < 50; ++trial) {
    ToolCallStream s(ToolCallStream::Mode::kAuto, &syntax);
    const Streamed got = FeedInPieces(s, content + call, rng);
    EXPECT_EQ(got.streamed, content);
    ASSERT_EQ(got.result.calls.size(), 1u);
    EXPECT_EQ(got.result.calls[0].name, "get_weather");
    EXPECT_EQ(got.result.calls[0].arguments, "{\"city\":\"Lima\"}");
    EXPECT_TRUE(got.result.text.empty());
  }
}

TEST(ToolCallStreamTest, NothingIsLostWithoutACallOrWhenTheCallIsMalformed) {
  const ToolCallSyntax syntax = MakeToolCallSyntax(ToolCallFormat::kHermes);
  std::mt19937 rng(2);
  const std::string alphabet = "<tool_call>{}\" abc";
  for (int trial = 0; trial < 300; ++trial) {
    std::string text;
    const int len = static_cast<int>(rng() % 40);
    for (int i = 0; i < len; ++i) text += alphabet[rng() % alphabet.size()];
    ToolCallStream s(ToolCallStream::Mode::kAuto, &syntax);
    const Streamed got = FeedInPieces(s, text, rng, /*parse=*/trial % 2 == 0);
    if (!got.result.calls.empty()) continue;  // a random well-formed call is possible in theory
    EXPECT_EQ(got.streamed + got.result.text, text) << text;
    // Streamed text never holds the start of a call.
    EXPECT_EQ(got.streamed.find("<tool_call>"), std::string::npos) << text;
  }
  // A marker prefix at the very end is released at the end.
  ToolCallStream s(ToolCallStream::Mode::kAuto, &syntax);
  EXPECT_EQ(s.Feed("a <tool_"), "a ");
  const ToolCallStream::Result tail = s.Finish(true);
  EXPECT_EQ(tail.text, "<tool_");
  EXPECT_FALSE(tail.malformed);  // no call was begun
  // Cancelled while holding a well-formed call: released as text, not parsed.
  ToolCallStream c(ToolCallStream::Mode::kAuto, &syntax);
  EXPECT_EQ(c.Feed("<tool_call>{\"name\": \"f\"}</tool_call>"), "");
  EXPECT_TRUE(c.holding_call());
  const ToolCallStream::Result r = c.Finish(/*parse=*/false);
  EXPECT_TRUE(r.calls.empty());
  EXPECT_FALSE(r.malformed);
  EXPECT_EQ(r.text, "<tool_call>{\"name\": \"f\"}</tool_call>");
}

// A marker that is a special token reaches the stream as its text (the request keeps it in the
// decoded text), alone in its piece as a generated token is.
TEST(ToolCallStreamTest, MarkerTokensArriveAsTheirText) {
  EXPECT_EQ(ToolCallMarkers(ToolCallFormat::kHermes),
            (std::vector<std::string_view>{"<tool_call>", "</tool_call>"}));
  EXPECT_EQ(ToolCallMarkers(ToolCallFormat::kLlama3Json),
            (std::vector<std::string_view>{"<|python_tag|>"}));
  EXPECT_TRUE(ToolCallMarkers(ToolCallFormat::kNone).empty());

  const ToolCallSyntax mistral = MakeToolCallSyntax(ToolCallFormat::kMistral);
  ToolCallStream s(ToolCallStream::Mode::kAuto, &mistral);
  EXPECT_EQ(s.Feed("Calling "), "Calling ");
  EXPECT_EQ(s.Feed("[TOOL_CALLS]"), "");
  EXPECT_EQ(s.Feed("[{\"name\": \"a\", "), "");
  EXPECT_EQ(s.Feed("\"arguments\": {\"x\": 2}}]"), "");
  ToolCallStream::Result r = s.Finish(true);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, "{\"x\":2}");

  // Two Hermes calls, each marker a piece of its own.
  const ToolCallSyntax hermes = MakeToolCallSyntax(ToolCallFormat::kHermes);
  ToolCallStream h(ToolCallStream::Mode::kAuto, &hermes);
  std::string streamed;
  for (std::string_view piece :
       {"Both.", "<tool_call>", "{\"name\": \"a\", \"arguments\": {}}", "</tool_call>", "\n",
        "<tool_call>", "{\"name\": \"b\", \"arguments\": {\"y\": [1]}}", "</tool_call>"}) {
    streamed += h.Feed(piece);
  }
  EXPECT_EQ(streamed, "Both.");
  r = h.Finish(true);
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "a");
  EXPECT_EQ(r.calls[1].name, "b");
  EXPECT_EQ(r.calls[1].arguments, "{\"y\":[1]}");
  EXPECT_FALSE(r.malformed);
}

TEST(ToolCallStreamTest, Llama3DecidesAtTheFirstCharacter) {
  const ToolCallSyntax syntax = MakeToolCallSyntax(ToolCallFormat::kLlama3Json);
  std::mt19937 rng(3);
  {
    ToolCallStream s(ToolCallStream::Mode::kAuto, &syntax);
    const Streamed got =
        FeedInPieces(s, "  {\"name\": \"search\", \"parameters\": {\"q\": \"kv\"}}", rng);
    EXPECT_EQ(got.streamed, "");
    ASSERT_EQ(got.result.calls.size(), 1u);
    EXPECT_EQ(got.result.calls[0].arguments, "{\"q\":\"kv\"}");
  }
  {
    // Prose streams at once; a brace later in the reply is only text.
    ToolCallStream s(ToolCallStream::Mode::kAuto, &syntax);
    EXPECT_EQ(s.Feed(" "), "");
    EXPECT_EQ(s.Feed("Sure {"), " Sure {");
    EXPECT_EQ(s.Feed("\"name\": 1}"), "\"name\": 1}");
    EXPECT_TRUE(s.Finish(true).calls.empty());
  }
  {
    // A JSON reply that is not a call comes back whole, leading space included.
    ToolCallStream s(ToolCallStream::Mode::kAuto, &syntax);
    const Streamed got = FeedInPieces(s, " {\"answer\": 42}", rng);
    EXPECT_EQ(got.streamed, "");
    EXPECT_TRUE(got.result.calls.empty());
    EXPECT_EQ(got.result.text, " {\"answer\": 42}");
  }
}

TEST(ToolCallStreamTest, ForcedModesHoldEverything) {
  std::mt19937 rng(4);
  {
    ToolCallStream s(ToolCallStream::Mode::kNamed, nullptr, "get_weather");
    const Streamed got = FeedInPieces(s, "{\"city\": \"Oslo\"}", rng);
    EXPECT_EQ(got.streamed, "");
    ASSERT_EQ(got.result.calls.size(), 1u);
    EXPECT_EQ(got.result.calls[0].name, "get_weather");
    EXPECT_EQ(got.result.calls[0].arguments, "{\"city\":\"Oslo\"}");
  }
  {
    ToolCallStream s(ToolCallStream::Mode::kRequired, nullptr);
    const Streamed got = FeedInPieces(s, "[{\"name\": \"now\", \"parameters\": {}}]", rng);
    ASSERT_EQ(got.result.calls.size(), 1u);
    EXPECT_EQ(got.result.calls[0].name, "now");
  }
  {
    // Cut at the length limit: the partial JSON is released as text.
    ToolCallStream s(ToolCallStream::Mode::kRequired, nullptr);
    const Streamed got = FeedInPieces(s, "[{\"name\": \"now\", \"para", rng);
    EXPECT_TRUE(got.result.calls.empty());
    EXPECT_TRUE(got.result.malformed);
    EXPECT_EQ(got.result.text, "[{\"name\": \"now\", \"para");
  }
}

TEST(ToolCallStreamTest, SingleCallKeepsTheFirstCallTheModelWrote) {
  const ToolCallSyntax syntax = MakeToolCallSyntax(ToolCallFormat::kHermes);
  const std::string text =
      "Checking. <tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Lima\"}}"
      "</tool_call>\n<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>";
  std::mt19937 rng(5);
  for (bool single : {false, true}) {
    ToolCallStream s(ToolCallStream::Mode::kAuto, &syntax, "", single);
    const Streamed got = FeedInPieces(s, text, rng);
    EXPECT_EQ(got.streamed, "Checking. ");
    ASSERT_EQ(got.result.calls.size(), single ? 1u : 2u);
    EXPECT_EQ(got.result.calls[0].name, "get_weather");
    EXPECT_EQ(got.result.dropped, single ? 1 : 0);
    EXPECT_FALSE(got.result.malformed);
  }
  // Forced REQUIRED: the schema allows one item, and the stream holds to it as well.
  ToolCallStream s(ToolCallStream::Mode::kRequired, nullptr, "", /*single_call=*/true);
  const Streamed got = FeedInPieces(
      s, "[{\"name\": \"now\", \"parameters\": {}}, {\"name\": \"now\", \"parameters\": {}}]",
      rng);
  ASSERT_EQ(got.result.calls.size(), 1u);
  EXPECT_EQ(got.result.dropped, 1);
  // One call with single_call: nothing dropped.
  ToolCallStream one(ToolCallStream::Mode::kRequired, nullptr, "", /*single_call=*/true);
  EXPECT_EQ(FeedInPieces(one, "[{\"name\": \"now\", \"parameters\": {}}]", rng).result.dropped,
            0);
}

// ---- streamed calls --------------------------------------------------------------------

// Each streamed call: its deltas' id is the one Finish returns, the name is the call's, and the
// arguments joined are the model's text of the arguments object (which parses to the call's).
void ExpectStreamedAsParsed(const Streamed& got, std::set<int> streamed) {
  std::set<int> seen;
  for (const auto& [index, c] : got.calls) {
    seen.insert(index);
    ASSERT_LT(static_cast<size_t>(index), got.result.calls.size());
    const ToolCall& call = got.result.calls[index];
    EXPECT_EQ(c.id, call.id) << index;
    EXPECT_EQ(c.name, call.name) << index;
    absl::StatusOr<Json> joined = ParseJson(c.arguments, "joined deltas");
    ASSERT_TRUE(joined.ok()) << c.arguments;
    EXPECT_EQ(*joined, *ParseJson(call.arguments, "arguments")) << c.arguments;
  }
  EXPECT_EQ(seen, streamed);
}

TEST(ToolCallStreamTest, HermesCallsStreamTheirArgumentsAsTheyAreWritten) {
  const ToolCallSyntax syntax = MakeToolCallSyntax(ToolCallFormat::kHermes);
  const std::string text =
      "Checking. <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"São "
      "Paulo\", \"days\": [1, 2, {\"x\": \"}]\\\"{\"}]}}\n</tool_call>\n<tool_call>\n{\"name\": "
      "\"get_time\", \"arguments\": {}}\n</tool_call>";
  std::mt19937 rng(3);
  for (int trial = 0; trial < 100; ++trial) {
    ToolCallStream s(ToolCallStream::Mode::kAuto, &syntax);
    const Streamed got = FeedInPieces(s, text, rng);
    EXPECT_EQ(got.streamed, "Checking. ");
    ASSERT_EQ(got.result.calls.size(), 2u);
    ExpectStreamedAsParsed(got, {0, 1});
    // The arguments text exactly as written, brackets inside strings and all.
    EXPECT_EQ(got.calls.at(0).arguments,
              "{\"city\": \"São Paulo\", \"days\": [1, 2, {\"x\": \"}]\\\"{\"}]}");
    EXPECT_GT(got.calls.at(0).deltas, 1) << "pieces of at most 5 bytes: several deltas";
  }
}

TEST(ToolCallStreamTest, Llama3MistralAndRequiredCallsStream) {
  std::mt19937 rng(4);
  const ToolCallSyntax llama = MakeToolCallSyntax(ToolCallFormat::kLlama3Json);
  const ToolCallSyntax mistral = MakeToolCallSyntax(ToolCallFormat::kMistral);
  for (int trial = 0; trial < 50; ++trial) {
    {
      ToolCallStream s(ToolCallStream::Mode::kAuto, &llama);
      const Streamed got = FeedInPieces(
          s, "{\"name\": \"a\", \"parameters\": {\"q\": 1}}; {\"name\": \"b\", \"parameters\": {}}",
          rng);
      ASSERT_EQ(got.result.calls.size(), 2u);
      ExpectStreamedAsParsed(got, {0, 1});
    }
    for (const char* calls : {"[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"q\": [1]}}, "
                              "{\"name\": \"b\", \"arguments\": {\"r\": {}}}]",
                              "[TOOL_CALLS] {\"name\": \"a\", \"arguments\": {\"q\": 2}}"}) {
      ToolCallStream s(ToolCallStream::Mode::kAuto, &mistral);
      const Streamed got = FeedInPieces(s, std::string("Sure. ") + calls, rng);
      EXPECT_EQ(got.streamed, "Sure. ");
      ASSERT_FALSE(got.result.calls.empty()) << calls;
      ExpectStreamedAsParsed(got, got.result.calls.size() == 2 ? std::set<int>{0, 1}
                                                               : std::set<int>{0});
    }
    {
      ToolCallStream s(ToolCallStream::Mode::kRequired, nullptr);
      const Streamed got = FeedInPieces(
          s, "[{\"name\": \"a\", \"parameters\": {\"q\": \"x\"}}, {\"name\": \"b\", \"parameters\": {}}]",
          rng);
      ASSERT_EQ(got.result.calls.size(), 2u);
      ExpectStreamedAsParsed(got, {0, 1});
    }
  }
}

TEST(ToolCallStreamTest, NamedFunctionStreamsTheWholeReplyAsItsArguments) {
  std::mt19937 rng(5);
  ToolCallStream s(ToolCallStream::Mode::kNamed, nullptr, "get_weather");
  const Streamed got = FeedInPieces(s, "{\"city\": \"Lima\", \"unit\": \"C\"}", rng);
  ASSERT_EQ(got.result.calls.size(), 1u);
  ExpectStreamedAsParsed(got, {0});
  EXPECT_EQ(got.calls.at(0).name, "get_weather");
  EXPECT_EQ(got.calls.at(0).arguments, "{\"city\": \"Lima\", \"unit\": \"C\"}");
}

TEST(ToolCallStreamTest, CallsThatCannotStreamComeWholeAtTheEnd) {
  const ToolCallSyntax syntax = MakeToolCallSyntax(ToolCallFormat::kHermes);
  std::mt19937 rng(6);
  // Arguments before the name, and arguments as a string holding the object: no deltas, the
  // calls as Finish parses them; a streamable call after them still streams.
  ToolCallStream s(ToolCallStream::Mode::kAuto, &syntax);
  const Streamed got = FeedInPieces(
      s,
      "<tool_call>{\"arguments\": {\"a\": 1}, \"name\": \"f\"}</tool_call>"
      "<tool_call>{\"name\": \"g\", \"arguments\": \"{\\\"b\\\": 2}\"}</tool_call>"
      "<tool_call>{\"name\": \"h\", \"arguments\": {\"c\": 3}}</tool_call>",
      rng);
  ASSERT_EQ(got.result.calls.size(), 3u);
  ExpectStreamedAsParsed(got, {2});
  EXPECT_EQ(got.result.calls[0].arguments, "{\"a\":1}");
  EXPECT_EQ(got.result.calls[1].arguments, "{\"b\":2}");
}

TEST(ToolCallStreamTest, SingleCallStreamsOnlyTheFirstAndACutCallStaysSent) {
  std::mt19937 rng(7);
  ToolCallStream one(ToolCallStream::Mode::kRequired, nullptr, "", /*single_call=*/true);
  const Streamed got = FeedInPieces(
      one, "[{\"name\": \"a\", \"parameters\": {\"q\": 1}}, {\"name\": \"b\", \"parameters\": {}}]",
      rng);
  ASSERT_EQ(got.result.calls.size(), 1u);
  EXPECT_EQ(got.result.dropped, 1);
  ExpectStreamedAsParsed(got, {0});
  // Cut by the length limit inside its arguments: the deltas went out, the call is malformed
  // and its text is released as text.
  const ToolCallSyntax syntax = MakeToolCallSyntax(ToolCallFormat::kHermes);
  ToolCallStream cut(ToolCallStream::Mode::kAuto, &syntax);
  const Streamed partial =
      FeedInPieces(cut, "<tool_call>{\"name\": \"f\", \"arguments\": {\"long\": \"abc", rng);
  EXPECT_TRUE(partial.result.calls.empty());
  EXPECT_TRUE(partial.result.malformed);
  ASSERT_EQ(partial.calls.count(0), 1u);
  EXPECT_EQ(partial.calls.at(0).arguments, "{\"long\": \"abc");
  EXPECT_THAT(partial.result.text, HasSubstr("\"long\": \"abc"));
}

// The scanner's call k is the parser's call k: objects the parser does not read as calls (text
// between Hermes blocks, text after Llama 3's calls, a second Mistral array) are not streamed
// as calls, and a call whose parse differs from what was streamed keeps a fresh id.
TEST(ToolCallStreamTest, OnlyWhatTheParserReadsAsCallsStreams) {
  std::mt19937 rng(8);
  const ToolCallSyntax hermes = MakeToolCallSyntax(ToolCallFormat::kHermes);
  const ToolCallSyntax llama = MakeToolCallSyntax(ToolCallFormat::kLlama3Json);
  const ToolCallSyntax mistral = MakeToolCallSyntax(ToolCallFormat::kMistral);
  struct Case {
    const ToolCallSyntax* syntax;
    std::string text;
    size_t calls;            // what the parser returns
    std::set<int> streamed;  // the calls streamed, by index
  };
  const std::vector<Case> cases = {
      {&hermes,
       "<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call>\n{}\n"
       "<tool_call>{\"name\":\"b\",\"arguments\":{\"x\":1}}</tool_call>",
       2, {0, 1}},
      {&llama, "{\"name\":\"a\",\"parameters\":{}} and {\"name\":\"b\",\"parameters\":{}}", 1,
       {0}},
      {&llama, " <|python_tag|>{\"name\":\"a\",\"parameters\":{\"q\":1}}", 1, {0}},
      {&mistral,
       "[TOOL_CALLS][{\"name\":\"a\",\"arguments\":{}}][TOOL_CALLS][{\"name\":\"b\","
       "\"arguments\":{}}]",
       1, {0}},
  };
  for (int trial = 0; trial < 30; ++trial) {
    for (const Case& c : cases) {
      ToolCallStream s(ToolCallStream::Mode::kAuto, c.syntax);
      const Streamed got = FeedInPieces(s, c.text, rng);
      ASSERT_EQ(got.result.calls.size(), c.calls) << c.text;
      ExpectStreamedAsParsed(got, c.streamed);
    }
    {
      // A duplicated arguments key: streamed as the first, parsed as the last. The call keeps a
      // fresh id, so it is not taken for the streamed one.
      ToolCallStream s(ToolCallStream::Mode::kAuto, &hermes);
      const Streamed got = FeedInPieces(
          s, "<tool_call>{\"name\":\"f\",\"arguments\":{\"a\":1},\"arguments\":{\"a\":2}}</tool_call>",
          rng);
      ASSERT_EQ(got.result.calls.size(), 1u);
      ASSERT_EQ(got.calls.count(0), 1u);
      EXPECT_EQ(got.calls.at(0).arguments, "{\"a\":1}");
      EXPECT_EQ(got.result.calls[0].arguments, "{\"a\":2}");
      EXPECT_NE(got.result.calls[0].id, got.calls.at(0).id);
    }
    for (const std::string text :
         {// "parameters" first streams; the parser prefers "arguments".
          std::string("<tool_call>{\"name\":\"f\",\"parameters\":{\"a\":1},"
                      "\"arguments\":{\"a\":2}}</tool_call>"),
          // The name given again after the arguments streamed: the parser takes the last.
          std::string("<tool_call>{\"name\":\"f\",\"arguments\":{\"a\":1},"
                      "\"name\":\"g\"}</tool_call>")}) {
      // Streamed as one call, parsed as another: the parsed call has a fresh id, not the
      // streamed one (the fuzzer's invariant, fuzz/tool_calls_fuzzer.cc).
      ToolCallStream s(ToolCallStream::Mode::kAuto, &hermes);
      const Streamed got = FeedInPieces(s, text, rng);
      ASSERT_EQ(got.result.calls.size(), 1u) << text;
      ASSERT_EQ(got.calls.count(0), 1u) << text;
      EXPECT_NE(got.result.calls[0].id, got.calls.at(0).id) << text;
      EXPECT_TRUE(got.result.calls[0].name != got.calls.at(0).name ||
                  got.result.calls[0].arguments != got.calls.at(0).arguments)
          << text;
    }
    {
      // An empty name is no call: nothing streams.
      ToolCallStream s(ToolCallStream::Mode::kAuto, &hermes);
      const Streamed got =
          FeedInPieces(s, "<tool_call>{\"name\":\"\",\"arguments\":{\"a\":1}}</tool_call>", rng);
      EXPECT_TRUE(got.deltas.empty());
    }
  }
}

// ---- the markup formats ------------------------------------------------------------------

// The functions the markup tests offer: their schemas type the XML-like formats' values.
std::vector<ToolSpec> MarkupTools() {
  return {{"get_weather", "",
           R"({"type": "object", "properties": {"city": {"type": "string"}, "days": {"type":
               "integer"}, "metric": {"type": "boolean"}, "at": {"type": ["number", "null"]},
               "where": {"type": "object"}, "tags": {"type": "array"}, "zip": {"type":
               "string"}}})"},
          {"get_time", "", R"({"type": "object", "properties": {"zone": {"type": "string"}}})"}};
}

struct MarkupCase {
  ToolCallFormat format;
  std::string text;  // from the start marker on, as the model writes it
};

// get_weather's arguments as the model writes them: JSON (the JSON formats), or one value a
// parameter as text (the XML-like formats; `string`: whether DSML marks it a string).
constexpr char kWeatherJson[] =
    R"({"city": "São Paulo", "days": 3, "metric": true, "at": 1.5, "where": {"lat": -23.5, )"
    R"("tz": [1]}, "tags": ["a", "b"], "zip": "01310", "note": "if a > b: <b>x</b> -> one\nline )"
    R"(two"})";
constexpr char kTimeJson[] = R"({"zone": "America/Sao_Paulo"})";
struct TextValue {
  const char* name;
  const char* text;
  bool string;
};
constexpr TextValue kWeatherValues[] = {{"city", "São Paulo", true},
                                        {"days", "3", false},
                                        {"metric", "true", false},
                                        {"at", "1.5", false},
                                        {"where", R"({"lat": -23.5, "tz": [1]})", false},
                                        {"tags", R"(["a", "b"])", false},
                                        {"zip", "01310", true},
                                        {"note", "if a > b: <b>x</b> -> one\nline two", true}};

// The XML-like formats' calls: each value between `open(name, string)` and `close`.
template <typename Open>
std::string XmlValues(const Open& open, const std::string& close) {
  std::string out;
  for (const TextValue& v : kWeatherValues) out += open(v.name, v.string) + v.text + close;
  return out;
}

// Each format's rendering of the same two calls: get_weather with every kind of value (a
// string that looks like a number, a multi-line string with '<' and '>' in it, a boolean, an
// object), then get_time; then text after them.
std::vector<MarkupCase> MarkupCases() {
  const std::string w = kWeatherJson, t = kTimeJson;
  // Qwen3-Coder's values on lines of their own, Python's True for the boolean (as `| string`
  // writes it in its templates).
  std::string qwen;
  for (const TextValue& v : kWeatherValues) {
    const std::string text = std::string(v.name) == "metric" ? "True" : v.text;
    qwen += absl::StrCat("<parameter=", v.name, ">\n", text, "\n</parameter>\n");
  }
  const auto dsml = [&](const std::string& block) {
    return absl::StrCat(
        "<｜DSML｜", block, ">\n<｜DSML｜invoke name=\"get_weather\">\n",
        XmlValues(
            [](const char* name, bool string) {
              return absl::StrCat("<｜DSML｜parameter name=\"", name, "\" string=\"",
                                  string ? "true" : "false", "\">");
            },
            "</｜DSML｜parameter>\n"),
        "</｜DSML｜invoke>\n<｜DSML｜invoke name=\"get_time\">\n<｜DSML｜parameter name=\"zone\" "
        "string=\"true\">America/Sao_Paulo</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜",
        block, ">Done.");
  };
  const std::string objects = absl::StrCat(R"({"name": "get_weather", "arguments": )", w,
                                           R"(}, {"name": "get_time", "arguments": )", t, "}");
  return {
      {ToolCallFormat::kQwen3Coder,
       absl::StrCat("<tool_call>\n<function=get_weather>\n", qwen,
                    "</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n"
                    "<parameter=zone>\nAmerica/Sao_Paulo\n</parameter>\n</function>\n"
                    "</tool_call>\nDone.")},
      {ToolCallFormat::kGlm45,
       absl::StrCat("<tool_call>get_weather\n",
                    XmlValues(
                        [](const char* name, bool) {
                          return absl::StrCat("<arg_key>", name, "</arg_key>\n<arg_value>");
                        },
                        "</arg_value>\n"),
                    "</tool_call><tool_call>get_time<arg_key>zone</arg_key>"
                    "<arg_value>America/Sao_Paulo</arg_value></tool_call>\nDone.")},
      {ToolCallFormat::kMinimaxM2,
       absl::StrCat("<minimax:tool_call>\n<invoke name=\"get_weather\">\n",
                    XmlValues([](const char* name,
                                 bool) { return absl::StrCat("<parameter name=\"", name, "\">"); },
                              "</parameter>\n"),
                    "</invoke>\n<invoke name=\"get_time\">\n<parameter name=\"zone\">"
                    "America/Sao_Paulo</parameter>\n</invoke>\n</minimax:tool_call>\nDone.")},
      // DeepSeek V3.2's DSML (string="false": JSON; "true": the text as it is, "01310" too),
      // and V4's, the same in a tool_calls block.
      {ToolCallFormat::kDeepSeekV32, dsml("function_calls")},
      {ToolCallFormat::kDeepSeekV32, dsml("tool_calls")},
      {ToolCallFormat::kDeepSeekV3,
       absl::StrCat("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>", w,
                    "<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>", t,
                    "<｜tool▁call▁end｜><｜tool▁calls▁end｜>Done.")},
      // R1's and V3's: "function", the name on its line, the arguments in a ```json fence.
      {ToolCallFormat::kDeepSeekV3,
       absl::StrCat(
           "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
           "```json\n",
           w,
           "\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n"
           "```json\n",
           t, "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>Done.")},
      {ToolCallFormat::kKimiK2,
       absl::StrCat("<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
                    "<|tool_call_argument_begin|>",
                    w,
                    "<|tool_call_end|><|tool_call_begin|>functions.get_time:1"
                    "<|tool_call_argument_begin|>",
                    t, "<|tool_call_end|><|tool_calls_section_end|>Done.")},
      // Mistral's v11+ tokenizers: [TOOL_CALLS]NAME[ARGS]{...} a call.
      {ToolCallFormat::kMistral,
       absl::StrCat("[TOOL_CALLS]get_weather[ARGS]", w,
                    "[TOOL_CALLS]get_time[CALL_ID]a1b2c3d4e[ARGS]", t, "Done.")},
      // MiniMax-M1's: a call object a line; Apriel's: an array.
      {ToolCallFormat::kMinimax,
       absl::StrCat("<tool_calls>\n",
                    absl::StrReplaceAll(objects, {{"}, {\"name\"", "}\n{\"name\""}}),
                    "\n</tool_calls>Done.")},
      {ToolCallFormat::kMinimax, absl::StrCat("<tool_calls>[", objects, "]</tool_calls>Done.")},
      {ToolCallFormat::kGranite, absl::StrCat("<|tool_call|>[", objects, "]Done.")},
  };
}

constexpr char kWeatherArgs[] =
    R"({"city":"São Paulo","days":3,"metric":true,"at":1.5,"where":{"lat":-23.5,"tz":[1]},)"
    R"("tags":["a","b"],"zip":"01310","note":"if a > b: <b>x</b> -> one\nline two"})";
constexpr char kTimeArgs[] = R"({"zone":"America/Sao_Paulo"})";

TEST(MarkupToolCallsTest, EveryFormatReadsTheSameCallsWithTypedValues) {
  const std::vector<ToolSpec> tools = MarkupTools();
  const ToolParamTypes types(tools);
  for (const MarkupCase& c : MarkupCases()) {
    SCOPED_TRACE(ToolCallFormatName(c.format));
    absl::StatusOr<ParsedToolCalls> p = ParseToolCalls(c.format, c.text, &types);
    ASSERT_TRUE(p.ok()) << p.status();
    ASSERT_EQ(p->calls.size(), 2u);
    EXPECT_EQ(p->calls[0].name, "get_weather");
    // "zip" is typed string: "01310" stays text; "note" is in no schema and is not JSON.
    EXPECT_EQ(p->calls[0].arguments, kWeatherArgs);
    EXPECT_EQ(p->calls[1].name, "get_time");
    EXPECT_EQ(p->calls[1].arguments, kTimeArgs);
    EXPECT_EQ(p->text, "Done.");
  }
}

TEST(MarkupToolCallsTest, ValuesWithoutSchemasAreJsonWhenTheyParse) {
  // No tools known: "3" is a number, "01310" (not JSON) stays text, "True" too.
  absl::StatusOr<ParsedToolCalls> p = ParseToolCalls(
      ToolCallFormat::kQwen3Coder,
      "<tool_call>\n<function=f>\n<parameter=a>\n3\n</parameter>\n<parameter=b>\n01310\n"
      "</parameter>\n<parameter=c>\nTrue\n</parameter>\n<parameter=d>\n\"q\"\n</parameter>\n"
      "</function>\n</tool_call>");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->calls[0].arguments, R"({"a":3,"b":"01310","c":"True","d":"q"})");
  // A string-typed parameter keeps its text exactly (here, JSON-looking text).
  const std::vector<ToolSpec> tools = {
      {"f", "", R"({"properties": {"a": {"type": "string"}, "n": {"type": "integer"}}})"}};
  const ToolParamTypes types(tools);
  p = ParseToolCalls(ToolCallFormat::kGlm45,
                     "<tool_call>f<arg_key>a</arg_key><arg_value>[1, 2]</arg_value>"
                     "<arg_key>n</arg_key><arg_value>three</arg_value></tool_call>",
                     &types);
  ASSERT_TRUE(p.ok()) << p.status();
  // An integer parameter the model wrote as a word stays text, as vLLM leaves it.
  EXPECT_EQ(p->calls[0].arguments, R"({"a":"[1, 2]","n":"three"})");
}

TEST(MarkupToolCallsTest, TheLenienciesOfVllmsReaders) {
  // Qwen3-Coder: a value without </parameter> runs to the next parameter or the function's end;
  // a reply may end (EOS) where </function></tool_call> would be; no parameters is {}.
  absl::StatusOr<ParsedToolCalls> p = ParseToolCalls(
      ToolCallFormat::kQwen3Coder,
      "<tool_call>\n<function=f>\n<parameter=a>\nx\n<parameter=b>\ny\n</function>\n</tool_call>"
      "<tool_call><function=g></function></tool_call><tool_call>\n<function=h>\n"
      "<parameter=c>\nz\n</parameter>\n");
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->calls.size(), 3u);
  EXPECT_EQ(p->calls[0].arguments, R"({"a":"x","b":"y"})");
  EXPECT_EQ(p->calls[1].arguments, "{}");
  EXPECT_EQ(p->calls[2].arguments, R"({"c":"z"})");
  // GLM: a call without arguments; DeepSeek / Kimi without their closing markers at the end.
  p = ParseToolCalls(ToolCallFormat::kGlm45, "<tool_call>now</tool_call>");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->calls[0].name, "now");
  EXPECT_EQ(p->calls[0].arguments, "{}");
  p = ParseToolCalls(ToolCallFormat::kDeepSeekV3,
                     "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\": 1}");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->calls[0].arguments, R"({"a":1})");
  p = ParseToolCalls(ToolCallFormat::kKimiK2,
                     "<|tool_calls_section_begin|> <|tool_call_begin|> functions.f:7 "
                     "<|tool_call_argument_begin|> \"{\\\"a\\\": 1}\" <|tool_call_end|>");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->calls[0].name, "f");
  EXPECT_EQ(p->calls[0].arguments, R"({"a":1})");  // a JSON string holding the object
}

TEST(MarkupToolCallsTest, CutOrMalformedCallsAreErrors) {
  const std::pair<ToolCallFormat, const char*> bad[] = {
      // Cut by the length limit inside a value, a tag, a name or the arguments.
      {ToolCallFormat::kQwen3Coder, "<tool_call>\n<function=f>\n<parameter=a>\nhal"},
      {ToolCallFormat::kQwen3Coder, "<tool_call>\n<function=f>\n<parameter=a"},
      {ToolCallFormat::kQwen3Coder, "<tool_call>\n<function=get_wea"},
      {ToolCallFormat::kQwen3Coder, "<tool_call>{\"name\": \"f\"}</tool_call>"},  // Hermes' JSON
      {ToolCallFormat::kQwen3Coder, "<tool_call>\n<function=>\n</function></tool_call>"},
      {ToolCallFormat::kGlm45, "<tool_call>f<arg_key>a</arg_key><arg_value>hal"},
      {ToolCallFormat::kGlm45, "<tool_call>f<arg_key>a</arg_key></tool_call>"},
      {ToolCallFormat::kGlm45, "<tool_call>f<arg_key>a</arg_key>x<arg_value>1</arg_value>"},
      {ToolCallFormat::kGlm45, "<tool_call><arg_key>a</arg_key><arg_value>1</arg_value>"},
      {ToolCallFormat::kMinimaxM2, "<minimax:tool_call><invoke name=\"f\"><parameter name=\"a\">1"},
      {ToolCallFormat::kMinimaxM2, "<minimax:tool_call>nothing</minimax:tool_call>"},
      {ToolCallFormat::kDeepSeekV3,
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\":"},
      {ToolCallFormat::kDeepSeekV3,
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>[1]"},
      {ToolCallFormat::kDeepSeekV3, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f{\"a\": 1}"},
      {ToolCallFormat::kDeepSeekV3,
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\": 1} "
       "junk<｜tool▁call▁end｜>"},
      {ToolCallFormat::kKimiK2, "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0"},
      {ToolCallFormat::kKimiK2,
       "<|tool_calls_section_begin|><|tool_call_begin|>:0<|tool_call_argument_begin|>{}"},
      {ToolCallFormat::kGranite, "<|tool_call|>[{\"name\": \"f\", \"arguments\": {\"a\": "},
      {ToolCallFormat::kMinimax, "<tool_calls>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}"},
      {ToolCallFormat::kMinimax, "<tool_calls>\n{\"arguments\": {}}</tool_calls>"},
      {ToolCallFormat::kMinimax, "<tool_calls></tool_calls>"},
      {ToolCallFormat::kMistral, "[TOOL_CALLS]f{\"a\": 1}"},
      {ToolCallFormat::kMistral, "[TOOL_CALLS]f[ARGS]{\"a\": "},
  };
  for (const auto& [format, text] : bad) {
    absl::StatusOr<ParsedToolCalls> p = ParseToolCalls(format, text);
    EXPECT_FALSE(p.ok()) << ToolCallFormatName(format) << ": " << text << " gave "
                         << (p.ok() ? p->calls[0].arguments : "");
  }
}

TEST(MarkupToolCallsTest, CallsStreamAsTheyAreWrittenAndKeepTheirIds) {
  const std::vector<ToolSpec> tools = MarkupTools();
  std::mt19937 rng(11);
  for (const MarkupCase& c : MarkupCases()) {
    SCOPED_TRACE(ToolCallFormatName(c.format));
    const ToolCallSyntax syntax = MakeToolCallSyntax(c.format);
    ASSERT_FALSE(syntax.start.empty());
    for (int trial = 0; trial < 40; ++trial) {
      ToolCallStream s(ToolCallStream::Mode::kAuto, &syntax, "", false, tools);
      const Streamed got = FeedInPieces(s, "Let me check. " + c.text, rng);
      EXPECT_EQ(got.streamed, "Let me check. ");
      ASSERT_EQ(got.result.calls.size(), 2u);
      EXPECT_EQ(got.result.calls[0].arguments, kWeatherArgs);
      EXPECT_EQ(got.result.calls[1].arguments, kTimeArgs);
      EXPECT_EQ(got.result.text, "Done.");
      ExpectStreamedAsParsed(got, {0, 1});
      if (c.format == ToolCallFormat::kMinimax) {
        EXPECT_EQ(got.calls.at(0).deltas, 1) << "a call goes whole once its object closes";
      } else {
        EXPECT_GT(got.calls.at(0).deltas, 1) << "several deltas for the long call";
      }
      // Deltas come in order: no delta of call 0 after one of call 1.
      bool second = false;
      for (const ToolCallDelta& d : got.deltas) {
        if (d.index == 1) second = true;
        EXPECT_FALSE(second && d.index == 0);
      }
    }
  }
}

TEST(MarkupToolCallsTest, XmlCallsStreamEachParameterOnceItIsWhole) {
  const std::vector<ToolSpec> tools = MarkupTools();
  const ToolCallSyntax syntax = MakeToolCallSyntax(ToolCallFormat::kQwen3Coder);
  ToolCallStream s(ToolCallStream::Mode::kAuto, &syntax, "", false, tools);
  std::string args;
  const auto feed = [&](std::string_view text) {
    EXPECT_EQ(s.Feed(text), "");
    for (const ToolCallDelta& d : s.TakeDeltas()) args += d.arguments;
    return args;
  };
  EXPECT_EQ(feed("<tool_call>\n<function=get_wea"), "");
  EXPECT_EQ(feed("ther>\n"), "{");  // the name is known: the object begins
  EXPECT_EQ(feed("<parameter=city>\nLi"), "{");
  EXPECT_EQ(feed("ma\n</parameter>\n"), R"({"city":"Lima")");
  EXPECT_EQ(feed("<parameter=days>\n3\n</parameter>\n</func"), R"({"city":"Lima","days":3)");
  EXPECT_EQ(feed("tion>\n</tool_call>"), R"({"city":"Lima","days":3})");
  const ToolCallStream::Result r = s.Finish(true);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, args);
}

// A value without its end tag ends at the next parameter's tag even when a later end tag
// follows (that one is the next parameter's), as vLLM reads it: whole or streamed, the same
// call, and the streamed one keeps its id.
TEST(MarkupToolCallsTest, AValueEndsAtTheNextParameterBeforeALaterEndTag) {
  const std::string text =
      "<tool_call>\n<function=f>\n<parameter=a>\nx\n<parameter=b>\ny\n</parameter>\n"
      "</function>\n</tool_call>";
  absl::StatusOr<ParsedToolCalls> p = ParseToolCalls(ToolCallFormat::kQwen3Coder, text);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->calls[0].arguments, R"({"a":"x","b":"y"})");
  const ToolCallSyntax syntax = MakeToolCallSyntax(ToolCallFormat::kQwen3Coder);
  std::mt19937 rng(12);
  for (int trial = 0; trial < 30; ++trial) {
    ToolCallStream s(ToolCallStream::Mode::kAuto, &syntax);
    const Streamed got = FeedInPieces(s, text, rng);
    ASSERT_EQ(got.result.calls.size(), 1u);
    ExpectStreamedAsParsed(got, {0});
  }
}

// A reply that ends (EOS, or a stop string on the end tag) after a call's last value closes the
// call with no end tag: the stream sent it without its "}", and Finish sends that as the call's
// last delta, so the streamed call is the returned one, id and all.
TEST(MarkupToolCallsTest, TheReplysEndClosesAStreamedCallWithALastDelta) {
  const std::pair<ToolCallFormat, std::string> cases[] = {
      {ToolCallFormat::kGlm45, "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>x</arg_value>\n"},
      {ToolCallFormat::kQwen3Coder, "<tool_call>\n<function=f>\n<parameter=a>\nx\n</parameter>\n"},
      {ToolCallFormat::kQwen3Coder, "<tool_call>\n<function=g>\n"},
      {ToolCallFormat::kMinimaxM2,
       "<minimax:tool_call><invoke name=\"f\"><parameter name=\"a\">x</parameter>"},
  };
  std::mt19937 rng(13);
  for (const auto& [format, text] : cases) {
    SCOPED_TRACE(text);
    const ToolCallSyntax syntax = MakeToolCallSyntax(format);
    ToolCallStream s(ToolCallStream::Mode::kAuto, &syntax);
    const Streamed got = FeedInPieces(s, text, rng);
    ASSERT_EQ(got.result.calls.size(), 1u);
    ExpectStreamedAsParsed(got, {0});
    EXPECT_EQ(got.calls.at(0).arguments, got.result.calls[0].arguments);
    EXPECT_EQ(got.deltas.back().arguments.back(), '}');
  }
}

// Parameter types from schemas that do not say "type" at the top: Pydantic's Optional[str]
// (anyOf with null), enums of strings; "3.10" stays text there, a number where typed so.
TEST(MarkupToolCallsTest, TypesComeFromAnyOfAndEnumsToo) {
  const std::vector<ToolSpec> tools = {
      {"f", "",
       R"({"properties": {"v": {"anyOf": [{"type": "string"}, {"type": "null"}]}, "e": )"
       R"({"enum": ["1", "2"]}, "n": {"oneOf": [{"type": "null"}, {"type": "number"}]}}})"}};
  const ToolParamTypes types(tools);
  EXPECT_EQ(types.Type("f", "v"), "string");
  EXPECT_EQ(types.Type("f", "e"), "string");
  EXPECT_EQ(types.Type("f", "n"), "number");
  absl::StatusOr<ParsedToolCalls> p = ParseToolCalls(
      ToolCallFormat::kGlm45,
      "<tool_call>f<arg_key>v</arg_key><arg_value>3.10</arg_value><arg_key>e</arg_key>"
      "<arg_value>1</arg_value><arg_key>n</arg_key><arg_value>3.10</arg_value></tool_call>",
      &types);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->calls[0].arguments, R"({"v":"3.10","e":"1","n":3.1})");
}

TEST(MarkupToolCallsTest, MistralsControlTokensAreKeptMarkers) {
  const std::vector<std::string_view> m = ToolCallMarkers(ToolCallFormat::kMistral);
  EXPECT_EQ(m, (std::vector<std::string_view>{"[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"}));
}

// Qwen3-Coder sometimes writes its functions without <tool_call> around them: "<function=" starts
// calls too (the text before it streams, "<functi" held back until it is known), and they are
// read as a block of their own, as vLLM reads them.
TEST(MarkupToolCallsTest, Qwen3CoderCallsWithoutTheirToolCallTags) {
  const ToolCallSyntax syntax = MakeToolCallSyntax(ToolCallFormat::kQwen3Coder);
  const std::string text =
      "<function=get_weather>\n<parameter=city>\nLima\n</parameter>\n</function>\n"
      "<tool_call>\n<function=get_time>\n</function>\n</tool_call>";
  std::mt19937 rng(14);
  for (int trial = 0; trial < 30; ++trial) {
    ToolCallStream s(ToolCallStream::Mode::kAuto, &syntax);
    const Streamed got = FeedInPieces(s, "Sure. " + text, rng);
    EXPECT_EQ(got.streamed, "Sure. ");
    ASSERT_EQ(got.result.calls.size(), 2u);
    EXPECT_EQ(got.result.calls[0].arguments, R"({"city":"Lima"})");
    EXPECT_EQ(got.result.calls[1].name, "get_time");
    ExpectStreamedAsParsed(got, {0, 1});
  }
  // A "<" that begins no marker is released.
  ToolCallStream s(ToolCallStream::Mode::kAuto, &syntax);
  EXPECT_EQ(s.Feed("a <fun"), "a ");
  EXPECT_EQ(s.Feed("ny> b"), "<funny> b");
  EXPECT_TRUE(s.Finish(true).calls.empty());
}

TEST(MarkupToolCallsTest, ACutCallStaysSentAndIsReturnedAsText) {
  const ToolCallSyntax syntax = MakeToolCallSyntax(ToolCallFormat::kGlm45);
  ToolCallStream s(ToolCallStream::Mode::kAuto, &syntax, "", false, MarkupTools());
  const std::string text =
      "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Lima</arg_value><arg_key>da";
  s.Feed(text);
  const std::vector<ToolCallDelta> d = s.TakeDeltas();
  ASSERT_FALSE(d.empty());
  EXPECT_EQ(d[0].name, "get_weather");
  const ToolCallStream::Result r = s.Finish(true);
  EXPECT_TRUE(r.calls.empty());
  EXPECT_TRUE(r.malformed);
  EXPECT_EQ(r.text, text);
}

}  // namespace
}  // namespace kvrm

namespace kvrm {
namespace {

// Pythonic calls: arguments of every literal kind, as Python's ast.literal_eval reads them,
// become JSON (the expected texts are json.dumps of Python's values, compact).
TEST(PythonicToolCallsTest, LiteralsBecomeJson) {
  absl::StatusOr<ParsedToolCalls> p =
      ParseToolCalls(ToolCallFormat::kPythonic, "[get_weather(city=\"Lima\", days=3), get_time()]");
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->calls.size(), 2u);
  EXPECT_EQ(p->calls[0].name, "get_weather");
  EXPECT_EQ(p->calls[0].arguments, R"({"city":"Lima","days":3})");
  EXPECT_EQ(p->calls[1].name, "get_time");
  EXPECT_EQ(p->calls[1].arguments, "{}");
  EXPECT_NE(p->calls[0].id, p->calls[1].id);
  EXPECT_EQ(p->text, "");
  const std::pair<const char*, const char*> cases[] = {
      {R"(s='it''s')", R"({"s":"its"})"},  // adjacent literals join
      {R"(s="a\"b\\c\n\t\x41\u00e9\U0001F600\101")", R"({"s":"a\"b\\c\n\tAé😀A"})"},
      {R"(s=r"C:\dir\n")", R"({"s":"C:\\dir\\n"})"},
      {"s='''two\nlines'''", R"({"s":"two\nlines"})"},
      {R"(s="\q")", R"({"s":"\\q"})"},  // an unknown escape keeps its backslash
      {"n=-42, h=0xFF, o=0o17, b=0b101, u=1_000_000",
       R"({"n":-42,"h":255,"o":15,"b":5,"u":1000000})"},
      {"f=1., g=.5, e=-2.5E+2, z=00.25, w=1e3",
       R"({"f":1.0,"g":0.5,"e":-250.0,"z":0.25,"w":1000.0})"},
      {"t=True, f=False, n=None", R"({"t":true,"f":false,"n":null})"},
      {"l=[1, 'a', [2, (3, 4)]], t=(5,), p=(6), e=()",
       R"({"l":[1,"a",[2,[3,4]]],"t":[5],"p":6,"e":[]})"},
      {"d={'k': {'n': [1]}, 1: 'one', True: 't', None: 'x', 2.5: 'f'}",
       R"({"d":{"k":{"n":[1]},"1":"one","true":"t","null":"x","2.5":"f"}})"},
      {"a = 1 ,\n  b = [1,\n 2,],\n", R"({"a":1,"b":[1,2]})"},  // spaces, newlines, trailing commas
  };
  for (const auto& [args, json] : cases) {
    p = ParseToolCalls(ToolCallFormat::kPythonic, absl::StrCat("[f(", args, ")]"));
    ASSERT_TRUE(p.ok()) << args << ": " << p.status();
    ASSERT_EQ(p->calls.size(), 1u);
    EXPECT_EQ(p->calls[0].arguments, json) << args;
  }
  // Llama 4's wrapper, and space around the list.
  p = ParseToolCalls(ToolCallFormat::kPythonic, " <|python_start|>[f(a=1)]<|python_end|>\n");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->calls[0].arguments, R"({"a":1})");
}

TEST(PythonicToolCallsTest, WhatIsNotALiteralCallListIsRefused) {
  const std::pair<const char*, const char*> cases[] = {
      {"f(a=1)", "expected '['"},
      {"[]", "none found"},
      {"[f('Lima')]", "expected a keyword argument"},
      {"[f(a=x)]", "'x' is not a literal"},
      {"[f(a=1+2)]", "expected ',' or ')'"},
      {"[f(a={1, 2})]", "sets are not JSON"},
      {"[f(a=f'{x}')]", "'f' is not a literal"},
      {"[f(a=b'x')]", "'b' is not a literal"},
      {"[f(a=1, a=2)]", "argument a repeated"},
      {"[f(a='open)]", "unterminated string"},
      {"[f(a='\\ud800')]", "pythonic tool call arguments"},  // a lone surrogate
      {"[f(a='\\U00110000')]", "escape is not a character"},
      {"[f(a=0x1ffffffffffffffff)]", "integer too large"},
      {"[f(a=007)]", "leading zeros"},
      {"[f(a=--5)]", "bad number"},
      {"[f(a='\\N{BULLET}')]", "Unicode names"},
      {"[f(a=1)] and more", "text after the list"},
      {"[f(a=1) g(b=2)]", "expected ',' or ']'"},
      {"[os.system(c='ls')]", "expected '(' after os"},
      {"[f(a=[1, 2)]", "expected ',' or ']'"},
      {"[f(a='\xff')]", "pythonic tool call arguments"},  // not UTF-8
  };
  for (const auto& [text, error] : cases) {
    absl::StatusOr<ParsedToolCalls> p = ParseToolCalls(ToolCallFormat::kPythonic, text);
    ASSERT_FALSE(p.ok()) << text;
    EXPECT_THAT(p.status().message(), HasSubstr(error)) << text;
  }
  // Nesting is bounded.
  std::string deep = "[f(a=";
  for (int i = 0; i < 100; ++i) deep += "[";
  for (int i = 0; i < 100; ++i) deep += "]";
  deep += ")]";
  absl::StatusOr<ParsedToolCalls> p = ParseToolCalls(ToolCallFormat::kPythonic, deep);
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("nested too deeply"));
}

// The stream decides at the reply's first character, as for Llama 3's JSON: a list is held and
// comes out as calls at the end, each call also a delta once its ")" closes it (its arguments
// are not JSON until read whole); prose streams, and a later "[" is only text; Llama 4's
// <|python_start|> begins calls anywhere.
TEST(PythonicToolCallsTest, StreamHoldsTheListAndReleasesProse) {
  const ToolCallSyntax syntax = MakeToolCallSyntax(ToolCallFormat::kPythonic);
  std::mt19937 rng(9);
  {
    ToolCallStream s(ToolCallStream::Mode::kAuto, &syntax);
    const Streamed got =
        FeedInPieces(s, "  [get_weather(city='Lima', unit=\"c\"), get_time(zone='UTC')]", rng);
    EXPECT_EQ(got.streamed, "");
    ASSERT_EQ(got.result.calls.size(), 2u);
    EXPECT_EQ(got.result.calls[0].arguments, R"({"city":"Lima","unit":"c"})");
    EXPECT_EQ(got.result.calls[1].name, "get_time");
    EXPECT_FALSE(got.result.malformed);
    ASSERT_EQ(got.deltas.size(), 2u);  // one a call
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_EQ(got.calls.at(i).id, got.result.calls[i].id);
      EXPECT_EQ(got.calls.at(i).name, got.result.calls[i].name);
      EXPECT_EQ(got.calls.at(i).arguments, got.result.calls[i].arguments);
    }
  }
  {
    ToolCallStream s(ToolCallStream::Mode::kAuto, &syntax);
    EXPECT_EQ(s.Feed("Sure"), "Sure");
    EXPECT_EQ(s.Feed(" [f(a=1)]"), " [f(a=1)]");
    EXPECT_TRUE(s.Finish(true).calls.empty());
  }
  {
    ToolCallStream s(ToolCallStream::Mode::kAuto, &syntax);
    const Streamed got =
        FeedInPieces(s, "Let me check. <|python_start|>[lookup(id=7)]<|python_end|>", rng);
    EXPECT_EQ(got.streamed, "Let me check. ");
    ASSERT_EQ(got.result.calls.size(), 1u);
    EXPECT_EQ(got.result.calls[0].arguments, R"({"id":7})");
  }
  {
    // A reply that begins "[" but not "[name(" (a citation, a list) streams as text: decided
    // at its first character that cannot begin a call.
    ToolCallStream s(ToolCallStream::Mode::kAuto, &syntax);
    EXPECT_EQ(s.Feed(" ["), "");
    EXPECT_EQ(s.Feed("1] See"), " [1] See");
    EXPECT_EQ(s.Feed(" the docs."), " the docs.");
    EXPECT_TRUE(s.Finish(true).calls.empty());
    ToolCallStream t(ToolCallStream::Mode::kAuto, &syntax);
    EXPECT_EQ(t.Feed("[ get_weather "), "");  // undecided
    EXPECT_EQ(t.Feed("is sunny]"), "[ get_weather is sunny]");
  }
  {
    // A call list that is not well-formed comes back whole as text at the end.
    ToolCallStream s(ToolCallStream::Mode::kAuto, &syntax);
    const Streamed got = FeedInPieces(s, "[f(1, 2)]", rng);
    EXPECT_TRUE(got.result.calls.empty());
    EXPECT_TRUE(got.result.malformed);
    EXPECT_EQ(got.streamed, "");
    EXPECT_EQ(got.result.text, "[f(1, 2)]");
    EXPECT_TRUE(got.deltas.empty());
  }
}

// Each pythonic call goes out as one delta (id, name, its whole arguments as JSON) as soon as
// its ")" closes it, before the next call is written: brackets, parentheses and quotes inside
// its string literals (single, double, triple-quoted, escaped) do not close it, nor do nested
// lists and dicts. Fed a byte at a time and in random pieces alike; the result keeps the ids.
TEST(PythonicToolCallsTest, EachCallStreamsWhenItCloses) {
  const ToolCallSyntax syntax = MakeToolCallSyntax(ToolCallFormat::kPythonic);
  const std::string first =
      R"py(search(q="a) b] (c", note='it\'s ) ok', doc='''x ')' ]''', tags=["x)", {"k": (1, 2)}]))py";
  const std::string second = R"py(get_time(zone='', empty="", tz=r"\d)"))py";
  const std::string reply = "<|python_start|>[" + first + ", " + second + "]<|python_end|>";
  absl::StatusOr<ParsedToolCalls> whole = ParseToolCalls(ToolCallFormat::kPythonic, reply);
  ASSERT_TRUE(whole.ok()) << whole.status();
  ASSERT_EQ(whole->calls.size(), 2u);
  {
    ToolCallStream s(ToolCallStream::Mode::kAuto, &syntax);
    const size_t first_end = reply.find(first) + first.size();  // just past its ")"
    int seen = 0;
    for (size_t i = 0; i < reply.size(); ++i) {
      s.Feed(reply.substr(i, 1));
      for (const ToolCallDelta& d : s.TakeDeltas()) {
        ASSERT_LT(seen, 2);
        EXPECT_EQ(d.index, seen);
        EXPECT_EQ(d.name, whole->calls[seen].name);
        EXPECT_EQ(d.arguments, whole->calls[seen].arguments);
        EXPECT_FALSE(d.id.empty());
        if (seen == 0) {
          EXPECT_EQ(i + 1, first_end) << "the first call's delta at its \")\"";
        }
        ++seen;
      }
    }
    EXPECT_EQ(seen, 2);
    const ToolCallStream::Result r = s.Finish(true);
    ASSERT_EQ(r.calls.size(), 2u);
    EXPECT_TRUE(s.TakeDeltas().empty());
  }
  std::mt19937 rng(4);
  for (int trial = 0; trial < 50; ++trial) {
    ToolCallStream s(ToolCallStream::Mode::kAuto, &syntax);
    const Streamed got = FeedInPieces(s, reply, rng);
    ASSERT_EQ(got.result.calls.size(), 2u);
    ASSERT_EQ(got.calls.size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_EQ(got.calls.at(i).deltas, 1);
      EXPECT_EQ(got.calls.at(i).id, got.result.calls[i].id);
      EXPECT_EQ(got.calls.at(i).arguments, whole->calls[i].arguments);
    }
  }
  // parallel_tool_calls false: the first call streams, the rest do not.
  ToolCallStream single(ToolCallStream::Mode::kAuto, &syntax, "", /*single_call=*/true);
  const Streamed got = FeedInPieces(single, reply, rng);
  EXPECT_EQ(got.calls.size(), 1u);
  ASSERT_EQ(got.result.calls.size(), 1u);
  EXPECT_EQ(got.result.dropped, 1);
}

TEST(PythonicToolCallsTest, NamedAndDetected) {
  EXPECT_EQ(*ToolCallFormatFromName("pythonic"), ToolCallFormat::kPythonic);
  EXPECT_EQ(*ToolCallFormatFromName("llama4_pythonic"), ToolCallFormat::kPythonic);
  EXPECT_EQ(ToolCallFormatName(ToolCallFormat::kPythonic), "pythonic");
  // Llama 4's instruction (its template also names <|python_start|> nowhere else).
  EXPECT_EQ(DetectToolCallFormat(
                "If you decide to invoke any of the function(s), you MUST put it in the format "
                "of [func_name1(params_name1=params_value1, params_name2=params_value2...), "
                "func_name2(params)]"),
            ToolCallFormat::kPythonic);
  EXPECT_THAT(ToolCallMarkers(ToolCallFormat::kPythonic),
              ::testing::ElementsAre("<|python_start|>", "<|python_end|>"));
}

}  // namespace
}  // namespace kvrm
