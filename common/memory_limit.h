// How much memory this process may use: the tightest of its cgroup's limits (v2 memory.max,
// v1 memory.limit_in_bytes, along the cgroup's path up to the root) and the machine's memory.
// For start-up checks: allocating past a container's limit is an out-of-memory kill part way
// through, with nothing said.
#ifndef KVRM_COMMON_MEMORY_LIMIT_H_
#define KVRM_COMMON_MEMORY_LIMIT_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"

namespace kvrm {

struct MemoryLimit {
  int64_t bytes = 0;
  std::string source;  // where it came from, for messages ("cgroup memory.max", ...)
};

// Reads /proc/self/cgroup, the cgroup files and /proc/meminfo under `root` ("/" on a real
// system; a directory laid out like one in tests). nullopt when none of them gives a limit.
std::optional<MemoryLimit> ReadMemoryLimit(const std::string& root = "/");

// RESOURCE_EXHAUSTED naming `what` and `advice` when `upfront_bytes` (memory faulted in at
// start-up) exceed the limit; a warning is logged when that plus `on_demand_bytes` (memory
// touched as load grows) would. OK without a limit.
absl::Status CheckFitsMemory(int64_t upfront_bytes, int64_t on_demand_bytes,
                             const std::optional<MemoryLimit>& limit, const std::string& what,
                             const std::string& advice);

}  // namespace kvrm

#endif  // KVRM_COMMON_MEMORY_LIMIT_H_
