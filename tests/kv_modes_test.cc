// The KV policy never changes what is computed: the same requests decode to identical tokens
// under the static baseline and under KV-RM, with and without fragmentation, compaction,
// swapping to the host tier, and drop-and-recompute. And every block comes back at the end.
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "gtest/gtest.h"
#include "runtime/engine.h"
#include "runtime/model_bundle.h"
#include "tests/test_server.h"

namespace kvrm {
namespace {

struct Spec {
  std::vector<int32_t> prompt;
  int32_t max_new_tokens;
  float temperature;
  uint64_t seed;
  int32_t priority;
};

std::vector<Spec> Workload() {
  std::mt19937 rng(2026);
  std::vector<Spec> specs;
  for (int i = 0; i < 14; ++i) {
    Spec s;
    const int len = 3 + static_cast<int>(rng() % 200);
    for (int t = 0; t < len; ++t) s.prompt.push_back(static_cast<int32_t>(rng() % 1000));
    s.max_new_tokens = 30 + static_cast<int32_t>(rng() % 100);
    s.temperature = i % 3 == 0 ? 0.9f : 0.0f;
    s.seed = 1000 + i;
    s.priority = static_cast<int32_t>(rng() % 3);
    specs.push_back(s);
  }
  return specs;
}

struct RunResult {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<FinishInfo> infos;
  EngineStats stats;
};

// Runs `specs` on `engine` (all submitted at once) and returns their tokens and finishes.
void RunSpecs(Engine& engine, const std::vector<Spec>& specs, RunResult* out) {
  std::vector<std::shared_ptr<CollectingSink>> sinks;
  for (size_t i = 0; i < specs.size(); ++i) {
    auto r = std::make_unique<GenerationRequest>();
    r->request_id = "r" + std::to_string(i);
    r->prompt = specs[i].prompt;
    r->max_new_tokens = specs[i].max_new_tokens;
    r->ignore_eos = true;
    r->sampling.temperature = specs[i].temperature;
    r->sampling.seed = specs[i].seed;
    r->priority = specs[i].priority;
    r->arrival = absl::Now();
    auto sink = std::make_shared<CollectingSink>();
    r->sink = sink;
    sinks.push_back(sink);
    CHECK_OK(engine.Submit(std::move(r)).status());
  }
  for (size_t i = 0; i < sinks.size(); ++i) {
    FinishInfo info;
    out->tokens.push_back(sinks[i]->Wait(&info));
    EXPECT_EQ(info.reason, FinishReason::kLength) << "request " << i << ": " << info.error;
    EXPECT_EQ(static_cast<int32_t>(out->tokens.back().size()), specs[i].max_new_tokens) << i;
    out->infos.push_back(info);
  }
}

std::unique_ptr<Engine> StartEngine(const ModelBundle& model, EngineOptions options) {
  options.threads = 2;
  options.max_new_tokens = 256;
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(&model, options);
  CHECK_OK(engine.status());
  (*engine)->Start();
  return std::move(*engine);
}

// Waits until blocks held for in-flight copies retired (the next idle iterations, every 20 ms).
EngineStats SettledStats(Engine& engine) {
  EXPECT_TRUE(engine.WaitIdle(absl::Seconds(10)));
  EngineStats stats;
  for (int i = 0; i < 100; ++i) {
    stats = engine.Stats();
    if (stats.kv.blocks_reserved == 0 || engine.options().kv_mode == KvMode::kStatic) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return stats;
}

RunResult RunWorkload(const ModelBundle& model, EngineOptions options) {
  std::unique_ptr<Engine> engine = StartEngine(model, options);
  RunResult out;
  RunSpecs(*engine, Workload(), &out);
  out.stats = SettledStats(*engine);
  return out;
}


class KvModesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_ = LoadTinyModel(); }
  static void TearDownTestSuite() { delete model_; }
  static ModelBundle* model_;
};
ModelBundle* KvModesTest::model_ = nullptr;

// Static, kvrm, fragmented with swaps to the host tier, and recompute, all with KV of
// `kv_dtype`, prefill chunks apart from or inside the decode pass, one prompt or several a step:
// the same tokens.
void ExpectIdenticalTokensUnderEveryKvPolicyAndLayout(const ModelBundle& model, DType kv_dtype) {
  EngineOptions base;
  base.slots = 4;
  base.prefill_chunk = 64;
  base.kv_dtype = kv_dtype;

  // The reference runs one prompt's prefill chunk a step, apart from the decode step; every
  // other run rides chunks with decode steps in one pass (the default), several prompts' chunks
  // a step where one prompt ends before the step's prefill tokens do (the default).
  EngineOptions static_apart = base;
  static_apart.kv_mode = KvMode::kStatic;
  static_apart.fuse_prefill = false;
  static_apart.max_prefills_per_step = 1;
  const RunResult reference = RunWorkload(model, static_apart);
  EXPECT_EQ(reference.stats.mixed_steps_total, 0u);
  EXPECT_EQ(reference.stats.prefill_chunks_total, reference.stats.prefill_steps_total);

  EngineOptions static_packed = static_apart;
  static_packed.max_prefills_per_step = 0;
  const RunResult packed = RunWorkload(model, static_packed);
  EXPECT_EQ(packed.tokens, reference.tokens) << "static, several prompts a step, apart";
  EXPECT_GT(packed.stats.prefill_chunks_total, packed.stats.prefill_steps_total);
  EXPECT_LT(packed.stats.prefill_steps_total, reference.stats.prefill_steps_total);

  EngineOptions static_mode = static_packed;
  static_mode.fuse_prefill = true;
  const RunResult static_mixed = RunWorkload(model, static_mode);
  EXPECT_EQ(static_mixed.tokens, reference.tokens) << "static, chunks in the decode pass";
  EXPECT_GT(static_mixed.stats.mixed_steps_total, 0u);
  EXPECT_GT(static_mixed.stats.prefill_chunks_total, static_mixed.stats.prefill_steps_total);

  EngineOptions kvrm = base;
  kvrm.kv_mode = KvMode::kKvrm;
  const RunResult plain = RunWorkload(model, kvrm);
  EXPECT_EQ(plain.tokens, reference.tokens) << "kvrm, no pressure";
  EXPECT_GT(plain.stats.prefill_chunks_total, plain.stats.prefill_steps_total);
  EXPECT_EQ(plain.stats.kv.blocks_used, 0);
  EXPECT_EQ(plain.stats.kv.blocks_free, plain.stats.kv.blocks_total);

  // Small blocks, two runs per slot and a tight pool: fragmentation, compaction, and pauses to
  // the host tier.
  EngineOptions fragmented = base;
  fragmented.kv_mode = KvMode::kKvrm;
  fragmented.slots = 6;
  fragmented.block_tokens = 4;
  fragmented.max_runs = 2;
  fragmented.kv_blocks = 200;  // 6 slots of up to ~85 blocks each do not fit at once
  const RunResult frag = RunWorkload(model, fragmented);
  EXPECT_EQ(frag.tokens, reference.tokens) << "kvrm, fragmented + swapped";
  EXPECT_GT(frag.stats.mixed_steps_total, 0u);
  EXPECT_GT(frag.stats.prefill_chunks_total, frag.stats.prefill_steps_total);
  EXPECT_GT(frag.stats.transfer_groups_total, 0u);
  EXPECT_GT(frag.stats.preemptions_total, 0u);
  EXPECT_LT(frag.stats.transfer_groups_total, frag.stats.transfer_blocks_total)
      << "merging makes groups fewer than blocks";
  EXPECT_EQ(frag.stats.kv.blocks_free, 200);
  EXPECT_EQ(frag.stats.kv.host_blocks_used, 0);

  // No host tier: pauses drop the KV and recompute it on resume.
  EngineOptions recompute = fragmented;
  recompute.kv_host_blocks = 0;
  const RunResult rec = RunWorkload(model, recompute);
  EXPECT_EQ(rec.tokens, reference.tokens) << "kvrm, recompute";
  EXPECT_GT(rec.stats.preemptions_total, 0u);
  EXPECT_EQ(rec.stats.kv.blocks_free, 200);
}

TEST_F(KvModesTest, IdenticalTokensUnderEveryKvPolicyAndLayout) {
  ExpectIdenticalTokensUnderEveryKvPolicyAndLayout(*model_, DType::kF32);
}

// A bf16 pool (--kv_dtype=bf16): transfer groups, the host tier and recompute move and rebuild
// bf16 KV as faithfully as f32.
TEST_F(KvModesTest, Bf16KvIdenticalTokensUnderEveryKvPolicyAndLayout) {
  ExpectIdenticalTokensUnderEveryKvPolicyAndLayout(*model_, DType::kBF16);
}

// An FP8 pool (--kv_dtype=fp8): its bytes move through transfer groups and the host tier
// unchanged, and recompute stores the same codes again.
TEST_F(KvModesTest, Fp8KvIdenticalTokensUnderEveryKvPolicyAndLayout) {
  ExpectIdenticalTokensUnderEveryKvPolicyAndLayout(*model_, DType::kF8E4M3);
}

// Prefix caching: conversations whose first turns share three system prompts, then the second
// turn of each (its prompt: the first turn's prompt, its output and a new message), decode to the
// same tokens with the cache off, on, and on in a tight pool that must evict, compact and swap;
// and the cache serves what it holds: a second turn finds its whole first-turn history (every
// full block of it) unless that was evicted.
std::vector<Spec> FirstTurns() {
  std::mt19937 rng(77);
  std::vector<std::vector<int32_t>> systems(3);
  for (auto& sys : systems) {
    const int len = 40 + static_cast<int>(rng() % 80);
    for (int t = 0; t < len; ++t) sys.push_back(static_cast<int32_t>(rng() % 1000));
  }
  std::vector<Spec> specs;
  for (int i = 0; i < 12; ++i) {
    Spec s;
    s.prompt = systems[i % 3];
    const int len = 5 + static_cast<int>(rng() % 55);
    for (int t = 0; t < len; ++t) s.prompt.push_back(static_cast<int32_t>(rng() % 1000));
    s.max_new_tokens = 20 + static_cast<int32_t>(rng() % 40);
    s.temperature = i % 3 == 0 ? 0.9f : 0.0f;
    s.seed = 500 + i;
    s.priority = 0;
    specs.push_back(s);
  }
  return specs;
}

std::vector<Spec> SecondTurns(const std::vector<Spec>& first, const RunResult& out) {
  std::mt19937 rng(78);
  std::vector<Spec> specs;
  for (size_t i = 0; i < first.size(); ++i) {
    Spec s = first[i];
    s.prompt.insert(s.prompt.end(), out.tokens[i].begin(), out.tokens[i].end());
    const int len = 3 + static_cast<int>(rng() % 28);
    for (int t = 0; t < len; ++t) s.prompt.push_back(static_cast<int32_t>(rng() % 1000));
    s.seed += 100;
    specs.push_back(s);
  }
  return specs;
}

// Unrelated requests, enough to push every first turn out of a small device pool.
std::vector<Spec> Flush() {
  std::mt19937 rng(79);
  std::vector<Spec> specs;
  for (int i = 0; i < 12; ++i) {
    Spec s;
    const int len = 200 + static_cast<int>(rng() % 60);
    for (int t = 0; t < len; ++t) s.prompt.push_back(static_cast<int32_t>(rng() % 1000));
    s.max_new_tokens = 30;
    s.temperature = 0.0f;
    s.seed = 900 + i;
    s.priority = 0;
    specs.push_back(s);
  }
  return specs;
}

// With `flush`, the Flush() requests run between the two turns (their results are not kept).
RunResult RunConversations(const ModelBundle& model, const EngineOptions& options,
                           bool flush = false) {
  std::unique_ptr<Engine> engine = StartEngine(model, options);
  RunResult out;
  const std::vector<Spec> first = FirstTurns();
  RunSpecs(*engine, first, &out);
  EXPECT_TRUE(engine->WaitIdle(absl::Seconds(10)));
  if (flush) {
    RunResult flushed;
    RunSpecs(*engine, Flush(), &flushed);
    EXPECT_TRUE(engine->WaitIdle(absl::Seconds(10)));
  }
  RunSpecs(*engine, SecondTurns(first, out), &out);
  out.stats = SettledStats(*engine);
  return out;
}

// The first turn's history with KV (its prompt and every output token but the last): what a
// second turn finds when the cache kept all of it (its full blocks and its tail,
// KvPager::RegisterTail); in full blocks, what it finds after the tail was evicted (a tail is
// never offloaded).
int64_t FirstTurnHistoryTokens(const Spec& first) {
  return static_cast<int64_t>(first.prompt.size()) + first.max_new_tokens - 1;
}
int64_t FirstTurnBlockTokens(const Spec& first, int32_t block_tokens) {
  return FirstTurnHistoryTokens(first) / block_tokens * block_tokens;
}

TEST_F(KvModesTest, PrefixCachingServesSharedPromptsAndConversationsWithIdenticalTokens) {
  EngineOptions base;
  base.slots = 4;
  base.prefill_chunk = 64;
  base.kv_mode = KvMode::kKvrm;
  EngineOptions off = base;
  off.prefix_caching = false;
  const RunResult reference = RunConversations(*model_, off);
  EXPECT_EQ(reference.stats.prefix_cache_hits_total, 0u);
  for (const FinishInfo& info : reference.infos) EXPECT_EQ(info.cached_prompt_tokens, 0);

  // Room for every history at once: nothing is evicted, so every second turn finds all of its
  // first turn's history: its full blocks, and the tail after them.
  EngineOptions roomy = base;
  roomy.kv_blocks = 512;
  const RunResult cached = RunConversations(*model_, roomy);
  EXPECT_EQ(cached.tokens, reference.tokens) << "prefix caching on";
  EXPECT_EQ(cached.stats.prefix_cache_evictions_total, 0u);
  const std::vector<Spec> first = FirstTurns();
  int64_t got = 0;
  for (size_t i = 0; i < first.size(); ++i) {
    const int32_t c = cached.infos[first.size() + i].cached_prompt_tokens;
    EXPECT_EQ(c, FirstTurnHistoryTokens(first[i])) << "conversation " << i;
    got += c;
  }
  int64_t first_turn_hits = 0;
  for (size_t i = 0; i < first.size(); ++i) first_turn_hits += cached.infos[i].cached_prompt_tokens;
  EXPECT_GT(first_turn_hits, 0) << "first turns shared their system prompts";
  EXPECT_EQ(cached.stats.prefix_cache_hits_total, static_cast<uint64_t>(got + first_turn_hits));
  EXPECT_GT(cached.stats.prefix_cache_queries_total, cached.stats.prefix_cache_hits_total);
  EXPECT_EQ(cached.stats.kv.blocks_reserved, 0);
  EXPECT_GT(cached.stats.kv.blocks_cached, 0) << "finished histories stay cached";
  EXPECT_EQ(cached.stats.kv.blocks_free, cached.stats.kv.blocks_total);

  // Two tensor-parallel ranks: one pager, the same block ids in both ranks' pools, so a block
  // one request wrote on both is read by another on both (tp=2 against tp=2: the all-reduce
  // may round differently from one rank).
  EngineOptions tp2_off = off;
  tp2_off.tensor_parallel = 2;
  EngineOptions tp2 = roomy;
  tp2.tensor_parallel = 2;
  const RunResult tp2_reference = RunConversations(*model_, tp2_off);
  const RunResult tp2_cached = RunConversations(*model_, tp2);
  EXPECT_EQ(tp2_cached.tokens, tp2_reference.tokens) << "prefix caching on, two ranks";
  EXPECT_GT(tp2_cached.stats.prefix_cache_hits_total, 0u);

  // A tight pool of small blocks: the cache must give way (evictions), histories fragment and
  // compact, and requests pause to the host tier, still with the same tokens.
  EngineOptions tight = base;
  tight.slots = 6;
  tight.block_tokens = 4;
  tight.max_runs = 2;
  tight.kv_blocks = 160;
  const RunResult pressed = RunConversations(*model_, tight);
  EXPECT_EQ(pressed.tokens, reference.tokens) << "prefix caching on, tight pool";
  EXPECT_GT(pressed.stats.prefix_cache_evictions_total, 0u);
  EXPECT_GT(pressed.stats.prefix_cache_hits_total, 0u);
  EXPECT_GT(pressed.stats.transfer_groups_total, 0u);
  EXPECT_EQ(pressed.stats.kv.blocks_free, 160);
}

// Offload to the host tier: unrelated requests between the two turns push every first turn out
// of a device pool that holds about a third of them. Without offload the second turns find
// little; with it, each finds its whole first-turn history (on the device or copied back from
// the host tier), and every turn decodes the same tokens as with no cache at all.
TEST_F(KvModesTest, PrefixCacheOffloadBringsEvictedHistoriesBackFromTheHostTier) {
  EngineOptions base;
  base.slots = 4;
  base.prefill_chunk = 64;
  base.kv_mode = KvMode::kKvrm;
  base.kv_blocks = 64;
  EngineOptions off = base;
  off.prefix_caching = false;
  const RunResult reference = RunConversations(*model_, off);

  EngineOptions device_only = base;
  device_only.prefix_cache_offload = false;
  const RunResult dropped = RunConversations(*model_, device_only, /*flush=*/true);
  EXPECT_EQ(dropped.tokens, reference.tokens) << "prefix caching on, no offload";
  EXPECT_EQ(dropped.stats.prefix_cache_offloaded_blocks_total, 0u);
  EXPECT_EQ(dropped.stats.prefix_cache_host_hits_total, 0u);

  EngineOptions offload = base;
  offload.kv_host_blocks = 1024;  // room for everything evicted
  const RunResult kept = RunConversations(*model_, offload, /*flush=*/true);
  EXPECT_EQ(kept.tokens, reference.tokens) << "prefix caching on, offload";
  const std::vector<Spec> first = FirstTurns();
  int64_t found = 0, found_without = 0;
  for (size_t i = 0; i < first.size(); ++i) {
    const int32_t c = kept.infos[first.size() + i].cached_prompt_tokens;
    // (The flush evicted the tails, which stay on the device: the full blocks come back.)
    EXPECT_EQ(c, FirstTurnBlockTokens(first[i], base.block_tokens)) << "conversation " << i;
    found += c;
    found_without += dropped.infos[first.size() + i].cached_prompt_tokens;
  }
  EXPECT_LT(found_without * 2, found) << "without offload most first turns are gone";
  EXPECT_GT(kept.stats.prefix_cache_offloaded_blocks_total, 64u);
  EXPECT_GT(kept.stats.prefix_cache_host_hits_total, static_cast<uint64_t>(found / 2));
  EXPECT_EQ(kept.stats.kv.blocks_reserved, 0) << "every block came back";
  EXPECT_GT(kept.stats.kv.host_blocks_cached, 64);
  EXPECT_GT(kept.stats.transfer_groups_total, 0u);
  std::printf("second turns found %lld prompt tokens cached with offload (%llu from the host "
              "tier), %lld without\n",
              static_cast<long long>(found),
              static_cast<unsigned long long>(kept.stats.prefix_cache_host_hits_total),
              static_cast<long long>(found_without));

  // Two ranks: the host tier holds both ranks' shares under the same block ids.
  EngineOptions tp2_off = off;
  tp2_off.tensor_parallel = 2;
  EngineOptions tp2 = offload;
  tp2.tensor_parallel = 2;
  const RunResult tp2_reference = RunConversations(*model_, tp2_off);
  const RunResult tp2_kept = RunConversations(*model_, tp2, /*flush=*/true);
  EXPECT_EQ(tp2_kept.tokens, tp2_reference.tokens) << "offload, two ranks";
  EXPECT_GT(tp2_kept.stats.prefix_cache_host_hits_total, 0u);
}

// One request on `engine` (greedy, ignore_eos, the top 2 logprobs of each token), waited for:
// its tokens, each token's logprob and its top 2 flattened, and its finish.
struct LoggedRun {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  FinishInfo info;
};
LoggedRun RunLogged(Engine& engine, const std::string& id, const std::vector<int32_t>& prompt,
                    int32_t max_new) {
  auto r = std::make_unique<GenerationRequest>();
  r->request_id = id;
  r->prompt = prompt;
  r->max_new_tokens = max_new;
  r->ignore_eos = true;
  r->sampling.logprobs = true;
  r->sampling.top_logprobs = 2;
  r->arrival = absl::Now();
  auto sink = std::make_shared<CollectingSink>();
  r->sink = sink;
  LoggedRun out;
  EXPECT_TRUE(engine.Submit(std::move(r)).ok());
  out.tokens = sink->Wait(&out.info);
  EXPECT_EQ(out.tokens.size(), static_cast<size_t>(max_new)) << out.info.error;
  for (const TokenLogprobs& t : sink->stream().logprobs) {
    out.logprobs.push_back(t.logprob);
    for (int32_t k = 0; k < t.num_top; ++k) out.logprobs.push_back(t.top_logprobs[k]);
  }
  return out;
}

// Prompts each one token longer than the one before (beam search's scoring requests): each
// finds the whole of the one before it cached, its full blocks and its tail (copied, not
// prefilled: KvPager::RegisterTail), and samples the same token with the same logprob as with
// the cache off; one and two ranks, f32 and bf16 KV.
TEST_F(KvModesTest, APromptThatGoesOnFromAnEndedHistoryCopiesItsTail) {
  for (const auto& [tp, kv_dtype] :
       {std::pair{1, DType::kF32}, std::pair{2, DType::kF32}, std::pair{1, DType::kBF16}}) {
    SCOPED_TRACE(absl::StrCat("tp ", tp, " ", std::string(DTypeName(kv_dtype))));
    std::vector<std::vector<int32_t>> tokens[2];
    std::vector<std::vector<float>> logprobs[2];
    std::vector<int32_t> cached;
    for (bool caching : {false, true}) {
      EngineOptions o;
      o.slots = 2;
      o.prefill_chunk = 64;
      o.tensor_parallel = tp;
      o.kv_dtype = kv_dtype;
      o.prefix_caching = caching;
      std::unique_ptr<Engine> engine = StartEngine(*model_, o);
      std::mt19937 rng(5);
      std::vector<int32_t> prompt(29);
      for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % 900) + 10;
      for (int step = 0; step < 24; ++step) {
        const LoggedRun run = RunLogged(*engine, absl::StrCat("score-", step), prompt, 1);
        tokens[caching].push_back(run.tokens);
        logprobs[caching].push_back(run.logprobs);
        if (caching) cached.push_back(run.info.cached_prompt_tokens);
        // The next prompt: this one and a token (not the one sampled: a beam's).
        prompt.push_back(static_cast<int32_t>(rng() % 900) + 10);
      }
    }
    EXPECT_EQ(tokens[1], tokens[0]);
    EXPECT_EQ(logprobs[1], logprobs[0]) << "the copied tails' K/V is what a prefill writes";
    // Each prompt after the first finds the one before it whole: 29, 30, ... tokens.
    for (size_t i = 1; i < cached.size(); ++i) {
      EXPECT_EQ(cached[i], 29 + static_cast<int32_t>(i) - 1) << "prompt " << i;
    }
  }
}

// Matching to the token: a prompt sent again finds all of itself but its last token (its last
// block is whole in the cache, the history having gone on past it), a prompt whose length is a
// multiple of the block size finds all of its last block but that token, and a next turn that
// leaves the history within a block finds the tokens before the difference; each copies its
// partial block's K/V, and every request samples the same tokens with the same logprobs as
// with the cache off. With prefix_cache_partial_blocks off, whole blocks only. One and two
// ranks, f32 and bf16 KV.
TEST_F(KvModesTest, APromptSentAgainPrefillsOneToken) {
  for (const auto& [tp, kv_dtype] :
       {std::pair{1, DType::kF32}, std::pair{2, DType::kF32}, std::pair{1, DType::kBF16}}) {
    SCOPED_TRACE(absl::StrCat("tp ", tp, " ", std::string(DTypeName(kv_dtype))));
    // Modes: the cache off, whole blocks only (as vLLM), to the token.
    std::vector<std::vector<int32_t>> tokens[3];
    std::vector<std::vector<float>> logprobs[3];
    std::vector<int32_t> cached[3];
    uint64_t copied[3] = {0, 0, 0};
    for (int caching : {0, 1, 2}) {
      EngineOptions o;
      o.slots = 2;
      o.prefill_chunk = 64;
      o.tensor_parallel = tp;
      o.kv_dtype = kv_dtype;
      o.prefix_caching = caching > 0;
      o.prefix_cache_partial_blocks = caching == 2;
      std::unique_ptr<Engine> engine = StartEngine(*model_, o);
      std::mt19937 rng(11);
      auto run = [&](const std::vector<int32_t>& prompt, int32_t max_new) {
        LoggedRun r =
            RunLogged(*engine, absl::StrCat("r-", tokens[caching].size()), prompt, max_new);
        tokens[caching].push_back(r.tokens);
        logprobs[caching].push_back(r.logprobs);
        cached[caching].push_back(r.info.cached_prompt_tokens);
        return r.tokens;
      };
      std::vector<int32_t> prompt(41);  // 2 blocks and 9 tokens
      for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % 900) + 10;
      const std::vector<int32_t> first = run(prompt, 12);  // the history fills its third block
      run(prompt, 12);                                     // sent again
      std::vector<int32_t> aligned(prompt.begin(), prompt.begin() + 32);  // 2 blocks exactly
      run(aligned, 4);
      // The next turn: the prompt, 3 of the tokens generated, then others.
      std::vector<int32_t> turn = prompt;
      turn.insert(turn.end(), first.begin(), first.begin() + 3);
      for (int i = 0; i < 20; ++i) turn.push_back(static_cast<int32_t>(rng() % 900) + 10);
      run(turn, 4);
      copied[caching] = engine->Stats().prefix_cache_copied_tokens_total;
    }
    EXPECT_EQ(tokens[1], tokens[0]);
    EXPECT_EQ(tokens[2], tokens[0]);
    EXPECT_EQ(logprobs[1], logprobs[0]);
    EXPECT_EQ(logprobs[2], logprobs[0]) << "the copied blocks' K/V is what a prefill writes";
    EXPECT_EQ(cached[0], (std::vector<int32_t>{0, 0, 0, 0}));
    EXPECT_EQ(cached[1], (std::vector<int32_t>{0, 32, 16, 32})) << "whole blocks";
    // All of the prompt but its last token; a whole block and 15 tokens of the next; up to where
    // the turn leaves the history.
    EXPECT_EQ(cached[2], (std::vector<int32_t>{0, 40, 31, 44})) << "to the token";
    EXPECT_EQ(copied[1], 0u);
    EXPECT_EQ(copied[2], 8u + 15 + 12);
  }
}

// A step whose prompt chunks include one whose slot ends before the step runs (its cached
// prefix's copy back from the host tier failed) runs the others' chunks without it: the failed
// request ends with an error, the prompt beside it gets its first token from that step and its
// tokens are those of a run without the fault, and every block comes back.
TEST_F(KvModesTest, AChunkWhoseCopyFailedLeavesTheStepAndTheOthersRun) {
  EngineOptions o;
  o.slots = 2;
  o.prefill_chunk = 64;
  o.max_context = 256;
  o.kv_blocks = 24;  // 384 tokens: the fillers below evict the first history to the host tier
  o.kv_host_blocks = 256;
  o.threads = 2;
  o.max_new_tokens = 64;
  std::atomic<bool> failing{false};
  std::atomic<int> failed{0};
  o.transfer_fault = [&](const TransferGroup& g) {
    if (failing.load() && g.src_tier == KvTier::kHost) {
      ++failed;
      return absl::InternalError("injected copy failure");
    }
    return absl::OkStatus();
  };
  absl::StatusOr<std::unique_ptr<Engine>> created = Engine::Create(model_, o);
  ASSERT_TRUE(created.ok()) << created.status();
  Engine& engine = **created;
  std::mt19937 rng(77);
  const auto tokens = [&](int n) {
    std::vector<int32_t> t(n);
    for (int32_t& x : t) x = static_cast<int32_t>(rng() % 900) + 10;
    return t;
  };
  const auto submit = [&](const std::string& id, std::vector<int32_t> prompt, int32_t n) {
    auto r = std::make_unique<GenerationRequest>();
    r->request_id = id;
    r->prompt = std::move(prompt);
    r->max_new_tokens = n;
    r->ignore_eos = true;
    r->arrival = absl::Now();
    auto sink = std::make_shared<CollectingSink>();
    r->sink = sink;
    CHECK_OK(engine.Submit(std::move(r)).status());
    return sink;
  };
  const auto run = [&](const std::vector<std::shared_ptr<CollectingSink>>& sinks) {
    for (int i = 0; i < 5000; ++i) {
      bool all = true;
      for (const auto& s : sinks) all &= s->done();
      if (all) return;
      engine.StepForTest();
    }
    FAIL() << "requests did not finish";
  };
  const std::vector<int32_t> history = tokens(64);
  run({submit("history", history, 1)});
  for (int i = 0; i < 4; ++i) run({submit("filler", tokens(150), 1)});
  ASSERT_GT(engine.Stats().prefix_cache_offloaded_blocks_total, 0u);

  // P's first 64 tokens are the history's, cached on the host tier; Q's are new.
  std::vector<int32_t> p_prompt = history;
  for (int32_t t : tokens(10)) p_prompt.push_back(t);
  const std::vector<int32_t> q_prompt = tokens(20);
  failing = true;
  const EngineStats before = engine.Stats();
  auto p = submit("p", p_prompt, 4);
  auto q = submit("q", q_prompt, 4);
  engine.StepForTest();
  const EngineStats after = engine.Stats();
  EXPECT_GE(failed.load(), 1);
  ASSERT_TRUE(p->done());
  FinishInfo info;
  EXPECT_TRUE(p->Wait(&info).empty());
  EXPECT_EQ(info.reason, FinishReason::kError);
  EXPECT_EQ(after.prefill_steps_total - before.prefill_steps_total, 1u);
  EXPECT_EQ(after.prefill_chunks_total - before.prefill_chunks_total, 1u) << "Q's alone";
  failing = false;
  run({q});
  const std::vector<int32_t> got = q->Wait(&info);
  EXPECT_EQ(info.reason, FinishReason::kLength) << info.error;
  // The same prompt again (its blocks now cached: the same tokens either way).
  auto again = submit("q-again", q_prompt, 4);
  run({again});
  EXPECT_EQ(again->Wait(&info), got);
  EXPECT_EQ(got.size(), 4u);
  for (int i = 0; i < 5; ++i) engine.StepForTest();  // retire copies in flight
  const EngineStats idle = engine.Stats();
  EXPECT_EQ(idle.slots_in_use, 0);
  EXPECT_EQ(idle.kv.blocks_used, 0);
  EXPECT_EQ(idle.kv.blocks_reserved, 0);
  EXPECT_EQ(idle.kv.host_blocks_used, 0);
}

}  // namespace
}  // namespace kvrm
