#include "runtime/sampler.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "runtime/sampler_kernels.h"

namespace kvrm {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPosInf = std::numeric_limits<float>::infinity();



// Strict weak order "a ranks before b": higher logit first, ties broken by lower id, so every
// selection below is deterministic.
struct RanksBefore {
  const float* logits;
  bool operator()(int32_t a, int32_t b) const {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  }
};

// Top-k up to this many is selected with a heap in one pass; larger k with nth_element.
constexpr int32_t kHeapTopKMax = 1024;

}  // namespace

absl::Status ValidateSamplingConfig(const SamplingConfig& c) {
  auto bad = [](absl::string_view field, double value, absl::string_view want) {
    return absl::InvalidArgumentError(absl::StrCat(field, " = ", value, ": want ", want));
  };
  if (!std::isfinite(c.temperature) || c.temperature < 0) {
    return bad("temperature", c.temperature, "finite and >= 0");
  }
  if (c.top_k < 0) return bad("top_k", c.top_k, ">= 0 (0 = off)");
  if (!(c.top_p > 0 && c.top_p <= 1)) return bad("top_p", c.top_p, "in (0, 1]");
  if (!(c.min_p >= 0 && c.min_p <= 1)) return bad("min_p", c.min_p, "in [0, 1]");
  if (!std::isfinite(c.repetition_penalty) || c.repetition_penalty <= 0) {
    return bad("repetition_penalty", c.repetition_penalty, "finite and > 0 (1 = off)");
  }
  if (!std::isfinite(c.presence_penalty)) {
    return bad("presence_penalty", c.presence_penalty, "finite");
  }
  if (!std::isfinite(c.frequency_penalty)) {
    return bad("frequency_penalty", c.frequency_penalty, "finite");
  }
  if (c.num_logit_bias < 0 || c.num_logit_bias > kMaxLogitBias) {
    return bad("num_logit_bias", c.num_logit_bias, absl::StrCat("in [0, ", kMaxLogitBias, "]"));
  }
  for (int32_t i = 0; i < c.num_logit_bias; ++i) {
    if (c.logit_bias[i].token < 0) return bad("logit_bias token", c.logit_bias[i].token, ">= 0");
    if (!std::isfinite(c.logit_bias[i].bias)) {
      return bad("logit_bias value", c.logit_bias[i].bias, "finite");
    }
  }
  if (c.top_logprobs < 0 || c.top_logprobs > kMaxTopLogprobs) {
    return bad("top_logprobs", c.top_logprobs, absl::StrCat("in [0, ", kMaxTopLogprobs, "]"));
  }
  return absl::OkStatus();
}

absl::Status ValidateSamplingTokens(const SamplingConfig& c, int32_t vocab_size) {
  for (int32_t i = 0; i < c.num_logit_bias; ++i) {
    if (c.logit_bias[i].token < 0 || c.logit_bias[i].token >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("sampling.logit_bias: token ",
                                                     c.logit_bias[i].token, " is not in [0, ",
                                                     vocab_size, ")"));
    }
  }
  if (c.bad_words) {
    if (c.bad_words->size() > static_cast<size_t>(kMaxBadWordSequences)) {
      return absl::InvalidArgumentError(absl::StrCat("sampling.bad_words: ", c.bad_words->size(),
                                                     " token sequences; at most ",
                                                     kMaxBadWordSequences));
    }
    for (size_t w = 0; w < c.bad_words->size(); ++w) {
      const std::vector<int32_t>& word = (*c.bad_words)[w];
      if (word.empty() || word.size() > static_cast<size_t>(kMaxBadWordTokens)) {
        return absl::InvalidArgumentError(absl::StrCat("sampling.bad_words[", w, "]: ", word.size(),
                                                       " tokens; 1 to ", kMaxBadWordTokens));
      }
      for (int32_t token : word) {
        if (token < 0 || token >= vocab_size) {
          return absl::InvalidArgumentError(absl::StrCat(
              "sampling.bad_words[", w, "]: token ", token, " is not in [0, ", vocab_size, ")"));
        }
      }
    }
  }
  if (!c.allowed_tokens) return absl::OkStatus();
  if (c.allowed_tokens->empty() || c.allowed_tokens->size() > static_cast<size_t>(vocab_size)) {
    return absl::InvalidArgumentError(absl::StrCat("sampling.allowed_token_ids: ",
                                                   c.allowed_tokens->size(),
                                                   " ids, must be 1 to ", vocab_size));
  }
  for (int32_t token : *c.allowed_tokens) {
    if (token < 0 || token >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("sampling.allowed_token_ids: token ", token,
                                                     " is not in [0, ", vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

Sampler::Sampler(int32_t vocab_size)
    : vocab_size_(vocab_size),
      seen_(vocab_size, 0),
      gen_count_(vocab_size, 0),
      probs_(vocab_size, 0.0f),
      order_(vocab_size, 0),
      keys_(vocab_size, 0),
      spare_keys_(vocab_size, 0) {
  CHECK(vocab_size > 0) << "vocab_size " << vocab_size;
  touched_.reserve(vocab_size);  // At most one entry per id, so push_back never reallocates.
}

void Sampler::Reset(const SamplingConfig& config, absl::Span<const int32_t> prompt_tokens) {
  CHECK(ValidateSamplingConfig(config).ok()) << "validate SamplingConfig at admission";
  config_ = config;
  // The seen ids and generated counts serve only the penalties: without any, not kept.
  tracks_penalties_ = config.repetition_penalty != 1.0f || config.presence_penalty != 0.0f ||
                      config.frequency_penalty != 0.0f;
  rng_.Seed(config.seed);
  for (int32_t token : touched_) {
    seen_[token] = 0;
    gen_count_[token] = 0;
  }
  touched_.clear();  // Keeps capacity.
  recent_count_ = 0;
  for (int32_t token : prompt_tokens) MarkSeen(token);
  const absl::Status tokens = ValidateSamplingTokens(config, vocab_size_);
  CHECK(tokens.ok()) << tokens;
}

void Sampler::MarkSeen(int32_t token) {
  CHECK(token >= 0 && token < vocab_size_) << "token " << token << " vocab " << vocab_size_;
  if (!tracks_penalties_) return;
  if (seen_[token] == 0) {
    seen_[token] = 1;
    touched_.push_back(token);
  }
}

float Sampler::DrawUniform() {
  // Rounding to float may reach 1.0f; the draw must stay below it.
  return std::min(static_cast<float>(rng_.NextDouble()), std::nextafter(1.0f, 0.0f));
}

void Sampler::Accept(int32_t token) {
  MarkSeen(token);
  if (tracks_penalties_) ++gen_count_[token];
  recent_[recent_count_ % recent_.size()] = token;
  ++recent_count_;
}

void Sampler::ApplyBadWords(absl::Span<float> logits) const {
  if (!config_.bad_words) return;
  const int64_t n = static_cast<int64_t>(recent_.size());
  for (const std::vector<int32_t>& word : *config_.bad_words) {
    const int64_t prefix = static_cast<int64_t>(word.size()) - 1;
    if (prefix > recent_count_) continue;  // fewer tokens generated than the word's start
    // The generated tokens' last `prefix` are word[0, prefix)?
    bool match = true;
    for (int64_t k = 0; k < prefix && match; ++k) {
      match = recent_[(recent_count_ - prefix + k) % n] == word[k];
    }
    if (match) logits[word.back()] = kNegInf;
  }
}

void Sampler::ApplyPenalties(absl::Span<float> logits) const {
  const float rep = config_.repetition_penalty;
  const float presence = config_.presence_penalty;
  const float frequency = config_.frequency_penalty;
  if (rep == 1.0f && presence == 0.0f && frequency == 0.0f) return;
  // Every id with a nonzero count is also in touched_, so this visits all affected logits.
  for (int32_t token : touched_) {
    float x = logits[token];
    if (rep != 1.0f) x = x > 0 ? x / rep : x * rep;
    const int32_t count = gen_count_[token];
    if (count > 0) x -= presence + frequency * static_cast<float>(count);
    logits[token] = x;
  }
}

void Sampler::ApplyAllowedTokens(absl::Span<float> logits) {
  if (!config_.allowed_tokens) return;
  const std::vector<int32_t>& ids = *config_.allowed_tokens;
  // probs_ is free until the draw: it keeps the allowed logits while the rest become -inf.
  for (size_t j = 0; j < ids.size(); ++j) probs_[j] = logits[ids[j]];
  std::fill(logits.begin(), logits.end(), kNegInf);
  for (size_t j = 0; j < ids.size(); ++j) logits[ids[j]] = probs_[j];
}

void Sampler::ApplyLogitBias(absl::Span<float> logits) const {
  for (int32_t i = 0; i < config_.num_logit_bias; ++i) {
    logits[config_.logit_bias[i].token] += config_.logit_bias[i].bias;
  }
}

float Sampler::Normalize(absl::Span<float> logits) const {
  float max = sampler_kernels::SanitizeAndMax(logits.data(), static_cast<int32_t>(logits.size()));
  if (max == kPosInf) {
    // The limit of softmax as the +inf entries grow together: uniform over them.
    for (float& x : logits) x = x == kPosInf ? 0.0f : kNegInf;
    max = 0;
  }
  return max;
}

SampleResult Sampler::Sample(absl::Span<float> logits, bool mask_support) {
  CHECK(static_cast<int32_t>(logits.size()) == vocab_size_)
      << "logits " << logits.size() << " vocab " << vocab_size_;
  ApplyAllowedTokens(logits);
  ApplyBadWords(logits);
  ApplyLogitBias(logits);
  ApplyPenalties(logits);
  const float max = Normalize(logits);
  SampleResult result;
  if (max == kNegInf) {
    // Every logit is -inf or NaN: there is no distribution. Token 0 keeps the engine going with a
    // valid id; logprob -inf tells the client it was not a real choice.
    result.token = 0;
    result.logprob = kNegInf;
    return result;
  }
  const bool want_top = config_.logprobs && config_.top_logprobs > 0;

  if (config_.temperature <= 0) {
    SampleGreedy(logits, max, want_top, result);
    return result;
  }

  // Shifting by the max first keeps (x - max) / T <= 0, so a tiny temperature cannot overflow.
  // The max entry gets exactly 1; entries below exp's f32 range get 0.
  const double total = sampler_kernels::ShiftScaleExp(logits.data(), max, config_.temperature,
                                                      probs_.data(), vocab_size_);
  const float log_z = static_cast<float>(std::log(total));
  if (want_top) FillTopLogprobs(logits, 0.0f, log_z, result);

  // n >= 0: the kept support is order_[0, n) (sorted best first when `sorted`). n < 0: no
  // candidate set was needed.
  int32_t n = -1;
  bool sorted = true;
  if (config_.top_k > 0 && config_.top_k < vocab_size_) n = SelectTopK(logits, config_.top_k);
  if (config_.top_p < 1) {
    if (n < 0) {
      n = SelectTopP(logits, total);
      sorted = false;
    } else {
      double set_total = 0;
      for (int32_t j = 0; j < n; ++j) set_total += probs_[order_[j]];
      n = CutTopP(n, set_total);
    }
  }
  if (n >= 0 && config_.min_p > 0) n = CutMinP(n, sorted);

  if (n >= 0) {
    result.token = DrawFrom(n);
  } else if (config_.min_p > 0) {
    result.token = DrawThreshold(config_.min_p, /*total=*/-1);
  } else {
    result.token = DrawThreshold(0.0f, total);
  }
  result.logprob = logits[result.token] - log_z;
  if (!mask_support) return result;
  if (n >= 0) {
    MaskOutside(logits, n, sorted);
  } else if (config_.min_p > 0) {
    for (int32_t i = 0; i < vocab_size_; ++i) {
      if (probs_[i] < config_.min_p) logits[i] = kNegInf;
    }
  }
  return result;
}

void Sampler::SampleGreedy(absl::Span<const float> logits, float max, bool want_top,
                           SampleResult& result) const {
  // The first index of the max is the lowest id among ties.
  const int32_t best = sampler_kernels::FirstIndexOf(logits.data(), vocab_size_, max);
  result.token = best;
  // Greedy needs no normaliser: the vocab-wide exp sum (a third of a 16-row step's host time)
  // runs only when the request asked for logprobs.
  if (!config_.logprobs) return;
  double z = 0;
  for (float x : logits) z += std::exp(x - max);
  const float log_z = static_cast<float>(std::log(z));
  result.logprob = -log_z;  // logits[best] - max == 0
  if (want_top) FillTopLogprobs(logits, max, log_z, result);
}

int32_t Sampler::SelectTopK(absl::Span<const float> logits, int32_t k) {
  const RanksBefore before{logits.data()};
  if (k > kHeapTopKMax) {
    // O(vocab) selection, then sort only the k winners.
    for (int32_t i = 0; i < vocab_size_; ++i) order_[i] = i;
    std::nth_element(order_.begin(), order_.begin() + (k - 1), order_.end(), before);
    std::sort(order_.begin(), order_.begin() + k, before);
  } else {
    // One pass keeping the k best in a heap whose top is the one ranking last: an id enters
    // only when its logit beats that one's (ids come in increasing order, so an equal logit
    // never ranks before it), which after the first few hundred ids almost never happens.
    const auto first = order_.begin(), end = order_.begin() + k;
    for (int32_t i = 0; i < k; ++i) order_[i] = i;
    std::make_heap(first, end, before);
    float worst = logits[order_[0]];
    for (int32_t i = k; i < vocab_size_; ++i) {
      if (!(logits[i] > worst)) continue;
      std::pop_heap(first, end, before);
      order_[k - 1] = i;
      std::push_heap(first, end, before);
      worst = logits[order_[0]];
    }
    std::sort_heap(first, end, before);  // best first
  }
  // Entries whose probability is 0 (-inf, or underflow) can never be drawn: drop them so the
  // support we report and mask is the real one. The best entry has probability 1, so n >= 1.
  int32_t n = k;
  while (n > 1 && probs_[order_[n - 1]] == 0) --n;
  return n;
}

namespace {

// RanksBefore as one integer: the logits here are shifted so the max is +0 and the rest negative
// (or -inf), and for those a higher value has a smaller bit pattern; the id breaks ties. Keys
// compare (and sort, and split by byte) without the comparator's two indirect loads.
uint64_t RankKey(absl::Span<const float> logits, int32_t id) {
  const float x = logits[id] + 0.0f;  // -0 ranks as +0 (RanksBefore compares values)
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return (static_cast<uint64_t>(bits) << 32) | static_cast<uint32_t>(id);
}

int32_t KeyId(uint64_t key) { return static_cast<int32_t>(key & 0xffffffffu); }

// Below this many candidates the rest of a radix select is a sort.
constexpr int32_t kRadixSmall = 48;

}  // namespace

void Sampler::SortByRank(absl::Span<const float> logits, int32_t n) {
  for (int32_t j = 0; j < n; ++j) keys_[j] = RankKey(logits, order_[j]);
  std::sort(keys_.begin(), keys_.begin() + n);
  for (int32_t j = 0; j < n; ++j) order_[j] = KeyId(keys_[j]);
}

int32_t Sampler::CutRanked(int32_t m, int32_t kept, double mass, double target) {
  uint64_t* cur = keys_.data();
  uint64_t* next = spare_keys_.data();
  // Invariant: every candidate ranking before those in cur[0, m) is kept (order_[0, kept)),
  // with `mass` their summed probabilities, below the target; the cut lies inside cur[0, m).
  for (int shift = 56; shift >= 0 && m > kRadixSmall; shift -= 8) {
    std::array<double, 256> bucket_mass{};
    for (int32_t j = 0; j < m; ++j) {
      bucket_mass[(cur[j] >> shift) & 0xff] += probs_[KeyId(cur[j])];
    }
    int32_t cut = 0;
    while (cut < 256 && mass + bucket_mass[cut] < target) mass += bucket_mass[cut++];
    if (cut == 256) {
      // Rounding left the whole set just short of the target: keep everything, as CutTopP.
      for (int32_t j = 0; j < m; ++j) order_[kept++] = KeyId(cur[j]);
      return kept;
    }
    int32_t left = 0;
    for (int32_t j = 0; j < m; ++j) {
      const int32_t b = static_cast<int32_t>((cur[j] >> shift) & 0xff);
      if (b < cut) {
        order_[kept++] = KeyId(cur[j]);
      } else if (b == cut) {
        next[left++] = cur[j];
      }
    }
    std::swap(cur, next);
    m = left;
  }
  // The last few in rank order, up to and including the one whose mass reaches the target.
  std::sort(cur, cur + m);
  for (int32_t j = 0; j < m; ++j) {
    const int32_t id = KeyId(cur[j]);
    order_[kept++] = id;
    mass += probs_[id];
    if (mass >= target) break;
  }
  return kept;
}

int32_t Sampler::SelectTopP(absl::Span<const float> logits, double total) {
  const double target = config_.top_p * total;
  // One pass: the mass per probability bucket (exponent and 3 mantissa bits of the positive
  // float, so buckets order as the probabilities do), two interleaved copies so that ids in one
  // bucket do not chain their additions. Probabilities are monotone in the logits, so every id
  // of a higher bucket ranks before every id of a lower one.
  constexpr int kShift = 20, kBuckets = 1 << (31 - kShift);
  std::array<std::array<double, kBuckets>, 2> mass{};
  const float* p = probs_.data();
  auto bucket = [](float v) {
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof(bits));
    return bits >> kShift;
  };
  int32_t i = 0;
  for (; i + 1 < vocab_size_; i += 2) {
    mass[0][bucket(p[i])] += p[i];
    mass[1][bucket(p[i + 1])] += p[i + 1];
  }
  if (i < vocab_size_) mass[0][bucket(p[i])] += p[i];
  // The bucket where the cumulative mass from the top reaches the target.
  double above = 0;
  int32_t cut = kBuckets - 1;
  for (; cut > 0; --cut) {
    const double m = mass[0][cut] + mass[1][cut];
    if (above + m >= target) break;
    above += m;
  }
  // Ids above the cut bucket are kept; those in it are ranked to find the cut. (Bucket 0 holds
  // the ids of probability 0, never kept; reaching it means rounding kept everything else.)
  int32_t kept = 0, m = 0;
  for (int32_t id = 0; id < vocab_size_; ++id) {
    if (!(p[id] > 0)) continue;
    const int32_t b = static_cast<int32_t>(bucket(p[id]));
    if (b > cut) {
      order_[kept++] = id;
    } else if (b == cut && cut > 0) {
      keys_[m++] = RankKey(logits, id);
    }
  }
  return CutRanked(m, kept, above, target);
}

int32_t Sampler::CutTopP(int32_t n, double set_total) {
  const double target = config_.top_p * set_total;
  double cum = 0;
  for (int32_t j = 0; j < n; ++j) {
    cum += probs_[order_[j]];
    if (cum >= target) return j + 1;
  }
  return n;  // Rounding left cum just short of the target: keep everything collected.
}

int32_t Sampler::CutMinP(int32_t n, bool sorted) {
  // The max entry has probability 1 (unnormalised), so min-p relative to the max prob is a plain
  // threshold on probs_; renormalisation after top-k/p leaves that ratio unchanged. The max is
  // always kept (min_p <= 1).
  if (sorted) {
    int32_t kept = 1;
    while (kept < n && probs_[order_[kept]] >= config_.min_p) ++kept;
    return kept;
  }
  int32_t kept = 0;
  for (int32_t j = 0; j < n; ++j) {
    if (probs_[order_[j]] >= config_.min_p) order_[kept++] = order_[j];
  }
  return kept;
}

int32_t Sampler::DrawFrom(int32_t n) {
  double total = 0;
  for (int32_t j = 0; j < n; ++j) total += probs_[order_[j]];
  const double target = rng_.NextDouble() * total;
  double cum = 0;
  for (int32_t j = 0; j < n; ++j) {
    cum += probs_[order_[j]];
    if (cum > target) return order_[j];
  }
  return order_[n - 1];  // Only reachable through rounding; it has probability > 0.
}

int32_t Sampler::DrawThreshold(float threshold, double total) {
  if (total < 0) total = sampler_kernels::SumAtLeast(probs_.data(), vocab_size_, threshold);
  const double target = rng_.NextDouble() * total;
  const int32_t pick =
      sampler_kernels::DrawAtLeast(probs_.data(), vocab_size_, threshold, target);
  return std::max(pick, 0);  // -1 only if nothing is kept, which the max entry (p = 1) rules out
}

void Sampler::MaskOutside(absl::Span<float> logits, int32_t n, bool sorted) const {
  // The kept support is exactly the first n ids in RanksBefore order, so everything ranking after
  // the last kept id is outside it.
  int32_t last = order_[n - 1];
  if (!sorted) {
    uint64_t worst = RankKey(logits, last);
    for (int32_t j = 0; j < n - 1; ++j) worst = std::max(worst, RankKey(logits, order_[j]));
    last = KeyId(worst);
  }
  const float last_x = logits[last];
  for (int32_t i = 0; i < vocab_size_; ++i) {
    if (logits[i] < last_x || (logits[i] == last_x && i > last)) logits[i] = kNegInf;
  }
}

namespace {

// The `want` (<= kMaxTopLogprobs) largest logits that are not -inf or NaN, best first (ties:
// lowest id), into vals / ids; returns how many.
int32_t TopEntries(absl::Span<const float> logits, int32_t want,
                   std::array<float, kMaxTopLogprobs>& vals,
                   std::array<int32_t, kMaxTopLogprobs>& ids) {
  int32_t count = 0;
  if (want <= 0) return 0;
  // One pass with an insertion-sorted array of at most 20: most ids fail the first compare.
  for (int32_t i = 0; i < static_cast<int32_t>(logits.size()); ++i) {
    const float x = logits[i];
    if (!(x > kNegInf)) continue;                           // -inf and NaN
    if (count == want && !(x > vals[count - 1])) continue;  // ties keep the lower id
    int32_t pos = count < want ? count++ : want - 1;
    while (pos > 0 && vals[pos - 1] < x) {
      vals[pos] = vals[pos - 1];
      ids[pos] = ids[pos - 1];
      --pos;
    }
    vals[pos] = x;
    ids[pos] = i;
  }
  return count;
}

}  // namespace

SampleResult ScoreToken(absl::Span<const float> logits, int32_t token, int32_t top_n) {
  SampleResult r;
  r.token = token;
  const int32_t want = std::clamp(top_n, 0, kMaxTopLogprobs);
  float max = kNegInf;
  for (float x : logits) max = x > max ? x : max;  // NaN never wins
  if (!(max > kNegInf)) {
    r.logprob = kNegInf;
    return r;
  }
  if (std::isinf(max)) {
    // As Sample does: uniform over the +inf entries.
    int64_t n = 0;
    for (float x : logits) n += x == max;
    const float lp = -static_cast<float>(std::log(static_cast<double>(n)));
    r.logprob = logits[token] == max ? lp : kNegInf;
    r.rank = logits[token] == max ? 1 : 0;
    for (int32_t i = 0; i < static_cast<int32_t>(logits.size()) && r.num_top < want; ++i) {
      if (logits[i] != max) continue;
      r.top_ids[r.num_top] = i;
      r.top_logprobs[r.num_top++] = lp;
    }
    return r;
  }
  double total = 0;
  for (float x : logits) {
    if (x > kNegInf) total += std::exp(static_cast<double>(x) - max);
  }
  const double log_z = max + std::log(total);
  r.logprob = logits[token] > kNegInf ? static_cast<float>(logits[token] - log_z) : kNegInf;
  if (r.logprob > kNegInf) {
    r.rank = 1;
    for (float x : logits) r.rank += x > logits[token];
  }
  r.num_top = TopEntries(logits, want, r.top_logprobs, r.top_ids);
  for (int32_t j = 0; j < r.num_top; ++j) {
    r.top_logprobs[j] = static_cast<float>(r.top_logprobs[j] - log_z);
  }
  return r;
}

void Sampler::FillTopLogprobs(absl::Span<const float> logits, float shift, float log_z,
                              SampleResult& result) const {
  // Normalize left no NaN: the entries are those of the processed distribution.
  result.num_top = TopEntries(logits, std::min(config_.top_logprobs, kMaxTopLogprobs),
                              result.top_logprobs, result.top_ids);
  for (int32_t j = 0; j < result.num_top; ++j) {
    result.top_logprobs[j] = result.top_logprobs[j] - shift - log_z;
  }
}

}  // namespace kvrm
