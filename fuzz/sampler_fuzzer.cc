// Fuzzes the host Sampler (runtime/sampler.h) with what a client and a model control: sampling
// parameters that pass ValidateSamplingConfig (the server's own check), logits with NaN, +-inf,
// denormals and huge values, a prompt and generated tokens for the penalties, logit-bias entries.
// Invariants: every draw is an id inside the vocabulary, its logprob is never NaN, and a real
// choice (logprob above -inf) is never an id whose logit was NaN or -inf, nor one outside
// allowed_token_ids when they are given.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "runtime/sampler.h"

namespace {

// Reads little pieces off the input; zeros once it runs out.
class Bytes {
 public:
  Bytes(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  template <typename T>
  T Take() {
    T v{};
    const size_t n = std::min(sizeof(T), size_ - at_);
    std::memcpy(&v, data_ + at_, n);
    at_ += n;
    return v;
  }
  size_t left() const { return size_ - at_; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Bytes in(data, size);
  const int32_t vocab = 1 + in.Take<uint16_t>() % 2048;
  kvrm::SamplingConfig c;
  c.temperature = in.Take<float>();
  c.top_k = in.Take<int32_t>();
  c.top_p = in.Take<float>();
  c.min_p = in.Take<float>();
  c.repetition_penalty = in.Take<float>();
  c.presence_penalty = in.Take<float>();
  c.frequency_penalty = in.Take<float>();
  c.seed = in.Take<uint64_t>();
  c.logprobs = in.Take<uint8_t>() & 1;
  c.top_logprobs = in.Take<uint8_t>() % (kvrm::kMaxTopLogprobs + 1);
  c.num_logit_bias = in.Take<uint8_t>() % 8;
  for (int32_t i = 0; i < c.num_logit_bias; ++i) {
    c.logit_bias[i].token = in.Take<uint16_t>() % vocab;
    c.logit_bias[i].bias = in.Take<float>();
  }
  // allowed_token_ids: 0 (none, the common case) to 7 ids, sorted and without repeats as
  // request validation leaves them.
  std::vector<int32_t> allowed(in.Take<uint8_t>() % 8);
  for (int32_t& t : allowed) t = in.Take<uint16_t>() % vocab;
  std::sort(allowed.begin(), allowed.end());
  allowed.erase(std::unique(allowed.begin(), allowed.end()), allowed.end());
  if (!allowed.empty()) c.allowed_tokens = std::make_shared<const std::vector<int32_t>>(allowed);
  // The server's limits on top of the sampler's own (request_validation.cc).
  if (!kvrm::ValidateSamplingConfig(c).ok() || c.temperature > 100 ||
      c.repetition_penalty > 10 || std::abs(c.presence_penalty) > 2 ||
      std::abs(c.frequency_penalty) > 2) {
    return 0;
  }
  for (int32_t i = 0; i < c.num_logit_bias; ++i) {
    if (std::abs(c.logit_bias[i].bias) > 100) return 0;
  }
  std::vector<int32_t> prompt(in.Take<uint8_t>() % 32);
  for (int32_t& t : prompt) t = in.Take<uint16_t>() % vocab;

  kvrm::Sampler sampler(vocab);
  sampler.Reset(c, prompt);
  std::vector<float> logits(vocab);
  for (int step = 0; step < 3; ++step) {
    // Mostly ordinary values, with the input choosing where the odd ones go.
    for (int32_t v = 0; v < vocab; ++v) {
      if (in.left() >= sizeof(float)) {
        logits[v] = in.Take<float>();
      } else {
        logits[v] = static_cast<float>((v * 2654435761u + step) % 1000) / 100.0f - 5.0f;
      }
    }
    const std::vector<float> raw = logits;
    const kvrm::SampleResult r = sampler.Sample(absl::MakeSpan(logits));
    FUZZ_CHECK(r.token >= 0 && r.token < vocab);
    FUZZ_CHECK(!std::isnan(r.logprob));
    if (r.logprob != -INFINITY) {
      // Bias and penalties are finite, so an id whose logit was NaN or -inf stays out. (With no
      // drawable id at all the sampler returns id 0 with logprob -inf.)
      FUZZ_CHECK(!std::isnan(raw[r.token]) && raw[r.token] != -INFINITY);
      if (!allowed.empty()) {
        FUZZ_CHECK(std::find(allowed.begin(), allowed.end(), r.token) != allowed.end());
      }
    }
    FUZZ_CHECK(r.num_top >= 0 && r.num_top <= kvrm::kMaxTopLogprobs);
    for (int32_t i = 0; i < r.num_top; ++i) FUZZ_CHECK(r.top_ids[i] >= 0 && r.top_ids[i] < vocab);
    sampler.Accept(r.token);
  }
  return 0;
}
