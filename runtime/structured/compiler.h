// Turns a request's structured-output constraint (a regex, a JSON Schema, any JSON object, a
// list of choices, or a GBNF grammar) into a Grammar for the served model's vocabulary, and keeps
// the results: a service sees the same few schemas again and again, and compiling one costs far
// more than a step.
//
// Thread safety: Compile may be called from any number of gRPC threads at once; the cache is
// under a mutex that is never held while compiling (two threads asking for the same new
// constraint at once may both compile it; the first result is kept). Refusals are cached too, so
// a client repeating a constraint that is too large does not cost a compile each time.
#ifndef KVRM_RUNTIME_STRUCTURED_COMPILER_H_
#define KVRM_RUNTIME_STRUCTURED_COMPILER_H_

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "runtime/structured/grammar.h"

namespace kvrm::structured {

struct ConstraintSpec {
  // kHarmonyToolCalls: a gpt-oss reply that calls one of the functions `choices` names on the
  // commentary channel ("<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>"),
  // its arguments held to that function's JSON Schema in `schemas` (the reply then ends, at
  // gpt-oss's <|call|>); with thinking kHarmony, after any analysis and commentary messages.
  enum class Kind { kRegex, kJsonSchema, kJsonObject, kChoice, kHarmonyToolCalls, kGrammar };
  Kind kind = Kind::kRegex;
  // kRegex: the pattern; kJsonSchema: the schema as JSON text; kGrammar: GBNF (gbnf.h)
  std::string text;
  std::vector<std::string> choices;  // kChoice: the completion is exactly one of these
  std::vector<std::string> schemas;  // kHarmonyToolCalls: each function's arguments' schema
  // kJsonSchema / kJsonObject: a regex for the whitespace allowed between JSON tokens; empty:
  // the default, at most one space.
  std::string whitespace_pattern;
  // A thinking model's reply (kvrmd's reasoning output): the constraint holds the answer after
  // its <think> block (structured/regex_builders.h ThinkingPrefix), not the thinking. kInside:
  // the prompt opened the block; kMayOpen: the reply may open one first. kHarmony: gpt-oss's
  // reply, the answer its final message's text after any analysis or commentary messages
  // (HarmonyPrefix; for kHarmonyToolCalls, the messages before the call: HarmonyMessages).
  enum class Thinking { kNone, kMayOpen, kInside, kHarmony };
  Thinking thinking = Thinking::kNone;
};

struct CompilerOptions {
  GrammarLimits limits;
  int64_t max_spec_bytes = 64 << 10;  // pattern, schema, or all choices together
  int32_t max_choices = 1024;
  int32_t json_max_depth = 4;         // nesting of values a schema leaves open, and of json_object
  // Grammars: times a rule that reaches itself may be open at once (GbnfOptions::max_depth), and
  // the deterministic states their automaton may take before it is minimised (in place of
  // limits.dfa.max_states when larger: unfolded recursion writes many copies of the same rules,
  // which determinise into many states that minimising merges again; llama.cpp's JSON grammar at
  // depth 4 takes 40000 to 80000 on the way to 2669).
  int32_t grammar_max_depth = 4;
  int32_t grammar_max_dfa_states = 100000;
  int32_t cache_entries = 256;
  int64_t cache_bytes = int64_t{1} << 30;  // compiled grammars kept, all together
};

class ConstraintCompiler {
 public:
  // `token_bytes`: TokenContinuationBytes of the tokenizer, sized to the model's logits (ids
  // past the tokenizer nullopt), with the end-of-sequence ids set to nullopt (they end the text).
  ConstraintCompiler(absl::Span<const std::optional<std::string>> token_bytes,
                     CompilerOptions options = {});

  // INVALID_ARGUMENT whose message says what is wrong with the constraint (the caller names
  // the field). A grammar whose start is already terminal (the constraint matches only "") is
  // refused: such a completion could write nothing.
  absl::StatusOr<std::shared_ptr<const Grammar>> Compile(const ConstraintSpec& spec);

  // Called after every Compile (from the calling thread, outside the lock): whether the cache
  // had it, whether it was refused, and the compile's time (0 for a hit). Set before the first
  // Compile (metrics).
  struct Event {
    bool cache_hit = false;
    bool refused = false;
    double seconds = 0;
  };
  void SetObserver(std::function<void(const Event&)> observer) { observer_ = std::move(observer); }

  // Whether Compile(spec) would be answered from the cache (a hint: it may be evicted meanwhile).
  bool Contains(const ConstraintSpec& spec) const;

  struct Stats {
    int64_t hits = 0;
    int64_t misses = 0;     // compiles
    int64_t refusals = 0;   // compiles that failed
    double compile_seconds = 0;
    int32_t entries = 0;
    int64_t bytes = 0;      // compiled grammars kept
  };
  Stats stats() const;
  const TokenTrie& trie() const { return *trie_; }

 private:
  absl::StatusOr<std::shared_ptr<const Grammar>> CompileUncached(const ConstraintSpec& spec) const;

  struct Entry {
    std::string key;
    absl::StatusOr<std::shared_ptr<const Grammar>> result;
    int64_t bytes = 0;
  };

  const CompilerOptions options_;
  std::function<void(const Event&)> observer_;
  const std::shared_ptr<const TokenTrie> trie_;
  mutable std::mutex mu_;
  std::list<Entry> lru_ ABSL_GUARDED_BY(mu_);  // most recently used first
  absl::flat_hash_map<std::string, std::list<Entry>::iterator> index_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvrm::structured

#endif  // KVRM_RUNTIME_STRUCTURED_COMPILER_H_
