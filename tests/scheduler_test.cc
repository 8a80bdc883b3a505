// The scheduler on a simulated clock: a scripted backend (deterministic tokens, simulated step
// costs that advance a ManualClock) under the real engine, stepped from the test thread. No
// sleeps; every assertion is about order, states, budgets and accounting.
#include <functional>
#include <limits>
#include <map>
#include <random>

#include "absl/strings/match.h"
#include "common/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/backend.h"
#include "runtime/clock.h"
#include "runtime/engine.h"
#include "runtime/model_bundle.h"
#include "tests/test_server.h"

namespace kvrm {
namespace {

constexpr absl::Duration kDecodeCost = absl::Milliseconds(10);
constexpr absl::Duration kPrefillCostPerToken = absl::Microseconds(100);
constexpr absl::Duration kRowCost = absl::Microseconds(100);  // a row of a fused pass

// Tokens follow from (input token, position); the clock advances by each step's cost.
class ScriptedBackend : public Backend {
 public:
  struct StepLog {
    int32_t prefill_slot = -1;
    int32_t prefill_tokens = 0;
    int32_t decode_rows = 0;
    // The step's number (the chunks of a PrefillChunks pass share one; decode rows are logged
    // on the step's last chunk, or on an entry of their own).
    int32_t pass = 0;
  };

  ScriptedBackend(int32_t vocab, int64_t blocks, int32_t block_tokens, int32_t chunk,
                  ManualClock* clock)
      : vocab_(vocab), chunk_(chunk), clock_(clock) {
    KvPoolShape shape;
    shape.num_layers = 1;
    shape.kv_heads = 1;
    shape.head_dim = 4;
    shape.block_tokens = block_tokens;
    shape.num_blocks = blocks;
    pool_ = *KvPool::Create(shape);
  }
  static int32_t NextToken(int32_t token, int32_t position) {
    return (token * 31 + position * 7) % 900;  // never a special (eos) id of the tiny model
  }
  absl::Status Decode(const StepDescriptor& step, float* logits) override {
    int32_t rows = 0;
    for (int32_t s = 0; s < step.max_slots; ++s) {
      if (!step.active[s]) continue;
      ++rows;
      float* l = logits + static_cast<size_t>(s) * vocab_;
      std::fill(l, l + vocab_, 0.0f);
      l[NextToken(step.token[s], step.position[s])] = 10.0f;
    }
    clock_->Advance(fused_ ? pass_fixed_cost_ + kRowCost * rows : kDecodeCost);
    std::lock_guard<std::mutex> lock(mu_);
    if (log_.empty() || log_.back().decode_rows != 0) log_.push_back({-1, 0, 0, ++passes_});
    log_.back().decode_rows = rows;
    return absl::OkStatus();
  }
  // Fused (set_fused): one pass costs a fixed part (its reads) plus kRowCost per row, decode
  // rows and chunk tokens alike; logged as one step with both.
  bool fuses_prefill() const override { return fused_; }
  absl::Status DecodeWithChunk(const PrefillChunk& chunk, float* last_logits,
                               const StepDescriptor& step, float* logits) override {
    const int32_t n = static_cast<int32_t>(chunk.tokens.size());
    if (last_logits) {
      std::fill(last_logits, last_logits + vocab_, 0.0f);
      last_logits[NextToken(chunk.tokens.back(), chunk.start + n - 1)] = 10.0f;
    }
    clock_->Advance(kRowCost * n);
    {
      std::lock_guard<std::mutex> lock(mu_);
      log_.push_back({chunk.slot, n, 0, ++passes_});
    }
    return Decode(step, logits);  // the fixed part and the decode rows' cost
  }
  // set_chunks_per_pass(k > 1): several chunks a pass, each logged with the pass's number (the
  // decode rows, when the step has some, on the last); the pass costs one chunk of all their
  // tokens (fused: their rows).
  int32_t max_chunks_per_pass() const override { return chunks_per_pass_; }
  absl::Status PrefillChunks(absl::Span<const PrefillChunk> chunks,
                             absl::Span<float* const> chunk_logits, const StepDescriptor* step,
                             float* logits) override {
    if (chunks.size() > static_cast<size_t>(chunks_per_pass_)) {
      return absl::InvalidArgumentError("more chunks than the pass takes");
    }
    int32_t tokens = 0;
    int32_t pass = 0;
    for (size_t k = 0; k < chunks.size(); ++k) {
      const int32_t n = static_cast<int32_t>(chunks[k].tokens.size());
      tokens += n;
      WriteChunkLogits(chunks[k], chunk_logits[k]);
      std::lock_guard<std::mutex> lock(mu_);
      if (k == 0) pass = ++passes_;
      log_.push_back({chunks[k].slot, n, 0, pass});
    }
    if (tokens > chunk_) return absl::InvalidArgumentError("more tokens than the pass takes");
    if (step != nullptr) {
      clock_->Advance(kRowCost * tokens);
      return Decode(*step, logits);
    }
    clock_->Advance(prefill_fixed_cost_ + kPrefillCostPerToken * tokens);
    return absl::OkStatus();
  }
  void set_chunks_per_pass(int32_t k) { chunks_per_pass_ = k; }
  void WriteChunkLogits(const PrefillChunk& chunk, float* last_logits) {
    const int32_t n = static_cast<int32_t>(chunk.tokens.size());
    if (last_logits) {
      // Every row's logits for a prompt being scored (all_logits), else the last row's.
      const int32_t rows = chunk.all_logits ? n : 1;
      for (int32_t r = 0; r < rows; ++r) {
        float* l = last_logits + static_cast<size_t>(r) * vocab_;
        const int32_t i = chunk.all_logits ? r : n - 1;
        std::fill(l, l + vocab_, 0.0f);
        l[NextToken(chunk.tokens[i], chunk.start + i)] = 10.0f;
      }
    }
  }
  absl::Status Prefill(const PrefillChunk& chunk, float* last_logits) override {
    const int32_t n = static_cast<int32_t>(chunk.tokens.size());
    WriteChunkLogits(chunk, last_logits);
    clock_->Advance(prefill_fixed_cost_ + kPrefillCostPerToken * n);
    std::lock_guard<std::mutex> lock(mu_);
    log_.push_back({chunk.slot, n, 0, ++passes_});
    return absl::OkStatus();
  }
  int32_t vocab_size() const override { return vocab_; }
  int32_t max_chunk_tokens() const override { return chunk_; }
  bool computes_all_logits() const override { return !fused_; }
  // A cost every chunk pays whatever its size (a CPU chunk reads every weight once).
  void set_prefill_fixed_cost(absl::Duration d) { prefill_fixed_cost_ = d; }
  void set_fused(absl::Duration pass_fixed_cost) {
    fused_ = true;
    pass_fixed_cost_ = pass_fixed_cost;
  }
  int32_t num_kv_pools() const override { return 1; }
  KvPool* kv_pool(int32_t) override { return pool_.get(); }

  std::vector<StepLog> TakeLog() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(log_, {});
  }

 private:
  const int32_t vocab_;
  const int32_t chunk_;
  ManualClock* clock_;
  absl::Duration prefill_fixed_cost_ = absl::ZeroDuration();
  bool fused_ = false;
  absl::Duration pass_fixed_cost_ = absl::ZeroDuration();
  int32_t chunks_per_pass_ = 1;
  std::unique_ptr<KvPool> pool_;
  std::mutex mu_;
  std::vector<StepLog> log_;
  int32_t passes_ = 0;
};

class RecordingSink : public RequestSink {
 public:
  void OnChunk(StreamChunk chunk) override {
    tokens.insert(tokens.end(), chunk.token_ids.begin(), chunk.token_ids.end());
  }
  void OnFinished(StreamChunk last, const FinishInfo& i) override {
    tokens.insert(tokens.end(), last.token_ids.begin(), last.token_ids.end());
    info = i;
    done = true;
  }
  std::vector<int32_t> tokens;
  FinishInfo info;
  bool done = false;
};

class AdmissionLog : public EngineObserver {
 public:
  void OnAdmitted(const GenerationRequest& r, absl::Duration) override {
    order.push_back(r.request_id);
  }
  std::vector<std::string> order;
};

EngineOptions Options(int32_t slots) {
  EngineOptions o;
  o.slots = slots;
  o.max_context = 512;
  o.prefill_chunk = 64;
  o.max_queue = 16;
  return o;
}

class SchedulerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_ = LoadTinyModel(); }
  static void TearDownTestSuite() { delete model_; }

  // `fused_pass_cost` > 0: the backend fuses chunks into the decode pass (set_fused).
  // `chunks_per_pass` > 1: the backend takes that many prompts' chunks in one pass.
  void Make(EngineOptions o, absl::Duration fused_pass_cost = absl::ZeroDuration(),
            int32_t chunks_per_pass = 1) {
    o.clock = &clock_;
    o.observer = &admissions_;
    o.threads = 1;
    o.max_new_tokens = 400;
    if (o.block_tokens == 0) o.block_tokens = 16;
    const int64_t blocks_per_slot = (o.max_context + o.block_tokens - 1) / o.block_tokens;
    const int64_t blocks = o.kv_blocks > 0 ? o.kv_blocks : blocks_per_slot * o.slots;
    auto backend = std::make_unique<ScriptedBackend>(1024, blocks, o.block_tokens,
                                                     o.prefill_chunk, &clock_);
    if (fused_pass_cost > absl::ZeroDuration()) backend->set_fused(fused_pass_cost);
    backend->set_chunks_per_pass(chunks_per_pass);
    backend_ = backend.get();
    auto e = Engine::CreateWithBackend(model_, o, std::move(backend));
    CHECK_OK(e.status());
    engine_ = std::move(*e);
  }

  // Submits a request with a prompt of `prompt` tokens; returns its sink (and handle).
  std::shared_ptr<RecordingSink> Submit(const std::string& id, int32_t prompt, int32_t output,
                                        int32_t priority = 0, uint64_t* handle = nullptr,
                                        absl::Status* status = nullptr,
                                        absl::Duration limit = absl::ZeroDuration()) {
    auto r = std::make_unique<GenerationRequest>();
    r->request_id = id;
    for (int32_t i = 0; i < prompt; ++i) r->prompt.push_back(10 + (i * 13 + prompt) % 800);
    r->max_new_tokens = output;
    r->ignore_eos = true;
    r->priority = priority;
    r->time_limit = limit;
    r->sampling.seed = 1;
    r->arrival = clock_.Now();
    auto sink = std::make_shared<RecordingSink>();
    r->sink = sink;
    absl::StatusOr<uint64_t> h = engine_->Submit(std::move(r));
    if (status) *status = h.status();
    if (handle && h.ok()) *handle = *h;
    return sink;
  }

  // Steps until every sink is done (bounded).
  void RunUntilDone(const std::vector<std::shared_ptr<RecordingSink>>& sinks, int max_steps = 20000) {
    for (int i = 0; i < max_steps; ++i) {
      bool all = true;
      for (const auto& s : sinks) all &= s->done;
      if (all) return;
      engine_->StepForTest();
    }
    FAIL() << "requests did not finish within " << max_steps << " steps";
  }

  // The prefill stall limit at 0.5 with prompt chunks of up to 64 tokens, a chunk costing
  // `chunk_fixed_cost` + 0.1 ms a token and a decode step 10 ms: two short requests decode until
  // both costs are measured, then a 450-token prompt arrives. Returns the sizes of its chunks
  // that ran beside decode rows (in order) and leaves the other steps' log to the caller; the
  // three requests are finished before returning.
  // `fused_pass_cost`: the backend runs chunks inside the decode pass instead, each pass costing
  // that + 0.1 ms per row.
  std::vector<int32_t> LongPromptChunksBesideDecode(
      absl::Duration chunk_fixed_cost, absl::Duration fused_pass_cost = absl::ZeroDuration()) {
    EngineOptions o = Options(3);  // chunks of up to 64 tokens
    o.max_prefill_stall = 0.5;
    Make(o, fused_pass_cost);
    backend_->set_prefill_fixed_cost(chunk_fixed_cost);
    auto a = Submit("a", 8, 150);
    auto b = Submit("b", 8, 150);
    for (int i = 0; i < 4; ++i) engine_->StepForTest();
    backend_->TakeLog();
    auto longp = Submit("long", 450, 4);
    while (longp->tokens.empty()) engine_->StepForTest();
    std::vector<int32_t> beside_decode;
    for (const ScriptedBackend::StepLog& s : backend_->TakeLog()) {
      if (s.prefill_tokens > 0 && s.decode_rows > 0) beside_decode.push_back(s.prefill_tokens);
    }
    RunUntilDone({a, b, longp});
    return beside_decode;
  }

  void ExpectIdle() {
    for (int i = 0; i < 3; ++i) engine_->StepForTest();  // retire in-flight copies
    const EngineStats s = engine_->Stats();
    EXPECT_EQ(s.slots_in_use, 0);
    EXPECT_EQ(s.queue_depth, 0);
    EXPECT_EQ(s.kv.blocks_used, 0);
    if (engine_->options().kv_mode == KvMode::kKvrm) {
      EXPECT_EQ(s.kv.blocks_free, s.kv.blocks_total) << "blocks leaked";
      EXPECT_EQ(s.kv.blocks_reserved, 0);
      EXPECT_EQ(s.kv.host_blocks_used, 0);
    }
  }

  static ModelBundle* model_;
  ManualClock clock_;
  AdmissionLog admissions_;
  ScriptedBackend* backend_ = nullptr;
  std::unique_ptr<Engine> engine_;
};
ModelBundle* SchedulerTest::model_ = nullptr;

// A Mistral sliding window shorter than the model's positions, on a backend that does not
// compute windows (the CUDA backend's case): by default the engine serves the window (where
// windowed attention is the full attention it computes); more is refused. A backend that
// computes windows (the CPU backend) serves the model's whole context, but not with far history.
TEST_F(SchedulerTest, SlidingWindowBoundsTheServedContext) {
  const int32_t saved = model_->config.sliding_window;
  const std::vector<bool> saved_layers = model_->config.sliding_layers;
  model_->config.sliding_window = 256;  // the tiny model has 512 positions
  model_->config.sliding_layers.assign(model_->config.num_hidden_layers, true);
  bool computes_windows = false;
  const auto create = [&](int32_t max_context) {
    EngineOptions o = Options(2);
    o.sliding_window_attention = computes_windows;
    o.max_context = max_context;
    o.kv_blocks = 64;
    o.clock = &clock_;
    return Engine::CreateWithBackend(
        model_, o, std::make_unique<ScriptedBackend>(1024, 64, 16, o.prefill_chunk, &clock_));
  };
  absl::StatusOr<std::unique_ptr<Engine>> e = create(0);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ((*e)->options().max_context, 256);
  EXPECT_TRUE(create(200).ok());
  e = create(512);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(e.status().message()),
              ::testing::HasSubstr("exceeds the model's sliding_window (256)"));

  computes_windows = true;
  e = create(0);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ((*e)->options().max_context, 512);
  EngineOptions far = Options(2);
  far.far_history.enabled = true;
  far.far_history.window_tokens = 64;
  far.kv_blocks = 64;
  far.clock = &clock_;
  e = Engine::CreateWithBackend(
      model_, far, std::make_unique<ScriptedBackend>(1024, 64, 16, far.prefill_chunk, &clock_));
  EXPECT_EQ(e.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(e.status().message()),
              ::testing::HasSubstr("does not combine with the model's sliding-window layers"));
  model_->config.sliding_window = saved;
  model_->config.sliding_layers = saved_layers;
}

// A KV pool larger than the memory the process may use is refused at start-up, naming the
// flags, instead of being faulted in until the out-of-memory killer ends the process.
TEST_F(SchedulerTest, KvPoolBeyondTheMemoryLimitIsRefusedAtStart) {
  EngineOptions o = Options(2);
  o.threads = 1;
  o.kv_blocks = 64;  // tiny model: 64 blocks of 16 tokens, a few MiB in f32
  o.memory_limit = MemoryLimit{1 << 20, "the test's limit"};
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(model_, o);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kResourceExhausted) << e.status();
  EXPECT_THAT(std::string(e.status().message()),
              ::testing::AllOf(::testing::HasSubstr("the KV cache (64 blocks of 16 tokens"),
                               ::testing::HasSubstr("the test's limit (0.00 GiB)"),
                               ::testing::HasSubstr("--kv_blocks"),
                               ::testing::HasSubstr("--kv_dtype=bf16")));
  // Within it (or with no limit known) the engine starts.
  o.memory_limit = MemoryLimit{int64_t{1} << 40, "the test's limit"};
  EXPECT_TRUE(Engine::Create(model_, o).ok());
  o.memory_limit = std::optional<MemoryLimit>();
  EXPECT_TRUE(Engine::Create(model_, o).ok());
  // The bytes: 2 (K, V) x layers x KV heads x head_dim x 4 bytes x 16 tokens per block.
  const LlamaConfig& c = model_->config;
  const int64_t block = int64_t{2} * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * 4 * 16;
  o.memory_limit = MemoryLimit{64 * block - 1, "the test's limit"};
  EXPECT_EQ(Engine::Create(model_, o).status().code(), absl::StatusCode::kResourceExhausted);
  o.memory_limit = MemoryLimit{64 * block, "the test's limit"};
  EXPECT_TRUE(Engine::Create(model_, o).ok());
  // A budget whose bytes overflow 64 bits fits no memory (the product must not wrap to small).
  o.kv_blocks = (std::numeric_limits<int64_t>::max() / block) * 2 + 3;
  o.memory_limit = MemoryLimit{int64_t{1} << 40, "the test's limit"};
  EXPECT_EQ(Engine::Create(model_, o).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST_F(SchedulerTest, PriorityFirstThenFcfsWithinAPriority) {
  Make(Options(1));
  auto x = Submit("x", 8, 5);
  engine_->StepForTest();  // x takes the only slot
  auto a = Submit("a", 8, 3, 0);
  auto b = Submit("b", 8, 3, 0);
  auto c = Submit("c", 8, 3, 5);
  auto d = Submit("d", 8, 3, -1);
  auto e = Submit("e", 8, 3, 5);
  RunUntilDone({x, a, b, c, d, e});
  EXPECT_EQ(admissions_.order, (std::vector<std::string>{"x", "c", "e", "a", "b", "d"}));
  ExpectIdle();
}

TEST_F(SchedulerTest, QueueBoundRefusesAtOnce) {
  EngineOptions o = Options(1);
  o.max_queue = 2;
  Make(o);
  absl::Status s1, s2, s3;
  auto a = Submit("a", 8, 50, 0, nullptr, &s1);
  auto b = Submit("b", 8, 50, 0, nullptr, &s2);
  auto c = Submit("c", 8, 50, 0, nullptr, &s3);
  EXPECT_TRUE(s1.ok());
  EXPECT_TRUE(s2.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(s3)) << s3;
  EXPECT_FALSE(c->done);  // refused before it reached the engine: no sink callback
  engine_->StepForTest();  // a admitted: the queue has room again
  absl::Status s4;
  auto d = Submit("d", 8, 5, 0, nullptr, &s4);
  EXPECT_TRUE(s4.ok());
  RunUntilDone({a, b, d});
  ExpectIdle();
}

TEST_F(SchedulerTest, ReservationPoliciesDecideHowManyRequestsFit) {
  // 24 blocks of 16 tokens. Two requests of 40-token prompts and 200 new tokens each: 15
  // blocks apiece when done, so both fit only if one is paused part of the time.
  for (ReservePolicy policy : {ReservePolicy::kPrompt, ReservePolicy::kPromptAndOutput}) {
    EngineOptions o = Options(2);
    o.max_context = 256;
    o.kv_blocks = 24;
    o.kv_host_blocks = 64;
    o.reserve = policy;
    Make(o);
    auto a = Submit("a", 40, 200);
    auto b = Submit("b", 40, 200);
    engine_->StepForTest();
    engine_->StepForTest();
    const int32_t admitted = static_cast<int32_t>(admissions_.order.size());
    const KvStats kv = engine_->Stats().kv;
    if (policy == ReservePolicy::kPrompt) {
      EXPECT_EQ(admitted, 2) << "prompt-only reservation admits both";
      EXPECT_EQ(kv.blocks_reserved, kv.blocks_used) << "nothing set aside beyond what is held";
    } else {
      EXPECT_EQ(admitted, 1) << "prompt+output (15 blocks each) admits one at a time";
      // The admitted request's whole prompt + output is reserved, though only its prompt's
      // blocks (and a few) are allocated yet.
      EXPECT_EQ(kv.blocks_reserved, 15) << kv.blocks_used << " used";
      EXPECT_LT(kv.blocks_used, 15);
      EXPECT_EQ(kv.blocks_free, kv.blocks_total - 15);
    }
    RunUntilDone({a, b});
    EXPECT_EQ(a->tokens.size(), 200u);
    EXPECT_EQ(b->tokens.size(), 200u);
    const uint64_t preemptions = engine_->Stats().preemptions_total;
    if (policy == ReservePolicy::kPromptAndOutput) EXPECT_EQ(preemptions, 0u);
    ExpectIdle();
    admissions_.order.clear();
  }
}

TEST_F(SchedulerTest, ChunkedPrefillNeverStallsDecodeByMoreThanOneChunk) {
  EngineOptions o = Options(3);
  o.prefill_chunk = 64;
  o.step_token_budget = 66;  // 2 decode rows + 64 prefill tokens
  Make(o);
  auto a = Submit("a", 8, 120);
  auto b = Submit("b", 8, 120);
  for (int i = 0; i < 4; ++i) engine_->StepForTest();
  backend_->TakeLog();
  auto longp = Submit("long", 450, 4);
  // Every step while the long prompt prefills: at most one chunk, within the budget, and both
  // decoding requests still advance.
  const std::vector<int32_t> before = {static_cast<int32_t>(a->tokens.size()),
                                       static_cast<int32_t>(b->tokens.size())};
  int32_t steps = 0;
  while (admissions_.order.size() < 3 || longp->tokens.empty()) {
    engine_->StepForTest();
    ++steps;
    ASSERT_LT(steps, 100);
  }
  for (const ScriptedBackend::StepLog& s : backend_->TakeLog()) {
    EXPECT_LE(s.prefill_tokens, 64);
    EXPECT_LE(s.prefill_tokens + s.decode_rows, 66);
  }
  EXPECT_GE(static_cast<int32_t>(a->tokens.size()) - before[0], steps - 1);
  EXPECT_GE(static_cast<int32_t>(b->tokens.size()) - before[1], steps - 1);
  RunUntilDone({a, b, longp});
  ExpectIdle();
}

// The step's prefill tokens go to the prompts first come first served, several a step where the
// backend takes their chunks in one pass: four 20-token prompts arriving together in chunks of
// 64 take one step for three of them and the first 4 tokens of the fourth, the next for its
// other 16 (beside the three's first decode rows). One prompt a step (--max_prefills_per_step=1,
// or a backend that takes one chunk a pass) takes four; a cap of 2, two. The tokens are the same.
TEST_F(SchedulerTest, SeveralPromptsArePrefilledInOneStepFirstComeFirstServed) {
  struct Case {
    int32_t max_prefills;
    int32_t chunks_per_pass;
    std::vector<std::vector<std::pair<int32_t, int32_t>>> steps;  // (slot, tokens) per step
  };
  const std::vector<Case> cases = {
      {0, 8, {{{0, 20}, {1, 20}, {2, 20}, {3, 4}}, {{3, 16}}}},
      {2, 8, {{{0, 20}, {1, 20}}, {{2, 20}, {3, 20}}}},
      {1, 8, {{{0, 20}}, {{1, 20}}, {{2, 20}}, {{3, 20}}}},
      {0, 1, {{{0, 20}}, {{1, 20}}, {{2, 20}}, {{3, 20}}}},
  };
  std::vector<std::vector<int32_t>> first_tokens;
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat("max_prefills_per_step ", c.max_prefills, ", ", c.chunks_per_pass,
                              " chunks a pass"));
    EngineOptions o = Options(4);  // chunks of up to 64 tokens; budget 4 + 64
    o.max_prefills_per_step = c.max_prefills;
    Make(o, absl::ZeroDuration(), c.chunks_per_pass);
    std::vector<std::shared_ptr<RecordingSink>> sinks;
    for (const char* id : {"a", "b", "c", "d"}) sinks.push_back(Submit(id, 20, 6));
    std::vector<std::vector<std::pair<int32_t, int32_t>>> steps;
    while (steps.size() < 8) {
      engine_->StepForTest();
      std::vector<std::pair<int32_t, int32_t>> chunks;
      for (const ScriptedBackend::StepLog& l : backend_->TakeLog()) {
        if (l.prefill_slot >= 0) chunks.emplace_back(l.prefill_slot, l.prefill_tokens);
      }
      if (chunks.empty()) break;
      steps.push_back(chunks);
    }
    EXPECT_EQ(steps, c.steps);
    const EngineStats stats = engine_->Stats();
    EXPECT_EQ(stats.prefill_steps_total, c.steps.size());
    size_t chunks = 0;
    for (const auto& step : c.steps) chunks += step.size();
    EXPECT_EQ(stats.prefill_chunks_total, chunks);
    RunUntilDone(sinks);
    std::vector<int32_t> tokens;
    for (const auto& sink : sinks) {
      EXPECT_EQ(sink->info.reason, FinishReason::kLength) << sink->info.error;
      tokens.insert(tokens.end(), sink->tokens.begin(), sink->tokens.end());
    }
    first_tokens.push_back(tokens);
    ExpectIdle();
  }
  for (size_t i = 1; i < first_tokens.size(); ++i) EXPECT_EQ(first_tokens[i], first_tokens[0]);
}

// The prompts' chunks ride in the decode pass together (fused), within the step's budget: two
// requests decode while three 30-token prompts arrive; with a budget of 42
// tokens a step takes what the decode rows leave, first come first served, beside them.
TEST_F(SchedulerTest, SeveralChunksRideInTheDecodePassWithinTheBudget) {
  EngineOptions o = Options(5);
  o.step_token_budget = 42;
  Make(o, /*fused_pass_cost=*/absl::Milliseconds(5), /*chunks_per_pass=*/8);
  auto a = Submit("a", 8, 40);
  auto b = Submit("b", 8, 40);
  for (int i = 0; i < 3; ++i) engine_->StepForTest();
  backend_->TakeLog();
  auto c = Submit("c", 30, 4);
  auto d = Submit("d", 30, 4);
  auto e = Submit("e", 30, 4);
  std::map<int32_t, std::vector<std::pair<int32_t, int32_t>>> steps;  // pass -> chunks
  std::map<int32_t, int32_t> decode_rows;
  for (int i = 0; i < 3; ++i) {
    engine_->StepForTest();
    for (const ScriptedBackend::StepLog& l : backend_->TakeLog()) {
      if (l.prefill_slot >= 0) steps[l.pass].emplace_back(l.prefill_slot, l.prefill_tokens);
      decode_rows[l.pass] += l.decode_rows;
    }
  }
  std::vector<std::vector<std::pair<int32_t, int32_t>>> chunks;
  std::vector<int32_t> rows;
  for (const auto& [pass, step] : steps) {
    chunks.push_back(step);
    rows.push_back(decode_rows[pass]);
  }
  // Step 1: c's 30 and d's first 10; step 2 (c now decodes: 3 decode rows, 39 tokens): d's
  // other 20 and e's first 19; step 3: e's last 11.
  const std::vector<std::vector<std::pair<int32_t, int32_t>>> want = {
      {{2, 30}, {3, 10}}, {{3, 20}, {4, 19}}, {{4, 11}}};
  EXPECT_EQ(chunks, want);
  EXPECT_EQ(rows, (std::vector<int32_t>{2, 3, 4}));
  RunUntilDone({a, b, c, d, e});
  ExpectIdle();
}

// A prompt being scored returns every row's logits: one such prompt a step (the others' chunks
// still share it).
TEST_F(SchedulerTest, OnePromptBeingScoredAStep) {
  Make(Options(4), absl::ZeroDuration(), /*chunks_per_pass=*/8);
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (const char* id : {"s1", "s2", "plain"}) {
    auto r = std::make_unique<GenerationRequest>();
    r->request_id = id;
    for (int32_t i = 0; i < 10; ++i) r->prompt.push_back(10 + i);
    r->max_new_tokens = 3;
    r->ignore_eos = true;
    if (id[0] == 's') r->prompt_logprobs = 0;
    r->arrival = clock_.Now();
    sinks.push_back(std::make_shared<RecordingSink>());
    r->sink = sinks.back();
    ASSERT_TRUE(engine_->Submit(std::move(r)).ok());
  }
  engine_->StepForTest();
  std::vector<std::pair<int32_t, int32_t>> first, second;
  for (const ScriptedBackend::StepLog& l : backend_->TakeLog()) {
    if (l.prefill_slot >= 0) first.emplace_back(l.prefill_slot, l.prefill_tokens);
  }
  engine_->StepForTest();
  for (const ScriptedBackend::StepLog& l : backend_->TakeLog()) {
    if (l.prefill_slot >= 0) second.emplace_back(l.prefill_slot, l.prefill_tokens);
  }
  EXPECT_EQ(first, (std::vector<std::pair<int32_t, int32_t>>{{0, 10}, {2, 10}}));
  EXPECT_EQ(second, (std::vector<std::pair<int32_t, int32_t>>{{1, 10}}));
  RunUntilDone(sinks);
  for (const auto& sink : sinks) EXPECT_EQ(sink->tokens.size(), 3u);
  ExpectIdle();
}

TEST_F(SchedulerTest, PrefillStallLimitCutsChunksWhileOthersDecode) {
  // Simulated costs: a decode step 10 ms, a prefill token 0.1 ms. With a stall limit of 0.5 a
  // chunk beside decode rows may add at most 5 ms: 50 tokens, once both costs are measured.
  const std::vector<int32_t> beside_decode = LongPromptChunksBesideDecode(absl::ZeroDuration());
  ASSERT_GE(beside_decode.size(), 8u);
  // Both costs were measured on a's and b's prompts and steps: every chunk keeps to the limit
  // and still uses it (not a token at a time).
  int32_t prefilled = 0;
  for (size_t i = 0; i < beside_decode.size(); ++i) {
    EXPECT_LE(beside_decode[i], 50) << "chunk " << i;
    prefilled += beside_decode[i];
    if (i + 1 < beside_decode.size()) EXPECT_GE(beside_decode[i], 40) << "chunk " << i;
  }
  EXPECT_EQ(prefilled, 450);
  // Nobody decoding: a prompt takes full chunks (there is no inter-token latency to protect).
  backend_->TakeLog();
  auto solo = Submit("solo", 300, 2);
  RunUntilDone({solo});
  std::vector<int32_t> alone;
  for (const ScriptedBackend::StepLog& s : backend_->TakeLog()) {
    if (s.prefill_slot >= 0 && s.decode_rows == 0) alone.push_back(s.prefill_tokens);
  }
  ASSERT_GE(alone.size(), 4u);
  for (size_t i = 0; i + 1 < alone.size(); ++i) EXPECT_EQ(alone[i], 64) << "chunk " << i;
  ExpectIdle();
}

TEST_F(SchedulerTest, PrefillStallLimitAccountsForAChunksFixedCost) {
  // A chunk costs 2 ms + 0.1 ms per token, a decode step 10 ms: within a 5 ms stall a chunk
  // takes (5 - 2) / 0.1 = 30 tokens. Per-token averages would say 14 (small chunks look dear)
  // or 50 (fixed cost ignored); the fitted cost model gives 30.
  int32_t at_cap = 0, prefilled = 0;
  for (int32_t tokens : LongPromptChunksBesideDecode(absl::Milliseconds(2))) {
    EXPECT_LE(tokens, 30);
    at_cap += tokens == 30;
    prefilled += tokens;
  }
  EXPECT_EQ(prefilled, 450);
  EXPECT_GE(at_cap, 12);
  ExpectIdle();
}

TEST_F(SchedulerTest, PrefillStallLimitWithChunksInTheDecodePass) {
  // A pass costs 8 ms + 0.1 ms a row: two decode rows 8.2 ms, so within a 0.5 stall a chunk
  // riding along may take 4.1 ms: 41 tokens (apart, the 450 tokens would pay the 8 ms in each
  // of 12+ chunks again). The fit has seen passes of 2 and 9 rows (b's prompt rode with a's
  // decode) before the long prompt comes, so every chunk is at the cap but the last.
  const uint64_t mixed_before = 1;  // b's prompt
  const std::vector<int32_t> beside_decode =
      LongPromptChunksBesideDecode(absl::ZeroDuration(), absl::Milliseconds(8));
  ASSERT_EQ(beside_decode.size(), 11u);
  for (size_t i = 0; i + 1 < beside_decode.size(); ++i) {
    EXPECT_EQ(beside_decode[i], 41) << "chunk " << i;
  }
  EXPECT_EQ(beside_decode.back(), 450 - 10 * 41);
  EXPECT_EQ(engine_->Stats().mixed_steps_total, mixed_before + beside_decode.size());
  ExpectIdle();
}

TEST_F(SchedulerTest, PreemptsLowestPriorityMostRecentAndResumes) {
  EngineOptions o = Options(3);
  o.kv_blocks = 40;     // 640 tokens for three requests that grow to ~300 each
  o.kv_host_blocks = 64;
  o.recompute_max_tokens = 1;  // always swap, to see the host tier used
  Make(o);
  auto high = Submit("high", 100, 200, 2);
  auto mid = Submit("mid", 100, 200, 1);
  auto low_old = Submit("low-old", 100, 200, 0);
  engine_->StepForTest();  // admit
  bool saw_low_paused = false, saw_other_paused = false;
  for (int i = 0; i < 5000 && !(high->done && mid->done && low_old->done); ++i) {
    engine_->StepForTest();
    for (int32_t s = 0; s < 3; ++s) {
      if (engine_->slot_state(s) != SlotState::kPaused) continue;
      // Slot s holds the request admitted s-th (admission fills slots in order).
      if (s == 2) saw_low_paused = true;
      else saw_other_paused = true;
    }
  }
  EXPECT_TRUE(saw_low_paused) << "the lowest priority request is paused first";
  EXPECT_FALSE(saw_other_paused) << "higher priority requests are never paused for it";
  ASSERT_TRUE(high->done && mid->done && low_old->done);
  for (const auto& s : {high, mid, low_old}) {
    EXPECT_EQ(s->info.reason, FinishReason::kLength);
    EXPECT_EQ(s->tokens.size(), 200u) << "no request fails because another grew";
  }
  EXPECT_GT(engine_->Stats().preemptions_total, 0u);
  ExpectIdle();
}

TEST_F(SchedulerTest, CancellationInEveryState) {
  EngineOptions o = Options(2);
  o.kv_blocks = 32;
  o.kv_host_blocks = 64;
  o.recompute_max_tokens = 1;
  Make(o);
  uint64_t h_queued = 0, h_prefill = 0, h_decode = 0, h_paused = 0;
  // Decoding and paused: two requests that outgrow the pool; the younger gets paused.
  auto dec = Submit("dec", 200, 300, 0, &h_decode);
  auto pau = Submit("pau", 200, 300, 0, &h_paused);
  auto que = Submit("que", 8, 5, 0, &h_queued);
  bool paused = false;
  for (int i = 0; i < 400 && !paused; ++i) {
    engine_->StepForTest();
    paused = engine_->slot_state(1) == SlotState::kPaused;
  }
  ASSERT_TRUE(paused);
  ASSERT_EQ(engine_->slot_state(0), SlotState::kDecoding);
  engine_->Cancel(h_queued);  // still queued: paused requests come first
  engine_->Cancel(h_paused);
  engine_->Cancel(h_decode);
  engine_->StepForTest();
  EXPECT_TRUE(que->done && pau->done && dec->done);
  EXPECT_EQ(que->info.reason, FinishReason::kCancelled);
  EXPECT_EQ(pau->info.reason, FinishReason::kCancelled);
  EXPECT_EQ(dec->info.reason, FinishReason::kCancelled);
  // Prefilling: a long prompt cancelled between two of its chunks.
  auto pre = Submit("pre", 400, 5, 0, &h_prefill);
  engine_->StepForTest();
  ASSERT_EQ(engine_->slot_state(0), SlotState::kPrefilling);
  engine_->Cancel(h_prefill);
  engine_->StepForTest();
  EXPECT_TRUE(pre->done);
  EXPECT_EQ(pre->info.reason, FinishReason::kCancelled);
  ExpectIdle();
}

TEST_F(SchedulerTest, TimeLimitOnTheSimulatedClock) {
  Make(Options(1));
  auto slow = Submit("slow", 8, 300, 0, nullptr, nullptr, absl::Milliseconds(205));
  RunUntilDone({slow});
  EXPECT_EQ(slow->info.reason, FinishReason::kTimeLimit);
  // Prefill (8 x 0.1 ms) gives token 1 at 0.8 ms, then one token per 10 ms step: token 21 at
  // 200.8 ms. The limit is checked at step boundaries, so the step starting at 200.8 ms still
  // runs (token 22 at 210.8 ms) and the next one ends the request.
  EXPECT_EQ(slow->tokens.size(), 22u);
  ExpectIdle();
}

TEST_F(SchedulerTest, NoStarvationUnderARandomBurst) {
  EngineOptions o = Options(4);
  o.kv_blocks = 64;
  o.kv_host_blocks = 32;
  o.max_queue = 64;
  Make(o);
  std::mt19937 rng(3);
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  std::vector<int32_t> want;
  for (int i = 0; i < 40; ++i) {
    const int32_t out = 1 + static_cast<int32_t>(rng() % 150);
    sinks.push_back(Submit("r" + std::to_string(i), 1 + static_cast<int32_t>(rng() % 300), out,
                           static_cast<int32_t>(rng() % 3)));
    want.push_back(out);
    if (i % 5 == 0) engine_->StepForTest();
  }
  RunUntilDone(sinks);
  for (size_t i = 0; i < sinks.size(); ++i) {
    EXPECT_EQ(sinks[i]->info.reason, FinishReason::kLength) << i;
    EXPECT_EQ(static_cast<int32_t>(sinks[i]->tokens.size()), want[i]) << i;
  }
  ExpectIdle();
}

// A request paused for lack of KV keeps newcomers of its priority or lower out until it is back
// (no starvation by newcomers), but not one of a higher priority: with room for it, that one is
// admitted and finishes while the paused one's peers still run. And --max_queue below 1 is
// refused (it counts requests not yet in a slot: at 0 nothing could be admitted).
TEST_F(SchedulerTest, AHigherPriorityNewcomerIsNotHeldBehindAPausedRequest) {
  EngineOptions o = Options(3);
  o.kv_blocks = 40;
  o.kv_host_blocks = 64;
  o.recompute_max_tokens = 1;  // paused requests swap out
  Make(o);
  auto a = Submit("a", 200, 300, 0);
  auto b = Submit("b", 200, 300, 0);
  bool paused = false;
  for (int i = 0; i < 400 && !paused; ++i) {
    engine_->StepForTest();
    for (int s = 0; s < 3; ++s) paused |= engine_->slot_state(s) == SlotState::kPaused;
  }
  ASSERT_TRUE(paused);
  auto low = Submit("low", 8, 4, /*priority=*/0);
  auto high = Submit("high", 8, 4, /*priority=*/10);
  for (int i = 0; i < 40 && !high->done; ++i) engine_->StepForTest();
  EXPECT_TRUE(high->done) << "the priority-10 request waited behind the paused one";
  EXPECT_FALSE(low->done) << "a newcomer of the paused request's priority waits for it";
  EXPECT_FALSE(a->done && b->done);
  RunUntilDone({a, b, low, high});

  EngineOptions bad = Options(2);
  bad.max_queue = 0;
  bad.clock = &clock_;
  auto e = Engine::CreateWithBackend(
      model_, bad, std::make_unique<ScriptedBackend>(1024, 64, 16, bad.prefill_chunk, &clock_));
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("--max_queue"), absl::string_view::npos);
}

// A newcomer that outranks running requests does not wait for their KV: it pauses the lowest
// of them (vLLM's priority scheduling preempts), runs, and they resume and finish whole with the
// tokens they would have had. Equal priorities stay first come, first served: a newcomer of the
// running requests' priority waits for them.
TEST_F(SchedulerTest, AHigherPriorityNewcomerPreemptsForItsKv) {
  // (Prompts of other lengths: Submit's prompt depends on its length only, and shared blocks
  // are not what a pause frees.)
  auto run_alone = [&](const std::string& id, int32_t prompt) {
    Make(Options(4));
    auto s = Submit(id, prompt, 250, 0);
    RunUntilDone({s});
    return s->tokens;
  };
  const std::vector<int32_t> a_alone = run_alone("a", 200), b_alone = run_alone("b", 199);

  EngineOptions o = Options(4);  // slots to spare: KV is what runs out
  o.kv_blocks = 40;
  o.kv_host_blocks = 64;
  o.recompute_max_tokens = 1;  // paused requests swap out
  Make(o);
  auto a = Submit("a", 200, 250, 0);
  auto b = Submit("b", 199, 250, 0);
  // Until a 100-token prompt (7 blocks, and a block of growth for each decoding request) no
  // longer fits, while both still decode (they collide, and one pauses, some 60 steps later).
  for (int i = 0; i < 400 && engine_->Stats().kv.blocks_free >= 9; ++i) engine_->StepForTest();
  ASSERT_LT(engine_->Stats().kv.blocks_free, 9);
  ASSERT_EQ(engine_->slot_state(0), SlotState::kDecoding);
  ASSERT_EQ(engine_->slot_state(1), SlotState::kDecoding);
  const uint64_t preempted_before = engine_->Stats().preemptions_total;
  auto same = Submit("same", 100, 4, 0);
  auto high = Submit("high", 100, 4, 10);
  engine_->StepForTest();
  // b, admitted last, is the one paused; high took the free slot.
  EXPECT_EQ(engine_->slot_state(0), SlotState::kDecoding);
  EXPECT_EQ(engine_->slot_state(1), SlotState::kPaused);
  EXPECT_NE(engine_->slot_state(2), SlotState::kFree);
  for (int i = 0; i < 20 && !high->done; ++i) engine_->StepForTest();
  EXPECT_TRUE(high->done) << "the priority-10 request waited for lower-priority KV";
  EXPECT_FALSE(same->done) << "a newcomer of the running requests' priority waits for them";
  EXPECT_EQ(engine_->Stats().preemptions_total, preempted_before + 1) << "one pause made room";
  RunUntilDone({a, b, same, high});
  for (const auto& s : {a, b, same, high}) EXPECT_EQ(s->info.reason, FinishReason::kLength);
  EXPECT_EQ(a->tokens, a_alone);
  EXPECT_EQ(b->tokens, b_alone) << "the paused request resumed with its history intact";
  ExpectIdle();
}

// A prompt being scored is prefilled whole whenever it (re)starts: paused while prefilling (for
// a higher-priority newcomer that found its own prompt in the prefix cache), it resumes without
// attaching the cached blocks that newcomer's match left behind (it once did: another prompt's
// KV under its tokens, and logprobs that were never computed).
// A backend that returns no hidden states (the scripted one here, the CUDA backend) refuses an
// embedding at submission, naming the field, and serves generation as before.
TEST_F(SchedulerTest, AnEmbeddingOnADeviceWithoutHiddenStatesIsRefused) {
  Make(Options(2));
  ASSERT_FALSE(engine_->returns_hidden());
  auto r = std::make_unique<GenerationRequest>();
  r->request_id = "embed";
  r->prompt = {5, 6, 7};
  r->pooling = Pooling::kLast;
  r->sink = std::make_shared<RecordingSink>();
  const absl::Status st = engine_->Submit(std::move(r)).status();
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_EQ(st.message().rfind("pooling:", 0), 0u) << st;
  auto plain = Submit("plain", 20, 4);
  RunUntilDone({plain});
  EXPECT_EQ(plain->tokens.size(), 4u);
  ExpectIdle();
}

TEST_F(SchedulerTest, AScoredPromptResumesWithoutAnotherRequestsCachedPrefix) {
  EngineOptions o = Options(4);
  o.max_context = 320;
  o.kv_blocks = 24;
  Make(o);
  auto warm = Submit("warm", 100, 4);  // its full blocks stay in the prefix cache
  RunUntilDone({warm});
  auto r = std::make_unique<GenerationRequest>();
  r->request_id = "scored";
  for (int32_t i = 0; i < 300; ++i) r->prompt.push_back(10 + (i * 17 + 5) % 800);
  r->max_new_tokens = 4;
  r->ignore_eos = true;
  r->prompt_logprobs = 0;
  r->arrival = clock_.Now();
  auto scored = std::make_shared<RecordingSink>();
  r->sink = scored;
  const absl::StatusOr<uint64_t> submitted = engine_->Submit(std::move(r));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  engine_->StepForTest();
  ASSERT_EQ(engine_->slot_state(0), SlotState::kPrefilling);
  // warm's prompt again, at a higher priority: it finds its blocks cached but not the room for
  // the rest, so the scored prompt (19 blocks) pauses.
  auto high = Submit("warm", 100, 4, 10);
  engine_->StepForTest();
  ASSERT_EQ(engine_->slot_state(0), SlotState::kPaused);
  RunUntilDone({high});
  EXPECT_GT(high->info.cached_prompt_tokens, 0);
  const uint64_t hits = engine_->Stats().prefix_cache_hits_total;
  backend_->TakeLog();
  RunUntilDone({scored});
  int32_t prefilled = 0;
  for (const ScriptedBackend::StepLog& s : backend_->TakeLog()) {
    if (s.prefill_slot == 0) prefilled += s.prefill_tokens;
  }
  EXPECT_EQ(prefilled, 300) << "the scored prompt is prefilled whole after it resumes";
  EXPECT_EQ(scored->info.reason, FinishReason::kLength) << scored->info.error;
  EXPECT_EQ(scored->tokens.size(), 4u);
  EXPECT_EQ(engine_->Stats().prefix_cache_hits_total, hits)
      << "the scored prompt resumed on cached blocks";
  ExpectIdle();
}

// A newcomer pauses no one when all the lower-priority requests together hold too little for it
// (here it is short of what a request of its own priority holds): it waits, and they run on.
TEST_F(SchedulerTest, APreemptionThatCannotMakeTheRoomPausesNoOne) {
  EngineOptions o = Options(4);
  o.kv_blocks = 40;
  o.kv_host_blocks = 64;
  o.recompute_max_tokens = 1;
  Make(o);
  auto big = Submit("big", 300, 150, /*priority=*/10);  // 19 blocks and growing
  auto low = Submit("low", 100, 150, /*priority=*/0);   // 7
  for (int i = 0; i < 12; ++i) engine_->StepForTest();
  ASSERT_EQ(engine_->slot_state(0), SlotState::kDecoding);
  ASSERT_EQ(engine_->slot_state(1), SlotState::kDecoding);
  const uint64_t preempted_before = engine_->Stats().preemptions_total;
  auto huge = Submit("huge", 450, 4, /*priority=*/10);  // 29 blocks: more than low could free
  for (int i = 0; i < 10; ++i) {
    engine_->StepForTest();
    EXPECT_EQ(engine_->slot_state(1), SlotState::kDecoding) << "step " << i;
    EXPECT_EQ(engine_->slot_state(2), SlotState::kFree) << "step " << i;
  }
  EXPECT_EQ(engine_->Stats().preemptions_total, preempted_before);
  RunUntilDone({big, low, huge});
  for (const auto& s : {big, low, huge}) EXPECT_EQ(s->info.reason, FinishReason::kLength);
  ExpectIdle();
}

// Engine::Submit refuses what the sampler would CHECK-fail on, for callers that skip the front
// ends' validation: the engine thread never sees it, and the engine serves on.
TEST_F(SchedulerTest, SubmitRefusesTokensOutsideTheVocabulary) {
  Make(Options(2));
  auto submit = [&](const std::function<void(GenerationRequest&)>& edit) {
    auto r = std::make_unique<GenerationRequest>();
    r->request_id = "bad";
    r->prompt = {10, 11, 12};
    r->max_new_tokens = 4;
    r->sampling.seed = 1;
    r->arrival = clock_.Now();
    r->sink = std::make_shared<RecordingSink>();
    edit(*r);
    return engine_->Submit(std::move(r)).status();
  };
  const int32_t vocab = model_->config.vocab_size;
  for (const auto& [edit, field] :
       std::vector<std::pair<std::function<void(GenerationRequest&)>, std::string>>{
           {[&](GenerationRequest& r) { r.prompt[1] = vocab; }, "prompt[1]"},
           {[&](GenerationRequest& r) { r.prompt[2] = -3; }, "prompt[2]"},
           {[&](GenerationRequest& r) {
              r.sampling.allowed_tokens = std::make_shared<const std::vector<int32_t>>(
                  std::vector<int32_t>{5, vocab + 7});
            },
            "sampling.allowed_token_ids"},
           {[&](GenerationRequest& r) {
              r.sampling.allowed_tokens =
                  std::make_shared<const std::vector<int32_t>>(std::vector<int32_t>{});
            },
            "sampling.allowed_token_ids"},
           {[&](GenerationRequest& r) {
              r.sampling.num_logit_bias = 1;
              r.sampling.logit_bias[0] = {vocab, 1.0f};
            },
            "sampling.logit_bias"},
       }) {
    const absl::Status st = submit(edit);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << field << ": " << st;
    EXPECT_TRUE(absl::StartsWith(st.message(), field)) << st;
  }
  auto ok = Submit("ok", 8, 4);
  RunUntilDone({ok});
  EXPECT_EQ(ok->tokens.size(), 4u);
}

}  // namespace
}  // namespace kvrm
