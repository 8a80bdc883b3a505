// Several prompts prefilled in one engine step (EngineOptions::max_prefills_per_step, kvrmd
// --max_prefills_per_step) against one prompt a step, side by side in one process on the CPU
// backend.
//
//   bazel build //bench:prefill_packing_bench
//   bazel-bin/bench/prefill_packing_bench --json=/tmp/packing.json
//
// For each prompt length (--prompt_tokens) a burst of --requests random prompts is queued at
// once on an engine of --slots slots (chunks of --prefill_chunk tokens), each generating
// --tokens tokens (greedy, ignore_eos), twice per repeat: with the step's prefill tokens shared
// by as many prompts as they cover (packed, the default) and with one prompt a step. The two
// alternate their order across --repeats (the machine is shared and noisy); the table shows
// medians of the mean time to first token, of the tokens per second over the burst, of the steps
// that prefilled and of the pairs' ratios, and whether both modes generated the same tokens.
// Prefix caching is off, so each run computes every token.
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
#include "nlohmann/json.hpp"
#include "runtime/engine.h"
#include "runtime/model_bundle.h"

ABSL_FLAG(std::string, size, "small", "generated model shape (tools/modelgen): tiny or small");
ABSL_FLAG(std::string, model_dir, "", "where to generate the model (default: a temp dir)");
ABSL_FLAG(std::string, prompt_tokens, "16,48,128", "prompt lengths, comma-separated");
ABSL_FLAG(int32_t, requests, 16, "prompts per burst");
ABSL_FLAG(int32_t, tokens, 16, "tokens each request generates");
ABSL_FLAG(int32_t, slots, 8, "engine slots");
ABSL_FLAG(int32_t, prefill_chunk, 256, "prompt tokens a step prefills");
ABSL_FLAG(int32_t, repeats, 3, "pairs of runs per row (their order alternates); medians shown");
ABSL_FLAG(int32_t, threads, 2, "CPU backend threads");
ABSL_FLAG(std::string, json, "", "also write the figures as JSON");

namespace kvrm {
namespace {

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::vector<int32_t> lengths;
  if (!bench::ParseCounts("--prompt_tokens", absl::GetFlag(FLAGS_prompt_tokens), &lengths)) {
    return 2;
  }
  const std::string size = absl::GetFlag(FLAGS_size);
  absl::StatusOr<std::unique_ptr<ModelBundle>> model =
      bench::LoadGeneratedModel(absl::GetFlag(FLAGS_model_dir), size, "kvrm-packing-bench");
  if (!model.ok()) {
    std::fprintf(stderr, "prefill_packing_bench: %s\n", model.status().ToString().c_str());
    return 1;
  }
  const LlamaConfig& config = (*model)->config;
  const int32_t threads = absl::GetFlag(FLAGS_threads);
  const int32_t requests = absl::GetFlag(FLAGS_requests);
  const int32_t tokens = absl::GetFlag(FLAGS_tokens);
  const int32_t repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  std::printf(
      "several prompts a step against one: model %s (hidden %d, %d layers, vocab %d), "
      "bursts of %d prompts, %d tokens each, %d slots, chunk %d, %d threads, %s\n",
      size.c_str(), config.hidden_size, config.num_hidden_layers, config.vocab_size, requests,
      tokens, absl::GetFlag(FLAGS_slots), absl::GetFlag(FLAGS_prefill_chunk), threads,
      bench::CpuModelName().c_str());
  std::printf("%7s | %10s %10s %7s | %9s %9s %7s | %13s %7s | %5s %5s\n", "prompt", "TTFT pack",
              "TTFT one", "one/pk", "tok/s pk", "tok/s one", "pk/one", "prefill steps", "prompts",
              "same", "busy");

  nlohmann::json out = bench::MachineJson(**model, size, threads);
  out["requests"] = requests;
  out["tokens"] = tokens;
  out["slots"] = absl::GetFlag(FLAGS_slots);
  out["prefill_chunk"] = absl::GetFlag(FLAGS_prefill_chunk);
  out["repeats"] = repeats;
  out["rows"] = nlohmann::json::array();
  bool all_same = true;
  for (int32_t length : lengths) {
    bench::IdSource ids(**model, 29 + length);
    std::vector<std::vector<int32_t>> prompts(requests);
    for (std::vector<int32_t>& p : prompts) {
      for (int32_t k = 0; k < length; ++k) p.push_back(ids.Next());
    }
    std::vector<bench::EngineRun> runs[2];  // [0] packed, [1] one prompt a step
    std::vector<double> ttft_ratios, rate_ratios;
    double others = 0;
    bool same = true;
    for (int32_t rep = 0; rep < repeats; ++rep) {
      for (int32_t k = 0; k < 2; ++k) {
        const int32_t mode = (k + rep) % 2;  // the order alternates
        EngineOptions o;
        o.slots = absl::GetFlag(FLAGS_slots);
        o.threads = threads;
        o.prefill_chunk = absl::GetFlag(FLAGS_prefill_chunk);
        o.prefix_caching = false;  // every run computes every token
        o.max_prefills_per_step = mode == 0 ? 0 : 1;
        std::vector<std::unique_ptr<GenerationRequest>> batch;
        for (int32_t i = 0; i < requests; ++i) {
          auto r = std::make_unique<GenerationRequest>();
          r->request_id = absl::StrCat(mode == 0 ? "packed-" : "one-", i);
          r->prompt = prompts[i];
          r->max_new_tokens = tokens;
          r->ignore_eos = true;
          batch.push_back(std::move(r));
        }
        absl::StatusOr<bench::EngineRun> run =
            bench::RunQueued(**model, o, std::move(batch), tokens);
        if (!run.ok()) {
          std::fprintf(stderr, "prefill_packing_bench: %s\n", run.status().ToString().c_str());
          return 1;
        }
        others = std::max(others, run->others_cores);
        runs[mode].push_back(*std::move(run));
      }
      const bench::EngineRun& packed = runs[0].back();
      const bench::EngineRun& one = runs[1].back();
      ttft_ratios.push_back(one.ttft_s / packed.ttft_s);
      rate_ratios.push_back(packed.tokens_per_s / one.tokens_per_s);
      same &= packed.outputs == one.outputs;
    }
    all_same &= same;
    std::vector<double> prefill_steps[2], prompts_per_step;
    for (int32_t m = 0; m < 2; ++m) {
      for (const bench::EngineRun& r : runs[m]) {
        prefill_steps[m].push_back(static_cast<double>(r.stats.prefill_steps_total));
        if (m == 0 && r.stats.prefill_steps_total > 0) {
          prompts_per_step.push_back(static_cast<double>(r.stats.prefill_chunks_total) /
                                     static_cast<double>(r.stats.prefill_steps_total));
        }
      }
    }
    nlohmann::json row;
    row["prompt_tokens"] = length;
    row["packed"] = bench::RunsJson(runs[0]);
    row["one_a_step"] = bench::RunsJson(runs[1]);
    row["packed"]["prefill_steps"] = bench::Median(prefill_steps[0]);
    row["one_a_step"]["prefill_steps"] = bench::Median(prefill_steps[1]);
    row["packed"]["chunks_per_prefill_step"] = bench::Median(prompts_per_step);
    row["ratio_ttft_one_over_packed"] = bench::Median(ttft_ratios);
    row["ratio_ttft_runs"] = ttft_ratios;
    row["ratio_tokens_per_s_packed_over_one"] = bench::Median(rate_ratios);
    row["ratio_tokens_per_s_runs"] = rate_ratios;
    row["same_tokens"] = same;
    row["others_cores_max"] = others;
    const double ttft_packed = row["packed"]["ttft_s"].get<double>();
    const double ttft_one = row["one_a_step"]["ttft_s"].get<double>();
    std::printf(
        "%7d | %8.0fms %8.0fms %6.2fx | %9.1f %9.1f %6.2fx | %6.0f / %4.0f %7.2f | %5s "
        "%5.2f\n",
        length, 1e3 * ttft_packed, 1e3 * ttft_one, bench::Median(ttft_ratios),
        row["packed"]["tokens_per_s"].get<double>(),
        row["one_a_step"]["tokens_per_s"].get<double>(), bench::Median(rate_ratios),
        bench::Median(prefill_steps[0]), bench::Median(prefill_steps[1]),
        bench::Median(prompts_per_step), same ? "yes" : "NO", others);
    out["rows"].push_back(std::move(row));
  }
  out["same_tokens"] = all_same;
  std::printf(
      "TTFT: mean time to first token over the burst (from its queueing); one/pk and pk/one: "
      "medians of the pairs' ratios; prefill steps: packed / one a step; prompts: prompts "
      "a packed prefilling step took on average; same: both modes generated the same "
      "tokens; busy: the most cores other processes kept busy during a row's runs\n");
  if (const std::string path = absl::GetFlag(FLAGS_json); !path.empty()) {
    std::ofstream(path) << out.dump(2) << "\n";
  }
  return all_same ? 0 : 1;
}

}  // namespace
}  // namespace kvrm

int main(int argc, char** argv) { return kvrm::Main(argc, argv); }
