// The free space of one KV tier: a bitmap over block ids with extent search.
//
// Allocation-free after construction. Extent search scans 64 blocks per word, skipping full
// words, so finding a placement costs O(blocks / 64) in the common case.
#ifndef KVRM_RUNTIME_BLOCK_SPACE_H_
#define KVRM_RUNTIME_BLOCK_SPACE_H_

#include <cstdint>
#include <vector>

namespace kvrm {

struct Extent {
  int64_t start = -1;
  int64_t length = 0;
};

class BlockSpace {
 public:
  explicit BlockSpace(int64_t num_blocks);

  int64_t size() const { return num_blocks_; }
  int64_t free_count() const { return free_count_; }
  bool IsFree(int64_t block) const {
    return (free_[block >> 6] >> (block & 63)) & 1u;
  }
  void Take(int64_t block);
  void Give(int64_t block);
  void TakeRange(int64_t start, int64_t length);

  // The longest run of free blocks (the first one among equals); length 0 when full.
  Extent LargestFree() const;
  // The first run of at least `length` free blocks, or {-1, 0}.
  Extent FirstFit(int64_t length) const;
  // Calls f(Extent) for every maximal run of free blocks, in block order.
  template <typename F>
  void ForEachFreeRun(F&& f) const {
    for (int64_t b = NextFree(0); b < num_blocks_;) {
      const int64_t run = FreeRunAt(b);
      f(Extent{b, run});
      b = NextFree(b + run);
    }
  }
  // The maximal run of free blocks that holds `block` ({-1, 0} when it is used).
  Extent FreeRunAround(int64_t block) const;
  // The shortest run of at least `length` free blocks (the first one among equals), or {-1, 0}.
  Extent BestFit(int64_t length) const;
  // Total length of the `k` longest free runs (k <= kMaxSumRuns): how many blocks an allocation
  // taking the largest extents first places in at most k runs.
  static constexpr int32_t kMaxSumRuns = 64;  // the widest run table --kv_max_runs allows
  int64_t LargestFreeSum(int32_t k) const;

 private:
  // Length of the free run starting at `block` (0 if it is used).
  int64_t FreeRunAt(int64_t block) const;
  // Next free block at or after `block`, or num_blocks_.
  int64_t NextFree(int64_t block) const;

  const int64_t num_blocks_;
  std::vector<uint64_t> free_;  // bit set = free
  int64_t free_count_;
};

// The total of the `k` largest run lengths pushed (k clamped to [0, kMaxSumRuns]), without
// allocating: LargestFreeSum's arithmetic, for callers that find runs by their own rule.
class LargestRunsSum {
 public:
  explicit LargestRunsSum(int32_t k);
  void Push(int64_t run);
  int64_t sum() const;

 private:
  int32_t k_;
  int64_t top_[BlockSpace::kMaxSumRuns] = {};  // descending
};

}  // namespace kvrm

#endif  // KVRM_RUNTIME_BLOCK_SPACE_H_
