#include "runtime/kv_pool.h"

#include <sys/mman.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvrm {

absl::StatusOr<std::unique_ptr<KvPool>> KvPool::Create(const KvPoolShape& shape) {
  if (shape.num_blocks <= 0 || shape.block_tokens <= 0 || shape.num_layers <= 0 ||
      shape.kv_heads <= 0 || shape.head_dim <= 0) {
    return absl::InvalidArgumentError("kv pool: every dimension must be positive");
  }
  const int64_t bytes = shape.BytesPerBlock() * shape.num_blocks;
  // mmap: page-aligned, zero-filled lazily, and returned to the OS on destruction.
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat("kv pool: cannot map ", bytes, " bytes (",
                                                     shape.num_blocks, " blocks): ",
                                                     std::strerror(errno)));
  }
  return std::unique_ptr<KvPool>(new KvPool(shape, static_cast<float*>(p), bytes));
}

KvPool::KvPool(const KvPoolShape& shape, float* memory, int64_t bytes)
    : shape_(shape), memory_(memory), bytes_(bytes) {}

KvPool::~KvPool() { munmap(memory_, bytes_); }

KvLayerView KvPool::Layer(int32_t layer) const {
  const int64_t pool_tokens = shape_.num_blocks * shape_.block_tokens;
  const int64_t head_stride = pool_tokens * shape_.head_dim;
  const int64_t per_layer = 2 * shape_.kv_heads * head_stride;
  float* base = memory_ + layer * per_layer;
  return KvLayerView{base, base + shape_.kv_heads * head_stride, head_stride, shape_.block_tokens,
                     shape_.head_dim};
}

}  // namespace kvrm
