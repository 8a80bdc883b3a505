// From a trace (or a synthetic arrival process) to the list of requests a replay sends: a time
// window, time compression, token-length scaling and clamping to what the server accepts.
#ifndef KVRM_TOOLS_REPLAY_WORKLOAD_H_
#define KVRM_TOOLS_REPLAY_WORKLOAD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "tools/replay/trace.h"

namespace kvrm::replay {

// One request as the replay sends it.
struct PlannedRequest {
  int index = 0;          // position in the plan, 0-based
  double send_at_s = 0;   // offset from the run's start (already time-scaled)
  double trace_s = 0;     // the arrival in the trace's own clock (unscaled), for reports
  int input_tokens = 1;   // exact prompt length
  int output_tokens = 1;  // exact output length (max_new_tokens with ignore_eos)
  // Prefix-block hashes and the (scaled) tokens each covers; empty when the trace has none.
  std::vector<int64_t> hash_ids;
  int hash_block_tokens = kTraceHashBlockTokens;
  bool clamped = false;  // lengths were cut to fit the server
};

struct ShapeOptions {
  double start_s = 0;        // window start, seconds after the trace's first row
  double duration_s = -1;    // window length; < 0 means to the end
  double time_scale = 1.0;   // multiplies inter-arrival gaps (0.1 = ten times faster)
  double input_scale = 1.0;  // multiplies prompt lengths (and the hash block size)
  double output_scale = 1.0;
  int max_requests = -1;  // < 0: no limit
};

// What the server accepts (from GetModelInfo).
struct ServerLimits {
  int max_context = 0;           // prompt + output must fit
  int max_new_tokens_limit = 0;  // 0: no limit beyond the context
};

// Rows with arrival in [start_s, start_s + duration_s), times relative to the first row in the
// window and multiplied by time_scale, lengths scaled (rounded, at least 1).
absl::StatusOr<std::vector<PlannedRequest>> ShapeTrace(absl::Span<const TraceRequest> trace,
                                                       const ShapeOptions& options);

// Fits every request to `limits`: output is capped at the server's max_new_tokens and at
// max_context - 1, then the prompt is cut so prompt + output <= max_context. Returns how many
// requests changed.
int ClampToServer(const ServerLimits& limits, std::vector<PlannedRequest>* requests);

// ---- synthetic workloads --------------------------------------------------------------------

enum class ArrivalProcess { kPoisson, kGamma };

// "poisson" or "gamma".
absl::StatusOr<ArrivalProcess> ParseArrivalProcess(absl::string_view name);

// `n` arrival offsets (seconds, the first at 0 + its gap) at mean rate `rate` per second. Gamma
// gaps have coefficient of variation `cv` (cv 1 is Poisson; > 1 burstier); Poisson ignores cv.
std::vector<double> SyntheticArrivals(ArrivalProcess process, double rate, double cv, int n,
                                      uint64_t seed);

// One entry of a length mix: a prompt/output pair and its relative weight.
struct LengthMixEntry {
  int input_tokens = 0;
  int output_tokens = 0;
  double weight = 1.0;
};

// Parses "in:out[:weight],in:out[:weight],..." (e.g. "128:256:3,2048:64:1").
absl::StatusOr<std::vector<LengthMixEntry>> ParseLengthMix(absl::string_view text);

// Requests at `arrivals` with lengths drawn from `mix`, or, when `mix` is empty, from the
// empirical (input, output) pairs of `trace` (which must then be non-empty). Lengths are scaled
// as ShapeTrace does; hash ids are not carried (arrivals no longer match the trace's sessions).
absl::StatusOr<std::vector<PlannedRequest>> SyntheticRequests(absl::Span<const double> arrivals,
                                                              absl::Span<const LengthMixEntry> mix,
                                                              absl::Span<const TraceRequest> trace,
                                                              double input_scale,
                                                              double output_scale, uint64_t seed);

// A shared system prompt, as vLLM's benchmark random-prefix-len: every request without hash ids
// gets the same `tokens` tokens before its own prompt (input_tokens grows by that many), so a
// server with prefix caching can reuse their KV. Requests with hash ids keep the trace's.
void PrependSharedPrefix(int tokens, std::vector<PlannedRequest>* plan);
inline constexpr int64_t kSharedPrefixHashId = -1;  // trace hash ids are >= 0

}  // namespace kvrm::replay

#endif  // KVRM_TOOLS_REPLAY_WORKLOAD_H_
