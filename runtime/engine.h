// The serving engine: fixed decode slots, admission, chunked prefill, decode steps, sampling,
// stop conditions, and streaming output to each request's sink.
//
// Threading: one owner thread (started by Start()) owns the slots, the queue, the KV allocator
// and the backend. Other threads (gRPC reactors) only post into it through Submit and Cancel,
// which take `mu_` briefly; nothing else is shared. Stats() reads a snapshot the owner publishes.
#ifndef KVRM_RUNTIME_ENGINE_H_
#define KVRM_RUNTIME_ENGINE_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/backend.h"
#include "runtime/engine_observer.h"
#include "runtime/kv_allocator.h"
#include "runtime/kv_pool.h"
#include "runtime/model_bundle.h"
#include "runtime/request.h"
#include "runtime/sampler.h"
#include "runtime/text_stream.h"

namespace kvrm {

enum class KvMode { kStatic, kKvrm };

struct EngineOptions {
  int32_t slots = 8;
  int32_t max_context = 0;        // 0: the model's max_position_embeddings
  int32_t prefill_chunk = 256;    // tokens per prefill chunk (one chunk per engine step)
  int32_t max_queue = 256;        // waiting requests beyond this get RESOURCE_EXHAUSTED
  int32_t max_new_tokens = 4096;  // upper bound a request may ask for
  int32_t block_tokens = 16;
  int32_t max_runs = 8;
  int32_t threads = 0;  // 0: hardware concurrency
  KvMode kv_mode = KvMode::kStatic;
  EngineObserver* observer = nullptr;  // not owned; outlives the engine
};

struct EngineStats {
  int32_t slots_total = 0;
  int32_t slots_in_use = 0;
  int32_t queue_depth = 0;
  uint64_t requests_total = 0;
  uint64_t tokens_generated_total = 0;
  uint64_t steps_total = 0;
  KvStats kv;
  // KV-RM pager figures (cumulative; stay 0 under --kv_mode=static). Read by metrics/.
  uint64_t transfer_groups_total = 0;       // merged host<->device copy groups issued
  uint64_t transfer_bytes_total = 0;        // bytes those groups moved
  double transport_wait_seconds_total = 0;  // time the step replay waited on transport
  uint64_t descriptor_commits_total = 0;    // step descriptors committed (run tables changed)
  uint64_t preemptions_total = 0;           // requests swapped out or recomputed
};

enum class SlotState { kFree, kPrefilling, kDecoding };

class Engine {
 public:
  // `model` must outlive the engine.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const ModelBundle* model,
                                                        const EngineOptions& options);
  ~Engine();  // Stops the owner thread; pending requests end CANCELLED.
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  void Start();

  // Queues a request and returns its handle (for Cancel). RESOURCE_EXHAUSTED when the queue is
  // full, UNAVAILABLE when draining, INVALID_ARGUMENT when the prompt cannot fit the context.
  // On success the request's sink will see exactly one OnFinished.
  absl::StatusOr<uint64_t> Submit(std::unique_ptr<GenerationRequest> request);
  // Ends the request at the next step boundary with CANCELLED (no-op if already finished).
  void Cancel(uint64_t handle);

  // Refuses new requests from now on (UNAVAILABLE).
  void BeginDrain();
  // Waits until no request is queued or running; false on timeout.
  bool WaitIdle(absl::Duration timeout);
  // Ends every queued and running request with CANCELLED.
  void CancelAll();

  EngineStats Stats() const;
  const EngineOptions& options() const { return options_; }
  const ModelBundle& model() const { return *model_; }

 private:
  struct Slot {
    SlotState state = SlotState::kFree;
    std::unique_ptr<GenerationRequest> request;
    std::unique_ptr<TextStream> text;
    int32_t prefilled = 0;   // prompt tokens whose KV is written
    int32_t position = 0;    // history length = position of the next input token
    int32_t next_token = 0;  // input of the next decode step
    int32_t generated = 0;
    absl::Time admitted;
    absl::Time first_token;
    absl::Time last_token;
  };

  Engine(const ModelBundle* model, const EngineOptions& options);
  void Loop();
  // One iteration of the loop; false when there was nothing to do.
  bool Step();
  void TakePosted();
  void ExpireDeadlines(absl::Time now);
  void Admit(absl::Time now);
  bool PrefillOneChunk();
  bool DecodeStep();
  // Applies a sampled token to the slot: output, stop checks, finish.
  void EmitToken(int32_t slot_index, const SampleResult& sample);
  void FinishSlot(int32_t slot_index, FinishReason reason, StreamChunk last,
                  std::string matched_stop = "", std::string error = "");
  void FinishQueued(std::unique_ptr<GenerationRequest> request, FinishReason reason);
  void PublishStats();

  EngineObserver* observer() { return observer_; }

  const ModelBundle* model_;
  const EngineOptions options_;
  std::unique_ptr<KvAllocator> kv_;
  std::unique_ptr<Backend> backend_;
  EngineObserver default_observer_;  // no-op when options_.observer is null
  EngineObserver* observer_;

  // Owner-thread state.
  std::vector<Slot> slots_;
  std::vector<std::unique_ptr<Sampler>> samplers_;  // [slots]
  std::deque<std::unique_ptr<GenerationRequest>> waiting_;
  StepDescriptor step_;
  std::vector<float> logits_;  // [slots][vocab]
  std::vector<int32_t> eos_ids_;
  uint64_t steps_ = 0;
  uint64_t tokens_generated_ = 0;

  // Posted by other threads.
  mutable std::mutex mu_;
  std::condition_variable cv_;     // wakes the owner thread
  std::condition_variable idle_cv_;
  std::vector<std::unique_ptr<GenerationRequest>> posted_;  // guarded by mu_
  std::vector<uint64_t> cancels_;                           // guarded by mu_
  bool cancel_all_ = false;                                 // guarded by mu_
  bool stop_ = false;                                       // guarded by mu_
  bool draining_ = false;                                   // guarded by mu_
  int32_t outstanding_ = 0;  // submitted and not finished; guarded by mu_
  int32_t queued_ = 0;       // submitted and not admitted; guarded by mu_
  uint64_t next_handle_ = 1;  // guarded by mu_
  uint64_t requests_total_ = 0;  // guarded by mu_
  EngineStats published_;     // guarded by mu_
  std::thread thread_;
};

}  // namespace kvrm

#endif  // KVRM_RUNTIME_ENGINE_H_
