#include "tools/replay/trace.h"

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/json.h"
#include "common/status_macros.h"

namespace kvrm::replay {
namespace {

// One line of a text file with its 1-based number; '\r' of CRLF files is dropped.
struct Line {
  int number;
  absl::string_view text;
};

std::vector<Line> SplitLines(absl::string_view text) {
  std::vector<Line> lines;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    if (absl::EndsWith(line, "\r")) line.remove_suffix(1);
    // Blank lines (a trailing newline, or none: both are fine) carry no request.
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    lines.push_back({number, line});
  }
  return lines;
}

absl::Status LineError(const std::string& name, int line, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(name, ":", line, ": ", message));
}

absl::StatusOr<int64_t> ParseCount(absl::string_view field, absl::string_view what) {
  int64_t value = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(field), &value) || value < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " \"", field, "\" is not a non-negative integer"));
  }
  return value;
}

// Sorts by arrival (traces are nearly sorted; ties keep file order) and makes times relative to
// the first row.
std::vector<TraceRequest> Normalise(std::vector<TraceRequest> rows) {
  std::stable_sort(rows.begin(), rows.end(), [](const TraceRequest& a, const TraceRequest& b) {
    return a.arrival_s < b.arrival_s;
  });
  if (!rows.empty()) {
    const double first = rows.front().arrival_s;
    for (TraceRequest& r : rows) r.arrival_s -= first;
  }
  return rows;
}

// Days from 1970-01-01 to y-m-d in the proleptic Gregorian calendar (H. Hinnant's algorithm).
int64_t DaysFromCivil(int64_t y, int64_t m, int64_t d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const int64_t yoe = y - era * 400;
  const int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + doe - 719468;
}

bool ParseDigits(absl::string_view s, int64_t* out) {
  if (s.empty()) return false;
  int64_t v = 0;
  for (char c : s) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
    v = v * 10 + (c - '0');
  }
  *out = v;
  return true;
}

// Azure timestamps as int64 nanoseconds: a double cannot hold 1.7e9 s to 100 ns exactly.
absl::StatusOr<int64_t> ParseAzureNanos(absl::string_view text) {
  const absl::Status bad = absl::InvalidArgumentError(
      absl::StrCat("timestamp \"", text, "\" is not YYYY-MM-DD HH:MM:SS[.fffffff]"));
  text = absl::StripAsciiWhitespace(text);
  if (text.size() < 19 || text[4] != '-' || text[7] != '-' || text[10] != ' ' || text[13] != ':' ||
      text[16] != ':') {
    return bad;
  }
  int64_t y, mo, d, h, mi, s;
  if (!ParseDigits(text.substr(0, 4), &y) || !ParseDigits(text.substr(5, 2), &mo) ||
      !ParseDigits(text.substr(8, 2), &d) || !ParseDigits(text.substr(11, 2), &h) ||
      !ParseDigits(text.substr(14, 2), &mi) || !ParseDigits(text.substr(17, 2), &s)) {
    return bad;
  }
  // Years bound so that nanoseconds since 1970 fit in int64 (which ends in 2262).
  if (y < 1970 || y > 2200) return bad;
  if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || s > 60) return bad;
  int64_t nanos = 0;
  absl::string_view rest = text.substr(19);
  if (!rest.empty()) {
    if (rest[0] != '.' || rest.size() < 2 || rest.size() > 10) return bad;
    absl::string_view frac = rest.substr(1);
    int64_t f = 0;
    if (!ParseDigits(frac, &f)) return bad;
    for (size_t i = frac.size(); i < 9; ++i) f *= 10;
    nanos = f;
  }
  const int64_t seconds = DaysFromCivil(y, mo, d) * 86400 + h * 3600 + mi * 60 + s;
  return seconds * 1'000'000'000 + nanos;
}

}  // namespace

absl::StatusOr<TraceFormat> ParseTraceFormat(absl::string_view name) {
  if (name == "auto") return TraceFormat::kAuto;
  if (name == "azure") return TraceFormat::kAzure;
  if (name == "mooncake") return TraceFormat::kMooncake;
  if (name == "burstgpt") return TraceFormat::kBurstGpt;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown trace format \"", name, "\" (auto, azure, mooncake, burstgpt)"));
}

absl::StatusOr<double> ParseAzureTimestamp(absl::string_view text) {
  ASSIGN_OR_RETURN(int64_t nanos, ParseAzureNanos(text));
  return static_cast<double>(nanos) * 1e-9;
}

absl::StatusOr<std::vector<TraceRequest>> ParseAzureCsv(absl::string_view text,
                                                        const std::string& name) {
  std::vector<Line> lines = SplitLines(text);
  if (lines.empty() || !absl::StartsWith(lines[0].text, "TIMESTAMP,")) {
    return LineError(name, lines.empty() ? 1 : lines[0].number,
                     "expected the header TIMESTAMP,ContextTokens,GeneratedTokens");
  }
  std::vector<TraceRequest> rows;
  rows.reserve(lines.size() - 1);
  int64_t first_nanos = 0;
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::vector<absl::string_view> f = absl::StrSplit(lines[i].text, ',');
    if (f.size() != 3) {
      return LineError(name, lines[i].number, absl::StrCat("expected 3 fields, got ", f.size()));
    }
    absl::StatusOr<int64_t> nanos = ParseAzureNanos(f[0]);
    absl::StatusOr<int64_t> input = ParseCount(f[1], "ContextTokens");
    absl::StatusOr<int64_t> output = ParseCount(f[2], "GeneratedTokens");
    for (const absl::Status& s : {nanos.status(), input.status(), output.status()}) {
      if (!s.ok()) return LineError(name, lines[i].number, s.message());
    }
    if (rows.empty()) first_nanos = *nanos;
    // Relative to the first row in integer nanoseconds before converting, to keep 100 ns digits.
    rows.push_back({static_cast<double>(*nanos - first_nanos) * 1e-9, *input, *output, {}});
  }
  return Normalise(std::move(rows));
}

absl::StatusOr<std::vector<TraceRequest>> ParseMooncakeJsonl(absl::string_view text,
                                                             const std::string& name) {
  std::vector<TraceRequest> rows;
  for (const Line& line : SplitLines(text)) {
    const std::string where = absl::StrCat(name, ":", line.number);
    absl::StatusOr<Json> parsed =
        ParseJson(std::string_view(line.text.data(), line.text.size()), where, 8);
    if (!parsed.ok()) return parsed.status();
    const Json& j = *parsed;
    if (!j.is_object()) return LineError(name, line.number, "expected a JSON object");
    TraceRequest r;
    const auto* ts = j.contains("timestamp") ? &j["timestamp"] : nullptr;
    if (ts == nullptr || !ts->is_number() || ts->get<double>() < 0) {
      return LineError(name, line.number, "\"timestamp\" must be a non-negative number (ms)");
    }
    r.arrival_s = ts->get<double>() / 1000.0;
    for (const auto& [key, out] :
         {std::pair<const char*, int64_t*>{"input_length", &r.input_tokens},
          {"output_length", &r.output_tokens}}) {
      if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<int64_t>() < 0) {
        return LineError(name, line.number,
                         absl::StrCat("\"", key, "\" must be a non-negative integer"));
      }
      *out = j[key].get<int64_t>();
    }
    if (j.contains("hash_ids")) {
      const Json& ids = j["hash_ids"];
      if (!ids.is_array()) return LineError(name, line.number, "\"hash_ids\" must be an array");
      for (const Json& id : ids) {
        if (!id.is_number_integer()) {
          return LineError(name, line.number, "\"hash_ids\" must hold integers");
        }
        r.hash_ids.push_back(id.get<int64_t>());
      }
    }
    rows.push_back(std::move(r));
  }
  return Normalise(std::move(rows));
}

absl::StatusOr<std::vector<TraceRequest>> ParseBurstGptCsv(absl::string_view text,
                                                           const std::string& name) {
  std::vector<Line> lines = SplitLines(text);
  if (lines.empty() || !absl::StartsWith(lines[0].text, "Timestamp,")) {
    return LineError(name, lines.empty() ? 1 : lines[0].number,
                     "expected the header Timestamp,Model,Request tokens,Response tokens,...");
  }
  std::vector<TraceRequest> rows;
  rows.reserve(lines.size() - 1);
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::vector<absl::string_view> f = absl::StrSplit(lines[i].text, ',');
    if (f.size() != 6) {
      return LineError(name, lines[i].number, absl::StrCat("expected 6 fields, got ", f.size()));
    }
    double ts = 0;
    if (!absl::SimpleAtod(absl::StripAsciiWhitespace(f[0]), &ts) || ts < 0) {
      return LineError(name, lines[i].number,
                       absl::StrCat("Timestamp \"", f[0], "\" is not a non-negative number"));
    }
    absl::StatusOr<int64_t> input = ParseCount(f[2], "Request tokens");
    absl::StatusOr<int64_t> output = ParseCount(f[3], "Response tokens");
    for (const absl::Status& s : {input.status(), output.status()}) {
      if (!s.ok()) return LineError(name, lines[i].number, s.message());
    }
    rows.push_back({ts, *input, *output, {}});
  }
  return Normalise(std::move(rows));
}

absl::StatusOr<std::vector<TraceRequest>> ParseTrace(absl::string_view text,
                                                     const std::string& name, TraceFormat format) {
  if (format == TraceFormat::kAuto) {
    const absl::string_view head = absl::StripLeadingAsciiWhitespace(text);
    if (absl::StartsWith(head, "{")) {
      format = TraceFormat::kMooncake;
    } else if (absl::StartsWith(head, "TIMESTAMP,")) {
      format = TraceFormat::kAzure;
    } else if (absl::StartsWith(head, "Timestamp,")) {
      format = TraceFormat::kBurstGpt;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ":1: unrecognised trace format (give --format=azure|mooncake|burstgpt)"));
    }
  }
  switch (format) {
    case TraceFormat::kAzure:
      return ParseAzureCsv(text, name);
    case TraceFormat::kMooncake:
      return ParseMooncakeJsonl(text, name);
    case TraceFormat::kBurstGpt:
      return ParseBurstGptCsv(text, name);
    case TraceFormat::kAuto:
      break;
  }
  return absl::InternalError("unreachable trace format");
}

absl::StatusOr<std::vector<TraceRequest>> ReadTrace(const std::string& path, TraceFormat format) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return ParseTrace(text, path, format);
}

}  // namespace kvrm::replay
