// The thinking budget (GenerationRequest::thinking_budget; vLLM's thinking_token_budget,
// Anthropic's thinking.budget_tokens) in the engine: once a reply has spent its budget inside
// its thinking blocks, the block's end is forced and the reply goes on after it. Each output is
// checked against a reference built outside the engine: every unforced token is the tiny model's
// greedy next token after what came before (one-token requests), and the budget's state machine
// is the test's own. The markers are the model's own greedy tokens, so that blocks open and close
// where the model writes them.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/logging.h"
#include "gtest/gtest.h"
#include "runtime/engine.h"
#include "runtime/model_bundle.h"
#include "tests/test_server.h"

namespace kvrm {
namespace {

struct Output {
  std::vector<int32_t> tokens;
  std::vector<TokenLogprobs> logprobs;
  FinishInfo info;
};

class ThinkingBudgetTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_ = LoadTinyModel(); }
  static void TearDownTestSuite() { delete model_; }

  void SetUp() override { engine_ = MakeEngine(0); }

  static std::unique_ptr<Engine> MakeEngine(int32_t speculative_tokens) {
    EngineOptions o;
    o.slots = 4;
    o.prefill_chunk = 32;
    o.max_new_tokens = 64;
    o.max_context = 256;
    o.threads = 2;
    o.speculative_tokens = speculative_tokens;
    absl::StatusOr<std::unique_ptr<Engine>> created = Engine::Create(model_, o);
    CHECK_OK(created.status());
    (*created)->Start();
    return std::move(*created);
  }

  static std::unique_ptr<GenerationRequest> Request(std::vector<int32_t> prompt,
                                                    int32_t max_new_tokens) {
    auto r = std::make_unique<GenerationRequest>();
    r->request_id = "think";
    r->prompt = std::move(prompt);
    r->max_new_tokens = max_new_tokens;
    r->ignore_eos = true;
    return r;
  }

  static Output Run(Engine& engine, std::unique_ptr<GenerationRequest> r) {
    auto sink = std::make_shared<CollectingSink>();
    r->sink = sink;
    r->arrival = absl::Now();
    absl::StatusOr<uint64_t> handle = engine.Submit(std::move(r));
    CHECK_OK(handle.status());
    Output out;
    out.tokens = sink->Wait(&out.info);
    out.logprobs = sink->stream().logprobs;
    return out;
  }

  Output Generate(const std::vector<int32_t>& prompt, int32_t max_new_tokens,
                  const ThinkingBudget& budget, Engine* engine = nullptr) {
    std::unique_ptr<GenerationRequest> r = Request(prompt, max_new_tokens);
    r->thinking_budget = budget;
    return Run(engine != nullptr ? *engine : *engine_, std::move(r));
  }

  // The model's greedy next token after `tokens`.
  int32_t NextGreedy(const std::vector<int32_t>& tokens) {
    const Output out = Run(*engine_, Request(tokens, 1));
    CHECK(out.tokens.size() == 1);
    return out.tokens[0];
  }

  static bool EndsWith(const std::vector<int32_t>& seq, const std::vector<int32_t>& tail,
                       size_t tail_len) {
    if (tail_len == 0 || seq.size() < tail_len) return false;
    return std::equal(tail.begin(), tail.begin() + tail_len, seq.end() - tail_len);
  }

  // What a greedy reply with `budget` must be: the budget's rules applied to the model's greedy
  // tokens one at a time.
  std::vector<int32_t> Reference(const std::vector<int32_t>& prompt, int32_t max_new_tokens,
                                 const ThinkingBudget& b) {
    std::vector<int32_t> seq = prompt;
    std::vector<int32_t> out;
    bool inside = b.starts_inside;
    int32_t spent = 0;
    int32_t forcing = inside && b.max_tokens == 0 ? 0 : -1;
    while (static_cast<int32_t>(out.size()) < max_new_tokens) {
      const int32_t t = forcing >= 0 ? b.forced[forcing] : NextGreedy(seq);
      seq.push_back(t);
      out.push_back(t);
      if (forcing >= 0) {
        if (++forcing == static_cast<int32_t>(b.forced.size())) {
          forcing = -1;
          inside = false;
        }
        continue;
      }
      if (inside) {
        ++spent;
        if (EndsWith(seq, b.end, b.end.size())) {
          inside = false;
          continue;
        }
      } else {
        inside = EndsWith(seq, b.start, b.start.size());
      }
      if (inside && spent >= b.max_tokens) {
        forcing = 0;
        for (size_t k = std::min<size_t>(b.forced.size() - 1, spent); k > 0; --k) {
          if (EndsWith(seq, b.forced, k)) {
            forcing = static_cast<int32_t>(k);
            break;
          }
        }
      }
    }
    return out;
  }

  // Tokens the tiny model's greedy reply to kPrompt does not contain (markers that never occur).
  std::vector<int32_t> Absent(const std::vector<int32_t>& reply, int n) {
    std::vector<int32_t> out;
    for (int32_t id = 7; static_cast<int>(out.size()) < n; id += 13) {
      if (std::find(reply.begin(), reply.end(), id) == reply.end()) out.push_back(id);
    }
    return out;
  }

  const std::vector<int32_t> kPrompt = {1, 412, 77, 905, 33, 1000, 5, 618, 240, 19, 870, 3};
  static ModelBundle* model_;
  std::unique_ptr<Engine> engine_;
};
ModelBundle* ThinkingBudgetTest::model_ = nullptr;

TEST_F(ThinkingBudgetTest, ForcesTheEndWhenTheBudgetIsSpent) {
  const std::vector<int32_t> g = Generate(kPrompt, 20, ThinkingBudget{}).tokens;
  ASSERT_EQ(g.size(), 20u);
  const std::vector<int32_t> markers = Absent(g, 3);
  for (int32_t spend : {0, 1, 5, 12}) {
    ThinkingBudget b;
    b.max_tokens = spend;
    b.start = {markers[0]};
    b.end = b.forced = {markers[1], markers[2]};
    b.starts_inside = true;
    const Output out = Generate(kPrompt, 20, b);
    ASSERT_EQ(out.tokens.size(), 20u) << spend;
    // The budget's tokens are the model's own, then the end is written whole.
    EXPECT_EQ(std::vector<int32_t>(out.tokens.begin(), out.tokens.begin() + spend),
              std::vector<int32_t>(g.begin(), g.begin() + spend))
        << spend;
    EXPECT_EQ(out.tokens[spend], markers[1]) << spend;
    EXPECT_EQ(out.tokens[spend + 1], markers[2]) << spend;
    EXPECT_EQ(out.tokens, Reference(kPrompt, 20, b)) << spend;
    EXPECT_EQ(out.info.reason, FinishReason::kLength);
  }
  // Each budget ended one block (kvrm:thinking_budget_ends_total).
  EXPECT_EQ(engine_->Stats().thinking_budget_ends_total, 4u);
}

TEST_F(ThinkingBudgetTest, CountsFromTheBlockTheReplyOpens) {
  const std::vector<int32_t> g = Generate(kPrompt, 24, ThinkingBudget{}).tokens;
  const std::vector<int32_t> markers = Absent(g, 1);
  // The reply's third token opens the block; the budget counts the tokens after it.
  ThinkingBudget b;
  b.max_tokens = 3;
  b.start = {g[2]};
  b.end = b.forced = {markers[0]};
  const size_t opened = std::find(g.begin(), g.end(), g[2]) - g.begin();
  const Output out = Generate(kPrompt, 24, b);
  ASSERT_EQ(out.tokens.size(), 24u);
  EXPECT_EQ(std::vector<int32_t>(out.tokens.begin(), out.tokens.begin() + opened + 4),
            std::vector<int32_t>(g.begin(), g.begin() + opened + 4));
  EXPECT_EQ(out.tokens[opened + 4], markers[0]);
  EXPECT_EQ(out.tokens, Reference(kPrompt, 24, b));
}

TEST_F(ThinkingBudgetTest, AReplyThatEndsItsThinkingInTimeIsUntouched) {
  const std::vector<int32_t> g = Generate(kPrompt, 20, ThinkingBudget{}).tokens;
  const std::vector<int32_t> markers = Absent(g, 2);
  // The block ends with the reply's second token, when exactly the budget is spent: the end is
  // the model's, nothing is forced, and no block opens again.
  ThinkingBudget b;
  b.max_tokens = 2;
  b.start = {markers[0]};
  b.end = {g[0], g[1]};
  b.forced = {markers[1]};
  b.starts_inside = true;
  const Output out = Generate(kPrompt, 20, b);
  EXPECT_EQ(out.tokens, g);
}

TEST_F(ThinkingBudgetTest, AnEndAlreadyBegunIsFinishedNotRepeated) {
  const std::vector<int32_t> g = Generate(kPrompt, 16, ThinkingBudget{}).tokens;
  const std::vector<int32_t> markers = Absent(g, 2);
  // The budget's last token is the end's first: only the rest is forced.
  ThinkingBudget b;
  b.max_tokens = 4;
  b.start = {markers[0]};
  b.end = b.forced = {g[3], markers[1]};
  b.starts_inside = true;
  const Output out = Generate(kPrompt, 16, b);
  ASSERT_EQ(out.tokens.size(), 16u);
  EXPECT_EQ(std::vector<int32_t>(out.tokens.begin(), out.tokens.begin() + 4),
            std::vector<int32_t>(g.begin(), g.begin() + 4));
  EXPECT_EQ(out.tokens[4], markers[1]);
  EXPECT_EQ(out.tokens, Reference(kPrompt, 16, b));
}

TEST_F(ThinkingBudgetTest, ForcedTokensAreCertainInASampledReply) {
  ThinkingBudget b;
  b.max_tokens = 6;
  b.start = {900};
  b.end = b.forced = {901, 902, 903};
  b.starts_inside = true;
  std::vector<std::vector<int32_t>> seen;
  for (const ThinkingBudget& budget : {ThinkingBudget{}, b}) {
    std::unique_ptr<GenerationRequest> r = Request(kPrompt, 14);
    r->sampling.temperature = 1.0f;
    r->sampling.seed = 99;
    r->sampling.logprobs = true;
    r->sampling.top_logprobs = 2;
    r->thinking_budget = budget;
    const Output out = Run(*engine_, std::move(r));
    ASSERT_EQ(out.tokens.size(), 14u);
    ASSERT_EQ(out.logprobs.size(), 14u);
    seen.push_back(out.tokens);
    if (budget.max_tokens < 0) continue;
    for (int k = 0; k < 3; ++k) {
      const TokenLogprobs& lp = out.logprobs[6 + k];
      EXPECT_EQ(lp.token, 901 + k);
      EXPECT_EQ(lp.logprob, 0.0f);
      ASSERT_EQ(lp.num_top, 1);
      EXPECT_EQ(lp.top_ids[0], 901 + k);
    }
    EXPECT_LT(out.logprobs[0].logprob, 0.0f);  // a sampled token's is a real distribution's
  }
  // The same seed draws the same tokens until the budget is spent.
  EXPECT_EQ(std::vector<int32_t>(seen[0].begin(), seen[0].begin() + 6),
            std::vector<int32_t>(seen[1].begin(), seen[1].begin() + 6));
}

// A forced token takes a sampled token's random draw: when the forced end is what the sampled
// reply writes there anyway, the whole reply is the one without a budget (every later token
// drawn from the same place in the seed's stream), and only the forced tokens' logprobs say
// they were forced.
TEST_F(ThinkingBudgetTest, AForcedTokenTakesASampledTokensDraw) {
  const auto sampled = [&](const ThinkingBudget& budget) {
    std::unique_ptr<GenerationRequest> r = Request(kPrompt, 24);
    r->sampling.temperature = 1.0f;
    r->sampling.seed = 1234;
    r->sampling.logprobs = true;
    r->thinking_budget = budget;
    return Run(*engine_, std::move(r));
  };
  const Output free = sampled(ThinkingBudget{});
  ASSERT_EQ(free.tokens.size(), 24u);
  // The budget runs out at the first place whose next two tokens appear nowhere before (so the
  // block cannot end there on its own first).
  int32_t at = -1;
  for (int32_t p = 3; p + 2 < 24 && at < 0; ++p) {
    bool earlier = false;
    for (int32_t q = 0; q + 1 < p + 1; ++q) {
      earlier =
          earlier || (free.tokens[q] == free.tokens[p] && free.tokens[q + 1] == free.tokens[p + 1]);
    }
    if (!earlier) at = p;
  }
  ASSERT_GE(at, 0);
  ThinkingBudget b;
  b.max_tokens = at;
  b.start = Absent(free.tokens, 1);
  b.end = b.forced = {free.tokens[at], free.tokens[at + 1]};
  b.starts_inside = true;
  const Output out = sampled(b);
  EXPECT_EQ(out.tokens, free.tokens);
  ASSERT_EQ(out.logprobs.size(), 24u);
  for (int32_t k = 0; k < 24; ++k) {
    if (k == at || k == at + 1) {
      EXPECT_EQ(out.logprobs[k].logprob, 0.0f) << k;
    } else {
      EXPECT_EQ(out.logprobs[k].logprob, free.logprobs[k].logprob) << k;
      EXPECT_LT(out.logprobs[k].logprob, 0.0f) << k;
    }
  }
}

TEST_F(ThinkingBudgetTest, DraftsOfTheForcedEndChangeNothing) {
  // A prompt that repeats itself, so that prompt lookup drafts as well.
  std::vector<int32_t> prompt;
  for (int k = 0; k < 6; ++k) prompt.insert(prompt.end(), kPrompt.begin() + 1, kPrompt.end());
  const std::vector<int32_t> g = Generate(prompt, 40, ThinkingBudget{}).tokens;
  const std::vector<int32_t> markers = Absent(g, 5);
  std::unique_ptr<Engine> speculative = MakeEngine(4);
  for (int32_t spend : {0, 3, 9}) {
    ThinkingBudget b;
    b.max_tokens = spend;
    b.start = {markers[0]};
    b.end = b.forced = {markers[1], markers[2], markers[3], markers[4]};
    b.starts_inside = true;
    const Output plain = Generate(prompt, 40, b);
    const Output drafted = Generate(prompt, 40, b, speculative.get());
    EXPECT_EQ(plain.tokens, drafted.tokens) << spend;
    EXPECT_EQ(plain.tokens, Reference(prompt, 40, b)) << spend;
  }
  EXPECT_GT(speculative->Stats().spec_decode_drafts_total, 0u);
  // On a prompt prompt lookup finds nothing in, the end's last three tokens are one draft, all
  // accepted: the budget's own drafting.
  std::unique_ptr<Engine> fresh = MakeEngine(4);
  ThinkingBudget b;
  b.max_tokens = 0;
  b.start = {markers[0]};
  b.end = b.forced = {markers[1], markers[2], markers[3], markers[4]};
  b.starts_inside = true;
  const Output out = Generate(kPrompt, 6, b, fresh.get());
  EXPECT_EQ(std::vector<int32_t>(out.tokens.begin(), out.tokens.begin() + 4), b.forced);
  const EngineStats stats = fresh->Stats();
  EXPECT_EQ(stats.spec_decode_drafts_total, 1u);
  EXPECT_EQ(stats.spec_decode_draft_tokens_total, 3u);
  EXPECT_EQ(stats.spec_decode_accepted_tokens_total, 3u);
}

TEST_F(ThinkingBudgetTest, MalformedBudgetsAreRefused) {
  const int32_t vocab = model_->config.vocab_size;
  struct Case {
    ThinkingBudget budget;
    std::string error;
  };
  std::vector<Case> cases(4);
  cases[0].budget = {3, {10}, {}, {11}, false};
  cases[0].error = "must be given";
  cases[1].budget = {3, {}, {11}, {11}, false};
  cases[1].error = "must be given";
  cases[2].budget = {3, {10}, {11}, {vocab}, false};
  cases[2].error = "not in [0, ";
  cases[3].budget = {3, {-1}, {11}, {11}, false};
  cases[3].error = "not in [0, ";
  for (const Case& c : cases) {
    std::unique_ptr<GenerationRequest> r = Request(kPrompt, 4);
    r->thinking_budget = c.budget;
    r->sink = std::make_shared<CollectingSink>();
    absl::StatusOr<uint64_t> handle = engine_->Submit(std::move(r));
    EXPECT_TRUE(absl::IsInvalidArgument(handle.status())) << handle.status();
    EXPECT_NE(handle.status().message().find("thinking_budget"), std::string::npos);
    EXPECT_NE(handle.status().message().find(c.error), std::string::npos) << handle.status();
  }
  // No start is needed when the prompt opens the block.
  ThinkingBudget inside = {3, {}, {11}, {11}, true};
  EXPECT_EQ(Generate(kPrompt, 6, inside).tokens[3], 11);
}

}  // namespace
}  // namespace kvrm
