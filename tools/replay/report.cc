#include "tools/replay/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"

namespace kvrm::replay {
namespace {

std::string Row(absl::string_view name, const Distribution& d) {
  return absl::StrFormat("%-22s %8lld %10.2f %10.2f %10.2f %10.2f %10.2f\n", name,
                         static_cast<long long>(d.count), d.mean, d.p50, d.p90, d.p99, d.max);
}

Json DistributionJson(const Distribution& d, bool null_when_empty) {
  if (d.count == 0 && null_when_empty) return nullptr;
  return Json{{"count", d.count}, {"mean", d.mean}, {"p50", d.p50},
              {"p90", d.p90},     {"p99", d.p99},   {"max", d.max}};
}

std::string CsvField(absl::string_view s) {
  if (s.find_first_of(",\"\n\r") == absl::string_view::npos) return std::string(s);
  return absl::StrCat("\"", absl::StrReplaceAll(s, {{"\"", "\"\""}}), "\"");
}

std::string XmlEscape(absl::string_view s) {
  return absl::StrReplaceAll(s, {{"&", "&amp;"}, {"<", "&lt;"}, {">", "&gt;"}, {"\"", "&quot;"}});
}

}  // namespace

std::string FormatTable(const Summary& s) {
  std::string out;
  absl::StrAppendFormat(&out,
                        "requests %d: completed %d, refused (RESOURCE_EXHAUSTED) %d, "
                        "failed %d, clamped to the model %d\n",
                        s.requests, s.completed, s.refused, s.failed, s.clamped);
  for (const auto& [code, n] : s.status_codes)
    absl::StrAppendFormat(&out, "  status %s: %d\n", code, n);
  for (const auto& [reason, n] : s.finish_reasons) {
    absl::StrAppendFormat(&out, "  finish %s: %d\n", reason, n);
  }
  absl::StrAppendFormat(&out,
                        "duration %.2f s, output %lld tokens (%.1f tok/s), %.2f req/s, "
                        "%.2f requests decoding on average, max send lag %.1f ms\n",
                        s.duration_s, static_cast<long long>(s.output_tokens),
                        s.output_tokens_per_s, s.requests_per_s, s.mean_decoding,
                        s.max_send_lag_ms);
  if (s.cached_input_tokens > 0) {
    absl::StrAppendFormat(&out, "prompt tokens %lld, %lld (%.1f%%) from the server's prefix cache\n",
                          static_cast<long long>(s.input_tokens),
                          static_cast<long long>(s.cached_input_tokens),
                          100.0 * s.cached_input_tokens / std::max<int64_t>(1, s.input_tokens));
  }
  absl::StrAppendFormat(&out, "\n%-22s %8s %10s %10s %10s %10s %10s\n", "latency (ms)", "count",
                        "mean", "p50", "p90", "p99", "max");
  out += Row("time to first token", s.ttft_ms);
  out += Row("time per output token", s.tpot_ms);
  out += Row("inter-token latency", s.itl_ms);
  out += Row("end to end", s.e2e_ms);
  if (s.slo.enabled()) {
    absl::StrAppendFormat(&out,
                          "\ngoodput (TTFT <= %g ms, TPOT <= %g ms): %d of %d requests, "
                          "%.2f req/s\n",
                          s.slo.ttft_ms, s.slo.tpot_ms, s.good, s.requests, s.goodput_rps);
  }
  if (std::isnan(s.worst_window_itl_p99_over_median)) {
    absl::StrAppendFormat(&out,
                          "worst %gs-window p99 inter-token latency / run median: undefined (the "
                          "median inter-token latency is %g ms)\n",
                          s.window_s, s.itl_ms.p50);
  } else {
    absl::StrAppendFormat(&out,
                          "worst %gs-window p99 inter-token latency / run median: %.2fx over %zu "
                          "windows\n",
                          s.window_s, s.worst_window_itl_p99_over_median, s.windows.size());
  }
  return out;
}

Json SummaryToJson(const Summary& s) {
  Json j;
  j["requests"] = s.requests;
  j["completed"] = s.completed;
  j["refused"] = s.refused;
  j["failed"] = s.failed;
  j["clamped"] = s.clamped;
  j["status_codes"] = s.status_codes;
  j["finish_reasons"] = s.finish_reasons;
  j["input_tokens"] = s.input_tokens;
  j["cached_input_tokens"] = s.cached_input_tokens;
  j["output_tokens"] = s.output_tokens;
  j["duration_s"] = s.duration_s;
  j["output_tokens_per_s"] = s.output_tokens_per_s;
  j["requests_per_s"] = s.requests_per_s;
  j["max_send_lag_ms"] = s.max_send_lag_ms;
  j["mean_decoding"] = s.mean_decoding;
  j["ttft_ms"] = DistributionJson(s.ttft_ms, false);
  j["tpot_ms"] = DistributionJson(s.tpot_ms, false);
  j["itl_ms"] = DistributionJson(s.itl_ms, false);
  j["e2e_ms"] = DistributionJson(s.e2e_ms, false);
  j["slo"] = s.slo.enabled() ? Json{{"ttft_ms", s.slo.ttft_ms}, {"tpot_ms", s.slo.tpot_ms}}
                             : Json(nullptr);
  j["good"] = s.good;
  j["goodput_rps"] = s.goodput_rps;
  j["window_s"] = s.window_s;
  // null when undefined (JSON has no NaN).
  j["worst_window_itl_p99_over_median"] =
      std::isnan(s.worst_window_itl_p99_over_median) ? Json(nullptr)
                                                     : Json(s.worst_window_itl_p99_over_median);
  Json windows = Json::array();
  for (const Window& w : s.windows) {
    windows.push_back({{"start_s", w.start_s},
                       {"arrivals", w.arrivals},
                       {"tokens", w.tokens},
                       {"itl_ms", DistributionJson(w.itl_ms, true)},
                       {"ttft_ms", DistributionJson(w.ttft_ms, true)}});
  }
  j["windows"] = std::move(windows);
  return j;
}

std::string RecordsToCsv(absl::Span<const RequestRecord> records) {
  std::string out =
      "index,trace_s,scheduled_s,send_s,first_token_s,finish_s,input_tokens,"
      "output_tokens_requested,output_tokens,server_completion_tokens,"
      "server_cached_prompt_tokens,ttft_ms,tpot_ms,e2e_ms,status,finish_reason,error,"
      "token_times_s\n";
  // Cells with no value (no token arrived, no gap to time) are empty, not 0.
  const auto optional = [](bool has, double v, int digits) {
    return has ? absl::StrFormat("%.*f", digits, v) : std::string();
  };
  for (const RequestRecord& r : records) {
    std::vector<std::string> times;
    times.reserve(r.token_times_s.size());
    for (double t : r.token_times_s) times.push_back(absl::StrFormat("%.6f", t));
    absl::StrAppendFormat(
        &out, "%d,%.6f,%.6f,%.6f,%s,%.6f,%d,%d,%d,%d,%d,%s,%s,%.3f,%s,%s,%s,%s\n", r.index,
        r.trace_s, r.scheduled_s, r.send_s, optional(r.first_token_s >= 0, r.first_token_s, 6),
        r.finish_s, r.input_tokens, r.output_tokens_requested, r.output_tokens(),
        r.server_completion_tokens, r.server_cached_prompt_tokens,
        optional(r.first_token_s >= 0, TtftMs(r), 3),
        optional(r.output_tokens() >= 2, TpotMs(r), 3), E2eMs(r), absl::StatusCodeToString(static_cast<absl::StatusCode>(r.grpc_code)),
        r.finish_reason, CsvField(r.error), absl::StrJoin(times, " "));
  }
  return out;
}

std::string RenderSvg(const Summary& s, const std::string& title) {
  // Layout: a latency panel (log scale, ms) above an arrivals panel (bars), sharing the x axis.
  constexpr double kW = 960, kH = 520, kLeft = 70, kRight = 20, kTop = 40;
  constexpr double kLatBottom = 330, kBarTop = 370, kBarBottom = 470;
  const double plot_w = kW - kLeft - kRight;
  const double span_s = std::max(s.window_s, s.windows.size() * s.window_s);
  auto x_of = [&](double t) { return kLeft + t / span_s * plot_w; };

  double lo = INFINITY, hi = 0;
  int max_arrivals = 1;
  for (const Window& w : s.windows) {
    for (const Distribution* d : {&w.itl_ms, &w.ttft_ms}) {
      if (d->count == 0) continue;
      lo = std::min({lo, std::max(d->p50, 1e-3)});
      hi = std::max(hi, d->p99);
    }
    max_arrivals = std::max(max_arrivals, w.arrivals);
  }
  if (!(hi > 0)) lo = 0.1, hi = 1;
  const double log_lo = std::floor(std::log10(std::max(lo, 1e-3)));
  const double log_hi = std::max(log_lo + 1, std::ceil(std::log10(hi)));
  auto y_of = [&](double ms) {
    const double v = (std::log10(std::max(ms, 1e-3)) - log_lo) / (log_hi - log_lo);
    return kLatBottom - std::clamp(v, 0.0, 1.0) * (kLatBottom - kTop);
  };

  std::string out = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%g\" height=\"%g\" "
      "viewBox=\"0 0 %g %g\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
      "<text x=\"%g\" y=\"22\" font-size=\"15\">%s</text>\n",
      kW, kH, kW, kH, kLeft, XmlEscape(title));
  // Latency grid: one line per decade.
  for (double e = log_lo; e <= log_hi; e += 1) {
    const double ms = std::pow(10.0, e);
    absl::StrAppendFormat(&out,
                          "<line x1=\"%g\" y1=\"%.1f\" x2=\"%g\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                          "<text x=\"%g\" y=\"%.1f\" text-anchor=\"end\">%g ms</text>\n",
                          kLeft, y_of(ms), kW - kRight, y_of(ms), kLeft - 6, y_of(ms) + 4, ms);
  }
  struct Series {
    const char* label;
    const char* color;
    const char* dash;
    double (*value)(const Window&);
    bool (*present)(const Window&);
  };
  const Series series[] = {
      {"ITL p50", "#1f77b4", "", [](const Window& w) { return w.itl_ms.p50; },
       [](const Window& w) { return w.itl_ms.count > 0; }},
      {"ITL p99", "#d62728", "", [](const Window& w) { return w.itl_ms.p99; },
       [](const Window& w) { return w.itl_ms.count > 0; }},
      {"TTFT p50", "#2ca02c", "6,3", [](const Window& w) { return w.ttft_ms.p50; },
       [](const Window& w) { return w.ttft_ms.count > 0; }},
      {"TTFT p99", "#ff7f0e", "6,3", [](const Window& w) { return w.ttft_ms.p99; },
       [](const Window& w) { return w.ttft_ms.count > 0; }},
  };
  double legend_x = kLeft + 280;
  for (const Series& se : series) {
    std::string path;
    bool pen_down = false;
    for (const Window& w : s.windows) {
      if (!se.present(w)) {
        pen_down = false;  // an empty window breaks the line
        continue;
      }
      absl::StrAppendFormat(&path, "%s%.1f,%.1f ", pen_down ? "L" : "M",
                            x_of(w.start_s + s.window_s / 2), y_of(se.value(w)));
      pen_down = true;
    }
    absl::StrAppendFormat(&out,
                          "<path d=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" "
                          "stroke-dasharray=\"%s\"/>\n"
                          "<line x1=\"%g\" y1=\"18\" x2=\"%g\" y2=\"18\" stroke=\"%s\" "
                          "stroke-width=\"2\" stroke-dasharray=\"%s\"/>"
                          "<text x=\"%g\" y=\"22\">%s</text>\n",
                          path.empty() ? "M0,0" : path, se.color, se.dash, legend_x + 80,
                          legend_x + 100, se.color, se.dash, legend_x + 104, se.label);
    legend_x += 110;
  }
  // Arrivals per window as bars.
  for (const Window& w : s.windows) {
    const double h = (kBarBottom - kBarTop) * w.arrivals / max_arrivals;
    absl::StrAppendFormat(&out,
                          "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                          "fill=\"#9aa\"/>\n",
                          x_of(w.start_s), kBarBottom - h,
                          std::max(0.5, x_of(s.window_s) - x_of(0) - 0.5), h);
  }
  absl::StrAppendFormat(&out,
                        "<text x=\"%g\" y=\"%g\" text-anchor=\"end\">%d</text>"
                        "<text x=\"%g\" y=\"%g\" text-anchor=\"end\">0</text>"
                        "<text x=\"%g\" y=\"%g\">arrivals per %g s window</text>\n",
                        kLeft - 6, kBarTop + 4, max_arrivals, kLeft - 6, kBarBottom, kLeft,
                        kBarTop - 6, s.window_s);
  // Time axis.
  const double step = std::max(1.0, std::pow(10.0, std::floor(std::log10(span_s / 2))));
  for (double t = 0; t <= span_s + 1e-9; t += step) {
    absl::StrAppendFormat(&out,
                          "<line x1=\"%.1f\" y1=\"%g\" x2=\"%.1f\" y2=\"%g\" stroke=\"#999\"/>"
                          "<text x=\"%.1f\" y=\"%g\" text-anchor=\"middle\">%g</text>\n",
                          x_of(t), kBarBottom, x_of(t), kBarBottom + 4, x_of(t), kBarBottom + 18,
                          t);
  }
  absl::StrAppendFormat(&out,
                        "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">run time (s)</text>\n"
                        "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"#333\"/>\n"
                        "</svg>\n",
                        kLeft + plot_w / 2, kH - 12, kLeft, kLatBottom, kW - kRight, kLatBottom);
  return out;
}

absl::Status WriteFile(const std::string& path, const std::string& contents) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return absl::UnavailableError(absl::StrCat("cannot open ", path, " for writing"));
  f << contents;
  f.close();
  if (!f) return absl::DataLossError(absl::StrCat("failed writing ", path));
  return absl::OkStatus();
}

}  // namespace kvrm::replay
