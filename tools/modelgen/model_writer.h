// Writes a complete random-weight Llama model directory (Hugging Face layout): config.json,
// generation_config.json, safetensors weights, tokenizer.json, tokenizer_config.json.
// The library behind //tools/modelgen:make_model, callable directly from tests.
#ifndef KVRM_TOOLS_MODELGEN_MODEL_WRITER_H_
#define KVRM_TOOLS_MODELGEN_MODEL_WRITER_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "tools/modelgen/bpe_trainer.h"
#include "tools/modelgen/model_spec.h"

namespace kvrm::modelgen {

struct MakeModelOptions {
  std::string size = "tiny";  // a FindModelSpec name
  std::string out_dir;        // created if missing
  DType dtype = DType::kBF16;
  int shards = 1;
  uint64_t seed = 0;
  int threads = 2;  // weight generation threads; the output does not depend on it
};

struct MakeModelSummary {
  ModelSpec spec;
  int64_t parameters = 0;
  int64_t weight_bytes = 0;
  int num_merges = 0;
  double tokenizer_seconds = 0;
  double weights_seconds = 0;
  double total_seconds = 0;
};

absl::StatusOr<MakeModelSummary> MakeModel(const MakeModelOptions& options);

// Brings a directory MakeModel wrote in an earlier version up to what it writes now, without
// regenerating it (kvrmd reuses a built-in model's cached directory): writes the chat template
// into a tokenizer_config.json that has none or has the built-in one from before tools
// (kChatTemplateV1); a template someone else put there is left alone. Returns whether anything
// changed.
absl::StatusOr<bool> UpgradeModelDir(const std::string& dir);

// The tokenizer make_model trains for `spec` and `seed` (exposed for tests).
absl::StatusOr<BpeModel> TrainModelTokenizer(const ModelSpec& spec, uint64_t seed);

}  // namespace kvrm::modelgen

#endif  // KVRM_TOOLS_MODELGEN_MODEL_WRITER_H_
