#include "runtime/sampler_kernels.h"

#include <cstring>
#include <limits>

#include "kernels/cpu/fast_math.h"
#include "kernels/cpu/isa.h"

namespace kvrm::sampler_kernels {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Block of DrawAtLeast's first pass: block sums vectorise; only the block holding the target is
// walked element by element.
constexpr int32_t kBlock = 256;

// Reductions use GCC vector types: without -ffast-math the vectoriser may not reorder a scalar
// sum or max, and these fix the order instead (16 lanes, combined in lane order at the end), so
// the result is the same on every instruction-set clone.
constexpr int32_t kLanes = 16;
typedef float VF __attribute__((vector_size(64)));
typedef double VD __attribute__((vector_size(64)));

inline VF Load(const float* p) {
  VF v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void Store(float* p, VF v) { std::memcpy(p, &v, sizeof(v)); }
inline VF Splat(float x) {
  VF v;
  for (int32_t j = 0; j < kLanes; ++j) v[j] = x;
  return v;
}
// Adds the 16 floats of `v` into the 16 doubles of lo:hi.
inline void Accumulate(VF v, VD& lo, VD& hi) {
  lo += __builtin_convertvector(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7), VD);
  hi += __builtin_convertvector(__builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15), VD);
}
inline double Total(VD lo, VD hi) {
  double t = 0;
  for (int32_t j = 0; j < kLanes / 2; ++j) t += lo[j];
  for (int32_t j = 0; j < kLanes / 2; ++j) t += hi[j];
  return t;
}

}  // namespace

KVRM_CPU_CLONES float SanitizeAndMax(float* x, int32_t n) {
  const VF neg_inf = Splat(kNegInf);
  VF m = neg_inf;
  int32_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    VF v = Load(x + i);
    v = v != v ? neg_inf : v;
    Store(x + i, v);
    m = v > m ? v : m;
  }
  float best = kNegInf;
  for (int32_t j = 0; j < kLanes; ++j) best = m[j] > best ? m[j] : best;
  for (; i < n; ++i) {
    const float v = x[i] != x[i] ? kNegInf : x[i];
    x[i] = v;
    best = v > best ? v : best;
  }
  return best;
}

KVRM_CPU_CLONES double ShiftScaleExp(float* x, float shift, float divisor, float* p, int32_t n) {
  // The map vectorises as it stands (FastExp is branch-free); the sum follows in lane order. A
  // division, not a product with 1 / divisor: for a tiny temperature that reciprocal is inf and
  // the max entry would become 0 * inf = NaN.
  for (int32_t i = 0; i < n; ++i) {
    const float v = (x[i] - shift) / divisor;
    x[i] = v;
    p[i] = v < -87.0f ? 0.0f : FastExp(v);
  }
  VD lo = {}, hi = {};
  int32_t i = 0;
  for (; i + kLanes <= n; i += kLanes) Accumulate(Load(p + i), lo, hi);
  double total = Total(lo, hi);
  for (; i < n; ++i) total += p[i];
  return total;
}

KVRM_CPU_CLONES int32_t FirstIndexOf(const float* x, int32_t n, float v) {
  const VF target = Splat(v);
  int32_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const auto hit = Load(x + i) == target;
    bool any = false;
    for (int32_t j = 0; j < kLanes; ++j) any |= hit[j] != 0;
    if (any) break;
  }
  for (; i < n; ++i) {
    if (x[i] == v) return i;
  }
  return n;
}

KVRM_CPU_CLONES double SumAtLeast(const float* p, int32_t n, float threshold) {
  const VF t = Splat(threshold), zero = Splat(0.0f);
  VD lo = {}, hi = {};
  int32_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const VF v = Load(p + i);
    Accumulate(v >= t && v > zero ? v : zero, lo, hi);
  }
  double total = Total(lo, hi);
  for (; i < n; ++i) total += p[i] >= threshold && p[i] > 0.0f ? p[i] : 0.0f;
  return total;
}

int32_t DrawAtLeast(const float* p, int32_t n, float threshold, double target) {
  // Block sums first, then one block walked in order. The walk's running sum starts from the
  // blocks' sums, so it may differ from one running sum in the last bits: the same draw up to
  // rounding.
  double cum = 0;
  int32_t last = -1;
  for (int32_t b = 0; b < n; b += kBlock) {
    const int32_t len = n - b < kBlock ? n - b : kBlock;
    const double s = SumAtLeast(p + b, len, threshold);
    if (cum + s <= target) {
      if (s > 0) {
        for (int32_t i = b + len - 1; i >= b; --i) {
          if (p[i] >= threshold && p[i] > 0.0f) {
            last = i;
            break;
          }
        }
      }
      cum += s;
      continue;
    }
    for (int32_t i = b; i < b + len; ++i) {
      if (p[i] >= threshold && p[i] > 0.0f) {
        cum += p[i];
        last = i;
        if (cum > target) return i;
      }
    }
  }
  return last;
}

}  // namespace kvrm::sampler_kernels
