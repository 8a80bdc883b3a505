#include "common/siphash.h"

#include <random>

namespace kvrm {
namespace {

inline uint64_t Rotl(uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }

inline void SipRound(uint64_t& v0, uint64_t& v1, uint64_t& v2, uint64_t& v3) {
  v0 += v1;
  v1 = Rotl(v1, 13);
  v1 ^= v0;
  v0 = Rotl(v0, 32);
  v2 += v3;
  v3 = Rotl(v3, 16);
  v3 ^= v2;
  v0 += v3;
  v3 = Rotl(v3, 21);
  v3 ^= v0;
  v2 += v1;
  v1 = Rotl(v1, 17);
  v1 ^= v2;
  v2 = Rotl(v2, 32);
}

}  // namespace

SipHash128Stream::SipHash128Stream(const SipKey& key)
    : v0_(key.k0 ^ 0x736f6d6570736575ull),
      v1_(key.k1 ^ 0x646f72616e646f6dull ^ 0xee),  // 0xee: the 128-bit variant
      v2_(key.k0 ^ 0x6c7967656e657261ull),
      v3_(key.k1 ^ 0x7465646279746573ull) {}

void SipHash128Stream::Absorb(uint64_t m) {
  v3_ ^= m;
  SipRound(v0_, v1_, v2_, v3_);  // c = 2 compression rounds
  SipRound(v0_, v1_, v2_, v3_);
  v0_ ^= m;
}

void SipHash128Stream::Update(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    tail_ |= static_cast<uint64_t>(p[i]) << (8 * (length_ % 8));
    if (++length_ % 8 == 0) {
      Absorb(tail_);
      tail_ = 0;
    }
  }
}

void SipHash128Stream::UpdateU64(uint64_t x) {
  if (length_ % 8 == 0) {
    Absorb(x);
    length_ += 8;
    return;
  }
  unsigned char b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(x >> (8 * i));
  Update(b, 8);
}

Hash128 SipHash128Stream::Final() const {
  uint64_t v0 = v0_, v1 = v1_, v2 = v2_, v3 = v3_;
  const uint64_t last = tail_ | (static_cast<uint64_t>(length_ & 0xff) << 56);
  v3 ^= last;
  SipRound(v0, v1, v2, v3);
  SipRound(v0, v1, v2, v3);
  v0 ^= last;
  v2 ^= 0xee;
  for (int i = 0; i < 4; ++i) SipRound(v0, v1, v2, v3);  // d = 4 finalization rounds
  Hash128 h;
  h.lo = v0 ^ v1 ^ v2 ^ v3;
  v1 ^= 0xdd;
  for (int i = 0; i < 4; ++i) SipRound(v0, v1, v2, v3);
  h.hi = v0 ^ v1 ^ v2 ^ v3;
  return h;
}

Hash128 SipHash128(const SipKey& key, const void* data, size_t n) {
  SipHash128Stream s(key);
  s.Update(data, n);
  return s.Final();
}

SipKey RandomSipKey() {
  std::random_device rd;
  auto word = [&] { return (static_cast<uint64_t>(rd()) << 32) ^ rd(); };
  SipKey k;
  k.k0 = word();
  k.k1 = word();
  return k;
}

}  // namespace kvrm
