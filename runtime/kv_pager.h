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
// pager's blocks): a full device block whose K/V is final can be registered under its chain
// hash (runtime/prefix_index.h: a keyed hash of every token up to its end, and the cache salt),
// so that a later history starting with the same tokens attaches the block instead of
// prefilling those tokens again. Device blocks are reference counted (slots holding them, moves
// reading them); a registered block that nobody holds stays in the cache, idle, until its space
// is wanted (least recently released first), and counts as free to everyone asking for room.
// Registered blocks are never written again: a history only writes past its attached blocks
// (the engine matches at most the blocks before the one holding a prompt's last token), and a
// compaction or swap of a shared block copies it out and leaves the original where it is.
//
// Offload to the host tier (KvPagerOptions::host_prefix_cache; what vLLM calls KV offloading
// and TensorRT-LLM secondary offloading): a device block evicted from the cache is first copied
// to a host block and registered there under the same key, in a second index over the host
// tier, when its chain can still be found (it is a history's first block, or the block before
// it is cached in either tier). MatchPrefix takes each block of a prompt from whichever tier
// holds it, so a chain may go device, host, device: a history's early blocks released behind a
// sliding window and evicted first, or a prefix prefilled again after its first blocks left,
// still lead to the blocks after them. AttachPrefix gives the slot new device blocks for the
// host ones and copies them back. The host tier is shared with paused requests, which evict
// cached host blocks (least recently used first) when they need room. An offload copy reads a
// device block that is free again as soon as it is planned: the engine submits offloads as
// their own batch ahead of everything planned after them, and every step waits for every batch
// submitted before it, so no one can write the block first.
#ifndef KVRM_RUNTIME_KV_PAGER_H_
#define KVRM_RUNTIME_KV_PAGER_H_

#include <algorithm>
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
  // The chain-hash key (runtime/prefix_index.h); 0: one drawn from the OS at start-up, so that
  // no client can aim a hash collision at another's prefix.
  uint64_t prefix_hash_seed = 0;
  // Window release (every layer attends within this many positions; 0: full attention): a
  // prefix hit needs only the blocks within the window of its end (MatchPrefix's `window`), so
  // an evicted block is offloaded even when the blocks before it are cached nowhere, and an
  // ended history goes idle first block first (its last window is evicted last).
  int32_t window = 0;
};

// One block of a cached prefix: a device block (attached as it is), a host block (brought back
// into a new device block), -1: behind the sliding window of the prefix's end (not needed), or
// (last, `tokens` > 0) a device block whose first `tokens` tokens are the prompt's next ones,
// an ended history's tail or a whole block of another history (copied into a new device block:
// the slot writes the rest of it).
struct PrefixBlock {
  KvTier tier = KvTier::kDevice;
  int32_t block = -1;
  int32_t tokens = 0;  // a tail block's tokens; 0: a whole block
  bool operator==(const PrefixBlock& o) const {
    return tier == o.tier && block == o.block && tokens == o.tokens;
  }
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
  // The longest chain of cached blocks holding tokens[0, n * block_tokens), n <= max_blocks,
  // each from the device tier's index or, with `host` (and host_prefix_cache on), the host
  // tier's where the device has none: writes them to `out` (cleared first) and returns n.
  // `salt` namespaces the cache (requests share only under the same salt; 0: the default).
  // With `window` > 0 (every layer attends within that many positions, and the slot releases
  // the blocks behind it), a prefix of n blocks needs only those from BlocksBehindWindow(n *
  // block_tokens) on, as vLLM's sliding-window cache hits: the blocks before are -1 in `out`
  // (cached or not), and n is the longest prefix whose needed blocks are all cached.
  // With `tail` (and no window): after the n blocks, the device block cached after them whose
  // first tokens are the most of tokens[n * block_tokens, tokens.size() - 1), as
  // TensorRT-LLM's partial reuse copies a block: an ended history's tail (RegisterTail) or a
  // whole block of a history that went on differently (a prompt sent again, a conversation's
  // next turn rendered apart from what was generated, the block that holds the prompt's last
  // token). It is appended to `out` as a tail entry (PrefixBlock::tokens, how many of its
  // tokens are the prompt's; not counted in n): the prompt's last token is always left to
  // prefill.
  int32_t MatchPrefix(absl::Span<const int32_t> tokens, int32_t max_blocks,
                      std::vector<PrefixBlock>* out, uint64_t salt = 0, bool host = false,
                      int32_t window = 0, bool tail = false) const;
  // Makes `blocks` (a MatchPrefix result, not changed since) the first blocks of `slot`, which
  // must hold none and have no move in flight: device blocks are shared as they are; each host
  // block gets a new device block, the destination of a move from it (appended to `moves`, with
  // `fence`), and is held until the fence retires; leading -1 blocks (behind the window) count
  // as dropped (DropBlocks). `written_at` (optional) gets the latest fence of an offload still
  // writing one of them (0: none; if that fence fails, the slot's KV is undefined). When the
  // device tier has no room for the host blocks, only the device blocks before the first of
  // them are attached (none, with blocks behind a window). A tail entry (last) gets a new device
  // block too, the destination of a device-to-device move from it (the slot writes the block
  // from the entry's tokens on, over what the source holds there), held until the fence
  // retires; it is left out when there is no room for that block (or no `moves`), or when a
  // block before it is. Returns the entries the slot holds or dropped: its history's first
  // n * block_tokens tokens are there, plus a tail entry's tokens when it is among them.
  int32_t AttachPrefix(int32_t slot, absl::Span<const PrefixBlock> blocks, uint64_t fence = 0,
                       std::vector<BlockMove>* moves = nullptr, uint64_t* written_at = nullptr);
  // Registers the slot's full blocks holding tokens[0, tokens.size() / block_tokens *
  // block_tokens) (tokens from the history's first, whatever window release dropped), whose
  // K/V the caller has written. A block whose content is cached in another block already (its
  // twin) stays private. Registers nothing while a move into the slot's blocks is in flight,
  // for a host-tier slot, or once far history summarised blocks after its sinks (the K/V after
  // them is not what the tokens alone give). Returns the blocks newly registered.
  int32_t RegisterPrefix(int32_t slot, absl::Span<const int32_t> tokens, uint64_t salt = 0);
  // A history that ends (called before Release, after RegisterPrefix of the same tokens): its
  // last block, when partly filled (tokens.size() not a multiple of block_tokens), is
  // registered as a tail, keyed by the chain before it and its tokens (the rest of the key -1,
  // which no token is), so that a prompt that goes on from those tokens copies its K/V instead
  // of prefilling them again (MatchPrefix's `tail`: beam search's scoring requests, each one
  // token longer than the one before it). Once released it is idle like any cached block,
  // evicted first of its history, never offloaded. Nothing under a window, after dropped
  // blocks, with a move in flight, or when a block after the same chain starts with those
  // tokens already (that tail, or a whole block MatchPrefix copies as well). Returns whether it
  // registered one.
  bool RegisterTail(int32_t slot, absl::Span<const int32_t> tokens, uint64_t salt = 0);
  // Whether a block is registered and held by no one (attaching it takes it out of the free
  // count).
  bool IdleCached(int32_t block) const { return cache_.registered(block) && refs_[block] == 0; }
  bool Registered(int32_t block) const { return cache_.registered(block); }
  // A registered block that is a tail (RegisterTail): its key ends in -1.
  bool IsTail(int32_t block) const { return cache_.tokens(block)[options_.block_tokens - 1] < 0; }
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

  // Forgets every cached prefix (vLLM's reset_prefix_cache): no lookup finds any block cached
  // before the call. Idle cached blocks go back to their tier's free pool at once (none is
  // offloaded); a device block histories hold, and a host block a copy still reads or writes,
  // stays registered but hidden (found by no lookup, never offloaded or registered again) until
  // it is evicted; and the histories running register nothing more until released (their KV
  // is from before the reset). Blocks freed in each tier.
  struct CacheReset {
    int64_t device_blocks = 0;
    int64_t host_blocks = 0;
  };
  CacheReset ResetPrefixCache();

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
    // Prefix cache: chain[j] = the chain hash of logical block j, as far as RegisterPrefix has
    // hashed; capacity reserved at start-up. chain_cut: nothing more of this history is
    // registered (far history dropped blocks after the sinks, so the K/V from there on is not
    // the tokens' alone; or a ResetPrefixCache came while it ran).
    std::vector<Hash128> chain;
    bool chain_cut = false;
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
  // Removes an idle cached block from the cache (offloading it first) and frees it.
  void Evict(int32_t block);
  // Copies an evicted registered `block` to the host tier, unless the host holds its key
  // already or nothing could find it there (not a history's first block, and the block before
  // it cached in neither tier; under a window every block may be found).
  void Offload(int32_t block);
  // A host block for the offload of device block `src`: a free one (beside the previous
  // offload's destination, on the side `src` is of its source, when that is free, so that runs
  // merge into long copies), else the least recently used idle cached one whose own offload
  // write is done. -1: none.
  int32_t TakeHostBlock(int32_t src);
  // Takes the least recently used idle cached host block whose offload write is done out of the
  // cache (it stays taken in host_). -1: none.
  int32_t EvictHostBlock();
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
  ChainHasher hasher_;
  // The key of a tail of `k` tokens from `tokens` on: those, then -1 to block_tokens (in
  // tail_key_, valid until the next call).
  const int32_t* TailKey(const int32_t* tokens, int32_t k) const {
    std::fill(std::copy_n(tokens, k, tail_key_.begin()), tail_key_.end(), -1);
    return tail_key_.data();
  }
  mutable std::vector<int32_t> tail_key_;  // [block_tokens], TailKey's (engine thread only)
  PrefixIndex cache_;        // the device tier's prefix cache
  uint64_t evictions_ = 0;
  // Host tier cache (offload_ on): its index, per host block the moves reading it and the fence
  // of its offload write (kUnsubmitted until the engine submits it).
  static constexpr uint64_t kUnsubmitted = ~uint64_t{0};
  bool offload_ = false;
  PrefixIndex host_cache_;
  std::vector<int32_t> host_refs_;
  std::vector<uint64_t> host_written_at_;
  std::vector<BlockMove> offload_moves_;  // capacity reserved at start-up
  int32_t last_offload_dst_ = -1;
  int32_t last_offload_src_ = -1;
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
