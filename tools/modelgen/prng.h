// Deterministic pseudo-random numbers for make_model: the same seed gives the same bits on every
// machine and compiler, so generated models are byte-identical everywhere.
//
// Why not <random>: std::*_distribution algorithms are implementation-defined (libstdc++ and
// libc++ differ), and libm's log/sin are not guaranteed to round identically across versions.
// Everything here is integer arithmetic plus IEEE double +, -, *, / and sqrt, which are
// correctly rounded; prng.cc is compiled with -ffp-contract=off so no FMA changes the rounding.
#ifndef KVRM_TOOLS_MODELGEN_PRNG_H_
#define KVRM_TOOLS_MODELGEN_PRNG_H_

#include <cstdint>
#include <string_view>

#include "common/xoshiro.h"

namespace kvrm::modelgen {

using ::kvrm::SplitMix64;

// A stream seed derived from (seed, name): FNV-1a over the name, mixed with the seed. Tensors
// are seeded by name so they can be generated in any order, on any number of threads.
uint64_t DeriveSeed(uint64_t seed, std::string_view name);

// xoshiro256** (common/xoshiro.h) with the distributions make_model needs.
class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}

  uint64_t Next() { return gen_.Next(); }
  // Uniform in [0, 1) with 53 random bits.
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  // Uniform integer in [0, n), n > 0 (multiply-shift; the bias is below 2^-32 for our n).
  uint32_t Below(uint32_t n) {
    return static_cast<uint32_t>(((Next() >> 32) * static_cast<uint64_t>(n)) >> 32);
  }
  // True with probability p.
  bool Chance(double p) { return Uniform() < p; }
  // Standard normal (Marsaglia's polar form of Box-Muller, in double).
  double Normal();

 private:
  Xoshiro256 gen_;
  bool has_spare_ = false;
  double spare_ = 0.0;
};

// Natural logarithm of x > 0 from +, *, / only (frexp-free bit manipulation plus an atanh
// series); accurate to a few ulp and bit-reproducible. Exposed for its test.
double PortableLog(double x);

}  // namespace kvrm::modelgen

#endif  // KVRM_TOOLS_MODELGEN_PRNG_H_
