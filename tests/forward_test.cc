// The CPU backend's forward pass against the float64 reference (tests/reference_llama.h), on the
// generated `tiny` model in f32, f16 and bf16: chunked prefill, decode, several slots in one step
// over fragmented run tables.
//
// Tolerance. The engine and the reference read the same stored weight values (both widen them
// exactly), so every difference comes from the engine keeping activations, dot products, norms,
// RoPE tables and softmax in f32: a relative error of a few 2^-24 * sqrt(n) per length-n reduction,
// grown through 4 layers. The tiny model's logits reach |ref| ~ 9; measured on every matmul path
// (generic, AVX2, AVX-512; 2 threads): max |diff| <= 8.1e-6, max |diff| / max(1, max |ref|) <=
// 1.3e-6, alike in f32, f16 and bf16. We allow
//   max |engine - ref| <= kRelTol * max(1, max |ref|),  kRelTol = 1e-5,
// about 8x the measured error (printed by each test; --test_output=all shows it), while a real
// mistake (interleaved instead of rotate_half RoPE, a wrong GQA head mapping) moves logits by
// O(1): checked by breaking the reference on purpose, 5 orders above. (The reference and the
// engine share RopeInverseFrequencies, so the llama3 scaling itself is checked against
// Transformers' values in model/config_test.cc, not here.)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "common/logging.h"
#include "common/testing/alloc_counter.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/matmul.h"
#include "runtime/backend.h"
#include "runtime/cpu_backend.h"
#include "runtime/kv_pool.h"
#include "runtime/model_bundle.h"
#include "runtime/tp_shard.h"
#include "model/gguf_quants.h"
#include "tests/reference_llama.h"
#include "tools/modelgen/model_writer.h"

namespace kvrm {
namespace {

constexpr double kRelTol = 1e-5;
// The avx512_bf16 path with bf16 weights rounds every linear layer's input to bf16 (as GPU bf16
// GEMMs do). The reference rounds at the same places, but an input that lands within f32 noise of
// a rounding boundary rounds the other way on one side, and such differences grow through the
// layers to the bf16 noise level: measured on the tiny model max |diff| / max(1, max |ref|) up to
// 5.8e-3. We allow 2e-2 there; a real mistake still moves logits by O(1) of a scale ~9.
constexpr double kRoundedRelTol = 2e-2;

// The tiny model of one dtype with its reference, generated once per test binary.
struct TinyModel {
  std::unique_ptr<ModelBundle> bundle;
  std::unique_ptr<ReferenceLlama> ref;
};

// Where GetTiny generates the `size` model in `dtype`.
std::string TinyDir(DType dtype, const std::string& size) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return (std::filesystem::path(tmp != nullptr ? tmp : "/tmp") /
          absl::StrCat(size, "_", std::string(DTypeName(dtype))))
      .string();
}

// `size`: a modelgen shape name (tiny, or tiny-qwen2 / tiny-qwen3 / tiny-phi3 / tiny-granite /
// tiny-biased for the other architectures).
const TinyModel& GetTiny(DType dtype, const std::string& size = "tiny") {
  static auto* models = new std::map<std::pair<DType, std::string>, TinyModel>();
  auto it = models->find({dtype, size});
  if (it != models->end()) return it->second;
  modelgen::MakeModelOptions options;
  options.size = size;
  options.dtype = dtype;
  options.out_dir = TinyDir(dtype, size);
  const auto summary = modelgen::MakeModel(options);
  CHECK_OK(summary.status());
  auto bundle = ModelBundle::Load(options.out_dir);
  CHECK_OK(bundle.status());
  auto ref = ReferenceLlama::Create((*bundle)->config, *(*bundle)->files);
  CHECK_OK(ref.status());
  TinyModel& m = (*models)[{dtype, size}];
  m.bundle = std::move(*bundle);
  m.ref = std::move(*ref);
  return m;
}

// Worst error seen by a test, printed at its end.
struct ErrorStats {
  double rel_tol = kRelTol;
  double max_abs = 0;      // max |engine - ref| over all compared logits
  double max_scaled = 0;   // max of max|diff| / max(1, max|ref|) over compared rows
  double max_ref = 0;      // largest |ref| logit seen
  int rows = 0;            // logit rows compared
  int argmax_checked = 0;  // rows whose top-2 gap made the argmax check meaningful
  std::vector<double> scaled;  // each row's max|diff| / max(1, max|ref|)

  double Median() const {
    if (scaled.empty()) return 0;
    std::vector<double> v = scaled;
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  }

  void Print(const std::string& what) const {
    std::printf(
        "[%s] %d logit rows: max|diff| %.3g, max|diff|/max(1,max|ref|) %.3g (tol %.1g), "
        "max|ref| %.3g, argmax checked on %d rows\n",
        what.c_str(), rows, max_abs, max_scaled, rel_tol, max_ref, argmax_checked);
  }
};

int32_t ArgMax(const float* x, int64_t n) {
  int32_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (x[i] > x[best]) best = static_cast<int32_t>(i);
  }
  return best;
}

// Checks one engine logit row against the reference row: the tolerance, and the greedy argmax
// where the reference's top-2 gap exceeds twice the tolerance (so no in-tolerance error may
// legitimately flip it).
void ExpectLogitsClose(const float* got, const std::vector<double>& ref, const std::string& where,
                       ErrorStats* stats) {
  const int64_t n = static_cast<int64_t>(ref.size());
  double max_ref = 0, max_diff = 0;
  int32_t top1 = 0, top2 = -1;
  for (int64_t i = 0; i < n; ++i) {
    max_ref = std::max(max_ref, std::abs(ref[i]));
    const double diff = std::abs(static_cast<double>(got[i]) - ref[i]);
    // NaN compares false: make it count as an error.
    max_diff =
        std::max(max_diff, std::isnan(diff) ? std::numeric_limits<double>::infinity() : diff);
    if (ref[i] > ref[top1]) {
      top2 = top1;
      top1 = static_cast<int32_t>(i);
    } else if (i != top1 && (top2 < 0 || ref[i] > ref[top2])) {
      top2 = static_cast<int32_t>(i);
    }
  }
  const double tol = stats->rel_tol * std::max(1.0, max_ref);
  EXPECT_LE(max_diff, tol) << where;
  stats->max_abs = std::max(stats->max_abs, max_diff);
  stats->max_scaled = std::max(stats->max_scaled, max_diff / std::max(1.0, max_ref));
  stats->scaled.push_back(max_diff / std::max(1.0, max_ref));
  stats->max_ref = std::max(stats->max_ref, max_ref);
  ++stats->rows;
  if (ref[top1] - ref[top2] > 2 * tol) {
    EXPECT_EQ(ArgMax(got, n), top1) << where;
    ++stats->argmax_checked;
  }
}

std::vector<int32_t> RandomTokens(std::mt19937* rng, int n, int vocab) {
  std::uniform_int_distribution<int32_t> dist(0, vocab - 1);
  std::vector<int32_t> tokens(n);
  for (int32_t& t : tokens) t = dist(*rng);
  return tokens;
}

// A backend with its own pool.
struct Engine {
  std::unique_ptr<CpuBackend> backend;
};

Engine MakeEngine(const TinyModel& model, int32_t block_tokens, int64_t num_blocks,
                  int32_t max_slots, int32_t max_chunk_tokens, int32_t tensor_parallel = 1,
                  bool weight_panels = true, DType kv_dtype = DType::kF32,
                  WeightFormat quantization = WeightFormat::kDense,
                  const LlamaWeights* weights = nullptr) {
  const LlamaConfig& c = model.bundle->config;
  Engine e;
  CpuBackendOptions options;
  options.kv_blocks = num_blocks;
  options.kv_block_tokens = block_tokens;
  options.max_slots = max_slots;
  options.max_chunk_tokens = max_chunk_tokens;
  options.max_context = 256;
  options.num_threads = 2;
  options.tensor_parallel = tensor_parallel;
  options.weight_panels = weight_panels;
  options.kv_dtype = kv_dtype;
  options.quantization = quantization;
  auto backend =
      CpuBackend::Create(c, weights != nullptr ? weights : &model.bundle->weights, options);
  CHECK_OK(backend.status());
  e.backend = std::move(*backend);
  return e;
}

// A test's tolerance on `isa` with `dtype` weights: the bf16-rounding one where the path rounds
// linear inputs to bf16.
ErrorStats StatsFor(CpuIsa isa, DType dtype) {
  ErrorStats stats;
  if (MatMulRoundsActivations(isa, dtype)) stats.rel_tol = kRoundedRelTol;
  return stats;
}

// Every weight dtype on every matmul path this processor runs.
class ForwardTest : public testing::TestWithParam<std::tuple<DType, CpuIsa>> {
 protected:
  void SetUp() override {
    SetActiveCpuIsa(isa());
    // The reference rounds linear-layer inputs to bf16 exactly where this path does.
    GetTiny(dtype()).ref->set_bf16_linear_inputs(MatMulRoundsActivations(isa(), dtype()));
  }
  DType dtype() const { return std::get<0>(GetParam()); }
  CpuIsa isa() const { return std::get<1>(GetParam()); }
  std::string Name() const {
    return absl::StrCat(std::string(DTypeName(dtype())), " ", std::string(CpuIsaName(isa())));
  }
  ErrorStats Stats() const { return StatsFor(isa(), dtype()); }
};

// One slot: prefill in chunks (checking the logits after every chunk), then teacher-forced decode
// steps, each compared with the reference over the same token sequence.
// `ref`: the reference to compare with (null: the model's own); `quantization` the backend's.
// `weights`: the model's with other KV cache scales (null: its own).
void ChunkedPrefillThenDecode(const TinyModel& model, DType kv_dtype, ErrorStats* stats,
                              const ReferenceLlama* ref_model = nullptr,
                              WeightFormat quantization = WeightFormat::kDense,
                              const LlamaWeights* weights = nullptr) {
  if (ref_model == nullptr) ref_model = model.ref.get();
  const int32_t vocab = model.bundle->config.vocab_size;
  constexpr int kDecodeSteps = 6;
  constexpr int32_t kBlockTokens = 16;
  // The slot's history: 11 blocks from block 3, so physical and logical positions differ. The
  // longest sequence (156) passes original_max_position_embeddings (128), where llama3 scaling
  // matters most.
  const KvRun runs[] = {{3, 11}};
  Engine engine =
      MakeEngine(model, kBlockTokens, 16, /*max_slots=*/2, /*max_chunk_tokens=*/160,
                 /*tensor_parallel=*/1, /*weight_panels=*/true, kv_dtype, quantization, weights);
  std::mt19937 rng(1234);
  std::vector<float> logits(2 * vocab);
  for (int prompt_len : {1, 7, 33, 100, 150}) {
    const std::vector<int32_t> seq = RandomTokens(&rng, prompt_len + kDecodeSteps, vocab);
    const std::vector<std::vector<double>> ref = ref_model->Forward(seq);
    for (int chunk : {16, 64, prompt_len}) {
      const std::string where = absl::StrCat("prompt ", prompt_len, " chunk ", chunk);
      for (int start = 0; start < prompt_len; start += chunk) {
        const int n = std::min(chunk, prompt_len - start);
        PrefillChunk pc{0, start, absl::MakeConstSpan(seq).subspan(start, n), runs, 1};
        std::fill(logits.begin(), logits.end(), NAN);
        ASSERT_TRUE(engine.backend->Prefill(pc, logits.data()).ok());
        ExpectLogitsClose(logits.data(), ref[start + n - 1],
                          absl::StrCat(where, " prefill to ", start + n), stats);
      }
      StepDescriptor step;
      step.Resize(2, 4);
      step.active[1] = 1;  // the other row of the step, so the batch is never trivially 1
      step.position[1] = 0;
      step.token[1] = 5;
      step.num_runs[1] = 1;
      step.SlotRuns(1)[0] = KvRun{0, 1};  // blocks 0..2 are not slot 0's
      step.active[0] = 1;
      step.num_runs[0] = 1;
      step.SlotRuns(0)[0] = runs[0];
      for (int k = 0; k < kDecodeSteps; ++k) {
        const int pos = prompt_len + k;
        step.position[0] = pos;
        step.token[0] = seq[pos];
        std::fill(logits.begin(), logits.end(), NAN);
        ASSERT_TRUE(engine.backend->Decode(step, logits.data()).ok());
        ExpectLogitsClose(logits.data(), ref[pos], absl::StrCat(where, " decode at ", pos), stats);
      }
    }
  }
}

TEST_P(ForwardTest, ChunkedPrefillThenDecodeMatchesReference) {
  ErrorStats stats = Stats();
  ChunkedPrefillThenDecode(GetTiny(dtype()), DType::kF32, &stats);
  stats.Print(absl::StrCat("single slot ", Name()));
}

// A bf16 KV pool (--kv_dtype=bf16) against the reference that rounds every key and value to
// bf16 where the pool stores them; on the best path, each weight dtype. The engine computes K
// and V in f32 and the reference in double, so an element near a rounding boundary can round the
// other way (measured: 1.1e-4 of the logit scale with f32 weights, held to 1e-3; with bf16
// weights the bf16 path's own tolerance).
TEST(Bf16KvTest, ChunkedPrefillThenDecodeMatchesRoundedReference) {
  SetActiveCpuIsa(AvailableCpuIsas().back());
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const TinyModel& model = GetTiny(dtype);
    model.ref->set_bf16_linear_inputs(MatMulRoundsActivations(ActiveCpuIsa(), dtype));
    model.ref->set_bf16_kv(true);
    ErrorStats stats;
    stats.rel_tol = MatMulRoundsActivations(ActiveCpuIsa(), dtype) ? kRoundedRelTol : 1e-3;
    ChunkedPrefillThenDecode(model, DType::kBF16, &stats);
    model.ref->set_bf16_kv(false);
    stats.Print(absl::StrCat("bf16 KV, ", std::string(DTypeName(dtype)), " weights"));
  }
}

// One slot of the multi-slot scenario.
struct SlotPlan {
  int prompt_len;
  std::vector<KvRun> runs;
  bool skip_odd_steps;  // inactive on odd decode steps: the step's shape holds an idle row
};

// Everything a scenario run produced, per slot, in order.
struct ScenarioResult {
  std::vector<std::vector<int32_t>> tokens;             // [slot] the sequence it consumed
  std::vector<std::vector<int32_t>> logit_positions;    // [slot][i] position of logits i
  std::vector<std::vector<std::vector<float>>> logits;  // [slot][i][vocab]
};

constexpr int kMultiDecodeSteps = 8;

// Prefills every slot in chunks of 16, round-robin across slots, then runs decode steps with all
// slots in one descriptor. Token streams come from a fixed seed, so two runs with different
// layouts consume identical tokens.
ScenarioResult RunScenario(const TinyModel& model, const std::vector<SlotPlan>& plans,
                           int64_t num_blocks, int32_t tensor_parallel = 1,
                           WeightFormat quantization = WeightFormat::kDense) {
  constexpr int32_t kBlockTokens = 8, kChunk = 16, kMaxRuns = 6;
  const int32_t slots = static_cast<int32_t>(plans.size());
  const int32_t vocab = model.bundle->config.vocab_size;
  Engine engine = MakeEngine(model, kBlockTokens, num_blocks, slots, kChunk, tensor_parallel,
                             /*weight_panels=*/true, DType::kF32, quantization);
  std::mt19937 rng(99);
  ScenarioResult r;
  r.tokens.resize(slots);
  r.logit_positions.resize(slots);
  r.logits.resize(slots);
  for (int32_t s = 0; s < slots; ++s) {
    r.tokens[s] = RandomTokens(&rng, plans[s].prompt_len + kMultiDecodeSteps, vocab);
  }
  std::vector<float> logits(static_cast<size_t>(slots) * vocab);
  std::vector<int> prefilled(slots, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int32_t s = 0; s < slots; ++s) {
      const int start = prefilled[s];
      const int n = std::min(kChunk, plans[s].prompt_len - start);
      if (n <= 0) continue;
      PrefillChunk pc{s, start, absl::MakeConstSpan(r.tokens[s]).subspan(start, n),
                      plans[s].runs.data(), static_cast<int32_t>(plans[s].runs.size())};
      CHECK_OK(engine.backend->Prefill(pc, logits.data()));
      r.logit_positions[s].push_back(start + n - 1);
      r.logits[s].emplace_back(logits.begin(), logits.begin() + vocab);
      prefilled[s] += n;
      progress = true;
    }
  }
  StepDescriptor step;
  step.Resize(slots, kMaxRuns);
  std::vector<int> position(prefilled);
  for (int k = 0; k < kMultiDecodeSteps; ++k) {
    for (int32_t s = 0; s < slots; ++s) {
      step.active[s] = !(plans[s].skip_odd_steps && k % 2 == 1);
      step.position[s] = position[s];
      step.token[s] = r.tokens[s][position[s]];
      step.num_runs[s] = static_cast<int32_t>(plans[s].runs.size());
      for (size_t i = 0; i < plans[s].runs.size(); ++i) step.SlotRuns(s)[i] = plans[s].runs[i];
    }
    std::fill(logits.begin(), logits.end(), NAN);
    CHECK_OK(engine.backend->Decode(step, logits.data()));
    for (int32_t s = 0; s < slots; ++s) {
      const float* row = logits.data() + static_cast<size_t>(s) * vocab;
      if (!step.active[s]) {
        // An idle row's logits are left alone.
        EXPECT_TRUE(std::isnan(row[0]) && std::isnan(row[vocab - 1])) << "slot " << s;
        continue;
      }
      r.logit_positions[s].push_back(position[s]);
      r.logits[s].emplace_back(row, row + vocab);
      ++position[s];
    }
  }
  for (int32_t s = 0; s < slots; ++s) r.tokens[s].resize(position[s]);
  return r;
}

// Four slots at different positions, in disjoint parts of an 8-token-block pool; slot 1's history
// is fragmented over four runs out of block order.
std::vector<SlotPlan> FragmentedPlans() {
  return {
      {5, {{30, 2}}, false},                            // 13 tokens max, 16 room
      {40, {{9, 2}, {2, 3}, {20, 1}, {24, 2}}, false},  // 48 max, 64 room
      {23, {{12, 5}}, true},                            // 27 max, 40 room
      {1, {{17, 1}, {6, 2}}, false},                    // 9 max, 24 room
  };
}

// An FP8 KV pool (--kv_dtype=fp8 and fp8_e5m2), f32 weights on the best path, against the
// reference that rounds every key and value to the FP8 code the pool stores: with scales 1 (a
// checkpoint without k_scale / v_scale) and with static per-layer scales calibrated as
// llm-compressor makes them (amax / largest finite value, of each layer's keys and values over
// three other 150-token sequences).
// Tolerance: the engine computes K and V in f32, the reference in double, and now and then an
// element lies so near the midpoint of two codes that the two round it apart: one code step is
// 6 % (E4M3) or 12 % (E5M2) of the element, and every later row of that sequence carries it
// (measured: worst row 1.1e-2 of the logit scale, E5M2 calibrated; held to 2e-2). Rows with no
// such element before them agree to f32 precision: the median row, measured <= 6.7e-7, is held
// to 1e-5, which a kernel bug (a scale applied twice, a unit missed) would break on every row.
// What FP8 itself costs, against the unrounded reference, is printed ("vs exact"; measured on
// this random-weight model: worst row 8 % of the logit scale E4M3, 17 % E5M2) and held only to
// 0.25, a bound for gross errors: that is the format, not the kernels.
TEST(Fp8KvTest, ChunkedPrefillThenDecodeMatchesRoundedReference) {
  SetActiveCpuIsa(AvailableCpuIsas().back());
  const TinyModel& model = GetTiny(DType::kF32);
  model.ref->set_bf16_linear_inputs(false);
  model.ref->reset_kv_amax();
  std::mt19937 rng(4321);
  for (int i = 0; i < 3; ++i) {
    model.ref->Forward(RandomTokens(&rng, 150, model.bundle->config.vocab_size));
  }
  const std::vector<std::pair<double, double>> amax = model.ref->kv_amax();
  ASSERT_EQ(static_cast<int32_t>(amax.size()), model.bundle->config.num_hidden_layers);
  for (DType kv : {DType::kF8E4M3, DType::kF8E5M2}) {
    const double largest = kv == DType::kF8E4M3 ? 448 : 57344;
    LlamaWeights calibrated = model.bundle->weights;
    std::vector<std::pair<double, double>> scales;
    for (size_t l = 0; l < amax.size(); ++l) {
      const float ks = static_cast<float>(amax[l].first / largest);
      const float vs = static_cast<float>(amax[l].second / largest);
      calibrated.layers[l].k_cache_scale = ks;
      calibrated.layers[l].v_cache_scale = vs;
      scales.emplace_back(ks, vs);
    }
    for (bool with_scales : {false, true}) {
      const std::string name = absl::StrCat(std::string(DTypeName(kv)), " KV, ",
                                            with_scales ? "calibrated" : "unit", " scales");
      const LlamaWeights* weights = with_scales ? &calibrated : nullptr;
      model.ref->set_kv_dtype(kv, with_scales ? scales : std::vector<std::pair<double, double>>{});
      ErrorStats rounded;
      rounded.rel_tol = 2e-2;
      ChunkedPrefillThenDecode(model, kv, &rounded, nullptr, WeightFormat::kDense, weights);
      rounded.Print(name);
      std::printf("[%s] median row %.3g (tol 1e-5)\n", name.c_str(), rounded.Median());
      EXPECT_LE(rounded.Median(), 1e-5) << name;
      model.ref->set_kv_dtype(DType::kF32);
      ErrorStats exact;
      exact.rel_tol = 0.25;
      ChunkedPrefillThenDecode(model, kv, &exact, nullptr, WeightFormat::kDense, weights);
      exact.Print(name + " vs exact");
      std::printf("[%s vs exact] median row %.3g\n", name.c_str(), exact.Median());
    }
  }
}

TEST_P(ForwardTest, MultiSlotDecodeMatchesPerSlotReference) {
  const TinyModel& model = GetTiny(dtype());
  const ScenarioResult r = RunScenario(model, FragmentedPlans(), /*num_blocks=*/32);
  ErrorStats stats = Stats();
  for (size_t s = 0; s < r.tokens.size(); ++s) {
    const std::vector<std::vector<double>> ref = model.ref->Forward(r.tokens[s]);
    ASSERT_FALSE(r.logits[s].empty());
    for (size_t i = 0; i < r.logits[s].size(); ++i) {
      const int pos = r.logit_positions[s][i];
      ExpectLogitsClose(r.logits[s][i].data(), ref[pos],
                        absl::StrCat("slot ", s, " position ", pos), &stats);
    }
  }
  stats.Print(absl::StrCat("multi slot ", Name()));
}

// Where a history lives in the pool must not change a bit of the result: attention walks the
// runs in logical order, so a fragmented table and a contiguous one sum in the same order.
TEST_P(ForwardTest, FragmentedLayoutIsBitIdenticalToContiguous) {
  const TinyModel& model = GetTiny(dtype());
  std::vector<SlotPlan> fragmented = FragmentedPlans();
  std::vector<SlotPlan> contiguous = fragmented;
  contiguous[1].runs = {{40, 8}};
  contiguous[3].runs = {{33, 3}};
  const ScenarioResult a = RunScenario(model, fragmented, /*num_blocks=*/48);
  const ScenarioResult b = RunScenario(model, contiguous, /*num_blocks=*/48);
  ASSERT_EQ(a.tokens, b.tokens);
  ASSERT_EQ(a.logit_positions, b.logit_positions);
  for (size_t s = 0; s < a.logits.size(); ++s) {
    for (size_t i = 0; i < a.logits[s].size(); ++i) {
      EXPECT_TRUE(a.logits[s][i] == b.logits[s][i])
          << "slot " << s << " position " << a.logit_positions[s][i];
    }
  }
}

// The fragmented scenario on one and on two ranks: two ranks against the reference and against
// one rank, each within `stats`' tolerance (printed under `name`).
// `with_reference` false: against one rank only (see RoutingFlipsUnderRounding).
void TwoRanksMatchReferenceAndOneRank(const TinyModel& model, const ErrorStats& stats,
                                      const std::string& name, bool with_reference = true) {
  const ScenarioResult one = RunScenario(model, FragmentedPlans(), /*num_blocks=*/32, 1);
  const ScenarioResult two = RunScenario(model, FragmentedPlans(), /*num_blocks=*/32, 2);
  ASSERT_EQ(one.tokens, two.tokens);
  ASSERT_EQ(one.logit_positions, two.logit_positions);
  ErrorStats vs_ref = stats, vs_one = stats;
  for (size_t s = 0; s < two.tokens.size(); ++s) {
    const std::vector<std::vector<double>> ref =
        with_reference ? model.ref->Forward(two.tokens[s]) : std::vector<std::vector<double>>{};
    for (size_t i = 0; i < two.logits[s].size(); ++i) {
      const std::string where = absl::StrCat("slot ", s, " position ", two.logit_positions[s][i]);
      if (with_reference) {
        ExpectLogitsClose(two.logits[s][i].data(), ref[two.logit_positions[s][i]], where, &vs_ref);
      }
      const std::vector<double> one_row(one.logits[s][i].begin(), one.logits[s][i].end());
      ExpectLogitsClose(two.logits[s][i].data(), one_row, where + " vs one rank", &vs_one);
    }
  }
  if (with_reference) vs_ref.Print(absl::StrCat("tp=2 vs reference ", name));
  vs_one.Print(absl::StrCat("tp=2 vs tp=1 ", name));
}

// Two tensor-parallel ranks (Megatron shards, KV heads split over two pools, in-process
// all-reduce) give the reference's logits within the same tolerance, and the single-rank logits
// within it too: only the summation order of O and down differs (two partial sums added).
TEST_P(ForwardTest, TwoRanksMatchReferenceAndOneRank) {
  TwoRanksMatchReferenceAndOneRank(GetTiny(dtype()), Stats(), Name());
}

// A prefill chunk riding with a decode step in one pass (DecodeWithChunk, --fuse_prefill) gives
// every bit that the chunk then the step give apart: the decode rows' logits, the chunk's last
// logits, and the whole KV pool of every rank. Slots 0-2 decode (slot 2 idle on odd steps) while
// slot 3's 40-token prompt goes through in chunks of 16, 16 and 8 (logits only after the last),
// in fragmented run tables; then all four decode. One and two ranks.
TEST_P(ForwardTest, MixedStepIsBitIdenticalToChunkThenStep) {
  const TinyModel& model = GetTiny(dtype());
  const int32_t vocab = model.bundle->config.vocab_size;
  constexpr int32_t kBlockTokens = 8, kChunk = 16, kMaxRuns = 6, kSlots = 4, kSteps = 5;
  const std::vector<SlotPlan> plans = {
      {5, {{30, 2}}, false},
      {23, {{9, 2}, {2, 3}, {20, 1}}, false},
      {11, {{12, 3}, {26, 1}}, true},
      {40, {{15, 2}, {0, 2}, {17, 3}, {24, 2}}, false},
  };
  for (int32_t tp : {1, 2}) {
    SCOPED_TRACE(absl::StrCat(Name(), " tp=", tp));
    Engine apart = MakeEngine(model, kBlockTokens, 32, kSlots, kChunk, tp);
    Engine mixed = MakeEngine(model, kBlockTokens, 32, kSlots, kChunk, tp);
    std::mt19937 rng(7);
    std::vector<std::vector<int32_t>> tokens(kSlots);
    for (int32_t s = 0; s < kSlots; ++s) {
      tokens[s] = RandomTokens(&rng, plans[s].prompt_len + 2 * kSteps, vocab);
    }
    auto chunk_of = [&](int32_t s, int32_t start, int32_t n) {
      return PrefillChunk{s, start, absl::MakeConstSpan(tokens[s]).subspan(start, n),
                          plans[s].runs.data(), static_cast<int32_t>(plans[s].runs.size())};
    };
    std::vector<float> logits_a(kSlots * vocab), logits_b(kSlots * vocab);
    std::vector<float> last_a(vocab), last_b(vocab);
    // Slots 0-2 prefilled alike in both.
    std::vector<int32_t> position(kSlots, 0);
    for (int32_t s = 0; s < 3; ++s) {
      for (; position[s] < plans[s].prompt_len; position[s] += kChunk) {
        const PrefillChunk pc =
            chunk_of(s, position[s], std::min(kChunk, plans[s].prompt_len - position[s]));
        ASSERT_TRUE(apart.backend->Prefill(pc, nullptr).ok());
        ASSERT_TRUE(mixed.backend->Prefill(pc, nullptr).ok());
      }
      position[s] = plans[s].prompt_len;
    }
    StepDescriptor step;
    step.Resize(kSlots, kMaxRuns);
    for (int32_t s = 0; s < kSlots; ++s) {
      step.num_runs[s] = static_cast<int32_t>(plans[s].runs.size());
      for (size_t i = 0; i < plans[s].runs.size(); ++i) step.SlotRuns(s)[i] = plans[s].runs[i];
    }
    int32_t prefilled = 0, mixed_steps = 0;
    for (int k = 0; k < 2 * kSteps; ++k) {
      const bool chunk = prefilled < plans[3].prompt_len;
      for (int32_t s = 0; s < kSlots; ++s) {
        step.active[s] = (s < 3 || !chunk) && !(plans[s].skip_odd_steps && k % 2 == 1);
        step.position[s] = position[s];
        step.token[s] = tokens[s][position[s]];
      }
      std::fill(logits_a.begin(), logits_a.end(), NAN);
      std::fill(logits_b.begin(), logits_b.end(), NAN);
      if (chunk) {
        const int32_t n = std::min(kChunk, plans[3].prompt_len - prefilled);
        const bool last = prefilled + n == plans[3].prompt_len;
        const PrefillChunk pc = chunk_of(3, prefilled, n);
        ASSERT_TRUE(apart.backend->Prefill(pc, last ? last_a.data() : nullptr).ok());
        ASSERT_TRUE(apart.backend->Decode(step, logits_a.data()).ok());
        ASSERT_TRUE(mixed.backend
                        ->DecodeWithChunk(pc, last ? last_b.data() : nullptr, step,
                                          logits_b.data())
                        .ok());
        if (last) EXPECT_TRUE(last_a == last_b) << "chunk logits, step " << k;
        prefilled += n;
        position[3] = prefilled;
        ++mixed_steps;
      } else {
        ASSERT_TRUE(apart.backend->Decode(step, logits_a.data()).ok());
        ASSERT_TRUE(mixed.backend->Decode(step, logits_b.data()).ok());
      }
      for (int32_t s = 0; s < kSlots; ++s) {
        if (!step.active[s]) continue;
        const size_t at = static_cast<size_t>(s) * vocab;
        EXPECT_TRUE(std::equal(logits_a.begin() + at, logits_a.begin() + at + vocab,
                               logits_b.begin() + at))
            << "slot " << s << ", step " << k;
        EXPECT_FALSE(std::isnan(logits_b[at]));
        ++position[s];
      }
      // Idle rows (and the prefilling slot's) are left alone.
      EXPECT_TRUE(std::isnan(logits_b[2 * vocab]) == !step.active[2]);
      if (chunk) EXPECT_TRUE(std::isnan(logits_b[3 * vocab]));
    }
    EXPECT_EQ(mixed_steps, 3);
    // Layer 0's K is the start of each pool ([layers][K|V]...): the whole pools are equal.
    for (int32_t r = 0; r < tp; ++r) {
      const KvPool* a = apart.backend->kv_pool(r);
      const KvPool* b = mixed.backend->kv_pool(r);
      ASSERT_EQ(a->bytes(), b->bytes());
      EXPECT_EQ(std::memcmp(a->Layer(0).k, b->Layer(0).k, a->bytes()), 0) << "rank " << r;
    }
  }
}

// Several prompts' chunks in one pass (PrefillChunks, --max_prefills_per_step) give every bit
// that each chunk's own Prefill, then the decode step, give apart: each chunk's logits (the last
// row's; every row's for a prompt being scored), an embedding's summed final-norm rows, the
// decode rows' logits, and the whole KV pool of every rank. Slots 0 and 1 decode while slots 2-4
// prefill prompts of 37, 9 and 21 tokens in fragmented run tables (a 24-token budget a pass,
// split first come first served), then the rest with no decode rows; one and two ranks.
TEST_P(ForwardTest, SeveralChunksInOnePassAreBitIdenticalToEachApart) {
  const TinyModel& model = GetTiny(dtype());
  const int32_t vocab = model.bundle->config.vocab_size;
  const int32_t hidden = model.bundle->config.hidden_size;
  constexpr int32_t kBlockTokens = 8, kBudget = 24, kMaxRuns = 6, kSlots = 5;
  const std::vector<SlotPlan> plans = {
      {6, {{30, 2}}, false},
      {12, {{9, 2}}, false},
      {37, {{12, 3}, {26, 1}, {2, 2}}, false},
      {9, {{15, 1}, {0, 1}}, false},
      {21, {{17, 2}, {24, 2}}, false},
  };
  // Slot 3's prompt is scored (every row's logits), slot 4's is an embedding (rows 1..20 summed).
  constexpr int32_t kScored = 3, kEmbedded = 4, kPooledFrom = 1;
  for (int32_t tp : {1, 2}) {
    SCOPED_TRACE(absl::StrCat(Name(), " tp=", tp));
    Engine apart = MakeEngine(model, kBlockTokens, 40, kSlots, kBudget, tp);
    Engine packed = MakeEngine(model, kBlockTokens, 40, kSlots, kBudget, tp);
    std::mt19937 rng(11);
    std::vector<std::vector<int32_t>> tokens(kSlots);
    for (int32_t s = 0; s < kSlots; ++s) {
      tokens[s] = RandomTokens(&rng, plans[s].prompt_len + 8, vocab);
    }
    auto chunk_of = [&](int32_t s, int32_t start, int32_t n) {
      PrefillChunk pc{s, start, absl::MakeConstSpan(tokens[s]).subspan(start, n),
                      plans[s].runs.data(), static_cast<int32_t>(plans[s].runs.size())};
      pc.all_logits = s == kScored;
      return pc;
    };
    // Slots 0 and 1 prefilled alike in both.
    std::vector<int32_t> position(kSlots, 0);
    for (int32_t s = 0; s < 2; ++s) {
      ASSERT_TRUE(apart.backend->Prefill(chunk_of(s, 0, plans[s].prompt_len), nullptr).ok());
      ASSERT_TRUE(packed.backend->Prefill(chunk_of(s, 0, plans[s].prompt_len), nullptr).ok());
      position[s] = plans[s].prompt_len;
    }
    StepDescriptor step;
    step.Resize(kSlots, kMaxRuns);
    for (int32_t s = 0; s < kSlots; ++s) {
      step.num_runs[s] = static_cast<int32_t>(plans[s].runs.size());
      for (size_t i = 0; i < plans[s].runs.size(); ++i) step.SlotRuns(s)[i] = plans[s].runs[i];
    }
    std::vector<float> logits_a(kSlots * vocab), logits_b(kSlots * vocab);
    // Per prefilling slot: its chunk's logits buffer in each backend, and the embedding sums.
    std::vector<std::vector<float>> chunk_a(kSlots), chunk_b(kSlots);
    std::vector<float> pooled_a(hidden, 0.0f), pooled_b(hidden, 0.0f);
    int32_t passes = 0, chunks = 0, scored_rows = 0;
    for (bool decode : {true, false}) {
      // With decode rows while the first prompt lasts; then the rest with none.
      while (
          position[2] < plans[2].prompt_len ||
          (!decode && (position[3] < plans[3].prompt_len || position[4] < plans[4].prompt_len))) {
        std::vector<PrefillChunk> pass;
        std::vector<float*> out_a, out_b;
        int32_t budget = kBudget;
        for (int32_t s = 2; s < kSlots && budget > 0; ++s) {
          const int32_t n = std::min(budget, plans[s].prompt_len - position[s]);
          if (n <= 0) continue;
          PrefillChunk pc = chunk_of(s, position[s], n);
          if (s == kEmbedded) {
            pc.hidden_begin = std::clamp(kPooledFrom - position[s], 0, n);
            pc.hidden_end = n;
            if (pc.hidden_end > pc.hidden_begin) pc.hidden = pooled_a.data();
          }
          const bool last = position[s] + n == plans[s].prompt_len;
          const size_t rows = pc.all_logits ? n : 1;
          chunk_a[s].assign(rows * vocab, NAN);
          chunk_b[s].assign(rows * vocab, -1.0f);
          out_a.push_back(last || pc.all_logits ? chunk_a[s].data() : nullptr);
          out_b.push_back(last || pc.all_logits ? chunk_b[s].data() : nullptr);
          pass.push_back(pc);
          budget -= n;
        }
        for (int32_t s = 0; s < 2; ++s) {
          step.active[s] = decode;
          step.position[s] = position[s];
          step.token[s] = tokens[s][position[s]];
        }
        std::fill(logits_a.begin(), logits_a.end(), NAN);
        std::fill(logits_b.begin(), logits_b.end(), NAN);
        for (size_t k = 0; k < pass.size(); ++k) {
          ASSERT_TRUE(apart.backend->Prefill(pass[k], out_a[k]).ok());
        }
        if (decode) ASSERT_TRUE(apart.backend->Decode(step, logits_a.data()).ok());
        for (PrefillChunk& pc : pass) {
          if (pc.hidden != nullptr) pc.hidden = pooled_b.data();
        }
        const absl::Status st =
            packed.backend->PrefillChunks(pass, out_b, decode ? &step : nullptr, logits_b.data());
        ASSERT_TRUE(st.ok()) << st;
        ++passes;
        for (size_t k = 0; k < pass.size(); ++k) {
          const int32_t s = pass[k].slot;
          if (out_a[k] != nullptr) {
            EXPECT_TRUE(chunk_a[s] == chunk_b[s]) << "slot " << s << "'s logits, pass " << passes;
            if (s == kScored) scored_rows += static_cast<int32_t>(pass[k].tokens.size());
          }
          position[s] += static_cast<int32_t>(pass[k].tokens.size());
          ++chunks;
        }
        for (int32_t s = 0; decode && s < 2; ++s) {
          const size_t at = static_cast<size_t>(s) * vocab;
          EXPECT_TRUE(std::equal(logits_a.begin() + at, logits_a.begin() + at + vocab,
                                 logits_b.begin() + at))
              << "slot " << s << ", pass " << passes;
          EXPECT_FALSE(std::isnan(logits_b[at]));
          ++position[s];
        }
        // The prefilling slots' rows of the step's logits are left alone.
        EXPECT_TRUE(std::isnan(logits_b[2 * vocab]));
      }
    }
    // Passes of 24 tokens: slot 2's first 24 beside the decode rows; its last 13 with slot 3's
    // 9 (scored: 9 rows of logits after slot 2's one) and slot 4's first 2 (pooled from row 1,
    // at rows 22-23 of the pass); then slot 4's last 19 alone, with no decode rows.
    EXPECT_EQ(passes, 3);
    EXPECT_EQ(chunks, 5);
    EXPECT_EQ(scored_rows, plans[kScored].prompt_len);
    EXPECT_TRUE(pooled_a == pooled_b) << "embedding sums";
    EXPECT_NE(pooled_b[0], 0.0f);
    for (int32_t r = 0; r < tp; ++r) {
      const KvPool* a = apart.backend->kv_pool(r);
      const KvPool* b = packed.backend->kv_pool(r);
      ASSERT_EQ(a->bytes(), b->bytes());
      EXPECT_EQ(std::memcmp(a->Layer(0).k, b->Layer(0).k, a->bytes()), 0) << "rank " << r;
    }
  }
}

// What PrefillChunks refuses, naming it: two chunks of one slot, a chunk of a slot the step
// decodes, more tokens together than a pass takes, and a logits list of another length.
TEST(MixedStepTest, SeveralChunksRefuseWhatOnePassCannotHold) {
  const TinyModel& model = GetTiny(DType::kF32);
  const int32_t vocab = model.bundle->config.vocab_size;
  Engine engine = MakeEngine(model, 16, 8, /*max_slots=*/3, /*max_chunk_tokens=*/16);
  std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  const KvRun runs0[] = {{0, 1}}, runs1[] = {{1, 1}}, runs2[] = {{2, 1}};
  StepDescriptor step;
  step.Resize(3, 1);
  step.active[2] = 1;
  step.position[2] = 4;
  step.num_runs[2] = 1;
  step.SlotRuns(2)[0] = KvRun{2, 1};
  std::vector<float> logits(3 * vocab), last0(vocab), last1(vocab);
  const auto span = [&](int32_t n) { return absl::MakeConstSpan(tokens).subspan(0, n); };
  const std::vector<float*> outs = {last0.data(), last1.data()};
  const auto run = [&](std::vector<PrefillChunk> chunks, const StepDescriptor* s) {
    return engine.backend->PrefillChunks(chunks, outs, s, logits.data());
  };
  absl::Status st = run({{0, 0, span(4), runs0, 1}, {0, 4, span(4), runs0, 1}}, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), testing::HasSubstr("slot 0 has two prefill chunks"));
  st = run({{0, 0, span(4), runs0, 1}, {2, 0, span(4), runs2, 1}}, &step);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), testing::HasSubstr("slot 2 both decodes and prefills"));
  st = run({{0, 0, span(10), runs0, 1}, {1, 0, span(10), runs1, 1}}, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), testing::HasSubstr("in one pass; max 16"));
  const std::vector<PrefillChunk> one = {{0, 0, span(4), runs0, 1}};
  st = engine.backend->PrefillChunks(one, outs, nullptr, logits.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), testing::HasSubstr("(2 logits buffers)"));
  // Within bounds it runs, and each chunk's last logits are written.
  std::fill(last1.begin(), last1.end(), NAN);
  EXPECT_TRUE(run({{0, 0, span(6), runs0, 1}, {1, 0, span(10), runs1, 1}}, &step).ok());
  EXPECT_FALSE(std::isnan(last1[0]));
}

// A slot cannot prefill and decode in one pass: refused, naming it.
TEST(MixedStepTest, RefusesAChunkForASlotTheStepDecodes) {
  const TinyModel& model = GetTiny(DType::kF32);
  const int32_t vocab = model.bundle->config.vocab_size;
  Engine engine = MakeEngine(model, 16, 8, /*max_slots=*/2, /*max_chunk_tokens=*/16);
  std::vector<int32_t> tokens = {1, 2, 3};
  const KvRun runs[] = {{0, 1}};
  StepDescriptor step;
  step.Resize(2, 1);
  step.active[1] = 1;
  step.position[1] = 4;
  step.num_runs[1] = 1;
  step.SlotRuns(1)[0] = KvRun{2, 1};
  std::vector<float> logits(2 * vocab), last(vocab);
  const absl::Status status = engine.backend->DecodeWithChunk(
      PrefillChunk{1, 0, absl::MakeConstSpan(tokens), runs, 1}, last.data(), step, logits.data());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), testing::HasSubstr("slot 1"));
  EXPECT_TRUE(engine.backend
                  ->DecodeWithChunk(PrefillChunk{0, 0, absl::MakeConstSpan(tokens), runs, 1},
                                    last.data(), step, logits.data())
                  .ok());
}

INSTANTIATE_TEST_SUITE_P(DtypesAndIsas, ForwardTest,
                         testing::Combine(testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                                          testing::ValuesIn(AvailableCpuIsas())),
                         [](const testing::TestParamInfo<std::tuple<DType, CpuIsa>>& info) {
                           return absl::StrCat(std::string(DTypeName(std::get<0>(info.param))), "_",
                                               std::string(CpuIsaName(std::get<1>(info.param))));
                         });

// ---- Qwen2, Qwen3, biased Llama, Phi-3, Granite, Gemma 2 / 3, sliding windows ------------------

// The tiny shape as Qwen2 (Q/K/V biases), Qwen3 (per-head Q/K RMSNorm before RoPE; both with
// head_dim 64 and hidden 128, 4 heads), Phi-3 (Q/K/V and gate/up as row ranges of fused tensors),
// Granite (its four multipliers), Llama with attention_bias (O biased too), Gemma 2 (1 + w and
// sandwich norms, GELU-tanh, both softcaps, even layers sliding over 48 positions), Gemma 3 (Q/K
// norms, the sliding layers' own RoPE base, linear scaling on the full ones) and Mistral with a
// 48-position window, in f32 and bf16 on every path, against the float64 reference reading the
// same HF tensors (tests/reference_llama.h): chunked prefill and decode over prompts past the
// windows, and two ranks (the Q/K/V biases cut by heads, the O bias added once after the
// all-reduce). Tolerances as ForwardTest's. The biases (std 0.5) and norm weights are large
// enough that leaving one out moves the logits by O(1): checked by dropping the K bias add, the
// Q head norm and the O bias from the CPU rank in turn, each failing every prefill and TP case
// of the models that have it; likewise dropping the window (fails gemma2, gemma3, mistral-sw),
// the attention softcap (gemma2), the local RoPE table (gemma3) or the MLP's post norm (both
// Gemmas).
class ArchitectureForwardTest
    : public testing::TestWithParam<std::tuple<std::string, DType, CpuIsa>> {
 protected:
  void SetUp() override {
    SetActiveCpuIsa(isa());
    model().ref->set_bf16_linear_inputs(MatMulRoundsActivations(isa(), dtype()));
  }
  const TinyModel& model() const { return GetTiny(dtype(), std::get<0>(GetParam())); }
  DType dtype() const { return std::get<1>(GetParam()); }
  CpuIsa isa() const { return std::get<2>(GetParam()); }
  std::string Name() const {
    return absl::StrCat(std::get<0>(GetParam()), " ", std::string(DTypeName(dtype())), " ",
                        std::string(CpuIsaName(isa())));
  }
  ErrorStats Stats() const { return StatsFor(isa(), dtype()); }
  // A mixture of experts where the products round their activations to bf16 (avx512_bf16, bf16
  // weights): the reference rounds them too, but wherever its hidden state and the engine's
  // round a value differently (~1e-3 of it), a router's near-tie (margins down to 2.5e-4 in
  // these models) can choose another expert, an O(1) change in that row: bf16 numerics of any
  // MoE engine, not an error. There the engine is held to itself (one rank against two), and
  // the routing to the reference on every other path.
  bool RoutingFlipsUnderRounding() const {
    return model().bundle->config.moe() && MatMulRoundsActivations(isa(), dtype());
  }
};

TEST_P(ArchitectureForwardTest, ConfigSaysWhatTheModelHas) {
  const LlamaConfig& c = model().bundle->config;
  const std::string& size = std::get<0>(GetParam());
  const bool gptoss = size == "tiny-gptoss";
  EXPECT_EQ(c.qkv_bias,
            size == "tiny-qwen2" || size == "tiny-biased" || size == "tiny-qwen2-moe" || gptoss);
  EXPECT_EQ(c.o_bias, size == "tiny-biased" || gptoss);
  // gpt-oss: sinks, biased router and experts, the clamped GLU; 8 experts, 4 a token, every
  // layer; the even layers slide over 16 positions.
  EXPECT_EQ(c.attention_sinks, gptoss);
  EXPECT_EQ(c.moe_biases, gptoss);
  EXPECT_EQ(c.swiglu_limit, gptoss ? 7.0 : 0.0);
  if (gptoss) {
    EXPECT_EQ(c.num_experts, 8);
    EXPECT_EQ(c.num_experts_per_tok, 4);
    EXPECT_TRUE(c.norm_topk_prob);
    EXPECT_EQ(c.SlidingWindowOf(0), 16);
    EXPECT_EQ(c.SlidingWindowOf(1), 0);
    EXPECT_EQ(c.rope_scaling.type, "yarn");
    EXPECT_FALSE(c.rope_scaling.truncate);
    const LayerWeights& l = model().bundle->weights.layers[0];
    EXPECT_EQ(l.sinks.cols, c.num_attention_heads);
    EXPECT_EQ(l.expert_gate_bias.size(), 8u);
    return;
  }
  const bool gemma = size == "tiny-gemma2" || size == "tiny-gemma3";
  EXPECT_EQ(c.qk_norm, size == "tiny-qwen3" || size == "tiny-gemma3" || size == "tiny-qwen3-moe" ||
                           size == "tiny-olmo2" || size == "tiny-olmo3");
  // OLMo 2: Q/K norms over the whole projections, output norms only.
  const bool olmo2 = size == "tiny-olmo2" || size == "tiny-olmo3";  // (and OLMo 3)
  EXPECT_EQ(c.qk_norm_whole, olmo2);
  EXPECT_EQ(c.pre_norms, !olmo2);
  if (olmo2) {
    const LayerWeights& l = model().bundle->weights.layers[0];
    EXPECT_EQ(l.q_norm.cols, c.num_attention_heads * c.head_dim);
    EXPECT_EQ(l.k_norm.cols, c.num_key_value_heads * c.head_dim);
    EXPECT_EQ(l.attn_norm.data, nullptr);
    EXPECT_EQ(l.mlp_norm.data, nullptr);
    EXPECT_NE(l.mlp_post_norm.data, nullptr);
  }
  // Mixtral: 4 experts, 2 a token, every layer; Qwen3-MoE: 8 experts of 96, 3 a token, weights
  // not renormalized, layer 3 dense.
  // Qwen2-MoE: 4 experts of 96, 2 a token, not renormalized, and a shared expert of 192.
  const bool qwen3_moe = size == "tiny-qwen3-moe";
  EXPECT_EQ(c.num_experts, qwen3_moe ? 8 : c.moe() ? 4 : 0);
  EXPECT_EQ(c.moe(), qwen3_moe || size == "tiny-mixtral" || size == "tiny-qwen2-moe");
  EXPECT_EQ(c.shared_expert_intermediate_size, size == "tiny-qwen2-moe" ? 192 : 0);
  if (c.moe()) {
    EXPECT_EQ(c.num_experts_per_tok, qwen3_moe ? 3 : 2);
    EXPECT_EQ(c.norm_topk_prob, size == "tiny-mixtral");
    EXPECT_EQ(c.IsMoeLayer(3), !qwen3_moe);
    EXPECT_TRUE(c.IsMoeLayer(2));
  }
  EXPECT_EQ(c.fused_projections, size == "tiny-phi3");
  EXPECT_EQ(c.sandwich_norms, gemma || olmo2);
  EXPECT_EQ(c.gelu_tanh(), gemma);
  EXPECT_EQ(c.attn_logit_softcapping > 0, size == "tiny-gemma2");
  const bool olmo3 = size == "tiny-olmo3";
  EXPECT_EQ(c.rope_local_theta > 0, size == "tiny-gemma3" || olmo3);
  // The windowed models slide in some layers (Mistral: all) over 48 positions.
  const bool windowed = gemma || size == "tiny-mistral-sw" || olmo3;
  EXPECT_EQ(c.sliding_window, windowed ? 48 : 0);
  if (windowed) {
    EXPECT_EQ(c.SlidingWindowOf(0), 48);
    EXPECT_EQ(c.SlidingWindowOf(1), gemma ? 0 : 48);
  }
  if (olmo3) {  // every fourth layer full; the sliding ones rotate unscaled at the same base
    EXPECT_EQ(c.SlidingWindowOf(2), 48);
    EXPECT_EQ(c.SlidingWindowOf(3), 0);
    EXPECT_EQ(c.rope_local_theta, c.rope_theta);
    EXPECT_EQ(c.rope_scaling.type, "llama3");
  }
  if (gemma) {
    EXPECT_EQ(c.attention_scale, 1 / std::sqrt(size == "tiny-gemma2" ? 96.0 : 64.0));
  } else if (size == "tiny-granite") {
    EXPECT_EQ(c.embedding_multiplier, 12.0);
    EXPECT_EQ(c.attention_scale, 1.0 / 32);
    EXPECT_EQ(c.residual_multiplier, 0.22);
    EXPECT_EQ(c.logits_scaling, 8.0);
  } else {
    EXPECT_EQ(c.attention_scale, 0.0);
  }
  if (size == "tiny-qwen2" || size == "tiny-qwen3" || size == "tiny-qwen2-moe") {
    EXPECT_EQ(c.head_dim * c.num_attention_heads, 2 * c.hidden_size);
  }
  // SmolLM3: layers 1 and 3 attend without RoPE.
  EXPECT_EQ(c.HasNopeLayers(), size == "tiny-smollm3");
  if (size == "tiny-smollm3") {
    EXPECT_EQ(c.rope_layers, std::vector<bool>({true, false, true, false}));
    EXPECT_EQ(c.rope_theta, 2000000.0);
    EXPECT_TRUE(c.tie_word_embeddings);
  }
}

TEST_P(ArchitectureForwardTest, ChunkedPrefillThenDecodeMatchesReference) {
  if (RoutingFlipsUnderRounding()) {
    GTEST_SKIP() << "bf16-rounded activations: routing near-ties may flip (TwoRanks... holds the "
                    "engine to itself here)";
  }
  ErrorStats stats = Stats();
  ChunkedPrefillThenDecode(model(), DType::kF32, &stats);
  stats.Print(absl::StrCat("single slot ", Name()));
  if (model().bundle->config.moe()) {
    // The smallest gap between a kept expert's router score and the best dropped one's, over
    // every token and layer: an engine whose scores were off by less than half of it chose the
    // same experts.
    std::printf("[%s] smallest routing margin %.3g\n", Name().c_str(),
                model().ref->min_routing_margin());
  }
}

TEST_P(ArchitectureForwardTest, TwoRanksMatchReferenceAndOneRank) {
  TwoRanksMatchReferenceAndOneRank(model(), Stats(), Name(), !RoutingFlipsUnderRounding());
}

INSTANTIATE_TEST_SUITE_P(
    ArchitecturesDtypesAndIsas, ArchitectureForwardTest,
    testing::Combine(testing::Values("tiny-qwen2", "tiny-qwen3", "tiny-biased", "tiny-phi3",
                                     "tiny-granite", "tiny-gemma2", "tiny-gemma3",
                                     "tiny-mistral-sw", "tiny-mixtral", "tiny-qwen2-moe",
                                     "tiny-qwen3-moe", "tiny-smollm3", "tiny-olmo2", "tiny-olmo3",
                                     "tiny-gptoss"),
                     testing::Values(DType::kF32, DType::kBF16),
                     testing::ValuesIn(AvailableCpuIsas())),
    [](const testing::TestParamInfo<std::tuple<std::string, DType, CpuIsa>>& info) {
      std::string arch = std::get<0>(info.param);
      std::replace(arch.begin(), arch.end(), '-', '_');
      return absl::StrCat(arch, "_", std::string(DTypeName(std::get<1>(info.param))), "_",
                          std::string(CpuIsaName(std::get<2>(info.param))));
    });

// The largest over rows of max|b - a| / max(1, max|a|): how far `b`'s logits are from `a`'s.
double WorstScaledDiff(const std::vector<std::vector<double>>& a,
                       const std::vector<std::vector<double>>& b) {
  double worst = 0;
  for (size_t t = 0; t < a.size(); ++t) {
    double max_ref = 0, max_diff = 0;
    for (size_t v = 0; v < a[t].size(); ++v) {
      max_ref = std::max(max_ref, std::abs(a[t][v]));
      max_diff = std::max(max_diff, std::abs(b[t][v] - a[t][v]));
    }
    worst = std::max(worst, max_diff / std::max(1.0, max_ref));
  }
  return worst;
}

// SmolLM3's NoPE layers matter: the reference of tiny-smollm3 with every layer rotating (its
// rope_layers cleared) moves the logits by a large share of their scale (measured 0.24,
// printed), so the engine's agreement with the reference above holds it to the layers that
// skip RoPE, not just to the rest of the block.
TEST(SmolLM3ForwardTest, NopeLayersMoveTheLogits) {
  const TinyModel& m = GetTiny(DType::kF32, "tiny-smollm3");
  ASSERT_TRUE(m.bundle->config.HasNopeLayers());
  LlamaConfig rotated = m.bundle->config;
  rotated.rope_layers.clear();
  auto every_layer = ReferenceLlama::Create(rotated, *m.bundle->files);
  ASSERT_TRUE(every_layer.ok()) << every_layer.status();
  std::mt19937 rng(7);
  const std::vector<int32_t> seq = RandomTokens(&rng, 48, m.bundle->config.vocab_size);
  const std::vector<std::vector<double>> nope = m.ref->Forward(seq),
                                         all = (*every_layer)->Forward(seq);
  const double worst = WorstScaledDiff(nope, all);
  std::printf("[tiny-smollm3] rotating the NoPE layers moves the logits by %.3g of their scale\n",
              worst);
  EXPECT_GT(worst, 0.1);
}

// OLMo 3's sliding layers rotate without the RoPE scaling: the reference of tiny-olmo3 with every
// layer scaled (rope_local_theta cleared) moves the logits by a large share of their scale past
// the original 128 positions (printed), so the engine's agreement with the reference above holds
// it to the unscaled sliding layers.
TEST(Olmo3ForwardTest, UnscaledSlidingLayersMoveTheLogits) {
  const TinyModel& m = GetTiny(DType::kF32, "tiny-olmo3");
  ASSERT_GT(m.bundle->config.rope_local_theta, 0);
  LlamaConfig scaled = m.bundle->config;
  scaled.rope_local_theta = 0;
  auto all_scaled = ReferenceLlama::Create(scaled, *m.bundle->files);
  ASSERT_TRUE(all_scaled.ok()) << all_scaled.status();
  std::mt19937 rng(8);
  const std::vector<int32_t> seq = RandomTokens(&rng, 160, m.bundle->config.vocab_size);
  const std::vector<std::vector<double>> want = m.ref->Forward(seq),
                                         other = (*all_scaled)->Forward(seq);
  const double worst = WorstScaledDiff(want, other);
  std::printf(
      "[tiny-olmo3] scaling the sliding layers' RoPE moves the logits by %.3g of their "
      "scale\n",
      worst);
  EXPECT_GT(worst, 0.05);
}

// YaRN (rope_scaling yarn, as Qwen2.5 / Qwen3 enable for long contexts) through the engine: the
// tiny Qwen2 model with factor 4 over an original context of 64 positions, so the prompts (up to
// 156 positions) run past it, against the reference, which scales its own cos and sin by the
// attention factor (0.1 ln 4 + 1). Measured 7.8e-7 of the logit scale (tolerance 1e-5); leaving
// the attention factor out of the engine's table fails it.
TEST(YarnForwardTest, ChunkedPrefillThenDecodeMatchesReference) {
  SetActiveCpuIsa(AvailableCpuIsas().back());
  GetTiny(DType::kF32, "tiny-qwen2");  // generates the directory
  auto bundle = ModelBundle::Load(TinyDir(DType::kF32, "tiny-qwen2"));
  ASSERT_TRUE(bundle.ok()) << bundle.status();
  RopeScaling& yarn = (*bundle)->config.rope_scaling;
  yarn.type = "yarn";
  yarn.factor = 4;
  yarn.original_max_position_embeddings = 64;
  yarn.attention_factor = 0.1 * std::log(4.0) + 1;
  auto ref = ReferenceLlama::Create((*bundle)->config, *(*bundle)->files);
  ASSERT_TRUE(ref.ok()) << ref.status();
  TinyModel model;
  model.bundle = std::move(*bundle);
  model.ref = std::move(*ref);
  ErrorStats stats;
  ChunkedPrefillThenDecode(model, DType::kF32, &stats);
  stats.Print("yarn tiny-qwen2 f32");
}

// ---- q8_0 weights (--quantization=q8_0) ---------------------------------------------------------

// The tiny f32 model with every linear weight quantized to q8_0 at load, against the reference
// that quantizes the same weights and rounds every linear input to the same int16 steps
// (ReferenceLlama::QuantizeLinearQ8_0). The kernels sum exactly in int32 per block, so what is
// left is f32 against double as in ForwardTest, plus an input near an int16 rounding boundary
// rounding the other way (one step, 1/32767 of the input's largest magnitude). Measured on every
// path: max |diff| / max(1, max |ref|) <= 2.1e-4; held to 1e-3. Against the unquantized
// reference the logits move by the quantization itself: 3.2e-2 of the scale, held to 5e-2.
class Q8ForwardTest : public testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override { SetActiveCpuIsa(GetParam()); }
  static const ReferenceLlama& Quantized() {
    static const ReferenceLlama* ref = [] {
      const TinyModel& model = GetTiny(DType::kF32);
      auto r = ReferenceLlama::Create(model.bundle->config, *model.bundle->files);
      CHECK_OK(r.status());
      (*r)->QuantizeLinearQ8_0();
      return r->release();
    }();
    return *ref;
  }
};

constexpr double kQ8RelTol = 1e-3;

TEST_P(Q8ForwardTest, ChunkedPrefillThenDecodeMatchesQuantizedReference) {
  const TinyModel& model = GetTiny(DType::kF32);
  model.ref->set_bf16_linear_inputs(false);
  ErrorStats stats;
  stats.rel_tol = kQ8RelTol;
  ChunkedPrefillThenDecode(model, DType::kF32, &stats, &Quantized(), WeightFormat::kQ8_0);
  stats.Print(absl::StrCat("q8_0 ", std::string(CpuIsaName(GetParam()))));
  ErrorStats unquantized;
  unquantized.rel_tol = 5e-2;
  ChunkedPrefillThenDecode(model, DType::kF32, &unquantized, model.ref.get(), WeightFormat::kQ8_0);
  unquantized.Print(absl::StrCat("q8_0 vs the unquantized reference ",
                                 std::string(CpuIsaName(GetParam()))));
}

// A mixture of experts with every expert quantized to q8_0 at load (the router stays f32, its
// input unrounded, in both), against the reference quantizing the same experts, on the best path:
// the experts' blocks are multiplied as any matrix's, so the tolerance is the dense model's
// (measured 2.4e-4; routing margin 1.1e-3). tiny-qwen3-moe is not held to it: quantized, its
// router has a near-tie of 1.3e-4 over these prompts, which the int16 rounding of the experts'
// inputs (~2e-4 of the hidden state) flips, as it would on any int8-activation engine.
TEST(MoeQ8ForwardTest, ExpertsQuantizedAtLoadMatchTheQuantizedReference) {
  SetActiveCpuIsa(AvailableCpuIsas().back());
  for (const std::string size : {"tiny-mixtral"}) {
    SCOPED_TRACE(size);
    const TinyModel& model = GetTiny(DType::kF32, size);
    model.ref->set_bf16_linear_inputs(false);
    auto quantized = ReferenceLlama::Create(model.bundle->config, *model.bundle->files);
    ASSERT_TRUE(quantized.ok()) << quantized.status();
    (*quantized)->QuantizeLinearQ8_0();
    ErrorStats stats;
    stats.rel_tol = kQ8RelTol;
    ChunkedPrefillThenDecode(model, DType::kF32, &stats, quantized->get(), WeightFormat::kQ8_0);
    stats.Print(absl::StrCat("q8_0 ", size));
    std::printf("[q8_0 %s] smallest routing margin %.3g\n", size.c_str(),
                (*quantized)->min_routing_margin());
  }
}

// Several slots in fragmented run tables.
TEST_P(Q8ForwardTest, MultiSlotMatchesQuantizedReference) {
  const TinyModel& model = GetTiny(DType::kF32);
  const ScenarioResult r =
      RunScenario(model, FragmentedPlans(), /*num_blocks=*/32, 1, WeightFormat::kQ8_0);
  ErrorStats stats;
  stats.rel_tol = kQ8RelTol;
  for (size_t s = 0; s < r.tokens.size(); ++s) {
    const std::vector<std::vector<double>> ref = Quantized().Forward(r.tokens[s]);
    for (size_t i = 0; i < r.logits[s].size(); ++i) {
      const int pos = r.logit_positions[s][i];
      ExpectLogitsClose(r.logits[s][i].data(), ref[pos],
                        absl::StrCat("slot ", s, " position ", pos), &stats);
    }
  }
  stats.Print(absl::StrCat("q8_0 multi slot ", std::string(CpuIsaName(GetParam()))));
}

INSTANTIATE_TEST_SUITE_P(AllIsas, Q8ForwardTest, testing::ValuesIn(AvailableCpuIsas()),
                         [](const testing::TestParamInfo<CpuIsa>& info) {
                           return std::string(CpuIsaName(info.param));
                         });

// Every linear weight gets q8_0 panels (and no dtype panels), with or without dense panels
// asked for; the backend says so.
TEST(Q8WeightsTest, EveryLinearWeightHasQ8Panels) {
  const TinyModel& model = GetTiny(DType::kBF16);
  const LlamaWeights& w = model.bundle->weights;
  int64_t q8 = BlockPanelBytes(w.lm_head), bf16 = w.lm_head.bytes();
  for (const LayerWeights& l : w.layers) {
    for (const WeightMatrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
      q8 += BlockPanelBytes(*m);
      bf16 += m->bytes();
    }
  }
  for (bool panels : {true, false}) {
    Engine engine = MakeEngine(model, 16, 16, 2, 16, 1, panels, DType::kF32, WeightFormat::kQ8_0);
    EXPECT_EQ(engine.backend->panel_weight_bytes(), q8);
    EXPECT_EQ(engine.backend->weight_quantization(), "q8_0");
  }
  Engine dense = MakeEngine(model, 16, 16, 2, 16);
  EXPECT_EQ(dense.backend->weight_quantization(), "");
  // Two ranks would cut the tiny model's 352 intermediate features into 176 a rank: not whole
  // 32-column blocks of down_proj's inputs.
  CpuBackendOptions two;
  two.kv_blocks = 16;
  two.max_slots = 2;
  two.max_chunk_tokens = 16;
  two.max_context = 256;
  two.tensor_parallel = 2;
  two.quantization = WeightFormat::kQ8_0;
  const absl::Status refused = CpuBackend::Create(model.bundle->config, &w, two).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.message()), testing::HasSubstr("intermediate_size inputs (176)"));
  // 8.5 bits a weight against bf16's 16, plus the padding of rows to 16 and columns to 32.
  EXPECT_GE(static_cast<double>(q8), 8.5 / 16 * static_cast<double>(bf16));
  EXPECT_LT(static_cast<double>(q8), 0.6 * static_cast<double>(bf16));
}

// ---- static plan: no allocation per step ------------------------------------------------------

TEST(StaticPlanTest, DecodePrefillAndMixedStepsDoNotAllocate) {
  if (!alloc_counter::kAvailable) GTEST_SKIP() << "allocation counting is off under sanitizers";
  SetActiveCpuIsa(AvailableCpuIsas().back());
  const TinyModel& model = GetTiny(DType::kBF16);
  const int32_t vocab = model.bundle->config.vocab_size;
  for (const auto& [tp, quantization] :
       {std::pair{1, WeightFormat::kDense}, std::pair{2, WeightFormat::kDense},
        std::pair{1, WeightFormat::kQ8_0}}) {  // (the tiny model's shares are not q8_0 blocks)
    Engine engine = MakeEngine(model, 16, 16, /*max_slots=*/4, /*max_chunk_tokens=*/32, tp,
                               /*weight_panels=*/true, DType::kF32, quantization);
    std::vector<int32_t> tokens(32, 7);
    std::vector<float> logits(4 * vocab), last(vocab);
    StepDescriptor step;
    step.Resize(4, 2);
    for (int32_t s = 0; s < 4; ++s) {
      step.active[s] = s != 2;
      step.num_runs[s] = 2;
      step.SlotRuns(s)[0] = KvRun{4 * s, 2};
      step.SlotRuns(s)[1] = KvRun{4 * s + 2, 2};
    }
    // One call of each kind first: nothing is lazily set up, but this keeps the count honest.
    const KvRun runs[] = {{0, 2}, {2, 2}};
    const KvRun runs2[] = {{8, 2}, {10, 2}};
    PrefillChunk warm{0, 0, absl::MakeConstSpan(tokens), runs, 2};
    ASSERT_TRUE(engine.backend->Prefill(warm, logits.data()).ok());
    const int64_t before = alloc_counter::AllocationCount();
    for (int k = 0; k < 3; ++k) {
      PrefillChunk pc{0, 0, absl::MakeConstSpan(tokens).subspan(0, 9 + 10 * k), runs, 2};
      ASSERT_TRUE(engine.backend->Prefill(pc, k == 1 ? nullptr : logits.data()).ok());
      for (int32_t s = 0; s < 4; ++s) {
        step.position[s] = 40 + k + s;
        step.token[s] = 3 * s + k;
      }
      ASSERT_TRUE(engine.backend->Decode(step, logits.data()).ok());
      // Slot 2 (idle in the step) prefills into its own blocks beside it.
      PrefillChunk mixed{2, 0, absl::MakeConstSpan(tokens).subspan(0, 5 + k), runs2, 2};
      ASSERT_TRUE(engine.backend->DecodeWithChunk(mixed, last.data(), step, logits.data()).ok());
      // Slots 0 and 2 prefill together beside slots 1 and 3 (PrefillChunks), then alone.
      step.active[0] = 0;
      const PrefillChunk two[] = {{0, 0, absl::MakeConstSpan(tokens).subspan(0, 7 + k), runs, 2},
                                  mixed};
      float* const outs[] = {last.data(), nullptr};
      ASSERT_TRUE(engine.backend->PrefillChunks(two, outs, &step, logits.data()).ok());
      ASSERT_TRUE(engine.backend->PrefillChunks(two, outs, nullptr, logits.data()).ok());
      step.active[0] = 1;
    }
    EXPECT_EQ(alloc_counter::AllocationCount() - before, 0)
        << "tp=" << tp << (quantization == WeightFormat::kQ8_0 ? " q8_0" : "");
    // The counter itself works: a vector allocates.
    std::vector<int> probe(10);
    EXPECT_GT(alloc_counter::AllocationCount() - before, 0);
  }
}

// ---- weight panels ----------------------------------------------------------------------------

// The backend packs every linear weight the best path reads panels of (MatMulReadsPanels), on
// every rank, and nothing when told not to (the engine, when another path is chosen). Whether
// the panel kernels compute the right thing is ForwardTest's and kernels_test's.
TEST(WeightPanelsTest, PackedForTheBestPathOnly) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    const TinyModel& model = GetTiny(dtype);
    const LlamaWeights& w = model.bundle->weights;
    int64_t linear = PanelBytes(w.lm_head);  // TP=1: whole matrices
    for (const LayerWeights& l : w.layers) {
      for (const WeightMatrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
        linear += PanelBytes(*m);
      }
    }
    const bool reads = MatMulReadsPanels(AvailableCpuIsas().back(), dtype);
    for (bool panels : {true, false}) {
      Engine engine = MakeEngine(model, 16, 16, 2, 16, /*tensor_parallel=*/1, panels);
      EXPECT_EQ(engine.backend->panel_weight_bytes(), panels && reads ? linear : 0)
          << DTypeName(dtype) << " panels=" << panels;
    }
    Engine two = MakeEngine(model, 16, 16, 2, 16, /*tensor_parallel=*/2);
    EXPECT_EQ(two.backend->panel_weight_bytes() > 0, reads) << DTypeName(dtype);
  }
}

// ---- tensor parallelism on the `small` model ----------------------------------------------------

// The `small` model (~125M parameters, 12 heads over 4 KV heads, bf16), generated once.
const ModelBundle& GetSmall() {
  static const ModelBundle* bundle = [] {
    const char* tmp = std::getenv("TEST_TMPDIR");
    modelgen::MakeModelOptions options;
    options.size = "small";
    options.dtype = DType::kBF16;
    options.out_dir = (std::filesystem::path(tmp != nullptr ? tmp : "/tmp") / "small_bf16").string();
    CHECK_OK(modelgen::MakeModel(options).status());
    auto loaded = ModelBundle::Load(options.out_dir);
    CHECK_OK(loaded.status());
    return loaded->release();
  }();
  return *bundle;
}

std::unique_ptr<CpuBackend> MakeSmallBackend(int32_t tp,
                                             WeightFormat quantization = WeightFormat::kDense) {
  const ModelBundle& m = GetSmall();
  CpuBackendOptions options;
  options.kv_blocks = 4 * 10;  // 4 slots x 160 tokens
  options.kv_block_tokens = 16;
  options.max_slots = 4;
  options.max_chunk_tokens = 32;
  options.max_context = 160;
  options.num_threads = 2;
  options.tensor_parallel = tp;
  options.quantization = quantization;
  auto backend = CpuBackend::Create(m.config, &m.weights, options);
  CHECK_OK(backend.status());
  return std::move(*backend);
}

// Two backends side by side over the same slots: random prompts of `prompt_len` tokens prefilled
// in chunks of `chunk` on both (slot s in blocks [10 s, 10 s + 10)), each chunk's logits compared
// (one rank's as the reference for the other's) into `stats`; then `step` decodes every slot from
// the end of its prompt, logits_one and logits_two holding each slot's last logits.
struct SideBySide {
  SideBySide(CpuBackend& one, CpuBackend& two, absl::Span<const int> prompt_len, int chunk,
             uint32_t seed, ErrorStats* stats)
      : one(one), two(two), vocab(one.vocab_size()), stats(stats) {
    const int32_t slots = static_cast<int32_t>(prompt_len.size());
    logits_one.resize(slots * vocab);
    logits_two.resize(slots * vocab);
    step.Resize(slots, 1);
    std::mt19937 rng(seed);
    for (int32_t s = 0; s < slots; ++s) {
      const std::vector<int32_t> prompt = RandomTokens(&rng, prompt_len[s], vocab);
      const KvRun run{10 * s, 10};
      for (int start = 0; start < prompt_len[s]; start += chunk) {
        const int n = std::min(chunk, prompt_len[s] - start);
        PrefillChunk pc{s, start, absl::MakeConstSpan(prompt).subspan(start, n), &run, 1};
        CHECK_OK(one.Prefill(pc, &logits_one[s * vocab]));
        CHECK_OK(two.Prefill(pc, &logits_two[s * vocab]));
        Compare(s, absl::StrCat("slot ", s, " prefill to ", start + n));
      }
      step.active[s] = 1;
      step.num_runs[s] = 1;
      step.SlotRuns(s)[0] = run;
      step.position[s] = prompt_len[s];
    }
  }
  // Slot s's last logits on both, within stats->rel_tol of one rank's scale.
  void Compare(int32_t s, const std::string& where) {
    const float* a = &logits_one[s * vocab];
    ExpectLogitsClose(&logits_two[s * vocab], std::vector<double>(a, a + vocab), where, stats);
  }
  // One decode step of every slot on both (step.token set by the caller), compared; positions
  // advance.
  void Decode() {
    CHECK_OK(one.Decode(step, logits_one.data()));
    CHECK_OK(two.Decode(step, logits_two.data()));
    for (int32_t s = 0; s < step.max_slots; ++s) {
      Compare(s, absl::StrCat("slot ", s, " decode at ", step.position[s]));
      ++step.position[s];
    }
  }

  CpuBackend& one;
  CpuBackend& two;
  const int32_t vocab;
  ErrorStats* stats;
  std::vector<float> logits_one, logits_two;
  StepDescriptor step;
};

// Four slots with random prompts, prefilled in chunks, then 64 greedy decode steps of all four in
// one descriptor, once with one rank and once with two, each run feeding back its own argmax.
// The logits agree within kRelTol of their scale at every step (measured: ~1e-6, printed) and
// the 4 x 64 greedy tokens are identical. On the best path that keeps activations in f32: with
// bf16-rounded activations (avx512_bf16) the two sums' last-bit differences flip roundings and
// the runs drift apart at the bf16 noise level, as they do on GPUs (that path's TP=2 vs TP=1
// agreement is checked within its tolerance by ForwardTest.TwoRanksMatchReferenceAndOneRank).
TEST(SmallModelTensorParallelTest, TwoRanksGreedyTokensIdenticalOver64Steps) {
  std::vector<CpuIsa> isas = AvailableCpuIsas();
  while (isas.size() > 1 && MatMulRoundsActivations(isas.back(), DType::kBF16)) isas.pop_back();
  SetActiveCpuIsa(isas.back());
  constexpr int kSlots = 4, kSteps = 64, kChunk = 32;
  const int32_t vocab = GetSmall().config.vocab_size;
  std::unique_ptr<CpuBackend> one = MakeSmallBackend(1), two = MakeSmallBackend(2);
  ASSERT_EQ(two->num_kv_pools(), 2);
  EXPECT_EQ(two->kv_pool(0)->shape().kv_heads, 2);
  EXPECT_EQ(two->kv_pool(1)->shape().kv_heads, 2);
  EXPECT_EQ(two->kv_pool(0)->shape().num_blocks, one->kv_pool(0)->shape().num_blocks);

  const int prompt_len[kSlots] = {3, 17, 40, 90};
  ErrorStats stats;
  SideBySide both(*one, *two, prompt_len, kChunk, 2024, &stats);
  int identical = 0;
  for (int k = 0; k < kSteps; ++k) {
    for (int32_t s = 0; s < kSlots; ++s) {
      const int32_t next_one = ArgMax(&both.logits_one[s * vocab], vocab);
      ASSERT_EQ(next_one, ArgMax(&both.logits_two[s * vocab], vocab))
          << "slot " << s << " step " << k;
      ++identical;
      both.step.token[s] = next_one;
    }
    both.Decode();
  }
  EXPECT_EQ(identical, kSlots * kSteps);
  stats.Print("small bf16 tp=2 vs tp=1");
}

// q8_0 weights on two ranks (the small model's shares are whole blocks: 384 of O's inputs, 1024
// of down's): the same q8_0 blocks as one rank; each rank rounds its share of O's and down's
// inputs with its share's own scale (a step at most as fine), and the two partial sums add in
// another order. Prefill and 16 decode steps of four slots, fed one rank's greedy tokens: the
// logits within kQ8RelTol of their scale (measured, printed).
TEST(SmallModelTensorParallelTest, TwoRanksQ8MatchOneRank) {
  SetActiveCpuIsa(AvailableCpuIsas().back());
  constexpr int kSlots = 4, kSteps = 16, kChunk = 32;
  const int32_t vocab = GetSmall().config.vocab_size;
  std::unique_ptr<CpuBackend> one = MakeSmallBackend(1, WeightFormat::kQ8_0);
  std::unique_ptr<CpuBackend> two = MakeSmallBackend(2, WeightFormat::kQ8_0);
  EXPECT_EQ(two->weight_quantization(), "q8_0");
  const int prompt_len[kSlots] = {5, 20, 33, 64};
  ErrorStats stats;
  stats.rel_tol = kQ8RelTol;
  SideBySide both(*one, *two, prompt_len, kChunk, 77, &stats);
  for (int k = 0; k < kSteps; ++k) {
    for (int32_t s = 0; s < kSlots; ++s) {
      both.step.token[s] = ArgMax(&both.logits_one[s * vocab], vocab);
    }
    both.Decode();
  }
  stats.Print("small q8_0 tp=2 vs tp=1");
}

// ---- q4_K weights (a GGUF file's q4_K matrices, multiplied as they are) -------------------------

// The small model's first layer (whole 256-value super-blocks in every linear weight's rows, which
// q4_K needs; the tiny model's 128 are not) with every linear weight quantized to q4_K by the
// GGUF converter's quantizer, once. One layer, not twelve: an int8 step is 1/127 of a block's
// magnitude, so once f32 against double flips one input's rounding, the next products' inputs
// differ by whole steps and flip more; over two layers the comparison already measures that
// cascade (1.2e-2 of the logit scale, about half the input rounding's own effect) rather than the
// kernels. The kernels themselves are held to float64 on single products in
// //kernels/cpu:q4_k_test.
constexpr int32_t kQ4KLayers = 1;
struct SmallQ4K {
  LlamaConfig config;
  std::vector<std::vector<std::byte>> blocks;
  LlamaWeights weights;
  std::map<std::string, const WeightMatrix*> by_name;  // HF tensor name -> matrix
};

// A weight matrix quantized to `type` (q4_K or q6_K) by the GGUF converter's quantizer, in
// memory `blocks` keeps.
WeightMatrix QuantizeKMatrix(const WeightMatrix& w, GgmlType type,
                             std::vector<std::vector<std::byte>>* blocks) {
  const GgmlTypeTraits& t = GgmlTraits(type);
  const int64_t row_bytes = w.cols / t.block_elems * t.block_bytes;
  std::vector<std::byte>& out = blocks->emplace_back(w.rows * row_bytes);
  std::vector<float> row(w.cols);
  for (int64_t r = 0; r < w.rows; ++r) {
    WeightRowToFloat(w, r, row.data());
    QuantizeRow(type, row.data(), w.cols, out.data() + r * row_bytes);
  }
  return WeightMatrix{w.dtype, out.data(), w.rows, w.cols, w.cols, nullptr,
                      type == GgmlType::kQ6_K ? WeightFormat::kQ6K : WeightFormat::kQ4K};
}

// `q4_k_m`: as llama.cpp's Q4_K_M mix, the output (lm_head) and down_proj in q6_K, the rest in
// q4_K; else every linear weight in q4_K.
const SmallQ4K& GetSmallQ4K(bool q4_k_m = false) {
  static const SmallQ4K* models[2] = {nullptr, nullptr};
  const SmallQ4K*& model = models[q4_k_m];
  if (model != nullptr) return *model;
  auto* m = new SmallQ4K;
  m->config = GetSmall().config;
  m->config.num_hidden_layers = kQ4KLayers;
  m->weights = GetSmall().weights;
  m->weights.layers.resize(kQ4KLayers);
  auto quantize = [&](const std::string& name, WeightMatrix& w, bool six) {
    w = QuantizeKMatrix(w, six && q4_k_m ? GgmlType::kQ6_K : GgmlType::kQ4_K, &m->blocks);
    m->by_name[name] = &w;
  };
  quantize("lm_head.weight", m->weights.lm_head, true);
  for (size_t i = 0; i < m->weights.layers.size(); ++i) {
    LayerWeights& l = m->weights.layers[i];
    const std::string p = absl::StrCat("model.layers.", i, ".");
    quantize(p + "self_attn.q_proj.weight", l.wq, false);
    quantize(p + "self_attn.k_proj.weight", l.wk, false);
    quantize(p + "self_attn.v_proj.weight", l.wv, false);
    quantize(p + "self_attn.o_proj.weight", l.wo, false);
    quantize(p + "mlp.gate_proj.weight", l.w_gate, false);
    quantize(p + "mlp.up_proj.weight", l.w_up, false);
    quantize(p + "mlp.down_proj.weight", l.w_down, true);
  }
  model = m;
  return *model;
}

// A prompt and the tokens decoded after it, and the float64 reference's logits after each: the
// small model's reference with the q4_K matrices' values (read through WeightRowToFloat, whose
// q4_K decoding //kernels/cpu:q4_k_test checks against ggml's layout) and every linear input
// rounded to int8 steps per 32 values, as the q4_K products take them. Computed once.
constexpr int kQ4KPrompt = 20, kQ4KDecode = 6;
struct Q4KReference {
  std::vector<int32_t> tokens;
  std::vector<std::vector<double>> logits;
  std::vector<std::vector<double>> unrounded;  // the same without the input rounding
};

const Q4KReference& GetQ4KReference() {
  static const Q4KReference* ref = [] {
    const ModelBundle& small = GetSmall();
    const SmallQ4K& q4k = GetSmallQ4K(/*q4_k_m=*/true);
    auto model = ReferenceLlama::Create(q4k.config, *small.files);
    CHECK_OK(model.status());
    (*model)->ReplaceLinearWeights(
        [&](const std::string& name, int64_t rows, int64_t cols, double* data) {
          const WeightMatrix* w = q4k.by_name.at(name);
          CHECK(w->rows == rows && w->cols == cols) << name;
          std::vector<float> row(cols);
          for (int64_t r = 0; r < rows; ++r) {
            WeightRowToFloat(*w, r, row.data());
            for (int64_t c = 0; c < cols; ++c) data[r * cols + c] = row[c];
          }
        });
    (*model)->set_int8_block_linear_inputs(true);
    auto* out = new Q4KReference;
    std::mt19937 rng(404);
    out->tokens = RandomTokens(&rng, kQ4KPrompt + kQ4KDecode, small.config.vocab_size);
    out->logits = (*model)->Forward(out->tokens);
    (*model)->set_int8_block_linear_inputs(false);
    out->unrounded = (*model)->Forward(out->tokens);
    return out;
  }();
  return *ref;
}

// The Q4_K_M-like mix (q4_K, with lm_head and down_proj in q6_K) multiplied as it is
// (kernels/cpu/q4_k.h) through a whole forward pass, prefill in chunks then decode, against the
// float64 reference over the same values and input rounding. The kernels sum each (sub-)block
// exactly in int32, so what is left is f32 against double plus, now and then, an input near an
// int8 rounding boundary rounding the other way (one step, 1/127 of its block's largest
// magnitude, which then moves the next products' inputs by whole steps). Measured on every path:
// max |diff| / max(1, max |ref|) at most 4.0e-7 on rows where no input rounded the other way;
// where one did, one step moves the rest of the pass: 3.5e-3 on an all-q4_K draw, 1.1e-2 on one
// row of this draw since the weights are quantized as ggml's reference does (2026-12-05: one of
// the 9 rows, its median 3e-7). So every row is held to kQ4KSplitRelTol and the median row to
// kQ4KRelTol; against the reference without the input rounding 1.9e-2, so the kernels round as
// the reference does (asserted: the median row at most half of that one's). Two ranks: O's
// inputs split at 384 (not a 256-value super-block: that share runs as q8 affine blocks of the
// same values, its inputs rounded to int16 steps of the share instead of int8 steps per 32) and
// down's at 1024 (q6_K): 1.7e-2 to 2.6e-2 against either reference, held to kQ4KSplitRelTol.
constexpr double kQ4KRelTol = 1e-2, kQ4KSplitRelTol = 5e-2;

// One slot of 64 positions (blocks 0-3), chunks of 8.
CpuBackendOptions Q4KBackendOptions() {
  CpuBackendOptions options;
  options.kv_blocks = 4;
  options.kv_block_tokens = 16;
  options.max_slots = 1;
  options.max_chunk_tokens = 8;
  options.max_context = 64;
  options.num_threads = 2;
  return options;
}

class Q4KForwardTest : public testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override { SetActiveCpuIsa(GetParam()); }
};

TEST_P(Q4KForwardTest, SmallModelMatchesReferenceOverTheSameValues) {
  const Q4KReference& ref = GetQ4KReference();
  const SmallQ4K& q4k = GetSmallQ4K(/*q4_k_m=*/true);
  const LlamaConfig& config = q4k.config;
  for (int32_t tp : {1, 2}) {
    CpuBackendOptions options = Q4KBackendOptions();
    options.tensor_parallel = tp;
    auto backend = CpuBackend::Create(config, &q4k.weights, options);
    ASSERT_TRUE(backend.ok()) << backend.status();
    EXPECT_EQ((*backend)->weight_quantization(), tp == 1 ? "q4_K+q6_K" : "q4_K+q6_K+q8_affine");
    const int32_t vocab = config.vocab_size;
    std::vector<float> logits(vocab);
    ErrorStats stats, unrounded;
    stats.rel_tol = kQ4KSplitRelTol;
    unrounded.rel_tol = kQ4KSplitRelTol;
    auto check = [&](int last, const std::string& where) {
      ExpectLogitsClose(logits.data(), ref.logits[last], where, &stats);
      ExpectLogitsClose(logits.data(), ref.unrounded[last], where, &unrounded);
    };
    const KvRun run{0, 4};
    for (int start = 0; start < kQ4KPrompt; start += 8) {
      const int n = std::min(8, kQ4KPrompt - start);
      PrefillChunk pc{0, start, absl::MakeConstSpan(ref.tokens).subspan(start, n), &run, 1};
      ASSERT_TRUE((*backend)->Prefill(pc, logits.data()).ok());
      check(start + n - 1, absl::StrCat("tp=", tp, " prefill to ", start + n));
    }
    StepDescriptor step;
    step.Resize(1, 1);
    step.active[0] = 1;
    step.num_runs[0] = 1;
    step.SlotRuns(0)[0] = run;
    for (int pos = kQ4KPrompt; pos < kQ4KPrompt + kQ4KDecode; ++pos) {
      step.position[0] = pos;
      step.token[0] = ref.tokens[pos];
      ASSERT_TRUE((*backend)->Decode(step, logits.data()).ok());
      check(pos, absl::StrCat("tp=", tp, " decode at ", pos));
    }
    const std::string name = absl::StrCat("tp=", tp, " ", std::string(CpuIsaName(GetParam())));
    stats.Print("small q4_K " + name);
    unrounded.Print("small q4_K against unrounded inputs " + name);
    std::printf("  median row: %.3g, against unrounded inputs %.3g\n", stats.Median(),
                unrounded.Median());
    if (tp == 1) {
      EXPECT_LE(stats.Median(), kQ4KRelTol);
      EXPECT_LT(stats.Median(), 0.5 * unrounded.Median());
    }
  }
}

// A rank's share of a row-parallel q4_K matrix: whole super-blocks stay q4_K (down's 1024
// inputs a rank), a share that splits one becomes q8 affine blocks of exactly its values (O's
// 384); either way the rank reads exactly the columns it owns.
TEST(Q4KShardTest, RowParallelSharesHoldTheirColumnsExactly) {
  const SmallQ4K& q4k = GetSmallQ4K(/*q4_k_m=*/true);
  // O in q6_K too: its 384-column shares split super-blocks into q8 halves blocks.
  std::vector<std::vector<std::byte>> blocks;
  LlamaWeights weights = q4k.weights;
  const WeightMatrix o6 = QuantizeKMatrix(GetSmall().weights.layers[0].wo, GgmlType::kQ6_K, &blocks);
  for (const WeightMatrix& o : {q4k.weights.layers[0].wo, o6}) {
    weights.layers[0].wo = o;
    const LayerWeights& whole = weights.layers[0];
    for (int32_t rank : {0, 1}) {
      absl::StatusOr<RankWeights> shard = ShardLlamaWeights(q4k.config, weights, rank, 2);
      ASSERT_TRUE(shard.ok()) << shard.status();
      const LayerWeights& l = shard->layers[0];
      EXPECT_EQ(l.wo.format, o.format == WeightFormat::kQ6K ? WeightFormat::kQ8Halves
                                                            : WeightFormat::kQ8Affine);
      EXPECT_EQ(l.w_down.format, WeightFormat::kQ6K);
      EXPECT_EQ(l.wq.format, WeightFormat::kQ4K);  // column-parallel: a row slice
      for (const auto& [part, full] : {std::pair{&l.wo, &whole.wo}, {&l.w_down, &whole.w_down}}) {
        ASSERT_EQ(part->cols * 2, full->cols);
        std::vector<float> got(part->cols), want(full->cols);
        for (int64_t r = 0; r < full->rows; r += 37) {
          WeightRowToFloat(*part, r, got.data());
          WeightRowToFloat(*full, r, want.data());
          for (int64_t c = 0; c < part->cols; ++c) {
            ASSERT_EQ(got[c], want[rank * part->cols + c]) << "rank " << rank << " row " << r;
          }
        }
      }
    }
  }
}

// --quantization=q4_K: the dense model's linear weights quantized to q4_K at load are the blocks
// the GGUF converter writes (the same quantizer), so the backend computes the same bits as over
// the q4_K matrices themselves. The tiny model's 128-value rows are not whole super-blocks: its
// matrices fall back to q8_0.
TEST(Q4KWeightsTest, QuantizedAtLoadComputesWhatTheQuantizedMatricesDo) {
  SetActiveCpuIsa(AvailableCpuIsas().back());
  const SmallQ4K& q4k = GetSmallQ4K();
  LlamaWeights dense = GetSmall().weights;
  dense.layers.resize(kQ4KLayers);
  CpuBackendOptions options = Q4KBackendOptions();
  auto from_file = CpuBackend::Create(q4k.config, &q4k.weights, options);
  options.quantization = WeightFormat::kQ4K;
  auto at_load = CpuBackend::Create(q4k.config, &dense, options);
  ASSERT_TRUE(from_file.ok() && at_load.ok());
  EXPECT_EQ((*at_load)->weight_quantization(), "q4_K");
  const int32_t vocab = q4k.config.vocab_size;
  std::vector<float> a(vocab), b(vocab);
  const Q4KReference& ref = GetQ4KReference();
  const KvRun run{0, 4};
  PrefillChunk pc{0, 0, absl::MakeConstSpan(ref.tokens).subspan(0, 8), &run, 1};
  ASSERT_TRUE((*from_file)->Prefill(pc, a.data()).ok());
  ASSERT_TRUE((*at_load)->Prefill(pc, b.data()).ok());
  EXPECT_EQ(a, b);
  StepDescriptor step;
  step.Resize(1, 1);
  step.active[0] = 1;
  step.num_runs[0] = 1;
  step.SlotRuns(0)[0] = run;
  step.position[0] = 8;
  step.token[0] = ref.tokens[8];
  ASSERT_TRUE((*from_file)->Decode(step, a.data()).ok());
  ASSERT_TRUE((*at_load)->Decode(step, b.data()).ok());
  EXPECT_EQ(a, b);

  Engine tiny = MakeEngine(GetTiny(DType::kBF16), 16, 16, 2, 16, 1, true, DType::kF32,
                           WeightFormat::kQ4K);
  EXPECT_EQ(tiny.backend->weight_quantization(), "q8_0");
}

INSTANTIATE_TEST_SUITE_P(AllIsas, Q4KForwardTest, testing::ValuesIn(AvailableCpuIsas()),
                         [](const testing::TestParamInfo<CpuIsa>& info) {
                           return std::string(CpuIsaName(info.param));
                         });

}  // namespace
}  // namespace kvrm
