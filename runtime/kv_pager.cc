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
    if (options.prefix_cache) s.links.reserve(options.max_blocks_per_slot);
  }
  // Sources held for copies and blocks retiring with a released slot's moves: a block at most
  // twice per tier, plus a shared block once per slot that moves it, plus the host blocks each
  // onboarding slot reads.
  pending_.reserve(2 * (options.device_blocks + options.host_blocks) +
                   2 * int64_t{options.num_slots} * options.max_blocks_per_slot);
  refs_.assign(options.device_blocks, 0);
  cache_.Init(options.device_blocks, options.block_tokens, options.prefix_cache);
  const bool offload = options.prefix_cache && options.host_prefix_cache && options.host_blocks > 0;
  host_cache_.Init(host_.size(), options.block_tokens, offload);
  if (options.prefix_cache) window_ring_.assign(options.device_blocks, 0);
  claim_.assign(options.device_blocks, 0);
  claimed_at_.reserve(options.num_slots);
  if (offload) {
    host_refs_.assign(options.host_blocks, 0);
    host_written_at_.assign(options.host_blocks, 0);
    host_copy_.assign(options.device_blocks, -1);
    host_copy_gen_.assign(options.device_blocks, 0);
    offload_moves_.reserve(options.device_blocks);
    offload_chain_.assign(options.device_blocks, 0);
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
  if (cache_.registered(block)) {
    cache_.IdlePush(block);
  } else {
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

int32_t KvPager::HostCopy(int32_t block) const {
  if (host_copy_.empty()) return -1;
  const int32_t h = host_copy_[block];
  return h >= 0 && host_cache_.registered(h) && host_cache_.gen(h) == host_copy_gen_[block] &&
                 host_cache_.ParentCurrent(h)
             ? h
             : -1;
}

void KvPager::Offload(int32_t block) {
  if (host_copy_.empty()) return;
  // The chain up from `block` to the first ancestor already on the host (or the root). A block
  // whose parent was evicted since it was registered is unreachable: nothing to keep.
  // (A copy planned in this submission window counts even if its host parent was evicted since:
  // a batch must not read a block twice.)
  auto copied = [&](int32_t x) {
    if (HostCopy(x) >= 0) return true;
    const int32_t h = host_copy_[x];
    return h >= 0 && host_cache_.registered(h) && host_cache_.gen(h) == host_copy_gen_[x] &&
           host_written_at_[h] == kUnsubmitted;
  };
  int32_t n = 0;
  for (int32_t x = block; x >= 0 && !copied(x); x = cache_.parent(x)) {
    if (!cache_.ParentCurrent(x)) return;
    offload_chain_[n++] = x;
  }
  if (n == 0) return;  // already there (its chain was copied when a block after it left)
  if (shed_offloads_) {
    ++shed_;
    return;
  }
  // Host blocks this call places (idle stamps from first_stamp on) are not evicted for its own
  // later blocks.
  uint64_t first_stamp = ~uint64_t{0};
  for (int32_t i = n - 1; i >= 0; --i) {
    const int32_t x = offload_chain_[i];
    const int32_t p = cache_.parent(x);
    const int32_t hp = p < 0 ? -1 : copied(p) ? host_copy_[p] : -1;
    if (p >= 0 && hp < 0) return;  // the parent's copy was evicted for a block of this chain
    const uint64_t hp_gen = p < 0 ? cache_.parent_gen(x) : host_cache_.gen(hp);
    int32_t h = host_cache_.Find(hp, hp_gen, cache_.tokens(x));
    if (h < 0) {
      h = TakeHostBlock(first_stamp);
      if (h < 0) return;
      host_cache_.Insert(h, hp, hp_gen, cache_.tokens(x));
      host_cache_.IdlePush(h);
      first_stamp = std::min(first_stamp, host_cache_.idle_stamp(h));
      host_written_at_[h] = kUnsubmitted;
      offload_moves_.push_back(BlockMove{KvTier::kDevice, x, KvTier::kHost, h});
      last_offload_dst_ = h;
      ++offloaded_;
      // The parent's copy may have been the block just evicted to make room.
      if (p >= 0 && (!copied(p) || host_copy_[p] != hp)) {
        host_cache_.IdleRemove(h);
        host_cache_.Remove(h);
        host_.Give(h);
        offload_moves_.pop_back();
        --offloaded_;
        return;
      }
    }
    host_copy_[x] = h;
    host_copy_gen_[x] = host_cache_.gen(h);
  }
  // Host eviction order: the chain's tail the oldest, its root the youngest (as a released
  // history goes idle on the device), so the host evicts a chain from its end and never orphans
  // its blocks by evicting their parents first. Ancestors already there are refreshed too.
  for (int32_t x = block; x >= 0 && cache_.ParentCurrent(x); x = cache_.parent(x)) {
    const int32_t h = HostCopy(x);
    if (h < 0 || host_refs_[h] > 0) continue;
    host_cache_.IdleRemove(h);
    host_cache_.IdlePush(h);
  }
}

int32_t KvPager::TakeHostBlock(uint64_t stamp_limit) {
  if (host_.free_count() == 0) return EvictHostBlock(stamp_limit);
  int64_t h = last_offload_dst_ + 1;
  if (last_offload_dst_ < 0 || h >= host_.size() || !host_.IsFree(h)) h = host_.LargestFree().start;
  host_.Take(h);
  return static_cast<int32_t>(h);
}

int32_t KvPager::EvictHostBlock(uint64_t stamp_limit) {
  for (int32_t h = host_cache_.idle_head(); h >= 0 && host_cache_.idle_stamp(h) < stamp_limit;
       h = host_cache_.idle_next(h)) {
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
    const int32_t h = EvictHostBlock(~uint64_t{0});
    if (h < 0) return false;
    host_.Give(h);
  }
  return true;
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
      // A move reading it gives it back when its fence retires; until then it stays registered
      // under a key no lookup asks for (parent -2), and its children never match (new gen).
      const std::vector<int32_t> key(host_cache_.tokens(h),
                                     host_cache_.tokens(h) + options_.block_tokens);
      host_cache_.Rekey(h, -2, 0, key.data());
      host_cache_.BumpGen(h);
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
                             std::vector<int32_t>* out, uint64_t salt,
                             std::vector<int32_t>* host_out) const {
  out->clear();
  if (host_out) host_out->clear();
  if (!options_.prefix_cache) return 0;
  const int64_t bt = options_.block_tokens;
  const int64_t n = std::min<int64_t>(max_blocks, static_cast<int64_t>(tokens.size()) / bt);
  int32_t parent = -1;
  uint64_t parent_gen = salt;
  int64_t j = 0;
  for (; j < n; ++j) {
    const int32_t b = cache_.Find(parent, parent_gen, tokens.data() + j * bt);
    if (b < 0) break;
    out->push_back(b);
    parent = b;
    parent_gen = cache_.gen(b);
  }
  if (host_out == nullptr || host_copy_.empty() || j == n) return static_cast<int32_t>(j);
  // The host index goes on from the host copy of the last device block; when that has none
  // (its content was prefilled again after the copy was evicted from the device), from the host
  // chain of the same tokens, looked up from the root.
  if (parent >= 0) {
    const int32_t copy = HostCopy(parent);
    parent = -1;
    parent_gen = salt;
    if (copy >= 0) {
      parent = copy;
      parent_gen = host_cache_.gen(copy);
    } else {
      for (int64_t k = 0; k < j; ++k) {
        const int32_t h = host_cache_.Find(parent, parent_gen, tokens.data() + k * bt);
        if (h < 0) return static_cast<int32_t>(j);
        parent = h;
        parent_gen = host_cache_.gen(h);
      }
    }
  }
  for (; j < n; ++j) {
    const int32_t h = host_cache_.Find(parent, parent_gen, tokens.data() + j * bt);
    if (h < 0) break;
    host_out->push_back(h);
    parent = h;
    parent_gen = host_cache_.gen(h);
  }
  return static_cast<int32_t>(j);
}

void KvPager::AttachPrefix(int32_t slot, absl::Span<const int32_t> blocks) {
  SlotKv& s = slots_[slot];
  CHECK(s.blocks.empty() && s.tier == KvTier::kDevice && s.dropped == 0)
      << "slot " << slot << ": a prefix goes into an empty device-tier slot";
  for (int32_t b : blocks) {
    CHECK(cache_.registered(b)) << "block " << b << " is not in the prefix cache";
    if (refs_[b] == 0) cache_.IdleRemove(b);
    Ref(b);
    Append(s, b);
    // (A matched chain: each block is the link after itself.)
    s.links.emplace_back(b, cache_.gen(b));
  }
  s.tokens = static_cast<int64_t>(blocks.size()) * options_.block_tokens;
}

absl::Status KvPager::OnboardPrefix(int32_t slot, absl::Span<const int32_t> host_blocks,
                                    uint64_t fence, std::vector<BlockMove>* moves,
                                    uint64_t* written_at) {
  if (written_at) *written_at = 0;
  if (host_blocks.empty()) return absl::OkStatus();
  SlotKv& s = slots_[slot];
  CHECK(s.tier == KvTier::kDevice && s.dropped == 0 && s.last_fence <= retired_)
      << "slot " << slot << ": onboarding goes into a device-tier slot with no move in flight";
  for (int32_t h : host_blocks) {
    CHECK(host_cache_.registered(h)) << "host block " << h << " is not in the prefix cache";
  }
  // Held first, so that the growth below (which may offload evicted device blocks into the host
  // tier) cannot evict them.
  for (int32_t h : host_blocks) {
    if (host_refs_[h]++ == 0) host_cache_.IdleRemove(h);
  }
  const size_t first = s.blocks.size();
  const int64_t tokens = static_cast<int64_t>(first + host_blocks.size()) * options_.block_tokens;
  // Given back tail first (here and when the fence retires), so that they go idle in the host's
  // eviction order: a chain's tail the oldest.
  if (absl::Status st = Grow(slot, tokens); !st.ok()) {
    for (size_t i = host_blocks.size(); i-- > 0;) Drop(KvTier::kHost, host_blocks[i]);
    return st;
  }
  for (size_t i = host_blocks.size(); i-- > 0;) {
    const int32_t h = host_blocks[i];
    const int32_t dst = s.blocks[first + i];
    moves->push_back(BlockMove{KvTier::kHost, h, KvTier::kDevice, dst});
    pending_.push_back(Pending{fence, KvTier::kHost, h});  // takes the reference
    host_copy_[dst] = h;
    host_copy_gen_[dst] = host_cache_.gen(h);
    // An offload not submitted yet goes out in the same submission as this move, ahead of it
    // (offloads first), so the move's own fence covers it; its kUnsubmitted stamp must not be
    // handed out as a fence (the engine would keep that owner entry forever).
    if (written_at && host_written_at_[h] > retired_ && host_written_at_[h] != kUnsubmitted) {
      *written_at = std::max(*written_at, host_written_at_[h]);
    }
  }
  s.last_fence = fence;
  return absl::OkStatus();
}

int32_t KvPager::RegisterPrefix(int32_t slot, absl::Span<const int32_t> tokens, uint64_t salt) {
  if (!options_.prefix_cache) return 0;
  SlotKv& s = slots_[slot];
  if (s.tier != KvTier::kDevice || s.last_fence > retired_) return 0;
  // A history whose first blocks were released (window release) goes on from the chain's link
  // after them, when it was walked that far before they went.
  if (static_cast<int32_t>(s.links.size()) < s.dropped) return 0;
  const size_t bt = static_cast<size_t>(options_.block_tokens);
  const size_t first = static_cast<size_t>(s.dropped);
  const size_t n = std::min(tokens.size() / bt, first + s.blocks.size());
  if (n <= first) return 0;
  int32_t parent = s.dropped > 0 ? s.links[first - 1].first : -1;
  uint64_t parent_gen = s.dropped > 0 ? s.links[first - 1].second : salt;
  int32_t added = 0;
  if (s.links.size() < n) s.links.resize(n);  // (within the capacity reserved)
  for (size_t j = first; j < n; ++j) {
    const int32_t b = s.blocks[j - first];
    const int32_t* key = tokens.data() + j * bt;
    if (cache_.registered(b) && cache_.parent(b) == parent && cache_.parent_gen(b) == parent_gen) {
      // Attached, or registered before on this chain.
    } else if (const int32_t twin = cache_.Find(parent, parent_gen, key); twin >= 0) {
      // The same content is cached in another block (two histories prefilled the same prompt
      // at once): this one stays private and the chain goes on through its twin, so that the
      // blocks after it are found after the twin (their K/V follows the same tokens).
      parent = twin;
      parent_gen = cache_.gen(twin);
      s.links[j] = {parent, parent_gen};
      continue;
    } else if (cache_.registered(b)) {
      // Registered under a chain that is gone (a twin it followed was evicted since, and the
      // block before it is registered now in the twin's place): the same tokens lead to it, so
      // it moves to this chain's key. Its own children stay keyed under it.
      cache_.Rekey(b, parent, parent_gen, key);
    } else {
      cache_.Insert(b, parent, parent_gen, key);
      ++added;
    }
    parent = b;
    parent_gen = cache_.gen(b);
    s.links[j] = {parent, parent_gen};
  }
  if (s.links.size() > n) s.links.resize(n);  // (links past n may be stale)
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
    // where they were freed, one at a time, was scattered over as many runs. (In release order,
    // a history's tail before its head: what stays cached of a chain is still reachable, and
    // an offload keeps whole chains.)
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
  // start a run of its own: a released history goes idle last block first, so the next block
  // evicted is the one before the block just placed, never the one after it (a prompt placed so
  // took a run per block, past what compaction can merge, and paused).
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
  // the prefix others are likelier to share.
  const bool in_flight = s.last_fence > retired_;
  for (auto it = s.blocks.rbegin(); it != s.blocks.rend(); ++it) {
    if (in_flight) {
      pending_.push_back(Pending{s.last_fence, s.tier, *it});
    } else {
      Drop(s.tier, *it);
    }
  }
  // Window release: the cached blocks behind the window went idle long before the rest, so they
  // are the oldest on the eviction list, and evicting the chain's start first would stop the
  // whole history from matching (a conversation's next turn). Now that the history ends they go
  // back to the list's recent end, its first block last, as if released with the rest: the tail
  // is evicted first, as for any history. (Chain blocks held by others, or evicted since, are
  // left alone.)
  if (!in_flight && s.tier == KvTier::kDevice && s.dropped > 0 &&
      static_cast<int32_t>(s.links.size()) >= s.dropped) {
    for (int32_t j = s.dropped - 1; j >= 0; --j) {
      const auto [b, gen] = s.links[j];
      if (b >= 0 && cache_.registered(b) && cache_.gen(b) == gen && refs_[b] == 0) {
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
  s.links.clear();
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
  // The prefix chain goes on after the dropped blocks only from the history's start (no sinks):
  // links index logical blocks from there.
  if (sink_blocks > 0) s.links.clear();
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
        if (index.parent(b) != -2 &&
            index.Find(index.parent(b), index.parent_gen(b), index.tokens(b)) != b) {
          return absl::InternalError(absl::StrCat("cached ", name, " block ", b, " is not found by its key"));
        }
        idle += owners[b] == 0;
      } else if (owners[b] == 0 && !space.IsFree(b) && reserved_empty == 0) {
        return absl::InternalError(absl::StrCat(name, " block ", b, " is held by no one and not free"));
      }
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
