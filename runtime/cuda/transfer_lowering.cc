#include "runtime/cuda/transfer_lowering.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvrm::cuda {

absl::StatusOr<PoolCopy2D> LowerTransferGroup(const KvPoolShape& src, const KvPoolShape& dst,
                                              const TransferGroup& g) {
  if (src.num_layers != dst.num_layers || src.kv_heads != dst.kv_heads ||
      src.head_dim != dst.head_dim || src.block_tokens != dst.block_tokens ||
      src.dtype != dst.dtype) {
    return absl::InvalidArgumentError("transfer between pools of different shapes");
  }
  if (g.num_blocks < 1 || g.src_first < 0 || g.dst_first < 0 ||
      int64_t{g.src_first} + g.num_blocks > src.num_blocks ||
      int64_t{g.dst_first} + g.num_blocks > dst.num_blocks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transfer group [", g.src_first, ", +", g.num_blocks, ") -> [", g.dst_first, ", +",
        g.num_blocks, ") outside pools of ", src.num_blocks, " and ", dst.num_blocks,
        " blocks"));
  }
  const int64_t token_bytes = int64_t{src.head_dim} * static_cast<int64_t>(DTypeSize(src.dtype));
  PoolCopy2D c;
  c.src_tier = g.src_tier;
  c.dst_tier = g.dst_tier;
  c.src_offset = int64_t{g.src_first} * src.block_tokens * token_bytes;
  c.dst_offset = int64_t{g.dst_first} * dst.block_tokens * token_bytes;
  c.width = int64_t{g.num_blocks} * src.block_tokens * token_bytes;
  c.src_pitch = src.num_blocks * src.block_tokens * token_bytes;
  c.dst_pitch = dst.num_blocks * dst.block_tokens * token_bytes;
  c.height = int64_t{src.num_layers} * 2 * src.kv_heads;
  return c;
}

void ApplyOnHost(const PoolCopy2D& c, const void* src_base, void* dst_base) {
  const char* s = static_cast<const char*>(src_base) + c.src_offset;
  char* d = static_cast<char*>(dst_base) + c.dst_offset;
  for (int64_t row = 0; row < c.height; ++row) {
    std::memcpy(d + row * c.dst_pitch, s + row * c.src_pitch, c.width);
  }
}

}  // namespace kvrm::cuda
