// The GPU check of the CUDA backend, one program for a lent machine (tools/device_check.sh):
//   1. the measured ceiling: device-to-device copy bandwidth (bytes read + written);
//   2. every CUDA kernel and the cuBLASLt product against float64 CPU references on random
//      inputs (fragmented run tables, inactive rows, histories longer than one split; the KV
//      write and attention over f32 and bf16 pools; Q/K/V biases and per-head Q/K norms, the O
//      bias folded into the MLP norm);
//   3. the whole backend (captured graphs) against the CPU backend on a random model of the
//      `small` shape: prefill and decode logits, greedy agreement; TP=2 where two GPUs exist;
//      again with bf16 KV pools on both; a transfer group through the host tier and back; then
//      modelgen's tiny-qwen2 and tiny-qwen3, tiny-qwen3 with Q/K/V and O biases added, and
//      tiny-qwen2 with every layer sliding over 48 positions;
//      LoRA adapters through every graph (rows of different adapters, a slot replaced between
//      replays, an empty slot refused);
//   4. decode through the graph at several slot counts: step time, tokens/s, bytes read per
//      step over the copy bandwidth, and the time the step waited on the copy-stream transport
//      while compaction groups were pre-staged beside it; one more row with a bf16 KV pool; what
//      the LoRA graph costs a replay with every row adapted.
// Prints a table last; --json FILE writes the same figures; --checks_only skips step 4. Exit 0
// when every check passed, 1 when one failed, 2 when there is no GPU.
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/dtype.h"
#include "common/logging.h"
#include "kernels/cuda/llama_kernels.h"
#include "model/lora.h"
#include "runtime/cpu_backend.h"
#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/cuda_raii.h"
#include "runtime/cuda/lt_gemm.h"
#include "runtime/cuda/step_packing.h"
#include "runtime/device_sampling.h"
#include "runtime/model_bundle.h"
#include "runtime/transport.h"
#include "tools/modelgen/model_writer.h"

// Every CUDA call of the check itself is checked too: a failure aborts with the call's text.
#define CK(expr)                                                                 \
  do {                                                                           \
    const cudaError_t ck_err_ = (expr);                                          \
    CHECK(ck_err_ == cudaSuccess) << #expr << ": " << cudaGetErrorString(ck_err_); \
  } while (0)

namespace kvrm::cuda {
namespace {

struct Check {
  std::string name;
  double error = 0;      // relative error (or mismatch fraction)
  double threshold = 0;
  bool ok = false;
};

struct BenchRow {
  int tp = 1;
  int slots = 0;
  std::string kv = "f32";  // the KV pool's element type
  int context = 0;
  int split_tokens = 0;  // attention's KV split length
  int token_sets = 0;    // attention's K/V token sets in flight per warp
  double step_ms = 0;       // Decode() end to end: input upload, graph, logits download
  double sampled_step_ms = 0;  // DecodeAndSample(), every row greedy on the device
  // A step carrying a full prefill chunk beside slots - 1 decode rows: Prefill then Decode (two
  // graphs, the weights read twice) against DecodeWithChunk (the mixed graph).
  double chunk_apart_ms = 0;
  double chunk_mixed_ms = 0;
  double graph_ms = 0;      // graph replay alone (events)
  double tokens_per_s = 0;
  double bytes_per_step = 0;
  double achieved_gbs = 0;  // bytes_per_step / graph time
  double of_copy = 0;       // achieved / copy bandwidth
  double transport_wait_share = 0;
};

std::mt19937_64 rng(20261130);

double RelError(const std::vector<double>& ref, const std::vector<float>& got) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = ref[i] - got[i];
    if (std::isnan(got[i])) return INFINITY;
    num += d * d;
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

std::vector<float> Random(size_t n, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Rounds to bf16 and back (what the device sees of a bf16 input).
float Bf(float x) { return Bf16ToFloat(FloatToBf16(x)); }

template <typename T>
T* Upload(const std::vector<T>& host, std::vector<DevicePtr>& keep) {
  void* p = nullptr;
  CK(cudaMalloc(&p, host.size() * sizeof(T)));
  CK(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  keep.emplace_back(p);
  return static_cast<T*>(p);
}

template <typename T>
std::vector<T> Download(const T* dev, size_t n) {
  std::vector<T> h(n);
  CK(cudaMemcpy(h.data(), dev, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

std::vector<uint16_t> ToBf16Bits(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = FloatToBf16(v[i]);
  return b;
}

double CopyBandwidth() {
  const size_t bytes = size_t{2} << 30;
  void *a = nullptr, *b = nullptr;
  CK(cudaMalloc(&a, bytes));
  CK(cudaMalloc(&b, bytes));
  // Random bytes, not zeros (METHOD.md: zeros can run faster than real data).
  {
    std::vector<uint32_t> host(bytes / 4 / 64);
    for (uint32_t& v : host) v = static_cast<uint32_t>(rng());
    for (size_t off = 0; off < bytes; off += host.size() * 4) {
      CK(cudaMemcpy(static_cast<char*>(a) + off, host.data(), host.size() * 4,
                    cudaMemcpyHostToDevice));
    }
  }
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int i = 0; i < 3; ++i) CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
  std::vector<float> ms;
  for (int i = 0; i < 10; ++i) {
    CK(cudaEventRecord(e0));
    CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float t = 0;
    CK(cudaEventElapsedTime(&t, e0, e1));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  CK(cudaFree(a));
  CK(cudaFree(b));
  return 2.0 * bytes / (ms[ms.size() / 2] * 1e-3) / 1e9;  // GB/s, read + write
}

// A random fragmented run table holding `tokens` tokens: 1..max_runs runs, each placed at a
// random free stretch of the pool (`free_mask`, updated).
std::vector<KvRun> RandomRuns(std::vector<bool>& free_mask, int32_t tokens, int32_t block_tokens,
                              int32_t max_runs) {
  const int32_t need = (tokens + block_tokens - 1) / block_tokens;
  const int32_t pieces = std::min<int32_t>(need, 1 + static_cast<int32_t>(rng() % max_runs));
  std::vector<KvRun> runs;
  int32_t left = need;
  const int64_t pool = static_cast<int64_t>(free_mask.size());
  for (int32_t p = 0; p < pieces; ++p) {
    const int32_t n = p + 1 == pieces ? left : std::max<int32_t>(1, left / (pieces - p));
    int64_t start = -1;
    for (int attempt = 0; attempt < 100000 && start < 0; ++attempt) {
      const int64_t s = static_cast<int64_t>(rng() % (pool - n + 1));
      bool all_free = true;
      for (int32_t b = 0; b < n && all_free; ++b) all_free = free_mask[s + b];
      if (all_free) start = s;
    }
    CHECK(start >= 0) << "pool too small for the check's histories";
    for (int32_t b = 0; b < n; ++b) free_mask[start + b] = false;
    runs.push_back(KvRun{static_cast<int32_t>(start), n});
    left -= n;
  }
  return runs;
}

// ---- Kernel checks -----------------------------------------------------------------------------

Check CheckRmsNormAndEmbed() {
  std::vector<DevicePtr> keep;
  const int rows = 37, dim = 768, vocab = 1000;
  const auto x = Random(rows * dim), w = Random(dim, 0.3f);
  std::vector<float> wb(dim);
  for (int i = 0; i < dim; ++i) wb[i] = Bf(1.0f + w[i]);
  const float* dx = Upload(x, keep);
  const bf16* dw = reinterpret_cast<const bf16*>(Upload(ToBf16Bits(wb), keep));
  bf16* dout = reinterpret_cast<bf16*>(Upload(std::vector<uint16_t>(rows * dim, 0x7fc0), keep));
  CHECK_OK(LaunchRmsNorm<bf16>(dx, dw, dout, rows, dim, 1e-5f, nullptr, nullptr));
  const auto out = Download(reinterpret_cast<const uint16_t*>(dout), rows * dim);
  std::vector<double> ref(rows * dim);
  std::vector<float> got(rows * dim);
  for (int r = 0; r < rows; ++r) {
    double ss = 0;
    for (int i = 0; i < dim; ++i) ss += double(x[r * dim + i]) * x[r * dim + i];
    const double inv = 1.0 / std::sqrt(ss / dim + 1e-5);
    for (int i = 0; i < dim; ++i) {
      ref[r * dim + i] = x[r * dim + i] * inv * wb[i];
      got[r * dim + i] = Bf16ToFloat(out[r * dim + i]);
    }
  }
  double err = RelError(ref, got);
  // Embedding: exact bf16 -> f32 rows (inactive rows read token 0).
  const auto table = ToBf16Bits(Random(vocab * dim));
  const StepInputLayout l = StepInputLayout::Make(rows, 1, 1);
  std::vector<int32_t> in(l.total, 0);
  for (int r = 0; r < rows; ++r) {
    in[l.active + r] = r % 5 != 0;
    in[l.token + r] = static_cast<int32_t>(rng() % vocab);
  }
  const int32_t* din = Upload(in, keep);
  float* dxe = Upload(std::vector<float>(rows * dim, NAN), keep);
  CHECK_OK(LaunchEmbed(reinterpret_cast<const bf16*>(Upload(table, keep)),
                       StepInputs::At(l, din), dim, dxe, nullptr));
  const auto xe = Download(dxe, rows * dim);
  for (int r = 0; r < rows; ++r) {
    const int t = in[l.active + r] ? in[l.token + r] : 0;
    for (int i = 0; i < dim; ++i) {
      if (xe[r * dim + i] != Bf16ToFloat(table[int64_t{t} * dim + i])) err = INFINITY;
    }
  }
  return {"rms_norm (bf16 out) + embed", err, 1e-2, err <= 1e-2};
}

Check CheckSwiGlu() {
  std::vector<DevicePtr> keep;
  const int rows = 19, ffn = 2048;
  const auto gu = Random(rows * 2 * ffn, 2.0f);
  bf16* dout = reinterpret_cast<bf16*>(Upload(std::vector<uint16_t>(rows * ffn, 0x7fc0), keep));
  CHECK_OK(LaunchSwiGlu(Upload(gu, keep), rows, ffn, dout, nullptr));
  const auto out = Download(reinterpret_cast<const uint16_t*>(dout), rows * ffn);
  std::vector<double> ref(rows * ffn);
  std::vector<float> got(rows * ffn);
  for (int r = 0; r < rows; ++r) {
    for (int i = 0; i < ffn; ++i) {
      const double g = gu[r * 2 * ffn + i], u = gu[r * 2 * ffn + ffn + i];
      ref[r * ffn + i] = g / (1 + std::exp(-g)) * u;
      got[r * ffn + i] = Bf16ToFloat(out[r * ffn + i]);
    }
  }
  const double err = RelError(ref, got);
  return {"swiglu (bf16 out)", err, 1e-2, err <= 1e-2};
}

Check CheckGemm() {
  std::vector<DevicePtr> keep;
  const int64_t m = 61, k = 768, n = 2048 + 3 * 64;
  std::vector<float> x = Random(m * k), w = Random(n * k, 0.05f), y0 = Random(m * n);
  for (float& v : x) v = Bf(v);
  for (float& v : w) v = Bf(v);
  cublasLtHandle_t h;
  CHECK(cublasLtCreate(&h) == CUBLAS_STATUS_SUCCESS);
  LtHandlePtr owner(h);
  auto ws = DeviceAlloc(32 << 20, "ws");
  CHECK_OK(ws.status());
  auto gemm = LtGemm::Create(h, m, k, n, 32 << 20);
  CHECK_OK(gemm.status());
  float* dy = Upload(y0, keep);
  CHECK_OK((*gemm)->Run(reinterpret_cast<const bf16*>(Upload(ToBf16Bits(x), keep)),
                        reinterpret_cast<const bf16*>(Upload(ToBf16Bits(w), keep)), dy, 1.0f,
                        ws->get(), nullptr));
  const auto y = Download(dy, m * n);
  std::vector<double> ref(m * n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = y0[i * n + j];
      for (int64_t t = 0; t < k; ++t) s += double(x[i * k + t]) * w[j * k + t];
      ref[i * n + j] = s;
    }
  }
  const double err = RelError(ref, y);
  return {"cuBLASLt bf16 product + residual (beta 1)", err, 1e-4, err <= 1e-4};
}

// A K/V element as a pool of `Kv` holds it, on the host: f32 as is; bf16 rounded as the CPU's
// bf16 pool rounds (FloatToBf16) and widened back.
template <typename Kv>
float AsStored(float x) {
  return std::is_same_v<Kv, bf16> ? Bf(x) : x;
}

// A pool's elements on the host as the device holds them: floats, or their bf16 bit patterns.
template <typename Kv>
Kv* UploadPool(const std::vector<float>& v, std::vector<DevicePtr>& keep) {
  if constexpr (std::is_same_v<Kv, bf16>) {
    return reinterpret_cast<bf16*>(Upload(ToBf16Bits(v), keep));
  } else {
    return Upload(v, keep);
  }
}

// The pool read back as bit patterns (bf16: 16 bits; f32: 32), for exact checks.
template <typename Kv>
std::vector<uint32_t> DownloadPoolBits(const Kv* dev, size_t n) {
  std::vector<uint32_t> bits(n);
  if constexpr (std::is_same_v<Kv, bf16>) {
    const auto h = Download(reinterpret_cast<const uint16_t*>(dev), n);
    std::copy(h.begin(), h.end(), bits.begin());
  } else {
    const auto h = Download(dev, n);
    std::memcpy(bits.data(), h.data(), n * 4);
  }
  return bits;
}
// Bit patterns (as DownloadPoolBits gives them) written back over a device pool.
template <typename Kv>
void UploadPoolBits(const std::vector<uint32_t>& bits, Kv* dev) {
  if constexpr (std::is_same_v<Kv, bf16>) {
    std::vector<uint16_t> h(bits.begin(), bits.end());
    CK(cudaMemcpy(dev, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
  } else {
    CK(cudaMemcpy(dev, bits.data(), bits.size() * 4, cudaMemcpyHostToDevice));
  }
}
template <typename Kv>
float BitsToFloat(uint32_t b) {
  if constexpr (std::is_same_v<Kv, bf16>) {
    return Bf16ToFloat(static_cast<uint16_t>(b));
  } else {
    float f;
    std::memcpy(&f, &b, 4);
    return f;
  }
}
template <typename Kv>
uint32_t StoredBits(float x) {
  if constexpr (std::is_same_v<Kv, bf16>) {
    return FloatToBf16(x);
  } else {
    uint32_t b;
    std::memcpy(&b, &x, 4);
    return b;
  }
}

// RoPE + KV write + attention over fragmented run tables, against float64, on a pool of `Kv`
// (float or bf16). A bf16 pool's history is random bf16 values and the reference reads every K
// and V rounded as the pool stores them (the new token's K rounded from its float64 rotation), so
// the threshold is the f32 pool's. The new V rows must be stored bit for bit as the CPU's
// FloatToBf16 rounds them (random values, and rounding ties and subnormals put in on purpose);
// the new K rows within rounding of the float64 rotation. With `window` > 0 (a sliding-window
// layer: Mistral's, Qwen2's, Phi-3's), each row attends to its last `window` positions only, and
// a run table lacking the blocks wholly behind that window (window release: packed from their
// end) must give the same bits.
template <typename Kv>
Check CheckAttention(int head_dim, int heads, int kv_heads, int window = 0) {
  constexpr bool kBf16 = std::is_same_v<Kv, bf16>;
  std::vector<DevicePtr> keep;
  const int rows = 9, max_runs = 4, block_tokens = 16, max_context = 1100, split = 128;
  const int64_t pool_blocks = 2400;  // room for a second, differently fragmented copy
  const int group = heads / kv_heads;
  const int qkvw = (heads + 2 * kv_heads) * head_dim;
  const StepInputLayout l = StepInputLayout::Make(rows, rows, max_runs);
  std::vector<int32_t> in(l.total, 0);
  std::vector<bool> free_blocks(pool_blocks, true);
  std::vector<std::vector<KvRun>> tables(rows);
  // Row r's run table (table r) in `dst`: runs in logical order, each starting where the last ends.
  auto write_table = [&](std::vector<int32_t>& dst, int r, const std::vector<KvRun>& runs) {
    dst[l.num_runs + r] = static_cast<int32_t>(runs.size());
    int32_t start = 0;
    for (size_t k = 0; k < runs.size(); ++k) {
      dst[l.run_first + r * max_runs + k] = runs[k].first_block;
      dst[l.run_blocks + r * max_runs + k] = runs[k].num_blocks;
      dst[l.run_start + r * max_runs + k] = start;
      start += runs[k].num_blocks * block_tokens;
    }
  };
  for (int r = 0; r < rows; ++r) {
    in[l.table + r] = r;
    if (r == 4) continue;  // an inactive row
    const int32_t position = r == 0 ? 0 : static_cast<int32_t>(rng() % (max_context - 1));
    tables[r] = RandomRuns(free_blocks, position + 1, block_tokens, max_runs);
    in[l.active + r] = 1;
    in[l.position + r] = position;
    write_table(in, r, tables[r]);
  }
  const StepInputs host_in = StepInputs::At(l, in.data());
  // Random history in the pool (as the pool stores it), random new Q/K/V; RoPE table as the
  // backend builds it.
  const int64_t head_stride = pool_blocks * block_tokens * head_dim;
  std::vector<float> k_pool = Random(kv_heads * head_stride), v_pool = Random(kv_heads * head_stride);
  for (float& x : k_pool) x = AsStored<Kv>(x);
  for (float& x : v_pool) x = AsStored<Kv>(x);
  std::vector<float> qkv = Random(rows * qkvw);
  if (kBf16) {
    // Rounding cases in the first new V elements of every row: ties to even (down and up, both
    // signs), just past a tie, a subnormal tie, a negative subnormal that rounds to -0.
    const uint32_t cases[] = {0x3f808000u, 0x3f818000u, 0xbf818000u, 0x3f80ffffu,
                              0x00018000u, 0x80008000u};
    for (int r = 0; r < rows; ++r) {
      for (int i = 0; i < 6; ++i) {
        std::memcpy(&qkv[r * qkvw + (heads + kv_heads) * head_dim + i], &cases[i], 4);
      }
    }
  }
  std::vector<float> rope(max_context * head_dim);
  for (int p = 0; p < max_context; ++p) {
    for (int i = 0; i < head_dim / 2; ++i) {
      const double a = p * std::pow(10000.0, -2.0 * i / head_dim);
      rope[p * head_dim + i] = static_cast<float>(std::cos(a));
      rope[p * head_dim + head_dim / 2 + i] = static_cast<float>(std::sin(a));
    }
  }
  Kv* dk = UploadPool<Kv>(k_pool, keep);
  Kv* dv = UploadPool<Kv>(v_pool, keep);
  float* dqkv = Upload(qkv, keep);
  const int32_t* din = Upload(in, keep);
  const StepInputs dev_in = StepInputs::At(l, din);
  const KvLayer<Kv> kv{dk, dv, head_stride, block_tokens, head_dim};
  CHECK_OK(LaunchRopeAndStoreKv(dqkv, dev_in, Upload(rope, keep), heads, kv_heads, kv, nullptr));
  const int splits = (max_context + split - 1) / split;
  float* po = Upload(std::vector<float>(AttentionPartialFloats(rows, heads, splits, head_dim)), keep);
  float* pml = Upload(std::vector<float>(int64_t{rows} * heads * splits * 2), keep);
  // Zero counters, as the backend allocates them; the check launches twice with each token-set
  // count, so the second launch also shows the first left them zero.
  int32_t* done = Upload(std::vector<int32_t>(AttentionCounterInts(rows, kv_heads), 0), keep);
  bf16* dout = reinterpret_cast<bf16*>(Upload(std::vector<uint16_t>(rows * heads * head_dim, 0x7fc0), keep));
  // Both token-set counts, each launched twice: a second launch gives the same bits (the first
  // left its split counters at zero).
  std::vector<uint16_t> out, out4;
  bool launches_agree = true;
  const size_t out_bytes = size_t{2} * rows * heads * head_dim;
  for (int sets : {2, 2, 4, 4}) {
    // NaN first, every launch: a launch that writes nothing (its last split never counted) is
    // not read as the previous launch's bits.
    CK(cudaMemset(dout, 0xff, out_bytes));
    CHECK_OK(LaunchAttention(dqkv, dev_in, kv, heads, kv_heads, 1.0f / std::sqrt(float(head_dim)),
                             window, AttentionWorkspace{po, pml, splits, split, done, sets}, dout,
                             nullptr));
    auto got_bits = Download(reinterpret_cast<const uint16_t*>(dout), rows * heads * head_dim);
    std::vector<uint16_t>& keep_bits = sets == 2 ? out : out4;
    if (!keep_bits.empty() && got_bits != keep_bits) launches_agree = false;
    keep_bits = std::move(got_bits);
  }
  const auto k_after = DownloadPoolBits(dk, k_pool.size());
  const auto v_after = DownloadPoolBits(dv, v_pool.size());

  // Layout invariance: every row's history (the new token's K and V too) moved to other runs,
  // fragmented differently, must attend to the same bits with either token-set count (the
  // engine's outputs must not depend on where compaction or a swap put a request's blocks).
  bool layout_invariant = true;
  {
    std::vector<int32_t> in2 = in;
    const StepInputs host_in2 = StepInputs::At(l, in2.data());
    std::vector<uint32_t> k2 = k_after, v2 = v_after;
    for (int r = 0; r < rows; ++r) {
      if (!in[l.active + r]) continue;
      const int32_t pos = in[l.position + r];
      write_table(in2, r, RandomRuns(free_blocks, pos + 1, block_tokens, max_runs));
      for (int32_t t = 0; t <= pos; ++t) {
        const int64_t from = host_in.PhysicalToken(r, t, block_tokens);
        const int64_t to = host_in2.PhysicalToken(r, t, block_tokens);
        for (int g = 0; g < kv_heads; ++g) {
          for (int d = 0; d < head_dim; ++d) {
            k2[g * head_stride + to * head_dim + d] = k_after[g * head_stride + from * head_dim + d];
            v2[g * head_stride + to * head_dim + d] = v_after[g * head_stride + from * head_dim + d];
          }
        }
      }
    }
    UploadPoolBits(k2, dk);
    UploadPoolBits(v2, dv);
    const StepInputs dev_in2 = StepInputs::At(l, Upload(in2, keep));
    for (int sets : {2, 4}) {
      CK(cudaMemset(dout, 0xff, out_bytes));
      CHECK_OK(LaunchAttention(dqkv, dev_in2, kv, heads, kv_heads, 1.0f / std::sqrt(float(head_dim)),
                               window, AttentionWorkspace{po, pml, splits, split, done, sets}, dout,
                               nullptr));
      const auto bits = Download(reinterpret_cast<const uint16_t*>(dout), rows * heads * head_dim);
      if (bits != (sets == 2 ? out : out4)) layout_invariant = false;
    }
    // Window release: the same tables without their blocks wholly behind each row's window,
    // their logical starts from the released blocks' end (as PackTable lays them out).
    if (window > 0) {
      std::vector<int32_t> in3 = in2;
      for (int r = 0; r < rows; ++r) {
        if (!in[l.active + r]) continue;
        const int32_t behind = BlocksBehindWindow(in[l.position + r], window, block_tokens);
        int32_t skip = behind;
        std::vector<KvRun> kept;
        for (int k = 0; k < in2[l.num_runs + r]; ++k) {
          KvRun run{in2[l.run_first + r * max_runs + k], in2[l.run_blocks + r * max_runs + k]};
          if (skip >= run.num_blocks) {
            skip -= run.num_blocks;
            continue;
          }
          kept.push_back({run.first_block + skip, run.num_blocks - skip});
          skip = 0;
        }
        write_table(in3, r, kept);
        for (size_t k = 0; k < kept.size(); ++k) {
          in3[l.run_start + r * max_runs + k] += behind * block_tokens;
        }
      }
      const StepInputs dev_in3 = StepInputs::At(l, Upload(in3, keep));
      for (int sets : {2, 4}) {
        CK(cudaMemset(dout, 0xff, out_bytes));
        CHECK_OK(LaunchAttention(dqkv, dev_in3, kv, heads, kv_heads,
                                 1.0f / std::sqrt(float(head_dim)), window,
                                 AttentionWorkspace{po, pml, splits, split, done, sets}, dout,
                                 nullptr));
        const auto bits =
            Download(reinterpret_cast<const uint16_t*>(dout), rows * heads * head_dim);
        if (bits != (sets == 2 ? out : out4)) layout_invariant = false;
      }
    }
  }
  // Every launch left its split counters at zero for the next.
  for (int32_t c : Download(done, AttentionCounterInts(rows, kv_heads))) {
    if (c != 0) launches_agree = false;
  }

  // Reference: rotate, write (rounded as the pool stores), attend (float64).
  std::vector<double> ref(rows * heads * head_dim, 0.0);
  std::vector<float> got(out.size());
  for (size_t i = 0; i < out.size(); ++i) got[i] = Bf16ToFloat(out[i]);
  bool kv_written = true;
  for (int r = 0; r < rows; ++r) {
    if (!in[l.active + r]) continue;
    const int32_t pos = in[l.position + r];
    const float* cs = &rope[pos * head_dim];
    std::vector<double> q(heads * head_dim), knew(kv_heads * head_dim);
    auto rot = [&](const float* src, double* dst) {
      const int half = head_dim / 2;
      for (int i = 0; i < half; ++i) {
        dst[i] = double(src[i]) * cs[i] - double(src[i + half]) * cs[half + i];
        dst[i + half] = double(src[i + half]) * cs[i] + double(src[i]) * cs[half + i];
      }
    };
    for (int h = 0; h < heads; ++h) rot(&qkv[r * qkvw + h * head_dim], &q[h * head_dim]);
    for (int g = 0; g < kv_heads; ++g) {
      rot(&qkv[r * qkvw + heads * head_dim + g * head_dim], &knew[g * head_dim]);
    }
    const float* vnew = &qkv[r * qkvw + (heads + kv_heads) * head_dim];
    const int64_t phys_new = host_in.PhysicalToken(r, pos, block_tokens);
    for (int g = 0; g < kv_heads; ++g) {
      for (int d = 0; d < head_dim; ++d) {
        const int64_t at = g * head_stride + phys_new * head_dim + d;
        const double want = knew[g * head_dim + d];
        // f32: the rotation's f32 rounding; bf16: one rounding to 8 significant bits on top.
        const double tol = kBf16 ? 4e-3 * std::abs(want) + 1e-6 : 1e-5 * (1 + std::abs(want));
        if (std::abs(BitsToFloat<Kv>(k_after[at]) - want) > tol) kv_written = false;
        if (v_after[at] != StoredBits<Kv>(vnew[g * head_dim + d])) kv_written = false;
      }
    }
    // The positions the row attends to: all, or its window's.
    const int lo = window > 0 ? std::max(0, pos + 1 - window) : 0;
    for (int h = 0; h < heads; ++h) {
      const int g = h / group;
      std::vector<double> s(pos + 1, -INFINITY);
      double mx = -1e300;
      for (int t = lo; t <= pos; ++t) {
        const int64_t phys = host_in.PhysicalToken(r, t, block_tokens);
        double dot = 0;
        for (int d = 0; d < head_dim; ++d) {
          const double kd =
              t == pos ? (kBf16 ? double(Bf(static_cast<float>(knew[g * head_dim + d])))
                                : knew[g * head_dim + d])
                       : k_pool[g * head_stride + phys * head_dim + d];
          dot += q[h * head_dim + d] * kd;
        }
        s[t] = dot / std::sqrt(double(head_dim));
        mx = std::max(mx, s[t]);
      }
      double z = 0;
      for (double& v : s) z += (v = std::exp(v - mx));
      for (int t = lo; t <= pos; ++t) {
        const int64_t phys = host_in.PhysicalToken(r, t, block_tokens);
        for (int d = 0; d < head_dim; ++d) {
          const double vd = t == pos ? AsStored<Kv>(vnew[g * head_dim + d])
                                     : v_pool[g * head_stride + phys * head_dim + d];
          ref[(r * heads + h) * head_dim + d] += s[t] / z * vd;
        }
      }
    }
  }
  std::vector<float> got4(out4.size());
  for (size_t i = 0; i < out4.size(); ++i) got4[i] = Bf16ToFloat(out4[i]);
  double err = std::max(RelError(ref, got), RelError(ref, got4));
  if (!kv_written || !launches_agree || !layout_invariant) err = INFINITY;
  return {absl::StrFormat("rope + kv write + attention (hd %d, %d/%d heads, %s KV%s)", head_dim,
                          heads, kv_heads, kBf16 ? "bf16" : "f32",
                          window > 0 ? absl::StrFormat(", window %d + released blocks", window)
                                     : std::string()),
          err, 1e-2, err <= 1e-2};
}

// Device sampling against the same procedure in float64 on the CPU.
Check CheckSampling() {
  std::vector<DevicePtr> keep;
  const int rows = 48, vocab = 32000;
  const StepInputLayout l = StepInputLayout::Make(rows, 1, 1);
  std::vector<int32_t> in(l.total, 0);
  for (int r = 0; r < rows; ++r) in[l.active + r] = r != 7;
  std::vector<float> logits = Random(int64_t{rows} * vocab, 3.0f);
  std::vector<SamplingRow> params(rows);
  std::vector<int32_t> counts(int64_t{rows} * vocab, 0);
  std::vector<uint8_t> seen(int64_t{rows} * vocab, 0);
  std::uniform_real_distribution<float> u01(0.0f, 1.0f);
  for (int r = 0; r < rows; ++r) {
    SamplingRow& p = params[r];
    const int kind = r % 6;
    p.temperature = kind == 0 ? 0.0f : 0.5f + u01(rng);
    p.top_k = kind == 2 ? 1 + static_cast<int>(rng() % 50) : 0;
    p.top_p = kind == 3 ? 0.5f + 0.45f * u01(rng) : 1.0f;
    p.min_p = kind == 4 ? 0.05f : 0.0f;
    p.repetition_penalty = kind == 5 ? 1.3f : 1.0f;
    p.presence_penalty = kind == 5 ? 0.5f : 0.0f;
    p.frequency_penalty = kind == 5 ? 0.25f : 0.0f;
    p.uniform = u01(rng);
    for (int i = 0; i < 40; ++i) {
      const int v = static_cast<int>(rng() % vocab);
      seen[int64_t{r} * vocab + v] = 1;
      if (i % 2) counts[int64_t{r} * vocab + v] += 1 + static_cast<int>(rng() % 3);
    }
  }
  float* dl = Upload(logits, keep);
  int32_t* dtok = Upload(std::vector<int32_t>(rows, -1), keep);
  float* dprobs = Upload(std::vector<float>(int64_t{rows} * vocab), keep);
  CHECK_OK(LaunchSample(dl, StepInputs::At(l, Upload(in, keep)), vocab,
                        Upload(params, keep), Upload(counts, keep), Upload(seen, keep), dprobs,
                        dtok, nullptr));
  const auto tokens = Download(dtok, rows);
  int mismatches = 0, compared = 0;
  std::vector<double> scratch;
  for (int r = 0; r < rows; ++r) {
    if (!in[l.active + r]) continue;
    const SamplingRow& p = params[r];
    // The penalties as the kernel applies them (f32), then the procedure in float64.
    std::vector<float> x(vocab);
    for (int v = 0; v < vocab; ++v) {
      float val = logits[int64_t{r} * vocab + v];
      if (seen[int64_t{r} * vocab + v] && p.repetition_penalty != 1) {
        val = val > 0 ? val / p.repetition_penalty : val * p.repetition_penalty;
      }
      const int c = counts[int64_t{r} * vocab + v];
      if (c > 0) val -= p.presence_penalty + p.frequency_penalty * static_cast<float>(c);
      x[v] = val;
    }
    const DeviceSampleResult want = SampleLikeDevice(
        x, DeviceSampling{1, p.temperature, p.top_k, p.top_p, p.min_p, p.uniform}, scratch);
    // Skip draws within float rounding of a boundary: f32 and f64 may fairly disagree there.
    if (want.margin < 1e-5) continue;
    const int expect = want.token;
    ++compared;
    if (tokens[r] != expect) ++mismatches;
  }
  const double frac = compared ? double(mismatches) / compared : 1.0;
  return {absl::StrFormat("device sampling (%d rows compared)", compared), frac, 0.0,
          mismatches == 0 && compared > rows / 2};
}

// Qwen2's Q/K/V biases and Qwen3's per-head Q/K norms on fused QKV rows against float64: biases
// alone (Qwen2), norms alone (Qwen3: the V heads must come back bit for bit as they went in), and
// both (Qwen3 with attention_bias); head sizes 64 and 128. f32 in and out: threshold 1e-5.
Check CheckQkvBiasAndNorm() {
  double err = 0;
  bool v_untouched = true;
  for (const int head_dim : {64, 128}) {
    const int rows = 37, heads = head_dim == 64 ? 12 : 8, kv_heads = head_dim == 64 ? 4 : 2;
    const int qkvw = (heads + 2 * kv_heads) * head_dim;
    const float eps = 1e-6f;
    for (const bool with_bias : {true, false}) {
      for (const bool with_norm : {false, true}) {
        if (!with_bias && !with_norm) continue;
        std::vector<DevicePtr> keep;
        const auto qkv = Random(int64_t{rows} * qkvw, 2.0f);
        const auto bias = Random(qkvw, 0.5f);
        std::vector<float> qn = Random(head_dim, 0.1f), kn = Random(head_dim, 0.1f);
        for (float& w : qn) w += 1.0f;
        for (float& w : kn) w += 1.0f;
        float* dqkv = Upload(qkv, keep);
        CHECK_OK(LaunchQkvBiasAndNorm(dqkv, rows, heads, kv_heads, head_dim,
                                      with_bias ? Upload(bias, keep) : nullptr,
                                      with_norm ? Upload(qn, keep) : nullptr,
                                      with_norm ? Upload(kn, keep) : nullptr, eps, nullptr));
        const auto got = Download(dqkv, qkv.size());
        std::vector<double> ref(qkv.size());
        for (int r = 0; r < rows; ++r) {
          for (int h = 0; h < heads + 2 * kv_heads; ++h) {
            const int64_t at = int64_t{r} * qkvw + int64_t{h} * head_dim;
            double ss = 0;
            for (int i = 0; i < head_dim; ++i) {
              ref[at + i] = double(qkv[at + i]) + (with_bias ? bias[h * head_dim + i] : 0.0);
              ss += ref[at + i] * ref[at + i];
            }
            const std::vector<float>* w = h < heads ? &qn : h < heads + kv_heads ? &kn : nullptr;
            if (with_norm && w != nullptr) {
              const double inv = 1.0 / std::sqrt(ss / head_dim + eps);
              for (int i = 0; i < head_dim; ++i) ref[at + i] *= inv * (*w)[i];
            }
            if (!with_bias && w == nullptr) {
              for (int i = 0; i < head_dim; ++i) v_untouched &= got[at + i] == qkv[at + i];
            }
          }
        }
        err = std::max(err, RelError(ref, got));
      }
    }
  }
  if (!v_untouched) err = INFINITY;
  return {"qkv bias + per-head Q/K norm (hd 64, 128)", err, 1e-5, err <= 1e-5};
}

// The O bias folded into the MLP's RMSNorm: x += bias must be stored as the f32 sum itself (the
// residual stream keeps it), the bf16 output within the RMSNorm check's threshold of float64.
// dim 768 takes the 16-byte path, dim 250 the scalar one.
Check CheckAddBiasRmsNorm() {
  double err = 0;
  bool residual_exact = true;
  for (const int dim : {768, 250}) {
    std::vector<DevicePtr> keep;
    const int rows = 37;
    const auto x = Random(int64_t{rows} * dim), bias = Random(dim, 0.5f), w = Random(dim, 0.3f);
    std::vector<float> wb(dim);
    for (int i = 0; i < dim; ++i) wb[i] = Bf(1.0f + w[i]);
    float* dx = Upload(x, keep);
    bf16* dout =
        reinterpret_cast<bf16*>(Upload(std::vector<uint16_t>(int64_t{rows} * dim, 0x7fc0), keep));
    CHECK_OK(LaunchAddBiasAndRmsNorm(dx, Upload(bias, keep),
                                     reinterpret_cast<const bf16*>(Upload(ToBf16Bits(wb), keep)),
                                     dout, rows, dim, 1e-5f, nullptr));
    const auto x_after = Download(dx, x.size());
    const auto out = Download(reinterpret_cast<const uint16_t*>(dout), x.size());
    std::vector<double> ref(x.size());
    std::vector<float> got(x.size());
    for (int r = 0; r < rows; ++r) {
      double ss = 0;
      for (int i = 0; i < dim; ++i) {
        const float sum = x[r * dim + i] + bias[i];
        residual_exact &= x_after[r * dim + i] == sum;
        ss += double(sum) * sum;
      }
      const double inv = 1.0 / std::sqrt(ss / dim + 1e-5);
      for (int i = 0; i < dim; ++i) {
        ref[r * dim + i] = double(x[r * dim + i] + bias[i]) * inv * wb[i];
        got[r * dim + i] = Bf16ToFloat(out[r * dim + i]);
      }
    }
    err = std::max(err, RelError(ref, got));
  }
  if (!residual_exact) err = INFINITY;
  return {"o bias + rms_norm (bf16 out, residual kept)", err, 1e-2, err <= 1e-2};
}

// ---- Backend against the CPU backend ------------------------------------------------------------

struct RandomModel {
  std::string name;  // in the checks' names; empty for the `small` shape
  LlamaConfig config;
  LlamaWeights weights;
  std::vector<std::vector<uint16_t>> storage;  // bf16 tensors
  std::unique_ptr<ModelBundle> bundle;         // a tools/modelgen model's files (ArchitectureModel)

  WeightMatrix Tensor(int64_t rows, int64_t cols, float scale, float mean = 0) {
    std::vector<float> v = Random(rows * cols, scale);
    for (float& x : v) x += mean;
    storage.push_back(ToBf16Bits(v));
    return WeightMatrix{DType::kBF16, storage.back().data(), rows, cols, cols};
  }
};

// The `small` shape of tools/modelgen with random bf16 weights.
std::unique_ptr<RandomModel> SmallModel() {
  auto m = std::make_unique<RandomModel>();
  LlamaConfig& c = m->config;
  c.model_type = "llama";
  c.vocab_size = 32000;
  c.hidden_size = 768;
  c.intermediate_size = 2048;
  c.num_hidden_layers = 12;
  c.num_attention_heads = 12;
  c.num_key_value_heads = 4;
  c.head_dim = 64;
  c.max_position_embeddings = 4096;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000;
  m->storage.reserve(4 + 9 * c.num_hidden_layers);
  const int64_t d = c.hidden_size, hd = c.head_dim, ffn = c.intermediate_size;
  LlamaWeights& w = m->weights;
  w.embed = m->Tensor(c.vocab_size, d, 0.5f);
  w.final_norm = m->Tensor(1, d, 0.1f, 1.0f);
  w.lm_head = m->Tensor(c.vocab_size, d, 1.0f / std::sqrt(float(d)));
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    LayerWeights l;
    const float s = 1.0f / std::sqrt(float(d));
    l.attn_norm = m->Tensor(1, d, 0.1f, 1.0f);
    l.wq = m->Tensor(c.num_attention_heads * hd, d, s);
    l.wk = m->Tensor(c.num_key_value_heads * hd, d, s);
    l.wv = m->Tensor(c.num_key_value_heads * hd, d, s);
    l.wo = m->Tensor(d, c.num_attention_heads * hd, s);
    l.mlp_norm = m->Tensor(1, d, 0.1f, 1.0f);
    l.w_gate = m->Tensor(ffn, d, s);
    l.w_up = m->Tensor(ffn, d, s);
    l.w_down = m->Tensor(d, ffn, 1.0f / std::sqrt(float(ffn)));
    w.layers.push_back(l);
  }
  w.dtype = DType::kBF16;
  return m;
}

// A tools/modelgen model loaded as kvrmd loads it: tiny-qwen2 (Q/K/V biases) or tiny-qwen3
// (per-head Q/K norms), head_dim 64, 4 layers, vocabulary 1024. With `attention_bias`, Q/K/V and
// O biases are added (random bf16, modelgen's bias scale): Qwen3 with attention_bias, every
// vector at once and the only head_dim-64 model with an O bias (tiny-biased's head_dim is 32).
// With `window` > 0, every layer attends within that many positions (Qwen2 with every layer
// sliding, as Mistral 7B v0.1's: tiny-mistral-sw's heads of 32 are not the CUDA kernels').
std::unique_ptr<RandomModel> ArchitectureModel(const std::string& size, bool attention_bias,
                                               int32_t window = 0) {
  auto m = std::make_unique<RandomModel>();
  modelgen::MakeModelOptions options;
  options.size = size;
  options.dtype = DType::kBF16;
  options.out_dir =
      (std::filesystem::temp_directory_path() / ("kvrm-device-check-" + size)).string();
  CHECK_OK(modelgen::MakeModel(options).status());
  auto bundle = ModelBundle::Load(options.out_dir);
  CHECK_OK(bundle.status());
  m->bundle = std::move(*bundle);
  m->name = size;
  m->config = m->bundle->config;
  m->weights = m->bundle->weights;
  if (window > 0) {
    m->name += absl::StrCat(" + window ", window);
    m->config.sliding_window = window;
    m->config.sliding_layers.assign(m->config.num_hidden_layers, true);
  }
  if (attention_bias) {
    m->name += " + attention_bias";
    LlamaConfig& c = m->config;
    c.qkv_bias = c.o_bias = true;
    const int64_t q = int64_t{c.num_attention_heads} * c.head_dim;
    const int64_t kv = int64_t{c.num_key_value_heads} * c.head_dim;
    m->storage.reserve(4 * c.num_hidden_layers);  // the views must not move
    for (LayerWeights& l : m->weights.layers) {
      l.bq = m->Tensor(1, q, 0.5f);
      l.bk = m->Tensor(1, kv, 0.5f);
      l.bv = m->Tensor(1, kv, 0.5f);
      l.bo = m->Tensor(1, c.hidden_size, 0.5f);
    }
  }
  return m;
}

// Sampling inside the decode graph (at tp 2 after the all-gather of the shards): the same step
// replayed with every row marked (the replay rewrites the same KV, so the logits are those of
// the plain Decode before it); each token against the procedure in float64 on those logits,
// rows within rounding of a boundary skipped. One row stays on the host: its logits must come
// back unchanged.
Check CheckGraphSampling(CudaBackend& gpu, StepDescriptor step, int32_t vocab) {
  const int32_t slots = step.max_slots;
  std::vector<float> plain(int64_t{slots} * vocab), logits(int64_t{slots} * vocab, NAN);
  std::vector<int32_t> tokens(slots, -1);
  std::uniform_real_distribution<float> u01(0.0f, 1.0f);
  std::vector<double> scratch;
  int compared = 0, mismatches = 0, host_rows = 0;
  bool host_row_ok = true;
  for (int round = 0; round < 24; ++round) {
    CHECK_OK(gpu.Decode(step, plain.data()));
    int32_t host = -1;
    for (int32_t s = 0; s < slots; ++s) {
      DeviceSampling& p = step.sampling[s];
      p = DeviceSampling{};
      if (!step.active[s]) continue;
      if (host < 0 && round % 3 == 0) {
        host = s;  // left to the host
        continue;
      }
      const int kind = (round + s) % 5;
      p.on_device = 1;
      p.temperature = kind == 0 ? 0.0f : 0.6f + u01(rng);
      p.top_k = kind == 2 ? 1 + static_cast<int32_t>(rng() % 60) : 0;
      p.top_p = kind == 3 ? 0.5f + 0.45f * u01(rng) : 1.0f;
      p.min_p = kind == 4 ? 0.02f : 0.0f;
      p.uniform = std::min(u01(rng), std::nextafter(1.0f, 0.0f));
    }
    CHECK_OK(gpu.DecodeAndSample(step, logits.data(), tokens.data()));
    for (int32_t s = 0; s < slots; ++s) {
      if (!step.active[s]) continue;
      const auto row = absl::MakeConstSpan(plain).subspan(int64_t{s} * vocab, vocab);
      if (s == host) {
        ++host_rows;
        const std::vector<double> want(row.begin(), row.end());
        const std::vector<float> got(logits.begin() + int64_t{s} * vocab,
                                     logits.begin() + int64_t{s + 1} * vocab);
        host_row_ok &= RelError(want, got) <= 1e-5;  // the same replay: equal up to reordering
        continue;
      }
      const DeviceSampleResult want = SampleLikeDevice(row, step.sampling[s], scratch);
      // As the kernel check: f32 prefix sums against float64 are within ~1e-6 of the total. The
      // test model's logits spread a row's mass thinly (~1e-4 a token), so a wider skip would
      // leave only greedy and top-k rows.
      if (want.margin < 1e-5) continue;
      ++compared;
      mismatches += tokens[s] != want.token;
    }
  }
  return {absl::StrFormat("sampling in the decode graph (%d rows, %d host rows)", compared,
                          host_rows),
          compared ? double(mismatches) / compared : 1.0, 0.0,
          mismatches == 0 && compared >= 20 && host_row_ok};
}

// A transfer group from the device pool to the host tier and back to other device blocks: the
// 2-D copies' offsets, widths and pitches in bytes of the pool's element size (the tiers differ in
// block count, so in pitch). The blocks that came back must equal the ones that left, byte for
// byte, in every (layer, K|V, head) row.
Check CheckTransferRoundTrip(CudaBackend& gpu, KvRun from, std::vector<bool>& free_blocks) {
  const KvPoolShape shape = gpu.kv_pool(0)->shape();
  const int32_t n = std::min<int32_t>(from.num_blocks, 8);
  int32_t to = -1;
  for (int32_t b = 0; b + n <= static_cast<int32_t>(free_blocks.size()) && to < 0; ++b) {
    bool all_free = true;
    for (int32_t i = 0; i < n && all_free; ++i) all_free = free_blocks[b + i];
    if (all_free) to = b;
  }
  CHECK(to >= 0) << "no free stretch for the transfer check";
  for (int32_t i = 0; i < n; ++i) free_blocks[to + i] = false;
  const int64_t host_blocks = 3 + n + 5;
  CHECK_OK(gpu.CreateHostTier(host_blocks));
  CHECK_OK(gpu.CopyGroup(TransferGroup{KvTier::kDevice, from.first_block, KvTier::kHost, 3, n}));
  CHECK_OK(gpu.CopyGroup(TransferGroup{KvTier::kHost, 3, KvTier::kDevice, to, n}));
  const KvPool& pool = *gpu.kv_pool(0);
  std::vector<char> bytes(pool.bytes());
  CK(cudaMemcpy(bytes.data(), pool.Layer(0).k, pool.bytes(), cudaMemcpyDeviceToHost));
  auto copy = KvPool::Wrap(shape, bytes.data());
  const int64_t row_bytes = int64_t{n} * shape.block_tokens * shape.head_dim *
                            static_cast<int64_t>(DTypeSize(shape.dtype));
  const int64_t src_tok = int64_t{from.first_block} * shape.block_tokens;
  const int64_t dst_tok = int64_t{to} * shape.block_tokens;
  int64_t differ = 0, rows = 0;
  bool nonzero = false;
  for (int32_t layer = 0; layer < shape.num_layers; ++layer) {
    const KvLayerView v = copy->Layer(layer);
    for (int32_t h = 0; h < shape.kv_heads; ++h) {
      for (const bool key : {true, false}) {
        const char* a = key ? v.KeyBytes(h, src_tok) : v.ValueBytes(h, src_tok);
        const char* b = key ? v.KeyBytes(h, dst_tok) : v.ValueBytes(h, dst_tok);
        differ += std::memcmp(a, b, row_bytes) != 0;
        for (int64_t i = 0; i < row_bytes && !nonzero; ++i) nonzero = a[i] != 0;
        ++rows;
      }
    }
  }
  return {absl::StrFormat("transfer group device->host->device, %s KV (%lld rows differ)",
                          std::string(DTypeName(shape.dtype)), static_cast<long long>(differ)),
          static_cast<double>(differ) / rows, 0.0, differ == 0 && nonzero};
}

// A backend for transfer groups alone: `kv_blocks` blocks of 16 tokens, a small step around
// them, host<->device groups by cudaMemcpy2DAsync or by the copy kernel.
CudaBackendOptions TransferBackendOptions(int64_t kv_blocks, bool copy_kernel) {
  CudaBackendOptions co;
  co.kv_blocks = kv_blocks;
  co.kv_block_tokens = 16;
  co.max_slots = 4;
  co.max_chunk_tokens = 64;
  co.max_context = 512;
  co.max_runs = 4;
  co.host_copy_kernel = copy_kernel;
  return co;
}

// The same round trip with host_copy_kernel (kernels/cuda/copy_rows.h): the host tier read and
// written by the SMs through its device mapping, over a pool of random bytes.
Check CheckHostCopyKernel(const RandomModel& m) {
  auto gpu = CudaBackend::Create(m.config, &m.weights,
                                 TransferBackendOptions(64, /*copy_kernel=*/true));
  CHECK_OK(gpu.status());
  const KvPool& pool = *(*gpu)->kv_pool(0);
  std::vector<uint64_t> noise(pool.bytes() / 8);
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (uint64_t& w : noise) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    w = x;
  }
  CK(cudaMemcpy(pool.Layer(0).k, noise.data(), noise.size() * 8, cudaMemcpyHostToDevice));
  std::vector<bool> free_blocks(64, true);
  for (int32_t b = 0; b < 8; ++b) free_blocks[b] = false;
  Check c = CheckTransferRoundTrip(**gpu, KvRun{0, 8}, free_blocks);
  c.name += " by the copy kernel";
  return c;
}

// A random LoRA adapter for `config` adapting the projections in `targets` (LoraTarget bits) of
// every layer at `rank`: A ~ U(-1, 1) / sqrt(in), B ~ U(-1, 1) * 0.6 / sqrt(rank) times the scale
// (2), so each delta is of the order of its product's output and a row that missed its adapter,
// or took another's, would be far outside the thresholds.
std::unique_ptr<LoraAdapter> RandomLoraAdapter(const LlamaConfig& config, const std::string& name,
                                               int32_t rank, uint32_t targets) {
  auto a = std::make_unique<LoraAdapter>();
  a->name = name;
  a->rank = rank;
  a->alpha = 2.0 * rank;
  a->scale = 2.0;
  a->layers.resize(config.num_hidden_layers);
  for (LoraLayer& layer : a->layers) {
    for (int32_t t = 0; t < kNumLoraTargets; ++t) {
      if (!(targets & (1u << t))) continue;
      const auto [out, in] = LoraTargetShape(config, LoraTarget(t));
      LoraMatrix& m = layer.m[t];
      m.rank = rank;
      m.in = in;
      m.out = out;
      m.a = Random(static_cast<size_t>(rank) * in, 1.0f / std::sqrt(float(in)));
      m.b = Random(static_cast<size_t>(out) * rank, 0.6f / std::sqrt(float(rank)));
      for (float& v : m.b) v = static_cast<float>(v * a->scale);
    }
  }
  return a;
}

// With kv_dtype bf16 both backends keep bf16 pools (each rounds its own f32 K and V to nearest
// even, as FloatToBf16 does); the thresholds are the f32 pools' (3e-2 relative on logits, greedy
// agreement >= 90 %).
// `lora`: both backends with three adapter slots (bf16 factors on both sides): slot 0 a rank-8
// adapter of all seven projections, slot 1 a rank-32 one of Q, V, O and down, slot 2 empty; the
// rows run base, slot 0, slot 1, slot 0; half-way through the decode steps slot 0 is replaced
// by a rank-16 adapter of Q, K, gate and up (SetLoraAdapter between replays), and the mixed
// graph's chunk runs slot 1. A row naming the empty slot must be refused.
// `transfer`: also a transfer group's round trip through the host tier (tp 1).
Check CheckBackend(const RandomModel& m, int tp, DType kv_dtype, bool sampling, bool transfer,
                   std::vector<Check>* also, bool lora = false) {
  const std::string model_name = m.name.empty() ? "" : m.name + " ";
  const std::string lora_name = lora ? ", LoRA" : "";
  const int32_t slots = 4, chunk = 64, max_context = 512, max_runs = 4, block_tokens = 16;
  const int64_t kv_blocks = 200;
  const std::string kv_name(DTypeName(kv_dtype));
  CudaBackendOptions co;
  co.kv_blocks = kv_blocks;
  co.kv_block_tokens = block_tokens;
  co.kv_dtype = kv_dtype;
  co.max_slots = slots;
  co.max_chunk_tokens = chunk;
  co.max_context = max_context;
  co.max_runs = max_runs;
  co.tensor_parallel = tp;
  if (lora) {
    co.max_lora_adapters = 3;
    co.max_lora_rank = 32;
  }
  auto gpu = CudaBackend::Create(m.config, &m.weights, co);
  CHECK_OK(gpu.status());
  CpuBackendOptions po;
  if (lora) {
    po.max_lora_adapters = 3;
    po.max_lora_rank = 32;
    po.lora_dtype = DType::kBF16;
  }
  po.kv_blocks = kv_blocks;
  po.kv_block_tokens = block_tokens;
  po.kv_dtype = kv_dtype;
  po.max_slots = slots;
  po.max_chunk_tokens = chunk;
  po.max_context = max_context;
  po.num_threads = static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
  auto cpu = CpuBackend::Create(m.config, &m.weights, po);
  CHECK_OK(cpu.status());
  // Puts `adapter` in slot `index` of both backends.
  auto set_adapter = [&](int32_t index, const LoraAdapter& adapter) {
    auto g = (*gpu)->PrepareLoraAdapter(adapter);
    CHECK_OK(g.status());
    CHECK_OK((*gpu)->SetLoraAdapter(index, *g));
    auto c = (*cpu)->PrepareLoraAdapter(adapter);
    CHECK_OK(c.status());
    CHECK_OK((*cpu)->SetLoraAdapter(index, *c));
  };
  constexpr uint32_t kAll = (1u << kNumLoraTargets) - 1;
  const auto bit = [](LoraTarget t) { return 1u << static_cast<int32_t>(t); };
  std::unique_ptr<LoraAdapter> swap_in;
  if (lora) {
    set_adapter(0, *RandomLoraAdapter(m.config, "all-r8", 8, kAll));
    set_adapter(1, *RandomLoraAdapter(m.config, "qvod-r32", 32,
                                      bit(LoraTarget::kQ) | bit(LoraTarget::kV) |
                                          bit(LoraTarget::kO) | bit(LoraTarget::kDown)));
    swap_in = RandomLoraAdapter(
        m.config, "qkgu-r16", 16,
        bit(LoraTarget::kQ) | bit(LoraTarget::kK) | bit(LoraTarget::kGate) | bit(LoraTarget::kUp));
  }

  const int32_t vocab = m.config.vocab_size;
  std::vector<bool> free_blocks(kv_blocks, true);
  StepDescriptor step;
  step.Resize(slots, max_runs);
  if (lora) {
    for (int32_t s = 0; s < slots; ++s) step.adapter[s] = s == 0 ? -1 : (s == 2 ? 1 : 0);
  }
  bool refused_empty_slot = !lora;
  std::vector<std::vector<KvRun>> tables(slots);
  std::vector<float> lg(vocab), lc(vocab);
  double worst = 0;
  int agree = 0, total = 0;
  const int decode_steps = 24;
  // Embeddings (PrefillChunk::hidden): each prompt's final-norm rows summed over a few of every
  // chunk's rows (mean pooling's sums; slot 0 every row), GPU against CPU.
  const int32_t d = m.config.hidden_size;
  std::vector<float> hg(d), hc(d);
  double hidden_worst = 0;
  for (int32_t s = 0; s < slots; ++s) {
    const int32_t prompt = 40 + static_cast<int32_t>(rng() % 150);
    std::fill(hg.begin(), hg.end(), 0.0f);
    std::fill(hc.begin(), hc.end(), 0.0f);
    // Room for the decode steps and the mixed-graph check's three more.
    tables[s] = RandomRuns(free_blocks, prompt + decode_steps + 8, block_tokens, max_runs);
    std::vector<int32_t> tokens(prompt);
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % vocab);
    for (int32_t start = 0; start < prompt; start += chunk) {
      PrefillChunk c;
      c.slot = s;
      c.start = start;
      c.tokens = absl::MakeConstSpan(tokens).subspan(start, std::min(chunk, prompt - start));
      c.runs = tables[s].data();
      c.num_runs = static_cast<int32_t>(tables[s].size());
      c.adapter = step.adapter[s];
      const int32_t n = static_cast<int32_t>(c.tokens.size());
      c.hidden_begin = s == 0 ? 0 : n / 3;
      c.hidden_end = s == 0 ? n : n - n / 4;
      PrefillChunk cc = c;
      c.hidden = hg.data();
      cc.hidden = hc.data();
      CHECK_OK((*gpu)->Prefill(c, lg.data()));
      CHECK_OK((*cpu)->Prefill(cc, lc.data()));
    }
    worst = std::max(worst, RelError(std::vector<double>(lc.begin(), lc.end()), lg));
    hidden_worst = std::max(hidden_worst, RelError(std::vector<double>(hc.begin(), hc.end()), hg));
    step.active[s] = 1;
    step.position[s] = prompt;
    step.token[s] = static_cast<int32_t>(std::max_element(lc.begin(), lc.end()) - lc.begin());
    step.num_runs[s] = static_cast<int32_t>(tables[s].size());
    std::copy(tables[s].begin(), tables[s].end(), step.SlotRuns(s).begin());
  }
  std::vector<float> g(int64_t{slots} * vocab), c(int64_t{slots} * vocab);
  // After a step on both backends: each active row's logits (GPU `g` against CPU `c`) into
  // `*err`, greedy agreement into `*same` of `*compared` (with `skip_ties`, only rows whose best
  // two CPU logits are apart by more than bf16 rounding), and both continue from the CPU's token
  // so that the histories stay identical.
  auto compare_rows = [&](bool skip_ties, double* err, int* same, int* compared) {
    for (int32_t s = 0; s < slots; ++s) {
      if (!step.active[s]) continue;
      std::vector<double> ref(c.begin() + int64_t{s} * vocab, c.begin() + int64_t{s + 1} * vocab);
      std::vector<float> got(g.begin() + int64_t{s} * vocab, g.begin() + int64_t{s + 1} * vocab);
      *err = std::max(*err, RelError(ref, got));
      const int32_t tc = static_cast<int32_t>(std::max_element(ref.begin(), ref.end()) - ref.begin());
      const int32_t tg = static_cast<int32_t>(std::max_element(got.begin(), got.end()) - got.begin());
      bool counted = true;
      if (skip_ties) {
        std::vector<double> top(ref);
        std::nth_element(top.begin(), top.begin() + 1, top.end(), std::greater<double>());
        counted = top[0] - top[1] > 2e-2 * std::max(1.0, std::abs(top[0]));
      }
      if (counted) {
        *same += tc == tg;
        ++*compared;
      }
      step.token[s] = tc;
      step.position[s] += 1;
    }
  };
  for (int i = 0; i < decode_steps; ++i) {
    if (i == decode_steps / 2) step.active[1] = 0;  // a slot leaves: its row goes inactive
    if (lora && i == decode_steps / 2 + 2) {
      // A row naming an empty slot is refused (and changes nothing); then slot 0's adapter is
      // replaced between two replays: slot 3's row runs the new one from here on.
      step.adapter[3] = 2;
      refused_empty_slot =
          (*gpu)->Decode(step, g.data()).code() == absl::StatusCode::kInvalidArgument;
      step.adapter[3] = 0;
      set_adapter(0, *swap_in);
    }
    CHECK_OK((*gpu)->Decode(step, g.data()));
    CHECK_OK((*cpu)->Decode(step, c.data()));
    // Near-ties skipped: a random model's top two logits are ~0.2 apart, and bf16 products
    // (against a CPU reference that may keep f32 inputs) can swap them without anything wrong.
    compare_rows(/*skip_ties=*/true, &worst, &agree, &total);
  }
  const bool ok =
      worst <= 3e-2 && total >= decode_steps && agree * 10 >= total * 9 && refused_empty_slot;
  if ((*gpu)->fuses_prefill()) {
    // The mixed graph: a new prompt for the slot that left, chunk by chunk, each chunk riding
    // with the other slots' decode rows in one pass, on both backends (the CPU's mixed pass is
    // checked against its apart one by the CPU tests); every decode row's logits and the
    // chunk's last logits against the CPU, both continuing from the CPU's tokens.
    const int32_t s1 = 1;
    const int32_t prompt = 2 * chunk + 17;
    const std::vector<KvRun> table = RandomRuns(free_blocks, prompt + 1, block_tokens, max_runs);
    std::vector<int32_t> tokens(prompt);
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % vocab);
    double mixed_worst = 0;
    int mixed_agree = 0, mixed_total = 0;
    std::fill(hg.begin(), hg.end(), 0.0f);
    std::fill(hc.begin(), hc.end(), 0.0f);
    for (int32_t start = 0; start < prompt; start += chunk) {
      PrefillChunk ch;
      ch.slot = s1;
      ch.start = start;
      ch.tokens = absl::MakeConstSpan(tokens).subspan(start, std::min(chunk, prompt - start));
      ch.runs = table.data();
      ch.num_runs = static_cast<int32_t>(table.size());
      ch.adapter = lora ? 1 : -1;
      ch.hidden_begin = 0;  // the mixed pass's chunk rows follow the decode rows
      ch.hidden_end = static_cast<int32_t>(ch.tokens.size());
      PrefillChunk cc = ch;
      ch.hidden = hg.data();
      cc.hidden = hc.data();
      CHECK((*gpu)->CanFuse(ch));
      CHECK_OK((*gpu)->DecodeWithChunk(ch, lg.data(), step, g.data()));
      CHECK_OK((*cpu)->DecodeWithChunk(cc, lc.data(), step, c.data()));
      mixed_worst =
          std::max(mixed_worst, RelError(std::vector<double>(lc.begin(), lc.end()), lg));
      // 9 rows in all: one near-tie must not fail the run.
      compare_rows(/*skip_ties=*/true, &mixed_worst, &mixed_agree, &mixed_total);
    }
    hidden_worst = std::max(hidden_worst, RelError(std::vector<double>(hc.begin(), hc.end()), hg));
    also->push_back(
        {absl::StrFormat("%smixed graph tp=%d, %s KV%s vs CPU: logits (greedy agree %d/%d)",
                         model_name, tp, kv_name, lora_name, mixed_agree, mixed_total),
         mixed_worst, 3e-2,
         mixed_worst <= 3e-2 && mixed_total >= 1 && mixed_agree * 10 >= mixed_total * 9});
  }
  also->push_back({absl::StrFormat("%shidden states tp=%d, %s KV%s vs CPU: pooled final-norm rows "
                                   "(embeddings)",
                                   model_name, tp, kv_name, lora_name),
                   hidden_worst, 3e-2, hidden_worst <= 3e-2});
  if (sampling && (*gpu)->samples_on_device()) {
    also->push_back(CheckGraphSampling(**gpu, step, vocab));
  }
  if (transfer && tp == 1) {
    also->push_back(CheckTransferRoundTrip(**gpu, tables[0][0], free_blocks));
  }
  return {absl::StrFormat("%sbackend tp=%d, %s KV%s vs CPU: logits (greedy agree %d/%d)%s",
                          model_name, tp, kv_name, lora_name, agree, total,
                          refused_empty_slot ? "" : "; an empty adapter slot was not refused"),
          worst, 3e-2, ok};
}

// What a transfer group costs through CudaBackend::CopyGroup (the transport's path: one 2-D
// copy per rank on the copy stream, then a synchronize), per direction and group size, on the
// small shape's pool (f32: 393 KB a block in 96 rows of one block's width). The figure the
// engine's H200 model (bench/null_backend.h, DeviceTiming) could not measure without a GPU:
// the host copy rate decides whether kvrm's swaps and the prefix cache's offloads keep up.
struct CopyRow {
  std::string direction;
  int32_t blocks = 0;       // per group
  int32_t groups = 0;       // timed
  double us_per_group = 0;  // wall, including the synchronize
  double gbs = 0;           // bytes moved / time
};

std::vector<CopyRow> MeasureTransfers(const RandomModel& m, bool kernel) {
  const int64_t kv_blocks = 2048, host_blocks = 1024;
  auto gpu = CudaBackend::Create(m.config, &m.weights, TransferBackendOptions(kv_blocks, kernel));
  CHECK_OK(gpu.status());
  CHECK_OK((*gpu)->CreateHostTier(host_blocks));
  const double bytes_per_block = static_cast<double>((*gpu)->kv_pool(0)->shape().BytesPerBlock());
  std::vector<CopyRow> rows;
  struct Dir {
    const char* name;
    KvTier src, dst;
  };
  std::vector<Dir> dirs = {Dir{"device->host", KvTier::kDevice, KvTier::kHost},
                           Dir{"host->device", KvTier::kHost, KvTier::kDevice}};
  if (!kernel) dirs.push_back(Dir{"device->device", KvTier::kDevice, KvTier::kDevice});
  for (const Dir d : dirs) {
    for (const int32_t n : {1, 8, 64}) {
      const int32_t groups = std::max(8, 512 / n);
      // Sources and destinations walk disjoint halves of each tier, group after group.
      auto group = [&](int32_t i) {
        const int32_t src_span = static_cast<int32_t>(d.src == KvTier::kHost ? host_blocks / 2
                                                                             : kv_blocks / 2);
        const int32_t dst_span = static_cast<int32_t>(d.dst == KvTier::kHost ? host_blocks / 2
                                                                             : kv_blocks / 2);
        const int32_t src = (i * n) % (src_span - n + 1);
        const int32_t dst = dst_span + (i * n) % (dst_span - n + 1);
        return TransferGroup{d.src, src, d.dst, dst, n};
      };
      for (int32_t i = 0; i < 4; ++i) CHECK_OK((*gpu)->CopyGroup(group(i)));  // warm-up
      const auto t0 = std::chrono::steady_clock::now();
      for (int32_t i = 0; i < groups; ++i) CHECK_OK((*gpu)->CopyGroup(group(i)));
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      CopyRow r;
      r.direction = d.src == d.dst || !kernel ? d.name : absl::StrCat(d.name, " (copy kernel)");
      r.blocks = n;
      r.groups = groups;
      r.us_per_group = s / groups * 1e6;
      r.gbs = bytes_per_block * n * groups / s / 1e9;
      std::printf("  transfer %s, %d-block groups: %.1f us a group, %.1f GB/s\n",
                  r.direction.c_str(), n, r.us_per_group, r.gbs);
      std::fflush(stdout);
      rows.push_back(r);
    }
  }
  return rows;
}

// The decode benchmarks' backend: `slots` slots of `context` tokens and 64 more for the steps,
// blocks of 16 tokens, one run of `*blocks_per_slot` blocks a slot (slot s from block s *
// blocks_per_slot), chunks of 256, run tables of 8, and `spare` blocks after the slots'.
CudaBackendOptions BenchOptions(int32_t slots, int32_t context, int64_t spare,
                                int32_t* blocks_per_slot) {
  CudaBackendOptions co;
  co.kv_block_tokens = 16;
  *blocks_per_slot = (context + 64 + co.kv_block_tokens - 1) / co.kv_block_tokens;
  co.kv_blocks = int64_t{slots} * *blocks_per_slot + spare;
  co.max_slots = slots;
  co.max_chunk_tokens = 256;
  co.max_context = context + 64;
  co.max_runs = 8;
  return co;
}

// Every slot's history: `context` random tokens prefilled into its own run of blocks_per_slot
// blocks (slot s from block s * blocks_per_slot), in chunks; with `adapters`, slot s on adapter
// s % adapters. Returns the decode step that goes on from there.
StepDescriptor PrefillRandomHistories(CudaBackend& gpu, int32_t slots, int32_t context,
                                      int32_t chunk, int32_t max_runs, int32_t blocks_per_slot,
                                      int32_t vocab, int32_t adapters) {
  StepDescriptor step;
  step.Resize(slots, max_runs);
  std::vector<float> lg(vocab);
  std::vector<int32_t> tokens(context);
  for (int32_t s = 0; s < slots; ++s) {
    const KvRun run{s * blocks_per_slot, blocks_per_slot};
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % vocab);
    const int32_t adapter = adapters > 0 ? s % adapters : -1;
    for (int32_t start = 0; start < context; start += chunk) {
      PrefillChunk c;
      c.slot = s;
      c.start = start;
      c.tokens = absl::MakeConstSpan(tokens).subspan(start, std::min(chunk, context - start));
      c.runs = &run;
      c.num_runs = 1;
      c.adapter = adapter;
      CHECK_OK(gpu.Prefill(c, lg.data()));
    }
    step.active[s] = 1;
    step.position[s] = context;
    step.token[s] = static_cast<int32_t>(rng() % vocab);
    step.num_runs[s] = 1;
    step.SlotRuns(s)[0] = run;
    step.adapter[s] = adapter;
  }
  return step;
}

// With `profile`, a few graph replays run between cudaProfilerStart and Stop, for
// `ncu --profile-from-start off` (tools/device_check.sh profile): each kernel of the step apart.
BenchRow Bench(const RandomModel& m, int tp, int slots, int context, double copy_gbs,
               DType kv_dtype = DType::kF32, int32_t split_tokens = 256, int token_sets = 2,
               bool profile = false) {
  const int64_t spare = 256;  // compaction traffic runs here, beside the slots' blocks
  int32_t blocks_per_slot = 0;
  CudaBackendOptions co = BenchOptions(slots, context, 2 * spare, &blocks_per_slot);
  const int32_t chunk = co.max_chunk_tokens, max_runs = co.max_runs;
  co.tensor_parallel = tp;
  co.kv_dtype = kv_dtype;
  co.split_tokens = split_tokens;
  co.attention_token_sets = token_sets;
  auto gpu = CudaBackend::Create(m.config, &m.weights, co);
  CHECK_OK(gpu.status());
  const int32_t vocab = m.config.vocab_size;
  std::vector<float> lg(vocab);
  StepDescriptor step = PrefillRandomHistories(**gpu, slots, context, chunk, max_runs,
                                               blocks_per_slot, vocab, /*adapters=*/0);
  std::vector<float> logits(int64_t{slots} * vocab);
  // The engine's pre-staging: each step's compaction group is submitted before the step runs
  // and must be complete before the next one; the wait is what the replay lost to transport.
  Transport transport([&](const TransferGroup& g) { return (*gpu)->CopyGroup(g); },
                      (*gpu)->kv_pool(0)->shape().BytesPerBlock(), 64);
  const int warmup = 20, steps = 200;
  double wait_s = 0, total_s = 0;
  uint64_t pending = 0;
  const int64_t spare_base = int64_t{slots} * blocks_per_slot;
  for (int i = 0; i < warmup + steps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    if (pending) {
      const absl::Duration w = transport.WaitFor(pending);
      if (i >= warmup) wait_s += absl::ToDoubleSeconds(w);
    }
    const TransferGroup g{KvTier::kDevice, static_cast<int32_t>(spare_base + (i % 2) * spare),
                          KvTier::kDevice, static_cast<int32_t>(spare_base + ((i + 1) % 2) * spare),
                          static_cast<int32_t>(std::min<int64_t>(spare, 32))};
    pending = transport.Submit(absl::MakeConstSpan(&g, 1), 0);
    CHECK_OK((*gpu)->Decode(step, logits.data()));
    transport.StepDone(i + 1);
    if (i >= warmup) total_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  transport.WaitFor(pending);
  BenchRow row;
  if ((*gpu)->fuses_prefill()) {
    // The last slot's history is prefilled again as a full chunk while the others decode.
    const int32_t last = slots - 1;
    step.active[last] = 0;
    const KvRun run{last * blocks_per_slot, blocks_per_slot};
    std::vector<int32_t> tokens(chunk);
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % vocab);
    PrefillChunk c;
    c.slot = last;
    c.start = 0;
    c.tokens = tokens;
    c.runs = &run;
    c.num_runs = 1;
    auto time_ms = [&](auto&& body) {
      for (int i = 0; i < 5; ++i) body();
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 50; ++i) body();
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 50 * 1e3;
    };
    row.chunk_apart_ms = time_ms([&] {
      CHECK_OK((*gpu)->Prefill(c, lg.data()));
      CHECK_OK((*gpu)->Decode(step, logits.data()));
    });
    row.chunk_mixed_ms = time_ms([&] { CHECK_OK((*gpu)->DecodeWithChunk(c, lg.data(), step, logits.data())); });
    step.active[last] = 1;
    CHECK_OK((*gpu)->Decode(step, logits.data()));  // TimeDecodeReplays replays the full step
  }
  if ((*gpu)->samples_on_device()) {
    // The engine's step with sampling in the graph: every row greedy, tokens back instead of
    // [slots][vocab] logits.
    for (int32_t s = 0; s < slots; ++s) step.sampling[s] = DeviceSampling{1, 0.0f};
    std::vector<int32_t> tokens(slots);
    for (int i = 0; i < 10; ++i) CHECK_OK((*gpu)->DecodeAndSample(step, logits.data(), tokens.data()));
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 100; ++i) CHECK_OK((*gpu)->DecodeAndSample(step, logits.data(), tokens.data()));
    row.sampled_step_ms =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 100 * 1e3;
    for (int32_t s = 0; s < slots; ++s) step.sampling[s] = DeviceSampling{};
    // TimeDecodeReplays replays the last step's graph: the plain decode, not decode + sampling.
    CHECK_OK((*gpu)->Decode(step, logits.data()));
  }
  row.tp = tp;
  row.slots = slots;
  row.kv = std::string(DTypeName(kv_dtype));
  row.context = context;
  row.step_ms = total_s / steps * 1e3;
  // Graph replay alone, with events (same inputs).
  auto graph_ms = (*gpu)->TimeDecodeReplays(100);
  CHECK_OK(graph_ms.status());
  row.graph_ms = *graph_ms;
  row.split_tokens = split_tokens;
  row.token_sets = token_sets;
  if (profile) {
    CK(cudaProfilerStart());
    CHECK_OK((*gpu)->TimeDecodeReplays(2).status());
    CK(cudaProfilerStop());
  }
  row.tokens_per_s = slots / (row.step_ms * 1e-3);
  const double embed_bytes = double(m.config.vocab_size) * m.config.hidden_size * 2;
  // KV bytes at the pool's element size (2 a K or V element with a bf16 pool).
  row.bytes_per_step = ((*gpu)->weight_bytes_per_rank() - embed_bytes) +
                       double(slots) * (context + 1) * (*gpu)->kv_bytes_per_token_per_rank();
  row.achieved_gbs = row.bytes_per_step / (row.graph_ms * 1e-3) / 1e9;
  row.of_copy = row.achieved_gbs / copy_gbs;
  row.transport_wait_share = wait_s / total_s;
  return row;
}

// What serving LoRA adapters costs a decode replay: `slots` rows at `context`, every row running
// one of `adapters` adapters of rank `rank` adapting all seven projections, the decode graph
// with the adapters' products against the plain one over the same inputs (CUDA events).
struct LoraCostRow {
  int slots = 0, context = 0, adapters = 0, rank = 0;
  double base_graph_ms = 0, lora_graph_ms = 0;
};
LoraCostRow LoraReplayCost(const RandomModel& m, int slots, int context, int adapters, int rank) {
  int32_t blocks_per_slot = 0;
  CudaBackendOptions co = BenchOptions(slots, context, /*spare=*/0, &blocks_per_slot);
  co.max_lora_adapters = adapters;
  co.max_lora_rank = rank;
  auto gpu = CudaBackend::Create(m.config, &m.weights, co);
  CHECK_OK(gpu.status());
  for (int a = 0; a < adapters; ++a) {
    auto prepared = (*gpu)->PrepareLoraAdapter(
        *RandomLoraAdapter(m.config, absl::StrCat("a", a), rank, (1u << kNumLoraTargets) - 1));
    CHECK_OK(prepared.status());
    CHECK_OK((*gpu)->SetLoraAdapter(a, *prepared));
  }
  const int32_t vocab = m.config.vocab_size;
  std::vector<float> logits(int64_t{slots} * vocab);
  StepDescriptor step = PrefillRandomHistories(**gpu, slots, context, co.max_chunk_tokens,
                                               co.max_runs, blocks_per_slot, vocab, adapters);
  CHECK_OK((*gpu)->Decode(step, logits.data()));
  LoraCostRow row{slots, context, adapters, rank};
  for (int i = 0; i < 2; ++i) {  // each measured twice, in turn: the second pair is kept
    auto base = (*gpu)->TimeDecodeReplays(100, /*lora=*/false);
    CHECK_OK(base.status());
    auto with = (*gpu)->TimeDecodeReplays(100, /*lora=*/true);
    CHECK_OK(with.status());
    row.base_graph_ms = *base;
    row.lora_graph_ms = *with;
  }
  std::printf(
      "  LoRA: %d slots, context %d, %d adapters of rank %d on every row: graph %.3f ms "
      "against %.3f ms without (%.2fx)\n",
      slots, context, adapters, rank, row.lora_graph_ms, row.base_graph_ms,
      row.lora_graph_ms / row.base_graph_ms);
  std::fflush(stdout);
  return row;
}

}  // namespace
}  // namespace kvrm::cuda

int main(int argc, char** argv) {
  using namespace kvrm::cuda;
  std::string json_path;
  bool quick = false, checks_only = false, bench_only = false, profile = false;
  // A sweep instead of the standard rows: every combination of these lists (comma-separated).
  std::vector<int> sweep_slots, sweep_contexts, sweep_splits, sweep_sets;
  std::vector<kvrm::DType> sweep_kv;
  auto ints = [](const std::string& list) {
    std::vector<int> v;
    for (absl::string_view part : absl::StrSplit(list, ',')) {
      int x = 0;
      CHECK(absl::SimpleAtoi(part, &x) && x > 0) << "device_check: bad number in " << list;
      v.push_back(x);
    }
    return v;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* flag) -> const char* {
      const size_t n = std::strlen(flag);
      return a.size() > n + 1 && a.compare(0, n, flag) == 0 && a[n] == '=' ? a.c_str() + n + 1
                                                                          : nullptr;
    };
    if (a == "--json" && i + 1 < argc) json_path = argv[++i];
    if (a == "--quick") quick = true;
    if (a == "--checks_only") checks_only = true;  // correctness only (the requires-gpu test)
    if (a == "--bench_only") bench_only = true;    // the decode table only
    if (a == "--profile") profile = true;          // the first row's replays for ncu
    if (const char* v = value("--slots")) sweep_slots = ints(v);
    if (const char* v = value("--contexts")) sweep_contexts = ints(v);
    if (const char* v = value("--split_tokens")) sweep_splits = ints(v);
    if (const char* v = value("--token_sets")) sweep_sets = ints(v);
    if (const char* v = value("--kv")) {
      for (absl::string_view part : absl::StrSplit(v, ',')) {
        CHECK(part == "f32" || part == "bf16") << "device_check: --kv takes f32 and bf16";
        sweep_kv.push_back(part == "bf16" ? kvrm::DType::kBF16 : kvrm::DType::kF32);
      }
    }
  }
  const bool sweep = !sweep_slots.empty() || !sweep_contexts.empty() || !sweep_splits.empty() ||
                     !sweep_sets.empty() || !sweep_kv.empty();
  const int devices = CudaDeviceCount();
  if (devices == 0) {
    std::printf("device_check: no CUDA device here; nothing to check\n");
    return 2;
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device_check: %d x %s (%d SMs, %.0f GiB)\n", devices, prop.name,
              prop.multiProcessorCount, prop.totalGlobalMem / double(1 << 30));
  const double copy_gbs = CopyBandwidth();
  std::printf("device-to-device copy: %.0f GB/s (read + write)\n", copy_gbs);

  std::vector<Check> checks;
  auto run = [&](Check c) {
    std::printf("  %-60s err %.3g (<= %.3g) %s\n", c.name.c_str(), c.error, c.threshold,
                c.ok ? "ok" : "FAIL");
    std::fflush(stdout);
    checks.push_back(c);
  };
  if (!bench_only) {
  run(CheckRmsNormAndEmbed());
  run(CheckSwiGlu());
  run(CheckGemm());
  run(CheckAttention<float>(64, 12, 4));
  run(CheckAttention<float>(128, 8, 8));
  run(CheckAttention<float>(128, 32, 4));
  run(CheckAttention<float>(64, 8, 4));    // groups of 2
  run(CheckAttention<float>(128, 16, 4));  // and 4 (Llama 3 8B's)
  run(CheckAttention<bf16>(64, 12, 4));  // both load widths (head_dim 64: 4 bytes, 128: 8)
  run(CheckAttention<bf16>(128, 32, 4));
  // Sliding windows (Mistral 7B v0.1's shape: 32 heads of 128 over 8 KV heads), ending
  // mid-split and mid-block, with the blocks behind them released.
  run(CheckAttention<bf16>(128, 32, 8, 200));
  run(CheckAttention<float>(64, 12, 4, 37));
  run(CheckSampling());
  }
  auto model = SmallModel();
  std::vector<Check> also;
  if (!bench_only) {
  run(CheckBackend(*model, 1, kvrm::DType::kF32, /*sampling=*/true, /*transfer=*/true, &also));
  if (devices >= 2) {
    run(CheckBackend(*model, 2, kvrm::DType::kF32, /*sampling=*/true, /*transfer=*/true, &also));
  }
  // The bf16 pool against the CPU's bf16 pool (sampling reads logits, whatever the pool: once).
  run(CheckBackend(*model, 1, kvrm::DType::kBF16, /*sampling=*/false, /*transfer=*/true, &also));
  // LoRA adapters through every graph (their rows, a replaced slot, the mixed chunk's).
  for (int tp = 1; tp <= std::min(devices, 2); ++tp) {
    run(CheckBackend(*model, tp, kvrm::DType::kF32, /*sampling=*/false, /*transfer=*/false, &also,
                     /*lora=*/true));
  }
  for (const Check& c : also) run(c);
  run(CheckHostCopyKernel(*model));
  // Qwen2 / Qwen3 / biased attention: its kernels, then the models through every graph against
  // the CPU backend (after the checks above, whose random inputs stay those of earlier runs).
  run(CheckQkvBiasAndNorm());
  run(CheckAddBiasRmsNorm());
  also.clear();
  // (tiny-qwen2 + window 48: prompts of 40-190 tokens and 24 steps run past the window.)
  struct Arch {
    std::string size;
    bool attention_bias;
    int32_t window;
  };
  for (const Arch& a : {Arch{"tiny-qwen2", false, 0}, Arch{"tiny-qwen3", false, 0},
                        Arch{"tiny-qwen3", true, 0}, Arch{"tiny-qwen2", false, 48}}) {
    const auto arch = ArchitectureModel(a.size, a.attention_bias, a.window);
    for (int tp = 1; tp <= std::min(devices, 2); ++tp) {
      run(CheckBackend(*arch, tp, kvrm::DType::kF32, /*sampling=*/false, /*transfer=*/false,
                       &also));
    }
  }
  for (const Check& c : also) run(c);
  }

  std::vector<BenchRow> rows;
  std::vector<int> slot_counts = quick ? std::vector<int>{64} : std::vector<int>{16, 64, 128};
  if (checks_only || sweep) slot_counts.clear();
  for (int tp : devices >= 2 ? std::vector<int>{1, 2} : std::vector<int>{1}) {
    for (int slots : slot_counts) {
      rows.push_back(Bench(*model, tp, slots, 512, copy_gbs));
      std::fflush(stdout);
    }
  }
  if (!checks_only && !sweep) {
    // Longer histories at 64 slots: at context 512 the step is ~120 latency-bound launches
    // around ~1 GB of reads; the KV reads, which the step's time should follow, dominate from
    // a few thousand tokens on.
    for (int context : {2048, 4000}) rows.push_back(Bench(*model, 1, 64, context, copy_gbs));
    // A bf16 KV pool at 64 slots: half the KV bytes a step reads.
    for (int context : {512, 4000}) {
      rows.push_back(Bench(*model, 1, 64, context, copy_gbs, kvrm::DType::kBF16));
    }
  }
  std::vector<LoraCostRow> lora_rows;
  if (!checks_only && !sweep) lora_rows.push_back(LoraReplayCost(*model, 64, 512, 4, 16));
  std::vector<CopyRow> copies;
  if (!checks_only && !sweep) {
    copies = MeasureTransfers(*model, /*kernel=*/false);
    const std::vector<CopyRow> k = MeasureTransfers(*model, /*kernel=*/true);
    copies.insert(copies.end(), k.begin(), k.end());
  }
  if (sweep && !checks_only) {
    rows.clear();
    if (sweep_slots.empty()) sweep_slots = {64};
    if (sweep_contexts.empty()) sweep_contexts = {512};
    if (sweep_splits.empty()) sweep_splits = {256};
    if (sweep_sets.empty()) sweep_sets = {2};
    if (sweep_kv.empty()) sweep_kv = {kvrm::DType::kF32};
    for (kvrm::DType kv : sweep_kv) {
      for (int slots : sweep_slots) {
        for (int context : sweep_contexts) {
          for (int split : sweep_splits) {
            for (int sets : sweep_sets) {
              CHECK(sets == 2 || sets == 4) << "device_check: --token_sets takes 2 and 4";
              rows.push_back(Bench(*model, 1, slots, context, copy_gbs, kv, split, sets,
                                   profile && rows.empty()));
              const BenchRow& r = rows.back();
              std::printf("  %s KV, %d slots, context %d, split %d, %d sets: graph %.3f ms, %.0f GB/s (%.0f%% of copy)\n",
                          r.kv.c_str(), slots, context, split, sets, r.graph_ms, r.achieved_gbs,
                          100 * r.of_copy);
              std::fflush(stdout);
            }
          }
        }
      }
    }
  }

  bool ok = true;
  for (const Check& c : checks) ok = ok && c.ok;
  std::printf("\n%s, copy bandwidth %.0f GB/s, small shape (bf16 weights)\n", prop.name, copy_gbs);
  std::printf("| tp | slots | kv | context | split | sets | step ms | step+sample ms | graph ms | tokens/s | MB/step | GB/s | of copy | transport wait | chunk apart ms | chunk mixed ms |\n");
  std::printf("|---:|------:|:---|--------:|------:|-----:|--------:|---------------:|---------:|---------:|--------:|-----:|--------:|---------------:|---------------:|---------------:|\n");
  for (const BenchRow& r : rows) {
    std::printf("| %d | %d | %s | %d | %d | %d | %.3f | %.3f | %.3f | %.0f | %.1f | %.0f | %.0f%% | %.2f%% | %.3f | %.3f |\n",
                r.tp, r.slots, r.kv.c_str(), r.context, r.split_tokens, r.token_sets, r.step_ms, r.sampled_step_ms, r.graph_ms, r.tokens_per_s,
                r.bytes_per_step / 1e6, r.achieved_gbs, 100 * r.of_copy,
                100 * r.transport_wait_share, r.chunk_apart_ms, r.chunk_mixed_ms);
  }
  if (!lora_rows.empty()) {
    std::printf(
        "\n| LoRA | slots | context | adapters | rank | graph ms | without ms | ratio |\n"
        "|:--|---:|---:|---:|---:|---:|---:|---:|\n");
    for (const LoraCostRow& r : lora_rows) {
      std::printf("| every row adapted | %d | %d | %d | %d | %.3f | %.3f | %.2fx |\n", r.slots,
                  r.context, r.adapters, r.rank, r.lora_graph_ms, r.base_graph_ms,
                  r.lora_graph_ms / r.base_graph_ms);
    }
  }
  if (!copies.empty()) {
    std::printf("\n| transfer group | blocks | us a group | GB/s |\n|:--|---:|---:|---:|\n");
    for (const CopyRow& c : copies) {
      std::printf("| %s | %d | %.1f | %.1f |\n", c.direction.c_str(), c.blocks, c.us_per_group,
                  c.gbs);
    }
  }
  std::printf("checks: %zu passed, %zu failed\n",
              static_cast<size_t>(std::count_if(checks.begin(), checks.end(), [](const Check& c) { return c.ok; })),
              static_cast<size_t>(std::count_if(checks.begin(), checks.end(), [](const Check& c) { return !c.ok; })));
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    // JSON has no NaN or infinity: a check that produced one writes null.
    auto num = [](double v) { return std::isfinite(v) ? absl::StrCat(v) : std::string("null"); };
    f << "{\n  \"device\": \"" << prop.name << "\",\n  \"devices\": " << devices
      << ",\n  \"copy_gbs\": " << num(copy_gbs) << ",\n  \"checks\": [\n";
    for (size_t i = 0; i < checks.size(); ++i) {
      f << "    {\"name\": \"" << checks[i].name << "\", \"error\": " << num(checks[i].error)
        << ", \"threshold\": " << num(checks[i].threshold) << ", \"ok\": " << (checks[i].ok ? "true" : "false")
        << "}" << (i + 1 < checks.size() ? "," : "") << "\n";
    }
    f << "  ],\n  \"decode\": [\n";
    for (size_t i = 0; i < rows.size(); ++i) {
      const BenchRow& r = rows[i];
      f << "    {\"tp\": " << r.tp << ", \"slots\": " << r.slots << ", \"kv_dtype\": \"" << r.kv
        << "\", \"context\": " << r.context << ", \"split_tokens\": " << r.split_tokens
        << ", \"token_sets\": " << r.token_sets
        << ", \"step_ms\": " << num(r.step_ms) << ", \"sampled_step_ms\": " << num(r.sampled_step_ms)
        << ", \"graph_ms\": " << num(r.graph_ms)
        << ", \"tokens_per_s\": " << num(r.tokens_per_s) << ", \"bytes_per_step\": " << num(r.bytes_per_step)
        << ", \"achieved_gbs\": " << num(r.achieved_gbs) << ", \"of_copy\": " << num(r.of_copy)
        << ", \"transport_wait_share\": " << num(r.transport_wait_share)
        << ", \"chunk_apart_ms\": " << num(r.chunk_apart_ms) << ", \"chunk_mixed_ms\": " << num(r.chunk_mixed_ms)
        << "}"
        << (i + 1 < rows.size() ? "," : "") << "\n";
    }
    f << "  ],\n  \"lora\": [\n";
    for (size_t i = 0; i < lora_rows.size(); ++i) {
      const LoraCostRow& r = lora_rows[i];
      f << "    {\"slots\": " << r.slots << ", \"context\": " << r.context
        << ", \"adapters\": " << r.adapters << ", \"rank\": " << r.rank
        << ", \"lora_graph_ms\": " << num(r.lora_graph_ms)
        << ", \"base_graph_ms\": " << num(r.base_graph_ms) << "}"
        << (i + 1 < lora_rows.size() ? "," : "") << "\n";
    }
    f << "  ],\n  \"transfers\": [\n";
    for (size_t i = 0; i < copies.size(); ++i) {
      const CopyRow& c = copies[i];
      f << "    {\"direction\": \"" << c.direction << "\", \"blocks\": " << c.blocks
        << ", \"groups\": " << c.groups << ", \"us_per_group\": " << num(c.us_per_group)
        << ", \"gbs\": " << num(c.gbs) << "}" << (i + 1 < copies.size() ? "," : "") << "\n";
    }
    f << "  ]\n}\n";
  }
  return ok ? 0 : 1;
}
