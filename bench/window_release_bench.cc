// Window release (EngineOptions::window_release): a model whose every layer attends within a
// sliding window (the generated small-mistral-sw: Mistral 7B v0.1's attention at the benchmark
// size, a 512-position window of 4096) served through the in-process engine on the CPU
// backend, its KV blocks behind the window released or kept, side by side in one process:
//
//   bazel build //bench:window_release_bench
//   bazel-bin/bench/window_release_bench --json=/tmp/window_release.json
//
// --requests requests (all queued at once, --slots slots), each a random prompt of
// --prompt_tokens ids generating exactly --max_new_tokens (greedy, ignore_eos), in three modes:
//   release     window release on, a pool of the working set a slot (WindowPeakBlocks) x slots
//               (the engine's default pool then);
//   keep, same  every block kept, the same pool: histories past it pause (swap or recompute) and
//               wait, so fewer decode at once;
//   keep, full  every block kept, a pool that holds every slot's whole history (what keeping
//               needs to decode them all at once, as release does).
// The modes' order rotates across --repeats (the machine is shared and noisy) and the table shows
// medians, with the ratios of release to the others measured in the same rounds. Every run's
// tokens must equal the first run's (release is exact): the `identical` column, and the exit
// status is 1 where they are not. "peak blocks" is the most KV blocks in use at once, sampled
// every 2 ms beside the run; "blocks moved" what the transport copied (compaction, and swaps out
// and back); KV MiB is the pool's size (K and V of every layer, f32 KV).
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "bench/engine_run.h"
#include "bench/generated_model.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "runtime/engine.h"
#include "runtime/model_bundle.h"

ABSL_FLAG(std::string, size, "small-mistral-sw",
          "generated model shape (tools/modelgen) whose every layer slides: small-mistral-sw or "
          "tiny-mistral-sw");
ABSL_FLAG(std::string, model_dir, "", "where to generate the model (default: a temp dir)");
ABSL_FLAG(int32_t, slots, 8, "decode slots");
ABSL_FLAG(int32_t, requests, 8, "requests per run, all queued at once");
ABSL_FLAG(int32_t, prompt_tokens, 512, "prompt tokens per request");
ABSL_FLAG(int32_t, max_new_tokens, 1536, "tokens each request generates (ignore_eos)");
ABSL_FLAG(int32_t, prefill_chunk, 256, "EngineOptions::prefill_chunk");
ABSL_FLAG(int32_t, repeats, 2, "rounds of the three modes (their order rotates); medians shown");
ABSL_FLAG(int32_t, threads, 2, "CPU backend threads");
ABSL_FLAG(std::string, json, "", "also write the figures as JSON");
ABSL_FLAG(int32_t, turn2_tokens, 64,
          "conversations: each request's next turn is its history and this many new tokens "
          "(0: no conversation section)");
ABSL_FLAG(int32_t, turn2_new_tokens, 32, "conversations: tokens the next turn generates");
ABSL_FLAG(int32_t, between, 8,
          "conversations: requests of other prompts served between the two turns");

namespace kvrm {
namespace {

struct Mode {
  const char* name;
  bool release;
  int64_t kv_blocks;
};

struct ModeRun : bench::EngineRun {
  int64_t peak_blocks = 0;
};

EngineOptions ModeOptions(const Mode& mode) {
  EngineOptions o;
  o.slots = absl::GetFlag(FLAGS_slots);
  o.threads = absl::GetFlag(FLAGS_threads);
  o.prefill_chunk = absl::GetFlag(FLAGS_prefill_chunk);
  o.window_release = mode.release;
  o.kv_blocks = mode.kv_blocks;
  return o;
}

std::vector<std::unique_ptr<GenerationRequest>> Requests(
    const std::vector<std::vector<int32_t>>& prompts, int32_t max_new_tokens, const char* tag) {
  std::vector<std::unique_ptr<GenerationRequest>> requests;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto r = std::make_unique<GenerationRequest>();
    r->request_id = tag + std::to_string(i);
    r->prompt = prompts[i];
    r->max_new_tokens = max_new_tokens;
    r->ignore_eos = true;
    requests.push_back(std::move(r));
  }
  return requests;
}

absl::StatusOr<ModeRun> RunMode(const ModelBundle& model, const Mode& mode,
                                const std::vector<std::vector<int32_t>>& prompts) {
  EngineOptions o = ModeOptions(mode);
  // The served context is the workload's history (keeping needs a request's whole history in
  // the pool; release a window's worth).
  o.max_context = absl::GetFlag(FLAGS_prompt_tokens) + absl::GetFlag(FLAGS_max_new_tokens);
  o.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  std::vector<std::unique_ptr<GenerationRequest>> requests =
      Requests(prompts, o.max_new_tokens, "w");
  std::atomic<int64_t> peak{0};
  const bench::BesideRun sample = [&](Engine* engine, const std::atomic<bool>* done) {
    while (!*done) {
      peak = std::max<int64_t>(peak, engine->Stats().kv.blocks_used);
      absl::SleepFor(absl::Milliseconds(2));
    }
  };
  absl::StatusOr<bench::EngineRun> run =
      bench::RunQueued(model, o, std::move(requests), o.max_new_tokens, sample);
  if (!run.ok()) return run.status();
  ModeRun out;
  static_cast<bench::EngineRun&>(out) = std::move(*run);
  out.peak_blocks = peak;
  return out;
}

// Conversations: each request's next turn (its whole history and --turn2_tokens new tokens),
// after --between requests of other prompts, on one engine. What the prefix cache finds of the
// history decides the next turn's prefill: under window release only the blocks within the
// window of the cached prefix's end are needed (the rest may be evicted long since), from the
// device or copied back from the host tier.
struct ConversationRun {
  bench::EngineRun turn2;
  uint64_t prompt_tokens = 0, cached = 0, from_host = 0, evictions = 0, offloaded = 0;
};

absl::StatusOr<ConversationRun> RunConversation(const ModelBundle& model, const Mode& mode,
                                                int64_t host_blocks, int32_t max_context,
                                                const std::vector<std::vector<int32_t>>& first,
                                                const std::vector<std::vector<int32_t>>& others,
                                                bench::IdSource ids) {
  EngineOptions o = ModeOptions(mode);
  o.kv_host_blocks = host_blocks;
  o.max_context = max_context;
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(&model, o));
  const int32_t new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  ASSIGN_OR_RETURN(bench::EngineRun turn1,
                   bench::RunQueuedOn(engine.get(), Requests(first, new_tokens, "t1-"), new_tokens,
                                      /*start=*/true));
  const int32_t between_tokens = 128;
  if (!others.empty()) {
    RETURN_IF_ERROR(bench::RunQueuedOn(engine.get(), Requests(others, between_tokens, "o-"),
                                       between_tokens, /*start=*/false)
                        .status());
  }
  std::vector<std::vector<int32_t>> next = first;
  ConversationRun r;
  for (size_t i = 0; i < next.size(); ++i) {
    next[i].insert(next[i].end(), turn1.outputs[i].begin(), turn1.outputs[i].end());
    for (int32_t k = 0; k < absl::GetFlag(FLAGS_turn2_tokens); ++k) next[i].push_back(ids.Next());
    r.prompt_tokens += next[i].size();
  }
  const EngineStats before = engine->Stats();
  const int32_t turn2_new = absl::GetFlag(FLAGS_turn2_new_tokens);
  ASSIGN_OR_RETURN(r.turn2, bench::RunQueuedOn(engine.get(), Requests(next, turn2_new, "t2-"),
                                               turn2_new, /*start=*/false));
  const EngineStats& after = r.turn2.stats;
  r.cached = after.prefix_cache_hits_total - before.prefix_cache_hits_total;
  r.from_host = after.prefix_cache_host_hits_total - before.prefix_cache_host_hits_total;
  r.evictions = after.prefix_cache_evictions_total;
  r.offloaded = after.prefix_cache_offloaded_blocks_total;
  return r;
}

int Main() {
  const std::string size = absl::GetFlag(FLAGS_size);
  absl::StatusOr<std::unique_ptr<ModelBundle>> loaded =
      bench::LoadGeneratedModel(absl::GetFlag(FLAGS_model_dir), size, "kvrm-window-release");
  if (!loaded.ok()) {
    std::fprintf(stderr, "window_release_bench: %s\n", loaded.status().ToString().c_str());
    return 2;
  }
  const ModelBundle& model = **loaded;
  const LlamaConfig& c = model.config;
  if (!c.AllLayersSlide()) {
    std::fprintf(stderr, "window_release_bench: --size=%s has a layer without a window\n",
                 size.c_str());
    return 2;
  }
  const int32_t slots = absl::GetFlag(FLAGS_slots);
  const int32_t prompt_tokens = absl::GetFlag(FLAGS_prompt_tokens);
  const int32_t new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  const int32_t history = prompt_tokens + new_tokens;
  if (history > c.max_position_embeddings || history <= c.sliding_window) {
    std::fprintf(stderr,
                 "window_release_bench: prompt + output = %d must lie past the window (%d) and "
                 "within the model's %d positions\n",
                 history, c.sliding_window, c.max_position_embeddings);
    return 2;
  }
  const int32_t block_tokens = EngineOptions{}.block_tokens;
  const int64_t peak =
      WindowPeakBlocks(c.sliding_window, block_tokens, absl::GetFlag(FLAGS_prefill_chunk), 0);
  const int64_t whole = (history + block_tokens - 1) / block_tokens;
  const std::vector<Mode> modes = {
      {"release", true, peak * slots},
      {"keep, same pool", false, std::max(peak * slots, whole)},
      {"keep, full pool", false, whole * slots},
  };
  // K and V of every layer, f32.
  const double mib_per_block = 2.0 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim *
                               sizeof(float) * block_tokens / (1024.0 * 1024.0);

  bench::IdSource ids(model, 42);
  std::vector<std::vector<int32_t>> prompts(absl::GetFlag(FLAGS_requests));
  for (auto& p : prompts) {
    for (int32_t i = 0; i < prompt_tokens; ++i) p.push_back(ids.Next());
  }
  const int32_t repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  std::vector<std::vector<ModeRun>> runs(modes.size());
  const std::vector<std::vector<int32_t>>* reference = nullptr;
  bool identical = true;
  for (int32_t round = 0; round < repeats; ++round) {
    for (size_t k = 0; k < modes.size(); ++k) {
      const size_t m = (k + round) % modes.size();
      absl::StatusOr<ModeRun> r = RunMode(model, modes[m], prompts);
      if (!r.ok()) {
        std::fprintf(stderr, "window_release_bench: %s: %s\n", modes[m].name,
                     r.status().ToString().c_str());
        return 2;
      }
      std::fprintf(stderr, "round %d %-16s %7.1f tok/s, %llu preemptions, peak %lld blocks\n",
                   round + 1, modes[m].name, r->tokens_per_s,
                   static_cast<unsigned long long>(r->stats.preemptions_total),
                   static_cast<long long>(r->peak_blocks));
      runs[m].push_back(std::move(*r));
      if (reference == nullptr) reference = &runs[m].front().outputs;
      identical &= runs[m].back().outputs == *reference;
    }
  }

  auto median_of = [&](size_t m, auto field) {
    std::vector<double> v;
    for (const ModeRun& r : runs[m]) v.push_back(field(r));
    return bench::Median(v);
  };
  auto tok_s = [](const ModeRun& r) { return r.tokens_per_s; };
  // Ratios within each round, then their median.
  auto ratio = [&](size_t a, size_t b, auto field) {
    std::vector<double> v;
    for (int32_t i = 0; i < repeats; ++i) v.push_back(field(runs[a][i]) / field(runs[b][i]));
    return bench::Median(v);
  };

  std::printf(
      "window release on %s (window %d of %d positions), %d slots, %zu requests of %d prompt + "
      "%d generated tokens (%d-token histories), %d threads, %d round(s), medians\n\n",
      size.c_str(), c.sliding_window, c.max_position_embeddings, slots, prompts.size(),
      prompt_tokens, new_tokens, history, absl::GetFlag(FLAGS_threads), repeats);
  std::printf("%-16s %9s %8s %8s %8s %8s %11s %11s %9s %12s %9s\n", "mode", "kv blocks", "KV MiB",
              "tok/s", "TPOT ms", "TTFT s", "preemptions", "peak blocks", "released",
              "blocks moved", "identical");
  nlohmann::json rows = nlohmann::json::array();
  for (size_t m = 0; m < modes.size(); ++m) {
    const double preemptions =
        median_of(m, [](const ModeRun& r) { return double(r.stats.preemptions_total); });
    const double peak_blocks = median_of(m, [](const ModeRun& r) { return double(r.peak_blocks); });
    const double released =
        median_of(m, [](const ModeRun& r) { return double(r.stats.window_blocks_released_total); });
    // Blocks the transport copied: compaction, and swaps out and back.
    const double moved =
        median_of(m, [](const ModeRun& r) { return double(r.stats.transfer_blocks_total); });
    bool same = true;
    for (const ModeRun& r : runs[m]) same &= r.outputs == *reference;
    std::printf("%-16s %9lld %8.1f %8.1f %8.2f %8.2f %11.0f %11.0f %9.0f %12.0f %9s\n",
                modes[m].name, static_cast<long long>(modes[m].kv_blocks),
                modes[m].kv_blocks * mib_per_block, median_of(m, tok_s),
                median_of(m, [](const ModeRun& r) { return r.tpot_ms; }),
                median_of(m, [](const ModeRun& r) { return r.ttft_s; }), preemptions, peak_blocks,
                released, moved, same ? "yes" : "NO");
    nlohmann::json row = bench::RunsJson(runs[m]);
    row["mode"] = modes[m].name;
    row["window_release"] = modes[m].release;
    row["kv_blocks"] = modes[m].kv_blocks;
    row["kv_mib"] = modes[m].kv_blocks * mib_per_block;
    row["preemptions"] = preemptions;
    row["peak_blocks"] = peak_blocks;
    row["released_blocks"] = released;
    row["moved_blocks"] = moved;
    row["identical"] = same;
    rows.push_back(row);
  }
  const double vs_same = ratio(0, 1, tok_s), vs_full = ratio(0, 2, tok_s);
  const double memory = static_cast<double>(modes[2].kv_blocks) / modes[0].kv_blocks;
  auto peak_of = [](const ModeRun& r) { return static_cast<double>(r.peak_blocks); };
  const double peak_ratio = ratio(2, 0, peak_of);
  std::printf("\nrelease vs keep at the same pool: %.2fx tok/s\n", vs_same);
  std::printf(
      "release vs keep at the full pool: %.2fx tok/s with %.2fx less KV pool (%.2fx fewer "
      "blocks in use at the peak)\n",
      vs_full, memory, peak_ratio);
  std::printf("outputs identical in every run: %s\n", identical ? "yes" : "NO");

  // Conversations: release's pool against keeping every block on a pool that holds every turn-2
  // history, both with a host tier of that size to offload the prefix cache to.
  nlohmann::json conversation;
  if (const int32_t turn2 = absl::GetFlag(FLAGS_turn2_tokens); turn2 > 0) {
    const int32_t turn2_history = history + turn2 + absl::GetFlag(FLAGS_turn2_new_tokens);
    const int64_t whole2 = (turn2_history + block_tokens - 1) / block_tokens;
    const std::vector<Mode> turn_modes = {
        {"release", true, peak * slots},
        {"keep, full pool", false, whole2 * slots},
    };
    const int64_t host_blocks = whole2 * slots;
    std::vector<std::vector<int32_t>> others(absl::GetFlag(FLAGS_between));
    for (auto& p : others) {
      for (int32_t i = 0; i < prompt_tokens; ++i) p.push_back(ids.Next());
    }
    std::vector<ConversationRun> conv;
    for (const Mode& m : turn_modes) {
      absl::StatusOr<ConversationRun> r = RunConversation(
          model, m, host_blocks, turn2_history, prompts, others, bench::IdSource(model, 7));
      if (!r.ok()) {
        std::fprintf(stderr, "window_release_bench: conversation, %s: %s\n", m.name,
                     r.status().ToString().c_str());
        return 2;
      }
      conv.push_back(std::move(*r));
    }
    const bool same2 = conv[0].turn2.outputs == conv[1].turn2.outputs;
    identical &= same2;
    std::printf(
        "\nconversations: turn 2 = each turn-1 history (%d tokens) + %d new tokens, generating "
        "%d, after %zu requests of other prompts (%d + 128 tokens); host tier %lld blocks\n\n",
        history, turn2, absl::GetFlag(FLAGS_turn2_new_tokens), others.size(), prompt_tokens,
        static_cast<long long>(host_blocks));
    std::printf("%-16s %9s %14s %13s %9s %10s %11s %10s %9s\n", "mode", "kv blocks",
                "turn-2 prompt", "from cache", "from host", "turn-2 TTFT s", "evictions",
                "offloaded", "identical");
    nlohmann::json crow = nlohmann::json::array();
    for (size_t m = 0; m < turn_modes.size(); ++m) {
      const ConversationRun& r = conv[m];
      std::printf("%-16s %9lld %14llu %12.1f%% %8.1f%% %13.3f %11llu %10llu %9s\n",
                  turn_modes[m].name, static_cast<long long>(turn_modes[m].kv_blocks),
                  static_cast<unsigned long long>(r.prompt_tokens),
                  100.0 * r.cached / r.prompt_tokens, 100.0 * r.from_host / r.prompt_tokens,
                  r.turn2.ttft_s, static_cast<unsigned long long>(r.evictions),
                  static_cast<unsigned long long>(r.offloaded), same2 ? "yes" : "NO");
      crow.push_back({{"mode", turn_modes[m].name},
                      {"window_release", turn_modes[m].release},
                      {"kv_blocks", turn_modes[m].kv_blocks},
                      {"kv_host_blocks", host_blocks},
                      {"turn2_prompt_tokens", r.prompt_tokens},
                      {"turn2_cached_tokens", r.cached},
                      {"turn2_host_tokens", r.from_host},
                      {"turn2_ttft_s", r.turn2.ttft_s},
                      {"turn2_tokens_per_s", r.turn2.tokens_per_s},
                      {"evictions", r.evictions},
                      {"offloaded_blocks", r.offloaded},
                      {"identical", same2}});
    }
    std::printf(
        "release vs keep at the full pool, turn 2: %.2fx the cached tokens, %.2fx TTFT, "
        "on %.2fx less KV pool\n",
        static_cast<double>(conv[0].cached) / std::max<uint64_t>(1, conv[1].cached),
        conv[0].turn2.ttft_s / conv[1].turn2.ttft_s,
        static_cast<double>(turn_modes[1].kv_blocks) / turn_modes[0].kv_blocks);
    conversation = {{"turn2_tokens", turn2},
                    {"turn2_new_tokens", absl::GetFlag(FLAGS_turn2_new_tokens)},
                    {"between_requests", others.size()},
                    {"rows", crow}};
  }

  if (const std::string path = absl::GetFlag(FLAGS_json); !path.empty()) {
    nlohmann::json j = bench::MachineJson(model, size, absl::GetFlag(FLAGS_threads));
    j["sliding_window"] = c.sliding_window;
    j["max_position_embeddings"] = c.max_position_embeddings;
    j["slots"] = slots;
    j["requests"] = prompts.size();
    j["prompt_tokens"] = prompt_tokens;
    j["max_new_tokens"] = new_tokens;
    j["prefill_chunk"] = absl::GetFlag(FLAGS_prefill_chunk);
    j["block_tokens"] = block_tokens;
    j["window_peak_blocks"] = peak;
    j["repeats"] = repeats;
    j["rows"] = rows;
    j["release_vs_keep_same_pool_tokens_per_s"] = vs_same;
    j["release_vs_keep_full_pool_tokens_per_s"] = vs_full;
    j["keep_full_pool_over_release_pool"] = memory;
    j["keep_full_peak_over_release_peak"] = peak_ratio;
    j["all_identical"] = identical;
    if (!conversation.is_null()) j["conversation"] = conversation;
    std::ofstream(path) << j.dump(2) << "\n";
  }
  return identical ? 0 : 1;
}

}  // namespace
}  // namespace kvrm

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return kvrm::Main();
}
