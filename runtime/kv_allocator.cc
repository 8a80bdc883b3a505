#include "runtime/kv_allocator.h"

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace kvrm {

StaticKvAllocator::StaticKvAllocator(int32_t num_slots, int64_t blocks_per_slot,
                                     int32_t block_tokens, int64_t bytes_per_block)
    : num_slots_(num_slots),
      blocks_per_slot_(blocks_per_slot),
      block_tokens_(block_tokens),
      bytes_per_block_(bytes_per_block),
      used_tokens_(new int64_t[num_slots]()) {}

absl::Status StaticKvAllocator::Grow(int32_t slot, int64_t num_tokens) {
  CHECK(slot >= 0 && slot < num_slots_);
  if (num_tokens > Capacity(slot)) {
    return absl::ResourceExhaustedError(absl::StrCat("slot ", slot, " holds at most ",
                                                     Capacity(slot), " tokens, asked for ",
                                                     num_tokens));
  }
  used_tokens_[slot] = std::max(used_tokens_[slot], num_tokens);
  return absl::OkStatus();
}

void StaticKvAllocator::Release(int32_t slot) { used_tokens_[slot] = 0; }

int32_t StaticKvAllocator::RunTable(int32_t slot, absl::Span<KvRun> runs) const {
  CHECK(!runs.empty());
  runs[0] = KvRun{static_cast<int32_t>(slot * blocks_per_slot_),
                  static_cast<int32_t>(blocks_per_slot_)};
  return 1;
}

int64_t StaticKvAllocator::Capacity(int32_t) const { return blocks_per_slot_ * block_tokens_; }

KvStats StaticKvAllocator::Stats() const {
  KvStats s;
  s.block_tokens = block_tokens_;
  s.blocks_total = num_slots_ * blocks_per_slot_;
  for (int32_t i = 0; i < num_slots_; ++i) {
    s.blocks_used += (used_tokens_[i] + block_tokens_ - 1) / block_tokens_;
  }
  // Static mode reserves everything at start-up: that is the point of the baseline.
  s.blocks_reserved = s.blocks_total;
  s.blocks_free = 0;
  s.bytes_per_block = bytes_per_block_;
  return s;
}

}  // namespace kvrm
