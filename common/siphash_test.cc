// SipHash-2-4-128 against the reference implementation's vectors (vectors.h, vectors_sip128:
// key 00 01 .. 0f, message 00 01 .. (len - 1)).
#include "common/siphash.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace kvrm {
namespace {

std::string Hex(const Hash128& h) {
  std::string s;
  char buf[3];
  for (uint64_t w : {h.lo, h.hi}) {
    for (int i = 0; i < 8; ++i) {
      std::snprintf(buf, sizeof(buf), "%02x", static_cast<unsigned>((w >> (8 * i)) & 0xff));
      s += buf;
    }
  }
  return s;
}

SipKey ReferenceKey() {
  SipKey k;
  k.k0 = 0x0706050403020100ull;
  k.k1 = 0x0f0e0d0c0b0a0908ull;
  return k;
}

TEST(SipHashTest, MatchesTheReferenceVectors) {
  struct Vector {
    size_t len;
    const char* tag;
  };
  // Every tail length (0-7 bytes past the last full word), one, two, four and eight full words.
  const Vector vectors[] = {
      {0, "a3817f04ba25a8e66df67214c7550293"},  {1, "da87c1d86b99af44347659119b22fc45"},
      {2, "8177228da4a45dc7fca38bdef60affe4"},  {3, "9c70b60c5267a94e5f33b6b02985ed51"},
      {4, "f88164c12d9c8faf7d0f6e7c7bcd5579"},  {5, "1368875980776f8854527a07690e9627"},
      {6, "14eeca338b208613485ea0308fd7a15e"},  {7, "a1f1ebbed8dbc153c0b84aa61ff08239"},
      {8, "3b62a9ba6258f5610f83e264f31497b4"},  {9, "264499060ad9baabc47f8b02bb6d71ed"},
      {15, "5493e99933b0a8117e08ec0f97cfc3d9"}, {16, "6ee2a4ca67b054bbfd3315bf85230577"},
      {17, "473d06e8738db89854c066c47ae47740"}, {32, "7c3956ca5eeafc3e363e9d556546eb68"},
      {63, "5150d1772f50834a503e069a973fbd7c"},
  };
  std::vector<unsigned char> msg(64);
  for (size_t i = 0; i < msg.size(); ++i) msg[i] = static_cast<unsigned char>(i);
  for (const Vector& v : vectors) {
    EXPECT_EQ(Hex(SipHash128(ReferenceKey(), msg.data(), v.len)), v.tag) << "length " << v.len;
  }
}

TEST(SipHashTest, AStreamFedInPiecesGivesTheOneShotTag) {
  std::vector<unsigned char> msg(200);
  for (size_t i = 0; i < msg.size(); ++i) msg[i] = static_cast<unsigned char>(i * 37 + 11);
  const Hash128 whole = SipHash128(ReferenceKey(), msg.data(), msg.size());
  for (size_t piece : {1, 3, 5, 8, 13, 64}) {
    SipHash128Stream s(ReferenceKey());
    for (size_t at = 0; at < msg.size(); at += piece) {
      s.Update(msg.data() + at, std::min(piece, msg.size() - at));
    }
    EXPECT_EQ(Hex(s.Final()), Hex(whole)) << "pieces of " << piece;
  }
  // Words: UpdateU64 is its eight little-endian bytes, aligned or not.
  for (size_t lead : {0, 3, 8}) {
    SipHash128Stream words(ReferenceKey());
    words.Update(msg.data(), lead);
    uint64_t w = 0;
    for (int i = 7; i >= 0; --i) w = (w << 8) | msg[lead + i];
    words.UpdateU64(w);
    words.Update(msg.data() + lead + 8, 20);
    EXPECT_EQ(Hex(words.Final()), Hex(SipHash128(ReferenceKey(), msg.data(), lead + 28)))
        << "after " << lead << " bytes";
  }
}

TEST(SipHashTest, TheKeyChangesEveryTag) {
  const std::vector<unsigned char> msg = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  SipKey other = ReferenceKey();
  other.k1 ^= 1;
  EXPECT_NE(SipHash128(ReferenceKey(), msg.data(), msg.size()),
            SipHash128(other, msg.data(), msg.size()));
  const SipKey a = RandomSipKey(), b = RandomSipKey();
  EXPECT_FALSE(a.k0 == b.k0 && a.k1 == b.k1) << "two random keys (a 2^-128 chance to fail)";
}

}  // namespace
}  // namespace kvrm
