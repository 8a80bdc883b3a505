// The KV-RM pager: owns the block pool of both tiers and maps each slot's logical blocks to
// physical blocks, keeping every history in as few physically contiguous runs as it can.
//
// Owner: the engine thread (no locking). Placement policy (extent style):
//  - grow in place: a slot's next block is the one right after its last, when that is free;
//  - a new run (a new prompt, or growth that cannot stay in place) goes in the middle of the
//    largest free extent, leaving room both for the left neighbour and for itself to grow;
//  - when a slot has more than max_runs runs, PlanCompaction moves its tail runs into one extent.
// Blocks that are the source of a planned move stay allocated until the transport's fence for
// that move completes (RetireUpTo), so no one can be given a block still being copied.
//
// Prefix cache (KvPagerOptions::prefix_cache; what vLLM calls automatic prefix caching, on the
// pager's blocks): a full device block whose K/V is final can be registered under its tokens and
// its parent (the block before it in the history, itself registered), so that a later history
// starting with the same tokens attaches the block instead of prefilling those tokens again.
// Device blocks are reference counted (slots holding them, moves reading them); a registered
// block that nobody holds stays in the cache, idle, until its space is wanted (least recently
// released first), and counts as free to everyone asking for room. Registered blocks are never
// written again: a history only writes past its attached blocks (the engine matches at most the
// blocks before the one holding a prompt's last token), and a compaction or swap of a shared
// block copies it out and leaves the original where it is.
#ifndef KVRM_RUNTIME_KV_PAGER_H_
#define KVRM_RUNTIME_KV_PAGER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "runtime/block_space.h"
#include "runtime/kv_allocator.h"
#include "runtime/transfer_plan.h"

namespace kvrm {

struct KvPagerOptions {
  int32_t num_slots = 0;
  int64_t device_blocks = 0;
  int64_t host_blocks = 0;
  int32_t block_tokens = 16;
  int32_t max_runs = 8;
  int32_t max_blocks_per_slot = 0;  // ceil(max_context / block_tokens)
  int64_t bytes_per_block = 0;
  bool prefix_cache = false;
};

class KvPager final : public KvAllocator {
 public:
  explicit KvPager(const KvPagerOptions& options);

  // KvAllocator.
  absl::Status Grow(int32_t slot, int64_t num_tokens) override;
  void Release(int32_t slot) override;
  int32_t RunTable(int32_t slot, absl::Span<KvRun> runs) const override;
  int64_t Capacity(int32_t slot) const override;
  KvStats Stats() const override;

  // Blocks a history of `num_tokens` needs.
  int64_t BlocksFor(int64_t num_tokens) const {
    return (num_tokens + options_.block_tokens - 1) / options_.block_tokens;
  }
  // Free device blocks, idle cached ones included (they are evicted when the space is taken).
  int64_t free_device_blocks() const { return device_.free_count() + idle_count_; }
  // Whether `blocks` new device blocks would land in at most `runs` runs now (Grow takes the
  // largest free extents first).
  bool FitsInRuns(int64_t blocks, int32_t runs) const {
    return device_.LargestFreeSum(runs) >= blocks;
  }
  // FitsInRuns, evicting idle cached blocks (least recently released first) until it holds or
  // none are left. (Growth itself evicts only when no block is free: a cached block saves a
  // block's prefill, worth far more than the run it may cost, which compaction merges.)
  bool MakeRoomInRuns(int64_t blocks, int32_t runs);

  // Prefix cache (all no-ops returning 0 when options.prefix_cache is off).
  // The longest chain of registered blocks holding tokens[0, n * block_tokens), n <= max_blocks:
  // writes their ids to `out` (cleared first) and returns n.
  // `salt` namespaces the cache (requests share only under the same salt; 0: the default).
  int32_t MatchPrefix(absl::Span<const int32_t> tokens, int32_t max_blocks,
                      std::vector<int32_t>* out, uint64_t salt = 0) const;
  // Makes `blocks` (a MatchPrefix result) the first blocks of `slot`, which must hold none.
  void AttachPrefix(int32_t slot, absl::Span<const int32_t> blocks);
  // Registers the slot's full blocks holding tokens[0, tokens.size() / block_tokens *
  // block_tokens), whose K/V the caller has written. A block whose content is registered under
  // another block already (its twin) stays private and the blocks after it are registered as the
  // twin's children; a registered block whose chain is gone (its twin was evicted) moves to this
  // chain's key. Registers nothing while a move into the slot's blocks is in flight or for a
  // far-history or host-tier slot. Returns the blocks newly registered.
  int32_t RegisterPrefix(int32_t slot, absl::Span<const int32_t> tokens, uint64_t salt = 0);
  // Whether a block is registered and held by no one (attaching it takes it out of the free
  // count).
  bool IdleCached(int32_t block) const { return cached_[block] && refs_[block] == 0; }
  bool Registered(int32_t block) const { return cached_[block] != 0; }
  int64_t idle_cached_blocks() const { return idle_count_; }
  int64_t cached_blocks() const { return cached_count_; }
  uint64_t evictions() const { return evictions_; }
  int64_t free_host_blocks() const { return host_.free_count(); }
  int32_t NumRuns(int32_t slot) const { return static_cast<int32_t>(slots_[slot].runs.size()); }
  int64_t NumBlocks(int32_t slot) const { return static_cast<int64_t>(slots_[slot].blocks.size()); }
  bool OnHost(int32_t slot) const { return slots_[slot].tier == KvTier::kHost; }
  const std::vector<int32_t>& Blocks(int32_t slot) const { return slots_[slot].blocks; }

  // Far-history summaries: frees the slot's kept blocks right after its first `sink_blocks` until
  // `dropped` logical blocks after the sinks are gone in all (their summaries replace them). The
  // run table then lists logical blocks [0, sink_blocks) and [sink_blocks + dropped, ...); Grow
  // counts the dropped blocks as held. A block that is the destination of a move in flight is
  // freed when that move's fence retires. Only for a slot in the device tier.
  void DropBlocks(int32_t slot, int32_t sink_blocks, int32_t dropped);
  int32_t Dropped(int32_t slot) const { return slots_[slot].dropped; }

  // When `slot` has more than max_runs runs: moves its tail runs into one free extent, appends
  // the block moves to `moves`, points the slot at the destinations and holds the sources until
  // `fence` retires. Returns false when no extent can take them (the slot keeps its runs).
  bool PlanCompaction(int32_t slot, uint64_t fence, std::vector<BlockMove>* moves);
  // Moves every block of `slot` to the host tier (pausing it). RESOURCE_EXHAUSTED when the host
  // tier has no room.
  absl::Status PlanSwapOut(int32_t slot, uint64_t fence, std::vector<BlockMove>* moves);
  // Moves a paused slot back to the device tier. RESOURCE_EXHAUSTED when there is no room.
  absl::Status PlanSwapIn(int32_t slot, uint64_t fence, std::vector<BlockMove>* moves);
  // Frees the sources of every move whose fence is <= `completed`.
  void RetireUpTo(uint64_t completed);
  // Source blocks still waiting for their fence.
  int64_t pending_blocks() const { return static_cast<int64_t>(pending_.size()); }

  // Full consistency check (tests, DCHECK builds): every block owned at most once, free +
  // owned + pending = total per tier, run tables consistent with block lists.
  absl::Status CheckInvariants() const;

 private:
  struct SlotKv {
    KvTier tier = KvTier::kDevice;
    std::vector<int32_t> blocks;  // logical -> physical; capacity reserved at start-up
    std::vector<KvRun> runs;      // maximal physically contiguous stretches of `blocks`
    int64_t tokens = 0;
    int32_t dropped = 0;      // far history: logical blocks after the sinks no longer held
    uint64_t last_fence = 0;  // fence of the latest move into this slot's blocks
  };
  struct Pending {
    uint64_t fence;
    KvTier tier;
    int32_t block;
  };

  // Device block references: a new block starts at 1 (NewRef); Unref frees it at 0, or leaves a
  // registered one idle in the cache.
  void NewRef(int32_t block) { refs_[block] = 1; }
  void Ref(int32_t block);
  void Unref(int32_t block);
  // Gives back a block of `tier` that was held (device: one reference).
  void Drop(KvTier tier, int32_t block);
  // Enters / removes a registered block's key in the hash table.
  void Link(int32_t block, int32_t parent, uint64_t parent_gen, const int32_t* tokens);
  void Unlink(int32_t block);
  // Removes an idle cached block from the cache and frees it.
  void Evict(int32_t block);
  bool EvictOldest();
  // Frees `length` contiguous device blocks, each free or idle cached, by evicting the idle
  // ones: the window least-recently-released eviction would free first (its most recently
  // released block the earliest of all windows'), without evicting the older blocks elsewhere
  // that order would take on the way; of equals, the one with the fewest idle blocks. O(device
  // blocks). False (nothing evicted) when no such window exists.
  bool EvictWindow(int64_t length);
  void IdlePush(int32_t block);
  void IdleRemove(int32_t block);
  // The hash-table bucket of a key. A key's parent is (block, its generation), or (-1, the salt)
  // for a history's first block.
  size_t Bucket(int32_t parent, uint64_t parent_gen, const int32_t* tokens) const;
  // The registered block with this key, or -1.
  int32_t Find(int32_t parent, uint64_t parent_gen, const int32_t* tokens) const;
  // Takes one new extent of up to `want` blocks (at least 1) for a new run, mid-largest-extent.
  Extent TakeNewRun(BlockSpace& space, int64_t want);
  void Append(SlotKv& s, int32_t block);
  static void RebuildRuns(SlotKv& s);

  const KvPagerOptions options_;
  BlockSpace device_;
  BlockSpace host_;
  std::vector<SlotKv> slots_;
  std::vector<Pending> pending_;  // capacity reserved at start-up
  uint64_t retired_ = 0;          // highest fence passed to RetireUpTo
  // Per device block: holders (slots and pending moves), and the prefix cache's entry: whether
  // it is registered, its key (parent block, the parent's generation, its tokens), its
  // generation (bumped on eviction, so that a child registered under an evicted parent never
  // matches the block's next content), the hash chain and the idle list (oldest first).
  std::vector<int32_t> refs_;
  int64_t shared_refs_ = 0;  // sum over blocks of refs - 1 where refs > 1
  std::vector<uint8_t> cached_;
  std::vector<int32_t> key_parent_;
  std::vector<uint64_t> key_parent_gen_;  // a root's: the salt
  std::vector<uint32_t> gen_;
  std::vector<int32_t> key_tokens_;  // [device_blocks][block_tokens]
  std::vector<int32_t> buckets_;     // hash -> first block, -1: none
  std::vector<int32_t> bucket_next_;
  std::vector<int32_t> idle_prev_, idle_next_;
  std::vector<uint64_t> idle_stamp_;  // when each idle block was released (idle_clock_)
  uint64_t idle_clock_ = 0;
  int32_t idle_head_ = -1, idle_tail_ = -1;
  int64_t idle_count_ = 0;
  int64_t cached_count_ = 0;
  uint64_t evictions_ = 0;
  std::vector<int64_t> window_ring_;  // EvictWindow's deque, sized at start-up
};

}  // namespace kvrm

#endif  // KVRM_RUNTIME_KV_PAGER_H_
