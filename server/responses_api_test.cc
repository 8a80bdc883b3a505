#include "server/responses_api.h"

#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvrm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

ResponsesRequest Parse(const std::string& body) {
  absl::StatusOr<ResponsesRequest> r = ParseResponsesRequest(body, OpenAiDefaults());
  EXPECT_TRUE(r.ok()) << body << ": " << r.status();
  return r.ok() ? *std::move(r) : ResponsesRequest{};
}

void ExpectRefused(const std::string& body, const std::string& param, const std::string& why = "") {
  absl::StatusOr<ResponsesRequest> r = ParseResponsesRequest(body, OpenAiDefaults());
  ASSERT_FALSE(r.ok()) << "accepted: " << body;
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << body;
  EXPECT_THAT(std::string(r.status().message()), StartsWith(param + ": ")) << body;
  if (!why.empty()) {
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(why)) << body;
  }
}

TEST(ResponsesRequestTest, InputAndInstructionsAreTheChat) {
  const ResponsesRequest r = Parse(R"({"model": "m", "instructions": "Be brief.",
      "input": "Hello", "max_output_tokens": 20, "temperature": 0.5, "top_p": 0.9})");
  const v1::GenerateRequest& g = r.chat.generate;
  ASSERT_TRUE(g.has_chat());
  ASSERT_EQ(g.chat().messages_size(), 2);
  EXPECT_EQ(g.chat().messages(0).role(), "system");
  EXPECT_EQ(g.chat().messages(0).content(), "Be brief.");
  EXPECT_EQ(g.chat().messages(1).role(), "user");
  EXPECT_EQ(g.chat().messages(1).content(), "Hello");
  EXPECT_EQ(g.stopping().max_new_tokens(), 20);
  EXPECT_FLOAT_EQ(g.sampling().temperature(), 0.5f);
  EXPECT_FLOAT_EQ(g.sampling().top_p(), 0.9f);
  EXPECT_EQ(r.chat.model, "m");
  // Service errors about these fields name the Responses parameters.
  EXPECT_EQ(r.chat.params.at("stopping.max_new_tokens"), "max_output_tokens");
  EXPECT_EQ(r.echo["instructions"], "Be brief.");
  EXPECT_EQ(r.echo["max_output_tokens"], 20);
  EXPECT_TRUE(r.echo["tools"].is_null());
}

TEST(ResponsesRequestTest, ItemsBecomeMessagesToolCallsAndResults) {
  const ResponsesRequest r = Parse(R"({"input": [
      {"role": "developer", "content": "Use tools."},
      {"type": "message", "role": "user",
       "content": [{"type": "input_text", "text": "Weather in "}, {"type": "input_text", "text": "Lima?"}]},
      {"type": "reasoning", "id": "rs_1", "summary": []},
      {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Lima\"}"},
      {"type": "function_call", "call_id": "call_2", "name": "get_time", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "call_1", "output": "18 C"},
      {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "09:00"}]},
      {"role": "assistant", "content": [{"type": "output_text", "text": "It is 18 C."}]}],
    "tools": [{"type": "function", "name": "get_weather", "description": "d",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
              {"type": "function", "name": "get_time", "parameters": {"type": "object"}}],
    "tool_choice": {"type": "function", "name": "get_weather"}, "parallel_tool_calls": false})");
  const v1::ChatPrompt& chat = r.chat.generate.chat();
  ASSERT_EQ(chat.messages_size(), 6);
  EXPECT_EQ(chat.messages(0).role(), "system");  // developer: the templates' system
  EXPECT_EQ(chat.messages(1).content(), "Weather in Lima?");
  EXPECT_EQ(chat.messages(2).role(), "assistant");  // both calls, one turn
  ASSERT_EQ(chat.messages(2).tool_calls_size(), 2);
  EXPECT_EQ(chat.messages(2).tool_calls(0).id(), "call_1");
  EXPECT_EQ(chat.messages(2).tool_calls(0).name(), "get_weather");
  EXPECT_EQ(chat.messages(2).tool_calls(1).name(), "get_time");
  EXPECT_EQ(chat.messages(3).role(), "tool");
  EXPECT_EQ(chat.messages(3).tool_call_id(), "call_1");
  EXPECT_EQ(chat.messages(3).content(), "18 C");
  EXPECT_EQ(chat.messages(4).content(), "09:00");
  EXPECT_EQ(chat.messages(5).role(), "assistant");
  ASSERT_EQ(chat.tools_size(), 2);
  EXPECT_EQ(chat.tools(0).name(), "get_weather");
  EXPECT_EQ(chat.tools(0).description(), "d");
  EXPECT_THAT(chat.tools(0).parameters(), HasSubstr("\"city\""));
  EXPECT_EQ(chat.tool_choice().function(), "get_weather");
  EXPECT_FALSE(chat.parallel_tool_calls());
}

TEST(ResponsesRequestTest, TextFormatAndReasoning) {
  const ResponsesRequest schema = Parse(R"({"input": "x", "text": {"format": {"type": "json_schema",
      "name": "person", "strict": true,
      "schema": {"type": "object", "properties": {"z": {"type": "integer"}, "a": {}}}}}})");
  ASSERT_EQ(schema.chat.generate.structured().constraint_case(), v1::StructuredOutput::kJsonSchema);
  // The schema's properties keep the order they were written in.
  EXPECT_THAT(schema.chat.generate.structured().json_schema(),
              HasSubstr(R"("properties":{"z":{"type":"integer"},"a":{}})"));
  EXPECT_EQ(schema.chat.params.at("structured.json_schema"), "text.format.schema");
  const ResponsesRequest object =
      Parse(R"({"input": "x", "text": {"format": {"type": "json_object"}}})");
  EXPECT_TRUE(object.chat.generate.structured().json_object());
  const ResponsesRequest plain = Parse(R"({"input": "x", "text": {"format": {"type": "text"}}})");
  EXPECT_FALSE(plain.chat.generate.has_structured());
  const ResponsesRequest effort = Parse(R"({"input": "x", "reasoning": {"effort": "low"}})");
  EXPECT_THAT(effort.chat.generate.chat().template_kwargs(),
              HasSubstr("\"reasoning_effort\":\"low\""));
  const ResponsesRequest included = Parse(
      R"({"input": "x", "include": ["reasoning.encrypted_content", "message.output_text.logprobs"]})");
  EXPECT_GE(included.chat.logprobs, 0);
  EXPECT_EQ(included.chat.generate.response().top_logprobs(), 0);
  EXPECT_LT(Parse(R"({"input": "x", "include": ["reasoning.encrypted_content"]})").chat.logprobs,
            0);
  const ResponsesRequest logprobs = Parse(R"({"input": "x", "top_logprobs": 3, "stream": true})");
  EXPECT_TRUE(logprobs.chat.stream);
  EXPECT_EQ(logprobs.chat.generate.response().top_logprobs(), 3);
}

TEST(ResponsesRequestTest, RefusalsNameTheResponsesParameter) {
  ExpectRefused(R"({"input": "x", "previous_response_id": "resp_1"})", "previous_response_id",
                "stores no responses");
  ExpectRefused(R"({"input": "x", "store": "yes"})", "store");
  ExpectRefused(R"({"input": "x", "background": true})", "background");
  ExpectRefused(R"({"input": "x", "conversation": "c"})", "conversation");
  ExpectRefused(R"({"input": "x", "truncation": "auto"})", "truncation");
  ExpectRefused(R"({})", "input", "is required");
  ExpectRefused(R"({"input": 5})", "input");
  ExpectRefused(
      R"({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]})",
      "input[0].content[0].type", "text only");
  ExpectRefused(R"({"input": [{"type": "item_reference", "id": "x"}]})", "input[0].type");
  ExpectRefused(R"({"input": [{"type": "function_call", "name": "f"}]})", "input[0].call_id",
                "is required");
  ExpectRefused(R"({"input": [{"type": "message", "content": "x"}]})", "input[0].role");
  ExpectRefused(R"({"input": "x", "tools": [{"type": "web_search"}]})", "tools[0].type",
                "only function tools");
  ExpectRefused(R"({"input": "x", "max_output_tokens": "many"})", "max_output_tokens");
  ExpectRefused(R"({"input": "x", "text": {"format": {"type": "xml"}}})", "text.format.type");
  ExpectRefused(R"({"input": "x", "text": {"format": {"type": "json_schema"}}})",
                "text.format.schema", "is required");
  // What the chat parser checks comes back under the Responses names.
  ExpectRefused(R"({"input": "x", "reasoning": {"effort": "extreme"}})", "reasoning.effort");
  ExpectRefused(R"({"input": "x", "tools": [{"type": "function"}]})", "tools[0].name");
  ExpectRefused(R"({"instructions": "s", "input": [{"role": "user", "content": "a"},
                    {"role": 5, "content": "b"}]})",
                "input[1].role");
  ExpectRefused(R"({"input": "x", "temperature": "hot"})", "temperature");
  ExpectRefused("[1]", "request body");
  ExpectRefused(R"({"input": "x", "include": "all"})", "include");
  ExpectRefused(R"({"input": "x", "include": [3]})", "include[0]");
}

TEST(ResponseStoreTest, KeepsTheMostRecentWithinItsBounds) {
  ResponseStore store(/*max_entries=*/2, /*max_bytes=*/1 << 20);
  auto entry = [](const std::string& text) {
    ResponseStore::Entry e;
    e.conversation = OrderedJson::array({{{"role", "user"}, {"content", text}}});
    e.response = "{}";
    return e;
  };
  store.Put("a", entry("1"));
  store.Put("b", entry("2"));
  ASSERT_TRUE(store.Get("a").has_value());  // read: now the most recent
  store.Put("c", entry("3"));               // b goes
  EXPECT_FALSE(store.Get("b").has_value());
  EXPECT_EQ(store.Get("a")->conversation[0]["content"], "1");
  EXPECT_EQ(store.size(), 2);
  EXPECT_TRUE(store.Erase("a"));
  EXPECT_FALSE(store.Erase("a"));
  EXPECT_EQ(store.size(), 1);
  // Bytes bound: an entry larger than the whole store is not kept; others make room.
  ResponseStore small(/*max_entries=*/10, /*max_bytes=*/200);
  small.Put("big", entry(std::string(300, 'x')));
  EXPECT_FALSE(small.Get("big").has_value());
  for (int i = 0; i < 5; ++i) small.Put(std::to_string(i), entry(std::string(60, 'y')));
  EXPECT_LT(small.size(), 5);
  EXPECT_TRUE(small.Get("4").has_value());
}

TEST(ResponsesRequestTest, PreviousResponseIdContinuesTheStoredConversation) {
  ResponseStore store(8, 1 << 20);
  ResponseStore::Entry e;
  e.conversation = OrderedJson::array(
      {{{"role", "user"}, {"content", "Hi"}}, {{"role", "assistant"}, {"content", "Hello!"}}});
  e.response = "{}";
  store.Put("resp_1", e);
  absl::StatusOr<ResponsesRequest> r = ParseResponsesRequest(
      R"({"instructions": "Be brief.", "previous_response_id": "resp_1", "input": "And you?"})",
      OpenAiDefaults(), &store);
  ASSERT_TRUE(r.ok()) << r.status();
  const v1::ChatPrompt& chat = r->chat.generate.chat();
  ASSERT_EQ(chat.messages_size(), 4);
  EXPECT_EQ(chat.messages(0).role(), "system");
  EXPECT_EQ(chat.messages(1).content(), "Hi");
  EXPECT_EQ(chat.messages(2).content(), "Hello!");
  EXPECT_EQ(chat.messages(3).content(), "And you?");
  EXPECT_TRUE(r->store);
  // The conversation kept with this response leaves the instructions out.
  ASSERT_EQ(r->conversation.size(), 3u);
  EXPECT_EQ(r->conversation[2]["content"], "And you?");
  EXPECT_EQ(r->echo["previous_response_id"], "resp_1");
  absl::StatusOr<ResponsesRequest> unstored =
      ParseResponsesRequest(R"({"input": "x", "store": false})", OpenAiDefaults(), &store);
  ASSERT_TRUE(unstored.ok());
  EXPECT_FALSE(unstored->store);
  absl::StatusOr<ResponsesRequest> missing = ParseResponsesRequest(
      R"({"input": "x", "previous_response_id": "resp_9"})", OpenAiDefaults(), &store);
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.status().message()),
              StartsWith("previous_response_id: no stored response 'resp_9'"));
}

// Messages as the service sends them.
v1::GenerateResponse Text(const std::string& text, const std::string& reasoning = "") {
  v1::GenerateResponse m;
  m.set_text(text);
  m.set_reasoning_text(reasoning);
  return m;
}
v1::GenerateResponse Finish(v1::FinishReason reason, int prompt_tokens, int completion_tokens) {
  v1::GenerateResponse m;
  m.mutable_finished()->set_reason(reason);
  m.mutable_finished()->mutable_usage()->set_prompt_tokens(prompt_tokens);
  m.mutable_finished()->mutable_usage()->set_completion_tokens(completion_tokens);
  m.mutable_finished()->mutable_usage()->set_cached_prompt_tokens(4);
  m.mutable_finished()->mutable_usage()->set_reasoning_tokens(2);
  return m;
}

TEST(ResponsesReplyTest, BodyHoldsReasoningThenTheMessageAndUsage) {
  const ResponsesRequest req = Parse(R"({"input": "x", "max_output_tokens": 9,
                                         "metadata": {"k": "v"}, "temperature": 0})");
  ResponsesReply reply(req, "resp_abc", 1700000000, "kvrm");
  reply.Add(Text("", "Let me think."), 0);
  reply.Add(Text("Hello", ""), 0);
  reply.Add(Text(" world", ""), 0);
  reply.Add(Finish(v1::FINISH_REASON_EOS, 12, 5), 0);
  absl::StatusOr<Json> body = ParseJson(reply.Body(), "body");
  ASSERT_TRUE(body.ok()) << reply.Body();
  const Json& b = *body;
  EXPECT_EQ(b["id"], "resp_abc");
  EXPECT_EQ(b["object"], "response");
  EXPECT_EQ(b["created_at"], 1700000000);
  EXPECT_EQ(b["status"], "completed");
  EXPECT_EQ(b["model"], "kvrm");
  EXPECT_EQ(b["max_output_tokens"], 9);
  EXPECT_EQ(b["metadata"]["k"], "v");
  EXPECT_EQ(b["store"], false);
  ASSERT_EQ(b["output"].size(), 2u);
  EXPECT_EQ(b["output"][0]["type"], "reasoning");
  EXPECT_EQ(b["output"][0]["content"][0]["text"], "Let me think.");
  EXPECT_EQ(b["output"][1]["type"], "message");
  EXPECT_EQ(b["output"][1]["status"], "completed");
  EXPECT_EQ(b["output"][1]["role"], "assistant");
  EXPECT_EQ(b["output"][1]["content"][0]["type"], "output_text");
  EXPECT_EQ(b["output"][1]["content"][0]["text"], "Hello world");
  EXPECT_EQ(b["usage"]["input_tokens"], 12);
  EXPECT_EQ(b["usage"]["input_tokens_details"]["cached_tokens"], 4);
  EXPECT_EQ(b["usage"]["output_tokens"], 5);
  EXPECT_EQ(b["usage"]["output_tokens_details"]["reasoning_tokens"], 2);
  EXPECT_EQ(b["usage"]["total_tokens"], 17);
  EXPECT_TRUE(b["incomplete_details"].is_null());
  EXPECT_TRUE(b["error"].is_null());
}

TEST(ResponsesReplyTest, BytesThatAreNotUtf8AreWrittenAsReplacementCharacters) {
  ResponsesReply reply(Parse(R"({"input": "x"})"), "resp_u", 0, "m");
  reply.Add(Text("a\xff"), 0);
  reply.Add(Finish(v1::FINISH_REASON_EOS, 1, 1), 0);
  absl::StatusOr<Json> b = ParseJson(reply.Body(), "body");
  ASSERT_TRUE(b.ok()) << reply.Body();
  EXPECT_EQ((*b)["output"][0]["content"][0]["text"], "a\xEF\xBF\xBD");
}

TEST(ResponsesReplyTest, CutByTheLimitIsIncomplete) {
  ResponsesReply reply(Parse(R"({"input": "x"})"), "resp_1", 0, "m");
  reply.Add(Text("partial"), 0);
  reply.Add(Finish(v1::FINISH_REASON_LENGTH, 3, 1), 0);
  absl::StatusOr<Json> b = ParseJson(reply.Body(), "body");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*b)["status"], "incomplete");
  EXPECT_EQ((*b)["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ((*b)["output"][0]["status"], "incomplete");
}

// The server-sent events of a stream: (type, data) in order.
std::vector<std::pair<std::string, Json>> Events(const std::string& sse) {
  std::vector<std::pair<std::string, Json>> out;
  for (absl::string_view block : absl::StrSplit(sse, "\n\n", absl::SkipEmpty())) {
    std::vector<absl::string_view> lines = absl::StrSplit(block, '\n');
    EXPECT_EQ(lines.size(), 2u) << block;
    if (lines.size() != 2) continue;
    absl::string_view type = lines[0], data = lines[1];
    EXPECT_TRUE(absl::ConsumePrefix(&type, "event: ")) << block;
    EXPECT_TRUE(absl::ConsumePrefix(&data, "data: ")) << block;
    absl::StatusOr<Json> j = ParseJson(std::string_view(data.data(), data.size()), "event");
    EXPECT_TRUE(j.ok()) << data;
    if (!j.ok()) continue;
    EXPECT_EQ((*j)["type"], std::string(type));
    out.emplace_back(std::string(type), *j);
  }
  return out;
}

TEST(ResponsesReplyTest, TopLogprobsComeWithTheMessagesText) {
  ResponsesReply plain(Parse(R"({"input": "x"})"), "resp_p", 0, "m");
  ResponsesReply scored(Parse(R"({"input": "x", "top_logprobs": 1})"), "resp_l", 0, "m");
  v1::GenerateResponse m = Text("ab");
  for (int t = 0; t < 2; ++t) {
    v1::TokenLogprob* lp = m.add_logprobs();
    lp->set_token_id(10 + t);
    lp->set_logprob(-0.5f * (t + 1));
    v1::TopLogprob* top = lp->add_top();
    top->set_token_id(20 + t);
    top->set_logprob(-0.25f);
  }
  ResponsesReply streamed(Parse(R"({"input": "x", "top_logprobs": 1})"), "resp_t", 0, "m");
  std::string sse = streamed.StreamStart() + streamed.StreamMessage(m, 0);
  for (ResponsesReply* r : {&plain, &scored}) {
    r->Add(m, 0);
    r->Add(Finish(v1::FINISH_REASON_EOS, 1, 2), 0);
  }
  absl::StatusOr<Json> without = ParseJson(plain.Body(), "body");
  absl::StatusOr<Json> with = ParseJson(scored.Body(), "body");
  ASSERT_TRUE(without.ok() && with.ok());
  EXPECT_TRUE((*without)["output"][0]["content"][0]["logprobs"].empty());
  const Json& lps = (*with)["output"][0]["content"][0]["logprobs"];
  ASSERT_EQ(lps.size(), 2u);
  EXPECT_FLOAT_EQ(lps[1]["logprob"].get<float>(), -1.0f);
  ASSERT_EQ(lps[1]["top_logprobs"].size(), 1u);
  EXPECT_FLOAT_EQ(lps[1]["top_logprobs"][0]["logprob"].get<float>(), -0.25f);
  // The streamed delta carries its tokens' logprobs too.
  bool delta = false;
  for (const auto& [type, data] : Events(sse)) {
    if (type != "response.output_text.delta") continue;
    delta = true;
    EXPECT_EQ(data["logprobs"].size(), 2u);
  }
  EXPECT_TRUE(delta);
}

TEST(ResponsesReplyTest, StreamEventsOpenDeltaAndCloseEachItem) {
  ResponsesReply reply(Parse(R"({"input": "x", "tools": [{"type": "function", "name": "f"}]})"),
                       "resp_s", 5, "m");
  std::string sse = reply.StreamStart();
  sse += reply.StreamMessage(Text("", "hmm"), 0);
  sse += reply.StreamMessage(Text("Calling.", ""), 0);
  v1::GenerateResponse call;
  v1::ToolCallDelta* d = call.add_tool_call_deltas();
  d->set_index(0);
  d->set_id("call_9");
  d->set_name("f");
  d->set_arguments("{\"a\":");
  sse += reply.StreamMessage(call, 0);
  v1::GenerateResponse more;
  more.add_tool_call_deltas()->set_index(0);
  more.mutable_tool_call_deltas(0)->set_arguments("1}");
  sse += reply.StreamMessage(more, 0);
  v1::GenerateResponse end = Finish(v1::FINISH_REASON_TOOL_CALLS, 7, 9);
  v1::ToolCall* tc = end.mutable_finished()->add_tool_calls();
  tc->set_id("call_9");
  tc->set_name("f");
  tc->set_arguments("{\"a\":1}");
  sse += reply.StreamMessage(end, 0);
  sse += reply.StreamEnd();

  const auto events = Events(sse);
  std::vector<std::string> types;
  for (size_t i = 0; i < events.size(); ++i) {
    types.push_back(events[i].first);
    EXPECT_EQ(events[i].second["sequence_number"], static_cast<int>(i));
  }
  EXPECT_THAT(
      types,
      ElementsAre("response.created", "response.in_progress", "response.output_item.added",
                  "response.reasoning_text.delta", "response.reasoning_text.done",
                  "response.output_item.done", "response.output_item.added",
                  "response.content_part.added", "response.output_text.delta",
                  "response.output_text.done", "response.content_part.done",
                  "response.output_item.done", "response.output_item.added",
                  "response.function_call_arguments.delta",
                  "response.function_call_arguments.delta", "response.function_call_arguments.done",
                  "response.output_item.done", "response.completed"));
  EXPECT_EQ(events[0].second["response"]["status"], "in_progress");
  EXPECT_EQ(events[8].second["delta"], "Calling.");
  EXPECT_EQ(events[8].second["output_index"], 1);
  EXPECT_EQ(events[12].second["item"]["type"], "function_call");
  EXPECT_EQ(events[12].second["item"]["call_id"], "call_9");
  EXPECT_EQ(events[15].second["arguments"], "{\"a\":1}");
  const Json& done = events.back().second["response"];
  EXPECT_EQ(done["status"], "completed");
  ASSERT_EQ(done["output"].size(), 3u);
  EXPECT_EQ(done["output"][2]["arguments"], "{\"a\":1}");
  EXPECT_EQ(done["output"][2]["name"], "f");
  EXPECT_EQ(done["usage"]["output_tokens"], 9);
  // Every delta names the item it belongs to, as added.
  EXPECT_EQ(events[8].second["item_id"], events[6].second["item"]["id"]);
  EXPECT_EQ(events[13].second["item_id"], events[12].second["item"]["id"]);
}

// The end's message carries a streamed call's last piece and the text written after it: the
// piece goes to the call's item before it is done, then the text opens a message item.
TEST(ResponsesReplyTest, AStreamedCallsLastPieceComesBeforeTheTextAfterIt) {
  ResponsesReply reply(Parse(R"({"input": "x", "tools": [{"type": "function", "name": "f"}]})"),
                       "resp_p", 5, "m");
  std::string sse = reply.StreamStart();
  v1::GenerateResponse call;
  v1::ToolCallDelta* d = call.add_tool_call_deltas();
  d->set_index(0);
  d->set_id("call_1");
  d->set_name("f");
  d->set_arguments("{\"a\":");
  sse += reply.StreamMessage(call, 0);
  v1::GenerateResponse end = Finish(v1::FINISH_REASON_TOOL_CALLS, 2, 4);
  end.set_text(" done");
  end.add_tool_call_deltas()->set_index(0);
  end.mutable_tool_call_deltas(0)->set_arguments("2}");
  sse += reply.StreamMessage(end, 0);
  sse += reply.StreamEnd();
  const auto events = Events(sse);
  bool call_done = false;
  for (const auto& [type, data] : events) {
    if (type == "response.function_call_arguments.done") {
      call_done = true;
      EXPECT_EQ(data["arguments"], "{\"a\":2}");
    }
    if (type == "response.function_call_arguments.delta") {
      EXPECT_FALSE(call_done) << "a delta after its item was done";
    }
  }
  EXPECT_TRUE(call_done);
}

TEST(ResponsesReplyTest, CallsThatComeWholeWithTheEndAreItemsToo) {
  ResponsesReply reply(Parse(R"({"input": "x"})"), "resp_w", 0, "m");
  v1::GenerateResponse end = Finish(v1::FINISH_REASON_TOOL_CALLS, 1, 1);
  v1::ToolCall* tc = end.mutable_finished()->add_tool_calls();
  tc->set_id("call_1");
  tc->set_name("g");
  tc->set_arguments("{}");
  reply.Add(end, 0);
  absl::StatusOr<Json> b = ParseJson(reply.Body(), "body");
  ASSERT_TRUE(b.ok());
  ASSERT_EQ((*b)["output"].size(), 1u);
  EXPECT_EQ((*b)["output"][0]["type"], "function_call");
  EXPECT_EQ((*b)["output"][0]["call_id"], "call_1");
  EXPECT_EQ((*b)["output"][0]["status"], "completed");
}

TEST(ResponsesReplyTest, AnErrorAfterTheStartFailsTheResponse) {
  ResponsesReply reply(Parse(R"({"input": "x"})"), "resp_e", 0, "m");
  std::string sse = reply.StreamStart() + reply.StreamMessage(Text("a"), 0);
  OpenAiError error;
  error.type = "server_error";
  error.message = "cancelled at the end of the drain";
  sse += reply.ErrorEvent(error);
  sse += reply.StreamEnd();
  const auto events = Events(sse);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events[events.size() - 1].first, "response.failed");
  EXPECT_EQ(events.back().second["response"]["error"]["message"],
            "cancelled at the end of the drain");
  bool error_event = false;
  for (const auto& [type, data] : events) error_event |= type == "error";
  EXPECT_TRUE(error_event);
}

}  // namespace
}  // namespace kvrm
