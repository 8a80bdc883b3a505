// A persistent pool of worker threads for the CPU kernels.
//
// Created once at start-up; ParallelFor neither creates threads nor allocates, so it can run on
// the decode step path. The calling thread takes part (it runs the first share), so a pool of
// N threads uses N-1 workers. One ParallelFor at a time: the pool is owned by one engine thread
// (or one rank thread under tensor parallelism).
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

class ThreadPool {
 public:
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

  const int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  // Work of the current generation; valid while pending_ > 0.
  absl::FunctionRef<void(int)>* job_ = nullptr;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

}  // namespace kvrm

#endif  // KVRM_KERNELS_CPU_THREAD_POOL_H_
