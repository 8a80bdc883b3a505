// Hooks the engine calls as requests and steps progress: the seam where metrics attach.
//
// Called on the engine's owner thread (except OnRejected, which runs on the submitting thread),
// so implementations must be cheap, never block and be thread-safe for OnRejected (atomics).
#ifndef KVRM_RUNTIME_ENGINE_OBSERVER_H_
#define KVRM_RUNTIME_ENGINE_OBSERVER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "runtime/request.h"

namespace kvrm {

struct EngineStats;
struct LoraAdapter;  // model/lora.h

class EngineObserver {
 public:
  virtual ~EngineObserver() = default;
  // A request left the queue for a slot after `queue_time`.
  virtual void OnAdmitted(const GenerationRequest& request, absl::Duration queue_time) {}
  // A request produced its first token `ttft` after arrival.
  virtual void OnFirstToken(const GenerationRequest& request, absl::Duration ttft) {}
  // A request produced a later token, `gap` after its previous one (inter-token latency).
  virtual void OnNextToken(const GenerationRequest& request, absl::Duration gap) {}
  // A request ended (every submitted request ends exactly once).
  virtual void OnFinished(const GenerationRequest& request, const FinishInfo& info) {}
  // Submit refused a request (RESOURCE_EXHAUSTED or UNAVAILABLE). Any thread.
  virtual void OnRejected(const absl::Status& status) {}
  // One prefill chunk of `tokens` took `duration`.
  virtual void OnPrefillChunk(int32_t tokens, absl::Duration duration) {}
  // One decode step over `active_slots` took `duration`.
  virtual void OnDecodeStep(int32_t active_slots, absl::Duration duration) {}
  // One pass ran a prefill chunk of `chunk_tokens` with a decode step over `active_slots`
  // (EngineOptions::fuse_prefill) and took `duration`; neither callback above is called for it.
  virtual void OnMixedStep(int32_t active_slots, int32_t chunk_tokens, absl::Duration duration) {}
  // After every engine iteration that did work, and when idle: the gauges' source.
  virtual void OnStats(const EngineStats& stats) {}
  // LoRA adapter slot `slot` now holds `adapter` (its metadata, valid until the slot changes
  // again), or is empty (null). On the owner thread, or in Engine::Create for the model's
  // adapters; requests that name the slot (GenerationRequest::lora_adapter) are all submitted
  // after the call and, for an emptied slot, all finished before it.
  virtual void OnLoraAdapter(int32_t slot, const LoraAdapter* adapter) {}
};

}  // namespace kvrm

#endif  // KVRM_RUNTIME_ENGINE_OBSERVER_H_
