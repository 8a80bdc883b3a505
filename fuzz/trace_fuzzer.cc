// Fuzzes the replay trace parsers (untrusted downloaded files). The first byte picks the
// format (auto, azure, mooncake, burstgpt); the rest is the file's text. Invariants on success:
// arrivals are finite, sorted and start at 0; token counts are not negative.
#include <cmath>
#include <cstdint>
#include <string>

#include "fuzz/fuzz_util.h"
#include "tools/replay/trace.h"

namespace {
int TestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  using kvrm::replay::TraceFormat;
  constexpr TraceFormat kFormats[] = {TraceFormat::kAuto, TraceFormat::kAzure,
                                      TraceFormat::kMooncake, TraceFormat::kBurstGpt};
  const TraceFormat format = kFormats[data[0] % 4];
  const absl::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  absl::StatusOr<std::vector<kvrm::replay::TraceRequest>> trace =
      kvrm::replay::ParseTrace(text, "fuzz.trace", format);
  if (!trace.ok()) return 0;
  double last = 0;
  for (size_t i = 0; i < trace->size(); ++i) {
    const kvrm::replay::TraceRequest& r = (*trace)[i];
    FUZZ_CHECK(std::isfinite(r.arrival_s));
    FUZZ_CHECK(i > 0 || r.arrival_s == 0);
    FUZZ_CHECK(r.arrival_s >= last);
    FUZZ_CHECK(r.input_tokens >= 0 && r.output_tokens >= 0);
    last = r.arrival_s;
  }
  return 0;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return kvrm::fuzz::RunWithKnownIssues([&] { TestOneInput(data, size); });
}
