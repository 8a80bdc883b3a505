// The Sampler's passes over the vocabulary, written as plain loops that vectorise (compiled for
// AVX-512, AVX2 and the baseline; the loader picks one, see kernels/cpu/isa.h). Each is a fixed
// sequence of f32 operations (compiled without FMA contraction, so every clone gives the same
// bits), and the sums run in a fixed lane order: a request's draws are the same on any x86-64.
#ifndef KVRM_RUNTIME_SAMPLER_KERNELS_H_
#define KVRM_RUNTIME_SAMPLER_KERNELS_H_

#include <cstdint>

namespace kvrm::sampler_kernels {

// NaN -> -inf in place; returns the largest entry (-inf for an empty or all -inf/NaN row).
float SanitizeAndMax(float* x, int32_t n);

// x[i] = (x[i] - shift) / divisor and p[i] = exp(x[i]) (0 where x[i] < -87, where exp
// underflows f32 normals, and for -inf); returns the sum of p in double.
double ShiftScaleExp(float* x, float shift, float divisor, float* p, int32_t n);

// The first i with x[i] == v; n when there is none.
int32_t FirstIndexOf(const float* x, int32_t n, float v);

// Sum of p[i] over p[i] >= threshold and p[i] > 0, in double.
double SumAtLeast(const float* p, int32_t n, float threshold);

// The first i at which the running sum of the kept p (p[i] >= threshold, p[i] > 0) exceeds
// `target`, and the last kept i when rounding never gets there; -1 when nothing is kept.
int32_t DrawAtLeast(const float* p, int32_t n, float threshold, double target);

}  // namespace kvrm::sampler_kernels

#endif  // KVRM_RUNTIME_SAMPLER_KERNELS_H_
