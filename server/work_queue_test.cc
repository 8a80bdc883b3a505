#include "server/work_queue.h"

#include <atomic>
#include <chrono>
#include <future>
#include <set>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace kvrm {
namespace {

TEST(WorkQueueTest, RunsEveryTaskOnItsOwnThreads) {
  std::atomic<int> done{0};
  std::mutex mu;
  std::set<std::thread::id> ran_on;
  {
    WorkQueue q(2, 1000);
    for (int i = 0; i < 500; ++i) {
      ASSERT_TRUE(q.TryPost([&] {
        std::lock_guard<std::mutex> lock(mu);
        ran_on.insert(std::this_thread::get_id());
        ++done;
      }));
    }
  }  // the destructor runs what is queued
  EXPECT_EQ(done.load(), 500);
  EXPECT_FALSE(ran_on.count(std::this_thread::get_id()));
  EXPECT_LE(ran_on.size(), 2u);
}

TEST(WorkQueueTest, RefusesPastCapacityAndTakesMoreOnceTasksStart) {
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  std::promise<void> started;
  WorkQueue q(1, 2);
  // One task runs (blocked on the gate), two wait: the queue is full.
  ASSERT_TRUE(q.TryPost([&] {
    started.set_value();
    gate.wait();
  }));
  started.get_future().wait();
  std::atomic<int> ran{0};
  EXPECT_TRUE(q.TryPost([&] { ++ran; }));
  EXPECT_TRUE(q.TryPost([&] { ++ran; }));
  EXPECT_EQ(q.waiting(), 2);
  EXPECT_FALSE(q.TryPost([&] { ran += 100; }));  // dropped, never run
  release.set_value();
  for (int i = 0; i < 1000 && ran.load() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(ran.load(), 2);
  EXPECT_TRUE(q.TryPost([&] { ++ran; }));
}

}  // namespace
}  // namespace kvrm
