// Far-history summaries (--far_history; off by default; approximate when on).
//
// A slot's history is attended in three parts: the first `sink_blocks` logical blocks (attention
// sinks, as in StreamingLLM) and the last `window_blocks` logical blocks (the block being written
// included) exactly; every block in between ("distant") through one summary entry: the mean of
// its B keys and the mean of its B values, whose score gets + log(B) so the entry weighs as the B
// tokens it stands for (docs/runtime.md, "Far-history summaries", says why).
//
// Once a block is summarized its KV blocks go back to the pager, so while decoding a slot holds
// at most sink_blocks + window_blocks + 1 device blocks whatever its history length; its summary
// entries (at most SummariesAt(max_context - 1)) live in a store the backend sizes at start-up.
//
// The policy is a pure function of the position, so decode, chunked prefill and a recompute after
// a dropped KV all attend to the same set of exact tokens and summaries, and get the same bits.
#ifndef KVRM_RUNTIME_FAR_HISTORY_H_
#define KVRM_RUNTIME_FAR_HISTORY_H_

#include <algorithm>
#include <cstdint>

#include "absl/status/statusor.h"

namespace kvrm {

// What the operator asks for, in tokens (kvrmd's --far_history, --far_history_sinks,
// --far_history_window).
struct FarHistoryOptions {
  bool enabled = false;
  int32_t sink_tokens = 16;      // rounded up to whole blocks; 0: no sinks
  int32_t window_tokens = 1024;  // rounded up to whole blocks; at least one block
};

// The resolved policy in blocks. All zero: off (every step attends over the full history).
struct FarHistoryShape {
  int32_t sink_blocks = 0;    // logical blocks [0, sink_blocks): always exact
  int32_t window_blocks = 0;  // the last window_blocks logical blocks: exact; 0 means off

  bool enabled() const { return window_blocks > 0; }
  // Summary entries a query at `position` attends to: entry j stands for logical block
  // sink_blocks + j, for the blocks between the sinks and the position's window.
  int32_t SummariesAt(int64_t position, int32_t block_tokens) const {
    if (!enabled()) return 0;
    const int64_t current = position / block_tokens;
    return static_cast<int32_t>(std::max<int64_t>(0, current - window_blocks + 1 - sink_blocks));
  }
  friend bool operator==(const FarHistoryShape& a, const FarHistoryShape& b) {
    return a.sink_blocks == b.sink_blocks && a.window_blocks == b.window_blocks;
  }
  friend bool operator!=(const FarHistoryShape& a, const FarHistoryShape& b) { return !(a == b); }
};

// Validates the options (INVALID_ARGUMENT naming the flag) and rounds them to blocks. Off gives
// the all-zero shape. Sinks + window may reach past max_context (then nothing is summarized).
absl::StatusOr<FarHistoryShape> ResolveFarHistory(const FarHistoryOptions& options,
                                                  int32_t block_tokens);

// Summary entries one slot may need: SummariesAt(max_context - 1), at least 1 (store shape).
int32_t FarHistoryMaxSummaries(const FarHistoryShape& shape, int32_t block_tokens,
                               int32_t max_context);

// Device blocks one slot holds at most, far history on: sinks + window + the larger of one block
// (decode: the block that just left the window is freed after the step that summarizes it) and
// one prefill chunk's worth (a chunk's rows need their own windows, the first row's included).
int64_t FarHistoryPeakBlocks(const FarHistoryShape& shape, int32_t block_tokens,
                             int32_t prefill_chunk);

}  // namespace kvrm

#endif  // KVRM_RUNTIME_FAR_HISTORY_H_
