// Background work on a machine whose cores the engine uses: the calling thread at the lowest
// scheduling priority.
#ifndef KVRM_COMMON_THREAD_PRIORITY_H_
#define KVRM_COMMON_THREAD_PRIORITY_H_

namespace kvrm {

// Gives the calling thread (only it: Linux keeps a nice value per thread) nice 19, so that it
// runs on what the engine's threads leave. False where the system refuses (it then runs as
// before).
bool LowerThisThreadsPriority();

}  // namespace kvrm

#endif  // KVRM_COMMON_THREAD_PRIORITY_H_
