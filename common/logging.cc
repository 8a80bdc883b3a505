#include "common/logging.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kvrm {
namespace {

std::atomic<int> g_min_severity{static_cast<int>(LogSeverity::kInfo)};

const char* SeverityLetter(LogSeverity s) {
  switch (s) {
    case LogSeverity::kInfo: return "I";
    case LogSeverity::kWarning: return "W";
    case LogSeverity::kError: return "E";
    case LogSeverity::kFatal: return "F";
  }
  return "?";
}

}  // namespace

void SetMinLogSeverity(LogSeverity severity) {
  g_min_severity.store(static_cast<int>(severity), std::memory_order_relaxed);
}

LogSeverity MinLogSeverity() {
  return static_cast<LogSeverity>(g_min_severity.load(std::memory_order_relaxed));
}

LogMessage::LogMessage(LogSeverity severity, const char* file, int line) : severity_(severity) {
  const char* base = std::strrchr(file, '/');
  stream_ << SeverityLetter(severity) << absl::FormatTime("%m%d %H:%M:%E3S", absl::Now(),
                                                           absl::LocalTimeZone())
          << " " << (base ? base + 1 : file) << ":" << line << "] ";
}

LogMessage::~LogMessage() {
  stream_ << '\n';
  const std::string line = stream_.str();
  // One fwrite per line so that lines from different threads do not interleave.
  std::fwrite(line.data(), 1, line.size(), stderr);
  if (severity_ == LogSeverity::kFatal) {
    std::fflush(stderr);
    std::abort();
  }
}

}  // namespace kvrm
