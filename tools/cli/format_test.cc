#include "tools/cli/format.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvrm::cli {
namespace {

using ::testing::HasSubstr;

TEST(FormatTest, FinishReasonNames) {
  EXPECT_EQ(FinishReasonName(v1::FINISH_REASON_LENGTH), "LENGTH");
  EXPECT_EQ(FinishReasonName(v1::FINISH_REASON_TIME_LIMIT), "TIME_LIMIT");
  EXPECT_EQ(FinishReasonName(static_cast<v1::FinishReason>(42)), "REASON_42");
}

TEST(FormatTest, SummaryLine) {
  v1::Finished finished;
  finished.set_reason(v1::FINISH_REASON_STOP);
  finished.set_matched_stop("\n###");
  finished.mutable_usage()->set_prompt_tokens(5);
  finished.mutable_usage()->set_completion_tokens(64);
  finished.set_queue_time_ms(0.25);
  finished.set_time_to_first_token_ms(12.04);
  finished.set_total_time_ms(400);
  EXPECT_EQ(FormatSummary(finished),
            "finish=STOP prompt_tokens=5 completion_tokens=64 queue_ms=0.2 ttft_ms=12.0 "
            "total_ms=400.0 tokens/s=160.0 matched_stop=\"\\n###\"");
}

TEST(FormatTest, SummaryNamesCachedPromptTokensWhenThereAreAny) {
  v1::Finished finished;
  finished.set_reason(v1::FINISH_REASON_LENGTH);
  finished.mutable_usage()->set_prompt_tokens(300);
  finished.mutable_usage()->set_completion_tokens(10);
  finished.mutable_usage()->set_cached_prompt_tokens(256);
  finished.set_total_time_ms(100);
  EXPECT_EQ(FormatSummary(finished),
            "finish=LENGTH prompt_tokens=300 completion_tokens=10 queue_ms=0.0 ttft_ms=0.0 "
            "total_ms=100.0 tokens/s=100.0 cached_prompt_tokens=256");
}

TEST(FormatTest, PrefixCacheLine) {
  v1::PrefixCacheInfo pc;
  EXPECT_EQ(FormatPrefixCache(pc), "off");
  pc.set_enabled(true);
  EXPECT_EQ(FormatPrefixCache(pc), "on, 0 of 0 prompt tokens hit (0.0%), 0 blocks cached, 0 evicted");
  pc.set_queried_tokens_total(400);
  pc.set_hit_tokens_total(100);
  pc.set_cached_blocks(12);
  pc.set_evicted_blocks_total(3);
  EXPECT_EQ(FormatPrefixCache(pc),
            "on, 100 of 400 prompt tokens hit (25.0%), 12 blocks cached, 3 evicted");
  pc.set_partial_blocks_enabled(true);
  pc.set_copied_tokens_total(9);
  EXPECT_EQ(FormatPrefixCache(pc),
            "on, 100 of 400 prompt tokens hit (25.0%), 12 blocks cached, 3 evicted (9 of the "
            "hits from blocks copied in part)");
}

TEST(FormatTest, SpeculativeDecodingLine) {
  v1::SpeculativeDecodingInfo info;
  EXPECT_EQ(FormatSpeculativeDecoding(info), "off");
  info.set_num_speculative_tokens(4);
  info.set_prompt_lookup_min(2);
  info.set_prompt_lookup_max(4);
  EXPECT_EQ(FormatSpeculativeDecoding(info),
            "up to 4 prompt-lookup tokens (2-4-grams); 0 of 0 draft tokens accepted (0.0%), "
            "0.00 a draft");
  info.set_drafts_total(50);
  info.set_draft_tokens_total(160);
  info.set_accepted_tokens_total(120);
  EXPECT_EQ(FormatSpeculativeDecoding(info),
            "up to 4 prompt-lookup tokens (2-4-grams); 120 of 160 draft tokens accepted (75.0%), "
            "2.40 a draft");
}

TEST(FormatTest, StructuredOutputLine) {
  v1::StructuredOutputInfo info;
  EXPECT_EQ(FormatStructuredOutput(info),
            "0 constraints cached (0.0 MiB); 0 compiled (0 refused) in 0.00 s, 0 cache hits");
  info.set_cached_constraints(3);
  info.set_cached_bytes(3 << 20);
  info.set_compiles_total(4);
  info.set_refusals_total(1);
  info.set_compile_seconds_total(0.125);
  info.set_cache_hits_total(9);
  EXPECT_EQ(FormatStructuredOutput(info),
            "3 constraints cached (3.0 MiB); 4 compiled (1 refused) in 0.12 s, 9 cache hits");
}

TEST(FormatTest, SummaryWithErrorAndZeroTime) {
  v1::Finished finished;
  finished.set_reason(v1::FINISH_REASON_ERROR);
  finished.set_error("device \"lost\"");
  EXPECT_EQ(FormatSummary(finished),
            "finish=ERROR prompt_tokens=0 completion_tokens=0 queue_ms=0.0 ttft_ms=0.0 "
            "total_ms=0.0 tokens/s=0.0 error=\"device \\\"lost\\\"\"");
}

TEST(FormatTest, ToolCallsOneLineEach) {
  v1::Finished finished;
  EXPECT_EQ(FormatToolCalls(finished), "");
  v1::ToolCall* c = finished.add_tool_calls();
  c->set_id("call_1");
  c->set_name("get_weather");
  c->set_arguments(R"({"city":"Lima"})");
  finished.add_tool_calls()->set_name("now");
  finished.mutable_tool_calls(1)->set_arguments("{}");
  finished.mutable_tool_calls(1)->set_id("call_2");
  EXPECT_EQ(FormatToolCalls(finished),
            "tool call get_weather {\"city\":\"Lima\"} (call_1)\ntool call now {} (call_2)\n");
}

TEST(FormatTest, TokensPlainAndWithPieces) {
  v1::TokenizeResponse response;
  response.add_token_ids(1);
  response.add_token_ids(345);
  response.add_token_ids(9);
  EXPECT_EQ(FormatTokens(response, false), "1 345 9\n");
  response.add_pieces("<s>");
  response.add_pieces("\xc3\xa9t\xc3\xa9");  // UTF-8 stays readable
  response.add_pieces("\n\t");
  EXPECT_EQ(FormatTokens(response, true),
            "0\t1\t\"<s>\"\n1\t345\t\"\xc3\xa9t\xc3\xa9\"\n2\t9\t\"\\n\\t\"\n");
}

TEST(FormatTest, Logprobs) {
  v1::TokenLogprob token;
  token.set_token_id(7);
  token.set_logprob(-0.5f);
  v1::TopLogprob* top = token.add_top();
  top->set_token_id(7);
  top->set_logprob(-0.5f);
  top->set_text("a");
  const v1::TokenLogprob tokens[] = {token};
  EXPECT_EQ(FormatLogprobs(tokens), "token 7 logprob -0.5000 top: 7 \"a\" -0.5000\n");
}

TEST(FormatTest, PromptLogprobsLinesAndPerplexity) {
  std::vector<v1::TokenLogprob> prompt(3);
  prompt[0].set_token_id(1);
  prompt[1].set_token_id(5);
  prompt[1].set_logprob(-1.0f);
  prompt[1].set_rank(2);
  v1::TopLogprob* top = prompt[1].add_top();
  top->set_token_id(9);
  top->set_text("b");
  top->set_logprob(-0.5f);
  prompt[2].set_token_id(6);
  prompt[2].set_logprob(-3.0f);
  prompt[2].set_rank(40);
  EXPECT_EQ(FormatPromptLogprobs(prompt),
            "prompt token 1 (first: not scored)\n"
            "prompt token 5 logprob -1.0000 rank 2 top: 9 \"b\" -0.5000\n"
            "prompt token 6 logprob -3.0000 rank 40\n"
            "prompt: 2 tokens scored, logprob sum -4.0000, perplexity 7.3891\n");
  EXPECT_EQ(FormatPromptLogprobs({}), "");
}

TEST(FormatTest, InfoTableIsAligned) {
  v1::ModelInfo model;
  model.set_name("tiny");
  model.set_num_parameters(873472);
  model.add_eos_token_ids(2);
  model.add_eos_token_ids(3);
  v1::ServerInfo server;
  server.set_state("SERVING");
  server.set_slots_total(8);
  server.set_slots_in_use(2);
  const std::string table = FormatInfo(model, server);
  EXPECT_THAT(table, HasSubstr("model\n  name                  tiny\n"));
  EXPECT_THAT(table, HasSubstr("  parameters            873472\n"));
  EXPECT_THAT(table, HasSubstr("  eos_token_ids         2,3\n"));
  EXPECT_THAT(table, HasSubstr("server\n  version           \n  state             SERVING\n"));
  EXPECT_THAT(table, HasSubstr("  slots             2 in use / 8\n"));
  EXPECT_THAT(table, HasSubstr("  lora_adapters         none\n"));
  EXPECT_THAT(table, HasSubstr("  window_release    off\n"));
  server.mutable_kv()->set_window_release_tokens(4096);
  server.mutable_kv()->set_window_released_blocks_total(37);
  EXPECT_THAT(FormatInfo(model, server),
              HasSubstr("  window_release    behind a 4096-token window, 37 blocks released\n"));
  model.set_num_parameters(124439808);
  EXPECT_THAT(FormatInfo(model, server), HasSubstr("124439808 (124.44M)"));
  model.set_num_experts(128);
  model.set_num_experts_per_tok(8);
  model.set_moe_intermediate_size(768);
  model.set_num_active_parameters(3340000000);
  model.set_num_parameters(30530000000);
  EXPECT_THAT(FormatInfo(model, server),
              HasSubstr("  parameters            30530000000 (30.53B); 3340000000 (3.34B) active "
                        "(8 of 128 experts of 768)\n"));
  model.set_num_experts(0);
  model.set_num_parameters(124439808);
  v1::LoraAdapterInfo* sql = model.add_lora_adapters();
  sql->set_name("sql");
  sql->set_rank(8);
  sql->add_target_modules("q_proj");
  sql->add_target_modules("v_proj");
  v1::LoraAdapterInfo* chat = model.add_lora_adapters();
  chat->set_name("chat");
  chat->set_rank(16);
  chat->add_target_modules("down_proj");
  EXPECT_THAT(FormatInfo(model, server),
              HasSubstr("  lora_adapters         sql (rank 8, q_proj,v_proj); chat (rank 16, "
                        "down_proj)\n"));
}

TEST(FormatTest, JsonLineUsesProtoNamesAndPrintsDefaults) {
  v1::GenerateResponse response;
  response.set_text("hi\n");
  response.add_token_ids(5);
  response.mutable_finished()->set_reason(v1::FINISH_REASON_EOS);
  absl::StatusOr<std::string> json = ToJsonLine(response);
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(json->find('\n'), std::string::npos);
  EXPECT_THAT(*json, HasSubstr("\"request_id\":\"\""));
  EXPECT_THAT(*json, HasSubstr("\"text\":\"hi\\n\""));
  EXPECT_THAT(*json, HasSubstr("\"token_ids\":[5]"));
  EXPECT_THAT(*json, HasSubstr("\"reason\":\"FINISH_REASON_EOS\""));
  EXPECT_THAT(*json, HasSubstr("\"time_to_first_token_ms\":0"));
}

}  // namespace
}  // namespace kvrm::cli
