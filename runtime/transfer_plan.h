// Merge-staged transport, planning half: turns a set of block moves into the fewest transfer
// groups, each one contiguous source range to one contiguous destination range.
#ifndef KVRM_RUNTIME_TRANSFER_PLAN_H_
#define KVRM_RUNTIME_TRANSFER_PLAN_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace kvrm {

enum class KvTier : uint8_t { kDevice, kHost };

struct BlockMove {
  KvTier src_tier = KvTier::kDevice;
  int32_t src = 0;
  KvTier dst_tier = KvTier::kDevice;
  int32_t dst = 0;
};

struct TransferGroup {
  KvTier src_tier = KvTier::kDevice;
  int32_t src_first = 0;
  KvTier dst_tier = KvTier::kDevice;
  int32_t dst_first = 0;
  int32_t num_blocks = 0;
};

// Sorts `moves` and merges every chain of moves whose sources and destinations are both
// consecutive into one group. Moves must be a partial injection (no block read twice or written
// twice) and no move may read a block another move of the same set writes: the groups run in
// any order. Dependent moves go in separate batches (the transport runs batches in order). Groups are maximal: no two of
// them could be joined. Appends to `groups` (reserve it: the planner itself does not allocate
// beyond the output and the sort).
void PlanTransferGroups(absl::Span<BlockMove> moves, std::vector<TransferGroup>* groups);

}  // namespace kvrm

#endif  // KVRM_RUNTIME_TRANSFER_PLAN_H_
