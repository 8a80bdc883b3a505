// tokenizer.json "decoder": turns token strings back into text (HF `decoders`).
#ifndef KVRM_MODEL_TOKENIZER_DECODER_H_
#define KVRM_MODEL_TOKENIZER_DECODER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/json.h"
#include "model/tokenizer_text.h"

namespace kvrm::tok {

// Immutable after parsing; DecodeChain is thread-safe. HF's `decode_chain`: tokens in, tokens
// out; the caller concatenates the result.
class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void DecodeChain(std::vector<std::string>* tokens) const = 0;
};

// Supported: Sequence, ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace; other types are
// UNIMPLEMENTED naming the type.
absl::StatusOr<std::unique_ptr<Decoder>> ParseDecoder(const Json& j, const JsonPath& at,
                                                      int depth = 0);

}  // namespace kvrm::tok

#endif  // KVRM_MODEL_TOKENIZER_DECODER_H_
