#include "runtime/kv_pool.h"

#include <sys/mman.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvrm {

absl::StatusOr<std::unique_ptr<KvPool>> KvPool::Create(const KvPoolShape& shape, bool populate) {
  if (shape.num_blocks <= 0 || shape.block_tokens <= 0 || shape.num_layers <= 0 ||
      shape.kv_heads <= 0 || shape.head_dim <= 0) {
    return absl::InvalidArgumentError("kv pool: every dimension must be positive");
  }
  if (shape.dtype == DType::kF16) {
    return absl::InvalidArgumentError("kv pool: K/V dtype must be f32, bf16, fp8_e4m3 or fp8_e5m2");
  }
  const int64_t bytes = shape.BytesPerBlock() * shape.num_blocks;
  // mmap: page-aligned, zeroed, and returned to the OS on destruction.
  const int flags = MAP_PRIVATE | MAP_ANONYMOUS | (populate ? MAP_POPULATE : 0);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat("kv pool: cannot map ", bytes, " bytes (",
                                                     shape.num_blocks, " blocks): ",
                                                     std::strerror(errno)));
  }
  return std::unique_ptr<KvPool>(new KvPool(shape, p, bytes, true));
}

std::unique_ptr<KvPool> KvPool::Wrap(const KvPoolShape& shape, void* memory) {
  return std::unique_ptr<KvPool>(
      new KvPool(shape, memory, shape.BytesPerBlock() * shape.num_blocks, false));
}

KvPool::KvPool(const KvPoolShape& shape, void* memory, int64_t bytes, bool owned)
    : shape_(shape), memory_(static_cast<char*>(memory)), bytes_(bytes), owned_(owned) {}

KvPool::~KvPool() {
  if (owned_) munmap(memory_, bytes_);
}

KvLayerView KvPool::Layer(int32_t layer) const {
  const int64_t pool_tokens = shape_.num_blocks * shape_.block_tokens;
  const int64_t head_stride = pool_tokens * shape_.head_dim;
  const int64_t elem = DTypeSize(shape_.dtype);
  const int64_t per_layer = 2 * shape_.kv_heads * head_stride * elem;  // bytes
  char* base = memory_ + layer * per_layer;
  char* values = base + shape_.kv_heads * head_stride * elem;
  return KvLayerView{base, values, head_stride, shape_.block_tokens, shape_.head_dim, shape_.dtype};
}

absl::StatusOr<DType> ParseKvDtype(std::string_view name) {
  if (name == "f32" || name == "float32") return DType::kF32;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  if (name == "fp8" || name == "fp8_e4m3") return DType::kF8E4M3;
  if (name == "fp8_e5m2") return DType::kF8E5M2;
  return absl::InvalidArgumentError(
      absl::StrCat("--kv_dtype=", std::string(name), ": f32, bf16, fp8 (fp8_e4m3) or fp8_e5m2"));
}

void CopyGroupBetweenPools(const KvPool& src, const KvPool& dst, const TransferGroup& g) {
  // The pool layout keeps consecutive blocks contiguous per head, so a group is one memcpy per
  // (layer, K|V, head).
  const KvPoolShape& shape = src.shape();
  const int64_t bytes = static_cast<int64_t>(g.num_blocks) * shape.block_tokens * shape.head_dim *
                        static_cast<int64_t>(DTypeSize(shape.dtype));
  const int64_t src_tok = static_cast<int64_t>(g.src_first) * shape.block_tokens;
  const int64_t dst_tok = static_cast<int64_t>(g.dst_first) * shape.block_tokens;
  for (int32_t layer = 0; layer < shape.num_layers; ++layer) {
    const KvLayerView s = src.Layer(layer);
    const KvLayerView d = dst.Layer(layer);
    for (int32_t h = 0; h < shape.kv_heads; ++h) {
      std::memcpy(d.KeyBytes(h, dst_tok), s.KeyBytes(h, src_tok), bytes);
      std::memcpy(d.ValueBytes(h, dst_tok), s.ValueBytes(h, src_tok), bytes);
    }
  }
}

}  // namespace kvrm
