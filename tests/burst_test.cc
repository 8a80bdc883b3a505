// A burst through the daemon's gRPC front end: far more requests than slots, mixed prompt
// lengths, a tight KV budget. Every request either completes or is refused with
// RESOURCE_EXHAUSTED at once; nothing hangs; afterwards slots, queue and KV are back to idle.
#include <atomic>
#include <random>
#include <thread>

#include "gtest/gtest.h"
#include "tests/test_server.h"

namespace kvrm {
namespace {

TEST(BurstTest, EveryRequestCompletesOrIsRefusedAtOnceAndTheServerReturnsToIdle) {
  EngineOptions o;
  o.slots = 4;
  o.max_queue = 12;
  o.max_new_tokens = 256;
  o.prefill_chunk = 64;
  o.threads = 2;
  o.kv_blocks = 48;  // 768 tokens for 4 slots of up to ~450: preemption happens
  TestServer server(o);
  constexpr int kRequests = 48;
  std::atomic<int> completed{0}, refused{0}, other{0}, slow_refusals{0};
  std::vector<std::thread> clients;
  std::mt19937 rng(9);
  std::vector<std::pair<int, int>> lengths;
  for (int i = 0; i < kRequests; ++i) {
    lengths.emplace_back(1 + static_cast<int>(rng() % 300), 8 + static_cast<int>(rng() % 120));
  }
  for (int i = 0; i < kRequests; ++i) {
    clients.emplace_back([&, i] {
      v1::GenerateRequest req;
      for (int t = 0; t < lengths[i].first; ++t) req.mutable_token_ids()->add_ids(5 + (t * 7 + i) % 900);
      req.mutable_stopping()->set_max_new_tokens(lengths[i].second);
      req.mutable_stopping()->set_ignore_eos(true);
      req.set_priority(i % 3);
      const absl::Time t0 = absl::Now();
      StreamResult r = RunGenerate(server.stub(), req);
      if (r.status.ok()) {
        EXPECT_EQ(r.finished.reason(), v1::FINISH_REASON_LENGTH) << i;
        EXPECT_EQ(static_cast<int>(r.tokens.size()), lengths[i].second) << i;
        ++completed;
      } else if (r.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
        ++refused;
        if (absl::Now() - t0 > absl::Seconds(2)) ++slow_refusals;
        EXPECT_EQ(r.trailers.count("retry-after-ms"), 1u);
      } else {
        ++other;
        ADD_FAILURE() << i << ": " << r.status.error_message();
      }
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(completed + refused, kRequests);
  EXPECT_EQ(other.load(), 0);
  // All arrive at once: at least the queue's worth is accepted before the engine admits any.
  EXPECT_GE(completed.load(), 12);
  EXPECT_EQ(slow_refusals.load(), 0) << "refusals are immediate";
  // Idle again: no slot, no queue, every block free (in-flight copies retire within steps).
  v1::ServerInfo si;
  for (int i = 0; i < 200; ++i) {
    grpc::ClientContext ctx;
    ASSERT_TRUE(server.stub().GetServerInfo(&ctx, v1::GetServerInfoRequest(), &si).ok());
    if (si.kv().blocks_free() == si.kv().blocks_total()) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(si.slots_in_use(), 0);
  EXPECT_EQ(si.queue_depth(), 0);
  EXPECT_EQ(si.kv().blocks_used(), 0);
  EXPECT_EQ(si.kv().blocks_free(), si.kv().blocks_total());
  EXPECT_EQ(si.kv().host_blocks_used(), 0);
}

}  // namespace
}  // namespace kvrm
