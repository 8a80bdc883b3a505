// Faults end in a clear error or a recovered state, never a crash, a hang or a leaked block:
// a slow transport, a failing copy, and a client that never reads its stream (or reads it late).
#include <atomic>
#include <cstdio>
#include <thread>

#include "absl/strings/str_cat.h"
#include "grpcpp/create_channel.h"
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
  // Slow copies are waited for: by a step on the copies it reads, or by growth on the blocks
  // they hold (the two counters).
  const EngineStats stats = server.engine().Stats();
  EXPECT_GT(stats.transport_wait_seconds_total + stats.transport_drain_wait_seconds_total, 0.0);
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

namespace kvrm {
namespace {

// A client that reads its stream only after the model has finished: while its writes wait on
// flow control the reactor merges the chunks (server/response_queue.h), so the client gets the
// whole completion, token for token, logprob for logprob, in fewer messages than tokens, the
// same as a client that read as it went.
TEST(FaultTest, ClientThatReadsLateGetsTheWholeStreamMerged) {
  EngineOptions o;
  o.slots = 2;
  o.max_new_tokens = 512;
  o.threads = 2;
  TestServer server(o);
  v1::GenerateRequest req = TextRequest("read me later", 400);
  req.mutable_stopping()->set_ignore_eos(true);
  req.mutable_response()->set_top_logprobs(20);  // ~400 bytes a token: past the stream window
  // Read as it comes.
  StreamResult eager = RunGenerate(server.stub(), req);
  ASSERT_TRUE(eager.status.ok()) << eager.status.error_message();
  ASSERT_EQ(eager.tokens.size(), 400u);
  // Read after the engine has finished the request, on a channel whose stream window stays
  // small (16 KiB, no BDP growth) as a slow client's would: the server's writes wait on it.
  grpc::ChannelArguments args;
  args.SetInt("grpc.http2.lookahead_bytes", 16 << 10);
  args.SetInt("grpc.http2.bdp_probe", 0);
  auto stub = v1::Kvrm::NewStub(grpc::CreateCustomChannel(
      absl::StrCat("127.0.0.1:", server.port()), grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext ctx;
  auto reader = stub->Generate(&ctx, req);
  v1::GenerateResponse first;
  ASSERT_TRUE(reader->Read(&first));  // the call is under way
  ASSERT_TRUE(server.engine().WaitIdle(absl::Seconds(120)));
  std::vector<v1::GenerateResponse> messages{first};
  for (v1::GenerateResponse m; reader->Read(&m);) messages.push_back(m);
  ASSERT_TRUE(reader->Finish().ok());
  std::vector<int32_t> tokens;
  std::string text;
  int finished = 0;
  for (const v1::GenerateResponse& m : messages) {
    ASSERT_EQ(m.logprobs_size(), m.token_ids_size()) << "one logprob entry per token";
    for (int i = 0; i < m.token_ids_size(); ++i) {
      EXPECT_EQ(m.logprobs(i).token_id(), m.token_ids(i));
      EXPECT_EQ(m.logprobs(i).top_size(), 20);
    }
    tokens.insert(tokens.end(), m.token_ids().begin(), m.token_ids().end());
    text += m.text();
    if (m.has_finished()) {
      ++finished;
      EXPECT_EQ(m.finished().usage().completion_tokens(), 400);
      EXPECT_EQ(m.finished().reason(), v1::FINISH_REASON_LENGTH);
    }
  }
  EXPECT_EQ(finished, 1);
  EXPECT_TRUE(messages.back().has_finished()) << "the final message comes last";
  EXPECT_EQ(tokens, eager.tokens) << "greedy: the same completion";
  EXPECT_EQ(text, eager.text);
  // Unmerged, 400 messages; the 16 KiB window holds ~40 of these, the rest merge into a few.
  EXPECT_LE(messages.size(), 100u) << "read late: chunks merged";
  std::fprintf(stderr, "read late: %zu messages for 400 tokens (read as it went: %zu)\n",
               messages.size(), eager.messages.size());
  ExpectIdle(server);
}

}  // namespace
}  // namespace kvrm
