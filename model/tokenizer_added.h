// Added tokens of a tokenizer.json ("added_tokens"): found in the text before anything else and
// encoded as their own ids (HF's AddedVocabulary).
#ifndef KVRM_MODEL_TOKENIZER_ADDED_H_
#define KVRM_MODEL_TOKENIZER_ADDED_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace kvrm::tok {

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool special = false;
};

// One part of a split: bytes [start, end) of the text, and the matched token's id or -1.
struct AddedSplit {
  size_t start;
  size_t end;
  int32_t id;
};

// Finds added tokens leftmost-longest (HF builds an Aho-Corasick automaton with that match
// kind; a byte trie walked from each position gives the same matches for these few, short
// patterns). Immutable after construction; thread-safe.
class AddedTokenMatcher {
 public:
  // `patterns[i]` is the text that stands for `tokens[i]` (its content, normalized when the
  // token is matched after normalization). `tokens` must outlive the matcher.
  AddedTokenMatcher(std::vector<const AddedToken*> tokens, const std::vector<std::string>& patterns);

  // HF `find_matches`: splits covering all of `sentence`, honouring single_word, lstrip, rstrip.
  std::vector<AddedSplit> Split(std::string_view sentence) const;
  bool empty() const { return tokens_.empty(); }

 private:
  struct Node {
    absl::flat_hash_map<unsigned char, int32_t> next;
    int32_t token = -1;  // index into tokens_ of the pattern ending here
  };
  // Length of the longest pattern starting at sentence[pos] and its token index, or {0, -1}.
  std::pair<size_t, int32_t> LongestAt(std::string_view sentence, size_t pos) const;

  std::vector<const AddedToken*> tokens_;
  std::vector<Node> nodes_;
};

}  // namespace kvrm::tok

#endif  // KVRM_MODEL_TOKENIZER_ADDED_H_
