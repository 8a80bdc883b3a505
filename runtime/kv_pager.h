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
#ifndef KVRM_RUNTIME_KV_PAGER_H_
#define KVRM_RUNTIME_KV_PAGER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
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
  int64_t free_device_blocks() const { return device_.free_count(); }
  // Whether `blocks` new device blocks would land in at most `runs` runs now (Grow takes the
  // largest free extents first).
  bool FitsInRuns(int64_t blocks, int32_t runs) const {
    return device_.LargestFreeSum(runs) >= blocks;
  }
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

  BlockSpace& Space(KvTier t) { return t == KvTier::kDevice ? device_ : host_; }
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
};

}  // namespace kvrm

#endif  // KVRM_RUNTIME_KV_PAGER_H_
