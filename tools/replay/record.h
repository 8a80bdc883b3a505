// What the replay observed for one request. Times are seconds from the run's start on the
// client's monotonic clock.
#ifndef KVRM_TOOLS_REPLAY_RECORD_H_
#define KVRM_TOOLS_REPLAY_RECORD_H_

#include <string>
#include <vector>

namespace kvrm::replay {

struct RequestRecord {
  int index = 0;
  double trace_s = 0;                 // arrival in the trace's clock (unscaled)
  double scheduled_s = 0;             // when the open loop meant to send it (the arrival)
  double send_s = 0;                  // when the call was started
  double first_token_s = -1;          // -1: no token arrived
  std::vector<double> token_times_s;  // one per generated token, in order
  double finish_s = 0;                // when the stream's status arrived
  int input_tokens = 0;
  int output_tokens_requested = 0;
  int server_completion_tokens = -1;  // Finished.usage.completion_tokens; -1: no final message
  int server_cached_prompt_tokens = 0;  // Finished.usage.cached_prompt_tokens (prefix cache)
  bool clamped = false;
  int grpc_code = 0;          // grpc::StatusCode; 0 = OK
  std::string error;          // the status message, or Finished.error
  std::string finish_reason;  // "LENGTH", "EOS", ..., or "" when the stream had no final message

  int output_tokens() const { return static_cast<int>(token_times_s.size()); }
};

}  // namespace kvrm::replay

#endif  // KVRM_TOOLS_REPLAY_RECORD_H_
