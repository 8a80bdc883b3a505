// A structured-output constraint compiled against a vocabulary: for every automaton state, the
// set of tokens that may come next (a bitset over the vocabulary), so that the engine's per-step
// work for a constrained row is one pass that sets the other logits to -inf, and one walk of the
// chosen token's bytes.
//
// The constraint is on the completion's text: the concatenation of its tokens' bytes (each
// token's contribution when it follows other text, model/tokenizer.h) must be a whole match of
// the regex when the completion ends. So a token is allowed in a state when its bytes lead the
// automaton to a state from which a match can still be finished by further tokens, and the
// end-of-sequence tokens are allowed exactly in accepting states. Special tokens and tokens that
// add no text are never allowed (an empty token would let a row stall without progress).
//
// Compile does all the work (off the engine thread, once per constraint and vocabulary; the
// cache in grammar_cache.h shares the result): one linear pass over the vocabulary's byte trie
// per automaton state, with subtrees cut where the automaton dies. Masks that come out equal are
// stored once. Immutable afterwards: MaskLogits, Next and the predicates never allocate and are
// safe from any thread.
#ifndef KVRM_RUNTIME_STRUCTURED_GRAMMAR_H_
#define KVRM_RUNTIME_STRUCTURED_GRAMMAR_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "runtime/structured/automaton.h"
#include "runtime/structured/regex_ast.h"

namespace kvrm::structured {

// The vocabulary as constraints see it: every token's bytes, laid out as a byte trie in preorder.
// Built once per model.
class TokenTrie {
 public:
  // `token_bytes[id]`: the bytes the token adds mid-text, or nullopt for tokens a constraint
  // never allows (special tokens, holes). Empty strings are never allowed either.
  explicit TokenTrie(absl::Span<const std::optional<std::string>> token_bytes);

  int32_t vocab_size() const { return vocab_size_; }
  // The token's bytes; empty when it is never allowed.
  std::string_view bytes(int32_t token) const {
    return std::string_view(bytes_.data() + byte_begin_[token],
                            byte_begin_[token + 1] - byte_begin_[token]);
  }
  int64_t num_nodes() const { return static_cast<int64_t>(node_byte_.size()); }
  int64_t memory_bytes() const;

 private:
  friend class Grammar;

  int32_t vocab_size_ = 0;
  std::string bytes_;                // all tokens' bytes
  std::vector<int64_t> byte_begin_;  // [vocab + 1]
  // Preorder trie without its root: node i's byte and depth (1 = a child of the root), the
  // index just past its subtree, and the tokens that end at it (tokens_[token_begin_[i] ..
  // token_begin_[i + 1])).
  std::vector<uint8_t> node_byte_;
  std::vector<uint16_t> node_depth_;
  std::vector<int32_t> subtree_end_;
  std::vector<int32_t> token_begin_;  // [nodes + 1]
  std::vector<int32_t> tokens_;
  int32_t max_depth_ = 0;
};

struct GrammarLimits {
  DfaLimits dfa;
  // Memory of the distinct masks together; a constraint that needs more is refused.
  int64_t max_mask_bytes = int64_t{256} << 20;
  // Vocabulary-trie nodes walked to build the masks (about 2 ns each), all states together.
  int64_t max_mask_work = 3000000000;
  // Threads walking the automaton's states at once (the result is the same for any count).
  int32_t threads = 1;
};

class Grammar {
 public:
  static constexpr int32_t kDead = Dfa::kDead;

  // INVALID_ARGUMENT when the regex matches nothing, nothing the vocabulary can spell, or needs
  // more than `limits`.
  static absl::StatusOr<std::shared_ptr<const Grammar>> Compile(
      const Regex& regex, std::shared_ptr<const TokenTrie> trie, const GrammarLimits& limits = {});

  int32_t start() const { return dfa_.start(); }
  int32_t num_states() const { return dfa_.num_states(); }
  int32_t vocab_size() const { return trie_->vocab_size(); }
  // The text so far is a whole match: the completion may end here.
  bool accepting(int32_t state) const { return dfa_.accepting(state); }
  // Accepting and no token can follow: the completion is complete.
  bool terminal(int32_t state) const { return accepting(state) && allowed_count_[state] == 0; }
  // Tokens allowed in `state` (the end-of-sequence tokens aside).
  int32_t allowed_count(int32_t state) const { return allowed_count_[state]; }
  bool Allows(int32_t state, int32_t token) const {
    const uint64_t* m = mask(state);
    return (m[token >> 6] >> (token & 63)) & 1;
  }
  // The state after `token`, or kDead when the token is not allowed in `state`.
  int32_t Next(int32_t state, int32_t token) const;

  // Jump-forward drafts (speculative decoding of constrained text): while the constraint forces
  // the next bytes (a non-accepting state with one byte it can go on with, or an accepting one
  // when `allow_end` is false), the longest allowed token that spells a prefix of them, then
  // the same from the state after it; at most `max_tokens` into `out`. Returns how many. The
  // forced text is certain; the tokens spelling it are a guess at the model's own tokenization
  // (verified like any draft). Allocation-free.
  int32_t ForcedTokens(int32_t state, bool allow_end, int32_t max_tokens, int32_t* out) const;

  // Sets the logit of every token not allowed in `state` to -inf; the ids in `end_ids` (the
  // end-of-sequence tokens) keep their logits when `allow_end` and the state is accepting, and
  // are -inf otherwise. `logits`: [vocab_size].
  void MaskLogits(int32_t state, absl::Span<float> logits, absl::Span<const int32_t> end_ids,
                  bool allow_end) const;

  int32_t num_distinct_masks() const { return static_cast<int32_t>(masks_.size() / words_); }
  int64_t memory_bytes() const;

 private:
  Grammar(Dfa dfa, std::shared_ptr<const TokenTrie> trie);
  const uint64_t* mask(int32_t state) const {
    return masks_.data() + static_cast<size_t>(mask_of_[state]) * words_;
  }
  absl::Status ComputeMasks(const GrammarLimits& limits);
  // The tokens allowed in state `s` into `mask` ([words_]), tokens into `stuck` states left
  // out; returns how many. `at`: [trie depth + 1] scratch. Reads only: safe on several threads.
  // Adds the trie nodes it walks to `*visited`.
  int32_t WalkState(int32_t s, const std::vector<uint8_t>& node_class,
                    const std::vector<uint8_t>& stuck, int32_t* at, uint64_t* mask,
                    int64_t* visited) const;
  // The index of `mask` among the distinct masks, adding it if new (INVALID_ARGUMENT past
  // limits.max_mask_bytes).
  absl::StatusOr<int32_t> InternMask(const uint64_t* mask, const GrammarLimits& limits,
                                     absl::flat_hash_map<uint64_t, std::vector<int32_t>>* by_hash);

  // The byte the constraint forces in `state` (see ForcedTokens), or -1.
  int32_t ForcedByte(int32_t state, bool allow_end) const;

  Dfa dfa_;
  std::array<uint8_t, 256> first_byte_of_class_{};  // a byte of each class
  std::array<uint16_t, 256> class_size_{};          // bytes in each class
  std::shared_ptr<const TokenTrie> trie_;
  int32_t words_ = 0;              // 64-bit words per mask
  std::vector<uint64_t> masks_;    // [distinct masks][words_]
  std::vector<int32_t> mask_of_;   // [states]
  std::vector<int32_t> allowed_count_;  // [states]
};

}  // namespace kvrm::structured

#endif  // KVRM_RUNTIME_STRUCTURED_GRAMMAR_H_
