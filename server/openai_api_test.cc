#include "server/openai_api.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/tokenizer.h"

namespace kvrm {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr OpenAiEndpoint kCompletions = OpenAiEndpoint::kCompletions;
constexpr OpenAiEndpoint kChat = OpenAiEndpoint::kChatCompletions;

// GPT-2's real vocabulary (byte-level BPE), loaded once for the whole binary: logprob token texts
// and bytes are then the ones a client sees.
const Tokenizer& Gpt2() {
  static const Tokenizer* tokenizer = [] {
    auto t = Tokenizer::FromFile("model/testdata/tokenizers/gpt2/tokenizer.json");
    if (!t.ok()) {
      std::cerr << "cannot load the GPT-2 tokenizer: " << t.status() << "\n";
      std::abort();
    }
    return t->release();
  }();
  return *tokenizer;
}

// The id of a text that GPT-2 encodes as exactly one token.
int32_t OneToken(absl::string_view text) {
  absl::StatusOr<std::vector<int32_t>> ids =
      Gpt2().Encode(std::string_view(text.data(), text.size()), /*add_special_tokens=*/false);
  EXPECT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(ids.ok() ? ids->size() : 0u, 1u) << "\"" << text << "\" is not one GPT-2 token";
  return ids.ok() && !ids->empty() ? (*ids)[0] : -1;
}

absl::StatusOr<OpenAiRequest> Completions(const std::string& body,
                                          const OpenAiDefaults& defaults = {}) {
  return ParseOpenAiRequest(kCompletions, body, defaults);
}

absl::StatusOr<OpenAiRequest> Chat(const std::string& body, const OpenAiDefaults& defaults = {}) {
  return ParseOpenAiRequest(kChat, body, defaults);
}

// A chat body with one user message and `more` (`"key": value, ...`) after it.
std::string ChatBody(const std::string& more = "") {
  return absl::StrCat(R"({"model": "m", "messages": [{"role": "user", "content": "hi"}])",
                      more.empty() ? "" : ", ", more, "}");
}

std::string CompletionBody(const std::string& more = "") {
  return absl::StrCat(R"({"model": "m", "prompt": "hi")", more.empty() ? "" : ", ", more, "}");
}

OpenAiRequest MustParse(OpenAiEndpoint endpoint, const std::string& body) {
  absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(endpoint, body, OpenAiDefaults());
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *std::move(r) : OpenAiRequest();
}

// The parse fails with INVALID_ARGUMENT whose message starts with "`param`: ".
void ExpectRefused(OpenAiEndpoint endpoint, const std::string& body, const std::string& param,
                   const std::string& why = "") {
  absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(endpoint, body, OpenAiDefaults());
  ASSERT_FALSE(r.ok()) << "accepted: " << body;
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << body;
  EXPECT_THAT(std::string(r.status().message()), StartsWith(param + ": ")) << body;
  if (!why.empty()) {
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(why)) << body;
  }
}

// A string's bytes as a JSON array of numbers, as chat logprobs write them.
Json Bytes(const std::string& s) {
  Json out = Json::array();
  for (unsigned char c : s) out.push_back(static_cast<int>(c));
  return out;
}

Json Parse(const std::string& text) {
  absl::StatusOr<Json> j = ParseJson(text, "test output");
  EXPECT_TRUE(j.ok()) << j.status() << "\n" << text;
  return j.ok() ? *j : Json();
}

// Splits server-sent events, checking each is framed "data: <payload>\n\n"; the payloads.
std::vector<std::string> SsePayloads(const std::string& sse) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < sse.size()) {
    const size_t end = sse.find("\n\n", at);
    EXPECT_NE(end, std::string::npos) << "unterminated event in: " << sse;
    if (end == std::string::npos) break;
    const std::string event = sse.substr(at, end - at);
    EXPECT_THAT(event, StartsWith("data: "));
    EXPECT_EQ(event.find('\n'), std::string::npos) << "an event of more than one line: " << event;
    out.push_back(event.substr(std::min<size_t>(6, event.size())));
    at = end + 2;
  }
  return out;
}

// The chunks of server-sent events that are all JSON (no [DONE]).
std::vector<Json> SseChunks(const std::string& sse) {
  std::vector<Json> out;
  for (const std::string& payload : SsePayloads(sse)) out.push_back(Parse(payload));
  return out;
}

// ---- messages of the service's stream --------------------------------------------------------

v1::GenerateResponse Delta(int index, const std::string& text) {
  v1::GenerateResponse m;
  m.set_request_id("req-1");
  m.set_index(index);
  m.set_text(text);
  return m;
}

void AddLogprob(v1::GenerateResponse* m, int32_t id, float logprob,
                const std::vector<std::pair<int32_t, float>>& top = {}) {
  m->add_token_ids(id);
  v1::TokenLogprob* lp = m->add_logprobs();
  lp->set_token_id(id);
  lp->set_logprob(logprob);
  for (const auto& [alt, alt_logprob] : top) {
    v1::TopLogprob* t = lp->add_top();
    t->set_token_id(alt);
    t->set_logprob(alt_logprob);
  }
}

v1::GenerateResponse Final(int index, const std::string& text, v1::FinishReason reason,
                           int prompt_tokens, int completion_tokens, int cached_tokens = 0,
                           const std::string& matched_stop = "") {
  v1::GenerateResponse m = Delta(index, text);
  v1::Finished* f = m.mutable_finished();
  f->set_reason(reason);
  f->set_matched_stop(matched_stop);
  f->mutable_usage()->set_prompt_tokens(prompt_tokens);
  f->mutable_usage()->set_completion_tokens(completion_tokens);
  f->mutable_usage()->set_cached_prompt_tokens(cached_tokens);
  return m;
}

void AddToolCall(v1::GenerateResponse* m, const std::string& id, const std::string& name,
                 const std::string& arguments) {
  v1::ToolCall* c = m->mutable_finished()->add_tool_calls();
  c->set_id(id);
  c->set_name(name);
  c->set_arguments(arguments);
}

// =============================================================================================
// Completions requests

// What this server cannot honour is refused by name, not ignored: a client relying on it
// learns at once. The neutral values (false, 0, null, true for skip_special_tokens) pass.
TEST(RequestTest, UnsupportedParametersAreRefusedByName) {
  for (OpenAiEndpoint e : {kChat, kCompletions}) {
    const auto body = [&](const std::string& more) {
      return e == kChat ? ChatBody(more) : CompletionBody(more);
    };
    ExpectRefused(e, body(R"("use_beam_search": "yes")"), "use_beam_search");
    // vLLM's beam search: the n beams; length_penalty only with it.
    absl::StatusOr<OpenAiRequest> beams = ParseOpenAiRequest(
        e, body(R"("use_beam_search": true, "n": 3, "length_penalty": 0.5)"), OpenAiDefaults());
    ASSERT_TRUE(beams.ok()) << beams.status();
    EXPECT_TRUE(beams->generate.has_beam_search());
    EXPECT_FLOAT_EQ(beams->generate.beam_search().length_penalty(), 0.5f);
    EXPECT_EQ(beams->generate.n(), 3);
    EXPECT_EQ(beams->params.at("beam_search.length_penalty"), "length_penalty");
    absl::StatusOr<OpenAiRequest> raw = ParseOpenAiRequest(
        e, body(R"("use_beam_search": true, "n": 2, "length_penalty": 0)"), OpenAiDefaults());
    ASSERT_TRUE(raw.ok());
    EXPECT_TRUE(raw->generate.beam_search().has_length_penalty()) << "0: no normalisation";
    EXPECT_FALSE(ParseOpenAiRequest(e, body(R"("use_beam_search": true, "n": 2)"), OpenAiDefaults())
                     ->generate.beam_search()
                     .has_length_penalty());
    absl::StatusOr<OpenAiRequest> sampled =
        ParseOpenAiRequest(e, body(R"("length_penalty": 2)"), OpenAiDefaults());
    ASSERT_TRUE(sampled.ok());
    EXPECT_FALSE(sampled->generate.has_beam_search());
    ExpectRefused(e, body(R"("skip_special_tokens": false)"), "skip_special_tokens");
    for (const char* neutral : {R"("prompt_logprobs": null)", R"("use_beam_search": false)",
                                R"("skip_special_tokens": true)", R"("guided_grammar": null)",
                                R"("structured_outputs": null)"}) {
      EXPECT_TRUE(ParseOpenAiRequest(e, body(neutral), OpenAiDefaults()).ok()) << neutral;
    }
  }
  ExpectRefused(kChat, ChatBody(R"("functions": [{"name": "f"}])"), "functions", "tools");
  ExpectRefused(kChat, ChatBody(R"("function_call": "auto")"), "function_call", "tool_choice");
  ExpectRefused(kChat, ChatBody(R"("chat_template": "{{ messages }}")"), "chat_template");
}

TEST(CompletionsRequestTest, StringPromptIsText) {
  absl::StatusOr<OpenAiRequest> r = Completions(R"({"model": "gpt2", "prompt": "Hello"})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->endpoint, kCompletions);
  EXPECT_EQ(r->generate.prompt_case(), v1::GenerateRequest::kText);
  EXPECT_EQ(r->generate.text(), "Hello");
  EXPECT_EQ(r->model, "gpt2");
  EXPECT_FALSE(r->stream);
  EXPECT_FALSE(r->include_usage);
  EXPECT_FALSE(r->echo);
  EXPECT_EQ(r->logprobs, -1);
  EXPECT_FALSE(r->generate.has_response());
  EXPECT_FALSE(r->generate.skip_bos());
}

TEST(CompletionsRequestTest, TokenIdPromptIsTokenIds) {
  absl::StatusOr<OpenAiRequest> r = Completions(R"({"prompt": [1, 2, 3]})");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->generate.prompt_case(), v1::GenerateRequest::kTokenIds);
  EXPECT_THAT(r->generate.token_ids().ids(), ::testing::ElementsAre(1, 2, 3));
  EXPECT_EQ(r->model, "");  // absent
}

TEST(CompletionsRequestTest, SingleElementListsAreOnePrompt) {
  absl::StatusOr<OpenAiRequest> ids = Completions(R"({"prompt": [[7, 8]]})");
  ASSERT_TRUE(ids.ok()) << ids.status();
  ASSERT_EQ(ids->generate.prompt_case(), v1::GenerateRequest::kTokenIds);
  EXPECT_THAT(ids->generate.token_ids().ids(), ::testing::ElementsAre(7, 8));

  absl::StatusOr<OpenAiRequest> text = Completions(R"({"prompt": ["a b"]})");
  ASSERT_TRUE(text.ok()) << text.status();
  ASSERT_EQ(text->generate.prompt_case(), v1::GenerateRequest::kText);
  EXPECT_EQ(text->generate.text(), "a b");
}

TEST(CompletionsRequestTest, ListsOfPromptsAreOneCallEach) {
  const OpenAiRequest r = MustParse(kCompletions, R"({"prompt": ["a b", [5, 6], "c"], "n": 2,
                                                     "temperature": 0.5, "max_tokens": 7,
                                                     "request_id": "batch"})");
  EXPECT_EQ(r.generate.text(), "a b");
  ASSERT_EQ(r.more_prompts.size(), 2u);
  const std::vector<v1::GenerateRequest> calls = OpenAiCalls(r);
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(calls[0].prompt_case(), v1::GenerateRequest::kText);
  EXPECT_EQ(calls[0].text(), "a b");
  ASSERT_EQ(calls[1].prompt_case(), v1::GenerateRequest::kTokenIds);
  EXPECT_THAT(calls[1].token_ids().ids(), ::testing::ElementsAre(5, 6));
  EXPECT_EQ(calls[2].text(), "c");
  for (size_t p = 0; p < calls.size(); ++p) {
    // Every call carries the request's parameters, under its own id.
    EXPECT_EQ(calls[p].request_id(), absl::StrCat("batch-", p));
    EXPECT_EQ(calls[p].n(), 2);
    EXPECT_FLOAT_EQ(calls[p].sampling().temperature(), 0.5f);
    EXPECT_EQ(calls[p].stopping().max_new_tokens(), 7);
  }
  // A lone prompt's call is `generate` itself, id unchanged.
  const OpenAiRequest one = MustParse(kCompletions, R"({"prompt": ["x"], "request_id": "solo"})");
  const std::vector<v1::GenerateRequest> solo = OpenAiCalls(one);
  ASSERT_EQ(solo.size(), 1u);
  EXPECT_EQ(solo[0].request_id(), "solo");
  EXPECT_EQ(solo[0].text(), "x");
}

TEST(CompletionsRequestTest, ListsOfPromptsAreBoundedAndCheckedPerElement) {
  OpenAiDefaults two;
  two.max_prompts = 2;
  absl::StatusOr<OpenAiRequest> r = Completions(R"({"prompt": ["a", "b", "c"]})", two);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()),
              StartsWith("prompt: a list of 3 prompts: at most 2"));
  EXPECT_TRUE(Completions(R"({"prompt": ["a", "b"]})", two).ok());
  ExpectRefused(kCompletions, R"({"prompt": ["a", 3]})", "prompt[1]");
  ExpectRefused(kCompletions, R"({"prompt": [[1], [2, -3]]})", "prompt[1][1]");
  ExpectRefused(kCompletions, R"({"prompt": ["a", []]})", "prompt[1]", "is empty");
  ExpectRefused(kCompletions, R"({"prompt": [[1], null]})", "prompt[1]");
}

TEST(CompletionsRequestTest, MissingOrMalformedPromptIsRefused) {
  ExpectRefused(kCompletions, R"({"model": "m"})", "prompt", "is required");
  ExpectRefused(kCompletions, R"({"prompt": null})", "prompt", "is required");
  ExpectRefused(kCompletions, R"({"prompt": []})", "prompt", "is empty");
  ExpectRefused(kCompletions, R"({"prompt": 5})", "prompt");
  ExpectRefused(kCompletions, R"({"prompt": {"text": "a"}})", "prompt");
  ExpectRefused(kCompletions, R"({"prompt": [1, "a"]})", "prompt[1]");
  ExpectRefused(kCompletions, R"({"prompt": [1, 2.5]})", "prompt[1]");
  ExpectRefused(kCompletions, R"({"prompt": [-1]})", "prompt[0]", "is not a token id");
  ExpectRefused(kCompletions, R"({"prompt": [[1, -2]]})", "prompt[0][1]");
  ExpectRefused(kCompletions, R"({"prompt": [true]})", "prompt[0]");
}

TEST(CompletionsRequestTest, DefaultsWhenAbsent) {
  absl::StatusOr<OpenAiRequest> r = Completions(R"({"prompt": "x"})");
  ASSERT_TRUE(r.ok()) << r.status();
  const v1::GenerateRequest& g = r->generate;
  EXPECT_EQ(g.stopping().max_new_tokens(), 16);  // OpenAI's default for completions
  EXPECT_FLOAT_EQ(g.sampling().temperature(), 1.0f);
  EXPECT_EQ(g.sampling().top_k(), 0);
  EXPECT_FLOAT_EQ(g.sampling().top_p(), 0.0f);  // unset: disabled
  EXPECT_FALSE(g.sampling().has_seed());
  EXPECT_TRUE(g.sampling().logit_bias().empty());
  EXPECT_TRUE(g.stopping().stop_sequences().empty());
  EXPECT_EQ(g.n(), 0);
  EXPECT_EQ(g.priority(), 0);
  EXPECT_EQ(g.request_id(), "");
  EXPECT_FALSE(g.has_structured());

  OpenAiDefaults defaults;
  defaults.completion_max_tokens = 7;
  defaults.chat_max_tokens = 99;
  absl::StatusOr<OpenAiRequest> d = Completions(R"({"prompt": "x"})", defaults);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->generate.stopping().max_new_tokens(), 7);
}

TEST(CompletionsRequestTest, MaxTokensAndTemperatureZeroAreKept) {
  absl::StatusOr<OpenAiRequest> r =
      Completions(R"({"prompt": "x", "max_tokens": 5, "temperature": 0})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->generate.stopping().max_new_tokens(), 5);
  EXPECT_FLOAT_EQ(r->generate.sampling().temperature(), 0.0f);
  // Completions have no max_completion_tokens: max_tokens is the one taken.
  absl::StatusOr<OpenAiRequest> both =
      Completions(R"({"prompt": "x", "max_tokens": 5, "max_completion_tokens": 9})");
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(both->generate.stopping().max_new_tokens(), 5);
}

TEST(CompletionsRequestTest, EverySamplingParameterLandsInItsField) {
  absl::StatusOr<OpenAiRequest> r = Completions(R"({
      "prompt": "x", "temperature": 0.5, "top_p": 0.25, "top_k": 40, "min_p": 0.125,
      "repetition_penalty": 1.5, "presence_penalty": -0.5, "frequency_penalty": 0.75,
      "seed": 1234, "logit_bias": {"50": -100, "7": 2.5}, "stop": ["\n", "END"],
      "stop_token_ids": [11, 12], "ignore_eos": true, "min_tokens": 3, "n": 2,
      "include_stop_str_in_output": true, "truncate_prompt_tokens": 100,
      "allowed_token_ids": [4, 9, 2], "bad_words": ["darn", " heck it"],
      "cache_salt": "tenant-a", "priority": -5, "request_id": "my-req",
      "stream": true, "stream_options": {"include_usage": true}, "user": "u1"})");
  ASSERT_TRUE(r.ok()) << r.status();
  const v1::GenerateRequest& g = r->generate;
  EXPECT_FLOAT_EQ(g.sampling().temperature(), 0.5f);
  EXPECT_FLOAT_EQ(g.sampling().top_p(), 0.25f);
  EXPECT_EQ(g.sampling().top_k(), 40);
  EXPECT_FLOAT_EQ(g.sampling().min_p(), 0.125f);
  EXPECT_FLOAT_EQ(g.sampling().repetition_penalty(), 1.5f);
  EXPECT_FLOAT_EQ(g.sampling().presence_penalty(), -0.5f);
  EXPECT_FLOAT_EQ(g.sampling().frequency_penalty(), 0.75f);
  ASSERT_TRUE(g.sampling().has_seed());
  EXPECT_EQ(g.sampling().seed(), 1234u);
  ASSERT_EQ(g.sampling().logit_bias().size(), 2u);
  EXPECT_FLOAT_EQ(g.sampling().logit_bias().at(50), -100.0f);
  EXPECT_FLOAT_EQ(g.sampling().logit_bias().at(7), 2.5f);
  EXPECT_THAT(g.stopping().stop_sequences(), ::testing::ElementsAre("\n", "END"));
  EXPECT_THAT(g.stopping().stop_token_ids(), ::testing::ElementsAre(11, 12));
  EXPECT_TRUE(g.stopping().ignore_eos());
  EXPECT_EQ(g.stopping().min_tokens(), 3);
  EXPECT_TRUE(g.stopping().include_stop_str_in_output());
  EXPECT_EQ(g.truncate_prompt_tokens(), 100);
  EXPECT_THAT(g.sampling().allowed_token_ids(), ::testing::ElementsAre(4, 9, 2));
  EXPECT_THAT(g.sampling().bad_words(), ::testing::ElementsAre("darn", " heck it"));
  EXPECT_EQ(g.n(), 2);
  EXPECT_EQ(g.cache_salt(), "tenant-a");
  EXPECT_EQ(g.priority(), -5);
  EXPECT_EQ(g.request_id(), "my-req");
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
}

TEST(CompletionsRequestTest, StopAsOneString) {
  absl::StatusOr<OpenAiRequest> r = Completions(CompletionBody(R"("stop": "###")"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->generate.stopping().stop_sequences(), ::testing::ElementsAre("###"));
}

TEST(CompletionsRequestTest, TopKMinusOneIsOff) {
  absl::StatusOr<OpenAiRequest> r = Completions(CompletionBody(R"("top_k": -1)"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->generate.sampling().top_k(), 0);
  // Other negatives are passed on for validation to refuse.
  absl::StatusOr<OpenAiRequest> neg = Completions(CompletionBody(R"("top_k": -2)"));
  ASSERT_TRUE(neg.ok()) << neg.status();
  EXPECT_EQ(neg->generate.sampling().top_k(), -2);
}

TEST(CompletionsRequestTest, NegativeSeedWraps) {
  absl::StatusOr<OpenAiRequest> r = Completions(CompletionBody(R"("seed": -1)"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->generate.sampling().seed(), UINT64_MAX);
  // The whole uint64 range is a seed.
  absl::StatusOr<OpenAiRequest> big =
      Completions(CompletionBody(R"("seed": 18446744073709551615)"));
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(big->generate.sampling().seed(), UINT64_MAX);
}

TEST(CompletionsRequestTest, IntegralFloatsAreIntegers) {
  absl::StatusOr<OpenAiRequest> r =
      Completions(CompletionBody(R"("max_tokens": 3.0, "n": 2.0, "prompt_ignored": 1)"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->generate.stopping().max_new_tokens(), 3);
  EXPECT_EQ(r->generate.n(), 2);
  ExpectRefused(kCompletions, CompletionBody(R"("max_tokens": 3.5)"), "max_tokens",
                "must be an integer");
}

TEST(CompletionsRequestTest, OutOfRangeIntegersAreRefused) {
  ExpectRefused(kCompletions, CompletionBody(R"("max_tokens": 3000000000)"), "max_tokens",
                "out of range");
  ExpectRefused(kCompletions, CompletionBody(R"("priority": -3000000000)"), "priority",
                "out of range");
  ExpectRefused(kCompletions, CompletionBody(R"("stop_token_ids": [3000000000])"),
                "stop_token_ids");
  // Beyond int64 (a JSON unsigned number) is out of range too, not wrapped to a negative value.
  ExpectRefused(kCompletions, CompletionBody(R"("priority": 18446744073709551615)"), "priority",
                "out of range");
  ExpectRefused(kCompletions, CompletionBody(R"("top_k": 18446744073709551615)"), "top_k",
                "out of range");
  ExpectRefused(kCompletions, CompletionBody(R"("max_tokens": 9223372036854775808)"),
                "max_tokens", ": 9223372036854775808 is out of range");
  ExpectRefused(kCompletions, R"({"prompt": [18446744073709551615]})", "prompt[0]");
  ExpectRefused(kCompletions, CompletionBody(R"("stop_token_ids": [18446744073709551615])"),
                "stop_token_ids[0]", "out of range");
}

TEST(CompletionsRequestTest, LogprobsAsksForTopAlternatives) {
  absl::StatusOr<OpenAiRequest> r = Completions(CompletionBody(R"("logprobs": 3)"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->logprobs, 3);
  EXPECT_TRUE(r->generate.response().logprobs());
  EXPECT_EQ(r->generate.response().top_logprobs(), 3);

  absl::StatusOr<OpenAiRequest> zero = Completions(CompletionBody(R"("logprobs": 0)"));
  ASSERT_TRUE(zero.ok()) << zero.status();
  EXPECT_EQ(zero->logprobs, 0);
  EXPECT_TRUE(zero->generate.response().logprobs());
  EXPECT_EQ(zero->generate.response().top_logprobs(), 0);

  ExpectRefused(kCompletions, CompletionBody(R"("logprobs": true)"), "logprobs");
}

TEST(CompletionsRequestTest, EchoAndItsLimits) {
  absl::StatusOr<OpenAiRequest> r = Completions(CompletionBody(R"("echo": true)"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->echo);
  EXPECT_FALSE(r->generate.response().prompt_logprobs());
  // echo with logprobs scores the prompt too (the prompt's tokens lead the logprobs object).
  r = Completions(CompletionBody(R"("echo": true, "logprobs": 3)"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->generate.response().prompt_logprobs());
  EXPECT_EQ(r->generate.response().prompt_top_logprobs(), 3);
  EXPECT_EQ(r->prompt_logprobs, -1);  // no vLLM prompt_logprobs list
  // echo false with logprobs does not.
  r = Completions(CompletionBody(R"("echo": false, "logprobs": 1)"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->generate.response().prompt_logprobs());
}

TEST(RequestTest, PromptLogprobsAskTheServiceToScoreThePrompt) {
  for (OpenAiEndpoint e : {kChat, kCompletions}) {
    const auto body = [&](const std::string& more) {
      return e == kChat ? ChatBody(more) : CompletionBody(more);
    };
    absl::StatusOr<OpenAiRequest> r =
        ParseOpenAiRequest(e, body(R"("prompt_logprobs": 0)"), OpenAiDefaults());
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->prompt_logprobs, 0);
    EXPECT_TRUE(r->generate.response().prompt_logprobs());
    EXPECT_EQ(r->generate.response().prompt_top_logprobs(), 0);
    r = ParseOpenAiRequest(e, body(R"("prompt_logprobs": 4)"), OpenAiDefaults());
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->generate.response().prompt_top_logprobs(), 4);
    // The service's range error is reported under the request's name for it.
    const OpenAiError err = ToOpenAiError(
        absl::InvalidArgumentError("response.prompt_top_logprobs: 21 is outside [0, 20]"), &*r);
    EXPECT_EQ(err.param, "prompt_logprobs");
    r = ParseOpenAiRequest(e, body(R"("prompt_logprobs": null)"), OpenAiDefaults());
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_FALSE(r->generate.response().prompt_logprobs());
    ExpectRefused(e, body(R"("prompt_logprobs": "all")"), "prompt_logprobs");
  }
}

TEST(CompletionsRequestTest, SuffixIsRefused) {
  ExpectRefused(kCompletions, CompletionBody(R"("suffix": "tail")"), "suffix", "not supported");
  EXPECT_TRUE(Completions(CompletionBody(R"("suffix": "")")).ok());
  EXPECT_TRUE(Completions(CompletionBody(R"("suffix": null)")).ok());
}

TEST(CompletionsRequestTest, BestOfMustEqualN) {
  ExpectRefused(kCompletions, CompletionBody(R"("best_of": 2)"), "best_of", "must equal n");
  ExpectRefused(kCompletions, CompletionBody(R"("best_of": 3, "n": 2)"), "best_of");
  EXPECT_TRUE(Completions(CompletionBody(R"("best_of": 1)")).ok());
  absl::StatusOr<OpenAiRequest> r = Completions(CompletionBody(R"("best_of": 2, "n": 2)"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->generate.n(), 2);
}

TEST(CompletionsRequestTest, AddSpecialTokensFalseSkipsBos) {
  absl::StatusOr<OpenAiRequest> off = Completions(CompletionBody(R"("add_special_tokens": false)"));
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_TRUE(off->generate.skip_bos());
  absl::StatusOr<OpenAiRequest> on = Completions(CompletionBody(R"("add_special_tokens": true)"));
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_FALSE(on->generate.skip_bos());
}

TEST(CompletionsRequestTest, StructuredOutputsToo) {
  absl::StatusOr<OpenAiRequest> r = Completions(CompletionBody(R"("guided_regex": "[0-9]+")"));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->generate.has_structured());
  EXPECT_EQ(r->generate.structured().regex(), "[0-9]+");
  EXPECT_EQ(r->params.at("structured.regex"), "guided_regex");
}

// =============================================================================================
// Chat requests

TEST(ChatRequestTest, StringAndTextPartContent) {
  absl::StatusOr<OpenAiRequest> r = Chat(R"({"model": "m", "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "Hello, "},
                                   {"type": "text", "text": "world"}], "name": "ann"}]})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->endpoint, kChat);
  ASSERT_EQ(r->generate.prompt_case(), v1::GenerateRequest::kChat);
  const v1::ChatPrompt& chat = r->generate.chat();
  ASSERT_EQ(chat.messages_size(), 2);
  EXPECT_EQ(chat.messages(0).role(), "system");
  EXPECT_EQ(chat.messages(0).content(), "Be brief.");
  EXPECT_EQ(chat.messages(1).role(), "user");
  EXPECT_EQ(chat.messages(1).content(), "Hello, world");  // joined without a separator
  EXPECT_EQ(chat.messages(1).name(), "ann");
  EXPECT_FALSE(chat.has_add_generation_prompt());
  EXPECT_FALSE(chat.has_tool_choice());
  EXPECT_EQ(chat.template_kwargs(), "");
}

TEST(ChatRequestTest, NonTextPartsAreRefusedNamingThePart) {
  ExpectRefused(kChat, R"({"messages": [{"role": "user", "content": [
      {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]})",
                "messages[0].content[0].type", "image_url");
  ExpectRefused(kChat, R"({"messages": [{"role": "user", "content": "a"},
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "input_audio"}]}]})",
                "messages[1].content[1].type");
  ExpectRefused(kChat, R"({"messages": [{"role": "user", "content": [{"type": "text"}]}]})",
                "messages[0].content[0].text", "is required");
  ExpectRefused(kChat, R"({"messages": [{"role": "user", "content": ["a"]}]})",
                "messages[0].content[0]");
  ExpectRefused(kChat, R"({"messages": [{"role": "user", "content": 3}]})",
                "messages[0].content");
}

TEST(ChatRequestTest, RoleIsRequired) {
  ExpectRefused(kChat, R"({"messages": [{"content": "hi"}]})", "messages[0].role", "is required");
  ExpectRefused(kChat, R"({"messages": [{"role": "user", "content": "a"}, {"role": 1}]})",
                "messages[1].role");
  ExpectRefused(kChat, R"({"messages": ["hi"]})", "messages[0]");
  ExpectRefused(kChat, R"({"model": "m"})", "messages", "is required");
  ExpectRefused(kChat, R"({"messages": {"role": "user"}})", "messages");
}

TEST(ChatRequestTest, AssistantToolCallsAndToolResults) {
  absl::StatusOr<OpenAiRequest> r = Chat(R"({"messages": [
      {"role": "user", "content": "weather?"},
      {"role": "assistant", "content": null, "reasoning_content": "Need the weather.",
       "tool_calls": [
          {"id": "call_1", "type": "function",
           "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
          {"id": "call_2", "type": "function",
           "function": {"name": "get_time", "arguments": {"tz": "CET", "fmt": 24}}}]},
      {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "sunny"}]})");
  ASSERT_TRUE(r.ok()) << r.status();
  const v1::ChatPrompt& chat = r->generate.chat();
  ASSERT_EQ(chat.messages_size(), 3);
  const v1::ChatMessage& assistant = chat.messages(1);
  EXPECT_EQ(assistant.role(), "assistant");
  EXPECT_EQ(assistant.content(), "");
  EXPECT_EQ(assistant.reasoning_content(), "Need the weather.");  // a past turn's reasoning
  ASSERT_EQ(assistant.tool_calls_size(), 2);
  EXPECT_EQ(assistant.tool_calls(0).id(), "call_1");
  EXPECT_EQ(assistant.tool_calls(0).name(), "get_weather");
  EXPECT_EQ(assistant.tool_calls(0).arguments(), "{\"city\": \"Paris\"}");  // the string as sent
  EXPECT_EQ(assistant.tool_calls(1).id(), "call_2");
  EXPECT_EQ(assistant.tool_calls(1).name(), "get_time");
  EXPECT_EQ(Parse(assistant.tool_calls(1).arguments()), Parse(R"({"tz": "CET", "fmt": 24})"));
  const v1::ChatMessage& tool = chat.messages(2);
  EXPECT_EQ(tool.role(), "tool");
  EXPECT_EQ(tool.tool_call_id(), "call_1");
  EXPECT_EQ(tool.name(), "get_weather");
  EXPECT_EQ(tool.content(), "sunny");
  EXPECT_EQ(tool.reasoning_content(), "");
  // vLLM's other name for it.
  r = Chat(R"({"messages": [{"role": "assistant", "content": "x", "reasoning": "hm"}]})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->generate.chat().messages(0).reasoning_content(), "hm");
  ExpectRefused(kChat, R"({"messages": [{"role": "assistant", "reasoning_content": 3}]})",
                "messages[0].reasoning_content");

  ExpectRefused(kChat, R"({"messages": [{"role": "assistant", "tool_calls": [{"id": "c"}]}]})",
                "messages[0].tool_calls[0].function", "is required");
  ExpectRefused(kChat,
                R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}]})",
                "messages[0].tool_calls[0].function.name");
  ExpectRefused(kChat, R"({"messages": [{"role": "assistant", "tool_calls": [
      {"function": {"name": "f", "arguments": 3}}]}]})",
                "messages[0].tool_calls[0].function.arguments");
  ExpectRefused(kChat, R"({"messages": [{"role": "assistant", "tool_calls": {}}]})",
                "messages[0].tool_calls");
}

TEST(ChatRequestTest, ToolsBecomeChatTools) {
  absl::StatusOr<OpenAiRequest> r = Chat(ChatBody(R"("tools": [
      {"type": "function", "function": {"name": "get_weather", "description": "Weather now",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}},
      {"function": {"name": "noop", "parameters": "{\"type\": \"object\"}"}},
      {"type": "function", "function": {"name": "bare"}}])"));
  ASSERT_TRUE(r.ok()) << r.status();
  const v1::ChatPrompt& chat = r->generate.chat();
  ASSERT_EQ(chat.tools_size(), 3);
  EXPECT_EQ(chat.tools(0).name(), "get_weather");
  EXPECT_EQ(chat.tools(0).description(), "Weather now");
  EXPECT_EQ(Parse(chat.tools(0).parameters()),
            Parse(R"({"type": "object", "properties": {"city": {"type": "string"}},
                      "required": ["city"]})"));
  EXPECT_EQ(chat.tools(1).name(), "noop");
  EXPECT_EQ(chat.tools(1).parameters(), "{\"type\": \"object\"}");
  EXPECT_EQ(chat.tools(2).name(), "bare");
  EXPECT_EQ(chat.tools(2).parameters(), "");

  ExpectRefused(kChat, ChatBody(R"("tools": [{"type": "retrieval", "function": {"name": "f"}}])"),
                "tools[0].type", "retrieval");
  ExpectRefused(kChat, ChatBody(R"("tools": [{"type": "function"}])"), "tools[0].function");
  ExpectRefused(kChat, ChatBody(R"("tools": [{"function": {"parameters": {}}}])"),
                "tools[0].function.name");
  ExpectRefused(kChat, ChatBody(R"("tools": [{"function": {"name": "f", "parameters": [1]}}])"),
                "tools[0].function.parameters");
  ExpectRefused(kChat, ChatBody(R"("tools": {"function": {"name": "f"}})"), "tools");
}

TEST(ChatRequestTest, ToolChoice) {
  const struct {
    const char* json;
    v1::ToolChoiceMode mode;
  } modes[] = {{R"("auto")", v1::TOOL_CHOICE_MODE_AUTO},
               {R"("none")", v1::TOOL_CHOICE_MODE_NONE},
               {R"("required")", v1::TOOL_CHOICE_MODE_REQUIRED}};
  for (const auto& m : modes) {
    absl::StatusOr<OpenAiRequest> r = Chat(ChatBody(absl::StrCat(R"("tool_choice": )", m.json)));
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(r->generate.chat().has_tool_choice()) << m.json;
    EXPECT_EQ(r->generate.chat().tool_choice().choice_case(), v1::ToolChoice::kMode) << m.json;
    EXPECT_EQ(r->generate.chat().tool_choice().mode(), m.mode) << m.json;
  }
  absl::StatusOr<OpenAiRequest> named =
      Chat(ChatBody(R"("tool_choice": {"type": "function", "function": {"name": "f"}})"));
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(named->generate.chat().tool_choice().choice_case(), v1::ToolChoice::kFunction);
  EXPECT_EQ(named->generate.chat().tool_choice().function(), "f");

  ExpectRefused(kChat, ChatBody(R"("tool_choice": "any")"), "tool_choice", "\"any\"");
  ExpectRefused(kChat, ChatBody(R"("tool_choice": 1)"), "tool_choice");
  ExpectRefused(kChat, ChatBody(R"("tool_choice": {"type": "function"})"),
                "tool_choice.function.name", "is required");
  // Absent (or null): no choice set, the proto's default (AUTO).
  absl::StatusOr<OpenAiRequest> none = Chat(ChatBody(R"("tool_choice": null)"));
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->generate.chat().has_tool_choice());
  EXPECT_FALSE(none->generate.chat().has_parallel_tool_calls()) << "unset: the default, true";
}

TEST(ChatRequestTest, ParallelToolCalls) {
  for (bool parallel : {false, true}) {
    absl::StatusOr<OpenAiRequest> r = Chat(
        ChatBody(absl::StrCat(R"("parallel_tool_calls": )", parallel ? "true" : "false")));
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(r->generate.chat().has_parallel_tool_calls());
    EXPECT_EQ(r->generate.chat().parallel_tool_calls(), parallel);
  }
  ExpectRefused(kChat, ChatBody(R"("parallel_tool_calls": "no")"), "parallel_tool_calls");
}

TEST(ChatRequestTest, MaxCompletionTokensWinsOverMaxTokens) {
  absl::StatusOr<OpenAiRequest> both =
      Chat(ChatBody(R"("max_tokens": 10, "max_completion_tokens": 20)"));
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(both->generate.stopping().max_new_tokens(), 20);
  EXPECT_EQ(both->params.at("stopping.max_new_tokens"), "max_completion_tokens");

  absl::StatusOr<OpenAiRequest> old = Chat(ChatBody(R"("max_tokens": 10)"));
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(old->generate.stopping().max_new_tokens(), 10);
  EXPECT_EQ(old->params.at("stopping.max_new_tokens"), "max_tokens");

  absl::StatusOr<OpenAiRequest> neither = Chat(ChatBody());
  ASSERT_TRUE(neither.ok()) << neither.status();
  EXPECT_EQ(neither->generate.stopping().max_new_tokens(), OpenAiDefaults().chat_max_tokens);
  EXPECT_EQ(neither->generate.stopping().max_new_tokens(), 4096);
  EXPECT_FLOAT_EQ(neither->generate.sampling().temperature(), 1.0f);

  OpenAiDefaults defaults;
  defaults.chat_max_tokens = 321;
  defaults.completion_max_tokens = 5;
  absl::StatusOr<OpenAiRequest> custom = Chat(ChatBody(), defaults);
  ASSERT_TRUE(custom.ok()) << custom.status();
  EXPECT_EQ(custom->generate.stopping().max_new_tokens(), 321);

  ExpectRefused(kChat, ChatBody(R"("max_completion_tokens": "many")"), "max_completion_tokens");
}

TEST(ChatRequestTest, LogprobsAndTopLogprobs) {
  absl::StatusOr<OpenAiRequest> r = Chat(ChatBody(R"("logprobs": true, "top_logprobs": 2)"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->logprobs, 2);
  EXPECT_TRUE(r->generate.response().logprobs());
  EXPECT_EQ(r->generate.response().top_logprobs(), 2);

  absl::StatusOr<OpenAiRequest> plain = Chat(ChatBody(R"("logprobs": true)"));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->logprobs, 0);
  EXPECT_TRUE(plain->generate.response().logprobs());
  EXPECT_EQ(plain->generate.response().top_logprobs(), 0);

  absl::StatusOr<OpenAiRequest> off = Chat(ChatBody(R"("logprobs": false)"));
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(off->logprobs, -1);
  EXPECT_FALSE(off->generate.response().logprobs());

  ExpectRefused(kChat, ChatBody(R"("top_logprobs": 2)"), "top_logprobs", "needs logprobs");
  ExpectRefused(kChat, ChatBody(R"("logprobs": false, "top_logprobs": 2)"), "top_logprobs");
  ExpectRefused(kChat, ChatBody(R"("logprobs": 3)"), "logprobs", "must be a boolean");
}

TEST(ChatRequestTest, TemplateOptions) {
  absl::StatusOr<OpenAiRequest> r = Chat(ChatBody(
      R"("chat_template_kwargs": {"enable_thinking": false, "depth": 2},
         "add_generation_prompt": false, "continue_final_message": true)"));
  ASSERT_TRUE(r.ok()) << r.status();
  const v1::ChatPrompt& chat = r->generate.chat();
  EXPECT_EQ(Parse(chat.template_kwargs()), Parse(R"({"enable_thinking": false, "depth": 2})"));
  ASSERT_TRUE(chat.has_add_generation_prompt());
  EXPECT_FALSE(chat.add_generation_prompt());
  EXPECT_TRUE(chat.continue_final_message());

  ExpectRefused(kChat, ChatBody(R"("chat_template_kwargs": "x")"), "chat_template_kwargs");
  ExpectRefused(kChat, ChatBody(R"("add_generation_prompt": "yes")"), "add_generation_prompt");

  // reasoning_effort reaches the template (gpt-oss's reads it); the kwargs' own wins.
  r = Chat(ChatBody(R"("reasoning_effort": "low")"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Parse(r->generate.chat().template_kwargs()), Parse(R"({"reasoning_effort": "low"})"));
  r = Chat(ChatBody(
      R"("reasoning_effort": "low", "chat_template_kwargs": {"reasoning_effort": "high", "a": 1})"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Parse(r->generate.chat().template_kwargs()),
            Parse(R"({"reasoning_effort": "high", "a": 1})"));
  r = Chat(ChatBody(R"("reasoning_effort": null)"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->generate.chat().template_kwargs(), "");
  ExpectRefused(kChat, ChatBody(R"("reasoning_effort": "extreme")"), "reasoning_effort",
                "use low, medium or high");
  ExpectRefused(kChat, ChatBody(R"("reasoning_effort": "minimal")"), "reasoning_effort");
  ExpectRefused(kChat, ChatBody(R"("reasoning_effort": 3)"), "reasoning_effort");

  // vLLM's thinking_token_budget.
  r = Chat(ChatBody(R"("thinking_token_budget": 256)"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->generate.chat().thinking_budget(), 256);
  EXPECT_EQ(r->params.at("chat.thinking_budget"), "thinking_token_budget");
  r = Chat(ChatBody(""));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->generate.chat().has_thinking_budget());
  ExpectRefused(kChat, ChatBody(R"("thinking_token_budget": "many")"), "thinking_token_budget");
  ExpectRefused(kChat, ChatBody(R"("thinking_token_budget": 1.5)"), "thinking_token_budget");

  // vLLM's return_token_ids (the service's response.prompt_token_ids), return_tokens_as_token_ids
  // and stream_options.continuous_usage_stats.
  r = Chat(ChatBody(R"("return_token_ids": true, "return_tokens_as_token_ids": true,
      "stream": true, "stream_options": {"include_usage": true, "continuous_usage_stats": true})"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->return_token_ids);
  EXPECT_TRUE(r->generate.response().prompt_token_ids());
  EXPECT_TRUE(r->tokens_as_ids);
  EXPECT_TRUE(r->continuous_usage);
  r = Chat(ChatBody(""));
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->return_token_ids || r->tokens_as_ids || r->continuous_usage);
  EXPECT_FALSE(r->generate.response().prompt_token_ids());
  ExpectRefused(kChat, ChatBody(R"("return_token_ids": 1)"), "return_token_ids");
  ExpectRefused(kCompletions, CompletionBody(R"("return_tokens_as_token_ids": "yes")"),
                "return_tokens_as_token_ids");
  ExpectRefused(kChat, ChatBody(R"("stream_options": {"continuous_usage_stats": 1})"),
                "stream_options.continuous_usage_stats");
}

TEST(ChatRequestTest, ResponseFormat) {
  absl::StatusOr<OpenAiRequest> object =
      Chat(ChatBody(R"("response_format": {"type": "json_object"})"));
  ASSERT_TRUE(object.ok()) << object.status();
  ASSERT_TRUE(object->generate.has_structured());
  EXPECT_EQ(object->generate.structured().constraint_case(), v1::StructuredOutput::kJsonObject);
  EXPECT_TRUE(object->generate.structured().json_object());

  absl::StatusOr<OpenAiRequest> schema = Chat(ChatBody(R"("response_format": {
      "type": "json_schema", "json_schema": {"name": "answer", "strict": true,
        "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}})"));
  ASSERT_TRUE(schema.ok()) << schema.status();
  ASSERT_EQ(schema->generate.structured().constraint_case(), v1::StructuredOutput::kJsonSchema);
  EXPECT_EQ(Parse(schema->generate.structured().json_schema()),
            Parse(R"({"type": "object", "properties": {"a": {"type": "integer"}}})"));
  EXPECT_EQ(schema->params.at("structured.json_schema"), "response_format.json_schema.schema");

  absl::StatusOr<OpenAiRequest> text = Chat(ChatBody(R"("response_format": {"type": "text"})"));
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_FALSE(text->generate.has_structured());

  ExpectRefused(kChat, ChatBody(R"("response_format": {"type": "xml"})"), "response_format.type",
                "\"xml\"");
  ExpectRefused(kChat, ChatBody(R"("response_format": {"type": "json_schema"})"),
                "response_format.json_schema");
  ExpectRefused(kChat,
                ChatBody(R"("response_format": {"type": "json_schema", "json_schema": {}})"),
                "response_format.json_schema.schema", "is required");
  ExpectRefused(kChat, ChatBody(R"("response_format": "json")"), "response_format");
}

TEST(ChatRequestTest, GuidedParameters) {
  absl::StatusOr<OpenAiRequest> json = Chat(ChatBody(
      R"("guided_json": {"type": "array"}, "guided_whitespace_pattern": "[ ]?")"));
  ASSERT_TRUE(json.ok()) << json.status();
  ASSERT_EQ(json->generate.structured().constraint_case(), v1::StructuredOutput::kJsonSchema);
  EXPECT_EQ(Parse(json->generate.structured().json_schema()), Parse(R"({"type": "array"})"));
  EXPECT_EQ(json->generate.structured().whitespace_pattern(), "[ ]?");
  EXPECT_EQ(json->params.at("structured.json_schema"), "guided_json");

  absl::StatusOr<OpenAiRequest> json_text =
      Chat(ChatBody(R"("guided_json": "{\"type\": \"null\"}")"));
  ASSERT_TRUE(json_text.ok()) << json_text.status();
  EXPECT_EQ(json_text->generate.structured().json_schema(), "{\"type\": \"null\"}");

  absl::StatusOr<OpenAiRequest> regex = Chat(ChatBody(R"j("guided_regex": "(yes|no)")j"));
  ASSERT_TRUE(regex.ok()) << regex.status();
  ASSERT_EQ(regex->generate.structured().constraint_case(), v1::StructuredOutput::kRegex);
  EXPECT_EQ(regex->generate.structured().regex(), "(yes|no)");

  absl::StatusOr<OpenAiRequest> choice = Chat(ChatBody(R"("guided_choice": ["red", "blue"])"));
  ASSERT_TRUE(choice.ok()) << choice.status();
  ASSERT_EQ(choice->generate.structured().constraint_case(), v1::StructuredOutput::kChoice);
  EXPECT_THAT(choice->generate.structured().choice().choices(),
              ::testing::ElementsAre("red", "blue"));

  // GBNF grammars: vLLM's guided_grammar, and llama.cpp server's grammar.
  for (const char* key : {"guided_grammar", "grammar"}) {
    absl::StatusOr<OpenAiRequest> grammar =
        Chat(ChatBody(absl::StrCat("\"", key, "\": \"root ::= [a-z]+ \\\"!\\\"\"")));
    ASSERT_TRUE(grammar.ok()) << grammar.status();
    ASSERT_EQ(grammar->generate.structured().constraint_case(), v1::StructuredOutput::kGrammar);
    EXPECT_EQ(grammar->generate.structured().grammar(), "root ::= [a-z]+ \"!\"");
    EXPECT_EQ(grammar->params.at("structured.grammar"), key);
  }
  ExpectRefused(kChat, ChatBody(R"("guided_grammar": ["root ::= \"a\""])"), "guided_grammar");
  // TGI's grammar object: a JSON Schema or a regex.
  absl::StatusOr<OpenAiRequest> tgi_json = Chat(ChatBody(
      R"("grammar": {"type": "json", "value": {"properties": {"z": {}, "a": {}}}})"));
  ASSERT_TRUE(tgi_json.ok()) << tgi_json.status();
  ASSERT_EQ(tgi_json->generate.structured().constraint_case(), v1::StructuredOutput::kJsonSchema);
  EXPECT_EQ(tgi_json->generate.structured().json_schema(), R"({"properties":{"z":{},"a":{}}})");
  absl::StatusOr<OpenAiRequest> tgi_regex =
      Chat(ChatBody(R"("grammar": {"type": "regex", "value": "[0-9]+"})"));
  ASSERT_TRUE(tgi_regex.ok()) << tgi_regex.status();
  EXPECT_EQ(tgi_regex->generate.structured().regex(), "[0-9]+");
  EXPECT_EQ(tgi_regex->params.at("structured.regex"), "grammar");
  ExpectRefused(kChat, ChatBody(R"("grammar": {"type": "ebnf", "value": "x"})"), "grammar.type",
                "use json, json_schema or regex");
  ExpectRefused(kChat, ChatBody(R"("grammar": {"type": "regex"})"), "grammar.value",
                "is required");
  ExpectRefused(kChat, ChatBody(R"("grammar": {"type": "regex", "value": 1})"), "grammar.value");
  ExpectRefused(kChat, ChatBody(R"("grammar": 5)"), "grammar");
  ExpectRefused(kChat, ChatBody(R"("guided_regex": "a", "guided_choice": ["a"])"),
                "guided_choice", "only one of");
  ExpectRefused(kChat, ChatBody(R"("guided_regex": "a", "grammar": "root ::= \"a\"")"), "grammar",
                "only one of");
  ExpectRefused(kChat,
                ChatBody(R"("response_format": {"type": "json_object"}, "guided_json": {})"),
                "guided_json", "only one of");
  ExpectRefused(kChat, ChatBody(R"("guided_choice": ["a", 1])"), "guided_choice[1]");
  ExpectRefused(kChat, ChatBody(R"("guided_choice": "a")"), "guided_choice");
  ExpectRefused(kChat, ChatBody(R"("guided_json": 5)"), "guided_json");
  ExpectRefused(kChat, ChatBody(R"("guided_whitespace_pattern": " ")"),
                "guided_whitespace_pattern", "needs a JSON constraint");
}

// vLLM's structured_outputs, which replaces its guided_* parameters.
TEST(ChatRequestTest, StructuredOutputsParameter) {
  struct Case {
    const char* body;
    v1::StructuredOutput::ConstraintCase kind;
    const char* param;
  };
  for (const Case& c : {
           Case{R"("structured_outputs": {"json": {"type": "object"}})",
                v1::StructuredOutput::kJsonSchema, "structured_outputs.json"},
           Case{R"("structured_outputs": {"json": "{\"type\": \"null\"}"})",
                v1::StructuredOutput::kJsonSchema, "structured_outputs.json"},
           Case{R"("structured_outputs": {"regex": "[0-9]+"})", v1::StructuredOutput::kRegex,
                "structured_outputs.regex"},
           Case{R"("structured_outputs": {"choice": ["a", "b"]})", v1::StructuredOutput::kChoice,
                "structured_outputs.choice"},
           Case{R"("structured_outputs": {"grammar": "root ::= \"a\"+"})",
                v1::StructuredOutput::kGrammar, "structured_outputs.grammar"},
           Case{R"("structured_outputs": {"json_object": true, "whitespace_pattern": "[ ]?"})",
                v1::StructuredOutput::kJsonObject, "structured_outputs.json_object"},
       }) {
    for (OpenAiEndpoint e : {kChat, kCompletions}) {
      absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(
          e, e == kChat ? ChatBody(c.body) : CompletionBody(c.body), OpenAiDefaults());
      ASSERT_TRUE(r.ok()) << c.body << ": " << r.status();
      EXPECT_EQ(r->generate.structured().constraint_case(), c.kind) << c.body;
      EXPECT_EQ(r->params.at("structured"), c.param) << c.body;
    }
  }
  absl::StatusOr<OpenAiRequest> object = Chat(
      ChatBody(R"("structured_outputs": {"json_object": true, "whitespace_pattern": "[ ]?"})"));
  ASSERT_TRUE(object.ok());
  EXPECT_EQ(object->generate.structured().whitespace_pattern(), "[ ]?");
  EXPECT_EQ(object->params.at("structured.whitespace_pattern"),
            "structured_outputs.whitespace_pattern");
  absl::StatusOr<OpenAiRequest> schema = Chat(ChatBody(
      R"("structured_outputs": {"json": {"type": "object", "properties": {"b": {}, "a": {}}}})"));
  ASSERT_TRUE(schema.ok());
  // The schema keeps its document order (properties are written in it).
  EXPECT_NE(schema->generate.structured().json_schema().find(R"("b":{},"a":{})"), std::string::npos)
      << schema->generate.structured().json_schema();

  ExpectRefused(kChat, ChatBody(R"("structured_outputs": {})"), "structured_outputs",
                "set one of json, regex, choice, grammar or json_object");
  ExpectRefused(kChat, ChatBody(R"("structured_outputs": {"regex": "a", "choice": ["a"]})"),
                "structured_outputs.choice", "only one of");
  ExpectRefused(
      kChat,
      ChatBody(R"("guided_regex": "a", "structured_outputs": {"grammar": "root ::= \"a\""})"),
      "structured_outputs.grammar", "only one of");
  ExpectRefused(kChat, ChatBody(R"("structured_outputs": {"structural_tag": "{}"})"),
                "structured_outputs.structural_tag", "is not supported");
  ExpectRefused(kChat, ChatBody(R"("structured_outputs": {"choice": [1]})"),
                "structured_outputs.choice[0]");
  ExpectRefused(kChat, ChatBody(R"("structured_outputs": {"regex": 5})"),
                "structured_outputs.regex");
  ExpectRefused(kChat, ChatBody(R"("structured_outputs": "json")"), "structured_outputs");
  ExpectRefused(kChat, ChatBody(R"("structured_outputs": {"whitespace_pattern": " "})"),
                "structured_outputs", "set one of");
}

// =============================================================================================
// JSON types, malformed bodies, nulls

TEST(RequestTypesTest, WrongTypesAreRefusedNamingTheParameter) {
  const struct {
    const char* more;
    const char* param;
  } cases[] = {
      {R"("temperature": "hot")", "temperature"},
      {R"("temperature": true)", "temperature"},
      {R"("top_p": [0.5])", "top_p"},
      {R"("top_k": 1.5)", "top_k"},
      {R"("top_k": "5")", "top_k"},
      {R"("min_p": {})", "min_p"},
      {R"("repetition_penalty": "1")", "repetition_penalty"},
      {R"("presence_penalty": false)", "presence_penalty"},
      {R"("frequency_penalty": "0")", "frequency_penalty"},
      {R"("seed": "42")", "seed"},
      {R"("seed": 1.5)", "seed"},
      {R"("logit_bias": [1])", "logit_bias"},
      {R"("logit_bias": {"5": "high"})", "logit_bias.5"},
      {R"("stop": 3)", "stop"},
      {R"("stop": ["a", 1])", "stop[1]"},
      {R"("stop_token_ids": 3)", "stop_token_ids"},
      {R"("stop_token_ids": [1, "2"])", "stop_token_ids[1]"},
      {R"("ignore_eos": 1)", "ignore_eos"},
      {R"("min_tokens": "2")", "min_tokens"},
      {R"("include_stop_str_in_output": 1)", "include_stop_str_in_output"},
      {R"("truncate_prompt_tokens": "8")", "truncate_prompt_tokens"},
      {R"("allowed_token_ids": 3)", "allowed_token_ids"},
      {R"("allowed_token_ids": [1, "2"])", "allowed_token_ids[1]"},
      {R"("bad_words": "darn")", "bad_words"},
      {R"("bad_words": ["darn", 3])", "bad_words[1]"},
      {R"("n": "2")", "n"},
      {R"("stream": "true")", "stream"},
      {R"("stream_options": true)", "stream_options"},
      {R"("stream_options": {"include_usage": "yes"})", "stream_options.include_usage"},
      {R"("model": 3)", "model"},
      {R"("user": 3)", "user"},
      {R"("cache_salt": 3)", "cache_salt"},
      {R"("priority": "high")", "priority"},
      {R"("request_id": 7)", "request_id"},
      {R"("max_tokens": "16")", "max_tokens"},
      {R"("guided_regex": 1)", "guided_regex"},
      {R"("response_format": {"type": 1})", "response_format.type"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.more);
    ExpectRefused(kCompletions, CompletionBody(c.more), c.param, "must be");
    ExpectRefused(kChat, ChatBody(c.more), c.param, "must be");
  }
  ExpectRefused(kCompletions, CompletionBody(R"("temperature": "hot")"), "temperature",
                "must be a number, not a string");
  ExpectRefused(kCompletions, CompletionBody(R"("logit_bias": {"abc": 1})"), "logit_bias",
                "not a token id");
  ExpectRefused(kCompletions, CompletionBody(R"("echo": "yes")"), "echo");
  ExpectRefused(kCompletions, CompletionBody(R"("best_of": "1")"), "best_of");
  ExpectRefused(kCompletions, CompletionBody(R"("suffix": 1)"), "suffix");
  ExpectRefused(kCompletions, CompletionBody(R"("add_special_tokens": 0)"), "add_special_tokens");
  ExpectRefused(kChat, ChatBody(R"("top_logprobs": "2", "logprobs": true)"), "top_logprobs");
  ExpectRefused(kChat, ChatBody(R"("continue_final_message": 1)"), "continue_final_message");
}

TEST(RequestTypesTest, NestedWrongTypesNameTheirPath) {
  ExpectRefused(kChat, R"({"messages": [{"role": "user", "content": "a", "name": 5}]})",
                "messages[0].name", "must be a string");
  ExpectRefused(kChat, R"({"messages": [{"role": "tool", "content": "a", "tool_call_id": 5}]})",
                "messages[0].tool_call_id", "must be a string");
  ExpectRefused(kChat, R"({"messages": [{"role": "assistant", "tool_calls": [
      {"id": 5, "function": {"name": "f"}}]}]})",
                "messages[0].tool_calls[0].id", "must be a string");
  ExpectRefused(kChat, R"({"messages": [{"role": "user", "content": [{"type": 1}]}]})",
                "messages[0].content[0].type", "must be a string");
  ExpectRefused(kChat, ChatBody(R"("tools": [{"type": 1, "function": {"name": "f"}}])"),
                "tools[0].type", "must be a string");
  ExpectRefused(kChat,
                ChatBody(R"("tools": [{"function": {"name": "f", "description": 1}}])"),
                "tools[0].function.description", "must be a string");
}

TEST(RequestTypesTest, MalformedBodiesAreRefused) {
  for (const char* body : {"", "{", R"({"prompt": "a",})", "not json", R"({"prompt": "a"} x)"}) {
    absl::StatusOr<OpenAiRequest> r = Completions(body);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << body;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("request body")) << body;
  }
  for (const char* body : {"[]", "\"prompt\"", "3", "null"}) {
    ExpectRefused(kCompletions, body, "request body", "a JSON object");
    ExpectRefused(kChat, body, "request body", "a JSON object");
  }
  // Nesting deeper than ParseJson's bound is refused, not recursed into.
  std::string deep = R"({"prompt": "a", "logit_bias": )";
  for (int i = 0; i < 10000; ++i) deep += "[";
  absl::StatusOr<OpenAiRequest> r = Completions(deep);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(RequestTypesTest, NullsAreAbsent) {
  absl::StatusOr<OpenAiRequest> c = Completions(R"({"prompt": "x", "model": null,
      "temperature": null, "top_p": null, "top_k": null, "min_p": null, "seed": null,
      "logit_bias": null, "stop": null, "stop_token_ids": null, "ignore_eos": null,
      "max_tokens": null, "n": null, "stream": null, "stream_options": null, "user": null,
      "cache_salt": null, "priority": null, "request_id": null, "suffix": null,
      "best_of": null, "echo": null, "logprobs": null, "add_special_tokens": null,
      "response_format": null, "guided_json": null, "guided_regex": null,
      "guided_choice": null, "guided_whitespace_pattern": null, "presence_penalty": null,
      "frequency_penalty": null, "repetition_penalty": null, "min_tokens": null})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FLOAT_EQ(c->generate.sampling().temperature(), 1.0f);
  EXPECT_EQ(c->generate.stopping().max_new_tokens(), 16);
  EXPECT_FALSE(c->generate.sampling().has_seed());
  EXPECT_EQ(c->logprobs, -1);
  EXPECT_FALSE(c->generate.has_structured());
  EXPECT_EQ(c->model, "");

  absl::StatusOr<OpenAiRequest> chat = Chat(R"({"messages": [
      {"role": "user", "content": null, "name": null, "tool_calls": null,
       "tool_call_id": null}], "tools": null, "tool_choice": null, "logprobs": null,
      "top_logprobs": null, "max_completion_tokens": null, "max_tokens": null,
      "chat_template_kwargs": null, "add_generation_prompt": null,
      "continue_final_message": null})");
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_EQ(chat->generate.stopping().max_new_tokens(), 4096);
  EXPECT_EQ(chat->generate.chat().messages(0).content(), "");
  EXPECT_EQ(chat->generate.chat().tools_size(), 0);
  EXPECT_FALSE(chat->generate.chat().has_add_generation_prompt());
  EXPECT_EQ(chat->logprobs, -1);
}

// =============================================================================================
// Errors

TEST(OpenAiErrorTest, StatusCodesMapToHttp) {
  const struct {
    absl::Status status;
    int http;
    const char* type;
  } cases[] = {
      {absl::InvalidArgumentError("bad"), 400, "invalid_request_error"},
      {absl::OutOfRangeError("bad"), 400, "invalid_request_error"},
      {absl::FailedPreconditionError("bad"), 400, "invalid_request_error"},
      {absl::UnauthenticatedError("who"), 401, "authentication_error"},
      {absl::PermissionDeniedError("no"), 403, "permission_error"},
      {absl::NotFoundError("model"), 404, "not_found_error"},
      {absl::ResourceExhaustedError("full"), 429, "rate_limit_error"},
      {absl::UnavailableError("draining"), 503, "service_unavailable"},
      {absl::DeadlineExceededError("slow"), 504, "timeout"},
      {absl::CancelledError("gone"), 499, "cancelled"},
      {absl::InternalError("boom"), 500, "server_error"},
      {absl::UnknownError("?"), 500, "server_error"},
  };
  for (const auto& c : cases) {
    const OpenAiError e = ToOpenAiError(c.status, nullptr);
    EXPECT_EQ(e.http_status, c.http) << c.status;
    EXPECT_EQ(e.type, c.type) << c.status;
    EXPECT_EQ(e.message, c.status.message()) << c.status;
    EXPECT_EQ(e.param, "") << c.status;
    EXPECT_EQ(e.retry_after_ms, 0) << c.status;
  }
}

// The message and param ToOpenAiError gives a service error for the request `body`.
OpenAiError ServiceError(OpenAiEndpoint endpoint, const std::string& body,
                         const std::string& message) {
  absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(endpoint, body, OpenAiDefaults());
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return OpenAiError();
  return ToOpenAiError(absl::InvalidArgumentError(message), &*r);
}

TEST(OpenAiErrorTest, FieldPathsBecomeOpenAiParameters) {
  OpenAiError e = ServiceError(kCompletions, CompletionBody(R"("top_p": 1.5)"),
                               "sampling.top_p: 1.5 is outside (0, 1]");
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.message, "top_p: 1.5 is outside (0, 1]");
  EXPECT_EQ(e.param, "top_p");

  e = ServiceError(kChat, ChatBody(R"("max_completion_tokens": 0)"),
                   "stopping.max_new_tokens: 0 is outside [1, 4096]");
  EXPECT_EQ(e.message, "max_completion_tokens: 0 is outside [1, 4096]");
  EXPECT_EQ(e.param, "max_completion_tokens");
  e = ServiceError(kChat, ChatBody(R"("max_tokens": 0)"),
                   "stopping.max_new_tokens: 0 is outside [1, 4096]");
  EXPECT_EQ(e.message, "max_tokens: 0 is outside [1, 4096]");
  EXPECT_EQ(e.param, "max_tokens");
  e = ServiceError(kCompletions, CompletionBody(), "stopping.max_new_tokens: too many");
  EXPECT_EQ(e.param, "max_tokens");

  e = ServiceError(kChat, ChatBody(), "chat.messages[2].role: must be 1 to 64 bytes");
  EXPECT_EQ(e.message, "messages[2].role: must be 1 to 64 bytes");
  EXPECT_EQ(e.param, "messages[2].role");
  e = ServiceError(kChat, ChatBody(), "chat: the server has no chat template");
  EXPECT_EQ(e.param, "messages");
  EXPECT_EQ(e.message, "messages: the server has no chat template");

  e = ServiceError(kChat, ChatBody(R"("tools": [{"function": {"name": "f"}}])"),
                   "chat.tools[0].parameters: must be a JSON object");
  EXPECT_EQ(e.message, "tools[0].function.parameters: must be a JSON object");
  EXPECT_EQ(e.param, "tools[0].function.parameters");
  e = ServiceError(kChat, ChatBody(), "chat.tools: more than 128 tools");
  EXPECT_EQ(e.param, "tools");
  e = ServiceError(kChat, ChatBody(), "chat.tool_choice: needs chat.tools");
  EXPECT_EQ(e.param, "tool_choice");
  e = ServiceError(kChat, ChatBody(), "chat.template_kwargs: may not set 'messages'");
  EXPECT_EQ(e.param, "chat_template_kwargs");

  e = ServiceError(kChat, ChatBody(R"("guided_json": {"type": "object"})"),
                   "structured.json_schema: keyword 'oneOf' is not supported");
  EXPECT_EQ(e.message, "guided_json: keyword 'oneOf' is not supported");
  EXPECT_EQ(e.param, "guided_json");
  e = ServiceError(kChat, ChatBody(R"("response_format": {"type": "json_schema",
                                      "json_schema": {"schema": {"type": "object"}}})"),
                   "structured.json_schema.properties: not an object");
  EXPECT_EQ(e.message, "response_format.json_schema.schema.properties: not an object");
  EXPECT_EQ(e.param, "response_format.json_schema.schema.properties");
  e = ServiceError(kChat, ChatBody(R"("guided_regex": "(")"), "structured.regex: unbalanced");
  EXPECT_EQ(e.param, "guided_regex");

  e = ServiceError(kCompletions, CompletionBody(R"("logprobs": 30)"),
                   "response.top_logprobs: 30 is outside [0, 20]");
  EXPECT_EQ(e.param, "logprobs");
  e = ServiceError(kChat, ChatBody(R"("logprobs": true, "top_logprobs": 30)"),
                   "response.top_logprobs: 30 is outside [0, 20]");
  EXPECT_EQ(e.param, "top_logprobs");
  e = ServiceError(kCompletions, CompletionBody(), "text: prompt is empty");
  EXPECT_EQ(e.message, "prompt: prompt is empty");
  EXPECT_EQ(e.param, "prompt");
  e = ServiceError(kCompletions, CompletionBody(), "token_ids: id 99999 at index 0 is too big");
  EXPECT_EQ(e.param, "prompt");
  e = ServiceError(kCompletions, CompletionBody(R"("n": 2)"), "n: 40 is outside [1, 16] (0: 1)");
  EXPECT_EQ(e.param, "n");
  EXPECT_EQ(e.message, "n: 40 is outside [1, 16] (0: 1)");
  e = ServiceError(kCompletions, CompletionBody(), "sampling.logit_bias: token id 1 is big");
  EXPECT_EQ(e.param, "logit_bias");
  e = ServiceError(kCompletions, CompletionBody(), "stopping.stop_sequences: more than 16");
  EXPECT_EQ(e.param, "stop");
}

TEST(OpenAiErrorTest, PathsMatchWholeFieldNamesOnly) {
  // "sampling.top_pp" is not "sampling.top_p" followed by more of a path.
  OpenAiError e = ServiceError(kCompletions, CompletionBody(), "sampling.top_pp: odd");
  EXPECT_EQ(e.message, "sampling.top_pp: odd");
  EXPECT_EQ(e.param, "sampling.top_pp");  // no OpenAI name: the path as it is
  // Without the request, or with a message that is not a field path, nothing is rewritten.
  e = ToOpenAiError(absl::InvalidArgumentError("sampling.top_p: 1.5 is outside (0, 1]"), nullptr);
  EXPECT_EQ(e.message, "sampling.top_p: 1.5 is outside (0, 1]");
  EXPECT_EQ(e.param, "sampling.top_p");
  e = ServiceError(kCompletions, CompletionBody(), "request body: not JSON");
  EXPECT_EQ(e.message, "request body: not JSON");
  EXPECT_EQ(e.param, "");
  e = ServiceError(kCompletions, CompletionBody(), "no path here");
  EXPECT_EQ(e.message, "no path here");
  EXPECT_EQ(e.param, "");
  // Not a 400: neither rewritten nor given a param.
  absl::StatusOr<OpenAiRequest> r = Completions(CompletionBody(R"("top_p": 0.5)"));
  ASSERT_TRUE(r.ok());
  e = ToOpenAiError(absl::InternalError("sampling.top_p: device lost"), &*r);
  EXPECT_EQ(e.http_status, 500);
  EXPECT_EQ(e.message, "sampling.top_p: device lost");
  EXPECT_EQ(e.param, "");
}

TEST(OpenAiErrorTest, ParseErrorsKeepTheirParameter) {
  absl::StatusOr<OpenAiRequest> r = Completions(CompletionBody(R"("temperature": "hot")"));
  ASSERT_FALSE(r.ok());
  OpenAiError e = ToOpenAiError(r.status(), nullptr);
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.param, "temperature");
  EXPECT_THAT(e.message, StartsWith("temperature: "));

  r = Chat(R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})");
  ASSERT_FALSE(r.ok());
  e = ToOpenAiError(r.status(), nullptr);
  EXPECT_EQ(e.param, "messages[0].content[0].type");
}

TEST(OpenAiErrorTest, RetryAfterIsCarried) {
  OpenAiError e = ToOpenAiError(absl::ResourceExhaustedError("queue full"), nullptr, 250);
  EXPECT_EQ(e.http_status, 429);
  EXPECT_EQ(e.retry_after_ms, 250);
  e = ToOpenAiError(absl::UnavailableError("draining"), nullptr, 1000);
  EXPECT_EQ(e.http_status, 503);
  EXPECT_EQ(e.retry_after_ms, 1000);
}

TEST(ChatRequestTest, JsonPassedOnKeepsTheKeysInTheOrderSent) {
  // A schema's properties are generated in the order written: "reasoning" before "answer".
  const std::string props = R"({"type": "object", "properties": {"reasoning": {"type": "string"},
                                 "answer": {"type": "integer"}}, "required": ["reasoning", "answer"]})";
  absl::StatusOr<OpenAiRequest> r = Chat(ChatBody(absl::StrCat(
      R"("response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": )",
      props, "}}")));
  ASSERT_TRUE(r.ok()) << r.status();
  const std::string schema = r->generate.structured().json_schema();
  EXPECT_LT(schema.find("reasoning"), schema.find("answer")) << schema;
  EXPECT_LT(schema.find("\"type\""), schema.find("\"properties\"")) << schema;
  r = Completions(CompletionBody(absl::StrCat(R"("guided_json": )", props)));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_LT(r->generate.structured().json_schema().find("reasoning"),
            r->generate.structured().json_schema().find("answer"));
  // Tools' parameters and an earlier call's arguments as the template will show them.
  r = Chat(absl::StrCat(R"({"messages": [{"role": "user", "content": "hi"},
      {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": "f", "arguments": {"zeta": 1, "alpha": 2}}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "ok"}],
      "tools": [{"type": "function", "function": {"name": "f", "parameters": )", props, "}}]}"));
  ASSERT_TRUE(r.ok()) << r.status();
  const std::string params = r->generate.chat().tools(0).parameters();
  EXPECT_LT(params.find("reasoning"), params.find("answer")) << params;
  EXPECT_EQ(r->generate.chat().messages(1).tool_calls(0).arguments(), R"({"zeta":1,"alpha":2})");
}

TEST(CompletionsRequestTest, NIsBoundedAtParseTime) {
  ExpectRefused(kCompletions, CompletionBody(R"("n": 40)"), "n", "40 is outside [1, 16]");
  ExpectRefused(kChat, ChatBody(R"("n": 2147483647)"), "n", "is outside [1, 16]");
  OpenAiDefaults d;
  d.max_choices = 6;
  absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(
      kCompletions, R"({"prompt": ["a", "b", "c"], "n": 3})", d);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::StartsWith(r.status().message(), "n: 9 completions")) << r.status();
  EXPECT_TRUE(ParseOpenAiRequest(kCompletions, R"({"prompt": ["a", "b", "c"], "n": 2})", d).ok());
}

TEST(OpenAiErrorTest, GrpcsMessageSizeLimitIs413NotARetry) {
  // gRPC's own words when a message exceeds --max_message_bytes, either way.
  for (const char* message : {"Received message larger than max (5242880 vs. 4194304)",
                              "Sent message larger than max (6000000 vs. 4194304)"}) {
    const OpenAiError e = ToOpenAiError(absl::ResourceExhaustedError(message), nullptr);
    EXPECT_EQ(e.http_status, 413) << message;
    EXPECT_EQ(e.type, "invalid_request_error");
    EXPECT_EQ(e.message, message);
  }
}

TEST(OpenAiErrorTest, JsonShape) {
  OpenAiError e = ServiceError(kCompletions, CompletionBody(R"("top_p": 1.5)"),
                               "sampling.top_p: 1.5 is outside (0, 1]");
  Json j = Parse(e.Json());
  ASSERT_TRUE(j.is_object());
  ASSERT_EQ(j.size(), 1u);
  const Json& error = j.at("error");
  ASSERT_EQ(error.size(), 4u);
  EXPECT_EQ(error.at("message"), "top_p: 1.5 is outside (0, 1]");
  EXPECT_EQ(error.at("type"), "invalid_request_error");
  EXPECT_EQ(error.at("param"), "top_p");
  EXPECT_EQ(error.at("code"), 400);

  Json none = Parse(ToOpenAiError(absl::UnavailableError("draining \"now\"\n"), nullptr).Json());
  EXPECT_TRUE(none.at("error").at("param").is_null());
  EXPECT_EQ(none.at("error").at("message"), "draining \"now\"\n");
  EXPECT_EQ(none.at("error").at("type"), "service_unavailable");
  EXPECT_EQ(none.at("error").at("code"), 503);

  // A stream's error event is the same body, framed as one event.
  const std::string event = OpenAiReply::StreamError(e);
  EXPECT_EQ(event, absl::StrCat("data: ", e.Json(), "\n\n"));
}

TEST(OpenAiErrorTest, InvalidUtf8InAMessageStillMakesJson) {
  OpenAiError e = ToOpenAiError(absl::InvalidArgumentError("text: bad byte \xff here"), nullptr);
  const std::string body = e.Json();
  Json j = Parse(body);
  EXPECT_TRUE(j.at("error").at("message").is_string());
}

TEST(FinishReasonTest, Mapping) {
  EXPECT_EQ(OpenAiFinishReason(v1::FINISH_REASON_EOS), "stop");
  EXPECT_EQ(OpenAiFinishReason(v1::FINISH_REASON_STOP), "stop");
  EXPECT_EQ(OpenAiFinishReason(v1::FINISH_REASON_LENGTH), "length");
  EXPECT_EQ(OpenAiFinishReason(v1::FINISH_REASON_TIME_LIMIT), "length");
  EXPECT_EQ(OpenAiFinishReason(v1::FINISH_REASON_TOOL_CALLS), "tool_calls");
  EXPECT_EQ(OpenAiFinishReason(v1::FINISH_REASON_CANCELLED), "abort");
  EXPECT_EQ(OpenAiFinishReason(v1::FINISH_REASON_ERROR), "error");
  EXPECT_EQ(OpenAiFinishReason(v1::FINISH_REASON_UNSPECIFIED), "");
}

// =============================================================================================
// Non-streaming replies

TEST(OpenAiReplyTest, CompletionsBodyWithInterleavedChoices) {
  const OpenAiRequest request = MustParse(kCompletions, CompletionBody(R"("n": 2)"));
  OpenAiReply reply(request, &Gpt2(), "cmpl-1", 1700000000, "served");
  reply.Add(Delta(0, "Hel"));
  reply.Add(Delta(1, "Good"));
  reply.Add(Delta(0, "lo"));
  reply.Add(Final(1, "bye", v1::FINISH_REASON_LENGTH, 5, 2, 4));
  reply.Add(Final(0, " world", v1::FINISH_REASON_STOP, 5, 3, 4, "\n\n"));
  EXPECT_EQ(reply.engine_error(), "");

  const Json body = Parse(reply.Body());
  EXPECT_EQ(body.at("id"), "cmpl-1");
  EXPECT_EQ(body.at("object"), "text_completion");
  EXPECT_EQ(body.at("created"), 1700000000);
  EXPECT_EQ(body.at("model"), "served");
  const Json& choices = body.at("choices");
  ASSERT_EQ(choices.size(), 2u);
  EXPECT_EQ(choices[0].at("index"), 0);
  EXPECT_EQ(choices[0].at("text"), "Hello world");
  EXPECT_EQ(choices[0].at("finish_reason"), "stop");
  EXPECT_EQ(choices[0].at("stop_reason"), "\n\n");
  EXPECT_TRUE(choices[0].at("logprobs").is_null());
  EXPECT_EQ(choices[1].at("index"), 1);
  EXPECT_EQ(choices[1].at("text"), "Goodbye");
  EXPECT_EQ(choices[1].at("finish_reason"), "length");
  EXPECT_TRUE(choices[1].at("stop_reason").is_null());
  const Json& usage = body.at("usage");
  EXPECT_EQ(usage.at("prompt_tokens"), 5);  // one prompt for both completions
  EXPECT_EQ(usage.at("completion_tokens"), 5);
  EXPECT_EQ(usage.at("total_tokens"), 10);
  EXPECT_EQ(usage.at("prompt_tokens_details").at("cached_tokens"), 4);
}

TEST(OpenAiReplyTest, FinishReasonsInTheBody) {
  const struct {
    v1::FinishReason reason;
    const char* want;
  } cases[] = {{v1::FINISH_REASON_EOS, "stop"},
               {v1::FINISH_REASON_STOP, "stop"},
               {v1::FINISH_REASON_LENGTH, "length"},
               {v1::FINISH_REASON_TOOL_CALLS, "tool_calls"},
               {v1::FINISH_REASON_CANCELLED, "abort"}};
  for (const auto& c : cases) {
    for (OpenAiEndpoint endpoint : {kCompletions, kChat}) {
      const OpenAiRequest request =
          MustParse(endpoint, endpoint == kChat ? ChatBody() : CompletionBody());
      OpenAiReply reply(request, &Gpt2(), "id", 1, "m");
      reply.Add(Final(0, "x", c.reason, 1, 1));
      const Json body = Parse(reply.Body());
      ASSERT_EQ(body.at("choices").size(), 1u);
      EXPECT_EQ(body.at("choices")[0].at("finish_reason"), c.want) << c.want;
      EXPECT_TRUE(body.at("choices")[0].at("stop_reason").is_null());
    }
  }
}

TEST(OpenAiReplyTest, UsageCountsThePromptOnceAndTheCompletionsTogether) {
  const OpenAiRequest request = MustParse(kChat, ChatBody(R"("n": 3)"));
  OpenAiReply reply(request, nullptr, "chatcmpl-1", 1, "m");
  reply.Add(Final(2, "c", v1::FINISH_REASON_EOS, 12, 7, 8));
  reply.Add(Final(0, "a", v1::FINISH_REASON_EOS, 12, 1, 0));
  reply.Add(Final(1, "b", v1::FINISH_REASON_EOS, 12, 4, 8));
  const Json body = Parse(reply.Body());
  ASSERT_EQ(body.at("choices").size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(body.at("choices")[i].at("index"), i);
    EXPECT_EQ(body.at("choices")[i].at("message").at("content"), std::string(1, 'a' + i));
  }
  EXPECT_EQ(body.at("usage").at("prompt_tokens"), 12);
  EXPECT_EQ(body.at("usage").at("completion_tokens"), 12);
  EXPECT_EQ(body.at("usage").at("total_tokens"), 24);
  EXPECT_EQ(body.at("usage").at("prompt_tokens_details").at("cached_tokens"), 8);
}

TEST(OpenAiReplyTest, ChatBody) {
  const OpenAiRequest request = MustParse(kChat, ChatBody());
  OpenAiReply reply(request, &Gpt2(), "chatcmpl-7", 1700000001, "served");
  reply.Add(Delta(0, "Hi"));
  reply.Add(Delta(0, ""));
  reply.Add(Final(0, " there.", v1::FINISH_REASON_EOS, 9, 3));
  const Json body = Parse(reply.Body());
  EXPECT_EQ(body.at("id"), "chatcmpl-7");
  EXPECT_EQ(body.at("object"), "chat.completion");
  EXPECT_EQ(body.at("created"), 1700000001);
  EXPECT_EQ(body.at("model"), "served");
  ASSERT_EQ(body.at("choices").size(), 1u);
  const Json& choice = body.at("choices")[0];
  EXPECT_EQ(choice.at("index"), 0);
  EXPECT_EQ(choice.at("message").at("role"), "assistant");
  EXPECT_EQ(choice.at("message").at("content"), "Hi there.");
  EXPECT_FALSE(choice.at("message").contains("tool_calls"));
  EXPECT_TRUE(choice.at("logprobs").is_null());
  EXPECT_EQ(choice.at("finish_reason"), "stop");
  EXPECT_EQ(body.at("usage").at("prompt_tokens"), 9);
  EXPECT_EQ(body.at("usage").at("completion_tokens"), 3);
  EXPECT_EQ(body.at("usage").at("total_tokens"), 12);
  EXPECT_EQ(body.at("usage").at("prompt_tokens_details").at("cached_tokens"), 0);
}

// A thinking model's reasoning (GenerateResponse.reasoning_text) is the message's
// reasoning_content, apart from its content; a reply without any has no such key.
TEST(OpenAiReplyTest, ChatReasoningContent) {
  const OpenAiRequest request = MustParse(kChat, ChatBody());
  OpenAiReply reply(request, &Gpt2(), "chatcmpl-r", 1, "m");
  v1::GenerateResponse think = Delta(0, "");
  think.set_reasoning_text("Rain is ");
  reply.Add(think);
  v1::GenerateResponse both = Delta(0, "Yes");
  both.set_reasoning_text("likely.");
  reply.Add(both);
  v1::GenerateResponse last = Final(0, ".", v1::FINISH_REASON_EOS, 5, 4);
  last.mutable_finished()->mutable_usage()->set_reasoning_tokens(3);
  reply.Add(last);
  const Json body = Parse(reply.Body());
  const Json& message = body.at("choices")[0].at("message");
  EXPECT_EQ(message.at("reasoning_content"), "Rain is likely.");
  EXPECT_EQ(message.at("content"), "Yes.");
  EXPECT_EQ(body.at("usage").at("completion_tokens"), 4);
  EXPECT_EQ(body.at("usage").at("completion_tokens_details").at("reasoning_tokens"), 3);
  OpenAiReply plain(request, &Gpt2(), "chatcmpl-p", 1, "m");
  plain.Add(Final(0, "Yes.", v1::FINISH_REASON_EOS, 5, 2));
  const Json plain_body = Parse(plain.Body());
  EXPECT_FALSE(plain_body.at("choices")[0].at("message").contains("reasoning_content"));
  EXPECT_FALSE(plain_body.at("usage").contains("completion_tokens_details"));
}

TEST(OpenAiReplyTest, ChatToolCalls) {
  const OpenAiRequest request =
      MustParse(kChat, ChatBody(R"("n": 2, "tools": [{"function": {"name": "get_weather"}}])"));
  OpenAiReply reply(request, nullptr, "chatcmpl-2", 1, "m");
  v1::GenerateResponse calls = Final(0, "", v1::FINISH_REASON_TOOL_CALLS, 20, 15);
  AddToolCall(&calls, "call_0123456789abcdef01234567", "get_weather", R"({"city":"Paris"})");
  AddToolCall(&calls, "call_76543210fedcba9876543210", "get_weather", R"({"city":"Rome"})");
  reply.Add(calls);
  v1::GenerateResponse with_text =
      Final(1, "Let me check.", v1::FINISH_REASON_TOOL_CALLS, 20, 10);
  AddToolCall(&with_text, "call_x", "get_weather", "{}");
  reply.Add(with_text);

  const Json body = Parse(reply.Body());
  ASSERT_EQ(body.at("choices").size(), 2u);
  const Json& first = body.at("choices")[0];
  EXPECT_EQ(first.at("finish_reason"), "tool_calls");
  const Json& message = first.at("message");
  EXPECT_EQ(message.at("role"), "assistant");
  EXPECT_TRUE(message.at("content").is_null());  // no text: null, as OpenAI writes it
  const Json& tool_calls = message.at("tool_calls");
  ASSERT_EQ(tool_calls.size(), 2u);
  EXPECT_EQ(tool_calls[0].at("id"), "call_0123456789abcdef01234567");
  EXPECT_EQ(tool_calls[0].at("type"), "function");
  EXPECT_EQ(tool_calls[0].at("function").at("name"), "get_weather");
  EXPECT_EQ(tool_calls[0].at("function").at("arguments"), R"({"city":"Paris"})");  // a string
  EXPECT_FALSE(tool_calls[0].contains("index"));  // only stream deltas have an index
  EXPECT_EQ(tool_calls[1].at("id"), "call_76543210fedcba9876543210");
  EXPECT_EQ(tool_calls[1].at("function").at("arguments"), R"({"city":"Rome"})");

  const Json& second = body.at("choices")[1].at("message");
  EXPECT_EQ(second.at("content"), "Let me check.");
  ASSERT_EQ(second.at("tool_calls").size(), 1u);
  EXPECT_EQ(second.at("tool_calls")[0].at("id"), "call_x");
  EXPECT_EQ(body.at("usage").at("completion_tokens"), 25);
}

TEST(OpenAiReplyTest, CompletionsLogprobs) {
  const OpenAiRequest request = MustParse(kCompletions, CompletionBody(R"("logprobs": 2)"));
  const int32_t hello = OneToken("Hello");
  const int32_t world = OneToken(" world");
  const int32_t there = OneToken(" there");
  const int32_t bang = OneToken("!");
  OpenAiReply reply(request, &Gpt2(), "cmpl-2", 1, "m");
  v1::GenerateResponse m1 = Delta(0, "Hello");
  AddLogprob(&m1, hello, -0.5f, {{hello, -0.5f}, {there, -2.0f}});
  reply.Add(m1);
  v1::GenerateResponse m2 = Final(0, " world!", v1::FINISH_REASON_LENGTH, 3, 3);
  AddLogprob(&m2, world, -1.25f, {{world, -1.25f}, {there, -1.5f}});
  AddLogprob(&m2, bang, -0.25f, {{bang, -0.25f}, {world, -3.0f}});
  reply.Add(m2);

  const Json body = Parse(reply.Body());
  const Json& choice = body.at("choices")[0];
  EXPECT_EQ(choice.at("text"), "Hello world!");
  const Json& lp = choice.at("logprobs");
  ASSERT_TRUE(lp.is_object());
  EXPECT_EQ(lp.at("tokens"), Json::array({"Hello", " world", "!"}));
  ASSERT_EQ(lp.at("token_logprobs").size(), 3u);
  EXPECT_FLOAT_EQ(lp.at("token_logprobs")[0].get<float>(), -0.5f);
  EXPECT_FLOAT_EQ(lp.at("token_logprobs")[1].get<float>(), -1.25f);
  EXPECT_FLOAT_EQ(lp.at("token_logprobs")[2].get<float>(), -0.25f);
  const Json& top = lp.at("top_logprobs");
  ASSERT_EQ(top.size(), 3u);
  ASSERT_TRUE(top[0].is_object());
  ASSERT_EQ(top[0].size(), 2u);
  EXPECT_FLOAT_EQ(top[0].at("Hello").get<float>(), -0.5f);
  EXPECT_FLOAT_EQ(top[0].at(" there").get<float>(), -2.0f);
  EXPECT_FLOAT_EQ(top[1].at(" world").get<float>(), -1.25f);
  EXPECT_FLOAT_EQ(top[1].at(" there").get<float>(), -1.5f);
  EXPECT_FLOAT_EQ(top[2].at("!").get<float>(), -0.25f);
  EXPECT_FLOAT_EQ(top[2].at(" world").get<float>(), -3.0f);
  // Each token starts where the previous one's text ends.
  EXPECT_EQ(lp.at("text_offset"), Json::array({0, 5, 11}));
}

TEST(OpenAiReplyTest, CompletionsLogprobsWithoutTopAlternatives) {
  const OpenAiRequest request = MustParse(kCompletions, CompletionBody(R"("logprobs": 0)"));
  OpenAiReply reply(request, &Gpt2(), "cmpl-3", 1, "m");
  v1::GenerateResponse m = Final(0, "Hello", v1::FINISH_REASON_EOS, 1, 1);
  AddLogprob(&m, OneToken("Hello"), -0.75f);
  reply.Add(m);
  const Json lp = Parse(reply.Body()).at("choices")[0].at("logprobs");
  EXPECT_EQ(lp.at("tokens"), Json::array({"Hello"}));
  ASSERT_EQ(lp.at("top_logprobs").size(), 1u);
  EXPECT_TRUE(lp.at("top_logprobs")[0].is_object());
  EXPECT_TRUE(lp.at("top_logprobs")[0].empty());
  EXPECT_EQ(lp.at("text_offset"), Json::array({0}));
}

TEST(OpenAiReplyTest, ChatLogprobs) {
  const OpenAiRequest request =
      MustParse(kChat, ChatBody(R"("logprobs": true, "top_logprobs": 1)"));
  const int32_t hello = OneToken("Hello");
  const int32_t there = OneToken(" there");
  // A byte-level token holding the first byte of a three-byte character (U+2019 is E2 80 99).
  const std::optional<int32_t> lead = Gpt2().TokenToId("\xC3\xA2");  // "â" spells byte 0xE2
  ASSERT_TRUE(lead.has_value());
  ASSERT_EQ(Gpt2().DecodeBytes({*lead}, false), "\xE2");

  OpenAiReply reply(request, &Gpt2(), "chatcmpl-3", 1, "m");
  v1::GenerateResponse m1 = Delta(0, "Hello");
  AddLogprob(&m1, hello, -0.5f, {{there, -1.0f}});
  reply.Add(m1);
  v1::GenerateResponse m2 = Final(0, "", v1::FINISH_REASON_LENGTH, 2, 2);
  AddLogprob(&m2, *lead, -2.5f, {{hello, -3.0f}});
  reply.Add(m2);

  const Json body = Parse(reply.Body());
  const Json& lp = body.at("choices")[0].at("logprobs");
  ASSERT_TRUE(lp.is_object());
  const Json& content = lp.at("content");
  ASSERT_EQ(content.size(), 2u);
  EXPECT_EQ(content[0].at("token"), "Hello");
  EXPECT_FLOAT_EQ(content[0].at("logprob").get<float>(), -0.5f);
  EXPECT_EQ(content[0].at("bytes"), Bytes("Hello"));
  ASSERT_EQ(content[0].at("top_logprobs").size(), 1u);
  EXPECT_EQ(content[0].at("top_logprobs")[0].at("token"), " there");
  EXPECT_FLOAT_EQ(content[0].at("top_logprobs")[0].at("logprob").get<float>(), -1.0f);
  EXPECT_EQ(content[0].at("top_logprobs")[0].at("bytes"),
            Bytes(" there"));
  EXPECT_FALSE(content[0].at("top_logprobs")[0].contains("top_logprobs"));
  // Half a character: the text is repaired (valid UTF-8), the bytes are exact.
  EXPECT_EQ(content[1].at("token"), Gpt2().Decode({*lead}, false));
  EXPECT_NE(content[1].at("token"), "\xE2");
  EXPECT_EQ(content[1].at("bytes"), Json::array({0xE2}));
  EXPECT_FLOAT_EQ(content[1].at("logprob").get<float>(), -2.5f);
  EXPECT_EQ(content[1].at("top_logprobs")[0].at("token"), "Hello");
}

TEST(OpenAiReplyTest, ChatLogprobsAskedButNoneCame) {
  const OpenAiRequest request = MustParse(kChat, ChatBody(R"("logprobs": true)"));
  OpenAiReply reply(request, &Gpt2(), "chatcmpl-4", 1, "m");
  reply.Add(Final(0, "ok", v1::FINISH_REASON_EOS, 1, 1));
  const Json lp = Parse(reply.Body()).at("choices")[0].at("logprobs");
  ASSERT_TRUE(lp.is_object());
  EXPECT_TRUE(lp.at("content").is_array());
  EXPECT_TRUE(lp.at("content").empty());
}

TEST(OpenAiReplyTest, NoTokenizerSpellsTokensEmpty) {
  const OpenAiRequest request = MustParse(kChat, ChatBody(R"("logprobs": true)"));
  OpenAiReply reply(request, nullptr, "chatcmpl-5", 1, "m");
  v1::GenerateResponse m = Final(0, "Hello", v1::FINISH_REASON_EOS, 1, 1);
  AddLogprob(&m, 15496, -0.5f);
  reply.Add(m);
  const Json content = Parse(reply.Body()).at("choices")[0].at("logprobs").at("content");
  ASSERT_EQ(content.size(), 1u);
  EXPECT_EQ(content[0].at("token"), "");
  EXPECT_TRUE(content[0].at("bytes").empty());
  EXPECT_FLOAT_EQ(content[0].at("logprob").get<float>(), -0.5f);
}

TEST(OpenAiReplyTest, EchoPrependsThePrompt) {
  const OpenAiRequest request = MustParse(kCompletions, CompletionBody(R"("echo": true, "n": 2)"));
  OpenAiReply reply(request, &Gpt2(), "cmpl-4", 1, "m", {"Once upon"});
  reply.Add(Delta(0, " a"));
  reply.Add(Final(0, " time", v1::FINISH_REASON_LENGTH, 2, 2));
  reply.Add(Final(1, " the", v1::FINISH_REASON_LENGTH, 2, 1));
  const Json body = Parse(reply.Body());
  EXPECT_EQ(body.at("choices")[0].at("text"), "Once upon a time");
  EXPECT_EQ(body.at("choices")[1].at("text"), "Once upon the");

  // Without echo the prompt text is not written.
  const OpenAiRequest plain = MustParse(kCompletions, CompletionBody());
  OpenAiReply no_echo(plain, &Gpt2(), "cmpl-5", 1, "m", {"Once upon"});
  no_echo.Add(Final(0, " a time", v1::FINISH_REASON_LENGTH, 2, 2));
  EXPECT_EQ(Parse(no_echo.Body()).at("choices")[0].at("text"), " a time");
}

// The first message of completion 0 with the prompt's scores: "Once" (no score), ":" (-1.5,
// rank 3, alternatives "." and ",").
v1::GenerateResponse WithPromptLogprobs(v1::GenerateResponse m) {
  const std::vector<std::pair<std::string, float>> prompt = {{"Once", 0.0f}, {":", -1.5f}};
  for (size_t i = 0; i < prompt.size(); ++i) {
    v1::TokenLogprob* e = m.add_prompt_logprobs();
    e->set_token_id(OneToken(prompt[i].first));
    e->set_logprob(prompt[i].second);
    if (i == 0) continue;
    e->set_rank(3);
    for (const auto& [alt, lp] : {std::pair{".", -0.5f}, std::pair{",", -1.0f}}) {
      v1::TopLogprob* t = e->add_top();
      t->set_token_id(OneToken(alt));
      t->set_logprob(lp);
      t->set_text(alt);
    }
  }
  return m;
}

TEST(OpenAiReplyTest, EchoWithLogprobsLeadsWithThePromptsTokens) {
  const OpenAiRequest request =
      MustParse(kCompletions, CompletionBody(R"("echo": true, "logprobs": 1, "n": 2)"));
  OpenAiReply reply(request, &Gpt2(), "cmpl-7", 1, "m", {"Once:"});
  v1::GenerateResponse first = WithPromptLogprobs(Final(0, " a", v1::FINISH_REASON_LENGTH, 2, 1));
  AddLogprob(&first, OneToken(" a"), -0.25f, {{OneToken(" a"), -0.25f}});
  reply.Add(first);
  v1::GenerateResponse other = Final(1, " the", v1::FINISH_REASON_LENGTH, 2, 1);
  AddLogprob(&other, OneToken(" the"), -0.75f, {{OneToken(" the"), -0.75f}});
  reply.Add(other);
  const Json body = Parse(reply.Body());
  for (int i = 0; i < 2; ++i) {
    SCOPED_TRACE(i);
    const Json& c = body.at("choices")[i];
    EXPECT_EQ(c.at("text"), i == 0 ? "Once: a" : "Once: the");
    const Json& lp = c.at("logprobs");
    EXPECT_EQ(lp.at("tokens"), Json::parse(i == 0 ? R"(["Once", ":", " a"])"
                                                   : R"(["Once", ":", " the"])"));
    EXPECT_TRUE(lp.at("token_logprobs")[0].is_null());
    EXPECT_FLOAT_EQ(lp.at("token_logprobs")[1].get<float>(), -1.5f);
    EXPECT_FLOAT_EQ(lp.at("token_logprobs")[2].get<float>(), i == 0 ? -0.25f : -0.75f);
    EXPECT_TRUE(lp.at("top_logprobs")[0].is_null());
    // logprobs = 1: one alternative of the prompt's two.
    EXPECT_EQ(lp.at("top_logprobs")[1].size(), 1u);
    EXPECT_FLOAT_EQ(lp.at("top_logprobs")[1].at(".").get<float>(), -0.5f);
    EXPECT_EQ(lp.at("text_offset"), Json::parse("[0, 4, 5]"));
    EXPECT_FALSE(c.contains("prompt_logprobs"));
  }
}

TEST(OpenAiReplyTest, PromptLogprobsAreVllmsListPerChoiceOrOnTheChatResponse) {
  const OpenAiRequest request =
      MustParse(kCompletions, CompletionBody(R"("prompt_logprobs": 1)"));
  OpenAiReply reply(request, &Gpt2(), "cmpl-8", 1, "m", {"Once:"});
  reply.Add(WithPromptLogprobs(Final(0, " a", v1::FINISH_REASON_LENGTH, 2, 1)));
  const Json body = Parse(reply.Body());
  const Json& plp = body.at("choices")[0].at("prompt_logprobs");
  ASSERT_EQ(plp.size(), 2u);
  EXPECT_TRUE(plp[0].is_null());
  // The prompt token (rank 3) and its best alternative (rank 1).
  ASSERT_EQ(plp[1].size(), 2u);
  const Json& own = plp[1].at(std::to_string(OneToken(":")));
  EXPECT_FLOAT_EQ(own.at("logprob").get<float>(), -1.5f);
  EXPECT_EQ(own.at("rank"), 3);
  EXPECT_EQ(own.at("decoded_token"), ":");
  const Json& best = plp[1].at(std::to_string(OneToken(".")));
  EXPECT_EQ(best.at("rank"), 1);
  EXPECT_EQ(best.at("decoded_token"), ".");

  const OpenAiRequest chat_request = MustParse(kChat, ChatBody(R"("prompt_logprobs": 0)"));
  OpenAiReply chat(chat_request, &Gpt2(), "chatcmpl-8", 1, "m");
  chat.Add(WithPromptLogprobs(Final(0, "Hi", v1::FINISH_REASON_EOS, 2, 1)));
  const Json chat_body = Parse(chat.Body());
  ASSERT_EQ(chat_body.at("prompt_logprobs").size(), 2u);
  EXPECT_EQ(chat_body.at("prompt_logprobs")[1].size(), 1u);  // no alternatives asked for
  EXPECT_FALSE(chat_body.at("choices")[0].contains("prompt_logprobs"));
}

TEST(OpenAiReplyTest, EngineErrorIsKept) {
  const OpenAiRequest request = MustParse(kCompletions, CompletionBody(R"("n": 2)"));
  OpenAiReply reply(request, nullptr, "cmpl-6", 1, "m");
  reply.Add(Final(0, "ok", v1::FINISH_REASON_EOS, 1, 1));
  EXPECT_EQ(reply.engine_error(), "");
  v1::GenerateResponse failed = Final(1, "", v1::FINISH_REASON_ERROR, 1, 0);
  failed.mutable_finished()->set_error("device lost");
  reply.Add(failed);
  EXPECT_EQ(reply.engine_error(), "device lost");
  // The first error is the one kept.
  v1::GenerateResponse later = Final(1, "", v1::FINISH_REASON_ERROR, 1, 0);
  later.mutable_finished()->set_error("second");
  reply.Add(later);
  EXPECT_EQ(reply.engine_error(), "device lost");

  // Streaming records it too.
  OpenAiReply stream(request, nullptr, "cmpl-7", 1, "m");
  const std::string sse = stream.StreamMessage(failed);
  EXPECT_EQ(stream.engine_error(), "device lost");
  const std::vector<Json> chunks = SseChunks(sse);
  ASSERT_EQ(chunks.size(), 1u);
  EXPECT_EQ(chunks[0].at("choices")[0].at("finish_reason"), "error");
}

TEST(OpenAiReplyTest, ChoicesWithoutMessagesStillAppear) {
  const OpenAiRequest request = MustParse(kCompletions, CompletionBody(R"("n": 2)"));
  OpenAiReply reply(request, nullptr, "cmpl-8", 1, "m");
  reply.Add(Final(1, "only", v1::FINISH_REASON_EOS, 1, 1));
  const Json body = Parse(reply.Body());
  ASSERT_EQ(body.at("choices").size(), 2u);
  EXPECT_EQ(body.at("choices")[0].at("index"), 0);
  EXPECT_EQ(body.at("choices")[0].at("text"), "");
  EXPECT_EQ(body.at("choices")[1].at("text"), "only");
}

// =============================================================================================
// Streaming replies

TEST(OpenAiStreamTest, ChatStartGivesEachChoiceItsRole) {
  const OpenAiRequest request = MustParse(kChat, ChatBody(R"("n": 2, "stream": true)"));
  OpenAiReply reply(request, &Gpt2(), "chatcmpl-s", 1700000002, "served");
  const std::vector<Json> chunks = SseChunks(reply.StreamStart());
  ASSERT_EQ(chunks.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const Json& c = chunks[i];
    EXPECT_EQ(c.at("id"), "chatcmpl-s");
    EXPECT_EQ(c.at("object"), "chat.completion.chunk");
    EXPECT_EQ(c.at("created"), 1700000002);
    EXPECT_EQ(c.at("model"), "served");
    ASSERT_EQ(c.at("choices").size(), 1u);
    EXPECT_EQ(c.at("choices")[0].at("index"), i);
    EXPECT_EQ(c.at("choices")[0].at("delta").at("role"), "assistant");
    EXPECT_EQ(c.at("choices")[0].at("delta").value("content", std::string("x")), "");
    EXPECT_TRUE(c.at("choices")[0].at("finish_reason").is_null());
  }
}

TEST(OpenAiStreamTest, CompletionsStartIsEmpty) {
  const OpenAiRequest request = MustParse(kCompletions, CompletionBody(R"("stream": true)"));
  OpenAiReply reply(request, &Gpt2(), "cmpl-s", 1, "m");
  EXPECT_EQ(reply.StreamStart(), "");
}

TEST(OpenAiStreamTest, ChatChunks) {
  const OpenAiRequest request = MustParse(kChat, ChatBody(R"("stream": true)"));
  OpenAiReply reply(request, &Gpt2(), "chatcmpl-s", 5, "served");
  const std::string first = reply.StreamMessage(Delta(0, "Hi"));
  EXPECT_THAT(first, StartsWith("data: {"));
  EXPECT_TRUE(absl::EndsWith(first, "}\n\n")) << first;
  std::vector<Json> chunks = SseChunks(first);
  ASSERT_EQ(chunks.size(), 1u);
  EXPECT_EQ(chunks[0].at("id"), "chatcmpl-s");
  EXPECT_EQ(chunks[0].at("object"), "chat.completion.chunk");
  EXPECT_EQ(chunks[0].at("created"), 5);
  EXPECT_EQ(chunks[0].at("model"), "served");
  ASSERT_EQ(chunks[0].at("choices").size(), 1u);
  const Json& choice = chunks[0].at("choices")[0];
  EXPECT_EQ(choice.at("index"), 0);
  EXPECT_EQ(choice.at("delta").at("content"), "Hi");
  EXPECT_FALSE(choice.at("delta").contains("role"));
  EXPECT_TRUE(choice.at("logprobs").is_null());
  EXPECT_TRUE(choice.at("finish_reason").is_null());

  // Nothing to say: no event at all.
  EXPECT_EQ(reply.StreamMessage(Delta(0, "")), "");

  chunks = SseChunks(reply.StreamMessage(Final(0, "", v1::FINISH_REASON_STOP, 3, 2, 0, "END")));
  ASSERT_EQ(chunks.size(), 1u);
  const Json& last = chunks[0].at("choices")[0];
  EXPECT_TRUE(last.at("delta").is_object());
  EXPECT_TRUE(last.at("delta").empty());
  EXPECT_EQ(last.at("finish_reason"), "stop");
  EXPECT_EQ(last.at("stop_reason"), "END");
  EXPECT_FALSE(chunks[0].contains("usage"));
}

TEST(OpenAiStreamTest, CompletionsChunks) {
  const OpenAiRequest request = MustParse(kCompletions, CompletionBody(R"("stream": true)"));
  OpenAiReply reply(request, &Gpt2(), "cmpl-s", 5, "served");
  std::vector<Json> chunks = SseChunks(reply.StreamMessage(Delta(0, "Hel")));
  ASSERT_EQ(chunks.size(), 1u);
  EXPECT_EQ(chunks[0].at("object"), "text_completion");
  EXPECT_EQ(chunks[0].at("id"), "cmpl-s");
  const Json& choice = chunks[0].at("choices")[0];
  EXPECT_EQ(choice.at("index"), 0);
  EXPECT_EQ(choice.at("text"), "Hel");
  EXPECT_TRUE(choice.at("logprobs").is_null());
  EXPECT_TRUE(choice.at("finish_reason").is_null());
  EXPECT_EQ(reply.StreamMessage(Delta(0, "")), "");
  chunks = SseChunks(reply.StreamMessage(Final(0, "lo", v1::FINISH_REASON_LENGTH, 1, 2)));
  ASSERT_EQ(chunks.size(), 1u);
  EXPECT_EQ(chunks[0].at("choices")[0].at("text"), "lo");
  EXPECT_EQ(chunks[0].at("choices")[0].at("finish_reason"), "length");
  EXPECT_TRUE(chunks[0].at("choices")[0].at("stop_reason").is_null());
}

// Reasoning streams as delta.reasoning_content (a chunk of thinking alone still makes an event);
// completions never carry it.
TEST(OpenAiStreamTest, ReasoningStreamsAsReasoningContent) {
  const OpenAiRequest request = MustParse(kChat, ChatBody(R"("stream": true)"));
  OpenAiReply reply(request, &Gpt2(), "chatcmpl-s", 1, "m");
  v1::GenerateResponse think = Delta(0, "");
  think.set_reasoning_text("Hmm.");
  std::vector<Json> chunks = SseChunks(reply.StreamMessage(think));
  ASSERT_EQ(chunks.size(), 1u);
  const Json& delta = chunks[0].at("choices")[0].at("delta");
  EXPECT_EQ(delta.at("reasoning_content"), "Hmm.");
  EXPECT_FALSE(delta.contains("content"));
  chunks = SseChunks(reply.StreamMessage(Final(0, "Yes.", v1::FINISH_REASON_EOS, 3, 2)));
  ASSERT_EQ(chunks.size(), 1u);
  EXPECT_FALSE(chunks[0].at("choices")[0].at("delta").contains("reasoning_content"));
  EXPECT_EQ(chunks[0].at("choices")[0].at("delta").at("content"), "Yes.");
}

// Calls streamed as they are generated: OpenAI's delta shape (the first piece with id, type and
// name; then arguments pieces), joined by the client into the call; the final chunk carries
// only the calls that were not streamed, so none arrives twice.
TEST(OpenAiStreamTest, ToolCallDeltasStreamAndAreNotRepeatedAtTheEnd) {
  const OpenAiRequest request = MustParse(
      kChat, ChatBody(R"("stream": true, "tools": [{"function": {"name": "f"}}])"));
  OpenAiReply reply(request, nullptr, "chatcmpl-d", 1, "m");
  const auto delta = [](int index, const std::string& id, const std::string& name,
                        const std::string& args) {
    v1::GenerateResponse m = Delta(0, "");
    v1::ToolCallDelta* d = m.add_tool_call_deltas();
    d->set_index(index);
    d->set_id(id);
    d->set_name(name);
    d->set_arguments(args);
    return m;
  };
  std::vector<Json> chunks = SseChunks(reply.StreamMessage(delta(0, "call_a", "f", "{\"x\"")));
  ASSERT_EQ(chunks.size(), 1u);
  const Json& first = chunks[0].at("choices")[0].at("delta").at("tool_calls");
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].at("index"), 0);
  EXPECT_EQ(first[0].at("id"), "call_a");
  EXPECT_EQ(first[0].at("type"), "function");
  EXPECT_EQ(first[0].at("function").at("name"), "f");
  EXPECT_EQ(first[0].at("function").at("arguments"), "{\"x\"");
  EXPECT_TRUE(chunks[0].at("choices")[0].at("finish_reason").is_null());
  chunks = SseChunks(reply.StreamMessage(delta(0, "", "", ": 1}")));
  const Json& next = chunks[0].at("choices")[0].at("delta").at("tool_calls")[0];
  EXPECT_EQ(next.at("index"), 0);
  EXPECT_FALSE(next.contains("id"));
  EXPECT_FALSE(next.contains("type"));
  EXPECT_FALSE(next.at("function").contains("name"));
  EXPECT_EQ(next.at("function").at("arguments"), ": 1}");
  // The end: call 0 was streamed, call 1 (say its arguments came before its name) was not.
  v1::GenerateResponse m = Final(0, "", v1::FINISH_REASON_TOOL_CALLS, 4, 9);
  AddToolCall(&m, "call_a", "f", R"({"x":1})");
  AddToolCall(&m, "call_b", "g", "{}");
  chunks = SseChunks(reply.StreamMessage(m));
  ASSERT_EQ(chunks.size(), 1u);
  const Json& choice = chunks[0].at("choices")[0];
  EXPECT_EQ(choice.at("finish_reason"), "tool_calls");
  const Json& rest = choice.at("delta").at("tool_calls");
  ASSERT_EQ(rest.size(), 1u);
  EXPECT_EQ(rest[0].at("index"), 1);
  EXPECT_EQ(rest[0].at("id"), "call_b");
  EXPECT_EQ(rest[0].at("function").at("arguments"), "{}");
  // A call that differs from what was streamed under its index (a fresh id) comes whole under an
  // index no streamed call used, so a client joining by index does not mix the two.
  OpenAiReply other(request, nullptr, "chatcmpl-e", 1, "m");
  other.StreamMessage(delta(0, "call_a", "f", "{\"x\":1}"));
  v1::GenerateResponse changed = Final(0, "", v1::FINISH_REASON_TOOL_CALLS, 4, 9);
  AddToolCall(&changed, "call_z", "f", R"({"x":2})");
  AddToolCall(&changed, "call_b", "g", "{}");
  chunks = SseChunks(other.StreamMessage(changed));
  const Json& resent = chunks[0].at("choices")[0].at("delta").at("tool_calls");
  ASSERT_EQ(resent.size(), 2u);
  EXPECT_EQ(resent[0].at("id"), "call_z");
  EXPECT_EQ(resent[0].at("index"), 1);
  EXPECT_EQ(resent[1].at("id"), "call_b");
  EXPECT_EQ(resent[1].at("index"), 2);
  // Completions have no tool calls: deltas there (none are sent) would not make an event.
  const OpenAiRequest completion = MustParse(kCompletions, CompletionBody(R"("stream": true)"));
  OpenAiReply plain(completion, &Gpt2(), "cmpl-d", 1, "m");
  EXPECT_EQ(plain.StreamMessage(delta(0, "call_a", "f", "{")), "");
}

TEST(OpenAiStreamTest, ToolCallsInTheFinalDelta) {
  const OpenAiRequest request = MustParse(
      kChat, ChatBody(R"("stream": true, "tools": [{"function": {"name": "f"}}])"));
  OpenAiReply reply(request, nullptr, "chatcmpl-t", 1, "m");
  v1::GenerateResponse m = Final(0, "", v1::FINISH_REASON_TOOL_CALLS, 4, 9);
  AddToolCall(&m, "call_a", "f", R"({"x":1})");
  AddToolCall(&m, "call_b", "g", "{}");
  const std::vector<Json> chunks = SseChunks(reply.StreamMessage(m));
  ASSERT_EQ(chunks.size(), 1u);
  const Json& choice = chunks[0].at("choices")[0];
  EXPECT_EQ(choice.at("finish_reason"), "tool_calls");
  EXPECT_FALSE(choice.at("delta").contains("content"));
  const Json& calls = choice.at("delta").at("tool_calls");
  ASSERT_EQ(calls.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(calls[i].at("index"), i);
    EXPECT_EQ(calls[i].at("type"), "function");
  }
  EXPECT_EQ(calls[0].at("id"), "call_a");
  EXPECT_EQ(calls[0].at("function").at("name"), "f");
  EXPECT_EQ(calls[0].at("function").at("arguments"), R"({"x":1})");
  EXPECT_EQ(calls[1].at("id"), "call_b");
  EXPECT_EQ(calls[1].at("function").at("name"), "g");
}

TEST(OpenAiStreamTest, EndWithUsage) {
  const OpenAiRequest request = MustParse(
      kChat, ChatBody(R"("n": 2, "stream": true, "stream_options": {"include_usage": true})"));
  ASSERT_TRUE(request.include_usage);
  OpenAiReply reply(request, nullptr, "chatcmpl-u", 3, "m");
  reply.StreamMessage(Final(0, "a", v1::FINISH_REASON_EOS, 6, 2, 3));
  reply.StreamMessage(Final(1, "b", v1::FINISH_REASON_LENGTH, 6, 5, 3));
  const std::string end = reply.StreamEnd();
  EXPECT_TRUE(absl::EndsWith(end, "data: [DONE]\n\n")) << end;
  const std::vector<std::string> payloads = SsePayloads(end);
  ASSERT_EQ(payloads.size(), 2u);
  EXPECT_EQ(payloads[1], "[DONE]");
  const Json usage_chunk = Parse(payloads[0]);
  EXPECT_EQ(usage_chunk.at("id"), "chatcmpl-u");
  EXPECT_EQ(usage_chunk.at("object"), "chat.completion.chunk");
  EXPECT_TRUE(usage_chunk.at("choices").is_array());
  EXPECT_TRUE(usage_chunk.at("choices").empty());
  EXPECT_EQ(usage_chunk.at("usage").at("prompt_tokens"), 6);
  EXPECT_EQ(usage_chunk.at("usage").at("completion_tokens"), 7);
  EXPECT_EQ(usage_chunk.at("usage").at("total_tokens"), 13);
  EXPECT_EQ(usage_chunk.at("usage").at("prompt_tokens_details").at("cached_tokens"), 3);

  const OpenAiRequest completions = MustParse(
      kCompletions, CompletionBody(R"("stream": true, "stream_options": {"include_usage": true})"));
  OpenAiReply creply(completions, nullptr, "cmpl-u", 3, "m");
  creply.StreamMessage(Final(0, "a", v1::FINISH_REASON_EOS, 2, 1));
  const std::vector<std::string> cpayloads = SsePayloads(creply.StreamEnd());
  ASSERT_EQ(cpayloads.size(), 2u);
  EXPECT_EQ(Parse(cpayloads[0]).at("object"), "text_completion");
  EXPECT_EQ(Parse(cpayloads[0]).at("usage").at("total_tokens"), 3);
  EXPECT_EQ(cpayloads[1], "[DONE]");
}

TEST(OpenAiStreamTest, EndWithoutUsageIsOnlyDone) {
  const OpenAiRequest request = MustParse(kChat, ChatBody(R"("stream": true)"));
  OpenAiReply reply(request, nullptr, "chatcmpl-d", 1, "m");
  reply.StreamMessage(Final(0, "a", v1::FINISH_REASON_EOS, 1, 1));
  EXPECT_EQ(reply.StreamEnd(), "data: [DONE]\n\n");
  const OpenAiRequest off =
      MustParse(kCompletions,
                CompletionBody(R"("stream": true, "stream_options": {"include_usage": false})"));
  OpenAiReply creply(off, nullptr, "cmpl-d", 1, "m");
  EXPECT_EQ(creply.StreamEnd(), "data: [DONE]\n\n");
}

TEST(OpenAiStreamTest, StreamedLogprobs) {
  const OpenAiRequest chat_request =
      MustParse(kChat, ChatBody(R"("stream": true, "logprobs": true, "top_logprobs": 1)"));
  const int32_t hello = OneToken("Hello");
  const int32_t world = OneToken(" world");
  OpenAiReply chat(chat_request, &Gpt2(), "chatcmpl-l", 1, "m");
  v1::GenerateResponse m = Delta(0, "Hello");
  AddLogprob(&m, hello, -0.5f, {{world, -1.5f}});
  std::vector<Json> chunks = SseChunks(chat.StreamMessage(m));
  ASSERT_EQ(chunks.size(), 1u);
  const Json& content = chunks[0].at("choices")[0].at("logprobs").at("content");
  ASSERT_EQ(content.size(), 1u);
  EXPECT_EQ(content[0].at("token"), "Hello");
  EXPECT_FLOAT_EQ(content[0].at("logprob").get<float>(), -0.5f);
  EXPECT_EQ(content[0].at("top_logprobs")[0].at("token"), " world");

  // A message with logprobs but no text (held back, e.g. half a character) is still sent.
  v1::GenerateResponse held = Delta(0, "");
  AddLogprob(&held, world, -0.125f);
  chunks = SseChunks(chat.StreamMessage(held));
  ASSERT_EQ(chunks.size(), 1u);
  EXPECT_FALSE(chunks[0].at("choices")[0].at("delta").contains("content"));
  EXPECT_EQ(chunks[0].at("choices")[0].at("logprobs").at("content").size(), 1u);

  const OpenAiRequest completion_request =
      MustParse(kCompletions, CompletionBody(R"("stream": true, "logprobs": 1)"));
  OpenAiReply completion(completion_request, &Gpt2(), "cmpl-l", 1, "m");
  v1::GenerateResponse c1 = Delta(0, "Hello");
  AddLogprob(&c1, hello, -0.5f, {{hello, -0.5f}});
  v1::GenerateResponse c2 = Final(0, " world", v1::FINISH_REASON_LENGTH, 1, 2);
  AddLogprob(&c2, world, -1.0f, {{world, -1.0f}});
  chunks = SseChunks(completion.StreamMessage(c1));
  ASSERT_EQ(chunks.size(), 1u);
  EXPECT_EQ(chunks[0].at("choices")[0].at("logprobs").at("tokens"), Json::array({"Hello"}));
  EXPECT_EQ(chunks[0].at("choices")[0].at("logprobs").at("text_offset"), Json::array({0}));
  chunks = SseChunks(completion.StreamMessage(c2));
  ASSERT_EQ(chunks.size(), 1u);
  const Json& lp = chunks[0].at("choices")[0].at("logprobs");
  EXPECT_EQ(lp.at("tokens"), Json::array({" world"}));
  EXPECT_EQ(lp.at("text_offset"), Json::array({5}));  // after the text streamed before
  EXPECT_FLOAT_EQ(lp.at("top_logprobs")[0].at(" world").get<float>(), -1.0f);
}

TEST(OpenAiStreamTest, EchoIsStreamedOncePerChoice) {
  const OpenAiRequest request =
      MustParse(kCompletions, CompletionBody(R"("stream": true, "echo": true, "n": 2)"));
  OpenAiReply reply(request, nullptr, "cmpl-e", 1, "m", {"Say:"});
  std::vector<Json> chunks = SseChunks(reply.StreamMessage(Delta(0, " a")));
  ASSERT_EQ(chunks.size(), 1u);
  EXPECT_EQ(chunks[0].at("choices")[0].at("text"), "Say: a");
  chunks = SseChunks(reply.StreamMessage(Delta(0, " b")));
  EXPECT_EQ(chunks[0].at("choices")[0].at("text"), " b");
  // The other choice gets its own echo, even from a message with no text of its own.
  chunks = SseChunks(reply.StreamMessage(Delta(1, "")));
  ASSERT_EQ(chunks.size(), 1u);
  EXPECT_EQ(chunks[0].at("choices")[0].at("index"), 1);
  EXPECT_EQ(chunks[0].at("choices")[0].at("text"), "Say:");
  EXPECT_EQ(reply.StreamMessage(Delta(1, "")), "");
}

// The text a client rebuilds from the stream, per choice, equals Body()'s for the same messages.
void ExpectStreamMatchesBody(OpenAiEndpoint endpoint, const std::string& body,
                             const std::vector<v1::GenerateResponse>& messages,
                             const std::string& prompt_text = "") {
  const OpenAiRequest request = MustParse(endpoint, body);
  const bool chat = endpoint == kChat;
  OpenAiReply stream(request, &Gpt2(), "id", 1, "m", {prompt_text});
  OpenAiReply whole(request, &Gpt2(), "id", 1, "m", {prompt_text});
  std::string sse = stream.StreamStart();
  for (const v1::GenerateResponse& m : messages) {
    sse += stream.StreamMessage(m);
    whole.Add(m);
  }
  sse += stream.StreamEnd();
  ASSERT_TRUE(absl::EndsWith(sse, "data: [DONE]\n\n"));
  std::vector<std::string> payloads = SsePayloads(sse);
  ASSERT_FALSE(payloads.empty());
  EXPECT_EQ(payloads.back(), "[DONE]");
  payloads.pop_back();

  std::map<int, std::string> texts;
  std::map<int, std::string> finish;
  std::map<int, std::vector<std::string>> tokens;
  for (const std::string& p : payloads) {
    const Json chunk = Parse(p);
    EXPECT_EQ(chunk.at("object"), chat ? "chat.completion.chunk" : "text_completion");
    for (const Json& c : chunk.at("choices")) {
      const int index = c.at("index").get<int>();
      if (chat) {
        if (c.at("delta").contains("content")) {
          texts[index] += c.at("delta").at("content").get<std::string>();
        }
      } else {
        texts[index] += c.at("text").get<std::string>();
      }
      if (!c.at("finish_reason").is_null()) {
        finish[index] = c.at("finish_reason").get<std::string>();
      }
      const Json& lp = c.at("logprobs");
      if (!lp.is_null()) {
        if (chat) {
          for (const Json& e : lp.at("content")) {
            tokens[index].push_back(e.at("token").get<std::string>());
          }
        } else {
          for (const Json& t : lp.at("tokens")) tokens[index].push_back(t.get<std::string>());
        }
      }
    }
  }
  const Json full = Parse(whole.Body());
  ASSERT_EQ(full.at("choices").size(), texts.size());
  for (const Json& c : full.at("choices")) {
    const int index = c.at("index").get<int>();
    SCOPED_TRACE(index);
    const std::string text = chat ? c.at("message").at("content").get<std::string>()
                                  : c.at("text").get<std::string>();
    EXPECT_EQ(texts[index], text);
    EXPECT_EQ(finish[index], c.at("finish_reason").get<std::string>());
    std::vector<std::string> want;
    if (!c.at("logprobs").is_null()) {
      if (chat) {
        for (const Json& e : c.at("logprobs").at("content")) {
          want.push_back(e.at("token").get<std::string>());
        }
      } else {
        for (const Json& t : c.at("logprobs").at("tokens")) want.push_back(t.get<std::string>());
      }
    }
    EXPECT_EQ(tokens[index], want);
  }
}

std::vector<v1::GenerateResponse> InterleavedMessages() {
  std::vector<v1::GenerateResponse> out;
  const char* const words[2][4] = {{"The", " cat", " sat", "."}, {"A", " dog", "", " ran"}};
  for (int step = 0; step < 4; ++step) {
    for (int index = 0; index < 2; ++index) {
      const std::string word = words[index][step];
      v1::GenerateResponse m =
          step == 3 ? Final(index, word, index == 0 ? v1::FINISH_REASON_EOS
                                                    : v1::FINISH_REASON_LENGTH,
                            4, 4)
                    : Delta(index, word);
      if (!word.empty()) {
        AddLogprob(&m, OneToken(word), -0.5f * (step + 1), {{OneToken(word), -0.5f}});
      }
      out.push_back(m);
    }
  }
  return out;
}

TEST(OpenAiStreamTest, StreamedDeltasAddUpToTheBody) {
  ExpectStreamMatchesBody(kChat, ChatBody(R"("n": 2, "stream": true)"), InterleavedMessages());
  ExpectStreamMatchesBody(kChat,
                          ChatBody(R"("n": 2, "stream": true, "logprobs": true, "top_logprobs": 1,
                                      "stream_options": {"include_usage": true})"),
                          InterleavedMessages());
  ExpectStreamMatchesBody(kCompletions, CompletionBody(R"("n": 2, "stream": true)"),
                          InterleavedMessages());
  ExpectStreamMatchesBody(kCompletions,
                          CompletionBody(R"("n": 2, "stream": true, "logprobs": 1)"),
                          InterleavedMessages());
  ExpectStreamMatchesBody(kCompletions, CompletionBody(R"("n": 2, "stream": true, "echo": true)"),
                          InterleavedMessages(), "Once:");
  // Echo with logprobs: each choice's first chunk leads with the prompt's tokens.
  std::vector<v1::GenerateResponse> scored = InterleavedMessages();
  scored[0] = WithPromptLogprobs(scored[0]);
  ExpectStreamMatchesBody(kCompletions,
                          CompletionBody(R"("n": 2, "stream": true, "echo": true, "logprobs": 1)"),
                          scored, "Once:");
}

// =============================================================================================
// Lists of prompts: P calls, P*n choices

TEST(OpenAiReplyTest, ListOfPromptsNumbersChoicesPromptMajorAndSumsUsage) {
  const OpenAiRequest request = MustParse(
      kCompletions, R"({"prompt": ["A", "B", "C"], "n": 2, "logprobs": 0})");
  OpenAiReply reply(request, &Gpt2(), "cmpl-b", 1, "m");
  // Messages of different calls interleave, as they arrive.
  reply.Add(Final(1, " c", v1::FINISH_REASON_LENGTH, 4, 1, /*cached_tokens=*/2), /*prompt=*/2);
  reply.Add(Delta(0, " a"), /*prompt=*/0);
  v1::GenerateResponse b0 = Final(0, " b", v1::FINISH_REASON_EOS, 3, 1);
  AddLogprob(&b0, OneToken(" b"), -0.25f);
  reply.Add(b0, /*prompt=*/1);
  reply.Add(Final(0, "", v1::FINISH_REASON_LENGTH, 2, 2), /*prompt=*/0);
  reply.Add(Final(1, " a2", v1::FINISH_REASON_LENGTH, 2, 1), /*prompt=*/0);
  reply.Add(Final(1, " b2", v1::FINISH_REASON_LENGTH, 3, 1), /*prompt=*/1);
  reply.Add(Final(0, " c1", v1::FINISH_REASON_LENGTH, 4, 1, /*cached_tokens=*/2), /*prompt=*/2);
  const Json body = Parse(reply.Body());
  const Json& choices = body.at("choices");
  ASSERT_EQ(choices.size(), 6u);
  const std::vector<std::string> texts = {" a", " a2", " b", " b2", " c1", " c"};
  for (size_t i = 0; i < choices.size(); ++i) {
    EXPECT_EQ(choices[i].at("index"), i);
    EXPECT_EQ(choices[i].at("text"), texts[i]) << i;
  }
  EXPECT_EQ(choices[2].at("finish_reason"), "stop");
  // Prompt 1's first completion has its own logprobs; the others none.
  EXPECT_EQ(choices[2].at("logprobs").at("tokens"), Json::array({" b"}));
  EXPECT_EQ(choices[2].at("logprobs").at("text_offset"), Json::array({0}));
  EXPECT_TRUE(choices[3].at("logprobs").at("tokens").empty());
  // Each prompt counted once for its n completions; completions all counted.
  EXPECT_EQ(body.at("usage").at("prompt_tokens"), 2 + 3 + 4);
  EXPECT_EQ(body.at("usage").at("completion_tokens"), 2 + 1 + 1 + 1 + 1 + 1);
  EXPECT_EQ(body.at("usage").at("total_tokens"), 9 + 7);
  EXPECT_EQ(body.at("usage").at("prompt_tokens_details").at("cached_tokens"), 2);
}

TEST(OpenAiStreamTest, ListOfPromptsStreamsEachCallUnderItsChoiceIndexes) {
  const OpenAiRequest request = MustParse(
      kCompletions,
      R"({"prompt": ["A", "B"], "n": 2, "stream": true, "echo": true,
          "stream_options": {"include_usage": true}})");
  OpenAiReply reply(request, nullptr, "cmpl-s", 1, "m", {"A", "B"});
  std::string sse = reply.StreamStart();
  sse += reply.StreamMessage(Delta(1, " x"), /*prompt=*/1);
  sse += reply.StreamMessage(Final(0, " y", v1::FINISH_REASON_LENGTH, 5, 1), /*prompt=*/0);
  sse += reply.StreamMessage(Final(1, "", v1::FINISH_REASON_EOS, 6, 1), /*prompt=*/1);
  sse += reply.StreamMessage(Final(0, " z", v1::FINISH_REASON_LENGTH, 6, 1), /*prompt=*/1);
  sse += reply.StreamMessage(Final(1, " w", v1::FINISH_REASON_LENGTH, 5, 1), /*prompt=*/0);
  sse += reply.StreamEnd();
  std::vector<std::string> payloads = SsePayloads(sse);
  ASSERT_EQ(payloads.back(), "[DONE]");
  payloads.pop_back();
  std::map<int, std::string> texts;
  std::map<int, std::string> finish;
  Json usage;
  for (const std::string& p : payloads) {
    const Json chunk = Parse(p);
    if (chunk.contains("usage")) usage = chunk.at("usage");
    for (const Json& c : chunk.at("choices")) {
      const int index = c.at("index").get<int>();
      texts[index] += c.at("text").get<std::string>();
      if (!c.at("finish_reason").is_null()) finish[index] = c.at("finish_reason");
    }
  }
  EXPECT_EQ(texts, (std::map<int, std::string>{{0, "A y"}, {1, "A w"}, {2, "B z"}, {3, "B x"}}));
  EXPECT_EQ(finish, (std::map<int, std::string>{
                        {0, "length"}, {1, "length"}, {2, "length"}, {3, "stop"}}));
  ASSERT_TRUE(usage.is_object());
  EXPECT_EQ(usage.at("prompt_tokens"), 5 + 6);
  EXPECT_EQ(usage.at("completion_tokens"), 4);
}

// =============================================================================================
// vLLM's /tokenize and /detokenize

TEST(TokenizeRequestTest, PromptOrMessages) {
  absl::StatusOr<OpenAiTokenize> t =
      ParseTokenizeRequest(R"({"model": "m", "prompt": "Hello", "return_token_strs": true})");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->tokenize.text(), "Hello");
  EXPECT_TRUE(t->tokenize.add_bos());  // add_special_tokens defaults to true, as vLLM's
  EXPECT_TRUE(t->tokenize.return_pieces());
  EXPECT_EQ(t->request.model, "m");
  t = ParseTokenizeRequest(R"({"prompt": "Hello", "add_special_tokens": false})");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_FALSE(t->tokenize.add_bos());
  EXPECT_FALSE(t->tokenize.return_pieces());

  t = ParseTokenizeRequest(R"({"messages": [{"role": "system", "content": "Be brief."},
                                            {"role": "user", "content": "Hi"}],
                               "add_generation_prompt": false,
                               "chat_template_kwargs": {"enable_thinking": false}})");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE(t->tokenize.has_chat());
  ASSERT_EQ(t->tokenize.chat().messages_size(), 2);
  EXPECT_EQ(t->tokenize.chat().messages(1).content(), "Hi");
  EXPECT_FALSE(t->tokenize.chat().add_generation_prompt());
  EXPECT_TRUE(t->tokenize.text().empty());
}

TEST(TokenizeRequestTest, RefusalsNameTheParameter) {
  for (const auto& [body, param] : std::vector<std::pair<std::string, std::string>>{
           {R"({})", "prompt"},
           {R"({"prompt": ["a"]})", "prompt"},
           {R"({"prompt": "a", "add_special_tokens": 1})", "add_special_tokens"},
           {R"({"prompt": "a", "return_token_strs": "yes"})", "return_token_strs"},
           {R"({"messages": [{"content": "x"}]})", "messages[0].role"},
           {R"([1])", "request body"},
       }) {
    absl::StatusOr<OpenAiTokenize> t = ParseTokenizeRequest(body);
    ASSERT_FALSE(t.ok()) << body;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(t.status().message()), StartsWith(param + ": ")) << body;
  }
  // The service's "text: ..." comes back as the prompt's.
  const OpenAiTokenize t = *ParseTokenizeRequest(R"({"prompt": "a"})");
  const OpenAiError e =
      ToOpenAiError(absl::InvalidArgumentError("text: longer than the prompt limit"), &t.request);
  EXPECT_EQ(e.param, "prompt");
  EXPECT_EQ(e.message, "prompt: longer than the prompt limit");
}

TEST(TokenizeReplyTest, VllmShape) {
  v1::TokenizeResponse r;
  r.add_token_ids(15496);
  r.add_token_ids(995);
  r.add_pieces("Hello");
  r.add_pieces(" world");
  Json j = Parse(TokenizeReplyJson(r, 2048, /*token_strs=*/true));
  EXPECT_EQ(j.at("count"), 2);
  EXPECT_EQ(j.at("max_model_len"), 2048);
  EXPECT_EQ(j.at("tokens"), Json::array({15496, 995}));
  EXPECT_EQ(j.at("token_strs"), Json::array({"Hello", " world"}));
  j = Parse(TokenizeReplyJson(r, 2048, /*token_strs=*/false));
  EXPECT_TRUE(j.at("token_strs").is_null());
}

TEST(DetokenizeRequestTest, TokensAndRefusals) {
  absl::StatusOr<OpenAiDetokenize> d = ParseDetokenizeRequest(R"({"model": "m", "tokens": [1, 2.0, 3]})");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_THAT(d->detokenize.token_ids(), ::testing::ElementsAre(1, 2, 3));
  EXPECT_EQ(d->request.model, "m");
  for (const auto& [body, param] : std::vector<std::pair<std::string, std::string>>{
           {R"({})", "tokens"},
           {R"({"tokens": "1 2"})", "tokens"},
           {R"({"tokens": [1, -2]})", "tokens[1]"},
           {R"({"tokens": [1, 2.5]})", "tokens[1]"},
           {R"({"tokens": [4294967296]})", "tokens[0]"},
       }) {
    absl::StatusOr<OpenAiDetokenize> bad = ParseDetokenizeRequest(body);
    ASSERT_FALSE(bad.ok()) << body;
    EXPECT_THAT(std::string(bad.status().message()), StartsWith(param + ": ")) << body;
  }
  // The service's field path becomes the request's name for it.
  const OpenAiError e = ToOpenAiError(
      absl::InvalidArgumentError("token_ids[2]: 99999 is outside the vocabulary [0, 512)"),
      &d->request);
  EXPECT_EQ(e.param, "tokens[2]");
  v1::DetokenizeResponse r;
  r.set_text("Hello world");
  EXPECT_EQ(Parse(DetokenizeReplyJson(r)), Json::parse(R"({"prompt": "Hello world"})"));
}

}  // namespace
}  // namespace kvrm
