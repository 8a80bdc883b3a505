// What the engine-level KV tests (far_history_test, window_release_test) share: a random
// workload of prompts and outputs, its requests, and one run of it on a started engine whose
// every request must generate exactly its max_new_tokens (ignore_eos), waiting until every
// block is back.
#ifndef KVRM_TESTS_ENGINE_WORKLOAD_H_
#define KVRM_TESTS_ENGINE_WORKLOAD_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/engine.h"
#include "runtime/model_bundle.h"
#include "runtime/request.h"
#include "tests/test_server.h"

namespace kvrm {

struct WorkloadSpec {
  std::vector<int32_t> prompt;
  int32_t max_new_tokens;
  float temperature;
};

// `n` random prompts of 3..2 + max_prompt ids below 1000 and 30..29 + max_new outputs; every
// third request samples (seeded), the rest are greedy.
std::vector<WorkloadSpec> RandomWorkload(int n, int max_prompt, int max_new, uint32_t seed);

// Request `i` of a workload (id "r<i>", seed 1000 + i, ignore_eos), streaming into `sink`.
std::unique_ptr<GenerationRequest> WorkloadRequest(const WorkloadSpec& spec, int i,
                                                   std::shared_ptr<CollectingSink> sink);

struct WorkloadRun {
  std::vector<std::vector<int32_t>> tokens;  // each request's, in order
  EngineStats stats;                         // once every block is back
  EngineOptions resolved;                    // the engine's options()
};

// Submits `specs` to a started engine (request i as WorkloadRequest(specs[i], first_id + i))
// and waits for all of them: each must end by length with its max_new_tokens. Their tokens, in
// order.
std::vector<std::vector<int32_t>> ServeWorkload(Engine& engine,
                                                const std::vector<WorkloadSpec>& specs,
                                                int first_id = 0);

// Creates an engine for `model` with `options` (2 threads, max_new_tokens 512), runs the
// workload to the end (a request ending otherwise than by length fails the test), and waits
// until the blocks held for copies in flight have retired.
WorkloadRun RunWorkload(const ModelBundle& model, EngineOptions options,
                        const std::vector<WorkloadSpec>& specs);

// The workload under KV pressure, three ways, each expected to give `reference`'s tokens and to
// return every block: `options` on a pool of `tight_blocks` (pauses swap to the host tier), the
// same with no host tier (pauses drop and recompute), and on `compact_blocks` with a run table of
// 3 (decoding slots compacted). Each must have paused, or moved blocks, to count.
void ExpectPressureChangesNoToken(const ModelBundle& model, const EngineOptions& options,
                                  int64_t tight_blocks, int64_t compact_blocks,
                                  const std::vector<WorkloadSpec>& specs,
                                  const WorkloadRun& reference);

}  // namespace kvrm

#endif  // KVRM_TESTS_ENGINE_WORKLOAD_H_
