// Per-slot token sampler: logit penalties, temperature, top-k / top-p / min-p, seeded draw.
//
// Owner: the engine's scheduler thread. The engine creates one Sampler per decode slot at
// start-up; `Reset` (admission) and `Sample` / `Accept` (every decode step) never allocate: all
// buffers are sized to the vocabulary in the constructor and reused.
//
// Processing order: allowed-token mask, bad words, logit bias, repetition penalty,
// presence/frequency penalties (vLLM's order); then, if temperature == 0, argmax (ties: lowest id);
// otherwise divide by temperature, top-k, top-p, min-p, renormalise, and draw with the request's
// own RNG. (min_tokens masks a request's stop tokens before all of this: the engine does it, it
// knows the stop tokens.) The cuts run in the order of Hugging Face's generate() warpers and of
// vLLM v0; vLLM v1 applies min-p before top-k/top-p, so with both min_p and top_p set its nucleus
// is top_p of the mass min-p left, and the two can keep different tokens (e.g. probabilities
// 0.4/0.3/0.2/0.1, min_p 0.5, top_p 0.75: here {0, 1, 2}, vLLM v1 {0, 1}). The device sampler
// (runtime/device_sampling.h) uses this same order. Top-k keeps exactly k tokens, the lowest
// ids among ties at the k-th value; vLLM keeps every token tied with it.
#ifndef KVRM_RUNTIME_SAMPLER_H_
#define KVRM_RUNTIME_SAMPLER_H_

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/xoshiro.h"

namespace kvrm {

inline constexpr int32_t kMaxTopLogprobs = 20;
inline constexpr int32_t kMaxLogitBias = 300;
// vLLM's bad_words: at most this many words a request, each at most this many tokens; a word
// is one or two token sequences (request validation: as written, and after a space).
inline constexpr int32_t kMaxBadWords = 128;
inline constexpr int32_t kMaxBadWordSequences = 2 * kMaxBadWords;
inline constexpr int32_t kMaxBadWordTokens = 32;

struct LogitBias {
  int32_t token = 0;
  float bias = 0;
};

struct SamplingConfig {
  float temperature = 0;  // 0 = greedy
  int32_t top_k = 0;      // 0 = off
  float top_p = 1;        // 1 = off
  float min_p = 0;        // 0 = off
  uint64_t seed = 0;      // The engine picks one when the request has none.
  // CTRL/HF style over prompt+generated tokens: logit > 0 ? logit / p : logit * p. 1 = off.
  float repetition_penalty = 1;
  // Over generated tokens only (vLLM/OpenAI): logit -= presence * [count > 0] + frequency * count.
  float presence_penalty = 0;
  float frequency_penalty = 0;
  // OpenAI / vLLM logit_bias: added to these tokens' logits before the penalties. Ids in
  // [0, vocab_size), values finite. Fixed capacity, so copying a config never allocates.
  std::array<LogitBias, kMaxLogitBias> logit_bias{};
  int32_t num_logit_bias = 0;
  // vLLM's allowed_token_ids (null: every token): all other logits are -inf before the bias.
  // Ids in [0, vocab_size), at most vocab_size of them (request validation sorts them and drops
  // repeats); shared and immutable, so copying a config never allocates.
  std::shared_ptr<const std::vector<int32_t>> allowed_tokens;
  // vLLM's bad_words, as token sequences (null: none): the last token of a sequence is -inf
  // whenever the tokens generated last are the rest of it (a one-token sequence: always). At
  // most kMaxBadWordSequences sequences of 1 to kMaxBadWordTokens ids in [0, vocab_size); shared
  // and immutable, so copying a config never allocates.
  std::shared_ptr<const std::vector<std::vector<int32_t>>> bad_words;
  bool logprobs = false;
  int32_t top_logprobs = 0;  // 0..kMaxTopLogprobs
};

// INVALID_ARGUMENT naming the field when `config` is outside the ranges above (negative
// temperature, top_p outside (0, 1], non-positive repetition penalty, ...). Call at admission.
absl::Status ValidateSamplingConfig(const SamplingConfig& config);
// INVALID_ARGUMENT naming the field when a logit_bias or allowed_tokens id is outside
// [0, vocab_size), or allowed_tokens is empty or longer than the vocabulary: what a Sampler of
// that vocabulary requires (Reset CHECKs it).
absl::Status ValidateSamplingTokens(const SamplingConfig& config, int32_t vocab_size);

struct SampleResult {
  int32_t token = 0;
  // Log-softmax of the processed logits (after penalties and temperature; for greedy,
  // temperature 1) at `token`. Filtering (top-k/p, min-p) does not change it. Greedy fills it
  // only when config.logprobs (0 otherwise: computing it costs a pass over the vocabulary).
  float logprob = 0;
  // Filled when config.logprobs: the best min(top_logprobs, #finite logits) entries of the same
  // distribution, best first (ties: lowest id).
  int32_t num_top = 0;
  std::array<int32_t, kMaxTopLogprobs> top_ids;
  std::array<float, kMaxTopLogprobs> top_logprobs;
  // ScoreToken only: 1 + the number of entries more likely than `token` (0 when it is -inf).
  int32_t rank = 0;
};

// Scores a given token (prompt logprobs): its log-probability under the softmax of the raw
// `logits` (no temperature, penalties or filters; NaN counts as -inf) and the `top_n` (at most
// kMaxTopLogprobs) best entries of that distribution, best first (ties: lowest id). `token`
// must be in [0, logits.size()). All -inf: logprob -inf and no entries. Two passes over the
// vocabulary, no allocation.
SampleResult ScoreToken(absl::Span<const float> logits, int32_t token, int32_t top_n);

class Sampler {
 public:
  explicit Sampler(int32_t vocab_size);
  Sampler(const Sampler&) = delete;
  Sampler& operator=(const Sampler&) = delete;

  // Starts a request: takes its config, reseeds the RNG and records the prompt tokens for the
  // repetition penalty. O(tokens seen by the previous request + prompt), no allocation.
  // Token ids must be in [0, vocab_size) (validated at the edge; CHECKed here).
  void Reset(const SamplingConfig& config, absl::Span<const int32_t> prompt_tokens);

  // Processes `logits` ([vocab_size]) in place and draws a token. Afterwards `logits` holds the
  // processed logits: penalised; for sampling also shifted so the max is 0, divided by the
  // temperature, and -inf outside the kept support of top-k / top-p / min-p. NaN counts as -inf;
  // if any logit is +inf the distribution is uniform over the +inf entries. An entry whose
  // processed logit is below -87 (where exp leaves f32's normal range) has probability 0 and is
  // never drawn, though its logit stays finite when no filter applies.
  // `mask_support` false skips that last vocabulary-wide pass (-inf outside the support): the
  // same token and logprobs, `logits` left only partly processed, for callers that read nothing
  // after the draw (the engine: a fifth of a top-p row's time).
  SampleResult Sample(absl::Span<float> logits, bool mask_support = true);

  // A uniform in [0, 1) from this request's generator, for a draw made elsewhere (the backend's
  // device sampling): one draw per sampled token, as Sample makes.
  float DrawUniform();

  // Records a generated token (penalty counts). Called by the engine after Sample for the token
  // it keeps.
  void Accept(int32_t token);

  // The penalty stage of Sample alone (exposed for tests): O(distinct tokens seen), not O(vocab).
  void ApplyPenalties(absl::Span<float> logits) const;
  // The logit-bias stage of Sample alone (before the penalties): O(entries).
  void ApplyAllowedTokens(absl::Span<float> logits);
  // The bad-words stage (after the allowed-token mask): O(the sequences' tokens).
  void ApplyBadWords(absl::Span<float> logits) const;
  void ApplyLogitBias(absl::Span<float> logits) const;

  int32_t vocab_size() const { return vocab_size_; }
  const SamplingConfig& config() const { return config_; }

 private:
  void MarkSeen(int32_t token);
  // Sanitises NaN -> -inf, maps +inf to a finite distribution and returns the max logit.
  float Normalize(absl::Span<float> logits) const;
  // Temperature 0: argmax; logprobs at temperature 1.
  void SampleGreedy(absl::Span<const float> logits, float max, bool want_top,
                    SampleResult& result) const;
  // Draws from order_[0, n) (the kept support, in any order) or from every id with probs_ >=
  // threshold (`total`: their summed probs_, or < 0 to compute it).
  int32_t DrawFrom(int32_t n);
  int32_t DrawThreshold(float threshold, double total);
  void FillTopLogprobs(absl::Span<const float> logits, float shift, float log_z,
                       SampleResult& result) const;

  // Candidate-set stages over order_[0, n): each returns the new n. The kept support is always
  // a prefix of the vocabulary in RanksBefore order; SelectTopK leaves it sorted best first,
  // SelectTopP in no particular order (sorting a flat nucleus of thousands of ids was most of a
  // top-p draw).
  int32_t SelectTopK(absl::Span<const float> logits, int32_t k);
  int32_t SelectTopP(absl::Span<const float> logits, double total);
  // Sorts order_[0, n) by RanksBefore; `logits` shifted so that none is positive.
  void SortByRank(absl::Span<const float> logits, int32_t n);
  // Over a sorted order_[0, n): the shortest prefix holding top_p of `set_total`.
  int32_t CutTopP(int32_t n, double set_total);
  // The rest of SelectTopP's cut: order_[0, kept) are kept, holding `mass` (below `target`),
  // and the cut lies among the candidates whose rank keys are in keys_[0, m). Found by a radix
  // select over the keys (the mass per key byte, descending into the bucket where the cut
  // falls) instead of a sort; the kept ids are appended to order_, unsorted. Returns kept.
  int32_t CutRanked(int32_t m, int32_t kept, double mass, double target);
  int32_t CutMinP(int32_t n, bool sorted);
  void MaskOutside(absl::Span<float> logits, int32_t n, bool sorted) const;

  const int32_t vocab_size_;
  SamplingConfig config_;
  Xoshiro256 rng_;

  // Penalty state, [vocab_size] each. touched_ lists the ids with seen_ set (prompt or
  // generated), so Reset clears O(tokens seen) entries instead of the whole vocabulary.
  std::vector<uint8_t> seen_;
  std::vector<int32_t> gen_count_;
  std::vector<int32_t> touched_;  // capacity vocab_size: never reallocates
  bool tracks_penalties_ = false;  // the config has a penalty: seen_ and gen_count_ are kept
  // The last kMaxBadWordTokens - 1 generated tokens (a ring: recent_[(recent_count_ - 1 - k) %
  // size] is the k-th latest), for the bad words; recent_count_ counts every token accepted.
  std::array<int32_t, kMaxBadWordTokens - 1> recent_{};
  int64_t recent_count_ = 0;

  // Step scratch, [vocab_size] each.
  std::vector<float> probs_;    // exp(processed logit), unnormalised (max entry is 1)
  std::vector<int32_t> order_;  // candidate ids; a prefix is the kept support
  std::vector<uint64_t> keys_;  // SortByRank's and CutRanked's scratch
  std::vector<uint64_t> spare_keys_;  // CutRanked's second buffer
};

}  // namespace kvrm

#endif  // KVRM_RUNTIME_SAMPLER_H_
