// The physical KV pool: fixed-size blocks of K and V for every layer, allocated once.
//
// Layout per layer, for K and for V: [kv_heads][num_blocks * block_tokens][head_dim] floats.
// A block id is an index; a run of consecutive block ids is one contiguous stretch of tokens
// per head, which is what the run-table attention reads (see kernels/cpu/attention.h).
#ifndef KVRM_RUNTIME_KV_POOL_H_
#define KVRM_RUNTIME_KV_POOL_H_

#include <cstdint>
#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "kernels/cpu/attention.h"
#include "runtime/transfer_plan.h"

namespace kvrm {

struct KvPoolShape {
  int32_t num_layers = 0;
  int32_t kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_tokens = 16;
  int64_t num_blocks = 0;
  DType dtype = DType::kF32;  // of the K and V elements: f32, bf16 or FP8 (--kv_dtype)

  // K and V of one token across all layers and heads.
  int64_t BytesPerToken() const {
    return int64_t{2} * num_layers * kv_heads * head_dim * static_cast<int64_t>(DTypeSize(dtype));
  }
  int64_t BytesPerBlock() const { return BytesPerToken() * block_tokens; }
};

class KvPool {
 public:
  // RESOURCE_EXHAUSTED when the memory cannot be had. `populate`: fault every page in now (the
  // pool a step reads and writes: a block's first use must not pay the kernel for its ~100
  // zeroed pages on the step path); otherwise pages come on first touch (a host tier that is
  // rarely used costs nothing until it is).
  static absl::StatusOr<std::unique_ptr<KvPool>> Create(const KvPoolShape& shape,
                                                        bool populate = false);
  ~KvPool();
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;

  // A pool over memory the caller owns and frees (a GPU backend's device allocation): Layer()
  // views then hold device pointers, for the backend's own kernels only.
  static std::unique_ptr<KvPool> Wrap(const KvPoolShape& shape, void* memory);

  const KvPoolShape& shape() const { return shape_; }
  KvLayerView Layer(int32_t layer) const;
  int64_t bytes() const { return bytes_; }

 private:
  KvPool(const KvPoolShape& shape, void* memory, int64_t bytes, bool owned);

  KvPoolShape shape_;
  char* memory_;  // [layers][K|V][kv_heads][pool_tokens][head_dim] of shape_.dtype
  int64_t bytes_;
  bool owned_;
};

// --kv_dtype's spellings: f32 (or float32), bf16 (bfloat16), fp8 (fp8_e4m3), fp8_e5m2;
// INVALID_ARGUMENT naming the flag otherwise.
absl::StatusOr<DType> ParseKvDtype(std::string_view name);

// Copies `group` from `src` to `dst` (pools of one shape): one memcpy per (layer, K|V, head).
void CopyGroupBetweenPools(const KvPool& src, const KvPool& dst, const TransferGroup& group);

}  // namespace kvrm

#endif  // KVRM_RUNTIME_KV_POOL_H_
