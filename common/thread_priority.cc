#include "common/thread_priority.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace kvrm {

bool LowerThisThreadsPriority() {
  const auto tid = static_cast<id_t>(syscall(SYS_gettid));
  return setpriority(PRIO_PROCESS, tid, 19) == 0;
}

}  // namespace kvrm
