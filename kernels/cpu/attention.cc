#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/logging.h"
#include "kernels/cpu/fast_math.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/ops.h"

// Attention's portable loops are compiled for several instruction sets (KVRM_CPU_CLONES).

namespace kvrm {

namespace attention_avx512 {
// kernels/cpu/attention_avx512.cc
bool Handles(int32_t head_dim);
#define KVRM_ATTENTION_AVX512_DECLS(Elem)                                                       \
  void ScoreKeys(const float* q, int32_t group, int32_t head_dim, const Elem* k, int64_t n,     \
                 float scale, float add, float* scores, int64_t ld);                            \
  void AddValues(const float* p, int64_t ld, const float* inv, int32_t group, int32_t head_dim, \
                 const Elem* v, int64_t n, float* out);
KVRM_ATTENTION_AVX512_DECLS(float)
KVRM_ATTENTION_AVX512_DECLS(uint16_t)
KVRM_ATTENTION_AVX512_DECLS(Fp8E4M3)
KVRM_ATTENTION_AVX512_DECLS(Fp8E5M2)
#undef KVRM_ATTENTION_AVX512_DECLS
}  // namespace attention_avx512

int64_t PhysicalToken(const KvRun* runs, int32_t num_runs, int32_t block_tokens, int64_t pos) {
  int64_t logical_block = pos / block_tokens;
  for (int32_t r = 0; r < num_runs; ++r) {
    if (logical_block < runs[r].num_blocks) {
      return (static_cast<int64_t>(runs[r].first_block) + logical_block) * block_tokens +
             pos % block_tokens;
    }
    logical_block -= runs[r].num_blocks;
  }
  LOG(FATAL) << "position " << pos << " beyond the run table";
  return -1;
}

namespace {

constexpr int kLanes = 16;

// A KV element as f32 (bf16 pools widen exactly; FP8 through its f16 view, so still to be
// multiplied by KvLayerView::KeyUnit / ValueUnit, as the AVX-512 loops do).
inline float Widen(float x) { return x; }
inline float Widen(uint16_t x) { return Bf16ToFloat(x); }
inline float Widen(Fp8E4M3 x) {
  return F16ToFloat(Fp8AsHalf(DType::kF8E4M3, static_cast<uint8_t>(x)));
}
inline float Widen(Fp8E5M2 x) {
  return F16ToFloat(Fp8AsHalf(DType::kF8E5M2, static_cast<uint8_t>(x)));
}

template <typename Elem>
__attribute__((always_inline)) inline float Dot(const float* __restrict a,
                                                const Elem* __restrict b, int32_t n) {
  float acc[kLanes] = {};
  int32_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) acc[j] += a[i + j] * Widen(b[i + j]);
  }
  float s = 0;
  for (int j = 0; j < kLanes; ++j) s += acc[j];
  for (; i < n; ++i) s += a[i] * Widen(b[i]);
  return s;
}

// Sum in 16 lanes then across them: a fixed order, vectorisable without -ffast-math.
inline float Sum(const float* x, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) acc[j] += x[i + j];
  }
  float s = 0;
  for (int j = 0; j < kLanes; ++j) s += acc[j];
  for (; i < n; ++i) s += x[i];
  return s;
}

}  // namespace

void AttendOneHead(const float* q, const KvLayerView& kv, int32_t kv_head, const KvRun* runs,
                   int32_t num_runs, int64_t seq_len, float scale, float* scores, float* out) {
  AttendGroup(q, 1, kv, kv_head, runs, num_runs, seq_len, scale, scores, out);
}

namespace {

// Calls fn(first_physical_token, n) for each physically contiguous stretch of `num_tokens`
// tokens that starts at kept token `first_kept_token` of the run table, in logical order.
template <typename Fn>
inline void ForEachStretch(const KvRun* runs, int32_t num_runs, int32_t block_tokens,
                           int64_t first_kept_token, int64_t num_tokens, Fn&& fn) {
  int64_t skip = first_kept_token;  // tokens
  for (int32_t r = 0; r < num_runs && num_tokens > 0; ++r) {
    const int64_t run_tokens = int64_t{runs[r].num_blocks} * block_tokens;
    if (skip >= run_tokens) {
      skip -= run_tokens;
      continue;
    }
    const int64_t n = std::min<int64_t>(run_tokens - skip, num_tokens);
    fn(int64_t{runs[r].first_block} * block_tokens + skip, n);
    num_tokens -= n;
    skip = 0;
  }
  DCHECK(num_tokens == 0);
}

// Pass 1 over one physically contiguous stretch of n keys:
// scores[g * ld + j] = (q_g . k_j) * scale + add.
template <typename Elem>
__attribute__((always_inline)) inline void ScoreKeysImpl(const float* q, int32_t group, int32_t d,
                                                         const Elem* k, int64_t n, float scale,
                                                         float add, float* scores, int64_t ld) {
  for (int64_t j = 0; j < n; ++j) {
    for (int32_t g = 0; g < group; ++g) {
      scores[g * ld + j] = Dot(q + g * d, k + j * d, d) * scale + add;
    }
  }
}

// Pass 2 over one stretch of n values: out_g += sum_j (p[g * ld + j] * inv[g]) v_j, in order.
template <typename Elem>
__attribute__((always_inline)) inline void AddValuesImpl(const float* p, int64_t ld,
                                                         const float* inv, int32_t group,
                                                         int32_t d, const Elem* v, int64_t n,
                                                         float* out) {
  for (int64_t j = 0; j < n; ++j) {
    const Elem* __restrict vj = v + j * d;
    for (int32_t g = 0; g < group; ++g) {
      const float pj = p[g * ld + j] * inv[g];
      float* __restrict o = out + g * d;
      for (int32_t i = 0; i < d; ++i) o[i] += pj * Widen(vj[i]);
    }
  }
}

// The loops compiled per instruction set (KVRM_CPU_CLONES), for each KV dtype.
#define KVRM_ATTENTION_PORTABLE(Elem)                                                            \
  KVRM_CPU_CLONES                                                                                \
  void ScoreKeysPortable(const float* q, int32_t group, int32_t d, const Elem* k, int64_t n,     \
                         float scale, float add, float* scores, int64_t ld) {                    \
    ScoreKeysImpl(q, group, d, k, n, scale, add, scores, ld);                                    \
  }                                                                                              \
  KVRM_CPU_CLONES                                                                                \
  void AddValuesPortable(const float* p, int64_t ld, const float* inv, int32_t group, int32_t d, \
                         const Elem* v, int64_t n, float* out) {                                 \
    AddValuesImpl(p, ld, inv, group, d, v, n, out);                                              \
  }
KVRM_ATTENTION_PORTABLE(float)
KVRM_ATTENTION_PORTABLE(uint16_t)
KVRM_ATTENTION_PORTABLE(Fp8E4M3)
KVRM_ATTENTION_PORTABLE(Fp8E5M2)
#undef KVRM_ATTENTION_PORTABLE

// Softmax of each group's row of scores; inv[g] = 1 / the row's sum (applied in pass 2). With
// `sinks` ([group]), each row's sink logit joins the max and the sum.
KVRM_CPU_CLONES
void ExpScores(float* scores, int32_t group, int64_t cols, const float* sinks, float* inv) {
  for (int32_t g = 0; g < group; ++g) {
    float* s = scores + g * cols;
    float mx = sinks != nullptr ? sinks[g] : -INFINITY;
    for (int64_t j = 0; j < cols; ++j) mx = std::max(mx, s[j]);
    for (int64_t j = 0; j < cols; ++j) s[j] = FastExp(s[j] - mx);  // <= 0
    const float sink = sinks != nullptr ? FastExp(sinks[g] - mx) : 0.0f;
    inv[g] = 1.0f / (Sum(s, cols) + sink);
  }
}

// Gemma 2's softcapping of `cols` scores of each of `group` rows (ld apart).
void Softcap(float* scores, int32_t group, int64_t cols, int64_t ld, float cap) {
  for (int32_t g = 0; g < group; ++g) SoftcapInPlace(scores + g * ld, cap, cols);
}

// fn(Elem{}) for the element type of a pool of `dtype`: float (f32), uint16_t (bf16), Fp8E4M3
// or Fp8E5M2.
template <typename Fn>
inline void WithPoolElement(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kBF16:
      return fn(uint16_t{});
    case DType::kF8E4M3:
      return fn(Fp8E4M3{});
    case DType::kF8E5M2:
      return fn(Fp8E5M2{});
    default:
      return fn(float{});
  }
}

// The inner loops for this head size on the active instruction set.
struct StretchOps {
  explicit StretchOps(int32_t head_dim)
      : avx512((ActiveCpuIsa() == CpuIsa::kAvx512 || ActiveCpuIsa() == CpuIsa::kAvx512Bf16) &&
               attention_avx512::Handles(head_dim)),
        d(head_dim) {}

  // Elem: float (f32 pools and the summaries), uint16_t (bf16 pools), Fp8E4M3 or Fp8E5M2.
  template <typename Elem>
  void Score(const float* q, int32_t group, const Elem* k, int64_t n, float scale, float add,
             float* scores, int64_t ld) const {
    if (avx512) return attention_avx512::ScoreKeys(q, group, d, k, n, scale, add, scores, ld);
    ScoreKeysPortable(q, group, d, k, n, scale, add, scores, ld);
  }
  template <typename Elem>
  void Add(const float* p, int64_t ld, const float* inv, int32_t group, const Elem* v, int64_t n,
           float* out) const {
    if (avx512) return attention_avx512::AddValues(p, ld, inv, group, d, v, n, out);
    AddValuesPortable(p, ld, inv, group, d, v, n, out);
  }

  // A stretch of the pool itself, whatever its dtype: keys scaled by `scale`, values weighted
  // by p * inv.
  void ScorePool(const float* q, int32_t group, const KvLayerView& kv, const char* k, int64_t n,
                 float scale, float* scores, int64_t ld) const {
    WithPoolElement(kv.dtype, [&](auto elem) {
      Score(q, group, reinterpret_cast<const decltype(elem)*>(k), n, scale, 0.0f, scores, ld);
    });
  }
  void AddPool(const float* p, int64_t ld, const float* inv, int32_t group, const KvLayerView& kv,
               const char* v, int64_t n, float* out) const {
    WithPoolElement(kv.dtype, [&](auto elem) {
      Add(p, ld, inv, group, reinterpret_cast<const decltype(elem)*>(v), n, out);
    });
  }

  bool avx512;
  int32_t d;
};

}  // namespace

void AttendGroup(const float* q, int32_t group, const KvLayerView& kv, int32_t kv_head,
                 const KvRun* runs, int32_t num_runs, int64_t seq_len, float scale, float* scores,
                 float* out) {
  AttendGroupFar(q, group, kv, kv_head, runs, num_runs, seq_len, FarAttention{},
                 AttentionScoring{scale}, scores, out);
}

void AttendGroup(const float* q, int32_t group, const KvLayerView& kv, int32_t kv_head,
                 const KvRun* runs, int32_t num_runs, int64_t seq_len,
                 const AttentionScoring& scoring, float* scores, float* out) {
  AttendGroupFar(q, group, kv, kv_head, runs, num_runs, seq_len, FarAttention{}, scoring, scores,
                 out);
}

void AttendGroupFar(const float* q, int32_t group, const KvLayerView& kv, int32_t kv_head,
                    const KvRun* runs, int32_t num_runs, int64_t seq_len, const FarAttention& far,
                    float scale, float* scores, float* out) {
  AttendGroupFar(q, group, kv, kv_head, runs, num_runs, seq_len, far, AttentionScoring{scale},
                 scores, out);
}

void AttendGroupFar(const float* q, int32_t group, const KvLayerView& kv, int32_t kv_head,
                    const KvRun* runs, int32_t num_runs, int64_t seq_len, const FarAttention& far,
                    const AttentionScoring& scoring, float* scores, float* out) {
  const StretchOps ops(kv.head_dim);
  const int32_t d = kv.head_dim;
  const int32_t bt = kv.block_tokens;
  const float scale = scoring.scale;
  DCHECK(group >= 1 && group <= kMaxAttentionGroup);
  DCHECK(far.dropped <= far.num_summaries);
  // (The engine refuses far history where a window is shorter than the served context.)
  DCHECK(scoring.window == 0 || scoring.window >= seq_len || !far.active());
  DCHECK(scoring.released_tokens == 0 ||
         (scoring.window > 0 && scoring.released_tokens <= seq_len - scoring.window));
  // Columns: the sink tokens, the summaries, the recent tokens. The recent tokens start after
  // the summarized blocks; in the run table, after the sinks and the blocks still listed there
  // although summarized (num_summaries - dropped, the step that summarizes them). Without far
  // history there are no sinks or summaries: the recent tokens are the whole history, or in a
  // sliding-window layer its last `window` positions (only whole blocks behind them may have
  // left the run table: released_tokens).
  const bool sliding = scoring.window > 0 && scoring.window < seq_len;
  const int64_t sink_tokens =
      sliding ? 0 : std::min<int64_t>(int64_t{far.sink_blocks} * bt, seq_len);
  const int64_t recent_first = int64_t{far.sink_blocks + far.num_summaries} * bt;
  const int64_t recent_tokens = sliding       ? scoring.window
                                : far.active() ? seq_len - recent_first
                                               : seq_len - sink_tokens;
  DCHECK(recent_tokens > 0 || !far.active());
  // Where the recent tokens start in the run table, in kept tokens.
  const int64_t recent_kept =
      sliding ? seq_len - scoring.window - scoring.released_tokens
              : int64_t{far.active() ? far.sink_blocks + far.num_summaries - far.dropped
                                     : far.sink_blocks} *
                    bt;
  const int64_t ns = far.active() ? far.num_summaries : 0;
  const int64_t cols = sink_tokens + ns + recent_tokens;
  // Pass 1: scores[g][c]; K rows and summary keys read once. A pool's FP8 keys are its f16
  // views: their unit goes into the scale (1 for f32 and bf16 pools: the same bits).
  int64_t c = 0;
  const float key_scale = scale * kv.KeyUnit();
  auto score_keys = [&](int64_t first, int64_t n) {
    ops.ScorePool(q, group, kv, kv.KeyBytes(kv_head, first), n, key_scale, scores + c, cols);
    c += n;
  };
  ForEachStretch(runs, num_runs, bt, 0, sink_tokens, score_keys);
  const int64_t summaries_first = c;
  const bool capped = scoring.softcap > 0;
  if (ns > 0) {
    ops.Score(q, group, far.k_summary, ns, scale, capped ? 0.0f : far.log_weight, scores + c, cols);
  }
  c += ns;
  ForEachStretch(runs, num_runs, bt, recent_kept, recent_tokens, score_keys);
  DCHECK(c == cols);
  if (capped) {
    Softcap(scores, group, cols, cols, scoring.softcap);
    for (int32_t g = 0; g < group; ++g) {
      for (int64_t j = 0; j < ns; ++j) scores[g * cols + summaries_first + j] += far.log_weight;
    }
  }
  float inv[kMaxAttentionGroup];
  ExpScores(scores, group, cols, scoring.sinks, inv);
  // Pass 2: weighted sum of values and summary values; the pool's value unit goes into the
  // weights of its own rows (not the summaries', which are plain f32).
  float pool_inv[kMaxAttentionGroup];
  const float value_unit = kv.ValueUnit();
  for (int32_t g = 0; g < group; ++g) pool_inv[g] = inv[g] * value_unit;
  std::fill(out, out + static_cast<int64_t>(group) * d, 0.0f);
  c = 0;
  auto add_stretch = [&](int64_t first, int64_t n) {
    ops.AddPool(scores + c, cols, pool_inv, group, kv, kv.ValueBytes(kv_head, first), n, out);
    c += n;
  };
  ForEachStretch(runs, num_runs, bt, 0, sink_tokens, add_stretch);
  if (ns > 0) ops.Add(scores + c, cols, inv, group, far.v_summary, ns, out);
  c += ns;
  ForEachStretch(runs, num_runs, bt, recent_kept, recent_tokens, add_stretch);
}

namespace {

template <typename Elem>
__attribute__((always_inline)) inline void SummarizeImpl(const Elem* k, const Elem* v,
                                                         int32_t block_tokens, int32_t d,
                                                         float k_unit, float v_unit, float* k_out,
                                                         float* v_out) {
  std::fill(k_out, k_out + d, 0.0f);
  std::fill(v_out, v_out + d, 0.0f);
  // Token by token, a fixed order: decode and a recompute's prefill get the same bits.
  for (int32_t t = 0; t < block_tokens; ++t) {
    for (int32_t i = 0; i < d; ++i) {
      k_out[i] += Widen(k[t * d + i]);
      v_out[i] += Widen(v[t * d + i]);
    }
  }
  const float inv = 1.0f / static_cast<float>(block_tokens);
  const float k_inv = inv * k_unit, v_inv = inv * v_unit;  // (inv itself but for FP8 pools)
  for (int32_t i = 0; i < d; ++i) {
    k_out[i] *= k_inv;
    v_out[i] *= v_inv;
  }
}

}  // namespace

KVRM_CPU_CLONES
void SummarizeBlock(const KvLayerView& kv, int32_t kv_head, int64_t first_token, float* k_out,
                    float* v_out) {
  const char* k = kv.KeyBytes(kv_head, first_token);
  const char* v = kv.ValueBytes(kv_head, first_token);
  const float ku = kv.KeyUnit(), vu = kv.ValueUnit();
  // (A switch rather than WithPoolElement: a lambda would not be compiled per instruction set.)
  switch (kv.dtype) {
    case DType::kBF16:
      return SummarizeImpl(reinterpret_cast<const uint16_t*>(k),
                           reinterpret_cast<const uint16_t*>(v), kv.block_tokens, kv.head_dim, ku,
                           vu, k_out, v_out);
    case DType::kF8E4M3:
      return SummarizeImpl(reinterpret_cast<const Fp8E4M3*>(k), reinterpret_cast<const Fp8E4M3*>(v),
                           kv.block_tokens, kv.head_dim, ku, vu, k_out, v_out);
    case DType::kF8E5M2:
      return SummarizeImpl(reinterpret_cast<const Fp8E5M2*>(k), reinterpret_cast<const Fp8E5M2*>(v),
                           kv.block_tokens, kv.head_dim, ku, vu, k_out, v_out);
    default:
      return SummarizeImpl(reinterpret_cast<const float*>(k), reinterpret_cast<const float*>(v),
                           kv.block_tokens, kv.head_dim, ku, vu, k_out, v_out);
  }
}

namespace {

// One row x / scale as FP8 codes (the encoders are branch-free: this loop vectorises).
KVRM_CPU_CLONES
void StoreRowE4M3(const float* x, float scale, int32_t n, uint8_t* out) {
  for (int32_t i = 0; i < n; ++i) out[i] = FloatToF8E4M3(x[i] / scale);
}
KVRM_CPU_CLONES
void StoreRowE5M2(const float* x, float scale, int32_t n, uint8_t* out) {
  for (int32_t i = 0; i < n; ++i) out[i] = FloatToF8E5M2(x[i] / scale);
}

}  // namespace

void StoreKv(const KvLayerView& kv, int64_t head, int64_t physical_token, const float* key,
             const float* value) {
  const int32_t d = kv.head_dim;
  if (IsFp8(kv.dtype)) {
    uint8_t* k = reinterpret_cast<uint8_t*>(kv.KeyBytes(head, physical_token));
    uint8_t* v = reinterpret_cast<uint8_t*>(kv.ValueBytes(head, physical_token));
    const auto store = kv.dtype == DType::kF8E4M3 ? StoreRowE4M3 : StoreRowE5M2;
    store(key, kv.k_scale, d, k);
    store(value, kv.v_scale, d, v);
    return;
  }
  if (kv.dtype == DType::kBF16) {
    uint16_t* k = reinterpret_cast<uint16_t*>(kv.KeyBytes(head, physical_token));
    uint16_t* v = reinterpret_cast<uint16_t*>(kv.ValueBytes(head, physical_token));
    for (int32_t i = 0; i < d; ++i) {
      k[i] = FloatToBf16(key[i]);
      v[i] = FloatToBf16(value[i]);
    }
    return;
  }
  std::memcpy(kv.KeyBytes(head, physical_token), key, d * sizeof(float));
  std::memcpy(kv.ValueBytes(head, physical_token), value, d * sizeof(float));
}

}  // namespace kvrm
