// Beam search (GenerateRequest.beam_search) through the service, side by side in one process on
// the CPU backend: the same search with the engine's prefix cache on (kvrmd's default: each
// step's one-token scoring requests attach the blocks their beam shares with the prompt and the
// step before) and off (each prefills its whole prompt and beam again), the same search with
// one scoring prompt prefilled a step (--max_prefills_per_step=1; by default a step prefills
// every beam's together), and n sampled completions of the same length (n = the width) as what
// the search costs against plain parallel sampling.
//
//   bazel build //bench:beam_search_bench
//   bazel-bin/bench/beam_search_bench --json=/tmp/beam.json
//
// For each width (--widths) one prompt of --prompt_tokens random ids; each call generates
// --tokens tokens a beam (ignore_eos). The four calls rotate their order across --repeats
// (the machine is shared and noisy); the table shows medians of beam tokens per second (width x
// tokens / wall) and the ratios of each pair of runs, and the share of the cached engine's
// scoring prompts' tokens that came from the cache.
#include <algorithm>
#include <chrono>
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
#include "kvrm/v1/kvrm.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "runtime/engine.h"
#include "runtime/model_bundle.h"
#include "server/kvrm_server.h"

ABSL_FLAG(std::string, size, "small", "generated model shape (tools/modelgen): tiny or small");
ABSL_FLAG(std::string, model_dir, "", "where to generate the model (default: a temp dir)");
ABSL_FLAG(std::string, widths, "1,2,4", "beam widths, comma-separated (1-10)");
ABSL_FLAG(int32_t, prompt_tokens, 256, "the prompt's length");
ABSL_FLAG(int32_t, tokens, 24, "tokens a beam");
ABSL_FLAG(int32_t, slots, 4, "engine slots");
ABSL_FLAG(int32_t, repeats, 3, "rounds of the three calls (their order rotates); medians shown");
ABSL_FLAG(int32_t, threads, 2, "CPU backend threads");
ABSL_FLAG(std::string, json, "", "also write the figures as JSON");

namespace kvrm {
namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// An engine and its service, with the prefix cache on or off.
struct Served {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<KvrmServer> server;
  std::unique_ptr<v1::Kvrm::Stub> stub;
  ~Served() {
    stub.reset();
    server.reset();  // before the engine it serves
    engine.reset();
  }
};

// `max_prefills`: EngineOptions::max_prefills_per_step (0: the engine's default, several a step).
std::unique_ptr<Served> Serve(ModelBundle* m, bool prefix_caching, int32_t max_prefills = 0) {
  EngineOptions o;
  o.max_prefills_per_step = max_prefills;
  o.slots = absl::GetFlag(FLAGS_slots);
  o.threads = absl::GetFlag(FLAGS_threads);
  o.prefix_caching = prefix_caching;
  o.max_queue = 256;
  auto s = std::make_unique<Served>();
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(m, o);
  CHECK_OK(engine.status());
  s->engine = *std::move(engine);
  s->engine->Start();
  ServerOptions so;
  so.listen = "127.0.0.1:0";
  absl::StatusOr<std::unique_ptr<KvrmServer>> server = KvrmServer::Start(s->engine.get(), so);
  CHECK_OK(server.status());
  s->server = *std::move(server);
  s->stub = v1::Kvrm::NewStub(s->server->InProcessChannel());
  return s;
}

struct Run {
  double seconds = 0;
  int64_t tokens = 0;  // generated, all completions
};

absl::StatusOr<Run> Call(v1::Kvrm::Stub& stub, const v1::GenerateRequest& req) {
  grpc::ClientContext ctx;
  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader = stub.Generate(&ctx, req);
  v1::GenerateResponse msg;
  Run run;
  while (reader->Read(&msg)) {
    if (msg.has_finished()) run.tokens += msg.finished().usage().completion_tokens();
  }
  const grpc::Status st = reader->Finish();
  run.seconds = Seconds(start);
  if (!st.ok()) return absl::InternalError(st.error_message());
  return run;
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::vector<int32_t> widths;
  if (!bench::ParseCounts("--widths", absl::GetFlag(FLAGS_widths), &widths)) return 2;
  const std::string size = absl::GetFlag(FLAGS_size);
  absl::StatusOr<std::unique_ptr<ModelBundle>> model =
      bench::LoadGeneratedModel(absl::GetFlag(FLAGS_model_dir), size, "kvrm-beam-bench");
  if (!model.ok()) {
    std::fprintf(stderr, "beam_search_bench: %s\n", model.status().ToString().c_str());
    return 1;
  }
  ModelBundle& m = **model;
  const int32_t threads = absl::GetFlag(FLAGS_threads);
  const int32_t prompt_tokens = absl::GetFlag(FLAGS_prompt_tokens);
  const int32_t tokens = absl::GetFlag(FLAGS_tokens);
  const int32_t repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  std::unique_ptr<Served> cached = Serve(&m, true);
  std::unique_ptr<Served> uncached = Serve(&m, false);
  std::unique_ptr<Served> one_a_step = Serve(&m, true, /*max_prefills=*/1);

  const LlamaConfig& config = m.config;
  std::printf(
      "beam search, prefix cache on vs off, one scoring prompt a step, and n sampled completions: "
      "model %s (hidden %d, %d layers), %d-token prompt, %d tokens a beam, %d slots, %d threads, "
      "%s\n",
      size.c_str(), config.hidden_size, config.num_hidden_layers, prompt_tokens, tokens,
      absl::GetFlag(FLAGS_slots), threads, bench::CpuModelName().c_str());
  std::printf("%5s | %11s %11s %11s %11s | %8s %8s %9s | %7s\n", "width", "beam tok/s",
              "no-cache", "one a step", "sampled", "cache x", "packed x", "vs sample", "cached");
  nlohmann::json out = bench::MachineJson(m, size, threads);
  out["prompt_tokens"] = prompt_tokens;
  out["tokens"] = tokens;
  out["slots"] = absl::GetFlag(FLAGS_slots);
  out["repeats"] = repeats;
  out["rows"] = nlohmann::json::array();
  for (int32_t width : widths) {
    bench::IdSource ids(m, 41 + width);
    v1::GenerateRequest beam;
    for (int32_t i = 0; i < prompt_tokens; ++i) beam.mutable_token_ids()->add_ids(ids.Next());
    beam.mutable_stopping()->set_max_new_tokens(tokens);
    beam.mutable_stopping()->set_ignore_eos(true);
    beam.mutable_sampling()->set_temperature(0);
    beam.set_n(width);
    beam.mutable_beam_search();
    v1::GenerateRequest sampled = beam;
    sampled.clear_beam_search();
    sampled.mutable_sampling()->set_temperature(1);
    sampled.mutable_sampling()->set_seed(7);
    // Calls: 0 beam search, 1 the same without the prefix cache, 2 n sampled completions, 3 beam
    // search with one scoring prompt prefilled a step.
    std::vector<double> rate[4], cache_ratio, packed_ratio, sample_ratio, hit_share;
    for (int32_t rep = 0; rep < repeats; ++rep) {
      double wall[4] = {0, 0, 0, 0};
      for (int32_t k = 0; k < 4; ++k) {
        const int32_t which = (k + rep) % 4;  // the order rotates
        // Each call its own cache salt: nothing is shared with the rounds before.
        v1::GenerateRequest req = which == 2 ? sampled : beam;
        req.set_cache_salt(absl::StrCat("w", width, "-r", rep, "-", which));
        Served& s = which == 1 ? *uncached : which == 3 ? *one_a_step : *cached;
        v1::ServerInfo before, after;
        {
          grpc::ClientContext c;
          CHECK(s.stub->GetServerInfo(&c, v1::GetServerInfoRequest(), &before).ok());
        }
        absl::StatusOr<Run> run = Call(*s.stub, req);
        if (!run.ok()) {
          std::fprintf(stderr, "beam_search_bench: %s\n", run.status().ToString().c_str());
          return 1;
        }
        if (run->tokens != static_cast<int64_t>(width) * tokens) {
          std::fprintf(stderr, "beam_search_bench: %lld tokens, not %d x %d\n",
                       static_cast<long long>(run->tokens), width, tokens);
          return 1;
        }
        if (which == 0) {
          grpc::ClientContext c;
          CHECK(s.stub->GetServerInfo(&c, v1::GetServerInfoRequest(), &after).ok());
          const double queried = static_cast<double>(after.prefix_cache().queried_tokens_total() -
                                                     before.prefix_cache().queried_tokens_total());
          const double hit = static_cast<double>(after.prefix_cache().hit_tokens_total() -
                                                 before.prefix_cache().hit_tokens_total());
          hit_share.push_back(queried > 0 ? hit / queried : 0);
        }
        wall[which] = run->seconds;
        rate[which].push_back(run->tokens / run->seconds);
      }
      cache_ratio.push_back(wall[1] / wall[0]);   // beam with the cache over without
      packed_ratio.push_back(wall[3] / wall[0]);  // several scoring prompts a step over one
      sample_ratio.push_back(wall[2] / wall[0]);  // beam's rate over sampling's
    }
    nlohmann::json row;
    row["width"] = width;
    row["beam_tokens_per_s"] = bench::Median(rate[0]);
    row["beam_no_cache_tokens_per_s"] = bench::Median(rate[1]);
    row["sampled_tokens_per_s"] = bench::Median(rate[2]);
    row["beam_one_a_step_tokens_per_s"] = bench::Median(rate[3]);
    row["packed_speedup"] = bench::Median(packed_ratio);
    row["packed_speedup_runs"] = packed_ratio;
    row["cache_speedup"] = bench::Median(cache_ratio);
    row["cache_speedup_runs"] = cache_ratio;
    row["beam_over_sampled"] = bench::Median(sample_ratio);
    row["beam_over_sampled_runs"] = sample_ratio;
    row["cached_share"] = bench::Median(hit_share);
    std::printf("%5d | %11.1f %11.1f %11.1f %11.1f | %7.2fx %7.2fx %8.3fx | %6.1f%%\n", width,
                bench::Median(rate[0]), bench::Median(rate[1]), bench::Median(rate[3]),
                bench::Median(rate[2]), bench::Median(cache_ratio), bench::Median(packed_ratio),
                bench::Median(sample_ratio), 100 * bench::Median(hit_share));
    out["rows"].push_back(std::move(row));
  }
  std::printf(
      "tok/s: beam (or sampled) tokens a second, width x tokens over the call's wall time; "
      "cache x: the search with the prefix cache over without it; packed x: with its beams' "
      "scoring prompts prefilled together (the default) over one a step "
      "(--max_prefills_per_step=1); vs sample: the search's rate over n sampled completions'; "
      "cached: of the scoring prompts' tokens, those the cache held (medians of %d rounds)\n",
      repeats);
  cached.reset();
  uncached.reset();
  one_a_step.reset();
  if (const std::string path = absl::GetFlag(FLAGS_json); !path.empty()) {
    std::ofstream(path) << out.dump(2) << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace kvrm

int main(int argc, char** argv) { return kvrm::Main(argc, argv); }
