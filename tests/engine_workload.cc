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

WorkloadRun RunWorkload(const ModelBundle& model, EngineOptions options,
                        const std::vector<WorkloadSpec>& specs) {
  options.threads = 2;
  options.max_new_tokens = 512;
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(&model, options);
  CHECK_OK(engine.status());
  (*engine)->Start();
  std::vector<std::shared_ptr<CollectingSink>> sinks;
  for (size_t i = 0; i < specs.size(); ++i) {
    sinks.push_back(std::make_shared<CollectingSink>());
    CHECK_OK(
        (*engine)->Submit(WorkloadRequest(specs[i], static_cast<int>(i), sinks.back())).status());
  }
  WorkloadRun out;
  out.resolved = (*engine)->options();
  for (size_t i = 0; i < sinks.size(); ++i) {
    FinishInfo info;
    out.tokens.push_back(sinks[i]->Wait(&info));
    EXPECT_EQ(info.reason, FinishReason::kLength) << "request " << i << ": " << info.error;
    EXPECT_EQ(static_cast<int32_t>(out.tokens.back().size()), specs[i].max_new_tokens) << i;
  }
  EXPECT_TRUE((*engine)->WaitIdle(absl::Seconds(10)));
  // Blocks held for in-flight copies retire on the next idle iterations (every 20 ms).
  for (int i = 0; i < 100; ++i) {
    out.stats = (*engine)->Stats();
    if (out.stats.kv.blocks_reserved == 0) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return out;
}

}  // namespace kvrm
