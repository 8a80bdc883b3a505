// The engine's own time per decode step: scheduling, the step descriptor, host sampling, the
// tokens' detokenization and stop checks, the sinks and the published stats, everything the
// engine thread does around the backend. Measured over a backend that computes nothing (its step
// returns at once), through the real engine, tokenizer and sampler of the generated model.
//
// Why: the engine launches a step only after it has done this work for the last one, so on a
// GPU, whose 64-slot decode step of the `small` model replays in ~0.82 ms (docs/cuda.md,
// "Measured on an H200"), it is time the device sits idle every step. The CPU backend's step
// takes tens of milliseconds and hides it.
//
//   bazel build -c opt //bench:engine_overhead
//   bazel-bin/bench/engine_overhead --slots=16,64,128 --json=/tmp/engine-overhead.json
//
// Per slot count, sampling path and handoff spin (Backend::handoff_spin: 0 as the CPU backend,
// 2000 µs as the CUDA backend), every slot decodes a request (a --prompt-token prompt,
// ignore_eos) for --steps timed steps after a warm-up:
//   device-greedy: the backend returns the tokens (DecodeAndSample; the CUDA graph's path for
//                  greedy rows), the engine samples nothing;
//   host-greedy:   the backend returns [slots][vocab] logits and the engine takes the argmax;
//   host-top-p:    the same with temperature 0.8 and top-p 0.95 (a softmax over the vocabulary).
// The backend's own time (copying the logits rows the host path reads: a GPU copies them by
// DMA) is measured and taken out; what remains includes the step runner's two thread handoffs
// a step (a GPU waits for those too). The rows the host samples were just written by the null
// backend and may still be in cache, where a GPU's DMA'd rows are not: host figures are a
// floor. The sinks only count what they get; a gRPC or HTTP front end adds its message
// building on top (not measured here).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/generated_model.h"
#include "bench/null_backend.h"
#include "common/logging.h"
#include "nlohmann/json.hpp"
#include "runtime/backend.h"
#include "runtime/engine.h"
#include "runtime/kv_pool.h"
#include "runtime/model_bundle.h"

ABSL_FLAG(std::string, size, "small", "generated model shape (tools/modelgen): tiny or small");
ABSL_FLAG(std::string, model_dir, "", "where to generate the model (default: a temp dir)");
ABSL_FLAG(std::string, slots, "16,64,128", "slot counts, comma-separated");
ABSL_FLAG(int32_t, prompt, 256, "prompt tokens per request");
ABSL_FLAG(int32_t, steps, 400, "timed decode steps per configuration");
ABSL_FLAG(int32_t, warmup, 50, "decode steps before timing");
ABSL_FLAG(std::string, handoff_spin_us, "0,2000",
          "Backend::handoff_spin values to compare, in microseconds (0: the CPU backend's; 2000: "
          "the CUDA backend's)");
ABSL_FLAG(std::string, paths, "device-greedy,host-greedy,host-top-p",
          "sampling paths to measure, comma-separated");
ABSL_FLAG(std::string, json, "", "also write the figures as JSON");

namespace kvrm {
namespace {

using Clock = std::chrono::steady_clock;

class CountingSink final : public RequestSink {
 public:
  void OnChunk(StreamChunk chunk) override {
    tokens += static_cast<int64_t>(chunk.token_ids.size());
    bytes += static_cast<int64_t>(chunk.text.size());
  }
  void OnFinished(StreamChunk last, const FinishInfo&) override {
    tokens += static_cast<int64_t>(last.token_ids.size());
    done = true;
  }
  int64_t tokens = 0, bytes = 0;
  bool done = false;
};

struct Row {
  std::string path;
  int32_t slots = 0;
  int32_t spin_us = 0;
  double step_us = 0;     // engine thread per step, the backend's time taken out
  double token_us = 0;    // the same per token generated
  double backend_us = 0;  // the null backend's own time per step (filling logits rows)
  int64_t tokens = 0;
};

// Tokens the first slots decode while the last prompts still prefill (a chunk a step): room for
// them too, so that no request ends before the timed steps do.
int32_t EarlyTokens(int32_t slots) { return slots * (absl::GetFlag(FLAGS_prompt) / 256 + 2) + 16; }

// The context every request needs for the whole run at `slots` slots.
int64_t ContextNeeded(int32_t slots) {
  return int64_t{absl::GetFlag(FLAGS_prompt)} + EarlyTokens(slots) + absl::GetFlag(FLAGS_warmup) +
         absl::GetFlag(FLAGS_steps) + 64;
}

Row Measure(const ModelBundle& model, const std::string& path, int32_t slots, int32_t spin_us) {
  const int32_t prompt = absl::GetFlag(FLAGS_prompt);
  const int32_t steps = absl::GetFlag(FLAGS_steps), warmup = absl::GetFlag(FLAGS_warmup);
  const int32_t early = EarlyTokens(slots);
  EngineOptions o;
  o.slots = slots;
  o.kv_mode = KvMode::kKvrm;
  o.block_tokens = 16;
  o.max_context = static_cast<int32_t>(ContextNeeded(slots));
  o.kv_blocks = int64_t{slots} * ((o.max_context + 15) / 16);
  o.max_queue = slots + 1;
  o.prefill_chunk = 256;
  o.max_new_tokens = early + warmup + steps + 32;
  o.threads = 1;
  const bool device = path == "device-greedy";
  o.device_sampling = device;
  auto owned = std::make_unique<bench::NullBackend>(model.config.vocab_size, o.kv_blocks, 16,
                                             o.prefill_chunk, device,
                                             absl::Microseconds(spin_us));
  bench::NullBackend* null = owned.get();
  auto engine = Engine::CreateWithBackend(&model, o, std::move(owned));
  CHECK_OK(engine.status());
  std::vector<std::shared_ptr<CountingSink>> sinks;
  for (int32_t s = 0; s < slots; ++s) {
    auto r = std::make_unique<GenerationRequest>();
    r->request_id = absl::StrCat("r", s);
    for (int32_t i = 0; i < prompt; ++i) {
      r->prompt.push_back(100 + (i * 131 + s * 17) % (model.config.vocab_size - 200));
    }
    r->max_new_tokens = early + warmup + steps + 16;
    r->ignore_eos = true;
    r->sampling.seed = 1 + s;
    if (path == "host-top-p") {
      r->sampling.temperature = 0.8f;
      r->sampling.top_p = 0.95f;
    }
    r->arrival = absl::Now();
    auto sink = std::make_shared<CountingSink>();
    r->sink = sink;
    sinks.push_back(sink);
    CHECK_OK((*engine)->Submit(std::move(r)).status());
  }
  // Until every slot decodes (the prompts prefill in a few steps), then the warm-up.
  for (int i = 0; i < 10000; ++i) {
    bool all = true;
    for (int32_t s = 0; s < slots; ++s) all &= (*engine)->slot_state(s) == SlotState::kDecoding;
    if (all) break;
    (*engine)->StepForTest();
  }
  for (int i = 0; i < warmup; ++i) (*engine)->StepForTest();
  int64_t before = 0;
  for (const auto& s : sinks) before += s->tokens;
  const double backend_before = null->backend_seconds();
  const auto t0 = Clock::now();
  for (int i = 0; i < steps; ++i) (*engine)->StepForTest();
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  int64_t after = 0;
  for (const auto& s : sinks) after += s->tokens;
  Row row;
  row.path = path;
  row.slots = slots;
  row.spin_us = spin_us;
  row.tokens = after - before;
  const double backend = null->backend_seconds() - backend_before;
  row.backend_us = backend / steps * 1e6;
  row.step_us = (wall - backend) / steps * 1e6;
  row.token_us = row.tokens > 0 ? (wall - backend) / row.tokens * 1e6 : 0;
  CHECK(row.tokens == int64_t{steps} * slots) << "every slot decodes every timed step";
  return row;
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // The model: generated in the Hugging Face layout and loaded by the real loader.
  auto model = bench::LoadGeneratedModel(absl::GetFlag(FLAGS_model_dir),
                                         absl::GetFlag(FLAGS_size), "kvrm-engine-overhead");
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
    return 1;
  }
  // A comma-separated list of integers of at least `min`, or an error naming the flag.
  auto ints = [](const char* flag, const std::string& list, int32_t min,
                 std::vector<int32_t>* out) {
    for (absl::string_view part : absl::StrSplit(list, ',')) {
      int32_t n = 0;
      if (!absl::SimpleAtoi(part, &n) || n < min) {
        std::fprintf(stderr, "--%s: '%s' is not an integer of at least %d\n", flag,
                     std::string(part).c_str(), min);
        return false;
      }
      out->push_back(n);
    }
    return true;
  };
  std::vector<int32_t> slot_counts, spins;
  if (!ints("slots", absl::GetFlag(FLAGS_slots), 1, &slot_counts) ||
      !ints("handoff_spin_us", absl::GetFlag(FLAGS_handoff_spin_us), 0, &spins)) {
    return 1;
  }
  for (int32_t n : slot_counts) {
    // Every request stays in the model's context for the whole run (see Measure).
    const int64_t context = ContextNeeded(n);
    if (absl::GetFlag(FLAGS_prompt) < 1 || absl::GetFlag(FLAGS_steps) < 1 ||
        absl::GetFlag(FLAGS_warmup) < 0 || context > (*model)->config.max_position_embeddings) {
      std::fprintf(stderr,
                   "--prompt, --warmup and --steps at %d slots need %lld positions; the model has "
                   "%d (fewer --steps, or a shorter --prompt)\n",
                   n, static_cast<long long>(context), (*model)->config.max_position_embeddings);
      return 1;
    }
  }
  std::printf("engine thread per decode step, %s model (vocab %d), null backend, %d timed steps\n",
              absl::GetFlag(FLAGS_size).c_str(), (*model)->config.vocab_size,
              absl::GetFlag(FLAGS_steps));
  const std::vector<std::string> paths = absl::StrSplit(absl::GetFlag(FLAGS_paths), ',');
  for (const std::string& path : paths) {
    if (path != "device-greedy" && path != "host-greedy" && path != "host-top-p") {
      std::fprintf(stderr, "--paths: '%s' (device-greedy, host-greedy, host-top-p)\n", path.c_str());
      return 1;
    }
  }
  std::printf("| sampling | slots | handoff spin µs | engine µs / step | engine µs / token | "
              "null backend µs / step |\n|---|---:|---:|---:|---:|---:|\n");
  nlohmann::json rows = nlohmann::json::array();
  for (const std::string& path : paths) {
    for (int32_t slots : slot_counts) {
      for (int32_t spin : spins) {
        const Row r = Measure(**model, path, slots, spin);
        std::printf("| %s | %d | %d | %.1f | %.2f | %.1f |\n", r.path.c_str(), r.slots, r.spin_us,
                    r.step_us, r.token_us, r.backend_us);
        std::fflush(stdout);
        rows.push_back({{"sampling", r.path}, {"slots", r.slots}, {"handoff_spin_us", r.spin_us},
                        {"engine_us_per_step", r.step_us}, {"engine_us_per_token", r.token_us},
                        {"null_backend_us_per_step", r.backend_us}, {"tokens", r.tokens}});
      }
    }
  }
  if (const std::string path = absl::GetFlag(FLAGS_json); !path.empty()) {
    std::ofstream f(path);
    f << nlohmann::json{{"model", absl::GetFlag(FLAGS_size)},
                        {"steps", absl::GetFlag(FLAGS_steps)},
                        {"prompt", absl::GetFlag(FLAGS_prompt)},
                        {"rows", rows}}
             .dump(2)
      << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace kvrm

int main(int argc, char** argv) { return kvrm::Main(argc, argv); }
