// How a sentence-transformers model directory says its embeddings are made: `modules.json` lists
// the modules after the transformer (a Pooling module, whose config.json sets one
// pooling_mode_*, and optionally Normalize), as vLLM reads it for its pooling models.
#ifndef KVRM_MODEL_POOLING_CONFIG_H_
#define KVRM_MODEL_POOLING_CONFIG_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace kvrm {

struct PoolingConfig {
  std::string pooling;     // "last", "mean" or "cls"
  bool normalize = false;  // a Normalize module follows
  std::string source;      // the Pooling module's config file, for logs
};

// nullopt when `dir` has no modules.json (not a sentence-transformers model). INVALID_ARGUMENT
// naming the file and key for a module or pooling mode kvrm does not compute (Dense layers; max,
// mean-sqrt-length or weighted-mean pooling; two modes at once), or malformed files.
absl::StatusOr<std::optional<PoolingConfig>> LoadPoolingConfig(const std::string& dir);

}  // namespace kvrm

#endif  // KVRM_MODEL_POOLING_CONFIG_H_
