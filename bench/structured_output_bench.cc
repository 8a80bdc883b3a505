// What structured outputs cost: for typical constraints on a real vocabulary (Llama 3's 128,256
// tokens by default), the one-time compile (automaton states, distinct token masks, memory, time)
// and the per-token cost on the engine thread (mask the row, then advance the automaton by the
// chosen token), set beside what the host sampler already spends on the same row (greedy), as a
// ratio measured side by side in one run.
//
//   bazel run -c opt //bench:structured_output_bench -- \
//     [--tokenizer=model/testdata/tokenizers/llama3/tokenizer.json] [--json=FILE]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "model/tokenizer.h"
#include "nlohmann/json.hpp"
#include "runtime/sampler.h"
#include "runtime/structured/compiler.h"

ABSL_FLAG(std::string, tokenizer, "model/testdata/tokenizers/llama3/tokenizer.json",
          "tokenizer.json whose vocabulary the constraints are compiled for");
ABSL_FLAG(int32_t, walks, 20, "random constrained generations per constraint");
ABSL_FLAG(int32_t, max_tokens, 64, "tokens per walk at most");
ABSL_FLAG(std::string, only, "", "run only the constraint of this name");
ABSL_FLAG(int32_t, threads, 1, "threads walking the automaton states of one compile");
ABSL_FLAG(std::string, json, "", "also write the results to this JSON file");

namespace kvrm {
namespace {

using structured::ConstraintSpec;
using Clock = std::chrono::steady_clock;

double Us(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

struct Case {
  const char* name;
  ConstraintSpec spec;
};

std::vector<Case> Cases() {
  std::vector<Case> cases;
  auto add = [&](const char* name, ConstraintSpec::Kind kind, std::string text) {
    Case c{name, {}};
    c.spec.kind = kind;
    c.spec.text = std::move(text);
    cases.push_back(std::move(c));
  };
  Case choice{"choice (3 labels)", {}};
  choice.spec.kind = ConstraintSpec::Kind::kChoice;
  choice.spec.choices = {"positive", "negative", "neutral"};
  cases.push_back(choice);
  add("regex (ISO date + time)", ConstraintSpec::Kind::kRegex,
      "\\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\\d|3[01])T([01]\\d|2[0-3]):[0-5]\\d:[0-5]\\dZ");
  add("regex (free text, 200 chars)", ConstraintSpec::Kind::kRegex, "[^\\n]{1,200}\\.");
  add("schema (5 typed properties)", ConstraintSpec::Kind::kJsonSchema, R"({
    "type": "object",
    "properties": {
      "name": {"type": "string", "maxLength": 40},
      "age": {"type": "integer", "minimum": 0, "maximum": 150},
      "email": {"type": "string", "format": "email"},
      "active": {"type": "boolean"},
      "score": {"type": "number"}
    },
    "required": ["name", "age", "active"]
  })");
  add("schema (nested, arrays, enums)", ConstraintSpec::Kind::kJsonSchema, R"({
    "type": "object",
    "$defs": {
      "item": {"type": "object",
               "properties": {"sku": {"type": "string", "pattern": "[A-Z]{3}-[0-9]{4}"},
                              "qty": {"type": "integer", "minimum": 1, "maximum": 99},
                              "unit": {"enum": ["each", "box", "kg"]}},
               "required": ["sku", "qty"]}
    },
    "properties": {
      "order_id": {"type": "string", "format": "uuid"},
      "status": {"enum": ["pending", "shipped", "delivered", "cancelled"]},
      "items": {"type": "array", "items": {"$ref": "#/$defs/item"}, "minItems": 1, "maxItems": 20},
      "notes": {"type": ["string", "null"]}
    },
    "required": ["order_id", "status", "items"]
  })");
  Case object{"json_object (any, depth 4)", {}};
  object.spec.kind = ConstraintSpec::Kind::kJsonObject;
  cases.push_back(object);
  // GBNF: a JSON grammar in the shape of llama.cpp's grammars/json.gbnf (indentation up to 20
  // columns after a newline), recursion unfolded 4 deep; and a small expression grammar.
  add("grammar (JSON, llama.cpp's shape)", ConstraintSpec::Kind::kGrammar, R"(
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws ::= | " " | "\n" [ \t]{0,20}
)");
  add("grammar (arithmetic)", ConstraintSpec::Kind::kGrammar, R"g(
root ::= expr "=" ws term
expr ::= term (ws [-+*/] ws term)*
term ::= [0-9]+ | "(" ws expr ws ")"
ws   ::= " "?
)g");
  return cases;
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  auto tokenizer = Tokenizer::FromFile(absl::GetFlag(FLAGS_tokenizer));
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "%s\n", std::string(tokenizer.status().message()).c_str());
    return 1;
  }
  const int32_t vocab = (*tokenizer)->vocab_size();
  std::vector<int32_t> end_ids;
  for (int32_t id = 0; id < vocab; ++id) {
    if ((*tokenizer)->IsSpecial(id)) end_ids.push_back(id);
    if (end_ids.size() == 2) break;
  }
  auto t0 = Clock::now();
  std::vector<std::optional<std::string>> bytes = (*tokenizer)->TokenContinuationBytes();
  for (int32_t id : end_ids) bytes[id].reset();
  structured::CompilerOptions options;
  options.limits.threads = absl::GetFlag(FLAGS_threads);
  structured::ConstraintCompiler compiler(bytes, options);
  const double vocab_ms = Us(Clock::now() - t0) / 1000;
  std::printf("vocabulary: %d tokens, %lld trie nodes, %.1f MiB, built in %.0f ms\n", vocab,
              static_cast<long long>(compiler.trie().num_nodes()),
              compiler.trie().memory_bytes() / 1048576.0, vocab_ms);

  nlohmann::json results = nlohmann::json::array();
  std::printf("\n%-32s %9s %7s %7s %8s %9s %9s %9s %7s\n", "constraint", "compile", "states",
              "masks", "MiB", "mask us", "next us", "greedy us", "ratio");
  std::mt19937 rng(20261202);
  std::normal_distribution<float> body(0.0f, 2.0f);
  std::vector<float> logits(vocab), row(vocab);
  Sampler sampler(vocab);
  sampler.Reset(SamplingConfig{}, {});
  for (const Case& c : Cases()) {
    if (!absl::GetFlag(FLAGS_only).empty() && absl::GetFlag(FLAGS_only) != c.name) continue;
    t0 = Clock::now();
    auto grammar = compiler.Compile(c.spec);
    const double compile_ms = Us(Clock::now() - t0) / 1000;
    if (!grammar.ok()) {
      std::printf("%-32s refused: %s\n", c.name, std::string(grammar.status().message()).c_str());
      continue;
    }
    const structured::Grammar& g = **grammar;
    // Random constrained generations: logits are drawn per row, masked, and the chosen token is
    // the best allowed one; the same row is timed through the host sampler without the mask.
    double mask_us = 0, next_us = 0, greedy_us = 0;
    int64_t tokens = 0, finished = 0;
    for (int w = 0; w < absl::GetFlag(FLAGS_walks); ++w) {
      int32_t state = g.start();
      for (int k = 0; k < absl::GetFlag(FLAGS_max_tokens) && !g.terminal(state); ++k) {
        for (float& x : logits) x = body(rng);
        row = logits;
        auto a = Clock::now();
        sampler.Sample(absl::MakeSpan(row));
        auto b = Clock::now();
        greedy_us += Us(b - a);
        a = Clock::now();
        g.MaskLogits(state, absl::MakeSpan(logits), end_ids, true);
        b = Clock::now();
        mask_us += Us(b - a);
        const int32_t token =
            static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
        if (std::find(end_ids.begin(), end_ids.end(), token) != end_ids.end()) {
          ++finished;
          break;
        }
        a = Clock::now();
        state = g.Next(state, token);
        b = Clock::now();
        next_us += Us(b - a);
        ++tokens;
        if (state == structured::Grammar::kDead) {
          std::fprintf(stderr, "%s: the mask let through a token the automaton refuses\n",
                       c.name);
          return 1;
        }
      }
      finished += g.terminal(state);
    }
    const double n = static_cast<double>(std::max<int64_t>(tokens, 1));
    const double ratio = (mask_us + next_us) / greedy_us;
    std::printf("%-32s %7.1fms %7d %7d %8.2f %9.2f %9.2f %9.2f %6.2fx\n", c.name, compile_ms,
                g.num_states(), g.num_distinct_masks(), g.memory_bytes() / 1048576.0, mask_us / n,
                next_us / n, greedy_us / n, ratio);
    results.push_back({{"constraint", c.name},
                       {"compile_ms", compile_ms},
                       {"states", g.num_states()},
                       {"distinct_masks", g.num_distinct_masks()},
                       {"memory_mib", g.memory_bytes() / 1048576.0},
                       {"tokens", tokens},
                       {"walks_finished", finished},
                       {"mask_us_per_token", mask_us / n},
                       {"next_us_per_token", next_us / n},
                       {"greedy_sample_us_per_token", greedy_us / n},
                       {"constraint_over_greedy", ratio}});
  }
  std::printf("\nmask us / next us: per constrained token on the engine thread; greedy us: the "
              "host sampler's greedy pass over the same row; ratio = (mask + next) / greedy.\n");
  if (!absl::GetFlag(FLAGS_json).empty()) {
    nlohmann::json out = {{"tokenizer", absl::GetFlag(FLAGS_tokenizer)},
                          {"threads", absl::GetFlag(FLAGS_threads)},
                          {"vocab", vocab},
                          {"trie_nodes", compiler.trie().num_nodes()},
                          {"vocabulary_ms", vocab_ms},
                          {"constraints", results}};
    std::ofstream(absl::GetFlag(FLAGS_json)) << out.dump(2) << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace kvrm

int main(int argc, char** argv) { return kvrm::Main(argc, argv); }
