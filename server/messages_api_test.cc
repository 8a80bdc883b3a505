#include "server/messages_api.h"

#include <string>
#include <utility>
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

MessagesRequest Parse(const std::string& body) {
  absl::StatusOr<MessagesRequest> r = ParseMessagesRequest(body, OpenAiDefaults());
  EXPECT_TRUE(r.ok()) << body << ": " << r.status();
  return r.ok() ? *std::move(r) : MessagesRequest{};
}

void ExpectRefused(const std::string& body, const std::string& param, const std::string& why = "") {
  absl::StatusOr<MessagesRequest> r = ParseMessagesRequest(body, OpenAiDefaults());
  ASSERT_FALSE(r.ok()) << "accepted: " << body;
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << body;
  EXPECT_THAT(std::string(r.status().message()), StartsWith(param + ": ")) << body;
  if (!why.empty()) {
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(why)) << body;
  }
}

TEST(MessagesRequestTest, SystemMessagesAndSamplingAreTheChat) {
  const MessagesRequest r = Parse(R"({"model": "m", "max_tokens": 20,
      "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
      "messages": [{"role": "user", "content": "Hello"}],
      "temperature": 0.5, "top_p": 0.9, "top_k": 7, "stop_sequences": ["END", "\n\n"],
      "metadata": {"user_id": "u-1"}, "stream": true, "seed": 3})");
  const v1::GenerateRequest& g = r.chat.generate;
  ASSERT_TRUE(g.has_chat());
  ASSERT_EQ(g.chat().messages_size(), 2);
  EXPECT_EQ(g.chat().messages(0).role(), "system");
  EXPECT_EQ(g.chat().messages(0).content(), "Be brief.");
  EXPECT_EQ(g.chat().messages(1).role(), "user");
  EXPECT_EQ(g.chat().messages(1).content(), "Hello");
  EXPECT_FALSE(g.chat().has_add_generation_prompt());  // the template's default: a prompt
  EXPECT_FALSE(g.chat().continue_final_message());
  EXPECT_EQ(g.stopping().max_new_tokens(), 20);
  EXPECT_THAT(g.stopping().stop_sequences(), ElementsAre("END", "\n\n"));
  EXPECT_THAT(r.stop_sequences, ElementsAre("END", "\n\n"));
  EXPECT_FLOAT_EQ(g.sampling().temperature(), 0.5f);
  EXPECT_FLOAT_EQ(g.sampling().top_p(), 0.9f);
  EXPECT_EQ(g.sampling().top_k(), 7);
  EXPECT_EQ(g.sampling().seed(), 3u);
  EXPECT_TRUE(r.chat.stream);
  EXPECT_EQ(r.chat.model, "m");
  // Service errors about these fields name the Messages parameters.
  EXPECT_EQ(r.chat.params.at("stopping.max_new_tokens"), "max_tokens");
  EXPECT_EQ(r.chat.params.at("stopping.stop_sequences"), "stop_sequences");
}

TEST(MessagesRequestTest, BlocksBecomeTurnsToolCallsAndResults) {
  const MessagesRequest r = Parse(R"({"max_tokens": 64, "messages": [
      {"role": "user", "content": [{"type": "text", "text": "Weather in "},
                                   {"type": "text", "text": "Lima?"}]},
      {"role": "assistant", "content": [
          {"type": "thinking", "thinking": "Use the tool.", "signature": "s"},
          {"type": "text", "text": "Checking."},
          {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
           "input": {"city": "Lima", "units": "C"}},
          {"type": "tool_use", "id": "toolu_2", "name": "get_time", "input": {}}]},
      {"role": "user", "content": [
          {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C"},
          {"type": "tool_result", "tool_use_id": "toolu_2",
           "content": [{"type": "text", "text": "09:00"}], "is_error": false},
          {"type": "text", "text": "And tomorrow?"}]},
      {"role": "user", "content": "Be quick."}],
    "tools": [{"name": "get_weather", "description": "d",
               "input_schema": {"type": "object", "properties": {"city": {"type": "string"},
                                                                "units": {"type": "string"}}}},
              {"type": "custom", "name": "get_time", "input_schema": {"type": "object"}}],
    "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": true}})");
  const v1::ChatPrompt& chat = r.chat.generate.chat();
  ASSERT_EQ(chat.messages_size(), 5);
  EXPECT_EQ(chat.messages(0).role(), "user");
  EXPECT_EQ(chat.messages(0).content(), "Weather in Lima?");
  EXPECT_EQ(chat.messages(1).role(), "assistant");
  EXPECT_EQ(chat.messages(1).content(), "Checking.");
  EXPECT_EQ(chat.messages(1).reasoning_content(), "Use the tool.");
  ASSERT_EQ(chat.messages(1).tool_calls_size(), 2);
  EXPECT_EQ(chat.messages(1).tool_calls(0).id(), "toolu_1");
  EXPECT_EQ(chat.messages(1).tool_calls(0).name(), "get_weather");
  // The input object, its keys in the order they were written.
  EXPECT_EQ(chat.messages(1).tool_calls(0).arguments(), R"({"city":"Lima","units":"C"})");
  EXPECT_EQ(chat.messages(1).tool_calls(1).arguments(), "{}");
  EXPECT_EQ(chat.messages(2).role(), "tool");
  EXPECT_EQ(chat.messages(2).tool_call_id(), "toolu_1");
  EXPECT_EQ(chat.messages(2).content(), "18 C");
  EXPECT_EQ(chat.messages(3).tool_call_id(), "toolu_2");
  EXPECT_EQ(chat.messages(3).content(), "09:00");
  // The text after the results, and the next user message: one user turn.
  EXPECT_EQ(chat.messages(4).role(), "user");
  EXPECT_EQ(chat.messages(4).content(), "And tomorrow?\n\nBe quick.");
  ASSERT_EQ(chat.tools_size(), 2);
  EXPECT_EQ(chat.tools(0).name(), "get_weather");
  EXPECT_EQ(chat.tools(0).description(), "d");
  EXPECT_THAT(chat.tools(0).parameters(), HasSubstr(R"("properties":{"city")"));
  EXPECT_EQ(chat.tool_choice().function(), "get_weather");
  EXPECT_FALSE(chat.parallel_tool_calls());
  EXPECT_EQ(Parse(R"({"max_tokens": 1, "messages": [{"role": "user", "content": "x"}],
                      "tools": [{"name": "f", "input_schema": {}}],
                      "tool_choice": {"type": "any"}})")
                .chat.generate.chat()
                .tool_choice()
                .mode(),
            v1::TOOL_CHOICE_MODE_REQUIRED);
  EXPECT_EQ(Parse(R"({"max_tokens": 1, "messages": [{"role": "user", "content": "x"}],
                      "tools": [{"name": "f", "input_schema": {}}],
                      "tool_choice": {"type": "none"}})")
                .chat.generate.chat()
                .tool_choice()
                .mode(),
            v1::TOOL_CHOICE_MODE_NONE);
}

TEST(MessagesRequestTest, AFinalAssistantMessageIsContinued) {
  const MessagesRequest r = Parse(R"({"max_tokens": 8, "messages": [
      {"role": "user", "content": "Name a colour."},
      {"role": "assistant", "content": "The colour is"}]})");
  const v1::ChatPrompt& chat = r.chat.generate.chat();
  ASSERT_EQ(chat.messages_size(), 2);
  EXPECT_EQ(chat.messages(1).content(), "The colour is");
  EXPECT_FALSE(chat.add_generation_prompt());
  EXPECT_TRUE(chat.continue_final_message());
}

TEST(MessagesRequestTest, AFinalAssistantMessageWithNothingToContinueIsNoPrefill) {
  const MessagesRequest r = Parse(R"({"max_tokens": 8, "messages": [
      {"role": "user", "content": "Hi"},
      {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "x"}]}]})");
  const v1::ChatPrompt& chat = r.chat.generate.chat();
  ASSERT_EQ(chat.messages_size(), 1);
  EXPECT_EQ(chat.messages(0).role(), "user");
  EXPECT_FALSE(chat.continue_final_message());
}

TEST(MessagesRequestTest, ThinkingAndOutputFormat) {
  const MessagesRequest on = Parse(R"({"max_tokens": 2048, "messages": [{"role": "user",
      "content": "x"}], "thinking": {"type": "enabled", "budget_tokens": 1024}})");
  EXPECT_THAT(on.chat.generate.chat().template_kwargs(), HasSubstr(R"("enable_thinking":true)"));
  // The budget is kept (vLLM's thinking_token_budget), named as the Messages API names it.
  EXPECT_EQ(on.chat.generate.chat().thinking_budget(), 1024);
  EXPECT_EQ(on.chat.params.at("chat.thinking_budget"), "thinking.budget_tokens");
  const MessagesRequest off = Parse(R"({"max_tokens": 8, "messages": [{"role": "user",
      "content": "x"}], "thinking": {"type": "disabled", "budget_tokens": 100}})");
  EXPECT_THAT(off.chat.generate.chat().template_kwargs(), HasSubstr(R"("enable_thinking":false)"));
  EXPECT_FALSE(off.chat.generate.chat().has_thinking_budget());
  // A chat_template_kwargs' own switch wins.
  const MessagesRequest own = Parse(R"({"max_tokens": 8, "messages": [{"role": "user",
      "content": "x"}], "thinking": {"type": "enabled"},
      "chat_template_kwargs": {"enable_thinking": false}})");
  EXPECT_THAT(own.chat.generate.chat().template_kwargs(), HasSubstr(R"("enable_thinking":false)"));
  const MessagesRequest schema = Parse(R"({"max_tokens": 8, "messages": [{"role": "user",
      "content": "x"}], "output_format": {"type": "json_schema",
      "schema": {"type": "object", "properties": {"z": {"type": "integer"}, "a": {}}}}})");
  ASSERT_EQ(schema.chat.generate.structured().constraint_case(), v1::StructuredOutput::kJsonSchema);
  EXPECT_THAT(schema.chat.generate.structured().json_schema(),
              HasSubstr(R"("properties":{"z":{"type":"integer"},"a":{}})"));
  EXPECT_EQ(schema.chat.params.at("structured.json_schema"), "output_format.schema");
}

TEST(MessagesRequestTest, RefusalsNameTheMessagesParameter) {
  const std::string user = R"("messages": [{"role": "user", "content": "x"}])";
  ExpectRefused("{" + user + "}", "max_tokens", "is required");
  ExpectRefused(R"({"max_tokens": 5})", "messages", "is required");
  ExpectRefused(R"({"max_tokens": 5, "messages": []})", "messages");
  ExpectRefused(R"({"max_tokens": "5", )" + user + "}", "max_tokens");
  ExpectRefused(R"({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]})",
                "messages[0].role", "top-level `system`");
  ExpectRefused(R"({"max_tokens": 5, "messages": [{"role": "user", "content": [
                    {"type": "image", "source": {"type": "base64", "data": "x"}}]}]})",
                "messages[0].content[0].type", "text only");
  ExpectRefused(R"({"max_tokens": 5, "messages": [{"role": "user", "content": [
                    {"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]})",
                "messages[0].content[0].type", "assistant messages");
  ExpectRefused(R"({"max_tokens": 5, "messages": [{"role": "assistant", "content": [
                    {"type": "tool_use", "id": "t", "name": "f", "input": "{}"}]}]})",
                "messages[0].content[0].input");
  ExpectRefused(R"({"max_tokens": 5, "messages": [{"role": "user", "content": [
                    {"type": "tool_result", "content": "r"}]}]})",
                "messages[0].content[0].tool_use_id", "is required");
  ExpectRefused(R"({"max_tokens": 5, "messages": [{"role": "user", "content": 3}]})",
                "messages[0].content");
  ExpectRefused(R"({"max_tokens": 5, "system": [{"type": "image"}], )" + user + "}",
                "system[0].type");
  ExpectRefused(R"({"max_tokens": 5, "tools": [{"type": "web_search_20250305",
                    "name": "web_search"}], )" +
                    user + "}",
                "tools[0].type", "only custom tools");
  ExpectRefused(R"({"max_tokens": 5, "tools": [{"name": "f"}], )" + user + "}",
                "tools[0].input_schema", "is required");
  ExpectRefused(R"({"max_tokens": 5, "tool_choice": "auto", )" + user + "}", "tool_choice");
  ExpectRefused(R"({"max_tokens": 5, "tool_choice": {"type": "some"}, )" + user + "}",
                "tool_choice.type");
  ExpectRefused(R"({"max_tokens": 5, "tool_choice": {"type": "tool"}, )" + user + "}",
                "tool_choice.name", "is required");
  ExpectRefused(R"({"max_tokens": 5, "stop_sequences": "x", )" + user + "}", "stop_sequences");
  ExpectRefused(R"({"max_tokens": 5, "stop_sequences": [1], )" + user + "}", "stop_sequences[0]");
  ExpectRefused(R"({"max_tokens": 5, "metadata": {"user_id": 3}, )" + user + "}",
                "metadata.user_id");
  ExpectRefused(R"({"max_tokens": 5, "thinking": {"type": "maybe"}, )" + user + "}",
                "thinking.type");
  ExpectRefused(R"({"max_tokens": 5, "mcp_servers": [], )" + user + "}", "mcp_servers");
  // A beta's server-side context editing is ignored: the conversation is served as sent.
  EXPECT_TRUE(ParseMessagesRequest(
                  R"({"max_tokens": 5, "context_management": {"edits": []}, )" + user + "}",
                  OpenAiDefaults())
                  .ok());
  ExpectRefused(R"({"max_tokens": 5, "output_format": {"type": "json_schema"}, )" + user + "}",
                "output_format.schema", "is required");
  // What the chat parser checks comes back under the Messages names.
  ExpectRefused(R"({"max_tokens": 5, "temperature": "hot", )" + user + "}", "temperature");
  ExpectRefused(R"({"max_tokens": 5, "system": "s", "messages": [
                    {"role": "user", "content": "a"},
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "t",
                     "name": 5, "input": {}}]}]})",
                "messages[1].content[0].name");
  ExpectRefused("[1]", "request body");
}

TEST(MessagesRequestTest, CountTokensNeedsNoMaxTokens) {
  absl::StatusOr<OpenAiTokenize> t = ParseCountTokensRequest(
      R"({"model": "m", "system": "s", "messages": [{"role": "user", "content": "hi"}],
          "tools": [{"name": "f", "input_schema": {"type": "object"}}]})");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE(t->tokenize.has_chat());
  EXPECT_EQ(t->tokenize.chat().messages_size(), 2);
  EXPECT_EQ(t->tokenize.chat().tools_size(), 1);
  EXPECT_EQ(t->request.model, "m");
  v1::TokenizeResponse response;
  for (int32_t id : {5, 6, 7}) response.add_token_ids(id);
  EXPECT_EQ(CountTokensReplyJson(response), R"({"input_tokens":3})");
  EXPECT_FALSE(ParseCountTokensRequest(R"({"messages": 1})").ok());
}

v1::GenerateResponse Text(const std::string& text, const std::string& reasoning = "") {
  v1::GenerateResponse m;
  m.set_text(text);
  m.set_reasoning_text(reasoning);
  return m;
}

v1::GenerateResponse Finish(v1::FinishReason reason, int32_t prompt_tokens,
                            int32_t completion_tokens, int32_t cached = 4) {
  v1::GenerateResponse m;
  m.mutable_finished()->set_reason(reason);
  m.mutable_finished()->mutable_usage()->set_prompt_tokens(prompt_tokens);
  m.mutable_finished()->mutable_usage()->set_completion_tokens(completion_tokens);
  m.mutable_finished()->mutable_usage()->set_cached_prompt_tokens(cached);
  return m;
}

Json ParsedBody(const MessagesReply& reply) {
  absl::StatusOr<Json> body = ParseJson(reply.Body(), "body");
  EXPECT_TRUE(body.ok()) << reply.Body();
  return body.ok() ? *body : Json();
}

TEST(MessagesReplyTest, BodyHoldsThinkingThenTextAndUsage) {
  MessagesReply reply(Parse(R"({"max_tokens": 9, "messages": [{"role": "user", "content": "x"}]})"),
                      "msg_abc", "kvrm");
  reply.Add(Text("", "Let me think."), 0);
  reply.Add(Text("Hello", ""), 0);
  reply.Add(Text(" world", ""), 0);
  reply.Add(Finish(v1::FINISH_REASON_EOS, 12, 5), 0);
  Json b = ParsedBody(reply);  // (not const: a missing key reads as null, not UB)
  EXPECT_EQ(b["id"], "msg_abc");
  EXPECT_EQ(b["type"], "message");
  EXPECT_EQ(b["role"], "assistant");
  EXPECT_EQ(b["model"], "kvrm");
  ASSERT_EQ(b["content"].size(), 2u);
  EXPECT_EQ(b["content"][0]["type"], "thinking");
  EXPECT_EQ(b["content"][0]["thinking"], "Let me think.");
  EXPECT_EQ(b["content"][1]["type"], "text");
  EXPECT_EQ(b["content"][1]["text"], "Hello world");
  EXPECT_EQ(b["stop_reason"], "end_turn");
  EXPECT_TRUE(b["stop_sequence"].is_null());
  // Anthropic's input_tokens leave out the cache's: 12 prompt tokens, 4 from the cache.
  EXPECT_EQ(b["usage"]["input_tokens"], 8);
  EXPECT_EQ(b["usage"]["cache_read_input_tokens"], 4);
  EXPECT_EQ(b["usage"]["cache_creation_input_tokens"], 0);
  EXPECT_EQ(b["usage"]["output_tokens"], 5);
}

TEST(MessagesReplyTest, StopReasons) {
  const std::vector<std::string> stops = {"END"};
  v1::Finished f;
  f.set_reason(v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(AnthropicStopReason(f, stops), "max_tokens");
  f.set_reason(v1::FINISH_REASON_EOS);
  EXPECT_EQ(AnthropicStopReason(f, stops), "end_turn");
  f.set_reason(v1::FINISH_REASON_TOOL_CALLS);
  EXPECT_EQ(AnthropicStopReason(f, stops), "tool_use");
  f.set_reason(v1::FINISH_REASON_STOP);
  f.set_matched_stop("END");
  EXPECT_EQ(AnthropicStopReason(f, stops), "stop_sequence");
  f.set_matched_stop("<|im_end|>");  // a stop token id's, not one of stop_sequences
  EXPECT_EQ(AnthropicStopReason(f, stops), "end_turn");
  f.set_reason(v1::FINISH_REASON_CANCELLED);
  EXPECT_EQ(AnthropicStopReason(f, stops), "pause_turn");
  f.set_reason(v1::FINISH_REASON_TIME_LIMIT);
  EXPECT_EQ(AnthropicStopReason(f, stops), "pause_turn");

  MessagesReply reply(Parse(R"({"max_tokens": 9, "stop_sequences": ["END"],
                                "messages": [{"role": "user", "content": "x"}]})"),
                      "msg_s", "m");
  reply.Add(Text("done"), 0);
  v1::GenerateResponse end = Finish(v1::FINISH_REASON_STOP, 3, 2);
  end.mutable_finished()->set_matched_stop("END");
  reply.Add(end, 0);
  Json b = ParsedBody(reply);  // (not const: a missing key reads as null, not UB)
  EXPECT_EQ(b["stop_reason"], "stop_sequence");
  EXPECT_EQ(b["stop_sequence"], "END");
}

TEST(MessagesReplyTest, ToolUseBlocksHoldTheInputObject) {
  MessagesReply reply(Parse(R"({"max_tokens": 9, "messages": [{"role": "user", "content": "x"}],
                                "tools": [{"name": "g", "input_schema": {}}]})"),
                      "msg_t", "m");
  reply.Add(Text("Calling."), 0);
  v1::GenerateResponse end = Finish(v1::FINISH_REASON_TOOL_CALLS, 1, 1);
  v1::ToolCall* tc = end.mutable_finished()->add_tool_calls();
  tc->set_id("call_1");
  tc->set_name("g");
  tc->set_arguments(R"({"z":1,"a":[true]})");
  reply.Add(end, 0);
  Json b = ParsedBody(reply);  // (not const: a missing key reads as null, not UB)
  ASSERT_EQ(b["content"].size(), 2u);
  EXPECT_EQ(b["content"][0]["text"], "Calling.");
  EXPECT_EQ(b["content"][1]["type"], "tool_use");
  EXPECT_EQ(b["content"][1]["id"], "call_1");
  EXPECT_EQ(b["content"][1]["name"], "g");
  EXPECT_EQ(b["content"][1]["input"]["z"], 1);
  EXPECT_EQ(b["content"][1]["input"]["a"][0], true);
  EXPECT_EQ(b["stop_reason"], "tool_use");
  // The keys in the order the model wrote them.
  EXPECT_THAT(reply.Body(), HasSubstr(R"("input":{"z":1,"a":[true]})"));
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
    // Every event's data names its own type, as Anthropic's SDKs read it.
    EXPECT_EQ((*j)["type"], std::string(type)) << block;
    out.emplace_back(std::string(type), *std::move(j));
  }
  return out;
}

TEST(MessagesReplyTest, StreamEventsStartDeltaAndStopEachBlock) {
  MessagesReply reply(Parse(R"({"max_tokens": 9, "messages": [{"role": "user", "content": "x"}],
                                "tools": [{"name": "f", "input_schema": {}}], "stream": true})"),
                      "msg_s", "m");
  std::string sse = reply.StreamStart();
  v1::GenerateResponse first = Text("", "hmm");
  first.mutable_prompt_usage()->set_prompt_tokens(7);
  first.mutable_prompt_usage()->set_cached_prompt_tokens(4);
  sse += reply.StreamMessage(first, 0);
  sse += reply.StreamMessage(Text("Calling."), 0);
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
  for (const auto& [type, data] : events) types.push_back(type);
  EXPECT_THAT(types, ElementsAre("message_start", "content_block_start", "content_block_delta",
                                 "content_block_stop", "content_block_start", "content_block_delta",
                                 "content_block_stop", "content_block_start", "content_block_delta",
                                 "content_block_delta", "content_block_stop", "message_delta",
                                 "message_stop"));
  const Json& start = events[0].second["message"];
  EXPECT_EQ(start["id"], "msg_s");
  EXPECT_EQ(start["role"], "assistant");
  EXPECT_TRUE(start["content"].empty());
  EXPECT_TRUE(start["stop_reason"].is_null());
  EXPECT_EQ(start["usage"]["input_tokens"], 3);  // the prompt's 7, 4 of them cached
  EXPECT_EQ(start["usage"]["cache_read_input_tokens"], 4);
  EXPECT_EQ(start["usage"]["output_tokens"], 0);
  EXPECT_EQ(events[1].second["index"], 0);
  EXPECT_EQ(events[1].second["content_block"]["type"], "thinking");
  EXPECT_EQ(events[2].second["delta"]["type"], "thinking_delta");
  EXPECT_EQ(events[2].second["delta"]["thinking"], "hmm");
  EXPECT_EQ(events[4].second["index"], 1);
  EXPECT_EQ(events[4].second["content_block"]["type"], "text");
  EXPECT_EQ(events[4].second["content_block"]["text"], "");
  EXPECT_EQ(events[5].second["delta"]["type"], "text_delta");
  EXPECT_EQ(events[5].second["delta"]["text"], "Calling.");
  EXPECT_EQ(events[7].second["index"], 2);
  EXPECT_EQ(events[7].second["content_block"]["type"], "tool_use");
  EXPECT_EQ(events[7].second["content_block"]["id"], "call_9");
  EXPECT_EQ(events[7].second["content_block"]["name"], "f");
  EXPECT_TRUE(events[7].second["content_block"]["input"].empty());
  EXPECT_EQ(events[8].second["delta"]["type"], "input_json_delta");
  // The pieces of partial_json make the call's input.
  EXPECT_EQ(events[8].second["delta"]["partial_json"].get<std::string>() +
                events[9].second["delta"]["partial_json"].get<std::string>(),
            "{\"a\":1}");
  EXPECT_EQ(events[10].second["index"], 2);
  EXPECT_EQ(events[11].second["delta"]["stop_reason"], "tool_use");
  EXPECT_TRUE(events[11].second["delta"]["stop_sequence"].is_null());
  EXPECT_EQ(events[11].second["usage"]["output_tokens"], 9);
  EXPECT_EQ(events[11].second["usage"]["input_tokens"], 3);
}

// The end's message carries a streamed call's last piece and the text written after it: the
// piece goes to the call's block before it stops, then the text opens its own.
TEST(MessagesReplyTest, AStreamedCallsLastPieceComesBeforeTheTextAfterIt) {
  MessagesReply reply(Parse(R"({"max_tokens": 9, "messages": [{"role": "user", "content": "x"}],
                                "tools": [{"name": "f", "input_schema": {}}], "stream": true})"),
                      "msg_p", "m");
  std::string sse = reply.StreamStart();
  v1::GenerateResponse call;
  v1::ToolCallDelta* d = call.add_tool_call_deltas();
  d->set_index(0);
  d->set_id("call_1");
  d->set_name("f");
  d->set_arguments("{\"a\":");
  sse += reply.StreamMessage(call, 0);
  v1::GenerateResponse end = Finish(v1::FINISH_REASON_TOOL_CALLS, 2, 4, 0);
  end.set_text(" done");
  end.add_tool_call_deltas()->set_index(0);
  end.mutable_tool_call_deltas(0)->set_arguments("2}");
  sse += reply.StreamMessage(end, 0);
  sse += reply.StreamEnd();
  const auto events = Events(sse);
  std::vector<std::string> types;
  for (const auto& [type, data] : events) types.push_back(type);
  EXPECT_THAT(types, ElementsAre("message_start", "content_block_start", "content_block_delta",
                                 "content_block_delta", "content_block_stop", "content_block_start",
                                 "content_block_delta", "content_block_stop", "message_delta",
                                 "message_stop"));
  EXPECT_EQ(events[3].second["index"], 0);
  EXPECT_EQ(events[3].second["delta"]["partial_json"], "2}");
  EXPECT_EQ(events[4].second["index"], 0);
  EXPECT_EQ(events[5].second["index"], 1);
  EXPECT_EQ(events[6].second["delta"]["text"], " done");
}

TEST(MessagesReplyTest, CallsThatComeWholeWithTheEndAreStreamedAsOneDelta) {
  MessagesReply reply(Parse(R"({"max_tokens": 9, "messages": [{"role": "user", "content": "x"}],
                                "stream": true})"),
                      "msg_w", "m");
  v1::GenerateResponse end = Finish(v1::FINISH_REASON_TOOL_CALLS, 2, 3, 0);
  v1::ToolCall* tc = end.mutable_finished()->add_tool_calls();
  tc->set_id("call_1");
  tc->set_name("g");
  tc->set_arguments("{\"q\":\"x\"}");
  std::string sse = reply.StreamStart();
  sse += reply.StreamMessage(end, 0);
  sse += reply.StreamEnd();
  const auto events = Events(sse);
  std::vector<std::string> types;
  for (const auto& [type, data] : events) types.push_back(type);
  EXPECT_THAT(types, ElementsAre("message_start", "content_block_start", "content_block_delta",
                                 "content_block_stop", "message_delta", "message_stop"));
  // Without prompt_usage (the end came first), message_start has the end's usage.
  EXPECT_EQ(events[0].second["message"]["usage"]["input_tokens"], 2);
  EXPECT_EQ(events[2].second["delta"]["partial_json"], "{\"q\":\"x\"}");
}

TEST(MessagesReplyTest, AnErrorAfterTheStartEndsTheStreamWithAnErrorEvent) {
  MessagesReply reply(Parse(R"({"max_tokens": 9, "messages": [{"role": "user", "content": "x"}],
                                "stream": true})"),
                      "msg_e", "m");
  std::string sse = reply.StreamStart() + reply.StreamMessage(Text("a"), 0);
  OpenAiError error;
  error.http_status = 503;
  error.type = "server_error";
  error.message = "cancelled at the end of the drain";
  sse += reply.ErrorEvent(error);
  sse += reply.StreamEnd();
  const auto events = Events(sse);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().first, "error");
  EXPECT_EQ(events.back().second["error"]["type"], "overloaded_error");
  EXPECT_EQ(events.back().second["error"]["message"], "cancelled at the end of the drain");
  for (const auto& [type, data] : events) EXPECT_NE(type, "message_stop");
}

TEST(AnthropicErrorTest, TheTypeComesFromTheStatus) {
  OpenAiError e;
  e.shape = OpenAiError::Shape::kAnthropic;
  e.message = "max_tokens: is required";
  for (const auto& [status, type] :
       std::vector<std::pair<int, std::string>>{{400, "invalid_request_error"},
                                                {401, "authentication_error"},
                                                {404, "not_found_error"},
                                                {413, "request_too_large"},
                                                {429, "rate_limit_error"},
                                                {500, "api_error"},
                                                {503, "overloaded_error"}}) {
    e.http_status = status;
    absl::StatusOr<Json> j = ParseJson(e.Json(), "error");
    ASSERT_TRUE(j.ok());
    EXPECT_EQ((*j)["type"], "error");
    EXPECT_EQ((*j)["error"]["type"], type) << status;
    EXPECT_EQ((*j)["error"]["message"], "max_tokens: is required");
  }
}

}  // namespace
}  // namespace kvrm
