// The prefix cache matched to the token (EngineOptions::prefix_cache_partial_blocks, kvrmd
// --prefix_cache_partial_blocks) against whole blocks only (vLLM's granularity), side by side in
// one process on the CPU backend.
//
//   bazel build //bench:prefix_match_bench
//   bazel-bin/bench/prefix_match_bench --json=/tmp/prefix-match.json
//
// For each KV block size (--block_tokens) an engine serves --requests conversations' first turns
// (random prompts of --min_prompt..--max_prompt tokens, each generating --tokens tokens, greedy,
// ignore_eos), then, timed, a burst queued at once of what users send next: each first prompt
// again (a retry, a regenerated answer) and each conversation's next turn (its prompt, the
// answer, --turn_tokens new tokens). Twice per repeat, on a fresh engine each: matching to the
// token and whole blocks only, their order alternating across --repeats (the machine is shared
// and noisy). The table shows the burst's prompt tokens prefilled (those the cache did not hold),
// the share served from the cache, medians of the mean time to first token and of the tokens per
// second over the burst with the pairs' ratios, and whether both modes generated the same tokens.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "bench/engine_run.h"
#include "bench/generated_model.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "runtime/engine.h"
#include "runtime/model_bundle.h"

ABSL_FLAG(std::string, size, "small", "generated model shape (tools/modelgen): tiny or small");
ABSL_FLAG(std::string, model_dir, "", "where to generate the model (default: a temp dir)");
ABSL_FLAG(std::string, block_tokens, "16,64", "KV block sizes, comma-separated");
ABSL_FLAG(int32_t, requests, 16, "conversations");
ABSL_FLAG(int32_t, min_prompt, 40, "shortest first prompt, tokens");
ABSL_FLAG(int32_t, max_prompt, 400, "longest first prompt, tokens");
ABSL_FLAG(int32_t, tokens, 16, "tokens each request generates");
ABSL_FLAG(int32_t, turn_tokens, 24, "new tokens a next turn adds after the answer");
ABSL_FLAG(int32_t, slots, 8, "engine slots");
ABSL_FLAG(int32_t, prefill_chunk, 256, "prompt tokens a step prefills");
ABSL_FLAG(int32_t, repeats, 3, "pairs of runs per row (their order alternates); medians shown");
ABSL_FLAG(int32_t, threads, 2, "CPU backend threads");
ABSL_FLAG(std::string, json, "", "also write the figures as JSON");

namespace kvrm {
namespace {

std::vector<std::unique_ptr<GenerationRequest>> Requests(
    const std::vector<std::vector<int32_t>>& prompts, int32_t tokens, const std::string& tag) {
  std::vector<std::unique_ptr<GenerationRequest>> out;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto r = std::make_unique<GenerationRequest>();
    r->request_id = absl::StrCat(tag, i);
    r->prompt = prompts[i];
    r->max_new_tokens = tokens;
    r->ignore_eos = true;
    out.push_back(std::move(r));
  }
  return out;
}

// One mode's run: the burst's figures, and the prefix cache's counts over the burst alone.
struct BurstRun : bench::EngineRun {
  uint64_t prompt_tokens = 0, cached = 0, copied = 0;
  std::vector<std::vector<int32_t>> first_outputs;
};

absl::StatusOr<BurstRun> RunMode(const ModelBundle& model, int32_t block_tokens, bool partial,
                                 const std::vector<std::vector<int32_t>>& first,
                                 const std::vector<std::vector<int32_t>>& turn_tokens) {
  EngineOptions o;
  o.slots = absl::GetFlag(FLAGS_slots);
  o.threads = absl::GetFlag(FLAGS_threads);
  o.prefill_chunk = absl::GetFlag(FLAGS_prefill_chunk);
  o.block_tokens = block_tokens;
  o.prefix_cache_partial_blocks = partial;
  const int32_t tokens = absl::GetFlag(FLAGS_tokens);
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(&model, o));
  ASSIGN_OR_RETURN(bench::EngineRun turn1,
                   bench::RunQueuedOn(engine.get(), Requests(first, tokens, "t1-"), tokens,
                                      /*start=*/true));
  std::vector<std::vector<int32_t>> burst = first;  // the retries
  for (size_t i = 0; i < first.size(); ++i) {       // the next turns
    std::vector<int32_t> next = first[i];
    next.insert(next.end(), turn1.outputs[i].begin(), turn1.outputs[i].end());
    next.insert(next.end(), turn_tokens[i].begin(), turn_tokens[i].end());
    burst.push_back(std::move(next));
  }
  BurstRun r;
  for (const std::vector<int32_t>& p : burst) r.prompt_tokens += p.size();
  const EngineStats before = engine->Stats();
  ASSIGN_OR_RETURN(static_cast<bench::EngineRun&>(r),
                   bench::RunQueuedOn(engine.get(), Requests(burst, tokens, "b-"), tokens,
                                      /*start=*/false));
  r.cached = r.stats.prefix_cache_hits_total - before.prefix_cache_hits_total;
  r.copied = r.stats.prefix_cache_copied_tokens_total - before.prefix_cache_copied_tokens_total;
  r.first_outputs = std::move(turn1.outputs);
  return r;
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::vector<int32_t> block_sizes;
  if (!bench::ParseCounts("--block_tokens", absl::GetFlag(FLAGS_block_tokens), &block_sizes)) {
    return 2;
  }
  const int32_t min_prompt = absl::GetFlag(FLAGS_min_prompt);
  const int32_t max_prompt = absl::GetFlag(FLAGS_max_prompt);
  if (min_prompt < 1 || max_prompt < min_prompt) {
    std::fprintf(stderr, "prefix_match_bench: need 1 <= --min_prompt <= --max_prompt\n");
    return 2;
  }
  const std::string size = absl::GetFlag(FLAGS_size);
  absl::StatusOr<std::unique_ptr<ModelBundle>> model =
      bench::LoadGeneratedModel(absl::GetFlag(FLAGS_model_dir), size, "kvrm-prefix-match-bench");
  if (!model.ok()) {
    std::fprintf(stderr, "prefix_match_bench: %s\n", model.status().ToString().c_str());
    return 1;
  }
  const LlamaConfig& config = (*model)->config;
  const int32_t threads = absl::GetFlag(FLAGS_threads);
  const int32_t requests = absl::GetFlag(FLAGS_requests);
  const int32_t tokens = absl::GetFlag(FLAGS_tokens);
  const int32_t repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  std::printf(
      "prefix cache to the token against whole blocks: model %s (hidden %d, %d layers, vocab "
      "%d), %d conversations (first prompts %d-%d tokens), bursts of %d retries and %d next "
      "turns, %d tokens each, %d slots, chunk %d, %d threads, %s\n",
      size.c_str(), config.hidden_size, config.num_hidden_layers, config.vocab_size, requests,
      min_prompt, max_prompt, requests, requests, tokens, absl::GetFlag(FLAGS_slots),
      absl::GetFlag(FLAGS_prefill_chunk), threads, bench::CpuModelName().c_str());
  std::printf("%5s | %8s %8s %8s %6s | %6s %6s | %9s %9s %7s | %9s %9s %7s | %5s %5s\n", "block",
              "prompt", "pf whole", "pf token", "w/t", "hit w", "hit t", "TTFT w", "TTFT t", "w/t",
              "tok/s w", "tok/s t", "t/w", "same", "busy");

  bench::IdSource ids(**model, 41);
  std::vector<std::vector<int32_t>> first(requests), turn(requests);
  for (int32_t i = 0; i < requests; ++i) {
    const int32_t n = min_prompt + static_cast<int32_t>(ids.Below(max_prompt - min_prompt + 1));
    for (int32_t k = 0; k < n; ++k) first[i].push_back(ids.Next());
    for (int32_t k = 0; k < absl::GetFlag(FLAGS_turn_tokens); ++k) turn[i].push_back(ids.Next());
  }

  nlohmann::json out = bench::MachineJson(**model, size, threads);
  out["requests"] = requests;
  out["min_prompt"] = min_prompt;
  out["max_prompt"] = max_prompt;
  out["tokens"] = tokens;
  out["turn_tokens"] = absl::GetFlag(FLAGS_turn_tokens);
  out["slots"] = absl::GetFlag(FLAGS_slots);
  out["prefill_chunk"] = absl::GetFlag(FLAGS_prefill_chunk);
  out["repeats"] = repeats;
  out["rows"] = nlohmann::json::array();
  bool all_same = true;
  for (int32_t bt : block_sizes) {
    std::vector<BurstRun> runs[2];  // [0] whole blocks, [1] to the token
    std::vector<double> ttft_ratios, rate_ratios;
    double others = 0;
    bool same = true;
    for (int32_t rep = 0; rep < repeats; ++rep) {
      for (int32_t k = 0; k < 2; ++k) {
        const int32_t mode = (k + rep) % 2;  // the order alternates
        absl::StatusOr<BurstRun> run = RunMode(**model, bt, mode == 1, first, turn);
        if (!run.ok()) {
          std::fprintf(stderr, "prefix_match_bench: %s\n", run.status().ToString().c_str());
          return 1;
        }
        others = std::max(others, run->others_cores);
        runs[mode].push_back(*std::move(run));
      }
      const BurstRun& whole = runs[0].back();
      const BurstRun& token = runs[1].back();
      ttft_ratios.push_back(whole.ttft_s / token.ttft_s);
      rate_ratios.push_back(token.tokens_per_s / whole.tokens_per_s);
      same &= whole.outputs == token.outputs && whole.first_outputs == token.first_outputs;
    }
    all_same &= same;
    // The cache's counts: medians over a mode's runs (the admissions' order can move them).
    const BurstRun& whole = runs[0].front();
    double cached[2], copied[2], prefilled[2];
    for (int32_t m = 0; m < 2; ++m) {
      std::vector<double> c, cp;
      for (const BurstRun& r : runs[m]) {
        c.push_back(static_cast<double>(r.cached));
        cp.push_back(static_cast<double>(r.copied));
      }
      cached[m] = bench::Median(c);
      copied[m] = bench::Median(cp);
      prefilled[m] = static_cast<double>(whole.prompt_tokens) - cached[m];
    }
    nlohmann::json row;
    row["block_tokens"] = bt;
    row["prompt_tokens"] = whole.prompt_tokens;
    row["whole_blocks"] = bench::RunsJson(runs[0]);
    row["to_the_token"] = bench::RunsJson(runs[1]);
    for (int32_t m = 0; m < 2; ++m) {
      nlohmann::json& j = row[m == 0 ? "whole_blocks" : "to_the_token"];
      j["cached_tokens"] = cached[m];
      j["copied_tokens"] = copied[m];
      j["prefilled_tokens"] = prefilled[m];
    }
    row["ratio_prefilled_whole_over_token"] = prefilled[0] / std::max(1.0, prefilled[1]);
    row["ratio_ttft_whole_over_token"] = bench::Median(ttft_ratios);
    row["ratio_ttft_runs"] = ttft_ratios;
    row["ratio_tokens_per_s_token_over_whole"] = bench::Median(rate_ratios);
    row["ratio_tokens_per_s_runs"] = rate_ratios;
    row["same_tokens"] = same;
    row["others_cores_max"] = others;
    const double p = static_cast<double>(whole.prompt_tokens);
    std::printf(
        "%5d | %8llu %8.0f %8.0f %5.2fx | %5.1f%% %5.1f%% | %7.0fms %7.0fms %6.2fx | %9.1f %9.1f "
        "%6.2fx | %5s %5.2f\n",
        bt, static_cast<unsigned long long>(whole.prompt_tokens), prefilled[0], prefilled[1],
        row["ratio_prefilled_whole_over_token"].get<double>(), 100.0 * cached[0] / p,
        100.0 * cached[1] / p, 1e3 * row["whole_blocks"]["ttft_s"].get<double>(),
        1e3 * row["to_the_token"]["ttft_s"].get<double>(), bench::Median(ttft_ratios),
        row["whole_blocks"]["tokens_per_s"].get<double>(),
        row["to_the_token"]["tokens_per_s"].get<double>(), bench::Median(rate_ratios),
        same ? "yes" : "NO", others);
    out["rows"].push_back(std::move(row));
  }
  out["same_tokens"] = all_same;
  std::printf(
      "prompt: the burst's prompt tokens; pf: those prefilled (not served from the prefix "
      "cache), whole blocks and to the token, and their ratio; hit: the share served from the "
      "cache; "
      "TTFT: mean time to first token over the burst (from its queueing); w/t and t/w: medians "
      "of the pairs' ratios; same: both modes generated the same tokens; busy: the most cores "
      "other processes kept busy during a row's runs\n");
  if (const std::string path = absl::GetFlag(FLAGS_json); !path.empty()) {
    std::ofstream(path) << out.dump(2) << "\n";
  }
  return all_same ? 0 : 1;
}

}  // namespace
}  // namespace kvrm

int main(int argc, char** argv) { return kvrm::Main(argc, argv); }
