// The BPE model of a tokenizer.json ("model": {"type": "BPE", ...}): turns one pre-token into ids
// by applying ranked merges, as HF `tokenizers` does (same tie-breaking, same unknown handling).
#ifndef KVRM_MODEL_TOKENIZER_BPE_H_
#define KVRM_MODEL_TOKENIZER_BPE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/json.h"
#include "model/tokenizer_text.h"

namespace kvrm::tok {

// Ids above this are rejected at load: the tokenizer keeps dense id-indexed tables.
inline constexpr int64_t kMaxTokenId = 1 << 24;

// Immutable after Parse; Tokenize is thread-safe (no cache: all state is per call).
class BpeModel {
 public:
  static absl::StatusOr<std::unique_ptr<BpeModel>> Parse(const Json& model, const JsonPath& at);

  // Appends the ids of `piece` (valid UTF-8) to `ids`. Fails only when an unknown character
  // needs an unk_token that is not in the vocabulary (HF fails the same way).
  absl::Status Tokenize(std::string_view piece, std::vector<int32_t>* ids) const;

  std::optional<int32_t> TokenToId(std::string_view token) const;
  const absl::flat_hash_map<std::string, int32_t>& vocab() const { return vocab_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  absl::Status InitialSymbols(std::string_view piece, std::vector<int32_t>* symbols,
                              std::vector<uint32_t>* lens) const;
  void MergeAll(std::vector<int32_t>* symbols, std::vector<uint32_t>* lens) const;

  absl::flat_hash_map<std::string, int32_t> vocab_;
  absl::flat_hash_map<uint64_t, Merge> merges_;
  std::optional<std::string> unk_token_;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::array<int32_t, 256> byte_ids_;  // <0xAB> token ids, -1 where absent
};

}  // namespace kvrm::tok

#endif  // KVRM_MODEL_TOKENIZER_BPE_H_
