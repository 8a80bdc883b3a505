// What serving LoRA adapters costs (multi-LoRA, model/lora.h): the same requests through the
// in-process engine on the CPU backend without adapters, all with one adapter, and spread over
// several adapters and the base model, back to back in one process, on the generated model (bf16
// weights).
//
//   bazel build //bench:lora_bench
//   bazel-bin/bench/lora_bench --json=/tmp/lora.json
//
// Adapters are written by tools/modelgen (MakeLoraAdapter: every projection, q k v o gate up
// down, in every layer; random values that look trained, so each changes every greedy
// continuation) and loaded with the real loader (LoadLoraAdapter) into the model's
// lora_adapters before any engine is made: --adapters of rank --rank, and one more per rank of
// --ranks that is not --rank. Every run's engine serves all of them.
//
// For each concurrency C (--concurrency; C slots, --requests requests, by default 2 x C, all
// queued at once) and mode (--modes):
//   base:   no request names an adapter (the engine still serves them all);
//   unloaded: the same, on an engine made without the adapters: against `base`, what merely
//           serving adapters costs requests that use none;
//   one:    every request runs with adapter 0 (rank --rank); with --ranks, a mode `one-rN` per
//           other rank N, every request with that rank's adapter;
//   mixed:  request i runs with the base model where i % (adapters + 1) == 0, else with adapter
//           i % (adapters + 1) - 1, so a decode step mixes adapters and the base model.
// Random prompts of --prompt_tokens ids, greedy, exactly --max_new_tokens each (ignore_eos); the
// engine runs with kvrmd's max_prefill_stall (--max_prefill_stall). The modes' order rotates
// across --repeats (repeat r starts with mode r), as the machine is shared and noisy; the table
// shows medians: of each mode's figures, and of its ratios to the `base` run of the same repeat.
//
// TPOT is a request's (last token - first token) / (tokens - 1), TTFT its first token's time
// since the run began (every request is queued then), both averaged over the requests. "busy
// elsewhere" is the most cores other processes kept busy on average during any of a row's runs
// (from /proc/stat; 0 on a quiet machine), to read its ratios by.
//
// The expectation beside each measured ratio: the mode's multiply-adds per generated token over
// the base model's (the seven projections and lm_head; attention's, which grow with the context,
// are left out), a request's adapter adding rank x (in + out) per adapted projection, averaged
// over the requests ("FLOPs vs base"); and as the CPU backend computes them ("as computed"):
// every thread of the pass forms A x for its share of B's rows, so A's rank x in comes once per
// thread. GMAC/s: on the base and unloaded rows, the run's multiply-adds in the linear layers
// (every prompt row and decoded row through the layers, lm_head per generated token) over its
// wall time, what the base model's kernels achieve all overheads included; on the others, the
// adapters' multiply-adds in the run (the ideal count) over the time the run took beyond the
// same repeat's base run (0 where it took none): what the adapters' arithmetic costs at the
// margin. Where that rate is far below the base row's, the overhead is not the arithmetic but how
// it is done.
//
// --churn adds a table: the `one` mode at the first concurrency, quiet and beside a thread that
// loads an adapter into a free slot and unloads it over and over (RunChurn): load times, loads
// per second, and the requests' tok/s and TPOT against the quiet run; their tokens must not
// change.
//
// Sanity (exit status 1 where it fails): every request without an adapter, in every mode and
// run, generates exactly the tokens it does in the first `base` run (others' adapters do not
// touch a base row); every request with an adapter generates the same tokens in every run and
// mode that gives it that adapter (alone or mixed); and different tokens from the base model's
// for the same prompt (the adapter is applied).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/engine_run.h"
#include "bench/generated_model.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/thread_priority.h"
#include "model/lora.h"
#include "nlohmann/json.hpp"
#include "runtime/engine.h"
#include "runtime/model_bundle.h"
#include "tools/modelgen/lora_writer.h"

ABSL_FLAG(std::string, size, "small", "generated model shape (tools/modelgen): tiny or small");
ABSL_FLAG(std::string, model_dir, "",
          "where to generate the model and the adapters (default: a temp dir)");
ABSL_FLAG(std::string, concurrency, "1,4,16",
          "slot counts, comma-separated (each run's requests are all queued at once)");
ABSL_FLAG(std::string, modes, "base,unloaded,one,mixed",
          "modes, comma-separated (base is always run)");
ABSL_FLAG(int32_t, requests, 0, "requests per run (0: 2 x the concurrency)");
ABSL_FLAG(int32_t, prompt_tokens, 128, "prompt tokens per request");
ABSL_FLAG(int32_t, max_new_tokens, 64, "tokens each request generates (ignore_eos)");
ABSL_FLAG(int32_t, rank, 16, "rank (r) of the adapters `one` and `mixed` use");
ABSL_FLAG(int32_t, adapters, 4, "adapters of rank --rank (the `mixed` mode spreads over them)");
ABSL_FLAG(std::string, ranks, "",
          "ranks for the `one` mode, comma-separated (empty: --rank); each other than --rank is "
          "a mode one-rN");
ABSL_FLAG(int32_t, repeats, 3, "runs of every mode per row (their order rotates); medians shown");
ABSL_FLAG(double, max_prefill_stall, 0.5,
          "EngineOptions::max_prefill_stall (kvrmd's default; 0: a prefill chunk takes the step's "
          "whole token budget)");
ABSL_FLAG(int32_t, threads, 2, "CPU backend threads");
ABSL_FLAG(std::string, json, "", "also write the figures as JSON");
ABSL_FLAG(std::string, lora_dtype, "auto",
          "what the backend keeps the adapters' factors in: auto (kvrmd's default: the model's, "
          "bf16 for the generated bf16 models), bfloat16 or float32");
ABSL_FLAG(bool, churn, false,
          "also measure loads while serving: at the first --concurrency, the `one` mode's requests "
          "with and without a thread that loads adapter 0's directory under another name into a "
          "free slot and unloads it, over and over, for the whole run");
ABSL_FLAG(int32_t, churn_interval_ms, 0,
          "with --churn: the pause between one load-and-unload and the next (0: back to back, "
          "the worst case)");

namespace kvrm {
namespace {

// A mode: which adapter each request runs with.
struct Mode {
  std::string name;  // base, one, one-r8, mixed
  enum Kind { kBase, kUnloaded, kOne, kMixed } kind = kBase;
  int32_t rank = 0;     // the adapters' rank (0: base)
  int32_t adapter = 0;  // one: the adapter every request runs with
};

// The adapter request i runs with in `mode` (-1: the base model).
int32_t AdapterOf(const Mode& mode, int32_t i) {
  switch (mode.kind) {
    case Mode::kBase:
    case Mode::kUnloaded:
      return -1;
    case Mode::kOne:
      return mode.adapter;
    case Mode::kMixed: {
      const int32_t k = i % (absl::GetFlag(FLAGS_adapters) + 1);
      return k - 1;
    }
  }
  return -1;
}

std::vector<std::vector<int32_t>> MakePrompts(const ModelBundle& model, int32_t requests,
                                              int32_t concurrency) {
  bench::IdSource ids(model, 1000 * concurrency + 3);
  std::vector<std::vector<int32_t>> out(requests);
  for (std::vector<int32_t>& p : out) {
    for (int32_t k = 0; k < absl::GetFlag(FLAGS_prompt_tokens); ++k) p.push_back(ids.Next());
  }
  return out;
}

// --lora_dtype (checked in Main): unset for auto.
std::optional<DType> LoraDtypeFlag() {
  return ParseLoraDtype(absl::GetFlag(FLAGS_lora_dtype)).value_or(std::nullopt);
}

// What the engines keep the adapters' factors in.
DType FactorDtype(const ModelBundle& model) {
  return LoraDtypeFlag().value_or(DefaultLoraDtype(model));
}

using RunResult = bench::EngineRun;

// While it lives, the model serves no adapters (its lora_adapters set aside, then put back).
class AdaptersAside {
 public:
  AdaptersAside(ModelBundle* model, bool aside) : model_(aside ? model : nullptr) {
    if (model_ != nullptr) std::swap(kept_, model_->lora_adapters);
  }
  ~AdaptersAside() {
    if (model_ != nullptr) std::swap(kept_, model_->lora_adapters);
  }
  AdaptersAside(const AdaptersAside&) = delete;
  AdaptersAside& operator=(const AdaptersAside&) = delete;

 private:
  ModelBundle* const model_;
  std::vector<LoraAdapter> kept_;
};

absl::StatusOr<RunResult> RunOnce(ModelBundle* model, const EngineOptions& options,
                                  const std::vector<std::vector<int32_t>>& prompts,
                                  const Mode& mode, const bench::BesideRun& beside = nullptr) {
  // Outlives the engine: `unloaded` runs on an engine made without the adapters.
  const AdaptersAside aside(model, mode.kind == Mode::kUnloaded);
  const int32_t n = static_cast<int32_t>(prompts.size());
  std::vector<std::unique_ptr<GenerationRequest>> requests;
  for (int32_t i = 0; i < n; ++i) {
    auto r = std::make_unique<GenerationRequest>();
    r->request_id = absl::StrCat("r", i);
    r->prompt = prompts[i];
    r->max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
    r->ignore_eos = true;
    r->sampling.temperature = 0;  // greedy
    r->lora_adapter = AdapterOf(mode, i);
    requests.push_back(std::move(r));
  }
  return bench::RunQueued(*model, options, std::move(requests),
                          absl::GetFlag(FLAGS_max_new_tokens), beside);
}

// ---- the expectation: multiply-adds per token ----------------------------------------------

// The base model's multiply-adds per row in its layers' linear projections (Q, K, V, O, gate, up,
// down in every layer).
double LayerMacsPerRow(const LlamaConfig& c) {
  double per_layer = 0;
  for (int32_t t = 0; t < kNumLoraTargets; ++t) {
    const auto [out, in] = LoraTargetShape(c, LoraTarget(t));
    per_layer += static_cast<double>(out) * in;
  }
  return c.num_hidden_layers * per_layer;
}

// ... and per generated token: its row's, and lm_head's.
double BaseMacsPerToken(const LlamaConfig& c) {
  return LayerMacsPerRow(c) + static_cast<double>(c.hidden_size) * c.vocab_size;
}

// An adapter's multiply-adds per token: rank x (in + out) per adapted projection; `threads` > 1:
// as the CPU backend computes them, A x once per thread (rank x (threads x in + out)).
double LoraMacsPerToken(const LoraAdapter& a, int32_t threads) {
  double macs = 0;
  for (const LoraLayer& l : a.layers) {
    for (const LoraMatrix& m : l.m) {
      macs += static_cast<double>(m.rank) * (static_cast<double>(threads) * m.in + m.out);
    }
  }
  return macs;
}

// The mode's multiply-adds per token over the base model's, averaged over the requests (each
// generates as many tokens as every other): {ideal, as computed}.
std::pair<double, double> FlopRatios(const ModelBundle& model, const Mode& mode, int32_t requests) {
  const double base = BaseMacsPerToken(model.config);
  double ideal = 0, computed = 0;
  for (int32_t i = 0; i < requests; ++i) {
    const int32_t a = AdapterOf(mode, i);
    if (a < 0) continue;
    ideal += LoraMacsPerToken(model.lora_adapters[a], 1);
    computed += LoraMacsPerToken(model.lora_adapters[a], absl::GetFlag(FLAGS_threads));
  }
  return {1 + ideal / (requests * base), 1 + computed / (requests * base)};
}

// A whole run's multiply-adds: {the base model's, the adapters'}. Every request's prompt rows
// and all but its last token pass through the layers (and its adapter); lm_head runs once per
// generated token (a prompt's last row gives the first).
std::pair<double, double> RunMacs(const ModelBundle& model, const Mode& mode, int32_t requests) {
  const double rows = absl::GetFlag(FLAGS_prompt_tokens) + absl::GetFlag(FLAGS_max_new_tokens) - 1;
  const double tokens = absl::GetFlag(FLAGS_max_new_tokens);
  const LlamaConfig& c = model.config;
  const double base =
      requests * (rows * LayerMacsPerRow(c) + tokens * (BaseMacsPerToken(c) - LayerMacsPerRow(c)));
  double lora = 0;
  for (int32_t i = 0; i < requests; ++i) {
    const int32_t a = AdapterOf(mode, i);
    if (a >= 0) lora += rows * LoraMacsPerToken(model.lora_adapters[a], 1);
  }
  return {base, lora};
}

// ---- a row: every mode at one concurrency ---------------------------------------------------

// One mode's figures over the repeats: each the median of its runs.

// The outputs' checks over a row's runs (see the file comment).
struct OutputCheck {
  // (adapter, request) -> the tokens its first run generated; adapter -1 is the base model.
  std::map<std::pair<int32_t, int32_t>, std::vector<int32_t>> first;
  bool base_identical = true;     // every base request as in the first base run
  bool adapter_identical = true;  // every adapted request as its first run with that adapter
  std::set<std::pair<int32_t, int32_t>> adapted, same_as_base;

  void Add(const Mode& mode, const RunResult& run) {
    for (int32_t i = 0; i < static_cast<int32_t>(run.outputs.size()); ++i) {
      const int32_t a = AdapterOf(mode, i);
      auto [it, inserted] = first.emplace(std::make_pair(a, i), run.outputs[i]);
      if (!inserted && it->second != run.outputs[i]) {
        (a < 0 ? base_identical : adapter_identical) = false;
      }
      if (a >= 0) adapted.insert({a, i});
    }
  }
  // After every run: the adapted requests whose tokens are the base model's.
  void Finish() {
    for (const auto& key : adapted) {
      auto base = first.find({-1, key.second});
      if (base != first.end() && base->second == first[key]) same_as_base.insert(key);
    }
  }
  bool ok() const { return base_identical && adapter_identical && same_as_base.empty(); }
};

// Requests per run at `concurrency` slots (--requests, or 2 x the slots).
int32_t RequestsAt(int32_t concurrency) {
  return absl::GetFlag(FLAGS_requests) > 0 ? absl::GetFlag(FLAGS_requests) : 2 * concurrency;
}

// A timed run's engine: `concurrency` slots, every request queued at once, the flags' settings.
EngineOptions RunOptions(const ModelBundle& model, int32_t concurrency, int32_t requests) {
  EngineOptions o;
  o.slots = concurrency;
  const int32_t need = absl::GetFlag(FLAGS_prompt_tokens) + absl::GetFlag(FLAGS_max_new_tokens);
  o.max_context = std::min((need + 16) / 16 * 16, model.config.max_position_embeddings);
  o.max_queue = requests + 1;
  o.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  o.max_prefill_stall = absl::GetFlag(FLAGS_max_prefill_stall);
  o.threads = absl::GetFlag(FLAGS_threads);
  o.lora_dtype = LoraDtypeFlag();
  return o;
}

absl::StatusOr<nlohmann::json> RunRow(ModelBundle* mutable_model, const std::vector<Mode>& modes,
                                      int32_t concurrency) {
  const ModelBundle& model = *mutable_model;
  const int32_t requests = RequestsAt(concurrency);
  const std::vector<std::vector<int32_t>> prompts = MakePrompts(model, requests, concurrency);
  const EngineOptions o = RunOptions(model, concurrency, requests);
  const size_t nm = modes.size();  // modes[0] is base
  std::vector<std::vector<RunResult>> runs(nm);
  std::vector<std::vector<double>> tps_ratio(nm), tpot_ratio(nm), ttft_ratio(nm), gmacs(nm);
  OutputCheck check;
  for (int32_t rep = 0; rep < absl::GetFlag(FLAGS_repeats); ++rep) {
    // The first base run comes first: it is what the other runs' outputs are checked against.
    for (size_t k = 0; k < nm; ++k) {
      const size_t m = (k + static_cast<size_t>(rep)) % nm;
      ASSIGN_OR_RETURN(RunResult r, RunOnce(mutable_model, o, prompts, modes[m]));
      check.Add(modes[m], r);
      r.outputs.clear();
      runs[m].push_back(std::move(r));
    }
    const RunResult& base = runs[0].back();
    for (size_t m = 0; m < nm; ++m) {
      const RunResult& r = runs[m].back();
      // Without adapted requests, the run's multiply-adds over its time; else the adapters' over
      // the time the run took beyond the base run's.
      const auto [base_macs, lora_macs] = RunMacs(model, modes[m], requests);
      const double extra_s = r.wall_s - base.wall_s;
      gmacs[m].push_back(lora_macs == 0 ? 1e-9 * base_macs / r.wall_s
                         : extra_s > 0  ? 1e-9 * lora_macs / extra_s
                                        : 0);
      if (m == 0) continue;
      tps_ratio[m].push_back(base.tokens_per_s > 0 ? r.tokens_per_s / base.tokens_per_s : 0);
      tpot_ratio[m].push_back(base.tpot_ms > 0 ? r.tpot_ms / base.tpot_ms : 0);
      ttft_ratio[m].push_back(base.ttft_s > 0 ? r.ttft_s / base.ttft_s : 0);
    }
  }
  check.Finish();
  nlohmann::json row{{"concurrency", concurrency},
                     {"requests", requests},
                     {"base_identical", check.base_identical},
                     {"adapter_identical", check.adapter_identical},
                     {"adapted_requests", check.adapted.size()},
                     {"adapted_same_as_base", check.same_as_base.size()},
                     {"ok", check.ok()}};
  nlohmann::json jm = nlohmann::json::array();
  for (size_t m = 0; m < nm; ++m) {
    nlohmann::json j = bench::RunsJson(runs[m]);
    j["mode"] = modes[m].name;
    j["rank"] = modes[m].rank;
    int32_t adapted = 0;
    std::set<int32_t> distinct;
    for (int32_t i = 0; i < requests; ++i) {
      const int32_t a = AdapterOf(modes[m], i);
      adapted += a >= 0;
      if (a >= 0) distinct.insert(a);
    }
    j["adapted_requests"] = adapted;
    j["adapters"] = distinct.size();
    const auto [ideal, computed] = FlopRatios(model, modes[m], requests);
    j["flops_vs_base"] = ideal;
    j["flops_vs_base_as_computed"] = computed;
    const auto [base_macs, lora_macs] = RunMacs(model, modes[m], requests);
    j["run_macs_base"] = base_macs;
    j["run_macs_lora"] = lora_macs;
    j["run_macs_vs_base"] = 1 + lora_macs / base_macs;
    j["gmacs_per_s"] = bench::Median(gmacs[m]);
    j["gmacs_per_s_runs"] = gmacs[m];
    j["tokens_per_s_vs_base"] = m == 0 ? 1.0 : bench::Median(tps_ratio[m]);
    j["tpot_vs_base"] = m == 0 ? 1.0 : bench::Median(tpot_ratio[m]);
    j["ttft_vs_base"] = m == 0 ? 1.0 : bench::Median(ttft_ratio[m]);
    if (m > 0) {
      j["tokens_per_s_vs_base_runs"] = tps_ratio[m];
      j["tpot_vs_base_runs"] = tpot_ratio[m];
      j["ttft_vs_base_runs"] = ttft_ratio[m];
    }
    jm.push_back(std::move(j));
  }
  row["modes"] = jm;
  return row;
}

void PrintRow(const nlohmann::json& r) {
  auto f = [](const nlohmann::json& j, const char* key) { return j[key].get<double>(); };
  double others = 0;
  for (const nlohmann::json& m : r["modes"]) others = std::max(others, f(m, "others_cores_max"));
  const bool base_ok = r["base_identical"].get<bool>();
  const bool adapter_ok = r["adapter_identical"].get<bool>();
  const std::string identical = base_ok && adapter_ok ? "yes"
                                : base_ok             ? "NO (adapted)"
                                                      : "NO (base)";
  const int adapted = r["adapted_requests"].get<int>();
  const std::string differ =
      absl::StrCat(adapted - r["adapted_same_as_base"].get<int>(), "/", adapted);
  for (const nlohmann::json& m : r["modes"]) {
    const bool base = m["mode"] == "base";
    // The base row's figures; the ratios and the adapters' rate only on the others.
    auto ratio = [&](const char* key) {
      return base ? std::string("-") : absl::StrFormat("%.3fx", f(m, key));
    };
    const std::string rank =
        m["adapted_requests"].get<int>() == 0 ? "-" : absl::StrCat(m["rank"].get<int>());
    std::printf(
        "%s",
        absl::StrFormat(
            "| %d | %d | %s | %s | %d/%d | %.0f | %s | %.2f | %s | %.2f | %s | %.0f | "
            "%.3fx | %.3fx | %.1f | %s | %s | %.2f |\n",
            r["concurrency"].get<int>(), r["requests"].get<int>(), m["mode"].get<std::string>(),
            rank, m["adapted_requests"].get<int>(), r["requests"].get<int>(), f(m, "tokens_per_s"),
            ratio("tokens_per_s_vs_base"), f(m, "tpot_ms"), ratio("tpot_vs_base"), f(m, "ttft_s"),
            ratio("ttft_vs_base"), f(m, "steps"), f(m, "flops_vs_base"),
            f(m, "flops_vs_base_as_computed"), f(m, "gmacs_per_s"), identical, differ, others)
            .c_str());
  }
  std::fflush(stdout);
}

// The flags' values that the engine would refuse later, or a run could not use; false after
// naming them.
bool CheckFlags(const std::vector<std::string>& modes, const std::vector<int32_t>& ranks) {
  for (const std::string& m : modes) {
    if (m != "base" && m != "unloaded" && m != "one" && m != "mixed") {
      std::fprintf(stderr, "--modes: '%s' (base, unloaded, one, mixed)\n", m.c_str());
      return false;
    }
  }
  if (absl::GetFlag(FLAGS_repeats) < 1 || absl::GetFlag(FLAGS_prompt_tokens) < 1 ||
      absl::GetFlag(FLAGS_max_new_tokens) < 2 || absl::GetFlag(FLAGS_adapters) < 1 ||
      absl::GetFlag(FLAGS_rank) < 1) {
    std::fprintf(stderr,
                 "need --repeats >= 1, --prompt_tokens >= 1, --max_new_tokens >= 2, "
                 "--adapters >= 1 and --rank >= 1\n");
    return false;
  }
  std::vector<int32_t> all = ranks;
  all.push_back(absl::GetFlag(FLAGS_rank));
  for (int32_t r : all) {
    if (r > kMaxLoraRank) {
      std::fprintf(stderr, "rank %d is over the served maximum %d\n", r, kMaxLoraRank);
      return false;
    }
  }
  return true;
}

// ---- the adapters
// --------------------------------------------------------------------------------

// Writes and loads an adapter of `rank` (every projection, every layer; alpha 2 x rank) into the
// model's lora_adapters; its index.
absl::StatusOr<int32_t> AddAdapter(ModelBundle* model, const std::string& root, int32_t rank,
                                   uint64_t seed) {
  modelgen::MakeLoraOptions o;
  o.out_dir = absl::StrCat(root, "/lora-", absl::GetFlag(FLAGS_size), "/r", rank, "-s", seed);
  o.rank = rank;
  o.alpha = 2.0 * rank;
  o.seed = seed;
  o.base_model = absl::StrCat("kvrm-generated-", absl::GetFlag(FLAGS_size));
  RETURN_IF_ERROR(modelgen::MakeLoraAdapter(model->config, o));
  ASSIGN_OR_RETURN(LoraAdapter adapter,
                   LoadLoraAdapter(model->config, absl::StrCat("r", rank, "-s", seed), o.out_dir));
  model->lora_adapters.push_back(std::move(adapter));
  return static_cast<int32_t>(model->lora_adapters.size()) - 1;
}

// The adapters, then the modes: base first, then --modes' others in their order (one expanded
// over --ranks).
absl::StatusOr<std::vector<Mode>> Prepare(ModelBundle* model, const std::string& root,
                                          const std::vector<std::string>& names,
                                          const std::vector<int32_t>& ranks) {
  const int32_t rank = absl::GetFlag(FLAGS_rank);
  for (int32_t k = 0; k < absl::GetFlag(FLAGS_adapters); ++k) {
    ASSIGN_OR_RETURN(const int32_t index, AddAdapter(model, root, rank, 101 + k));
    CHECK(index == k);
  }
  std::vector<Mode> modes = {{"base", Mode::kBase, 0, -1}};
  for (const std::string& name : names) {
    if (name == "unloaded") {
      modes.push_back({"unloaded", Mode::kUnloaded, 0, -1});
    } else if (name == "one") {
      for (int32_t r : ranks) {
        if (r == rank) {
          modes.push_back({"one", Mode::kOne, rank, 0});
        } else {
          ASSIGN_OR_RETURN(const int32_t index, AddAdapter(model, root, r, 101));
          modes.push_back({absl::StrCat("one-r", r), Mode::kOne, r, index});
        }
      }
    } else if (name == "mixed") {
      modes.push_back({"mixed", Mode::kMixed, rank, 0});
    }
  }
  return modes;
}

// ---- loads while serving ---------------------------------------------------------------------

// The `one` mode's requests at `concurrency`, alternately quiet and beside a thread that loads
// adapter 0's directory (read from disk, as LoadLoraAdapter does) into a free slot and unloads
// it, over and over (--churn_interval_ms apart; 0: back to back, the worst a stream of loads
// does to the requests running: on 2 cores a load takes a core from the engine while it reads
// and cuts the adapter). Both runs' engines have the extra slot. Outputs must be identical.
absl::StatusOr<nlohmann::json> RunChurn(ModelBundle* model, int32_t concurrency) {
  const int32_t requests = RequestsAt(concurrency);
  const std::vector<std::vector<int32_t>> prompts = MakePrompts(*model, requests, concurrency);
  EngineOptions o = RunOptions(*model, concurrency, requests);
  o.max_loras = static_cast<int32_t>(model->lora_adapters.size()) + 1;
  const Mode one{"one", Mode::kOne, absl::GetFlag(FLAGS_rank), 0};
  const std::string dir = model->lora_adapters[0].path;
  std::vector<RunResult> quiet, churned;
  std::vector<double> load_ms, read_ms, tps_ratio, tpot_ratio;
  std::vector<int32_t> loads_per_run;
  bool identical = true;
  absl::Status churn_error;
  std::mutex mu;  // churn_error
  for (int32_t rep = 0; rep < absl::GetFlag(FLAGS_repeats); ++rep) {
    RunResult runs[2];
    for (int k = 0; k < 2; ++k) {
      const bool churn = (k + rep) % 2 == 1;  // the order alternates across repeats
      int32_t loads = 0;
      bench::BesideRun beside = [&](Engine* engine, const std::atomic<bool>* done) {
        // As kvrmd's adapter thread (server/kvrm_service.cc), at the lowest priority.
        LowerThisThreadsPriority();
        while (!done->load()) {
          const auto t0 = std::chrono::steady_clock::now();
          absl::StatusOr<LoraAdapter> adapter = LoadLoraAdapter(model->config, "churn", dir);
          const auto read = std::chrono::steady_clock::now();
          absl::StatusOr<ServedLoraAdapter> served =
              adapter.ok() ? engine->LoadLoraAdapter(*std::move(adapter))
                           : absl::StatusOr<ServedLoraAdapter>(adapter.status());
          const auto t1 = std::chrono::steady_clock::now();
          absl::Status unloaded =
              served.ok() ? engine->UnloadLoraAdapter("churn").status() : served.status();
          if (!unloaded.ok()) {
            std::lock_guard<std::mutex> lock(mu);
            churn_error = unloaded;
            return;
          }
          ++loads;
          load_ms.push_back(1e3 * std::chrono::duration<double>(t1 - t0).count());
          read_ms.push_back(1e3 * std::chrono::duration<double>(read - t0).count());
          const auto pause = std::chrono::milliseconds(absl::GetFlag(FLAGS_churn_interval_ms));
          for (auto until = std::chrono::steady_clock::now() + pause;
               !done->load() && std::chrono::steady_clock::now() < until;) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
        }
      };
      ASSIGN_OR_RETURN(runs[churn ? 1 : 0],
                       RunOnce(model, o, prompts, one, churn ? beside : nullptr));
      if (churn) loads_per_run.push_back(loads);
    }
    RETURN_IF_ERROR(churn_error);
    identical = identical && runs[0].outputs == runs[1].outputs;
    tps_ratio.push_back(runs[0].tokens_per_s > 0 ? runs[1].tokens_per_s / runs[0].tokens_per_s
                                                 : 0);
    tpot_ratio.push_back(runs[0].tpot_ms > 0 ? runs[1].tpot_ms / runs[0].tpot_ms : 0);
    for (int k = 0; k < 2; ++k) runs[k].outputs.clear();
    quiet.push_back(std::move(runs[0]));
    churned.push_back(std::move(runs[1]));
  }
  std::vector<double> loads_per_s;
  for (size_t i = 0; i < churned.size(); ++i) {
    loads_per_s.push_back(churned[i].wall_s > 0 ? loads_per_run[i] / churned[i].wall_s : 0);
  }
  return nlohmann::json{
      {"concurrency", concurrency},
      {"requests", requests},
      {"adapter_rank", model->lora_adapters[0].rank},
      {"interval_ms", absl::GetFlag(FLAGS_churn_interval_ms)},
      {"loads_per_run", loads_per_run},
      {"loads_per_s", bench::Median(loads_per_s)},
      {"load_ms_median", bench::Median(load_ms)},
      {"load_ms_max", load_ms.empty() ? 0 : *std::max_element(load_ms.begin(), load_ms.end())},
      {"read_ms_median", bench::Median(read_ms)},
      {"tokens_per_s_vs_quiet", bench::Median(tps_ratio)},
      {"tpot_vs_quiet", bench::Median(tpot_ratio)},
      {"outputs_identical", identical},
      {"quiet", bench::RunsJson(quiet)},
      {"churn", bench::RunsJson(churned)}};
}

void PrintChurn(const nlohmann::json& c) {
  std::printf(
      "\n## Loads while serving (`one` at concurrency %d, an adapter of rank %d loaded and "
      "unloaded beside the run, %d ms apart)\n\n",
      c["concurrency"].get<int>(), c["adapter_rank"].get<int>(),
      c["interval_ms"].get<int>());
  std::printf(
      "| loads / s | load ms (median) | of which reading (median) | load ms (max) | tok/s vs quiet | "
      "TPOT vs quiet | outputs identical | busy elsewhere |\n"
      "|---:|---:|---:|---:|---:|---:|---|---:|\n");
  std::printf("| %.1f | %.1f | %.1f | %.1f | %.3f | %.3f | %s | %.2f |\n",
              c["loads_per_s"].get<double>(), c["load_ms_median"].get<double>(),
              c["read_ms_median"].get<double>(), c["load_ms_max"].get<double>(),
              c["tokens_per_s_vs_quiet"].get<double>(), c["tpot_vs_quiet"].get<double>(),
              c["outputs_identical"].get<bool>() ? "yes" : "NO",
              std::max(c["quiet"]["others_cores_max"].get<double>(),
                       c["churn"]["others_cores_max"].get<double>()));
}

// Two untimed requests (the base model's and adapter 0's): the first run in the process would
// otherwise also fault in the memory-mapped weights.
absl::Status WarmUp(ModelBundle* model) {
  EngineOptions o;
  o.slots = 1;
  o.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  o.threads = absl::GetFlag(FLAGS_threads);
  o.lora_dtype = LoraDtypeFlag();
  o.max_context =
      std::min(absl::GetFlag(FLAGS_prompt_tokens) + absl::GetFlag(FLAGS_max_new_tokens) + 16,
               model->config.max_position_embeddings);
  const Mode mixed{"mixed", Mode::kMixed, 0, 0};  // request 0 base, request 1 adapter 0
  return RunOnce(model, o, MakePrompts(*model, 2, 1), mixed).status();
}

// The machine, the configuration and the adapters: the JSON's top-level fields, and the table's
// heading.
nlohmann::json Config(const ModelBundle& model) {
  nlohmann::json adapters = nlohmann::json::array();
  const double base = BaseMacsPerToken(model.config);
  const double factor_bytes = FactorDtype(model) == DType::kF32 ? 4 : 2;
  for (const LoraAdapter& a : model.lora_adapters) {
    const double macs = LoraMacsPerToken(a, 1);
    adapters.push_back(
        {{"name", a.name},
         {"rank", a.rank},
         {"alpha", a.alpha},
         {"target_modules", a.target_modules},
         {"parameters", a.num_parameters},
         {"macs_per_token", macs},
         {"macs_per_token_as_computed", LoraMacsPerToken(a, absl::GetFlag(FLAGS_threads))},
         {"flops_vs_base", macs / base},
         // A and B as the CPU backend keeps them (--lora_dtype), against the base model's
         // linear weights in bf16.
         {"factor_bytes", factor_bytes * macs},
         {"factor_bytes_vs_base_bf16", (factor_bytes * macs) / (2 * base)}});
  }
  nlohmann::json out =
      bench::MachineJson(model, absl::GetFlag(FLAGS_size), absl::GetFlag(FLAGS_threads));
  out.update(nlohmann::json{{"prompt_tokens", absl::GetFlag(FLAGS_prompt_tokens)},
                            {"max_new_tokens", absl::GetFlag(FLAGS_max_new_tokens)},
                            {"rank", absl::GetFlag(FLAGS_rank)},
                            {"num_adapters", absl::GetFlag(FLAGS_adapters)},
                            {"repeats", absl::GetFlag(FLAGS_repeats)},
                            {"max_prefill_stall", absl::GetFlag(FLAGS_max_prefill_stall)},
                            {"lora_dtype", DTypeName(FactorDtype(model))},
                            {"base_macs_per_token", base},
                            {"adapters", adapters}});
  return out;
}

void PrintHeading(const nlohmann::json& c) {
  std::printf(
      "LoRA serving cost: %s model (vocab %d), CPU backend, %d threads, %s (%u cores), %s\n",
      c["model"].get<std::string>().c_str(), c["vocab"].get<int>(), c["threads"].get<int>(),
      c["cpu"].get<std::string>().c_str(), c["cores"].get<unsigned>(),
      c["date"].get<std::string>().c_str());
  std::printf(
      "prompts %d tokens, %d new tokens each, greedy, %d adapters of rank %d (all 7 "
      "projections, %s factors), %zu served, max_prefill_stall %.2f, medians of %d runs per "
      "mode\n\n",
      c["prompt_tokens"].get<int>(), c["max_new_tokens"].get<int>(), c["num_adapters"].get<int>(),
      c["rank"].get<int>(), c["lora_dtype"].get<std::string>().c_str(), c["adapters"].size(),
      c["max_prefill_stall"].get<double>(), c["repeats"].get<int>());
  std::printf(
      "| C | requests | mode | rank | adapted | tok/s | tok/s vs base | TPOT ms | TPOT vs base | "
      "TTFT s | TTFT vs base | steps | FLOPs vs base | as computed | GMAC/s | identical | "
      "adapted differ | busy elsewhere |\n");
  std::printf(
      "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|"
      "\n");
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (const absl::Status st = ParseLoraDtype(absl::GetFlag(FLAGS_lora_dtype)).status(); !st.ok()) {
    std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
    return 1;
  }
  std::vector<int32_t> concurrency, ranks;
  if (!bench::ParseCounts("concurrency", absl::GetFlag(FLAGS_concurrency), &concurrency)) return 1;
  const std::string rank_list = absl::GetFlag(FLAGS_ranks).empty()
                                    ? std::to_string(absl::GetFlag(FLAGS_rank))
                                    : absl::GetFlag(FLAGS_ranks);
  if (!bench::ParseCounts("ranks", rank_list, &ranks)) return 1;
  const std::vector<std::string> names = absl::StrSplit(absl::GetFlag(FLAGS_modes), ',');
  if (!CheckFlags(names, ranks)) return 1;
  const std::string root =
      absl::GetFlag(FLAGS_model_dir).empty()
          ? (std::filesystem::temp_directory_path() / "kvrm-lora-bench").string()
          : absl::GetFlag(FLAGS_model_dir);
  auto model = bench::LoadGeneratedModel(root, absl::GetFlag(FLAGS_size), "kvrm-lora-bench");
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<std::vector<Mode>> modes = Prepare(model->get(), root, names, ranks);
  if (!modes.ok()) {
    std::fprintf(stderr, "adapters: %s\n", modes.status().ToString().c_str());
    return 1;
  }
  if (const absl::Status warm = WarmUp(model->get()); !warm.ok()) {
    std::fprintf(stderr, "warm-up: %s\n", warm.ToString().c_str());
    return 1;
  }
  nlohmann::json out = Config(**model);
  PrintHeading(out);
  nlohmann::json rows = nlohmann::json::array();
  bool all_ok = true;
  for (int32_t c : concurrency) {
    absl::StatusOr<nlohmann::json> row = RunRow(model->get(), *modes, c);
    if (!row.ok()) {
      std::fprintf(stderr, "concurrency %d: %s\n", c, row.status().ToString().c_str());
      return 1;
    }
    PrintRow(*row);
    all_ok = all_ok && (*row)["ok"].get<bool>();
    rows.push_back(*std::move(row));
  }
  if (absl::GetFlag(FLAGS_churn)) {
    absl::StatusOr<nlohmann::json> churn = RunChurn(model->get(), concurrency.front());
    if (!churn.ok()) {
      std::fprintf(stderr, "churn: %s\n", churn.status().ToString().c_str());
      return 1;
    }
    PrintChurn(*churn);
    all_ok = all_ok && (*churn)["outputs_identical"].get<bool>();
    out["churn"] = *std::move(churn);
  }
  out["all_ok"] = all_ok;
  out["rows"] = rows;
  if (const std::string path = absl::GetFlag(FLAGS_json); !path.empty()) {
    std::ofstream(path) << out.dump(2) << "\n";
  }
  if (!all_ok) {
    std::fprintf(stderr,
                 "outputs failed the checks (identical: base requests' tokens across modes and "
                 "runs, adapted requests' across runs; adapted differ: from the base model's)\n");
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace kvrm

int main(int argc, char** argv) { return kvrm::Main(argc, argv); }
