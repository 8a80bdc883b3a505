#include "common/memory_limit.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/json.h"
#include "common/logging.h"

namespace kvrm {
namespace {

// Limits at or above this are "none" (cgroup v1 writes PAGE_COUNTER_MAX pages, ~2^63).
constexpr int64_t kUnlimited = int64_t{1} << 60;

std::optional<std::string> ReadSmallFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) return std::nullopt;
  return *std::move(text);
}

// A limit file's value: bytes, or nullopt for "max", unlimited or unreadable.
std::optional<int64_t> ReadLimitFile(const std::string& path) {
  const std::optional<std::string> text = ReadSmallFile(path);
  if (!text) return std::nullopt;
  const absl::string_view v = absl::StripAsciiWhitespace(*text);
  int64_t bytes = 0;
  if (v == "max" || !absl::SimpleAtoi(v, &bytes) || bytes <= 0 || bytes >= kUnlimited) {
    return std::nullopt;
  }
  return bytes;
}

// The smallest limit in `file` of the cgroup at `path` under `mount` or of any of its parents
// (each one's limit applies). In a container with a cgroup namespace the path is "/".
std::optional<int64_t> TightestAlongPath(const std::string& mount, std::string path,
                                         const std::string& file) {
  std::optional<int64_t> best;
  for (;;) {
    while (path.size() > 1 && path.back() == '/') path.pop_back();
    const std::string dir = path == "/" || path.empty() ? mount : mount + path;
    if (const std::optional<int64_t> v = ReadLimitFile(dir + "/" + file)) {
      best = best ? std::min(*best, *v) : *v;
    }
    if (path.empty() || path == "/") return best;
    const size_t slash = path.rfind('/');
    path = slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
  }
}

}  // namespace

std::optional<MemoryLimit> ReadMemoryLimit(const std::string& root) {
  const std::string base = root == "/" ? "" : root;
  std::optional<MemoryLimit> out;
  const auto consider = [&](std::optional<int64_t> bytes, const std::string& source) {
    if (bytes && (!out || *bytes < out->bytes)) out = MemoryLimit{*bytes, source};
  };
  // "0::/path" (v2) and "N:memory:/path" (v1), possibly both on a hybrid system.
  if (const std::optional<std::string> cgroups = ReadSmallFile(base + "/proc/self/cgroup")) {
    for (absl::string_view line : absl::StrSplit(*cgroups, '\n')) {
      const std::vector<absl::string_view> f = absl::StrSplit(line, absl::MaxSplits(':', 2));
      if (f.size() != 3) continue;
      const std::string path(f[2]);
      if (f[0] == "0" && f[1].empty()) {
        for (const std::string& mount : {base + "/sys/fs/cgroup", base + "/sys/fs/cgroup/unified"}) {
          consider(TightestAlongPath(mount, path, "memory.max"), "the cgroup's memory.max");
        }
      } else {
        for (absl::string_view c : absl::StrSplit(f[1], ',')) {
          if (c != "memory") continue;
          consider(TightestAlongPath(base + "/sys/fs/cgroup/memory", path,
                                     "memory.limit_in_bytes"),
                   "the cgroup's memory.limit_in_bytes");
        }
      }
    }
  }
  if (const std::optional<std::string> meminfo = ReadSmallFile(base + "/proc/meminfo")) {
    for (absl::string_view line : absl::StrSplit(*meminfo, '\n')) {
      if (!absl::ConsumePrefix(&line, "MemTotal:")) continue;
      line = absl::StripAsciiWhitespace(line);
      int64_t kib = 0;
      if (absl::ConsumeSuffix(&line, "kB") &&
          absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &kib) && kib > 0) {
        consider(kib * 1024, "the machine's memory (/proc/meminfo MemTotal)");
      }
    }
  }
  return out;
}

absl::Status CheckFitsMemory(int64_t upfront_bytes, int64_t on_demand_bytes,
                             const std::optional<MemoryLimit>& limit, const std::string& what,
                             const std::string& advice) {
  if (!limit) return absl::OkStatus();
  const auto gib = [](int64_t b) { return absl::StrFormat("%.2f GiB", b / 1073741824.0); };
  if (upfront_bytes > limit->bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(what, " needs ", gib(upfront_bytes),
                                                     " at start-up, more than ", limit->source,
                                                     " (", gib(limit->bytes), "): ", advice));
  }
  if (on_demand_bytes > limit->bytes - upfront_bytes) {  // the sum, without overflow
    const int64_t total = on_demand_bytes > std::numeric_limits<int64_t>::max() - upfront_bytes
                              ? std::numeric_limits<int64_t>::max()
                              : upfront_bytes + on_demand_bytes;
    LOG(WARNING) << what << " needs " << gib(upfront_bytes) << " at start-up and up to "
                 << gib(total) << " as it fills, more than "
                 << limit->source << " (" << gib(limit->bytes)
                 << "): the process may be killed for memory under load; " << advice;
  }
  return absl::OkStatus();
}

}  // namespace kvrm
