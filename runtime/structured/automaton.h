// Regex tree -> deterministic automaton over bytes: the structured-output constraint that the
// token masks (grammar.h) are computed from.
//
// Built once per constraint, off the engine thread: the tree is lowered to a Thompson NFA over
// bytes (code point classes become UTF-8 byte-range sequences), then determinised by subset
// construction over byte classes (bytes no transition tells apart share a column). States from
// which no accepting state can be reached are dropped, so every transition that exists leads to a
// completion: a generation that follows the automaton can always finish. Last, equivalent states
// are merged (the minimal automaton: the UTF-8 paths of a class and the copies a translator
// writes for optional parts collapse).
//
// Immutable after Compile; Next and accepting are O(1) table reads, safe from any thread.
#ifndef KVRM_RUNTIME_STRUCTURED_AUTOMATON_H_
#define KVRM_RUNTIME_STRUCTURED_AUTOMATON_H_

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/structured/regex_ast.h"

namespace kvrm::structured {

struct DfaLimits {
  // Deterministic states; a constraint that needs more is refused (INVALID_ARGUMENT).
  int32_t max_states = 20000;
  // Nondeterministic states (the tree's size) accepted before determinising.
  int64_t max_nfa_states = 2000000;
  // Work of determinising: nondeterministic states visited while building the deterministic
  // states' sets (a few ns each), counted into `*work` when set (shared by several compiles: a
  // schema's enum checks), else per compile. Few states can still be huge sets ((a?){1000}
  // repeated), so states alone do not bound the time; past this the constraint is refused.
  int64_t max_work = 200000000;
  int64_t* work = nullptr;
  // Nondeterministic states held in the deterministic states' sets, all together (4 bytes each).
  int64_t max_set_entries = 16000000;
};

class Dfa {
 public:
  static constexpr int32_t kDead = -1;

  // INVALID_ARGUMENT when the language is empty (nothing can match), or the automaton would be
  // larger than `limits`.
  static absl::StatusOr<Dfa> Compile(const Regex& regex, const DfaLimits& limits = {});

  int32_t start() const { return start_; }
  int32_t num_states() const { return static_cast<int32_t>(accepting_.size()); }
  int32_t num_classes() const { return num_classes_; }
  // The state after `byte`, or kDead when no completion of the text starts that way.
  int32_t Next(int32_t state, uint8_t byte) const {
    return table_[static_cast<size_t>(state) * num_classes_ + class_of_[byte]];
  }
  bool accepting(int32_t state) const { return accepting_[state] != 0; }
  // True when some byte leads on from `state` (false: the match can only end here).
  bool HasNext(int32_t state) const { return has_next_[state] != 0; }
  // Whole-text match (for tests and validation).
  bool Matches(std::string_view text) const;

  // The byte class of each byte, and the table by class: what token masks walk.
  const std::array<uint8_t, 256>& class_of() const { return class_of_; }
  int32_t NextByClass(int32_t state, int32_t cls) const {
    return table_[static_cast<size_t>(state) * num_classes_ + cls];
  }

 private:
  Dfa() = default;
  // Merges states that accept the same continuations (Hopcroft), so that equal languages give
  // equal automata and token masks are computed once per distinct future.
  void Minimize();

  std::array<uint8_t, 256> class_of_{};
  int32_t num_classes_ = 0;
  int32_t start_ = 0;
  std::vector<int32_t> table_;      // [states][classes]
  std::vector<uint8_t> accepting_;  // [states]
  std::vector<uint8_t> has_next_;   // [states]
};

}  // namespace kvrm::structured

#endif  // KVRM_RUNTIME_STRUCTURED_AUTOMATON_H_
