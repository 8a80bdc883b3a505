// Pieces of the Prometheus text exposition format (0.0.4): escaping, number formatting and
// sample lines. Kept apart from the registry so the format rules are tested on their own.
#ifndef KVRM_METRICS_EXPOSITION_H_
#define KVRM_METRICS_EXPOSITION_H_

#include <string>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace kvrm {

// HELP text: backslash and line feed are escaped (a quote is not).
std::string EscapeHelp(absl::string_view text);
// Label values: backslash, double quote and line feed are escaped.
std::string EscapeLabelValue(absl::string_view value);
// A sample value or `le` bound: integers without a fraction, otherwise the shortest
// round-tripping decimal; "+Inf", "-Inf", "NaN" as Prometheus spells them.
std::string FormatValue(double value);

// True for [a-zA-Z_:][a-zA-Z0-9_:]* (metric names) or, without colons, label names.
bool IsValidMetricName(absl::string_view name);
bool IsValidLabelName(absl::string_view name);

// Appends `# HELP name help\n# TYPE name type\n`.
void AppendHeader(std::string* out, absl::string_view name, absl::string_view help,
                  absl::string_view type);

// Appends `name{l1="v1",l2="v2"[,le="bound"]} value\n`, labels in the given order, no braces
// when there are none. `le` is appended last when not empty.
void AppendSample(std::string* out, absl::string_view name,
                  absl::Span<const std::string> label_names,
                  absl::Span<const std::string> label_values, absl::string_view le, double value);

}  // namespace kvrm

#endif  // KVRM_METRICS_EXPOSITION_H_
