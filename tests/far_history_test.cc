// Far-history summaries through the engine (runtime/far_history.h, docs/runtime.md):
//  - on, with every history shorter than sinks + window, tokens are identical to off;
//  - on, far past that, a slot's device blocks stay within sinks + window + 1 while decoding,
//    histories longer than the whole pool complete, and every block comes back;
//  - on, the same tokens whatever the KV pressure: swapping, drop-and-recompute (a chunked
//    prefill over summaries) and compaction give the bits of an unpressured run;
//  - bad options are refused naming the flag; the backend's far step does not allocate.
// The kernel itself is checked against a float64 reference in kernels/cpu/kernels_test.
#include "runtime/far_history.h"

#include <condition_variable>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

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
#include "tests/reference_llama.h"
#include "tests/test_server.h"

namespace kvrm {
namespace {

const ModelBundle& Tiny() {
  static const ModelBundle* model = LoadTinyModel();
  return *model;
}

using Spec = WorkloadSpec;
using RunResult = WorkloadRun;

RunResult RunWorkload(const EngineOptions& options, const std::vector<Spec>& specs) {
  return RunWorkload(Tiny(), options, specs);
}

FarHistoryOptions Far(int32_t sinks, int32_t window) {
  FarHistoryOptions f;
  f.enabled = true;
  f.sink_tokens = sinks;
  f.window_tokens = window;
  return f;
}

// Off is the full computation; on, while every history stays within sinks + window, no summary
// exists and the engine takes the exact kernel path: the same tokens, bit for bit.
TEST(FarHistoryTest, ShortHistoriesGiveTheTokensOfOff) {
  const std::vector<Spec> specs = RandomWorkload(10, 300, 180, 2026);  // histories < 512 tokens
  EngineOptions off;
  off.slots = 4;
  off.prefill_chunk = 64;
  const RunResult exact = RunWorkload(off, specs);
  EXPECT_EQ(exact.stats.far_blocks_summarized_total, 0u);

  EngineOptions on = off;
  on.far_history = Far(16, 496);  // sinks + window = 512 = max context
  const RunResult far = RunWorkload(on, specs);
  EXPECT_EQ(far.tokens, exact.tokens);
  EXPECT_EQ(far.stats.far_blocks_summarized_total, 0u);
  EXPECT_EQ(far.stats.kv.blocks_free, far.stats.kv.blocks_total);
}

// 8-token blocks, 1 sink block, a 4-block window, 16-token chunks: a decoding slot holds at
// most 1 + 4 + 1 = 6 blocks, a prefilling one 1 + 4 + 2 = 7. Two requests of 340 and 420
// tokens decode on a 16-block (128-token) pool, checked after every engine step.
TEST(FarHistoryTest, DecodingFarPastThePoolKeepsBlocksBounded) {
  constexpr int32_t kSinkBlocks = 1, kWindowBlocks = 4, kChunkBlocks = 2;
  EngineOptions o;
  o.slots = 2;
  o.block_tokens = 8;
  o.prefill_chunk = 16;
  o.kv_blocks = 16;
  o.kv_host_blocks = 16;
  o.threads = 2;
  o.max_new_tokens = 512;
  o.far_history = Far(8, 32);
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(&Tiny(), o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ((*engine)->far_history().sink_blocks, kSinkBlocks);
  EXPECT_EQ((*engine)->far_history().window_blocks, kWindowBlocks);
  std::vector<Spec> specs = RandomWorkload(2, 100, 1, 7);
  specs[0].prompt.resize(40, 5);
  specs[0].max_new_tokens = 300;
  specs[1].prompt.resize(100, 9);
  specs[1].max_new_tokens = 320;
  std::vector<std::shared_ptr<CollectingSink>> sinks;
  for (int i = 0; i < 2; ++i) {
    sinks.push_back(std::make_shared<CollectingSink>());
    ASSERT_TRUE((*engine)->Submit(WorkloadRequest(specs[i], i, sinks.back())).ok());
  }
  int steps = 0, decoding_steps = 0;
  int64_t most_reserved = 0;
  while (!sinks[0]->done() || !sinks[1]->done()) {
    ASSERT_LT(++steps, 2000);
    (*engine)->StepForTest();
    int64_t bound = 0;
    for (int32_t s = 0; s < 2; ++s) {
      const SlotState st = (*engine)->slot_state(s);
      if (st == SlotState::kDecoding) bound += kSinkBlocks + kWindowBlocks + 1;
      if (st == SlotState::kPrefilling) bound += kSinkBlocks + kWindowBlocks + kChunkBlocks;
    }
    const EngineStats stats = (*engine)->Stats();
    ASSERT_LE(stats.kv.blocks_reserved, bound) << "after step " << steps;
    ASSERT_EQ(stats.slots_paused, 0);
    decoding_steps += stats.slots_decoding == 2;
    most_reserved = std::max(most_reserved, stats.kv.blocks_reserved);
  }
  for (int i = 0; i < 2; ++i) {
    FinishInfo info;
    const std::vector<int32_t> tokens = sinks[i]->Wait(&info);
    EXPECT_EQ(info.reason, FinishReason::kLength) << info.error;
    EXPECT_EQ(static_cast<int32_t>(tokens.size()), specs[i].max_new_tokens);
  }
  const EngineStats stats = (*engine)->Stats();
  // 340 and 420 tokens = 43 + 53 blocks of history on a 16-block pool.
  EXPECT_GT(decoding_steps, 250);
  EXPECT_GE(stats.far_blocks_summarized_total, uint64_t{(43 - 5) + (53 - 5)});
  EXPECT_EQ(stats.kv.blocks_used, 0);
  EXPECT_EQ(stats.kv.blocks_reserved, 0);
  EXPECT_EQ(stats.kv.blocks_free, 16);
  EXPECT_EQ(stats.kv.host_blocks_used, 0);
  std::printf("[far history] 2 slots decoded to 340 and 420 tokens on a 16-block pool: at most "
              "%lld blocks held, %llu blocks summarized\n",
              static_cast<long long>(most_reserved),
              static_cast<unsigned long long>(stats.far_blocks_summarized_total));
}

// The far policy is a function of the position only, so KV pressure changes nothing: swapping
// to the host tier keeps a slot's summaries, a recompute rebuilds them by chunked prefill, and
// compaction moves kept blocks; all give the tokens of a run with room for everyone.
TEST(FarHistoryTest, SwapRecomputeAndCompactionGiveIdenticalTokens) {
  // Prompts of one chunk, so the pressure comes while decoding (victims are swapped, or
  // recomputed over several chunks of summaries when there is no host tier).
  const std::vector<Spec> specs = RandomWorkload(8, 14, 250, 99);
  EngineOptions roomy;
  roomy.slots = 4;
  roomy.block_tokens = 8;
  roomy.prefill_chunk = 16;
  roomy.far_history = Far(8, 32);
  const RunResult reference = RunWorkload(roomy, specs);
  EXPECT_GT(reference.stats.far_blocks_summarized_total, 100u);
  EXPECT_EQ(reference.stats.preemptions_total, 0u);
  EXPECT_EQ(reference.stats.transfer_groups_total, 0u);

  // 4 slots need up to 4 x 7 blocks at once on 18: pauses. R = 8 >= the 6 kept blocks of a
  // decoding slot: no compaction there. With R = 3 < 6 on 40 blocks, a decoding slot's scattered
  // window is compacted (moves gated on the step that writes the hot block, drops of blocks
  // whose move is in flight).
  ExpectPressureChangesNoToken(Tiny(), roomy, /*tight_blocks=*/18, /*compact_blocks=*/40, specs,
                               reference);
}

TEST(FarHistoryTest, BadOptionsAreRefusedNamingTheFlag) {
  auto error = [](EngineOptions o) {
    absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(&Tiny(), o);
    EXPECT_FALSE(e.ok());
    return e.ok() ? std::string() : std::string(e.status().message());
  };
  EngineOptions o;
  o.slots = 2;
  o.threads = 2;
  o.far_history = Far(16, 0);
  EXPECT_NE(error(o).find("--far_history_window"), std::string::npos);
  o.far_history = Far(-1, 64);
  EXPECT_NE(error(o).find("--far_history_sinks"), std::string::npos);
  o.far_history = Far(16, 64);
  o.kv_mode = KvMode::kStatic;
  EXPECT_NE(error(o).find("--kv_mode=kvrm"), std::string::npos);
  o.kv_mode = KvMode::kKvrm;
  o.kv_blocks = 10;  // 1 sink + 4 window + 16 chunk blocks do not fit
  EXPECT_NE(error(o).find("--kv_blocks"), std::string::npos);
  // A pool smaller than one max-context request is fine when it holds the working set.
  o.kv_blocks = 21;
  absl::StatusOr<std::unique_ptr<Engine>> ok = Engine::Create(&Tiny(), o);
  EXPECT_TRUE(ok.ok()) << ok.status();
  // The defaults (a 1024-token window) on a 512-token model: accepted, never engaged.
  o.kv_blocks = 0;
  o.far_history = FarHistoryOptions{};
  o.far_history.enabled = true;
  ok = Engine::Create(&Tiny(), o);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)->far_history().SummariesAt(511, 16), 0);
}

// The whole forward pass with summaries (prefill chunks and decode steps, blocks leaving the run
// table as the engine drops them) against the float64 reference Llama computing the same
// approximation from its own definition (tests/reference_llama.h). Tolerance as in forward_test:
// max |engine - reference| <= 1e-5 * max(1, max |reference|) per logit row (measured ~1e-6,
// printed), while the approximation itself moves logits far more (checked: the exact reference
// differs by > 100x the tolerance).
TEST(FarHistoryTest, ForwardMatchesFloat64ReferenceOfTheSameApproximation) {
  constexpr int32_t kBlock = 8, kSinkBlocks = 1, kWindowBlocks = 3, kChunk = 16;
  constexpr int32_t kPrompt = 150, kSteps = 20, kBlocks = 32;
  const ModelBundle& m = Tiny();
  const int32_t vocab = m.config.vocab_size;
  absl::StatusOr<std::unique_ptr<ReferenceLlama>> ref = ReferenceLlama::Create(m.config, *m.files);
  ASSERT_TRUE(ref.ok()) << ref.status();
  FarHistoryShape far;
  far.sink_blocks = kSinkBlocks;
  far.window_blocks = kWindowBlocks;
  std::mt19937 rng(31);
  std::vector<int32_t> seq(kPrompt + kSteps);
  for (int32_t& t : seq) t = static_cast<int32_t>(rng() % vocab);
  ReferenceLlama::FarHistory rf;
  rf.block_tokens = kBlock;
  rf.sink_blocks = kSinkBlocks;
  rf.window_blocks = kWindowBlocks;
  const std::vector<std::vector<double>> want = (*ref)->Forward(seq, rf);
  const std::vector<std::vector<double>> exact = (*ref)->Forward(seq);
  // Slot 1's history: logical block b at physical block 2 * kBlocks - 1 - b (reversed, so every
  // kept block is its own run). The engine frees summarized blocks after a chunk or step: the
  // run table lists the sink, then the blocks from the first not yet summarized.
  auto kept_runs = [&](int32_t dropped, int32_t upto_block, std::vector<KvRun>* runs) {
    runs->clear();
    for (int32_t b = 0; b <= upto_block; ++b) {
      if (b >= kSinkBlocks && b < kSinkBlocks + dropped) continue;
      runs->push_back(KvRun{2 * kBlocks - 1 - b, 1});
    }
  };
  auto dropped_at = [&](int32_t pos) { return pos == 0 ? 0 : far.SummariesAt(pos - 1, kBlock); };
  double worst = 0, approximation = 0;
  auto check = [&](const float* got, int32_t pos, int32_t tp) {
    double scale = 0, diff = 0, off = 0;
    for (int32_t i = 0; i < vocab; ++i) {
      scale = std::max(scale, std::abs(want[pos][i]));
      diff = std::max(diff, std::abs(got[i] - want[pos][i]));
      off = std::max(off, std::abs(exact[pos][i] - want[pos][i]));
    }
    EXPECT_LE(diff, 1e-5 * std::max(1.0, scale)) << "position " << pos << " tp " << tp;
    worst = std::max(worst, diff / std::max(1.0, scale));
    approximation = std::max(approximation, off / std::max(1.0, scale));
  };
  // One rank, and two (each with its KV heads and its own summary store).
  for (int32_t tp : {1, 2}) {
    CpuBackendOptions bo;
    bo.kv_blocks = 2 * kBlocks;
    bo.kv_block_tokens = kBlock;
    bo.max_slots = 2;
    bo.max_chunk_tokens = kChunk;
    bo.max_context = 256;
    bo.num_threads = 2;
    bo.tensor_parallel = tp;
    bo.far_history = far;
    absl::StatusOr<std::unique_ptr<CpuBackend>> backend =
        CpuBackend::Create(m.config, &m.weights, bo);
    ASSERT_TRUE(backend.ok()) << backend.status();
    std::vector<float> logits(2 * vocab);
    std::vector<KvRun> runs;
    for (int32_t start = 0; start < kPrompt; start += kChunk) {
      const int32_t n = std::min(kChunk, kPrompt - start);
      PrefillChunk pc{1, start, absl::MakeConstSpan(seq).subspan(start, n), nullptr, 0};
      pc.far = far;
      pc.far_dropped = dropped_at(start);
      kept_runs(pc.far_dropped, (start + n - 1) / kBlock, &runs);
      pc.runs = runs.data();
      pc.num_runs = static_cast<int32_t>(runs.size());
      ASSERT_TRUE((*backend)->Prefill(pc, logits.data()).ok());
      check(logits.data(), start + n - 1, tp);
    }
    StepDescriptor step;
    step.Resize(2, 2 * kBlocks);
    step.far = far;
    step.active[1] = 1;
    for (int32_t pos = kPrompt; pos < kPrompt + kSteps; ++pos) {
      step.position[1] = pos;
      step.token[1] = seq[pos];
      step.far_dropped[1] = dropped_at(pos);
      step.far_summaries[1] = far.SummariesAt(pos, kBlock);
      kept_runs(step.far_dropped[1], pos / kBlock, &runs);
      std::copy(runs.begin(), runs.end(), step.SlotRuns(1).begin());
      step.num_runs[1] = static_cast<int32_t>(runs.size());
      ASSERT_TRUE((*backend)->Decode(step, logits.data()).ok());
      check(logits.data() + vocab, pos, tp);
    }
  }
  EXPECT_GT(approximation, 100 * 1e-5) << "the summaries must matter for the check to mean much";
  std::printf("[far history] forward vs float64 reference of the approximation: max|diff| / "
              "max(1, max|ref|) %.3g (tol 1e-5); approximation vs exact %.3g\n",
              worst, approximation);
}

// When on, the server says so: attention is approximate.
TEST(FarHistoryTest, ServerInfoReportsItOn) {
  EngineOptions o;
  o.slots = 2;
  o.threads = 2;
  o.far_history = Far(4, 100);  // rounded to 16-token blocks: 16 and 112
  TestServer server(o);
  v1::GenerateRequest req = TextRequest("far far away", 300);
  req.mutable_stopping()->set_ignore_eos(true);
  const StreamResult r = RunGenerate(server.stub(), req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens.size(), 300u);
  grpc::ClientContext context;
  v1::ServerInfo info;
  ASSERT_TRUE(server.stub().GetServerInfo(&context, v1::GetServerInfoRequest(), &info).ok());
  EXPECT_TRUE(info.far_history().enabled());
  EXPECT_EQ(info.far_history().sink_tokens(), 16);
  EXPECT_EQ(info.far_history().window_tokens(), 112);
  EXPECT_GT(info.far_history().blocks_summarized_total(), 10u);
}

// The far step (summaries written and read, blocks missing from the run table) allocates
// nothing, in decode and in prefill, with one and two tensor-parallel ranks.
TEST(FarHistoryTest, BackendStepWithSummariesDoesNotAllocate) {
  if (!alloc_counter::kAvailable) GTEST_SKIP() << "allocation counting is off under sanitizers";
  const ModelBundle& m = Tiny();
  const int32_t vocab = m.config.vocab_size;
  FarHistoryShape far;
  far.sink_blocks = 1;
  far.window_blocks = 3;
  for (int32_t tp : {1, 2}) {
    CpuBackendOptions bo;
    bo.kv_blocks = 64;
    bo.kv_block_tokens = 8;
    bo.max_slots = 2;
    bo.max_chunk_tokens = 16;
    bo.max_context = 256;
    bo.num_threads = 2;
    bo.tensor_parallel = tp;
    bo.far_history = far;
    absl::StatusOr<std::unique_ptr<CpuBackend>> backend =
        CpuBackend::Create(m.config, &m.weights, bo);
    ASSERT_TRUE(backend.ok()) << backend.status();
    std::vector<int32_t> tokens(16, 7);
    std::vector<float> logits(2 * vocab);
    // Slot s's history: 32 blocks from 32 * s, all still in the run table (nothing dropped).
    const KvRun runs[2] = {{0, 32}, {32, 32}};
    for (int32_t start = 0; start < 96; start += 16) {
      PrefillChunk pc{0, start, absl::MakeConstSpan(tokens), &runs[0], 1};
      pc.far = far;
      ASSERT_TRUE((*backend)->Prefill(pc, logits.data()).ok());
    }
    StepDescriptor step;
    step.Resize(2, 1);
    step.far = far;
    for (int32_t s = 0; s < 2; ++s) {
      step.active[s] = 1;
      step.num_runs[s] = 1;
      step.SlotRuns(s)[0] = runs[s];
    }
    const int64_t before = alloc_counter::AllocationCount();
    for (int k = 0; k < 3; ++k) {
      PrefillChunk pc{0, 96 + 16 * k, absl::MakeConstSpan(tokens), &runs[0], 1};
      pc.far = far;
      pc.far_dropped = 2;  // the blocks of entries 0 and 1 are gone: the run table lacks them
      const KvRun kept[2] = {{0, 1}, {3, 29}};
      pc.runs = kept;
      pc.num_runs = 2;
      ASSERT_TRUE((*backend)->Prefill(pc, k == 1 ? nullptr : logits.data()).ok());
      for (int32_t s = 0; s < 2; ++s) {
        step.position[s] = 150 + k + s;
        step.token[s] = 3 * s + k;
        step.far_summaries[s] = far.SummariesAt(step.position[s], 8);
        ASSERT_GT(step.far_summaries[s], 0);
      }
      ASSERT_TRUE((*backend)->Decode(step, logits.data()).ok());
    }
    EXPECT_EQ(alloc_counter::AllocationCount() - before, 0) << "tp=" << tp;
  }
}

}  // namespace
}  // namespace kvrm
