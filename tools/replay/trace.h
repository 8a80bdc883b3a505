// Request traces: the three public formats the replay tool reads, parsed into one record type.
//
//   Azure LLM inference trace CSV   TIMESTAMP,ContextTokens,GeneratedTokens
//                                   (timestamps "YYYY-MM-DD HH:MM:SS.fffffff", 0-7 fraction digits)
//   Mooncake JSON Lines             {"timestamp": ms, "input_length", "output_length", "hash_ids"}
//   BurstGPT CSV                    Timestamp,Model,Request tokens,Response tokens,Total tokens,
//                                   Log Type (timestamp in seconds)
//
// Parsers never throw; errors are INVALID_ARGUMENT naming "file:line".
#ifndef KVRM_TOOLS_REPLAY_TRACE_H_
#define KVRM_TOOLS_REPLAY_TRACE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvrm::replay {

struct TraceRequest {
  // Seconds from the trace's first row (rows are sorted by arrival after parsing).
  double arrival_s = 0;
  int64_t input_tokens = 0;
  int64_t output_tokens = 0;
  // Prefix-block hashes (Mooncake): equal leading ids mean a shared prompt prefix, one id per
  // kTraceHashBlockTokens tokens. Empty when the format has none.
  std::vector<int64_t> hash_ids;
};

// Tokens per hash id in the Mooncake trace.
inline constexpr int kTraceHashBlockTokens = 512;

enum class TraceFormat { kAuto, kAzure, kMooncake, kBurstGpt };

// "auto", "azure", "mooncake" or "burstgpt".
absl::StatusOr<TraceFormat> ParseTraceFormat(absl::string_view name);

// Each parser takes the whole file's text; `name` is the file name used in error messages.
absl::StatusOr<std::vector<TraceRequest>> ParseAzureCsv(absl::string_view text,
                                                        const std::string& name);
absl::StatusOr<std::vector<TraceRequest>> ParseMooncakeJsonl(absl::string_view text,
                                                             const std::string& name);
absl::StatusOr<std::vector<TraceRequest>> ParseBurstGptCsv(absl::string_view text,
                                                           const std::string& name);

// Picks the parser from the content (a JSON object line, or the CSV header) when kAuto.
absl::StatusOr<std::vector<TraceRequest>> ParseTrace(absl::string_view text,
                                                     const std::string& name, TraceFormat format);

// Reads `path` and parses it.
absl::StatusOr<std::vector<TraceRequest>> ReadTrace(const std::string& path, TraceFormat format);

// Parses "YYYY-MM-DD HH:MM:SS[.f{1,9}]" as seconds since 1970-01-01 (UTC, no zone in the data);
// exposed for tests.
absl::StatusOr<double> ParseAzureTimestamp(absl::string_view text);

}  // namespace kvrm::replay

#endif  // KVRM_TOOLS_REPLAY_TRACE_H_
