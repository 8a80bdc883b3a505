// A child process for tests, benchmarks and tools that drive kvrmd (or Prometheus) as a real
// process: posix_spawn with its output to a log file, a port-file wait that gives up as soon as
// the child dies, and a destructor that kills (SIGKILL) and reaps a child nobody waited for.
#ifndef KVRM_COMMON_SUBPROCESS_H_
#define KVRM_COMMON_SUBPROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kvrm {

class Subprocess {
 public:
  struct Options {
    // stdout and stderr go here (appended to nothing: the file is truncated); empty: inherited.
    std::string log;
    // When set, stdout goes here instead and only stderr to `log`.
    std::string stdout_path;
  };

  // argv[0] is the program's path.
  static absl::StatusOr<Subprocess> Start(const std::vector<std::string>& argv,
                                          const Options& options);
  Subprocess() = default;
  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) noexcept;
  ~Subprocess();

  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }
  // Sends `signal` (no-op once reaped).
  void Signal(int signal) const;
  // Waits for the child; its exit code, or 128 + the signal that ended it.
  int Wait();
  // The child's exit code if it has ended (reaping it), else nothing; non-blocking.
  bool Exited(int* code);

  // Waits until `path` holds a port number (the daemon's --port_file); FAILED_PRECONDITION when
  // the child exits first, DEADLINE_EXCEEDED after `timeout`. Both name the log's tail.
  absl::StatusOr<int> WaitForPortFile(const std::string& path, absl::Duration timeout);

  // The last `max_bytes` of the log (empty without one).
  std::string LogTail(size_t max_bytes = 4000) const;
  const std::string& log() const { return options_.log; }

 private:
  pid_t pid_ = -1;
  Options options_;
};

// $TEST_TMPDIR under Bazel, else /tmp.
std::string TestTmpDir();

// Multiplier for tests' deadlines, from KVRM_TEST_TIMEOUT_SCALE (default 1): they are sized for
// a plain build, and tools/sanitizers.sh raises it under ThreadSanitizer (5-15x slower).
int TestTimeoutScale();

}  // namespace kvrm

#endif  // KVRM_COMMON_SUBPROCESS_H_
