#include "server/beam_search.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace kvrm {
namespace {

using Candidates = std::vector<std::pair<int32_t, float>>;

// A toy model over a small vocabulary: a fixed random log-softmax for every prefix (hashed), so
// that a search can be checked against exhaustive enumeration.
class ToyModel {
 public:
  ToyModel(int32_t vocab, uint32_t seed) : vocab_(vocab), seed_(seed) {}

  // The next token's log-probabilities after `prefix`, most likely first.
  Candidates Next(const std::vector<int32_t>& prefix) const {
    uint64_t h = seed_;
    for (int32_t t : prefix) h = h * 1000003u + static_cast<uint64_t>(t) + 1;
    std::mt19937_64 rng(h);
    std::normal_distribution<double> normal(0.0, 2.0);
    std::vector<double> logits(vocab_);
    for (double& l : logits) l = normal(rng);
    double max = *std::max_element(logits.begin(), logits.end());
    double sum = 0;
    for (double l : logits) sum += std::exp(l - max);
    Candidates out;
    for (int32_t t = 0; t < vocab_; ++t) {
      out.emplace_back(t, static_cast<float>(logits[t] - max - std::log(sum)));
    }
    std::stable_sort(out.begin(), out.end(),
                     [](const auto& a, const auto& b) { return a.second > b.second; });
    return out;
  }

 private:
  int32_t vocab_;
  uint32_t seed_;
};

// The search as the service runs it: each step's candidates are every live beam's top `top`.
std::vector<Beam> Search(const ToyModel& model, const BeamSearchConfig& config, int32_t steps,
                         size_t top) {
  std::vector<Beam> beams(1), completed;
  for (int32_t s = 0; s < steps && !beams.empty(); ++s) {
    std::vector<Candidates> candidates;
    for (const Beam& b : beams) {
      Candidates c = model.Next(b.tokens);
      c.resize(std::min(c.size(), top));
      candidates.push_back(std::move(c));
    }
    beams = BeamStep(beams, candidates, config, &completed);
  }
  return BestBeams(std::move(completed), std::move(beams), config);
}

// Every sequence of up to `steps` tokens (one that reaches EOS stops there), scored.
void Enumerate(const ToyModel& model, const BeamSearchConfig& config, int32_t steps, Beam beam,
               std::vector<Beam>* out) {
  if (static_cast<int32_t>(beam.tokens.size()) == steps) {
    out->push_back(beam);
    return;
  }
  for (const auto& [token, logprob] : model.Next(beam.tokens)) {
    Beam next = beam;
    next.tokens.push_back(token);
    next.cum_logprob += logprob;
    if (!config.ignore_eos &&
        std::find(config.eos_ids.begin(), config.eos_ids.end(), token) != config.eos_ids.end()) {
      next.ended = true;
      out->push_back(next);
    } else {
      Enumerate(model, config, steps, next, out);
    }
  }
}

// A beam wide enough to keep every sequence is exhaustive search: its answer is the best
// sequences by score, exactly, for each length penalty and with or without an end token.
TEST(BeamSearchTest, AWideEnoughBeamIsExhaustiveSearch) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    const ToyModel model(4, seed);
    for (double penalty : {0.5, 1.0, 2.0}) {
      for (bool ignore_eos : {false, true}) {
        BeamSearchConfig config;
        config.width = 64;  // 4^3: nothing is ever cut
        config.length_penalty = penalty;
        config.prompt_tokens = 5;
        config.eos_ids = {0};
        config.ignore_eos = ignore_eos;
        const std::vector<Beam> got = Search(model, config, 3, 4);
        std::vector<Beam> all;
        Enumerate(model, config, 3, Beam(), &all);
        std::stable_sort(all.begin(), all.end(), [&](const Beam& a, const Beam& b) {
          return BeamScore(a, config) > BeamScore(b, config);
        });
        ASSERT_EQ(got.size(), std::min<size_t>(all.size(), 64)) << seed;
        for (size_t i = 0; i < got.size(); ++i) {
          EXPECT_NEAR(BeamScore(got[i], config), BeamScore(all[i], config), 1e-12)
              << "seed " << seed << " penalty " << penalty << " rank " << i;
        }
        EXPECT_EQ(got[0].tokens, all[0].tokens);
        EXPECT_NEAR(got[0].cum_logprob, all[0].cum_logprob, 1e-9);
      }
    }
  }
}

// Width 1 is greedy decoding: the most likely token each step.
TEST(BeamSearchTest, WidthOneIsGreedy) {
  const ToyModel model(50, 7);
  BeamSearchConfig config;
  config.width = 1;
  config.prompt_tokens = 3;
  config.ignore_eos = true;
  const std::vector<Beam> got = Search(model, config, 12, 2);
  ASSERT_EQ(got.size(), 1u);
  std::vector<int32_t> greedy;
  double cum = 0;
  for (int i = 0; i < 12; ++i) {
    const Candidates c = model.Next(greedy);
    greedy.push_back(c[0].first);
    cum += c[0].second;
  }
  EXPECT_EQ(got[0].tokens, greedy);
  EXPECT_NEAR(got[0].cum_logprob, cum, 1e-9);
}

TEST(BeamSearchTest, StepKeepsTheBestWidthAndSetsAsideEndedBeams) {
  BeamSearchConfig config;
  config.width = 2;
  config.prompt_tokens = 1;
  config.eos_ids = {9};
  std::vector<Beam> beams(2);
  beams[0].tokens = {1};
  beams[0].cum_logprob = -1.0;
  beams[1].tokens = {2};
  beams[1].cum_logprob = -2.0;
  std::vector<Beam> completed;
  const std::vector<Beam> next =
      BeamStep(beams,
               {{{9, -0.1f}, {3, -0.5f}, {4, -3.0f}},
                {{5, -0.2f}, {6, -std::numeric_limits<float>::infinity()}}},
               config, &completed);
  // Candidates: [1,3] -1.5, [1,4] -4.0, [2,5] -2.2 (length 3 each); [1,9] ended; [2,6] masked.
  ASSERT_EQ(next.size(), 2u);
  EXPECT_EQ(next[0].tokens, (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(next[1].tokens, (std::vector<int32_t>{2, 5}));
  EXPECT_NEAR(next[1].cum_logprob, -2.2, 1e-6);
  ASSERT_EQ(completed.size(), 1u);
  EXPECT_EQ(completed[0].tokens, (std::vector<int32_t>{1, 9}));
  EXPECT_TRUE(completed[0].ended);
  // An ended beam's length leaves its EOS out: prompt 1 + 1 token.
  EXPECT_NEAR(BeamScore(completed[0], config), -1.1 / 2, 1e-6);
  // Ended beams past the width are dropped as they come: only the best `width` can be answers.
  std::vector<Beam> many;
  for (int i = 0; i < 3; ++i) {
    BeamStep(beams, {{{9, -0.1f * (i + 1)}, {3, -0.5f}}, {{9, -0.3f}, {5, -0.2f}}}, config, &many);
    EXPECT_LE(many.size(), 2u) << "step " << i;
  }
  EXPECT_NEAR(many[0].cum_logprob, -1.1, 1e-6);  // [1, 9] at -1.0 - 0.1, the best ended
  // The answer mixes ended and live beams by score.
  const std::vector<Beam> best = BestBeams(completed, next, config);
  ASSERT_EQ(best.size(), 2u);
  EXPECT_EQ(best[0].tokens, (std::vector<int32_t>{1, 3}));  // -1.5 / 3 = -0.5
  EXPECT_EQ(best[1].tokens, (std::vector<int32_t>{1, 9}));  // -1.1 / 2 = -0.55
}

}  // namespace
}  // namespace kvrm
