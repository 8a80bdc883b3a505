// A loaded model: config, memory-mapped weights, and tokenizer, from a Hugging Face directory.
#ifndef KVRM_RUNTIME_MODEL_BUNDLE_H_
#define KVRM_RUNTIME_MODEL_BUNDLE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "model/chat_config.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "model/tokenizer.h"
#include "model/weights.h"

namespace kvrm {

struct ModelBundle {
  std::string name;  // the directory's base name
  std::string dir;
  LlamaConfig config;
  std::unique_ptr<SafetensorsSet> files;
  LlamaWeights weights;  // views into `files`
  std::unique_ptr<Tokenizer> tokenizer;
  ChatConfig chat;  // tokenizer_config.json / chat_template.jinja; kvrmd's --chat_template

  // Every error names the file and what is wrong with it.
  static absl::StatusOr<std::unique_ptr<ModelBundle>> Load(const std::string& dir);
};

}  // namespace kvrm

#endif  // KVRM_RUNTIME_MODEL_BUNDLE_H_
