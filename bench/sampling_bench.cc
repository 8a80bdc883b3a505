// What host sampling costs the engine thread per decode step: the Sampler over `--slots` rows of
// a `--vocab` vocabulary (32000: the `small` shape), for greedy, plain temperature, top-k and
// top-p requests, beside the size of the logits a GPU would copy back for them. These are the
// costs --device_sampling removes from a CUDA step (docs/cuda.md); on the CPU backend they are
// part of every step.
//
//   bazel run -c opt //bench:sampling_bench -- [--slots=64] [--vocab=32000] [--json=FILE]
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
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "runtime/sampler.h"

ABSL_FLAG(int32_t, slots, 64, "rows sampled per step");
ABSL_FLAG(int32_t, vocab, 32000, "vocabulary size");
ABSL_FLAG(int32_t, steps, 60, "steps timed per kind (the median is reported)");
ABSL_FLAG(std::string, json, "", "also write the results to this JSON file");

namespace kvrm {
namespace {

struct Kind {
  const char* name;
  SamplingConfig config;
};

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int32_t slots = absl::GetFlag(FLAGS_slots), vocab = absl::GetFlag(FLAGS_vocab);
  const int32_t steps = absl::GetFlag(FLAGS_steps);
  std::vector<Kind> kinds(4);
  kinds[0].name = "greedy";
  kinds[1].name = "temperature 0.8";
  kinds[1].config.temperature = 0.8f;
  kinds[2].name = "top_k 50";
  kinds[2].config.temperature = 0.8f;
  kinds[2].config.top_k = 50;
  kinds[3].name = "top_p 0.9";
  kinds[3].config.temperature = 0.8f;
  kinds[3].config.top_p = 0.9f;

  // Model-like logits: a heavy head over a normal body, fresh per row.
  std::mt19937 rng(7);
  std::normal_distribution<float> body(0.0f, 2.0f);
  std::vector<float> source(static_cast<size_t>(slots) * vocab);
  for (float& x : source) x = body(rng);
  for (int32_t s = 0; s < slots; ++s) {
    for (int i = 0; i < 20; ++i) source[static_cast<size_t>(s) * vocab + rng() % vocab] += 8.0f;
  }
  std::vector<float> logits(source.size());
  std::vector<std::unique_ptr<Sampler>> samplers;
  for (int32_t s = 0; s < slots; ++s) samplers.push_back(std::make_unique<Sampler>(vocab));

  const double logits_mb = double(slots) * vocab * sizeof(float) / 1e6;
  std::printf("Host sampling per decode step: %d rows x %d vocabulary (%.1f MB of f32 logits)\n\n",
              slots, vocab, logits_mb);
  // Each kind twice, side by side: as the engine calls Sample (mask_support false: nothing
  // reads the row after the draw) and with the support's -inf mask written back (Sample's
  // default, which the engine skips).
  std::printf("| request kind | ms per step (median) | us per row | ms per step, mask written |\n"
              "|---|---:|---:|---:|\n");
  nlohmann::json out;
  out["date"] = absl::FormatTime("%Y-%m-%d", absl::Now(), absl::UTCTimeZone());
  out["slots"] = slots;
  out["vocab"] = vocab;
  out["logits_mb_per_step"] = logits_mb;
  for (const Kind& k : kinds) {
    double ms_of[2] = {0, 0};  // [0]: the engine's call, [1]: the mask written back
    for (int masked = 0; masked < 2; ++masked) {
      for (int32_t s = 0; s < slots; ++s) {
        SamplingConfig c = k.config;
        c.seed = 100 + s;
        samplers[s]->Reset(c, {});
      }
      std::vector<double> times;
      for (int32_t i = 0; i < steps + 5; ++i) {
        std::copy(source.begin(), source.end(), logits.begin());  // the step's fresh logits
        const auto t0 = std::chrono::steady_clock::now();
        for (int32_t s = 0; s < slots; ++s) {
          const SampleResult r = samplers[s]->Sample(
              absl::MakeSpan(logits).subspan(static_cast<size_t>(s) * vocab, vocab), masked == 1);
          samplers[s]->Accept(r.token);
        }
        const double t =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (i >= 5) times.push_back(t);
      }
      std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
      ms_of[masked] = times[times.size() / 2] * 1e3;
    }
    const double ms = ms_of[0];
    std::printf("| %s | %.3f | %.1f | %.3f |\n", k.name, ms, ms * 1e3 / slots, ms_of[1]);
    out["kinds"].push_back({{"kind", k.name},
                            {"ms_per_step", ms},
                            {"us_per_row", ms * 1e3 / slots},
                            {"ms_per_step_mask_written", ms_of[1]}});
  }
  const std::string json = absl::GetFlag(FLAGS_json);
  if (!json.empty()) std::ofstream(json) << out.dump(2) << "\n";
  return 0;
}

}  // namespace
}  // namespace kvrm

int main(int argc, char** argv) { return kvrm::Main(argc, argv); }
