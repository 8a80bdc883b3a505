#include "runtime/kv_pager.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace kvrm {

KvPager::KvPager(const KvPagerOptions& options)
    : options_(options),
      device_(options.device_blocks),
      host_(std::max<int64_t>(1, options.host_blocks)),
      slots_(options.num_slots) {
  if (options.host_blocks == 0) host_.TakeRange(0, 1);  // an empty host tier
  for (SlotKv& s : slots_) {
    s.blocks.reserve(options.max_blocks_per_slot);
    s.runs.reserve(options.max_blocks_per_slot);
    if (options.prefix_cache) s.chain.reserve(options.max_blocks_per_slot);
  }
  // Sources held for copies and blocks retiring with a released slot's moves: a block at most
  // twice per tier, plus a shared block once per slot that moves it, plus the host blocks each
  // onboarding slot reads.
  pending_.reserve(2 * (options.device_blocks + options.host_blocks) +
                   2 * int64_t{options.num_slots} * options.max_blocks_per_slot);
  refs_.assign(options.device_blocks, 0);
  if (options.prefix_cache) {
    const uint64_t seed = options.prefix_hash_seed;
    hasher_ =
        ChainHasher(seed == 0 ? RandomSipKey() : SipKey{seed, seed * 0x9e3779b97f4a7c15ull + 1});
  }
  cache_.Init(options.device_blocks, options.block_tokens, options.prefix_cache);
  offload_ = options.prefix_cache && options.host_prefix_cache && options.host_blocks > 0;
  host_cache_.Init(host_.size(), options.block_tokens, offload_);
  if (options.prefix_cache) window_ring_.assign(options.device_blocks, 0);
  if (options.prefix_cache) tail_key_.assign(options.block_tokens, -1);
  claim_.assign(options.device_blocks, 0);
  claimed_at_.reserve(options.num_slots);
  if (offload_) {
    host_refs_.assign(options.host_blocks, 0);
    host_written_at_.assign(options.host_blocks, 0);
    offload_moves_.reserve(options.device_blocks);
  }
}

void KvPager::Ref(int32_t block) {
  if (refs_[block]++ > 0) ++shared_refs_;
}

void KvPager::Unref(int32_t block) {
  DCHECK(refs_[block] > 0);
  if (--refs_[block] > 0) {
    --shared_refs_;
    return;
  }
  if (cache_.linked(block)) {
    cache_.IdlePush(block);
  } else {
    // A hidden block (its key no longer says what it holds: a prefix-cache reset, a failed
    // copy) is found by no lookup: freed now rather than kept idle, counted as cached, until
    // evicted.
    if (cache_.registered(block)) cache_.Remove(block);
    device_.Give(block);
  }
}

void KvPager::Drop(KvTier tier, int32_t block) {
  if (tier == KvTier::kDevice) {
    Unref(block);
  } else if (host_cache_.registered(block)) {  // a cached block an onboarding copy was reading
    if (--host_refs_[block] == 0) host_cache_.IdlePush(block);
  } else {
    host_.Give(block);
  }
}

void KvPager::Evict(int32_t block) {
  Offload(block);
  cache_.IdleRemove(block);
  cache_.Remove(block);
  ++evictions_;
  device_.Give(block);
}

bool KvPager::EvictOldest() {
  if (cache_.idle_head() < 0) return false;
  Evict(cache_.idle_head());
  return true;
}

void KvPager::Offload(int32_t block) {
  // (A tail is matched on the device only: a recent history's, worth no host block. A hidden
  // block is never idle, so never evicted: Unref frees it.)
  if (!offload_ || IsTail(block)) return;
  const Hash128& parent = cache_.parent_hash(block);
  const Hash128& hash = cache_.hash(block);
  if (host_cache_.Find(parent, hash, cache_.tokens(block)) >= 0) return;  // copied before
  // A block after one cached nowhere is found by no lookup until those tokens are cached again:
  // not worth a copy and the host block it would evict.
  // (Under a window a prefix hit needs only the blocks near its end: every block is worth it.)
  if (options_.window <= 0 && !cache_.first(block) && cache_.FindHash(parent) < 0 &&
      host_cache_.FindHash(parent) < 0) {
    return;
  }
  if (shed_offloads_) {
    ++shed_;
    return;
  }
  const int32_t h = TakeHostBlock(block);
  if (h < 0) return;
  host_cache_.Insert(h, parent, hash, cache_.tokens(block), cache_.first(block));
  host_cache_.IdlePush(h);
  host_written_at_[h] = kUnsubmitted;
  offload_moves_.push_back(BlockMove{KvTier::kDevice, block, KvTier::kHost, h});
  last_offload_dst_ = h;
  last_offload_src_ = block;
  ++offloaded_;
  // Host eviction order: the chain's blocks before this one (those already there, up to the
  // first that is not) go idle after it, its first block last, so the host evicts a chain from
  // its end and keeps what leads to the rest. (A released history goes idle on the device the
  // same way, and is evicted and offloaded tail first.) Under a window, blocks reach the host
  // first block first and keep that order: the last window goes last.
  for (int32_t x = h, hops = 0;
       options_.window <= 0 && !host_cache_.first(x) && hops < options_.max_blocks_per_slot;
       ++hops) {
    x = host_cache_.FindHash(host_cache_.parent_hash(x));
    if (x < 0) break;
    if (host_refs_[x] > 0) continue;
    host_cache_.IdleRemove(x);
    host_cache_.IdlePush(x);
  }
}

int32_t KvPager::TakeHostBlock(int32_t src) {
  if (host_.free_count() == 0) return EvictHostBlock();
  // The copy of a block evicted right after its neighbour goes next to that one's copy, on the
  // same side, so that the two merge into one transfer group (PlanTransferGroups merges moves
  // whose sources and destinations both go up by one). Under full attention a history goes
  // idle, and is evicted, last block first: a run of copies then goes down, and a new run
  // starts at the end of the largest free extent; under a window, first block first, up from
  // its start. (Onboarding copies back then merge too: the host holds a chain in the device's
  // order.)
  int64_t h = -1;
  if (last_offload_dst_ >= 0 && (src == last_offload_src_ + 1 || src == last_offload_src_ - 1)) {
    h = last_offload_dst_ + (src - last_offload_src_);
    if (h < 0 || h >= host_.size() || !host_.IsFree(h)) h = -1;
  }
  if (h < 0) {
    const Extent e = host_.LargestFree();
    h = options_.window > 0 ? e.start : e.start + e.length - 1;
  }
  host_.Take(h);
  return static_cast<int32_t>(h);
}

int32_t KvPager::EvictHostBlock() {
  for (int32_t h = host_cache_.idle_head(); h >= 0; h = host_cache_.idle_next(h)) {
    if (host_written_at_[h] > retired_) continue;  // its offload copy may still be writing it
    host_cache_.IdleRemove(h);
    host_cache_.Remove(h);
    ++host_evictions_;
    return h;
  }
  return -1;
}

bool KvPager::MakeHostRoom(int64_t n) {
  // Count first what can be evicted now (not blocks whose offload write is not done), so that a
  // request that cannot fit does not cost the cache anything.
  int64_t room = host_.free_count();
  for (int32_t h = host_cache_.idle_head(); h >= 0 && room < n; h = host_cache_.idle_next(h)) {
    room += host_written_at_[h] <= retired_;
  }
  if (room < n) return false;
  while (host_.free_count() < n) {
    const int32_t h = EvictHostBlock();
    if (h < 0) return false;
    host_.Give(h);
  }
  return true;
}

KvPager::CacheReset KvPager::ResetPrefixCache() {
  CacheReset freed;
  // A history running now registers none of its blocks again (those copied by a compaction or
  // swap-in, or written while it decoded, hold KV from before the reset too) until it is
  // released: a recompute prefills anew.
  for (SlotKv& s : slots_) {
    if (!s.blocks.empty() || s.dropped > 0) s.chain_cut = true;
  }
  for (int32_t b = 0; b < static_cast<int32_t>(refs_.size()) && cache_.count() > 0; ++b) {
    if (!cache_.registered(b)) continue;
    if (refs_[b] == 0) {
      cache_.IdleRemove(b);
      cache_.Remove(b);
      device_.Give(b);
      ++freed.device_blocks;
    } else {
      // Held (and maybe shared): kept registered, found by no lookup, so that its holders keep
      // it and it is never registered again; freed when they let go of it (Unref).
      cache_.Hide(b);
    }
  }
  for (int32_t h = 0; h < static_cast<int32_t>(host_refs_.size()); ++h) {
    if (!host_cache_.registered(h)) continue;
    if (host_refs_[h] == 0 && host_written_at_[h] <= retired_) {
      host_cache_.IdleRemove(h);
      host_cache_.Remove(h);
      host_.Give(h);
      ++freed.host_blocks;
    } else {
      host_cache_.Hide(h);
    }
  }
  return freed;
}

void KvPager::OffloadSubmitted(uint64_t fence) {
  for (const BlockMove& m : offload_moves_) host_written_at_[m.dst] = fence;
  offload_moves_.clear();
}

void KvPager::DiscardFailedOffloads(absl::Span<const uint64_t> failed) {
  if (host_written_at_.empty()) return;
  for (int32_t h = 0; h < static_cast<int32_t>(host_written_at_.size()); ++h) {
    if (!host_cache_.registered(h) ||
        std::find(failed.begin(), failed.end(), host_written_at_[h]) == failed.end()) {
      continue;
    }
    if (host_refs_[h] == 0) {
      host_cache_.IdleRemove(h);
      host_cache_.Remove(h);
      host_.Give(h);
    } else {
      // A move reading it gives it back when its fence retires; until then it stays registered,
      // found by no lookup.
      host_cache_.Hide(h);
    }
  }
}

bool KvPager::EvictWindow(int64_t length) {
  if (cache_.idle_count() == 0 || length <= 0) return false;
  const int64_t total = options_.device_blocks;
  auto usable = [&](int64_t b) { return device_.IsFree(b) || IdleCached(static_cast<int32_t>(b)); };
  auto stamp = [&](int64_t b) { return device_.IsFree(b) ? uint64_t{0} : cache_.idle_stamp(b); };
  // Every window of `length` blocks, each free or idle: a sliding window keeps its maximum
  // release stamp (a monotonic deque of positions in a buffer sized at start-up; a free block
  // counts 0) and its number of idle blocks. Least-recently-released eviction would free the
  // window with the smallest maximum first; this evicts that window's idle blocks only.
  int64_t best_start = -1, best_idle = 0;
  uint64_t best_stamp = 0;
  int64_t head = 0, tail = 0, idle_in = 0, stretch_start = 0;
  for (int64_t b = 0; b < total; ++b) {
    if (!usable(b)) {
      head = tail = 0;
      idle_in = 0;
      stretch_start = b + 1;
      continue;
    }
    const uint64_t st = stamp(b);
    while (tail > head && stamp(window_ring_[tail - 1]) <= st) --tail;
    window_ring_[tail++] = b;
    idle_in += st != 0;
    const int64_t start = b - length + 1;
    if (start < stretch_start) continue;
    if (start > stretch_start) idle_in -= stamp(start - 1) != 0;
    while (window_ring_[head] < start) ++head;
    const uint64_t window_max = stamp(window_ring_[head]);
    if (best_start < 0 || window_max < best_stamp ||
        (window_max == best_stamp && idle_in < best_idle)) {
      best_start = start;
      best_stamp = window_max;
      best_idle = idle_in;
    }
  }
  if (best_start < 0) return false;
  for (int64_t b = best_start; b < best_start + length; ++b) {
    if (!device_.IsFree(b)) Evict(static_cast<int32_t>(b));
  }
  return true;
}

bool KvPager::FitsWithIdleEvicted(int64_t blocks, int32_t runs) const {
  LargestRunsSum top(runs);
  int64_t run = 0;
  for (int64_t b = 0; b < options_.device_blocks; ++b) {
    if (device_.IsFree(b) || IdleCached(static_cast<int32_t>(b))) {
      ++run;
    } else {
      top.Push(run);
      run = 0;
    }
  }
  top.Push(run);
  return top.sum() >= blocks;
}

bool KvPager::MakeRoomInRuns(int64_t blocks, int32_t runs) {
  if (FitsInRuns(blocks, runs)) return true;
  // Evicting every idle block would not make it fit (the room is cut up by blocks in use):
  // keep the cache rather than empty it for nothing, on every retry.
  if (!FitsWithIdleEvicted(blocks, runs)) return false;
  while (!FitsInRuns(blocks, runs)) {
    if (!EvictOldest()) return false;
  }
  return true;
}

int32_t KvPager::MatchPrefix(absl::Span<const int32_t> tokens, int32_t max_blocks,
                             std::vector<PrefixBlock>* out, uint64_t salt, bool host,
                             int32_t window, bool tail) const {
  out->clear();
  if (!options_.prefix_cache) return 0;
  const int32_t bt = options_.block_tokens;
  const int64_t n = std::min<int64_t>(max_blocks, static_cast<int64_t>(tokens.size()) / bt);
  const bool use_host = host && offload_;
  // Each block from the device tier, else the host tier. Full attention needs them all, so the
  // walk ends at the first missing; under a window it goes on, keeping the longest prefix whose
  // blocks from the window of its end on are all there (`present`: the first of the blocks
  // found in a row up to here).
  Hash128 parent = hasher_.Root(salt);
  Hash128 matched = parent;  // the chain hash of the blocks in `out` (full attention)
  int64_t best = 0, present = 0;
  for (int64_t j = 0; j < n; ++j) {
    const int32_t* key = tokens.data() + j * bt;
    const Hash128 hash = hasher_.Next(parent, key, bt);
    PrefixBlock found{KvTier::kDevice, cache_.Find(parent, hash, key)};
    if (found.block < 0 && use_host) found = {KvTier::kHost, host_cache_.Find(parent, hash, key)};
    parent = hash;
    if (window <= 0 && found.block < 0) break;
    if (found.block >= 0) matched = hash;
    out->push_back(found);
    if (found.block < 0) {
      present = j + 1;
    } else if (present <= BlocksBehindWindow((j + 1) * bt, window, bt)) {
      best = j + 1;
    }
  }
  if (window <= 0) {
    const int32_t m = static_cast<int32_t>(out->size());
    // After the m blocks, the cached block (a tail or a whole block) whose first tokens are the
    // most of the prompt's next ones, leaving the prompt's last token.
    const int64_t rest = static_cast<int64_t>(tokens.size()) - 1 - int64_t{m} * bt;
    const int32_t most = static_cast<int32_t>(std::min<int64_t>(bt - 1, rest));
    if (tail && most > 0 && cache_.count() > 0) {
      int32_t b = -1;
      const int32_t k = cache_.LongestChild(matched, tokens.data() + int64_t{m} * bt, most, &b);
      if (k > 0) out->push_back(PrefixBlock{KvTier::kDevice, b, k});
    }
    return m;
  }
  out->resize(best);
  const int32_t behind = BlocksBehindWindow(best * bt, window, bt);
  for (int32_t i = 0; i < behind; ++i) (*out)[i] = PrefixBlock{KvTier::kDevice, -1};
  return static_cast<int32_t>(best);
}

int32_t KvPager::AttachPrefix(int32_t slot, absl::Span<const PrefixBlock> blocks, uint64_t fence,
                              std::vector<BlockMove>* moves, uint64_t* written_at) {
  if (written_at) *written_at = 0;
  SlotKv& s = slots_[slot];
  CHECK(s.blocks.empty() && s.tier == KvTier::kDevice && s.dropped == 0 && s.last_fence <= retired_)
      << "slot " << slot << ": a prefix goes into an empty device-tier slot with no move in flight";
  // Blocks behind the window (leading -1s) are dropped from the start. Host blocks need as many
  // new device blocks; the idle device blocks attached stop counting as free. Without room, the
  // device blocks before the first host block go alone (none after dropped ones: the window of
  // a shorter prefix reaches back past them).
  // A tail entry (last) is attached only with every block before it, and room for its copy.
  const bool has_tail = !blocks.empty() && blocks.back().tokens > 0;
  const size_t whole = blocks.size() - (has_tail ? 1 : 0);
  size_t skip = 0;
  while (skip < whole && blocks[skip].block < 0) ++skip;
  int64_t host_blocks = 0, idle = 0;
  size_t first_host = whole;
  for (size_t i = skip; i < whole; ++i) {
    const PrefixBlock& pb = blocks[i];
    CHECK(pb.block >= 0) << "a prefix's blocks behind the window come first";
    if (pb.tier == KvTier::kDevice) {
      CHECK(cache_.registered(pb.block)) << "block " << pb.block << " is not in the prefix cache";
      idle += refs_[pb.block] == 0;
    } else {
      CHECK(host_cache_.registered(pb.block))
          << "host block " << pb.block << " is not in the prefix cache";
      first_host = std::min(first_host, i);
      ++host_blocks;
    }
  }
  size_t take = whole;
  if (host_blocks > 0 && (moves == nullptr || free_device_blocks() - idle < host_blocks)) {
    take = skip > 0 ? 0 : first_host;
  }
  int32_t tail = -1;  // the tail block copied, if any
  if (has_tail && take == whole && skip == 0 && moves != nullptr) {
    const PrefixBlock& t = blocks.back();
    CHECK(t.tier == KvTier::kDevice && cache_.linked(t.block) && t.tokens < options_.block_tokens)
        << "block " << t.block << " is not a cached block to copy " << t.tokens << " tokens of";
    // Room for the host blocks' copies and the tail's, with the tail itself held.
    const int64_t held_idle = idle + (refs_[t.block] == 0 ? 1 : 0);
    if (free_device_blocks() - held_idle >= host_blocks + 1) tail = t.block;
  }
  if (take == 0 && tail < 0) return 0;
  // Every block held first, so that the growth below (which may evict idle device blocks, and
  // offload them into the host tier) can take none of them.
  if (tail >= 0) {
    if (refs_[tail] == 0) cache_.IdleRemove(tail);
    Ref(tail);
  }
  for (size_t i = skip; i < take; ++i) {
    const int32_t b = blocks[i].block;
    if (blocks[i].tier == KvTier::kDevice) {
      if (refs_[b] == 0) cache_.IdleRemove(b);
      Ref(b);
    } else if (host_refs_[b]++ == 0) {
      host_cache_.IdleRemove(b);
    }
  }
  const int32_t bt = options_.block_tokens;
  s.dropped = static_cast<int32_t>(skip);
  bool copies = false;
  for (size_t i = skip; i < take;) {
    if (blocks[i].tier == KvTier::kDevice) {
      Append(s, blocks[i].block);
      ++i;
      continue;
    }
    size_t end = i;
    while (end < take && blocks[end].tier == KvTier::kHost) ++end;
    const size_t first = s.blocks.size();
    CHECK_OK(Grow(slot, static_cast<int64_t>(skip + first + end - i) * bt));  // room counted
    // Given back (when the fence retires) in the host's eviction order: a chain's tail the
    // oldest, or under a window its first block.
    for (size_t step = 0; step < end - i; ++step) {
      const size_t k = options_.window > 0 ? i + step : end - 1 - step;
      const int32_t h = blocks[k].block;
      const int32_t dst = s.blocks[first + (k - i)];
      moves->push_back(BlockMove{KvTier::kHost, h, KvTier::kDevice, dst});
      pending_.push_back(Pending{fence, KvTier::kHost, h});  // takes the reference
      // An offload not submitted yet goes out in the same submission as this move, ahead of
      // it (offloads first), so the move's own fence covers it; its kUnsubmitted stamp must not
      // be handed out as a fence (the engine would keep that owner entry forever).
      if (written_at && host_written_at_[h] > retired_ && host_written_at_[h] != kUnsubmitted) {
        *written_at = std::max(*written_at, host_written_at_[h]);
      }
    }
    copies = true;
    i = end;
  }
  s.tokens = static_cast<int64_t>(take) * bt;
  if (tail >= 0) {
    // Its copy: the slot's next block, written from the tail's tokens on by the slot itself.
    CHECK_OK(Grow(slot, static_cast<int64_t>(take + 1) * bt));  // room counted
    moves->push_back(BlockMove{KvTier::kDevice, tail, KvTier::kDevice, s.blocks.back()});
    pending_.push_back(Pending{fence, KvTier::kDevice, tail});  // takes the reference
    s.tokens = static_cast<int64_t>(take) * bt + blocks.back().tokens;
    copies = true;
    ++take;
  }
  if (copies) s.last_fence = fence;
  return static_cast<int32_t>(take);
}

bool KvPager::RegisterTail(int32_t slot, absl::Span<const int32_t> tokens, uint64_t salt) {
  if (!options_.prefix_cache || options_.window > 0) return false;
  SlotKv& s = slots_[slot];
  const int32_t bt = options_.block_tokens;
  const size_t j = tokens.size() / bt;  // the tail's logical block
  const int32_t k = static_cast<int32_t>(tokens.size() % bt);
  if (k == 0 || s.tier != KvTier::kDevice || s.last_fence > retired_ || s.chain_cut ||
      s.dropped > 0 || j >= s.blocks.size() || s.chain.size() < j) {
    return false;
  }
  const int32_t b = s.blocks[j];
  if (cache_.registered(b) || refs_[b] != 1) return false;
  const Hash128 parent = j == 0 ? hasher_.Root(salt) : s.chain[j - 1];
  // Cached already when a block after the same chain starts with the same k tokens (a tail, or
  // the whole block of a history that went on: MatchPrefix copies either).
  int32_t twin = -1;
  if (cache_.LongestChild(parent, tokens.data() + j * bt, k, &twin) == k) return false;
  const int32_t* key = TailKey(tokens.data() + j * bt, k);
  const Hash128 hash = hasher_.Next(parent, key, bt);
  if (cache_.Find(parent, hash, key) >= 0) return false;  // (past LongestChild's scan)
  cache_.Insert(b, parent, hash, key, j == 0);
  return true;
}

int32_t KvPager::RegisterPrefix(int32_t slot, absl::Span<const int32_t> tokens, uint64_t salt) {
  if (!options_.prefix_cache) return 0;
  SlotKv& s = slots_[slot];
  if (s.tier != KvTier::kDevice || s.last_fence > retired_ || s.chain_cut) return 0;
  const int32_t bt = options_.block_tokens;
  const size_t first = static_cast<size_t>(s.dropped);
  const size_t n = std::min(tokens.size() / bt, first + s.blocks.size());
  if (s.chain.size() > n) s.chain.resize(n);  // (hashes past n may be of tokens since undone)
  while (s.chain.size() < n) {
    const size_t j = s.chain.size();
    s.chain.push_back(
        hasher_.Next(j == 0 ? hasher_.Root(salt) : s.chain[j - 1], tokens.data() + j * bt, bt));
  }
  int32_t added = 0;
  for (size_t j = first; j < n; ++j) {
    const int32_t b = s.blocks[j - first];
    if (cache_.registered(b)) {
      DCHECK(cache_.hash(b) == s.chain[j]);  // attached, or registered before
      continue;
    }
    const Hash128 parent = j == 0 ? hasher_.Root(salt) : s.chain[j - 1];
    const int32_t* key = tokens.data() + j * bt;
    // The same content cached in another block (two histories prefilled the same prompt at
    // once) leaves this one private: the chain goes on through either.
    if (cache_.Find(parent, s.chain[j], key) >= 0) continue;
    cache_.Insert(b, parent, s.chain[j], key, j == 0);
    ++added;
  }
  return added;
}

void KvPager::Append(SlotKv& s, int32_t block) {
  s.blocks.push_back(block);
  if (!s.runs.empty() && s.runs.back().first_block + s.runs.back().num_blocks == block) {
    ++s.runs.back().num_blocks;
  } else {
    s.runs.push_back(KvRun{block, 1});
  }
}

void KvPager::RebuildRuns(SlotKv& s) {
  s.runs.clear();
  for (int32_t b : s.blocks) {
    if (!s.runs.empty() && s.runs.back().first_block + s.runs.back().num_blocks == b) {
      ++s.runs.back().num_blocks;
    } else {
      s.runs.push_back(KvRun{b, 1});
    }
  }
}

Extent KvPager::TakeNewRun(BlockSpace& space, int64_t want) {
  const Extent largest = space.LargestFree();
  if (largest.length == 0) return largest;
  const int64_t n = std::min(want, largest.length);
  // Leave the left half of the spare room to whoever ends just before the extent, the right half
  // for this run's own growth. An extent at the pool's start has no left neighbour.
  const int64_t spare = largest.length - n;
  const int64_t start = largest.start == 0 ? 0 : largest.start + spare / 2;
  space.TakeRange(start, n);
  return Extent{start, n};
}

void KvPager::MarkClaims(int32_t except) {
  for (int32_t i = 0; i < options_.num_slots; ++i) {
    const SlotKv& o = slots_[i];
    if (i == except || o.tier != KvTier::kDevice || o.runs.empty() || o.expected_tokens <= 0) {
      continue;
    }
    const int64_t end = static_cast<int64_t>(o.runs.back().first_block) + o.runs.back().num_blocks;
    const int64_t rest = std::min<int64_t>(BlocksFor(o.expected_tokens) - o.dropped,
                                           options_.max_blocks_per_slot) -
                         static_cast<int64_t>(o.blocks.size());
    if (end >= device_.size() || rest <= 0) continue;
    if (claim_[end] == 0) claimed_at_.push_back(static_cast<int32_t>(end));
    claim_[end] = std::max(claim_[end], static_cast<int32_t>(rest));
  }
}

void KvPager::ClearClaims() {
  for (int32_t b : claimed_at_) claim_[b] = 0;
  claimed_at_.clear();
}

Extent KvPager::Unclaimed(Extent e) const {
  if (e.length <= 0) return e;
  const int64_t c = std::min<int64_t>(claim_[e.start], e.length);
  return Extent{e.start + c, e.length - c};
}

Extent KvPager::ShortestUnclaimed(int64_t length) const {
  Extent fit;
  device_.ForEachFreeRun([&](Extent e) {
    const Extent u = Unclaimed(e);
    if (u.length >= length && (fit.length == 0 || u.length < fit.length)) fit = u;
  });
  return fit;
}

bool KvPager::UnclaimedWithIdleEvicted(int64_t length) const {
  int64_t start = -1;
  for (int64_t b = 0; b <= options_.device_blocks; ++b) {
    const bool usable = b < options_.device_blocks &&
                        (device_.IsFree(b) || IdleCached(static_cast<int32_t>(b)));
    if (usable) {
      if (start < 0) start = b;
      continue;
    }
    if (start >= 0 && b - start - claim_[start] >= length) return true;
    start = -1;
  }
  return false;
}

Extent KvPager::PlaceRun(int32_t slot, int64_t held, int64_t want) {
  const SlotKv& s = slots_[slot];
  const int64_t expected =
      std::min<int64_t>(BlocksFor(s.expected_tokens) - s.dropped, options_.max_blocks_per_slot);
  const int64_t rest = expected - held;
  if (s.expected_tokens > 0 && rest >= want) {
    // The shortest free extent whose unclaimed part holds the rest, the run placed at that
    // part's end: the spare room stays next to whatever precedes it (a history that may grow
    // past its expected end); what follows an extent is a run's start, which grows nowhere.
    MarkClaims(slot);
    Extent fit = ShortestUnclaimed(rest);
    // With the free space cut up, idle cached blocks make the room, evicted least recently
    // released first until an extent holds the rest (when evicting them all would make one):
    // under the prefix cache the pool fills with idle blocks, and growth that took its blocks
    // where they were freed, one at a time, was scattered over as many runs. (In release order:
    // what stays cached of a history is what a later match needs most, Release.)
    // (At most twice the rest evicted for it: the expected end is an upper bound, and a
    // placement is not worth the cache.)
    if (fit.length == 0 && cache_.idle_count() > 0 && UnclaimedWithIdleEvicted(rest)) {
      int64_t budget = 2 * rest;
      for (int32_t b = cache_.idle_head(); b >= 0 && fit.length == 0 && budget-- > 0;
           b = cache_.idle_head()) {
        Evict(b);
        if (const Extent u = Unclaimed(device_.FreeRunAround(b)); u.length >= rest) fit = u;
      }
    }
    ClearClaims();
    if (fit.length > 0) {
      const int64_t start = fit.start + fit.length - rest;
      device_.TakeRange(start, want);
      return Extent{start, want};
    }
  }
  return TakeNewRun(device_, want);
}

absl::Status KvPager::Grow(int32_t slot, int64_t num_tokens) {
  SlotKv& s = slots_[slot];
  if (s.tier != KvTier::kDevice) {
    return absl::FailedPreconditionError(absl::StrCat("slot ", slot, " is in the host tier"));
  }
  int64_t need = BlocksFor(num_tokens) - s.dropped - static_cast<int64_t>(s.blocks.size());
  if (BlocksFor(num_tokens) > options_.max_blocks_per_slot) {
    return absl::OutOfRangeError(absl::StrCat("slot ", slot, ": ", num_tokens,
                                              " tokens exceed the max context"));
  }
  if (need > free_device_blocks()) {
    return absl::ResourceExhaustedError(absl::StrCat("KV pool exhausted: slot ", slot, " needs ",
                                                     need, " blocks, ", free_device_blocks(),
                                                     " free"));
  }
  // The blocks growth must take from the cache (the least recently released ones, as many as
  // the free blocks fall short by) are evicted before any block is placed, so that they are
  // placed as the extents they form. Evicted one at a time as the placement went, each would
  // start a run of its own: a released history goes idle last block first (full attention), so
  // the next block evicted is the one before the block just placed, never the one after it (a
  // prompt placed so took a run per block, past what compaction can merge, and paused).
  while (device_.free_count() < need) CHECK(EvictOldest());  // free_device_blocks() >= need
  // Blocks scattered so thinly that the growth would take more runs than the run table has
  // left: evict idle cached blocks (least recently released first) until it fits, when that
  // can make it fit. The run table's width is a hard limit (past it the history must be
  // compacted into an extent that may not exist, or paused), which a cached block is not worth.
  const int32_t runs_left = std::max<int32_t>(
      1, options_.max_runs - static_cast<int32_t>(s.runs.size()));
  if (need > 1 && !FitsInRuns(need, runs_left)) MakeRoomInRuns(need, runs_left);
  while (need > 0) {
    if (!s.blocks.empty()) {
      const int64_t next = static_cast<int64_t>(s.runs.back().first_block) + s.runs.back().num_blocks;
      if (next < device_.size() && device_.IsFree(next)) {
        device_.Take(next);
        NewRef(static_cast<int32_t>(next));
        Append(s, static_cast<int32_t>(next));
        --need;
        continue;
      }
    }
    const Extent e = PlaceRun(slot, static_cast<int64_t>(s.blocks.size()), need);
    CHECK(e.length > 0);
    for (int64_t b = e.start; b < e.start + e.length; ++b) {
      NewRef(static_cast<int32_t>(b));
      Append(s, static_cast<int32_t>(b));
    }
    need -= e.length;
  }
  s.tokens = std::max(s.tokens, num_tokens);
  return absl::OkStatus();
}

void KvPager::Release(int32_t slot) {
  SlotKv& s = slots_[slot];
  // Blocks that are destinations of a move still in flight must not be handed to anyone else
  // before the copy lands: they retire with that move's fence instead of being freed now.
  // Last block first: cached blocks go idle in that order, so a history's tail is evicted before
  // the prefix others are likelier to share. Under a window, first block first: a prefix hit
  // needs only the blocks near its end (MatchPrefix), so the history's last window, what its
  // next turn needs, goes last (and the blocks released behind the window while it ran stay the
  // oldest of all).
  const bool in_flight = s.last_fence > retired_;
  const bool window = options_.window > 0;
  const size_t n = s.blocks.size();
  for (size_t i = 0; i < n; ++i) {
    const int32_t b = s.blocks[window ? i : n - 1 - i];
    if (in_flight) {
      pending_.push_back(Pending{s.last_fence, s.tier, b});
    } else {
      Drop(s.tier, b);
    }
  }
  // Window release under full-attention matching (no `window` option): the cached blocks behind
  // the window went idle long before the rest, so they are the oldest on the eviction list, and
  // evicting the chain's start first would stop the whole history from matching (a
  // conversation's next turn). Now that the history ends they go back to the list's recent end,
  // its first block last, as if released with the rest: the tail is evicted first, as for any
  // history. (Chain blocks held by others, or evicted since, are left alone.)
  if (!window && !in_flight && s.tier == KvTier::kDevice && s.dropped > 0 && !s.chain_cut) {
    for (int32_t j = std::min<int32_t>(s.dropped, static_cast<int32_t>(s.chain.size())); j-- > 0;) {
      const int32_t b = cache_.FindHash(s.chain[j]);
      if (b >= 0 && refs_[b] == 0) {
        cache_.IdleRemove(b);
        cache_.IdlePush(b);
      }
    }
  }
  s.blocks.clear();
  s.runs.clear();
  s.tokens = 0;
  s.dropped = 0;
  s.tier = KvTier::kDevice;
  s.last_fence = 0;
  s.chain.clear();
  s.chain_cut = false;
}

void KvPager::DropBlocks(int32_t slot, int32_t sink_blocks, int32_t dropped) {
  SlotKv& s = slots_[slot];
  const int32_t n = dropped - s.dropped;
  if (n <= 0) return;
  CHECK(s.tier == KvTier::kDevice) << "slot " << slot << ": dropping blocks in the host tier";
  CHECK(sink_blocks + n <= static_cast<int64_t>(s.blocks.size()))
      << "slot " << slot << ": dropping " << n << " blocks after " << sink_blocks << " of "
      << s.blocks.size();
  // As in Release: a destination of a move still in flight retires with that move.
  const bool in_flight = s.last_fence > retired_;
  for (int32_t i = sink_blocks; i < sink_blocks + n; ++i) {
    if (in_flight) {
      pending_.push_back(Pending{s.last_fence, KvTier::kDevice, s.blocks[i]});
    } else {
      Unref(s.blocks[i]);
    }
  }
  s.blocks.erase(s.blocks.begin() + sink_blocks, s.blocks.begin() + sink_blocks + n);
  // After far history's summaries, the K/V is no longer what the tokens alone give: nothing more
  // is registered. (Window release computes the same K/V as a full prefill would.)
  if (sink_blocks > 0) s.chain_cut = true;
  s.dropped = dropped;
  RebuildRuns(s);
}

int32_t KvPager::RunTable(int32_t slot, absl::Span<KvRun> runs) const {
  const SlotKv& s = slots_[slot];
  const size_t n = std::min(runs.size(), s.runs.size());
  std::copy(s.runs.begin(), s.runs.begin() + n, runs.begin());
  return static_cast<int32_t>(n);
}

int64_t KvPager::Capacity(int32_t slot) const {
  const SlotKv& s = slots_[slot];
  return (static_cast<int64_t>(s.blocks.size()) + s.dropped) * options_.block_tokens;
}

KvStats KvPager::Stats() const {
  KvStats st;
  st.block_tokens = options_.block_tokens;
  st.blocks_total = options_.device_blocks;
  for (const SlotKv& s : slots_) {
    if (s.tier != KvTier::kDevice) {
      st.host_blocks_used += static_cast<int64_t>(s.blocks.size());
      continue;
    }
    st.blocks_used += BlocksFor(s.tokens) - s.dropped;
  }
  // A block several histories share holds its KV once (shared_refs_ also counts the rare move
  // still reading a shared block: used is then low by that many until the move retires).
  st.blocks_used = std::max<int64_t>(0, st.blocks_used - shared_refs_);
  st.blocks_reserved = options_.device_blocks - device_.free_count() - cache_.idle_count();
  st.blocks_free = free_device_blocks();
  st.blocks_cached = cache_.idle_count();
  st.host_blocks_cached = host_cache_.count();
  st.bytes_per_block = options_.bytes_per_block;
  return st;
}

bool KvPager::PlanCompaction(int32_t slot, uint64_t fence, std::vector<BlockMove>* moves) {
  SlotKv& s = slots_[slot];
  const int32_t runs = static_cast<int32_t>(s.runs.size());
  if (s.tier != KvTier::kDevice || runs <= options_.max_runs) return true;
  const int64_t held = static_cast<int64_t>(s.blocks.size());
  // Moves blocks [from, from + n) of the history to [dst, dst + n) (taken by the caller).
  auto move = [&](int64_t from, int64_t n, int64_t dst) {
    for (int64_t i = 0; i < n; ++i) {
      const int32_t src = s.blocks[from + i];
      const int32_t to = static_cast<int32_t>(dst + i);
      moves->push_back(BlockMove{KvTier::kDevice, src, KvTier::kDevice, to});
      pending_.push_back(Pending{fence, KvTier::kDevice, src});  // takes over the slot's reference
      NewRef(to);
      s.blocks[from + i] = to;
    }
  };
  // One run too many (the usual case: growth that could not stay in place): where a run can
  // move right next to its neighbour in the history, into free blocks there, the two merge at
  // the cost of copying only the shorter one, with no extent of their total needed.
  if (runs == options_.max_runs + 1) {
    int32_t pick = -1;
    int64_t pick_dst = 0, pick_first = 0, pick_len = 0, first = 0;
    auto all_free = [&](int64_t start, int64_t n) {
      if (start < 0 || start + n > device_.size()) return false;
      for (int64_t b = start; b < start + n; ++b) {
        if (!device_.IsFree(b)) return false;
      }
      return true;
    };
    for (int32_t r = 0; r + 1 < runs; ++r) {
      const KvRun& a = s.runs[r];
      const KvRun& b = s.runs[r + 1];
      const int64_t a_end = static_cast<int64_t>(a.first_block) + a.num_blocks;
      // b moves to right after a, or a to right before b.
      if ((pick < 0 || b.num_blocks < pick_len) && all_free(a_end, b.num_blocks)) {
        pick = r + 1, pick_dst = a_end, pick_first = first + a.num_blocks, pick_len = b.num_blocks;
      }
      if ((pick < 0 || a.num_blocks < pick_len) &&
          all_free(static_cast<int64_t>(b.first_block) - a.num_blocks, a.num_blocks)) {
        pick = r, pick_dst = static_cast<int64_t>(b.first_block) - a.num_blocks,
        pick_first = first, pick_len = a.num_blocks;
      }
      first += a.num_blocks;
    }
    if (pick >= 0) {
      device_.TakeRange(pick_dst, pick_len);
      move(pick_first, pick_len, pick_dst);
      s.last_fence = fence;
      RebuildRuns(s);
      CHECK(static_cast<int32_t>(s.runs.size()) <= options_.max_runs);
      return true;
    }
  }
  // Merge `w` consecutive runs into one new extent, so that max_runs runs stay: the window of
  // them holding the fewest blocks (fewest bytes copied) among those a free extent can take,
  // evicting idle cached blocks for the smallest window when none can. The tail run, the one
  // growing, usually is the shortest: a window ending there gets room for the rest of the
  // expected history where an extent has it.
  const int32_t w = runs - options_.max_runs + 1;
  int64_t window = 0;
  for (int32_t r = 0; r < w; ++r) window += s.runs[r].num_blocks;
  int64_t largest = device_.LargestFree().length;
  int32_t best = -1, smallest = 0;
  int64_t best_blocks = 0, smallest_blocks = window, first = 0, best_first = 0;
  for (int32_t a = 0;; ++a) {
    if (window <= largest && (best < 0 || window < best_blocks)) {
      best = a;
      best_blocks = window;
      best_first = first;
    }
    if (window < smallest_blocks) {
      smallest = a;
      smallest_blocks = window;
    }
    if (a + w >= runs) break;
    first += s.runs[a].num_blocks;
    window += s.runs[a + w].num_blocks - s.runs[a].num_blocks;
  }
  if (best < 0 && EvictWindow(smallest_blocks)) {
    best = smallest;
    best_blocks = smallest_blocks;
    best_first = 0;
    for (int32_t r = 0; r < best; ++r) best_first += s.runs[r].num_blocks;
  }
  if (best >= 0) {
    // (Outside other histories' growth room where that leaves an extent; at the start of what
    // is left, the rest of a tail's expected history after it.)
    MarkClaims(slot);
    Extent e;
    if (best + w == runs && s.expected_tokens > 0) {
      const int64_t expected =
          std::min<int64_t>(BlocksFor(s.expected_tokens) - s.dropped, options_.max_blocks_per_slot);
      e = ShortestUnclaimed(std::max(best_blocks, expected - held + best_blocks));
    }
    if (e.length == 0) e = ShortestUnclaimed(best_blocks);
    ClearClaims();
    if (e.length == 0) e = device_.BestFit(best_blocks);
    device_.TakeRange(e.start, best_blocks);
    move(best_first, best_blocks, e.start);
  } else {
    // No extent takes any window: the whole history moves into the largest free extents, at
    // most max_runs of them, evicting idle cached blocks for the room where that makes it
    // (device to device: on a GPU far cheaper than pausing it to the host tier and back).
    if (!MakeRoomInRuns(held, options_.max_runs)) return false;
    int64_t i = 0;
    while (i < held) {
      const Extent e = TakeNewRun(device_, held - i);
      CHECK(e.length > 0);
      move(i, e.length, e.start);
      i += e.length;
    }
  }
  s.last_fence = fence;
  RebuildRuns(s);
  CHECK(static_cast<int32_t>(s.runs.size()) <= options_.max_runs)
      << s.runs.size() << " runs after compaction";
  return true;
}

absl::Status KvPager::PlanSwapOut(int32_t slot, uint64_t fence, std::vector<BlockMove>* moves) {
  SlotKv& s = slots_[slot];
  if (s.tier != KvTier::kDevice) return absl::FailedPreconditionError("already on host");
  const int64_t n = static_cast<int64_t>(s.blocks.size());
  // Cached host blocks make room for a paused request (its KV is worth more than a cache entry).
  if (!MakeHostRoom(n)) {
    return absl::ResourceExhaustedError(absl::StrCat("host KV tier full: ", n, " blocks needed, ",
                                                     host_.free_count(), " free"));
  }
  std::vector<int32_t>& blocks = s.blocks;
  int64_t i = 0;
  while (i < n) {
    const Extent e = TakeNewRun(host_, n - i);
    for (int64_t j = 0; j < e.length; ++j, ++i) {
      moves->push_back(BlockMove{KvTier::kDevice, blocks[i], KvTier::kHost,
                                 static_cast<int32_t>(e.start + j)});
      pending_.push_back(Pending{fence, KvTier::kDevice, blocks[i]});
      blocks[i] = static_cast<int32_t>(e.start + j);
    }
  }
  s.tier = KvTier::kHost;
  s.last_fence = fence;
  RebuildRuns(s);
  return absl::OkStatus();
}

absl::Status KvPager::PlanSwapIn(int32_t slot, uint64_t fence, std::vector<BlockMove>* moves) {
  SlotKv& s = slots_[slot];
  if (s.tier != KvTier::kHost) return absl::FailedPreconditionError("not on host");
  const int64_t n = static_cast<int64_t>(s.blocks.size());
  if (n > free_device_blocks()) {
    return absl::ResourceExhaustedError(absl::StrCat("KV pool exhausted: swap-in needs ", n,
                                                     " blocks, ", free_device_blocks(), " free"));
  }
  while (device_.free_count() < n) CHECK(EvictOldest());
  int64_t i = 0;
  while (i < n) {
    const Extent e = PlaceRun(slot, i, n - i);
    for (int64_t j = 0; j < e.length; ++j, ++i) {
      moves->push_back(BlockMove{KvTier::kHost, s.blocks[i], KvTier::kDevice,
                                 static_cast<int32_t>(e.start + j)});
      pending_.push_back(Pending{fence, KvTier::kHost, s.blocks[i]});
      s.blocks[i] = static_cast<int32_t>(e.start + j);
      NewRef(s.blocks[i]);
    }
  }
  s.tier = KvTier::kDevice;
  s.last_fence = fence;
  RebuildRuns(s);
  return absl::OkStatus();
}

void KvPager::RetireUpTo(uint64_t completed) {
  retired_ = std::max(retired_, completed);
  size_t keep = 0;
  for (size_t i = 0; i < pending_.size(); ++i) {
    if (pending_[i].fence <= completed) {
      Drop(pending_[i].tier, pending_[i].block);
    } else {
      pending_[keep++] = pending_[i];
    }
  }
  pending_.resize(keep);
}

absl::Status KvPager::CheckInvariants() const {
  for (KvTier tier : {KvTier::kDevice, KvTier::kHost}) {
    const bool dev = tier == KvTier::kDevice;
    const BlockSpace& space = dev ? device_ : host_;
    const PrefixIndex& index = dev ? cache_ : host_cache_;
    const char* name = dev ? "device" : "host";
    std::vector<int> owners(space.size(), 0);
    for (size_t i = 0; i < slots_.size(); ++i) {
      const SlotKv& s = slots_[i];
      if (s.tier != tier) continue;
      std::vector<int32_t> mine = s.blocks;
      std::sort(mine.begin(), mine.end());
      if (std::adjacent_find(mine.begin(), mine.end()) != mine.end()) {
        return absl::InternalError(absl::StrCat("slot ", i, " holds a block twice"));
      }
      for (int32_t b : s.blocks) {
        if (b < 0 || b >= space.size()) return absl::InternalError("block id out of range");
        if (space.IsFree(b)) return absl::InternalError(absl::StrCat("slot ", i, " owns free block ", b));
        // Only the prefix cache shares device blocks, and only registered ones; a slot never
        // holds a host block of the cache.
        if ((++owners[b] > 1 && !(dev && cache_.registered(b))) || (!dev && index.registered(b))) {
          return absl::InternalError(absl::StrCat(name, " block ", b, " owned twice"));
        }
      }
      std::vector<KvRun> runs;
      for (int32_t b : s.blocks) {
        if (!runs.empty() && runs.back().first_block + runs.back().num_blocks == b) {
          ++runs.back().num_blocks;
        } else {
          runs.push_back(KvRun{b, 1});
        }
      }
      if (runs.size() != s.runs.size()) return absl::InternalError("run table out of date");
      for (size_t r = 0; r < runs.size(); ++r) {
        if (runs[r].first_block != s.runs[r].first_block ||
            runs[r].num_blocks != s.runs[r].num_blocks) {
          return absl::InternalError("run table out of date");
        }
      }
    }
    for (const Pending& p : pending_) {
      if (p.tier != tier) continue;
      if (space.IsFree(p.block)) return absl::InternalError("pending block is free");
      if (++owners[p.block] > 1 && !index.registered(p.block)) {
        return absl::InternalError(absl::StrCat("pending ", name, " block ", p.block, " also owned"));
      }
    }
    const int64_t reserved_empty = !dev && options_.host_blocks == 0 ? 1 : 0;  // its block 0
    int64_t held = 0, idle = 0, cached = 0;
    for (int64_t b = 0; b < space.size(); ++b) {
      held += owners[b] > 0;
      const int32_t refs = dev ? refs_[b] : index.registered(b) ? host_refs_[b] : owners[b];
      if (owners[b] != refs) {
        return absl::InternalError(absl::StrCat(name, " block ", b, ": ", refs, " references, ",
                                                owners[b], " holders"));
      }
      if (index.registered(b)) {
        ++cached;
        if (space.IsFree(b)) return absl::InternalError(absl::StrCat("cached ", name, " block ", b, " is free"));
        if (index.linked(b) &&
            index.Find(index.parent_hash(b), index.hash(b), index.tokens(b)) != b) {
          return absl::InternalError(absl::StrCat("cached ", name, " block ", b, " is not found by its key"));
        }
        if (hasher_.Next(index.parent_hash(b), index.tokens(b), options_.block_tokens) !=
            index.hash(b)) {
          return absl::InternalError(absl::StrCat("cached ", name, " block ", b,
                                                  ": chain hash is not its parent's and tokens'"));
        }
        idle += owners[b] == 0;
      } else if (owners[b] == 0 && !space.IsFree(b) && reserved_empty == 0) {
        return absl::InternalError(absl::StrCat(name, " block ", b, " is held by no one and not free"));
      }
    }
    if (const std::string bad = index.CheckChildLists(); !bad.empty()) {
      return absl::InternalError(absl::StrCat(name, " prefix index: ", bad));
    }
    int64_t listed = 0;
    for (int32_t b = index.idle_head(); b >= 0; b = index.idle_next(b)) {
      if (!index.registered(b) || owners[b] != 0) {
        return absl::InternalError(absl::StrCat(name, " idle list holds block ", b));
      }
      if (++listed > idle) break;
    }
    if (listed != idle || idle != index.idle_count() || cached != index.count()) {
      return absl::InternalError(absl::StrCat(name, " idle list ", listed, ", idle ", idle, " (counted ",
                                              index.idle_count(), "), cached ", cached, " (counted ",
                                              index.count(), ")"));
    }
    if (held + idle + space.free_count() + reserved_empty != space.size()) {
      return absl::InternalError(absl::StrCat(name, " tier: held ", held, " + idle ", idle,
                                              " + free ", space.free_count(), " != total ",
                                              space.size()));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvrm
