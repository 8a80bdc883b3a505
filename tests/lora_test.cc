// Multi-LoRA serving: rows with different adapters (and none) in one pass, each against the
// float64 reference with that adapter merged into its weights (W + scale B A, read from the
// adapter's files here, not through the loader); tensor parallelism; batch independence; the
// engine and the service (adapter by name, prefix cache kept apart per adapter, refusals).
#include "model/lora.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/json.h"
#include "common/logging.h"
#include "common/testing/alloc_counter.h"
#include "gtest/gtest.h"
#include "model/safetensors.h"
#include "runtime/backend.h"
#include "runtime/cpu_backend.h"
#include "runtime/engine.h"
#include "runtime/model_bundle.h"
#include "server/openai_http.h"
#include "tests/http_client.h"
#include "tests/reference_llama.h"
#include "tests/test_server.h"
#include "tools/modelgen/lora_writer.h"
#include "tools/modelgen/model_writer.h"

namespace kvrm {
namespace {

std::string TmpDir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return tmp != nullptr ? tmp : "/tmp";
}

// An element of a safetensors tensor as double (f32, bf16, f16).
double ElementOf(const TensorView& t, int64_t i) {
  if (t.dtype == DType::kF32) {
    float v;
    std::memcpy(&v, t.data + i * 4, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, t.data + i * 2, 2);
  return t.dtype == DType::kBF16 ? Bf16ToFloat(h) : F16ToFloat(h);
}

// Merges the adapter in `dir` into `ref`'s linear weights: W += scale * B A, with the scale from
// adapter_config.json (lora_alpha / r, or / sqrt(r) with use_rslora) and A, B as PEFT names them.
// `bf16`: with the factors a backend keeping them in bf16 multiplies: A's values and (scale B)'s
// (the product rounded to f32, as the loader folds it) each rounded to bf16.
void MergeAdapter(const std::string& dir, ReferenceLlama* ref, bool bf16 = false) {
  std::ifstream in(dir + "/adapter_config.json");
  const Json config = Json::parse(in);
  const double r = config.at("r").get<double>();
  const double alpha = config.at("lora_alpha").get<double>();
  const double scale = config.value("use_rslora", false) ? alpha / std::sqrt(r) : alpha / r;
  auto file = SafetensorsFile::Open(dir + "/adapter_model.safetensors");
  CHECK_OK(file.status());
  int merged = 0;
  ref->ReplaceLinearWeights([&](const std::string& name, int64_t rows, int64_t cols, double* w) {
    // "model.layers.0.self_attn.q_proj.weight" -> "base_model.model.model.layers.0...lora_A..."
    const std::string stem = name.substr(0, name.size() - std::strlen(".weight"));
    const TensorView* a = (*file)->Find("base_model.model." + stem + ".lora_A.weight");
    const TensorView* b = (*file)->Find("base_model.model." + stem + ".lora_B.weight");
    if (a == nullptr || b == nullptr) return;
    const int64_t rank = a->shape[0];
    CHECK(a->shape[1] == cols && b->shape[0] == rows && b->shape[1] == rank) << name;
    for (int64_t o = 0; o < rows; ++o) {
      for (int64_t c = 0; c < cols; ++c) {
        double sum = 0;
        for (int64_t k = 0; k < rank; ++k) {
          const double bv = ElementOf(*b, o * rank + k), av = ElementOf(*a, k * cols + c);
          sum += bf16 ? double{Bf16ToFloat(FloatToBf16(static_cast<float>(bv * scale)))} *
                            Bf16ToFloat(FloatToBf16(static_cast<float>(av)))
                      : bv * av;
        }
        w[o * cols + c] += bf16 ? sum : scale * sum;
      }
    }
    ++merged;
  });
  CHECK(merged > 0) << dir;
}

// The f32 tiny model, two adapters (every projection at rank 8 in f32; q, v and down of the last
// layer at rank 4 with rsLoRA in bf16) and the three references: base, base + each adapter.
struct LoraModels {
  std::unique_ptr<ModelBundle> bundle;
  std::vector<std::string> dirs;
  std::unique_ptr<ReferenceLlama> base;
  std::vector<std::unique_ptr<ReferenceLlama>> merged;
  std::vector<std::unique_ptr<ReferenceLlama>> merged_bf16;  // with bf16-rounded factors
};

const LoraModels& GetModels() {
  static const LoraModels* models = [] {
    auto* m = new LoraModels;
    modelgen::MakeModelOptions options;
    options.size = "tiny";
    options.dtype = DType::kF32;
    options.out_dir = TmpDir() + "/lora_tiny_f32";
    CHECK_OK(modelgen::MakeModel(options).status());
    auto bundle = ModelBundle::Load(options.out_dir);
    CHECK_OK(bundle.status());
    m->bundle = std::move(*bundle);
    const LlamaConfig& config = m->bundle->config;
    modelgen::MakeLoraOptions all;
    all.out_dir = TmpDir() + "/lora_all";
    all.rank = 8;
    all.alpha = 16;
    all.seed = 11;
    modelgen::MakeLoraOptions qv;
    qv.out_dir = TmpDir() + "/lora_qv";
    qv.rank = 4;
    qv.alpha = 6;
    qv.use_rslora = true;
    qv.target_modules = {"q_proj", "v_proj", "down_proj"};
    qv.layers = {config.num_hidden_layers - 1};
    qv.dtype = DType::kBF16;
    qv.seed = 12;
    for (const modelgen::MakeLoraOptions* o : {&all, &qv}) {
      CHECK_OK(modelgen::MakeLoraAdapter(config, *o));
      auto adapter = LoadLoraAdapter(config, o == &all ? "all" : "qv", o->out_dir);
      CHECK_OK(adapter.status());
      m->bundle->lora_adapters.push_back(std::move(*adapter));
      m->dirs.push_back(o->out_dir);
    }
    auto base = ReferenceLlama::Create(config, *m->bundle->files);
    CHECK_OK(base.status());
    m->base = std::move(*base);
    for (const std::string& dir : m->dirs) {
      for (const bool bf16 : {false, true}) {
        auto ref = ReferenceLlama::Create(config, *m->bundle->files);
        CHECK_OK(ref.status());
        MergeAdapter(dir, ref->get(), bf16);
        (bf16 ? m->merged_bf16 : m->merged).push_back(std::move(*ref));
      }
    }
    return m;
  }();
  return *models;
}

constexpr int32_t kBlockTokens = 16;
constexpr int32_t kSlots = 3;
// Relative to max(1, max |ref|) of a row, as the base model's f32 forward test allows.
constexpr double kRelTol = 1e-5;

// The tests' backend shape: kSlots slots, 64 blocks, 256 positions, 2 threads; no adapters.
CpuBackendOptions TestBackendOptions() {
  CpuBackendOptions o;
  o.kv_blocks = 64;
  o.kv_block_tokens = kBlockTokens;
  o.max_slots = kSlots;
  o.max_chunk_tokens = 32;
  o.max_context = 256;
  o.num_threads = 2;
  return o;
}

std::unique_ptr<CpuBackend> MakeBackend(const ModelBundle& model, int32_t tp, bool adapters = true,
                                        DType lora_dtype = DType::kF32) {
  CpuBackendOptions o = TestBackendOptions();
  o.tensor_parallel = tp;
  o.lora_dtype = lora_dtype;
  if (adapters) {
    for (const LoraAdapter& a : model.lora_adapters) o.lora_adapters.push_back(&a);
  }
  auto backend = CpuBackend::Create(model.config, &model.weights, o);
  CHECK_OK(backend.status());
  return std::move(*backend);
}

std::vector<int32_t> RandomTokens(std::mt19937* rng, int n, int32_t vocab) {
  std::uniform_int_distribution<int32_t> d(0, vocab - 1);
  std::vector<int32_t> out(n);
  for (int32_t& t : out) t = d(*rng);
  return out;
}

// max |got - ref| / max(1, max |ref|) over one row.
double ScaledError(const float* got, const std::vector<double>& ref) {
  double max_ref = 0, max_diff = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(ref[i]));
    max_diff = std::max(max_diff, std::fabs(got[i] - ref[i]));
  }
  return max_diff / std::max(1.0, max_ref);
}

double ScaledDistance(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<float> af(a.begin(), a.end());
  return ScaledError(af.data(), b);
}

// (tensor-parallel ranks, factors kept in bf16).
class LoraForwardTest : public testing::TestWithParam<std::tuple<int32_t, bool>> {};

// Slot 0 runs adapter "all", slot 1 adapter "qv", slot 2 the base model: each prompt prefilled
// in chunks with its adapter, then teacher-forced decode steps with all three in one pass; every
// logit row against its own merged reference (with the bf16-rounded factors where the backend
// keeps them in bf16).
TEST_P(LoraForwardTest, MixedAdaptersInOnePassMatchTheirMergedReferences) {
  const LoraModels& m = GetModels();
  const int32_t vocab = m.bundle->config.vocab_size;
  const auto [tp, bf16] = GetParam();
  std::unique_ptr<CpuBackend> backend =
      MakeBackend(*m.bundle, tp, true, bf16 ? DType::kBF16 : DType::kF32);
  ASSERT_EQ(backend->max_lora_adapters(), 2);
  const int32_t adapter_of[kSlots] = {0, 1, -1};
  const auto& merged = bf16 ? m.merged_bf16 : m.merged;
  const ReferenceLlama* refs[kSlots] = {merged[0].get(), merged[1].get(), m.base.get()};
  constexpr int kDecodeSteps = 8;
  std::mt19937 rng(2024);
  std::vector<std::vector<int32_t>> seqs;
  std::vector<std::vector<std::vector<double>>> want;
  std::vector<KvRun> runs;
  double worst = 0;
  std::vector<float> logits(static_cast<size_t>(kSlots) * vocab);
  for (int32_t s = 0; s < kSlots; ++s) {
    const int prompt = 21 + 9 * s;
    seqs.push_back(RandomTokens(&rng, prompt + kDecodeSteps, vocab));
    want.push_back(refs[s]->Forward(seqs[s]));
    runs.push_back(KvRun{1 + s * 5, 5});  // 80 positions each, not from block 0
    for (int start = 0; start < prompt; start += 8) {
      const int n = std::min(8, prompt - start);
      PrefillChunk chunk{s, start, absl::MakeConstSpan(seqs[s]).subspan(start, n), &runs[s], 1};
      chunk.adapter = adapter_of[s];
      ASSERT_TRUE(backend->Prefill(chunk, logits.data()).ok());
      const double e = ScaledError(logits.data(), want[s][start + n - 1]);
      EXPECT_LE(e, kRelTol) << "slot " << s << " prefill to " << start + n;
      worst = std::max(worst, e);
    }
  }
  StepDescriptor step;
  step.Resize(kSlots, 2);
  for (int32_t s = 0; s < kSlots; ++s) {
    step.active[s] = 1;
    step.num_runs[s] = 1;
    step.SlotRuns(s)[0] = runs[s];
    step.adapter[s] = adapter_of[s];
  }
  for (int k = 0; k < kDecodeSteps; ++k) {
    for (int32_t s = 0; s < kSlots; ++s) {
      step.position[s] = 21 + 9 * s + k;
      step.token[s] = seqs[s][step.position[s]];
    }
    ASSERT_TRUE(backend->Decode(step, logits.data()).ok());
    for (int32_t s = 0; s < kSlots; ++s) {
      const double e = ScaledError(logits.data() + s * vocab, want[s][step.position[s]]);
      EXPECT_LE(e, kRelTol) << "slot " << s << " decode at " << step.position[s];
      worst = std::max(worst, e);
    }
  }
  // The adapters matter: their references are far from the base model's (a row that skipped its
  // adapter, or took another's, would fail above by this much).
  for (int32_t s = 0; s < 2; ++s) {
    const auto base = m.base->Forward(seqs[s]);
    EXPECT_GT(ScaledDistance(want[s].back(), base.back()), 100 * kRelTol) << "adapter " << s;
    if (bf16) {  // what rounding the factors changes, far above the tolerance held above
      const auto f32 = m.merged[s]->Forward(seqs[s]);
      std::printf("[tp %d bf16] adapter %d: f32 factors' reference is %.3g away\n", tp, s,
                  ScaledDistance(want[s].back(), f32.back()));
    }
  }
  std::printf("[tp %d%s] worst max|diff|/max(1,max|ref|) %.3g (tol %.1g)\n", tp,
              bf16 ? " bf16" : "", worst, kRelTol);
}

INSTANTIATE_TEST_SUITE_P(TensorParallelAndFactors, LoraForwardTest,
                         testing::Combine(testing::Values(1, 2), testing::Bool()),
                         [](const auto& info) {
                           return absl::StrCat("tp", std::get<0>(info.param),
                                               std::get<1>(info.param) ? "_bf16" : "_f32");
                         });

// A row's logits do not depend on what else is in the pass: adapter 0's slot alone, beside rows
// of the other adapter and the base model, and beside a prefill chunk of adapter 1 (a mixed
// step), bit for bit.
TEST(LoraBatchTest, RowsAreIndependentOfTheBatch) {
  const LoraModels& m = GetModels();
  const int32_t vocab = m.bundle->config.vocab_size;
  std::unique_ptr<CpuBackend> backend = MakeBackend(*m.bundle, 1);
  std::mt19937 rng(7);
  const std::vector<int32_t> seq = RandomTokens(&rng, 40, vocab);
  const KvRun run0{0, 3}, run1{10, 3}, run2{20, 3};  // 48 positions each
  PrefillChunk p0{0, 0, absl::MakeConstSpan(seq).first(30), &run0, 1};
  p0.adapter = 0;
  ASSERT_TRUE(backend->Prefill(p0, nullptr).ok());
  PrefillChunk p1{1, 0, absl::MakeConstSpan(seq).first(30), &run1, 1};
  p1.adapter = 1;
  ASSERT_TRUE(backend->Prefill(p1, nullptr).ok());
  StepDescriptor step;
  step.Resize(kSlots, 2);
  auto set = [&](int32_t s, const KvRun& run, int32_t adapter) {
    step.active[s] = 1;
    step.num_runs[s] = 1;
    step.SlotRuns(s)[0] = run;
    step.position[s] = 30;
    step.token[s] = seq[30];
    step.adapter[s] = adapter;
  };
  set(0, run0, 0);
  std::vector<float> alone(static_cast<size_t>(kSlots) * vocab), mixed(alone.size());
  ASSERT_TRUE(backend->Decode(step, alone.data()).ok());
  PrefillChunk p2base{2, 0, absl::MakeConstSpan(seq).first(30), &run2, 1};
  ASSERT_TRUE(backend->Prefill(p2base, nullptr).ok());
  set(1, run1, 1);
  set(2, run2, -1);
  ASSERT_TRUE(backend->Decode(step, mixed.data()).ok());
  EXPECT_EQ(std::memcmp(alone.data(), mixed.data(), vocab * sizeof(float)), 0);
  // Beside rows of its own adapter (its products then take several rows at once).
  set(1, run1, 0);
  set(2, run2, 0);
  ASSERT_TRUE(backend->Decode(step, mixed.data()).ok());
  EXPECT_EQ(std::memcmp(alone.data(), mixed.data(), vocab * sizeof(float)), 0);
  set(1, run1, 1);
  set(2, run2, -1);
  // The same step with a chunk of adapter 1 riding along (slot 2's own blocks).
  step.active[2] = 0;
  std::vector<float> fused(alone.size()), chunk_logits(vocab), chunk_apart(vocab);
  const KvRun run3{30, 3};
  PrefillChunk p2{2, 0, absl::MakeConstSpan(seq).first(12), &run3, 1};
  p2.adapter = 1;
  ASSERT_TRUE(backend->DecodeWithChunk(p2, chunk_logits.data(), step, fused.data()).ok());
  EXPECT_EQ(std::memcmp(alone.data(), fused.data(), vocab * sizeof(float)), 0);
  ASSERT_TRUE(backend->Prefill(p2, chunk_apart.data()).ok());
  EXPECT_EQ(std::memcmp(chunk_logits.data(), chunk_apart.data(), vocab * sizeof(float)), 0);
}

TEST(LoraBatchTest, DecodeWithAdaptersDoesNotAllocate) {
  if (!alloc_counter::kAvailable) GTEST_SKIP() << "allocation counting is off under sanitizers";
  const LoraModels& m = GetModels();
  std::unique_ptr<CpuBackend> backend = MakeBackend(*m.bundle, 1);
  std::vector<float> logits(static_cast<size_t>(kSlots) * m.bundle->config.vocab_size);
  StepDescriptor step;
  step.Resize(kSlots, 2);
  for (int32_t s = 0; s < kSlots; ++s) {
    step.active[s] = 1;
    step.num_runs[s] = 1;
    step.SlotRuns(s)[0] = KvRun{s * 4, 4};
    step.position[s] = 5 + s;
    step.token[s] = 3 + s;
    step.adapter[s] = s - 1;
  }
  ASSERT_TRUE(backend->Decode(step, logits.data()).ok());  // warm
  const int64_t before = alloc_counter::AllocationCount();
  ASSERT_TRUE(backend->Decode(step, logits.data()).ok());
  EXPECT_EQ(alloc_counter::AllocationCount() - before, 0);
}

TEST(LoraBatchTest, RefusesAdaptersTheBackendDoesNotServe) {
  const LoraModels& m = GetModels();
  std::unique_ptr<CpuBackend> backend = MakeBackend(*m.bundle, 1);
  std::unique_ptr<CpuBackend> plain = MakeBackend(*m.bundle, 1, /*adapters=*/false);
  EXPECT_EQ(plain->max_lora_adapters(), 0);
  std::vector<float> logits(static_cast<size_t>(kSlots) * m.bundle->config.vocab_size);
  StepDescriptor step;
  step.Resize(kSlots, 2);
  step.active[0] = 1;
  step.num_runs[0] = 1;
  step.SlotRuns(0)[0] = KvRun{0, 2};
  step.adapter[0] = 2;
  absl::Status st = backend->Decode(step, logits.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("LoRA adapter 2"), std::string::npos) << st;
  step.adapter[0] = 0;
  EXPECT_EQ(plain->Decode(step, logits.data()).code(), absl::StatusCode::kInvalidArgument);
  const int32_t tokens[] = {1, 2, 3};
  const KvRun run{0, 2};
  PrefillChunk chunk{0, 0, tokens, &run, 1};
  chunk.adapter = -2;
  EXPECT_EQ(backend->Prefill(chunk, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

// Adapter slots filled and emptied between steps (what a load and an unload while serving do
// on the backend): an adapter put in an empty slot gives its merged reference's logits, an
// emptied slot and one never filled are refused, and a rank above max_lora_rank is refused at
// preparation naming the flag.
TEST(LoraBatchTest, SlotsFilledAndEmptiedBetweenSteps) {
  const LoraModels& m = GetModels();
  const int32_t vocab = m.bundle->config.vocab_size;
  CpuBackendOptions o = TestBackendOptions();
  o.lora_adapters = {&m.bundle->lora_adapters[1]};  // "qv" (rank 4) in slot 0
  o.max_lora_adapters = 3;
  o.max_lora_rank = 8;
  auto backend = CpuBackend::Create(m.bundle->config, &m.bundle->weights, o);
  ASSERT_TRUE(backend.ok()) << backend.status();
  CpuBackend& b = **backend;
  EXPECT_EQ(b.max_lora_adapters(), 3);
  EXPECT_EQ(b.max_lora_rank(), 8);
  std::mt19937 rng(99);
  const std::vector<int32_t> seq = RandomTokens(&rng, 24, vocab);
  const std::vector<std::vector<double>> want_all = m.merged[0]->Forward(seq);
  const KvRun run{0, 2};
  std::vector<float> logits(static_cast<size_t>(kSlots) * vocab);
  PrefillChunk chunk{0, 0, seq, &run, 1};
  chunk.adapter = 2;  // empty
  absl::Status st = b.Prefill(chunk, logits.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("not in a slot"), std::string::npos) << st;
  // "all" (rank 8) into slot 2: its reference's logits.
  auto prepared = b.PrepareLoraAdapter(m.bundle->lora_adapters[0]);
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  ASSERT_TRUE(b.SetLoraAdapter(2, *prepared).ok());
  ASSERT_TRUE(b.Prefill(chunk, logits.data()).ok());
  EXPECT_LE(ScaledError(logits.data(), want_all.back()), kRelTol);
  // Emptied: refused again; slot 0 still serves "qv".
  ASSERT_TRUE(b.SetLoraAdapter(2, nullptr).ok());
  EXPECT_EQ(b.Prefill(chunk, logits.data()).code(), absl::StatusCode::kInvalidArgument);
  chunk.adapter = 0;
  ASSERT_TRUE(b.Prefill(chunk, logits.data()).ok());
  EXPECT_LE(ScaledError(logits.data(), m.merged[1]->Forward(seq).back()), kRelTol);
  EXPECT_EQ(b.SetLoraAdapter(3, *prepared).code(), absl::StatusCode::kInvalidArgument);

  // A backend sized for rank 4 takes "qv" and refuses "all".
  o.max_lora_rank = 4;
  auto narrow = CpuBackend::Create(m.bundle->config, &m.bundle->weights, o);
  ASSERT_TRUE(narrow.ok()) << narrow.status();
  auto refused = (*narrow)->PrepareLoraAdapter(m.bundle->lora_adapters[0]);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("--max_lora_rank"), std::string::npos)
      << refused.status();
  // Fewer slots than adapters to serve from the start, or a rank beyond the kernels', refused.
  o.max_lora_adapters = 0;
  o.lora_adapters = {&m.bundle->lora_adapters[0]};
  EXPECT_EQ(CpuBackend::Create(m.bundle->config, &m.bundle->weights, o).status().code(),
            absl::StatusCode::kInvalidArgument);  // rank 8 > max_lora_rank 4
}

// ---- through the engine and the service ---------------------------------------------------

// The test server's tiny model with two built-in-style adapters.
std::unique_ptr<ModelBundle> TinyWithAdapters() {
  std::unique_ptr<ModelBundle> model(LoadTinyModel());
  for (const auto& [name, seed] : {std::pair{"sql", 1}, std::pair{"chat", 2}}) {
    modelgen::MakeLoraOptions o;
    o.out_dir = absl::StrCat(TmpDir(), "/server_lora_", name);
    o.seed = seed;
    CHECK_OK(modelgen::MakeLoraAdapter(model->config, o));
    auto adapter = LoadLoraAdapter(model->config, name, o.out_dir);
    CHECK_OK(adapter.status());
    model->lora_adapters.push_back(std::move(*adapter));
  }
  return model;
}

EngineOptions ServerOptionsForLora() {
  EngineOptions o;
  o.slots = 4;
  o.max_context = 256;
  o.prefill_chunk = 32;
  o.threads = 2;
  return o;
}

v1::GenerateRequest Greedy(const std::string& prompt, const std::string& adapter, int tokens) {
  v1::GenerateRequest r = TextRequest(prompt, tokens);
  r.mutable_sampling()->set_temperature(0);
  r.mutable_stopping()->set_ignore_eos(true);
  r.set_lora_adapter(adapter);
  return r;
}

TEST(LoraServiceTest, AdaptersByNameAloneAndTogether) {
  TestServer server(TinyWithAdapters(), ServerOptionsForLora());
  const std::string prompt = "the quick brown fox jumps over the lazy dog";
  std::map<std::string, std::vector<int32_t>> alone;
  for (const std::string adapter : {"", "sql", "chat"}) {
    StreamResult r = RunGenerate(server.stub(), Greedy(prompt, adapter, 24));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    ASSERT_EQ(r.tokens.size(), 24u);
    alone[adapter] = r.tokens;
  }
  EXPECT_NE(alone[""], alone["sql"]);
  EXPECT_NE(alone["sql"], alone["chat"]);
  // The three at once, in the same steps: each gets what it got alone.
  std::vector<std::thread> threads;
  std::map<std::string, StreamResult> together;
  std::mutex mu;
  for (const std::string adapter : {"", "sql", "chat", "sql"}) {
    threads.emplace_back([&, adapter] {
      StreamResult r = RunGenerate(server.stub(), Greedy(prompt, adapter, 24));
      std::lock_guard<std::mutex> lock(mu);
      EXPECT_TRUE(r.status.ok()) << r.status.error_message();
      EXPECT_EQ(r.tokens, alone[adapter]) << "adapter '" << adapter << "'";
    });
  }
  for (std::thread& t : threads) t.join();
  // ModelInfo lists them.
  grpc::ClientContext context;
  v1::ModelInfo info;
  ASSERT_TRUE(server.stub().GetModelInfo(&context, v1::GetModelInfoRequest(), &info).ok());
  ASSERT_EQ(info.lora_adapters_size(), 2);
  EXPECT_EQ(info.lora_adapters(0).name(), "sql");
  EXPECT_EQ(info.lora_adapters(0).rank(), 8);
  EXPECT_EQ(info.lora_adapters(0).target_modules_size(), 7);
  EXPECT_EQ(info.lora_adapters(1).name(), "chat");
}

// Speculative decoding's draft rows run with their slot's adapter: every adapter's greedy tokens
// are the same with drafts as without, and some drafts were accepted.
TEST(LoraServiceTest, DraftRowsRunWithTheirSlotsAdapter) {
  TestServer plain(TinyWithAdapters(), ServerOptionsForLora());
  EngineOptions o = ServerOptionsForLora();
  o.speculative_tokens = 4;
  TestServer drafting(TinyWithAdapters(), o);
  const std::string prompt = "one two three one two three one two three one two";
  for (const std::string adapter : {"", "sql", "chat"}) {
    StreamResult want = RunGenerate(plain.stub(), Greedy(prompt, adapter, 40));
    StreamResult got = RunGenerate(drafting.stub(), Greedy(prompt, adapter, 40));
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    EXPECT_EQ(got.tokens, want.tokens) << "adapter '" << adapter << "'";
  }
  EXPECT_GT(drafting.engine().Stats().spec_decode_accepted_tokens_total, 0u);
}

TEST(LoraServiceTest, UnknownAdapterIsRefusedByName) {
  TestServer server(TinyWithAdapters(), ServerOptionsForLora());
  StreamResult r = RunGenerate(server.stub(), Greedy("hello", "nope", 4));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(r.status.error_message().find("lora_adapter"), std::string::npos)
      << r.status.error_message();
  EXPECT_NE(r.status.error_message().find("`sql`, `chat`"), std::string::npos)
      << r.status.error_message();
  TestServer plain(ServerOptionsForLora());
  r = RunGenerate(plain.stub(), Greedy("hello", "sql", 4));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(r.status.error_message().find("serves no LoRA adapters"), std::string::npos)
      << r.status.error_message();
}

// An adapter's K/V are its own: a prompt cached under one adapter is not reused by the base
// model or by another adapter, and is by the same adapter; every reply is what it is uncached.
TEST(LoraServiceTest, PrefixCacheIsKeptApartPerAdapter) {
  TestServer server(TinyWithAdapters(), ServerOptionsForLora());
  std::string prompt;
  for (int i = 0; i < 12; ++i) absl::StrAppend(&prompt, "word", i, " and more text ");
  StreamResult first = RunGenerate(server.stub(), Greedy(prompt, "sql", 8));
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  ASSERT_GT(first.finished.usage().prompt_tokens(), 2 * 16);
  EXPECT_EQ(first.finished.usage().cached_prompt_tokens(), 0);
  StreamResult base = RunGenerate(server.stub(), Greedy(prompt, "", 8));
  EXPECT_EQ(base.finished.usage().cached_prompt_tokens(), 0);
  StreamResult other = RunGenerate(server.stub(), Greedy(prompt, "chat", 8));
  EXPECT_EQ(other.finished.usage().cached_prompt_tokens(), 0);
  StreamResult again = RunGenerate(server.stub(), Greedy(prompt, "sql", 8));
  EXPECT_GE(again.finished.usage().cached_prompt_tokens(), 2 * 16);
  EXPECT_EQ(again.tokens, first.tokens);
  // n = 2 with the adapter: the prompt is prefilled once, the second completion starts from the
  // first's cached blocks (the follower keeps the adapter and its cache key).
  v1::GenerateRequest two = Greedy(prompt + " again", "chat", 4);
  two.set_n(2);
  StreamResult both = RunGenerate(server.stub(), two);
  ASSERT_TRUE(both.status.ok()) << both.status.error_message();
  int finished = 0;
  for (const v1::GenerateResponse& m : both.messages) {
    if (!m.has_finished()) continue;
    ++finished;
    if (m.index() == 1) {
      EXPECT_GE(m.finished().usage().cached_prompt_tokens(), 2 * 16);
    }
  }
  EXPECT_EQ(finished, 2);
  // The base model's reply from a server that never saw the adapters' requests.
  TestServer fresh(ServerOptionsForLora());
  EXPECT_EQ(RunGenerate(fresh.stub(), Greedy(prompt, "", 8)).tokens, base.tokens);
}

// The HTTP API: `model` naming an adapter runs it (the same tokens as gRPC's lora_adapter),
// /v1/models lists the adapters with the base model as their parent, other names are 404.
TEST(LoraServiceTest, HttpModelNamesTheAdapter) {
  TestServer server(TinyWithAdapters(), ServerOptionsForLora());
  OpenAiHttpOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.served_model_name = "tiny";
  o.lora_adapters = [] { return std::vector<std::string>{"sql", "chat"}; };
  o.max_context = server.engine().options().max_context;
  o.tokenizer = server.model().tokenizer.get();
  auto http = OpenAiHttpServer::Start(server.server().InProcessChannel(), o);
  ASSERT_TRUE(http.ok()) << http.status();
  const int port = (*http)->port();
  HttpReply models = HttpCall(port, "GET", "/v1/models");
  ASSERT_EQ(models.status, 200) << models.body;
  const Json list = Json::parse(models.body);
  ASSERT_EQ(list["data"].size(), 3u);
  EXPECT_EQ(list["data"][0]["id"], "tiny");
  EXPECT_TRUE(list["data"][0]["parent"].is_null());
  EXPECT_EQ(list["data"][1]["id"], "sql");
  EXPECT_EQ(list["data"][1]["parent"], "tiny");
  EXPECT_EQ(list["data"][1]["root"], server.model().lora_adapters[0].path);
  EXPECT_EQ(list["data"][2]["id"], "chat");
  EXPECT_EQ(HttpCall(port, "GET", "/v1/models/chat").status, 200);
  EXPECT_EQ(HttpCall(port, "GET", "/v1/models/nope").status, 404);
  for (const std::string model : {"tiny", "sql", "chat"}) {
    StreamResult want =
        RunGenerate(server.stub(), Greedy("The capital of", model == "tiny" ? "" : model, 10));
    ASSERT_TRUE(want.status.ok()) << want.status.error_message();
    HttpReply r = HttpCall(port, "POST", "/v1/completions",
                           absl::StrCat(R"({"model": ")", model, R"(", "prompt": "The capital of",
                               "max_tokens": 10, "temperature": 0, "ignore_eos": true})"));
    ASSERT_EQ(r.status, 200) << r.body;
    const Json j = Json::parse(r.body);
    EXPECT_EQ(j["model"], model);
    EXPECT_EQ(j["choices"][0]["text"], want.text) << model;
  }
  HttpReply wrong = HttpCall(port, "POST", "/v1/completions",
                             R"({"model": "nope", "prompt": "x", "max_tokens": 2})");
  EXPECT_EQ(wrong.status, 404);
  EXPECT_NE(wrong.body.find("the LoRA adapters `sql`, `chat`"), std::string::npos) << wrong.body;
}

}  // namespace
}  // namespace kvrm
