// Faults end in a clear error or a recovered state, never a crash, a hang or a leaked block:
// a slow transport, a failing copy, and a client that never reads its stream.
#include <atomic>
#include <thread>

#include "gtest/gtest.h"
#include "tests/test_server.h"

namespace kvrm {
namespace {

EngineOptions PressureOptions() {
  EngineOptions o;
  o.slots = 4;
  o.max_queue = 64;
  o.max_new_tokens = 256;
  o.prefill_chunk = 64;
  o.threads = 2;
  o.block_tokens = 4;
  o.max_runs = 2;
  o.kv_blocks = 160;  // 640 tokens for 4 slots growing to ~400: compaction and swapping
  o.recompute_max_tokens = 1;
  return o;
}

std::vector<StreamResult> RunBatch(TestServer& server, int n) {
  std::vector<StreamResult> results(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      v1::GenerateRequest req;
      for (int t = 0; t < 60 + 40 * (i % 4); ++t) req.mutable_token_ids()->add_ids(5 + (t * 11 + i) % 900);
      req.mutable_stopping()->set_max_new_tokens(200);
      req.mutable_stopping()->set_ignore_eos(true);
      results[i] = RunGenerate(server.stub(), req);
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

void ExpectIdle(TestServer& server) {
  v1::ServerInfo si;
  for (int i = 0; i < 300; ++i) {
    grpc::ClientContext ctx;
    ASSERT_TRUE(server.stub().GetServerInfo(&ctx, v1::GetServerInfoRequest(), &si).ok());
    if (si.slots_in_use() == 0 && si.kv().blocks_free() == si.kv().blocks_total()) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(si.slots_in_use(), 0);
  EXPECT_EQ(si.kv().blocks_free(), si.kv().blocks_total()) << "blocks leaked";
  EXPECT_EQ(si.kv().host_blocks_used(), 0);
}

TEST(FaultTest, SlowTransportChangesNothingButTime) {
  // Reference without faults, then the same batch with every copy delayed by 3 ms.
  std::vector<std::vector<int32_t>> reference;
  {
    TestServer server(PressureOptions());
    for (const StreamResult& r : RunBatch(server, 8)) {
      ASSERT_TRUE(r.status.ok()) << r.status.error_message();
      reference.push_back(r.tokens);
    }
  }
  EngineOptions o = PressureOptions();
  std::atomic<int> copies{0};
  o.transfer_fault = [&](const TransferGroup&) {
    ++copies;
    absl::SleepFor(absl::Milliseconds(3));
    return absl::OkStatus();
  };
  TestServer server(o);
  const std::vector<StreamResult> results = RunBatch(server, 8);
  for (size_t i = 0; i < results.size(); ++i) {
    ASSERT_TRUE(results[i].status.ok()) << results[i].status.error_message();
    EXPECT_EQ(results[i].tokens, reference[i]) << i;
  }
  EXPECT_GT(copies.load(), 0) << "the workload must move blocks for this test to mean anything";
  EXPECT_GT(server.engine().Stats().transport_wait_seconds_total, 0.0);
  ExpectIdle(server);
}

TEST(FaultTest, FailingCopyFailsOnlyTheAffectedRequestsAndTheServerRecovers) {
  EngineOptions o = PressureOptions();
  std::atomic<int> copies{0};
  std::atomic<bool> failing{true};
  o.transfer_fault = [&](const TransferGroup&) {
    if (failing.load() && copies.fetch_add(1) == 0) {
      return absl::InternalError("injected copy failure");
    }
    return absl::OkStatus();
  };
  TestServer server(o);
  const std::vector<StreamResult> results = RunBatch(server, 8);
  int errors = 0;
  for (const StreamResult& r : results) {
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();  // the stream ends cleanly
    if (r.finished.reason() == v1::FINISH_REASON_ERROR) {
      ++errors;
      EXPECT_FALSE(r.finished.error().empty());
    } else {
      EXPECT_EQ(r.finished.reason(), v1::FINISH_REASON_LENGTH);
      EXPECT_EQ(r.tokens.size(), 200u);
    }
  }
  EXPECT_GE(copies.load(), 1);
  EXPECT_GE(errors, 1) << "the request whose KV could not be copied ends with ERROR";
  EXPECT_LT(errors, 8) << "not everyone";
  failing = false;
  ExpectIdle(server);
  // And it keeps serving.
  StreamResult after = RunGenerate(server.stub(), TextRequest("after the fault", 8));
  EXPECT_TRUE(after.status.ok());
  EXPECT_EQ(after.finished.reason(), v1::FINISH_REASON_LENGTH);
}

TEST(FaultTest, ClientThatNeverReadsDoesNotBlockOthers) {
  EngineOptions o;
  o.slots = 2;
  o.max_new_tokens = 256;
  o.threads = 2;
  TestServer server(o);
  // A stream whose client never reads: its messages queue in its reactor, the engine goes on.
  grpc::ClientContext stuck_ctx;
  v1::GenerateRequest stuck = TextRequest("never read", 250);
  stuck.mutable_stopping()->set_ignore_eos(true);
  auto stuck_reader = server.stub().Generate(&stuck_ctx, stuck);
  // Others complete meanwhile, and the stuck one finishes on the server side too.
  for (int i = 0; i < 4; ++i) {
    StreamResult r = RunGenerate(server.stub(), TextRequest("others " + std::to_string(i), 20));
    EXPECT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.tokens.size(), 20u);
  }
  EXPECT_TRUE(server.engine().WaitIdle(absl::Seconds(60)));
  // The client goes away without ever reading: the call ends, nothing leaks.
  stuck_ctx.TryCancel();
  stuck_reader->Finish();
  ExpectIdle(server);
}

}  // namespace
}  // namespace kvrm
