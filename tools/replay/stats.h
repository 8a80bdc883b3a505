// The replay's summary: latency distributions, throughput, goodput under an SLO, and the same
// latencies per fixed window of the run so that bursts show.
#ifndef KVRM_TOOLS_REPLAY_STATS_H_
#define KVRM_TOOLS_REPLAY_STATS_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "tools/replay/record.h"

namespace kvrm::replay {

// Milliseconds. All zero when count is 0.
struct Distribution {
  int64_t count = 0;
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
};

// The p-th percentile (p in [0, 100]) of ascending `sorted` by linear interpolation between
// closest ranks (numpy's default). 0 when empty.
double Percentile(absl::Span<const double> sorted, double p);

// Sorts a copy of `values` and summarises it.
Distribution Distribute(std::vector<double> values);

struct Slo {
  double ttft_ms = 0;  // 0: no bound
  double tpot_ms = 0;  // 0: no bound
  bool enabled() const { return ttft_ms > 0 || tpot_ms > 0; }
};

// Parses "ttft_ms,tpot_ms" (either may be 0 for no bound).
absl::StatusOr<Slo> ParseSlo(absl::string_view text);

// One window [start_s, start_s + width) of the run.
struct Window {
  double start_s = 0;
  int arrivals = 0;      // requests scheduled in the window
  int64_t tokens = 0;    // tokens received in the window
  Distribution itl_ms;   // gaps whose later token arrived in the window
  Distribution ttft_ms;  // TTFT of the requests that arrived in the window
};

struct Summary {
  int requests = 0;
  int completed = 0;  // status OK, a token or more, and finished by LENGTH, EOS, STOP or TOOL_CALLS
  int refused = 0;    // RESOURCE_EXHAUSTED (server full)
  int failed = 0;     // every other error
  int clamped = 0;
  std::map<std::string, int> status_codes;    // code name -> count, errors only
  std::map<std::string, int> finish_reasons;  // of OK streams; "NONE": no final message
  int64_t input_tokens = 0;                   // of completed requests
  int64_t cached_input_tokens = 0;  // ... that the server found in its prefix cache
  int64_t output_tokens = 0;                  // received, all requests
  double duration_s = 0;                      // first send to last finish
  double output_tokens_per_s = 0;
  double requests_per_s = 0;   // completed / duration
  double max_send_lag_ms = 0;  // worst lateness of the open loop against its schedule
  // Requests between their first and last token, averaged over the run (completed requests):
  // by Little's law the token-weighted mean TPOT is this over the rate of tokens after the
  // first, so a server that decodes more requests at once pays in TPOT unless its rate grows
  // as much.
  double mean_decoding = 0;
  Distribution ttft_ms, tpot_ms, itl_ms, e2e_ms;
  Slo slo;
  int good = 0;  // completed within the SLO (all completed when no SLO is set)
  double goodput_rps = 0;
  double window_s = 1.0;
  std::vector<Window> windows;
  // Worst window p99 inter-token latency over the run's median ITL (the burst-spike metric);
  // NaN when the median is not positive (no gaps, or mostly zero ones): undefined, not a pass.
  double worst_window_itl_p99_over_median = 0;
};

Summary Summarize(absl::Span<const RequestRecord> records, const Slo& slo, double window_s = 1.0);

// TTFT, TPOT and end-to-end latency of a completed record, in ms; TPOT is the first to the
// last token over the n - 1 gaps between them, and 0 for a single-token output.
double TtftMs(const RequestRecord& r);
double E2eMs(const RequestRecord& r);
double TpotMs(const RequestRecord& r);
bool Completed(const RequestRecord& r);

}  // namespace kvrm::replay

#endif  // KVRM_TOOLS_REPLAY_STATS_H_
