#include "tools/replay/trace_files.h"

#include <cstdlib>
#include <filesystem>
#include <system_error>

namespace kvrm::replay {

std::string FindTracesDir() {
  namespace fs = std::filesystem;
  if (const char* env = std::getenv("KVRM_TRACES_DIR"); env != nullptr && *env != '\0') {
    return env;
  }
  std::error_code ec;
  // The runfile is a symlink into the source tree: its real path is inside the checkout.
  fs::path p = fs::canonical("tools/replay/testdata/azure_small.csv", ec);
  if (ec) return "";
  for (p = p.parent_path(); !p.empty() && p != p.root_path(); p = p.parent_path()) {
    const fs::path candidate = p / "shared" / "traces";
    if (fs::is_directory(candidate, ec)) return candidate.string();
  }
  return "";
}

}  // namespace kvrm::replay
