// Merge-staged transport, executing half: a thread that runs transfer groups ahead of the step
// that needs them, in submission order, and publishes a fence the step checks.
//
// Threads: Submit/StepDone/WaitFor are called by the engine thread; the copies run on the
// transport's own thread. A batch may be gated on a step: its copies read or write a block the
// step is still writing (the tail block of a slot), so they start only once that step is done.
// Everything else runs while the step runs: that is the pre-staging.
#ifndef KVRM_RUNTIME_TRANSPORT_H_
#define KVRM_RUNTIME_TRANSPORT_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "runtime/transfer_plan.h"

namespace kvrm {

struct TransportStats {
  uint64_t groups_total = 0;
  uint64_t blocks_total = 0;
  uint64_t bytes_total = 0;
  uint64_t batches_total = 0;
};

class Transport {
 public:
  // Executes one group (all layers, all ranks); returns an error to fail the batch.
  using CopyFn = std::function<absl::Status(const TransferGroup&)>;

  // `capacity`: most groups queued at once (a ring allocated here).
  Transport(CopyFn copy, int64_t bytes_per_block, int32_t capacity);
  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  // The fence the next Submit will return (plan with it, then Submit).
  uint64_t next_fence() const { return next_fence_; }
  // Queues `groups` (run after every earlier batch and, when `after_step` > 0, after
  // StepDone(after_step)). Returns the batch's fence. Blocks only if the ring is full.
  uint64_t Submit(absl::Span<const TransferGroup> groups, uint64_t after_step);
  // The step runner finished `step`.
  void StepDone(uint64_t step);
  // Highest fence whose copies are all done.
  uint64_t completed() const { return completed_.load(std::memory_order_acquire); }
  // Waits until `fence` completed; returns how long it waited (zero when already done).
  absl::Duration WaitFor(uint64_t fence);
  // Fences of batches with a failed copy since the last call, and the first error among them
  // (the engine fails the requests whose KV those batches moved; later batches still run).
  std::vector<uint64_t> TakeFailedFences(absl::Status* first_error);
  TransportStats Stats() const;

 private:
  struct Batch {
    uint64_t fence = 0;
    uint64_t after_step = 0;
    int64_t first = 0;  // index into ring_ (monotonic; modulo capacity)
    int32_t count = 0;
    bool last = true;  // the last part of its Submit (only then does its fence complete)
  };
  void Loop();

  const CopyFn copy_;
  const int64_t bytes_per_block_;
  const int32_t capacity_;
  std::vector<TransferGroup> ring_;  // [capacity_]
  std::vector<Batch> batches_;       // [capacity_] ring of batches
  uint64_t next_fence_ = 1;          // engine thread only

  mutable std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  int64_t ring_head_ = 0;        // guarded by mu_: next group slot to fill
  int64_t ring_tail_ = 0;        // guarded by mu_: first group not yet executed
  int64_t batch_head_ = 0;       // guarded by mu_
  int64_t batch_tail_ = 0;       // guarded by mu_
  uint64_t steps_done_ = 0;      // guarded by mu_
  bool stop_ = false;            // guarded by mu_
  std::vector<uint64_t> failed_fences_;  // guarded by mu_
  absl::Status first_error_;             // guarded by mu_
  TransportStats stats_;         // guarded by mu_
  std::atomic<uint64_t> completed_{0};
  std::thread thread_;
};

}  // namespace kvrm

#endif  // KVRM_RUNTIME_TRANSPORT_H_
