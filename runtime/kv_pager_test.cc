// Property tests of the KV-RM pager and the transfer planner over long random sequences of
// admit / grow / EOS / cancel / compact / swap-out / swap-in, with a simulated transport that
// runs each batch of moves some time after it was planned (as the real one may), checked
// against a simple oracle: each slot's logical blocks hold the values written to them.
#include "runtime/kv_pager.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <deque>
#include <memory>
#include <random>
#include <set>
#include <string>

#include "gtest/gtest.h"
#include "runtime/block_space.h"
#include "runtime/prefix_index.h"
#include "runtime/transfer_plan.h"

namespace kvrm {
namespace {

constexpr int32_t kBlockTokens = 16;

// Values stand in for KV contents, one per token position of a block: block j of request r
// holds Value(r, j).
using BlockValue = std::array<uint64_t, kBlockTokens>;
BlockValue Value(uint64_t request, int64_t logical_block) {
  BlockValue v;
  v.fill(request * 1000003u + static_cast<uint64_t>(logical_block) * 7919u + 1);
  return v;
}

// Prefix-cache runs: position i of a history's block j stands for the K/V computed from its
// tokens up to and with that position's, so a block attached from the cache must hold exactly
// what this history would have written there, and a block copied for its first k tokens must
// hold that in its first k positions.
BlockValue TokenValue(const std::vector<int32_t>& seq, int64_t logical_block) {
  uint64_t h = 1469598103934665603ull;
  const int64_t first = logical_block * kBlockTokens;
  for (int64_t i = 0; i < std::min<int64_t>(first, seq.size()); ++i) {
    h = (h ^ static_cast<uint32_t>(seq[i])) * 1099511628211ull;
  }
  BlockValue v;
  for (int32_t i = 0; i < kBlockTokens; ++i) {
    if (first + i < static_cast<int64_t>(seq.size())) {
      h = (h ^ static_cast<uint32_t>(seq[first + i])) * 1099511628211ull;
    }
    v[i] = h;
  }
  return v;
}

struct Sim {
  KvPagerOptions options;
  std::unique_ptr<KvPager> pager;
  std::vector<BlockValue> device, host;  // simulated contents per physical block
  std::vector<uint64_t> request;       // per slot: 0 = free
  std::vector<int64_t> tokens;         // per slot
  std::vector<std::vector<int32_t>> seq;  // per slot, prefix-cache runs: the whole history
  std::deque<std::pair<uint64_t, std::vector<BlockMove>>> in_flight;  // planned, not yet copied
  uint64_t next_fence = 1;
  uint64_t next_request = 1;
  int64_t groups = 0, moves = 0;

  explicit Sim(KvPagerOptions o) : options(o), pager(std::make_unique<KvPager>(o)) {
    device.assign(o.device_blocks, BlockValue{});
    host.assign(std::max<int64_t>(1, o.host_blocks), BlockValue{});
    request.assign(o.num_slots, 0);
    tokens.assign(o.num_slots, 0);
    seq.assign(o.num_slots, {});
  }

  BlockValue ValueOf(int32_t slot, int64_t j) const {
    return seq[slot].empty() ? Value(request[slot], j) : TokenValue(seq[slot], j);
  }

  std::vector<BlockValue>& Mem(KvTier t) { return t == KvTier::kDevice ? device : host; }

  // Writes the oracle values into the slot's blocks from its `from_block`-th on (as prefill and
  // decode would; the first blocks of a history may have been dropped: the values are those of
  // their logical place).
  void Write(int32_t slot, int64_t from_block) {
    const int64_t dropped = pager->Dropped(slot);
    const std::vector<int32_t>& blocks = pager->Blocks(slot);
    std::vector<BlockValue>& mem = Mem(pager->OnHost(slot) ? KvTier::kHost : KvTier::kDevice);
    for (int64_t j = from_block; j < static_cast<int64_t>(blocks.size()); ++j) {
      // A registered block is never written again (whoever else holds it reads it).
      if (!pager->OnHost(slot)) {
        ASSERT_FALSE(pager->Registered(blocks[j])) << "block " << blocks[j];
      }
      mem[blocks[j]] = ValueOf(slot, dropped + j);
    }
  }

  void Submit(std::vector<BlockMove> planned, uint64_t fence) {
    if (planned.empty()) return;
    // Planner properties: groups cover the moves exactly, are disjoint and maximal.
    std::vector<BlockMove> copy = planned;
    std::vector<TransferGroup> g;
    PlanTransferGroups(absl::MakeSpan(copy), &g);
    int64_t covered = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      covered += g[i].num_blocks;
      for (size_t k = 0; k < g.size(); ++k) {
        if (k == i) continue;
        const bool joinable = g[i].src_tier == g[k].src_tier && g[i].dst_tier == g[k].dst_tier &&
                              g[i].src_first + g[i].num_blocks == g[k].src_first &&
                              g[i].dst_first + g[i].num_blocks == g[k].dst_first;
        ASSERT_FALSE(joinable) << "groups " << i << " and " << k << " could merge";
        if (g[i].src_tier == g[k].src_tier) {
          ASSERT_TRUE(g[i].src_first + g[i].num_blocks <= g[k].src_first ||
                      g[k].src_first + g[k].num_blocks <= g[i].src_first) << "sources overlap";
        }
        if (g[i].dst_tier == g[k].dst_tier) {
          ASSERT_TRUE(g[i].dst_first + g[i].num_blocks <= g[k].dst_first ||
                      g[k].dst_first + g[k].num_blocks <= g[i].dst_first) << "dests overlap";
        }
      }
    }
    ASSERT_EQ(covered, static_cast<int64_t>(planned.size()));
    groups += g.size();
    moves += planned.size();
    in_flight.emplace_back(fence, std::move(planned));
  }

  // Executes the oldest in-flight batch (copies, then retires its fence).
  void RunOne() {
    if (in_flight.empty()) return;
    auto [fence, batch] = std::move(in_flight.front());
    in_flight.pop_front();
    for (const BlockMove& m : batch) Mem(m.dst_tier)[m.dst] = Mem(m.src_tier)[m.src];
    pager->RetireUpTo(fence);
  }
  void RunAll() {
    while (!in_flight.empty()) RunOne();
  }
  // Runs batches until `fence` is done (as a step waits for every batch submitted before it).
  void RunUpTo(uint64_t fence) {
    while (!in_flight.empty() && in_flight.front().first <= fence) RunOne();
  }
  // The offloads planned so far go out as one batch with `fence`, ahead of the moves planned
  // after them (as the engine submits them).
  void SubmitOffloads(uint64_t fence) {
    std::vector<BlockMove> m(pager->offload_moves().begin(), pager->offload_moves().end());
    pager->OffloadSubmitted(fence);
    Submit(std::move(m), fence);
  }
  // A growth that may evict (and so offload): the offloads run before anything writes the
  // evicted blocks.
  absl::Status GrowAndWrite(int32_t slot, int64_t tokens) {
    const int64_t before = pager->NumBlocks(slot);
    const absl::Status st = pager->Grow(slot, tokens);
    const uint64_t fence = next_fence++;
    SubmitOffloads(fence);
    RunUpTo(fence);
    if (st.ok()) Write(slot, before);
    return st;
  }

  // After each random operation: the pager's invariants; every `every` operations the transport
  // catches up and every slot's contents are checked.
  void CheckAfter(int op, int every) {
    ASSERT_TRUE(pager->CheckInvariants().ok()) << pager->CheckInvariants() << " op " << op;
    if (op % every == 0) {
      RunAll();
      CheckContents();
    }
  }

  // Ends every request and retires every move.
  void ReleaseAll() {
    for (int32_t s = 0; s < options.num_slots; ++s) pager->Release(s);
    pager->RetireUpTo(next_fence);
  }

  // Plans the slot's compaction (when it has more than max_runs runs) and submits the moves.
  // (Fences come in pairs: the offloads a plan's evictions make go out first.)
  void Compact(int32_t slot) {
    std::vector<BlockMove> m;
    const uint64_t fence = next_fence + 1;
    next_fence += 2;
    if (pager->PlanCompaction(slot, fence, &m) && !pager->OnHost(slot)) {
      ASSERT_LE(pager->NumRuns(slot), options.max_runs);
    }
    SubmitOffloads(fence - 1);
    Submit(std::move(m), fence);
  }

  // Swaps the slot out (a pause), or back in when it is in the host tier (a resume).
  void Swap(int32_t slot) {
    std::vector<BlockMove> m;
    const uint64_t fence = next_fence + 1;
    next_fence += 2;
    const absl::Status st = pager->OnHost(slot) ? pager->PlanSwapIn(slot, fence, &m)
                                                : pager->PlanSwapOut(slot, fence, &m);
    ASSERT_TRUE(st.ok() || absl::IsResourceExhausted(st)) << st;
    SubmitOffloads(fence - 1);
    Submit(std::move(m), fence);
  }

  void CheckContents() {
    for (int32_t s = 0; s < options.num_slots; ++s) {
      if (request[s] == 0) continue;
      const std::vector<int32_t>& blocks = pager->Blocks(s);
      std::vector<BlockValue>& mem = Mem(pager->OnHost(s) ? KvTier::kHost : KvTier::kDevice);
      const int64_t dropped = pager->Dropped(s);
      for (size_t j = 0; j < blocks.size(); ++j) {
        ASSERT_EQ(mem[blocks[j]], ValueOf(s, dropped + j)) << "slot " << s << " block " << j;
      }
    }
  }
};

KvPagerOptions Options(int32_t slots, int64_t device_blocks, int64_t host_blocks, int32_t runs) {
  KvPagerOptions o;
  o.num_slots = slots;
  o.device_blocks = device_blocks;
  o.host_blocks = host_blocks;
  o.block_tokens = kBlockTokens;
  o.max_runs = runs;
  o.max_blocks_per_slot = 64;
  o.bytes_per_block = 1024;
  return o;
}

void RandomOperations(int32_t max_runs) {
  for (uint32_t seed : {1u, 2u, 3u, 4u}) {
    Sim sim(Options(12, 300, 200, max_runs));
    std::mt19937 rng(seed);
    auto pick = [&](int n) { return static_cast<int>(rng() % n); };
    for (int op = 0; op < 6000; ++op) {
      const int32_t s = pick(sim.options.num_slots);
      KvPager& p = *sim.pager;
      switch (pick(8)) {
        case 0:
        case 1: {  // admit a prompt into a free slot
          if (sim.request[s] != 0) break;
          const int64_t prompt = 1 + pick(300);
          if (p.BlocksFor(prompt) > p.free_device_blocks()) break;
          // Half the requests say where they may end (a placement hint, not always right).
          p.ExpectTokens(s, pick(2) == 0 ? 0 : prompt + pick(400));
          ASSERT_TRUE(p.Grow(s, prompt).ok());
          sim.request[s] = sim.next_request++;
          sim.tokens[s] = prompt;
          sim.Write(s, 0);
          break;
        }
        case 2:
        case 3: {  // decode growth by a few tokens
          if (sim.request[s] == 0 || p.OnHost(s)) break;
          const int64_t before = p.NumBlocks(s);
          const int64_t want = std::min<int64_t>(sim.tokens[s] + 1 + pick(40), 64 * kBlockTokens);
          const absl::Status st = p.Grow(s, want);
          if (!st.ok()) {
            ASSERT_TRUE(absl::IsResourceExhausted(st) || absl::IsOutOfRange(st)) << st;
            break;
          }
          sim.tokens[s] = want;
          sim.Write(s, before);
          break;
        }
        case 4: {  // EOS / stop / cancel
          if (sim.request[s] == 0) break;
          p.Release(s);
          sim.request[s] = 0;
          sim.tokens[s] = 0;
          break;
        }
        case 5:  // compaction when over max_runs
          if (sim.request[s] != 0) sim.Compact(s);
          break;
        case 6:  // swap out (pause) or back in (resume)
          if (sim.request[s] != 0) sim.Swap(s);
          break;
        case 7:  // the transport catches up by one batch
          sim.RunOne();
          break;
      }
      sim.CheckAfter(op, 50);
      if (::testing::Test::HasFatalFailure()) return;
    }
    sim.RunAll();
    sim.CheckContents();
    // Every slot at most max_runs after its compaction is planned and done.
    for (int32_t s = 0; s < sim.options.num_slots; ++s) {
      if (sim.request[s] != 0 && !sim.pager->OnHost(s)) sim.Compact(s);
    }
    sim.RunAll();
    sim.CheckContents();
    // No block leaked when all requests end.
    sim.ReleaseAll();
    EXPECT_EQ(sim.pager->free_device_blocks(), 300);
    EXPECT_EQ(sim.pager->free_host_blocks(), 200);
    EXPECT_TRUE(sim.pager->CheckInvariants().ok());
    // The sequence exercised the transport, and merging made groups rarer than moves.
    EXPECT_GT(sim.moves, 500) << "seed " << seed;
    EXPECT_LT(sim.groups, sim.moves) << "seed " << seed;
  }
}

TEST(KvPagerTest, RandomOperationsKeepEveryInvariant) { RandomOperations(4); }

// A table two runs wide: compaction takes its window and whole-history paths, not only the
// neighbour's.
TEST(KvPagerTest, RandomOperationsWithANarrowRunTableKeepEveryInvariant) { RandomOperations(2); }

// Prefix cache, property test: histories drawn from a few shared system prompts and from earlier
// conversations continued (as in multi-turn traffic), admitted through MatchPrefix/AttachPrefix,
// registered as they fill and when they end, under compaction, swaps and a lagging transport,
// on a pool small enough that the cache must evict. Every attached block holds exactly what the
// history would have written (TokenValue), no registered block is written again, references
// match holders, and all blocks come back at the end.
// With `offload`, evicted blocks go to the host tier (shared with swapped-out requests) and
// admissions bring matched host blocks back: those must hold exactly what the history would have
// written too, though the device blocks they were copied from were handed out long before.
// With `release`, histories also drop their blocks behind a 64-token window (window release),
// attached ones included, and go on registering past them.
void PrefixCacheRandomOperations(bool offload, bool release = false) {
  int64_t tails_registered = 0, tails_attached = 0, whole_sources = 0;
  for (uint32_t seed : {11u, 12u, 13u}) {
    KvPagerOptions o = Options(10, 260, 120, 4);
    o.prefix_cache = true;
    o.host_prefix_cache = offload;
    // Window release drops the blocks wholly behind the last 64 tokens: BlocksBehindWindow's
    // window of 65 positions, under which a match needs only the blocks after those.
    const int32_t window = release ? 65 : 0;
    o.window = window;
    Sim sim(o);
    std::mt19937 rng(seed);
    auto pick = [&](int n) { return static_cast<int>(rng() % n); };
    const int64_t max_tokens = o.max_blocks_per_slot * kBlockTokens;
    std::vector<std::vector<int32_t>> systems(3);
    for (auto& sys : systems) {
      sys.resize(40 + pick(200));
      for (int32_t& t : sys) t = pick(50000);
    }
    std::vector<std::vector<int32_t>> finished;  // conversations to continue
    int64_t hit_blocks = 0, host_hit_blocks = 0, registered = 0, released = 0, window_hits = 0;
    std::vector<PrefixBlock> match;
    int64_t resets_freed = 0;
    for (int op = 0; op < 6000; ++op) {
      const int32_t s = pick(sim.options.num_slots);
      KvPager& p = *sim.pager;
      if (op % 1000 == 999) {
        // A prefix cache reset between two operations: nothing cached before it is found after
        // it, in either tier, and every history keeps its blocks and contents (checked below).
        const KvPager::CacheReset freed = p.ResetPrefixCache();
        resets_freed += freed.device_blocks + freed.host_blocks;
        ASSERT_EQ(p.idle_cached_blocks(), 0);
        for (const std::vector<int32_t>& seq : finished) {
          ASSERT_EQ(p.MatchPrefix(seq, static_cast<int32_t>(seq.size() / kBlockTokens), &match, 0,
                                  offload, window, /*tail=*/true),
                    0);
          ASSERT_TRUE(match.empty()) << "no tail after a reset";
        }
        ASSERT_TRUE(p.CheckInvariants().ok()) << p.CheckInvariants();
      }
      switch (pick(release ? 10 : 9)) {
        case 0:
        case 1: {  // admit: a system prompt or an earlier conversation, then new tokens
          if (sim.request[s] != 0) break;
          std::vector<int32_t> seq;
          if (!finished.empty() && pick(2) == 0) {
            seq = finished[pick(static_cast<int>(finished.size()))];
          } else {
            seq = systems[pick(3)];
            seq.resize(pick(static_cast<int>(seq.size()) + 1));
          }
          const int64_t prompt = std::min<int64_t>(seq.size() + 1 + pick(120), max_tokens / 2);
          while (static_cast<int64_t>(seq.size()) < max_tokens) seq.push_back(pick(50000));
          // At most the blocks before the one that holds the prompt's last token.
          int32_t hits = p.MatchPrefix(absl::MakeConstSpan(seq).first(prompt),
                                       static_cast<int32_t>((prompt - 1) / kBlockTokens), &match, 0,
                                       offload, window, /*tail=*/true);
          const bool has_tail = !match.empty() && match.back().tokens > 0;
          ASSERT_EQ(hits + (has_tail ? 1 : 0), static_cast<int32_t>(match.size()));
          int64_t idle = 0, device_hits = 0, behind = 0;
          for (const PrefixBlock& b : match) {
            ASSERT_TRUE(offload || b.tier == KvTier::kDevice);
            if (b.block < 0) {
              ASSERT_EQ(&b - match.data(), behind) << "blocks behind the window come first";
              ++behind;
              continue;
            }
            if (b.tier == KvTier::kDevice) {
              idle += p.IdleCached(b.block);
              device_hits += b.tokens == 0;
            }
          }
          ASSERT_EQ(behind,
                    window > 0 ? BlocksBehindWindow(hits * kBlockTokens, window, kBlockTokens) : 0);
          window_hits += behind;
          if (p.BlocksFor(prompt) - behind - device_hits > p.free_device_blocks() - idle) break;
          sim.request[s] = sim.next_request++;
          sim.seq[s] = std::move(seq);
          // Offloads (fence f), then the copies back (f + 1), then the prompt's own blocks are
          // written once the offloads have read what the growth evicted.
          const uint64_t fence = sim.next_fence + 1;
          sim.next_fence += 2;
          std::vector<BlockMove> onboard;
          hits = p.AttachPrefix(s, match, fence, &onboard);
          ASSERT_EQ(hits, static_cast<int32_t>(match.size())) << "room was counted";
          // A tail entry (an ended history's tail, or a whole block of a history that went on
          // elsewhere) is copied on the device into the slot's last block.
          int32_t tail_dst = -1;
          if (has_tail) {
            ++tails_attached;
            whole_sources += !p.IsTail(match.back().block);
            tail_dst = p.Blocks(s).back();
            int copies = 0;
            for (const BlockMove& m : onboard) {
              if (m.dst_tier == KvTier::kDevice && m.dst == tail_dst) {
                ASSERT_EQ(m.src, match.back().block);
                ASSERT_EQ(m.src_tier, KvTier::kDevice);
                ++copies;
              }
            }
            ASSERT_EQ(copies, 1);
            ASSERT_FALSE(p.Registered(tail_dst));
          }
          const int64_t before = p.NumBlocks(s);
          ASSERT_EQ(p.Dropped(s), behind);
          ASSERT_EQ(before + behind, hits);
          p.ExpectTokens(s, pick(2) == 0 ? 0 : prompt + pick(400));
          ASSERT_TRUE(p.Grow(s, prompt).ok());
          sim.SubmitOffloads(fence - 1);
          sim.Submit(std::move(onboard), fence);
          // The step that prefills the rest (and so writes the tail's copy) waits for it.
          sim.RunUpTo(has_tail ? fence : fence - 1);
          sim.tokens[s] = prompt;
          hit_blocks += hits;
          host_hit_blocks += hits - behind - device_hits - (has_tail ? 1 : 0);
          // The prompt's last token is never among them (it gives the first output's logits).
          ASSERT_LE((before - 1) * kBlockTokens + (has_tail ? match.back().tokens : kBlockTokens),
                    prompt - 1);
          if (has_tail) {
            // Its first `tokens` positions hold what this history writes there.
            const BlockValue want = TokenValue(sim.seq[s], before - 1);
            const int32_t k = match.back().tokens;
            ASSERT_TRUE(std::equal(want.begin(), want.begin() + k, sim.device[tail_dst].begin()))
                << "the copy's first " << k << " positions";
          }
          sim.Write(s, has_tail ? before - 1 : before);
          break;
        }
        case 2:
        case 3: {  // decode growth by a few tokens, registering the full blocks
          if (sim.request[s] == 0 || p.OnHost(s)) break;
          const int64_t want = std::min<int64_t>(sim.tokens[s] + 1 + pick(40), max_tokens);
          const absl::Status st = sim.GrowAndWrite(s, want);
          if (!st.ok()) {
            ASSERT_TRUE(absl::IsResourceExhausted(st) || absl::IsOutOfRange(st)) << st;
            break;
          }
          sim.tokens[s] = want;
          if (pick(2) == 0) {
            registered += p.RegisterPrefix(s, absl::MakeConstSpan(sim.seq[s]).first(want));
          }
          break;
        }
        case 4: {  // EOS / stop / cancel; most register their history first
          if (sim.request[s] == 0) break;
          if (pick(4) != 0) {
            registered +=
                p.RegisterPrefix(s, absl::MakeConstSpan(sim.seq[s]).first(sim.tokens[s]));
            if (p.RegisterTail(s, absl::MakeConstSpan(sim.seq[s]).first(sim.tokens[s]))) {
              // Its K/V written (the copies into it done), then keyed by its tokens alone.
              ++tails_registered;
              const int64_t j = sim.tokens[s] / kBlockTokens;
              ASSERT_EQ(p.Dropped(s), 0);
              const int32_t b = p.Blocks(s)[j];
              ASSERT_EQ(sim.device[b], sim.ValueOf(s, j)) << "a tail registered before written";
            }
            finished.emplace_back(sim.seq[s].begin(), sim.seq[s].begin() + sim.tokens[s]);
            if (finished.size() > 20) finished.erase(finished.begin());
          }
          p.Release(s);
          sim.request[s] = 0;
          sim.tokens[s] = 0;
          sim.seq[s].clear();
          break;
        }
        case 5:  // compaction when over max_runs
          if (sim.request[s] != 0) sim.Compact(s);
          break;
        case 6:  // swap out (pause) or back in (resume)
          if (sim.request[s] != 0) sim.Swap(s);
          break;
        case 7:
        case 8:  // the transport catches up by one batch
          sim.RunOne();
          break;
        case 9: {  // window release: the blocks wholly behind the last 64 tokens' window
          if (sim.request[s] == 0 || p.OnHost(s)) break;
          const int64_t behind = std::max<int64_t>(0, sim.tokens[s] - 64) / kBlockTokens;
          const int32_t target =
              static_cast<int32_t>(std::min<int64_t>(behind, p.Dropped(s) + p.NumBlocks(s)));
          if (target > p.Dropped(s)) {
            p.DropBlocks(s, /*sink_blocks=*/0, target);
            ++released;
          }
          break;
        }
      }
      sim.CheckAfter(op, 25);
      if (::testing::Test::HasFatalFailure()) return;
    }
    sim.RunAll();
    sim.CheckContents();
    sim.ReleaseAll();
    EXPECT_EQ(sim.pager->free_device_blocks(), 260) << "idle cached blocks count as free";
    EXPECT_EQ(sim.pager->idle_cached_blocks(), sim.pager->cached_blocks());
    EXPECT_EQ(sim.pager->free_host_blocks(), 120);
    EXPECT_TRUE(sim.pager->CheckInvariants().ok());
    // The run shared, registered and evicted plenty.
    EXPECT_EQ(released > 0, release);
    EXPECT_EQ(window_hits > 0, release) << "hits with blocks behind the window not attached";
    EXPECT_GT(hit_blocks, 500) << "seed " << seed;
    EXPECT_GT(resets_freed, 0) << "seed " << seed;
    EXPECT_GT(registered, 500) << "seed " << seed;
    EXPECT_GT(sim.pager->evictions(), 100u) << "seed " << seed;
    if (offload) {
      EXPECT_GT(sim.pager->offloaded_blocks(), 200u) << "seed " << seed;
      EXPECT_GT(host_hit_blocks, 30) << "seed " << seed;
      EXPECT_GT(sim.pager->host_evictions(), 0u) << "seed " << seed;
    } else {
      EXPECT_EQ(sim.pager->offloaded_blocks(), 0u);
      EXPECT_EQ(host_hit_blocks, 0);
    }
    std::printf("seed %u: %lld blocks from the cache (%lld from the host tier), %llu offloaded\n",
                seed, static_cast<long long>(hit_blocks), static_cast<long long>(host_hit_blocks),
                static_cast<unsigned long long>(sim.pager->offloaded_blocks()));
  }
  // Tails: registered and copied back many times, and so are the first tokens of whole blocks
  // (a system prompt that stops within a block); none under a window.
  std::printf("tails: %lld registered, %lld copied (%lld from whole blocks)\n",
              static_cast<long long>(tails_registered), static_cast<long long>(tails_attached),
              static_cast<long long>(whole_sources));
  if (release) {
    EXPECT_EQ(tails_registered, 0);
    EXPECT_EQ(tails_attached, 0);
  } else {
    EXPECT_GT(tails_attached - whole_sources, 20);
    EXPECT_GT(whole_sources, 20);
  }
}

TEST(KvPagerTest, PrefixCacheRandomOperationsKeepEveryInvariant) {
  PrefixCacheRandomOperations(false);
}

TEST(KvPagerTest, HostPrefixCacheRandomOperationsKeepEveryInvariant) {
  PrefixCacheRandomOperations(true);
}

TEST(KvPagerTest, PrefixCacheWithWindowReleaseKeepsEveryInvariant) {
  PrefixCacheRandomOperations(false, /*release=*/true);
  PrefixCacheRandomOperations(true, /*release=*/true);
}

std::vector<int32_t> RandomTokens(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % 32000);
  return t;
}

KvPagerOptions CacheOptions(int32_t slots, int64_t device_blocks) {
  KvPagerOptions o = Options(slots, device_blocks, 0, 4);
  o.prefix_cache = true;
  return o;
}

// The prefix cache with offload to a host tier of `host_blocks`.
KvPagerOptions OffloadOptions(int32_t slots, int64_t device_blocks, int64_t host_blocks) {
  KvPagerOptions o = CacheOptions(slots, device_blocks);
  o.host_blocks = host_blocks;
  o.host_prefix_cache = true;
  return o;
}

// A match's block ids; its tiers as a string of initials ('d' or 'h').
std::vector<int32_t> Ids(const std::vector<PrefixBlock>& m) {
  std::vector<int32_t> ids;
  for (const PrefixBlock& b : m) ids.push_back(b.block);
  return ids;
}
std::string Tiers(const std::vector<PrefixBlock>& m) {
  std::string s;
  for (const PrefixBlock& b : m) s += b.tier == KvTier::kDevice ? 'd' : 'h';
  return s;
}

// Slot 0 holds `tokens`' first block, registered; slot 1 holds both blocks of `tokens`: its first
// is a twin of slot 0's (not registered), its second registered.
void RegisterTwinChain(KvPager& p, const std::vector<int32_t>& tokens) {
  ASSERT_TRUE(p.Grow(0, kBlockTokens).ok());
  ASSERT_EQ(p.RegisterPrefix(0, absl::MakeConstSpan(tokens).first(kBlockTokens)), 1);
  ASSERT_TRUE(p.Grow(1, 2 * kBlockTokens).ok());
  ASSERT_EQ(p.RegisterPrefix(1, tokens), 1) << "its first block is a twin; its second a child";
}

TEST(KvPagerTest, PrefixCacheSharesFullBlocksAndKeepsThemIdleAfterRelease) {
  KvPager p(CacheOptions(3, 64));
  const std::vector<int32_t> prompt = RandomTokens(100, 1);  // 6 full blocks + 4 tokens
  std::vector<PrefixBlock> match;
  EXPECT_EQ(p.MatchPrefix(prompt, 6, &match), 0);
  ASSERT_TRUE(p.Grow(0, 100).ok());
  EXPECT_EQ(p.RegisterPrefix(0, prompt), 6);
  EXPECT_EQ(p.RegisterPrefix(0, prompt), 0) << "registered once";
  // The same prompt: all six full blocks, the same physical ones; none past max_blocks.
  ASSERT_EQ(p.MatchPrefix(prompt, 6, &match), 6);
  EXPECT_EQ(Ids(match), std::vector<int32_t>(p.Blocks(0).begin(), p.Blocks(0).begin() + 6));
  EXPECT_EQ(p.MatchPrefix(prompt, 4, &match), 4);
  // A prompt that differs in its second block shares only the first; one that differs in its
  // first shares nothing, even where later blocks are equal (the chain decides).
  std::vector<int32_t> second = prompt;
  second[20] ^= 1;
  EXPECT_EQ(p.MatchPrefix(second, 6, &match), 1);
  std::vector<int32_t> first = prompt;
  first[3] ^= 1;
  EXPECT_EQ(p.MatchPrefix(first, 6, &match), 0);
  // Slot 1 attaches the prefix and grows its own tail after it.
  ASSERT_EQ(p.MatchPrefix(prompt, 6, &match), 6);
  p.AttachPrefix(1, match);
  ASSERT_TRUE(p.Grow(1, 100).ok());
  EXPECT_EQ(p.NumBlocks(1), 7);
  EXPECT_NE(p.Blocks(1)[6], p.Blocks(0)[6]) << "the partial block is the slot's own";
  EXPECT_EQ(p.Stats().blocks_used, 7 + 1) << "shared blocks hold their KV once";
  EXPECT_EQ(p.free_device_blocks(), 64 - 8);
  ASSERT_TRUE(p.CheckInvariants().ok()) << p.CheckInvariants();
  p.Release(0);
  EXPECT_EQ(p.idle_cached_blocks(), 0) << "slot 1 still holds them";
  EXPECT_EQ(p.free_device_blocks(), 64 - 7);
  p.Release(1);
  EXPECT_EQ(p.idle_cached_blocks(), 6);
  EXPECT_EQ(p.Stats().blocks_cached, 6);
  EXPECT_EQ(p.Stats().blocks_reserved, 0);
  EXPECT_EQ(p.free_device_blocks(), 64) << "idle cached blocks count as free";
  EXPECT_EQ(p.MatchPrefix(prompt, 6, &match), 6) << "and still match";
  EXPECT_TRUE(p.CheckInvariants().ok()) << p.CheckInvariants();
}

TEST(KvPagerTest, PrefixCacheRegistersABlockWhoseTwinWasEvicted) {
  // Slot 1's first block is a twin of slot 0's (private), its second registered. Slot 0's block
  // is evicted: the chain is cut at its first block until slot 1 registers again (as it does
  // after every chunk and when it ends), its first block taking the twin's place; its second
  // block, keyed by content, was found after either all along.
  KvPager p(CacheOptions(3, 8));
  const std::vector<int32_t> tokens = RandomTokens(2 * kBlockTokens, 8);
  RegisterTwinChain(p, tokens);
  if (HasFatalFailure()) return;
  std::vector<PrefixBlock> match;
  ASSERT_EQ(p.MatchPrefix(tokens, 2, &match), 2);
  p.Release(0);
  ASSERT_TRUE(p.Grow(2, 6 * kBlockTokens).ok());  // every free block and the idle twin
  ASSERT_EQ(p.evictions(), 1u);
  EXPECT_EQ(p.MatchPrefix(tokens, 2, &match), 0);
  EXPECT_EQ(p.RegisterPrefix(1, tokens), 1) << "the first block, in its twin's place";
  ASSERT_EQ(p.MatchPrefix(tokens, 2, &match), 2);
  EXPECT_EQ(Ids(match), p.Blocks(1));
  EXPECT_TRUE(p.CheckInvariants().ok()) << p.CheckInvariants();
}

// Offload, by hand: an evicted history goes to the host tier (one copy per block), a matching
// prompt finds it there, attaching it reports the offload still writing it, and a failed
// offload takes its blocks out of the host cache.
// Shed offloads: evicted blocks are dropped as without offload (nothing copied, nothing on the
// host to match), and counted; offloading resumes when shedding stops.
TEST(KvPagerTest, ShedOffloadsDropsEvictedBlocksInsteadOfCopyingThem) {
  KvPager p(OffloadOptions(3, 12, 16));
  const std::vector<int32_t> first = RandomTokens(6 * kBlockTokens, 5);
  ASSERT_TRUE(p.Grow(0, 6 * kBlockTokens).ok());
  ASSERT_EQ(p.RegisterPrefix(0, first), 6);
  p.Release(0);
  p.ShedOffloads(true);
  ASSERT_TRUE(p.Grow(1, 9 * kBlockTokens).ok());  // 6 free, 3 of the cached blocks evicted
  EXPECT_EQ(p.evictions(), 3u);
  EXPECT_TRUE(p.offload_moves().empty());
  EXPECT_EQ(p.offloaded_blocks(), 0u);
  EXPECT_EQ(p.shed_offloads(), 3u);
  EXPECT_EQ(p.host_cached_blocks(), 0);
  p.ShedOffloads(false);
  ASSERT_TRUE(p.Grow(2, 3 * kBlockTokens).ok());  // the other 3
  EXPECT_EQ(p.evictions(), 6u);
  EXPECT_GT(p.offloaded_blocks(), 0u);
  EXPECT_EQ(p.shed_offloads(), 3u);
  p.OffloadSubmitted(1);
  p.RetireUpTo(1);
  EXPECT_TRUE(p.CheckInvariants().ok()) << p.CheckInvariants();
}

TEST(KvPagerTest, HostPrefixCacheOffloadsOnEvictionAndOnboardsOnAMatch) {
  KvPager p(OffloadOptions(2, 12, 16));
  const std::vector<int32_t> prompt = RandomTokens(100, 5);  // 6 full blocks + 4 tokens
  ASSERT_TRUE(p.Grow(0, 100).ok());
  ASSERT_EQ(p.RegisterPrefix(0, prompt), 6);
  p.Release(0);
  EXPECT_EQ(p.idle_cached_blocks(), 6);
  EXPECT_TRUE(p.offload_moves().empty()) << "nothing copied until a block is evicted";
  // 12 blocks for another history: all six cached blocks go, each copied to the host first.
  ASSERT_TRUE(p.Grow(1, 12 * kBlockTokens).ok());
  EXPECT_EQ(p.evictions(), 6u);
  ASSERT_EQ(p.offload_moves().size(), 6u);
  EXPECT_EQ(p.offloaded_blocks(), 6u);
  std::set<int32_t> sources, dests;
  for (const BlockMove& m : p.offload_moves()) {
    EXPECT_EQ(m.src_tier, KvTier::kDevice);
    EXPECT_EQ(m.dst_tier, KvTier::kHost);
    sources.insert(m.src);
    dests.insert(m.dst);
  }
  EXPECT_EQ(sources.size(), 6u);
  EXPECT_EQ(*dests.rbegin() - *dests.begin(), 5) << "one contiguous host range: one group";
  p.OffloadSubmitted(7);
  EXPECT_EQ(p.host_cached_blocks(), 6);
  ASSERT_TRUE(p.CheckInvariants().ok()) << p.CheckInvariants();
  p.Release(1);

  // The prompt again: nothing on the device, all six on the host; with max_blocks 4, four.
  std::vector<PrefixBlock> match;
  EXPECT_EQ(p.MatchPrefix(prompt, 6, &match, 0, /*host=*/true), 6);
  EXPECT_EQ(Tiers(match), "hhhhhh");
  EXPECT_EQ(p.MatchPrefix(prompt, 6, &match, 0, false), 0) << "host matches only when asked";
  EXPECT_EQ(p.MatchPrefix(prompt, 4, &match, 0, true), 4);
  EXPECT_EQ(p.MatchPrefix(prompt, 6, &match, /*salt=*/9, true), 0) << "salts apply there too";
  ASSERT_EQ(p.MatchPrefix(prompt, 6, &match, 0, true), 6);
  std::vector<BlockMove> moves;
  uint64_t written_at = 0;
  ASSERT_EQ(p.AttachPrefix(0, match, 9, &moves, &written_at), 6);
  EXPECT_EQ(written_at, 7u) << "the offload writing them has not retired";
  ASSERT_EQ(moves.size(), 6u);
  EXPECT_EQ(p.NumBlocks(0), 6);
  for (const BlockMove& m : moves) EXPECT_EQ(m.src_tier, KvTier::kHost);
  ASSERT_TRUE(p.CheckInvariants().ok()) << p.CheckInvariants();
  EXPECT_EQ(p.RegisterPrefix(0, prompt), 0) << "nothing registered while the copies are in flight";

  // The offload failed: its host blocks leave the cache (the onboarding's reads still hold them
  // until their own fence), and nothing matches there any more.
  p.DiscardFailedOffloads({7});
  EXPECT_EQ(p.MatchPrefix(prompt, 6, &match, 0, true), 0);
  ASSERT_TRUE(p.CheckInvariants().ok()) << p.CheckInvariants();
  p.Release(0);
  p.RetireUpTo(9);
  ASSERT_TRUE(p.CheckInvariants().ok()) << p.CheckInvariants();
  EXPECT_EQ(p.free_host_blocks(), 16);
  EXPECT_EQ(p.free_device_blocks(), 12);
}

// An ended history's partly filled last block (RegisterTail) is found after its full blocks by
// a prompt that starts with its first token at least (MatchPrefix's `tail`), and is copied into
// a new block of the prompt's slot (a device-to-device move, the tail held until its fence
// retires) for the tokens they share; a prompt that goes elsewhere finds the full blocks only.
// A tail is registered once, never offloaded, and evicted first of its history.
TEST(KvPagerTest, AnEndedHistorysTailIsCopiedForAPromptThatGoesOnFromIt) {
  KvPager p(OffloadOptions(3, 12, 16));
  const std::vector<int32_t> a = RandomTokens(2 * kBlockTokens + 5, 51);
  ASSERT_TRUE(p.Grow(0, static_cast<int64_t>(a.size()) + 1).ok());
  ASSERT_EQ(p.RegisterPrefix(0, a), 2);
  EXPECT_TRUE(p.RegisterTail(0, a));
  EXPECT_FALSE(p.RegisterTail(0, a)) << "registered already";
  p.Release(0);
  EXPECT_EQ(p.cached_blocks(), 3);
  EXPECT_EQ(p.idle_cached_blocks(), 3);
  ASSERT_TRUE(p.CheckInvariants().ok()) << p.CheckInvariants();

  // a and two more tokens: its full blocks, then the tail's 5 tokens.
  std::vector<int32_t> b = a;
  b.push_back(7);
  b.push_back(8);
  const int32_t max_blocks = static_cast<int32_t>((b.size() - 1) / kBlockTokens);
  std::vector<PrefixBlock> match;
  EXPECT_EQ(p.MatchPrefix(b, max_blocks, &match, 0, true, 0, /*tail=*/true), 2);
  ASSERT_EQ(match.size(), 3u);
  EXPECT_EQ(match[2].tokens, 5);
  EXPECT_EQ(match[2].tier, KvTier::kDevice);
  // The history itself again: the tail's first 4 tokens (its last is left to prefill). A prompt
  // that leaves it within the tail: the tokens before. Without `tail`, one that differs from
  // the tail's first token, or under another salt: no tail.
  std::vector<PrefixBlock> other;
  EXPECT_EQ(p.MatchPrefix(a, 2, &other, 0, true, 0, true), 2);
  ASSERT_EQ(other.size(), 3u);
  EXPECT_EQ(other[2], (PrefixBlock{KvTier::kDevice, match[2].block, 4}));
  std::vector<int32_t> c = b;
  c[2 * kBlockTokens + 3] += 1;
  EXPECT_EQ(p.MatchPrefix(c, max_blocks, &other, 0, true, 0, true), 2);
  ASSERT_EQ(other.size(), 3u);
  EXPECT_EQ(other[2].tokens, 3);
  EXPECT_EQ(p.MatchPrefix(b, max_blocks, &other, 0, true, 0, false), 2);
  EXPECT_EQ(other.size(), 2u);
  c[2 * kBlockTokens] += 1;
  EXPECT_EQ(p.MatchPrefix(c, max_blocks, &other, 0, true, 0, true), 2);
  EXPECT_EQ(other.size(), 2u);
  EXPECT_EQ(p.MatchPrefix(b, max_blocks, &other, /*salt=*/9, true, 0, true), 0);
  EXPECT_TRUE(other.empty());

  // Attached: the full blocks shared, the tail copied into the slot's third block.
  std::vector<BlockMove> moves;
  EXPECT_EQ(p.AttachPrefix(1, match, /*fence=*/4, &moves), 3);
  ASSERT_EQ(moves.size(), 1u);
  EXPECT_EQ(moves[0].src_tier, KvTier::kDevice);
  EXPECT_EQ(moves[0].dst_tier, KvTier::kDevice);
  EXPECT_EQ(moves[0].src, match[2].block);
  ASSERT_EQ(p.NumBlocks(1), 3);
  std::vector<KvRun> runs(4);
  const int32_t n = p.RunTable(1, absl::MakeSpan(runs));
  int32_t last = -1;
  for (int32_t r = 0; r < n; ++r) last = runs[r].first_block + runs[r].num_blocks - 1;
  EXPECT_EQ(moves[0].dst, last);
  EXPECT_NE(moves[0].dst, match[2].block);
  EXPECT_EQ(p.idle_cached_blocks(), 0) << "the full blocks attached, the tail held for its copy";
  ASSERT_TRUE(p.CheckInvariants().ok()) << p.CheckInvariants();
  EXPECT_EQ(p.RegisterPrefix(1, b), 0) << "a move into the slot is in flight";
  p.RetireUpTo(4);
  EXPECT_EQ(p.idle_cached_blocks(), 1) << "the tail, idle again once copied";
  ASSERT_TRUE(p.CheckInvariants().ok()) << p.CheckInvariants();
  // Without moves to plan it the tail is left out.
  std::vector<PrefixBlock> again;
  EXPECT_EQ(p.MatchPrefix(b, max_blocks, &again, 0, true, 0, true), 2);
  ASSERT_EQ(again.size(), 3u);
  EXPECT_EQ(p.AttachPrefix(2, again), 2);
  EXPECT_EQ(p.NumBlocks(2), 2);
  p.Release(2);
  p.Release(1);
  ASSERT_TRUE(p.CheckInvariants().ok()) << p.CheckInvariants();

  // Evicted (the pool taken whole by slot 0): the tail first, and only the full blocks reach
  // the host tier.
  ASSERT_TRUE(p.Grow(0, 12 * kBlockTokens).ok());
  EXPECT_EQ(p.idle_cached_blocks(), 0);
  for (const BlockMove& m : p.offload_moves()) EXPECT_NE(m.src, match[2].block);
  EXPECT_EQ(p.offload_moves().size(), 2u) << "a's two full blocks (b's tail was never cached)";
  p.Release(0);
  ASSERT_TRUE(p.CheckInvariants().ok()) << p.CheckInvariants();
}

// A whole cached block is copied for its first tokens too, to the token: for a prompt sent again
// (the history went on past it, so the block that holds the prompt's end is whole), a prompt
// that stops one token into a block, and a next turn that leaves the history within a block.
// The source is held until the copy's fence, shared with whoever holds it, and stays cached. An
// ended history whose tail is the start of such a block registers no tail of its own.
TEST(KvPagerTest, AWholeBlockIsCopiedForTheTokensAPromptSharesWithIt) {
  KvPager p(OffloadOptions(4, 16, 16));
  // A prompt of 2 blocks and 5 tokens that generated 11 more: three whole blocks, no tail.
  const std::vector<int32_t> h = RandomTokens(3 * kBlockTokens, 71);
  ASSERT_TRUE(p.Grow(0, static_cast<int64_t>(h.size()) + 1).ok());
  ASSERT_EQ(p.RegisterPrefix(0, h), 3);
  const int32_t third = p.Blocks(0)[2];
  std::vector<PrefixBlock> match;
  // Sent again: two blocks, then 4 of the third's tokens (the prompt's last is prefilled).
  const std::vector<int32_t> again(h.begin(), h.begin() + 2 * kBlockTokens + 5);
  EXPECT_EQ(p.MatchPrefix(again, 2, &match, 0, true, 0, true), 2);
  ASSERT_EQ(match.size(), 3u);
  EXPECT_EQ(match[2], (PrefixBlock{KvTier::kDevice, third, 4}));
  EXPECT_FALSE(p.IsTail(third));
  // A prompt of exactly two blocks: the first whole, 15 tokens of the second.
  const std::vector<int32_t> two(h.begin(), h.begin() + 2 * kBlockTokens);
  EXPECT_EQ(p.MatchPrefix(two, 1, &match, 0, true, 0, true), 1);
  ASSERT_EQ(match.size(), 2u);
  EXPECT_EQ(match[1], (PrefixBlock{KvTier::kDevice, p.Blocks(0)[1], kBlockTokens - 1}));
  // A next turn that differs from the history 10 tokens into its third block.
  std::vector<int32_t> turn(h.begin(), h.begin() + 2 * kBlockTokens + 10);
  for (int32_t i = 0; i < 20; ++i) turn.push_back(90000 + i);
  EXPECT_EQ(p.MatchPrefix(turn, 3, &match, 0, true, 0, true), 2);
  ASSERT_EQ(match.size(), 3u);
  EXPECT_EQ(match[2], (PrefixBlock{KvTier::kDevice, third, 10}));

  // Attached while the history still holds the block: the copy's source is held for the move.
  std::vector<BlockMove> moves;
  EXPECT_EQ(p.AttachPrefix(1, match, /*fence=*/3, &moves), 3);
  ASSERT_EQ(moves.size(), 1u);
  EXPECT_EQ(moves[0].src_tier, KvTier::kDevice);
  EXPECT_EQ(moves[0].src, third);
  EXPECT_EQ(moves[0].dst_tier, KvTier::kDevice);
  ASSERT_EQ(p.NumBlocks(1), 3);
  EXPECT_EQ(moves[0].dst, p.Blocks(1)[2]);
  EXPECT_EQ(p.Blocks(1)[0], p.Blocks(0)[0]);
  EXPECT_EQ(p.Blocks(1)[1], p.Blocks(0)[1]);
  ASSERT_TRUE(p.CheckInvariants().ok()) << p.CheckInvariants();
  p.Release(0);
  EXPECT_EQ(p.idle_cached_blocks(), 0) << "two shared with slot 1, the third held for its copy";
  p.RetireUpTo(3);
  EXPECT_EQ(p.idle_cached_blocks(), 1) << "the third, idle and still cached once copied";
  EXPECT_TRUE(p.Registered(third));
  ASSERT_TRUE(p.CheckInvariants().ok()) << p.CheckInvariants();
  // Slot 1 ends 7 tokens into its third block: those are the cached block's first 7 already.
  const std::vector<int32_t> ended(h.begin(), h.begin() + 2 * kBlockTokens + 7);
  ASSERT_TRUE(p.Grow(1, static_cast<int64_t>(ended.size()) + 1).ok());
  EXPECT_EQ(p.RegisterPrefix(1, ended), 0);
  EXPECT_FALSE(p.RegisterTail(1, ended)) << "cached in the whole block";
  p.Release(1);
  EXPECT_EQ(p.cached_blocks(), 3);
  ASSERT_TRUE(p.CheckInvariants().ok()) << p.CheckInvariants();
}

// The index's lists of the blocks after a parent: the longest shared run of leading tokens wins,
// the most recently registered among equals, at most kChildScan of them are compared (the oldest
// past that are not found), and hidden or removed blocks are never returned.
TEST(PrefixIndexTest, LongestChildComparesTheMostRecentBlocksAfterTheParent) {
  constexpr int32_t kBlocks = 64;
  PrefixIndex index;
  index.Init(kBlocks, kBlockTokens, /*enabled=*/true);
  ChainHasher hasher(SipKey{1, 2});
  const Hash128 parent = hasher.Root(0), other = hasher.Root(1);
  auto insert = [&](int32_t b, const Hash128& p, std::vector<int32_t> key) {
    key.resize(kBlockTokens, -1);
    index.Insert(b, p, hasher.Next(p, key.data(), kBlockTokens), key.data(), true);
  };
  insert(0, parent, {5, 6, 7});
  insert(1, parent, {5, 6, 8, 9});
  insert(2, parent, {5, 6, 7, 1});  // the same first three as block 0, registered later
  insert(3, other, {5, 6, 7, 1, 2});
  const std::vector<int32_t> prompt = {5, 6, 7, 1, 2, 3};
  int32_t b = -2;
  EXPECT_EQ(index.LongestChild(parent, prompt.data(), 6, &b), 4);
  EXPECT_EQ(b, 2);
  EXPECT_EQ(index.LongestChild(parent, prompt.data(), 3, &b), 3);
  EXPECT_EQ(b, 2) << "the most recent of those sharing three";
  const std::vector<int32_t> eight = {5, 6, 8, 9, 9};
  EXPECT_EQ(index.LongestChild(parent, eight.data(), 5, &b), 4);
  EXPECT_EQ(b, 1);
  const std::vector<int32_t> none = {4, 6};
  EXPECT_EQ(index.LongestChild(parent, none.data(), 2, &b), 0);
  EXPECT_EQ(b, -1);
  EXPECT_EQ(index.LongestChild(other, prompt.data(), 6, &b), 5) << "by parent";
  EXPECT_EQ(b, 3);
  index.Hide(2);
  EXPECT_EQ(index.LongestChild(parent, prompt.data(), 6, &b), 3);
  EXPECT_EQ(b, 0) << "a hidden block is found by no lookup";
  index.Remove(2);
  index.Remove(0);
  EXPECT_EQ(index.LongestChild(parent, prompt.data(), 6, &b), 2);
  EXPECT_EQ(b, 1);
  EXPECT_EQ(index.CheckChildLists(), "");
  // kChildScan newer blocks after the parent hide the older ones from the scan.
  for (int32_t i = 0; i < PrefixIndex::kChildScan; ++i) insert(10 + i, parent, {7, i});
  EXPECT_EQ(index.LongestChild(parent, eight.data(), 5, &b), 0) << "block 1, past the scan";
  index.Remove(10);
  EXPECT_EQ(index.LongestChild(parent, eight.data(), 5, &b), 4) << "within it again";
  EXPECT_EQ(b, 1);
  EXPECT_EQ(index.CheckChildLists(), "");
}

// A tail is registered only where it can be reused: not for a history that fills its last
// block, nor after blocks it dropped (window release), nor with a move into it in flight.
TEST(KvPagerTest, ATailIsRegisteredOnlyWhereItCanBeReused) {
  KvPager p(OffloadOptions(2, 12, 16));
  const std::vector<int32_t> full = RandomTokens(2 * kBlockTokens, 61);
  ASSERT_TRUE(p.Grow(0, static_cast<int64_t>(full.size()) + 1).ok());
  EXPECT_EQ(p.RegisterPrefix(0, full), 2);
  EXPECT_FALSE(p.RegisterTail(0, full)) << "no partly filled block";
  p.Release(0);
  const std::vector<int32_t> a = RandomTokens(kBlockTokens + 3, 62);
  ASSERT_TRUE(p.Grow(0, 4 * kBlockTokens).ok());
  ASSERT_EQ(p.RegisterPrefix(0, a), 1);  // (its chain hashed: only the drop stops the tail)
  p.DropBlocks(0, 0, 1);
  EXPECT_FALSE(p.RegisterTail(0, a)) << "blocks dropped";
  p.Release(0);
  // Swapped out and back in, the copy back not done yet: its blocks are not written.
  const std::vector<int32_t> w = RandomTokens(2 * kBlockTokens + 7, 64);
  ASSERT_TRUE(p.Grow(0, static_cast<int64_t>(w.size()) + 1).ok());
  ASSERT_EQ(p.RegisterPrefix(0, w), 2);
  std::vector<BlockMove> swap;
  ASSERT_TRUE(p.PlanSwapOut(0, 1, &swap).ok());
  p.RetireUpTo(1);
  ASSERT_TRUE(p.PlanSwapIn(0, 2, &swap).ok());
  EXPECT_FALSE(p.RegisterTail(0, w)) << "a copy into its blocks in flight";
  p.RetireUpTo(2);
  EXPECT_TRUE(p.RegisterTail(0, w));
  p.Release(0);
  ASSERT_TRUE(p.CheckInvariants().ok()) << p.CheckInvariants();
  // A short history: its only block is its tail, found for a prompt that goes on from it.
  const std::vector<int32_t> s = RandomTokens(5, 63);
  ASSERT_TRUE(p.Grow(0, 6).ok());
  EXPECT_EQ(p.RegisterPrefix(0, s), 0);
  EXPECT_TRUE(p.RegisterTail(0, s));
  p.Release(0);
  std::vector<int32_t> longer = s;
  longer.push_back(1);
  std::vector<PrefixBlock> match;
  EXPECT_EQ(p.MatchPrefix(longer, 0, &match, 0, false, 0, true), 0);
  ASSERT_EQ(match.size(), 1u);
  EXPECT_EQ(match[0].tokens, 5);
  std::vector<BlockMove> moves;
  EXPECT_EQ(p.AttachPrefix(1, match, 2, &moves), 1);
  EXPECT_EQ(moves.size(), 1u);
  p.RetireUpTo(2);
  p.Release(1);
  ASSERT_TRUE(p.CheckInvariants().ok()) << p.CheckInvariants();
}

// An ended history's blocks, evicted last block first, are offloaded into a host run in the
// device's order: their copies merge into one transfer group, and so do the copies back.
TEST(KvPagerTest, AnEvictedHistoryIsOffloadedAndBroughtBackInOneGroup) {
  KvPager p(OffloadOptions(2, 12, 16));
  const std::vector<int32_t> a = RandomTokens(6 * kBlockTokens, 71);
  ASSERT_TRUE(p.Grow(0, 6 * kBlockTokens).ok());
  ASSERT_EQ(p.RegisterPrefix(0, a), 6);
  p.Release(0);
  ASSERT_TRUE(p.Grow(1, 12 * kBlockTokens).ok());  // evicts all six
  std::vector<BlockMove> out(p.offload_moves().begin(), p.offload_moves().end());
  ASSERT_EQ(out.size(), 6u);
  std::vector<TransferGroup> groups;
  PlanTransferGroups(absl::MakeSpan(out), &groups);
  EXPECT_EQ(groups.size(), 1u) << "one copy of six blocks";
  p.OffloadSubmitted(1);
  p.RetireUpTo(1);
  p.Release(1);
  std::vector<PrefixBlock> match;
  ASSERT_EQ(p.MatchPrefix(a, 5, &match, 0, /*host=*/true), 5);
  std::vector<BlockMove> back;
  ASSERT_EQ(p.AttachPrefix(0, match, 2, &back), 5);
  ASSERT_EQ(back.size(), 5u);
  groups.clear();
  PlanTransferGroups(absl::MakeSpan(back), &groups);
  EXPECT_EQ(groups.size(), 1u) << "one copy back";
  p.RetireUpTo(2);
  p.Release(0);
  ASSERT_TRUE(p.CheckInvariants().ok()) << p.CheckInvariants();
}

// ResetPrefixCache: no lookup finds anything cached before it, in either tier. Idle blocks are
// free at once (none offloaded); a block a history holds is its own until released, then free
// (not cached, nor counted as such); a host block an offload still writes stays out of the pool
// until evicted.
TEST(KvPagerTest, ResetPrefixCacheForgetsEveryCachedBlock) {
  KvPager p(OffloadOptions(3, 12, 16));
  const std::vector<int32_t> a = RandomTokens(6 * kBlockTokens, 31);
  const std::vector<int32_t> b = RandomTokens(3 * kBlockTokens, 32);
  // a's six blocks offloaded to the host (and submitted, not retired); b's three cached on the
  // device, two of them held by slot 2, which attached them.
  ASSERT_TRUE(p.Grow(0, 6 * kBlockTokens).ok());
  ASSERT_EQ(p.RegisterPrefix(0, a), 6);
  p.Release(0);
  ASSERT_TRUE(p.Grow(1, 12 * kBlockTokens).ok());
  ASSERT_EQ(p.offload_moves().size(), 6u);
  p.OffloadSubmitted(3);
  p.Release(1);
  ASSERT_TRUE(p.Grow(0, 3 * kBlockTokens).ok());
  ASSERT_EQ(p.RegisterPrefix(0, b), 3);
  p.Release(0);
  std::vector<PrefixBlock> match;
  ASSERT_EQ(p.MatchPrefix(b, 2, &match), 2);
  p.AttachPrefix(2, match);
  ASSERT_EQ(p.idle_cached_blocks(), 1);
  ASSERT_EQ(p.MatchPrefix(a, 6, &match, 0, /*host=*/true), 6);
  const uint64_t evictions = p.evictions();

  KvPager::CacheReset freed = p.ResetPrefixCache();
  EXPECT_EQ(freed.device_blocks, 1);
  EXPECT_EQ(freed.host_blocks, 0) << "the offload writing them has not retired";
  EXPECT_EQ(p.idle_cached_blocks(), 0);
  EXPECT_TRUE(p.offload_moves().empty()) << "nothing offloaded";
  EXPECT_EQ(p.evictions(), evictions);
  EXPECT_EQ(p.MatchPrefix(b, 3, &match, 0, true), 0);
  EXPECT_EQ(p.MatchPrefix(a, 6, &match, 0, true), 0);
  EXPECT_EQ(p.NumBlocks(2), 2) << "a running history keeps its blocks";
  EXPECT_EQ(p.free_device_blocks(), 12 - 2);
  ASSERT_TRUE(p.CheckInvariants().ok()) << p.CheckInvariants();
  EXPECT_EQ(p.RegisterPrefix(2, absl::MakeConstSpan(b).first(2 * kBlockTokens)), 0)
      << "not registered again";
  EXPECT_EQ(p.cached_blocks(), 2) << "held: registered, hidden";
  p.Release(2);
  EXPECT_EQ(p.free_device_blocks(), 12);
  EXPECT_EQ(p.cached_blocks(), 0) << "released: freed, not kept idle as cached";
  EXPECT_EQ(p.idle_cached_blocks(), 0);
  EXPECT_EQ(p.MatchPrefix(b, 3, &match, 0, true), 0) << "released, and still not found";
  // Evicting them offloads nothing.
  ASSERT_TRUE(p.Grow(1, 12 * kBlockTokens).ok());
  EXPECT_TRUE(p.offload_moves().empty());
  EXPECT_EQ(p.idle_cached_blocks(), 0);
  p.Release(1);
  // Once the offload retired, a second reset frees the host blocks.
  p.RetireUpTo(3);
  freed = p.ResetPrefixCache();
  EXPECT_EQ(freed.device_blocks, 0);
  EXPECT_EQ(freed.host_blocks, 6);
  EXPECT_EQ(p.host_cached_blocks(), 0);
  EXPECT_EQ(p.free_host_blocks(), 16);
  ASSERT_TRUE(p.CheckInvariants().ok()) << p.CheckInvariants();
  // The cache works as before: a history registered again is found.
  ASSERT_TRUE(p.Grow(0, 3 * kBlockTokens).ok());
  ASSERT_EQ(p.RegisterPrefix(0, b), 3);
  EXPECT_EQ(p.MatchPrefix(b, 3, &match), 3);
  ASSERT_TRUE(p.CheckInvariants().ok()) << p.CheckInvariants();
}

// A history running at a reset caches nothing it wrote before it: not its registered blocks
// (hidden), not its copies of them after a swap-out and back, not the blocks it wrote while
// decoding and had not registered yet. Released, its slot caches again.
TEST(KvPagerTest, AHistoryRunningAtAResetRegistersNothingMore) {
  KvPager p(OffloadOptions(2, 24, 16));
  const std::vector<int32_t> a = RandomTokens(6 * kBlockTokens, 41);
  ASSERT_TRUE(p.Grow(0, 6 * kBlockTokens).ok());
  ASSERT_EQ(p.RegisterPrefix(0, absl::MakeConstSpan(a).first(2 * kBlockTokens)), 2);
  p.ResetPrefixCache();
  // Its decode blocks (2 .. 5), and all of it after a swap-out and back (fresh copies).
  EXPECT_EQ(p.RegisterPrefix(0, a), 0);
  std::vector<BlockMove> moves;
  ASSERT_TRUE(p.PlanSwapOut(0, 1, &moves).ok());
  p.RetireUpTo(1);
  moves.clear();
  ASSERT_TRUE(p.PlanSwapIn(0, 2, &moves).ok());
  p.RetireUpTo(2);
  EXPECT_EQ(p.RegisterPrefix(0, a), 0);
  std::vector<PrefixBlock> match;
  EXPECT_EQ(p.MatchPrefix(a, 6, &match, 0, /*host=*/true), 0);
  ASSERT_TRUE(p.CheckInvariants().ok()) << p.CheckInvariants();
  // Released and used again: cached as before.
  p.Release(0);
  ASSERT_TRUE(p.Grow(0, 6 * kBlockTokens).ok());
  EXPECT_EQ(p.RegisterPrefix(0, a), 6);
  EXPECT_EQ(p.MatchPrefix(a, 6, &match), 6);
  ASSERT_TRUE(p.CheckInvariants().ok()) << p.CheckInvariants();
}

TEST(KvPagerTest, PrefixCacheSaltsKeepNamespacesApart) {
  KvPager p(CacheOptions(3, 64));
  const std::vector<int32_t> prompt = RandomTokens(64, 7);
  ASSERT_TRUE(p.Grow(0, 64).ok());
  ASSERT_EQ(p.RegisterPrefix(0, prompt, /*salt=*/111), 4);
  std::vector<PrefixBlock> match;
  EXPECT_EQ(p.MatchPrefix(prompt, 4, &match, 111), 4);
  EXPECT_EQ(p.MatchPrefix(prompt, 4, &match, 222), 0) << "another tenant's salt";
  EXPECT_EQ(p.MatchPrefix(prompt, 4, &match), 0) << "the default namespace";
  // The same content under another salt is its own chain, in its own blocks.
  ASSERT_TRUE(p.Grow(1, 64).ok());
  EXPECT_EQ(p.RegisterPrefix(1, prompt, 222), 4);
  EXPECT_EQ(p.MatchPrefix(prompt, 4, &match, 222), 4);
  EXPECT_EQ(Ids(match), p.Blocks(1));
  EXPECT_TRUE(p.CheckInvariants().ok()) << p.CheckInvariants();
}

// Content-keyed chains across tiers: a history's first two blocks, released behind its window
// and evicted while it still runs, go to the host tier; the rest stay on the device. A prompt
// with the same tokens takes each block from whichever tier holds it (host, host, then device),
// and attaching it copies the host ones into new device blocks ahead of the shared device ones.
// (Keyed by the block before, the device blocks were unreachable once their parent was evicted.)
TEST(KvPagerTest, PrefixChainsGoOnAcrossTiers) {
  KvPager p(OffloadOptions(3, 12, 16));
  const std::vector<int32_t> a = RandomTokens(6 * kBlockTokens + 3, 21);
  ASSERT_TRUE(p.Grow(0, 6 * kBlockTokens + 3).ok());
  ASSERT_EQ(p.RegisterPrefix(0, a), 6);
  const std::vector<int32_t> first_two(p.Blocks(0).begin(), p.Blocks(0).begin() + 2);
  p.DropBlocks(0, /*sink_blocks=*/0, 2);  // idle now, the oldest in the cache
  const std::vector<int32_t> kept = p.Blocks(0);
  ASSERT_EQ(kept.size(), 5u);
  ASSERT_TRUE(p.Grow(1, 7 * kBlockTokens).ok());  // 5 free blocks and the 2 idle ones
  ASSERT_EQ(p.evictions(), 2u);
  ASSERT_EQ(p.offload_moves().size(), 2u);
  EXPECT_EQ(p.offload_moves()[0].src, first_two[0]);
  EXPECT_EQ(p.offload_moves()[1].src, first_two[1]);
  p.OffloadSubmitted(1);
  p.RetireUpTo(1);

  std::vector<PrefixBlock> match;
  EXPECT_EQ(p.MatchPrefix(a, 6, &match), 0) << "the device tier alone lacks the first block";
  ASSERT_EQ(p.MatchPrefix(a, 6, &match, 0, /*host=*/true), 6);
  EXPECT_EQ(Tiers(match), "hhdddd");
  const std::vector<int32_t> ids = Ids(match);
  EXPECT_EQ(std::vector<int32_t>(ids.begin() + 2, ids.end()),
            std::vector<int32_t>(kept.begin(), kept.begin() + 4));
  EXPECT_EQ(p.MatchPrefix(a, 6, &match, /*salt=*/5, true), 0) << "salts still apart";

  // Slot 2 attaches all six once slot 1 has given its blocks back.
  p.Release(1);
  ASSERT_EQ(p.MatchPrefix(a, 6, &match, 0, true), 6);
  std::vector<BlockMove> moves;
  ASSERT_EQ(p.AttachPrefix(2, match, /*fence=*/2, &moves), 6);
  ASSERT_EQ(moves.size(), 2u);
  ASSERT_EQ(p.NumBlocks(2), 6);
  for (const BlockMove& m : moves) {
    EXPECT_EQ(m.src_tier, KvTier::kHost);
    EXPECT_EQ(m.dst_tier, KvTier::kDevice);
    EXPECT_TRUE(m.dst == p.Blocks(2)[0] || m.dst == p.Blocks(2)[1]);
  }
  EXPECT_EQ(std::vector<int32_t>(p.Blocks(2).begin() + 2, p.Blocks(2).end()),
            std::vector<int32_t>(kept.begin(), kept.begin() + 4))
      << "the device blocks are shared";
  EXPECT_EQ(p.RegisterPrefix(2, a), 0) << "nothing registered while the copies are in flight";
  ASSERT_TRUE(p.CheckInvariants().ok()) << p.CheckInvariants();
  p.RetireUpTo(2);
  EXPECT_EQ(p.RegisterPrefix(2, a), 2) << "the copied blocks join the device index";
  EXPECT_EQ(p.MatchPrefix(a, 6, &match), 6);
  EXPECT_EQ(Tiers(match), "dddddd");
  p.Release(0);
  p.Release(2);
  EXPECT_TRUE(p.CheckInvariants().ok()) << p.CheckInvariants();
  EXPECT_EQ(p.free_device_blocks(), 12);
  EXPECT_EQ(p.free_host_blocks(), 16);
}

// Under a sliding window a prefix hit needs only the blocks within the window of its end (as
// vLLM's sliding-window cache): blocks behind it come back as -1 whether cached or not, and
// attaching counts them as dropped.
TEST(KvPagerTest, AWindowedMatchNeedsOnlyTheBlocksNearItsEnd) {
  KvPagerOptions o = CacheOptions(3, 64);
  constexpr int32_t kWindow = 3 * kBlockTokens + 1;  // a row reads its own block and three more
  o.window = kWindow;
  KvPager p(o);
  const std::vector<int32_t> a = RandomTokens(12 * kBlockTokens, 22);
  // Slot 0 releases its first four blocks before registering anything: only blocks 4-9 are
  // cached.
  ASSERT_TRUE(p.Grow(0, 10 * kBlockTokens).ok());
  p.DropBlocks(0, 0, 4);
  ASSERT_EQ(p.RegisterPrefix(0, absl::MakeConstSpan(a).first(10 * kBlockTokens)), 6);
  std::vector<PrefixBlock> match;
  EXPECT_EQ(p.MatchPrefix(a, 10, &match), 0) << "full attention needs the first block";
  // Ten blocks end at position 160; its window starts at 160 + 1 - 49 = 112: block 7.
  ASSERT_EQ(p.MatchPrefix(a, 10, &match, 0, false, kWindow), 10);
  ASSERT_EQ(match.size(), 10u);
  for (int i = 0; i < 7; ++i) EXPECT_EQ(match[i].block, -1) << i;
  const std::vector<int32_t> ids = Ids(match);
  EXPECT_EQ(std::vector<int32_t>(ids.begin() + 7, ids.end()),
            std::vector<int32_t>(p.Blocks(0).begin() + 3, p.Blocks(0).end()));
  // Nine at most: blocks 6-8 (the window of position 144 starts at 96).
  EXPECT_EQ(p.MatchPrefix(a, 9, &match, 0, false, kWindow), 9);
  EXPECT_EQ(match[5].block, -1);
  EXPECT_GE(match[6].block, 0);
  // Other tokens after block 3: the window of any prefix past 4 blocks reaches back to a block
  // that is not cached, and below that block 0-3 are not cached either.
  std::vector<int32_t> b = a;
  b[5 * kBlockTokens] ^= 1;
  EXPECT_EQ(p.MatchPrefix(b, 10, &match, 0, false, kWindow), 0);

  ASSERT_EQ(p.MatchPrefix(a, 10, &match, 0, false, kWindow), 10);
  ASSERT_EQ(p.AttachPrefix(1, match), 10);
  EXPECT_EQ(p.Dropped(1), 7);
  EXPECT_EQ(p.NumBlocks(1), 3);
  EXPECT_EQ(p.Capacity(1), 10 * kBlockTokens);
  ASSERT_TRUE(p.Grow(1, 11 * kBlockTokens).ok());
  EXPECT_EQ(p.NumBlocks(1), 4);
  EXPECT_EQ(p.RegisterPrefix(1, absl::MakeConstSpan(a).first(11 * kBlockTokens)), 1);
  EXPECT_EQ(p.MatchPrefix(a, 11, &match, 0, false, kWindow), 11);
  ASSERT_TRUE(p.CheckInvariants().ok()) << p.CheckInvariants();
  p.Release(0);
  p.Release(1);
  EXPECT_TRUE(p.CheckInvariants().ok()) << p.CheckInvariants();
  EXPECT_EQ(p.free_device_blocks(), 64);
}

TEST(KvPagerTest, PrefixCacheEvictsLeastRecentlyReleasedTailFirst) {
  KvPager p(CacheOptions(2, 16));
  const std::vector<int32_t> a = RandomTokens(8 * kBlockTokens, 2);
  ASSERT_TRUE(p.Grow(0, 8 * kBlockTokens).ok());
  ASSERT_EQ(p.RegisterPrefix(0, a), 8);
  p.Release(0);
  ASSERT_EQ(p.idle_cached_blocks(), 8);
  // 12 blocks for another history: 8 free, so 4 cached ones go, the last of `a` first.
  ASSERT_TRUE(p.Grow(1, 12 * kBlockTokens).ok());
  EXPECT_EQ(p.evictions(), 4u);
  std::vector<PrefixBlock> match;
  EXPECT_EQ(p.MatchPrefix(a, 8, &match), 4) << "the head of the chain survives";
  EXPECT_TRUE(p.CheckInvariants().ok()) << p.CheckInvariants();
  p.Release(1);
  EXPECT_TRUE(p.CheckInvariants().ok()) << p.CheckInvariants();
}

TEST(KvPagerTest, PrefixCacheNeverRevivesTheChildrenOfAnEvictedBlock) {
  // A block evicted while the block after it stays cached (registered by a history whose own
  // first block was the evicted one's twin), then reused and registered with other content: a
  // history that continues the new content with the old child's tokens must not match the old
  // child (its K/V was computed after the old content; its key hashes every token before it).
  KvPager p(CacheOptions(3, 16));
  const std::vector<int32_t> old = RandomTokens(2 * kBlockTokens, 5);
  RegisterTwinChain(p, old);
  if (HasFatalFailure()) return;
  const int32_t parent = p.Blocks(0)[0];
  std::vector<PrefixBlock> match;
  ASSERT_EQ(p.MatchPrefix(old, 2, &match), 2);
  EXPECT_EQ(Ids(match), (std::vector<int32_t>{parent, p.Blocks(1)[1]}));
  p.Release(0);
  ASSERT_TRUE(p.IdleCached(parent));
  // Slot 2 takes every block: the free ones and the parent, evicted for them.
  ASSERT_TRUE(p.Grow(2, 14 * kBlockTokens).ok());
  ASSERT_EQ(p.evictions(), 1u);
  const std::vector<int32_t>& taken = p.Blocks(2);
  const int64_t j = std::find(taken.begin(), taken.end(), parent) - taken.begin();
  ASSERT_LT(j, 14) << "the parent's space went to slot 2";
  const std::vector<int32_t> mine = RandomTokens(14 * kBlockTokens, 6);
  ASSERT_EQ(p.RegisterPrefix(2, mine), 14);
  // Slot 2's history up to the parent's new content, then the old child's tokens.
  std::vector<int32_t> probe(mine.begin(), mine.begin() + (j + 1) * kBlockTokens);
  probe.insert(probe.end(), old.begin() + kBlockTokens, old.end());
  EXPECT_EQ(p.MatchPrefix(probe, static_cast<int32_t>(j) + 2, &match), j + 1);
  EXPECT_TRUE(p.CheckInvariants().ok()) << p.CheckInvariants();
}

TEST(KvPagerTest, PrefixCacheCompactionEvictsOnlyTheWindowItTakes) {
  // Eight histories of 4 blocks fill the pool and go idle in an order unrelated to where they
  // lie. Two new histories grow a block at a time by turns, each growth evicting the least
  // recently released block (a history's tail first), so each takes every other block: 6 runs
  // of one block. Compaction then needs one free extent for three of them. It evicts the idle
  // blocks of one window only: the window least-recently-released eviction would have freed
  // first, without evicting the older blocks elsewhere that order would have taken on the way.
  KvPager p(CacheOptions(10, 32));
  for (int32_t s = 0; s < 8; ++s) {
    ASSERT_TRUE(p.Grow(s, 4 * kBlockTokens).ok());
    ASSERT_EQ(p.RegisterPrefix(s, RandomTokens(4 * kBlockTokens, 100 + s)), 4);
  }
  for (int32_t s : {5, 2, 7, 0, 3, 6, 1, 4}) p.Release(s);
  ASSERT_EQ(p.idle_cached_blocks(), 32);
  for (int32_t b = 1; b <= 6; ++b) {
    ASSERT_TRUE(p.Grow(8, b * kBlockTokens).ok());
    ASSERT_TRUE(p.Grow(9, b * kBlockTokens).ok());
  }
  ASSERT_EQ(p.evictions(), 12u);
  ASSERT_EQ(p.NumRuns(8), 6);
  std::vector<bool> idle(32);
  for (int32_t b = 0; b < 32; ++b) idle[b] = p.IdleCached(b);
  std::vector<BlockMove> moves;
  ASSERT_TRUE(p.PlanCompaction(8, /*fence=*/1, &moves));
  EXPECT_LE(p.NumRuns(8), 4);
  int32_t lo = 32, hi = -1;
  for (const BlockMove& m : moves) {
    lo = std::min(lo, m.dst);
    hi = std::max(hi, m.dst);
  }
  ASSERT_EQ(hi - lo + 1, static_cast<int32_t>(moves.size())) << "one destination extent";
  int64_t idle_in_window = 0;
  for (int32_t b = lo; b <= hi; ++b) idle_in_window += idle[b];
  EXPECT_EQ(p.evictions(), 12u + idle_in_window) << "nothing evicted outside the window";
  for (int32_t b = 0; b < 32; ++b) {
    if (b < lo || b > hi) EXPECT_EQ(p.IdleCached(b), idle[b]) << b;
  }
  p.RetireUpTo(1);
  EXPECT_TRUE(p.CheckInvariants().ok()) << p.CheckInvariants();
}

TEST(KvPagerTest, GrowsInPlaceAndPlacesPromptsAsOneExtent) {
  KvPager p(Options(4, 256, 0, 4));
  ASSERT_TRUE(p.Grow(0, 100).ok());  // 7 blocks
  EXPECT_EQ(p.NumRuns(0), 1);
  ASSERT_TRUE(p.Grow(1, 200).ok());  // 13 blocks, one extent
  EXPECT_EQ(p.NumRuns(1), 1);
  for (int64_t t = 101; t <= 600; t += 16) ASSERT_TRUE(p.Grow(0, t).ok());
  EXPECT_EQ(p.NumRuns(0), 1) << "growth stays in place while the next block is free";
  for (int64_t t = 201; t <= 600; t += 16) ASSERT_TRUE(p.Grow(1, t).ok());
  ASSERT_TRUE(p.Grow(0, 600).ok());
  ASSERT_TRUE(p.Grow(1, 600).ok());
  EXPECT_EQ(p.NumRuns(0), 1);
  EXPECT_EQ(p.NumRuns(1), 1);
  const KvStats st = p.Stats();
  EXPECT_EQ(st.blocks_used, 2 * p.BlocksFor(600));
  EXPECT_EQ(st.blocks_used + st.blocks_free, 256);
}

TEST(KvPagerTest, ExhaustionIsResourceExhaustedAndChangesNothing) {
  KvPager p(Options(2, 10, 0, 4));
  ASSERT_TRUE(p.Grow(0, 8 * kBlockTokens).ok());
  const absl::Status st = p.Grow(1, 3 * kBlockTokens);
  EXPECT_TRUE(absl::IsResourceExhausted(st)) << st;
  EXPECT_EQ(p.NumBlocks(1), 0);
  EXPECT_EQ(p.free_device_blocks(), 2);
}

// FitsInRuns predicts what Grow does: the k largest free extents, summed (a random free map
// against a brute-force list of free runs; then a Grow of exactly that many blocks on a fresh
// pager with the same holes lands in at most k runs, one more block in more).
TEST(BlockSpaceTest, LargestFreeSumIsTheKLongestFreeRuns) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t n = 1 + static_cast<int64_t>(rng() % 300);
    BlockSpace space(n);
    for (int64_t b = 0; b < n; ++b) {
      if (rng() % 3 == 0) space.Take(b);
    }
    std::vector<int64_t> runs;
    for (int64_t b = 0; b < n;) {
      if (!space.IsFree(b)) {
        ++b;
        continue;
      }
      int64_t e = b;
      while (e < n && space.IsFree(e)) ++e;
      runs.push_back(e - b);
      b = e;
    }
    std::sort(runs.rbegin(), runs.rend());
    // Up to the widest run table: with --kv_max_runs 32 a resume asks for 31 runs.
    for (int32_t k : {0, 1, 2, 3, 4, 5, 6, 17, 31, BlockSpace::kMaxSumRuns}) {
      int64_t want = 0;
      for (int32_t i = 0; i < k && i < static_cast<int32_t>(runs.size()); ++i) want += runs[i];
      ASSERT_EQ(space.LargestFreeSum(k), want) << "trial " << trial << " k " << k;
    }
  }
}

TEST(KvPagerTest, FitsInRunsPredictsHowManyRunsGrowTakes) {
  // Four slots take blocks, then two release theirs: the free space is in several holes.
  auto fragmented = [] {
    auto p = std::make_unique<KvPager>(Options(5, 40, 0, 8));
    EXPECT_TRUE(p->Grow(0, 5 * kBlockTokens).ok());
    EXPECT_TRUE(p->Grow(1, 3 * kBlockTokens).ok());
    EXPECT_TRUE(p->Grow(2, 9 * kBlockTokens).ok());
    EXPECT_TRUE(p->Grow(3, 13 * kBlockTokens).ok());
    p->Release(0);
    p->Release(2);
    return p;
  };
  for (int32_t k = 1; k <= 3; ++k) {
    std::unique_ptr<KvPager> p = fragmented();
    int64_t most = 0;  // the most blocks FitsInRuns promises in k runs
    while (p->FitsInRuns(most + 1, k)) ++most;
    ASSERT_GT(most, 0);
    if (k == 1) EXPECT_LT(most, p->free_device_blocks()) << "the space is in several holes";
    ASSERT_TRUE(p->Grow(4, most * kBlockTokens).ok());
    EXPECT_LE(p->NumRuns(4), k) << most << " blocks";
    std::unique_ptr<KvPager> q = fragmented();
    if (most < q->free_device_blocks()) {
      ASSERT_TRUE(q->Grow(4, (most + 1) * kBlockTokens).ok());
      EXPECT_GT(q->NumRuns(4), k) << most + 1 << " blocks";
    }
  }
}

TEST(KvPagerTest, CompactionMergesTailRunsIntoOneAndHoldsSourcesUntilTheFence) {
  KvPager p(Options(3, 64, 0, 2));
  // Interleave two slots' growth on a pool with holes so slot 0 fragments.
  ASSERT_TRUE(p.Grow(0, 16).ok());
  ASSERT_TRUE(p.Grow(1, 16 * 30).ok());
  ASSERT_TRUE(p.Grow(2, 16 * 30).ok());
  for (int i = 2; i <= 3; ++i) ASSERT_TRUE(p.Grow(0, 16 * i).ok());
  p.Release(1);
  ASSERT_TRUE(p.Grow(0, 16 * 4).ok());
  std::vector<BlockMove> m;
  const int64_t free_before = p.free_device_blocks();
  if (p.NumRuns(0) > 2) {
    ASSERT_TRUE(p.PlanCompaction(0, 7, &m));
    EXPECT_LE(p.NumRuns(0), 2);
    EXPECT_FALSE(m.empty());
    // Sources are not free until fence 7 retires.
    EXPECT_EQ(p.free_device_blocks(), free_before - static_cast<int64_t>(m.size()));
    p.RetireUpTo(6);
    EXPECT_EQ(p.free_device_blocks(), free_before - static_cast<int64_t>(m.size()));
    p.RetireUpTo(7);
    EXPECT_EQ(p.free_device_blocks(), free_before);
  }
  EXPECT_TRUE(p.CheckInvariants().ok());
}

// Window release with the prefix cache: a prompt prefilled chunk by chunk, each chunk's blocks
// registered and then the blocks behind the window dropped (as the engine does), leaves its
// whole chain in the cache: a second history with the same tokens matches every full block,
// the dropped (idle) ones included, as the same physical blocks. Blocks dropped before they were
// registered are lost, but the chain hashes come from the tokens: the blocks after them are
// registered, and found once another history caches those first blocks again.
TEST(KvPagerTest, WindowReleaseGoesOnRegisteringPastTheDroppedBlocks) {
  KvPager p(CacheOptions(3, 64));
  const std::vector<int32_t> prompt = RandomTokens(10 * kBlockTokens + 5, 3);
  std::vector<int32_t> physical;  // logical block -> physical, as slot 0 placed them
  constexpr int64_t kWindowBlocks = 3;
  // Chunks of two blocks, the last one partial (165 tokens: ten full blocks and five tokens).
  for (const int64_t done : {32, 64, 96, 128, 160, 165}) {
    ASSERT_TRUE(p.Grow(0, done).ok());
    for (int64_t j = static_cast<int64_t>(physical.size()) - p.Dropped(0); j < p.NumBlocks(0);
         ++j) {
      physical.push_back(p.Blocks(0)[j]);
    }
    p.RegisterPrefix(0, absl::MakeConstSpan(prompt).first(done));
    const int32_t behind =
        static_cast<int32_t>(std::max<int64_t>(0, done / kBlockTokens - kWindowBlocks));
    p.DropBlocks(0, /*sink_blocks=*/0, std::max(p.Dropped(0), behind));
    ASSERT_LE(p.NumBlocks(0), kWindowBlocks + 1);
    ASSERT_TRUE(p.CheckInvariants().ok());
  }
  ASSERT_EQ(p.Dropped(0), 7);
  ASSERT_EQ(physical.size(), 11u);
  EXPECT_EQ(p.cached_blocks(), 10);
  std::vector<PrefixBlock> match;
  ASSERT_EQ(p.MatchPrefix(prompt, 10, &match), 10);
  EXPECT_EQ(Ids(match), std::vector<int32_t>(physical.begin(), physical.begin() + 10));

  // Slot 1 attaches all ten, drops seven at once (the engine's release after attaching) and goes
  // on: its eleventh block (new tokens) joins the chain after the tenth.
  std::vector<int32_t> longer = prompt;
  longer.resize(12 * kBlockTokens, 17);
  p.AttachPrefix(1, match);
  p.DropBlocks(1, 0, 7);
  ASSERT_TRUE(p.Grow(1, 11 * kBlockTokens).ok());
  EXPECT_EQ(p.RegisterPrefix(1, absl::MakeConstSpan(longer).first(11 * kBlockTokens)), 1);
  EXPECT_EQ(p.MatchPrefix(longer, 11, &match), 11);

  // Slot 2 drops two blocks before registering anything: the four after them are registered,
  // but a lookup must first find the two.
  const std::vector<int32_t> other = RandomTokens(6 * kBlockTokens, 4);
  ASSERT_TRUE(p.Grow(2, 6 * kBlockTokens).ok());
  p.DropBlocks(2, 0, 2);
  EXPECT_EQ(p.RegisterPrefix(2, other), 4);
  EXPECT_EQ(p.MatchPrefix(other, 5, &match), 0);
  // Slot 0 (ended) again, prefilling those two blocks: the chain goes on into slot 2's blocks.
  p.Release(0);
  ASSERT_TRUE(p.Grow(0, 2 * kBlockTokens).ok());
  EXPECT_EQ(p.RegisterPrefix(0, absl::MakeConstSpan(other).first(2 * kBlockTokens)), 2);
  ASSERT_EQ(p.MatchPrefix(other, 6, &match), 6);
  std::vector<int32_t> expected = p.Blocks(0);
  expected.insert(expected.end(), p.Blocks(2).begin(), p.Blocks(2).end());
  EXPECT_EQ(Ids(match), expected);
  p.Release(0);
  p.Release(1);
  p.Release(2);
  EXPECT_TRUE(p.CheckInvariants().ok());
  EXPECT_EQ(p.free_device_blocks(), 64);
}

// A history whose blocks behind the window went idle early (window release) is evicted as any
// released history is, its tail first, once it ends: a later prompt continuing it (the next turn
// of a conversation) still matches its start after growth elsewhere takes a few blocks.
TEST(KvPagerTest, AnEndedWindowReleasedHistoryIsEvictedTailFirst) {
  KvPager p(CacheOptions(2, 16));
  const std::vector<int32_t> history = RandomTokens(12 * kBlockTokens, 7);
  constexpr int32_t kWindowBlocks = 3;
  for (int32_t blocks = 1; blocks <= 12; ++blocks) {  // a block a step, registered as it fills
    ASSERT_TRUE(p.Grow(0, blocks * kBlockTokens).ok());
    p.RegisterPrefix(0, absl::MakeConstSpan(history).first(blocks * kBlockTokens));
    p.DropBlocks(0, 0, std::max(p.Dropped(0), blocks - kWindowBlocks));
  }
  ASSERT_EQ(p.Dropped(0), 9);
  EXPECT_EQ(p.idle_cached_blocks(), 9) << "the blocks behind the window, idle while it ran";
  p.Release(0);
  EXPECT_EQ(p.idle_cached_blocks(), 12);
  // 4 free blocks and 12 idle ones: 8 new blocks evict 4, which must be the history's last.
  ASSERT_TRUE(p.Grow(1, 8 * kBlockTokens).ok());
  EXPECT_EQ(p.evictions(), 4u);
  std::vector<PrefixBlock> match;
  EXPECT_EQ(p.MatchPrefix(history, 12, &match), 8);
  p.Release(1);
  EXPECT_TRUE(p.CheckInvariants().ok());
}

// Under a window the order is the other way round: a later turn needs the blocks near the end
// of its cached prefix (a windowed match), so an ended history is evicted first block first and
// its last window goes last.
TEST(KvPagerTest, UnderAWindowAnEndedHistoryKeepsItsLastWindowLongest) {
  KvPagerOptions o = CacheOptions(2, 16);
  constexpr int32_t kWindow = 3 * kBlockTokens + 1;
  o.window = kWindow;
  KvPager p(o);
  const std::vector<int32_t> history = RandomTokens(12 * kBlockTokens, 7);
  for (int32_t blocks = 1; blocks <= 12; ++blocks) {
    ASSERT_TRUE(p.Grow(0, blocks * kBlockTokens).ok());
    p.RegisterPrefix(0, absl::MakeConstSpan(history).first(blocks * kBlockTokens));
    p.DropBlocks(0, 0, std::max(p.Dropped(0), blocks - 3));
  }
  p.Release(0);
  ASSERT_EQ(p.idle_cached_blocks(), 12);
  // 4 free blocks and 12 idle ones: 12 new blocks evict 8, the history's first eight.
  ASSERT_TRUE(p.Grow(1, 12 * kBlockTokens).ok());
  EXPECT_EQ(p.evictions(), 8u);
  std::vector<PrefixBlock> match;
  EXPECT_EQ(p.MatchPrefix(history, 12, &match), 0) << "full attention needs the first block";
  ASSERT_EQ(p.MatchPrefix(history, 12, &match, 0, false, kWindow), 12) << "blocks 9-11 suffice";
  EXPECT_EQ(match[8].block, -1);
  p.Release(1);
  EXPECT_TRUE(p.CheckInvariants().ok());
}

// Far history: a slot that decodes far past its pool share keeps sinks + window blocks, its run
// table lists the kept blocks in logical order, and every freed block is reusable at once (or,
// the destination of a move in flight, once its fence retires).
TEST(KvPagerTest, DropBlocksBoundsAFarHistorySlot) {
  constexpr int32_t kSinks = 1, kWindow = 3;
  KvPager p(Options(2, 12, 8, 8));
  ASSERT_TRUE(p.Grow(1, 3 * kBlockTokens).ok());  // a neighbour, so holes appear
  int32_t dropped = 0;
  for (int64_t tokens = 1; tokens <= 40 * kBlockTokens; ++tokens) {
    ASSERT_TRUE(p.Grow(0, tokens).ok()) << tokens;
    // The blocks that left the window (summarized) go, as the engine drops them after a step.
    const int32_t current = static_cast<int32_t>((tokens - 1) / kBlockTokens);
    dropped = std::max(dropped, current - kWindow + 1 - kSinks);
    p.DropBlocks(0, kSinks, dropped);
    ASSERT_EQ(p.Dropped(0), dropped);
    ASSERT_LE(p.NumBlocks(0), kSinks + kWindow) << tokens;
    ASSERT_EQ(p.Capacity(0), p.BlocksFor(tokens) * kBlockTokens);
    ASSERT_TRUE(p.CheckInvariants().ok()) << tokens;
  }
  EXPECT_EQ(p.Stats().blocks_used, kSinks + kWindow + 3);  // slot 1 holds 3
  EXPECT_EQ(p.Stats().blocks_free, 12 - (kSinks + kWindow) - 3);
  // A dropped block that is the destination of a move in flight is held until its fence.
  std::vector<BlockMove> moves;
  ASSERT_TRUE(p.PlanSwapOut(0, 5, &moves).ok());
  p.RetireUpTo(5);
  moves.clear();
  ASSERT_TRUE(p.PlanSwapIn(0, 6, &moves).ok());
  EXPECT_EQ(p.Dropped(0), dropped) << "the host tier keeps the slot's summarized count";
  ASSERT_TRUE(p.Grow(0, 41 * kBlockTokens).ok());
  const int64_t free_before = p.free_device_blocks();
  p.DropBlocks(0, kSinks, dropped + 1);
  EXPECT_EQ(p.free_device_blocks(), free_before) << "held for fence 6";
  p.RetireUpTo(6);
  EXPECT_EQ(p.free_device_blocks(), free_before + 1);
  p.Release(0);
  p.Release(1);
  EXPECT_EQ(p.free_device_blocks(), 12);
  EXPECT_EQ(p.Dropped(0), 0);
  EXPECT_TRUE(p.CheckInvariants().ok());
}

TEST(TransferPlanTest, MergesConsecutiveMovesIntoMaximalGroups) {
  std::vector<BlockMove> moves = {
      {KvTier::kDevice, 12, KvTier::kDevice, 42}, {KvTier::kDevice, 10, KvTier::kDevice, 40},
      {KvTier::kDevice, 11, KvTier::kDevice, 41}, {KvTier::kDevice, 13, KvTier::kDevice, 50},
      {KvTier::kDevice, 14, KvTier::kHost, 0},    {KvTier::kDevice, 15, KvTier::kHost, 1},
  };
  std::vector<TransferGroup> groups;
  PlanTransferGroups(absl::MakeSpan(moves), &groups);
  ASSERT_EQ(groups.size(), 3u);
  EXPECT_EQ(groups[0].src_first, 10);
  EXPECT_EQ(groups[0].dst_first, 40);
  EXPECT_EQ(groups[0].num_blocks, 3);
  EXPECT_EQ(groups[1].src_first, 13);
  EXPECT_EQ(groups[1].num_blocks, 1);
  EXPECT_EQ(groups[2].dst_tier, KvTier::kHost);
  EXPECT_EQ(groups[2].num_blocks, 2);
}

// MakeRoomInRuns evicts only when evicting can make the room: with the free space cut up by
// blocks in use, a request that would not fit with every idle block gone leaves the cache alone
// (a paused request retries this every step).
// Growth into a pool of idle cached blocks evicts the least recently released ones it needs
// before placing any: they are placed as the extents they form (a released history's blocks
// lie together), not one run per block as evicting each while placing did (a history goes idle
// tail first, so each evicted block lay before the one just placed).
TEST(KvPagerTest, GrowthIntoIdleBlocksTakesThemAsTheExtentsTheyForm) {
  // A run table wide enough for one run per block: nothing but the order of eviction and
  // placement keeps the growth in few runs.
  KvPagerOptions o = CacheOptions(9, 32);
  o.max_runs = 16;
  KvPager p(o);
  for (int32_t s = 0; s < 8; ++s) {
    ASSERT_TRUE(p.Grow(s, 4 * kBlockTokens).ok());
    ASSERT_EQ(p.RegisterPrefix(s, RandomTokens(4 * kBlockTokens, 100 + s)), 4);
  }
  // The 12 least recently released: histories 5, 2 and 7, each one extent.
  std::vector<int32_t> want;
  for (int32_t s : {5, 2, 7}) {
    ASSERT_EQ(p.NumRuns(s), 1);
    want.insert(want.end(), p.Blocks(s).begin(), p.Blocks(s).end());
  }
  std::sort(want.begin(), want.end());
  for (int32_t s : {5, 2, 7, 0, 3, 6, 1, 4}) p.Release(s);
  ASSERT_TRUE(p.Grow(8, 12 * kBlockTokens).ok());
  EXPECT_EQ(p.evictions(), 12u);
  EXPECT_LE(p.NumRuns(8), 3);
  std::vector<int32_t> blocks = p.Blocks(8);
  std::sort(blocks.begin(), blocks.end());
  EXPECT_EQ(blocks, want);
  EXPECT_TRUE(p.CheckInvariants().ok()) << p.CheckInvariants();
}

// A pool of `blocks` blocks each held by a one-block history: slot i (1..blocks) at block
// blocks - i (a hinted run goes to the end of the extent it fits), so that releasing slots cuts
// holes exactly where a test wants them. Slot 0 is free.
std::unique_ptr<KvPager> SinglesPool(int64_t blocks, int32_t runs) {
  auto p = std::make_unique<KvPager>(Options(static_cast<int32_t>(blocks) + 1, blocks, 0, runs));
  for (int32_t i = 1; i <= blocks; ++i) {
    p->ExpectTokens(i, kBlockTokens);
    EXPECT_TRUE(p->Grow(i, kBlockTokens).ok());
    EXPECT_EQ(p->Blocks(i).front(), blocks - i);
  }
  return p;
}
void FreeBlocks(KvPager& p, int64_t blocks, int64_t from, int64_t to) {
  for (int64_t b = from; b < to; ++b) p.Release(static_cast<int32_t>(blocks - b));
}

// A history whose end is expected (ExpectTokens) goes to the shortest free extent that holds
// all of it, at that extent's end, and grows there in place to its end: one run. Another
// history's growth room (the free blocks after its last run, up to its expected end) is not
// taken. Without a hint, the largest extent, as before.
TEST(KvPagerTest, AnExpectedHistoryGoesToTheShortestExtentThatHoldsIt) {
  constexpr int64_t kBlocks = 120;
  std::unique_ptr<KvPager> pool = SinglesPool(kBlocks, 4);
  KvPager& p = *pool;
  // Holes of 50, 40 and 10 blocks.
  FreeBlocks(p, kBlocks, 0, 50);
  FreeBlocks(p, kBlocks, 55, 95);
  FreeBlocks(p, kBlocks, 100, 110);
  // Slot 0: a 5-block prompt, 25 blocks expected: the 40-block hole, at its end.
  p.ExpectTokens(0, 25 * kBlockTokens);
  ASSERT_TRUE(p.Grow(0, 5 * kBlockTokens).ok());
  EXPECT_EQ(p.Blocks(0).front(), 70);
  for (int64_t t = 5 * kBlockTokens + 1; t <= 25 * kBlockTokens; ++t) {
    ASSERT_TRUE(p.Grow(0, t).ok());
  }
  EXPECT_EQ(p.NumRuns(0), 1) << "grown in place to its expected end";
  p.Release(0);
  // 45 expected: the 50-block hole, from block 5. Then a history of 38 expected: the 40 blocks
  // after slot 0's prompt, [10, 50), are the shortest extent that holds it, but they are slot 0's
  // growth room; the 40-block hole [55, 95) is not anyone's.
  p.ExpectTokens(0, 45 * kBlockTokens);
  ASSERT_TRUE(p.Grow(0, 5 * kBlockTokens).ok());
  EXPECT_EQ(p.Blocks(0).front(), 5);
  const int32_t other = static_cast<int32_t>(kBlocks);  // held block 0, released above
  p.ExpectTokens(other, 38 * kBlockTokens);
  ASSERT_TRUE(p.Grow(other, 2 * kBlockTokens).ok());
  EXPECT_EQ(p.Blocks(other).front(), 95 - 38) << "not 50 - 38: that is slot 0's room";
  for (int64_t t = 5 * kBlockTokens + 1; t <= 45 * kBlockTokens; ++t) {
    ASSERT_TRUE(p.Grow(0, t).ok());
  }
  EXPECT_EQ(p.NumRuns(0), 1);
  p.Release(0);
  // No hint: the largest extent ([0, 50) again, from its start at the pool's start).
  p.ExpectTokens(0, 0);
  ASSERT_TRUE(p.Grow(0, 5 * kBlockTokens).ok());
  EXPECT_EQ(p.Blocks(0).front(), 0);
  EXPECT_TRUE(p.CheckInvariants().ok()) << p.CheckInvariants();
}

// With the pool full of idle cached blocks, an expected history evicts the least recently
// released of them until one extent holds the rest of it, and then grows in place: one run
// each for two histories growing by turns, where growth a block at a time took each block
// wherever one was evicted (six runs each).
TEST(KvPagerTest, AnExpectedHistoryEvictsIdleBlocksForOneExtent) {
  KvPager p(CacheOptions(10, 32));
  for (int32_t s = 0; s < 8; ++s) {
    ASSERT_TRUE(p.Grow(s, 4 * kBlockTokens).ok());
    ASSERT_EQ(p.RegisterPrefix(s, RandomTokens(4 * kBlockTokens, 100 + s)), 4);
  }
  for (int32_t s : {5, 2, 7, 0, 3, 6, 1, 4}) p.Release(s);
  p.ExpectTokens(8, 12 * kBlockTokens);
  p.ExpectTokens(9, 12 * kBlockTokens);
  for (int32_t b = 1; b <= 12; ++b) {
    ASSERT_TRUE(p.Grow(8, b * kBlockTokens).ok());
    ASSERT_TRUE(p.Grow(9, b * kBlockTokens).ok());
  }
  EXPECT_EQ(p.NumRuns(8), 1);
  EXPECT_EQ(p.NumRuns(9), 1);
  EXPECT_GE(p.evictions(), 24u);
  EXPECT_TRUE(p.CheckInvariants().ok()) << p.CheckInvariants();
}

// Room that only another history's growth room could make is not made: no idle block is
// evicted for it beyond what the growth itself takes.
TEST(KvPagerTest, AnExpectedHistoryEvictsNothingForRoomThatIsClaimed) {
  KvPager p(CacheOptions(5, 100));
  ASSERT_TRUE(p.Grow(0, 10 * kBlockTokens).ok());  // [0, 10): the pool's start
  p.ExpectTokens(3, 30 * kBlockTokens);
  ASSERT_TRUE(p.Grow(3, 30 * kBlockTokens).ok());  // [70, 100)
  p.ExpectTokens(1, 60 * kBlockTokens);
  ASSERT_TRUE(p.Grow(1, 60 * kBlockTokens).ok());  // [10, 70)
  ASSERT_EQ(p.Blocks(1).front(), 10);
  ASSERT_EQ(p.RegisterPrefix(1, RandomTokens(60 * kBlockTokens, 7)), 60);
  ASSERT_EQ(p.RegisterPrefix(3, RandomTokens(30 * kBlockTokens, 8)), 30);
  p.Release(1);  // all 90 idle, slot 1's tail the oldest
  p.Release(3);
  p.ExpectTokens(0, 60 * kBlockTokens);  // slot 0's room: [10, 60)
  // 45 expected: [60, 100) is 40 blocks, so only slot 0's room could hold it.
  p.ExpectTokens(2, 45 * kBlockTokens);
  ASSERT_TRUE(p.Grow(2, 5 * kBlockTokens).ok());
  EXPECT_EQ(p.evictions(), 5u) << "the 5 blocks the growth takes, no more";
  for (int32_t b : p.Blocks(2)) EXPECT_GE(b, 60) << "not in slot 0's room";
  EXPECT_EQ(p.idle_cached_blocks(), 85);
  EXPECT_TRUE(p.CheckInvariants().ok()) << p.CheckInvariants();
}

// Slot 0 in three runs of two blocks, [2,4) [10,12) [20,22), with the table two wide. Where the
// free blocks right after a run can take the next run, only that one moves (two blocks); where
// no free extent takes any two runs, the whole history moves into the two largest extents
// (device to device) instead of failing (and pausing it to the host tier and back).
TEST(KvPagerTest, CompactionMovesARunNextToItsNeighbourOrTheWholeHistory) {
  constexpr int64_t kBlocks = 40;
  auto three_runs = [&](KvPager& p) {
    FreeBlocks(p, kBlocks, 2, 4);
    FreeBlocks(p, kBlocks, 10, 12);
    FreeBlocks(p, kBlocks, 20, 22);
    for (int32_t b = 1; b <= 6; ++b) ASSERT_TRUE(p.Grow(0, b * kBlockTokens).ok());
    ASSERT_EQ(p.Blocks(0), (std::vector<int32_t>{2, 3, 10, 11, 20, 21}));
  };
  {
    std::unique_ptr<KvPager> pool = SinglesPool(kBlocks, 2);
    KvPager& p = *pool;
    three_runs(p);
    if (HasFatalFailure()) return;
    FreeBlocks(p, kBlocks, 12, 14);  // right after the second run
    std::vector<BlockMove> m;
    ASSERT_TRUE(p.PlanCompaction(0, 1, &m));
    EXPECT_EQ(m.size(), 2u);
    EXPECT_EQ(p.Blocks(0), (std::vector<int32_t>{2, 3, 10, 11, 12, 13}));
    EXPECT_EQ(p.NumRuns(0), 2);
    p.RetireUpTo(1);
    EXPECT_TRUE(p.CheckInvariants().ok()) << p.CheckInvariants();
  }
  {
    std::unique_ptr<KvPager> pool = SinglesPool(kBlocks, 2);
    KvPager& p = *pool;
    three_runs(p);
    if (HasFatalFailure()) return;
    FreeBlocks(p, kBlocks, 30, 33);  // two 3-block extents: no two runs fit either
    FreeBlocks(p, kBlocks, 35, 38);
    std::vector<BlockMove> m;
    ASSERT_TRUE(p.PlanCompaction(0, 1, &m));
    EXPECT_EQ(m.size(), 6u);
    EXPECT_EQ(p.Blocks(0), (std::vector<int32_t>{30, 31, 32, 35, 36, 37}));
    EXPECT_EQ(p.NumRuns(0), 2);
    p.RetireUpTo(1);
    EXPECT_EQ(p.free_device_blocks(), 6) << "the sources are free once the copies retire";
    EXPECT_TRUE(p.CheckInvariants().ok()) << p.CheckInvariants();
  }
}

TEST(KvPagerTest, MakeRoomInRunsKeepsTheCacheWhenEvictingCannotHelp) {
  KvPagerOptions o = Options(/*slots=*/4, /*device_blocks=*/16, /*host_blocks=*/0, /*runs=*/2);
  o.prefix_cache = true;
  KvPager p(o);
  ASSERT_TRUE(p.Grow(0, kBlockTokens).ok());
  ASSERT_TRUE(p.Grow(1, kBlockTokens).ok());
  ASSERT_TRUE(p.Grow(2, kBlockTokens).ok());
  ASSERT_TRUE(p.Grow(3, 3 * kBlockTokens).ok());
  std::vector<int32_t> tokens(3 * kBlockTokens);
  for (int i = 0; i < 3 * kBlockTokens; ++i) tokens[i] = i + 1;
  ASSERT_EQ(p.RegisterPrefix(3, tokens), 3);
  p.Release(3);
  ASSERT_EQ(p.idle_cached_blocks(), 3);
  ASSERT_EQ(p.free_device_blocks(), 13);
  // More than the free and idle blocks together: no eviction can help.
  EXPECT_FALSE(p.MakeRoomInRuns(14, 2));
  EXPECT_EQ(p.cached_blocks(), 3);
  EXPECT_EQ(p.evictions(), 0u);
  // Every size up to 13 in one or two runs: either it fits with what eviction frees (and then it
  // does fit), or it fails having evicted nothing.
  for (int32_t runs : {1, 2}) {
    for (int64_t blocks = 1; blocks <= 13; ++blocks) {
      const int64_t cached = p.cached_blocks();
      if (p.MakeRoomInRuns(blocks, runs)) {
        EXPECT_TRUE(p.FitsInRuns(blocks, runs)) << blocks << " in " << runs;
      } else {
        EXPECT_EQ(p.cached_blocks(), cached) << blocks << " in " << runs;
      }
      ASSERT_TRUE(p.CheckInvariants().ok());
    }
  }
  // And it evicts where that makes the room: all 13 in four runs fit once the idle blocks are
  // gone (the three slots' blocks cut the space into at most four stretches).
  EXPECT_EQ(p.MakeRoomInRuns(13, 4), true);
  EXPECT_EQ(p.cached_blocks(), 0);
}

}  // namespace
}  // namespace kvrm
