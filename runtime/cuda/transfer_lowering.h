// Lowering of a transfer group to one strided copy per rank.
//
// A pool is [layers][K|V][kv_heads][pool_tokens][head_dim] elements of its dtype (f32 or bf16,
// runtime/kv_pool.h; offsets, widths and pitches are bytes: DTypeSize per element), so the
// token range of a group is, in every (layer, K|V, head) row of the pool, one contiguous stretch
// at the same offset: the whole group is one 2-D copy (height layers * 2 * kv_heads, the pools'
// row pitches as strides), i.e. one cudaMemcpy2DAsync on the copy stream. The host tier may have
// a different block count than the device tier, so the two pitches differ.
//
// No CUDA: built and tested on every machine (ApplyOnHost executes a lowered copy with memcpy).
#ifndef KVRM_RUNTIME_CUDA_TRANSFER_LOWERING_H_
#define KVRM_RUNTIME_CUDA_TRANSFER_LOWERING_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "runtime/kv_pool.h"
#include "runtime/transfer_plan.h"

namespace kvrm::cuda {

struct PoolCopy2D {
  KvTier src_tier = KvTier::kDevice;
  KvTier dst_tier = KvTier::kDevice;
  int64_t src_offset = 0;  // bytes from the source pool's base
  int64_t dst_offset = 0;
  int64_t width = 0;       // bytes per row: the group's tokens of one (layer, K|V, head)
  int64_t src_pitch = 0;   // bytes between consecutive rows in the source pool
  int64_t dst_pitch = 0;
  int64_t height = 0;      // rows: layers * 2 * kv_heads
};

// INVALID_ARGUMENT when the shapes differ in anything but num_blocks or the group reaches past
// either pool.
absl::StatusOr<PoolCopy2D> LowerTransferGroup(const KvPoolShape& src, const KvPoolShape& dst,
                                              const TransferGroup& group);

// Executes `copy` between two host buffers (tests; the CPU reference of the device copy).
void ApplyOnHost(const PoolCopy2D& copy, const void* src_base, void* dst_base);

}  // namespace kvrm::cuda

#endif  // KVRM_RUNTIME_CUDA_TRANSFER_LOWERING_H_
