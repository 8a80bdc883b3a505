// Runs the backend's work for one engine step (an optional prefill chunk, then the decode step
// over the committed descriptor) on its own thread, so that the engine thread can build the
// next step's descriptor and stage its transfers while this one runs. On a GPU this is the
// stream the graph replays on; on the CPU it is this thread driving the kernel pool.
#ifndef KVRM_RUNTIME_STEP_RUNNER_H_
#define KVRM_RUNTIME_STEP_RUNNER_H_

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "runtime/backend.h"
#include "runtime/clock.h"

namespace kvrm {

struct StepWork {
  // The step's prefill chunks: none, one, or several where the backend takes them in one pass
  // (Backend::max_chunks_per_pass). chunk_logits[i]: where chunk i's logits go (after its last
  // token; every token's with all_logits) when wanted, else null.
  absl::Span<const PrefillChunk> chunks;
  absl::Span<float* const> chunk_logits;
  const StepDescriptor* step = nullptr;  // optional; rows with active == 0 are skipped
  float* logits = nullptr;
  // Set when the step's descriptor marks rows for sampling on the device
  // (Backend::DecodeAndSample, or DecodeWithChunkAndSample when fused): their tokens land
  // here, [max_slots].
  int32_t* tokens = nullptr;
  // Chunks and step in one pass (Backend::DecodeWithChunk, or PrefillChunks with several
  // chunks, which never sample on the device); both must be set.
  bool fused = false;
};

// A fused step reports the pass's status and time as both the chunk's and the step's.
struct StepResult {
  absl::Status prefill_status;
  absl::Status decode_status;
  absl::Duration prefill_time;
  absl::Duration decode_time;
};

class StepRunner {
 public:
  // Durations are measured on `clock` (the engine's: simulated in scheduler tests).
  // `spin` (Backend::handoff_spin): Wait polls for the step's end, and the runner thread for
  // the next Launch, that long before sleeping on the condition variable.
  StepRunner(Backend* backend, Clock* clock, absl::Duration spin = absl::ZeroDuration());
  ~StepRunner();
  StepRunner(const StepRunner&) = delete;
  StepRunner& operator=(const StepRunner&) = delete;

  // Starts `work` (which must stay valid until Wait returns). One step at a time.
  void Launch(const StepWork& work);
  // Blocks until the launched step is done.
  StepResult Wait();

 private:
  void Loop();

  Backend* backend_;
  Clock* clock_;
  const absl::Duration spin_;
  // Mirrors of pending_ and running_ (written under mu_), polled without it while spinning.
  std::atomic<bool> pending_flag_{false};
  std::atomic<bool> running_flag_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  StepWork work_;       // guarded by mu_
  StepResult result_;   // guarded by mu_
  bool pending_ = false;  // guarded by mu_: launched, not yet taken by the thread
  bool running_ = false;  // guarded by mu_: launched and not finished
  bool stop_ = false;     // guarded by mu_
  std::thread thread_;
};

}  // namespace kvrm

#endif  // KVRM_RUNTIME_STEP_RUNNER_H_
