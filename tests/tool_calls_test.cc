// Tool calling end to end: chat requests with tools through gRPC on the tiny model, whose built-in
// template teaches the Hermes format. Forced calls (REQUIRED, a named function) are sampled at
// temperature 1 so that the random-weight model goes everywhere the constraint lets it; AUTO is
// driven by a structured-output regex that makes the model write the markup.
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/json.h"
#include "gtest/gtest.h"
#include "metrics/kvrm_metrics.h"
#include "metrics/registry.h"
#include "model/chat_config.h"
#include "server/request_validation.h"
#include "tests/test_server.h"

namespace kvrm {
namespace {

constexpr char kWeatherSchema[] =
    R"({"type": "object", "properties": {"city": {"enum": ["Lima", "Oslo"]}, )"
    R"("days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city"]})";

EngineOptions Options(int slots) {
  EngineOptions o;
  o.slots = slots;
  o.max_queue = 64;
  o.max_new_tokens = 256;
  o.prefill_chunk = 32;
  o.threads = 2;
  return o;
}

v1::GenerateRequest ToolRequest(int max_new_tokens, uint64_t seed) {
  v1::GenerateRequest r;
  v1::ChatMessage* m = r.mutable_chat()->add_messages();
  m->set_role("user");
  m->set_content("Weather in Lima?");
  v1::Tool* t = r.mutable_chat()->add_tools();
  t->set_name("get_weather");
  t->set_description("Forecast.");
  t->set_parameters(kWeatherSchema);
  v1::Tool* now = r.mutable_chat()->add_tools();
  now->set_name("now");
  r.mutable_stopping()->set_max_new_tokens(max_new_tokens);
  r.mutable_sampling()->set_temperature(1.0f);
  r.mutable_sampling()->set_seed(seed);
  return r;
}

// Checks a call against the two tools' schemas; returns whether it holds.
bool ValidCall(const v1::ToolCall& call) {
  EXPECT_TRUE(absl::StartsWith(call.id(), "call_")) << call.id();
  absl::StatusOr<Json> args = ParseJson(call.arguments(), "arguments");
  if (!args.ok() || !args->is_object()) {
    ADD_FAILURE() << call.arguments();
    return false;
  }
  if (call.name() == "now") return args->empty();
  if (call.name() != "get_weather") return false;
  for (const auto& [key, value] : args->items()) {
    if (key == "city") {
      if (!value.is_string()) return false;
      const std::string c = value.get<std::string>();
      if (c != "Lima" && c != "Oslo") return false;
    } else if (key == "days") {
      if (!value.is_number_integer()) return false;
      const int64_t d = value.get<int64_t>();
      if (d < 1 || d > 7) return false;
    } else {
      return false;  // additionalProperties: false
    }
  }
  return args->contains("city");
}

std::string StreamedText(const StreamResult& r) {
  std::string text;
  for (const v1::GenerateResponse& m : r.messages) {
    if (!m.has_finished()) text += m.text();
  }
  return text;
}

class ToolCallsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    registry_ = new MetricRegistry();
    metrics_ = new KvrmMetrics(registry_, KvrmMetricsOptions{"tiny", "kvrm"});
    ServerOptions so;
    so.tool_call_metrics = &metrics_->tool_calls();
    server_ = new TestServer(Options(4), so);
  }
  static void TearDownTestSuite() {
    delete server_;
    delete metrics_;
    delete registry_;
  }
  v1::Kvrm::Stub& stub() { return server_->stub(); }

  // The value of one sample in the registry's exposition.
  static double Sample(const std::string& series) {
    const std::string text = registry_->Render();
    for (absl::string_view line : absl::StrSplit(text, '\n')) {
      if (absl::StartsWith(line, series + " ")) {
        double v = 0;
        EXPECT_TRUE(absl::SimpleAtod(line.substr(series.size() + 1), &v)) << line;
        return v;
      }
    }
    ADD_FAILURE() << "no sample " << series;
    return -1;
  }

  static MetricRegistry* registry_;
  static KvrmMetrics* metrics_;
  static TestServer* server_;
};
MetricRegistry* ToolCallsTest::registry_ = nullptr;
KvrmMetrics* ToolCallsTest::metrics_ = nullptr;
TestServer* ToolCallsTest::server_ = nullptr;

TEST_F(ToolCallsTest, ModelInfoNamesTheParserAndTheTemplateShowsToolsAndCalls) {
  grpc::ClientContext c0;
  v1::ModelInfo mi;
  ASSERT_TRUE(stub().GetModelInfo(&c0, v1::GetModelInfoRequest(), &mi).ok());
  EXPECT_EQ(mi.tool_call_parser(), "hermes");
  {
    v1::TokenizeRequest probe;
    *probe.mutable_chat() = ToolRequest(8, 1).chat();
    grpc::ClientContext cp;
    v1::TokenizeResponse pr;
    ASSERT_TRUE(stub().Tokenize(&cp, probe, &pr).ok());
    // The replies below need room in the tiny model's 512 positions.
    ASSERT_LT(pr.token_ids_size(), 400);
  }

  // A second turn: the earlier call and its result go back into the prompt.
  v1::TokenizeRequest req;
  *req.mutable_chat() = ToolRequest(8, 1).chat();
  v1::ChatMessage* call = req.mutable_chat()->add_messages();
  call->set_role("assistant");
  v1::ToolCall* tc = call->add_tool_calls();
  tc->set_id("call_1");
  tc->set_name("get_weather");
  tc->set_arguments(R"({"city": "Lima", "days": 2})");
  v1::ChatMessage* result = req.mutable_chat()->add_messages();
  result->set_role("tool");
  result->set_tool_call_id("call_1");
  result->set_content("18C, sunny");
  grpc::ClientContext c1;
  v1::TokenizeResponse resp;
  const grpc::Status st = stub().Tokenize(&c1, req, &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(resp.prompt(),
            "<|begin_of_text|>system:\nFunctions you may call:\n<tools>\n"
            "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": "
            "\"Forecast.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": "
            "{\"enum\": [\"Lima\", \"Oslo\"]}, \"days\": {\"type\": \"integer\", \"minimum\": 1, "
            "\"maximum\": 7}}, \"required\": [\"city\"]}}}\n"
            "{\"type\": \"function\", \"function\": {\"name\": \"now\", \"parameters\": "
            "{\"type\": \"object\", \"properties\": {}}}}\n"
            "</tools>\nCall one as <tool_call>{\"name\": <name>, \"arguments\": <object>}"
            "</tool_call>.<|eot_id|>"
            "user:\nWeather in Lima?<|eot_id|>"
            "assistant:\n<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": "
            "\"Lima\", \"days\": 2}}</tool_call><|eot_id|>"
            "tool:\n<tool_response>18C, sunny</tool_response><|eot_id|>"
            "assistant:\n");

  // Without tools the built-in template renders as it did before tools existed.
  v1::TokenizeRequest plain;
  v1::ChatMessage* m = plain.mutable_chat()->add_messages();
  m->set_role("user");
  m->set_content("Hi");
  grpc::ClientContext c2;
  ASSERT_TRUE(stub().Tokenize(&c2, plain, &resp).ok());
  EXPECT_EQ(resp.prompt(), "<|begin_of_text|>user:\nHi<|eot_id|>assistant:\n");
}

TEST_F(ToolCallsTest, RequiredRepliesAreWellFormedCallsAndStreamNoText) {
  const double calls_before = Sample(
      "kvrm:tool_calls_total{model_name=\"tiny\",kv_mode=\"kvrm\"}");
  int with_calls = 0, returned = 0;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    v1::GenerateRequest r = ToolRequest(192, seed);
    r.mutable_chat()->mutable_tool_choice()->set_mode(v1::TOOL_CHOICE_MODE_REQUIRED);
    const StreamResult got = RunGenerate(stub(), r);
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    EXPECT_EQ(StreamedText(got), "") << "call text is held back";
    if (got.finished.reason() == v1::FINISH_REASON_TOOL_CALLS) {
      ++with_calls;
      EXPECT_GE(got.finished.tool_calls_size(), 1);
      std::set<std::string> ids;
      for (const v1::ToolCall& c : got.finished.tool_calls()) {
        EXPECT_TRUE(ValidCall(c)) << c.name() << " " << c.arguments();
        ids.insert(c.id());
      }
      EXPECT_EQ(ids.size(), static_cast<size_t>(got.finished.tool_calls_size()));
      EXPECT_EQ(got.text, "");
      returned += got.finished.tool_calls_size();
    } else {
      // Cut by the length limit inside the array: the partial JSON comes back as text.
      EXPECT_EQ(got.finished.reason(), v1::FINISH_REASON_LENGTH);
      EXPECT_EQ(got.finished.tool_calls_size(), 0);
      EXPECT_TRUE(absl::StartsWith(got.text, "[")) << got.text;
    }
  }
  EXPECT_GE(with_calls, 4) << "most replies should finish their calls in 192 tokens";
  EXPECT_EQ(Sample("kvrm:tool_calls_total{model_name=\"tiny\",kv_mode=\"kvrm\"}"),
            calls_before + returned);
}

TEST_F(ToolCallsTest, NamedFunctionRepliesAreItsArguments) {
  for (uint64_t seed = 11; seed <= 14; ++seed) {
    v1::GenerateRequest r = ToolRequest(96, seed);
    r.mutable_chat()->mutable_tool_choice()->set_function("get_weather");
    const StreamResult got = RunGenerate(stub(), r);
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    ASSERT_EQ(got.finished.reason(), v1::FINISH_REASON_TOOL_CALLS) << got.text;
    ASSERT_EQ(got.finished.tool_calls_size(), 1);
    EXPECT_EQ(got.finished.tool_calls(0).name(), "get_weather");
    EXPECT_TRUE(ValidCall(got.finished.tool_calls(0))) << got.finished.tool_calls(0).arguments();
    EXPECT_EQ(got.text, "");
  }
  // A function without parameters: exactly {}.
  v1::GenerateRequest r = ToolRequest(32, 3);
  r.mutable_chat()->mutable_tool_choice()->set_function("now");
  const StreamResult got = RunGenerate(stub(), r);
  ASSERT_EQ(got.finished.reason(), v1::FINISH_REASON_TOOL_CALLS);
  EXPECT_EQ(got.finished.tool_calls(0).arguments(), "{}");
}

TEST_F(ToolCallsTest, AutoParsesTheModelsMarkupAndStreamsTheTextBeforeIt) {
  v1::GenerateRequest r = ToolRequest(128, 5);
  r.set_n(2);
  r.mutable_structured()->set_regex(
      "Let me check\\. <tool_call>\\{\"name\": \"get_weather\", \"arguments\": \\{\"city\": "
      "\"(Lima|Oslo)\"\\}\\}</tool_call>");
  const StreamResult got = RunGenerate(stub(), r);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  int finished = 0;
  for (int index = 0; index < 2; ++index) {
    std::string streamed;
    for (const v1::GenerateResponse& m : got.messages) {
      if (m.index() != index) continue;
      streamed += m.text();
      if (!m.has_finished()) continue;
      ++finished;
      EXPECT_EQ(m.finished().reason(), v1::FINISH_REASON_TOOL_CALLS);
      ASSERT_EQ(m.finished().tool_calls_size(), 1);
      EXPECT_EQ(m.finished().tool_calls(0).name(), "get_weather");
      EXPECT_TRUE(ValidCall(m.finished().tool_calls(0)));
    }
    EXPECT_EQ(streamed, "Let me check. ") << index;
  }
  EXPECT_EQ(finished, 2);
}

TEST_F(ToolCallsTest, ParallelToolCallsFalseMakesAtMostOneCall) {
  // AUTO: the model writes two calls (a regex makes it); without parallel_tool_calls both come
  // back, with it false only the first.
  for (bool parallel : {true, false}) {
    v1::GenerateRequest r = ToolRequest(160, 6);
    r.mutable_chat()->set_parallel_tool_calls(parallel);
    r.mutable_structured()->set_regex(
        "<tool_call>\\{\"name\": \"get_weather\", \"arguments\": \\{\"city\": \"(Lima|Oslo)\"\\}\\}"
        "</tool_call><tool_call>\\{\"name\": \"now\", \"arguments\": \\{\\}\\}</tool_call>");
    const StreamResult got = RunGenerate(stub(), r);
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    ASSERT_EQ(got.finished.reason(), v1::FINISH_REASON_TOOL_CALLS) << got.text;
    ASSERT_EQ(got.finished.tool_calls_size(), parallel ? 2 : 1);
    EXPECT_EQ(got.finished.tool_calls(0).name(), "get_weather");
    EXPECT_TRUE(ValidCall(got.finished.tool_calls(0)));
    EXPECT_EQ(got.text, "");
  }
  // REQUIRED: the constraint is an array of one call, whatever the sampler draws.
  int with_calls = 0;
  for (uint64_t seed = 21; seed <= 26; ++seed) {
    v1::GenerateRequest r = ToolRequest(160, seed);
    r.mutable_chat()->mutable_tool_choice()->set_mode(v1::TOOL_CHOICE_MODE_REQUIRED);
    r.mutable_chat()->set_parallel_tool_calls(false);
    const StreamResult got = RunGenerate(stub(), r);
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    if (got.finished.reason() != v1::FINISH_REASON_TOOL_CALLS) continue;
    ++with_calls;
    ASSERT_EQ(got.finished.tool_calls_size(), 1) << seed;
    EXPECT_TRUE(ValidCall(got.finished.tool_calls(0)));
  }
  EXPECT_GE(with_calls, 3);
}

TEST_F(ToolCallsTest, RequiredCallsOfToolsWithRefsInTheirParameters) {
  // Pydantic writes nested models as $defs + $ref: under REQUIRED the parameters are embedded in
  // the array-of-calls schema, where their refs must still resolve to their own $defs.
  int with_calls = 0;
  for (uint64_t seed = 31; seed <= 34; ++seed) {
    v1::GenerateRequest r;
    v1::ChatMessage* m = r.mutable_chat()->add_messages();
    m->set_role("user");
    m->set_content("Convert 20 degrees");
    v1::Tool* t = r.mutable_chat()->add_tools();
    t->set_name("convert");
    t->set_parameters(R"({"$defs": {"Unit": {"enum": ["C", "F"]}}, "type": "object",
        "properties": {"unit": {"$ref": "#/$defs/Unit"}}, "required": ["unit"],
        "additionalProperties": false})");
    r.mutable_chat()->mutable_tool_choice()->set_mode(v1::TOOL_CHOICE_MODE_REQUIRED);
    r.mutable_chat()->set_parallel_tool_calls(false);  // one call: it ends within the budget
    r.mutable_stopping()->set_max_new_tokens(160);
    r.mutable_sampling()->set_temperature(1.0f);
    r.mutable_sampling()->set_seed(seed);
    const StreamResult got = RunGenerate(stub(), r);
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    if (got.finished.reason() != v1::FINISH_REASON_TOOL_CALLS) continue;
    ++with_calls;
    for (const v1::ToolCall& c : got.finished.tool_calls()) {
      absl::StatusOr<Json> args = ParseJson(c.arguments(), "arguments");
      ASSERT_TRUE(args.ok()) << c.arguments();
      EXPECT_TRUE((*args)["unit"] == "C" || (*args)["unit"] == "F") << c.arguments();
    }
  }
  EXPECT_GE(with_calls, 2);
}

TEST_F(ToolCallsTest, MalformedMarkupComesBackAsTextAndNoneNeverParses) {
  const std::string labels = "model_name=\"tiny\",kv_mode=\"kvrm\"";
  const double failures = Sample("kvrm:tool_call_parse_failures_total{" + labels + "}");
  const std::string bad = "<tool_call>{\"nam\": 1}</tool_call>";
  v1::GenerateRequest r = ToolRequest(64, 6);
  r.mutable_structured()->set_regex("<tool_call>\\{\"nam\": 1\\}</tool_call>");
  StreamResult got = RunGenerate(stub(), r);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.finished.reason(), v1::FINISH_REASON_STOP);
  EXPECT_EQ(got.finished.tool_calls_size(), 0);
  EXPECT_EQ(got.text, bad) << "nothing the model wrote is lost";
  EXPECT_EQ(StreamedText(got), "") << "held until the end";
  EXPECT_EQ(Sample("kvrm:tool_call_parse_failures_total{" + labels + "}"), failures + 1);

  const std::string good =
      "<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>";
  v1::GenerateRequest none = ToolRequest(64, 7);
  none.mutable_chat()->mutable_tool_choice()->set_mode(v1::TOOL_CHOICE_MODE_NONE);
  none.mutable_structured()->set_regex(
      "<tool_call>\\{\"name\": \"now\", \"arguments\": \\{\\}\\}</tool_call>");
  got = RunGenerate(stub(), none);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.finished.reason(), v1::FINISH_REASON_STOP);
  EXPECT_EQ(got.finished.tool_calls_size(), 0);
  EXPECT_EQ(got.text, good);
  EXPECT_FALSE(StreamedText(got).empty()) << "NONE streams the markup as text";
  EXPECT_GE(Sample("kvrm:tool_call_requests_total{" + labels + ",choice=\"none\"}"), 1);
  EXPECT_GE(Sample("kvrm:tool_call_requests_total{" + labels + ",choice=\"auto\"}"), 1);
}

TEST_F(ToolCallsTest, BadToolRequestsGetInvalidArgumentNamingTheField) {
  struct Case {
    std::function<void(v1::GenerateRequest*)> edit;
    std::string prefix;
  };
  const std::vector<Case> cases = {
      {[](v1::GenerateRequest* r) { r->mutable_chat()->mutable_tools(0)->set_name("get weather"); },
       "chat.tools[0].name: may hold only letters"},
      {[](v1::GenerateRequest* r) { r->mutable_chat()->mutable_tools(1)->set_name("get_weather"); },
       "chat.tools[1].name: 'get_weather' is also chat.tools[0]"},
      {[](v1::GenerateRequest* r) { r->mutable_chat()->mutable_tools(0)->set_parameters("[1]"); },
       "chat.tools[0].parameters: must be a JSON object"},
      {[](v1::GenerateRequest* r) { r->mutable_chat()->mutable_tools(0)->set_parameters("{"); },
       "chat.tools[0].parameters: JSON: invalid JSON"},
      {[](v1::GenerateRequest* r) { r->mutable_chat()->mutable_tool_choice()->set_function("x"); },
       "chat.tool_choice.function: 'x' is not one of chat.tools"},
      {[](v1::GenerateRequest* r) {
         r->mutable_chat()->clear_tools();
         r->mutable_chat()->mutable_tool_choice()->set_mode(v1::TOOL_CHOICE_MODE_REQUIRED);
       },
       "chat.tool_choice: needs chat.tools"},
      {[](v1::GenerateRequest* r) {
         r->mutable_chat()->mutable_tool_choice()->set_mode(v1::TOOL_CHOICE_MODE_REQUIRED);
         r->mutable_structured()->set_json_object(true);
       },
       "structured: not with chat.tool_choice REQUIRED"},
      {[](v1::GenerateRequest* r) {
         r->mutable_chat()->mutable_tools(0)->set_parameters(R"({"not": {"type": "string"}})");
         r->mutable_chat()->mutable_tool_choice()->set_function("get_weather");
       },
       "chat.tool_choice: JSON schema"},
      {[](v1::GenerateRequest* r) {
         r->mutable_chat()->set_template_kwargs(R"({"tools": []})");
       },
       "chat.template_kwargs: may not set the template's own variable 'tools'"},
      {[](v1::GenerateRequest* r) {
         r->mutable_chat()->set_template_kwargs(R"({"raise_exception": 1})");
       },
       "chat.template_kwargs: may not set the template's own variable 'raise_exception'"},
      {[](v1::GenerateRequest* r) {
         v1::ChatMessage* m = r->mutable_chat()->add_messages();
         m->set_role("assistant");
         m->add_tool_calls()->set_name("get_weather");
         m->mutable_tool_calls(0)->set_arguments("{\"city\": ");
       },
       "chat.messages[1].tool_calls[0].arguments: JSON: invalid JSON"},
      {[](v1::GenerateRequest* r) {
         v1::ChatMessage* m = r->mutable_chat()->add_messages();
         m->set_role("tool");
         m->set_tool_call_id("call\n1");
       },
       "chat.messages[1].tool_call_id: must be printable ASCII"},
      {[](v1::GenerateRequest* r) {
         v1::ChatMessage* m = r->mutable_chat()->add_messages();
         m->set_role("ipython");
       },
       "chat: unknown role: ipython (this template takes system, user, assistant and tool)"},
  };
  for (const Case& c : cases) {
    v1::GenerateRequest r = ToolRequest(8, 1);
    c.edit(&r);
    const StreamResult got = RunGenerate(stub(), r);
    EXPECT_EQ(got.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.prefix;
    EXPECT_TRUE(absl::StartsWith(got.status.error_message(), c.prefix))
        << got.status.error_message() << "\nexpected: " << c.prefix;
  }
  // A server whose model writes no known call format refuses AUTO, and serves the rest.
  const RequestLimits limits;
  v1::GenerateRequest r = ToolRequest(8, 1);
  absl::StatusOr<std::optional<ToolCalling>> auto_none =
      ToolCallingFromProto(r, ToolCallFormat::kNone, limits);
  ASSERT_FALSE(auto_none.ok());
  EXPECT_TRUE(absl::StartsWith(auto_none.status().message(), "chat.tool_choice: AUTO needs"));
  r.mutable_chat()->mutable_tool_choice()->set_mode(v1::TOOL_CHOICE_MODE_REQUIRED);
  absl::StatusOr<std::optional<ToolCalling>> required =
      ToolCallingFromProto(r, ToolCallFormat::kNone, limits);
  ASSERT_TRUE(required.ok()) << required.status();
  ASSERT_TRUE(required->has_value());
  EXPECT_EQ((*required)->mode, ToolCallStream::Mode::kRequired);
}

// A vocabulary whose Hermes markers are special tokens (Hermes 2 Pro's): decoded text skips
// special tokens, so a request offering tools keeps the markers in its text for the call parser,
// and only such a request. The tiny model is copied with two of its last merges turned into
// special <tool_call> and </tool_call> (added tokens take the ids over), and its replies are
// restricted to <tool_call> with allowed_token_ids: the held call text then fails to parse and
// is released as text, marker and all.
// A model whose template teaches Qwen3-Coder's XML calls (Qwen3.5, Qwen3-Coder): the format is
// detected from the template, the call's parameters stream as JSON once each is whole, and its
// values are typed by the tool's schema ("days" an integer, "city" a string).
TEST(ToolCallFormatsEndToEndTest, Qwen3CoderCallsAreParsedTypedAndStreamed) {
  std::unique_ptr<ModelBundle> model(LoadTinyModel());
  SetChatTemplate(
      "{%- if tools %}Call tools as <tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n"
      "</parameter>\n</function>\n</tool_call>\n{% endif %}{%- for m in messages %}{{ m.role }}: "
      "{{ m.content }}\n{%- endfor %}{%- if add_generation_prompt %}assistant: {% endif %}",
      "test", &model->chat);
  ASSERT_EQ(model->chat.tool_call_format, ToolCallFormat::kQwen3Coder);
  TestServer server(std::move(model), Options(2));
  for (uint64_t seed : {1, 2, 3}) {
    v1::GenerateRequest r = ToolRequest(160, seed);
    r.mutable_structured()->set_regex(
        "Checking\\. <tool_call>\n<function=get_weather>\n<parameter=city>\n(Lima|Oslo)\n"
        "</parameter>\n<parameter=days>\n[1-7]\n</parameter>\n</function>\n</tool_call>");
    const StreamResult got = RunGenerate(server.stub(), r);
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    std::string streamed, id, name, args;
    const v1::GenerateResponse* last = nullptr;
    for (const v1::GenerateResponse& m : got.messages) {
      streamed += m.text();
      for (const v1::ToolCallDelta& d : m.tool_call_deltas()) {
        EXPECT_EQ(d.index(), 0);
        if (!d.id().empty()) {
          EXPECT_TRUE(id.empty()) << "one first delta";
          id = d.id();
          name = d.name();
        }
        args += d.arguments();
      }
      if (m.has_finished()) last = &m;
    }
    ASSERT_NE(last, nullptr);
    EXPECT_EQ(streamed, "Checking. ");
    ASSERT_EQ(last->finished().reason(), v1::FINISH_REASON_TOOL_CALLS);
    ASSERT_EQ(last->finished().tool_calls_size(), 1);
    const v1::ToolCall& call = last->finished().tool_calls(0);
    EXPECT_EQ(call.name(), "get_weather");
    EXPECT_TRUE(ValidCall(call)) << call.arguments();
    const Json parsed = *ParseJson(call.arguments(), "arguments");
    EXPECT_TRUE(parsed.at("city").is_string());
    EXPECT_TRUE(parsed.at("days").is_number_integer()) << call.arguments();
    // The streamed call is the returned one: same id and name, its pieces the arguments.
    EXPECT_EQ(id, call.id());
    EXPECT_EQ(name, "get_weather");
    EXPECT_EQ(args, call.arguments());
  }
}

// Mistral's templates refuse tool call ids that are not 9 characters; kvrm's (and OpenAI's) are
// "call_" and 24 hex digits. For a model in the Mistral format the template sees the last 9, in
// the call and in the tool turn alike (vLLM's rule); other formats see ids as sent.
TEST(ChatToolCallIdsTest, MistralTemplatesSeeNineCharacterIds) {
  ChatConfig config;
  SetChatTemplate(
      "{%- for m in messages %}{%- if m.tool_calls is defined %}{%- for t in m.tool_calls %}"
      "{%- if t.id|length != 9 %}{{ raise_exception('Tool call IDs should be alphanumeric "
      "strings with length 9!') }}{%- endif %}[TOOL_CALLS]{{ t.function.name }}[CALL_ID]"
      "{{ t.id }}[ARGS]{{ t.function.arguments|tojson }}{%- endfor %}{%- elif m.role == 'tool' %}"
      "[TOOL_RESULTS]{{ m.tool_call_id }}[TOOL_CONTENT]{{ m.content }}[/TOOL_RESULTS]"
      "{%- else %}[INST]{{ m.content }}[/INST]{%- endif %}{%- endfor %}",
      "test", &config);
  ASSERT_EQ(config.tool_call_format, ToolCallFormat::kMistral);
  const std::string id = "call_0f1e2d3c4b5a69788796a5b4";
  v1::ChatPrompt chat;
  chat.add_messages()->set_content("Weather in Lima?");
  v1::ChatMessage* call = chat.add_messages();
  call->set_role("assistant");
  v1::ToolCall* tc = call->add_tool_calls();
  tc->set_id(id);
  tc->set_name("get_weather");
  tc->set_arguments(R"({"city": "Lima"})");
  v1::ChatMessage* result = chat.add_messages();
  result->set_role("tool");
  result->set_tool_call_id(id);
  result->set_content("18C");
  chat.mutable_messages(0)->set_role("user");
  const RequestLimits limits;
  absl::StatusOr<std::string> text = RenderChatPrompt(chat, &config, limits);
  ASSERT_TRUE(text.ok()) << text.status();
  const std::string last9 = id.substr(id.size() - 9);
  EXPECT_EQ(*text, absl::StrCat("[INST]Weather in Lima?[/INST][TOOL_CALLS]get_weather[CALL_ID]",
                                last9, "[ARGS]{\"city\": \"Lima\"}[TOOL_RESULTS]", last9,
                                "[TOOL_CONTENT]18C[/TOOL_RESULTS]"));
  // A short id is left alone (and refused here by the template itself, as in vLLM).
  tc->set_id("call_1");
  result->set_tool_call_id("call_1");
  text = RenderChatPrompt(chat, &config, limits);
  ASSERT_FALSE(text.ok());
  EXPECT_TRUE(absl::StrContains(text.status().message(), "length 9")) << text.status();
  // Another format: the ids as sent, which this template refuses.
  config.tool_call_format = ToolCallFormat::kHermes;
  tc->set_id(id);
  result->set_tool_call_id(id);
  EXPECT_FALSE(RenderChatPrompt(chat, &config, limits).ok());
}

TEST(ToolCallMarkerTokensTest, SpecialMarkersReachTheParserOnlyWhenToolsAreOffered) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(TestTmpDir()) / "kvrm-tiny-special-markers";
  fs::remove_all(dir);
  fs::copy(TinyModelDir(), dir, fs::copy_options::recursive);
  absl::StatusOr<std::string> text = ReadFileToString((dir / "tokenizer.json").string());
  ASSERT_TRUE(text.ok()) << text.status();
  absl::StatusOr<Json> tok = ParseJson(*text, "tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status();
  const int32_t first_special = (*tok)["added_tokens"][0]["id"].get<int32_t>();
  const int32_t start_id = first_special - 2, end_id = first_special - 1;
  for (auto [id, content] : {std::pair<int32_t, const char*>{start_id, "<tool_call>"},
                             {end_id, "</tool_call>"}}) {
    (*tok)["added_tokens"].push_back({{"id", id}, {"content", content}, {"single_word", false},
                                      {"lstrip", false}, {"rstrip", false},
                                      {"normalized", false}, {"special", true}});
  }
  {
    std::ofstream out(dir / "tokenizer.json", std::ios::trunc);
    out << tok->dump(2);
    ASSERT_TRUE(out.good());
  }
  absl::StatusOr<std::unique_ptr<ModelBundle>> model = ModelBundle::Load(dir.string());
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_EQ((*model)->tokenizer->TokenToId("<tool_call>"), start_id);
  ASSERT_TRUE((*model)->tokenizer->IsSpecial(start_id));
  MetricRegistry registry;
  KvrmMetrics metrics(&registry, KvrmMetricsOptions{"tiny", "kvrm"});
  ServerOptions so;
  so.tool_call_metrics = &metrics.tool_calls();
  TestServer server(std::move(*model), Options(2), so);

  v1::GenerateRequest r = ToolRequest(2, 1);
  r.mutable_sampling()->set_temperature(0.0f);
  r.mutable_sampling()->add_allowed_token_ids(start_id);
  StreamResult got = RunGenerate(server.stub(), r);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.tokens, (std::vector<int32_t>{start_id, start_id}));
  EXPECT_EQ(StreamedText(got), "") << "from the marker on, the reply is held";
  EXPECT_EQ(got.finished.reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(got.finished.tool_calls_size(), 0);
  EXPECT_EQ(got.text, "<tool_call><tool_call>");
  EXPECT_NE(registry.Render().find(
                "kvrm:tool_call_parse_failures_total{model_name=\"tiny\",kv_mode=\"kvrm\"} 1\n"),
            std::string::npos);

  // Without tools the same tokens are special tokens as ever: no text.
  r.mutable_chat()->clear_tools();
  got = RunGenerate(server.stub(), r);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.tokens, (std::vector<int32_t>{start_id, start_id}));
  EXPECT_EQ(got.text, "");
}

}  // namespace
}  // namespace kvrm
