#include "runtime/far_history.h"

#include "absl/strings/str_cat.h"

namespace kvrm {

absl::StatusOr<FarHistoryShape> ResolveFarHistory(const FarHistoryOptions& options,
                                                  int32_t block_tokens, int32_t max_context) {
  if (!options.enabled) return FarHistoryShape{};
  if (block_tokens <= 0) return absl::InvalidArgumentError("block tokens must be positive");
  if (options.sink_tokens < 0 || options.sink_tokens > max_context) {
    return absl::InvalidArgumentError(absl::StrCat("--far_history_sinks ", options.sink_tokens,
                                                   " must be in [0, max_context ", max_context,
                                                   "]"));
  }
  if (options.window_tokens <= 0 || options.window_tokens > max_context) {
    return absl::InvalidArgumentError(absl::StrCat("--far_history_window ", options.window_tokens,
                                                   " must be in [1, max_context ", max_context,
                                                   "]"));
  }
  FarHistoryShape shape;
  shape.sink_blocks = (options.sink_tokens + block_tokens - 1) / block_tokens;
  shape.window_blocks = (options.window_tokens + block_tokens - 1) / block_tokens;
  return shape;
}

int32_t FarHistoryMaxSummaries(const FarHistoryShape& shape, int32_t block_tokens,
                               int32_t max_context) {
  return std::max(1, shape.SummariesAt(std::max(0, max_context - 1), block_tokens));
}

int64_t FarHistoryPeakBlocks(const FarHistoryShape& shape, int32_t block_tokens,
                             int32_t prefill_chunk) {
  const int64_t chunk_blocks = (int64_t{prefill_chunk} + block_tokens - 1) / block_tokens;
  return int64_t{shape.sink_blocks} + shape.window_blocks + std::max<int64_t>(1, chunk_blocks);
}

}  // namespace kvrm
