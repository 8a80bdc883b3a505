// Host side of the step graphs' input upload: packs the committed StepDescriptor (or a prefill
// chunk) into the flat int32 layout of kernels/cuda/step_inputs.h, checking every index the
// kernels will follow, so a bad descriptor is an error here and never an out-of-bounds access on
// the device. No CUDA: built and tested on every machine.
#ifndef KVRM_RUNTIME_CUDA_STEP_PACKING_H_
#define KVRM_RUNTIME_CUDA_STEP_PACKING_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/step_inputs.h"
#include "runtime/backend.h"

namespace kvrm::cuda {

struct PackLimits {
  int64_t pool_blocks = 0;   // physical blocks in the device pool
  int32_t block_tokens = 0;
  int32_t max_context = 0;   // positions
  int32_t vocab_size = 0;
  int32_t lora_adapters = 0;  // LoRA adapter slots: a row's adapter is in [-1, lora_adapters)
  // Window release (StepDescriptor::far_dropped): the model's window where every layer slides;
  // a table may then lack its first blocks wholly behind the window of its row (its first
  // row), and is packed from their end. 0: none may be released.
  int32_t release_window = 0;
};

// Layout of a decode step over `step`'s shape: one row and one run table per slot.
StepInputLayout DecodeLayout(int32_t max_slots, int32_t max_runs);
// Layout of a prefill chunk: `max_chunk` rows sharing one run table.
StepInputLayout PrefillLayout(int32_t max_chunk, int32_t max_runs);
// Layout of a mixed step (a prefill chunk riding with the decode rows in one pass): rows
// [0, max_slots) and tables [0, max_slots) as DecodeLayout; then up to `max_chunk` chunk rows
// sharing table max_slots, whose width is max_runs too (a wider prompt table runs apart).
StepInputLayout MixedLayout(int32_t max_slots, int32_t max_chunk, int32_t max_runs);

// Writes layout.total int32 values to `out` (every element: padding and inactive rows are
// zero). INVALID_ARGUMENT naming the slot and field when an active row's token, position, LoRA
// adapter (StepDescriptor::adapter, PrefillChunk::adapter: packed as 1 + the slot) or run table
// is out of range or its run table does not hold its position (the KV write target).
// With `with_sampling`, active rows marked in step.sampling are packed for sampling on the
// device (sample = 1 and their SamplingRow), checked likewise (temperature finite and >= 0,
// top_k in [0, vocab], top_p in (0, 1], min_p in [0, 1], uniform in [0, 1)); without, no row is.
absl::Status PackDecodeInputs(const StepDescriptor& step, const StepInputLayout& layout,
                              const PackLimits& limits, int32_t* out, bool with_sampling = false);
absl::Status PackPrefillInputs(const PrefillChunk& chunk, const StepInputLayout& layout,
                               const PackLimits& limits, int32_t* out);
// The decode step as PackDecodeInputs and the chunk after it (last_row: the chunk's last row),
// checked likewise; also INVALID_ARGUMENT when the chunk's slot decodes in `step` or its run
// table is wider than the layout's.
absl::Status PackMixedInputs(const PrefillChunk& chunk, const StepDescriptor& step,
                             const StepInputLayout& layout, const PackLimits& limits,
                             int32_t* out, bool with_sampling = false);

// Whether any row of a packed buffer runs a LoRA adapter (the step then replays the graph with
// the adapters' products).
bool AnyAdapterRow(const StepInputLayout& layout, const int32_t* packed);

}  // namespace kvrm::cuda

#endif  // KVRM_RUNTIME_CUDA_STEP_PACKING_H_
