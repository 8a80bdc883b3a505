#include "runtime/far_history.h"

#include "absl/strings/str_cat.h"

namespace kvrm {

absl::StatusOr<FarHistoryShape> ResolveFarHistory(const FarHistoryOptions& options,
                                                  int32_t block_tokens) {
  if (!options.enabled) return FarHistoryShape{};
  if (block_tokens <= 0) return absl::InvalidArgumentError("block tokens must be positive");
  // Sinks + window at or past max_context are allowed (summaries then never engage; the engine
  // warns): the defaults must work on a short-context model.
  if (options.sink_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--far_history_sinks ", options.sink_tokens, " must be >= 0"));
  }
  if (options.window_tokens <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("--far_history_window ", options.window_tokens,
                                                   " must be >= 1 (tokens)"));
  }
  FarHistoryShape shape;
  shape.sink_blocks =
      static_cast<int32_t>((int64_t{options.sink_tokens} + block_tokens - 1) / block_tokens);
  shape.window_blocks =
      static_cast<int32_t>((int64_t{options.window_tokens} + block_tokens - 1) / block_tokens);
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
