#include "runtime/transport.h"

#include <utility>

#include "common/logging.h"

namespace kvrm {

Transport::Transport(CopyFn copy, int64_t bytes_per_block, int32_t capacity)
    : copy_(std::move(copy)),
      bytes_per_block_(bytes_per_block),
      capacity_(capacity),
      ring_(capacity),
      batches_(capacity) {
  thread_ = std::thread([this] { Loop(); });
}

Transport::~Transport() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  thread_.join();
}

uint64_t Transport::Submit(absl::Span<const TransferGroup> groups, uint64_t after_step) {
  const uint64_t fence = next_fence_++;
  size_t done = 0;
  // A batch larger than the ring is split; each part carries the same fence, and completion is
  // published when the last part is done (parts run in order).
  while (true) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] {
      return stop_ || (ring_head_ - ring_tail_ < capacity_ && batch_head_ - batch_tail_ < capacity_);
    });
    if (stop_) return fence;
    const int32_t room = static_cast<int32_t>(capacity_ - (ring_head_ - ring_tail_));
    const int32_t n = static_cast<int32_t>(std::min<size_t>(room, groups.size() - done));
    Batch& b = batches_[batch_head_ % capacity_];
    b.fence = fence;
    b.after_step = after_step;
    b.first = ring_head_;
    b.count = n;
    b.last = done + n == groups.size();
    for (int32_t i = 0; i < n; ++i) ring_[(ring_head_ + i) % capacity_] = groups[done + i];
    ring_head_ += n;
    ++batch_head_;
    done += n;
    lock.unlock();
    work_cv_.notify_one();
    if (done == groups.size()) return fence;
  }
}

void Transport::StepDone(uint64_t step) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    steps_done_ = std::max(steps_done_, step);
  }
  work_cv_.notify_one();
}

absl::Duration Transport::WaitFor(uint64_t fence) {
  if (completed() >= fence) return absl::ZeroDuration();
  const absl::Time t0 = absl::Now();
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return stop_ || completed() >= fence; });
  return absl::Now() - t0;
}

std::vector<uint64_t> Transport::TakeFailedFences(absl::Status* first_error) {
  std::lock_guard<std::mutex> lock(mu_);
  if (first_error) *first_error = first_error_;
  first_error_ = absl::OkStatus();
  return std::exchange(failed_fences_, {});
}

TransportStats Transport::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void Transport::Loop() {
  for (;;) {
    Batch batch;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] {
        return stop_ || (batch_tail_ < batch_head_ &&
                         batches_[batch_tail_ % capacity_].after_step <= steps_done_);
      });
      if (stop_) return;
      batch = batches_[batch_tail_ % capacity_];
    }
    absl::Status st;
    uint64_t blocks = 0;
    for (int32_t i = 0; i < batch.count && st.ok(); ++i) {
      const TransferGroup& g = ring_[(batch.first + i) % capacity_];
      st = copy_(g);
      blocks += g.num_blocks;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!st.ok()) {
        if (first_error_.ok()) first_error_ = st;
        if (failed_fences_.empty() || failed_fences_.back() != batch.fence) {
          failed_fences_.push_back(batch.fence);
        }
      }
      ring_tail_ += batch.count;
      ++batch_tail_;
      stats_.groups_total += batch.count;
      stats_.blocks_total += blocks;
      stats_.bytes_total += blocks * bytes_per_block_;
      ++stats_.batches_total;
      // The fence completes with its Submit's last part (a part queued later, once the ring
      // had room, may not be in the ring yet when an earlier one finishes).
      if (batch.last) completed_.store(batch.fence, std::memory_order_release);
    }
    done_cv_.notify_all();
  }
}

}  // namespace kvrm
