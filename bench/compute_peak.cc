#include "bench/compute_peak.h"

#include <immintrin.h>

#include <chrono>

namespace kvrm {
namespace {

constexpr int kAccumulators = 12;  // > FMA latency x ports: the loop is throughput-bound

template <PeakKind kKind>
double Run(int64_t iterations) {
  __m512 acc[kAccumulators];
  for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm512_set1_ps(0.001f * i);
  const __m512 a = _mm512_set1_ps(1.0001f), b = _mm512_set1_ps(0.9999f);
  const __m512bh ab = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x3f803f80));
  const __m512bh bb = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x3f7f3f7f));
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kAccumulators; ++i) {
      acc[i] = kKind == PeakKind::kFmaF32 ? _mm512_fmadd_ps(a, b, acc[i])
                                          : _mm512_dpbf16_ps(acc[i], ab, bb);
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Keep the sums alive.
  __m512 sum = acc[0];
  for (int i = 1; i < kAccumulators; ++i) sum = _mm512_add_ps(sum, acc[i]);
  volatile float sink = _mm512_reduce_add_ps(sum);
  (void)sink;
  const double flops_per_op = kKind == PeakKind::kFmaF32 ? 2.0 * 16 : 4.0 * 16;
  return static_cast<double>(iterations) * kAccumulators * flops_per_op / seconds;
}

}  // namespace

double PeakFlopsOneThread(PeakKind kind, int64_t iterations) {
  return kind == PeakKind::kFmaF32 ? Run<PeakKind::kFmaF32>(iterations)
                                   : Run<PeakKind::kDpBf16>(iterations);
}

}  // namespace kvrm
