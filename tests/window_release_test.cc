// Window release through the engine (EngineOptions::window_release): a model whose every layer
// attends within a sliding window (tiny-mistral-sw: 48 positions of 512) gives a history's KV
// blocks wholly behind the window back to the pool as it moves on.
//  - exact: the same tokens as keeping every block, bit for bit, greedy and sampled, under KV
//    pressure (swap, drop-and-recompute over released blocks, compaction), with the prefix
//    cache (a cached prefix longer than the window) and with speculative drafts;
//  - bounded: a slot holds at most WindowPeakBlocks blocks whatever its length, histories
//    several times the pool complete, and every block comes back;
//  - it applies only where every layer slides, in kvrm mode; a pool below the working set is
//    refused naming --kv_blocks; the backend refuses a released block a row would read.
// The windowed forward pass itself is held to the float64 reference in forward_test
// (tiny-mistral-sw), and the kernel's released run tables to the full ones in kernels_test.
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/testing/alloc_counter.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kvrm/v1/kvrm.grpc.pb.h"
#include "runtime/backend.h"
#include "runtime/cpu_backend.h"
#include "runtime/engine.h"
#include "runtime/model_bundle.h"
#include "tests/engine_workload.h"
#include "tests/test_server.h"
#include "tools/modelgen/model_writer.h"

namespace kvrm {
namespace {

constexpr int32_t kWindow = 48;

const ModelBundle& Mistral() {
  static const ModelBundle* model = [] {
    const char* tmp = std::getenv("TEST_TMPDIR");
    modelgen::MakeModelOptions options;
    options.size = "tiny-mistral-sw";
    options.dtype = DType::kF32;
    options.out_dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/tiny-mistral-sw_f32");
    CHECK_OK(modelgen::MakeModel(options).status());
    absl::StatusOr<std::unique_ptr<ModelBundle>> bundle = ModelBundle::Load(options.out_dir);
    CHECK_OK(bundle.status());
    return bundle->release();
  }();
  return *model;
}

using Spec = WorkloadSpec;
using RunResult = WorkloadRun;

RunResult RunWorkload(const EngineOptions& options, const std::vector<Spec>& specs) {
  return RunWorkload(Mistral(), options, specs);
}

EngineOptions Roomy(bool release) {
  EngineOptions o;
  o.slots = 4;
  o.block_tokens = 8;
  o.prefill_chunk = 16;
  o.window_release = release;
  // The same pool either way (release's default is its working set a slot).
  o.kv_blocks = 4 * 64;
  return o;
}

// Histories up to ~450 tokens, far past the 48-token window: releasing the blocks behind it
// gives the tokens of keeping them, bit for bit (greedy and sampled).
TEST(WindowReleaseTest, ReleasedBlocksGiveTheTokensOfKeepingThem) {
  const std::vector<Spec> specs = RandomWorkload(8, 150, 250, 2026);
  const RunResult kept = RunWorkload(Roomy(false), specs);
  EXPECT_FALSE(kept.resolved.window_release);
  EXPECT_EQ(kept.stats.window_blocks_released_total, 0u);

  const RunResult released = RunWorkload(Roomy(true), specs);
  EXPECT_TRUE(released.resolved.window_release);
  EXPECT_EQ(released.tokens, kept.tokens);
  // Every history ends past its window: all but its last window's blocks went back early.
  uint64_t behind = 0;
  for (const Spec& s : specs) {
    behind += BlocksBehindWindow(static_cast<int64_t>(s.prompt.size()) + s.max_new_tokens - 1,
                                 kWindow, 8);
  }
  EXPECT_GE(released.stats.window_blocks_released_total, behind);
  EXPECT_EQ(released.stats.kv.blocks_free, released.stats.kv.blocks_total);
  EXPECT_EQ(released.stats.kv.blocks_used, 0);
  std::printf("[window release] 8 requests: %llu blocks released behind the window\n",
              static_cast<unsigned long long>(released.stats.window_blocks_released_total));
}

// 8-token blocks, 16-token chunks, a 48-token window: a slot holds at most
// WindowPeakBlocks = (47 + 15) / 8 + 2 = 9 blocks. Two requests growing to 440 and 470 tokens
// (55 and 59 blocks) run on an 18-block pool, checked after every engine step, and give the
// tokens of a pool that keeps every block.
TEST(WindowReleaseTest, SlotsHoldAWindowOfBlocksWhateverTheirLength) {
  const int64_t peak = WindowPeakBlocks(kWindow, 8, 16, 0);
  ASSERT_EQ(peak, 9);
  EngineOptions o = Roomy(true);
  o.slots = 2;
  o.kv_blocks = 2 * peak;
  o.kv_host_blocks = 2 * peak;
  o.threads = 2;
  o.max_new_tokens = 512;
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(&Mistral(), o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<Spec> specs = RandomWorkload(2, 100, 1, 7);
  specs[0].prompt.resize(40, 5);
  specs[0].max_new_tokens = 400;
  specs[1].prompt.resize(150, 9);  // a prompt three windows long: prefilled chunk by chunk
  specs[1].max_new_tokens = 320;
  std::vector<std::shared_ptr<CollectingSink>> sinks;
  for (int i = 0; i < 2; ++i) {
    sinks.push_back(std::make_shared<CollectingSink>());
    ASSERT_TRUE((*engine)->Submit(WorkloadRequest(specs[i], i, sinks.back())).ok());
  }
  int steps = 0, both_decoding = 0;
  int64_t most_reserved = 0;
  while (!sinks[0]->done() || !sinks[1]->done()) {
    ASSERT_LT(++steps, 3000);
    (*engine)->StepForTest();
    const EngineStats stats = (*engine)->Stats();
    ASSERT_LE(stats.kv.blocks_reserved, 2 * peak) << "after step " << steps;
    ASSERT_EQ(stats.slots_paused, 0) << "after step " << steps;
    both_decoding += stats.slots_decoding == 2;
    most_reserved = std::max(most_reserved, stats.kv.blocks_reserved);
  }
  std::vector<std::vector<int32_t>> tokens;
  for (int i = 0; i < 2; ++i) {
    FinishInfo info;
    tokens.push_back(sinks[i]->Wait(&info));
    EXPECT_EQ(info.reason, FinishReason::kLength) << info.error;
    EXPECT_EQ(static_cast<int32_t>(tokens.back().size()), specs[i].max_new_tokens);
  }
  const EngineStats stats = (*engine)->Stats();
  EXPECT_GT(both_decoding, 250);
  EXPECT_GE(stats.window_blocks_released_total, uint64_t{(55 - 8) + (59 - 8)});
  EXPECT_EQ(stats.kv.blocks_used, 0);
  EXPECT_EQ(stats.kv.blocks_free, 2 * peak);
  EXPECT_EQ(stats.kv.host_blocks_used, 0);
  EXPECT_EQ(stats.preemptions_total, 0u);
  EXPECT_EQ(RunWorkload(Roomy(false), specs).tokens, tokens);
  std::printf(
      "[window release] 2 slots grew to 440 and 470 tokens (114 blocks) on an %lld-block "
      "pool: at most %lld blocks held, %llu released\n",
      static_cast<long long>(2 * peak), static_cast<long long>(most_reserved),
      static_cast<unsigned long long>(stats.window_blocks_released_total));
}

// Release is a function of the position only, so KV pressure changes nothing: a swapped slot
// keeps its released count, a recomputed one releases again as it re-prefills, compaction moves
// kept blocks only; all give the tokens of keeping every block with room for everyone.
TEST(WindowReleaseTest, SwapRecomputeAndCompactionGiveIdenticalTokens) {
  // Prompts of one chunk, so the pressure comes while decoding.
  const std::vector<Spec> specs = RandomWorkload(8, 14, 250, 99);
  const RunResult reference = RunWorkload(Roomy(false), specs);
  EXPECT_EQ(reference.stats.preemptions_total, 0u);

  // 4 slots of up to 9 blocks on 20: pauses. A decoding slot keeps at most 8 blocks, within
  // R = 8 runs: no compaction there. With R = 3 on 48 blocks, a decoding slot's recycled blocks
  // scatter over the pool and are compacted (moves gated on the step that writes the hot block,
  // releases of blocks whose move is in flight).
  ExpectPressureChangesNoToken(Mistral(), Roomy(true), /*tight_blocks=*/20,
                               /*compact_blocks=*/48, specs, reference);
}

// A shared 120-token prefix (two and a half windows) comes from the prefix cache: the slot
// attaches it and releases at once the blocks behind its first chunk's window. Prompt-lookup
// drafts verify over released tables too. Both give the tokens of keeping every block.
TEST(WindowReleaseTest, PrefixCacheAndDraftsGiveIdenticalTokens) {
  std::vector<Spec> specs = RandomWorkload(8, 30, 120, 5);
  std::mt19937 rng(11);
  std::vector<int32_t> shared(120);
  for (int32_t& t : shared) t = static_cast<int32_t>(rng() % 1000);
  for (size_t i = 0; i < specs.size(); ++i) {
    if (i % 4 == 3) continue;  // some prompts share nothing
    specs[i].prompt.insert(specs[i].prompt.begin(), shared.begin(), shared.end());
  }
  EngineOptions keep = Roomy(false);
  keep.slots = 2;  // later requests find the earlier ones' blocks cached
  const RunResult reference = RunWorkload(keep, specs);
  EngineOptions cached = Roomy(true);
  cached.slots = 2;
  const RunResult hit = RunWorkload(cached, specs);
  EXPECT_EQ(hit.tokens, reference.tokens);
  EXPECT_TRUE(hit.resolved.prefix_caching);
  EXPECT_GE(hit.stats.prefix_cache_hits_total, 4u * 112);
  EXPECT_EQ(hit.stats.kv.blocks_used, 0);

  EngineOptions drafting = cached;
  drafting.speculative_tokens = 4;
  const RunResult drafted = RunWorkload(drafting, specs);
  EXPECT_EQ(drafted.tokens, reference.tokens);
  EXPECT_GT(drafted.stats.spec_decode_draft_tokens_total, 0u);
  EXPECT_GT(drafted.stats.window_blocks_released_total, 0u);
  EXPECT_EQ(drafted.stats.kv.blocks_used, 0);
  std::printf(
      "[window release] prefix cache: %llu of %llu prompt tokens hit; drafts: %llu of "
      "%llu accepted\n",
      static_cast<unsigned long long>(hit.stats.prefix_cache_hits_total),
      static_cast<unsigned long long>(hit.stats.prefix_cache_queries_total),
      static_cast<unsigned long long>(drafted.stats.spec_decode_accepted_tokens_total),
      static_cast<unsigned long long>(drafted.stats.spec_decode_draft_tokens_total));
}

TEST(WindowReleaseTest, AppliesOnlyWhereEveryLayerSlidesAndSizesThePool) {
  EngineOptions o;
  o.slots = 3;
  o.threads = 2;
  o.block_tokens = 8;
  o.prefill_chunk = 16;
  // The default pool is the working set a slot: 9 blocks, not 512 / 8 = 64.
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(&Mistral(), o);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_TRUE((*e)->options().window_release);
  EXPECT_EQ((*e)->options().kv_blocks, 3 * 9);
  // Below one slot's working set: refused naming the flag.
  o.kv_blocks = 8;
  e = Engine::Create(&Mistral(), o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("--kv_blocks 8"), std::string::npos) << e.status();
  o.kv_blocks = 9;
  EXPECT_TRUE(Engine::Create(&Mistral(), o).ok());
  // Off when asked, in the static baseline (no block table), when the context is within the
  // window, and for a model with a layer that does not slide (the tiny Llama: no window).
  o.kv_blocks = 0;
  o.window_release = false;
  e = Engine::Create(&Mistral(), o);
  ASSERT_TRUE(e.ok());
  EXPECT_FALSE((*e)->options().window_release);
  EXPECT_EQ((*e)->options().kv_blocks, 3 * 64);
  o.window_release = true;
  o.kv_mode = KvMode::kStatic;
  e = Engine::Create(&Mistral(), o);
  ASSERT_TRUE(e.ok());
  EXPECT_FALSE((*e)->options().window_release);
  o.kv_mode = KvMode::kKvrm;
  o.max_context = kWindow;
  e = Engine::Create(&Mistral(), o);
  ASSERT_TRUE(e.ok());
  EXPECT_FALSE((*e)->options().window_release);
  o.max_context = 0;
  static const ModelBundle* tiny = LoadTinyModel();
  e = Engine::Create(tiny, o);
  ASSERT_TRUE(e.ok());
  EXPECT_FALSE((*e)->options().window_release);
}

// A conversation: turn 1 (100 prompt + 150 generated tokens, five windows) releases blocks as it
// decodes, registering them first; turn 2's prompt (turn 1's history and 20 new tokens) then
// finds all of turn 1's written full blocks in the cache, as without release, and gives the
// same tokens.
TEST(WindowReleaseTest, AConversationsNextTurnFindsTheWholeHistoryCached) {
  auto run = [](bool release, uint64_t* turn2_hits) {
    EngineOptions o = Roomy(release);
    o.slots = 1;
    o.threads = 2;
    absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(&Mistral(), o);
    CHECK_OK(engine.status());
    (*engine)->Start();
    std::vector<Spec> turns = RandomWorkload(1, 1, 1, 77);
    turns[0].prompt.resize(100, 11);
    for (size_t t = 0; t < 100; ++t) turns[0].prompt[t] = static_cast<int32_t>(7 * t % 1000);
    turns[0].max_new_tokens = 150;
    turns[0].temperature = 0;
    std::vector<std::vector<int32_t>> outputs;
    uint64_t hits_before = 0;
    for (int turn = 0; turn < 2; ++turn) {
      if (turn == 1) {
        Spec next = turns[0];
        next.prompt.insert(next.prompt.end(), outputs[0].begin(), outputs[0].end());
        for (int t = 0; t < 20; ++t) next.prompt.push_back(500 + t);
        next.max_new_tokens = 40;
        turns.push_back(next);
        hits_before = (*engine)->Stats().prefix_cache_hits_total;
      }
      outputs.push_back(ServeWorkload(**engine, {turns[turn]}, turn)[0]);
    }
    EXPECT_TRUE((*engine)->WaitIdle(absl::Seconds(10)));
    *turn2_hits = (*engine)->Stats().prefix_cache_hits_total - hits_before;
    return outputs;
  };
  uint64_t kept_hits = 0, released_hits = 0;
  const auto kept = run(false, &kept_hits);
  const auto released = run(true, &released_hits);
  EXPECT_EQ(released, kept);
  // Turn 1 wrote K/V for 249 tokens (its last token is never an input): 31 full 8-token blocks
  // and, kept whole, the 1-token tail after them (KvPager::RegisterTail; not under a window,
  // where a slot's blocks are released as it goes).
  EXPECT_EQ(kept_hits, 31u * 8 + 1);
  EXPECT_EQ(released_hits, 31u * 8);
}

// The same conversation on a pool of 12 blocks (the window's working set and three more), with
// a host tier to offload to. Turn 1's released blocks are evicted while it still decodes, its
// first ones long before its last; turn 2 needs only the blocks within the window of its cached
// prefix's end (a sliding-window hit, as vLLM's), found on the device. With another request in
// between, those are evicted too, and come back from the host tier. Either way turn 2 finds all
// of turn 1's written blocks, and gives the tokens of a roomy pool that keeps every block.
// (Chains keyed by the block before, as they were until 2026-12-07, found 8 of the 248 tokens
// either way: the first blocks, evicted first, cut every chain after them, and a hit needed
// every block from the first.)
TEST(WindowReleaseTest, UnderPressureTheNextTurnFindsItsWindowInEitherTier) {
  struct Turn2 {
    std::vector<std::vector<int32_t>> outputs;
    uint64_t hits = 0, host_hits = 0;
  };
  auto run = [](bool release, bool between) {
    EngineOptions o = Roomy(release);
    o.slots = 1;
    o.threads = 2;
    if (release) {
      o.kv_blocks = 12;
      o.kv_host_blocks = 64;
    }
    absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(&Mistral(), o);
    CHECK_OK(engine.status());
    EXPECT_EQ((*engine)->options().window_release, release);
    (*engine)->Start();
    Spec first = RandomWorkload(1, 1, 1, 78)[0];
    first.prompt.resize(100);
    for (size_t t = 0; t < 100; ++t) first.prompt[t] = static_cast<int32_t>(13 * t % 1000);
    first.max_new_tokens = 150;
    first.temperature = 0;
    Spec other = first;
    for (size_t t = 0; t < 100; ++t) other.prompt[t] = static_cast<int32_t>(17 * t % 1000 + 3);
    other.max_new_tokens = 60;
    Turn2 r;
    r.outputs.push_back(ServeWorkload(**engine, {first}, 0)[0]);
    if (between) ServeWorkload(**engine, {other}, 1);
    Spec next = first;
    next.prompt.insert(next.prompt.end(), r.outputs[0].begin(), r.outputs[0].end());
    for (int t = 0; t < 20; ++t) next.prompt.push_back(600 + t);
    next.max_new_tokens = 40;
    const uint64_t hits_before = (*engine)->Stats().prefix_cache_hits_total;
    const uint64_t host_before = (*engine)->Stats().prefix_cache_host_hits_total;
    r.outputs.push_back(ServeWorkload(**engine, {next}, 2)[0]);
    EXPECT_TRUE((*engine)->WaitIdle(absl::Seconds(10)));
    r.hits = (*engine)->Stats().prefix_cache_hits_total - hits_before;
    r.host_hits = (*engine)->Stats().prefix_cache_host_hits_total - host_before;
    return r;
  };
  for (const bool between : {false, true}) {
    SCOPED_TRACE(between ? "another request between the turns" : "turn after turn");
    const Turn2 kept = run(false, between);
    const Turn2 released = run(true, between);
    EXPECT_EQ(released.outputs, kept.outputs);
    // Turn 1 wrote K/V for 249 tokens (its last token is never an input): 31 full 8-token
    // blocks, and kept whole its 1-token tail (not under a window).
    EXPECT_EQ(kept.hits, 31u * 8 + 1);
    EXPECT_EQ(kept.host_hits, 0u) << "a roomy pool evicts nothing";
    EXPECT_EQ(released.hits, 31u * 8);
    if (between) {
      EXPECT_GT(released.host_hits, 0u) << "the window's blocks came back from the host tier";
    } else {
      EXPECT_EQ(released.host_hits, 0u) << "the window's blocks were still on the device";
    }
    std::printf(
        "[window release, 12-block pool%s] turn 2: %llu cached tokens, %llu of them "
        "copied back from the host\n",
        between ? ", a request between" : "", static_cast<unsigned long long>(released.hits),
        static_cast<unsigned long long>(released.host_hits));
  }
}

// Random shapes around the edges: windows of 1 to 100 positions (shorter than a block, not a
// multiple of one, longer than a chunk), blocks of 4 to 16 tokens, chunks of 8 to 40, with and
// without drafts, one tensor-parallel rank or two, on a roomy pool and a tight one (pauses):
// every shape gives the tokens of keeping every block, and every block comes back.
TEST(WindowReleaseTest, RandomShapesGiveTheTokensOfKeepingThem) {
  absl::StatusOr<std::unique_ptr<ModelBundle>> loaded = ModelBundle::Load(Mistral().dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ModelBundle& model = **loaded;  // its window changes per shape (engines read it at creation)
  std::mt19937 rng(35);
  int released_shapes = 0, paused_shapes = 0;
  for (int shape = 0; shape < 14; ++shape) {
    const int32_t window = std::vector<int32_t>{1, 3, 5, 16, 20, 37, 64, 100}[rng() % 8];
    model.config.sliding_window = window;
    EngineOptions o;
    o.slots = 3;
    o.block_tokens = std::vector<int32_t>{4, 8, 16}[rng() % 3];
    o.prefill_chunk = std::vector<int32_t>{8, 24, 40}[rng() % 3];
    o.speculative_tokens = rng() % 2 == 0 ? 0 : 3;
    o.tensor_parallel = shape % 3 == 0 ? 2 : 1;  // each rank's share of KV heads released alike
    const std::vector<Spec> specs = RandomWorkload(5, 90, 150, 100 + shape);
    EngineOptions keep = o;
    keep.window_release = false;
    const RunResult reference = RunWorkload(model, keep, specs);
    o.window_release = true;
    const int64_t peak =
        WindowPeakBlocks(window, o.block_tokens, o.prefill_chunk, o.speculative_tokens);
    const bool tight = shape % 2 == 1;
    if (tight) o.kv_blocks = peak + 2 + static_cast<int64_t>(rng() % (2 * peak));
    const RunResult released = RunWorkload(model, o, specs);
    const std::string what = absl::StrCat(
        "window ", window, ", blocks of ", o.block_tokens, ", chunks of ", o.prefill_chunk,
        ", drafts ", o.speculative_tokens, ", tp ", o.tensor_parallel, ", pool ", o.kv_blocks);
    ASSERT_TRUE(released.resolved.window_release) << what;
    EXPECT_EQ(released.tokens, reference.tokens) << what;
    EXPECT_EQ(released.stats.kv.blocks_used, 0) << what;
    EXPECT_EQ(released.stats.kv.blocks_free, released.stats.kv.blocks_total) << what;
    released_shapes += released.stats.window_blocks_released_total > 0;
    paused_shapes += released.stats.preemptions_total > 0;
  }
  model.config.sliding_window = kWindow;
  EXPECT_EQ(released_shapes, 14);
  EXPECT_GT(paused_shapes, 0);
}

// Conversations at random shapes, windowed prefix hits under pressure: three conversations run
// their first turns at once on a tight pool with a narrow run table (so their blocks interleave,
// and a cached window may lie in more runs than a slot can take), then their second turns (each
// history and a few new tokens) at once. Every second turn gives the tokens of keeping every
// block on a roomy pool, and some of them start from the cache.
TEST(WindowReleaseTest, RandomConversationsGiveTheTokensOfKeepingThem) {
  absl::StatusOr<std::unique_ptr<ModelBundle>> loaded = ModelBundle::Load(Mistral().dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ModelBundle& model = **loaded;
  std::mt19937 rng(41);
  uint64_t hits = 0;
  for (int shape = 0; shape < 8; ++shape) {
    const int32_t window = std::vector<int32_t>{5, 16, 20, 37}[rng() % 4];
    model.config.sliding_window = window;
    EngineOptions o;
    o.slots = 3;
    o.threads = 2;
    o.block_tokens = std::vector<int32_t>{4, 8}[rng() % 2];
    o.prefill_chunk = std::vector<int32_t>{8, 24}[rng() % 2];
    o.max_runs = 1 + static_cast<int32_t>(rng() % 2);
    std::vector<Spec> first = RandomWorkload(3, 60, 60, 300 + shape);
    for (Spec& s : first) s.temperature = 0;
    std::vector<int32_t> extra(5);
    for (int32_t& x : extra) x = static_cast<int32_t>(rng() % 900);
    auto run = [&](const EngineOptions& options, uint64_t* turn2_hits) {
      absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(&model, options);
      CHECK_OK(engine.status());
      (*engine)->Start();
      std::vector<std::vector<int32_t>> out = ServeWorkload(**engine, first, 0);
      std::vector<Spec> second = first;
      for (size_t i = 0; i < second.size(); ++i) {
        second[i].prompt.insert(second[i].prompt.end(), out[i].begin(), out[i].end());
        second[i].prompt.insert(second[i].prompt.end(), extra.begin(), extra.end());
        second[i].max_new_tokens = 12;
      }
      const uint64_t before = (*engine)->Stats().prefix_cache_hits_total;
      std::vector<std::vector<int32_t>> out2 = ServeWorkload(**engine, second, 10);
      EXPECT_TRUE((*engine)->WaitIdle(absl::Seconds(10)));
      *turn2_hits = (*engine)->Stats().prefix_cache_hits_total - before;
      out.insert(out.end(), out2.begin(), out2.end());
      return out;
    };
    EngineOptions keep = o;
    keep.window_release = false;
    keep.max_runs = 8;
    uint64_t keep_hits = 0, release_hits = 0;
    const auto reference = run(keep, &keep_hits);
    o.window_release = true;
    o.kv_blocks = WindowPeakBlocks(window, o.block_tokens, o.prefill_chunk, 0) + 3;
    const auto released = run(o, &release_hits);
    EXPECT_EQ(released, reference) << "window " << window << ", blocks of " << o.block_tokens
                                   << ", runs " << o.max_runs << ", pool " << o.kv_blocks;
    hits += release_hits;
  }
  model.config.sliding_window = kWindow;
  EXPECT_GT(hits, 0u);
  std::printf("[window release, random conversations] turn 2: %llu tokens from the cache\n",
              static_cast<unsigned long long>(hits));
}

// The server says so: GetServerInfo's KV usage names the window and counts the blocks released.
TEST(WindowReleaseTest, ServerInfoReportsTheWindowAndTheReleasedBlocks) {
  EngineOptions o;
  o.slots = 2;
  o.threads = 2;
  absl::StatusOr<std::unique_ptr<ModelBundle>> model = ModelBundle::Load(Mistral().dir);
  ASSERT_TRUE(model.ok()) << model.status();
  TestServer server(std::move(*model), o);
  v1::GenerateRequest req = TextRequest("a window slides along", 200);
  req.mutable_stopping()->set_ignore_eos(true);
  const StreamResult r = RunGenerate(server.stub(), req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens.size(), 200u);
  grpc::ClientContext context;
  v1::ServerInfo info;
  ASSERT_TRUE(server.stub().GetServerInfo(&context, v1::GetServerInfoRequest(), &info).ok());
  EXPECT_EQ(info.kv().window_release_tokens(), kWindow);
  // 16-token blocks: a history of 200 + the prompt's tokens leaves at least (200 - 48) / 16.
  EXPECT_GE(info.kv().window_released_blocks_total(), 9u);
  // The default pool: the working set a slot, (47 + 255) / 16 + 2 = 20 blocks.
  EXPECT_EQ(info.kv().blocks_total(), 2 * 20);
}

// The CPU backend takes a released block only where every layer slides and the block lies
// wholly behind the window of the slot's first row; its released step allocates nothing.
TEST(WindowReleaseTest, BackendRefusesAReleasedBlockARowReadsAndDoesNotAllocate) {
  const ModelBundle& m = Mistral();
  const int32_t vocab = m.config.vocab_size;
  CpuBackendOptions bo;
  bo.kv_blocks = 64;
  bo.kv_block_tokens = 8;
  bo.max_slots = 2;
  bo.max_chunk_tokens = 16;
  bo.max_context = 256;
  bo.num_threads = 2;
  absl::StatusOr<std::unique_ptr<CpuBackend>> backend =
      CpuBackend::Create(m.config, &m.weights, bo);
  ASSERT_TRUE(backend.ok()) << backend.status();
  std::vector<int32_t> tokens(16, 7);
  std::vector<float> logits(2 * vocab);
  const KvRun all[2] = {{0, 32}, {32, 32}};
  for (int32_t start = 0; start < 96; start += 16) {
    PrefillChunk pc{0, start, absl::MakeConstSpan(tokens), &all[0], 1};
    ASSERT_TRUE((*backend)->Prefill(pc, logits.data()).ok());
  }
  // Slot 0 at position 100 reads [53, 100]: blocks 0..5 (tokens < 48) are behind; block 6 holds
  // 48..55, which it reads.
  ASSERT_EQ(BlocksBehindWindow(100, kWindow, 8), 6);
  StepDescriptor step;
  step.Resize(2, 1);
  step.active[0] = 1;
  step.position[0] = 100;
  step.token[0] = 3;
  step.num_runs[0] = 1;
  step.far_dropped[0] = 7;
  step.SlotRuns(0)[0] = KvRun{7, 25};
  absl::Status st = (*backend)->Decode(step, logits.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("7 blocks released"), std::string::npos) << st;
  PrefillChunk chunk{0, 96, absl::MakeConstSpan(tokens), &all[0], 1};
  chunk.far_dropped = 7;  // its first row, at 96, reads from 49 on: 6 blocks are behind
  chunk.runs = &step.SlotRuns(0)[0];
  EXPECT_EQ((*backend)->Prefill(chunk, logits.data()).code(), absl::StatusCode::kInvalidArgument);

  // Released behind the window: the logits of the full table, bit for bit, and no allocation.
  step.far_dropped[0] = 6;
  step.SlotRuns(0)[0] = KvRun{6, 26};
  std::vector<float> released(logits.size()), full(logits.size());
  const int64_t before = alloc_counter::AllocationCount();
  ASSERT_TRUE((*backend)->Decode(step, released.data()).ok());
  const int64_t allocations = alloc_counter::AllocationCount() - before;
  if (alloc_counter::kAvailable) EXPECT_EQ(allocations, 0);
  StepDescriptor whole = step;
  whole.far_dropped[0] = 0;
  whole.SlotRuns(0)[0] = all[0];
  ASSERT_TRUE((*backend)->Decode(whole, full.data()).ok());
  EXPECT_TRUE(std::equal(full.begin(), full.begin() + vocab, released.begin()));

  // A model with a layer that does not slide reads every block: none may be released.
  static const ModelBundle* tiny = LoadTinyModel();
  backend = CpuBackend::Create(tiny->config, &tiny->weights, bo);
  ASSERT_TRUE(backend.ok()) << backend.status();
  for (int32_t start = 0; start < 96; start += 16) {
    PrefillChunk pc{0, start, absl::MakeConstSpan(tokens), &all[0], 1};
    ASSERT_TRUE((*backend)->Prefill(pc, logits.data()).ok());
  }
  st = (*backend)->Decode(step, logits.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("a layer without a window"), std::string::npos) << st;
}

}  // namespace
}  // namespace kvrm
