// make_model: writes a deterministic random-weight Llama model in Hugging Face layout.
//
//   make_model --size=tiny|small --out=DIR [--dtype=f32|bf16|f16] [--shards=N] [--seed=S]
//
// The same flags give byte-identical files on any machine. See tools/modelgen/README.md.
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "common/dtype.h"
#include "tools/modelgen/model_writer.h"

ABSL_FLAG(std::string, size, "tiny", "model shape: tiny (~1M params) or small (~125M)");
ABSL_FLAG(std::string, out, "", "output directory (created if missing)");
ABSL_FLAG(std::string, dtype, "bf16", "weight dtype: f32, bf16 or f16");
ABSL_FLAG(int, shards, 1, "number of safetensors shards (1 writes model.safetensors)");
ABSL_FLAG(uint64_t, seed, 0, "random seed for weights and the tokenizer corpus");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "make_model --size=tiny|small --out=DIR [--dtype=f32|bf16|f16] [--shards=N] [--seed=S]");
  absl::ParseCommandLine(argc, argv);
  kvrm::modelgen::MakeModelOptions options;
  options.size = absl::GetFlag(FLAGS_size);
  options.out_dir = absl::GetFlag(FLAGS_out);
  options.shards = absl::GetFlag(FLAGS_shards);
  options.seed = absl::GetFlag(FLAGS_seed);
  const std::string dtype = absl::GetFlag(FLAGS_dtype);
  if (dtype == "f32") {
    options.dtype = kvrm::DType::kF32;
  } else if (dtype == "bf16") {
    options.dtype = kvrm::DType::kBF16;
  } else if (dtype == "f16") {
    options.dtype = kvrm::DType::kF16;
  } else {
    std::fprintf(stderr, "make_model: --dtype must be f32, bf16 or f16, got \"%s\"\n",
                 dtype.c_str());
    return 2;
  }
  const auto summary = kvrm::modelgen::MakeModel(options);
  if (!summary.ok()) {
    std::fprintf(stderr, "make_model: %s\n", summary.status().ToString().c_str());
    return 1;
  }
  std::printf(
      "make_model: %s %s -> %s: %lld parameters, %lld weight bytes, %d merges, %.2f s "
      "(tokenizer %.2f s, weights %.2f s)\n",
      std::string(summary->spec.name).c_str(), dtype.c_str(), options.out_dir.c_str(),
      static_cast<long long>(summary->parameters), static_cast<long long>(summary->weight_bytes),
      summary->num_merges, summary->total_seconds, summary->tokenizer_seconds,
      summary->weights_seconds);
  return 0;
}
