#include "runtime/device_sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace kvrm {
namespace {

double Clean(float x) {
  return std::isnan(x) ? -std::numeric_limits<double>::infinity() : static_cast<double>(x);
}

}  // namespace

absl::Status CheckDeviceSampling(const DeviceSampling& p, int32_t vocab_size) {
  auto bad = [](const char* field, double value, const char* range) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.", field, " = ", value, " outside ", range));
  };
  if (!(p.temperature >= 0.0f) || std::isinf(p.temperature)) {
    return bad("temperature", p.temperature, "[0, inf)");
  }
  if (p.top_k < 0 || p.top_k > vocab_size) return bad("top_k", p.top_k, "[0, vocab]");
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) return bad("top_p", p.top_p, "(0, 1]");
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) return bad("min_p", p.min_p, "[0, 1]");
  if (!(p.uniform >= 0.0f && p.uniform < 1.0f)) return bad("uniform", p.uniform, "[0, 1)");
  return absl::OkStatus();
}

DeviceSampleResult SampleLikeDevice(absl::Span<const float> logits, const DeviceSampling& p,
                                    std::vector<double>& pr) {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  constexpr double kInf = std::numeric_limits<double>::infinity();
  DeviceSampleResult result;
  double mx = -kInf, second = -kInf;
  for (int32_t v = 0; v < vocab; ++v) {
    const double x = Clean(logits[v]);
    if (x > mx) {
      second = mx;
      mx = x;
      result.token = v;
    } else if (x > second) {
      second = x;
    }
  }
  if (p.temperature == 0.0f || mx == -kInf) {
    result.margin = mx == -kInf || second == -kInf ? kInf : (mx - second) / std::max(1.0, std::abs(mx));
    if (mx == -kInf) result.token = 0;
    return result;
  }
  pr.resize(vocab);
  const bool has_inf = mx == kInf;
  for (int32_t v = 0; v < vocab; ++v) {
    const double x = Clean(logits[v]);
    pr[v] = has_inf ? (x == kInf ? 1.0 : 0.0) : std::exp((x - mx) / p.temperature);
  }
  // Thresholds from the sorted probabilities (largest first). Sorting a copy is O(V log V):
  // fine for a reference.
  std::vector<double> sorted(pr);
  std::sort(sorted.begin(), sorted.end(), [](double a, double b) { return a > b; });
  double threshold = 0;
  if (p.top_k > 0 && p.top_k < vocab) threshold = sorted[p.top_k - 1];
  if (p.top_p < 1.0f) {
    double kept = 0;
    for (double v : sorted) kept += v >= threshold ? v : 0;
    double acc = 0;
    for (double v : sorted) {
      if (v < threshold) break;
      acc += v;
      if (acc >= static_cast<double>(p.top_p) * kept) {
        threshold = std::max(threshold, v);
        break;
      }
    }
  }
  threshold = std::max(threshold, static_cast<double>(p.min_p));
  double total = 0;
  for (double v : pr) total += v >= threshold && v > 0 ? v : 0;
  const double target = static_cast<double>(p.uniform) * total;
  double c = 0;
  int32_t pick = -1;
  double before = 0;
  for (int32_t v = 0; v < vocab; ++v) {
    if (pr[v] < threshold || pr[v] <= 0) continue;
    pick = v;
    before = c;
    c += pr[v];
    if (c > target) break;
  }
  result.token = std::max(pick, 0);
  result.margin = total > 0 ? std::min(c - target, target - before) / total : kInf;
  return result;
}

}  // namespace kvrm
