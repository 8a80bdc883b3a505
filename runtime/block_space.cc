#include "runtime/block_space.h"

#include <algorithm>
#include <utility>

#include "common/logging.h"

namespace kvrm {

BlockSpace::BlockSpace(int64_t num_blocks)
    : num_blocks_(num_blocks), free_((num_blocks + 63) / 64, ~uint64_t{0}), free_count_(num_blocks) {
  // Bits past the end are "used" so scans never run off the end.
  if (num_blocks % 64 != 0) free_.back() = (uint64_t{1} << (num_blocks % 64)) - 1;
}

void BlockSpace::Take(int64_t block) {
  DCHECK(IsFree(block));
  free_[block >> 6] &= ~(uint64_t{1} << (block & 63));
  --free_count_;
}

void BlockSpace::Give(int64_t block) {
  DCHECK(!IsFree(block));
  free_[block >> 6] |= uint64_t{1} << (block & 63);
  ++free_count_;
}

void BlockSpace::TakeRange(int64_t start, int64_t length) {
  for (int64_t b = start; b < start + length; ++b) Take(b);
}

int64_t BlockSpace::NextFree(int64_t block) const {
  if (block >= num_blocks_) return num_blocks_;
  int64_t w = block >> 6;
  uint64_t bits = free_[w] & (~uint64_t{0} << (block & 63));
  while (bits == 0) {
    if (++w >= static_cast<int64_t>(free_.size())) return num_blocks_;
    bits = free_[w];
  }
  return std::min<int64_t>(num_blocks_, (w << 6) + __builtin_ctzll(bits));
}

int64_t BlockSpace::FreeRunAt(int64_t block) const {
  int64_t w = block >> 6;
  const int bit = block & 63;
  // Used bits from `block` on, in this word.
  uint64_t used = ~free_[w] & (~uint64_t{0} << bit);
  if (used != 0) return __builtin_ctzll(used) - bit;
  int64_t run = 64 - bit;
  while (++w < static_cast<int64_t>(free_.size())) {
    if (free_[w] == ~uint64_t{0}) {
      run += 64;
      continue;
    }
    run += __builtin_ctzll(~free_[w]);
    break;
  }
  return std::min(run, num_blocks_ - block);
}

Extent BlockSpace::LargestFree() const {
  Extent best;
  for (int64_t b = NextFree(0); b < num_blocks_;) {
    const int64_t run = FreeRunAt(b);
    if (run > best.length) best = Extent{b, run};
    b = NextFree(b + run);
  }
  return best;
}

int64_t BlockSpace::LargestFreeSum(int32_t k) const {
  if (k <= 0) return 0;
  LargestRunsSum top(k);
  for (int64_t b = NextFree(0); b < num_blocks_;) {
    const int64_t run = FreeRunAt(b);
    b = NextFree(b + run);
    top.Push(run);
  }
  return top.sum();
}

LargestRunsSum::LargestRunsSum(int32_t k) : k_(std::clamp(k, 0, BlockSpace::kMaxSumRuns)) {}

void LargestRunsSum::Push(int64_t run) {
  for (int32_t i = 0; i < k_; ++i) {
    if (run > top_[i]) std::swap(run, top_[i]);
  }
}

int64_t LargestRunsSum::sum() const {
  int64_t sum = 0;
  for (int32_t i = 0; i < k_; ++i) sum += top_[i];
  return sum;
}

Extent BlockSpace::FirstFit(int64_t length) const {
  for (int64_t b = NextFree(0); b < num_blocks_;) {
    const int64_t run = FreeRunAt(b);
    if (run >= length) return Extent{b, run};
    b = NextFree(b + run);
  }
  return Extent{};
}

Extent BlockSpace::FreeRunAround(int64_t block) const {
  if (!IsFree(block)) return Extent{};
  // The last used block before `block`, a word at a time.
  int64_t w = block >> 6;
  const int bit = block & 63;
  uint64_t used = bit == 0 ? 0 : ~free_[w] & ((uint64_t{1} << bit) - 1);
  while (used == 0 && --w >= 0) used = ~free_[w];
  const int64_t start = w < 0 ? 0 : (w << 6) + 64 - __builtin_clzll(used);
  return Extent{start, FreeRunAt(start)};
}

Extent BlockSpace::BestFit(int64_t length) const {
  Extent best;
  for (int64_t b = NextFree(0); b < num_blocks_;) {
    const int64_t run = FreeRunAt(b);
    if (run >= length && (best.length == 0 || run < best.length)) {
      best = Extent{b, run};
      if (run == length) break;
    }
    b = NextFree(b + run);
  }
  return best;
}

}  // namespace kvrm
