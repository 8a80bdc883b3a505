// Sampling inside the step (Backend::DecodeAndSample, the CUDA backend's path), tested
// without a GPU: the procedure itself (runtime/device_sampling.h, the kernel's reference) against
// an independent computation of the kept distribution, and the engine's side through a CPU
// backend that samples the rows the engine marks with that procedure and poisons their logits,
// so a row the engine sampled on the host by mistake would show.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "common/logging.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "runtime/device_sampling.h"
#include "runtime/engine.h"
#include "runtime/model_bundle.h"
#include "tests/test_server.h"

namespace kvrm {
namespace {

std::vector<float> RandomLogits(int32_t vocab, uint32_t seed, float scale = 2.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, scale);
  std::vector<float> x(vocab);
  for (float& v : x) v = n(rng);
  return x;
}

// The kept, renormalised distribution by sorting ids (not the reference's code path).
std::vector<double> KeptDistribution(const std::vector<float>& x, const DeviceSampling& p) {
  const int32_t vocab = static_cast<int32_t>(x.size());
  const double mx = *std::max_element(x.begin(), x.end());
  std::vector<double> pr(vocab);
  for (int32_t v = 0; v < vocab; ++v) pr[v] = std::exp((x[v] - mx) / p.temperature);
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return pr[a] > pr[b]; });
  int32_t n = vocab;
  if (p.top_k > 0) n = std::min(n, p.top_k);
  double kept = 0;
  for (int32_t i = 0; i < n; ++i) kept += pr[order[i]];
  if (p.top_p < 1.0f) {
    double acc = 0;
    for (int32_t i = 0; i < n; ++i) {
      acc += pr[order[i]];
      if (acc >= p.top_p * kept) {
        n = i + 1;
        break;
      }
    }
  }
  while (n > 1 && pr[order[n - 1]] < p.min_p) --n;
  std::vector<double> out(vocab, 0.0);
  double total = 0;
  for (int32_t i = 0; i < n; ++i) total += pr[order[i]];
  for (int32_t i = 0; i < n; ++i) out[order[i]] = pr[order[i]] / total;
  return out;
}

TEST(SampleLikeDeviceTest, GreedyIsTheArgmaxWithTheLowestIdOnTies) {
  std::vector<double> scratch;
  std::vector<float> x = RandomLogits(1000, 1);
  const int32_t best = static_cast<int32_t>(std::max_element(x.begin(), x.end()) - x.begin());
  EXPECT_EQ(SampleLikeDevice(x, DeviceSampling{1, 0.0f}, scratch).token, best);
  x[17] = x[best];  // a tie: the lower id wins
  EXPECT_EQ(SampleLikeDevice(x, DeviceSampling{1, 0.0f}, scratch).token, std::min(17, best));
  // NaN never wins; all -inf picks id 0.
  x[3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_NE(SampleLikeDevice(x, DeviceSampling{1, 0.0f}, scratch).token, 3);
  std::vector<float> none(8, -std::numeric_limits<float>::infinity());
  EXPECT_EQ(SampleLikeDevice(none, DeviceSampling{1, 0.7f, 0, 1.0f, 0.0f, 0.5f}, scratch).token, 0);
}

// With stratified uniforms u_i = (i + 0.5) / N the draws hit each kept id exactly in proportion
// to its probability (to within one draw), so the comparison is sharp and deterministic.
TEST(SampleLikeDeviceTest, DrawsFollowTheKeptDistributionForEveryFilter) {
  std::vector<double> scratch;
  const int32_t vocab = 60, draws = 20000;
  const std::vector<float> x = RandomLogits(vocab, 7, 1.5f);
  const DeviceSampling cases[] = {
      {1, 1.0f, 0, 1.0f, 0.0f, 0},    {1, 0.7f, 10, 1.0f, 0.0f, 0},
      {1, 1.3f, 0, 0.8f, 0.0f, 0},    {1, 1.0f, 0, 1.0f, 0.1f, 0},
      {1, 0.9f, 20, 0.9f, 0.05f, 0},  {1, 2.0f, 1, 1.0f, 0.0f, 0},
  };
  for (const DeviceSampling& c : cases) {
    const std::vector<double> want = KeptDistribution(x, c);
    std::vector<int32_t> count(vocab, 0);
    for (int32_t i = 0; i < draws; ++i) {
      DeviceSampling p = c;
      p.uniform = static_cast<float>((i + 0.5) / draws);
      const int32_t t = SampleLikeDevice(x, p, scratch).token;
      ASSERT_GE(t, 0);
      ASSERT_LT(t, vocab);
      ++count[t];
    }
    for (int32_t v = 0; v < vocab; ++v) {
      EXPECT_NEAR(count[v], want[v] * draws, 2.0)
          << "T " << c.temperature << " top_k " << c.top_k << " top_p " << c.top_p << " min_p "
          << c.min_p << " id " << v;
    }
  }
}

TEST(SampleLikeDeviceTest, InfiniteLogitsAreUniformAndTheLastDrawStaysInTheSupport) {
  std::vector<double> scratch;
  std::vector<float> x = RandomLogits(100, 3);
  x[10] = x[70] = std::numeric_limits<float>::infinity();
  DeviceSampling p{1, 1.0f, 0, 1.0f, 0.0f, 0.25f};
  EXPECT_EQ(SampleLikeDevice(x, p, scratch).token, 10);
  p.uniform = 0.75f;
  EXPECT_EQ(SampleLikeDevice(x, p, scratch).token, 70);
  // A uniform just below 1 takes the last kept id, never one outside top-k.
  const std::vector<float> y = RandomLogits(100, 4);
  p = DeviceSampling{1, 1.0f, 5, 1.0f, 0.0f, std::nextafter(1.0f, 0.0f)};
  const std::vector<double> kept = KeptDistribution(y, p);
  int32_t last = 0;
  for (int32_t v = 0; v < 100; ++v) {
    if (kept[v] > 0) last = v;
  }
  EXPECT_EQ(SampleLikeDevice(y, p, scratch).token, last);
}

// ---- Through the engine ------------------------------------------------------------------------

// The CPU backend, plus sampling of the marked rows inside the step with the device procedure.
// Those rows' logits are overwritten with NaN: the engine must take their tokens, not sample.
class SamplingCpuBackend : public Backend {
 public:
  explicit SamplingCpuBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}

  absl::Status Decode(const StepDescriptor& step, float* logits) override {
    for (const DeviceSampling& s : step.sampling) {
      if (s.on_device) return absl::InternalError("Decode got rows marked for the device");
    }
    return inner_->Decode(step, logits);
  }
  absl::Status Prefill(const PrefillChunk& chunk, float* last_logits) override {
    return inner_->Prefill(chunk, last_logits);
  }
  bool fuses_prefill() const override { return inner_->fuses_prefill(); }
  absl::Status DecodeWithChunk(const PrefillChunk& chunk, float* last_logits,
                               const StepDescriptor& step, float* logits) override {
    return inner_->DecodeWithChunk(chunk, last_logits, step, logits);
  }
  absl::Status DecodeWithChunkAndSample(const PrefillChunk& chunk, float* last_logits,
                                        const StepDescriptor& step, float* logits,
                                        int32_t* tokens) override {
    ++calls;
    RETURN_IF_ERROR(inner_->DecodeWithChunk(chunk, last_logits, step, logits));
    return SampleMarked(step, logits, tokens);
  }
  bool samples_on_device() const override { return true; }
  absl::Status DecodeAndSample(const StepDescriptor& step, float* logits,
                               int32_t* tokens) override {
    ++calls;
    RETURN_IF_ERROR(inner_->Decode(step, logits));
    return SampleMarked(step, logits, tokens);
  }
  int32_t vocab_size() const override { return inner_->vocab_size(); }
  int32_t max_chunk_tokens() const override { return inner_->max_chunk_tokens(); }
  int32_t num_kv_pools() const override { return inner_->num_kv_pools(); }
  KvPool* kv_pool(int32_t rank) override { return inner_->kv_pool(rank); }
  absl::Status CreateHostTier(int64_t blocks) override { return inner_->CreateHostTier(blocks); }
  absl::Status CopyGroup(const TransferGroup& group) override { return inner_->CopyGroup(group); }

  std::atomic<int64_t> calls{0};
  std::atomic<int64_t> rows{0};

 private:
  // Checks every marked row as the CUDA backend's packing does (a bad row fails the step), then
  // samples them.
  absl::Status SampleMarked(const StepDescriptor& step, float* logits, int32_t* tokens) {
    const int32_t vocab = inner_->vocab_size();
    for (int32_t s = 0; s < step.max_slots; ++s) {
      if (!step.active[s] || !step.sampling[s].on_device) continue;
      RETURN_IF_ERROR(CheckDeviceSampling(step.sampling[s], vocab));
    }
    for (int32_t s = 0; s < step.max_slots; ++s) {
      if (!step.active[s] || !step.sampling[s].on_device) continue;
      float* row = logits + static_cast<size_t>(s) * vocab;
      tokens[s] = SampleLikeDevice(absl::MakeConstSpan(row, vocab), step.sampling[s], scratch_).token;
      std::fill(row, row + vocab, std::numeric_limits<float>::quiet_NaN());
      ++rows;
    }
    return absl::OkStatus();
  }

  std::unique_ptr<Backend> inner_;
  std::vector<double> scratch_;
};

struct Req {
  std::vector<int32_t> prompt;
  int32_t max_new_tokens = 24;
  SamplingConfig sampling;
  int32_t min_tokens = 0;
  std::vector<int32_t> stop_token_ids;
};

struct Outcome {
  std::vector<std::vector<int32_t>> tokens;
  EngineStats stats;
  int64_t backend_calls = 0, backend_rows = 0;
};

class DeviceSamplingTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_ = LoadTinyModel(); }
  static void TearDownTestSuite() { delete model_; }

  static std::vector<Req> Plain(int n, float temperature) {
    std::mt19937 rng(99);
    std::vector<Req> reqs(n);
    for (int i = 0; i < n; ++i) {
      const int len = 4 + static_cast<int>(rng() % 60);
      for (int t = 0; t < len; ++t) reqs[i].prompt.push_back(static_cast<int32_t>(rng() % 1000));
      reqs[i].max_new_tokens = 12 + static_cast<int32_t>(rng() % 30);
      reqs[i].sampling.temperature = temperature;
      reqs[i].sampling.top_k = temperature > 0 ? 40 : 0;
      reqs[i].sampling.top_p = temperature > 0 ? 0.9f : 1.0f;
      reqs[i].sampling.seed = 500 + i;
    }
    return reqs;
  }

  // Runs `reqs` (all at once) on an engine over the CPU backend, wrapped in SamplingCpuBackend
  // when `wrap`.
  static Outcome Run(const std::vector<Req>& reqs, bool wrap, EngineOptions o = {}) {
    o.slots = 4;
    o.threads = 2;
    o.prefill_chunk = 32;
    o.max_new_tokens = 256;
    SamplingCpuBackend* sampling = nullptr;
    if (wrap) {
      o.backend_factory = [&sampling](const ModelBundle& model, const EngineOptions& resolved)
          -> absl::StatusOr<std::unique_ptr<Backend>> {
        ASSIGN_OR_RETURN(std::unique_ptr<Backend> cpu, MakeCpuBackend(model, resolved));
        auto b = std::make_unique<SamplingCpuBackend>(std::move(cpu));
        sampling = b.get();
        return std::unique_ptr<Backend>(std::move(b));
      };
    }
    absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(model_, o);
    CHECK_OK(engine.status());
    (*engine)->Start();
    std::vector<std::shared_ptr<CollectingSink>> sinks;
    for (size_t i = 0; i < reqs.size(); ++i) {
      auto r = std::make_unique<GenerationRequest>();
      r->request_id = "r" + std::to_string(i);
      r->prompt = reqs[i].prompt;
      r->max_new_tokens = reqs[i].max_new_tokens;
      r->ignore_eos = true;
      r->min_tokens = reqs[i].min_tokens;
      r->stop_token_ids = reqs[i].stop_token_ids;
      r->sampling = reqs[i].sampling;
      r->arrival = absl::Now();
      auto sink = std::make_shared<CollectingSink>();
      r->sink = sink;
      sinks.push_back(sink);
      CHECK_OK((*engine)->Submit(std::move(r)).status());
    }
    Outcome out;
    for (size_t i = 0; i < sinks.size(); ++i) {
      FinishInfo info;
      out.tokens.push_back(sinks[i]->Wait(&info));
      EXPECT_TRUE(info.error.empty()) << "request " << i << ": " << info.error;
    }
    EXPECT_TRUE((*engine)->WaitIdle(absl::Seconds(10)));
    out.stats = (*engine)->Stats();
    if (sampling != nullptr) {
      out.backend_calls = sampling->calls;
      out.backend_rows = sampling->rows;
    }
    return out;
  }

  static ModelBundle* model_;
};
ModelBundle* DeviceSamplingTest::model_ = nullptr;

int64_t TokensAfterTheFirst(const Outcome& o) {
  int64_t n = 0;
  for (const auto& t : o.tokens) n += static_cast<int64_t>(t.size()) - 1;
  return n;
}

TEST_F(DeviceSamplingTest, GreedyRowsAreSampledInTheStepWithTheHostsTokens) {
  const std::vector<Req> reqs = Plain(10, 0.0f);
  const Outcome host = Run(reqs, false);
  EXPECT_EQ(host.stats.device_sampled_tokens_total, 0u);
  for (bool fuse : {false, true}) {
    EngineOptions o;
    o.fuse_prefill = fuse;
    const Outcome dev = Run(reqs, true, o);
    EXPECT_EQ(dev.tokens, host.tokens) << "fuse_prefill " << fuse;
    EXPECT_EQ(static_cast<int64_t>(dev.stats.device_sampled_tokens_total), dev.backend_rows);
    // Every token but a request's first (sampled from the prefill chunk's logits), in plain
    // steps and in steps that carry a chunk in the same pass alike.
    EXPECT_EQ(dev.backend_rows, TokensAfterTheFirst(dev));
    if (fuse) {
      EXPECT_GT(dev.stats.mixed_steps_total, 0u);
    }
  }
}

TEST_F(DeviceSamplingTest, RowsThatNeedTheHostSamplerStayOnTheHost) {
  std::vector<Req> reqs = Plain(6, 0.0f);
  reqs[1].sampling.logprobs = true;
  reqs[1].sampling.top_logprobs = 3;
  reqs[2].sampling.repetition_penalty = 1.5f;
  reqs[3].sampling.presence_penalty = 0.5f;
  reqs[3].sampling.frequency_penalty = 0.5f;
  reqs[4].sampling.logit_bias[0] = LogitBias{5, 3.0f};
  reqs[4].sampling.num_logit_bias = 1;
  // min_tokens with a stop token: held on the host until min_tokens are out, then the device.
  reqs[5].min_tokens = 7;
  reqs[5].stop_token_ids = {999};
  EngineOptions o;
  o.fuse_prefill = false;
  const Outcome host = Run(reqs, false, o);
  const Outcome dev = Run(reqs, true, o);
  EXPECT_EQ(dev.tokens, host.tokens);
  const int64_t on_device = (static_cast<int64_t>(dev.tokens[0].size()) - 1) +
                            (static_cast<int64_t>(dev.tokens[5].size()) - reqs[5].min_tokens);
  EXPECT_EQ(dev.backend_rows, on_device);
  EXPECT_EQ(static_cast<int64_t>(dev.stats.device_sampled_tokens_total), on_device);
}

TEST_F(DeviceSamplingTest, SeededSamplingInTheStepIsReproducibleAndSeedDependent) {
  std::vector<Req> reqs = Plain(8, 0.9f);
  EngineOptions o;
  o.fuse_prefill = false;
  const Outcome a = Run(reqs, true, o);
  const Outcome b = Run(reqs, true, o);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.backend_rows, TokensAfterTheFirst(a));
  for (Req& r : reqs) r.sampling.seed += 1000;
  const Outcome c = Run(reqs, true, o);
  int differ = 0;
  for (size_t i = 0; i < reqs.size(); ++i) differ += c.tokens[i] != a.tokens[i];
  EXPECT_GE(differ, 6) << "other seeds, other draws";
  const Outcome greedy = Run(Plain(8, 0.0f), true, o);
  int from_greedy = 0;
  for (size_t i = 0; i < reqs.size(); ++i) from_greedy += greedy.tokens[i] != a.tokens[i];
  EXPECT_GE(from_greedy, 6) << "temperature 0.9 samples";
}

TEST_F(DeviceSamplingTest, TopKBeyondTheVocabularyIsOffOnTheDeviceAsOnTheHost) {
  // A client's top_k above the vocabulary is valid (off) for the host sampler; passed to the
  // device as it is, it would fail the whole step and every request in it.
  std::vector<Req> reqs = Plain(6, 0.9f);
  for (size_t i = 0; i < reqs.size(); i += 2) reqs[i].sampling.top_k = 1 << 20;
  EngineOptions o;
  o.fuse_prefill = false;
  const Outcome dev = Run(reqs, true, o);
  EXPECT_EQ(dev.backend_rows, TokensAfterTheFirst(dev));
  std::vector<Req> off = reqs;
  for (size_t i = 0; i < off.size(); i += 2) off[i].sampling.top_k = 0;
  EXPECT_EQ(dev.tokens, Run(off, true, o).tokens) << "top_k past the vocabulary is top_k off";
}

TEST_F(DeviceSamplingTest, OffItNeverAsksTheBackend) {
  EngineOptions o;
  o.fuse_prefill = false;
  o.device_sampling = false;
  const Outcome dev = Run(Plain(4, 0.0f), true, o);
  EXPECT_EQ(dev.backend_calls, 0);
  EXPECT_EQ(dev.stats.device_sampled_tokens_total, 0u);
  EXPECT_EQ(dev.tokens, Run(Plain(4, 0.0f), false, o).tokens);
}

}  // namespace
}  // namespace kvrm
