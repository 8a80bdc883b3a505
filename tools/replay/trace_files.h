// Test helper: where the real traces are. They live outside the repository, in
// ../shared/traces beside the checkout, so tests find them from the real path of a runfile.
#ifndef KVRM_TOOLS_REPLAY_TRACE_FILES_H_
#define KVRM_TOOLS_REPLAY_TRACE_FILES_H_

#include <string>

namespace kvrm::replay {

// $KVRM_TRACES_DIR when set; else the first `shared/traces` found beside an ancestor of the
// checkout (found through the real path of this target's runfile); "" when there is none.
std::string FindTracesDir();

}  // namespace kvrm::replay

#endif  // KVRM_TOOLS_REPLAY_TRACE_FILES_H_
