// to_gguf: a Hugging Face model directory as one GGUF file (tools/gguf/README.md).
//   bazel run //tools/gguf:to_gguf -- --model=DIR --out=FILE.gguf [--type=f16]
//       [--experts_type=mxfp4]
#include <cstdio>
#include <optional>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "model/gguf.h"
#include "tools/gguf/gguf_convert.h"

ABSL_FLAG(std::string, model, "",
          "Hugging Face model directory (config.json, safetensors, tokenizer.json)");
ABSL_FLAG(std::string, out, "", "the GGUF file to write");
ABSL_FLAG(std::string, type, "f16",
          "matrix type: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K, q6_K, or q4_K_M "
          "(llama-quantize's mix of q4_K and q6_K)");
ABSL_FLAG(std::string, experts_type, "",
          "the experts' matrices' type (a --type, or mxfp4); empty: mxfp4 where the checkpoint's "
          "experts are MXFP4 (gpt-oss), else --type");

namespace {

std::optional<kvrm::GgmlType> TypeNamed(const std::string& name) {
  for (uint32_t id = 0; id < 64; ++id) {
    const kvrm::GgmlTypeTraits* t = kvrm::FindGgmlType(id);
    if (t != nullptr && name == t->name) return t->type;
  }
  return std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string model = absl::GetFlag(FLAGS_model), out = absl::GetFlag(FLAGS_out);
  if (model.empty() || out.empty()) {
    std::fprintf(stderr, "to_gguf: --model and --out are required\n");
    return 2;
  }
  kvrm::GgufConvertOptions options;
  const std::string type = absl::GetFlag(FLAGS_type);
  options.q4_k_m = type == "q4_K_M";
  const std::optional<kvrm::GgmlType> matrices = TypeNamed(type);
  if (!options.q4_k_m && (!matrices || *matrices == kvrm::GgmlType::kMxfp4)) {
    std::fprintf(stderr,
                 "to_gguf: --type=%s is not one of f32, f16, bf16, q8_0, q4_0, q4_1, "
                 "q5_0, q5_1, q4_K, q5_K, q6_K, q4_K_M\n",
                 type.c_str());
    return 2;
  }
  if (matrices) options.type = *matrices;
  if (const std::string experts = absl::GetFlag(FLAGS_experts_type); !experts.empty()) {
    options.experts_type = TypeNamed(experts);
    if (!options.experts_type) {
      std::fprintf(stderr, "to_gguf: --experts_type=%s is not a --type or mxfp4\n",
                   experts.c_str());
      return 2;
    }
  }
  if (absl::Status st = kvrm::ConvertToGguf(model, out, options); !st.ok()) {
    std::fprintf(stderr, "to_gguf: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  std::printf("wrote %s\n", out.c_str());
  return 0;
}
