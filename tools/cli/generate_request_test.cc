#include "tools/cli/generate_request.h"

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvrm::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ParseIdListTest, ParsesWithSpacesAndRejectsJunk) {
  EXPECT_THAT(*ParseIdList("1, 2 ,3", "x"), ElementsAre(1, 2, 3));
  EXPECT_THAT(*ParseIdList("-5", "x"),
              ElementsAre(-5));  // the server rejects it, not us
  EXPECT_TRUE(ParseIdList("  ", "x")->empty());
  for (const char* bad : {"1,,2", "1,a", "1.5", "99999999999", "1,"}) {
    absl::StatusOr<std::vector<int32_t>> ids = ParseIdList(bad, "token_ids");
    ASSERT_FALSE(ids.ok()) << bad;
    EXPECT_THAT(std::string(ids.status().message()), HasSubstr("--token_ids"));
  }
}

TEST(ParseStopSequencesTest, SplitsUnescapesAndKeepsOrder) {
  absl::StatusOr<std::vector<std::string>> stops =
      ParseStopSequences({"a,\\n\\n", "", "x\\x2cy", "END"});
  ASSERT_TRUE(stops.ok()) << stops.status();
  EXPECT_THAT(*stops, ElementsAre("a", "\n\n", "x,y", "END"));
  EXPECT_FALSE(ParseStopSequences({"a,,b"}).ok());
  EXPECT_FALSE(ParseStopSequences({"bad\\q"}).ok());
}

TEST(BuildGenerateRequestTest, TextPromptCarriesEveryOption) {
  GenerateOptions options;
  options.prompt = "Once upon";
  options.skip_bos = true;
  options.max_new_tokens = 17;
  options.temperature = 0.7f;
  options.top_k = 40;
  options.top_p = 0.9f;
  options.min_p = 0.05f;
  options.seed = 1234;
  options.repetition_penalty = 1.1f;
  options.presence_penalty = 0.5f;
  options.frequency_penalty = -0.5f;
  options.stop = {"\\n,THE END", "###"};
  options.stop_token_ids = "5,6";
  options.ignore_eos = true;
  options.min_tokens = 4;
  options.include_stop_str_in_output = true;
  options.truncate_prompt_tokens = -1;
  options.logit_bias = "13:-100, 42:2.5";
  options.allowed_token_ids = "13,42,7";
  options.bad_words = {"darn", "heck, no"};
  options.logprobs = 3;
  options.priority = -7;
  options.n = 3;
  options.cache_salt = "tenant-7";
  options.lora_adapter = "sql-v2";
  options.time_limit_ms = 2500;
  options.request_id = "cli-1";
  absl::StatusOr<v1::GenerateRequest> request = BuildGenerateRequest(options);
  ASSERT_TRUE(request.ok()) << request.status();

  EXPECT_EQ(request->prompt_case(), v1::GenerateRequest::kText);
  EXPECT_EQ(request->text(), "Once upon");
  EXPECT_TRUE(request->skip_bos());
  EXPECT_EQ(request->request_id(), "cli-1");
  EXPECT_EQ(request->priority(), -7);
  EXPECT_EQ(request->cache_salt(), "tenant-7");
  EXPECT_EQ(request->lora_adapter(), "sql-v2");
  const v1::SamplingParams& s = request->sampling();
  EXPECT_FLOAT_EQ(s.temperature(), 0.7f);
  EXPECT_EQ(s.top_k(), 40);
  EXPECT_FLOAT_EQ(s.top_p(), 0.9f);
  EXPECT_FLOAT_EQ(s.min_p(), 0.05f);
  ASSERT_TRUE(s.has_seed());
  EXPECT_EQ(s.seed(), 1234u);
  EXPECT_FLOAT_EQ(s.repetition_penalty(), 1.1f);
  EXPECT_FLOAT_EQ(s.presence_penalty(), 0.5f);
  EXPECT_FLOAT_EQ(s.frequency_penalty(), -0.5f);
  ASSERT_EQ(s.logit_bias_size(), 2);
  EXPECT_FLOAT_EQ(s.logit_bias().at(13), -100.0f);
  EXPECT_FLOAT_EQ(s.logit_bias().at(42), 2.5f);
  ASSERT_EQ(s.bad_words_size(), 2);
  EXPECT_EQ(s.bad_words(1), "heck, no");
  EXPECT_THAT(s.allowed_token_ids(), ElementsAre(13, 42, 7));
  const v1::StoppingCriteria& stop = request->stopping();
  EXPECT_EQ(stop.max_new_tokens(), 17);
  EXPECT_THAT(stop.stop_sequences(), ElementsAre("\n", "THE END", "###"));
  EXPECT_THAT(stop.stop_token_ids(), ElementsAre(5, 6));
  EXPECT_TRUE(stop.ignore_eos());
  EXPECT_EQ(stop.min_tokens(), 4);
  EXPECT_TRUE(stop.include_stop_str_in_output());
  EXPECT_EQ(request->truncate_prompt_tokens(), -1);
  EXPECT_EQ(stop.time_limit_ms(), 2500u);
  EXPECT_EQ(request->n(), 3);
  EXPECT_TRUE(request->response().logprobs());
  EXPECT_EQ(request->response().top_logprobs(), 3);
}

TEST(BuildGenerateRequestTest, DefaultsAreGreedyWithoutSeedOrLogprobs) {
  GenerateOptions options;
  options.token_ids = "1,2,3";
  absl::StatusOr<v1::GenerateRequest> request = BuildGenerateRequest(options);
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->prompt_case(), v1::GenerateRequest::kTokenIds);
  EXPECT_THAT(request->token_ids().ids(), ElementsAre(1, 2, 3));
  EXPECT_EQ(request->stopping().max_new_tokens(), 64);
  EXPECT_FALSE(request->sampling().has_seed());
  EXPECT_EQ(request->sampling().temperature(), 0);
  EXPECT_FALSE(request->has_response());
  EXPECT_TRUE(request->stopping().stop_sequences().empty());
}

TEST(BuildGenerateRequestTest, BeamSearchCarriesItsLengthPenalty) {
  GenerateOptions options;
  options.token_ids = "1,2,3";
  options.n = 4;
  options.beam_search = true;
  options.length_penalty = 0.5f;
  absl::StatusOr<v1::GenerateRequest> request = BuildGenerateRequest(options);
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->n(), 4);
  ASSERT_TRUE(request->has_beam_search());
  EXPECT_FLOAT_EQ(request->beam_search().length_penalty(), 0.5f);
  options.beam_search = false;
  EXPECT_FALSE(BuildGenerateRequest(options).ok()) << "a length penalty without beam search";
  options.length_penalty.reset();
  EXPECT_FALSE(BuildGenerateRequest(options)->has_beam_search());
  options.beam_search = true;
  EXPECT_FALSE(BuildGenerateRequest(options)->beam_search().has_length_penalty())
      << "unset: the server's 1";
  options.length_penalty = 0.0f;
  EXPECT_TRUE(BuildGenerateRequest(options)->beam_search().has_length_penalty())
      << "0 is a value: no length normalisation";
}

TEST(BuildGenerateRequestTest, LogprobsZeroMeansSampledTokenOnly) {
  GenerateOptions options;
  options.prompt = "x";
  options.logprobs = 0;
  absl::StatusOr<v1::GenerateRequest> request = BuildGenerateRequest(options);
  ASSERT_TRUE(request.ok());
  EXPECT_TRUE(request->response().logprobs());
  EXPECT_EQ(request->response().top_logprobs(), 0);
}

TEST(BuildGenerateRequestTest, PromptLogprobsScoreThePrompt) {
  GenerateOptions options;
  options.prompt = "x";
  absl::StatusOr<v1::GenerateRequest> request = BuildGenerateRequest(options);
  ASSERT_TRUE(request.ok());
  EXPECT_FALSE(request->response().prompt_logprobs());
  options.prompt_logprobs = 2;
  request = BuildGenerateRequest(options);
  ASSERT_TRUE(request.ok());
  EXPECT_TRUE(request->response().prompt_logprobs());
  EXPECT_EQ(request->response().prompt_top_logprobs(), 2);
}

TEST(ParseLogitBiasTest, ParsesPairsAndRejectsJunk) {
  absl::StatusOr<std::vector<std::pair<int32_t, float>>> bias = ParseLogitBias(" 7:-1.5,9:100 ");
  ASSERT_TRUE(bias.ok()) << bias.status();
  EXPECT_EQ(*bias, (std::vector<std::pair<int32_t, float>>{{7, -1.5f}, {9, 100.0f}}));
  EXPECT_TRUE(ParseLogitBias("").ok());
  for (const char* junk : {"7", "7:", ":1", "x:1", "7:1:2", "7:1,"}) {
    EXPECT_EQ(ParseLogitBias(junk).status().code(), absl::StatusCode::kInvalidArgument) << junk;
  }
}

TEST(BuildGenerateRequestTest, NeedsExactlyOnePrompt) {
  GenerateOptions neither;
  EXPECT_EQ(BuildGenerateRequest(neither).status().code(), absl::StatusCode::kInvalidArgument);
  GenerateOptions both;
  both.prompt = "x";
  both.token_ids = "1";
  EXPECT_EQ(BuildGenerateRequest(both).status().code(), absl::StatusCode::kInvalidArgument);
  GenerateOptions bad_ids;
  bad_ids.token_ids = "1,x";
  EXPECT_EQ(BuildGenerateRequest(bad_ids).status().code(), absl::StatusCode::kInvalidArgument);
  GenerateOptions blank_ids;
  blank_ids.token_ids = " ";
  EXPECT_EQ(BuildGenerateRequest(blank_ids).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BuildGenerateRequestTest, MessagesBecomeChatTurnsInOrder) {
  GenerateOptions options;
  options.system = "Be brief.";
  options.messages = {"user:Hi: there", "assistant:Hello.", "user:"};
  absl::StatusOr<v1::GenerateRequest> r = BuildGenerateRequest(options);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->has_chat());
  ASSERT_EQ(r->chat().messages_size(), 4);
  EXPECT_EQ(r->chat().messages(0).role(), "system");
  EXPECT_EQ(r->chat().messages(0).content(), "Be brief.");
  EXPECT_EQ(r->chat().messages(1).role(), "user");
  EXPECT_EQ(r->chat().messages(1).content(), "Hi: there");  // split at the first colon only
  EXPECT_EQ(r->chat().messages(2).role(), "assistant");
  EXPECT_EQ(r->chat().messages(3).content(), "");
  EXPECT_FALSE(r->chat().has_add_generation_prompt()) << "the server's default (true)";

  GenerateOptions no_role;
  no_role.messages = {":Hi"};
  EXPECT_THAT(std::string(BuildGenerateRequest(no_role).status().message()),
              HasSubstr("--message: ':Hi' is not role:content"));
  no_role.messages = {"Hi"};
  EXPECT_EQ(BuildGenerateRequest(no_role).status().code(), absl::StatusCode::kInvalidArgument);
  GenerateOptions system_only;
  system_only.system = "x";
  EXPECT_THAT(std::string(BuildGenerateRequest(system_only).status().message()),
              HasSubstr("--system needs a --message"));
  GenerateOptions cont;
  cont.messages = {"user:Hi", "assistant:Hel"};
  cont.continue_final_message = true;
  absl::StatusOr<v1::GenerateRequest> c = BuildGenerateRequest(cont);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->chat().continue_final_message());
  GenerateOptions cont_text;
  cont_text.prompt = "x";
  cont_text.continue_final_message = true;
  EXPECT_THAT(std::string(BuildGenerateRequest(cont_text).status().message()),
              HasSubstr("--continue_final_message needs --message"));
  GenerateOptions chat_and_text;
  chat_and_text.prompt = "x";
  chat_and_text.messages = {"user:y"};
  EXPECT_EQ(BuildGenerateRequest(chat_and_text).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(BuildGenerateRequestTest, StructuredOutputFlags) {
  GenerateOptions options;
  options.prompt = "x";
  absl::StatusOr<v1::GenerateRequest> none = BuildGenerateRequest(options);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_structured());

  options.regex = "[0-9]+";
  absl::StatusOr<v1::GenerateRequest> regex = BuildGenerateRequest(options);
  ASSERT_TRUE(regex.ok()) << regex.status();
  EXPECT_EQ(regex->structured().regex(), "[0-9]+");

  options.regex.clear();
  options.choice = {"yes,no", "maybe\\x2c later"};
  absl::StatusOr<v1::GenerateRequest> choice = BuildGenerateRequest(options);
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_THAT(choice->structured().choice().choices(), ElementsAre("yes", "no", "maybe, later"));

  options.choice.clear();
  const std::string path = std::string(getenv("TEST_TMPDIR")) + "/schema.json";
  {
    std::ofstream f(path);
    f << R"({"type": "integer"})";
  }
  options.json_schema = "@" + path;
  options.whitespace_pattern = "[ \\n]{0,4}";
  absl::StatusOr<v1::GenerateRequest> schema = BuildGenerateRequest(options);
  ASSERT_TRUE(schema.ok()) << schema.status();
  EXPECT_EQ(schema->structured().json_schema(), R"({"type": "integer"})");
  EXPECT_EQ(schema->structured().whitespace_pattern(), "[ \\n]{0,4}");

  options.json_schema = "@" + path + ".missing";
  absl::StatusOr<v1::GenerateRequest> missing = BuildGenerateRequest(options);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("--json_schema"), absl::string_view::npos);

  const std::string gbnf = std::string(getenv("TEST_TMPDIR")) + "/list.gbnf";
  {
    std::ofstream f(gbnf);
    f << "root ::= \"[\" [0-9]+ \"]\"\n";
  }
  options.json_schema.clear();
  options.whitespace_pattern.clear();
  options.grammar = "@" + gbnf;
  absl::StatusOr<v1::GenerateRequest> grammar = BuildGenerateRequest(options);
  ASSERT_TRUE(grammar.ok()) << grammar.status();
  EXPECT_EQ(grammar->structured().grammar(), "root ::= \"[\" [0-9]+ \"]\"\n");
  options.grammar = "root ::= \"x\"";
  grammar = BuildGenerateRequest(options);
  ASSERT_TRUE(grammar.ok()) << grammar.status();
  EXPECT_EQ(grammar->structured().grammar(), "root ::= \"x\"");
  options.grammar = "@" + gbnf + ".missing";
  EXPECT_NE(BuildGenerateRequest(options).status().message().find("--grammar: "),
            absl::string_view::npos);
  options.grammar = "root ::= \"x\"";
  options.regex = "x";
  EXPECT_NE(BuildGenerateRequest(options).status().message().find("at most one"),
            absl::string_view::npos);
  options.regex.clear();
  options.grammar.clear();

  options.json_schema = R"({"type": "integer"})";
  options.json_object = true;
  absl::StatusOr<v1::GenerateRequest> two = BuildGenerateRequest(options);
  EXPECT_EQ(two.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(two.status().message().find("at most one"), absl::string_view::npos);

  GenerateOptions ws;
  ws.prompt = "x";
  ws.regex = "a";
  ws.whitespace_pattern = " ";
  EXPECT_EQ(BuildGenerateRequest(ws).status().code(), absl::StatusCode::kInvalidArgument);

  // --include_thinking rides on a constraint, and only on one.
  GenerateOptions thinking;
  thinking.prompt = "x";
  thinking.include_thinking = true;
  EXPECT_EQ(BuildGenerateRequest(thinking).status().code(), absl::StatusCode::kInvalidArgument);
  thinking.regex = "a";
  absl::StatusOr<v1::GenerateRequest> held = BuildGenerateRequest(thinking);
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_TRUE(held->structured().include_thinking());
}

TEST(BuildGenerateRequestTest, ToolFlags) {
  GenerateOptions options;
  options.messages = {"user:Weather?"};
  // OpenAI's shape and the bare function object; the schema's keys stay in their order.
  options.tools =
      R"([{"type": "function", "function": {"name": "get_weather", "description": "Now.", )"
      R"("parameters": {"type": "object", "properties": {"z": {}, "a": {}}}}}, {"name": "now"}])";
  options.tool_choice = "get_weather";
  options.template_kwargs = R"({"enable_thinking": false})";
  absl::StatusOr<v1::GenerateRequest> r = BuildGenerateRequest(options);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->chat().tools_size(), 2);
  EXPECT_EQ(r->chat().tools(0).name(), "get_weather");
  EXPECT_EQ(r->chat().tools(0).description(), "Now.");
  EXPECT_EQ(r->chat().tools(0).parameters(),
            R"({"type":"object","properties":{"z":{},"a":{}}})");
  EXPECT_EQ(r->chat().tools(1).name(), "now");
  EXPECT_EQ(r->chat().tools(1).parameters(), "");
  EXPECT_EQ(r->chat().tool_choice().function(), "get_weather");
  EXPECT_EQ(r->chat().template_kwargs(), R"({"enable_thinking": false})");
  EXPECT_FALSE(r->chat().has_parallel_tool_calls());
  EXPECT_FALSE(r->chat().has_thinking_budget());
  options.thinking_budget = 0;
  r = BuildGenerateRequest(options);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(r->chat().has_thinking_budget());
  EXPECT_EQ(r->chat().thinking_budget(), 0);
  options.thinking_budget.reset();
  options.parallel_tool_calls = false;
  r = BuildGenerateRequest(options);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(r->chat().has_parallel_tool_calls());
  EXPECT_FALSE(r->chat().parallel_tool_calls());
  for (const char* mode : {"auto", "none", "required"}) {
    options.tool_choice = mode;
    r = BuildGenerateRequest(options);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->chat().tool_choice().choice_case(), v1::ToolChoice::kMode) << mode;
  }
  EXPECT_EQ(r->chat().tool_choice().mode(), v1::TOOL_CHOICE_MODE_REQUIRED);

  options.tools = R"({"name": "x"})";
  EXPECT_THAT(BuildGenerateRequest(options).status().message(), HasSubstr("--tools: expected"));
  options.tools = R"([{"description": "x"}])";
  EXPECT_THAT(BuildGenerateRequest(options).status().message(),
              HasSubstr("entry 0 has no \"name\""));
  options.tools = "[";
  EXPECT_THAT(BuildGenerateRequest(options).status().message(), HasSubstr("--tools"));
  GenerateOptions text;
  text.prompt = "x";
  text.tool_choice = "required";
  EXPECT_THAT(BuildGenerateRequest(text).status().message(), HasSubstr("need --message"));
  text.tool_choice.clear();
  text.thinking_budget = 64;
  EXPECT_THAT(BuildGenerateRequest(text).status().message(), HasSubstr("need --message"));
}

}  // namespace
}  // namespace kvrm::cli
