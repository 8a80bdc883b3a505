// to_gguf: a Hugging Face Llama, Qwen2 or Qwen3 model directory as one GGUF file
// (tools/gguf/README.md).
//   bazel run //tools/gguf:to_gguf -- --model=DIR --out=FILE.gguf [--type=f16]
#include <cstdio>
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

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string model = absl::GetFlag(FLAGS_model), out = absl::GetFlag(FLAGS_out);
  if (model.empty() || out.empty()) {
    std::fprintf(stderr, "to_gguf: --model and --out are required\n");
    return 2;
  }
  kvrm::GgufConvertOptions options;
  options.q4_k_m = absl::GetFlag(FLAGS_type) == "q4_K_M";
  bool known = options.q4_k_m;
  for (uint32_t id = 0; id < 64; ++id) {
    const kvrm::GgmlTypeTraits* t = kvrm::FindGgmlType(id);
    if (t != nullptr && absl::GetFlag(FLAGS_type) == t->name) {
      options.type = t->type;
      known = true;
    }
  }
  if (!known) {
    std::fprintf(stderr,
                 "to_gguf: --type=%s is not one of f32, f16, bf16, q8_0, q4_0, q4_1, "
                 "q5_0, q5_1, q4_K, q5_K, q6_K, q4_K_M\n",
                 absl::GetFlag(FLAGS_type).c_str());
    return 2;
  }
  if (absl::Status st = kvrm::ConvertToGguf(model, out, options); !st.ok()) {
    std::fprintf(stderr, "to_gguf: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  std::printf("wrote %s\n", out.c_str());
  return 0;
}
