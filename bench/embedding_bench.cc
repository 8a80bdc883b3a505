// Embeddings (GenerationRequest::pooling) against the same prompts run as one-token generations,
// side by side in one process on the CPU backend, and against the processor's multiply-add peak.
//
//   bazel build //bench:embedding_bench
//   bazel-bin/bench/embedding_bench --json=/tmp/embedding.json
//
// For each prompt length (--prompt_tokens) --requests random prompts are queued at once on an
// engine of --slots slots, twice per repeat: as embeddings (last-token pooling: prefill, then
// the final norm of the last row) and as generations of one token (prefill, then the LM head and
// a sample for the last row: the cheapest way to have a prompt's K/V computed through the
// generation API). The two alternate their order across --repeats (the machine is shared and
// noisy); the table shows medians of each mode's prompt tokens per second and of the pairs'
// ratios. Prefix caching is off, so each run computes every token.
//
// The roofline: a prompt of L tokens costs 2 x (the layers' linear weights) FLOPs per token,
// plus causal attention's 4 x heads x head_dim x L (L + 1) / 2 per layer (Q K^T and the weighted
// sum of V), plus for the generation 2 x hidden x vocab for its one LM-head row. "peak" is the
// multiply-add rate of the instruction the matmuls use (vdpbf16ps on a bf16 model where
// avx512_bf16 runs, else vfmadd231ps), measured on --threads threads (bench/compute_peak.h).
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "bench/compute_peak.h"
#include "bench/engine_run.h"
#include "bench/generated_model.h"
#include "common/logging.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/thread_pool.h"
#include "nlohmann/json.hpp"
#include "runtime/engine.h"
#include "runtime/model_bundle.h"

ABSL_FLAG(std::string, size, "small", "generated model shape (tools/modelgen): tiny or small");
ABSL_FLAG(std::string, model_dir, "", "where to generate the model (default: a temp dir)");
ABSL_FLAG(std::string, prompt_tokens, "32,128,512", "prompt lengths, comma-separated");
ABSL_FLAG(int32_t, requests, 16, "prompts per run");
ABSL_FLAG(int32_t, slots, 4, "engine slots");
ABSL_FLAG(int32_t, repeats, 3, "pairs of runs per row (their order alternates); medians shown");
ABSL_FLAG(int32_t, threads, 2, "CPU backend threads");
ABSL_FLAG(std::string, json, "", "also write the figures as JSON");

namespace kvrm {
namespace {

// FLOPs of one prompt of `length` tokens through every layer (see the header).
double PromptFlops(const LlamaConfig& c, int64_t length) {
  const double d = c.hidden_size, q = double{c.num_attention_heads} * c.head_dim,
               kv = double{c.num_key_value_heads} * c.head_dim, ffn = c.intermediate_size;
  const double linear = d * q + 2 * d * kv + q * d + 3 * d * ffn;
  const double attention = 4.0 * q * static_cast<double>(length) * (length + 1) / 2;
  return c.num_hidden_layers * (2 * linear * static_cast<double>(length) + attention);
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::vector<int32_t> lengths;
  if (!bench::ParseCounts("--prompt_tokens", absl::GetFlag(FLAGS_prompt_tokens), &lengths)) {
    return 2;
  }
  const std::string size = absl::GetFlag(FLAGS_size);
  absl::StatusOr<std::unique_ptr<ModelBundle>> model =
      bench::LoadGeneratedModel(absl::GetFlag(FLAGS_model_dir), size, "kvrm-embedding-bench");
  if (!model.ok()) {
    std::fprintf(stderr, "embedding_bench: %s\n", model.status().ToString().c_str());
    return 1;
  }
  const LlamaConfig& config = (*model)->config;
  const int32_t threads = absl::GetFlag(FLAGS_threads);
  const int32_t requests = absl::GetFlag(FLAGS_requests);
  const int32_t repeats = std::max(1, absl::GetFlag(FLAGS_repeats));

  // The peak of the instruction the matmuls run (bf16 weights: vdpbf16ps where it runs).
  const bool bf16 = ActiveCpuIsa() == CpuIsa::kAvx512Bf16;
  const bool avx512 = bf16 || ActiveCpuIsa() == CpuIsa::kAvx512;
  double peak = 0;
  const char* peak_name = "none (no AVX-512)";
  if (avx512) {
    ThreadPool pool(threads);
    std::vector<double> flops(threads);
    const PeakKind kind = bf16 ? PeakKind::kDpBf16 : PeakKind::kFmaF32;
    pool.RunOnAll([&](int t) { flops[t] = PeakFlopsOneThread(kind, 30'000'000); });
    for (double f : flops) peak += f;
    peak_name = bf16 ? "vdpbf16ps" : "vfmadd231ps";
  }
  std::printf("embeddings against one-token generations: model %s (hidden %d, %d layers, vocab "
              "%d), %d prompts a run, %d slots, %d threads, %s; peak %s %.1f GFLOP/s\n",
              size.c_str(), config.hidden_size, config.num_hidden_layers, config.vocab_size,
              requests, absl::GetFlag(FLAGS_slots), threads, bench::CpuModelName().c_str(),
              peak_name, peak / 1e9);
  std::printf("%8s | %14s %14s %7s | %10s %7s | %7s\n", "prompt", "embed tok/s", "gen-1 tok/s",
              "ratio", "GFLOP/s", "of peak", "busy");

  nlohmann::json out = bench::MachineJson(**model, size, threads);
  out["requests"] = requests;
  out["slots"] = absl::GetFlag(FLAGS_slots);
  out["repeats"] = repeats;
  out["peak_instruction"] = peak_name;
  out["peak_gflops"] = peak / 1e9;
  out["rows"] = nlohmann::json::array();
  for (int32_t length : lengths) {
    bench::IdSource ids(**model, 17 + length);
    std::vector<std::vector<int32_t>> prompts(requests);
    for (std::vector<int32_t>& p : prompts) {
      for (int32_t k = 0; k < length; ++k) p.push_back(ids.Next());
    }
    EngineOptions o;
    o.slots = absl::GetFlag(FLAGS_slots);
    o.threads = threads;
    o.prefix_caching = false;  // every run computes every token
    std::vector<bench::EngineRun> embed_runs, gen_runs;
    std::vector<double> ratios;
    double others = 0;
    for (int32_t rep = 0; rep < repeats; ++rep) {
      double rate[2] = {0, 0};
      for (int32_t k = 0; k < 2; ++k) {
        const bool embed = (k + rep) % 2 == 0;  // the order alternates
        std::vector<std::unique_ptr<GenerationRequest>> batch;
        for (int32_t i = 0; i < requests; ++i) {
          auto r = std::make_unique<GenerationRequest>();
          r->request_id = absl::StrCat(embed ? "embed-" : "gen-", i);
          r->prompt = prompts[i];
          r->max_new_tokens = 1;
          r->ignore_eos = true;
          if (embed) r->pooling = Pooling::kLast;
          batch.push_back(std::move(r));
        }
        absl::StatusOr<bench::EngineRun> run =
            bench::RunQueued(**model, o, std::move(batch), embed ? 0 : 1);
        if (!run.ok()) {
          std::fprintf(stderr, "embedding_bench: %s\n", run.status().ToString().c_str());
          return 1;
        }
        run->tokens_per_s = static_cast<double>(requests) * length / run->wall_s;
        others = std::max(others, run->others_cores);
        rate[embed ? 0 : 1] = run->tokens_per_s;
        (embed ? embed_runs : gen_runs).push_back(*std::move(run));
      }
      ratios.push_back(rate[0] / rate[1]);
    }
    nlohmann::json row;
    row["prompt_tokens"] = length;
    row["embed"] = bench::RunsJson(embed_runs);
    row["generate_1"] = bench::RunsJson(gen_runs);
    // (RunsJson's tokens_per_s is the prompt tokens' here: set above.)
    const double embed_rate = row["embed"]["tokens_per_s"].get<double>();
    const double gen_rate = row["generate_1"]["tokens_per_s"].get<double>();
    const double flops_per_s = PromptFlops(config, length) / length * embed_rate;
    row["ratio_tokens_per_s"] = bench::Median(ratios);
    row["ratio_runs"] = ratios;
    row["embed_gflops"] = flops_per_s / 1e9;
    row["embed_of_peak"] = peak > 0 ? flops_per_s / peak : 0.0;
    row["generate_1_gflops"] =
        (PromptFlops(config, length) / length +
         2.0 * config.hidden_size * config.vocab_size / length) *
        gen_rate / 1e9;
    row["others_cores_max"] = others;
    std::printf("%8d | %14.0f %14.0f %6.2fx | %10.1f %6.1f%% | %7.2f\n", length, embed_rate,
                gen_rate, bench::Median(ratios), flops_per_s / 1e9,
                peak > 0 ? 100 * flops_per_s / peak : 0.0, others);
    out["rows"].push_back(std::move(row));
  }
  std::printf("ratio: embed tok/s over gen-1 tok/s, median of the pairs; busy: the most cores "
              "other processes kept busy during a row's runs\n");
  if (const std::string path = absl::GetFlag(FLAGS_json); !path.empty()) {
    std::ofstream(path) << out.dump(2) << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace kvrm

int main(int argc, char** argv) { return kvrm::Main(argc, argv); }
