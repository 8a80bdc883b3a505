// The processor's multiply-add peak for the CPU roofline: a register-only loop of independent
// vector multiply-adds (no loads), timed per thread. Compiled with AVX-512 and BF16 flags; call
// a kind only where ActiveCpuIsa says the processor runs it.
#ifndef KVRM_BENCH_COMPUTE_PEAK_H_
#define KVRM_BENCH_COMPUTE_PEAK_H_

#include <cstdint>

namespace kvrm {

enum class PeakKind { kFmaF32, kDpBf16 };  // vfmadd231ps zmm (AVX-512), vdpbf16ps zmm

// FLOP/s of one thread running `iterations` rounds of 12 independent accumulators
// (2 FLOP per f32 lane for an FMA, 4 per lane for vdpbf16ps).
double PeakFlopsOneThread(PeakKind kind, int64_t iterations);

}  // namespace kvrm

#endif  // KVRM_BENCH_COMPUTE_PEAK_H_
