#include "tests/engine_workload.h"

#include <random>
#include <string>

#include "common/logging.h"
#include "gtest/gtest.h"

namespace kvrm {

std::vector<WorkloadSpec> RandomWorkload(int n, int max_prompt, int max_new, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<WorkloadSpec> specs;
  for (int i = 0; i < n; ++i) {
    WorkloadSpec s;
    const int len = 3 + static_cast<int>(rng() % max_prompt);
    for (int t = 0; t < len; ++t) s.prompt.push_back(static_cast<int32_t>(rng() % 1000));
    s.max_new_tokens = 30 + static_cast<int32_t>(rng() % max_new);
    s.temperature = i % 3 == 0 ? 0.9f : 0.0f;
    specs.push_back(s);
  }
  return specs;
}

std::unique_ptr<GenerationRequest> WorkloadRequest(const WorkloadSpec& spec, int i,
                                                   std::shared_ptr<CollectingSink> sink) {
  auto r = std::make_unique<GenerationRequest>();
  r->request_id = "r" + std::to_string(i);
  r->prompt = spec.prompt;
  r->max_new_tokens = spec.max_new_tokens;
  r->ignore_eos = true;
  r->sampling.temperature = spec.temperature;
  r->sampling.seed = 1000 + i;
  r->arrival = absl::Now();
  r->sink = std::move(sink);
  return r;
}

std::vector<std::vector<int32_t>> ServeWorkload(Engine& engine,
                                                const std::vector<WorkloadSpec>& specs,
                                                int first_id) {
  std::vector<std::shared_ptr<CollectingSink>> sinks;
  for (size_t i = 0; i < specs.size(); ++i) {
    sinks.push_back(std::make_shared<CollectingSink>());
    CHECK_OK(engine.Submit(WorkloadRequest(specs[i], first_id + static_cast<int>(i), sinks.back()))
                 .status());
  }
  std::vector<std::vector<int32_t>> tokens;
  for (size_t i = 0; i < sinks.size(); ++i) {
    FinishInfo info;
    tokens.push_back(sinks[i]->Wait(&info));
    EXPECT_EQ(info.reason, FinishReason::kLength) << "request " << i << ": " << info.error;
    EXPECT_EQ(static_cast<int32_t>(tokens.back().size()), specs[i].max_new_tokens) << i;
  }
  return tokens;
}

WorkloadRun RunWorkload(const ModelBundle& model, EngineOptions options,
                        const std::vector<WorkloadSpec>& specs) {
  options.threads = 2;
  options.max_new_tokens = 512;
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(&model, options);
  CHECK_OK(engine.status());
  (*engine)->Start();
  WorkloadRun out;
  out.resolved = (*engine)->options();
  out.tokens = ServeWorkload(**engine, specs);
  EXPECT_TRUE((*engine)->WaitIdle(absl::Seconds(10)));
  // Blocks held for in-flight copies retire on the next idle iterations (every 20 ms).
  for (int i = 0; i < 100; ++i) {
    out.stats = (*engine)->Stats();
    if (out.stats.kv.blocks_reserved == 0) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return out;
}

void ExpectPressureChangesNoToken(const ModelBundle& model, const EngineOptions& options,
                                  int64_t tight_blocks, int64_t compact_blocks,
                                  const std::vector<WorkloadSpec>& specs,
                                  const WorkloadRun& reference) {
  EngineOptions tight = options;
  tight.kv_blocks = tight_blocks;
  const WorkloadRun swapped = RunWorkload(model, tight, specs);
  EXPECT_EQ(swapped.tokens, reference.tokens) << "swap";
  EXPECT_GT(swapped.stats.preemptions_total, 0u);
  EXPECT_GT(swapped.stats.transfer_groups_total, 0u);
  EXPECT_EQ(swapped.stats.kv.blocks_free, tight_blocks);
  EXPECT_EQ(swapped.stats.kv.host_blocks_used, 0);

  EngineOptions recompute = tight;
  recompute.kv_host_blocks = 0;
  const WorkloadRun recomputed = RunWorkload(model, recompute, specs);
  EXPECT_EQ(recomputed.tokens, reference.tokens) << "drop and recompute";
  EXPECT_GT(recomputed.stats.preemptions_total, 0u);
  EXPECT_EQ(recomputed.stats.kv.blocks_free, tight_blocks);

  EngineOptions compacted = options;
  compacted.kv_blocks = compact_blocks;
  compacted.max_runs = 3;
  const WorkloadRun compact = RunWorkload(model, compacted, specs);
  EXPECT_EQ(compact.tokens, reference.tokens) << "compaction";
  EXPECT_GT(compact.stats.transfer_groups_total, 0u);
  EXPECT_EQ(compact.stats.kv.blocks_free, compact_blocks);
}

}  // namespace kvrm
