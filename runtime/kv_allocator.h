// The KV interface the engine sees: per-slot capacity and run tables over the pool's blocks.
//
// Owner: the engine thread (no locking). Implementations: StaticKvAllocator (the static-graph
// baseline: every slot owns max-context contiguous blocks from start-up) and the KV-RM pager.
#ifndef KVRM_RUNTIME_KV_ALLOCATOR_H_
#define KVRM_RUNTIME_KV_ALLOCATOR_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/cpu/attention.h"

namespace kvrm {

// Whole blocks before the first position a row at `position` attends to in a sliding-window
// layer of `window` positions (it attends to [position + 1 - window, position]): the blocks a
// model whose every layer slides reads no more from that row on.
inline int32_t BlocksBehindWindow(int64_t position, int32_t window, int32_t block_tokens) {
  const int64_t first = position + 1 - window;
  return first <= 0 ? 0 : static_cast<int32_t>(first / block_tokens);
}

struct KvStats {
  int32_t block_tokens = 0;
  int64_t blocks_total = 0;
  int64_t blocks_used = 0;      // holding live KV
  int64_t blocks_reserved = 0;  // set aside for requests (>= used)
  int64_t blocks_free = 0;
  int64_t bytes_per_block = 0;
  int64_t host_blocks_used = 0;
  int64_t blocks_cached = 0;  // prefix cache: registered blocks nobody holds (counted in free)
  int64_t host_blocks_cached = 0;  // prefix cache offloaded to the host tier
};

class KvAllocator {
 public:
  virtual ~KvAllocator() = default;
  // Makes room for positions [0, num_tokens) of `slot`. RESOURCE_EXHAUSTED when it cannot.
  virtual absl::Status Grow(int32_t slot, int64_t num_tokens) = 0;
  // Frees every block of `slot` (EOS, stop, cancel, error).
  virtual void Release(int32_t slot) = 0;
  // Writes the slot's run table into `runs`; returns the number of runs.
  virtual int32_t RunTable(int32_t slot, absl::Span<KvRun> runs) const = 0;
  // Positions the slot can hold without growing.
  virtual int64_t Capacity(int32_t slot) const = 0;
  virtual KvStats Stats() const = 0;
};

// The static-graph baseline: slot s owns blocks [s * per_slot, (s + 1) * per_slot) from start-up,
// one run, whatever its request needs.
class StaticKvAllocator : public KvAllocator {
 public:
  StaticKvAllocator(int32_t num_slots, int64_t blocks_per_slot, int32_t block_tokens,
                    int64_t bytes_per_block);
  absl::Status Grow(int32_t slot, int64_t num_tokens) override;
  void Release(int32_t slot) override;
  int32_t RunTable(int32_t slot, absl::Span<KvRun> runs) const override;
  int64_t Capacity(int32_t slot) const override;
  KvStats Stats() const override;

 private:
  const int32_t num_slots_;
  const int64_t blocks_per_slot_;
  const int32_t block_tokens_;
  const int64_t bytes_per_block_;
  std::unique_ptr<int64_t[]> used_tokens_;  // [num_slots]
};

}  // namespace kvrm

#endif  // KVRM_RUNTIME_KV_ALLOCATOR_H_
