// The in-process all-reduce: correct sums, bit-identical on every rank, repeatable, and
// consistent errors on mismatched calls.
#include "runtime/communicator.h"

#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace kvrm {
namespace {

// Runs fn(rank) on `size` threads at once.
template <typename Fn>
void OnRanks(int size, Fn fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back([&fn, r] { fn(r); });
  for (std::thread& t : threads) t.join();
}

TEST(CommunicatorTest, AllReduceSumsInRankOrderOnEveryRank) {
  for (int size : {1, 2, 3, 4}) {
    auto group = InProcessCommunicatorGroup::Create(size);
    ASSERT_TRUE(group.ok());
    for (int64_t n : {0, 1, 7, 1000, 12289}) {
      std::vector<std::vector<float>> data(size, std::vector<float>(n));
      std::mt19937 rng(static_cast<uint32_t>(size * 100 + n));
      std::normal_distribution<float> dist(0, 1e3);
      for (auto& d : data) {
        for (float& v : d) v = dist(rng);
      }
      std::vector<float> expected(n);
      for (int64_t i = 0; i < n; ++i) {
        float s = data[0][i];
        for (int r = 1; r < size; ++r) s += data[r][i];  // rank order, in float
        expected[i] = s;
      }
      OnRanks(size, [&](int r) {
        Communicator* c = (*group)->communicator(r);
        EXPECT_EQ(c->rank(), r);
        EXPECT_EQ(c->size(), size);
        // Several rounds back to back exercise the barrier's sense reversal.
        for (int round = 0; round < 3; ++round) {
          std::vector<float> mine = data[r];
          ASSERT_TRUE(c->AllReduceSum(mine.data(), n).ok());
          ASSERT_EQ(0, n == 0 ? 0 : std::memcmp(mine.data(), expected.data(), n * sizeof(float)))
              << "size " << size << " n " << n << " rank " << r;
        }
      });
    }
  }
}

TEST(CommunicatorTest, LengthMismatchFailsOnEveryRankAndRecovers) {
  auto group = InProcessCommunicatorGroup::Create(2);
  ASSERT_TRUE(group.ok());
  std::vector<absl::Status> status(2);
  OnRanks(2, [&](int r) {
    std::vector<float> v(10, 1.0f);
    status[r] = (*group)->communicator(r)->AllReduceSum(v.data(), r == 0 ? 10 : 9);
    // The group stays usable after the failed call.
    std::vector<float> w(5, static_cast<float>(r + 1));
    ASSERT_TRUE((*group)->communicator(r)->AllReduceSum(w.data(), 5).ok());
    for (float x : w) EXPECT_EQ(x, 3.0f);
  });
  EXPECT_EQ(status[0].code(), absl::StatusCode::kInternal);
  EXPECT_EQ(status[1].code(), absl::StatusCode::kInternal);
}

TEST(CommunicatorTest, RejectsBadSize) {
  EXPECT_FALSE(InProcessCommunicatorGroup::Create(0).ok());
  EXPECT_FALSE(InProcessCommunicatorGroup::Create(65).ok());
}

}  // namespace
}  // namespace kvrm
