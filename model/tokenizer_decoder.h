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
//
// `lossy` true is HF's behaviour: ByteLevel makes the joined bytes valid UTF-8 the way
// from_utf8_lossy does, and ByteFallback writes one U+FFFD per byte of a "<0xAB>" run that is not
// valid UTF-8. `lossy` false keeps those raw bytes instead (and ByteFallback emits each byte of
// such a run as its own token, where lossy mode emits its U+FFFD), so the output may be ill-formed
// UTF-8: structured output needs the exact bytes a token contributes, and a lone UTF-8 lead byte
// must not turn into U+FFFD. Every step accepts ill-formed input (ill-formed bytes match no
// character) and treats valid input exactly as in lossy mode, which is the only mode HF has.
class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void DecodeChain(std::vector<std::string>* tokens, bool lossy) const = 0;
};

// Supported: Sequence, ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace; other types are
// UNIMPLEMENTED naming the type.
absl::StatusOr<std::unique_ptr<Decoder>> ParseDecoder(const Json& j, const JsonPath& at,
                                                      int depth = 0);

}  // namespace kvrm::tok

#endif  // KVRM_MODEL_TOKENIZER_DECODER_H_
