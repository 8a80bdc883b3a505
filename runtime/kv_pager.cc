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
  }
  pending_.reserve(options.device_blocks + options.host_blocks);
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
  if (need > device_.free_count()) {
    return absl::ResourceExhaustedError(absl::StrCat("KV pool exhausted: slot ", slot, " needs ",
                                                     need, " blocks, ", device_.free_count(),
                                                     " free"));
  }
  while (need > 0) {
    if (!s.blocks.empty()) {
      const int64_t next = static_cast<int64_t>(s.runs.back().first_block) + s.runs.back().num_blocks;
      if (next < device_.size() && device_.IsFree(next)) {
        device_.Take(next);
        Append(s, static_cast<int32_t>(next));
        --need;
        continue;
      }
    }
    const Extent e = TakeNewRun(device_, need);
    CHECK(e.length > 0);  // free_count() >= need guarantees a free block
    for (int64_t b = e.start; b < e.start + e.length; ++b) Append(s, static_cast<int32_t>(b));
    need -= e.length;
  }
  s.tokens = std::max(s.tokens, num_tokens);
  return absl::OkStatus();
}

void KvPager::Release(int32_t slot) {
  SlotKv& s = slots_[slot];
  BlockSpace& space = Space(s.tier);
  // Blocks that are destinations of a move still in flight must not be handed to anyone else
  // before the copy lands: they retire with that move's fence instead of being freed now.
  const bool in_flight = s.last_fence > retired_;
  for (int32_t b : s.blocks) {
    if (in_flight) {
      pending_.push_back(Pending{s.last_fence, s.tier, b});
    } else {
      space.Give(b);
    }
  }
  s.blocks.clear();
  s.runs.clear();
  s.tokens = 0;
  s.dropped = 0;
  s.tier = KvTier::kDevice;
  s.last_fence = 0;
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
      device_.Give(s.blocks[i]);
    }
  }
  s.blocks.erase(s.blocks.begin() + sink_blocks, s.blocks.begin() + sink_blocks + n);
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
    st.blocks_reserved += static_cast<int64_t>(s.blocks.size());
  }
  for (const Pending& p : pending_) {
    if (p.tier == KvTier::kDevice) ++st.blocks_reserved;
  }
  st.blocks_free = device_.free_count();
  st.bytes_per_block = options_.bytes_per_block;
  return st;
}

bool KvPager::PlanCompaction(int32_t slot, uint64_t fence, std::vector<BlockMove>* moves) {
  SlotKv& s = slots_[slot];
  const int32_t runs = static_cast<int32_t>(s.runs.size());
  if (s.tier != KvTier::kDevice || runs <= options_.max_runs) return true;
  // Merge the tail runs (the most recent, usually the shortest) so that max_runs - 1 runs stay
  // and one new run holds the rest. Try from the fewest runs moved upwards: fewer bytes.
  const int32_t keep = options_.max_runs - 1;
  int64_t tail_blocks = 0;
  for (int32_t r = keep; r < runs; ++r) tail_blocks += s.runs[r].num_blocks;
  const Extent e = device_.LargestFree();
  if (e.length < tail_blocks) return false;
  const int64_t spare = e.length - tail_blocks;
  const int64_t start = e.start == 0 ? 0 : e.start + spare / 2;
  device_.TakeRange(start, tail_blocks);
  int64_t logical = 0;
  for (int32_t r = 0; r < keep; ++r) logical += s.runs[r].num_blocks;
  for (int64_t i = 0; i < tail_blocks; ++i) {
    const int32_t src = s.blocks[logical + i];
    const int32_t dst = static_cast<int32_t>(start + i);
    moves->push_back(BlockMove{KvTier::kDevice, src, KvTier::kDevice, dst});
    pending_.push_back(Pending{fence, KvTier::kDevice, src});
    s.blocks[logical + i] = dst;
  }
  s.last_fence = fence;
  RebuildRuns(s);
  return true;
}

absl::Status KvPager::PlanSwapOut(int32_t slot, uint64_t fence, std::vector<BlockMove>* moves) {
  SlotKv& s = slots_[slot];
  if (s.tier != KvTier::kDevice) return absl::FailedPreconditionError("already on host");
  const int64_t n = static_cast<int64_t>(s.blocks.size());
  if (n > host_.free_count()) {
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
  if (n > device_.free_count()) {
    return absl::ResourceExhaustedError(absl::StrCat("KV pool exhausted: swap-in needs ", n,
                                                     " blocks, ", device_.free_count(), " free"));
  }
  int64_t i = 0;
  while (i < n) {
    const Extent e = TakeNewRun(device_, n - i);
    for (int64_t j = 0; j < e.length; ++j, ++i) {
      moves->push_back(BlockMove{KvTier::kHost, s.blocks[i], KvTier::kDevice,
                                 static_cast<int32_t>(e.start + j)});
      pending_.push_back(Pending{fence, KvTier::kHost, s.blocks[i]});
      s.blocks[i] = static_cast<int32_t>(e.start + j);
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
      Space(pending_[i].tier).Give(pending_[i].block);
    } else {
      pending_[keep++] = pending_[i];
    }
  }
  pending_.resize(keep);
}

absl::Status KvPager::CheckInvariants() const {
  for (KvTier tier : {KvTier::kDevice, KvTier::kHost}) {
    const BlockSpace& space = tier == KvTier::kDevice ? device_ : host_;
    std::vector<int> owners(space.size(), 0);
    int64_t owned = 0;
    for (size_t i = 0; i < slots_.size(); ++i) {
      const SlotKv& s = slots_[i];
      if (s.tier != tier) continue;
      for (int32_t b : s.blocks) {
        if (b < 0 || b >= space.size()) return absl::InternalError("block id out of range");
        if (space.IsFree(b)) return absl::InternalError(absl::StrCat("slot ", i, " owns free block ", b));
        if (++owners[b] > 1) return absl::InternalError(absl::StrCat("block ", b, " owned twice"));
        ++owned;
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
      if (++owners[p.block] > 1) return absl::InternalError(absl::StrCat("pending block ", p.block, " also owned"));
      ++owned;
    }
    const int64_t total = tier == KvTier::kDevice ? options_.device_blocks
                                                  : std::max<int64_t>(1, options_.host_blocks);
    const int64_t reserved_empty = tier == KvTier::kHost && options_.host_blocks == 0 ? 1 : 0;
    if (owned + space.free_count() + reserved_empty != total) {
      return absl::InternalError(absl::StrCat("tier ", static_cast<int>(tier), ": owned ", owned,
                                              " + free ", space.free_count(), " != total ", total));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvrm
