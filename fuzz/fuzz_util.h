// Shared bits of the libFuzzer targets in fuzz/ (see fuzz/README.md).
#ifndef KVRM_FUZZ_FUZZ_UTIL_H_
#define KVRM_FUZZ_FUZZ_UTIL_H_

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include "model/tokenizer.h"
#include "nlohmann/json.hpp"

namespace kvrm::fuzz {

// The repository root the fuzzers read fixed test data from: $KVRM_FUZZ_ROOT, else ".".
inline std::string RepoPath(const std::string& relative) {
  const char* root = std::getenv("KVRM_FUZZ_ROOT");
  return std::string(root ? root : ".") + "/" + relative;
}

// Loads a real tokenizer from model/testdata; aborts (a setup error, not a finding) if missing.
inline std::unique_ptr<Tokenizer> LoadTokenizer(const std::string& family) {
  const std::string path = RepoPath("model/testdata/tokenizers/" + family + "/tokenizer.json");
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromFile(path);
  if (!tok.ok()) {
    std::fprintf(stderr, "fuzz setup: cannot load %s: %s\n", path.c_str(),
                 tok.status().ToString().c_str());
    std::abort();
  }
  return std::move(*tok);
}

// Crashes with a message: libFuzzer records the input that broke an invariant.
#define FUZZ_CHECK(cond)                                                                  \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      std::fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                       \
    }                                                                                     \
  } while (0)

// Writes the input to this process's own file ending in `extension` (for loaders that take a
// path and map the file) and returns the path.
inline const std::string& WriteInputFile(const uint8_t* data, size_t size,
                                         const std::string& extension) {
  static const std::string path = [&] {
    const char* tmp = std::getenv("TMPDIR");
    return std::string(tmp ? tmp : "/tmp") + "/kvrm_fuzz_" + std::to_string(getpid()) + extension;
  }();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return path;
}

// Runs one input. (Findings are fixed where they are found; none is let through here.)
template <typename F>
int RunWithKnownIssues(F&& run_one) {
  run_one();
  return 0;
}

}  // namespace kvrm::fuzz

#endif  // KVRM_FUZZ_FUZZ_UTIL_H_
