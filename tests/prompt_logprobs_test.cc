// Prompt logprobs (GenerationRequest::prompt_logprobs, ResponseOptions.prompt_logprobs): every
// prompt token scored after the tokens before it, against the float64 reference Llama's
// log-softmax; prefilled whole (never from the prefix cache) in chunks that return every row's
// logits, beside decoding requests whose tokens they do not change; through the gRPC service
// with n > 1 and bad values.
#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/logging.h"
#include "gtest/gtest.h"
#include "runtime/engine.h"
#include "runtime/model_bundle.h"
#include "tests/reference_llama.h"
#include "tests/test_server.h"

namespace kvrm {
namespace {

// A finished request: its tokens, prompt logprobs, finish, and the chunks that carried them.
struct Scored {
  std::vector<int32_t> tokens;
  std::vector<TokenLogprobs> prompt;
  int chunks_with_prompt_logprobs = 0;
  FinishInfo info;
};

Scored Read(CollectingSink& sink) {
  Scored out;
  out.tokens = sink.Wait(&out.info);
  out.prompt = sink.stream().prompt_logprobs;
  out.chunks_with_prompt_logprobs = sink.prompt_logprob_chunks();
  return out;
}

std::shared_ptr<CollectingSink> Submit(Engine& engine, const std::vector<int32_t>& prompt,
                                       int32_t prompt_logprobs, int32_t max_new_tokens = 8) {
  auto r = std::make_unique<GenerationRequest>();
  r->request_id = "plp";
  r->prompt = prompt;
  r->max_new_tokens = max_new_tokens;
  r->ignore_eos = true;
  r->prompt_logprobs = prompt_logprobs;
  r->arrival = absl::Now();
  auto sink = std::make_shared<CollectingSink>();
  r->sink = sink;
  CHECK_OK(engine.Submit(std::move(r)).status());
  return sink;
}

// The entries against the reference: entry t (t >= 1) is log_softmax(logits after t - 1)[prompt
// t], its rank, and the top entries in order. Tolerance: 1e-4 on a log-probability (the logits
// agree to ~1e-6 of their scale on this model, forward_test).
void ExpectMatchesReference(const std::vector<TokenLogprobs>& got,
                            const std::vector<int32_t>& prompt,
                            const std::vector<std::vector<double>>& logits, int32_t top) {
  ASSERT_EQ(got.size(), prompt.size());
  EXPECT_EQ(got[0].token, prompt[0]);
  EXPECT_EQ(got[0].logprob, 0.0f);
  EXPECT_EQ(got[0].num_top, 0);
  double worst = 0;
  for (size_t t = 1; t < prompt.size(); ++t) {
    const std::vector<double>& row = logits[t - 1];
    double max = row[0];
    for (double x : row) max = std::max(max, x);
    double total = 0;
    for (double x : row) total += std::exp(x - max);
    const double log_z = max + std::log(total);
    EXPECT_EQ(got[t].token, prompt[t]);
    worst = std::max(worst, std::abs(got[t].logprob - (row[prompt[t]] - log_z)));
    int32_t rank = 1;
    for (double x : row) rank += x > row[prompt[t]];
    EXPECT_EQ(got[t].rank, rank) << "position " << t;
    std::vector<int32_t> order(row.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return row[a] > row[b]; });
    ASSERT_EQ(got[t].num_top, top) << "position " << t;
    for (int32_t j = 0; j < top; ++j) {
      EXPECT_EQ(got[t].top_ids[j], order[j]) << "position " << t << " rank " << j;
      worst = std::max(worst, std::abs(got[t].top_logprobs[j] - (row[order[j]] - log_z)));
    }
  }
  EXPECT_LE(worst, 1e-4);
  std::printf("prompt logprobs: %zu positions, max |logprob - float64 reference| %.2e\n",
              prompt.size() - 1, worst);
}

class PromptLogprobsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_ = LoadTinyModel(); }
  static void TearDownTestSuite() { delete model_; }
  static ModelBundle* model_;
};
ModelBundle* PromptLogprobsTest::model_ = nullptr;

TEST_F(PromptLogprobsTest, ScoresEveryPromptTokenAsTheFloat64ReferenceDoesNeverFromTheCache) {
  absl::StatusOr<std::unique_ptr<ReferenceLlama>> ref =
      ReferenceLlama::Create(model_->config, *model_->files);
  ASSERT_TRUE(ref.ok()) << ref.status();
  std::mt19937 rng(8);
  std::vector<int32_t> prompt(87);  // three chunks of at most 32 rows
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % model_->config.vocab_size);
  const std::vector<std::vector<double>> want = (*ref)->Forward(prompt);

  EngineOptions o;
  o.slots = 3;
  o.threads = 2;
  o.prefill_chunk = 64;
  o.block_tokens = 16;
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(model_, o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  (*engine)->Start();
  // A request decoding alongside, before and after: its tokens are those of a run alone.
  std::vector<int32_t> other(40);
  for (int32_t& t : other) t = static_cast<int32_t>(rng() % model_->config.vocab_size);
  const std::vector<int32_t> alone = Read(*Submit(**engine, other, -1, 30)).tokens;
  // The prompt is cached first by a plain request; the scored one must not take it from there.
  Read(*Submit(**engine, prompt, -1));
  const uint64_t hits_before = (*engine)->Stats().prefix_cache_hits_total;
  auto beside_sink = Submit(**engine, other, -1, 30);
  const Scored scored = Read(*Submit(**engine, prompt, 5));
  const Scored beside = Read(*beside_sink);
  EXPECT_EQ(beside.tokens, alone);
  EXPECT_EQ(scored.chunks_with_prompt_logprobs, 1);
  ExpectMatchesReference(scored.prompt, prompt, want, 5);
  EXPECT_EQ(scored.info.cached_prompt_tokens, 0);
  // A plain request for the same prompt still hits the cache (the scored one registered too).
  const Scored plain = Read(*Submit(**engine, prompt, -1));
  EXPECT_GT((*engine)->Stats().prefix_cache_hits_total, hits_before);
  EXPECT_GT(plain.info.cached_prompt_tokens, 0);
  EXPECT_EQ(plain.chunks_with_prompt_logprobs, 0);
  // Its first tokens are the scored one's (scoring changes nothing of the generation).
  EXPECT_EQ(plain.tokens, scored.tokens);
  // A one-token prompt: one unscored entry. No alternatives asked: none given.
  ASSERT_EQ(Read(*Submit(**engine, {prompt[0]}, 0)).prompt.size(), 1u);
  ExpectMatchesReference(Read(*Submit(**engine, prompt, 0)).prompt, prompt, want, 0);
}

TEST_F(PromptLogprobsTest, OutOfRangeIsRefused) {
  EngineOptions o;
  o.slots = 1;
  o.threads = 2;
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(model_, o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto r = std::make_unique<GenerationRequest>();
  r->prompt = {1, 2, 3};
  r->prompt_logprobs = 21;
  r->sink = std::make_shared<CollectingSink>();
  const absl::Status st = (*engine)->Submit(std::move(r)).status();
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_NE(st.message().find("prompt_logprobs"), std::string::npos) << st;
}

// Through the service: the first message of completion 0 carries one entry per prompt token
// (the text's tokens, BOS included), the other completions none; the entries' alternatives
// carry their text; a bad count is INVALID_ARGUMENT naming the field.
TEST(PromptLogprobsServiceTest, CompletionZeroCarriesThePromptsScores) {
  EngineOptions o;
  o.slots = 2;
  o.threads = 2;
  TestServer server(o);
  v1::GenerateRequest req = TextRequest("The quick brown fox jumps over the lazy dog", 4);
  req.set_n(2);
  req.mutable_response()->set_prompt_top_logprobs(2);
  const StreamResult r = RunGenerate(server.stub(), req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  v1::TokenizeRequest treq;
  treq.set_text("The quick brown fox jumps over the lazy dog");
  treq.set_add_bos(true);
  grpc::ClientContext ctx;
  v1::TokenizeResponse tok;
  ASSERT_TRUE(server.stub().Tokenize(&ctx, treq, &tok).ok());
  int with = 0;
  for (const v1::GenerateResponse& m : r.messages) {
    if (m.prompt_logprobs_size() == 0) continue;
    ++with;
    EXPECT_EQ(m.index(), 0);
    ASSERT_EQ(m.prompt_logprobs_size(), tok.token_ids_size());
    for (int i = 0; i < m.prompt_logprobs_size(); ++i) {
      const v1::TokenLogprob& e = m.prompt_logprobs(i);
      EXPECT_EQ(e.token_id(), tok.token_ids(i));
      if (i == 0) {
        EXPECT_EQ(e.top_size(), 0);
        continue;
      }
      EXPECT_LT(e.logprob(), 0.0f);
      EXPECT_GE(e.rank(), 1);
      ASSERT_EQ(e.top_size(), 2);
      EXPECT_GE(e.top(0).logprob(), e.top(1).logprob());
      EXPECT_GE(e.top(0).logprob(), e.logprob());
      EXPECT_FALSE(e.top(0).text().empty() && e.top(1).text().empty());
    }
  }
  EXPECT_EQ(with, 1);

  v1::GenerateRequest bad = TextRequest("hello", 2);
  bad.mutable_response()->set_prompt_top_logprobs(21);
  const StreamResult b = RunGenerate(server.stub(), bad);
  EXPECT_EQ(b.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(b.status.error_message().find("response.prompt_top_logprobs"), std::string::npos)
      << b.status.error_message();
}

}  // namespace
}  // namespace kvrm
