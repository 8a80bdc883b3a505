// End to end through gRPC on a loopback port: streaming, seeded sampling, concurrency,
// cancellation, stop conditions, overload and request validation.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/sampler.h"
#include "server/request_validation.h"
#include "tests/test_server.h"

namespace kvrm {
namespace {

EngineOptions Options(int slots, int max_queue = 64) {
  EngineOptions o;
  o.slots = slots;
  o.max_queue = max_queue;
  o.max_new_tokens = 256;
  o.prefill_chunk = 32;
  o.threads = 2;
  return o;
}

class E2eTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = new TestServer(Options(4)); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  v1::Kvrm::Stub& stub() { return server_->stub(); }
  static TestServer* server_;
};
TestServer* E2eTest::server_ = nullptr;

TEST_F(E2eTest, StreamsTokensThenFinishes) {
  v1::GenerateRequest req = TextRequest("The quick brown fox", 24);
  req.mutable_stopping()->set_ignore_eos(true);
  req.set_request_id("stream-1");
  StreamResult r = RunGenerate(stub(), req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  // A message per step that produced a token (several merged into one when the client falls
  // behind, server/response_queue.h), the last carrying `finished`.
  EXPECT_EQ(r.tokens.size(), 24u);
  EXPECT_GE(r.messages.size(), 1u);
  EXPECT_LE(r.messages.size(), 24u);
  for (size_t i = 0; i + 1 < r.messages.size(); ++i) {
    EXPECT_FALSE(r.messages[i].has_finished());
    EXPECT_GE(r.messages[i].token_ids_size(), 1) << "no empty message before the last";
  }
  EXPECT_EQ(r.finished.reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(r.finished.usage().completion_tokens(), 24);
  const std::vector<int32_t> prompt =
      *server_->model().tokenizer->Encode("The quick brown fox", true);
  EXPECT_EQ(r.finished.usage().prompt_tokens(), static_cast<int32_t>(prompt.size()));
  EXPECT_GT(r.finished.time_to_first_token_ms(), 0);
  EXPECT_GE(r.finished.total_time_ms(), r.finished.time_to_first_token_ms());
  for (const auto& m : r.messages) EXPECT_EQ(m.request_id(), "stream-1");
  // The streamed text is the decoding of the streamed tokens, given the prompt as context.
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), r.tokens.begin(), r.tokens.end());
  const std::string full = server_->model().tokenizer->Decode(all, true);
  const std::string prompt_text = server_->model().tokenizer->Decode(prompt, true);
  EXPECT_EQ(prompt_text + r.text, full);
}

TEST_F(E2eTest, GreedyIsDeterministicAndTokenPromptEqualsTextPrompt) {
  v1::GenerateRequest a = TextRequest("Once upon a time", 16);
  StreamResult ra = RunGenerate(stub(), a);
  ASSERT_TRUE(ra.status.ok());
  v1::GenerateRequest b;
  const std::vector<int32_t> ids = *server_->model().tokenizer->Encode("Once upon a time", true);
  for (int32_t id : ids) {
    b.mutable_token_ids()->add_ids(id);
  }
  b.mutable_stopping()->set_max_new_tokens(16);
  StreamResult rb = RunGenerate(stub(), b);
  ASSERT_TRUE(rb.status.ok()) << rb.status.error_message();
  EXPECT_EQ(ra.tokens, rb.tokens);
}

TEST_F(E2eTest, SeededSamplingIsReproducible) {
  auto run = [&](uint64_t seed) {
    v1::GenerateRequest req = TextRequest("In a hole in the ground", 32);
    req.mutable_stopping()->set_ignore_eos(true);
    req.mutable_sampling()->set_temperature(1.0f);
    req.mutable_sampling()->set_top_p(0.95f);
    req.mutable_sampling()->set_seed(seed);
    StreamResult r = RunGenerate(stub(), req);
    EXPECT_TRUE(r.status.ok());
    return r.tokens;
  };
  const std::vector<int32_t> a = run(42), b = run(42), c = run(43);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST_F(E2eTest, SixteenConcurrentStreamsAllComplete) {
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  std::vector<std::vector<int32_t>> tokens(16);
  for (int i = 0; i < 16; ++i) {
    threads.emplace_back([&, i] {
      v1::GenerateRequest req = TextRequest("Concurrent request number " + std::to_string(i % 4), 12);
      req.mutable_stopping()->set_ignore_eos(true);
      StreamResult r = RunGenerate(stub(), req);
      if (r.status.ok() && r.finished.reason() == v1::FINISH_REASON_LENGTH &&
          r.tokens.size() == 12) {
        ++ok;
      }
      tokens[i] = r.tokens;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 16);
  // Same prompt, greedy: same output whatever slot or batch it ran in.
  for (int i = 4; i < 16; ++i) EXPECT_EQ(tokens[i], tokens[i % 4]) << i;
}

TEST_F(E2eTest, StopSequenceEndsTheStreamBeforeItOrWithIt) {
  v1::GenerateRequest req = TextRequest("A story about", 40);
  req.mutable_stopping()->set_ignore_eos(true);
  StreamResult full = RunGenerate(stub(), req);
  ASSERT_TRUE(full.status.ok());
  ASSERT_GT(full.text.size(), 12u);
  const std::string stop = full.text.substr(full.text.size() / 2, 3);
  const size_t cut = full.text.find(stop);
  req.mutable_stopping()->add_stop_sequences(stop);
  // include_stop_str_in_output: the text ends with the stop instead of before it.
  for (bool include : {false, true}) {
    req.mutable_stopping()->set_include_stop_str_in_output(include);
    StreamResult r = RunGenerate(stub(), req);
    ASSERT_TRUE(r.status.ok());
    EXPECT_EQ(r.finished.reason(), v1::FINISH_REASON_STOP);
    EXPECT_EQ(r.finished.matched_stop(), stop);
    EXPECT_EQ(r.text, full.text.substr(0, cut + (include ? stop.size() : 0))) << include;
  }
}

TEST_F(E2eTest, TruncatedPromptIsItsLastTokens) {
  // A prompt of 60 random ids (fixed seed), truncated to its last 20: the same completion as the
  // last 20 ids given directly, and usage counts 20.
  std::mt19937 rng(17);
  const int vocab = server_->engine().model().config.vocab_size;
  v1::GenerateRequest whole;
  for (int i = 0; i < 60; ++i) {
    whole.mutable_token_ids()->add_ids(static_cast<int32_t>(rng() % (vocab - 8)) + 4);
  }
  whole.mutable_stopping()->set_max_new_tokens(12);
  whole.mutable_stopping()->set_ignore_eos(true);
  v1::GenerateRequest last = whole;
  last.mutable_token_ids()->clear_ids();
  for (int i = 40; i < 60; ++i) last.mutable_token_ids()->add_ids(whole.token_ids().ids(i));
  whole.set_truncate_prompt_tokens(20);
  const StreamResult a = RunGenerate(stub(), whole);
  const StreamResult b = RunGenerate(stub(), last);
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  ASSERT_TRUE(b.status.ok()) << b.status.error_message();
  EXPECT_EQ(a.finished.usage().prompt_tokens(), 20);
  EXPECT_EQ(a.tokens, b.tokens);
  // Longer than the prompt: nothing is cut.
  whole.set_truncate_prompt_tokens(100);
  EXPECT_EQ(RunGenerate(stub(), whole).finished.usage().prompt_tokens(), 60);
  // -1: a prompt longer than the context keeps what leaves room for max_new_tokens.
  const int context = server_->engine().options().max_context;
  v1::GenerateRequest longer;
  for (int i = 0; i < context + 30; ++i) {
    longer.mutable_token_ids()->add_ids(static_cast<int32_t>(rng() % (vocab - 8)) + 4);
  }
  longer.mutable_stopping()->set_max_new_tokens(8);
  longer.set_truncate_prompt_tokens(-1);
  const StreamResult c = RunGenerate(stub(), longer);
  ASSERT_TRUE(c.status.ok()) << c.status.error_message();
  EXPECT_EQ(c.finished.usage().prompt_tokens(), context - 8);
}

TEST_F(E2eTest, AllowedTokenIdsAreTheOnlyTokensSampled) {
  const std::vector<int32_t> allowed = {37, 101, 205, 333, 480};
  for (float temperature : {0.0f, 1.0f}) {
    v1::GenerateRequest req = TextRequest("Once upon a time", 24);
    req.mutable_stopping()->set_ignore_eos(true);
    req.mutable_sampling()->set_temperature(temperature);
    req.mutable_sampling()->set_seed(5);
    for (int32_t id : allowed) req.mutable_sampling()->add_allowed_token_ids(id);
    const StreamResult r = RunGenerate(stub(), req);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    ASSERT_EQ(r.tokens.size(), 24u);
    for (int32_t t : r.tokens) {
      EXPECT_TRUE(std::count(allowed.begin(), allowed.end(), t)) << t << " at T=" << temperature;
    }
  }
}

TEST_F(E2eTest, AllowedTokensAllMaskedEndTheRequestWithAnError) {
  // The only allowed token is EOS, which min_tokens holds back: nothing can be sampled, and the
  // request ends with an error instead of streaming a token nobody allowed.
  const std::vector<int32_t>& eos = server_->engine().model().config.eos_token_ids;
  ASSERT_FALSE(eos.empty());
  v1::GenerateRequest req = TextRequest("Once upon a time", 8);
  req.mutable_sampling()->add_allowed_token_ids(eos[0]);
  req.mutable_stopping()->set_min_tokens(3);
  const StreamResult r = RunGenerate(stub(), req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.finished.reason(), v1::FINISH_REASON_ERROR);
  EXPECT_TRUE(absl::StrContains(r.finished.error(), "no token can be sampled"))
      << r.finished.error();
  EXPECT_TRUE(r.tokens.empty());
  // Once min_tokens is 0, EOS is sampled and ends it.
  req.mutable_stopping()->set_min_tokens(0);
  const StreamResult ok = RunGenerate(stub(), req);
  EXPECT_EQ(ok.finished.reason(), v1::FINISH_REASON_EOS);
}

TEST_F(E2eTest, StopTokenIdEndsTheStreamWithIt) {
  v1::GenerateRequest req = TextRequest("Numbers:", 30);
  req.mutable_stopping()->set_ignore_eos(true);
  StreamResult full = RunGenerate(stub(), req);
  ASSERT_TRUE(full.status.ok());
  const int32_t stop_id = full.tokens[10];
  size_t first = 0;
  while (full.tokens[first] != stop_id) ++first;
  req.mutable_stopping()->add_stop_token_ids(stop_id);
  StreamResult r = RunGenerate(stub(), req);
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.finished.reason(), v1::FINISH_REASON_STOP);
  EXPECT_EQ(r.tokens, std::vector<int32_t>(full.tokens.begin(), full.tokens.begin() + first + 1));
}

TEST_F(E2eTest, LogitBiasBansAndForcesTokens) {
  v1::GenerateRequest req = TextRequest("Numbers:", 8);
  req.mutable_stopping()->set_ignore_eos(true);
  StreamResult full = RunGenerate(stub(), req);
  ASSERT_TRUE(full.status.ok());
  ASSERT_EQ(full.tokens.size(), 8u);
  // -100 on the greedy first token: another one is chosen.
  v1::GenerateRequest banned = req;
  (*banned.mutable_sampling()->mutable_logit_bias())[full.tokens[0]] = -100;
  StreamResult b = RunGenerate(stub(), banned);
  ASSERT_TRUE(b.status.ok());
  EXPECT_NE(b.tokens[0], full.tokens[0]);
  // +100 on a token the model did not pick: greedy picks it every step, sampling too.
  int32_t forced = 3;
  while (std::find(full.tokens.begin(), full.tokens.end(), forced) != full.tokens.end()) ++forced;
  for (float temperature : {0.0f, 0.8f}) {
    v1::GenerateRequest f = req;
    f.mutable_sampling()->set_temperature(temperature);
    f.mutable_sampling()->set_seed(11);
    (*f.mutable_sampling()->mutable_logit_bias())[forced] = 100;
    StreamResult r = RunGenerate(stub(), f);
    ASSERT_TRUE(r.status.ok()) << temperature;
    EXPECT_EQ(r.tokens, std::vector<int32_t>(8, forced)) << temperature;
  }
}

// vLLM's bad_words: a word of one token is never generated; a word of two is cut at its second
// token right after its first. Greedy, so the output is the unbanned one up to that point.
TEST_F(E2eTest, BadWordsAreNeverGenerated) {
  const Tokenizer& tok = *server_->model().tokenizer;
  v1::GenerateRequest req = TextRequest("Numbers:", 24);
  req.mutable_stopping()->set_ignore_eos(true);
  const StreamResult full = RunGenerate(stub(), req);
  ASSERT_TRUE(full.status.ok());
  ASSERT_EQ(full.tokens.size(), 24u);
  // A word whose own encoding (as bad_words tokenizes it: bare) is exactly these tokens.
  auto word_of = [&](std::vector<int32_t> ids) -> std::optional<std::string> {
    const std::string text(absl::StripLeadingAsciiWhitespace(tok.Decode(ids, true)));
    absl::StatusOr<std::vector<int32_t>> again = tok.Encode(text, false);
    if (text.empty() || !again.ok() || *again != ids) return std::nullopt;
    return text;
  };
  bool single = false, pair = false;
  for (size_t i = 0; i + 1 < full.tokens.size() && !(single && pair); ++i) {
    if (!single) {
      if (std::optional<std::string> w = word_of({full.tokens[i]})) {
        single = true;
        v1::GenerateRequest banned = req;
        banned.mutable_sampling()->add_bad_words(*w);
        const StreamResult b = RunGenerate(stub(), banned);
        ASSERT_TRUE(b.status.ok()) << b.status.error_message();
        const size_t first =
            std::find(full.tokens.begin(), full.tokens.end(), full.tokens[i]) - full.tokens.begin();
        EXPECT_EQ(std::find(b.tokens.begin(), b.tokens.end(), full.tokens[i]), b.tokens.end())
            << "'" << *w << "'";
        EXPECT_EQ(std::vector<int32_t>(b.tokens.begin(), b.tokens.begin() + first),
                  std::vector<int32_t>(full.tokens.begin(), full.tokens.begin() + first));
      }
    }
    if (!pair && full.tokens[i] != full.tokens[i + 1]) {
      if (std::optional<std::string> w = word_of({full.tokens[i], full.tokens[i + 1]})) {
        pair = true;
        v1::GenerateRequest banned = req;
        banned.mutable_sampling()->add_bad_words(*w);
        const StreamResult b = RunGenerate(stub(), banned);
        ASSERT_TRUE(b.status.ok()) << b.status.error_message();
        // The first time the pair would come: its first token, then something else.
        size_t at = 0;
        while (at + 1 < full.tokens.size() &&
               !(full.tokens[at] == full.tokens[i] && full.tokens[at + 1] == full.tokens[i + 1])) {
          ++at;
        }
        ASSERT_GT(b.tokens.size(), at + 1);
        EXPECT_EQ(std::vector<int32_t>(b.tokens.begin(), b.tokens.begin() + at + 1),
                  std::vector<int32_t>(full.tokens.begin(), full.tokens.begin() + at + 1));
        EXPECT_NE(b.tokens[at + 1], full.tokens[i + 1]) << "'" << *w << "'";
        for (size_t k = 0; k + 1 < b.tokens.size(); ++k) {
          EXPECT_FALSE(b.tokens[k] == full.tokens[i] && b.tokens[k + 1] == full.tokens[i + 1]) << k;
        }
      }
    }
  }
  EXPECT_TRUE(single && pair) << "no word of the greedy output encodes back to its tokens";
  // Refusals name the word.
  v1::GenerateRequest bad = req;
  bad.mutable_sampling()->add_bad_words("fine");
  bad.mutable_sampling()->add_bad_words("   ");
  const StreamResult r = RunGenerate(stub(), bad);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(r.status.error_message().rfind("sampling.bad_words[1]:", 0), 0u)
      << r.status.error_message();
}

// bad_words are tokenized as vLLM's SamplingParams.update_from_tokenizer does: the word with its
// leading spaces dropped, and with one space before it only where that starts with another
// token and has as many tokens; 128 words are served even where each is two sequences, 129 are
// refused naming the field.
TEST_F(E2eTest, BadWordsAreTokenizedAsVllmDoes) {
  const Tokenizer& tok = *server_->model().tokenizer;
  RequestLimits limits;
  limits.vocab_size = server_->model().config.vocab_size;
  limits.max_context = 512;
  limits.max_new_tokens = 64;
  const std::vector<std::string> words = {"hello", "  world", "x y z", "the", "Numbers"};
  v1::GenerateRequest req = TextRequest("Hi", 4);
  std::vector<std::vector<int32_t>> want;
  for (const std::string& w : words) {
    req.mutable_sampling()->add_bad_words(w);
    const std::string bare(absl::StripLeadingAsciiWhitespace(w));
    const std::vector<int32_t> a = *tok.Encode(bare, false);
    const std::vector<int32_t> b = *tok.Encode(" " + bare, false);
    want.push_back(a);
    if (b[0] != a[0] && b.size() == a.size()) want.push_back(b);
  }
  absl::StatusOr<std::unique_ptr<GenerationRequest>> r = ValidateGenerateRequest(req, tok, limits);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_NE((*r)->sampling.bad_words, nullptr);
  EXPECT_EQ(*(*r)->sampling.bad_words, want);
  EXPECT_GT(want.size(), words.size()) << "no word here has a spaced variant of its own";

  v1::GenerateRequest many = TextRequest("Hi", 4);
  for (int i = 0; i < kMaxBadWords; ++i)
    many.mutable_sampling()->add_bad_words(absl::StrCat("w", i));
  const StreamResult ok = RunGenerate(stub(), many);
  EXPECT_TRUE(ok.status.ok()) << ok.status.error_message();
  many.mutable_sampling()->add_bad_words("one more");
  const StreamResult refused = RunGenerate(stub(), many);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(refused.status.error_message().rfind("sampling.bad_words:", 0), 0u)
      << refused.status.error_message();
}

TEST_F(E2eTest, MinTokensHoldsOffEosStopTokensAndStopSequences) {
  grpc::ClientContext ctx;
  v1::ModelInfo info;
  ASSERT_TRUE(stub().GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok());
  ASSERT_GT(info.eos_token_ids_size(), 0);
  const int32_t eos = info.eos_token_ids(0);
  // EOS forced by a +100 bias: the first token ends the stream; with min_tokens = 4 it cannot be
  // sampled for the first four, and the fifth is EOS.
  for (int min_tokens : {0, 4}) {
    v1::GenerateRequest req = TextRequest("Once upon a time", 12);
    (*req.mutable_sampling()->mutable_logit_bias())[eos] = 100;
    req.mutable_stopping()->set_min_tokens(min_tokens);
    StreamResult r = RunGenerate(stub(), req);
    ASSERT_TRUE(r.status.ok()) << min_tokens;
    EXPECT_EQ(r.finished.reason(), v1::FINISH_REASON_EOS) << min_tokens;
    ASSERT_EQ(r.tokens.size(), static_cast<size_t>(min_tokens + 1)) << min_tokens;
    for (int i = 0; i < min_tokens; ++i) EXPECT_NE(r.tokens[i], eos) << i;
    EXPECT_EQ(r.tokens.back(), eos);
  }
  v1::GenerateRequest req = TextRequest("Numbers:", 30);
  req.mutable_stopping()->set_ignore_eos(true);
  StreamResult full = RunGenerate(stub(), req);
  ASSERT_TRUE(full.status.ok());
  ASSERT_EQ(full.tokens.size(), 30u);
  // A stop token: the greedy first one. Without min_tokens the stream is that token alone; with
  // min_tokens = 6 none of the first six is it, and the stream stops at its first use after.
  v1::GenerateRequest stop_id = req;
  stop_id.mutable_stopping()->add_stop_token_ids(full.tokens[0]);
  StreamResult one = RunGenerate(stub(), stop_id);
  ASSERT_TRUE(one.status.ok());
  EXPECT_EQ(one.tokens, std::vector<int32_t>{full.tokens[0]});
  stop_id.mutable_stopping()->set_min_tokens(6);
  StreamResult held = RunGenerate(stub(), stop_id);
  ASSERT_TRUE(held.status.ok());
  ASSERT_GE(held.tokens.size(), 6u);
  for (size_t i = 0; i < held.tokens.size(); ++i) {
    if (i < 6 || i + 1 < held.tokens.size()) {
      EXPECT_NE(held.tokens[i], full.tokens[0]) << i;
    }
  }
  if (held.finished.reason() == v1::FINISH_REASON_STOP) {
    EXPECT_EQ(held.tokens.back(), full.tokens[0]);
  } else {
    EXPECT_EQ(held.finished.reason(), v1::FINISH_REASON_LENGTH);
  }
  // A stop sequence at the very start of the text: it would end the stream with no text; with
  // min_tokens = 8 the first eight tokens come out as they did without the stop.
  v1::GenerateRequest stop_seq = req;
  stop_seq.mutable_stopping()->add_stop_sequences(full.text.substr(0, 2));
  StreamResult none = RunGenerate(stub(), stop_seq);
  ASSERT_TRUE(none.status.ok());
  EXPECT_EQ(none.finished.reason(), v1::FINISH_REASON_STOP);
  EXPECT_EQ(none.text, "");
  stop_seq.mutable_stopping()->set_min_tokens(8);
  StreamResult later = RunGenerate(stub(), stop_seq);
  ASSERT_TRUE(later.status.ok());
  ASSERT_GE(later.tokens.size(), 8u);
  EXPECT_EQ(std::vector<int32_t>(later.tokens.begin(), later.tokens.begin() + 8),
            std::vector<int32_t>(full.tokens.begin(), full.tokens.begin() + 8));
}

TEST_F(E2eTest, LogprobsAreReturnedPerToken) {
  v1::GenerateRequest req = TextRequest("Logprobs please", 5);
  req.mutable_response()->set_top_logprobs(3);
  StreamResult r = RunGenerate(stub(), req);
  ASSERT_TRUE(r.status.ok());
  int n = 0;
  for (const auto& m : r.messages) {
    ASSERT_EQ(m.logprobs_size(), m.token_ids_size());
    for (const auto& lp : m.logprobs()) {
      ++n;
      EXPECT_LE(lp.logprob(), 0.0f);
      ASSERT_EQ(lp.top_size(), 3);
      // Greedy: the chosen token is the most likely one.
      EXPECT_EQ(lp.top(0).token_id(), lp.token_id());
      EXPECT_FLOAT_EQ(lp.top(0).logprob(), lp.logprob());
      EXPECT_GE(lp.top(0).logprob(), lp.top(1).logprob());
    }
  }
  EXPECT_EQ(n, static_cast<int>(r.tokens.size()));
}

TEST_F(E2eTest, BadRequestsGetInvalidArgumentNamingTheField) {
  struct Case {
    std::string name;
    std::function<void(v1::GenerateRequest*)> mutate;
    std::string field;
  };
  const int context = server_->engine().options().max_context;
  std::vector<Case> cases = {
      {"empty prompt", [](v1::GenerateRequest* r) { r->set_text(""); }, "text"},
      {"no prompt", [](v1::GenerateRequest* r) { r->clear_prompt(); }, "prompt"},
      {"max_new_tokens 0",
       [](v1::GenerateRequest* r) { r->mutable_stopping()->set_max_new_tokens(0); },
       "stopping.max_new_tokens"},
      {"max_new_tokens above limit",
       [](v1::GenerateRequest* r) { r->mutable_stopping()->set_max_new_tokens(100000); },
       "stopping.max_new_tokens"},
      {"negative temperature",
       [](v1::GenerateRequest* r) { r->mutable_sampling()->set_temperature(-0.5f); },
       "sampling.temperature"},
      {"top_p above 1", [](v1::GenerateRequest* r) { r->mutable_sampling()->set_top_p(1.5f); },
       "sampling.top_p"},
      {"top_p negative", [](v1::GenerateRequest* r) { r->mutable_sampling()->set_top_p(-0.1f); },
       "sampling.top_p"},
      {"prompt longer than context",
       [context](v1::GenerateRequest* r) {
         r->clear_text();
         for (int i = 0; i < context + 5; ++i) r->mutable_token_ids()->add_ids(7);
       },
       "token_ids"},
      {"unknown token id",
       [](v1::GenerateRequest* r) {
         r->clear_text();
         r->mutable_token_ids()->add_ids(5);
         r->mutable_token_ids()->add_ids(999999);
       },
       "token_ids"},
      {"negative top_k", [](v1::GenerateRequest* r) { r->mutable_sampling()->set_top_k(-1); },
       "sampling.top_k"},
      {"top_logprobs above 20",
       [](v1::GenerateRequest* r) { r->mutable_response()->set_top_logprobs(21); },
       "response.top_logprobs"},
      {"empty stop sequence",
       [](v1::GenerateRequest* r) { r->mutable_stopping()->add_stop_sequences(""); },
       "stopping.stop_sequences"},
      {"priority out of range", [](v1::GenerateRequest* r) { r->set_priority(1000); },
       "priority"},
      {"cache_salt too long",
       [](v1::GenerateRequest* r) { r->set_cache_salt(std::string(257, 's')); }, "cache_salt"},
      {"min_tokens above max_new_tokens",
       [](v1::GenerateRequest* r) { r->mutable_stopping()->set_min_tokens(5); },
       "stopping.min_tokens"},
      {"negative min_tokens",
       [](v1::GenerateRequest* r) { r->mutable_stopping()->set_min_tokens(-1); },
       "stopping.min_tokens"},
      {"logit_bias token outside the vocabulary",
       [](v1::GenerateRequest* r) { (*r->mutable_sampling()->mutable_logit_bias())[999999] = 1; },
       "sampling.logit_bias"},
      {"logit_bias value above 100",
       [](v1::GenerateRequest* r) { (*r->mutable_sampling()->mutable_logit_bias())[5] = 101; },
       "sampling.logit_bias"},
      {"logit_bias value NaN",
       [](v1::GenerateRequest* r) {
         (*r->mutable_sampling()->mutable_logit_bias())[5] = std::nanf("");
       },
       "sampling.logit_bias"},
      {"allowed token outside the vocabulary",
       [](v1::GenerateRequest* r) { r->mutable_sampling()->add_allowed_token_ids(1 << 20); },
       "sampling.allowed_token_ids"},
      {"truncate_prompt_tokens -2", [](v1::GenerateRequest* r) { r->set_truncate_prompt_tokens(-2); },
       "truncate_prompt_tokens"},
      {"truncate_prompt_tokens at the context",
       [context](v1::GenerateRequest* r) { r->set_truncate_prompt_tokens(context); },
       "truncate_prompt_tokens"},
      {"logit_bias with 301 entries",
       [](v1::GenerateRequest* r) {
         for (int i = 0; i < 301; ++i) (*r->mutable_sampling()->mutable_logit_bias())[i] = 1;
       },
       "sampling.logit_bias"},
  };
  for (const Case& c : cases) {
    v1::GenerateRequest req = TextRequest("valid prompt", 4);
    c.mutate(&req);
    StreamResult r = RunGenerate(stub(), req);
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.name;
    EXPECT_TRUE(absl::StartsWith(r.status.error_message(), c.field + ":"))
        << c.name << ": " << r.status.error_message();
    EXPECT_TRUE(r.messages.empty()) << c.name;
  }
  // Still serving.
  StreamResult ok = RunGenerate(stub(), TextRequest("still alive", 3));
  EXPECT_TRUE(ok.status.ok());
  EXPECT_EQ(ok.tokens.size() > 0, true);
}

TEST_F(E2eTest, TokenizeAndInfo) {
  grpc::ClientContext c1;
  v1::TokenizeRequest treq;
  treq.set_text("hello world");
  treq.set_add_bos(true);
  treq.set_return_pieces(true);
  v1::TokenizeResponse tresp;
  ASSERT_TRUE(stub().Tokenize(&c1, treq, &tresp).ok());
  const std::vector<int32_t> expect = *server_->model().tokenizer->Encode("hello world", true);
  EXPECT_EQ(std::vector<int32_t>(tresp.token_ids().begin(), tresp.token_ids().end()), expect);
  EXPECT_EQ(tresp.pieces_size(), tresp.token_ids_size());

  grpc::ClientContext c2;
  v1::ModelInfo mi;
  ASSERT_TRUE(stub().GetModelInfo(&c2, v1::GetModelInfoRequest(), &mi).ok());
  EXPECT_EQ(mi.vocab_size(), 1024);
  EXPECT_EQ(mi.num_layers(), 4);
  EXPECT_EQ(mi.num_key_value_heads(), 2);
  EXPECT_EQ(mi.dtype(), "f32");

  grpc::ClientContext c3;
  v1::ServerInfo si;
  ASSERT_TRUE(stub().GetServerInfo(&c3, v1::GetServerInfoRequest(), &si).ok());
  EXPECT_EQ(si.slots_total(), 4);
  EXPECT_EQ(si.state(), "SERVING");
  EXPECT_EQ(si.kv().block_tokens(), 16);
  EXPECT_GT(si.kv().blocks_total(), 0);
  EXPECT_EQ(si.kv_dtype(), "f32");
  EXPECT_TRUE(si.mixed_steps()) << "the CPU backend runs chunks in the decode pass by default";
  EXPECT_FALSE(si.device_sampling()) << "the CPU backend samples on the host";
  EXPECT_FALSE(si.far_history().enabled()) << "off unless asked for";
}

v1::GenerateRequest ChatRequest(std::vector<std::pair<std::string, std::string>> turns,
                                int max_new_tokens) {
  v1::GenerateRequest r;
  r.mutable_chat();  // set even with no turns
  for (auto& [role, content] : turns) {
    v1::ChatMessage* m = r.mutable_chat()->add_messages();
    m->set_role(role);
    m->set_content(content);
  }
  r.mutable_stopping()->set_max_new_tokens(max_new_tokens);
  return r;
}

// A chat request is the text its template renders (the built-in model's: Llama 3's layout with
// plain-text headers, tools/modelgen/tokenizer_json.h), tokenized with its special tokens and no
// second BOS: the same prompt tokens, and so the same greedy completion, as that text sent with
// skip_bos.
TEST_F(E2eTest, ChatRequestIsTheTemplatesTextAndEndsAtTheTurnsEnd) {
  grpc::ClientContext c0;
  v1::ModelInfo mi;
  ASSERT_TRUE(stub().GetModelInfo(&c0, v1::GetModelInfoRequest(), &mi).ok());
  EXPECT_TRUE(mi.chat_template());

  v1::GenerateRequest chat = ChatRequest(
      {{"system", "  Be brief.\n"}, {"user", "What is a KV cache?"}, {"assistant", "A cache."},
       {"user", "Of what?"}},
      40);
  const std::string rendered =
      "<|begin_of_text|>system:\nBe brief.<|eot_id|>user:\nWhat is a KV cache?<|eot_id|>"
      "assistant:\nA cache.<|eot_id|>user:\nOf what?<|eot_id|>assistant:\n";
  v1::GenerateRequest text = TextRequest(rendered, 40);
  text.set_skip_bos(true);
  const StreamResult a = RunGenerate(stub(), chat);
  const StreamResult b = RunGenerate(stub(), text);
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  ASSERT_TRUE(b.status.ok()) << b.status.error_message();
  const std::vector<int32_t> ids = *server_->model().tokenizer->Encode(rendered, false);
  EXPECT_EQ(ids[0], *server_->model().config.bos_token_id) << "one BOS, the template's";
  EXPECT_NE(ids[1], *server_->model().config.bos_token_id);
  EXPECT_EQ(a.finished.usage().prompt_tokens(), static_cast<int32_t>(ids.size()));
  EXPECT_EQ(b.finished.usage().prompt_tokens(), static_cast<int32_t>(ids.size()));
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_FALSE(a.tokens.empty());

  // Tokenize shows the rendered prompt and the same ids.
  grpc::ClientContext ct;
  v1::TokenizeRequest treq;
  *treq.mutable_chat() = chat.chat();
  v1::TokenizeResponse tresp;
  ASSERT_TRUE(stub().Tokenize(&ct, treq, &tresp).ok());
  EXPECT_EQ(tresp.prompt(), rendered);
  EXPECT_EQ(std::vector<int32_t>(tresp.token_ids().begin(), tresp.token_ids().end()), ids);
  grpc::ClientContext cbad;
  v1::TokenizeRequest bad;
  bad.mutable_chat()->add_messages()->set_role("ipython");
  const grpc::Status bad_status = stub().Tokenize(&cbad, bad, &tresp);
  EXPECT_EQ(bad_status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StartsWith(bad_status.error_message(), "chat: unknown role: ipython"))
      << bad_status.error_message();

  // Without the generation prompt the rendering stops after the last turn's end.
  v1::GenerateRequest no_header = ChatRequest({{"user", "Hi"}}, 8);
  no_header.mutable_chat()->set_add_generation_prompt(false);
  const StreamResult c = RunGenerate(stub(), no_header);
  ASSERT_TRUE(c.status.ok()) << c.status.error_message();
  EXPECT_EQ(c.finished.usage().prompt_tokens(),
            static_cast<int32_t>(
                server_->model().tokenizer->Encode("<|begin_of_text|>user:\nHi<|eot_id|>", false)
                    ->size()));

  // Continuing the final message: the prompt ends inside the assistant's partial reply, the same
  // tokens (and greedy completion) as that text sent as is.
  v1::GenerateRequest cont =
      ChatRequest({{"user", "Name a colour."}, {"assistant", "  The colour is "}}, 16);
  cont.mutable_chat()->set_continue_final_message(true);
  const std::string partial =
      "<|begin_of_text|>user:\nName a colour.<|eot_id|>assistant:\nThe colour is";
  v1::GenerateRequest partial_text = TextRequest(partial, 16);
  partial_text.set_skip_bos(true);
  const StreamResult d = RunGenerate(stub(), cont);
  const StreamResult e = RunGenerate(stub(), partial_text);
  ASSERT_TRUE(d.status.ok()) << d.status.error_message();
  ASSERT_TRUE(e.status.ok()) << e.status.error_message();
  EXPECT_EQ(d.finished.usage().prompt_tokens(),
            static_cast<int32_t>(server_->model().tokenizer->Encode(partial, false)->size()));
  EXPECT_EQ(d.tokens, e.tokens);
  grpc::ClientContext ct2;
  v1::TokenizeRequest treq2;
  *treq2.mutable_chat() = cont.chat();
  ASSERT_TRUE(stub().Tokenize(&ct2, treq2, &tresp).ok());
  EXPECT_EQ(tresp.prompt(), partial);
}

TEST_F(E2eTest, BadChatRequestsGetInvalidArgumentNamingTheFieldOrTheTemplatesError) {
  struct Case {
    v1::GenerateRequest request;
    std::string message_prefix;
  };
  std::vector<Case> cases;
  cases.push_back({ChatRequest({}, 8), "chat.messages: no messages"});
  cases.push_back({ChatRequest({{"", "hello"}}, 8), "chat.messages[0].role: must be 1 to 64"});
  cases.push_back({ChatRequest({{"user", "a"}, {std::string(65, 'r'), "b"}}, 8),
                   "chat.messages[1].role: must be 1 to 64"});
  cases.push_back({ChatRequest({{"user\n", "a"}}, 8), "chat.messages[0].role: must be printable"});
  // The template's own raise_exception, as its message.
  cases.push_back({ChatRequest({{"user", "a"}, {"ipython", "{}"}}, 8),
                   "chat: unknown role: ipython (this template takes system, user, assistant and tool)"});
  {
    v1::GenerateRequest both = ChatRequest({{"user", "a"}, {"assistant", "b"}}, 8);
    both.mutable_chat()->set_continue_final_message(true);
    both.mutable_chat()->set_add_generation_prompt(true);
    cases.push_back({both, "chat.continue_final_message: not with add_generation_prompt true"});
    v1::GenerateRequest empty_last = ChatRequest({{"user", "a"}, {"assistant", "  "}}, 8);
    empty_last.mutable_chat()->set_continue_final_message(true);
    cases.push_back({empty_last, "chat.continue_final_message: the chat template does not write"});
  }
  // Too long once rendered.
  cases.push_back({ChatRequest({{"user", std::string(5000, 'x')}}, 8), "chat: prompt of"});
  for (const Case& c : cases) {
    const StreamResult r = RunGenerate(stub(), c.request);
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << c.message_prefix << ": " << r.status.error_message();
    EXPECT_TRUE(absl::StartsWith(r.status.error_message(), c.message_prefix))
        << "expected '" << c.message_prefix << "...', got '" << r.status.error_message() << "'";
  }
  // A model without a template refuses chat requests and says why (the validation the service
  // runs, with the ChatConfig of such a model).
  const ChatConfig none;
  RequestLimits limits;
  limits.vocab_size = 1024;
  limits.max_context = 512;
  limits.max_new_tokens = 64;
  absl::StatusOr<std::unique_ptr<GenerationRequest>> r = ValidateGenerateRequest(
      ChatRequest({{"user", "hi"}}, 8), *server_->model().tokenizer, limits, &none);
  EXPECT_TRUE(absl::IsInvalidArgument(r.status()));
  EXPECT_EQ(r.status().message(), "chat: the model has no chat template");
  // The server is unharmed.
  const StreamResult ok = RunGenerate(stub(), ChatRequest({{"user", "still there?"}}, 4));
  EXPECT_TRUE(ok.status.ok()) << ok.status.error_message();
}

// --kv_dtype=bf16: the server says so, a block takes half the bytes, and requests are served.
// --fuse_prefill=false: the server says mixed steps are off (on by default, checked above).
TEST(E2eMixedStepsTest, OffIsReported) {
  EngineOptions o = Options(2);
  o.fuse_prefill = false;
  TestServer server(o);
  grpc::ClientContext c;
  v1::ServerInfo si;
  ASSERT_TRUE(server.stub().GetServerInfo(&c, v1::GetServerInfoRequest(), &si).ok());
  EXPECT_FALSE(si.mixed_steps());
}

// --grpc_max_connection_age_s: a connection older than that gets a GOAWAY, so the client's
// channel leaves READY (and re-resolves) on its own; a stream open across the age finishes
// whole, and the channel's next call reconnects transparently. Without the option the channel
// stays connected.
grpc_connectivity_state StateAfterIdle(int port, bool* streams_ok) {
  auto channel =
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
  auto stub = v1::Kvrm::NewStub(channel);
  v1::GenerateRequest req = TextRequest("a stream read slowly", 48);
  req.mutable_stopping()->set_ignore_eos(true);
  grpc::ClientContext ctx;
  auto reader = stub->Generate(&ctx, req);
  v1::GenerateResponse msg;
  int tokens = 0;
  bool finished = false;
  if (reader->Read(&msg)) {
    tokens += msg.token_ids_size();
    finished |= msg.has_finished();
  }
  EXPECT_EQ(channel->GetState(false), GRPC_CHANNEL_READY);
  // Past the age (1 s, +-10 % jitter) with the stream still open on the old connection.
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  while (reader->Read(&msg)) {
    tokens += msg.token_ids_size();
    finished |= msg.has_finished();
  }
  const grpc::Status status = reader->Finish();
  const grpc_connectivity_state state = channel->GetState(false);
  const StreamResult again = RunGenerate(*stub, TextRequest("and again", 4));
  *streams_ok = status.ok() && finished && tokens == 48 && again.status.ok() &&
                again.finished.reason() != v1::FINISH_REASON_UNSPECIFIED;
  return state;
}

TEST(E2eConnectionAgeTest, OldConnectionsAreToldToGoAwayAndCallsReconnect) {
  ServerOptions so;
  so.max_connection_age_s = 1;
  {
    TestServer aged(Options(2), so);
    bool ok = false;
    EXPECT_NE(StateAfterIdle(aged.port(), &ok), GRPC_CHANNEL_READY);
    EXPECT_TRUE(ok);
    // Out of range is refused at start.
    ServerOptions bad;
    bad.listen = "127.0.0.1:0";
    bad.max_connection_age_s = -1;
    EXPECT_FALSE(KvrmServer::Start(&aged.engine(), bad).ok());
    bad.max_connection_age_s = 2592000;  // 30 days: its milliseconds overflow gRPC's int
    EXPECT_FALSE(KvrmServer::Start(&aged.engine(), bad).ok());
  }
  TestServer forever(Options(2));
  bool ok = false;
  EXPECT_EQ(StateAfterIdle(forever.port(), &ok), GRPC_CHANNEL_READY);
  EXPECT_TRUE(ok);
}

// Prefix caching through the API: a second request whose prompt repeats the first's (a system
// prompt) and adds a question reports the cached tokens in its usage, decodes as it would
// without the cache (a server with --prefix_caching=false gives the same tokens), and the server
// info counts the hits; the static baseline reports the cache off.
std::vector<int32_t> GreedyTokens(TestServer& server, const std::vector<int32_t>& prompt,
                                  v1::Usage* usage, const std::string& salt = "") {
  grpc::ClientContext ctx;
  v1::GenerateRequest req;
  req.set_cache_salt(salt);
  for (int32_t t : prompt) req.mutable_token_ids()->add_ids(t);
  req.mutable_stopping()->set_max_new_tokens(16);
  req.mutable_stopping()->set_ignore_eos(true);
  auto reader = server.stub().Generate(&ctx, req);
  v1::GenerateResponse msg;
  std::vector<int32_t> out;
  while (reader->Read(&msg)) {
    out.insert(out.end(), msg.token_ids().begin(), msg.token_ids().end());
    if (msg.has_finished()) *usage = msg.finished().usage();
  }
  EXPECT_TRUE(reader->Finish().ok());
  return out;
}

TEST(E2ePrefixCacheTest, CachedTokensAreReportedAndChangeNothing) {
  std::mt19937 rng(9);
  std::vector<int32_t> system(150);
  for (int32_t& t : system) t = static_cast<int32_t>(rng() % 500) + 10;
  std::vector<int32_t> second = system;
  for (int i = 0; i < 20; ++i) second.push_back(static_cast<int32_t>(rng() % 500) + 10);

  EngineOptions o = Options(2);
  TestServer cached(o);
  v1::Usage u1, u2;
  GreedyTokens(cached, system, &u1);
  EXPECT_EQ(u1.cached_prompt_tokens(), 0);
  const std::vector<int32_t> with_cache = GreedyTokens(cached, second, &u2);
  EXPECT_EQ(u2.prompt_tokens(), 170);
  // The first history's 9 blocks shared, and its tenth (the system prompt's last 6 tokens, then
  // what it generated) copied for those 6.
  EXPECT_EQ(u2.cached_prompt_tokens(), 150) << "the first request's prompt";
  grpc::ClientContext c;
  v1::ServerInfo si;
  ASSERT_TRUE(cached.stub().GetServerInfo(&c, v1::GetServerInfoRequest(), &si).ok());
  EXPECT_TRUE(si.prefix_cache().enabled());
  EXPECT_EQ(si.prefix_cache().queried_tokens_total(), 320u);
  EXPECT_EQ(si.prefix_cache().hit_tokens_total(), 150u);
  EXPECT_GT(si.prefix_cache().cached_blocks(), 0);

  // cache_salt: another tenant's identical prompt finds nothing; its own second request does.
  v1::Usage u4, u5;
  EXPECT_EQ(GreedyTokens(cached, second, &u4, "tenant-b"), with_cache);
  EXPECT_EQ(u4.cached_prompt_tokens(), 0) << "another salt shares nothing";
  GreedyTokens(cached, second, &u5, "tenant-b");
  EXPECT_EQ(u5.cached_prompt_tokens(), 169) << "its own history: all of 170 but the last";

  o.prefix_caching = false;
  TestServer plain(o);
  v1::Usage u3;
  EXPECT_EQ(GreedyTokens(plain, second, &u3), with_cache);
  EXPECT_EQ(u3.cached_prompt_tokens(), 0);
  grpc::ClientContext c2;
  ASSERT_TRUE(plain.stub().GetServerInfo(&c2, v1::GetServerInfoRequest(), &si).ok());
  EXPECT_FALSE(si.prefix_cache().enabled());

  EngineOptions st = Options(2);
  st.kv_mode = KvMode::kStatic;
  TestServer baseline(st);
  grpc::ClientContext c3;
  ASSERT_TRUE(baseline.stub().GetServerInfo(&c3, v1::GetServerInfoRequest(), &si).ok());
  EXPECT_FALSE(si.prefix_cache().enabled()) << "the static baseline has no block table to share";
}

// Offload: a history pushed out of a small device pool by other requests comes back from the
// host tier; the reply is the same and ServerInfo says where the tokens came from.
TEST(E2ePrefixCacheTest, OffloadedHistoryComesBackFromTheHostTier) {
  std::mt19937 rng(10);
  std::vector<int32_t> first(150);
  for (int32_t& t : first) t = static_cast<int32_t>(rng() % 500) + 10;
  std::vector<int32_t> second = first;
  for (int i = 0; i < 20; ++i) second.push_back(static_cast<int32_t>(rng() % 500) + 10);

  EngineOptions o = Options(2);
  o.kv_blocks = 64;
  o.kv_host_blocks = 512;
  TestServer server(o);
  v1::Usage u;
  const std::vector<int32_t> reference = GreedyTokens(server, second, &u);  // cached nothing
  EXPECT_EQ(u.cached_prompt_tokens(), 0);
  GreedyTokens(server, first, &u);
  EXPECT_EQ(u.cached_prompt_tokens(), 149) << "second's first 9 blocks, 5 tokens of its tenth";
  for (int i = 0; i < 6; ++i) {  // 6 x 15 blocks of other histories: more than the pool
    std::vector<int32_t> other(230);
    for (int32_t& t : other) t = static_cast<int32_t>(rng() % 500) + 10;
    GreedyTokens(server, other, &u);
  }
  v1::ServerInfo before;
  grpc::ClientContext c1;
  ASSERT_TRUE(server.stub().GetServerInfo(&c1, v1::GetServerInfoRequest(), &before).ok());
  EXPECT_TRUE(before.prefix_cache().offload_enabled());
  EXPECT_GT(before.prefix_cache().offloaded_blocks_total(), 0u);
  EXPECT_GT(before.prefix_cache().host_cached_blocks(), 0);
  EXPECT_GT(before.prefix_cache().evicted_blocks_total(), 0u);

  EXPECT_EQ(GreedyTokens(server, second, &u), reference);
  // (Its eleventh block went to the host tier too: a block is copied for part of its tokens
  // from the device only.)
  EXPECT_EQ(u.cached_prompt_tokens(), 160) << "second's own 10 full blocks, from the host tier";
  v1::ServerInfo after;
  grpc::ClientContext c2;
  ASSERT_TRUE(server.stub().GetServerInfo(&c2, v1::GetServerInfoRequest(), &after).ok());
  EXPECT_EQ(after.prefix_cache().host_hit_tokens_total() -
                before.prefix_cache().host_hit_tokens_total(),
            160u);

  o.kv_host_blocks = 0;  // no host tier: nothing to offload to
  TestServer no_host(o);
  grpc::ClientContext c3;
  ASSERT_TRUE(no_host.stub().GetServerInfo(&c3, v1::GetServerInfoRequest(), &after).ok());
  EXPECT_TRUE(after.prefix_cache().enabled());
  EXPECT_FALSE(after.prefix_cache().offload_enabled());
}

// A server with a `kv_dtype` cache says so, takes 1 / `fraction` of an f32 block's bytes, and
// serves a request.
void ExpectKvDtypeReportedAndServes(DType kv_dtype, const std::string& name, int fraction) {
  EngineOptions o = Options(2);
  TestServer f32(o);
  o.kv_dtype = kv_dtype;
  TestServer narrow(o);
  grpc::ClientContext c1, c2;
  v1::ServerInfo a, b;
  ASSERT_TRUE(f32.stub().GetServerInfo(&c1, v1::GetServerInfoRequest(), &a).ok());
  ASSERT_TRUE(narrow.stub().GetServerInfo(&c2, v1::GetServerInfoRequest(), &b).ok());
  EXPECT_EQ(b.kv_dtype(), name);
  EXPECT_EQ(fraction * b.kv().bytes_per_block(), a.kv().bytes_per_block());
  grpc::ClientContext ctx;
  v1::GenerateRequest req = TextRequest("a narrow cache", 12);
  req.mutable_stopping()->set_ignore_eos(true);
  auto reader = narrow.stub().Generate(&ctx, req);
  v1::GenerateResponse msg;
  int tokens = 0;
  while (reader->Read(&msg)) tokens += msg.token_ids_size();
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(tokens, 12);
}

TEST(E2eKvDtypeTest, Bf16KvIsReportedAndServes) {
  ExpectKvDtypeReportedAndServes(DType::kBF16, "bf16", 2);
}

// --kv_dtype=fp8: reported as fp8_e4m3, a quarter of an f32 block's bytes.
TEST(E2eKvDtypeTest, Fp8KvIsReportedAndServes) {
  ExpectKvDtypeReportedAndServes(DType::kF8E4M3, "fp8_e4m3", 4);
}

// Per completion of an n > 1 call: its tokens and its finish (messages grouped by index).
struct Completions {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<v1::Finished> finished;
  std::vector<int> finishes;  // final messages seen per index (exactly one each)
};

Completions ByIndex(const StreamResult& r, int n) {
  Completions c;
  c.tokens.resize(n);
  c.finished.resize(n);
  c.finishes.assign(n, 0);
  for (const v1::GenerateResponse& m : r.messages) {
    EXPECT_GE(m.index(), 0);
    EXPECT_LT(m.index(), n);
    if (m.index() < 0 || m.index() >= n) continue;
    c.tokens[m.index()].insert(c.tokens[m.index()].end(), m.token_ids().begin(),
                               m.token_ids().end());
    if (m.has_finished()) {
      c.finished[m.index()] = m.finished();
      ++c.finishes[m.index()];
    }
  }
  return c;
}

// response.prompt_token_ids: each completion's first message (and only it) carries the prompt
// as the model read it: a chat rendered and tokenized as Tokenize does it, truncated to
// truncate_prompt_tokens.
TEST(E2eParallelSamplingTest, PromptTokenIdsComeWithEachCompletionsFirstMessage) {
  TestServer server(Options(4));
  v1::GenerateRequest req;
  v1::ChatMessage* m = req.mutable_chat()->add_messages();
  m->set_role("user");
  m->set_content("Tell me about the sea, the wind and the long grey ships.");
  req.mutable_stopping()->set_max_new_tokens(6);
  req.mutable_sampling()->set_temperature(0.9f);
  req.mutable_sampling()->set_seed(5);
  req.set_n(3);
  req.mutable_response()->set_prompt_token_ids(true);
  grpc::ClientContext ctx;
  v1::TokenizeRequest tokenize;
  *tokenize.mutable_chat() = req.chat();
  v1::TokenizeResponse tokenized;
  ASSERT_TRUE(server.stub().Tokenize(&ctx, tokenize, &tokenized).ok());
  const std::vector<int32_t> prompt(tokenized.token_ids().begin(), tokenized.token_ids().end());
  ASSERT_GT(prompt.size(), 10u);
  for (const int32_t truncate : {0, 7}) {
    req.set_truncate_prompt_tokens(truncate);
    const std::vector<int32_t> want =
        truncate == 0 ? prompt : std::vector<int32_t>(prompt.end() - truncate, prompt.end());
    StreamResult r = RunGenerate(server.stub(), req);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    std::vector<int> seen(3, 0);
    for (const v1::GenerateResponse& msg : r.messages) {
      ASSERT_LT(msg.index(), 3);
      const std::vector<int32_t> got(msg.prompt_token_ids().begin(), msg.prompt_token_ids().end());
      EXPECT_EQ(got, seen[msg.index()]++ == 0 ? want : std::vector<int32_t>())
          << "completion " << msg.index();
    }
    for (int i = 0; i < 3; ++i) EXPECT_GT(seen[i], 0) << i;
  }
  // Not asked for: none.
  req.mutable_response()->set_prompt_token_ids(false);
  StreamResult r = RunGenerate(server.stub(), req);
  ASSERT_TRUE(r.status.ok());
  for (const v1::GenerateResponse& msg : r.messages) EXPECT_EQ(msg.prompt_token_ids_size(), 0);
}

// n completions: each streams under its index and finishes once; completion i is the one a
// single request with seed + i gives; the prompt is prefilled once (the others attach its
// cached blocks: every full block before the one holding the prompt's last token).
TEST(E2eParallelSamplingTest, NCompletionsShareThePromptPrefill) {
  TestServer server(Options(4));
  std::mt19937 rng(4242);
  v1::GenerateRequest req;
  for (int i = 0; i < 70; ++i) req.mutable_token_ids()->add_ids(static_cast<int32_t>(rng() % 900) + 20);
  req.mutable_stopping()->set_max_new_tokens(12);
  req.mutable_stopping()->set_ignore_eos(true);
  req.mutable_sampling()->set_temperature(0.9f);
  req.mutable_sampling()->set_seed(77);
  req.set_n(3);
  StreamResult r = RunGenerate(server.stub(), req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  const Completions c = ByIndex(r, 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(c.finishes[i], 1) << i;
    EXPECT_EQ(c.tokens[i].size(), 12u) << i;
    EXPECT_EQ(c.finished[i].reason(), v1::FINISH_REASON_LENGTH) << i;
    EXPECT_EQ(c.finished[i].usage().prompt_tokens(), 70) << i;
  }
  EXPECT_EQ(c.finished[0].usage().cached_prompt_tokens(), 0);
  EXPECT_EQ(c.finished[1].usage().cached_prompt_tokens(), 64);
  EXPECT_EQ(c.finished[2].usage().cached_prompt_tokens(), 64);
  EXPECT_TRUE(c.tokens[0] != c.tokens[1] || c.tokens[1] != c.tokens[2]);
  // Each completion's first message reports its prompt as its end will (prompt_usage), later
  // messages do not.
  std::vector<int> seen(3, 0);
  for (const v1::GenerateResponse& m : r.messages) {
    ASSERT_GE(m.index(), 0);
    ASSERT_LT(m.index(), 3);
    if (seen[m.index()]++ > 0) {
      EXPECT_FALSE(m.has_prompt_usage()) << "completion " << m.index();
      continue;
    }
    ASSERT_TRUE(m.has_prompt_usage()) << "completion " << m.index();
    const v1::Usage& end = c.finished[m.index()].usage();
    EXPECT_EQ(m.prompt_usage().prompt_tokens(), end.prompt_tokens());
    EXPECT_EQ(m.prompt_usage().cached_prompt_tokens(), end.cached_prompt_tokens());
    EXPECT_EQ(m.prompt_usage().completion_tokens(), 0);
  }
  // Completion i is seed + i's.
  for (int i = 0; i < 3; ++i) {
    v1::GenerateRequest one = req;
    one.set_n(1);
    one.mutable_sampling()->set_seed(77 + i);
    StreamResult single = RunGenerate(server.stub(), one);
    ASSERT_TRUE(single.status.ok()) << single.status.error_message();
    EXPECT_EQ(single.tokens, c.tokens[i]) << "completion " << i;
    for (const auto& m : single.messages) EXPECT_EQ(m.index(), 0);
  }
  // Greedy: n identical completions.
  req.mutable_sampling()->set_temperature(0);
  req.set_n(2);
  const Completions g = ByIndex(RunGenerate(server.stub(), req), 2);
  EXPECT_EQ(g.tokens[0], g.tokens[1]);
  ASSERT_TRUE(server.engine().WaitIdle(absl::Seconds(10)));
  EXPECT_EQ(server.engine().Stats().slots_in_use, 0);
}

TEST(E2eParallelSamplingTest, NOutOfRangeIsInvalidArgumentNamingTheField) {
  TestServer server(Options(1));
  for (int n : {-1, 17, std::numeric_limits<int32_t>::max()}) {
    v1::GenerateRequest req = TextRequest("hello", 4);
    req.set_n(n);
    StreamResult r = RunGenerate(server.stub(), req);
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << n;
    EXPECT_TRUE(absl::StartsWith(r.status.error_message(), "n:")) << r.status.error_message();
  }
}

// A call admitted with n > 1 is served whole: its other completions are not refused because the
// queue filled up meanwhile (here: one slot, room for one waiting request).
TEST(E2eParallelSamplingTest, TheOtherCompletionsAreNotRefusedByAFullQueue) {
  TestServer server(Options(1, /*max_queue=*/1));
  v1::GenerateRequest req = TextRequest("All of them, please", 8);
  req.mutable_stopping()->set_ignore_eos(true);
  req.mutable_sampling()->set_temperature(0.7f);
  req.set_n(4);
  StreamResult r = RunGenerate(server.stub(), req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  const Completions c = ByIndex(r, 4);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(c.finished[i].reason(), v1::FINISH_REASON_LENGTH)
        << i << ": " << c.finished[i].error();
    EXPECT_EQ(c.tokens[i].size(), 8u) << i;
  }
}

// Cancelling an n = 4 call ends every completion, submitted or not: nothing goes on generating
// (each would run to 450 tokens; together they stop after a few: how many depends on how soon
// the cancel reaches the engine, tens of steps on a loaded machine, hence the long requests).
TEST(E2eParallelSamplingTest, CancellingTheCallEndsEveryCompletion) {
  EngineOptions o = Options(2);
  o.max_new_tokens = 450;
  TestServer server(o);
  for (int reads : {0, 1, 6}) {
    const uint64_t tokens_before = server.engine().Stats().tokens_generated_total;
    grpc::ClientContext ctx;
    v1::GenerateRequest req = TextRequest("Four completions, then a cancel", 450);
    req.mutable_stopping()->set_ignore_eos(true);
    req.mutable_sampling()->set_temperature(1.0f);
    req.set_n(4);
    auto reader = server.stub().Generate(&ctx, req);
    v1::GenerateResponse msg;
    for (int i = 0; i < reads; ++i) ASSERT_TRUE(reader->Read(&msg));
    ctx.TryCancel();
    while (reader->Read(&msg)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED) << reads;
    ASSERT_TRUE(server.engine().WaitIdle(absl::Seconds(20))) << reads;
    const EngineStats s = server.engine().Stats();
    EXPECT_EQ(s.slots_in_use, 0) << reads;
    EXPECT_EQ(s.queue_depth, 0) << reads;
    // One completion left running alone would have produced 450.
    EXPECT_LT(s.tokens_generated_total - tokens_before, 450u) << reads;
  }
}

// A drain's CancelAll that finds an n = 4 call's first completion still queued ends the whole
// call: the other three, submitted only at the first one's end, end cancelled too instead of
// running to their length through the drain (each would make 200 tokens).
TEST(E2eParallelSamplingTest, CancelAllBeforeTheFirstTokenEndsEveryCompletion) {
  TestServer server(Options(1));
  grpc::ClientContext blocker_ctx;
  v1::GenerateRequest blocker = TextRequest("Holding the only slot", 200);
  blocker.mutable_stopping()->set_ignore_eos(true);
  auto blocker_reader = server.stub().Generate(&blocker_ctx, blocker);
  v1::GenerateResponse msg;
  ASSERT_TRUE(blocker_reader->Read(&msg));

  v1::GenerateRequest req = TextRequest("Four completions, queued", 200);
  req.mutable_stopping()->set_ignore_eos(true);
  req.mutable_sampling()->set_temperature(1.0f);
  req.set_n(4);
  StreamResult r;
  std::thread call([&] { r = RunGenerate(server.stub(), req); });
  const absl::Time deadline = absl::Now() + absl::Seconds(20 * TestTimeoutScale());
  while (server.engine().Stats().queue_depth < 1 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  ASSERT_GE(server.engine().Stats().queue_depth, 1) << "the call's first completion waits";
  const uint64_t tokens_before = server.engine().Stats().tokens_generated_total;
  server.engine().BeginDrain();
  server.engine().CancelAll();
  call.join();
  while (blocker_reader->Read(&msg)) {
  }
  blocker_reader->Finish();
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  const Completions c = ByIndex(r, 4);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(c.finishes[i], 1) << i;
    EXPECT_EQ(c.finished[i].reason(), v1::FINISH_REASON_CANCELLED) << i;
  }
  ASSERT_TRUE(server.engine().WaitIdle(absl::Seconds(10 * TestTimeoutScale())));
  EXPECT_LT(server.engine().Stats().tokens_generated_total - tokens_before, 150u);
}

// With one slot: a cancelled stream frees it for the next request, and its blocks are returned.
TEST(E2eCancelTest, CancelledStreamFreesItsSlot) {
  TestServer server(Options(1));
  grpc::ClientContext ctx;
  v1::GenerateRequest req = TextRequest("This will be cancelled", 200);
  req.mutable_stopping()->set_ignore_eos(true);
  auto reader = server.stub().Generate(&ctx, req);
  v1::GenerateResponse msg;
  ASSERT_TRUE(reader->Read(&msg));
  ASSERT_TRUE(reader->Read(&msg));
  ctx.TryCancel();
  while (reader->Read(&msg)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  // The next request gets the single slot and completes.
  StreamResult r = RunGenerate(server.stub(), TextRequest("Next in line", 5));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.finished.usage().completion_tokens() > 0, true);
  ASSERT_TRUE(server.engine().WaitIdle(absl::Seconds(10)));
  const EngineStats s = server.engine().Stats();
  EXPECT_EQ(s.slots_in_use, 0);
  EXPECT_EQ(s.kv.blocks_used, 0);
}

// Beyond the queue bound a request is refused at once with RESOURCE_EXHAUSTED and a retry hint.
TEST(E2eOverloadTest, FullQueueGetsResourceExhaustedAtOnce) {
  TestServer server(Options(1, /*max_queue=*/1));
  std::vector<std::thread> threads;
  std::atomic<int> ok{0}, exhausted{0}, other{0};
  for (int i = 0; i < 12; ++i) {
    threads.emplace_back([&] {
      v1::GenerateRequest req = TextRequest("overload", 40);
      req.mutable_stopping()->set_ignore_eos(true);
      StreamResult r = RunGenerate(server.stub(), req);
      if (r.status.ok()) {
        ++ok;
      } else if (r.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
        ++exhausted;
        EXPECT_EQ(r.trailers.count("retry-after-ms"), 1u) << r.status.error_message();
      } else {
        ++other;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_GE(ok.load(), 1);
  EXPECT_GE(exhausted.load(), 1);
  EXPECT_EQ(other.load(), 0);
  EXPECT_EQ(ok.load() + exhausted.load(), 12);
}

// A time limit ends the stream with TIME_LIMIT and the tokens produced so far. The tiny model
// decodes ~0.1 ms a token here, so 480 tokens take several times the 5 ms limit.
TEST(E2eTimeLimitTest, TimeLimitEndsTheStream) {
  EngineOptions o = Options(1);
  o.max_new_tokens = 480;
  TestServer server(o);
  v1::GenerateRequest req = TextRequest("Slow and long", 480);
  req.mutable_stopping()->set_ignore_eos(true);
  req.mutable_stopping()->set_time_limit_ms(5);
  StreamResult r = RunGenerate(server.stub(), req);
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.finished.reason(), v1::FINISH_REASON_TIME_LIMIT);
  EXPECT_LT(r.finished.usage().completion_tokens(), 480);
  EXPECT_EQ(r.finished.usage().completion_tokens(), static_cast<int32_t>(r.tokens.size()));
}

}  // namespace
}  // namespace kvrm
