// KV-RM runtime costs and memory, measured side by side in one run:
//  1. descriptor build + commit per step (pager growth, run tables, epoch flip) at 16, 64 and
//     256 slots, against one decode step of the `small` model at 16 slots (must be < 1%);
//  2. the transfer planner on a fragmented pool: moves in, groups out, bytes per group;
//  3. reserved KV bytes per mode (static vs kvrm) over three workload families;
//  4. the prefix cache's hit rate on the Mooncake conversation trace by KV pool size (the
//     pager alone, at the trace's full lengths): how much of the trace's prefix reuse a pool of
//     each size keeps.
//
//   bazel run -c opt //bench:kv_runtime_bench -- [--json=FILE] [--model_dir=DIR] [--quick]
//       [--mooncake=TRACE.jsonl]
//
// 1 and 2 are Google Benchmark microbenchmarks; the decode step and the reserved-bytes
// simulation are timed/computed directly; everything is summarised in one table.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "benchmark/benchmark.h"
#include "common/logging.h"
#include "nlohmann/json.hpp"
#include "runtime/backend.h"
#include "runtime/cpu_backend.h"
#include "runtime/far_history.h"
#include "runtime/kv_pager.h"
#include "runtime/model_bundle.h"
#include "runtime/transfer_plan.h"
#include "tools/modelgen/model_writer.h"
#include "tools/replay/prompt.h"
#include "tools/replay/trace.h"

ABSL_FLAG(std::string, json, "", "also write the results to this JSON file");
ABSL_FLAG(std::string, model_dir, "", "where the small model is generated (default: a temp dir)");
ABSL_FLAG(bool, quick, false, "short runs (smoke test): tiny model, fewer steps");
ABSL_FLAG(int32_t, threads, 2, "threads for the decode step");
ABSL_FLAG(std::string, mooncake,
          "../shared/traces/mooncake-conversation/conversation_trace.jsonl",
          "Mooncake trace for the prefix-cache table (skipped when missing)");

namespace kvrm {
namespace {

constexpr int32_t kBlockTokens = 16;
constexpr int32_t kMaxContext = 4096;
constexpr int32_t kMaxRuns = 8;
constexpr int32_t kBlocksPerSlot = kMaxContext / kBlockTokens;
// K+V bytes per block of the `small` shape (12 layers, 4 KV heads, head_dim 64, f32 KV).
constexpr int64_t kSmallBytesPerBlock = int64_t{2} * 12 * 4 * 64 * 4 * kBlockTokens;

// ---- 1. descriptor build + commit -----------------------------------------------------------

// A pager and a descriptor pair with `slots` live requests whose histories grow one token per
// step; a request that reaches its length ends and a new one takes its slot (churn).
struct DescriptorWorld {
  explicit DescriptorWorld(int32_t slots) : rng(7) {
    KvPagerOptions o;
    o.num_slots = slots;
    o.device_blocks = int64_t{slots} * kBlocksPerSlot / 2;  // half the static budget
    o.host_blocks = 0;
    o.block_tokens = kBlockTokens;
    o.max_runs = kMaxRuns;
    o.max_blocks_per_slot = kBlocksPerSlot;
    o.bytes_per_block = kSmallBytesPerBlock;
    pager = std::make_unique<KvPager>(o);
    for (StepDescriptor& d : desc) d.Resize(slots, kMaxRuns);
    position.assign(slots, 0);
    target.assign(slots, 0);
    for (int32_t s = 0; s < slots; ++s) Admit(s);
  }
  void Admit(int32_t s) {
    const int32_t prompt = 64 + static_cast<int32_t>(rng() % 1200);
    position[s] = prompt;
    target[s] = prompt + 32 + static_cast<int32_t>(rng() % 600);
    CHECK_OK(pager->Grow(s, prompt + 1));
  }
  // One step: what Engine::BuildDescriptor + commit do for every decoding slot.
  void Step() {
    StepDescriptor& d = desc[committed ^ 1];
    for (int32_t s = 0; s < d.max_slots; ++s) {
      if (position[s] + 1 >= target[s]) {
        pager->Release(s);
        Admit(s);
      }
      if (!pager->Grow(s, position[s] + 1).ok()) {
        d.active[s] = 0;
        continue;
      }
      d.active[s] = 1;
      d.position[s] = position[s];
      d.token[s] = position[s] & 1023;
      d.num_runs[s] = pager->RunTable(s, d.SlotRuns(s));
      ++position[s];
    }
    committed ^= 1;  // the epoch flip
  }
  std::mt19937 rng;
  std::unique_ptr<KvPager> pager;
  StepDescriptor desc[2];
  int32_t committed = 0;
  std::vector<int32_t> position, target;
};

void BM_DescriptorBuildCommit(benchmark::State& state) {
  DescriptorWorld world(static_cast<int32_t>(state.range(0)));
  for (auto _ : state) {
    world.Step();
    benchmark::DoNotOptimize(world.desc[world.committed].runs.data());
  }
  state.SetLabel(absl::StrFormat("%d slots", state.range(0)));
}
BENCHMARK(BM_DescriptorBuildCommit)->Arg(16)->Arg(64)->Arg(256)->Unit(benchmark::kMicrosecond);

// ---- 2. transfer planner on a fragmented pool -------------------------------------------------

struct PlannerCase {
  std::vector<BlockMove> moves;
  int64_t runs_before = 0;
};

// A fragmented pool as a first-fit paged allocator leaves it under churn: each slot's 40 blocks
// lie in runs of 1-4 blocks scattered over the first half of the pool; compaction moves every
// slot into one contiguous extent of the second half. These are the moves the planner merges
// (the KV-RM pager itself rarely fragments this badly: it grows in place).
PlannerCase FragmentedCompaction(int32_t slots) {
  constexpr int32_t kBlocks = 40;
  const int32_t half = slots * kBlocks;
  std::mt19937 rng(5);
  // Cut [0, half) into runs of 1-4 blocks and deal them to slots at random.
  std::vector<std::pair<int32_t, int32_t>> runs;  // (start, length)
  for (int32_t b = 0; b < half;) {
    const int32_t len = std::min<int32_t>(1 + static_cast<int32_t>(rng() % 4), half - b);
    runs.emplace_back(b, len);
    b += len;
  }
  std::shuffle(runs.begin(), runs.end(), rng);
  std::vector<std::vector<int32_t>> blocks(slots);
  int32_t s = 0;
  for (const auto& [start, len] : runs) {
    while (static_cast<int32_t>(blocks[s].size()) >= kBlocks) s = (s + 1) % slots;
    for (int32_t i = 0; i < len && static_cast<int32_t>(blocks[s].size()) < kBlocks; ++i) {
      blocks[s].push_back(start + i);
    }
    s = (s + 1) % slots;
  }
  PlannerCase c;
  for (int32_t k = 0; k < slots; ++k) {
    for (size_t j = 0; j < blocks[k].size(); ++j) {
      if (j == 0 || blocks[k][j] != blocks[k][j - 1] + 1) ++c.runs_before;
      c.moves.push_back(BlockMove{KvTier::kDevice, blocks[k][j], KvTier::kDevice,
                                  static_cast<int32_t>(half + k * kBlocks + j)});
    }
  }
  return c;
}

void BM_PlanTransferGroups(benchmark::State& state) {
  const PlannerCase c = FragmentedCompaction(static_cast<int32_t>(state.range(0)));
  std::vector<BlockMove> moves;
  std::vector<TransferGroup> groups;
  moves.reserve(c.moves.size());
  groups.reserve(c.moves.size());
  for (auto _ : state) {
    moves = c.moves;
    groups.clear();
    PlanTransferGroups(absl::MakeSpan(moves), &groups);
    benchmark::DoNotOptimize(groups.data());
  }
  state.counters["runs_before"] = static_cast<double>(c.runs_before);
  state.counters["moves_in"] = static_cast<double>(c.moves.size());
  state.counters["groups_out"] = static_cast<double>(groups.size());
  state.counters["bytes_per_group"] =
      groups.empty() ? 0 : static_cast<double>(c.moves.size()) * kSmallBytesPerBlock / groups.size();
}
BENCHMARK(BM_PlanTransferGroups)->Arg(16)->Arg(64)->Unit(benchmark::kMicrosecond);

// Collects each benchmark's real time per iteration and counters.
class Collector : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) {
      Entry e;
      e.seconds = r.GetAdjustedRealTime() / 1e6;  // benchmarks report in microseconds
      for (const auto& [k, v] : r.counters) e.counters[k] = v.value;
      results[r.benchmark_name()] = e;
    }
  }
  struct Entry {
    double seconds = 0;
    std::map<std::string, double> counters;
  };
  std::map<std::string, Entry> results;
};

// ---- decode step of the small model ---------------------------------------------------------

double DecodeStepSeconds(bool quick, int32_t slots, int32_t context) {
  std::string dir = absl::GetFlag(FLAGS_model_dir);
  if (dir.empty()) dir = "/tmp/kvrm-bench-models";
  const std::string size = quick ? "tiny" : "small";
  dir += "/" + size + "-bf16";
  if (!std::ifstream(dir + "/config.json")) {
    modelgen::MakeModelOptions o;
    o.size = size;
    o.out_dir = dir;
    o.dtype = DType::kBF16;
    CHECK_OK(modelgen::MakeModel(o).status());
  }
  auto model = ModelBundle::Load(dir);
  CHECK_OK(model.status());
  const int32_t ctx = std::min(context, (*model)->config.max_position_embeddings - 8);
  const int32_t blocks_per_slot = (ctx + 8 + kBlockTokens - 1) / kBlockTokens;
  CpuBackendOptions bo;
  bo.kv_blocks = int64_t{slots} * blocks_per_slot;
  bo.kv_block_tokens = kBlockTokens;
  bo.max_slots = slots;
  bo.max_chunk_tokens = 16;
  bo.max_context = ctx + 8;
  bo.num_threads = absl::GetFlag(FLAGS_threads);
  auto backend = CpuBackend::Create((*model)->config, &(*model)->weights, bo);
  CHECK_OK(backend.status());
  StepDescriptor d;
  d.Resize(slots, kMaxRuns);
  for (int32_t s = 0; s < slots; ++s) {
    d.active[s] = 1;
    d.position[s] = ctx;
    d.token[s] = 100 + s;
    d.num_runs[s] = 1;
    d.SlotRuns(s)[0] = KvRun{s * blocks_per_slot, blocks_per_slot};
  }
  std::vector<float> logits(static_cast<size_t>(slots) * (*backend)->vocab_size());
  CHECK_OK((*backend)->Decode(d, logits.data()));  // warm-up
  const int steps = quick ? 2 : 10;
  double best = 1e9;
  for (int w = 0; w < 3; ++w) {
    const absl::Time t0 = absl::Now();
    for (int i = 0; i < steps; ++i) CHECK_OK((*backend)->Decode(d, logits.data()));
    best = std::min(best, absl::ToDoubleSeconds(absl::Now() - t0) / steps);
  }
  return best;
}

// ---- 3. reserved KV bytes per mode -----------------------------------------------------------

struct Family {
  std::string name;
  // Draws (prompt, output) lengths.
  std::function<std::pair<int32_t, int32_t>(std::mt19937&)> draw;
};

int32_t Uniform(std::mt19937& rng, int32_t lo, int32_t hi) {
  return lo + static_cast<int32_t>(rng() % static_cast<uint32_t>(hi - lo + 1));
}

std::vector<Family> Families() {
  return {
      {"short chat (prompt 32-512, output 32-512)",
       [](std::mt19937& r) { return std::make_pair(Uniform(r, 32, 512), Uniform(r, 32, 512)); }},
      {"mixed multi-hop (50% short, 30% 0.8-1.6k, 20% 2-3.6k prompts)",
       [](std::mt19937& r) {
         const int32_t k = Uniform(r, 0, 9);
         if (k < 5) return std::make_pair(Uniform(r, 64, 600), Uniform(r, 32, 300));
         if (k < 8) return std::make_pair(Uniform(r, 800, 1600), Uniform(r, 64, 400));
         return std::make_pair(Uniform(r, 2000, 3600), Uniform(r, 64, 400));
       }},
      {"long-document QA (prompt 1-2k, output 16-256)",
       [](std::mt19937& r) { return std::make_pair(Uniform(r, 1024, 2048), Uniform(r, 16, 256)); }},
  };
}

struct ReservedResult {
  double static_bytes = 0;
  double kvrm_mean_bytes = 0;
  double kvrm_peak_bytes = 0;
  double used_mean_bytes = 0;
};

// Every slot always busy: a request prefills (its prompt placed at once), decodes one token per
// step, ends, and the next request takes the slot. The pager is the engine's; static reserves
// max context per slot by construction.
//
// With `far` on (far-history summaries), each slot keeps its sink and window blocks and frees the
// distant ones after every step, as the engine does; the summary store (1/B of a full per-slot
// reservation, allocated at start-up) counts as reserved.
ReservedResult SimulateReserved(const Family& f, int32_t slots, int32_t steps,
                                FarHistoryShape far = {}) {
  KvPagerOptions o;
  o.num_slots = slots;
  o.device_blocks = int64_t{slots} * kBlocksPerSlot;  // the same budget as static
  o.block_tokens = kBlockTokens;
  o.max_runs = kMaxRuns;
  o.max_blocks_per_slot = kBlocksPerSlot;
  o.bytes_per_block = kSmallBytesPerBlock;
  KvPager pager(o);
  std::mt19937 rng(11);
  std::vector<int32_t> pos(slots), end(slots);
  auto admit = [&](int32_t s) {
    const auto [prompt, output] = f.draw(rng);
    pos[s] = prompt;
    end[s] = std::min(prompt + output, kMaxContext - 1);
    CHECK_OK(pager.Grow(s, prompt + 1));
    if (far.enabled()) pager.DropBlocks(s, far.sink_blocks, far.SummariesAt(prompt, kBlockTokens));
  };
  for (int32_t s = 0; s < slots; ++s) admit(s);
  ReservedResult r;
  r.static_bytes = static_cast<double>(slots) * kBlocksPerSlot * kSmallBytesPerBlock;
  for (int32_t t = 0; t < steps; ++t) {
    for (int32_t s = 0; s < slots; ++s) {
      if (++pos[s] >= end[s]) {
        pager.Release(s);
        admit(s);
      } else {
        CHECK_OK(pager.Grow(s, pos[s] + 1));
        if (far.enabled()) {
          pager.DropBlocks(s, far.sink_blocks, far.SummariesAt(pos[s], kBlockTokens));
        }
      }
    }
    const KvStats st = pager.Stats();
    const double store = far.enabled() ? r.static_bytes / kBlockTokens : 0;
    const double reserved = static_cast<double>(st.blocks_reserved) * st.bytes_per_block + store;
    r.kvrm_mean_bytes += reserved / steps;
    r.used_mean_bytes += static_cast<double>(st.blocks_used) * st.bytes_per_block / steps;
    r.kvrm_peak_bytes = std::max(r.kvrm_peak_bytes, reserved);
  }
  return r;
}

// ---- 4. prefix cache hit rate on a trace ---------------------------------------------------------

// Request `index`'s history, as the replay synthesizes it (replay::PromptSynthesizer): its prompt
// (512 tokens per hash id, derived from the id alone, then its own), then its outputs, its own
// (a request of another index, past every prompt's); `*prompt` is set to the prompt's length.
std::vector<int32_t> HistoryOf(const replay::PromptSynthesizer& synth,
                               const replay::TraceRequest& r, size_t index, size_t requests,
                               int64_t max_tokens, int64_t* prompt) {
  const int64_t total = std::min<int64_t>(r.input_tokens + r.output_tokens, max_tokens);
  replay::PlannedRequest p;
  p.index = static_cast<int>(index);
  p.input_tokens = static_cast<int>(std::min<int64_t>(r.input_tokens, total));
  p.hash_ids = r.hash_ids;
  p.hash_block_tokens = replay::kTraceHashBlockTokens;
  std::vector<int32_t> t = synth.Synthesize(p);
  *prompt = p.input_tokens;
  replay::PlannedRequest out;
  out.index = static_cast<int>(requests + index);
  out.input_tokens = static_cast<int>(total - p.input_tokens);
  if (out.input_tokens > 0) {
    const std::vector<int32_t> o = synth.Synthesize(out);
    t.insert(t.end(), o.begin(), o.end());
  }
  return t;
}

struct PrefixCacheResult {
  int64_t pool_tokens = 0;
  int64_t host_tokens = 0;
  int64_t host_hit_tokens = 0;  // of hit_tokens, copied back from the host tier
  uint64_t offloaded = 0;       // blocks copied to the host tier
  int64_t prompt_tokens = 0;
  int64_t hit_tokens = 0;
  uint64_t evictions = 0;
  int64_t refused = 0;  // did not fit beside the live ones
};

// The trace's requests in arrival order through the pager with its prefix cache, `live` of them
// at once (each ends when the live-th after it arrives), as the engine drives it: a request
// attaches the cached blocks that start its prompt (all but the block of its last prompt token),
// grows to its prompt, registers the prompt's full blocks (prefilled), grows to prompt + output,
// and registers its whole history when it ends. With `host_blocks`, evicted cached blocks are
// offloaded to a host tier of that size and matched ones come back (every copy done at once).
PrefixCacheResult SimulatePrefixCache(const std::vector<replay::TraceRequest>& trace,
                                      const replay::PromptSynthesizer& synth,
                                      int64_t pool_blocks, int32_t live, int64_t max_tokens,
                                      int64_t host_blocks = 0) {
  KvPagerOptions o;
  o.num_slots = live;
  o.device_blocks = pool_blocks;
  o.block_tokens = kBlockTokens;
  o.max_runs = kMaxRuns;
  o.max_blocks_per_slot = static_cast<int32_t>((max_tokens + kBlockTokens - 1) / kBlockTokens);
  o.bytes_per_block = kSmallBytesPerBlock;
  o.prefix_cache = true;
  o.host_blocks = host_blocks;
  o.host_prefix_cache = host_blocks > 0;
  KvPager pager(o);
  PrefixCacheResult r;
  r.pool_tokens = pool_blocks * kBlockTokens;
  r.host_tokens = host_blocks * kBlockTokens;
  std::vector<std::vector<int32_t>> history(live);
  std::vector<PrefixBlock> match;
  std::vector<BlockMove> moves;
  uint64_t fence = 0;
  auto copies_done = [&] {  // the transport runs the offloads, then the copies back
    pager.OffloadSubmitted(++fence);
    pager.RetireUpTo(++fence);
    moves.clear();
  };
  for (size_t i = 0; i < trace.size(); ++i) {
    const int32_t s = static_cast<int32_t>(i % live);
    if (!history[s].empty()) {  // the request that held this slot ends
      pager.RegisterPrefix(s, history[s]);
      pager.Release(s);
      history[s].clear();
    }
    int64_t prompt = 0;
    std::vector<int32_t> h = HistoryOf(synth, trace[i], i, trace.size(), max_tokens, &prompt);
    if (prompt <= 0) continue;
    pager.MatchPrefix(absl::MakeConstSpan(h).first(prompt),
                      static_cast<int32_t>((prompt - 1) / kBlockTokens), &match, 0,
                      host_blocks > 0);
    pager.ExpectTokens(s, static_cast<int64_t>(h.size()));  // as the engine: prompt + output
    const bool onboarded =
        pager.AttachPrefix(s, match, fence + 2, &moves) == static_cast<int32_t>(match.size());
    if (!onboarded || !pager.Grow(s, prompt).ok() ||
        !pager.Grow(s, static_cast<int64_t>(h.size())).ok()) {
      pager.Release(s);
      copies_done();
      ++r.refused;
      continue;
    }
    copies_done();
    pager.RegisterPrefix(s, absl::MakeConstSpan(h).first(prompt));
    r.prompt_tokens += prompt;
    int64_t from_host = 0;
    for (const PrefixBlock& b : match) from_host += b.tier == KvTier::kHost;
    r.hit_tokens += static_cast<int64_t>(match.size()) * kBlockTokens;
    r.host_hit_tokens += from_host * kBlockTokens;
    history[s] = std::move(h);
  }
  r.evictions = pager.evictions();
  r.offloaded = pager.offloaded_blocks();
  return r;
}

// What an unbounded cache would find: each request's leading hash ids seen before, 512 tokens
// each, up to the block of its last prompt token.
double UnboundedHitRate(const std::vector<replay::TraceRequest>& trace, int64_t max_tokens) {
  std::set<int64_t> seen;
  int64_t prompt = 0, hit = 0;
  for (const replay::TraceRequest& r : trace) {
    const int64_t p = std::min<int64_t>(r.input_tokens, max_tokens);
    int64_t k = 0;
    while (k < static_cast<int64_t>(r.hash_ids.size()) && seen.count(r.hash_ids[k])) ++k;
    seen.insert(r.hash_ids.begin(), r.hash_ids.end());
    prompt += p;
    hit += std::min(k * replay::kTraceHashBlockTokens, (p - 1) / kBlockTokens * kBlockTokens);
  }
  return prompt > 0 ? static_cast<double>(hit) / prompt : 0;
}

int Main(int argc, char** argv) {
  // Google Benchmark takes its --benchmark_* flags out of argv first; absl parses the rest.
  std::vector<char*> args(argv, argv + argc);
  std::string min_time = "--benchmark_min_time=0.5";
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--quick") min_time = "--benchmark_min_time=0.01";
  }
  args.insert(args.begin() + 1, min_time.data());
  int bargc = static_cast<int>(args.size());
  benchmark::Initialize(&bargc, args.data());
  absl::ParseCommandLine(bargc, args.data());
  const bool quick = absl::GetFlag(FLAGS_quick);
  Collector collector;
  benchmark::RunSpecifiedBenchmarks(&collector);

  nlohmann::json out;
  out["date"] = absl::FormatTime("%Y-%m-%d", absl::Now(), absl::UTCTimeZone());
  const double step16 = DecodeStepSeconds(quick, 16, 128);
  std::printf("\nDescriptor build + commit per step vs one decode step of the %s model "
              "(16 slots, context 128, bf16): %.3f ms\n",
              quick ? "tiny" : "small", step16 * 1e3);
  std::printf("%-8s %14s %16s\n", "slots", "descriptor us", "% of decode step");
  for (int32_t s : {16, 64, 256}) {
    const auto& e = collector.results[absl::StrFormat("BM_DescriptorBuildCommit/%d", s)];
    const double pct = 100.0 * e.seconds / step16;
    std::printf("%-8d %14.2f %15.3f%%\n", s, e.seconds * 1e6, pct);
    out["descriptor"].push_back({{"slots", s}, {"seconds", e.seconds}, {"percent_of_step16", pct}});
  }
  out["decode_step_seconds_16_slots"] = step16;

  std::printf("\nTransfer planner on a fragmented pool (every slot's 40 blocks in runs of 1-4, "
              "compacted to one extent)\n");
  std::printf("%-8s %10s %10s %16s %12s\n", "slots", "moves in", "groups", "bytes/group", "plan us");
  for (int32_t s : {16, 64}) {
    const auto& e = collector.results[absl::StrFormat("BM_PlanTransferGroups/%d", s)];
    std::printf("%-8d %10.0f %10.0f %16.0f %12.2f\n", s, e.counters.at("moves_in"),
                e.counters.at("groups_out"), e.counters.at("bytes_per_group"), e.seconds * 1e6);
    out["planner"].push_back({{"slots", s},
                              {"moves_in", e.counters.at("moves_in")},
                              {"groups_out", e.counters.at("groups_out")},
                              {"bytes_per_group", e.counters.at("bytes_per_group")},
                              {"seconds", e.seconds}});
  }

  const int32_t slots = 16;
  const int32_t steps = quick ? 2000 : 40000;
  std::printf("\nReserved KV memory at %d slots, max context %d (small shape, %lld KiB/block)\n",
              slots, kMaxContext, static_cast<long long>(kSmallBytesPerBlock / 1024));
  std::printf("%-66s %10s %12s %12s %10s\n", "workload family", "static MiB", "kvrm mean", "kvrm peak",
              "kvrm/static");
  for (const Family& f : Families()) {
    const ReservedResult r = SimulateReserved(f, slots, steps);
    const double ratio = r.kvrm_mean_bytes / r.static_bytes;
    std::printf("%-66s %10.0f %12.0f %12.0f %9.1f%%\n", f.name.c_str(), r.static_bytes / 1048576,
                r.kvrm_mean_bytes / 1048576, r.kvrm_peak_bytes / 1048576, 100 * ratio);
    out["reserved"].push_back({{"family", f.name},
                               {"static_bytes", r.static_bytes},
                               {"kvrm_mean_bytes", r.kvrm_mean_bytes},
                               {"kvrm_peak_bytes", r.kvrm_peak_bytes},
                               {"used_mean_bytes", r.used_mean_bytes},
                               {"kvrm_over_static", ratio}});
  }
  // The same families with far-history summaries on (an approximation: docs/runtime.md), at
  // kvrmd's default sinks and window.
  const FarHistoryShape far{1, 1024 / kBlockTokens};
  std::printf("\nWith --far_history (approximate attention; sinks 16, window 1024 tokens):\n");
  for (const Family& f : Families()) {
    const ReservedResult r = SimulateReserved(f, slots, steps, far);
    const double ratio = r.kvrm_mean_bytes / r.static_bytes;
    std::printf("%-66s %10.0f %12.0f %12.0f %9.1f%%\n", f.name.c_str(), r.static_bytes / 1048576,
                r.kvrm_mean_bytes / 1048576, r.kvrm_peak_bytes / 1048576, 100 * ratio);
    out["reserved_far_history"].push_back({{"family", f.name},
                                           {"static_bytes", r.static_bytes},
                                           {"kvrm_mean_bytes", r.kvrm_mean_bytes},
                                           {"kvrm_peak_bytes", r.kvrm_peak_bytes},
                                           {"kvrm_over_static", ratio}});
  }
  if (auto trace = replay::ReadTrace(absl::GetFlag(FLAGS_mooncake), replay::TraceFormat::kMooncake);
      !trace.ok()) {
    std::printf("\nPrefix cache: no trace (%s): skipped\n", trace.status().ToString().c_str());
  } else {
    if (quick && trace->size() > 400) trace->resize(400);
    constexpr int32_t kLive = 32;
    int64_t max_tokens = 0;
    for (const replay::TraceRequest& r : *trace) {
      max_tokens = std::max(max_tokens, r.input_tokens + r.output_tokens);
    }
    max_tokens = std::min<int64_t>(max_tokens, 131072);
    // The replay's synthesizer over a 128k vocabulary with no special ids.
    const auto synth = replay::PromptSynthesizer::Create(1 << 17, {}, 17);
    CHECK_OK(synth.status());
    const double unbounded = UnboundedHitRate(*trace, max_tokens);
    std::printf("\nPrefix cache on %s: %zu requests in arrival order, %d at once, full lengths "
                "(prompt tokens found in the cache; unbounded cache: %.1f%%)\n",
                absl::GetFlag(FLAGS_mooncake).c_str(), trace->size(), kLive, 100 * unbounded);
    std::printf("%-14s %-14s %12s %14s %14s %12s %12s %10s\n", "pool tokens", "host tokens",
                "hit rate", "of unbounded", "from the host", "evictions", "offloaded", "refused");
    out["prefix_cache"]["trace"] = absl::GetFlag(FLAGS_mooncake);
    out["prefix_cache"]["requests"] = trace->size();
    out["prefix_cache"]["live"] = kLive;
    out["prefix_cache"]["unbounded_hit_rate"] = unbounded;
    // (device pool, host tier) in tokens: device pools alone, then a 1M-token device pool
    // with host tiers that bring the total to the last two device-only pools'.
    const std::vector<std::pair<int64_t, int64_t>> pools =
        quick ? std::vector<std::pair<int64_t, int64_t>>{{1 << 19, 0}, {1 << 21, 0},
                                                         {1 << 19, 3 << 19}}
              : std::vector<std::pair<int64_t, int64_t>>{
                    {1 << 19, 0}, {1 << 20, 0}, {1 << 21, 0}, {1 << 22, 0}, {1 << 23, 0},
                    {1 << 20, 3 << 20}, {1 << 20, 7 << 20}};
    for (const auto& [tokens, host_tokens] : pools) {
      const PrefixCacheResult p = SimulatePrefixCache(*trace, *synth, tokens / kBlockTokens, kLive,
                                                      max_tokens, host_tokens / kBlockTokens);
      const double rate = p.prompt_tokens > 0 ? static_cast<double>(p.hit_tokens) / p.prompt_tokens : 0;
      const double host_share =
          p.hit_tokens > 0 ? static_cast<double>(p.host_hit_tokens) / p.hit_tokens : 0;
      std::printf("%-14lld %-14lld %11.1f%% %13.0f%% %13.0f%% %12llu %12llu %10lld\n",
                  static_cast<long long>(tokens), static_cast<long long>(host_tokens), 100 * rate,
                  unbounded > 0 ? 100 * rate / unbounded : 0, 100 * host_share,
                  static_cast<unsigned long long>(p.evictions),
                  static_cast<unsigned long long>(p.offloaded), static_cast<long long>(p.refused));
      out["prefix_cache"]["pools"].push_back({{"pool_tokens", tokens},
                                              {"host_tokens", host_tokens},
                                              {"prompt_tokens", p.prompt_tokens},
                                              {"hit_tokens", p.hit_tokens},
                                              {"host_hit_tokens", p.host_hit_tokens},
                                              {"hit_rate", rate},
                                              {"evictions", p.evictions},
                                              {"offloaded_blocks", p.offloaded},
                                              {"refused", p.refused}});
    }
  }
  const std::string json = absl::GetFlag(FLAGS_json);
  if (!json.empty()) std::ofstream(json) << out.dump(2) << "\n";
  return 0;
}

}  // namespace
}  // namespace kvrm

int main(int argc, char** argv) { return kvrm::Main(argc, argv); }
