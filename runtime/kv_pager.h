// The KV-RM pager: owns the block pool of both tiers and maps each slot's logical blocks to
// physical blocks, keeping every history in as few physically contiguous runs as it can.
//
// Owner: the engine thread (no locking). Placement policy (extent style):
//  - grow in place: a slot's next block is the one right after its last, when that is free;
//  - a new run (a new prompt, or growth that cannot stay in place) of a history whose expected
//    end is known (ExpectTokens) goes at the end of the shortest free extent that holds all of
//    the rest outside other histories' growth room (best fit), so that it grows in place to its
//    end; with none, idle cached blocks are evicted (least recently released first) for one;
//  - otherwise, or when no extent holds that, in the middle of the largest free extent, leaving
//    room both for the left neighbour and for itself to grow;
//  - when a slot has more than max_runs runs, PlanCompaction moves the fewest blocks it can: a
//    run next to its neighbour, a window of runs into one extent, or the whole history.
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
//
// Offload to the host tier (KvPagerOptions::host_prefix_cache; what vLLM calls KV offloading
// and TensorRT-LLM secondary offloading): a device block evicted from the cache is first copied
// to a host block, with every ancestor in its chain that has no host copy yet (so the host keeps
// whole chains), and registered there under the same tokens in a second index over the host
// tier. MatchPrefix goes on in the host index where the device chain ends; OnboardPrefix gives
// the slot new device blocks for those and copies them back. The host tier is shared with
// paused requests, which evict cached host blocks (least recently used first) when they need
// room. An offload copy reads a device block that is free again as soon as it is planned: the
// engine submits offloads as their own batch ahead of everything planned after them, and every
// step waits for every batch submitted before it, so no one can write the block first.
#ifndef KVRM_RUNTIME_KV_PAGER_H_
#define KVRM_RUNTIME_KV_PAGER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "runtime/block_space.h"
#include "runtime/kv_allocator.h"
#include "runtime/prefix_index.h"
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
  // Offload evicted cache blocks to the host tier and bring them back on a hit (needs
  // prefix_cache and host_blocks > 0).
  bool host_prefix_cache = false;
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

  // Where `slot`'s history is expected to end (its prompt plus the tokens it may generate; 0:
  // unknown), a placement hint that reserves nothing: a new run goes into the shortest free
  // extent that holds the whole expected rest, so that the history grows in place to its end
  // (one run, where placing each new block in the largest extent split that extent at every
  // turn and left the pool in holes too small for the run table). Kept until set again.
  void ExpectTokens(int32_t slot, int64_t num_tokens) { slots_[slot].expected_tokens = num_tokens; }

  // Blocks a history of `num_tokens` needs.
  int64_t BlocksFor(int64_t num_tokens) const {
    return (num_tokens + options_.block_tokens - 1) / options_.block_tokens;
  }
  // Free device blocks, idle cached ones included (they are evicted when the space is taken).
  int64_t free_device_blocks() const { return device_.free_count() + cache_.idle_count(); }
  // Whether `blocks` new device blocks would land in at most `runs` runs now (Grow takes the
  // largest free extents first).
  bool FitsInRuns(int64_t blocks, int32_t runs) const {
    return device_.LargestFreeSum(runs) >= blocks;
  }
  // FitsInRuns, evicting idle cached blocks (least recently released first) until it holds;
  // false, evicting nothing, when it would not hold with every idle block evicted.
  bool MakeRoomInRuns(int64_t blocks, int32_t runs);
  // Whether FitsInRuns holds now or would with every idle cached block evicted (evicts nothing).
  bool CouldFitInRuns(int64_t blocks, int32_t runs) const {
    return FitsInRuns(blocks, runs) || FitsWithIdleEvicted(blocks, runs);
  }

  // Prefix cache (all no-ops returning 0 when options.prefix_cache is off).
  // The longest chain of registered blocks holding tokens[0, n * block_tokens), n <= max_blocks:
  // writes their ids to `out` (cleared first) and returns n.
  // `salt` namespaces the cache (requests share only under the same salt; 0: the default).
  // With `host_out` (and host_prefix_cache on), the chain goes on in the host tier's index
  // where the device one ends: the host blocks holding the next tokens go to `host_out`
  // (cleared first; n counts them too).
  int32_t MatchPrefix(absl::Span<const int32_t> tokens, int32_t max_blocks,
                      std::vector<int32_t>* out, uint64_t salt = 0,
                      std::vector<int32_t>* host_out = nullptr) const;
  // Makes `blocks` (a MatchPrefix result) the first blocks of `slot`, which must hold none.
  void AttachPrefix(int32_t slot, absl::Span<const int32_t> blocks);
  // Brings the host blocks of a MatchPrefix back after the slot's attached prefix: the slot grows
  // by as many new device blocks, each the destination of a move from its host block (appended
  // to `moves`, with `fence`); the host blocks are held until the fence retires. `written_at`
  // (optional) gets the latest fence of an offload still writing one of them (0: none; if that
  // fence fails, the slot's KV is undefined). RESOURCE_EXHAUSTED (nothing changed) when the
  // device tier has no room.
  absl::Status OnboardPrefix(int32_t slot, absl::Span<const int32_t> host_blocks, uint64_t fence,
                             std::vector<BlockMove>* moves, uint64_t* written_at = nullptr);
  // Registers the slot's full blocks holding tokens[0, tokens.size() / block_tokens *
  // block_tokens), whose K/V the caller has written. A block whose content is registered under
  // another block already (its twin) stays private and the blocks after it are registered as the
  // twin's children; a registered block whose chain is gone (its twin was evicted) moves to this
  // chain's key. Registers nothing while a move into the slot's blocks is in flight, for a
  // host-tier slot, or for one whose dropped blocks (far history; window release before a
  // registration walked past them) hid the chain. With window release it goes on past the
  // released blocks (tokens still start at the history's first). Returns the blocks newly
  // registered.
  int32_t RegisterPrefix(int32_t slot, absl::Span<const int32_t> tokens, uint64_t salt = 0);
  // Whether a block is registered and held by no one (attaching it takes it out of the free
  // count).
  bool IdleCached(int32_t block) const { return cache_.registered(block) && refs_[block] == 0; }
  bool Registered(int32_t block) const { return cache_.registered(block); }
  int64_t idle_cached_blocks() const { return cache_.idle_count(); }
  int64_t cached_blocks() const { return cache_.count(); }
  uint64_t evictions() const { return evictions_; }
  // Free host blocks, idle cached ones included (evicted when a paused request needs room).
  int64_t free_host_blocks() const { return host_.free_count() + host_cache_.idle_count(); }
  // Host tier cache: blocks registered there, blocks copied there (offloads), blocks evicted
  // from it.
  int64_t host_cached_blocks() const { return host_cache_.count(); }
  uint64_t offloaded_blocks() const { return offloaded_; }
  // While set, an evicted block is not copied to the host tier (dropped, as without offload):
  // the engine sheds offloads while those already sent are a backlog on the transport, so that a
  // slow host link does not hold up the copies steps wait on. Blocks shed so far.
  void ShedOffloads(bool shed) { shed_offloads_ = shed; }
  uint64_t shed_offloads() const { return shed_; }
  uint64_t host_evictions() const { return host_evictions_; }
  bool HostRegistered(int32_t host_block) const { return host_cache_.registered(host_block); }

  // Offload copies planned since the last OffloadSubmitted (device -> host). The engine submits
  // them as a batch of their own ahead of any other move planned after them, then calls
  // OffloadSubmitted with that batch's fence.
  absl::Span<BlockMove> offload_moves() { return absl::MakeSpan(offload_moves_); }
  void OffloadSubmitted(uint64_t fence);
  // The transport failed these fences: host blocks an offload in them was writing leave the
  // cache (their content is undefined).
  void DiscardFailedOffloads(absl::Span<const uint64_t> failed);
  int32_t NumRuns(int32_t slot) const { return static_cast<int32_t>(slots_[slot].runs.size()); }
  int64_t NumBlocks(int32_t slot) const { return static_cast<int64_t>(slots_[slot].blocks.size()); }
  bool OnHost(int32_t slot) const { return slots_[slot].tier == KvTier::kHost; }
  const std::vector<int32_t>& Blocks(int32_t slot) const { return slots_[slot].blocks; }

  // Far-history summaries: frees the slot's kept blocks right after its first `sink_blocks` until
  // `dropped` logical blocks after the sinks are gone in all (their summaries replace them), or,
  // with no sinks, blocks behind a sliding window (window release). The
  // run table then lists logical blocks [0, sink_blocks) and [sink_blocks + dropped, ...); Grow
  // counts the dropped blocks as held. A block that is the destination of a move in flight is
  // freed when that move's fence retires. Only for a slot in the device tier.
  void DropBlocks(int32_t slot, int32_t sink_blocks, int32_t dropped);
  int32_t Dropped(int32_t slot) const { return slots_[slot].dropped; }

  // When `slot` has more than max_runs runs, brings it to max_runs by moving the fewest blocks
  // it finds a place for: with one run over, a run right next to its neighbour in the history
  // (into free blocks there); else the window of consecutive runs with the fewest blocks, into
  // one extent (evicting idle cached blocks for the smallest window when no extent takes any);
  // else the whole history, into the largest extents. Appends the block moves to `moves`, points
  // the slot at the destinations and holds the sources until `fence` retires. Returns false when
  // none fits (the slot keeps its runs).
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
    int64_t expected_tokens = 0;  // ExpectTokens
    int32_t dropped = 0;      // far history: logical blocks after the sinks no longer held
    uint64_t last_fence = 0;  // fence of the latest move into this slot's blocks
    // Prefix cache: links[j] = the chain's (parent, parent_gen) after logical block j, as the
    // last RegisterPrefix (or AttachPrefix) walked them; capacity reserved at start-up. Once
    // blocks from the history's start are dropped (window release), registration goes on from
    // links[dropped - 1], where the chain was walked that far (links.size() >= dropped); else
    // the chain is not known there and nothing more is registered. Cleared when blocks after
    // sinks are dropped (far history).
    std::vector<std::pair<int32_t, uint64_t>> links;
  };
  struct Pending {
    uint64_t fence;
    KvTier tier;
    int32_t block;
  };

  // Device block references: a new block starts at 1 (NewRef); Unref frees it at 0, or leaves a
  // registered one idle in the cache.
  void NewRef(int32_t block) {
    refs_[block] = 1;
    if (!host_copy_.empty()) host_copy_[block] = -1;
  }
  void Ref(int32_t block);
  void Unref(int32_t block);
  // Gives back a block of `tier` that was held (device: one reference).
  void Drop(KvTier tier, int32_t block);
  // Removes an idle cached block from the cache (offloading it first) and frees it.
  void Evict(int32_t block);
  // The valid host copy of a registered device block, or -1: registered under the same
  // generation, and a child of its host parent's current content (a copy whose parent was
  // evicted from the host is copied again with a chain that leads to it).
  int32_t HostCopy(int32_t block) const;
  // Copies `block` and its ancestors without a host copy to the host tier (root first), as far
  // as the host tier has room without evicting what this call placed.
  void Offload(int32_t block);
  // A host block for an offload: a free one (after the previous offload's destination when
  // that is free, so chains merge into long copies), else the least recently used idle cached
  // one released before `stamp_limit` whose own offload write is done. -1: none.
  int32_t TakeHostBlock(uint64_t stamp_limit);
  // Takes the least recently used idle cached host block released before `stamp_limit` whose
  // offload write is done out of the cache (it stays taken in host_). -1: none.
  int32_t EvictHostBlock(uint64_t stamp_limit);
  // Frees host blocks (evicting idle cached ones) until `n` are free; false when it cannot.
  bool MakeHostRoom(int64_t n);
  bool EvictOldest();
  // Whether FitsInRuns would hold with every idle cached block free.
  bool FitsWithIdleEvicted(int64_t blocks, int32_t runs) const;
  // Frees `length` contiguous device blocks, each free or idle cached, by evicting the idle
  // ones: the window least-recently-released eviction would free first (its most recently
  // released block the earliest of all windows'), without evicting the older blocks elsewhere
  // that order would take on the way; of equals, the one with the fewest idle blocks. O(device
  // blocks). False (nothing evicted) when no such window exists.
  bool EvictWindow(int64_t length);
  // Takes one new extent of up to `want` blocks (at least 1) for a new run, mid-largest-extent.
  Extent TakeNewRun(BlockSpace& space, int64_t want);
  // A new device run of up to `want` blocks for `slot`, whose history then holds `held` blocks:
  // where an extent takes the rest of its expected history (its ExpectTokens), else
  // TakeNewRun's.
  Extent PlaceRun(int32_t slot, int64_t held, int64_t want);
  // Growth room: the free blocks right after a history's last run are that history's to grow
  // into, up to its expected end. MarkClaims notes them for every device-tier history but
  // `except`'s (in claim_, at the block after each last run), ClearClaims forgets them, and
  // Unclaimed is the part of a free extent no claim covers (its end).
  void MarkClaims(int32_t except);
  void ClearClaims();
  Extent Unclaimed(Extent e) const;
  // The shortest free extent whose unclaimed part holds `length` blocks: that part ({-1, 0}:
  // none). Claims must be marked.
  Extent ShortestUnclaimed(int64_t length) const;
  // Whether a stretch of free or idle cached blocks, less the claim at its start, holds
  // `length`: whether evicting idle blocks can make room for a run there. Claims must be marked.
  bool UnclaimedWithIdleEvicted(int64_t length) const;
  void Append(SlotKv& s, int32_t block);
  static void RebuildRuns(SlotKv& s);

  const KvPagerOptions options_;
  BlockSpace device_;
  BlockSpace host_;
  std::vector<SlotKv> slots_;
  std::vector<Pending> pending_;  // capacity reserved at start-up
  uint64_t retired_ = 0;          // highest fence passed to RetireUpTo
  // Per device block: holders (slots and pending moves).
  std::vector<int32_t> refs_;
  int64_t shared_refs_ = 0;  // sum over blocks of refs - 1 where refs > 1
  PrefixIndex cache_;        // the device tier's prefix cache
  uint64_t evictions_ = 0;
  // Host tier cache: its index, per host block the moves reading it and the fence of its
  // offload write (kUnsubmitted until the engine submits it); per device block its host copy
  // and that copy's generation (a copy evicted from the host since is not its copy any more).
  static constexpr uint64_t kUnsubmitted = ~uint64_t{0};
  PrefixIndex host_cache_;
  std::vector<int32_t> host_refs_;
  std::vector<uint64_t> host_written_at_;
  std::vector<int32_t> host_copy_;
  std::vector<uint32_t> host_copy_gen_;
  std::vector<BlockMove> offload_moves_;  // capacity reserved at start-up
  std::vector<int32_t> offload_chain_;    // Offload's scratch, sized at start-up
  int32_t last_offload_dst_ = -1;
  uint64_t offloaded_ = 0;
  bool shed_offloads_ = false;
  uint64_t shed_ = 0;
  uint64_t host_evictions_ = 0;
  std::vector<int64_t> window_ring_;  // EvictWindow's deque, sized at start-up
  std::vector<int32_t> claim_;        // MarkClaims: blocks claimed from here on (device blocks)
  std::vector<int32_t> claimed_at_;   // ... where claim_ is set (capacity: one per slot)
};

}  // namespace kvrm

#endif  // KVRM_RUNTIME_KV_PAGER_H_
