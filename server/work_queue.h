// A bounded FIFO of tasks run by a few threads of its own: work that may take long (compiling a
// structured-output constraint) goes here instead of running on a gRPC callback thread, which
// must never block (it would delay every other call, health checks included).
//
// Thread safety: TryPost from any thread. The destructor stops taking tasks, runs those already
// queued (each holds a call that must still be finished), then joins the threads.
#ifndef KVRM_SERVER_WORK_QUEUE_H_
#define KVRM_SERVER_WORK_QUEUE_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"

namespace kvrm {

class WorkQueue {
 public:
  // `threads` >= 1 workers; at most `capacity` tasks wait (beyond those running).
  WorkQueue(int32_t threads, int32_t capacity);
  ~WorkQueue();
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // Queues `task`; false (and `task` dropped unrun) when `capacity` tasks already wait or the
  // queue is being destroyed: the caller answers RESOURCE_EXHAUSTED.
  bool TryPost(std::function<void()> task);

  int32_t waiting() const;

 private:
  void Run();

  const int32_t capacity_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace kvrm

#endif  // KVRM_SERVER_WORK_QUEUE_H_
