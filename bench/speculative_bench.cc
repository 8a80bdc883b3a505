// Speculative decoding by prompt lookup (EngineOptions::speculative_tokens): the same requests
// through the in-process engine on the CPU backend without drafts and with them, back to back in
// one process, on the generated model (bf16 weights).
//
//   bazel build //bench:speculative_bench
//   bazel-bin/bench/speculative_bench --json=/tmp/speculative.json
//
// For each concurrency C (--concurrency; C slots, --requests requests, by default 2 x C, all
// queued at once) and workload (--workloads):
//   repeat:  prompts of --prompt_tokens ids in which a random 8-16 token phrase comes again and
//            again with noise (a substituted token, a few random ids between copies), the input
//            prompt lookup is for (quoting, editing); greedy decoding;
//   sampled: random prompts, --temperature (1.0), top-p 0.95, seeded: drafts mostly fail or find
//            no match, which shows what they cost where they do not help;
//   record:  random prompts, greedy, the output held to a regex of 15 JSON records
//            ({"name": "...", "id": NN, "ok": true|false}, ...), longer than --max_new_tokens:
//            the keys and punctuation it forces are jump-forward drafts.
// Every request generates exactly --max_new_tokens (ignore_eos); the engine runs with kvrmd's
// max_prefill_stall (--max_prefill_stall). The two runs of a pair alternate their order across
// --repeats (the machine is shared and noisy), and the table shows medians: of each mode's
// figures, and of the pairs' ratios (tok/s with / without, TPOT without / with). Every run's
// token ids must equal the first run's (drafts never change outputs): the `identical` column,
// and the exit status is 1 where they are not.
//
// TPOT is a request's (last token - first token) / (tokens - 1), TTFT its first token's time
// since the run began (every request is queued then), both averaged over the requests. "busy
// elsewhere" is the most cores other processes kept busy on average during any of a row's runs
// (from /proc/stat; 0 on a quiet machine), to read its ratios by.
//
// Tokens per decode step is per request (slot-step): a slot's first token comes with its last
// prefill chunk, and each decode step then gives it 1 + the drafts accepted, so it is
// (tokens - requests) / (tokens - requests - accepted). The JSON's lookup_replay is the proposer
// alone replayed over the outputs, drafting wherever it finds a match (ReplayLookup): what the
// engine's choice of when to draft is read against. The model's weights are random: its greedy
// continuations are not those of a trained model (it does not copy the prompt's phrase; its
// greedy output falls into loops, which is where the drafts it accepts come from), so acceptance
// here is the generated model's, not a real model's (docs/benchmarks.md).

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/engine_run.h"
#include "bench/generated_model.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "runtime/engine.h"
#include "runtime/model_bundle.h"
#include "runtime/ngram_proposer.h"
#include "runtime/structured/compiler.h"

ABSL_FLAG(std::string, size, "small", "generated model shape (tools/modelgen): tiny or small");
ABSL_FLAG(std::string, model_dir, "", "where to generate the model (default: a temp dir)");
ABSL_FLAG(std::string, concurrency, "1,4,16",
          "slot counts, comma-separated (each run's requests are all queued at once)");
ABSL_FLAG(std::string, workloads, "repeat,sampled", "workloads, comma-separated");
ABSL_FLAG(int32_t, requests, 0, "requests per run (0: 2 x the concurrency)");
ABSL_FLAG(int32_t, prompt_tokens, 200, "prompt tokens per request");
ABSL_FLAG(int32_t, max_new_tokens, 128, "tokens each request generates (ignore_eos)");
ABSL_FLAG(int32_t, speculative_tokens, 4, "EngineOptions::speculative_tokens of the drafted runs");
ABSL_FLAG(int32_t, prompt_lookup_min, 2, "speculative_ngram.min_ngram");
ABSL_FLAG(int32_t, prompt_lookup_max, 4, "speculative_ngram.max_ngram");
ABSL_FLAG(int32_t, repeats, 3, "pairs of runs per row (their order alternates); medians shown");
ABSL_FLAG(double, temperature, 1.0, "the sampled workload's temperature (top-p 0.95)");
ABSL_FLAG(double, max_prefill_stall, 0.5,
          "EngineOptions::max_prefill_stall (kvrmd's default; 0: a prefill chunk takes the step's "
          "whole token budget)");
ABSL_FLAG(int32_t, threads, 2, "CPU backend threads");
ABSL_FLAG(std::string, json, "", "also write the figures as JSON");

namespace kvrm {
namespace {

struct RequestSpec {
  std::vector<int32_t> prompt;
  std::shared_ptr<const structured::Grammar> grammar;  // record: the output's constraint
  float temperature = 0;
  float top_p = 1;
  uint64_t seed = 0;
};

// A few random ids, then copies of one 8-16 token phrase until `length`: a copy has one token
// substituted one time in four, and 0-2 random ids follow it. The last copy is cut where the
// prompt ends, so the phrase's rest is what prompt lookup drafts.
std::vector<int32_t> RepeatPrompt(bench::IdSource& ids, int32_t length) {
  std::vector<int32_t> phrase(8 + ids.Below(9));
  for (int32_t& t : phrase) t = ids.Next();
  std::vector<int32_t> p;
  for (int32_t i = 0, lead = length / 8; i < lead; ++i) p.push_back(ids.Next());
  while (static_cast<int32_t>(p.size()) < length) {
    std::vector<int32_t> copy = phrase;
    if (ids.Below(4) == 0) copy[ids.Below(static_cast<uint32_t>(copy.size()))] = ids.Next();
    p.insert(p.end(), copy.begin(), copy.end());
    for (uint32_t i = 0, noise = ids.Below(3); i < noise; ++i) p.push_back(ids.Next());
  }
  p.resize(length);
  return p;
}

// The record workload's constraint, compiled against the model's vocabulary once.
std::shared_ptr<const structured::Grammar> RecordGrammar(const ModelBundle& model) {
  static std::shared_ptr<const structured::Grammar>* const grammar = [&] {
    structured::ConstraintCompiler compiler(StructuredTokenBytes(model));
    structured::ConstraintSpec spec;
    const std::string item = R"(\{"name": "[a-z]{3,8}", "id": [0-9]{2}, "ok": (true|false)\})";
    spec.text = absl::StrCat(R"(\[()", item, ", ){14}", item, R"(\])");
    absl::StatusOr<std::shared_ptr<const structured::Grammar>> g = compiler.Compile(spec);
    CHECK_OK(g.status());
    return new std::shared_ptr<const structured::Grammar>(*g);
  }();
  return *grammar;
}

std::vector<RequestSpec> MakeWorkload(const ModelBundle& model, const std::string& workload,
                                      int32_t requests, int32_t concurrency) {
  bench::IdSource ids(model, 1000 * concurrency + (workload == "repeat" ? 1 : 2));
  const int32_t length = absl::GetFlag(FLAGS_prompt_tokens);
  std::vector<RequestSpec> out(requests);
  for (int32_t i = 0; i < requests; ++i) {
    RequestSpec& r = out[i];
    r.seed = 7 + i;
    if (workload == "repeat") {
      r.prompt = RepeatPrompt(ids, length);
    } else if (workload == "record") {
      for (int32_t k = 0; k < length; ++k) r.prompt.push_back(ids.Next());
      r.grammar = RecordGrammar(model);
    } else {
      for (int32_t k = 0; k < length; ++k) r.prompt.push_back(ids.Next());
      r.temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature));
      r.top_p = 0.95f;
    }
  }
  return out;
}

struct RunResult : bench::EngineRun {
  uint64_t drafts = 0, draft_tokens = 0, accepted = 0;
  double acceptance = 0;       // accepted / draft tokens
  double tokens_per_step = 0;  // per request and decode step (see the file comment)
};

absl::StatusOr<RunResult> RunOnce(const ModelBundle& model, const EngineOptions& options,
                                  const std::vector<RequestSpec>& specs) {
  const int32_t n = static_cast<int32_t>(specs.size());
  const int32_t max_new = absl::GetFlag(FLAGS_max_new_tokens);
  std::vector<std::unique_ptr<GenerationRequest>> requests;
  for (int32_t i = 0; i < n; ++i) {
    auto r = std::make_unique<GenerationRequest>();
    r->request_id = absl::StrCat("r", i);
    r->prompt = specs[i].prompt;
    r->max_new_tokens = max_new;
    r->ignore_eos = true;
    r->sampling.temperature = specs[i].temperature;
    r->sampling.top_p = specs[i].top_p;
    r->sampling.seed = specs[i].seed;
    r->grammar = specs[i].grammar;
    requests.push_back(std::move(r));
  }
  RunResult run;
  ASSIGN_OR_RETURN(static_cast<bench::EngineRun&>(run),
                   bench::RunQueued(model, options, std::move(requests), max_new));
  run.drafts = run.stats.spec_decode_drafts_total;
  run.draft_tokens = run.stats.spec_decode_draft_tokens_total;
  run.accepted = run.stats.spec_decode_accepted_tokens_total;
  run.acceptance = run.draft_tokens > 0 ? static_cast<double>(run.accepted) / run.draft_tokens : 0;
  const double decode_tokens = static_cast<double>(run.tokens) - n;
  run.tokens_per_step =
      decode_tokens > 0 ? decode_tokens / (decode_tokens - static_cast<double>(run.accepted)) : 0;
  return run;
}

nlohmann::json ModeJson(const std::vector<RunResult>& runs) {
  nlohmann::json j = bench::RunsJson(runs);
  auto median = [&](auto field) {
    std::vector<double> v;
    for (const RunResult& r : runs) v.push_back(static_cast<double>(field(r)));
    return bench::Median(v);
  };
  j["drafts"] = median([](const RunResult& r) { return r.drafts; });
  j["draft_tokens"] = median([](const RunResult& r) { return r.draft_tokens; });
  j["accepted_tokens"] = median([](const RunResult& r) { return r.accepted; });
  j["acceptance"] = median([](const RunResult& r) { return r.acceptance; });
  j["tokens_per_step"] = median([](const RunResult& r) { return r.tokens_per_step; });
  for (size_t i = 0; i < runs.size(); ++i) {
    j["runs"][i]["drafts"] = runs[i].drafts;
    j["runs"][i]["draft_tokens"] = runs[i].draft_tokens;
    j["runs"][i]["accepted_tokens"] = runs[i].accepted;
  }
  return j;
}

// The proposer alone over the outputs: prompt lookup drafting the most it may (K, within the
// request's length) at every step where it finds a match, whatever the acceptance, as vLLM's
// `ngram` method does. What the engine's per-step policy (drafting only where it pays) is read
// against: the acceptance and tokens per step the drafts themselves would give.
nlohmann::json ReplayLookup(const std::vector<RequestSpec>& specs,
                            const std::vector<std::vector<int32_t>>& outputs) {
  const int32_t k = absl::GetFlag(FLAGS_speculative_tokens);
  const NgramDraftOptions ngram{absl::GetFlag(FLAGS_prompt_lookup_min),
                                absl::GetFlag(FLAGS_prompt_lookup_max)};
  uint64_t steps = 0, drafts = 0, draft_tokens = 0, accepted = 0;
  std::vector<int32_t> draft(k);
  for (size_t i = 0; i < specs.size(); ++i) {
    const std::vector<int32_t>& out = outputs[i];
    const int32_t m = static_cast<int32_t>(out.size());
    std::vector<int32_t> history = specs[i].prompt;
    // Token g - 1 is the step's input; its first comes with the prompt's last chunk.
    for (int32_t g = 1; g < m;) {
      const int32_t n =
          ProposeNgramDraft(history, out[g - 1], ngram, std::min(k, m - g - 1), draft.data());
      int32_t a = 0;
      while (a < n && draft[a] == out[g + a]) ++a;
      ++steps;
      drafts += n > 0;
      draft_tokens += n;
      accepted += a;
      for (int32_t j = 0; j <= a; ++j) history.push_back(out[g - 1 + j]);
      g += a + 1;
    }
  }
  return {{"steps", steps},
          {"drafts", drafts},
          {"draft_tokens", draft_tokens},
          {"accepted_tokens", accepted},
          {"acceptance", draft_tokens > 0 ? static_cast<double>(accepted) / draft_tokens : 0},
          {"tokens_per_step", steps > 0 ? static_cast<double>(steps + accepted) / steps : 0}};
}

// Both modes `repeats` times on one workload at one concurrency; the row's JSON.
absl::StatusOr<nlohmann::json> RunRow(const ModelBundle& model, const std::string& workload,
                                      int32_t concurrency) {
  const int32_t requests =
      absl::GetFlag(FLAGS_requests) > 0 ? absl::GetFlag(FLAGS_requests) : 2 * concurrency;
  const std::vector<RequestSpec> specs = MakeWorkload(model, workload, requests, concurrency);
  const int32_t k = absl::GetFlag(FLAGS_speculative_tokens);
  EngineOptions o;
  o.slots = concurrency;
  // The same KV for both modes: every request's prompt, output and drafts.
  const int32_t need = absl::GetFlag(FLAGS_prompt_tokens) + absl::GetFlag(FLAGS_max_new_tokens) + k;
  o.max_context = std::min((need + 16) / 16 * 16, model.config.max_position_embeddings);
  o.max_queue = requests + 1;
  o.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  o.max_prefill_stall = absl::GetFlag(FLAGS_max_prefill_stall);
  o.threads = absl::GetFlag(FLAGS_threads);
  o.speculative_ngram = NgramDraftOptions{absl::GetFlag(FLAGS_prompt_lookup_min),
                                          absl::GetFlag(FLAGS_prompt_lookup_max)};
  std::vector<RunResult> runs[2];  // [without, with]
  std::vector<double> speedup, tpot_ratio;
  bool identical = true;
  for (int32_t rep = 0; rep < absl::GetFlag(FLAGS_repeats); ++rep) {
    for (int32_t m : rep % 2 == 0 ? std::vector<int32_t>{0, 1} : std::vector<int32_t>{1, 0}) {
      o.speculative_tokens = m == 0 ? 0 : k;
      ASSIGN_OR_RETURN(RunResult r, RunOnce(model, o, specs));
      if (!runs[0].empty() || !runs[1].empty()) {
        const RunResult& first = runs[0].empty() ? runs[1][0] : runs[0][0];
        identical = identical && r.outputs == first.outputs;
      }
      runs[m].push_back(std::move(r));
    }
    const RunResult &off = runs[0].back(), &on = runs[1].back();
    speedup.push_back(off.tokens_per_s > 0 ? on.tokens_per_s / off.tokens_per_s : 0);
    tpot_ratio.push_back(on.tpot_ms > 0 ? off.tpot_ms / on.tpot_ms : 0);
  }
  const nlohmann::json lookup = ReplayLookup(specs, runs[0][0].outputs);
  for (RunResult& r : runs[0]) r.outputs.clear();
  for (RunResult& r : runs[1]) r.outputs.clear();
  return nlohmann::json{{"workload", workload},
                        {"concurrency", concurrency},
                        {"requests", requests},
                        {"without", ModeJson(runs[0])},
                        {"with", ModeJson(runs[1])},
                        {"speedup_tokens_per_s", bench::Median(speedup)},
                        {"speedup_tpot", bench::Median(tpot_ratio)},
                        {"speedup_tokens_per_s_runs", speedup},
                        {"speedup_tpot_runs", tpot_ratio},
                        {"lookup_replay", lookup},
                        {"identical", identical}};
}

void PrintRow(const nlohmann::json& r) {
  const nlohmann::json &off = r["without"], &on = r["with"];
  auto f = [](const nlohmann::json& j, const char* key) { return j[key].get<double>(); };
  std::printf(
      "| %s | %d | %d | %.0f | %.0f | %.2fx | %.2f | %.2f | %.2fx | %.2f | %.2f | %.0f | %.0f | "
      "%.0f | %.0f | %.2f | %.2f | %s | %.2f |\n",
      r["workload"].get<std::string>().c_str(), r["concurrency"].get<int>(),
      r["requests"].get<int>(), f(off, "tokens_per_s"), f(on, "tokens_per_s"),
      f(r, "speedup_tokens_per_s"), f(off, "tpot_ms"), f(on, "tpot_ms"), f(r, "speedup_tpot"),
      f(off, "ttft_s"), f(on, "ttft_s"), f(off, "steps"), f(on, "steps"), f(on, "draft_tokens"),
      f(on, "accepted_tokens"), f(on, "acceptance"), f(on, "tokens_per_step"),
      r["identical"].get<bool>() ? "yes" : "NO",
      std::max(f(off, "others_cores_max"), f(on, "others_cores_max")));
  std::fflush(stdout);
}

// The flags' values that the engine would refuse later, or a run could not use; false after
// naming them.
bool CheckFlags(const std::vector<std::string>& workloads) {
  for (const std::string& w : workloads) {
    if (w != "repeat" && w != "sampled" && w != "record") {
      std::fprintf(stderr, "--workloads: '%s' (repeat, sampled, record)\n", w.c_str());
      return false;
    }
  }
  if (absl::GetFlag(FLAGS_speculative_tokens) < 1 || absl::GetFlag(FLAGS_repeats) < 1 ||
      absl::GetFlag(FLAGS_prompt_tokens) < 1 || absl::GetFlag(FLAGS_max_new_tokens) < 2) {
    std::fprintf(stderr,
                 "need --speculative_tokens >= 1, --repeats >= 1, --prompt_tokens >= 1 and "
                 "--max_new_tokens >= 2\n");
    return false;
  }
  return true;
}

// One untimed request: the first run in the process would otherwise also fault in the
// memory-mapped weights.
absl::Status WarmUp(const ModelBundle& model) {
  EngineOptions o;
  o.slots = 1;
  o.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  o.threads = absl::GetFlag(FLAGS_threads);
  o.max_context =
      std::min(absl::GetFlag(FLAGS_prompt_tokens) + absl::GetFlag(FLAGS_max_new_tokens) + 16,
               model.config.max_position_embeddings);
  return RunOnce(model, o, MakeWorkload(model, "sampled", 1, 1)).status();
}

// The machine and the configuration: the JSON's top-level fields, and the table's heading.
nlohmann::json Config(const ModelBundle& model) {
  nlohmann::json out =
      bench::MachineJson(model, absl::GetFlag(FLAGS_size), absl::GetFlag(FLAGS_threads));
  out.update(nlohmann::json{{"prompt_tokens", absl::GetFlag(FLAGS_prompt_tokens)},
                            {"max_new_tokens", absl::GetFlag(FLAGS_max_new_tokens)},
                            {"speculative_tokens", absl::GetFlag(FLAGS_speculative_tokens)},
                            {"prompt_lookup_min", absl::GetFlag(FLAGS_prompt_lookup_min)},
                            {"prompt_lookup_max", absl::GetFlag(FLAGS_prompt_lookup_max)},
                            {"repeats", absl::GetFlag(FLAGS_repeats)},
                            {"temperature", absl::GetFlag(FLAGS_temperature)},
                            {"max_prefill_stall", absl::GetFlag(FLAGS_max_prefill_stall)}});
  return out;
}

void PrintHeading(const nlohmann::json& c) {
  std::printf(
      "speculative decoding by prompt lookup: %s model (vocab %d), CPU backend, %d threads, %s "
      "(%u cores), %s\n",
      c["model"].get<std::string>().c_str(), c["vocab"].get<int>(), c["threads"].get<int>(),
      c["cpu"].get<std::string>().c_str(), c["cores"].get<unsigned>(),
      c["date"].get<std::string>().c_str());
  std::printf(
      "prompts %d tokens, %d new tokens each, speculative_tokens %d, prompt lookup %d-%d, "
      "sampled at temperature %.2f, max_prefill_stall %.2f, medians of %d pairs\n\n",
      c["prompt_tokens"].get<int>(), c["max_new_tokens"].get<int>(),
      c["speculative_tokens"].get<int>(), c["prompt_lookup_min"].get<int>(),
      c["prompt_lookup_max"].get<int>(), c["temperature"].get<double>(),
      c["max_prefill_stall"].get<double>(), c["repeats"].get<int>());
  std::printf(
      "| workload | concurrency | requests | tok/s off | tok/s on | tok/s on/off | TPOT ms off | "
      "TPOT ms on | TPOT off/on | TTFT s off | TTFT s on | steps off | steps on | draft tokens | "
      "accepted | acceptance | tokens/step | identical | busy elsewhere |\n");
  std::string rule = "|---|";  // text columns left-aligned, figures right-aligned
  for (int i = 0; i < 16; ++i) rule += "---:|";
  std::printf("%s---|---:|\n", rule.c_str());
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::vector<int32_t> concurrency;
  if (!bench::ParseCounts("concurrency", absl::GetFlag(FLAGS_concurrency), &concurrency)) return 1;
  const std::vector<std::string> workloads = absl::StrSplit(absl::GetFlag(FLAGS_workloads), ',');
  if (!CheckFlags(workloads)) return 1;
  auto model = bench::LoadGeneratedModel(absl::GetFlag(FLAGS_model_dir), absl::GetFlag(FLAGS_size),
                                         "kvrm-speculative-bench");
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
    return 1;
  }
  if (const absl::Status warm = WarmUp(**model); !warm.ok()) {
    std::fprintf(stderr, "warm-up: %s\n", warm.ToString().c_str());
    return 1;
  }
  nlohmann::json out = Config(**model);
  PrintHeading(out);
  nlohmann::json rows = nlohmann::json::array();
  bool all_identical = true;
  for (const std::string& w : workloads) {
    for (int32_t c : concurrency) {
      absl::StatusOr<nlohmann::json> row = RunRow(**model, w, c);
      if (!row.ok()) {
        std::fprintf(stderr, "%s at concurrency %d: %s\n", w.c_str(), c,
                     row.status().ToString().c_str());
        return 1;
      }
      PrintRow(*row);
      all_identical = all_identical && (*row)["identical"].get<bool>();
      rows.push_back(*std::move(row));
    }
  }
  out["all_identical"] = all_identical;
  out["rows"] = rows;
  if (const std::string path = absl::GetFlag(FLAGS_json); !path.empty()) {
    std::ofstream(path) << out.dump(2) << "\n";
  }
  if (!all_identical) {
    std::fprintf(stderr, "outputs differ with drafts and without (see the identical column)\n");
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace kvrm

int main(int argc, char** argv) { return kvrm::Main(argc, argv); }
