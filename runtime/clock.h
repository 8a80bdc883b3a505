// The engine's notion of time, injectable so the scheduler can be tested on a simulated clock.
#ifndef KVRM_RUNTIME_CLOCK_H_
#define KVRM_RUNTIME_CLOCK_H_

#include <mutex>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kvrm {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() = 0;
  // The wall clock.
  static Clock* Real();
};

// A clock that moves only when told (tests). Thread-safe.
class ManualClock final : public Clock {
 public:
  explicit ManualClock(absl::Time start = absl::UnixEpoch() + absl::Hours(24)) : now_(start) {}
  absl::Time Now() override {
    std::lock_guard<std::mutex> lock(mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    std::lock_guard<std::mutex> lock(mu_);
    now_ += d;
  }

 private:
  std::mutex mu_;
  absl::Time now_;
};

}  // namespace kvrm

#endif  // KVRM_RUNTIME_CLOCK_H_
