// Structured outputs end to end: constrained requests through gRPC on the tiny model, sampled at
// temperature 1 so that the random-weight model goes everywhere the constraint lets it.
#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/json.h"
#include "gtest/gtest.h"
#include "metrics/kvrm_metrics.h"
#include "metrics/registry.h"
#include "runtime/structured/automaton.h"
#include "runtime/structured/compiler.h"
#include "runtime/structured/gbnf.h"
#include "runtime/structured/json_schema.h"
#include "runtime/structured/regex_parser.h"
#include "server/kvrm_service.h"
#include "tests/test_server.h"

namespace kvrm {
namespace {

using structured::Dfa;

EngineOptions Options(int slots) {
  EngineOptions o;
  o.slots = slots;
  o.max_queue = 64;
  o.max_new_tokens = 256;
  o.prefill_chunk = 32;
  o.threads = 2;
  return o;
}

Dfa RegexDfa(const std::string& pattern) {
  auto regex = structured::ParseRegex(pattern);
  CHECK(regex.ok()) << regex.status();
  auto dfa = Dfa::Compile(*regex);
  CHECK(dfa.ok()) << dfa.status();
  return *std::move(dfa);
}

Dfa SchemaDfa(const std::string& schema) {
  auto regex = structured::JsonSchemaTextToRegex(schema);
  CHECK(regex.ok()) << regex.status();
  auto dfa = Dfa::Compile(*regex);
  CHECK(dfa.ok()) << dfa.status();
  return *std::move(dfa);
}

// True when `text` can still be completed to a match (no byte of it leaves the automaton).
bool IsViablePrefix(const Dfa& dfa, const std::string& text) {
  int32_t s = dfa.start();
  for (char c : text) {
    s = dfa.Next(s, static_cast<uint8_t>(c));
    if (s == Dfa::kDead) return false;
  }
  return true;
}

v1::GenerateRequest Sampled(const std::string& prompt, int max_new_tokens, uint64_t seed) {
  v1::GenerateRequest req = TextRequest(prompt, max_new_tokens);
  req.mutable_sampling()->set_temperature(1.0f);
  req.mutable_sampling()->set_seed(seed);
  return req;
}

// Checks one finished completion against the automaton: a whole match when it ended by itself
// (STOP: complete; EOS: the model chose to end where the text is whole), a viable prefix when cut
// by the length limit. Returns whether it was whole.
bool CheckCompletion(const Dfa& dfa, const StreamResult& r) {
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  const v1::FinishReason reason = r.finished.reason();
  if (reason == v1::FINISH_REASON_STOP || reason == v1::FINISH_REASON_EOS) {
    EXPECT_TRUE(dfa.Matches(r.text)) << v1::FinishReason_Name(reason) << " \"" << r.text << "\"";
    return true;
  }
  EXPECT_EQ(reason, v1::FINISH_REASON_LENGTH) << r.finished.error();
  EXPECT_TRUE(IsViablePrefix(dfa, r.text)) << "\"" << r.text << "\"";
  return false;
}

class StructuredOutputTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = new TestServer(Options(4)); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  v1::Kvrm::Stub& stub() { return server_->stub(); }
  static TestServer* server_;
};
TestServer* StructuredOutputTest::server_ = nullptr;

TEST_F(StructuredOutputTest, SampledTextMatchesTheRegex) {
  const std::string pattern = "(yes|no|maybe), because [a-z ]{3,24}\\.( Score: [1-9][0-9]?/10)?";
  const Dfa dfa = RegexDfa(pattern);
  int whole = 0;
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    v1::GenerateRequest req = Sampled("Answer the question:", 96, seed);
    req.mutable_structured()->set_regex(pattern);
    const StreamResult r = RunGenerate(stub(), req);
    whole += CheckCompletion(dfa, r);
    // Each message's text is a prefix of a match as it arrives, not only the end.
    std::string so_far;
    for (const v1::GenerateResponse& m : r.messages) {
      so_far += m.text();
      EXPECT_TRUE(IsViablePrefix(dfa, so_far)) << so_far;
    }
  }
  // Every completion is bounded by the regex (at most ~60 bytes, 96 tokens): all must end whole.
  EXPECT_EQ(whole, 12);
}

TEST_F(StructuredOutputTest, JsonSchemaOutputParsesAndHoldsTheSchema) {
  const std::string schema = R"({
    "type": "object",
    "properties": {
      "name": {"type": "string", "minLength": 1, "maxLength": 12},
      "age": {"type": "integer", "minimum": 0, "maximum": 120},
      "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
      "ok": {"type": "boolean"}
    },
    "required": ["name", "age"]
  })";
  const Dfa dfa = SchemaDfa(schema);
  int parsed = 0;
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    v1::GenerateRequest req = Sampled("Describe a person as JSON:", 160, seed);
    req.mutable_structured()->set_json_schema(schema);
    const StreamResult r = RunGenerate(stub(), req);
    if (!CheckCompletion(dfa, r)) continue;
    auto json = ParseJson(r.text, "completion");
    ASSERT_TRUE(json.ok()) << r.text;
    ASSERT_TRUE(json->is_object()) << r.text;
    ASSERT_TRUE(json->contains("name") && (*json)["name"].is_string()) << r.text;
    const std::string name = (*json)["name"].get<std::string>();
    EXPECT_GE(name.size(), 1u);
    ASSERT_TRUE(json->contains("age") && (*json)["age"].is_number_integer()) << r.text;
    EXPECT_GE((*json)["age"].get<int64_t>(), 0);
    EXPECT_LE((*json)["age"].get<int64_t>(), 120);
    if (json->contains("tags")) {
      ASSERT_TRUE((*json)["tags"].is_array());
      EXPECT_LE((*json)["tags"].size(), 3u);
      for (const Json& t : (*json)["tags"]) {
        const std::string tag = t.get<std::string>();
        EXPECT_TRUE(tag == "red" || tag == "green" || tag == "blue") << tag;
      }
    }
    for (auto it = json->begin(); it != json->end(); ++it) {
      EXPECT_TRUE(it.key() == "name" || it.key() == "age" || it.key() == "tags" ||
                  it.key() == "ok")
          << it.key();
    }
    ++parsed;
  }
  // The schema bounds every value (the name's 12 characters may be escapes of up to 6 bytes):
  // 160 tokens always suffice.
  EXPECT_EQ(parsed, 10);
}

TEST_F(StructuredOutputTest, JsonObjectIsAnObjectOrAViablePrefixOfOne) {
  const Dfa dfa = [] {
    auto regex = structured::AnyJsonObject(structured::JsonSchemaOptions{});
    auto d = Dfa::Compile(regex);
    CHECK(d.ok()) << d.status();
    return *std::move(d);
  }();
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    v1::GenerateRequest req = Sampled("JSON:", 64, seed);
    req.mutable_structured()->set_json_object(true);
    const StreamResult r = RunGenerate(stub(), req);
    ASSERT_FALSE(r.text.empty());
    EXPECT_EQ(r.text[0], '{') << r.text;
    if (CheckCompletion(dfa, r)) {
      auto json = ParseJson(r.text, "completion");
      ASSERT_TRUE(json.ok()) << r.text;
      EXPECT_TRUE(json->is_object());
    }
  }
}

TEST_F(StructuredOutputTest, ChoiceIsExactlyOneOfTheChoices) {
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    v1::GenerateRequest req = Sampled("Pick a colour:", 32, seed);
    for (const char* c : {"red", "green", "blue", "ultramarine violet"}) {
      req.mutable_structured()->mutable_choice()->add_choices(c);
    }
    const StreamResult r = RunGenerate(stub(), req);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_TRUE(r.text == "red" || r.text == "green" || r.text == "blue" ||
                r.text == "ultramarine violet")
        << r.text;
    // No choice is a prefix of another: the completion ends the moment one is written, without
    // a step for the end token.
    EXPECT_EQ(r.finished.reason(), v1::FINISH_REASON_STOP);
    EXPECT_EQ(r.finished.matched_stop(), "");
  }
}

// Depth of nested JSON arrays in `v` (a scalar: 0).
int ArrayDepth(const Json& v) {
  if (!v.is_array()) return 0;
  int deepest = 0;
  for (const Json& e : v) deepest = std::max(deepest, ArrayDepth(e));
  return deepest + 1;
}

// A recursive GBNF grammar (nested lists of integers), checked apart from the automaton it
// compiles to: every whole completion parses as JSON, holds only integers and arrays, and nests
// no deeper than the unfolding's 4 levels.
TEST_F(StructuredOutputTest, GrammarOutputIsALanguageOfTheGrammar) {
  const std::string grammar = R"(# nested lists of integers
root ::= list
list ::= "[" ( item ( "," " "? item )* )? "]"
item ::= "-"? [1-9] [0-9]{0,3} | "0" | list
)";
  auto regex = structured::GbnfToRegex(grammar);
  ASSERT_TRUE(regex.ok()) << regex.status();
  auto compiled = Dfa::Compile(*regex, structured::DfaLimits{.max_states = 100000});
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  const Dfa& dfa = *compiled;
  int whole = 0;
  int nested = 0;
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    v1::GenerateRequest req = Sampled("A list:", 48, seed);
    req.mutable_structured()->set_grammar(grammar);
    const StreamResult r = RunGenerate(stub(), req);
    std::string so_far;
    for (const v1::GenerateResponse& m : r.messages) {
      so_far += m.text();
      EXPECT_TRUE(IsViablePrefix(dfa, so_far)) << so_far;
    }
    if (!CheckCompletion(dfa, r)) continue;
    ++whole;
    auto json = ParseJson(r.text, "completion");
    ASSERT_TRUE(json.ok()) << r.text;
    ASSERT_TRUE(json->is_array()) << r.text;
    const int depth = ArrayDepth(*json);
    EXPECT_LE(depth, 4) << r.text;
    nested += depth > 1;
    std::function<void(const Json&)> integers = [&](const Json& v) {
      if (v.is_array()) {
        for (const Json& e : v) integers(e);
      } else {
        EXPECT_TRUE(v.is_number_integer()) << r.text;
      }
    };
    integers(*json);
  }
  // Sampling at temperature 1 ends most lists within 48 tokens, some of them nested.
  EXPECT_GE(whole, 4);
  EXPECT_GE(nested, 1);
}

TEST_F(StructuredOutputTest, GreedyUnderAConstraintItAlreadyMeetsIsUnchanged) {
  // The mask only removes tokens: where the model's own greedy choice is allowed, it is chosen.
  v1::GenerateRequest free = TextRequest("Once upon a time", 12);
  free.mutable_stopping()->set_ignore_eos(true);
  const StreamResult base = RunGenerate(stub(), free);
  ASSERT_TRUE(base.status.ok());
  ASSERT_EQ(base.tokens.size(), 12u);
  std::string escaped;
  for (char c : base.text) {
    if (std::string_view("\\.+*?()|[]{}^$-/").find(c) != std::string_view::npos) {
      escaped.push_back('\\');
    }
    escaped.push_back(c);
  }
  v1::GenerateRequest constrained = free;
  constrained.mutable_stopping()->set_max_new_tokens(40);
  constrained.mutable_structured()->set_regex(escaped);
  const StreamResult r = RunGenerate(stub(), constrained);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens, base.tokens);
  EXPECT_EQ(r.text, base.text);
  EXPECT_EQ(r.finished.reason(), v1::FINISH_REASON_STOP);  // the whole text, nothing can follow
}

TEST_F(StructuredOutputTest, TopLogprobsOnlyNameTokensTheConstraintAllows) {
  const std::string pattern = "[0-9]{2,4}-[a-f]{2}";
  structured::ConstraintCompiler compiler(StructuredTokenBytes(server_->model()));
  structured::ConstraintSpec spec;
  spec.kind = structured::ConstraintSpec::Kind::kRegex;
  spec.text = pattern;
  auto grammar = compiler.Compile(spec);
  ASSERT_TRUE(grammar.ok()) << grammar.status();
  const std::vector<int32_t>& eos = server_->model().config.eos_token_ids;
  auto is_eos = [&](int32_t id) { return std::find(eos.begin(), eos.end(), id) != eos.end(); };
  v1::GenerateRequest req = Sampled("Code:", 16, 7);
  req.mutable_structured()->set_regex(pattern);
  req.mutable_response()->set_top_logprobs(5);
  const StreamResult r = RunGenerate(stub(), req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  int32_t state = (*grammar)->start();
  int checked = 0;
  for (const v1::GenerateResponse& m : r.messages) {
    for (const v1::TokenLogprob& lp : m.logprobs()) {
      EXPECT_GE(lp.top_size(), 1);
      for (const v1::TopLogprob& top : lp.top()) {
        EXPECT_TRUE((*grammar)->Allows(state, top.token_id()) ||
                    (is_eos(top.token_id()) && (*grammar)->accepting(state)))
            << "token " << top.token_id() << " after \"" << r.text << "\"";
        EXPECT_TRUE(std::isfinite(top.logprob()));
        ++checked;
      }
      if (!is_eos(lp.token_id())) state = (*grammar)->Next(state, lp.token_id());
      ASSERT_NE(state, structured::Grammar::kDead);
    }
  }
  EXPECT_GT(checked, 10);
}

TEST_F(StructuredOutputTest, BadConstraintsGetInvalidArgumentNamingTheField) {
  auto refused = [&](const std::function<void(v1::StructuredOutput*)>& set) {
    v1::GenerateRequest req = TextRequest("x", 8);
    set(req.mutable_structured());
    const StreamResult r = RunGenerate(stub(), req);
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    return r.status.error_message();
  };
  auto has = [](const std::string& message, const std::string& part) {
    return message.find(part) != std::string::npos;
  };
  std::string m = refused([](v1::StructuredOutput*) {});
  EXPECT_TRUE(has(m, "structured: set regex, json_schema, json_object, choice or grammar")) << m;
  m = refused([](v1::StructuredOutput* s) { s->set_regex("ab(?=c)"); });
  EXPECT_TRUE(has(m, "structured.regex: regex at offset 2: lookaround")) << m;
  m = refused([](v1::StructuredOutput* s) { s->set_regex("(a{1000}){1000}"); });
  EXPECT_TRUE(has(m, "structured.regex: the constraint is too large")) << m;
  m = refused([](v1::StructuredOutput* s) { s->set_regex("(?:)"); });
  EXPECT_TRUE(has(m, "structured.regex: the constraint only matches the empty text")) << m;
  m = refused([](v1::StructuredOutput* s) { s->set_json_schema("{\"type\": "); });
  EXPECT_TRUE(has(m, "structured.json_schema: ")) << m;
  m = refused([](v1::StructuredOutput* s) {
    s->set_json_schema(R"({"properties": {"a": {"not": {"type": "string"}}}})");
  });
  EXPECT_TRUE(has(m, "structured.json_schema: ") && has(m, "/properties/a/not")) << m;
  m = refused([](v1::StructuredOutput* s) { s->set_grammar("root ::= \"a\" b"); });
  EXPECT_TRUE(has(m, "structured.grammar: grammar: line 1 column 14: undefined rule b")) << m;
  m = refused([](v1::StructuredOutput* s) { s->set_grammar("root ::= \"(\" root \")\""); });
  EXPECT_TRUE(has(m, "structured.grammar: grammar: root matches no text")) << m;
  m = refused([](v1::StructuredOutput* s) { s->set_json_object(false); });
  EXPECT_TRUE(has(m, "structured.json_object: set it to true")) << m;
  m = refused([](v1::StructuredOutput* s) { s->mutable_choice(); });
  EXPECT_TRUE(has(m, "structured.choice: no choices")) << m;
  m = refused([](v1::StructuredOutput* s) {
    s->set_json_object(true);
    s->set_whitespace_pattern("[ \\n");
  });
  EXPECT_TRUE(has(m, "structured.whitespace_pattern: ")) << m;
  m = refused([](v1::StructuredOutput* s) {
    s->set_json_object(true);
    s->set_whitespace_pattern("x|,");  // would put an x or a stray comma between JSON tokens
  });
  EXPECT_TRUE(has(m, "structured.whitespace_pattern: matches more than JSON whitespace")) << m;
  m = refused([](v1::StructuredOutput* s) {
    s->set_regex("[a-z]+");
    s->set_whitespace_pattern(" ");
  });
  EXPECT_TRUE(has(m, "structured.whitespace_pattern applies to json_schema and json_object")) << m;
  // The server still serves after all of these.
  const StreamResult ok = RunGenerate(stub(), TextRequest("x", 4));
  EXPECT_TRUE(ok.status.ok()) << ok.status.error_message();
}

// New constraints compile on the service's compile threads, with a bounded queue: a burst of
// distinct constraints gets answers (served, or RESOURCE_EXHAUSTED with retry-after-ms), never
// another error, and every served one holds its constraint.
TEST_F(StructuredOutputTest, ABurstOfNewConstraintsIsServedOrRefusedForRetry) {
  constexpr int kCalls = 96;
  std::vector<StreamResult> results(kCalls);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int k = t; k < kCalls; k += 8) {
        v1::GenerateRequest req = Sampled("x", 24, k);
        // Distinct, and not tiny: a free-text field of k + 8 characters then a number.
        req.mutable_structured()->set_regex(absl::StrCat("[^\\n]{", k + 8, "} #[0-9]{", 1 + k % 3, "}"));
        results[k] = RunGenerate(stub(), req);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  int served = 0;
  for (int k = 0; k < kCalls; ++k) {
    const StreamResult& r = results[k];
    if (r.status.ok()) {
      ++served;
      const Dfa dfa = RegexDfa(absl::StrCat("[^\\n]{", k + 8, "} #[0-9]{", 1 + k % 3, "}"));
      EXPECT_TRUE(IsViablePrefix(dfa, r.text)) << k << ": " << r.text;
      continue;
    }
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << k << ": " << r.status.error_message();
    EXPECT_EQ(r.trailers.count("retry-after-ms"), 1u);
  }
  EXPECT_GT(served, 0);
  const StreamResult after = RunGenerate(stub(), TextRequest("x", 4));
  EXPECT_TRUE(after.status.ok()) << after.status.error_message();
}

// The service's structured-output metrics: requests by kind, compiles (one per distinct
// constraint), cache hits for repeats, refusals, and the compile-time histogram.
TEST(StructuredOutputMetricsTest, RequestsCompilesHitsAndRefusalsAreCounted) {
  MetricRegistry registry;
  KvrmMetrics metrics(&registry, KvrmMetricsOptions{"tiny", "kvrm"});
  ServerOptions so;
  so.structured_metrics = &metrics.structured_outputs();
  TestServer server(Options(2), so);
  const std::string schema = R"({"type": "object", "properties": {"n": {"type": "integer"}}})";
  for (int k = 0; k < 3; ++k) {
    v1::GenerateRequest req = TextRequest("x", 8);
    req.mutable_structured()->set_json_schema(schema);
    EXPECT_TRUE(RunGenerate(server.stub(), req).status.ok());
  }
  v1::GenerateRequest choice = TextRequest("x", 8);
  choice.mutable_structured()->mutable_choice()->add_choices("a");
  EXPECT_TRUE(RunGenerate(server.stub(), choice).status.ok());
  v1::GenerateRequest grammar = TextRequest("x", 8);
  grammar.mutable_structured()->set_grammar("root ::= [a-c]+");
  EXPECT_TRUE(RunGenerate(server.stub(), grammar).status.ok());
  v1::GenerateRequest bad = TextRequest("x", 8);
  bad.mutable_structured()->set_regex("(?i)x");
  EXPECT_FALSE(RunGenerate(server.stub(), bad).status.ok());
  EXPECT_FALSE(RunGenerate(server.stub(), bad).status.ok());  // refused again, from the cache

  const std::string text = registry.Render();
  auto sample = [&](const std::string& series) {
    for (absl::string_view line : absl::StrSplit(text, '\n')) {
      if (absl::StartsWith(line, series + " ")) {
        double v = 0;
        EXPECT_TRUE(absl::SimpleAtod(line.substr(series.size() + 1), &v)) << line;
        return v;
      }
    }
    ADD_FAILURE() << "no sample " << series << " in\n" << text;
    return -1.0;
  };
  const std::string labels = "model_name=\"tiny\",kv_mode=\"kvrm\"";
  EXPECT_EQ(sample("kvrm:structured_output_requests_total{" + labels + ",kind=\"json_schema\"}"), 3);
  EXPECT_EQ(sample("kvrm:structured_output_requests_total{" + labels + ",kind=\"choice\"}"), 1);
  EXPECT_EQ(sample("kvrm:structured_output_requests_total{" + labels + ",kind=\"grammar\"}"), 1);
  EXPECT_EQ(sample("kvrm:structured_output_requests_total{" + labels + ",kind=\"regex\"}"), 0);
  // Four distinct constraints compiled (the schema, the choice, the grammar, the refused
  // regex) ...
  EXPECT_EQ(sample("kvrm:structured_output_compiles_total{" + labels + "}"), 4);
  EXPECT_EQ(sample("kvrm:structured_output_refusals_total{" + labels + "}"), 1);
  // ... and found again for the second and third schema request and the repeated regex.
  EXPECT_EQ(sample("kvrm:structured_output_cache_hits_total{" + labels + "}"), 3);
  EXPECT_EQ(sample("kvrm:structured_output_compile_seconds_count{" + labels + "}"), 4);

  // GetServerInfo reports the same from the grammar cache.
  grpc::ClientContext context;
  v1::ServerInfo info;
  ASSERT_TRUE(server.stub().GetServerInfo(&context, v1::GetServerInfoRequest(), &info).ok());
  const v1::StructuredOutputInfo& cache = info.structured_output();
  EXPECT_EQ(cache.cached_constraints(), 4);  // the refusal is cached too
  EXPECT_GT(cache.cached_bytes(), 0);
  EXPECT_EQ(cache.compiles_total(), 4u);
  EXPECT_EQ(cache.refusals_total(), 1u);
  EXPECT_EQ(cache.cache_hits_total(), 3u);
  EXPECT_GT(cache.compile_seconds_total(), 0);
}

// The same seeded, constrained requests give the same completions whatever the engine does below
// the slots: static KV, n completions of one call, and a pool so small that requests are paused
// and resumed (the automaton state must survive with the slot); two tensor-parallel ranks add
// up partial sums in another order, so there every completion is checked on its own.
TEST(StructuredOutputModesTest, EveryModeWritesTheSameConstrainedCompletions) {
  // At least five items, so that every completion needs several blocks.
  const std::string pattern = "\\[(\"[a-z]{3,6}\", ){4,7}\"[a-z]{3,6}\"\\]";
  const std::string prompt = "A list of words, with a longer prompt so that it spans blocks";
  const Dfa dfa = RegexDfa(pattern);
  uint64_t preemptions = 0;
  auto run_all = [&](EngineOptions o, bool use_n) {
    TestServer server(o);
    std::vector<std::string> texts(4);
    if (use_n) {
      v1::GenerateRequest req = Sampled(prompt, 128, 100);
      req.set_n(4);
      req.mutable_structured()->set_regex(pattern);
      const StreamResult r = RunGenerate(server.stub(), req);
      EXPECT_TRUE(r.status.ok()) << r.status.error_message();
      for (const v1::GenerateResponse& m : r.messages) texts[m.index()] += m.text();
    } else {
      std::vector<std::thread> threads;
      for (int k = 0; k < 4; ++k) {
        threads.emplace_back([&, k] {
          v1::GenerateRequest req = Sampled(prompt, 128, 100 + k);
          req.mutable_structured()->set_regex(pattern);
          const StreamResult r = RunGenerate(server.stub(), req);
          EXPECT_TRUE(r.status.ok()) << r.status.error_message();
          texts[k] = r.text;
        });
      }
      for (std::thread& t : threads) t.join();
    }
    preemptions = server.engine().Stats().preemptions_total;
    return texts;
  };
  EngineOptions base = Options(4);
  const std::vector<std::string> want = run_all(base, false);
  for (const std::string& t : want) EXPECT_TRUE(dfa.Matches(t)) << t;

  EngineOptions st = base;
  st.kv_mode = KvMode::kStatic;
  EXPECT_EQ(run_all(st, false), want) << "static KV";

  // n = 4 with seed 100: completion i uses seed 100 + i, as the separate requests above.
  EXPECT_EQ(run_all(base, true), want) << "n = 4";

  EngineOptions tight = base;
  tight.max_context = 128;
  tight.kv_blocks = 12;  // four requests of ~5 blocks each: some are paused and resumed
  EXPECT_EQ(run_all(tight, false), want) << "paused and resumed";
  EXPECT_GT(preemptions, 0u);

  EngineOptions tp = base;
  tp.tensor_parallel = 2;
  for (const std::string& t : run_all(tp, false)) EXPECT_TRUE(dfa.Matches(t)) << "tp = 2: " << t;
}

}  // namespace
}  // namespace kvrm
