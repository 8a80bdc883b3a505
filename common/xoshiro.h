// xoshiro256** (Blackman & Vigna) seeded through SplitMix64: our own generator, so a seed gives
// the same stream on every machine, compiler and library version (unlike <random>'s
// distributions). Used by the sampler (per-request streams) and the model generator.
#ifndef KVRM_COMMON_XOSHIRO_H_
#define KVRM_COMMON_XOSHIRO_H_

#include <cstdint>

namespace kvrm {

// One SplitMix64 step: advances `state` and returns a well-mixed 64-bit value.
inline uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

class Xoshiro256 {
 public:
  explicit Xoshiro256(uint64_t seed = 0) { Seed(seed); }
  void Seed(uint64_t seed) {
    for (uint64_t& word : s_) word = SplitMix64(seed);
  }
  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }
  // Uniform in [0, 1) from the top 53 bits.
  double NextDouble() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace kvrm

#endif  // KVRM_COMMON_XOSHIRO_H_
