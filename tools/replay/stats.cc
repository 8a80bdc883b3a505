#include "tools/replay/stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kvrm::replay {
namespace {

constexpr int kResourceExhausted = static_cast<int>(absl::StatusCode::kResourceExhausted);

}  // namespace

double Percentile(absl::Span<const double> sorted, double p) {
  if (sorted.empty()) return 0;
  const double rank = std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - static_cast<double>(lo));
}

Distribution Distribute(std::vector<double> values) {
  Distribution d;
  if (values.empty()) return d;
  std::sort(values.begin(), values.end());
  d.count = static_cast<int64_t>(values.size());
  d.mean = std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(d.count);
  d.p50 = Percentile(values, 50);
  d.p90 = Percentile(values, 90);
  d.p99 = Percentile(values, 99);
  d.max = values.back();
  return d;
}

absl::StatusOr<Slo> ParseSlo(absl::string_view text) {
  const std::vector<absl::string_view> f = absl::StrSplit(text, ',');
  Slo slo;
  if (f.size() != 2 || !absl::SimpleAtod(f[0], &slo.ttft_ms) ||
      !absl::SimpleAtod(f[1], &slo.tpot_ms) || slo.ttft_ms < 0 || slo.tpot_ms < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--slo \"", text, "\" is not ttft_ms,tpot_ms (non-negative numbers)"));
  }
  return slo;
}

bool Completed(const RequestRecord& r) {
  // A stream that ends OK without its final message lost output (or the server broke the
  // protocol): it did not complete. Nor did one cancelled (a drain) or cut by its time limit,
  // nor one that ended without a token: none of them served what was asked.
  static constexpr absl::string_view kDone[] = {"LENGTH", "EOS", "STOP", "TOOL_CALLS"};
  return r.grpc_code == 0 && r.output_tokens() > 0 &&
         std::find(std::begin(kDone), std::end(kDone), r.finish_reason) != std::end(kDone);
}

double TtftMs(const RequestRecord& r) {
  return r.first_token_s < 0 ? 0 : (r.first_token_s - r.send_s) * 1e3;
}

double E2eMs(const RequestRecord& r) { return (r.finish_s - r.send_s) * 1e3; }

double TpotMs(const RequestRecord& r) {
  // First to last token (not to the stream's status, which comes a round trip later).
  const int n = r.output_tokens();
  return n < 2 ? 0 : (r.token_times_s.back() - r.token_times_s.front()) * 1e3 / (n - 1);
}

Summary Summarize(absl::Span<const RequestRecord> records, const Slo& slo, double window_s) {
  Summary s;
  s.slo = slo;
  s.window_s = window_s;
  s.requests = static_cast<int>(records.size());
  if (records.empty()) {
    s.worst_window_itl_p99_over_median = std::nan("");
    return s;
  }

  double start = INFINITY, end = 0, decoding_s = 0;
  std::vector<double> ttft, tpot, itl, e2e;
  for (const RequestRecord& r : records) {
    start = std::min(start, r.send_s);
    end = std::max(end, r.finish_s);
    s.output_tokens += r.output_tokens();
    s.max_send_lag_ms = std::max(s.max_send_lag_ms, (r.send_s - r.scheduled_s) * 1e3);
    if (r.clamped) ++s.clamped;
    if (r.grpc_code != 0) {
      ++s.status_codes[absl::StatusCodeToString(static_cast<absl::StatusCode>(r.grpc_code))];
      if (r.grpc_code == kResourceExhausted) {
        ++s.refused;
      } else {
        ++s.failed;
      }
      continue;
    }
    if (!Completed(r)) {
      ++s.failed;
      ++s.finish_reasons[r.finish_reason.empty() ? "NONE" : r.finish_reason];
      continue;
    }
    ++s.completed;
    ++s.finish_reasons[r.finish_reason];
    s.input_tokens += r.input_tokens;
    s.cached_input_tokens += r.server_cached_prompt_tokens;
    if (r.first_token_s >= 0) ttft.push_back(TtftMs(r));
    if (r.output_tokens() >= 2) tpot.push_back(TpotMs(r));
    e2e.push_back(E2eMs(r));
    if (!r.token_times_s.empty()) decoding_s += r.token_times_s.back() - r.token_times_s.front();
    for (size_t i = 1; i < r.token_times_s.size(); ++i) {
      itl.push_back((r.token_times_s[i] - r.token_times_s[i - 1]) * 1e3);
    }
    const bool ttft_ok = slo.ttft_ms <= 0 || TtftMs(r) <= slo.ttft_ms;
    const bool tpot_ok = slo.tpot_ms <= 0 || TpotMs(r) <= slo.tpot_ms;
    if (ttft_ok && tpot_ok) ++s.good;
  }
  s.duration_s = std::max(0.0, end - start);
  if (s.duration_s > 0) {
    s.output_tokens_per_s = static_cast<double>(s.output_tokens) / s.duration_s;
    s.requests_per_s = s.completed / s.duration_s;
    s.goodput_rps = s.good / s.duration_s;
    s.mean_decoding = decoding_s / s.duration_s;
  }
  s.ttft_ms = Distribute(std::move(ttft));
  s.tpot_ms = Distribute(std::move(tpot));
  s.itl_ms = Distribute(itl);
  s.e2e_ms = Distribute(std::move(e2e));

  // Windows over [0, end] of the run clock (arrivals are scheduled from 0).
  const int n_windows = std::max(1, static_cast<int>(std::ceil(end / window_s)));
  std::vector<std::vector<double>> w_itl(n_windows), w_ttft(n_windows);
  s.windows.resize(n_windows);
  auto window_of = [&](double t) {
    return std::clamp(static_cast<int>(std::floor(t / window_s)), 0, n_windows - 1);
  };
  for (int i = 0; i < n_windows; ++i) s.windows[i].start_s = i * window_s;
  for (const RequestRecord& r : records) {
    ++s.windows[window_of(r.scheduled_s)].arrivals;
    for (size_t i = 0; i < r.token_times_s.size(); ++i) {
      const int w = window_of(r.token_times_s[i]);
      ++s.windows[w].tokens;
      if (i > 0 && Completed(r))
        w_itl[w].push_back((r.token_times_s[i] - r.token_times_s[i - 1]) * 1e3);
    }
    if (Completed(r) && r.first_token_s >= 0) w_ttft[window_of(r.scheduled_s)].push_back(TtftMs(r));
  }
  // Undefined (NaN) without a positive median: no gaps at all, or most of them zero (tokens
  // that arrived in one message), and then no window can be said to be within 3x of it.
  s.worst_window_itl_p99_over_median = s.itl_ms.p50 > 0 ? 0 : std::nan("");
  for (int i = 0; i < n_windows; ++i) {
    s.windows[i].itl_ms = Distribute(std::move(w_itl[i]));
    s.windows[i].ttft_ms = Distribute(std::move(w_ttft[i]));
    if (s.itl_ms.p50 > 0) {
      s.worst_window_itl_p99_over_median =
          std::max(s.worst_window_itl_p99_over_median, s.windows[i].itl_ms.p99 / s.itl_ms.p50);
    }
  }
  return s;
}

}  // namespace kvrm::replay
