// Beam search end to end (GenerateRequest.beam_search): width 1 is greedy decoding; each beam's
// cumulative logprob is what the model gives its tokens (scored independently, as prompt
// logprobs of the prompt and the beam); beams come best first; what beam search cannot honour
// is refused by name; and nothing is left running.
#include "server/beam_search.h"

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/test_server.h"

namespace kvrm {
namespace {

EngineOptions Options() {
  EngineOptions o;
  o.slots = 4;
  o.max_new_tokens = 64;
  o.prefill_chunk = 32;
  o.threads = 2;
  o.kv_mode = KvMode::kKvrm;
  return o;
}

v1::GenerateRequest BeamRequest(int width, int max_tokens) {
  v1::GenerateRequest req;
  for (int32_t t : {17, 250, 31, 402, 99, 7, 123}) req.mutable_token_ids()->add_ids(t);
  req.mutable_stopping()->set_max_new_tokens(max_tokens);
  req.mutable_sampling()->set_temperature(0);
  req.set_n(width);
  req.mutable_beam_search();
  return req;
}

// The model's logprob of each token of `continuation` after `prompt` (its raw distribution:
// prompt logprobs of the joined sequence).
std::vector<double> Scored(TestServer& server, const std::vector<int32_t>& prompt,
                           const std::vector<int32_t>& continuation) {
  v1::GenerateRequest req;
  for (int32_t t : prompt) req.mutable_token_ids()->add_ids(t);
  for (int32_t t : continuation) req.mutable_token_ids()->add_ids(t);
  req.mutable_stopping()->set_max_new_tokens(1);
  req.mutable_sampling()->set_temperature(0);
  req.mutable_response()->set_prompt_logprobs(true);
  StreamResult r = RunGenerate(server.stub(), req);
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  std::vector<double> out;
  for (const v1::GenerateResponse& m : r.messages) {
    for (int i = 0; i < m.prompt_logprobs_size(); ++i) {
      if (i >= static_cast<int>(prompt.size())) out.push_back(m.prompt_logprobs(i).logprob());
    }
  }
  return out;
}

struct Completion {
  std::vector<int32_t> tokens;
  v1::Finished finished;
  int messages = 0;
};

std::vector<Completion> ByIndex(const StreamResult& r, int n) {
  std::vector<Completion> out(n);
  for (const v1::GenerateResponse& m : r.messages) {
    EXPECT_GE(m.index(), 0);
    EXPECT_LT(m.index(), n);
    if (m.index() < 0 || m.index() >= n) continue;
    Completion& c = out[m.index()];
    ++c.messages;
    c.tokens.insert(c.tokens.end(), m.token_ids().begin(), m.token_ids().end());
    if (m.has_finished()) c.finished = m.finished();
  }
  return out;
}

TEST(BeamSearchE2eTest, WidthOneIsGreedyDecoding) {
  TestServer server(Options());
  v1::GenerateRequest beam = BeamRequest(1, 10);
  beam.mutable_stopping()->set_ignore_eos(true);
  StreamResult b = RunGenerate(server.stub(), beam);
  ASSERT_TRUE(b.status.ok()) << b.status.error_message();
  v1::GenerateRequest greedy = beam;
  greedy.clear_beam_search();
  StreamResult g = RunGenerate(server.stub(), greedy);
  ASSERT_TRUE(g.status.ok());
  EXPECT_EQ(b.tokens, g.tokens);
  EXPECT_EQ(b.finished.reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(b.finished.usage().completion_tokens(), 10);
  EXPECT_EQ(b.finished.usage().prompt_tokens(), 7);
  EXPECT_EQ(b.text, g.text);
}

// Four beams: each is what the model scores it, they come best first by vLLM's score, they
// differ, and the best scores at least as well as greedy decoding's sequence.
TEST(BeamSearchE2eTest, BeamsAreScoredByTheModelAndComeBestFirst) {
  TestServer server(Options());
  constexpr int kWidth = 4, kTokens = 6;
  v1::GenerateRequest req = BeamRequest(kWidth, kTokens);
  req.mutable_stopping()->set_ignore_eos(true);  // every beam kTokens long: scores compare sums
  StreamResult r = RunGenerate(server.stub(), req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  const std::vector<Completion> beams = ByIndex(r, kWidth);
  const std::vector<int32_t> prompt(req.token_ids().ids().begin(), req.token_ids().ids().end());
  double previous = 0;
  for (int i = 0; i < kWidth; ++i) {
    const Completion& c = beams[i];
    EXPECT_EQ(c.messages, 1) << "a beam comes whole in one message";
    ASSERT_EQ(c.tokens.size(), static_cast<size_t>(kTokens)) << i;
    EXPECT_EQ(c.finished.reason(), v1::FINISH_REASON_LENGTH);
    const std::vector<double> lp = Scored(server, prompt, c.tokens);
    ASSERT_EQ(lp.size(), c.tokens.size());
    double sum = 0;
    for (double x : lp) sum += x;
    // float32 logprobs summed: 1e-4 a token.
    EXPECT_NEAR(c.finished.cumulative_logprob(), sum, 1e-4 * kTokens) << "beam " << i;
    if (i > 0) {
      EXPECT_LE(c.finished.cumulative_logprob(), previous + 1e-9) << "best first";
    }
    previous = c.finished.cumulative_logprob();
    for (int j = 0; j < i; ++j) EXPECT_NE(c.tokens, beams[j].tokens) << i << " " << j;
  }
  v1::GenerateRequest greedy = req;
  greedy.clear_beam_search();
  greedy.set_n(1);
  StreamResult g = RunGenerate(server.stub(), greedy);
  ASSERT_TRUE(g.status.ok());
  double greedy_sum = 0;
  for (double x : Scored(server, prompt, g.tokens)) greedy_sum += x;
  EXPECT_GE(beams[0].finished.cumulative_logprob(), greedy_sum - 1e-4 * kTokens)
      << "four beams find a sequence at least as likely as greedy's";
  ASSERT_TRUE(server.engine().WaitIdle(absl::Seconds(10)));
  EXPECT_EQ(server.engine().Stats().slots_in_use, 0);
}

// With end tokens: a beam that reaches one ends there (EOS), its text without it; the scores
// follow vLLM's length penalty.
TEST(BeamSearchE2eTest, EndedBeamsAndTheLengthPenalty) {
  TestServer server(Options());
  const std::vector<int32_t> eos = server.model().config.eos_token_ids;
  ASSERT_FALSE(eos.empty());
  v1::GenerateRequest req = BeamRequest(3, 12);
  // Favour the end token enough that beams end, through the scores beam search reads.
  (*req.mutable_sampling()->mutable_logit_bias())[eos[0]] = 20.0f;
  req.mutable_beam_search()->set_length_penalty(0.5f);
  StreamResult r = RunGenerate(server.stub(), req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  const std::vector<Completion> beams = ByIndex(r, 3);
  BeamSearchConfig config;
  config.width = 3;
  config.length_penalty = 0.5;
  config.prompt_tokens = 7;
  config.eos_ids = eos;
  int ended = 0;
  double previous = 0;
  for (int i = 0; i < 3; ++i) {
    const Completion& c = beams[i];
    ASSERT_FALSE(c.tokens.empty());
    Beam b;
    b.tokens = c.tokens;
    b.cum_logprob = c.finished.cumulative_logprob();
    b.ended = c.finished.reason() == v1::FINISH_REASON_EOS;
    if (b.ended) {
      ++ended;
      EXPECT_EQ(c.tokens.back(), eos[0]) << "an ended beam's last token is its end";
    } else {
      EXPECT_EQ(c.tokens.size(), 12u);
    }
    const double score = BeamScore(b, config);
    if (i > 0) {
      EXPECT_LE(score, previous + 1e-9) << "best first by score";
    }
    previous = score;
  }
  EXPECT_GE(ended, 1) << "a strongly favoured end token ends some beam";
}

// At the context's end a beam stops as a sampled completion does (LENGTH), not with an error.
TEST(BeamSearchE2eTest, TheContextsEndEndsTheBeamsAsItEndsGreedyDecoding) {
  EngineOptions o = Options();
  o.max_context = 64;
  TestServer server(o);
  v1::GenerateRequest beam = BeamRequest(1, 20);
  beam.clear_token_ids();
  for (int i = 0; i < 61; ++i) beam.mutable_token_ids()->add_ids(20 + (i * 37) % 400);
  beam.mutable_stopping()->set_ignore_eos(true);
  StreamResult b = RunGenerate(server.stub(), beam);
  ASSERT_TRUE(b.status.ok()) << b.status.error_message();
  v1::GenerateRequest greedy = beam;
  greedy.clear_beam_search();
  StreamResult g = RunGenerate(server.stub(), greedy);
  ASSERT_TRUE(g.status.ok());
  EXPECT_EQ(b.finished.reason(), v1::FINISH_REASON_LENGTH) << b.finished.error();
  EXPECT_EQ(b.tokens, g.tokens);
  EXPECT_EQ(b.tokens.size(), 3u) << "61 prompt tokens in a context of 64";
}

// A client that leaves ends the search: its running step's requests are cancelled, nothing is
// left running.
TEST(BeamSearchE2eTest, AClientThatLeavesEndsTheSearch) {
  EngineOptions o = Options();
  o.slots = 1;  // the step's requests queue behind each other
  TestServer server(o);
  v1::GenerateRequest req = BeamRequest(4, 60);
  req.mutable_stopping()->set_ignore_eos(true);
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
      server.stub().Generate(&ctx, req);
  absl::SleepFor(absl::Milliseconds(150));
  ctx.TryCancel();
  v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  ASSERT_TRUE(server.engine().WaitIdle(absl::Seconds(10)));
  EXPECT_EQ(server.engine().Stats().slots_in_use, 0);
  // The server goes on serving.
  StreamResult after = RunGenerate(server.stub(), BeamRequest(2, 3));
  EXPECT_TRUE(after.status.ok()) << after.status.error_message();
}

TEST(BeamSearchE2eTest, WhatBeamSearchCannotHonourIsRefusedByName) {
  TestServer server(Options());
  auto refused = [&](const std::function<void(v1::GenerateRequest&)>& change,
                     const std::string& field) {
    v1::GenerateRequest req = BeamRequest(2, 4);
    change(req);
    StreamResult r = RunGenerate(server.stub(), req);
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << field;
    EXPECT_EQ(r.status.error_message().rfind(field + ":", 0), 0u) << r.status.error_message();
  };
  refused([](v1::GenerateRequest& r) { r.set_n(11); }, "n");
  refused([](v1::GenerateRequest& r) { r.mutable_sampling()->set_top_p(0.9f); }, "sampling.top_p");
  refused([](v1::GenerateRequest& r) { r.mutable_sampling()->set_top_k(5); }, "sampling.top_k");
  refused([](v1::GenerateRequest& r) { r.mutable_sampling()->set_presence_penalty(1); },
          "sampling.presence_penalty");
  refused([](v1::GenerateRequest& r) { r.mutable_stopping()->add_stop_sequences("x"); },
          "stopping.stop_sequences");
  refused([](v1::GenerateRequest& r) { r.mutable_response()->set_logprobs(true); },
          "response.logprobs");
  refused(
      [](v1::GenerateRequest& r) {
        r.mutable_beam_search()->set_length_penalty(std::numeric_limits<float>::infinity());
      },
      "beam_search.length_penalty");
  refused([](v1::GenerateRequest& r) { r.mutable_structured()->set_json_object(true); },
          "structured");
  refused(
      [](v1::GenerateRequest& r) {
        v1::ChatMessage* m = r.mutable_chat()->add_messages();
        m->set_role("user");
        m->set_content("Hi");
        r.mutable_chat()->set_thinking_budget(8);
      },
      "chat.thinking_budget");
}

}  // namespace
}  // namespace kvrm
