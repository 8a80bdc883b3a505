// config.json and generation_config.json for a generated LlamaForCausalLM.
#ifndef KVRM_TOOLS_MODELGEN_HF_CONFIG_H_
#define KVRM_TOOLS_MODELGEN_HF_CONFIG_H_

#include <string>
#include <vector>

#include "common/dtype.h"
#include "tools/modelgen/model_spec.h"

namespace kvrm::modelgen {

struct SpecialIds {
  int bos = 0;
  std::vector<int> eos;  // <|end_of_text|>, <|eot_id|>
  int pad = 0;
};

// Transformers' torch_dtype name: "float32", "float16", "bfloat16".
std::string TorchDtypeName(DType dtype);

// Deterministic, pretty-printed JSON text.
std::string BuildConfigJson(const ModelSpec& spec, DType dtype, const SpecialIds& ids);
std::string BuildGenerationConfigJson(const SpecialIds& ids);

}  // namespace kvrm::modelgen

#endif  // KVRM_TOOLS_MODELGEN_HF_CONFIG_H_
