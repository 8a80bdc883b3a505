// The two inner loops of attention (kernels/cpu/attention.cc) for AVX-512 and head_dim a multiple
// of 16 up to 128, compiled with their own -m flags and called only where the processor has
// AVX-512 (ActiveCpuIsa).
//
// Scores: 16 keys at a time, each dot product's 16 lanes kept in its own register, then one
// transpose-and-add tree turns the 16 registers into the 16 scores: no horizontal sum per key.
// Every key's lanes are added in the same tree order whatever its place among the 16, so a
// score does not depend on how a history is cut into runs.
// Values: the output rows of a few query heads stay in registers across the stretch.
// K and V in f32, bf16 (--kv_dtype=bf16: widened exactly in registers) or FP8 (--kv_dtype=fp8:
// each byte moved into an f16's bits and widened with vcvtph2ps; the caller scales by the
// format's unit, see KvLayerView::KeyUnit).
#include <immintrin.h>

// GCC 12 warns inside its own unpack/shuffle intrinsics (the placeholder vector they pass to the
// masked builtin): a false positive, not about this file's variables.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <algorithm>
#include <cstdint>
#include <type_traits>

// (For the FP8 element types only: this file is compiled for AVX-512, so it must not emit
// copies of the header's inline functions that other files' calls could link to.)
#include "common/dtype.h"

namespace kvrm {
namespace attention_avx512 {
namespace {

// out lane t = sum of the 16 lanes of v[t].
inline __m512 SumEach(const __m512* v) {
  __m512 pairs[8];  // per 128-bit chunk: partials of v[2i] and v[2i+1], interleaved
  for (int i = 0; i < 8; ++i) {
    pairs[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                             _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  }
  __m512 quads[4];  // per 128-bit chunk: the partials of v[4i .. 4i+3], in order
  for (int i = 0; i < 4; ++i) {
    quads[i] = _mm512_add_ps(_mm512_shuffle_ps(pairs[2 * i], pairs[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(pairs[2 * i], pairs[2 * i + 1], 0xEE));
  }
  const __m512 a = _mm512_add_ps(_mm512_shuffle_f32x4(quads[0], quads[1], 0x44),
                                 _mm512_shuffle_f32x4(quads[0], quads[1], 0xEE));
  const __m512 b = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2], quads[3], 0x44),
                                 _mm512_shuffle_f32x4(quads[2], quads[3], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xDD));
}

// 16 KV elements as f32: f32 as is, bf16 widened exactly (a 16-bit shift).
inline __m512 Load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 Load16(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
// E4M3 s.eeee.mmm as the f16 s.0eeee.mmm0000000 (Fp8AsHalf): the byte in the high half, shifted
// right one with its sign copied, the copy cleared.
inline __m512 Load16(const Fp8E4M3* p) {
  const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m256i h = _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(w, 8), 1),
                                     _mm256_set1_epi16(static_cast<int16_t>(0xbfff)));
  return _mm512_cvtph_ps(h);
}
// E5M2 is the high byte of an f16.
inline __m512 Load16(const Fp8E5M2* p) {
  const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm512_cvtph_ps(_mm256_slli_epi16(w, 8));
}

// The scores of `group` query heads against m <= 16 keys of kb.
template <int NV, typename Elem>
inline void ScoreBlock(const float* q, int32_t group, const Elem* kb, int m, __m512 vscale,
                       __m512 vadd, float* scores, int64_t ld) {
  constexpr int kDim = NV * 16;
  for (int32_t g = 0; g < group; ++g) {
    __m512 qv[NV];
    for (int v = 0; v < NV; ++v) qv[v] = _mm512_loadu_ps(q + g * kDim + v * 16);
    __m512 acc[16];
    for (int t = 0; t < 16; ++t) {
      if (t < m) {
        acc[t] = _mm512_mul_ps(Load16(kb + t * kDim), qv[0]);
        for (int v = 1; v < NV; ++v) {
          acc[t] = _mm512_fmadd_ps(Load16(kb + t * kDim + v * 16), qv[v], acc[t]);
        }
      } else {
        acc[t] = _mm512_setzero_ps();
      }
    }
    const __m512 s = _mm512_add_ps(_mm512_mul_ps(SumEach(acc), vscale), vadd);
    _mm512_mask_storeu_ps(scores + g * ld, static_cast<__mmask16>((1u << m) - 1), s);
  }
}

template <int NV, typename Elem>
void ScoreKeysT(const float* q, int32_t group, const Elem* k, int64_t n, float scale, float add,
                float* scores, int64_t ld) {
  constexpr int kDim = NV * 16;
  constexpr bool kWiden = !std::is_same_v<Elem, float>;
  const __m512 vscale = _mm512_set1_ps(scale), vadd = _mm512_set1_ps(add);
  // Narrow keys (bf16, FP8) that several query heads read are widened once per 16 into f32 here
  // (the same values, so the same sums), not once per head.
  alignas(64) float widened[kWiden ? 16 * kDim : 1];
  for (int64_t j0 = 0; j0 < n; j0 += 16) {
    const int m = static_cast<int>(std::min<int64_t>(16, n - j0));
    const Elem* kb = k + j0 * kDim;
    if (!kWiden || group == 1) {
      ScoreBlock<NV>(q, group, kb, m, vscale, vadd, scores + j0, ld);
      continue;
    }
    for (int t = 0; t < m; ++t) {
      for (int v = 0; v < NV; ++v) {
        _mm512_store_ps(widened + t * kDim + v * 16, Load16(kb + t * kDim + v * 16));
      }
    }
    ScoreBlock<NV>(q, group, static_cast<const float*>(widened), m, vscale, vadd, scores + j0, ld);
  }
}

template <int NV, typename Elem>
void AddValuesT(const float* p, int64_t ld, const float* inv, int32_t group, const Elem* v,
                int64_t n, float* out) {
  constexpr int kDim = NV * 16;
  constexpr int kHeads = std::max(1, 16 / NV);  // accumulators: kHeads * NV <= 16 registers
  for (int32_t g0 = 0; g0 < group; g0 += kHeads) {
    const int gc = std::min<int32_t>(kHeads, group - g0);
    __m512 acc[kHeads][NV];
    for (int g = 0; g < kHeads; ++g) {
      for (int c = 0; c < NV; ++c) {
        acc[g][c] = g < gc ? _mm512_loadu_ps(out + (g0 + g) * kDim + c * 16) : _mm512_setzero_ps();
      }
    }
    for (int64_t j = 0; j < n; ++j) {
      __m512 vv[NV];
      for (int c = 0; c < NV; ++c) vv[c] = Load16(v + j * kDim + c * 16);
      for (int g = 0; g < kHeads; ++g) {
        if (g >= gc) break;
        const __m512 pj = _mm512_set1_ps(p[(g0 + g) * ld + j] * inv[g0 + g]);
        for (int c = 0; c < NV; ++c) acc[g][c] = _mm512_fmadd_ps(pj, vv[c], acc[g][c]);
      }
    }
    for (int g = 0; g < gc; ++g) {
      for (int c = 0; c < NV; ++c) _mm512_storeu_ps(out + (g0 + g) * kDim + c * 16, acc[g][c]);
    }
  }
}

}  // namespace

bool Handles(int32_t head_dim) { return head_dim % 16 == 0 && head_dim >= 16 && head_dim <= 128; }

namespace {

template <typename Elem>
void ScoreKeysFor(const float* q, int32_t group, int32_t head_dim, const Elem* k, int64_t n,
                  float scale, float add, float* scores, int64_t ld) {
  switch (head_dim / 16) {
#define KVRM_SCORE_CASE(NV) \
  case NV: return ScoreKeysT<NV, Elem>(q, group, k, n, scale, add, scores, ld);
    KVRM_SCORE_CASE(1) KVRM_SCORE_CASE(2) KVRM_SCORE_CASE(3) KVRM_SCORE_CASE(4)
    KVRM_SCORE_CASE(5) KVRM_SCORE_CASE(6) KVRM_SCORE_CASE(7) KVRM_SCORE_CASE(8)
#undef KVRM_SCORE_CASE
  }
}

template <typename Elem>
void AddValuesFor(const float* p, int64_t ld, const float* inv, int32_t group, int32_t head_dim,
                  const Elem* v, int64_t n, float* out) {
  switch (head_dim / 16) {
#define KVRM_ADD_CASE(NV) \
  case NV: return AddValuesT<NV, Elem>(p, ld, inv, group, v, n, out);
    KVRM_ADD_CASE(1) KVRM_ADD_CASE(2) KVRM_ADD_CASE(3) KVRM_ADD_CASE(4)
    KVRM_ADD_CASE(5) KVRM_ADD_CASE(6) KVRM_ADD_CASE(7) KVRM_ADD_CASE(8)
#undef KVRM_ADD_CASE
  }
}

}  // namespace

#define KVRM_ATTENTION_ENTRY_POINTS(Elem)                                                       \
  void ScoreKeys(const float* q, int32_t group, int32_t head_dim, const Elem* k, int64_t n,     \
                 float scale, float add, float* scores, int64_t ld) {                           \
    ScoreKeysFor(q, group, head_dim, k, n, scale, add, scores, ld);                             \
  }                                                                                             \
  void AddValues(const float* p, int64_t ld, const float* inv, int32_t group, int32_t head_dim, \
                 const Elem* v, int64_t n, float* out) {                                        \
    AddValuesFor(p, ld, inv, group, head_dim, v, n, out);                                       \
  }
KVRM_ATTENTION_ENTRY_POINTS(float)
KVRM_ATTENTION_ENTRY_POINTS(uint16_t)
KVRM_ATTENTION_ENTRY_POINTS(Fp8E4M3)
KVRM_ATTENTION_ENTRY_POINTS(Fp8E5M2)
#undef KVRM_ATTENTION_ENTRY_POINTS

}  // namespace attention_avx512
}  // namespace kvrm
