#include "server/response_queue.h"

#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace kvrm {
namespace {

// What a client reconstructs of one completion from the messages it receives.
struct Completion {
  std::vector<int32_t> tokens;
  std::string text;
  std::string reasoning;
  std::vector<int32_t> logprob_tokens;
  std::vector<float> logprobs;
  std::vector<int32_t> top_ids;  // every top entry's id, in order
  int finished = 0;              // messages carrying `finished`
  int32_t completion_tokens = -1;
  int messages = 0;
};

void Receive(const v1::GenerateResponse& m, std::vector<Completion>& out) {
  Completion& c = out.at(m.index());
  ASSERT_EQ(c.finished, 0) << "a message after completion " << m.index() << " finished";
  ++c.messages;
  c.tokens.insert(c.tokens.end(), m.token_ids().begin(), m.token_ids().end());
  c.text += m.text();
  c.reasoning += m.reasoning_text();
  for (const v1::TokenLogprob& lp : m.logprobs()) {
    c.logprob_tokens.push_back(lp.token_id());
    c.logprobs.push_back(lp.logprob());
    for (const v1::TopLogprob& t : lp.top()) c.top_ids.push_back(t.token_id());
  }
  if (m.has_finished()) {
    ++c.finished;
    c.completion_tokens = m.finished().usage().completion_tokens();
  }
}

// A random chunk of 1-3 tokens for completion `index`, as the reactor builds them.
v1::GenerateResponse Chunk(std::mt19937& rng, int32_t index, bool with_logprobs) {
  v1::GenerateResponse m;
  m.set_request_id("req-7");
  m.set_index(index);
  const int n = 1 + static_cast<int>(rng() % 3);
  for (int i = 0; i < n; ++i) {
    const int32_t id = static_cast<int32_t>(rng() % 32000);
    m.add_token_ids(id);
    // Some tokens are a thinking model's reasoning (reasoning_text), the others its answer.
    const std::string piece(1 + rng() % 4, static_cast<char>('a' + rng() % 26));
    (rng() % 3 == 0 ? m.mutable_reasoning_text() : m.mutable_text())->append(piece);
    if (with_logprobs) {
      v1::TokenLogprob* lp = m.add_logprobs();
      lp->set_token_id(id);
      lp->set_logprob(-static_cast<float>(rng() % 1000) / 100.0f);
      for (int t = 0; t < 5; ++t) {
        v1::TopLogprob* top = lp->add_top();
        top->set_token_id(static_cast<int32_t>(rng() % 32000));
        top->set_logprob(-static_cast<float>(t));
        top->set_text("piece");
      }
    }
  }
  return m;
}

TEST(ResponseQueueTest, FirstMessageIsWrittenAtOnceAndTheQueueEmpties) {
  ResponseQueue q(64 << 10);
  v1::GenerateResponse m;
  m.set_index(0);
  m.add_token_ids(42);
  const v1::GenerateResponse* w = q.Push(m);
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->token_ids(0), 42);
  EXPECT_TRUE(q.writing());
  EXPECT_EQ(q.WriteDone(), nullptr);
  EXPECT_FALSE(q.writing());
  EXPECT_EQ(q.size(), 0u);
  // The next push starts a write again.
  EXPECT_NE(q.Push(m), nullptr);
}

TEST(ResponseQueueTest, ChunksArrivingDuringAWriteBecomeOneMessageInOrder) {
  std::mt19937 rng(11);
  ResponseQueue q(1 << 30);
  std::vector<Completion> sent(1), got(1);
  const v1::GenerateResponse* inflight = nullptr;
  std::vector<int32_t> first_tokens;
  for (int i = 0; i < 300; ++i) {
    v1::GenerateResponse m = Chunk(rng, 0, /*with_logprobs=*/true);
    if (i == 299) m.mutable_finished()->mutable_usage()->set_completion_tokens(1234);
    Receive(m, sent);
    const v1::GenerateResponse* w = q.Push(std::move(m));
    if (i == 0) {
      ASSERT_NE(w, nullptr);
      inflight = w;
      first_tokens.assign(w->token_ids().begin(), w->token_ids().end());
    } else {
      EXPECT_EQ(w, nullptr);
      // The message in flight is not merged into while others queue behind it.
      EXPECT_EQ(std::vector<int32_t>(inflight->token_ids().begin(), inflight->token_ids().end()),
                first_tokens);
    }
    EXPECT_LE(q.size(), 2u);
  }
  EXPECT_EQ(q.merged_chunks(), 298u);
  Receive(*inflight, got);
  const v1::GenerateResponse* next = q.WriteDone();
  ASSERT_NE(next, nullptr);
  Receive(*next, got);
  EXPECT_EQ(q.WriteDone(), nullptr);
  sent[0].messages = got[0].messages = 0;
  EXPECT_EQ(got[0].tokens, sent[0].tokens);
  EXPECT_EQ(got[0].text, sent[0].text);
  EXPECT_EQ(got[0].logprob_tokens, sent[0].logprob_tokens);
  EXPECT_EQ(got[0].logprobs, sent[0].logprobs);
  EXPECT_EQ(got[0].top_ids, sent[0].top_ids);
  EXPECT_EQ(got[0].finished, 1);
  EXPECT_EQ(got[0].completion_tokens, 1234);
}

// A completion's first message's prompt fields (prompt_usage, prompt_token_ids) survive a merge
// into the message queued behind a write: once, as sent.
TEST(ResponseQueueTest, PromptFieldsOfAMergedFirstMessageAreKeptOnce) {
  ResponseQueue q(1 << 20);
  v1::GenerateResponse busy;
  busy.set_index(1);  // another completion's message, being written
  busy.add_token_ids(9);
  ASSERT_NE(q.Push(busy), nullptr);
  v1::GenerateResponse first, second;
  first.set_index(0);
  first.add_token_ids(5);
  first.mutable_prompt_usage()->set_prompt_tokens(3);
  for (int32_t id : {101, 102, 103}) first.add_prompt_token_ids(id);
  second.set_index(0);
  second.add_token_ids(6);
  EXPECT_EQ(q.Push(first), nullptr);
  EXPECT_EQ(q.Push(second), nullptr);
  const v1::GenerateResponse* merged = q.WriteDone();
  ASSERT_NE(merged, nullptr);
  EXPECT_EQ(std::vector<int32_t>(merged->token_ids().begin(), merged->token_ids().end()),
            std::vector<int32_t>({5, 6}));
  EXPECT_EQ(
      std::vector<int32_t>(merged->prompt_token_ids().begin(), merged->prompt_token_ids().end()),
      std::vector<int32_t>({101, 102, 103}));
  EXPECT_EQ(merged->prompt_usage().prompt_tokens(), 3);
  EXPECT_EQ(q.WriteDone(), nullptr);
}

// Tool-call deltas merged into a queued message: each call's arguments arrive whole and in
// order, a call's first delta (its id and name) stays an entry of its own, and a call's later
// pieces join the entry before them.
TEST(ResponseQueueTest, ToolCallDeltasMergeIntoWholeCallsInOrder) {
  ResponseQueue q(1 << 30);
  const auto delta = [](int index, const std::string& id, const std::string& args) {
    v1::GenerateResponse m;
    v1::ToolCallDelta* d = m.add_tool_call_deltas();
    d->set_index(index);
    d->set_id(id);
    if (!id.empty()) d->set_name(absl::StrCat("f", index));
    d->set_arguments(args);
    return m;
  };
  ASSERT_NE(q.Push(delta(0, "call_a", "{")), nullptr);  // in flight
  EXPECT_EQ(q.Push(delta(0, "", "\"x\": ")), nullptr);
  EXPECT_EQ(q.Push(delta(0, "", "1}")), nullptr);
  EXPECT_EQ(q.Push(delta(1, "call_b", "{\"y\"")), nullptr);
  EXPECT_EQ(q.Push(delta(1, "", ": 2}")), nullptr);
  EXPECT_EQ(q.size(), 2u);  // the four queued behind the write in flight are one message
  const v1::GenerateResponse* next = q.WriteDone();
  ASSERT_NE(next, nullptr);
  ASSERT_EQ(next->tool_call_deltas_size(), 2);
  EXPECT_EQ(next->tool_call_deltas(0).index(), 0);
  EXPECT_EQ(next->tool_call_deltas(0).id(), "");
  EXPECT_EQ(next->tool_call_deltas(0).arguments(), "\"x\": 1}");
  EXPECT_EQ(next->tool_call_deltas(1).id(), "call_b");
  EXPECT_EQ(next->tool_call_deltas(1).name(), "f1");
  EXPECT_EQ(next->tool_call_deltas(1).arguments(), "{\"y\": 2}");
  EXPECT_EQ(q.WriteDone(), nullptr);
}

// n completions interleaved, a reader completing writes at random: every completion arrives
// whole and in order, the queue holds at most one message per completion beside the one in
// flight, and each message stays within the byte cap.
TEST(ResponseQueueTest, RandomReaderGetsEveryCompletionWholeWithABoundedQueue) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    std::mt19937 rng(seed);
    const int n = 1 + static_cast<int>(seed % 4);
    const size_t cap = seed % 2 ? (1u << 30) : 2000u;
    const bool logprobs = seed % 3 == 0;
    ResponseQueue q(cap);
    std::vector<Completion> sent(n), got(n);
    std::vector<int> remaining(n);
    for (int& r : remaining) r = 20 + static_cast<int>(rng() % 200);
    std::vector<int> live;
    for (int i = 0; i < n; ++i) live.push_back(i);
    const v1::GenerateResponse* inflight = nullptr;
    size_t most = 0;
    const double read_prob = 0.05 + 0.3 * (seed % 4);
    std::uniform_real_distribution<double> u(0, 1);
    auto complete_write = [&] {
      ASSERT_NE(inflight, nullptr);
      if (cap < (1u << 30)) {
        // The cap holds for merged messages (a single chunk is smaller than it here).
        EXPECT_LE(inflight->ByteSizeLong(), cap) << "seed " << seed;
      }
      Receive(*inflight, got);
      inflight = q.WriteDone();
    };
    while (!live.empty()) {
      const size_t k = rng() % live.size();
      const int32_t idx = live[k];
      v1::GenerateResponse m = Chunk(rng, idx, logprobs);
      if (--remaining[idx] == 0) {
        m.mutable_finished()->mutable_usage()->set_completion_tokens(idx + 100);
        live.erase(live.begin() + k);
      }
      Receive(m, sent);
      const v1::GenerateResponse* w = q.Push(std::move(m));
      if (w != nullptr) {
        ASSERT_EQ(inflight, nullptr) << "two writes in flight";
        inflight = w;
      }
      most = std::max(most, q.size());
      if (cap >= (1u << 30)) {
        EXPECT_LE(q.size(), static_cast<size_t>(n) + 1) << "seed " << seed;
      }
      while (inflight != nullptr && u(rng) < read_prob) complete_write();
    }
    while (inflight != nullptr) complete_write();
    EXPECT_FALSE(q.writing());
    size_t messages = 0, chunks = 0;
    for (int i = 0; i < n; ++i) {
      SCOPED_TRACE("seed " + std::to_string(seed) + " completion " + std::to_string(i));
      EXPECT_EQ(got[i].tokens, sent[i].tokens);
      EXPECT_EQ(got[i].text, sent[i].text);
      EXPECT_EQ(got[i].reasoning, sent[i].reasoning);
      EXPECT_EQ(got[i].logprob_tokens, sent[i].logprob_tokens);
      EXPECT_EQ(got[i].logprobs, sent[i].logprobs);
      EXPECT_EQ(got[i].top_ids, sent[i].top_ids);
      EXPECT_EQ(got[i].finished, 1);
      EXPECT_EQ(got[i].completion_tokens, i + 100);
      messages += got[i].messages;
      chunks += sent[i].messages;
    }
    // A slow reader got fewer messages than chunks; the merge count says by how many.
    EXPECT_EQ(chunks - messages, q.merged_chunks()) << "seed " << seed;
    if (read_prob < 0.5) {
      EXPECT_LT(messages, chunks) << "seed " << seed;
    }
  }
}

TEST(ResponseQueueTest, DroppingKeepsOnlyTheWriteInFlight) {
  std::mt19937 rng(5);
  ResponseQueue q(64 << 10);
  const v1::GenerateResponse* w = q.Push(Chunk(rng, 0, false));
  ASSERT_NE(w, nullptr);
  const int32_t first = w->token_ids(0);
  for (int i = 0; i < 10; ++i) q.Push(Chunk(rng, i % 2, false));
  EXPECT_EQ(q.size(), 3u);
  q.DropQueued();
  EXPECT_EQ(q.size(), 1u);
  EXPECT_EQ(w->token_ids(0), first);  // still valid: gRPC may be writing it
  EXPECT_EQ(q.WriteDone(), nullptr);
  EXPECT_FALSE(q.writing());
}

}  // namespace
}  // namespace kvrm
