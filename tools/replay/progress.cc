#include "tools/replay/progress.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace kvrm::replay {

std::string FormatProgress(const ProgressState& s, bool bar) {
  std::string out;
  if (bar) {
    constexpr int kWidth = 30;
    const int filled = s.total > 0 ? std::clamp(s.done * kWidth / s.total, 0, kWidth) : kWidth;
    out = absl::StrFormat("[%s%s] ", std::string(filled, '#'), std::string(kWidth - filled, '.'));
  }
  absl::StrAppendFormat(&out, "%d/%d done, %d sent, %d in flight, %d errors, %lld tokens, %.1f s",
                        s.done, s.total, s.sent, s.in_flight, s.errors,
                        static_cast<long long>(s.tokens), s.elapsed_s);
  return out;
}

ProgressReporter::ProgressReporter(FILE* out, bool enabled, bool tty, double line_interval_s)
    : out_(out), enabled_(enabled), tty_(tty), interval_s_(tty ? 0.1 : line_interval_s) {}

void ProgressReporter::Update(const ProgressState& state) {
  if (!enabled_ || state.elapsed_s - last_s_ < interval_s_) return;
  last_s_ = state.elapsed_s;
  if (tty_) {
    // \x1b[K clears what a longer previous line left behind.
    fprintf(out_, "\r%s\x1b[K", FormatProgress(state, true).c_str());
  } else {
    fprintf(out_, "replay: %s\n", FormatProgress(state, false).c_str());
  }
  fflush(out_);
}

void ProgressReporter::Finish(const ProgressState& state) {
  if (!enabled_) return;
  if (tty_) {
    fprintf(out_, "\r%s\x1b[K\n", FormatProgress(state, true).c_str());
  } else {
    fprintf(out_, "replay: %s\n", FormatProgress(state, false).c_str());
  }
  fflush(out_);
}

}  // namespace kvrm::replay
