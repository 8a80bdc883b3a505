// A persistent pool of worker threads for the CPU kernels.
//
// Created once at start-up; RunOnAll / ParallelFor neither create threads nor allocate, so they
// run on the decode step path. The calling thread takes part (it runs share 0), so a pool of N
// threads uses N-1 workers. One RunOnAll at a time: the pool is owned by one thread (the engine
// thread, or one rank thread under tensor parallelism).
//
// Wake-up latency matters: a decode step runs ~100 parallel regions, and a condition-variable
// wake-up costs 10-50 us each. Workers therefore spin on an atomic generation counter for a
// while after each region (kSpinMicros) before sleeping on the condition variable, and the
// caller spins for completion. Between steps an idle pool sleeps, so it costs no CPU.
#ifndef KVRM_KERNELS_CPU_THREAD_POOL_H_
#define KVRM_KERNELS_CPU_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"

namespace kvrm {

// Spins briefly (pause instructions), then yields; for waits that are usually short.
void SpinPause(int64_t iteration);

class ThreadPool {
 public:
  // How long an idle worker keeps spinning before it sleeps: longer than the gaps between a
  // step's regions (a few us of serial work), shorter than the engine's host work between steps.
  // 300 us kept a core busy through that host work, and on a machine where kvrmd's threads share
  // the cores with its gRPC threads (and, in benchmarks, the load generator) the streams' tokens
  // waited for the core: a replay's p99 inter-token latency fell ~10 % and its worst one-second
  // window from 2.1-4.2x to 2.0-3.1x the median with 50 us (docs/benchmarks.md).
  static constexpr int64_t kSpinMicros = 50;

  // `num_threads` >= 1 counts the caller.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Splits [0, n) into num_threads() contiguous shares of multiples of `grain` and runs
  // fn(begin, end) on each, returning when all are done. Small n runs inline.
  void ParallelFor(int64_t n, int64_t grain, absl::FunctionRef<void(int64_t, int64_t)> fn);

  // Runs fn(thread_index) once on every thread (index 0 is the caller).
  void RunOnAll(absl::FunctionRef<void(int)> fn);

 private:
  void WorkerLoop(int index);
  // Waits until generation_ differs from `seen` (or stop); returns false on stop.
  bool WaitForWork(uint64_t seen);

  const int num_threads_;
  std::vector<std::thread> workers_;
  // The current job; written by the owner before generation_ is bumped (release), read by
  // workers after they observe the new generation (acquire).
  absl::FunctionRef<void(int)>* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};  // workers still running the current job
  std::atomic<bool> stop_{false};
  // Sleeping workers: the owner takes mu_ and notifies only when some may sleep.
  std::atomic<int> sleepers_{0};
  std::mutex mu_;
  std::condition_variable work_cv_;
};

}  // namespace kvrm

#endif  // KVRM_KERNELS_CPU_THREAD_POOL_H_
