// The Hugging Face tokenizer.json tokenizer (BPE models: Llama 3, Llama 2 / Mistral, GPT-2,
// Qwen2/3), matching HF `tokenizers` token for token.
//
// Pipeline per Encode, as HF runs it: added tokens are cut out of the raw text; the rest is
// normalized, cut again on normalized added tokens, pre-tokenized into pieces, and each piece is
// BPE-encoded; the post-processor adds special tokens when asked. Decode maps ids to token
// strings and runs the decoder chain.
//
// Thread safety: immutable after FromJson; Encode, Decode, DecodeBytes and TokenContinuationBytes
// are const and safe to call from any number of threads at once (no caches, all scratch state is
// per call).
#ifndef KVRM_MODEL_TOKENIZER_H_
#define KVRM_MODEL_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace kvrm {
namespace tok {
class AddedTokenMatcher;
struct AddedToken;
class BpeModel;
class Decoder;
class Normalizer;
class PostProcessor;
class PreTokenizer;
}  // namespace tok

// The most ids a tokenizer.json may hold (tok::kMaxTokenId): the bound without a model's.
inline constexpr int32_t kTokenizerMaxIds = 1 << 24;

class Tokenizer {
 public:
  // Parses a tokenizer.json (untrusted: every malformed case is an INVALID_ARGUMENT naming the
  // file and key, never a crash; unsupported component types are UNIMPLEMENTED naming the type).
  // `vocab_limit`: ids must be below it (config.json's vocab_size: the embedding's rows), checked
  // before the id tables are sized by them; the post-processor's ids must also name tokens.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromFile(
      const std::string& path, int32_t vocab_limit = kTokenizerMaxIds);
  // `what` names the source in errors.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(
      std::string_view json, std::string_view what, int32_t vocab_limit = kTokenizerMaxIds);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // HF `tokenizer.encode(text, add_special_tokens=...)` ids. Added/special tokens written in the
  // text are matched. INVALID_ARGUMENT naming "text" when `text` is not valid UTF-8.
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_special_tokens) const;
  // HF `tokenizer(a, b)`'s joining of a pair (a cross-encoder's query and document), given each
  // one's Encode(..., false) ids: with `add_special_tokens`, the post-processor's pair template
  // (Llama 3's <|begin_of_text|> A <|begin_of_text|> B, Bert's [CLS] A [SEP] B [SEP]), else A B.
  std::vector<int32_t> JoinPair(const std::vector<int32_t>& a, const std::vector<int32_t>& b,
                                bool add_special_tokens) const;

  // HF `tokenizer.decode(ids, skip_special_tokens=...)`; always valid UTF-8. Ids that name no
  // token are skipped.
  std::string Decode(absl::Span<const int32_t> ids, bool skip_special_tokens) const;
  // Decode(ids, true), except that the special tokens in `kept` keep their text: a request that
  // offered tools reads its model's call markers (<tool_call>, [TOOL_CALLS], <|python_tag|>)
  // where they are special tokens, as vLLM's tool parsers turn skip_special_tokens off.
  std::string DecodeKeeping(absl::Span<const int32_t> ids, absl::Span<const int32_t> kept) const;

  // Decode without the UTF-8 repairs: the exact bytes the decoder produces, which may be
  // ill-formed UTF-8 (a token holding half a character is its raw bytes, not U+FFFD). Byte-level
  // decoders keep the joined bytes as they are and "<0xAB>" byte-fallback runs that are not valid
  // UTF-8 keep their bytes; everything else is as in Decode, so wherever the result is valid UTF-8
  // it equals Decode's.
  std::string DecodeBytes(absl::Span<const int32_t> ids, bool skip_special_tokens) const;

  // For every id in [0, vocab_size): the raw bytes (as DecodeBytes) the token adds to decoded
  // text when it is not the first token, for structured-output token masks. This is not the
  // token's own decode: Llama 2's "▁the" decodes to "the" at the start of a text but adds " the"
  // after other text. Computed as DecodeBytes({ctx, id}) minus the prefix DecodeBytes({ctx}) for
  // one neutral context token (see ContinuationContext in tokenizer.cc), so for the decoders the
  // supported models use, DecodeBytes(ids) == DecodeBytes({ids[0]}) + the entries of ids[1..],
  // provided DecodeBytes({ids[0]}) is not empty (a Strip decoder strips the text's first space,
  // wherever it is). The one exception known: where ByteFallback runs ahead of Metaspace, byte
  // tokens that together spell "▁" become " " only as a run, so no single token adds that.
  // std::nullopt for ids that name no token, special tokens and tokens spelled like a special
  // token (what they add depends on skip_special_tokens), and any token after which the context's
  // bytes are not a prefix of the decode. A token that adds nothing is an empty string. One pass
  // over the vocabulary, two-token decodes each: meant to run once per model.
  std::vector<std::optional<std::string>> TokenContinuationBytes() const;

  int32_t vocab_size() const { return static_cast<int32_t>(id_to_token_.size()); }  // max id + 1
  std::optional<int32_t> TokenToId(std::string_view token) const;
  std::string_view IdToToken(int32_t id) const;  // "" when no token has this id
  bool IsSpecial(int32_t id) const;              // added token with special=true
  std::optional<int32_t> bos_id() const;         // the token the post-processor prepends, if any

  // Replaces the post-processor with [bos] $A [eos] (either may be absent): what Transformers'
  // LlamaTokenizer(Fast) builds from tokenizer_config.json's add_bos_token / add_eos_token,
  // whatever tokenizer.json says. INVALID_ARGUMENT naming a token that is not in the vocabulary.
  absl::Status SetSpecialTokensTemplate(std::optional<std::string_view> bos,
                                        std::optional<std::string_view> eos);

 private:
  Tokenizer();
  absl::Status Load(std::string_view json, std::string_view what, int32_t vocab_limit);
  // Appends the ids of a text segment holding no raw-matched added token.
  absl::Status EncodeSegment(std::string text, bool at_start, std::vector<int32_t>* ids) const;
  // Decode and DecodeKeeping: with `skip_special_tokens`, the special tokens in `kept` stay.
  std::string DecodeText(absl::Span<const int32_t> ids, bool skip_special_tokens,
                         absl::Span<const int32_t> kept) const;
  // The token strings Decode feeds the decoder chain for `ids`.
  // With `skip_special_tokens`, the special tokens in `kept` stay.
  std::vector<std::string> IdsToTokens(absl::Span<const int32_t> ids, bool skip_special_tokens,
                                       absl::Span<const int32_t> kept = {}) const;
  // Runs the decoder chain (or the space join when there is none) and joins the result.
  std::string DecodeTokens(std::vector<std::string>* tokens, bool lossy) const;
  // The token TokenContinuationBytes decodes ahead of each id, if any.
  std::optional<int32_t> ContinuationContext() const;

  std::unique_ptr<tok::Normalizer> normalizer_;        // may be null
  std::unique_ptr<tok::PreTokenizer> pre_tokenizer_;   // may be null
  std::unique_ptr<tok::BpeModel> model_;
  std::unique_ptr<tok::PostProcessor> post_processor_;  // may be null
  std::unique_ptr<tok::Decoder> decoder_;               // may be null

  std::vector<tok::AddedToken> added_tokens_;
  std::unique_ptr<tok::AddedTokenMatcher> raw_matcher_;         // normalized=false tokens
  std::unique_ptr<tok::AddedTokenMatcher> normalized_matcher_;  // normalized=true tokens
  absl::flat_hash_map<std::string, int32_t> added_ids_;
  absl::flat_hash_set<std::string> special_contents_;

  // [vocab_size]: token string per id ("" for holes), and flags.
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_token_;
  std::vector<bool> is_special_;
};

}  // namespace kvrm

#endif  // KVRM_MODEL_TOKENIZER_H_
