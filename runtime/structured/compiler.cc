#include "runtime/structured/compiler.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "model/tokenizer_text.h"
#include "runtime/structured/gbnf.h"
#include "runtime/structured/json_schema.h"
#include "runtime/structured/regex_builders.h"
#include "runtime/structured/regex_parser.h"

namespace kvrm::structured {
namespace {

// One string per spec: the kind, then length-prefixed fields, so no two specs share a key.
std::string CacheKey(const ConstraintSpec& spec) {
  std::string key = absl::StrCat(static_cast<int>(spec.kind), ":", static_cast<int>(spec.thinking),
                                 ":", spec.whitespace_pattern.size(),
                                 ":", spec.whitespace_pattern, ":", spec.text.size(), ":",
                                 spec.text);
  for (const std::string& c : spec.choices) absl::StrAppend(&key, ":", c.size(), ":", c);
  absl::StrAppend(&key, ";");
  for (const std::string& c : spec.schemas) absl::StrAppend(&key, ":", c.size(), ":", c);
  return key;
}

absl::Status Invalid(absl::string_view what) { return absl::InvalidArgumentError(what); }

}  // namespace

ConstraintCompiler::ConstraintCompiler(absl::Span<const std::optional<std::string>> token_bytes,
                                       CompilerOptions options)
    : options_(std::move(options)), trie_(std::make_shared<const TokenTrie>(token_bytes)) {}

absl::StatusOr<std::shared_ptr<const Grammar>> ConstraintCompiler::CompileUncached(
    const ConstraintSpec& spec) const {
  JsonSchemaOptions json;
  json.max_depth = options_.json_max_depth;
  if (!spec.whitespace_pattern.empty()) {
    if (spec.kind != ConstraintSpec::Kind::kJsonSchema &&
        spec.kind != ConstraintSpec::Kind::kJsonObject) {
      return Invalid("whitespace_pattern applies to json_schema and json_object only");
    }
    auto ws = ParseRegex(spec.whitespace_pattern);
    if (!ws.ok()) return Invalid(absl::StrCat("whitespace_pattern: ", ws.status().message()));
    // Between JSON tokens only JSON's whitespace is valid: a pattern that can write anything
    // else ("x|,") would make the output not JSON.
    absl::StatusOr<Dfa> ws_dfa = Dfa::Compile(*ws);
    if (ws_dfa.ok()) {
      for (int32_t st = 0; st < ws_dfa->num_states(); ++st) {
        for (int b = 0; b < 256; ++b) {
          if (b == ' ' || b == '\t' || b == '\n' || b == '\r') continue;
          if (ws_dfa->Next(st, static_cast<uint8_t>(b)) != Dfa::kDead) {
            return Invalid(
                "whitespace_pattern: matches more than JSON whitespace (space, \\t, \\n, \\r)");
          }
        }
      }
    }
    json.whitespace = *std::move(ws);
  }
  Regex regex;
  GrammarLimits limits = options_.limits;
  switch (spec.kind) {
    case ConstraintSpec::Kind::kRegex: {
      ASSIGN_OR_RETURN(regex, ParseRegex(spec.text));
      break;
    }
    case ConstraintSpec::Kind::kGrammar: {
      GbnfOptions gbnf;
      gbnf.max_depth = options_.grammar_max_depth;
      ASSIGN_OR_RETURN(regex, GbnfToRegex(spec.text, gbnf));
      limits.dfa.max_states = std::max(limits.dfa.max_states, options_.grammar_max_dfa_states);
      break;
    }
    case ConstraintSpec::Kind::kJsonSchema: {
      // From the text: the properties come in the order the schema writes them.
      ASSIGN_OR_RETURN(regex, JsonSchemaTextToRegex(spec.text, json));
      break;
    }
    case ConstraintSpec::Kind::kJsonObject:
      regex = AnyJsonObject(json);
      break;
    case ConstraintSpec::Kind::kChoice: {
      if (spec.choices.empty()) return Invalid("no choices");
      if (static_cast<int32_t>(spec.choices.size()) > options_.max_choices) {
        return Invalid(absl::StrCat(spec.choices.size(), " choices; at most ",
                                    options_.max_choices));
      }
      std::vector<Regex> options;
      for (size_t i = 0; i < spec.choices.size(); ++i) {
        // Literal() takes UTF-8: text that is not could only be spelled by raw byte tokens.
        if (!tok::IsValidUtf8(spec.choices[i])) {
          return Invalid(absl::StrCat("choice ", i, " is not valid UTF-8"));
        }
        options.push_back(Literal(spec.choices[i]));
      }
      regex = Alt(std::move(options));
      break;
    }
    case ConstraintSpec::Kind::kHarmonyToolCalls: {
      if (spec.choices.empty() || spec.choices.size() != spec.schemas.size()) {
        return Invalid("a harmony tool call needs each function's name and schema");
      }
      std::vector<Regex> calls;
      for (size_t i = 0; i < spec.choices.size(); ++i) {
        ASSIGN_OR_RETURN(Regex arguments, JsonSchemaTextToRegex(spec.schemas[i], json));
        calls.push_back(Concat({Literal(HarmonyCallHeader(spec.choices[i])), arguments}));
      }
      regex = Alt(std::move(calls));
      break;
    }
  }
  if (spec.thinking == ConstraintSpec::Thinking::kHarmony) {
    // The messages before the answer: the final header too, unless the reply is a call.
    const bool call = spec.kind == ConstraintSpec::Kind::kHarmonyToolCalls;
    regex = Concat({call ? HarmonyMessages() : HarmonyPrefix(), regex});
  } else if (spec.thinking != ConstraintSpec::Thinking::kNone) {
    regex = Concat({ThinkingPrefix(spec.thinking == ConstraintSpec::Thinking::kInside), regex});
  }
  ASSIGN_OR_RETURN(std::shared_ptr<const Grammar> grammar, Grammar::Compile(regex, trie_, limits));
  if (grammar->terminal(grammar->start())) {
    return Invalid("the constraint only matches the empty text");
  }
  return grammar;
}

absl::StatusOr<std::shared_ptr<const Grammar>> ConstraintCompiler::Compile(
    const ConstraintSpec& spec) {
  // An oversized spec is refused before its key (as large as the spec) is built or cached.
  int64_t spec_bytes = static_cast<int64_t>(spec.text.size() + spec.whitespace_pattern.size());
  for (const std::string& c : spec.choices) spec_bytes += static_cast<int64_t>(c.size());
  if (spec_bytes > options_.max_spec_bytes) {
    return Invalid(absl::StrCat(spec_bytes, " bytes; at most ", options_.max_spec_bytes));
  }
  std::string key = CacheKey(spec);
  std::optional<absl::StatusOr<std::shared_ptr<const Grammar>>> cached;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(key);
    if (it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      ++stats_.hits;
      cached = it->second->result;
    }
  }
  if (cached) {
    if (observer_) observer_(Event{.cache_hit = true, .refused = !cached->ok()});
    return *std::move(cached);
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<std::shared_ptr<const Grammar>> result = CompileUncached(spec);
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (observer_) observer_(Event{.refused = !result.ok(), .seconds = seconds});
  // The key is held twice (the index's and the entry's): a refusal costs its key.
  const int64_t bytes =
      (result.ok() ? (*result)->memory_bytes() : 0) + 2 * static_cast<int64_t>(key.size());

  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.misses;
  stats_.compile_seconds += seconds;
  if (!result.ok()) ++stats_.refusals;
  if (index_.contains(key) || bytes > options_.cache_bytes) return result;
  lru_.push_front(Entry{std::move(key), result, bytes});
  index_.emplace(lru_.front().key, lru_.begin());
  stats_.bytes += bytes;
  while (static_cast<int32_t>(lru_.size()) > options_.cache_entries ||
         stats_.bytes > options_.cache_bytes) {
    // Evicting drops the cache's reference only: requests holding the grammar keep it alive.
    stats_.bytes -= lru_.back().bytes;
    index_.erase(lru_.back().key);
    lru_.pop_back();
  }
  stats_.entries = static_cast<int32_t>(lru_.size());
  return result;
}

bool ConstraintCompiler::Contains(const ConstraintSpec& spec) const {
  const std::string key = CacheKey(spec);
  std::lock_guard<std::mutex> lock(mu_);
  return index_.contains(key);
}

ConstraintCompiler::Stats ConstraintCompiler::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace kvrm::structured
