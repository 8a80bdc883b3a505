// Decode and prefill throughput of the CPU backend on a generated model, beside the memory
// roofline measured in the same run.
//
//   bazel run //bench:cpu_decode_bench -- [--size=small] [--dtypes=f32,bf16] [--slots=1,4,8,16]
//       [--contexts=128,1024] [--prompts=128,1024] [--threads=2] [--tp=1] [--isas=auto]
//       [--json=FILE]
//
// Roofline: a decode step reads every weight byte once (whatever the number of slots) plus each
// active slot's KV history, so at best it takes (weight bytes + KV bytes) / B, where B is the read
// bandwidth measured here by a STREAM-style kernel (a sum over a buffer much larger than the
// caches, on all threads). Figures are noisy on shared machines: compare the ratio to the
// roofline, measured side by side.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/compute_peak.h"
#include "common/dtype.h"
#include "common/logging.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/thread_pool.h"
#include "model/gguf.h"
#include "model/gguf_quants.h"
#include "nlohmann/json.hpp"
#include "runtime/backend.h"
#include "runtime/cpu_backend.h"
#include "runtime/kv_pool.h"
#include "runtime/model_bundle.h"
#include "tools/gguf/gguf_convert.h"
#include "tools/modelgen/model_writer.h"
#include "tools/modelgen/quantized_writer.h"

ABSL_FLAG(std::string, size, "small", "generated model shape (tools/modelgen): tiny or small");
ABSL_FLAG(std::string, dtypes, "f32,bf16",
          "weight dtypes to measure (f32, f16, bf16; q8_0: the bf16 model quantized at load; a "
          "GGUF type such as q4_K, or q4_K_M (llama-quantize's mix): the bf16 model converted to "
          "that GGUF type; q4_K_as_q8, q6_K_as_q8, q4_K_M_as_q8: that file with its K-quant "
          "matrices held as exact 8-bit blocks (q8 affine, q8 halves), as before kvrm multiplied "
          "q4_K and q6_K); file:PATH: that GGUF file as it is (another program's, e.g. llama.cpp's "
          "llama-quantize output, to time both on the same file); awq, gptq, gptq_act_order, "
          "w4a16: the bf16 model as a 4-bit group-128 quantized checkpoint of that kind "
          "(tools/modelgen/quantized_writer.h), loaded as kvrmd does; fp8 (Transformers' FP8, "
          "128x128 blocks: requantized to q8_0 at load), w8a8 (compressed-tensors int8 by "
          "channel: exactly q8_0), nf4 (bitsandbytes NF4, double-quantized: q8_0 at load), "
          "mxfp4 (a gpt_oss model's experts as gpt-oss ships them, multiplied as they are), "
          "mxfp4_as_q8 (the same held as q8_0 blocks of exactly their values): "
          "those checkpoints likewise; NAME+q8_0: that case with "
          "what it leaves dense (a checkpoint's LM head) quantized to q8_0 at load; NAME+q4_K: "
          "to q4_K, and its requantized matrices (nf4's, fp8's) q4_K too, as kvrmd "
          "--quantization=q4_K");
ABSL_FLAG(std::string, slots, "1,4,8,16", "active decode slots");
ABSL_FLAG(std::string, contexts, "128,1024", "history length of every slot during decode");
ABSL_FLAG(std::string, prompts, "128,1024", "prefill prompt lengths");
ABSL_FLAG(int32_t, chunk, 256, "prefill chunk tokens");
ABSL_FLAG(std::string, mixed_chunks, "32",
          "chunk sizes for the mixed-step cases: a chunk beside each decode case, run apart "
          "(Prefill, then Decode) and in one pass (DecodeWithChunk); empty: none");
ABSL_FLAG(int32_t, steps, 8, "timed decode steps per window (after 2 warm-up steps)");
ABSL_FLAG(int32_t, windows, 3, "timed windows per decode case; the fastest is reported");
ABSL_FLAG(int32_t, threads, 2, "threads (all ranks together)");
ABSL_FLAG(int32_t, tp, 1, "tensor-parallel ranks");
ABSL_FLAG(int64_t, stream_mb, 512, "bandwidth test buffer, MiB");
ABSL_FLAG(std::string, model_dir, "", "where to generate the models (default: a temp dir)");
ABSL_FLAG(bool, kernels, false, "also time single matmuls (GFLOP/s, GB/s) on the small shapes");
ABSL_FLAG(std::string, json, "", "also write the results to this JSON file");
ABSL_FLAG(std::string, kv_dtypes, "f32",
          "KV cache dtypes (f32, bf16, fp8, fp8_e5m2); with several, every case runs on each "
          "back to back");
ABSL_FLAG(std::string, layouts, "panels",
          "weight layouts: panels (as kvrmd loads them for the best path), rows (row-major "
          "only); with both, every case runs on each back to back (side by side)");
ABSL_FLAG(std::string, isas, "auto",
          "kernel paths, comma-separated: auto (the best available), generic, avx2, avx512, "
          "avx512_bf16; with several, every case runs on each back to back (side by side)");

namespace kvrm {
namespace {

using Clock = std::chrono::steady_clock;

// CPU seconds this process has used (all threads; spinning counts).
double ProcessCpuSeconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::vector<int32_t> IntList(const std::string& text) {
  std::vector<int32_t> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int32_t v = 0;
    CHECK(absl::SimpleAtoi(part, &v) && v > 0) << "bad list element: " << std::string(part);
    out.push_back(v);
  }
  return out;
}

// Read bandwidth in bytes/s: every thread sums its share of a buffer far larger than the caches
// (a STREAM-style read kernel: decode only reads weights and KV). Measured at the start and again
// before every case, so that the roofline reflects the machine's best in this run on a shared
// machine: best() is the maximum of all measurements.
class ReadBandwidth {
 public:
  ReadBandwidth(int threads, int64_t bytes)
      : pool_(threads), n_(bytes / sizeof(float) / 1024 * 1024), buffer_(n_), sink_(threads * 16) {
    pool_.ParallelFor(n_, 4096, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) buffer_[i] = static_cast<float>(i & 1023);
    });
  }

  // Best of `passes` passes now; also folds it into best().
  double Measure(int passes) {
    double now = 0;
    const int threads = pool_.num_threads();
    for (int pass = 0; pass < passes; ++pass) {
      const auto t0 = Clock::now();
      // Passes take turns: no software prefetch, 8 KiB ahead (the row-major decode tiles) and
      // 32 KiB ahead (about a panel of the small model, as the panel kernels do): the roofline
      // is the best way to read, so a kernel cannot beat it by reading smarter.
      constexpr int64_t kAheadFloats[] = {0, 2048, 8192};
      const int64_t ahead = kAheadFloats[pass % 3];
      pool_.RunOnAll([&](int t) {
        const int64_t b = n_ * t / threads / 64 * 64, e = n_ * (t + 1) / threads / 64 * 64;
        float acc[64] = {};
        for (int64_t i = b; i < e; i += 64) {
          if (ahead != 0) {
            for (int j = 0; j < 64; j += 16) __builtin_prefetch(&buffer_[i + j] + ahead, 0, 0);
          }
          for (int j = 0; j < 64; ++j) acc[j] += buffer_[i + j];
        }
        std::copy(acc, acc + 16, &sink_[t * 16]);
        for (int j = 16; j < 64; ++j) sink_[t * 16 + j % 16] += acc[j];
      });
      now = std::max(now, static_cast<double>(n_) * sizeof(float) / Seconds(t0, Clock::now()));
    }
    best_ = std::max(best_, now);
    return now;
  }
  double best() const { return best_; }

 private:
  ThreadPool pool_;
  const int64_t n_;
  std::vector<float> buffer_;
  std::vector<float> sink_;
  double best_ = 0;
};

bool ParseDType(absl::string_view name, DType* out) {
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16}) {
    if (name == absl::string_view(DTypeName(d).data(), DTypeName(d).size())) {
      *out = d;
      return true;
    }
  }
  return false;
}

// Bytes of linear weights a decode step reads: block panels (their blocks, scales and padding)
// for the matrices that have them (block formats; and dense ones when the engine quantizes them
// at load, `quantization`: q8_0, or q4_K where rows are whole super-blocks), else the stored
// matrix. A mixture of experts' layer reads its router and the experts its rows chose:
// `experts_run` (layer, expert) pairs a step on average, as the backend counted them
// (CpuBackend::experts_run), of the E per MoE layer the file holds.
double WeightBytesPerStep(const LlamaConfig& c, const LlamaWeights& w, WeightFormat quantization,
                          double experts_run) {
  auto bytes = [&](const WeightMatrix& m) -> double {
    if (WeightMatrix::IsQuantized(m.format)) return BlockPanelBytes(m);
    if (quantization == WeightFormat::kDense) return m.bytes();
    return BlockPanelBytes(m, quantization == WeightFormat::kQ4K &&
                                      m.cols % WeightMatrix::kQ4KBlock == 0
                                  ? WeightFormat::kQ4K
                                  : WeightFormat::kQ8_0);
  };
  const int64_t moe_layers = c.NumMoeLayers();
  const double chosen = moe_layers > 0 ? experts_run / (double{c.num_experts} * moe_layers) : 1;
  double total = bytes(w.lm_head);
  for (const LayerWeights& l : w.layers) {
    // Every linear product (a shared expert's too), less the share of the experts not chosen.
    ForEachLinearWeight(l, [&](const WeightMatrix& m) { total += bytes(m); });
    if (l.router.data == nullptr) continue;
    total += l.router.bytes();
    for (const auto* experts : {&l.expert_gate, &l.expert_up, &l.expert_down}) {
      for (const WeightMatrix& m : *experts) total -= bytes(m) * (1 - chosen);
    }
  }
  return total;
}

// The GGUF type named `name` ("q4_K"), or null.
const GgmlTypeTraits* GgufTypeNamed(absl::string_view name) {
  for (uint32_t id = 0; id < 64; ++id) {
    const GgmlTypeTraits* t = FindGgmlType(id);
    if (t != nullptr && name == t->name) return t;
  }
  return nullptr;
}

// Times y = x W^T for W [rows][cols] of `dtype` (its q8_0 panels when `q8`) at n activation
// rows: GFLOP/s and weight GB/s.
void TimeMatMul(DType dtype, bool q8, int64_t rows, int64_t cols, int64_t n, int threads) {
  std::vector<uint16_t> half(rows * cols, 0x3c00);
  std::vector<float> full(rows * cols, 0.5f);
  WeightMatrix w{dtype,
                 dtype == DType::kF32 ? static_cast<const void*>(full.data())
                                      : static_cast<const void*>(half.data()),
                 rows, cols, cols};
  // The panel copy the CPU backend packs for the best path, where this path reads it.
  std::optional<PanelCopy> panels;
  if (q8) {
    w.panels = panels.emplace(w, WeightFormat::kQ8_0).data();
    w.panel_format = WeightFormat::kQ8_0;
  } else if (MatMulReadsPanels(ActiveCpuIsa(), dtype)) {
    w.panels = panels.emplace(w).data();
  }
  std::vector<float> x(n * cols, 0.25f), y(n * rows);
  ThreadPool pool(threads);
  std::vector<float> scratch(threads * MatMulScratchFloats(cols));
  // Enough repetitions for ~0.2 s.
  const int reps =
      static_cast<int>(std::max<int64_t>(3, 2e8 / (rows * cols * std::max<int64_t>(n, 8))));
  MatMul(pool, x.data(), n, cols, w, y.data(), rows, scratch.data());
  const auto t0 = Clock::now();
  for (int r = 0; r < reps; ++r) MatMul(pool, x.data(), n, cols, w, y.data(), rows, scratch.data());
  const double s = Seconds(t0, Clock::now()) / reps;
  std::printf("matmul %-11s %-4s %-6s %5lld x %5lld  n=%4lld  threads=%d: %8.1f us  %7.1f GFLOP/s  "
              "%6.1f GB/s\n",
              std::string(CpuIsaName(ActiveCpuIsa())).c_str(),
              q8 ? "q8_0" : std::string(DTypeName(dtype)).c_str(),
              w.panels != nullptr ? "panels" : "rows",
              static_cast<long long>(rows), static_cast<long long>(cols),
              static_cast<long long>(n), threads, s * 1e6, 2.0 * rows * cols * n / s / 1e9,
              (q8 ? panels->bytes() : w.bytes()) / s / 1e9);
}

struct Loaded {
  std::unique_ptr<ModelBundle> bundle;
  std::unique_ptr<CpuBackend> backend;
  int32_t blocks_per_slot = 0;
  int32_t max_context = 0;
  int64_t kv_bytes_per_token = 0;  // all ranks' pools
  DType kv_dtype = DType::kF32;
  WeightFormat quantization = WeightFormat::kDense;
  std::vector<std::vector<std::byte>> converted;  // the *_as_q8 blocks
};

// Every q4_K and q6_K matrix of `w` as 8-bit blocks of exactly its values (q8 affine, q8
// halves), in `out`.
void KQuantsTo8Bit(LlamaWeights& w, std::vector<std::vector<std::byte>>* out) {
  auto convert = [&](WeightMatrix& m) {
    if (!WeightMatrix::IsKQuant(m.format)) return;
    const GgmlType type = GgmlTypeOf(m.format);
    const WeightFormat format = Exact8BitFormat(type);
    const int64_t from = m.DataBytes(m.cols);
    const int64_t to = m.cols / WeightMatrix::kQ8Block * WeightMatrix::DataBlockSize(format);
    std::vector<std::byte>& blocks = out->emplace_back(m.rows * to);
    for (int64_t r = 0; r < m.rows; ++r) {
      CHECK(ToExact8Bit(type, static_cast<const std::byte*>(m.data) + r * from, m.cols,
                        blocks.data() + r * to));
    }
    m = WeightMatrix{m.dtype, blocks.data(), m.rows, m.cols, m.cols, nullptr, format};
  };
  convert(w.lm_head);
  for (LayerWeights& l : w.layers) {
    ForEachLinearWeight(l, convert);
  }
}

Loaded Load(const std::string& dir, int32_t max_slots, int32_t max_context, bool panels,
            DType kv_dtype, WeightFormat quantization, bool as_q8) {
  Loaded m;
  // As kvrmd loads it: --quantization=q4_K also requantizes a checkpoint's non-exact matrices
  // to q4_K.
  ModelBundle::LoadOptions load;
  if (quantization == WeightFormat::kQ4K) load.requantize_as = WeightFormat::kQ4K;
  load.mxfp4 = !as_q8;  // mxfp4_as_q8: MXFP4 experts as q8_0 blocks of the same values
  auto bundle = ModelBundle::Load(dir, load);
  CHECK_OK(bundle.status());
  m.bundle = std::move(*bundle);
  if (as_q8) KQuantsTo8Bit(m.bundle->weights, &m.converted);
  constexpr int32_t kBlockTokens = 16;
  m.blocks_per_slot = (max_context + kBlockTokens - 1) / kBlockTokens;
  m.max_context = max_context;
  CpuBackendOptions o;
  // One slot more than the decode cases use: the mixed cases' chunk goes there.
  o.kv_blocks = static_cast<int64_t>(m.blocks_per_slot) * (max_slots + 1);
  o.kv_block_tokens = kBlockTokens;
  o.max_slots = max_slots + 1;
  o.max_chunk_tokens = absl::GetFlag(FLAGS_chunk);
  o.max_context = max_context;
  o.num_threads = absl::GetFlag(FLAGS_threads);
  o.tensor_parallel = absl::GetFlag(FLAGS_tp);
  o.weight_panels = panels;
  o.quantization = quantization;
  o.kv_dtype = kv_dtype;
  m.kv_dtype = kv_dtype;
  m.quantization = quantization;
  auto backend = CpuBackend::Create(m.bundle->config, &m.bundle->weights, o);
  CHECK_OK(backend.status());
  m.backend = std::move(*backend);
  // Real data in every KV page: untouched anonymous pages all map the zero page, which would
  // read from cache and flatter the attention.
  for (int32_t r = 0; r < m.backend->num_kv_pools(); ++r) {
    KvPool* pool = m.backend->kv_pool(r);
    m.kv_bytes_per_token += pool->shape().BytesPerToken();
    for (int32_t l = 0; l < pool->shape().num_layers; ++l) {
      const KvLayerView v = pool->Layer(l);
      const int64_t elems = v.head_stride * pool->shape().kv_heads;
      for (void* base : {v.k, v.v}) {
        for (int64_t i = 0; i < elems; ++i) {
          const float x = 0.01f * static_cast<float>(i % 97);
          if (v.dtype == DType::kBF16) {
            static_cast<uint16_t*>(base)[i] = FloatToBf16(x);
          } else if (v.dtype == DType::kF8E4M3) {
            static_cast<uint8_t*>(base)[i] = FloatToF8E4M3(x);
          } else if (v.dtype == DType::kF8E5M2) {
            static_cast<uint8_t*>(base)[i] = FloatToF8E5M2(x);
          } else {
            CHECK(v.dtype == DType::kF32);
            static_cast<float*>(base)[i] = x;
          }
        }
      }
    }
  }
  return m;
}

// The q8 panels' formats ("q8_0", "q8_affine": every path reads them), "panels" when this path
// reads the backend's weight panels, else "rows".
std::string WeightLayout(const Loaded& m) {
  if (!m.backend->weight_quantization().empty()) return m.backend->weight_quantization();
  return m.backend->panel_weight_bytes() > 0 &&
                 MatMulReadsPanels(ActiveCpuIsa(), m.bundle->weights.dtype)
             ? "panels"
             : "rows";
}

struct DecodeResult {
  std::string isa;
  std::string layout;  // of the weights: panels or rows
  std::string kv;      // KV cache dtype
  std::string dtype;
  int32_t slots, context;
  double tokens_per_s, step_ms, roofline_tokens_per_s, mb_per_step;
  double bytes_per_step, bandwidth_now;  // the roofline is filled in at the end from best()
  // CPU time the process got during the fastest window / (wall time * threads): below 1 when
  // other processes took the cores (the figures are then low by about that factor).
  double cpu_share;
  // A mixture of experts: the experts a step ran per MoE layer, on average (0: dense).
  double experts_per_layer = 0;
  int32_t num_experts = 0;
};

// Slots the pool holds (each one run of blocks_per_slot blocks, slot s at block s * that).
int32_t PoolSlots(const Loaded& m) {
  return static_cast<int32_t>(m.backend->kv_pool(0)->shape().num_blocks / m.blocks_per_slot);
}

// A step over the pool's slots with slots [0, `slots`) active, each reading its own run.
StepDescriptor DecodeStep(const Loaded& m, int32_t slots) {
  StepDescriptor step;
  step.Resize(PoolSlots(m), 1);
  for (int32_t s = 0; s < slots; ++s) {
    step.active[s] = 1;
    step.num_runs[s] = 1;
    step.SlotRuns(s)[0] = KvRun{s * m.blocks_per_slot, m.blocks_per_slot};
  }
  return step;
}

DecodeResult RunDecode(Loaded& m, const std::string& dtype, int32_t slots, int32_t context,
                       ReadBandwidth* bandwidth) {
  const int32_t steps = absl::GetFlag(FLAGS_steps), warmup = 2;
  const int32_t max_slots = PoolSlots(m);
  StepDescriptor step = DecodeStep(m, slots);
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> token(0, m.bundle->config.vocab_size - 1);
  std::vector<float> logits(static_cast<size_t>(max_slots) * m.bundle->config.vocab_size);
  // The best of several windows of `steps` steps, each from position `context`: on a shared
  // machine the fastest window is the one least disturbed by other processes.
  const double bandwidth_now = bandwidth->Measure(3);
  double seconds = 1e30, cpu_share = 0;
  int64_t experts_run = 0;  // (layer, expert) pairs the timed steps ran, all windows
  for (int32_t window = 0; window < absl::GetFlag(FLAGS_windows); ++window) {
    Clock::time_point t0;
    double cpu0 = 0;
    int64_t experts0 = 0;
    for (int32_t k = 0; k < warmup + steps; ++k) {
      if (k == warmup) {
        t0 = Clock::now();
        cpu0 = ProcessCpuSeconds();
        experts0 = m.backend->experts_run();
      }
      for (int32_t s = 0; s < slots; ++s) {
        // Warm-up steps reuse the first timed position so the timed histories start at
        // `context`.
        step.position[s] = context + std::max(0, k - warmup);
        step.token[s] = token(rng);
      }
      CHECK_OK(m.backend->Decode(step, logits.data()));
    }
    const double wall = Seconds(t0, Clock::now());
    experts_run += m.backend->experts_run() - experts0;
    if (wall < seconds) {
      seconds = wall;
      cpu_share = (ProcessCpuSeconds() - cpu0) / (wall * absl::GetFlag(FLAGS_threads));
    }
  }
  DecodeResult r;
  r.isa = std::string(CpuIsaName(ActiveCpuIsa()));
  r.layout = WeightLayout(m);
  r.kv = std::string(DTypeName(m.kv_dtype));
  r.dtype = dtype;
  r.slots = slots;
  r.context = context;
  r.step_ms = seconds / steps * 1e3;
  r.tokens_per_s = slots * steps / seconds;
  // Mean history read per step: positions context .. context + steps - 1, plus the new token.
  const double kv_tokens = slots * (context + 0.5 * (steps - 1) + 1);
  const double experts_per_step =
      static_cast<double>(experts_run) / (steps * absl::GetFlag(FLAGS_windows));
  const double weight_bytes = WeightBytesPerStep(
      m.bundle->config, m.bundle->weights, m.quantization, experts_per_step);
  const LlamaConfig& c = m.bundle->config;
  if (c.moe()) r.experts_per_layer = experts_per_step / c.NumMoeLayers();
  r.num_experts = c.num_experts;
  const double bytes = weight_bytes + kv_tokens * m.kv_bytes_per_token;
  r.mb_per_step = bytes / 1e6;
  r.bytes_per_step = bytes;
  r.bandwidth_now = bandwidth_now;
  r.cpu_share = cpu_share;
  return r;
}

struct MixedResult {
  std::string isa, layout, kv, dtype;
  int32_t slots, context, chunk;
  double decode_ms, apart_ms, mixed_ms;  // per step: decode alone, chunk then decode, one pass
};

// A `chunk`-token prompt chunk beside a decode step over `slots` slots at `context`: the step
// alone, the chunk then the step (Prefill, Decode), and both in one pass (DecodeWithChunk). The
// three are timed in turn within each window (best window each), so they see the same machine.
MixedResult RunMixed(Loaded& m, const std::string& dtype, int32_t slots, int32_t context,
                     int32_t chunk) {
  const int32_t steps = absl::GetFlag(FLAGS_steps), warmup = 2;
  const int32_t max_slots = PoolSlots(m);
  const int32_t chunk_slot = max_slots - 1;  // never a decode case's
  StepDescriptor step = DecodeStep(m, slots);
  std::mt19937 rng(13);
  std::uniform_int_distribution<int32_t> token(0, m.bundle->config.vocab_size - 1);
  for (int32_t s = 0; s < slots; ++s) {
    step.position[s] = context;
    step.token[s] = token(rng);
  }
  std::vector<int32_t> tokens(chunk);
  for (int32_t& t : tokens) t = token(rng);
  const KvRun run{chunk_slot * m.blocks_per_slot, m.blocks_per_slot};
  // A chunk in the middle of a prompt at `context`: it attends to as much history as the rows.
  CHECK(chunk <= m.max_context && chunk <= absl::GetFlag(FLAGS_chunk))
      << "--mixed_chunks: " << chunk << " tokens is longer than --chunk or the context";
  const PrefillChunk pc{chunk_slot, std::min(context, m.max_context - chunk),
                        absl::MakeConstSpan(tokens), &run, 1};
  std::vector<float> logits(static_cast<size_t>(max_slots) * m.bundle->config.vocab_size);
  double best[3] = {1e30, 1e30, 1e30};
  for (int32_t window = 0; window < absl::GetFlag(FLAGS_windows); ++window) {
    for (int variant = 0; variant < 3; ++variant) {
      Clock::time_point t0;
      for (int32_t k = 0; k < warmup + steps; ++k) {
        if (k == warmup) t0 = Clock::now();
        if (variant == 0) {
          CHECK_OK(m.backend->Decode(step, logits.data()));
        } else if (variant == 1) {
          CHECK_OK(m.backend->Prefill(pc, nullptr));
          CHECK_OK(m.backend->Decode(step, logits.data()));
        } else {
          CHECK_OK(m.backend->DecodeWithChunk(pc, nullptr, step, logits.data()));
        }
      }
      best[variant] = std::min(best[variant], Seconds(t0, Clock::now()) / steps);
    }
  }
  return MixedResult{std::string(CpuIsaName(ActiveCpuIsa())), WeightLayout(m),
                     std::string(DTypeName(m.kv_dtype)), dtype, slots, context, chunk,
                     best[0] * 1e3, best[1] * 1e3, best[2] * 1e3};
}

struct PrefillResult {
  std::string isa;
  std::string layout;
  std::string kv;
  std::string dtype;
  int32_t prompt;
  double tokens_per_s, ms;
};

PrefillResult RunPrefill(Loaded& m, const std::string& dtype, int32_t prompt) {
  const int32_t chunk = absl::GetFlag(FLAGS_chunk);
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> token(0, m.bundle->config.vocab_size - 1);
  std::vector<int32_t> tokens(prompt);
  for (int32_t& t : tokens) t = token(rng);
  const KvRun run{0, m.blocks_per_slot};
  std::vector<float> logits(m.bundle->config.vocab_size);
  double best = 1e30;
  for (int rep = 0; rep < absl::GetFlag(FLAGS_windows); ++rep) {
    const auto t0 = Clock::now();
    for (int32_t start = 0; start < prompt; start += chunk) {
      const int32_t n = std::min(chunk, prompt - start);
      PrefillChunk pc{0, start, absl::MakeConstSpan(tokens).subspan(start, n), &run, 1};
      CHECK_OK(m.backend->Prefill(pc, start + n == prompt ? logits.data() : nullptr));
    }
    best = std::min(best, Seconds(t0, Clock::now()));
  }
  return PrefillResult{std::string(CpuIsaName(ActiveCpuIsa())), WeightLayout(m),
                       std::string(DTypeName(m.kv_dtype)), dtype, prompt, prompt / best,
                       best * 1e3};
}

int Main() {
  std::vector<CpuIsa> isas;
  const std::vector<std::string> names =
      absl::StrSplit(absl::GetFlag(FLAGS_isas), ',', absl::SkipEmpty());
  for (const std::string& name : names) {
    CpuIsa isa = ActiveCpuIsa();
    if (name != "auto" && !ParseCpuIsa(name, &isa)) {
      std::fprintf(stderr, "--isas: %s is not one of this processor's: %s\n", name.c_str(),
                   AvailableCpuIsaNames().c_str());
      return 2;
    }
    isas.push_back(isa);
  }
  if (isas.empty()) isas.push_back(ActiveCpuIsa());
  std::vector<bool> layouts;
  for (absl::string_view name :
       absl::StrSplit(absl::GetFlag(FLAGS_layouts), ',', absl::SkipEmpty())) {
    CHECK(name == "panels" || name == "rows") << "unknown layout " << std::string(name);
    layouts.push_back(name == "panels");
  }
  CHECK(!layouts.empty()) << "--layouts names none";
  std::vector<DType> kv_dtypes;
  for (absl::string_view name :
       absl::StrSplit(absl::GetFlag(FLAGS_kv_dtypes), ',', absl::SkipEmpty())) {
    absl::StatusOr<DType> kv = ParseKvDtype(std::string(name));
    CHECK_OK(kv.status());
    kv_dtypes.push_back(*kv);
  }
  CHECK(!kv_dtypes.empty()) << "--kv_dtypes names none";
  const std::vector<int32_t> slots = IntList(absl::GetFlag(FLAGS_slots));
  const std::vector<int32_t> contexts = IntList(absl::GetFlag(FLAGS_contexts));
  const std::vector<int32_t> prompts = IntList(absl::GetFlag(FLAGS_prompts));
  const int32_t threads = absl::GetFlag(FLAGS_threads);
  std::string dir = absl::GetFlag(FLAGS_model_dir);
  if (dir.empty()) {
    const char* tmp = std::getenv("TEST_TMPDIR");
    dir = (std::filesystem::path(tmp ? tmp : std::filesystem::temp_directory_path().c_str()) /
           absl::StrCat("kvrm_bench_", getpid()))
              .string();
  }
  CHECK(!slots.empty() && !contexts.empty()) << "--slots and --contexts need a value each";
  const int32_t max_slots = *std::max_element(slots.begin(), slots.end());
  // (--prompts may be empty: no prefill cases.)
  const int32_t max_context =
      std::max(*std::max_element(contexts.begin(), contexts.end()) + absl::GetFlag(FLAGS_steps) + 2,
               prompts.empty() ? 0 : *std::max_element(prompts.begin(), prompts.end()));

  std::printf("measuring read bandwidth (%d threads, %lld MiB)...\n", threads,
              static_cast<long long>(absl::GetFlag(FLAGS_stream_mb)));
  ReadBandwidth bandwidth(threads, absl::GetFlag(FLAGS_stream_mb) << 20);
  std::string isa_names;
  for (CpuIsa isa : isas) isa_names += " " + std::string(CpuIsaName(isa));
  std::printf("read bandwidth: %.2f GB/s; kernel paths:%s; threads %d; tp %d\n",
              bandwidth.Measure(6) / 1e9, isa_names.c_str(), threads, absl::GetFlag(FLAGS_tp));

  // The multiply-add peak beside the read bandwidth: the other side of the roofline.
  std::vector<std::pair<std::string, double>> compute_peaks;  // (instruction, GFLOP/s, all threads)
  if (absl::GetFlag(FLAGS_kernels)) {
    const std::vector<CpuIsa> available = AvailableCpuIsas();
    auto has = [&](CpuIsa isa) {
      return std::find(available.begin(), available.end(), isa) != available.end();
    };
    ThreadPool pool(threads);
    const std::tuple<PeakKind, const char*, CpuIsa> kinds[] = {
        {PeakKind::kFmaF32, "vfmadd231ps", CpuIsa::kAvx512},
        {PeakKind::kDpBf16, "vdpbf16ps", CpuIsa::kAvx512Bf16}};
    for (const auto& [kind, name, isa] : kinds) {
      if (!has(isa)) continue;
      std::vector<double> flops(threads);
      pool.RunOnAll([&](int t) { flops[t] = PeakFlopsOneThread(kind, 30'000'000); });
      double total = 0;
      for (double f : flops) total += f;
      compute_peaks.emplace_back(name, total / 1e9);
      std::printf("compute peak %-12s %d threads: %7.1f GFLOP/s\n", name, threads, total / 1e9);
    }
    for (const auto& [dtype, q8] : {std::pair{DType::kF32, false}, std::pair{DType::kBF16, false},
                                     std::pair{DType::kBF16, true}}) {
      for (int64_t n : {1, 4, 16, 128}) {
        for (int t : {1, threads}) {
          for (CpuIsa isa : isas) {
            SetActiveCpuIsa(isa);
            TimeMatMul(dtype, q8, 2048, 768, n, t);
          }
        }
      }
    }
  }

  std::vector<DecodeResult> decode;
  std::vector<PrefillResult> prefill;
  std::vector<MixedResult> mixed;
  const std::vector<int32_t> mixed_chunks = IntList(absl::GetFlag(FLAGS_mixed_chunks));
  for (absl::string_view case_name :
       absl::StrSplit(absl::GetFlag(FLAGS_dtypes), ',', absl::SkipEmpty())) {
    // "<dtype>+q8_0": what that dtype leaves dense (a checkpoint's LM head) quantized to q8_0 at
    // load, as kvrmd --quantization=q8_0 does.
    // "<dtype>+q4_K": likewise to q4_K, and a checkpoint's requantized matrices to q4_K too
    // (--quantization=q4_K).
    const bool dense_to_q8 = absl::EndsWith(case_name, "+q8_0");
    const bool dense_to_q4k = absl::EndsWith(case_name, "+q4_K");
    const absl::string_view dtype_name =
        dense_to_q8 || dense_to_q4k ? case_name.substr(0, case_name.size() - 5) : case_name;
    DType dtype = DType::kF32;
    // q8_0: the bf16 model with every linear weight quantized at load (--quantization=q8_0).
    // A GGUF type ("q4_K"): the bf16 model converted to a GGUF file of that type, loaded as kvrmd
    // does (its matrices in their exact 8-bit forms where they have one).
    const bool q8 = dtype_name == "q8_0";
    // "file:PATH": a GGUF file someone else wrote, served as it is.
    const bool given_file = absl::StartsWith(dtype_name, "file:");
    const bool dense = !q8 && !given_file && ParseDType(dtype_name, &dtype);
    // "<type>_as_q8": that file with its K-quant matrices as exact 8-bit blocks; "q4_K_M":
    // llama-quantize's mix (GgufConvertOptions::q4_k_m).
    const bool as_q8 = absl::EndsWith(dtype_name, "_as_q8");
    const absl::string_view base = as_q8 ? dtype_name.substr(0, dtype_name.size() - 6) : dtype_name;
    const bool q4_k_m = base == "q4_K_M";
    // A quantized Hugging Face checkpoint of the bf16 model: AWQ, GPTQ, compressed-tensors W4A16
    // in 4-bit groups of 128; FP8 in 128x128 blocks; W8A8 int8 by channel.
    const bool checkpoint = dtype_name == "awq" || dtype_name == "gptq" ||
                            dtype_name == "gptq_act_order" || dtype_name == "w4a16" ||
                            dtype_name == "fp8" || dtype_name == "w8a8" || dtype_name == "nf4" ||
                            base == "mxfp4";
    const GgmlTypeTraits* gguf = q8 || dense || given_file || checkpoint
                                     ? nullptr
                                     : GgufTypeNamed(q4_k_m ? absl::string_view("q4_K") : base);
    CHECK(q8 || dense || given_file || gguf != nullptr || checkpoint)
        << "unknown dtype " << std::string(dtype_name);
    if (q8 || gguf != nullptr || checkpoint) dtype = DType::kBF16;
    modelgen::MakeModelOptions mo;
    mo.size = absl::GetFlag(FLAGS_size);
    mo.dtype = dtype;
    // Named by size too: a --model_dir kept between runs of different sizes holds each.
    mo.out_dir =
        (std::filesystem::path(dir) / absl::StrCat(mo.size, "-", std::string(DTypeName(dtype))))
            .string();
    mo.threads = threads;
    if (!given_file &&
        !std::filesystem::exists(std::filesystem::path(mo.out_dir) / "config.json")) {
      std::printf("generating %s %s model in %s...\n", mo.size.c_str(),
                  std::string(dtype_name).c_str(), mo.out_dir.c_str());
      CHECK_OK(modelgen::MakeModel(mo).status());
    }
    std::string model_path = given_file ? std::string(dtype_name.substr(5)) : mo.out_dir;
    if (gguf != nullptr) {
      const std::string file = q4_k_m ? "q4_K_M" : gguf->name;
      model_path =
          (std::filesystem::path(dir) / absl::StrCat(mo.size, "-", file, ".gguf")).string();
      if (!std::filesystem::exists(model_path)) {
        std::printf("converting to %s in %s...\n", file.c_str(), model_path.c_str());
        GgufConvertOptions co;
        co.type = gguf->type;
        co.q4_k_m = q4_k_m;
        CHECK_OK(ConvertToGguf(mo.out_dir, model_path, co));
      }
    }
    if (checkpoint) {
      model_path =
          (std::filesystem::path(dir) / absl::StrCat(mo.size, "-", std::string(base))).string();
      if (!std::filesystem::exists(std::filesystem::path(model_path) / "config.json")) {
        std::printf("quantizing to %s in %s...\n", std::string(dtype_name).c_str(),
                    model_path.c_str());
        modelgen::QuantizeOptions qo;
        qo.method = dtype_name == "awq"     ? "awq"
                    : dtype_name == "w4a16" ? "compressed-tensors"
                                            : "gptq";
        qo.group_size = 128;
        qo.zero_point = dtype_name == "awq";
        qo.act_order = dtype_name == "gptq_act_order";
        qo.scale_dtype = dtype_name == "w4a16" ? DType::kBF16 : DType::kF16;
        if (dtype_name == "fp8") {  // Qwen3-FP8's blocks
          qo = modelgen::QuantizeOptions();
          qo.method = "fp8";
          qo.bits = 8;
          qo.zero_point = false;
          qo.group_size = 128;
          qo.block_rows = 128;
          qo.scale_dtype = DType::kF32;
        } else if (dtype_name == "nf4") {  // unsloth's -bnb-4bit: NF4, double quantization
          qo = modelgen::QuantizeOptions();
          qo.method = "bitsandbytes";
          qo.format = "nf4";
          qo.group_size = 64;
          qo.double_quant = true;
        } else if (base == "mxfp4") {  // gpt-oss's own: MXFP4 experts
          qo = modelgen::QuantizeOptions();
          qo.method = "mxfp4";
        } else if (dtype_name == "w8a8") {  // RedHatAI's quantized.w8a8
          qo = modelgen::QuantizeOptions();
          qo.method = "compressed-tensors";
          qo.format = "int-quantized";
          qo.bits = 8;
          qo.zero_point = false;
          qo.group_size = -1;
          qo.scale_dtype = DType::kBF16;
        }
        CHECK_OK(modelgen::QuantizeModelDir(mo.out_dir, model_path, "", qo));
      }
    }
    std::vector<Loaded> loaded;
    for (DType kv : kv_dtypes) {
      for (bool panels : layouts) {
        loaded.push_back(Load(model_path, max_slots, max_context, panels, kv,
                              q8 || dense_to_q8 ? WeightFormat::kQ8_0
                              : dense_to_q4k    ? WeightFormat::kQ4K
                                                : WeightFormat::kDense,
                              as_q8));
      }
    }
    for (int32_t context : contexts) {
      for (int32_t s : slots) {
        for (CpuIsa isa : isas) {
          SetActiveCpuIsa(isa);
          for (Loaded& m : loaded) {
            decode.push_back(RunDecode(m, std::string(case_name), s, context, &bandwidth));
          }
        }
      }
    }
    for (int32_t context : contexts) {
      for (int32_t s : slots) {
        for (int32_t c : mixed_chunks) {
          for (CpuIsa isa : isas) {
            SetActiveCpuIsa(isa);
            for (Loaded& m : loaded) {
              mixed.push_back(RunMixed(m, std::string(case_name), s, context, c));
            }
          }
        }
      }
    }
    for (int32_t p : prompts) {
      for (CpuIsa isa : isas) {
        SetActiveCpuIsa(isa);
        for (Loaded& m : loaded) {
          prefill.push_back(RunPrefill(m, std::string(case_name), p));
        }
      }
    }
  }

  for (DecodeResult& r : decode) {
    r.roofline_tokens_per_s = r.slots * bandwidth.best() / r.bytes_per_step;
  }
  std::printf("\ndecode (%s model); roofline = slots * %.2f GB/s (best read bandwidth of the run) "
              "/ (weight + KV bytes per step); 'GB/s now' measured just before the case\n",
              absl::GetFlag(FLAGS_size).c_str(), bandwidth.best() / 1e9);
  std::printf("%-12s %-7s %-6s %-4s %6s %8s %10s %9s %9s %10s %8s %9s %6s\n", "path",
              "weights", "dtype", "kv", "slots", "context", "tok/s", "step ms", "MB/step",
              "roofline", "of roof", "GB/s now", "cpu");
  for (const DecodeResult& r : decode) {
    std::printf("%-12s %-7s %-6s %-4s %6d %8d %10.1f %9.2f %9.1f %10.1f %7.0f%% %9.1f %5.0f%%\n",
                r.isa.c_str(), r.layout.c_str(), r.dtype.c_str(), r.kv.c_str(), r.slots, r.context,
                r.tokens_per_s, r.step_ms,
                r.mb_per_step,
                r.roofline_tokens_per_s, 100 * r.tokens_per_s / r.roofline_tokens_per_s,
                r.bandwidth_now / 1e9, 100 * r.cpu_share);
    if (r.experts_per_layer > 0) {
      std::printf("%-12s   (a step ran %.2f of each MoE layer's %d experts)\n", "",
                  r.experts_per_layer, r.num_experts);
    }
  }
  std::printf("\nprefill (chunks of %d)\n%-12s %-7s %-6s %-4s %8s %10s %10s\n",
              absl::GetFlag(FLAGS_chunk), "path", "weights", "dtype", "kv", "prompt", "tok/s",
              "ms");
  for (const PrefillResult& r : prefill) {
    std::printf("%-12s %-7s %-6s %-4s %8d %10.1f %10.1f\n", r.isa.c_str(), r.layout.c_str(),
                r.dtype.c_str(), r.kv.c_str(), r.prompt, r.tokens_per_s, r.ms);
  }

  if (!mixed.empty()) {
    std::printf("\nmixed steps: a prompt chunk beside a decode step, apart (chunk, then step) "
                "and in one pass; 'chunk adds' = ms over the step alone\n%-12s %-7s %-6s %-4s "
                "%6s %8s %6s %9s %9s %9s %11s %11s %7s\n",
                "path", "weights", "dtype", "kv", "slots", "context", "chunk", "step ms",
                "apart ms", "one ms", "adds apart", "adds one", "one/apart");
    for (const MixedResult& r : mixed) {
      std::printf("%-12s %-7s %-6s %-4s %6d %8d %6d %9.2f %9.2f %9.2f %11.2f %11.2f %7.2f\n",
                  r.isa.c_str(), r.layout.c_str(), r.dtype.c_str(), r.kv.c_str(), r.slots,
                  r.context, r.chunk, r.decode_ms, r.apart_ms, r.mixed_ms,
                  r.apart_ms - r.decode_ms, r.mixed_ms - r.decode_ms, r.mixed_ms / r.apart_ms);
    }
  }

  if (!absl::GetFlag(FLAGS_json).empty()) {
    nlohmann::json j;
    j["model"] = absl::GetFlag(FLAGS_size);
    j["threads"] = threads;
    j["tensor_parallel"] = absl::GetFlag(FLAGS_tp);
    j["isas"] = nlohmann::json::array();
    for (CpuIsa isa : isas) j["isas"].push_back(std::string(CpuIsaName(isa)));
    j["read_bandwidth_gb_s"] = bandwidth.best() / 1e9;
    for (const auto& [name, gflops] : compute_peaks) j["compute_peak_gflops"][name] = gflops;
    j["decode"] = nlohmann::json::array();
    for (const DecodeResult& r : decode) {
      j["decode"].push_back({{"isa", r.isa},
                             {"weights", r.layout},
                             {"kv_dtype", r.kv},
                             {"dtype", r.dtype},
                             {"slots", r.slots},
                             {"context", r.context},
                             {"tokens_per_s", r.tokens_per_s},
                             {"step_ms", r.step_ms},
                             {"mb_per_step", r.mb_per_step},
                             {"roofline_tokens_per_s", r.roofline_tokens_per_s},
                             {"read_bandwidth_now_gb_s", r.bandwidth_now / 1e9},
                             {"cpu_share", r.cpu_share},
                             {"experts_per_moe_layer", r.experts_per_layer}});
    }
    j["prefill"] = nlohmann::json::array();
    for (const PrefillResult& r : prefill) {
      j["prefill"].push_back({{"isa", r.isa},
                              {"weights", r.layout},
                              {"kv_dtype", r.kv},
                              {"dtype", r.dtype},
                              {"prompt_tokens", r.prompt},
                              {"tokens_per_s", r.tokens_per_s},
                              {"ms", r.ms}});
    }
    j["mixed"] = nlohmann::json::array();
    for (const MixedResult& r : mixed) {
      j["mixed"].push_back({{"isa", r.isa},
                            {"weights", r.layout},
                            {"kv_dtype", r.kv},
                            {"dtype", r.dtype},
                            {"slots", r.slots},
                            {"context", r.context},
                            {"chunk_tokens", r.chunk},
                            {"decode_ms", r.decode_ms},
                            {"apart_ms", r.apart_ms},
                            {"one_pass_ms", r.mixed_ms}});
    }
    std::ofstream out(absl::GetFlag(FLAGS_json));
    out << j.dump(2) << "\n";
    CHECK(out.good()) << "cannot write " << absl::GetFlag(FLAGS_json);
  }
  if (absl::GetFlag(FLAGS_model_dir).empty()) std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace
}  // namespace kvrm

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress lines appear as they happen
  return kvrm::Main();
}
