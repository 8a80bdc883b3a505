// The replay's outputs: a table for people (stdout), JSON (summary and windows), CSV (one row per
// request) and an SVG plot of per-window latency over time with arrivals as bars beneath.
#ifndef KVRM_TOOLS_REPLAY_REPORT_H_
#define KVRM_TOOLS_REPLAY_REPORT_H_

#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/json.h"
#include "tools/replay/record.h"
#include "tools/replay/stats.h"

namespace kvrm::replay {

std::string FormatTable(const Summary& summary);

// {"requests":..., "ttft_ms":{"mean","p50",...}, ..., "windows":[{...}]}. Window latencies of
// empty windows are null.
Json SummaryToJson(const Summary& summary);

// Header plus one row per request: index, trace_s, scheduled_s, send_s, first_token_s, finish_s,
// input_tokens, output_tokens_requested, output_tokens,
// server_completion_tokens, server_cached_prompt_tokens, ttft_ms, tpot_ms, e2e_ms, status,
// finish_reason, error, token_times_s (space-separated, seconds).
std::string RecordsToCsv(absl::Span<const RequestRecord> records);

// A standalone SVG document.
std::string RenderSvg(const Summary& summary, const std::string& title);

absl::Status WriteFile(const std::string& path, const std::string& contents);

}  // namespace kvrm::replay

#endif  // KVRM_TOOLS_REPLAY_REPORT_H_
