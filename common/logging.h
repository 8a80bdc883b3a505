// Minimal logging and CHECK macros (Abseil 20220623 has no absl/log).
//
// LOG(INFO) << ...; writes one line to stderr with a timestamp, severity and file:line.
// CHECK(cond) aborts with the condition's text; DCHECK is compiled out under NDEBUG.
#ifndef KVRM_COMMON_LOGGING_H_
#define KVRM_COMMON_LOGGING_H_

#include <sstream>

namespace kvrm {

enum class LogSeverity { kInfo, kWarning, kError, kFatal };

// Lines below this severity are dropped (default kInfo; set from --log_level or KVRM_LOG_LEVEL).
void SetMinLogSeverity(LogSeverity severity);
LogSeverity MinLogSeverity();

class LogMessage {
 public:
  LogMessage(LogSeverity severity, const char* file, int line);
  ~LogMessage();  // Writes the line; aborts for kFatal.
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  LogSeverity severity_;
  std::ostringstream stream_;
};

// Swallows a stream expression when a log line is disabled.
struct LogVoidify {
  void operator&(std::ostream&) {}
};

}  // namespace kvrm

#define KVRM_LOG_INFO ::kvrm::LogSeverity::kInfo
#define KVRM_LOG_WARNING ::kvrm::LogSeverity::kWarning
#define KVRM_LOG_ERROR ::kvrm::LogSeverity::kError
#define KVRM_LOG_FATAL ::kvrm::LogSeverity::kFatal

#define LOG(severity)                                                   \
  (KVRM_LOG_##severity < ::kvrm::MinLogSeverity())                      \
      ? (void)0                                                         \
      : ::kvrm::LogVoidify() &                                          \
            ::kvrm::LogMessage(KVRM_LOG_##severity, __FILE__, __LINE__) \
                .stream()

#define CHECK(cond)                                                           \
  (cond) ? (void)0                                                            \
         : ::kvrm::LogVoidify() &                                             \
               ::kvrm::LogMessage(::kvrm::LogSeverity::kFatal, __FILE__, __LINE__) \
                       .stream()                                              \
                   << "Check failed: " #cond " "

#define CHECK_OK(expr)                                                    \
  do {                                                                    \
    const ::absl::Status kvrm_check_status_ = (expr);                     \
    CHECK(kvrm_check_status_.ok()) << kvrm_check_status_.ToString();      \
  } while (0)

#ifdef NDEBUG
#define DCHECK(cond) \
  while (false) CHECK(cond)
#else
#define DCHECK(cond) CHECK(cond)
#endif

#endif  // KVRM_COMMON_LOGGING_H_
