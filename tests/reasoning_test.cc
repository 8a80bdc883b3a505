// Reasoning output end to end: chat requests through gRPC on the tiny model served with a
// thinking model's chat template (Qwen3's shape: the model writes <think> itself, or finds an
// empty block in the prompt with enable_thinking false; DeepSeek-R1's: the prompt opens the
// block). The random-weight model is made to write the markup by a structured-output regex over
// the whole reply (structured.include_thinking), so the split is checked against text the test
// knows; without include_thinking the constraint holds only the answer after the thinking.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "common/json.h"
#include "gtest/gtest.h"
#include "model/chat_config.h"
#include "model/harmony.h"
#include "model/tokenizer.h"
#include "server/request_validation.h"
#include "tests/test_server.h"

namespace kvrm {
namespace {

// ChatML as Qwen3 renders it: past turns' thinking dropped, tools shown in Hermes markup, and
// enable_thinking false writing an empty thinking block into the prompt.
constexpr char kQwen3Like[] = R"TPL({%- if tools %}{{- '<|im_start|>system\n<tools>' }}
{%- for tool in tools %}{{- tool | tojson }}{%- endfor %}
{{- '</tools>\nCall with <tool_call>{"name": ..., "arguments": ...}</tool_call><|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- set content = message.content %}
{%- if message.role == 'assistant' and '</think>' in content %}
{%- set content = content.split('</think>')[-1].lstrip('\n') %}
{%- endif %}
{{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}
{%- endif %})TPL";

// DeepSeek-R1's shape: the generation prompt opens the thinking block.
constexpr char kR1Like[] = R"TPL({%- for message in messages %}
{%- if message.role == 'user' %}{{- '<|User|>' + message.content }}
{%- else %}{{- '<|Assistant|>' + message.content.split('</think>')[-1] + '<|end|>' }}{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|Assistant|><think>\n' }}{%- endif %})TPL";

EngineOptions Options() {
  EngineOptions o;
  o.slots = 4;
  o.max_queue = 16;
  o.max_new_tokens = 128;
  o.prefill_chunk = 32;
  o.threads = 2;
  return o;
}

std::unique_ptr<TestServer> ServeWithTemplate(const char* source, bool parse_reasoning = true,
                                              ServerOptions so = {}) {
  std::unique_ptr<ModelBundle> model(LoadTinyModel());
  SetChatTemplate(source, "test template", &model->chat);
  EXPECT_NE(model->chat.chat_template, nullptr) << model->chat.status;
  if (!parse_reasoning) model->chat.reasoning_format = ReasoningFormat::kNone;
  return std::make_unique<TestServer>(std::move(model), Options(), std::move(so));
}

v1::GenerateRequest ChatRequest(const std::string& regex, uint64_t seed = 1) {
  v1::GenerateRequest r;
  v1::ChatMessage* m = r.mutable_chat()->add_messages();
  m->set_role("user");
  m->set_content("Is it raining?");
  r.mutable_structured()->set_regex(regex);
  r.mutable_structured()->set_include_thinking(true);
  r.mutable_stopping()->set_max_new_tokens(120);
  r.mutable_sampling()->set_temperature(1.0f);
  r.mutable_sampling()->set_seed(seed);
  return r;
}

struct Split {
  std::string reasoning, text;
  std::vector<int32_t> tokens;
  v1::Finished finished;
};

// Completion `index`'s messages joined.
Split Joined(const StreamResult& r, int index = 0) {
  Split s;
  for (const v1::GenerateResponse& m : r.messages) {
    if (m.index() != index) continue;
    s.reasoning += m.reasoning_text();
    s.text += m.text();
    s.tokens.insert(s.tokens.end(), m.token_ids().begin(), m.token_ids().end());
    if (m.has_finished()) s.finished = m.finished();
  }
  return s;
}

TEST(ReasoningE2eTest, ModelInfoNamesTheParser) {
  for (bool on : {true, false}) {
    std::unique_ptr<TestServer> server = ServeWithTemplate(kQwen3Like, on);
    grpc::ClientContext ctx;
    v1::ModelInfo info;
    ASSERT_TRUE(server->stub().GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok());
    EXPECT_EQ(info.reasoning_parser(), on ? "think" : "none");
  }
  // The built-in template does not think.
  TestServer plain(Options());
  grpc::ClientContext ctx;
  v1::ModelInfo info;
  ASSERT_TRUE(plain.stub().GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.reasoning_parser(), "none");
}

TEST(ReasoningE2eTest, ThinkingComesApartFromTheAnswer) {
  std::unique_ptr<TestServer> server = ServeWithTemplate(kQwen3Like);
  v1::GenerateRequest r = ChatRequest(
      "<think>\nThe sky is (grey|blue)\\.\nSo (yes|no)\\.\n</think>\n\nAnswer: (yes|no)\\.");
  r.set_n(2);
  const StreamResult got = RunGenerate(server->stub(), r);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  for (int index = 0; index < 2; ++index) {
    const Split s = Joined(got, index);
    EXPECT_TRUE(
        s.reasoning == "The sky is grey.\nSo yes." || s.reasoning == "The sky is grey.\nSo no." ||
        s.reasoning == "The sky is blue.\nSo yes." || s.reasoning == "The sky is blue.\nSo no.")
        << s.reasoning;
    EXPECT_TRUE(s.text == "Answer: yes." || s.text == "Answer: no.") << s.text;
    EXPECT_EQ(s.finished.reason(), v1::FINISH_REASON_STOP);
    // The thinking's tokens: those up to the one that completes </think>.
    size_t k = 0;
    while (k < s.tokens.size() &&
           server->model()
                   .tokenizer->Decode(absl::MakeConstSpan(s.tokens).first(k), false)
                   .find("</think>") == std::string::npos) {
      ++k;
    }
    ASSERT_LT(k, s.tokens.size());
    EXPECT_EQ(s.finished.usage().reasoning_tokens(), static_cast<int32_t>(k));
    EXPECT_EQ(s.finished.usage().completion_tokens(), static_cast<int32_t>(s.tokens.size()));
  }
  // The thinking streams before the answer: no message carries answer text before the last
  // piece of thinking.
  bool answer_seen = false;
  for (const v1::GenerateResponse& m : got.messages) {
    if (m.index() != 0) continue;
    if (!m.reasoning_text().empty()) {
      EXPECT_FALSE(answer_seen);
    }
    if (!m.text().empty()) answer_seen = true;
  }
}

TEST(ReasoningE2eTest, PromptThatOpensTheBlockAndEnableThinkingFalse) {
  {
    std::unique_ptr<TestServer> server = ServeWithTemplate(kR1Like);
    const StreamResult got =
        RunGenerate(server->stub(), ChatRequest("Hmm, (rain|sun)\\.\n</think>\n\n(Yes|No)\\."));
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    const Split s = Joined(got);
    EXPECT_TRUE(s.reasoning == "Hmm, rain." || s.reasoning == "Hmm, sun.") << s.reasoning;
    EXPECT_TRUE(s.text == "Yes." || s.text == "No.") << s.text;
  }
  std::unique_ptr<TestServer> server = ServeWithTemplate(kQwen3Like);
  v1::GenerateRequest r = ChatRequest("(Yes|No), it is\\.");
  r.mutable_chat()->set_template_kwargs(R"({"enable_thinking": false})");
  const StreamResult got = RunGenerate(server->stub(), r);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  const Split s = Joined(got);
  EXPECT_EQ(s.reasoning, "");
  EXPECT_TRUE(s.text == "Yes, it is." || s.text == "No, it is.") << s.text;
}

// A reply cut off by its length limit while thinking is all thinking.
TEST(ReasoningE2eTest, CutOffWhileThinking) {
  std::unique_ptr<TestServer> server = ServeWithTemplate(kQwen3Like);
  v1::GenerateRequest r = ChatRequest("<think>\n[a-z]{60}\n</think>\n\nDone\\.");
  r.mutable_stopping()->set_max_new_tokens(12);
  const StreamResult got = RunGenerate(server->stub(), r);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  const Split s = Joined(got);
  EXPECT_EQ(s.finished.reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(s.text, "");
  EXPECT_FALSE(s.reasoning.empty());
  EXPECT_EQ(s.reasoning.find_first_not_of("abcdefghijklmnopqrstuvwxyz"), std::string::npos)
      << s.reasoning;
}

// Tool calls are read from the answer only: a call after the thinking is parsed, and the
// thinking (which may mention calls) is not.
TEST(ReasoningE2eTest, ToolCallsAfterTheThinking) {
  std::unique_ptr<TestServer> server = ServeWithTemplate(kQwen3Like);
  v1::GenerateRequest r = ChatRequest(
      "<think>\nI could write <tool_call> here\\.\n</think>\n\n<tool_call>\\{\"name\": \"now\", "
      "\"arguments\": \\{\\}\\}</tool_call>");
  r.mutable_chat()->add_tools()->set_name("now");
  const StreamResult got = RunGenerate(server->stub(), r);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  const Split s = Joined(got);
  EXPECT_EQ(s.reasoning, "I could write <tool_call> here.");
  EXPECT_EQ(s.text, "");
  EXPECT_EQ(s.finished.reason(), v1::FINISH_REASON_TOOL_CALLS);
  ASSERT_EQ(s.finished.tool_calls_size(), 1);
  EXPECT_EQ(s.finished.tool_calls(0).name(), "now");
}

// Without include_thinking the constraint holds the answer only: after a prompt that opened the
// block the reply must think first (the random model never closes it, so all of it is
// thinking, cut by the length limit, not the constrained "yes" / "no" at once); after one that
// did not, it may answer at once, or think first.
TEST(ReasoningE2eTest, ConstraintHoldsTheAnswerAfterTheThinking) {
  {
    std::unique_ptr<TestServer> server = ServeWithTemplate(kR1Like);
    v1::GenerateRequest r = ChatRequest("(yes|no)");
    r.mutable_structured()->set_include_thinking(false);
    r.mutable_stopping()->set_max_new_tokens(16);
    const StreamResult got = RunGenerate(server->stub(), r);
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    const Split s = Joined(got);
    EXPECT_EQ(s.finished.reason(), v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(s.text, "");
    EXPECT_NE(s.reasoning, "yes");
    EXPECT_NE(s.reasoning, "no");
    EXPECT_EQ(s.reasoning.find("</think>"), std::string::npos);
  }
  std::unique_ptr<TestServer> server = ServeWithTemplate(kQwen3Like);
  for (uint64_t seed : {1, 2, 3, 4}) {
    v1::GenerateRequest r = ChatRequest("(yes|no)", seed);
    r.mutable_structured()->set_include_thinking(false);
    r.mutable_stopping()->set_max_new_tokens(16);
    const StreamResult got = RunGenerate(server->stub(), r);
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    const Split s = Joined(got);
    if (s.reasoning.empty()) {
      EXPECT_TRUE(s.text == "yes" || s.text == "no") << s.text;
      EXPECT_EQ(s.finished.reason(), v1::FINISH_REASON_STOP);
    } else {
      EXPECT_TRUE(s.text.empty() || s.text == "yes" || s.text == "no") << s.text;
    }
  }
}

// chat.thinking_budget: after a prompt that opened the block, the reply thinks for exactly the
// budget (the same tokens as without one, for the same seed), then "</think>" is written for it
// (its tokens as the tokenizer writes them, counted as reasoning) and the answer follows.
TEST(ReasoningE2eTest, ThinkingBudgetEndsTheThinking) {
  std::unique_ptr<TestServer> server = ServeWithTemplate(kR1Like);
  const Tokenizer& tok = *server->model().tokenizer;
  absl::StatusOr<std::vector<int32_t>> end = tok.Encode("</think>", /*add_bos=*/false);
  ASSERT_TRUE(end.ok());
  const int32_t m = static_cast<int32_t>(end->size());
  for (int32_t budget : {0, 6, 15}) {
    v1::GenerateRequest r = ChatRequest("");
    r.clear_structured();
    r.mutable_stopping()->set_max_new_tokens(40);
    const Split free = Joined(RunGenerate(server->stub(), r));
    r.mutable_chat()->set_thinking_budget(budget);
    const StreamResult got = RunGenerate(server->stub(), r);
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    const Split s = Joined(got);
    ASSERT_EQ(s.tokens.size(), 40u);
    EXPECT_EQ(std::vector<int32_t>(s.tokens.begin(), s.tokens.begin() + budget),
              std::vector<int32_t>(free.tokens.begin(), free.tokens.begin() + budget));
    EXPECT_EQ(std::vector<int32_t>(s.tokens.begin() + budget, s.tokens.begin() + budget + m), *end)
        << budget;
    EXPECT_EQ(s.finished.usage().reasoning_tokens(), budget + m) << budget;
    EXPECT_EQ(s.reasoning.find("</think>"), std::string::npos) << s.reasoning;
    EXPECT_FALSE(s.text.empty());
    // Without the budget, the random model thinks to its length limit.
    EXPECT_EQ(free.text, "");
    EXPECT_EQ(free.finished.usage().reasoning_tokens(), 40);
  }
}

// kvrmd --thinking_budget: the budget of chat requests that give none; one a request gives wins.
TEST(ReasoningE2eTest, TheServersThinkingBudgetIsTheDefault) {
  ServerOptions so;
  so.info.default_thinking_budget = 6;
  std::unique_ptr<TestServer> server = ServeWithTemplate(kR1Like, true, so);
  const Tokenizer& tok = *server->model().tokenizer;
  absl::StatusOr<std::vector<int32_t>> end = tok.Encode("</think>", /*add_bos=*/false);
  ASSERT_TRUE(end.ok());
  const int32_t m = static_cast<int32_t>(end->size());
  for (const int32_t given : {-1, 15}) {
    v1::GenerateRequest r = ChatRequest("");
    r.clear_structured();
    r.mutable_stopping()->set_max_new_tokens(40);
    if (given >= 0) r.mutable_chat()->set_thinking_budget(given);
    const StreamResult got = RunGenerate(server->stub(), r);
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    const Split s = Joined(got);
    const int32_t budget = given >= 0 ? given : 6;
    ASSERT_GE(static_cast<int32_t>(s.tokens.size()), budget + m);
    EXPECT_EQ(std::vector<int32_t>(s.tokens.begin() + budget, s.tokens.begin() + budget + m), *end)
        << given;
    EXPECT_EQ(s.finished.usage().reasoning_tokens(), budget + m) << given;
  }
  // A text prompt is not a chat: no budget.
  const StreamResult text = RunGenerate(server->stub(), TextRequest("<think>\n", 12));
  ASSERT_TRUE(text.status.ok());
  EXPECT_EQ(server->engine().Stats().thinking_budget_ends_total, 2u);
}

// A budget with a structured output that holds the answer only: the forced end closes the
// thinking the random model would never close, and the answer follows the constraint.
TEST(ReasoningE2eTest, ThinkingBudgetLetsAConstrainedAnswerCome) {
  std::unique_ptr<TestServer> server = ServeWithTemplate(kR1Like);
  for (uint64_t seed : {1, 2, 3}) {
    v1::GenerateRequest r = ChatRequest("(yes|no)", seed);
    r.mutable_structured()->set_include_thinking(false);
    r.mutable_stopping()->set_max_new_tokens(40);
    r.mutable_chat()->set_thinking_budget(8);
    const StreamResult got = RunGenerate(server->stub(), r);
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    const Split s = Joined(got);
    EXPECT_EQ(s.finished.reason(), v1::FINISH_REASON_STOP) << s.reasoning;
    // (The constraint lets up to 4 whitespace characters follow the block; only newlines are
    // dropped from the answer's start.)
    const absl::string_view answer = absl::StripLeadingAsciiWhitespace(s.text);
    EXPECT_TRUE(answer == "yes" || answer == "no") << s.text;
    EXPECT_FALSE(s.reasoning.empty());
  }
}

// Where no block opens (the model may open one and does not), the reply is what it is without a
// budget. Under a constraint on the whole reply, the end is forced only where the constraint
// allows all of it: thinking held to 30 characters that can begin "</think>" but not finish it
// is the reply's own, word for word, and the end comes after it (spelled as the tokenizer
// spells it where the reply spelled it otherwise).
TEST(ReasoningE2eTest, ThinkingBudgetLeavesOtherRepliesAlone) {
  std::unique_ptr<TestServer> server = ServeWithTemplate(kQwen3Like);
  {
    v1::GenerateRequest r = ChatRequest("", 5);
    r.clear_structured();
    r.mutable_stopping()->set_max_new_tokens(50);
    const Split free = Joined(RunGenerate(server->stub(), r));
    r.mutable_chat()->set_thinking_budget(4);
    const StreamResult got = RunGenerate(server->stub(), r);
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    EXPECT_EQ(Joined(got).tokens, free.tokens);
  }
  int respelled = 0;
  for (uint64_t seed : {1, 2, 3, 5}) {
    v1::GenerateRequest r = ChatRequest(R"(<think>\n[a-z/<]{30}\n</think>\n\nDone\.)", seed);
    r.mutable_stopping()->set_max_new_tokens(60);
    const Split free = Joined(RunGenerate(server->stub(), r));
    r.mutable_chat()->set_thinking_budget(2);
    const StreamResult got = RunGenerate(server->stub(), r);
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    const Split s = Joined(got);
    EXPECT_EQ(s.reasoning, free.reasoning) << seed;
    EXPECT_EQ(s.reasoning.size(), 30u) << s.reasoning;
    EXPECT_EQ(s.text, "Done.") << seed;
    respelled += s.tokens != free.tokens;
  }
  EXPECT_GT(respelled, 0);  // (the budget was seen, and acted, on some seed)
  // A negative budget is refused by name.
  v1::GenerateRequest bad = ChatRequest("");
  bad.clear_structured();
  bad.mutable_chat()->set_thinking_budget(-1);
  const StreamResult refused = RunGenerate(server->stub(), bad);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(refused.status.error_message().find("chat.thinking_budget"), std::string::npos);
}

// Only chat replies are split, and only when the server parses reasoning.
TEST(ReasoningE2eTest, TextPromptsAndParserNoneAreLeftWhole) {
  const std::string regex = "<think>\nmaybe\n</think>\n\nyes";
  std::unique_ptr<TestServer> server = ServeWithTemplate(kQwen3Like);
  v1::GenerateRequest text = TextRequest("Is it raining?", 60);
  text.mutable_structured()->set_regex(regex);
  StreamResult got = RunGenerate(server->stub(), text);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(Joined(got).text, "<think>\nmaybe\n</think>\n\nyes");
  EXPECT_EQ(Joined(got).reasoning, "");
  EXPECT_EQ(Joined(got).finished.usage().reasoning_tokens(), 0);

  std::unique_ptr<TestServer> off = ServeWithTemplate(kQwen3Like, /*parse_reasoning=*/false);
  got = RunGenerate(off->stub(), ChatRequest(regex));
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(Joined(got).text, "<think>\nmaybe\n</think>\n\nyes");
  EXPECT_EQ(Joined(got).reasoning, "");
}

// gpt-oss's shape: harmony messages, the generation prompt "<|start|>assistant" (the reply
// begins with its first message's header), past answers rendered on the final channel.
constexpr char kHarmonyLike[] = R"TPL({%- for message in messages %}
{%- if message.role == 'assistant' %}{{- '<|start|>assistant<|channel|>final<|message|>' + message.content + '<|end|>' }}
{%- else %}{{- '<|start|>' + message.role + '<|message|>' + message.content + '<|end|>' }}{%- endif %}
{%- endfor %}
{%- if tools %}{{- '<|start|>developer<|message|># Tools\nnamespace functions {\n' }}
{%- for tool in tools %}{{- 'type ' + tool.function.name + ' = () => any;\n' }}{%- endfor %}
{{- '}<|end|>' }}{%- endif %}
{%- if add_generation_prompt %}{{- '<|start|>assistant' }}{%- endif %})TPL";

TEST(ReasoningE2eTest, HarmonyAnalysisIsReasoningAndFinalIsTheAnswer) {
  std::unique_ptr<TestServer> server = ServeWithTemplate(kHarmonyLike);
  {
    grpc::ClientContext ctx;
    v1::ModelInfo info;
    ASSERT_TRUE(server->stub().GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok());
    EXPECT_EQ(info.reasoning_parser(), "harmony");
  }
  // (The tiny model's vocabulary spells the markers with ordinary tokens: the split reads text.)
  const std::string header = "<\\|start\\|>assistant<\\|channel\\|>";
  v1::GenerateRequest r = ChatRequest(
      "<\\|channel\\|>analysis<\\|message\\|>The sky is (grey|blue)"
      "\\.<\\|end\\|>" +
      header + "final<\\|message\\|>(Yes|No)\\.");
  r.set_n(2);
  const StreamResult got = RunGenerate(server->stub(), r);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  for (int index = 0; index < 2; ++index) {
    const Split s = Joined(got, index);
    EXPECT_TRUE(s.reasoning == "The sky is grey." || s.reasoning == "The sky is blue.")
        << s.reasoning;
    EXPECT_TRUE(s.text == "Yes." || s.text == "No.") << s.text;
    EXPECT_EQ(s.finished.reason(), v1::FINISH_REASON_STOP);
    // Every token but the answer's counts as reasoning (headers, markers, analysis).
    size_t k = 0;
    while (k < s.tokens.size() &&
           server->model()
                   .tokenizer->Decode(absl::MakeConstSpan(s.tokens).first(k), false)
                   .find("final<|message|>") == std::string::npos) {
      ++k;
    }
    ASSERT_LT(k, s.tokens.size());
    EXPECT_EQ(s.finished.usage().reasoning_tokens(), static_cast<int32_t>(k));
  }
}

// Without include_thinking, a constraint on a harmony reply holds its final message's text: the
// reply opens with a message header (analysis, commentary or final) and the answer comes after
// "<|channel|>final<|message|>"; the messages before it are free. The random model reaches the
// final header on some seeds within the limit (the answer is then "yes" or "no" and the reply
// stops) and not on others (cut by the length limit inside a message).
TEST(ReasoningE2eTest, HarmonyConstraintHoldsTheFinalAnswer) {
  std::unique_ptr<TestServer> server = ServeWithTemplate(kHarmonyLike);
  constexpr int kSeeds = 24;
  int answered = 0;
  for (uint64_t seed = 1; seed <= kSeeds; ++seed) {
    v1::GenerateRequest r = ChatRequest("(yes|no)", seed);
    r.mutable_structured()->set_include_thinking(false);
    r.mutable_stopping()->set_max_new_tokens(48);
    r.mutable_sampling()->set_temperature(4.0f);  // (flatter: the channel's name is a draw)
    const StreamResult got = RunGenerate(server->stub(), r);
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    const Split s = Joined(got);
    const std::string raw = server->model().tokenizer->Decode(s.tokens, false);
    EXPECT_EQ(raw.rfind("<|channel|>", 0), 0u) << raw;
    if (s.finished.reason() == v1::FINISH_REASON_STOP) {
      ++answered;
      EXPECT_TRUE(s.text == "yes" || s.text == "no") << s.text;
      EXPECT_NE(raw.find("<|channel|>final<|message|>" + s.text), std::string::npos) << raw;
    } else {  // (a commentary message's text is the user's: content, as HarmonyStream has it)
      EXPECT_EQ(s.finished.reason(), v1::FINISH_REASON_LENGTH);
      const size_t final_at = raw.find("<|channel|>final<|message|>");
      if (final_at != std::string::npos) {
        const std::string after = raw.substr(final_at + 27);
        EXPECT_TRUE(after.empty() || after == "y" || after == "n") << raw;
      }
    }
  }
  std::printf("harmony constraint: %d of %d seeds reached the final answer\n", answered, kSeeds);
  EXPECT_GT(answered, 0);
  EXPECT_LT(answered, kSeeds);
}

// A call on the commentary channel to functions.NAME comes back as a tool call with its body as
// the arguments; the analysis before it is reasoning.
TEST(ReasoningE2eTest, HarmonyFunctionCallsAreToolCalls) {
  std::unique_ptr<TestServer> server = ServeWithTemplate(kHarmonyLike);
  EXPECT_EQ(server->model().chat.tool_call_format, ToolCallFormat::kHermes);
  v1::GenerateRequest r = ChatRequest(
      "<\\|channel\\|>analysis<\\|message\\|>Need the time\\.<\\|end\\|><\\|start\\|>assistant"
      "<\\|channel\\|>commentary to=functions\\.now <\\|constrain\\|>json<\\|message\\|>"
      "\\{\"tz\": \"(UTC|CET)\"\\}");
  r.mutable_chat()->add_tools()->set_name("now");
  const StreamResult got = RunGenerate(server->stub(), r);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  const Split s = Joined(got);
  EXPECT_EQ(s.reasoning, "Need the time.");
  EXPECT_EQ(s.text, "");
  EXPECT_EQ(s.finished.reason(), v1::FINISH_REASON_TOOL_CALLS);
  ASSERT_EQ(s.finished.tool_calls_size(), 1);
  EXPECT_EQ(s.finished.tool_calls(0).name(), "now");
  const std::string& args = s.finished.tool_calls(0).arguments();
  EXPECT_TRUE(args == "{\"tz\":\"UTC\"}" || args == "{\"tz\":\"CET\"}") << args;  // (compact)
  // Without tools the same reply's call is not for the user: reasoning, no call.
  r.mutable_chat()->clear_tools();
  const StreamResult plain = RunGenerate(server->stub(), r);
  ASSERT_TRUE(plain.status.ok()) << plain.status.error_message();
  const Split p = Joined(plain);
  EXPECT_EQ(p.text, "");
  EXPECT_EQ(p.finished.tool_calls_size(), 0);
  EXPECT_EQ(p.reasoning.rfind("Need the time.\n{\"tz\": ", 0), 0u) << p.reasoning;
}

// tool_choice REQUIRED or a named function on a harmony reply: the constraint makes gpt-oss's own
// call ("<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>" and arguments held
// to that function's schema) after any analysis and commentary messages, and it comes back as a
// tool call. The random model reaches the call on some seeds within the limit (and stops there,
// finish tool_calls), and is cut inside a message on the others.
TEST(ReasoningE2eTest, HarmonyForcedToolCallsAreGptOssCalls) {
  std::unique_ptr<TestServer> server = ServeWithTemplate(kHarmonyLike);
  for (const bool named : {true, false}) {
    constexpr int kSeeds = 24;
    int called = 0;
    for (uint64_t seed = 1; seed <= kSeeds; ++seed) {
      v1::GenerateRequest r = ChatRequest("", seed);
      r.clear_structured();
      r.mutable_stopping()->set_max_new_tokens(120);
      r.mutable_sampling()->set_temperature(4.0f);
      v1::Tool* now = r.mutable_chat()->add_tools();
      now->set_name("now");
      now->set_parameters(R"({"type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}},
                              "required": ["tz"], "additionalProperties": false})");
      r.mutable_chat()->add_tools()->set_name("later");
      if (named) {
        r.mutable_chat()->mutable_tool_choice()->set_function("now");
      } else {
        r.mutable_chat()->mutable_tool_choice()->set_mode(v1::TOOL_CHOICE_MODE_REQUIRED);
      }
      const StreamResult got = RunGenerate(server->stub(), r);
      ASSERT_TRUE(got.status.ok()) << got.status.error_message();
      const Split s = Joined(got);
      const std::string raw = server->model().tokenizer->Decode(s.tokens, false);
      EXPECT_EQ(raw.rfind("<|channel|>", 0), 0u) << raw;
      if (s.finished.reason() == v1::FINISH_REASON_TOOL_CALLS) {
        ++called;
        ASSERT_EQ(s.finished.tool_calls_size(), 1) << raw;
        const v1::ToolCall& call = s.finished.tool_calls(0);
        EXPECT_TRUE(call.name() == "now" || (!named && call.name() == "later")) << raw;
        if (call.name() == "now") {
          EXPECT_TRUE(call.arguments() == R"({"tz":"UTC"})" ||
                      call.arguments() == R"({"tz":"CET"})")
              << call.arguments();
        }
        EXPECT_NE(raw.find(" <|constrain|>json<|message|>"), std::string::npos) << raw;
      } else {
        EXPECT_EQ(s.finished.reason(), v1::FINISH_REASON_LENGTH) << raw;
        EXPECT_EQ(raw.find("<|channel|>final"), std::string::npos) << raw;  // never an answer
      }
    }
    std::printf("harmony %s tool call: %d of %d seeds called\n", named ? "named" : "required",
                called, kSeeds);
    EXPECT_GT(called, 0);
  }
}

// The tiny model with gpt-oss's harmony markers as special tokens, as o200k_harmony has them:
// the vocabulary's last seven tokens (and the merges that make or use them) give their ids to
// "<|start|>", "<|channel|>", ..., and <|return|> and <|call|> end a reply (the weights are
// random: any rows do). Served with kHarmonyLike, whose prompts now hold the markers as those
// tokens.
std::unique_ptr<TestServer> ServeWithHarmonyTokens(std::vector<int32_t>* marker_ids) {
  std::unique_ptr<ModelBundle> model(LoadTinyModel());
  absl::StatusOr<Json> tj = ReadJsonFile(TinyModelDir() + "/tokenizer.json");
  EXPECT_TRUE(tj.ok()) << tj.status();
  Json& vocab = (*tj)["model"]["vocab"];
  std::vector<std::pair<int64_t, std::string>> by_id;
  for (const auto& [text, id] : vocab.items()) by_id.push_back({id.get<int64_t>(), text});
  std::sort(by_id.begin(), by_id.end());
  const std::vector<std::string> markers(std::begin(kHarmonyMarkers), std::end(kHarmonyMarkers));
  std::set<std::string> freed;
  for (size_t i = 0; i < markers.size(); ++i) {
    const auto& [id, text] = by_id[by_id.size() - 1 - i];
    freed.insert(text);
    vocab.erase(text);
    marker_ids->push_back(static_cast<int32_t>(id));
    (*tj)["added_tokens"].push_back({{"id", id},
                                     {"content", markers[i]},
                                     {"single_word", false},
                                     {"lstrip", false},
                                     {"rstrip", false},
                                     {"normalized", false},
                                     {"special", true}});
  }
  Json merges = Json::array();
  for (const Json& m : (*tj)["model"]["merges"]) {
    const std::string pair = m.is_string()
                                 ? m.get<std::string>()
                                 : m[0].get<std::string>() + " " + m[1].get<std::string>();
    const size_t space = pair.find(' ');
    const std::string a = pair.substr(0, space), b = pair.substr(space + 1);
    if (!freed.contains(a) && !freed.contains(b) && !freed.contains(a + b)) merges.push_back(m);
  }
  (*tj)["model"]["merges"] = std::move(merges);
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
      Tokenizer::FromJson(tj->dump(), "tiny tokenizer with harmony markers");
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  model->tokenizer = std::move(*tokenizer);
  const auto id_of = [&](std::string_view marker) {
    return (*marker_ids)[std::find(markers.begin(), markers.end(), marker) - markers.begin()];
  };
  model->config.eos_token_ids = {id_of("<|return|>"), id_of("<|call|>")};
  SetChatTemplate(kHarmonyLike, "test template", &model->chat);
  EXPECT_EQ(model->chat.reasoning_format, ReasoningFormat::kHarmony);
  return std::make_unique<TestServer>(std::move(model), Options());
}

// With the markers special tokens, as in gpt-oss's own vocabulary: a constraint behind the
// analysis writes them as those tokens (they spell themselves for it: StructuredTokenBytes) or
// spelled out, the answer is held after the final header, and a forced call comes back as a
// tool call; the replies keep their markers for the harmony reader.
TEST(ReasoningE2eTest, HarmonyMarkersAsSpecialTokens) {
  std::vector<int32_t> marker_ids;
  std::unique_ptr<TestServer> server = ServeWithHarmonyTokens(&marker_ids);
  const Tokenizer& tok = *server->model().tokenizer;
  for (int32_t id : marker_ids) EXPECT_TRUE(tok.IsSpecial(id)) << id;
  constexpr int kSeeds = 24;
  int answered = 0, called = 0, with_marker_tokens = 0;
  for (const bool forced : {false, true}) {
    for (uint64_t seed = 1; seed <= kSeeds; ++seed) {
      v1::GenerateRequest r = ChatRequest("(yes|no)", seed);
      r.mutable_structured()->set_include_thinking(false);
      r.mutable_stopping()->set_max_new_tokens(120);
      r.mutable_sampling()->set_temperature(4.0f);
      if (forced) {
        r.clear_structured();
        r.mutable_chat()->add_tools()->set_name("now");
        r.mutable_chat()->mutable_tool_choice()->set_function("now");
      }
      const StreamResult got = RunGenerate(server->stub(), r);
      ASSERT_TRUE(got.status.ok()) << got.status.error_message();
      const Split s = Joined(got);
      const std::string raw = tok.Decode(s.tokens, /*skip_special_tokens=*/false);
      EXPECT_EQ(raw.rfind("<|channel|>", 0), 0u) << raw;
      with_marker_tokens += std::any_of(s.tokens.begin(), s.tokens.end(), [&](int32_t t) {
        return std::find(marker_ids.begin(), marker_ids.end(), t) != marker_ids.end();
      });
      if (forced && s.finished.reason() == v1::FINISH_REASON_TOOL_CALLS) {
        ++called;
        ASSERT_EQ(s.finished.tool_calls_size(), 1) << raw;
        EXPECT_EQ(s.finished.tool_calls(0).name(), "now");
        EXPECT_EQ(s.text, "");
      } else if (!forced && s.finished.reason() == v1::FINISH_REASON_STOP) {
        ++answered;
        EXPECT_TRUE(s.text == "yes" || s.text == "no") << raw;
      } else {
        EXPECT_EQ(s.finished.reason(), v1::FINISH_REASON_LENGTH) << raw;
      }
    }
  }
  std::printf(
      "harmony markers as special tokens: %d of %d answered, %d of %d called, %d of %d "
      "replies with marker tokens\n",
      answered, kSeeds, called, kSeeds, with_marker_tokens, 2 * kSeeds);
  EXPECT_GT(answered, 0);
  EXPECT_GT(called, 0);
  EXPECT_GT(with_marker_tokens, 0);
}

// What the service gives the engine for a budget: the reasoning format's markers as the
// tokenizer writes them, and whether the prompt opened the block; nothing for a model that does
// not think. (The engine's side: //tests:thinking_budget_test.)
TEST(ReasoningE2eTest, ThinkingBudgetMarkersFollowTheFormat) {
  struct Case {
    std::unique_ptr<TestServer> server;
    std::string kwargs;
    std::string start, end, forced;
    bool inside = false;
  };
  std::vector<int32_t> marker_ids;
  std::vector<Case> cases;
  cases.push_back({ServeWithHarmonyTokens(&marker_ids), "", "<|channel|>analysis<|message|>",
                   "<|end|>", "<|end|><|start|>assistant<|channel|>final<|message|>", false});
  cases.push_back({ServeWithTemplate(kR1Like), "", "<think>", "</think>", "</think>", true});
  cases.push_back({ServeWithTemplate(kQwen3Like), "", "<think>", "</think>", "</think>", false});
  cases.push_back({ServeWithTemplate(kQwen3Like), R"({"enable_thinking": false})", "<think>",
                   "</think>", "</think>", false});
  cases.push_back(
      {ServeWithTemplate(kQwen3Like, /*parse_reasoning=*/false), "", "", "", "", false});
  for (const Case& c : cases) {
    const ModelBundle& model = c.server->model();
    RequestLimits limits;
    limits.vocab_size = model.config.vocab_size;
    limits.max_context = 256;
    limits.max_new_tokens = 64;
    v1::GenerateRequest r = ChatRequest("");
    r.clear_structured();
    r.mutable_stopping()->set_max_new_tokens(8);
    r.mutable_chat()->set_template_kwargs(c.kwargs);
    r.mutable_chat()->set_thinking_budget(5);
    absl::StatusOr<std::unique_ptr<GenerationRequest>> g =
        ValidateGenerateRequest(r, *model.tokenizer, limits, &model.chat);
    ASSERT_TRUE(g.ok()) << g.status();
    const ThinkingBudget& b = (*g)->thinking_budget;
    if (c.end.empty()) {
      EXPECT_EQ(b.max_tokens, -1);
      continue;
    }
    EXPECT_EQ(b.max_tokens, 5);
    const Tokenizer& tok = *model.tokenizer;
    EXPECT_EQ(tok.Decode(b.start, /*skip_special_tokens=*/false), c.start);
    EXPECT_EQ(tok.Decode(b.end, false), c.end);
    EXPECT_EQ(tok.Decode(b.forced, false), c.forced);
    EXPECT_EQ(b.starts_inside, c.inside) << c.start;
  }
}

}  // namespace
}  // namespace kvrm
