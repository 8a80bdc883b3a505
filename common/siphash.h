// SipHash-2-4 (Aumasson and Bernstein) with a 128-bit tag: a keyed pseudorandom function, so
// that whoever does not hold the key cannot make two inputs collide (what a plain hash of
// attacker-chosen text would allow). The prefix cache keys each KV block by a chain of these
// over the tokens before it (runtime/prefix_index.h).
#ifndef KVRM_COMMON_SIPHASH_H_
#define KVRM_COMMON_SIPHASH_H_

#include <cstddef>
#include <cstdint>

namespace kvrm {

struct Hash128 {
  uint64_t lo = 0, hi = 0;
  bool operator==(const Hash128& o) const { return lo == o.lo && hi == o.hi; }
  bool operator!=(const Hash128& o) const { return !(*this == o); }
};

struct SipKey {
  uint64_t k0 = 0, k1 = 0;  // the key's bytes 0-7 and 8-15, little-endian
};

// The 128-bit tag of `n` bytes, as the reference implementation writes it: `lo` holds its first
// eight bytes (little-endian), `hi` the last eight.
Hash128 SipHash128(const SipKey& key, const void* data, size_t n);

// The same tag, fed in pieces (no allocation).
class SipHash128Stream {
 public:
  explicit SipHash128Stream(const SipKey& key);
  void Update(const void* data, size_t n);
  void UpdateU64(uint64_t x);  // its eight bytes, little-endian
  Hash128 Final() const;

 private:
  uint64_t v0_, v1_, v2_, v3_;
  uint64_t tail_ = 0;  // bytes past the last full word, little-endian
  size_t length_ = 0;
  void Absorb(uint64_t m);
};

// A key from the operating system's random source (std::random_device).
SipKey RandomSipKey();

}  // namespace kvrm

#endif  // KVRM_COMMON_SIPHASH_H_
