// The open-loop replay: one thread drives every Generate stream through a single
// grpc::CompletionQueue, sending each planned request at its time whether or not earlier ones
// have finished (so a slow server builds a queue, as real traffic would), and timestamps every
// streamed token. Hundreds of concurrent streams cost one call object each, not a thread.
#ifndef KVRM_TOOLS_REPLAY_REPLAYER_H_
#define KVRM_TOOLS_REPLAY_REPLAYER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvrm/v1/kvrm.grpc.pb.h"
#include "tools/replay/progress.h"
#include "tools/replay/prompt.h"
#include "tools/replay/record.h"
#include "tools/replay/workload.h"

namespace kvrm::replay {

struct ReplayOptions {
  double request_timeout_s = 0;          // per-call deadline; 0 = none
  ProgressReporter* progress = nullptr;  // optional
  // LoRA adapters the requests name in turn (request i: lora_adapters[i % size]; "" the base
  // model); empty: none.
  std::vector<std::string> lora_adapters;
};

// Waits up to `timeout_s` for the server, then returns its ModelInfo.
absl::StatusOr<v1::ModelInfo> FetchModelInfo(v1::Kvrm::Stub& stub, double timeout_s);

// The request sent for `planned`: token-id prompt, ignore_eos, max_new_tokens = output length,
// greedy sampling, token ids returned.
v1::GenerateRequest BuildRequest(const PlannedRequest& planned, const PromptSynthesizer& prompts);

// Replays `plan` (sorted by send_at_s) and returns one record per planned request, in plan order.
std::vector<RequestRecord> Replay(v1::Kvrm::Stub& stub, absl::Span<const PlannedRequest> plan,
                                  const PromptSynthesizer& prompts, const ReplayOptions& options);

}  // namespace kvrm::replay

#endif  // KVRM_TOOLS_REPLAY_REPLAYER_H_
