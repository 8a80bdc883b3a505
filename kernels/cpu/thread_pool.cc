#include "kernels/cpu/thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace kvrm {

void SpinPause(int64_t iteration) {
  // After a few thousand pauses (~tens of us) the other side is probably descheduled: yield so
  // a shared, oversubscribed machine still makes progress.
  if (iteration < 4096) {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#endif
  } else {
    std::this_thread::yield();
  }
}

ThreadPool::ThreadPool(int num_threads) : num_threads_(std::max(1, num_threads)) {
  workers_.reserve(num_threads_ - 1);
  for (int i = 1; i < num_threads_; ++i) {
    workers_.emplace_back([this, i] { WorkerLoop(i); });
  }
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  {
    std::lock_guard<std::mutex> lock(mu_);
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

bool ThreadPool::WaitForWork(uint64_t seen) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point deadline = Clock::now() + std::chrono::microseconds(kSpinMicros);
  for (int64_t i = 0;; ++i) {
    if (generation_.load(std::memory_order_acquire) != seen) return true;
    if (stop_.load(std::memory_order_relaxed)) return false;
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#endif
    if ((i & 63) == 63 && Clock::now() > deadline) break;
  }
  // Sleep. sleepers_ and generation_ are seq_cst: either the owner sees our increment and
  // notifies under mu_, or we see its new generation before waiting.
  std::unique_lock<std::mutex> lock(mu_);
  sleepers_.fetch_add(1);
  work_cv_.wait(lock, [&] { return stop_.load() || generation_.load() != seen; });
  sleepers_.fetch_sub(1);
  return !stop_.load();
}

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  while (WaitForWork(seen)) {
    seen = generation_.load(std::memory_order_acquire);
    (*job_)(index);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::RunOnAll(absl::FunctionRef<void(int)> fn) {
  if (num_threads_ == 1) {
    fn(0);
    return;
  }
  job_ = &fn;
  pending_.store(num_threads_ - 1, std::memory_order_relaxed);
  generation_.fetch_add(1);  // seq_cst: publishes job_ and pending_
  if (sleepers_.load() > 0) {
    { std::lock_guard<std::mutex> lock(mu_); }
    work_cv_.notify_all();
  }
  fn(0);
  for (int64_t i = 0; pending_.load(std::memory_order_acquire) != 0; ++i) SpinPause(i);
  job_ = nullptr;
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             absl::FunctionRef<void(int64_t, int64_t)> fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t units = (n + grain - 1) / grain;
  const int64_t shares = std::min<int64_t>(num_threads_, units);
  if (shares <= 1) {
    fn(0, n);
    return;
  }
  RunOnAll([&](int t) {
    if (t >= shares) return;
    const int64_t begin = std::min(n, (units * t / shares) * grain);
    const int64_t end = std::min(n, (units * (t + 1) / shares) * grain);
    if (begin < end) fn(begin, end);
  });
}

}  // namespace kvrm
