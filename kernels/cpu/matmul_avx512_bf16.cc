// The matmul kernel for bf16 weights on processors with AVX512_BF16: vdpbf16ps multiplies 32
// bf16 pairs per instruction straight from the stored weights (no widening to f32) into f32
// accumulators. The activations are rounded to bf16 (round to nearest even) once per call, as a
// GPU's bf16 GEMM takes them; products and sums stay f32. Twice the multiply-adds per
// instruction of the f32 path and half the register traffic: batched decode and prefill, which
// are compute-bound on a CPU, run about twice as fast. f32 and f16 weights go to the AVX-512
// kernel.
//
// Two kernels:
// - Panels (WeightMatrix::panels, which the CPU backend packs at load time): for each group of
//   16 output rows, one 64-byte load per column pair holds the group's 16 x 2 weights;
//   vdpbf16ps multiplies it by a broadcast pair of each activation row's columns into that row's
//   16 output sums. Up to 12 activation rows per pass (a 16-slot step: 12 streaming the panel
//   from memory, 4 from L1); the sums land as whole vectors (no horizontal reductions) and the
//   matrix is read front to back, the next panel prefetched.
//   Measured against the row-major kernel (docs/benchmarks.md, "weight panels"): in cache,
//   2048 x 768 at 16 activation rows 696 against 530 GFLOP/s; a 16-slot decode step 8.7 -> 7.1
//   ms, one slot at the read roofline.
// - Row-major (a matrix without panels, or a row range that does not start a panel): as
//   matmul_impl.inc, kRowTile weight rows x up to kMaxActs activation rows of accumulators.
// In both, each (weight row, activation row) sum runs over the columns in the same order
// whatever the tile or pass, so a row's result does not depend on the batch it was computed in
// (the two kernels differ from each other in the last bits).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/q4_k.h"
#include "kernels/cpu/q8_0.h"
#include "kernels/cpu/weight_matrix.h"

namespace kvrm {

void MatMulRows_avx512(const float*, int64_t, int64_t, const WeightMatrix&, int64_t, int64_t,
                       float*, int64_t, float*);

namespace matmul_avx512_bf16 {
namespace {

constexpr int kRowTile = 4;
constexpr int kMaxActs = 4;
// Activation rows converted per block: a block stays in L2 while the weight tiles stream by.
constexpr int64_t kActBlockBytes = 128 * 1024;

int64_t Padded(int64_t k) { return (k + 31) / 32 * 32; }

// n rows of x rounded to bf16, zero-padded to Padded(k) columns.
void ToBf16(const float* x, int64_t n, int64_t ldx, int64_t k, uint16_t* out) {
  const int64_t kp = Padded(k);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t c = 0; c < kp; c += 16) {
      const int64_t m = std::clamp<int64_t>(k - c, 0, 16);
      const __mmask16 mask = static_cast<__mmask16>((1u << m) - 1);
      const __m512 v = _mm512_maskz_loadu_ps(mask, x + i * ldx + c);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i * kp + c),
                          reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
    }
  }
}

inline __m512bh Load(const uint16_t* p) {
  return reinterpret_cast<__m512bh>(_mm512_loadu_si512(p));
}

// y[i * ldy + j] = row_j . xb_i for j < nr, i < N; xb rows are kp apart. `ahead` as in
// matmul_impl.inc's Tile: bytes past each row to prefetch (the next tile), 0 for none.
template <int N>
inline void Tile(const uint16_t* const* rows, int nr, const uint16_t* xb, int64_t kp, int64_t k,
                 float* y, int64_t ldy, int64_t ahead) {
  __m512 acc[kRowTile][N];
  for (int j = 0; j < kRowTile; ++j) {
    for (int i = 0; i < N; ++i) acc[j][i] = _mm512_setzero_ps();
  }
  const int64_t full = k / 32 * 32;
  for (int64_t c = 0; c < full; c += 32) {
    if (ahead != 0) {
      for (int j = 0; j < kRowTile; ++j) {
        __builtin_prefetch(reinterpret_cast<const char*>(rows[j] + c) + ahead, 0, 0);
      }
    }
    __m512bh w[kRowTile];
    for (int j = 0; j < kRowTile; ++j) w[j] = Load(rows[j] + c);
    for (int i = 0; i < N; ++i) {
      const __m512bh xv = Load(xb + i * kp + c);
      for (int j = 0; j < kRowTile; ++j) acc[j][i] = _mm512_dpbf16_ps(acc[j][i], w[j], xv);
    }
  }
  if (full < k) {  // the weights' last partial 32 columns; xb is zero there already
    const __mmask32 mask = static_cast<__mmask32>((uint64_t{1} << (k - full)) - 1);
    __m512bh w[kRowTile];
    for (int j = 0; j < kRowTile; ++j) {
      w[j] = reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi16(mask, rows[j] + full));
    }
    for (int i = 0; i < N; ++i) {
      const __m512bh xv = Load(xb + i * kp + full);
      for (int j = 0; j < kRowTile; ++j) acc[j][i] = _mm512_dpbf16_ps(acc[j][i], w[j], xv);
    }
  }
  for (int i = 0; i < N; ++i) {
    for (int j = 0; j < nr; ++j) y[i * ldy + j] = _mm512_reduce_add_ps(acc[j][i]);
  }
}

// All n converted activation rows against one weight tile, kMaxActs at a time.
inline void TileAllActs(const uint16_t* const* rows, int nr, const uint16_t* xb, int64_t n,
                        int64_t kp, int64_t k, float* y, int64_t ldy, int64_t ahead) {
  // The pass that streams a weight tile from memory takes three activation rows, the passes
  // that re-read it from L1 four. Measured, not derived: streaming with a full 4 x 4 tile ran
  // ~10 % slower per step (4 slots: 5.5 ms against 4.9 with 3 + 1; 8 slots 5.9 against 5.4).
  // Each (weight row, activation row) sum is the same whatever tile computes it.
  int64_t i = 0;
  if (n >= kMaxActs) {
    Tile<3>(rows, nr, xb, kp, k, y, ldy, ahead);
    i = 3;
  }
  for (; i + kMaxActs <= n; i += kMaxActs) {
    Tile<kMaxActs>(rows, nr, xb + i * kp, kp, k, y + i * ldy, ldy, ahead);
  }
  switch (n - i) {
    case 0: break;
    case 1: Tile<1>(rows, nr, xb + i * kp, kp, k, y + i * ldy, ldy, ahead); break;
    case 2: Tile<2>(rows, nr, xb + i * kp, kp, k, y + i * ldy, ldy, ahead); break;
    case 3: Tile<3>(rows, nr, xb + i * kp, kp, k, y + i * ldy, ldy, ahead); break;
  }
  static_assert(kMaxActs == 4, "extend the remainder switch");
}

constexpr int64_t kGroup = WeightMatrix::kPanelRows;
// Activation rows per pass over a panel. Each output sums its even and its odd lines in two
// chains (added at the end), so one activation row is not held to one vdpbf16ps latency per
// line; 2 x 12 accumulators leave 8 of the 32 registers. The chains are the same whatever the
// pass, so a row's result does not depend on its batch.
constexpr int kPassRows = 12;

// out[i * ldy + l] = sum over column pairs q < pairs of panel line q . activation pair q of row
// i, for l < nr (the group's rows past the matrix's last are not stored). `xb` rows are `ldx`
// pairs apart; `ahead` elements past each line are prefetched (the next panel), 0 for none.
template <int R>
inline void PanelTile(const uint16_t* panel, int64_t pairs, const uint32_t* xb, int64_t ldx,
                      float* y, int64_t ldy, int nr, int64_t ahead) {
  constexpr int64_t kLine = 2 * kGroup;  // elements
  __m512 even[R], odd[R];
#pragma GCC unroll 16
  for (int i = 0; i < R; ++i) even[i] = odd[i] = _mm512_setzero_ps();
  // An activation pair (two bf16 in 32 bits) in every lane.
  auto pair = [](uint32_t bits) {
    return reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(bits)));
  };
  int64_t q = 0;
  for (; q + 2 <= pairs; q += 2) {
    const uint16_t* line = panel + q * kLine;
    if (ahead != 0) {
      __builtin_prefetch(line + ahead, 0, 0);
      __builtin_prefetch(line + kLine + ahead, 0, 0);
    }
    const __m512bh w0 = Load(line), w1 = Load(line + kLine);
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i) {
      even[i] = _mm512_dpbf16_ps(even[i], w0, pair(xb[i * ldx + q]));
      odd[i] = _mm512_dpbf16_ps(odd[i], w1, pair(xb[i * ldx + q + 1]));
    }
  }
  if (q < pairs) {
    const __m512bh w0 = Load(panel + q * kLine);
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i) {
      even[i] = _mm512_dpbf16_ps(even[i], w0, pair(xb[i * ldx + q]));
    }
  }
  const __mmask16 mask = static_cast<__mmask16>((1u << nr) - 1);
#pragma GCC unroll 16
  for (int i = 0; i < R; ++i) {
    _mm512_mask_storeu_ps(y + i * ldy, mask, _mm512_add_ps(even[i], odd[i]));
  }
}

#include "kernels/cpu/matmul_panels.inc"

// q8_0 panels: AVX512_VNNI's vpdpwssd (this path's processors have it; kernels/cpu/isa.cc).
inline __m512i Q8Dot(__m512i acc, __m512i w, __m512i x) {
  return _mm512_dpwssd_epi32(acc, w, x);
}
#include "kernels/cpu/matmul_q8_avx512.inc"

// q4_K panels: AVX512_VNNI's vpdpbusd.
inline __m512i Q4Dot(__m512i acc, __m512i w, __m512i x) { return _mm512_dpbusd_epi32(acc, w, x); }
#include "kernels/cpu/matmul_q4k_avx512.inc"

// Rows [row_begin, row_end) from the panels; row_begin starts a panel.
void PanelMatMul(const float* x, int64_t n, int64_t ldx, const WeightMatrix& w, int64_t row_begin,
                 int64_t row_end, float* y, int64_t ldy, uint16_t* xb) {
  const int64_t k = w.cols, kp = Padded(k);
  // Activation rows per block, converted to bf16 once: as many whole groups as fit in L2 beside
  // the panel (at least one), so a decode step is one block.
  const int64_t block = std::max<int64_t>(kGroup, kActBlockBytes / (kp * 2) / kGroup * kGroup);
  auto block_x = [&](int64_t i0, int64_t nb) {
    ToBf16(x + i0 * ldx, nb, ldx, k, xb);
    return reinterpret_cast<const uint32_t*>(xb);  // activation pairs, kp / 2 a row
  };
  PanelMatMulBlocks<uint16_t>(w, n, block, w.PanelStride() / (2 * kGroup), kp / 2, block_x,
                              row_begin, row_end, y, ldy);
}

}  // namespace

int64_t ScratchFloats(int64_t cols) {
  // Converted activations: one L2 block, at least one panel group's rows.
  return std::max<int64_t>(kActBlockBytes, kGroup * Padded(cols) * 2) / 4 + 16;
}

void MatMulRows(const float* x, int64_t n, int64_t ldx, const WeightMatrix& w, int64_t row_begin,
                int64_t row_end, float* y, int64_t ldy, float* scratch) {
  uint16_t* xb = reinterpret_cast<uint16_t*>(scratch);
  if (w.panels != nullptr && row_begin % kGroup == 0) {
    return PanelMatMul(x, n, ldx, w, row_begin, row_end, y, ldy, xb);
  }
  const int64_t k = w.cols, kp = Padded(k);
  // Decode (a few rows): one block, weights streamed from memory once with the next tile
  // prefetched. Prefill: blocks of activation rows that fit in L2, each weight tile (in L1 by
  // its second use) against the whole block.
  const int64_t block =
      n <= kMaxActs
          ? n
          : std::max<int64_t>(kMaxActs, kActBlockBytes / (kp * 2) / kMaxActs * kMaxActs);
  for (int64_t i0 = 0; i0 < n; i0 += block) {
    const int64_t nb = std::min(block, n - i0);
    ToBf16(x + i0 * ldx, nb, ldx, k, xb);
    for (int64_t r0 = row_begin; r0 < row_end; r0 += kRowTile) {
      const int nr = static_cast<int>(std::min<int64_t>(kRowTile, row_end - r0));
      const uint16_t* rows[kRowTile];
      for (int j = 0; j < kRowTile; ++j) {  // short tiles repeat their last row
        rows[j] = reinterpret_cast<const uint16_t*>(w.RowPtr(r0 + std::min(j, nr - 1)));
      }
      const int64_t ahead =
          r0 + kRowTile < row_end ? kRowTile * w.row_stride * int64_t{sizeof(uint16_t)} : 0;
      TileAllActs(rows, nr, xb, nb, kp, k, y + i0 * ldy + r0, ldy, ahead);
    }
  }
}

}  // namespace matmul_avx512_bf16

void MatMulRows_avx512_bf16(const float* x, int64_t n, int64_t ldx, const WeightMatrix& w,
                            int64_t row_begin, int64_t row_end, float* y, int64_t ldy,
                            float* scratch) {
  if (WeightMatrix::IsKQuant(w.panel_format)) {
    return matmul_avx512_bf16::KQuantPanelMatMul(x, n, ldx, w, row_begin, row_end, y, ldy, scratch);
  }
  if (WeightMatrix::IsQ8(w.panel_format)) {
    return matmul_avx512_bf16::Q8PanelMatMul(x, n, ldx, w, row_begin, row_end, y, ldy, scratch);
  }
  if (w.dtype != DType::kBF16) {
    return MatMulRows_avx512(x, n, ldx, w, row_begin, row_end, y, ldy, scratch);
  }
  matmul_avx512_bf16::MatMulRows(x, n, ldx, w, row_begin, row_end, y, ldy, scratch);
}

int64_t MatMulScratchFloats_avx512_bf16(int64_t cols) {
  return matmul_avx512_bf16::ScratchFloats(cols);
}

}  // namespace kvrm
