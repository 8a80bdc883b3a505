// tokenizer.json "normalizer": rewrites text before pre-tokenization (HF `normalizers`).
#ifndef KVRM_MODEL_TOKENIZER_NORMALIZER_H_
#define KVRM_MODEL_TOKENIZER_NORMALIZER_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/json.h"
#include "model/tokenizer_text.h"

namespace kvrm::tok {

// Immutable after parsing; Normalize is thread-safe. Input and output are valid UTF-8.
class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual absl::Status Normalize(std::string* text) const = 0;
};

// Parses the normalizer object `j` (never null here). Supported: Sequence, Prepend, Replace,
// NFC, NFD, NFKC, NFKD, Lowercase, Strip; other types are UNIMPLEMENTED naming the type.
absl::StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const Json& j, const JsonPath& at,
                                                            int depth = 0);

}  // namespace kvrm::tok

#endif  // KVRM_MODEL_TOKENIZER_NORMALIZER_H_
