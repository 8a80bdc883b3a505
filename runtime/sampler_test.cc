#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "common/testing/alloc_counter.h"
#include "gtest/gtest.h"


namespace kvrm {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

}  // namespace

// Where the allocation probe escapes to, so the compiler cannot elide the allocation.
void* volatile g_probe_sink = nullptr;

namespace {

// Test inputs come from our own RNG too, so they are identical everywhere.
std::vector<float> RandomLogits(int32_t n, uint64_t seed, double lo, double hi) {
  Xoshiro256 rng(seed);
  std::vector<float> logits(n);
  for (float& x : logits) x = static_cast<float>(lo + (hi - lo) * rng.NextDouble());
  return logits;
}

// ---- references (double precision, straightforward) ----------------------------------------

std::vector<double> RefLogSoftmax(const std::vector<float>& logits, double temperature) {
  std::vector<double> x(logits.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = logits[i] / temperature;
  const double m = *std::max_element(x.begin(), x.end());
  double z = 0;
  for (double v : x) z += std::exp(v - m);
  for (double& v : x) v = v - m - std::log(z);
  return x;
}

// Final sampling distribution: temperature, top-k, top-p, min-p, renormalised. 0 outside support.
std::vector<double> RefProbs(const std::vector<float>& logits, const SamplingConfig& c) {
  const int32_t n = logits.size();
  std::vector<double> p = RefLogSoftmax(logits, c.temperature);
  for (double& v : p) v = std::exp(v);
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
  std::vector<bool> keep(n, true);
  if (c.top_k > 0) {
    for (int32_t r = c.top_k; r < n; ++r) keep[order[r]] = false;
  }
  if (c.top_p < 1) {
    double kept_mass = 0;
    for (int32_t i = 0; i < n; ++i) kept_mass += keep[i] ? p[i] : 0;
    double cum = 0;
    bool reached = false;
    for (int32_t r = 0; r < n; ++r) {
      const int32_t id = order[r];
      if (!keep[id]) continue;
      if (reached) {
        keep[id] = false;
        continue;
      }
      cum += p[id] / kept_mass;
      reached = cum >= c.top_p;
    }
  }
  if (c.min_p > 0) {
    const double pmax = p[order[0]];
    for (int32_t i = 0; i < n; ++i) {
      if (p[i] < c.min_p * pmax) keep[i] = false;
    }
  }
  double total = 0;
  for (int32_t i = 0; i < n; ++i) total += keep[i] ? p[i] : 0;
  std::vector<double> out(n, 0.0);
  for (int32_t i = 0; i < n; ++i) out[i] = keep[i] ? p[i] / total : 0;
  return out;
}

std::vector<double> RefPenalties(const std::vector<float>& logits, const SamplingConfig& c,
                                 const std::vector<int32_t>& prompt,
                                 const std::vector<int32_t>& generated) {
  std::vector<double> x(logits.begin(), logits.end());
  std::vector<int> count(logits.size(), 0);
  std::vector<bool> seen(logits.size(), false);
  for (int32_t t : prompt) seen[t] = true;
  for (int32_t t : generated) {
    seen[t] = true;
    ++count[t];
  }
  for (size_t i = 0; i < x.size(); ++i) {
    if (seen[i]) x[i] = x[i] > 0 ? x[i] / c.repetition_penalty : x[i] * c.repetition_penalty;
    if (count[i] > 0) x[i] -= c.presence_penalty + c.frequency_penalty * count[i];
  }
  return x;
}

// ---- RNG -------------------------------------------------------------------------------------

// The published reference code (xoshiro256starstar.c, splitmix64.c), transcribed.
struct RefXoshiro {
  uint64_t s[4];
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  explicit RefXoshiro(uint64_t seed) {
    uint64_t x = seed;
    for (uint64_t& w : s) {
      uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
      w = z ^ (z >> 31);
    }
  }
  uint64_t next() {
    const uint64_t result = rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
  }
};

TEST(Xoshiro256Test, MatchesReferenceAndKnownSplitMixValue) {
  // splitmix64 from state 0 yields 0xe220a8397b1dcdaf first (published test value); it is our
  // first state word.
  RefXoshiro zero(0);
  EXPECT_EQ(zero.s[0], 0xe220a8397b1dcdafULL);
  for (uint64_t seed : {0ULL, 1ULL, 42ULL, 0xdeadbeefcafef00dULL}) {
    Xoshiro256 ours(seed);
    RefXoshiro ref(seed);
    for (int i = 0; i < 1000; ++i) ASSERT_EQ(ours.Next(), ref.next()) << seed << " " << i;
  }
  Xoshiro256 rng(7);
  for (int i = 0; i < 10000; ++i) {
    const double u = rng.NextDouble();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
  }
}

// ---- config validation -----------------------------------------------------------------------

TEST(ValidateSamplingConfigTest, AcceptsDefaultsRejectsOutOfRange) {
  EXPECT_TRUE(ValidateSamplingConfig(SamplingConfig{}).ok());
  auto with = [](auto mutate) {
    SamplingConfig c;
    mutate(c);
    return ValidateSamplingConfig(c);
  };
  EXPECT_EQ(with([](SamplingConfig& c) { c.temperature = -1; }).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(with([](SamplingConfig& c) { c.top_k = -1; }).ok());
  EXPECT_FALSE(with([](SamplingConfig& c) { c.top_p = 0; }).ok());
  EXPECT_FALSE(with([](SamplingConfig& c) { c.top_p = 1.5; }).ok());
  EXPECT_FALSE(with([](SamplingConfig& c) { c.min_p = -0.1f; }).ok());
  EXPECT_FALSE(with([](SamplingConfig& c) { c.repetition_penalty = 0; }).ok());
  EXPECT_FALSE(with([](SamplingConfig& c) { c.presence_penalty = NAN; }).ok());
  EXPECT_FALSE(with([](SamplingConfig& c) { c.top_logprobs = 21; }).ok());
  EXPECT_TRUE(with([](SamplingConfig& c) {
                c.temperature = 0.7f;
                c.top_k = 40;
                c.top_p = 0.9f;
                c.min_p = 0.05f;
                c.top_logprobs = 20;
              }).ok());
}

// ---- greedy and penalties --------------------------------------------------------------------

TEST(SamplerTest, GreedyIsArgmaxLowestIdOnTies) {
  Sampler sampler(1000);
  sampler.Reset(SamplingConfig{}, {});
  for (uint64_t seed = 0; seed < 50; ++seed) {
    std::vector<float> logits = RandomLogits(1000, seed, -5, 5);
    const int32_t want = std::max_element(logits.begin(), logits.end()) - logits.begin();
    EXPECT_EQ(sampler.Sample(absl::MakeSpan(logits)).token, want);
  }
  std::vector<float> ties(1000, 1.0f);
  ties[17] = ties[400] = ties[999] = 2.0f;
  EXPECT_EQ(sampler.Sample(absl::MakeSpan(ties)).token, 17);
}

TEST(SamplerTest, EachPenaltyChangesExactlyTheExpectedLogits) {
  const std::vector<int32_t> prompt = {1, 2, 3, 3, 10};
  const std::vector<int32_t> generated = {3, 4, 4, 20, 4};
  const std::vector<float> logits = RandomLogits(50, 99, -3, 3);
  std::vector<SamplingConfig> configs(4);
  configs[0].repetition_penalty = 1.3f;
  configs[1].presence_penalty = 0.5f;
  configs[2].frequency_penalty = 0.25f;
  configs[3].repetition_penalty = 0.8f;  // < 1 rewards repeats; still the same formula
  configs[3].presence_penalty = -0.4f;
  configs[3].frequency_penalty = 0.7f;
  Sampler sampler(50);
  for (const SamplingConfig& c : configs) {
    SCOPED_TRACE(::testing::Message() << "rep " << c.repetition_penalty << " presence "
                                      << c.presence_penalty << " freq " << c.frequency_penalty);
    sampler.Reset(c, prompt);
    for (int32_t t : generated) sampler.Accept(t);
    std::vector<float> out = logits;
    sampler.ApplyPenalties(absl::MakeSpan(out));
    const std::vector<double> ref = RefPenalties(logits, c, prompt, generated);
    std::set<int32_t> changed, want_changed;
    for (int32_t i = 0; i < 50; ++i) {
      EXPECT_NEAR(out[i], ref[i], 1e-5) << i;
      if (out[i] != logits[i]) changed.insert(i);
      if (ref[i] != static_cast<double>(logits[i])) want_changed.insert(i);
    }
    EXPECT_EQ(changed, want_changed);
    EXPECT_FALSE(changed.empty());
  }
  // Presence/frequency see generated tokens only: prompt-only ids 1, 2, 10 stay put.
  EXPECT_EQ(std::set<int32_t>({3, 4, 20}), [&] {
    sampler.Reset(configs[1], prompt);
    for (int32_t t : generated) sampler.Accept(t);
    std::vector<float> out = logits;
    sampler.ApplyPenalties(absl::MakeSpan(out));
    std::set<int32_t> s;
    for (int32_t i = 0; i < 50; ++i) {
      if (out[i] != logits[i]) s.insert(i);
    }
    return s;
  }());
}

TEST(SamplerTest, LogitBiasIsAddedBeforeThePenalties) {
  const std::vector<int32_t> prompt = {1, 2, 3};
  const std::vector<float> logits = RandomLogits(64, 7, -3, 3);
  SamplingConfig c;
  c.repetition_penalty = 1.5f;
  c.presence_penalty = 0.3f;
  const std::vector<std::pair<int32_t, float>> bias = {{2, 4.5f}, {40, -2.25f}, {63, 100.0f}};
  for (const auto& [token, value] : bias) c.logit_bias[c.num_logit_bias++] = {token, value};
  Sampler sampler(64);
  sampler.Reset(c, prompt);
  sampler.Accept(40);
  std::vector<float> out = logits;
  sampler.ApplyLogitBias(absl::MakeSpan(out));
  sampler.ApplyPenalties(absl::MakeSpan(out));
  // Reference in double: bias first, then the penalties of the biased value.
  std::vector<float> biased = logits;
  for (const auto& [token, value] : bias) biased[token] += value;
  const std::vector<double> ref = RefPenalties(biased, c, prompt, {40});
  for (int32_t i = 0; i < 64; ++i) EXPECT_NEAR(out[i], ref[i], 1e-5) << i;
  // Sample applies it: +100 makes token 63 the greedy choice, and a sampled one (p ~ 1).
  for (float temperature : {0.0f, 1.0f}) {
    c.temperature = temperature;
    sampler.Reset(c, prompt);
    std::vector<float> l = logits;
    EXPECT_EQ(sampler.Sample(absl::MakeSpan(l)).token, 63) << temperature;
  }
  // Bad entries are refused by validation.
  SamplingConfig bad;
  bad.num_logit_bias = 1;
  bad.logit_bias[0] = {-1, 1.0f};
  EXPECT_FALSE(ValidateSamplingConfig(bad).ok());
  bad.logit_bias[0] = {5, std::numeric_limits<float>::infinity()};
  EXPECT_FALSE(ValidateSamplingConfig(bad).ok());
  bad.num_logit_bias = kMaxLogitBias + 1;
  EXPECT_FALSE(ValidateSamplingConfig(bad).ok());
}

TEST(SamplerTest, AllowedTokensAreTheOnlySupport) {
  constexpr int32_t kVocab = 500;
  const std::vector<float> logits = RandomLogits(kVocab, 9, -4, 4);
  const std::vector<int32_t> allowed = {3, 77, 140, 141, 499, 77};  // a duplicate is harmless
  SamplingConfig c;
  c.allowed_tokens = std::make_shared<const std::vector<int32_t>>(allowed);
  c.logprobs = true;
  c.top_logprobs = 4;
  // Reference in double: log-softmax over the distinct allowed ids only.
  const std::vector<int32_t> distinct = {3, 77, 140, 141, 499};
  auto reference = [&](double temperature) {
    double max = -1e300;
    for (int32_t t : distinct) max = std::max(max, logits[t] / temperature);
    double z = 0;
    for (int32_t t : distinct) z += std::exp(logits[t] / temperature - max);
    std::vector<double> lp(kVocab, -std::numeric_limits<double>::infinity());
    for (int32_t t : distinct) lp[t] = logits[t] / temperature - max - std::log(z);
    return lp;
  };
  // Greedy: the best allowed id, with its logprob at temperature 1.
  Sampler sampler(kVocab);
  sampler.Reset(c, {});
  std::vector<float> work = logits;
  const SampleResult g = sampler.Sample(absl::MakeSpan(work));
  int32_t best = distinct[0];
  for (int32_t t : distinct) best = logits[t] > logits[best] ? t : best;
  EXPECT_EQ(g.token, best);
  const std::vector<double> ref1 = reference(1.0);
  EXPECT_NEAR(g.logprob, ref1[best], 1e-5);
  ASSERT_EQ(g.num_top, 4);
  for (int32_t j = 0; j < g.num_top; ++j) {
    EXPECT_TRUE(std::count(distinct.begin(), distinct.end(), g.top_ids[j])) << g.top_ids[j];
    EXPECT_NEAR(g.top_logprobs[j], ref1[g.top_ids[j]], 1e-5);
  }
  // Sampling: every draw is allowed, logprobs against the reference, and every allowed id turns
  // up over 2000 draws at temperature 2 (the least likely has p > 0.01 here: a miss has
  // probability below e^-20).
  c.temperature = 2.0f;
  sampler.Reset(c, {});
  const std::vector<double> ref2 = reference(2.0);
  std::set<int32_t> seen;
  for (int i = 0; i < 2000; ++i) {
    work = logits;
    const SampleResult r = sampler.Sample(absl::MakeSpan(work));
    ASSERT_TRUE(std::count(distinct.begin(), distinct.end(), r.token)) << r.token;
    EXPECT_NEAR(r.logprob, ref2[r.token], 1e-5);
    seen.insert(r.token);
  }
  for (int32_t t : distinct) EXPECT_GT(std::exp(ref2[t]), 0.01) << t;
  EXPECT_EQ(seen.size(), distinct.size());
  // The bias applies after the mask: it cannot bring back a masked id.
  c.temperature = 0;
  c.logit_bias[c.num_logit_bias++] = {10, 100.0f};
  c.logit_bias[c.num_logit_bias++] = {140, 50.0f};
  sampler.Reset(c, {});
  work = logits;
  EXPECT_EQ(sampler.Sample(absl::MakeSpan(work)).token, 140);
}

// vLLM's bad_words: a one-token word is never drawn; a longer word's last token is -inf exactly
// when the tokens accepted last are the rest of it (across the ring's wrap-around), checked
// against a brute-force scan of the whole history; the prompt does not count.
TEST(SamplerTest, BadWordsBanTheirLastTokenAfterTheirStart) {
  constexpr int32_t kVocab = 64;
  const std::vector<std::vector<int32_t>> words = {{5}, {7, 8, 9}, {3, 3}, {1, 2, 3, 4, 6}};
  SamplingConfig c;
  c.bad_words = std::make_shared<const std::vector<std::vector<int32_t>>>(words);
  ASSERT_TRUE(ValidateSamplingTokens(c, kVocab).ok());
  Sampler sampler(kVocab);
  sampler.Reset(c, /*prompt_tokens=*/{7, 8});  // the prompt's 7 8 bans nothing
  std::vector<int32_t> history;
  std::mt19937 rng(4);
  // A history that keeps running into the words' starts: tokens 1..9 mostly.
  for (int step = 0; step < 400; ++step) {
    std::vector<float> logits(kVocab, 0.0f);
    sampler.ApplyBadWords(absl::MakeSpan(logits));
    std::set<int32_t> banned;
    for (const std::vector<int32_t>& w : words) {
      const size_t prefix = w.size() - 1;
      if (prefix > history.size()) continue;
      if (std::equal(w.begin(), w.end() - 1, history.end() - prefix)) banned.insert(w.back());
    }
    for (int32_t t = 0; t < kVocab; ++t) {
      EXPECT_EQ(std::isinf(logits[t]), banned.count(t) == 1) << "step " << step << " token " << t;
    }
    // Greedy with the banned token on top: never drawn.
    for (int32_t t : banned) {
      std::vector<float> top(kVocab, 0.0f);
      top[t] = 10.0f;
      EXPECT_NE(sampler.Sample(absl::MakeSpan(top)).token, t) << "step " << step;
    }
    const int32_t next =
        step % 50 < 40 ? static_cast<int32_t>(1 + rng() % 9) : static_cast<int32_t>(rng() % kVocab);
    sampler.Accept(next);
    history.push_back(next);
  }
  // Bounds: too many words, an empty or over-long word, an id outside the vocabulary.
  auto with = [](std::vector<std::vector<int32_t>> w) {
    SamplingConfig bad;
    bad.bad_words = std::make_shared<const std::vector<std::vector<int32_t>>>(std::move(w));
    return ValidateSamplingTokens(bad, kVocab);
  };
  EXPECT_FALSE(with({{}}).ok());
  EXPECT_FALSE(with({std::vector<int32_t>(kMaxBadWordTokens + 1, 1)}).ok());
  EXPECT_TRUE(with({std::vector<int32_t>(kMaxBadWordTokens, 1)}).ok());
  EXPECT_FALSE(with({{kVocab}}).ok());
  EXPECT_FALSE(with(std::vector<std::vector<int32_t>>(kMaxBadWordSequences + 1, {1})).ok());
}

TEST(SamplerTest, PenaltyFlipsGreedyChoiceAndResetForgetsOldTokens) {
  Sampler sampler(8);
  SamplingConfig c;
  c.repetition_penalty = 2;
  sampler.Reset(c, {5});
  std::vector<float> logits = {0, 1, 2, 0, 0, 3, 0, 0};
  std::vector<float> work = logits;
  EXPECT_EQ(sampler.Sample(absl::MakeSpan(work)).token, 2);  // 3 / 2 = 1.5 < 2
  EXPECT_FLOAT_EQ(work[5], 1.5f);
  sampler.Reset(c, {1});  // id 5 is no longer in the context
  work = logits;
  EXPECT_EQ(sampler.Sample(absl::MakeSpan(work)).token, 5);
  EXPECT_FLOAT_EQ(work[1], 0.5f);
}

// ---- filtering support and distribution ------------------------------------------------------

// Draws `draws` tokens and checks the support (tokens drawn and logits left finite) and the
// empirical frequencies against the reference distribution.
void CheckDistribution(const std::vector<float>& logits, const SamplingConfig& c, int draws) {
  const int32_t n = logits.size();
  const std::vector<double> ref = RefProbs(logits, c);
  Sampler sampler(n);
  sampler.Reset(c, {});
  // The same draws without the support mask (the engine's call): the same tokens and logprobs.
  Sampler unmasked(n);
  unmasked.Reset(c, {});
  std::vector<float> work = logits, work_unmasked = logits;
  std::vector<int64_t> counts(n, 0);
  for (int d = 0; d < draws; ++d) {
    std::copy(logits.begin(), logits.end(), work.begin());
    std::copy(logits.begin(), logits.end(), work_unmasked.begin());
    const SampleResult r = sampler.Sample(absl::MakeSpan(work));
    const SampleResult u = unmasked.Sample(absl::MakeSpan(work_unmasked), /*mask_support=*/false);
    ASSERT_EQ(u.token, r.token) << "draw " << d;
    ASSERT_EQ(u.logprob, r.logprob) << "draw " << d;
    const int32_t t = r.token;
    ASSERT_TRUE(t >= 0 && t < n);
    ASSERT_GT(ref[t], 0) << "token " << t << " is outside the reference support";
    ++counts[t];
    if (d == 0) {  // the processed logits are -inf exactly outside the support
      for (int32_t i = 0; i < n; ++i) {
        ASSERT_EQ(std::isfinite(work[i]), ref[i] > 0) << i << " " << work[i] << " " << ref[i];
      }
    }
  }
  // Frequencies: per token for small vocabularies; for large ones, per bin of ~1/20 of the mass
  // (ids in reference order), since thousands of near-zero per-token counts have Poisson tails.
  std::vector<int32_t> bin(n, -1);
  if (n <= 256) {
    std::iota(bin.begin(), bin.end(), 0);
  } else {
    std::vector<int32_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return ref[a] > ref[b]; });
    double cum = 0;
    for (int32_t id : order) {
      bin[id] = std::min(19, static_cast<int32_t>(cum * 20));
      cum += ref[id];
    }
  }
  std::vector<double> bin_prob(n, 0);
  std::vector<int64_t> bin_count(n, 0);
  for (int32_t i = 0; i < n; ++i) {
    bin_prob[bin[i]] += ref[i];
    bin_count[bin[i]] += counts[i];
  }
  for (int32_t b = 0; b < n; ++b) {
    const double expected = draws * bin_prob[b];
    const double sigma = std::sqrt(draws * bin_prob[b] * (1 - bin_prob[b]));
    EXPECT_LE(std::abs(bin_count[b] - expected), 4 * sigma + 1)
        << "bin " << b << " count " << bin_count[b] << " expected " << expected;
  }
}

TEST(SamplerTest, FilteringKeepsExactSupportAndReferenceFrequencies) {
  const std::vector<float> logits = RandomLogits(64, 5, -4, 4);
  std::vector<SamplingConfig> configs;
  auto add = [&](float t, int32_t k, float p, float min_p) {
    SamplingConfig c;
    c.temperature = t;
    c.top_k = k;
    c.top_p = p;
    c.min_p = min_p;
    c.seed = configs.size() + 1;
    configs.push_back(c);
  };
  add(0.5f, 0, 1, 0);  // temperature only
  add(1.0f, 5, 1, 0);
  add(0.8f, 0, 0.6f, 0);
  add(1.3f, 0, 1, 0.15f);
  add(1.0f, 12, 0.85f, 0.1f);
  add(1.0f, 0, 0.9f, 0.05f);
  add(1.0f, 0, 1e-6f, 0);  // top-p keeps at least the best token
  add(2.0f, 100, 1, 0);    // top-k above the vocabulary is off
  for (const SamplingConfig& c : configs) {
    SCOPED_TRACE(::testing::Message() << "T " << c.temperature << " k " << c.top_k << " p "
                                      << c.top_p << " min_p " << c.min_p);
    CheckDistribution(logits, c, 20000);
  }
}

TEST(SamplerTest, TopPOverLargeVocabularyFlatAndPeaked) {
  // Flat: the bounded rounds must fall through to the guaranteed threshold.
  std::vector<float> flat = RandomLogits(32000, 11, -3, 3);
  // Peaked: a handful of ids dominate; the first round suffices.
  std::vector<float> peaked = flat;
  for (int32_t id : {7, 1234, 31999, 20000}) peaked[id] = 14;
  for (const std::vector<float>* logits : {&flat, &peaked}) {
    SamplingConfig c;
    c.temperature = 1;
    c.top_p = 0.9f;
    c.seed = 3;
    CheckDistribution(*logits, c, 2000);
    c.top_k = 3000;
    CheckDistribution(*logits, c, 2000);
  }
}

TEST(SamplerTest, TopKAndTopPKeepTheLowestIdsAmongTiedLogits) {
  // Logits on a coarse grid: every cut falls inside a run of equal logits, so the kept support
  // depends on the tie rule (lower id first), for the one-pass heap (k <= 1024) and the
  // nth_element path (larger k) alike.
  std::vector<float> grid = RandomLogits(3000, 17, -3, 3);
  for (float& x : grid) x = std::round(x * 2) / 2;
  for (int32_t k : {1, 7, 64, 1024, 1025, 2000}) {
    SamplingConfig c;
    c.temperature = 1.0f;
    c.top_k = k;
    c.seed = 40 + k;
    SCOPED_TRACE(::testing::Message() << "top_k " << k);
    CheckDistribution(grid, c, 2000);
  }
  SamplingConfig c;
  c.temperature = 0.7f;
  c.top_p = 0.3f;
  c.seed = 9;
  CheckDistribution(grid, c, 2000);
}

// ---- reproducibility -------------------------------------------------------------------------

std::vector<int32_t> Generate(Sampler& sampler, const SamplingConfig& c, int steps) {
  sampler.Reset(c, {1, 2, 3});
  std::vector<int32_t> tokens;
  for (int s = 0; s < steps; ++s) {
    std::vector<float> logits = RandomLogits(sampler.vocab_size(), 1000 + s, -2, 2);
    const int32_t t = sampler.Sample(absl::MakeSpan(logits)).token;
    sampler.Accept(t);
    tokens.push_back(t);
  }
  return tokens;
}

TEST(SamplerTest, SameSeedReproducesDifferentSeedsDiffer) {
  SamplingConfig c;
  c.temperature = 0.9f;
  c.top_p = 0.95f;
  c.repetition_penalty = 1.1f;
  c.frequency_penalty = 0.2f;
  c.seed = 42;
  Sampler a(500), b(500);
  const std::vector<int32_t> first = Generate(a, c, 300);
  EXPECT_EQ(first, Generate(b, c, 300));
  EXPECT_EQ(first, Generate(a, c, 300));  // Reset fully restores the state
  c.seed = 43;
  const std::vector<int32_t> other = Generate(b, c, 300);
  int differ = 0;
  for (int i = 0; i < 300; ++i) differ += first[i] != other[i];
  EXPECT_GT(differ, 200);
}

// ---- logprobs --------------------------------------------------------------------------------

void CheckLogprobs(const SamplingConfig& c, const std::vector<float>& logits) {
  const double temperature = c.temperature > 0 ? c.temperature : 1.0;
  const std::vector<double> ref = RefLogSoftmax(logits, temperature);
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return ref[a] > ref[b]; });
  Sampler sampler(logits.size());
  sampler.Reset(c, {});
  for (int rep = 0; rep < 20; ++rep) {
    std::vector<float> work = logits;
    const SampleResult r = sampler.Sample(absl::MakeSpan(work));
    EXPECT_NEAR(r.logprob, ref[r.token], 1e-5);
    ASSERT_EQ(r.num_top, c.top_logprobs);
    for (int32_t j = 0; j < r.num_top; ++j) {
      EXPECT_EQ(r.top_ids[j], order[j]) << j;
      EXPECT_NEAR(r.top_logprobs[j], ref[order[j]], 1e-5) << j;
    }
  }
}

TEST(SamplerTest, LogprobsMatchReferenceLogSoftmax) {
  const std::vector<float> logits = RandomLogits(5000, 21, -6, 6);
  SamplingConfig c;
  c.logprobs = true;
  c.top_logprobs = 20;
  CheckLogprobs(c, logits);  // greedy: temperature 1
  c.temperature = 0.7f;
  c.top_k = 3;  // filtering does not change the reported logprobs
  c.top_logprobs = 5;
  CheckLogprobs(c, logits);
  c.top_k = 0;
  c.temperature = 1.6f;
  c.min_p = 0.2f;
  CheckLogprobs(c, logits);
}

// ---- non-finite logits -----------------------------------------------------------------------

TEST(SamplerTest, NonFiniteLogits) {
  Sampler sampler(6);
  SamplingConfig greedy;
  greedy.logprobs = true;  // greedy fills logprob only when asked
  SamplingConfig sample;
  sample.temperature = 1;
  sample.top_k = 4;
  sample.logprobs = true;
  for (const SamplingConfig& c : {greedy, sample}) {
    sampler.Reset(c, {});
    // NaN is -inf: never chosen.
    for (int i = 0; i < 200; ++i) {
      std::vector<float> logits = {1, NAN, 0.5f, NAN, -1, 0};
      const SampleResult r = sampler.Sample(absl::MakeSpan(logits));
      ASSERT_NE(r.token, 1);
      ASSERT_NE(r.token, 3);
      ASSERT_TRUE(std::isfinite(r.logprob));
    }
    // Nothing finite: token 0 with logprob -inf.
    std::vector<float> none = {-kInf, NAN, -kInf, -kInf, NAN, -kInf};
    const SampleResult r = sampler.Sample(absl::MakeSpan(none));
    EXPECT_EQ(r.token, 0);
    EXPECT_EQ(r.logprob, -kInf);
    // +inf entries share the mass equally.
    std::set<int32_t> seen;
    for (int i = 0; i < 200; ++i) {
      std::vector<float> logits = {1, 2, kInf, 3, kInf, NAN};
      const SampleResult s = sampler.Sample(absl::MakeSpan(logits));
      ASSERT_TRUE(s.token == 2 || s.token == 4) << s.token;
      ASSERT_NEAR(s.logprob, std::log(0.5), 1e-6);
      seen.insert(s.token);
    }
    EXPECT_EQ(seen.size(), c.temperature > 0 ? 2u : 1u);
  }
}

// A temperature far below 1 (validation takes any value in [0, 100]) is all but greedy: the
// argmax, with every filter, and never an id outside the vocabulary. (1 / T is inf here: the
// scaling must divide, or the max entry becomes 0 * inf = NaN.)
TEST(SamplerTest, TinyTemperatureIsTheArgmax) {
  const std::vector<float> logits = RandomLogits(3000, 23, -4, 4);
  const int32_t best =
      static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  for (float t : {1e-40f, 1e-30f, 1e-6f}) {
    for (int kind = 0; kind < 4; ++kind) {
      SamplingConfig c;
      c.temperature = t;
      c.top_k = kind == 1 ? 50 : kind == 3 ? 2000 : 0;
      c.top_p = kind == 2 ? 0.9f : 1.0f;
      c.min_p = kind == 3 ? 0.1f : 0.0f;
      c.logprobs = true;
      c.seed = 5;
      Sampler sampler(3000);
      sampler.Reset(c, {});
      std::vector<float> work = logits;
      const SampleResult r = sampler.Sample(absl::MakeSpan(work));
      EXPECT_EQ(r.token, best) << "T " << t << " kind " << kind;
      EXPECT_EQ(r.logprob, 0.0f) << "T " << t << " kind " << kind;
    }
  }
}

// ---- no allocation on the step path ----------------------------------------------------------

TEST(SamplerTest, SampleAcceptAndResetDoNotAllocate) {
  if (!alloc_counter::kAvailable) GTEST_SKIP() << "allocation counting is off under sanitizers";
  constexpr int32_t kVocab = 32000;
  const std::vector<float> flat = RandomLogits(kVocab, 1, -3, 3);
  std::vector<float> peaked = flat;
  peaked[100] = peaked[200] = 12;
  std::vector<float> work(kVocab);
  const std::vector<int32_t> prompt = {5, 6, 7, 8, 9, 5, 100};
  std::vector<SamplingConfig> configs(6);
  configs[0].logprobs = true;  // greedy + top logprobs
  configs[0].top_logprobs = 20;
  configs[1].temperature = 0.8f;  // top-k + top-p + min-p + penalties
  configs[1].top_k = 50;
  configs[1].top_p = 0.9f;
  configs[1].min_p = 0.01f;
  configs[1].repetition_penalty = 1.2f;
  configs[1].presence_penalty = 0.3f;
  configs[1].frequency_penalty = 0.3f;
  configs[2].temperature = 1;  // unsorted top-p over a flat vocabulary (large sort)
  configs[2].top_p = 0.95f;
  configs[3].temperature = 1.1f;  // min-p only
  configs[3].min_p = 0.05f;
  configs[4].temperature = 1;  // plain sampling with logprobs
  configs[4].logprobs = true;
  configs[4].top_logprobs = 3;
  configs[5].temperature = 0.9f;  // allowed tokens (built once, shared by copies)
  configs[5].allowed_tokens =
      std::make_shared<const std::vector<int32_t>>(std::vector<int32_t>{1, 100, 200, 31999});
  Sampler sampler(kVocab);

  // The counter must see an allocation it cannot elide, or the zero below would prove nothing.
  const int64_t probe = alloc_counter::AllocationCount();
  auto probe_vec = std::make_unique<std::vector<int32_t>>(100);
  g_probe_sink = probe_vec.get();
  ASSERT_GT(alloc_counter::AllocationCount(), probe);

  int64_t sink = 0;
  const int64_t before = alloc_counter::AllocationCount();
  for (int i = 0; i < 1000; ++i) {
    if (i % 100 == 0) sampler.Reset(configs[(i / 100) % configs.size()], prompt);
    const std::vector<float>& src = (i / 50) % 2 ? flat : peaked;
    std::copy(src.begin(), src.end(), work.begin());
    const SampleResult r = sampler.Sample(absl::MakeSpan(work));
    sampler.Accept(r.token);
    sink += r.token + r.num_top;
  }
  const int64_t after = alloc_counter::AllocationCount();
  EXPECT_EQ(after - before, 0);
  EXPECT_GT(sink, 0);
}

// ScoreToken (prompt logprobs) against a float64 log-softmax of the raw logits: the token's
// value and the best entries in order, ties to the lower id, -inf and NaN entries left out.
TEST(ScoreTokenTest, MatchesAFloat64LogSoftmaxOfTheRawLogits) {
  std::mt19937 rng(31);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int iter = 0; iter < 200; ++iter) {
    const int32_t vocab = 1 + static_cast<int32_t>(rng() % 300);
    std::vector<float> logits(vocab);
    for (float& x : logits) {
      x = normal(rng);
      const uint32_t r = rng() % 20;
      if (r == 0) x = -std::numeric_limits<float>::infinity();
      if (r == 1) x = std::nanf("");
      if (r == 2) x = std::round(x);  // ties
    }
    const int32_t token = static_cast<int32_t>(rng() % vocab);
    const int32_t top_n = static_cast<int32_t>(rng() % 22);  // clamped to 20
    const SampleResult got = ScoreToken(logits, token, top_n);
    ASSERT_EQ(got.token, token);
    // Reference.
    double max = -std::numeric_limits<double>::infinity();
    std::vector<int32_t> finite;
    for (int32_t i = 0; i < vocab; ++i) {
      if (logits[i] > -std::numeric_limits<float>::infinity()) {
        max = std::max<double>(max, logits[i]);
        finite.push_back(i);
      }
    }
    if (finite.empty()) {
      EXPECT_EQ(got.logprob, -std::numeric_limits<float>::infinity());
      EXPECT_EQ(got.num_top, 0);
      continue;
    }
    double total = 0;
    for (int32_t i : finite) total += std::exp(logits[i] - max);
    const double log_z = max + std::log(total);
    if (std::isnan(logits[token]) || std::isinf(logits[token])) {
      EXPECT_EQ(got.logprob, -std::numeric_limits<float>::infinity()) << iter;
    } else {
      EXPECT_NEAR(got.logprob, logits[token] - log_z, 1e-5) << iter;
    }
    std::stable_sort(finite.begin(), finite.end(),
                     [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    const int32_t want = std::min<int32_t>({top_n, 20, static_cast<int32_t>(finite.size())});
    ASSERT_EQ(got.num_top, want) << iter;
    for (int32_t j = 0; j < want; ++j) {
      EXPECT_EQ(got.top_ids[j], finite[j]) << iter << " rank " << j;
      EXPECT_NEAR(got.top_logprobs[j], logits[finite[j]] - log_z, 1e-5) << iter;
    }
  }
  // +inf entries: uniform over them.
  const float inf = std::numeric_limits<float>::infinity();
  const SampleResult r = ScoreToken(std::vector<float>{1.0f, inf, 2.0f, inf}, 3, 5);
  EXPECT_FLOAT_EQ(r.logprob, -std::log(2.0f));
  ASSERT_EQ(r.num_top, 2);
  EXPECT_EQ(r.top_ids[0], 1);
  EXPECT_EQ(r.top_ids[1], 3);
  EXPECT_EQ(ScoreToken(std::vector<float>{1.0f, inf}, 0, 0).logprob, -inf);
}

}  // namespace
}  // namespace kvrm
