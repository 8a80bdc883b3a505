// Progress of a replay on stderr: a redrawn bar on a terminal, a periodic status line otherwise
// (so CI logs stay readable). Owned and called by the replay thread only.
#ifndef KVRM_TOOLS_REPLAY_PROGRESS_H_
#define KVRM_TOOLS_REPLAY_PROGRESS_H_

#include <cstdint>
#include <cstdio>
#include <string>

namespace kvrm::replay {

struct ProgressState {
  int total = 0;
  int sent = 0;
  int done = 0;
  int in_flight = 0;
  int errors = 0;
  int64_t tokens = 0;
  double elapsed_s = 0;
};

// The text of one update (without the leading '\r' or trailing newline); exposed for tests.
std::string FormatProgress(const ProgressState& state, bool bar);

class ProgressReporter {
 public:
  // `enabled` false prints nothing; `tty` picks the bar, else lines every `line_interval_s`.
  ProgressReporter(FILE* out, bool enabled, bool tty, double line_interval_s = 5.0);

  // Call as often as convenient; redraws at most every 0.1 s (bar) or line_interval_s (lines).
  void Update(const ProgressState& state);
  // The final state, always printed (ends the bar's line).
  void Finish(const ProgressState& state);

 private:
  FILE* out_;
  bool enabled_;
  bool tty_;
  double interval_s_;
  double last_s_ = -1e9;
};

}  // namespace kvrm::replay

#endif  // KVRM_TOOLS_REPLAY_PROGRESS_H_
