// Fuzzes structured outputs (runtime/structured/) with what a client controls: a regex, a JSON
// Schema, a list of choices, a GBNF grammar or a whitespace pattern, compiled against a small vocabulary (every
// byte, plus multi-byte pieces), alone or behind a thinking model's <think> block. Invariants, on every constraint that compiles:
//   - the tree prints back (ToPattern) into a regex that parses and means the same: texts
//     generated under the constraint match the reprinted one too;
//   - a walk that follows the token masks never hits a dead state, every prefix it writes can
//     still be completed, and where it stops on an accepting state the text is a whole match;
//   - MaskLogits leaves exactly the allowed tokens (and the end token where accepting) finite;
//   - jump-forward drafts (ForcedTokens) are allowed token by token.
// Errors must be INVALID_ARGUMENT; nothing may crash, leak or hang (state limits keep every
// compile small).
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "model/tokenizer_text.h"
#include "runtime/structured/automaton.h"
#include "runtime/structured/gbnf.h"
#include "runtime/structured/grammar.h"
#include "runtime/structured/json_schema.h"
#include "runtime/structured/regex_builders.h"
#include "runtime/structured/regex_parser.h"

namespace {

using kvrm::structured::Dfa;
using kvrm::structured::Grammar;
using kvrm::structured::Regex;

std::shared_ptr<const kvrm::structured::TokenTrie>* trie = nullptr;
int32_t vocab = 0;
int32_t end_id = 0;

std::vector<std::optional<std::string>> Vocabulary() {
  std::vector<std::optional<std::string>> v;
  for (int b = 0; b < 256; ++b) v.push_back(std::string(1, static_cast<char>(b)));
  const char* pieces[] = {"{\"", "\":", "\": ", ", \"", "\"}", "true", "false", "null", "12",
                          "0.", "e+", "[\"", "\"]", "\\u00", "\\n", "é", "日本", "ab", "abc",
                          " {", "}\n", "  ", "name", "\"name\": \"", "-1", "\xF0\x9F"};
  for (const char* p : pieces) v.push_back(std::string(p));
  v.push_back(std::nullopt);  // the end token
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const auto v = Vocabulary();
  vocab = static_cast<int32_t>(v.size());
  end_id = vocab - 1;
  trie = new std::shared_ptr<const kvrm::structured::TokenTrie>(
      std::make_shared<const kvrm::structured::TokenTrie>(v));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint8_t kind = data[0] % 5;
  const uint8_t walk_seed = data[1];
  const std::string text(reinterpret_cast<const char*>(data + 2), size - 2);
  kvrm::structured::JsonSchemaOptions json;
  json.max_depth = 1 + walk_seed % 3;
  absl::StatusOr<Regex> regex = absl::InvalidArgumentError("unset");
  switch (kind) {
    case 0:
      regex = kvrm::structured::ParseRegex(text);
      break;
    case 1:
      regex = kvrm::structured::JsonSchemaTextToRegex(text, json);
      break;
    case 2: {
      // Choices, one per line.
      std::vector<Regex> options;
      size_t from = 0;
      while (from <= text.size()) {
        const size_t nl = std::min(text.find('\n', from), text.size());
        const std::string choice = text.substr(from, nl - from);
        if (kvrm::tok::IsValidUtf8(choice)) {
          options.push_back(kvrm::structured::Literal(choice));
        }
        from = nl + 1;
      }
      regex = kvrm::structured::Alt(std::move(options));
      break;
    }
    case 4: {
      // A GBNF grammar, unfolded 1 to 4 levels deep, at most 20000 nodes.
      kvrm::structured::GbnfOptions gbnf;
      gbnf.max_depth = 1 + walk_seed % 4;
      gbnf.max_nodes = 20000;
      regex = kvrm::structured::GbnfToRegex(text, gbnf);
      break;
    }
    default: {
      // A whitespace pattern for any JSON object.
      auto ws = kvrm::structured::ParseRegex(text);
      if (!ws.ok()) {
        FUZZ_CHECK(absl::IsInvalidArgument(ws.status()));
        return 0;
      }
      json.whitespace = *ws;
      regex = kvrm::structured::AnyJsonObject(json);
    }
  }
  if (!regex.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(regex.status()));
    return 0;
  }
  // A thinking model's constraint (seed's top bit): behind the free <think> block.
  if (walk_seed & 0x80) {
    regex = kvrm::structured::Concat({kvrm::structured::ThinkingPrefix(walk_seed & 0x40), *regex});
  }
  kvrm::structured::GrammarLimits limits;
  limits.dfa.max_states = 1000;
  limits.dfa.max_nfa_states = 200000;
  limits.max_mask_bytes = 16 << 20;
  auto grammar = Grammar::Compile(*regex, *trie, limits);
  if (!grammar.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(grammar.status()));
    return 0;
  }
  const Grammar& g = **grammar;
  auto dfa = Dfa::Compile(*regex, limits.dfa);
  FUZZ_CHECK(dfa.ok());
  // The printed tree parses back; its automaton may be refused only for size (printing can
  // spell a class as a longer alternation).
  auto reparsed = kvrm::structured::ParseRegex(kvrm::structured::ToPattern(*regex));
  FUZZ_CHECK(reparsed.ok());
  auto dfa2 = Dfa::Compile(*reparsed, limits.dfa);
  FUZZ_CHECK(dfa2.ok() || absl::IsInvalidArgument(dfa2.status()));

  std::vector<float> logits(vocab);
  uint32_t rng = 2166136261u ^ walk_seed;
  for (int walk = 0; walk < 4; ++walk) {
    int32_t state = g.start();
    std::string written;
    for (int step = 0; step < 48; ++step) {
      std::fill(logits.begin(), logits.end(), 0.0f);
      const int32_t end[] = {end_id};
      g.MaskLogits(state, absl::MakeSpan(logits), end, true);
      int32_t finite = 0;
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < vocab; ++id) {
        const bool keep = id == end_id ? g.accepting(state) : g.Allows(state, id);
        FUZZ_CHECK(std::isfinite(logits[id]) == keep);
        if (keep) {
          ++finite;
          allowed.push_back(id);
        }
      }
      FUZZ_CHECK(finite == g.allowed_count(state) + (g.accepting(state) ? 1 : 0));
      FUZZ_CHECK(finite > 0);  // a state the walk reaches always has a way on or an end
      {
        // Jump-forward drafts: each allowed where it stands, the walk stays alive.
        int32_t forced[8];
        const int32_t n = g.ForcedTokens(state, (rng & 1) != 0, 8, forced);
        FUZZ_CHECK(n >= 0 && n <= 8);
        int32_t s = state;
        for (int32_t k = 0; k < n; ++k) {
          FUZZ_CHECK(g.Allows(s, forced[k]));
          s = g.Next(s, forced[k]);
          FUZZ_CHECK(s != Grammar::kDead);
        }
      }
      rng = rng * 1664525u + 1013904223u;
      const int32_t pick = allowed[(rng >> 8) % allowed.size()];
      if (pick == end_id || g.terminal(state)) break;
      const int32_t next = g.Next(state, pick);
      FUZZ_CHECK(next != Grammar::kDead);
      written += (*trie)->bytes(pick);
      state = next;
      // Every prefix can still be completed: the byte automaton is alive after it.
      int32_t s = dfa->start();
      for (char c : written) {
        s = dfa->Next(s, static_cast<uint8_t>(c));
        FUZZ_CHECK(s != Dfa::kDead);
      }
      FUZZ_CHECK(s == state);
    }
    if (g.accepting(state)) {
      FUZZ_CHECK(dfa->Matches(written));
      if (dfa2.ok()) FUZZ_CHECK(dfa2->Matches(written));
    }
  }
  return 0;
}
