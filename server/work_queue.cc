#include "server/work_queue.h"

#include <utility>

#include "common/logging.h"

namespace kvrm {

WorkQueue::WorkQueue(int32_t threads, int32_t capacity) : capacity_(capacity) {
  CHECK(threads >= 1 && capacity >= 0) << "threads " << threads << " capacity " << capacity;
  threads_.reserve(threads);
  for (int32_t i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
}

WorkQueue::~WorkQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

bool WorkQueue::TryPost(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ || static_cast<int32_t>(tasks_.size()) >= capacity_) return false;
    tasks_.push_back(std::move(task));
  }
  cv_.notify_one();
  return true;
}

int32_t WorkQueue::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int32_t>(tasks_.size());
}

void WorkQueue::Run() {
  while (true) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
      // Stopping still drains: every queued task finishes a call.
      if (tasks_.empty()) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace kvrm
