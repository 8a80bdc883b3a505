// The generated model a benchmark runs on: tools/modelgen's shape `size`, written in the Hugging
// Face layout under `dir`/`size` (made there first when it is not there yet) and loaded by the
// real loader. `dir` empty: a folder `name` in the system's temp directory, kept across runs.
#ifndef KVRM_BENCH_GENERATED_MODEL_H_
#define KVRM_BENCH_GENERATED_MODEL_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/model_bundle.h"

namespace kvrm::bench {

absl::StatusOr<std::unique_ptr<ModelBundle>> LoadGeneratedModel(const std::string& dir,
                                                                 const std::string& size,
                                                                 const std::string& name);

}  // namespace kvrm::bench

#endif  // KVRM_BENCH_GENERATED_MODEL_H_
