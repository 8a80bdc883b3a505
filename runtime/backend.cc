#include "runtime/backend.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/lora.h"

namespace kvrm {

absl::Status Backend::DecodeWithChunk(const PrefillChunk&, float*, const StepDescriptor&, float*) {
  return absl::UnimplementedError("this backend runs a prefill chunk and a decode step apart");
}

absl::Status Backend::PrefillChunks(absl::Span<const PrefillChunk>, absl::Span<float* const>,
                                    const StepDescriptor*, float*) {
  return absl::UnimplementedError("this backend runs one prefill chunk a pass");
}

absl::Status Backend::DecodeAndSample(const StepDescriptor&, float*, int32_t*) {
  return absl::UnimplementedError("this backend does not sample on the device");
}

absl::Status Backend::DecodeWithChunkAndSample(const PrefillChunk&, float*,
                                               const StepDescriptor&, float*, int32_t*) {
  return absl::UnimplementedError("this backend does not sample a mixed step on the device");
}

absl::StatusOr<std::shared_ptr<const PreparedLoraAdapter>> Backend::PrepareLoraAdapter(
    const LoraAdapter&) const {
  return absl::FailedPreconditionError(
      "LoRA adapters: this device serves none (the CPU device does: --device=cpu)");
}

absl::Status Backend::SetLoraAdapter(int32_t index, std::shared_ptr<const PreparedLoraAdapter>) {
  return absl::FailedPreconditionError(
      absl::StrCat("LoRA adapter slot ", index, ": this device serves none (the CPU device does)"));
}

absl::Status Backend::CheckLoraAdapterFits(const LoraAdapter& adapter, int32_t slots,
                                           int32_t max_rank) {
  if (slots == 0) {
    return absl::FailedPreconditionError(
        "LoRA adapters: this server has no adapter slots (kvrmd --max_loras)");
  }
  // Every projection's rank (the loader gives each the config's `r`; a hand-built adapter might
  // not): the backends' scratch and slots hold max_rank.
  int32_t rank = adapter.rank;
  for (const LoraLayer& layer : adapter.layers) {
    for (const LoraMatrix& m : layer.m) rank = std::max(rank, m.rank);
  }
  if (rank > max_rank) {
    return absl::InvalidArgumentError(absl::StrCat("LoRA adapter '", adapter.name, "' has rank ",
                                                   rank, "; this server takes ranks up to ",
                                                   max_rank, " (kvrmd --max_lora_rank)"));
  }
  return absl::OkStatus();
}

absl::Status Backend::CheckLoraSlot(int32_t index, int32_t slots) {
  if (index < 0 || index >= slots) {
    return absl::InvalidArgumentError(
        absl::StrCat("LoRA adapter slot ", index, " is not in [0, ", slots, ")"));
  }
  return absl::OkStatus();
}

absl::Status Backend::CreateHostTier(int64_t blocks) {
  if (!host_tier_.empty()) return absl::FailedPreconditionError("host tier created twice");
  for (int32_t r = 0; r < num_kv_pools(); ++r) {
    KvPoolShape shape = kv_pool(r)->shape();
    shape.num_blocks = blocks;
    ASSIGN_OR_RETURN(std::unique_ptr<KvPool> host, KvPool::Create(shape));
    host_tier_.push_back(std::move(host));
  }
  return absl::OkStatus();
}

absl::Status Backend::CopyGroup(const TransferGroup& g) {
  const bool host_side = g.src_tier == KvTier::kHost || g.dst_tier == KvTier::kHost;
  if (host_side && host_tier_.size() != static_cast<size_t>(num_kv_pools())) {
    return absl::InternalError("transfer to the host tier, which was not created");
  }
  for (int32_t r = 0; r < num_kv_pools(); ++r) {
    const KvPool* src = g.src_tier == KvTier::kDevice ? kv_pool(r) : host_tier_[r].get();
    const KvPool* dst = g.dst_tier == KvTier::kDevice ? kv_pool(r) : host_tier_[r].get();
    CopyGroupBetweenPools(*src, *dst, g);
  }
  return absl::OkStatus();
}

}  // namespace kvrm
