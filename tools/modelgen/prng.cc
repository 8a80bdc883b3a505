#include "tools/modelgen/prng.h"

#include <cmath>
#include <cstring>

namespace kvrm::modelgen {
namespace {

inline uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

}  // namespace

uint64_t DeriveSeed(uint64_t seed, std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  uint64_t state = seed ^ Rotl(h, 17);
  SplitMix64(state);
  return SplitMix64(state) ^ h;
}


double PortableLog(double x) {
  // x = m * 2^e with m in [sqrt(1/2), sqrt(2)), read straight from the IEEE bits (x is a
  // normal positive double here: Normal() only passes values in (0, 1]).
  uint64_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  int e = static_cast<int>((bits >> 52) & 0x7ff) - 1023;
  bits = (bits & 0x000fffffffffffffull) | 0x3ff0000000000000ull;  // m in [1, 2)
  double m;
  std::memcpy(&m, &bits, sizeof(m));
  if (m > 1.4142135623730951) {
    m *= 0.5;
    ++e;
  }
  // log(m) = 2 atanh(s), s = (m-1)/(m+1), |s| <= 0.1716: 12 odd terms reach 1e-18.
  const double s = (m - 1.0) / (m + 1.0);
  const double s2 = s * s;
  double poly = 1.0 / 25.0;
  for (int k = 11; k >= 0; --k) poly = poly * s2 + 1.0 / (2 * k + 1);
  constexpr double kLn2Hi = 6.93147180369123816490e-01;  // fdlibm's split of ln 2
  constexpr double kLn2Lo = 1.90821492927058770002e-10;
  return e * kLn2Hi + (2.0 * s * poly + e * kLn2Lo);
}

double Rng::Normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  double u, v, r2;
  do {
    u = 2.0 * Uniform() - 1.0;
    v = 2.0 * Uniform() - 1.0;
    r2 = u * u + v * v;
  } while (r2 >= 1.0 || r2 < 1e-300);
  const double f = std::sqrt(-2.0 * PortableLog(r2) / r2);  // sqrt is correctly rounded
  spare_ = v * f;
  has_spare_ = true;
  return u * f;
}

}  // namespace kvrm::modelgen
