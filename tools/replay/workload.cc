#include "tools/replay/workload.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kvrm::replay {
namespace {

int ScaleLength(int64_t tokens, double scale) {
  const double scaled = std::round(static_cast<double>(tokens) * scale);
  return static_cast<int>(std::clamp(scaled, 1.0, 1e9));
}

}  // namespace

absl::StatusOr<std::vector<PlannedRequest>> ShapeTrace(absl::Span<const TraceRequest> trace,
                                                       const ShapeOptions& options) {
  if (!(options.time_scale > 0)) return absl::InvalidArgumentError("--time_scale must be > 0");
  if (!(options.input_scale > 0) || !(options.output_scale > 0)) {
    return absl::InvalidArgumentError("--input_scale and --output_scale must be > 0");
  }
  if (options.start_s < 0) return absl::InvalidArgumentError("--start must be >= 0");
  const double end_s = options.duration_s < 0 ? INFINITY : options.start_s + options.duration_s;
  const int block_tokens =
      std::max(1, static_cast<int>(std::round(kTraceHashBlockTokens * options.input_scale)));
  std::vector<PlannedRequest> out;
  double first = -1;
  for (const TraceRequest& row : trace) {
    if (row.arrival_s < options.start_s || row.arrival_s >= end_s) continue;
    if (options.max_requests >= 0 && static_cast<int>(out.size()) >= options.max_requests) break;
    if (first < 0) first = row.arrival_s;
    PlannedRequest r;
    r.index = static_cast<int>(out.size());
    r.trace_s = row.arrival_s;
    r.send_at_s = (row.arrival_s - first) * options.time_scale;
    r.input_tokens = ScaleLength(row.input_tokens, options.input_scale);
    r.output_tokens = ScaleLength(row.output_tokens, options.output_scale);
    r.hash_ids = row.hash_ids;
    r.hash_block_tokens = block_tokens;
    out.push_back(std::move(r));
  }
  return out;
}

int ClampToServer(const ServerLimits& limits, std::vector<PlannedRequest>* requests) {
  int changed = 0;
  for (PlannedRequest& r : *requests) {
    int output = r.output_tokens;
    if (limits.max_new_tokens_limit > 0) output = std::min(output, limits.max_new_tokens_limit);
    // Keep at least one prompt token: the output keeps its length first because decode length is
    // what the replay measures, and a prompt can always be shortened.
    output = std::max(1, std::min(output, limits.max_context - 1));
    const int input = std::max(1, std::min(r.input_tokens, limits.max_context - output));
    if (input != r.input_tokens || output != r.output_tokens) {
      r.input_tokens = input;
      r.output_tokens = output;
      r.clamped = true;
      ++changed;
    }
  }
  return changed;
}

absl::StatusOr<ArrivalProcess> ParseArrivalProcess(absl::string_view name) {
  if (name == "poisson") return ArrivalProcess::kPoisson;
  if (name == "gamma") return ArrivalProcess::kGamma;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown arrival process \"", name, "\" (trace, poisson, gamma)"));
}

std::vector<double> SyntheticArrivals(ArrivalProcess process, double rate, double cv, int n,
                                      uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<double> out;
  out.reserve(n);
  double t = 0;
  if (std::isinf(rate)) {
    out.assign(n, 0.0);  // everything queued at once (a saturation run)
    return out;
  }
  if (process == ArrivalProcess::kPoisson || cv <= 0) {
    std::exponential_distribution<double> gap(rate);
    for (int i = 0; i < n; ++i) out.push_back(t += gap(rng));
  } else {
    // Gamma with shape k = 1/cv^2 and mean 1/rate: scale = 1/(rate*k).
    const double shape = 1.0 / (cv * cv);
    std::gamma_distribution<double> gap(shape, 1.0 / (rate * shape));
    for (int i = 0; i < n; ++i) out.push_back(t += gap(rng));
  }
  return out;
}

absl::StatusOr<std::vector<LengthMixEntry>> ParseLengthMix(absl::string_view text) {
  std::vector<LengthMixEntry> mix;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    const std::vector<absl::string_view> f = absl::StrSplit(item, ':');
    LengthMixEntry e;
    if ((f.size() != 2 && f.size() != 3) || !absl::SimpleAtoi(f[0], &e.input_tokens) ||
        !absl::SimpleAtoi(f[1], &e.output_tokens) ||
        (f.size() == 3 && !absl::SimpleAtod(f[2], &e.weight)) || e.input_tokens < 1 ||
        e.output_tokens < 1 || !(e.weight > 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "length mix entry \"", item, "\" is not in:out[:weight] with positive values"));
    }
    mix.push_back(e);
  }
  if (mix.empty()) return absl::InvalidArgumentError("empty length mix");
  return mix;
}

absl::StatusOr<std::vector<PlannedRequest>> SyntheticRequests(absl::Span<const double> arrivals,
                                                              absl::Span<const LengthMixEntry> mix,
                                                              absl::Span<const TraceRequest> trace,
                                                              double input_scale,
                                                              double output_scale, uint64_t seed) {
  if (mix.empty() && trace.empty()) {
    return absl::InvalidArgumentError("synthetic arrivals need a length mix or a trace");
  }
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
  std::vector<double> weights;
  for (const LengthMixEntry& e : mix) weights.push_back(e.weight);
  std::discrete_distribution<size_t> pick_mix(weights.begin(), weights.end());
  std::uniform_int_distribution<size_t> pick_row(0, trace.empty() ? 0 : trace.size() - 1);
  std::vector<PlannedRequest> out;
  out.reserve(arrivals.size());
  for (size_t i = 0; i < arrivals.size(); ++i) {
    int64_t input, output;
    if (!mix.empty()) {
      const LengthMixEntry& e = mix[pick_mix(rng)];
      input = e.input_tokens;
      output = e.output_tokens;
    } else {
      const TraceRequest& row = trace[pick_row(rng)];
      input = row.input_tokens;
      output = row.output_tokens;
    }
    PlannedRequest r;
    r.index = static_cast<int>(i);
    r.send_at_s = arrivals[i];
    r.trace_s = arrivals[i];
    r.input_tokens = ScaleLength(input, input_scale);
    r.output_tokens = ScaleLength(output, output_scale);
    out.push_back(std::move(r));
  }
  return out;
}

void PrependSharedPrefix(int tokens, std::vector<PlannedRequest>* plan) {
  if (tokens <= 0) return;
  for (PlannedRequest& r : *plan) {
    if (!r.hash_ids.empty()) continue;
    r.hash_ids = {kSharedPrefixHashId};
    r.hash_block_tokens = tokens;
    r.input_tokens += tokens;
  }
}

}  // namespace kvrm::replay
