#include "runtime/transport.h"

#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace kvrm {
namespace {

// Copies that run only when the test lets them, one at a time.
class GatedCopies {
 public:
  absl::Status Copy(const TransferGroup& g) {
    std::unique_lock<std::mutex> lock(mu_);
    started_.push_back(g.src_first);
    cv_.notify_all();
    cv_.wait(lock, [&] { return allowed_ >= static_cast<int>(started_.size()); });
    return absl::OkStatus();
  }
  void Allow(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    allowed_ = n;
    cv_.notify_all();
  }
  // Blocks until copy number `n` (1-based) has started.
  void WaitStarted(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return static_cast<int>(started_.size()) >= n; });
  }
  std::vector<int32_t> started() {
    std::lock_guard<std::mutex> lock(mu_);
    return started_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int32_t> started_;
  int allowed_ = 0;
};

// A batch larger than the ring goes in parts, each queued once the ring has room. Its fence
// completes only with the last part: when the first part is done the second is not even in the
// ring yet, and a fence published then would let the engine read blocks still being copied
// (and free sources still being read).
TEST(TransportTest, ABatchSplitAcrossTheRingCompletesWithItsLastPart) {
  GatedCopies gate;
  Transport t([&](const TransferGroup& g) { return gate.Copy(g); }, /*bytes_per_block=*/64,
              /*capacity=*/2);
  std::vector<TransferGroup> groups(5);
  for (int i = 0; i < 5; ++i) groups[i] = {KvTier::kHost, i, KvTier::kDevice, 10 + i, 1};
  uint64_t fence = 0;
  std::thread submitter([&] { fence = t.Submit(groups, /*after_step=*/0); });
  gate.Allow(2);      // the first part: two groups
  gate.WaitStarted(3);  // the second part is queued and running: the first is done
  EXPECT_EQ(t.completed(), 0u) << "completed after the first of three parts";
  gate.Allow(4);
  gate.WaitStarted(5);
  EXPECT_EQ(t.completed(), 0u);
  gate.Allow(5);
  submitter.join();
  t.WaitFor(fence);
  EXPECT_EQ(t.completed(), fence);
  EXPECT_EQ(gate.started(), (std::vector<int32_t>{0, 1, 2, 3, 4}));  // in order
  const TransportStats stats = t.Stats();
  EXPECT_EQ(stats.groups_total, 5u);
  EXPECT_EQ(stats.batches_total, 3u);  // the parts
  EXPECT_EQ(stats.bytes_total, 5u * 64);
}

// Batches run in order; one gated on a step waits for it while later ones wait behind it.
TEST(TransportTest, GatedBatchWaitsForItsStep) {
  GatedCopies gate;
  gate.Allow(100);
  Transport t([&](const TransferGroup& g) { return gate.Copy(g); }, 64, 8);
  const std::vector<TransferGroup> one = {{KvTier::kDevice, 1, KvTier::kDevice, 2, 1}};
  const uint64_t a = t.Submit(one, /*after_step=*/3);
  const uint64_t b = t.Submit(one, /*after_step=*/0);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_LT(t.completed(), a) << "ran before its step was done";
  t.StepDone(3);
  t.WaitFor(b);
  EXPECT_EQ(t.completed(), b);
  EXPECT_GT(b, a);
}

}  // namespace
}  // namespace kvrm
