#include "model/gguf_quants.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/dtype.h"
#include "common/logging.h"
#include "kernels/cpu/q4_k.h"
#include "kernels/cpu/q8_0.h"

namespace kvrm {
namespace {

constexpr int kQk = 32;    // elements of a q4_0 .. q8_0 block
constexpr int kQkK = 256;  // elements of a K-quant super-block

uint16_t LoadU16(const std::byte* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
float LoadHalf(const std::byte* p) { return F16ToFloat(LoadU16(p)); }
void StoreHalf(std::byte* p, float f) {
  const uint16_t h = FloatToF16(f);
  std::memcpy(p, &h, 2);
}
const uint8_t* U8(const std::byte* p) { return reinterpret_cast<const uint8_t*>(p); }
uint8_t* U8(std::byte* p) { return reinterpret_cast<uint8_t*>(p); }

int NearestInt(float f) { return static_cast<int>(std::lrintf(f)); }

// ---- dequantization (ggml-quants.c's dequantize_row_*) ----------------------------------

void DequantQ4_0(const std::byte* b, float* y) {
  const float d = LoadHalf(b);
  const uint8_t* qs = U8(b + 2);
  for (int j = 0; j < kQk / 2; ++j) {
    const int x0 = (qs[j] & 0x0F) - 8;
    const int x1 = (qs[j] >> 4) - 8;
    y[j] = x0 * d;
    y[j + kQk / 2] = x1 * d;
  }
}

void DequantQ5_0(const std::byte* b, float* y) {
  const float d = LoadHalf(b);
  uint32_t qh;
  std::memcpy(&qh, b + 2, 4);
  const uint8_t* qs = U8(b + 6);
  for (int j = 0; j < kQk / 2; ++j) {
    const uint8_t xh_0 = ((qh >> (j + 0)) << 4) & 0x10;
    const uint8_t xh_1 = ((qh >> (j + 12))) & 0x10;
    const int32_t x0 = ((qs[j] & 0x0F) | xh_0) - 16;
    const int32_t x1 = ((qs[j] >> 4) | xh_1) - 16;
    y[j] = x0 * d;
    y[j + kQk / 2] = x1 * d;
  }
}

// q4_1, q5_1, q4_K and q5_K: affine in every 32-element (sub-)block, value s * q + o with q in
// [0, 31]. Writes the block's sub-blocks (1 for q4_1 / q5_1, 8 for the K types) to s, o and q
// (32 each) and returns how many. ggml computes x * d + m (q4_1, q5_1) and d1 * q - m1 with d1 =
// d * scale, m1 = dmin * min (the K types, 8 sub-blocks; each 64-element chunk is the low nibbles
// of 32 bytes, then their high nibbles; q5_K adds a fifth bit from qh, the masks moving; q4_K is
// the kernels' DecodeBlockQ4K): every s * q is exact in f32, so s * q + o in one rounding is
// ggml's value bit for bit.
int DecodeAffine(GgmlType type, const std::byte* b, float* s, float* o, uint8_t* q) {
  if (type == GgmlType::kQ4_1 || type == GgmlType::kQ5_1) {
    const bool five = type == GgmlType::kQ5_1;
    s[0] = LoadHalf(b);
    o[0] = LoadHalf(b + 2);
    uint32_t qh = 0;
    if (five) std::memcpy(&qh, b + 4, 4);
    const uint8_t* qs = U8(b + (five ? 8 : 4));
    for (int j = 0; j < kQk / 2; ++j) {
      const uint8_t xh_0 = five ? ((qh >> (j + 0)) << 4) & 0x10 : 0;
      const uint8_t xh_1 = five ? ((qh >> (j + 12))) & 0x10 : 0;
      q[j] = (qs[j] & 0x0F) | xh_0;
      q[j + kQk / 2] = (qs[j] >> 4) | xh_1;
    }
    return 1;
  }
  if (type == GgmlType::kQ4_K) {
    DecodeBlockQ4K(U8(b), s, o, q);  // kernels/cpu/q4_k.h
    return 8;
  }
  CHECK(type == GgmlType::kQ5_K);
  const float d = LoadHalf(b), min = LoadHalf(b + 2);
  const uint8_t* scales = U8(b + 4);
  const uint8_t* qh = U8(b + 16);
  const uint8_t* qs = U8(b + 48);
  uint8_t u1 = 1, u2 = 2;
  for (int is = 0; is < 8; is += 2) {
    uint8_t sc, m;
    Q4KScaleMin(is + 0, scales, &sc, &m);
    s[is] = d * sc;
    o[is] = -(min * m);
    Q4KScaleMin(is + 1, scales, &sc, &m);
    s[is + 1] = d * sc;
    o[is + 1] = -(min * m);
    for (int l = 0; l < 32; ++l) {
      q[is * 32 + l] = (qs[l] & 0xF) + (qh[l] & u1 ? 16 : 0);
      q[is * 32 + 32 + l] = (qs[l] >> 4) + (qh[l] & u2 ? 16 : 0);
    }
    qs += 32;
    u1 <<= 2;
    u2 <<= 2;
  }
  return 8;
}

void DequantAffine(GgmlType type, const std::byte* b, float* y) {
  float s[8], o[8];
  uint8_t q[kQkK];
  const int subs = DecodeAffine(type, b, s, o, q);
  for (int i = 0; i < subs * kQk; ++i) y[i] = std::fma(s[i / kQk], q[i], o[i / kQk]);
}

// q6_K: 256 elements, element e scaled by d * scales[e / 16] (int8), q - 32 in [-32, 31]. Writes
// the 16 scales (d * scale, exact in f32) and the 256 q - 32 (the kernels' DecodeBlockQ6K).
void DecodeQ6_K(const std::byte* b, float* s, int8_t* q) {
  uint8_t u[kQkK];
  DecodeBlockQ6K(U8(b), s, u);
  for (int e = 0; e < kQkK; ++e) q[e] = static_cast<int8_t>(u[e] - 32);
}

// ggml computes d * scale * q left to right: d * scale is exact, so one rounding, as here.
void DequantQ6_K(const std::byte* b, float* y) {
  float s[16];
  int8_t q[kQkK];
  DecodeQ6_K(b, s, q);
  for (int e = 0; e < kQkK; ++e) y[e] = s[e / 16] * q[e];
}

// ---- quantization -----------------------------------------------------------------------

// The value of largest magnitude, sign kept (ggml's reference quantizers scale by it).
float SignedAbsMax(const float* x, int n) {
  float amax = 0, max = 0;
  for (int j = 0; j < n; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}


// Q4_0 (offset 8, 4 bits) and Q5_0 (offset 16, 5 bits): symmetric, scaled by the signed max.
void QuantQx0(const float* x, int bits, std::byte* b) {
  const int offset = 1 << (bits - 1), top = (1 << bits) - 1;
  const float d = SignedAbsMax(x, kQk) / -offset;
  const float id = d != 0 ? 1 / d : 0;
  StoreHalf(b, d);
  uint8_t* qs = U8(b + (bits == 4 ? 2 : 6));
  uint32_t qh = 0;
  for (int j = 0; j < kQk / 2; ++j) {
    const int x0 = std::min(top, static_cast<int>(static_cast<int8_t>(x[j] * id + offset + 0.5f)));
    const int x1 =
        std::min(top, static_cast<int>(static_cast<int8_t>(x[j + kQk / 2] * id + offset + 0.5f)));
    qs[j] = static_cast<uint8_t>((x0 & 0x0F) | ((x1 & 0x0F) << 4));
    qh |= static_cast<uint32_t>((x0 & 0x10) >> 4) << (j + 0);
    qh |= static_cast<uint32_t>((x1 & 0x10) >> 4) << (j + kQk / 2);
  }
  if (bits == 5) std::memcpy(b + 2, &qh, 4);
}

// Q4_1 and Q5_1: scale and min.
void QuantQx1(const float* x, int bits, std::byte* b) {
  const int top = (1 << bits) - 1;
  float min = x[0], max = x[0];
  for (int j = 1; j < kQk; ++j) {
    min = std::min(min, x[j]);
    max = std::max(max, x[j]);
  }
  const float d = (max - min) / top;
  const float id = d != 0 ? 1 / d : 0;
  StoreHalf(b, d);
  StoreHalf(b + 2, min);
  uint8_t* qs = U8(b + (bits == 4 ? 4 : 8));
  uint32_t qh = 0;
  for (int j = 0; j < kQk / 2; ++j) {
    const int x0 = std::min(top, static_cast<int>((x[j] - min) * id + 0.5f));
    const int x1 = std::min(top, static_cast<int>((x[j + kQk / 2] - min) * id + 0.5f));
    qs[j] = static_cast<uint8_t>((x0 & 0x0F) | ((x1 & 0x0F) << 4));
    qh |= static_cast<uint32_t>((x0 & 0x10) >> 4) << (j + 0);
    qh |= static_cast<uint32_t>((x1 & 0x10) >> 4) << (j + kQk / 2);
  }
  if (bits == 5) std::memcpy(b + 4, &qh, 4);
}

// Q5_K: the K-quants' header and fit (kernels/cpu/q4_k.h, as ggml's quantize_row_q5_K_ref: nmax
// 31, rmin -0.5, 15 steps), each value's fifth bit in qh.
void QuantQ5_K(const float* x, std::byte* b) {
  uint8_t q[kQkK];
  QuantizeKSuperBlock(x, 31, -0.5f, 15, U8(b), q);
  uint8_t* qh = U8(b + 16);
  uint8_t* qs = U8(b + 48);
  std::memset(qh, 0, 32);
  for (int s = 0; s < 8; ++s) {
    for (int l = 0; l < 32; ++l) {
      const int v = q[s * 32 + l];
      uint8_t& byte = qs[s / 2 * 32 + l];
      byte = s % 2 ? static_cast<uint8_t>((byte & 0x0F) | ((v & 0xF) << 4))
                   : static_cast<uint8_t>((byte & 0xF0) | (v & 0xF));
      if (v & 16) qh[l] |= static_cast<uint8_t>(1u << s);
    }
  }
}

// ggml's make_qx_quants for q6_K (n values to [-nmax, nmax - 1], weights x^2, no importance
// matrix): the signed scale fitting them best over 19 trial inverse scales around -nmax / (the
// value of largest magnitude), by weighted least squares; their levels (l + nmax) in `levels`.
// ggml's float operations in ggml's order, so that the result is its bits.
float FitSymmetricScale(int n, int nmax, const float* x, uint8_t* levels) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < 1e-15f) {  // ggml's GROUP_MAX_EPS: all zero
    std::fill(levels, levels + n, uint8_t{0});
    return 0.0f;
  }
  const auto level = [&](float iscale, int i) {
    return std::clamp(NearestInt(iscale * x[i]), -nmax, nmax - 1);
  };
  const auto sums = [&](float iscale, float* sumlx, float* suml2) {
    *sumlx = *suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = level(iscale, i);
      const float w = x[i] * x[i];
      *sumlx += w * x[i] * l;
      *suml2 += w * l * l;
    }
  };
  float iscale = -nmax / max;
  for (int i = 0; i < n; ++i) levels[i] = static_cast<uint8_t>(level(iscale, i) + nmax);
  float sumlx, suml2;
  sums(iscale, &sumlx, &suml2);
  float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(nmax + 0.1f * is) / max;
    sums(iscale, &sumlx, &suml2);
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) levels[i] = static_cast<uint8_t>(level(iscale, i) + nmax);
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// Q6_K as ggml's quantize_row_q6_K_ref: each 16-value sub-block's scale by FitSymmetricScale,
// the scales as int8 multiples of d (the signed largest-magnitude scale / -128), then the values
// again under the stored scales (a sub-block whose scale rounded to 0 keeps its fit's levels).
void QuantQ6_K(const float* x, std::byte* b) {
  float scale[16], max_scale = 0, max_abs_scale = 0;
  uint8_t q[kQkK];
  for (int s = 0; s < 16; ++s) {
    scale[s] = FitSymmetricScale(16, 32, x + s * 16, q + s * 16);
    if (std::fabs(scale[s]) > max_abs_scale) {
      max_abs_scale = std::fabs(scale[s]);
      max_scale = scale[s];
    }
  }
  if (max_abs_scale < 1e-15f) {
    std::memset(b, 0, 210);
    return;
  }
  const float iscale = -128.0f / max_scale;
  StoreHalf(b + 208, 1 / iscale);
  const float dd = LoadHalf(b + 208);
  int8_t* sc = reinterpret_cast<int8_t*>(b + 192);
  for (int s = 0; s < 16; ++s) {
    sc[s] = static_cast<int8_t>(std::min(127, NearestInt(iscale * scale[s])));
  }
  for (int s = 0; s < 16; ++s) {
    const float dl = dd * sc[s];
    if (dl == 0) continue;
    for (int l = 0; l < 16; ++l) {
      q[s * 16 + l] =
          static_cast<uint8_t>(std::clamp(NearestInt(x[s * 16 + l] / dl), -32, 31) + 32);
    }
  }
  uint8_t* ql = U8(b);
  uint8_t* qh = U8(b + 128);
  for (int n = 0; n < kQkK; n += 128) {
    const uint8_t* qn = q + n;
    for (int l = 0; l < 32; ++l) {
      ql[l] = static_cast<uint8_t>((qn[l] & 0xF) | ((qn[l + 64] & 0xF) << 4));
      ql[l + 32] = static_cast<uint8_t>((qn[l + 32] & 0xF) | ((qn[l + 96] & 0xF) << 4));
      qh[l] = static_cast<uint8_t>((qn[l] >> 4) | ((qn[l + 32] >> 4) << 2) |
                                   ((qn[l + 64] >> 4) << 4) | ((qn[l + 96] >> 4) << 6));
    }
    ql += 64;
    qh += 32;
  }
}

}  // namespace

void DequantizeRow(GgmlType type, const std::byte* src, int64_t n, float* out) {
  const GgmlTypeTraits& t = GgmlTraits(type);
  CHECK(n % t.block_elems == 0) << t.name << ": " << n << " elements";
  const int64_t blocks = n / t.block_elems;
  for (int64_t i = 0; i < blocks; ++i) {
    const std::byte* b = src + i * t.block_bytes;
    float* y = out + i * t.block_elems;
    switch (type) {
      case GgmlType::kF32:
        std::memcpy(y, b, 4);
        break;
      case GgmlType::kF16:
        *y = LoadHalf(b);
        break;
      case GgmlType::kBF16:
        *y = Bf16ToFloat(LoadU16(b));
        break;
      case GgmlType::kQ4_0:
        DequantQ4_0(b, y);
        break;
      case GgmlType::kQ4_1:
      case GgmlType::kQ5_1:
      case GgmlType::kQ4_K:
      case GgmlType::kQ5_K:
        DequantAffine(type, b, y);
        break;
      case GgmlType::kQ5_0:
        DequantQ5_0(b, y);
        break;
      case GgmlType::kQ8_0:
        DequantizeBlockQ8_0(reinterpret_cast<const uint8_t*>(b), y);  // kernels/cpu/q8_0.h
        break;
      case GgmlType::kQ6_K:
        DequantQ6_K(b, y);
        break;
      case GgmlType::kMxfp4:
        DequantizeRowMxfp4(U8(b), kQk, y);  // kernels/cpu/q8_0.h: the same values, exactly
        break;
    }
  }
}

bool ToQ8_0Exactly(GgmlType type, const std::byte* src, int64_t n, std::byte* dst) {
  if (type != GgmlType::kQ8_0 && type != GgmlType::kQ4_0 && type != GgmlType::kQ5_0) return false;
  const GgmlTypeTraits& t = GgmlTraits(type);
  CHECK(n % kQk == 0) << t.name << ": " << n << " elements";
  if (type == GgmlType::kQ8_0) {
    std::memcpy(dst, src, n / kQk * t.block_bytes);
    return true;
  }
  float y[kQk];
  for (int64_t i = 0; i < n / kQk; ++i) {
    const std::byte* b = src + i * t.block_bytes;
    std::byte* out = dst + i * WeightMatrix::kQ8BlockBytes;
    // Both formats start with d (f16); each value is d times a small integer, exactly in f32, so
    // the integer comes back exactly.
    DequantizeRow(type, b, kQk, y);
    std::memcpy(out, b, 2);
    const float d = LoadHalf(b);
    int8_t* q = reinterpret_cast<int8_t*>(out + 2);
    for (int j = 0; j < kQk; ++j) {
      q[j] = d != 0 && std::isfinite(d) ? static_cast<int8_t>(std::nearbyint(y[j] / d)) : 0;
    }
  }
  return true;
}

namespace {

// One two-f32 q8 block (q8 affine: s, o; q8 halves: s0, s1) then its 32 q at `out`; returns the
// next block's place.
std::byte* PutTwoScaleBlock(float first, float second, const void* q, std::byte* out) {
  std::memcpy(out, &first, 4);
  std::memcpy(out + 4, &second, 4);
  std::memcpy(out + 8, q, kQk);
  return out + WeightMatrix::kQ8AffineBlockBytes;
}

}  // namespace

bool ToQ8AffineExactly(GgmlType type, const std::byte* src, int64_t n, std::byte* dst) {
  if (type == GgmlType::kMxfp4) {
    // s = 2^(e - 128) (any E8M0 but 255: from 2^-128, f32's subnormals, to 2^126), o = 0 and q
    // twice the FP4 value (at most 12): the same products as the FP4 block's.
    CHECK(n % kQk == 0) << "mxfp4: " << n << " elements";
    for (int64_t i = 0; i < n / kQk; ++i) {
      const uint8_t* b = U8(src + i * WeightMatrix::kMxfp4BlockBytes);
      int8_t q[kQk];
      for (int j = 0; j < kQk / 2; ++j) {
        q[j] = kMxfp4Twice[b[1 + j] & 15];
        q[j + kQk / 2] = kMxfp4Twice[b[1 + j] >> 4];
      }
      dst = PutTwoScaleBlock(std::ldexp(1.0f, static_cast<int>(b[0]) - 128), 0.0f, q, dst);
    }
    return true;
  }
  if (type != GgmlType::kQ4_1 && type != GgmlType::kQ5_1 && type != GgmlType::kQ4_K &&
      type != GgmlType::kQ5_K) {
    return false;
  }
  const GgmlTypeTraits& t = GgmlTraits(type);
  CHECK(n % t.block_elems == 0) << t.name << ": " << n << " elements";
  float s[8], o[8];
  uint8_t q[kQkK];
  std::byte* out = dst;
  for (int64_t i = 0; i < n / t.block_elems; ++i) {
    const int subs = DecodeAffine(type, src + i * t.block_bytes, s, o, q);
    // q <= 31: the same bytes as int8.
    for (int j = 0; j < subs; ++j) out = PutTwoScaleBlock(s[j], o[j], q + j * kQk, out);
  }
  return true;
}

bool ToQ8HalvesExactly(GgmlType type, const std::byte* src, int64_t n, std::byte* dst) {
  if (type != GgmlType::kQ6_K) return false;
  const GgmlTypeTraits& t = GgmlTraits(type);
  CHECK(n % t.block_elems == 0) << t.name << ": " << n << " elements";
  float s[16];
  int8_t q[kQkK];
  std::byte* out = dst;
  for (int64_t i = 0; i < n / t.block_elems; ++i) {
    DecodeQ6_K(src + i * t.block_bytes, s, q);
    // s0, s1: the scales of the block's two 16-value halves.
    for (int j = 0; j < kQkK / kQk; ++j) {
      out = PutTwoScaleBlock(s[2 * j], s[2 * j + 1], q + j * kQk, out);
    }
  }
  return true;
}

WeightFormat StoredBlockFormat(GgmlType type) {
  switch (type) {
    case GgmlType::kQ8_0:
      return WeightFormat::kQ8_0;
    case GgmlType::kQ4_K:
      return WeightFormat::kQ4K;
    case GgmlType::kQ6_K:
      return WeightFormat::kQ6K;
    case GgmlType::kMxfp4:
      return WeightFormat::kMxfp4;
    default:
      return WeightFormat::kDense;
  }
}

GgmlType GgmlTypeOf(WeightFormat stored) {
  switch (stored) {
    case WeightFormat::kQ8_0:
      return GgmlType::kQ8_0;
    case WeightFormat::kQ4K:
      return GgmlType::kQ4_K;
    case WeightFormat::kQ6K:
      return GgmlType::kQ6_K;
    case WeightFormat::kMxfp4:
      return GgmlType::kMxfp4;
    default:
      LOG(FATAL) << "no GGUF type is stored as format " << static_cast<int>(stored);
  }
}

WeightFormat Exact8BitFormat(GgmlType type) {
  switch (type) {
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_0:
    case GgmlType::kQ5_0:
      return WeightFormat::kQ8_0;
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_1:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kMxfp4:
      return WeightFormat::kQ8Affine;
    case GgmlType::kQ6_K:
      return WeightFormat::kQ8Halves;
    default:
      return WeightFormat::kDense;
  }
}

bool ToQ4GroupsExactly(GgmlType type, const std::byte* src, int64_t n, std::byte* dst) {
  constexpr int64_t kSuper = WeightMatrix::kQ4KBlock, kQ4_0Bytes = 18;
  if (type != GgmlType::kQ4_0 || n % kSuper != 0) return false;
  for (int64_t sb = 0; sb < n / kSuper; ++sb) {
    std::byte* block = dst + sb * WeightMatrix::kQ4GBlockBytes;
    for (int j = 0; j < 8; ++j) {
      const std::byte* q4 = src + (sb * 8 + j) * kQ4_0Bytes;
      std::memcpy(block + 2 * j, q4, 2);             // d as s
      block[16 + j] = std::byte{8};                  // z
      std::memcpy(block + 24 + 16 * j, q4 + 2, 16);  // q[i] low, q[i + 16] high
    }
  }
  return true;
}

bool ToExact8Bit(GgmlType type, const std::byte* src, int64_t n, std::byte* dst) {
  return ToQ8_0Exactly(type, src, n, dst) || ToQ8AffineExactly(type, src, n, dst) ||
         ToQ8HalvesExactly(type, src, n, dst);
}

namespace {

// quantize_row_mxfp4_ref: e from the block's largest magnitude (floor(log2 amax) - 2 + 127, so
// 1.5 x 2^floor(log2 amax) is the largest value; larger ones saturate at 6 x the scale), each
// value the first of the 16 codes nearest it (the doubled values against half the scale).
void QuantMxfp4(const float* x, std::byte* b) {
  float amax = 0.0f;
  for (int j = 0; j < kQk; ++j) amax = std::max(amax, std::fabs(x[j]));
  // (At least 0: ggml casts a negative float to uint8, undefined, for amax below 2^-125.)
  const uint8_t e =
      amax > 0.0f ? static_cast<uint8_t>(std::max(0.0f, std::floor(std::log2(amax)) - 2 + 127)) : 0;
  const float d = std::ldexp(1.0f, static_cast<int>(e) - 128);  // GGML_E8M0_TO_FP32_HALF
  auto nearest = [&](float v) {
    int best = 0;
    float best_err = std::fabs(kMxfp4Twice[0] * d - v);
    for (int i = 1; i < 16; ++i) {
      const float err = std::fabs(kMxfp4Twice[i] * d - v);
      if (err < best_err) {
        best = i;
        best_err = err;
      }
    }
    return static_cast<uint8_t>(best);
  };
  uint8_t* out = U8(b);
  out[0] = e;
  for (int j = 0; j < kQk / 2; ++j) {
    out[1 + j] = static_cast<uint8_t>(nearest(x[j]) | nearest(x[j + kQk / 2]) << 4);
  }
}

}  // namespace

void QuantizeRow(GgmlType type, const float* x, int64_t n, std::byte* dst) {
  const GgmlTypeTraits& t = GgmlTraits(type);
  CHECK(n % t.block_elems == 0) << t.name << ": " << n << " elements";
  const int64_t blocks = n / t.block_elems;
  for (int64_t i = 0; i < blocks; ++i) {
    std::byte* b = dst + i * t.block_bytes;
    const float* v = x + i * t.block_elems;
    switch (type) {
      case GgmlType::kF32:
        std::memcpy(b, v, 4);
        break;
      case GgmlType::kF16:
        StoreHalf(b, *v);
        break;
      case GgmlType::kBF16: {
        const uint16_t h = FloatToBf16(*v);
        std::memcpy(b, &h, 2);
        break;
      }
      case GgmlType::kQ4_0:
        QuantQx0(v, 4, b);
        break;
      case GgmlType::kQ4_1:
        QuantQx1(v, 4, b);
        break;
      case GgmlType::kQ5_0:
        QuantQx0(v, 5, b);
        break;
      case GgmlType::kQ5_1:
        QuantQx1(v, 5, b);
        break;
      case GgmlType::kQ8_0:
        QuantizeBlockQ8_0(v, reinterpret_cast<uint8_t*>(b));  // ggml's reference, as the kernels
        break;
      case GgmlType::kQ4_K:
        QuantizeBlockQ4K(v, reinterpret_cast<uint8_t*>(b));  // ggml's reference, as the kernels
        break;
      case GgmlType::kQ5_K:
        QuantQ5_K(v, b);
        break;
      case GgmlType::kQ6_K:
        QuantQ6_K(v, b);
        break;
      case GgmlType::kMxfp4:
        QuantMxfp4(v, b);
        break;
    }
  }
}

}  // namespace kvrm
