// Branch-free exp for the CPU kernels: loops calling it vectorise (std::exp does not: one libm
// call per element), and it is a fixed sequence of f32 operations, so callers compiled alike get
// the same bits for the same input. Not across instruction sets: the loops that call it are
// built in baseline, AVX2 and AVX-512 variants picked at load time (target_clones, whatever
// --cpu_isa says, which picks the matmul and AVX-512 attention paths), and the FMA variants
// may contract its multiply-adds, so the last bits of a softmax can differ between machines.
#ifndef KVRM_KERNELS_CPU_FAST_MATH_H_
#define KVRM_KERNELS_CPU_FAST_MATH_H_

#include <algorithm>
#include <bit>
#include <cstdint>

namespace kvrm {

// exp(x) with ~1 ulp error for x in [-87, 88]; clamped outside (exp(-87) ~ 1.6e-38 is as good as 0
// for a softmax or a sigmoid; exp(88) ~ 1.7e38 is within f32). 2^n * p(r), r = x - n ln2 in
// [-ln2/2, ln2/2], p the degree-6 Taylor polynomial (truncation < 1.3e-7 relative).
inline float FastExp(float x) {
  x = std::clamp(x, -87.0f, 88.0f);
  const float kShift = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float t = x * 1.44269504088896341f + kShift;
  const float n = t - kShift;
  const float r = (x - n * 0.693145751953125f) - n * 1.42860682030941723e-6f;
  float p = 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t e = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(kShift);
  return p * std::bit_cast<float>((e + 127) << 23);
}

}  // namespace kvrm

#endif  // KVRM_KERNELS_CPU_FAST_MATH_H_
