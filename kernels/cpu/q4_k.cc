#include "kernels/cpu/q4_k.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/dtype.h"
#include "common/logging.h"
#include "kernels/cpu/isa.h"

namespace kvrm {
namespace {

constexpr int64_t kSuper = WeightMatrix::kQ4KBlock;
constexpr int64_t kSub = 32;  // values a sub-block (and an activation block)
constexpr int64_t kGroup = WeightMatrix::kPanelRows;
// Bytes of int8 activation rows a q4_K product quantizes at a time (as q8_0.cc's).
constexpr int64_t kActBlockBytes = 128 * 1024;

// Bytes of one quantized activation row: its int8 values; per 32, xd and xsum; per 16, a sum.
int64_t RowBytes(int64_t cols) { return cols + cols / kSub * 8 + cols / 16 * 4; }

float LoadF16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return F16ToFloat(h);
}

}  // namespace

void Q4KScaleMin(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

void Q4KPackScaleMin(const uint8_t* sc, const uint8_t* m, uint8_t* q) {
  std::memset(q, 0, 12);
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      q[j] |= sc[j];
      q[j + 4] |= m[j];
    } else {
      q[j + 4] = static_cast<uint8_t>((sc[j] & 0xF) | ((m[j] & 0xF) << 4));
      q[j - 4] |= static_cast<uint8_t>((sc[j] >> 4) << 6);
      q[j] |= static_cast<uint8_t>((m[j] >> 4) << 6);
    }
  }
}

float FitKQuantSubBlock(int n, int nmax, const float* x, const float* weights, uint8_t* q,
                        float* min, float rmin, float rdelta, int nstep) {
  float lo = 0, hi = x[0], sum_w = 0, sum_wx = 0;
  for (int i = 0; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
    sum_w += weights[i];
    sum_wx += weights[i] * x[i];
  }
  if (hi == lo) {  // all zero (or one non-positive value): nothing to scale
    std::fill(q, q + n, uint8_t{0});
    *min = -lo;
    return 0.0f;
  }
  // Rounding under a trial scale, and the weighted squared error of a fit. As in ggml's
  // make_qkx2_quants, the trials round from the offset of the best fit so far (lo until one beats
  // the first) and divide by hi less that offset.
  float offset = lo;
  auto round_at = [&](float inverse, uint8_t* out) {
    for (int i = 0; i < n; ++i) {
      const float r = std::nearbyint(inverse * (x[i] - offset));
      out[i] = static_cast<uint8_t>(std::clamp(r, 0.0f, static_cast<float>(nmax)));
    }
  };
  // (ggml's float operations in ggml's order: w * (diff * diff), the first scale 1 / iscale.)
  auto error_of = [&](const uint8_t* l, float scale, float offset) {
    float e = 0;
    for (int i = 0; i < n; ++i) {
      const float diff = scale * l[i] + offset - x[i];
      e += weights[i] * (diff * diff);
    }
    return e;
  };
  const float iscale = nmax / (hi - lo);
  float scale = 1 / iscale;
  round_at(iscale, q);
  float best = error_of(q, scale, offset);
  uint8_t trial[WeightMatrix::kQ4KBlock];
  for (int k = 0; k <= nstep; ++k) {
    round_at((rmin + rdelta * k + nmax) / (hi - offset), trial);
    // The weighted least-squares scale and offset for these q.
    float sl = 0, sl2 = 0, sxl = 0;
    for (int i = 0; i < n; ++i) {
      sl += weights[i] * trial[i];
      sl2 += weights[i] * trial[i] * trial[i];
      sxl += weights[i] * trial[i] * x[i];
    }
    const float det = sum_w * sl2 - sl * sl;
    if (det <= 0) continue;
    float s = (sum_w * sxl - sum_wx * sl) / det;
    float o = (sl2 * sum_wx - sl * sxl) / det;
    if (o > 0) {  // the min stays at most 0: refit the scale alone
      o = 0;
      s = sxl / sl2;
    }
    const float e = error_of(trial, s, o);
    if (e < best) {
      std::copy(trial, trial + n, q);
      best = e;
      scale = s;
      offset = o;
    }
  }
  *min = -offset;
  return scale;
}

void QuantizeKSuperBlock(const float* x, int nmax, float rmin, int nstep, uint8_t* header,
                         uint8_t* q) {
  std::memset(header, 0, 16);
  bool finite = true;
  for (int64_t i = 0; i < kSuper; ++i) finite = finite && std::isfinite(x[i]);
  if (!finite) {
    const uint16_t nan = 0x7e00;
    std::memcpy(header, &nan, 2);
    std::memset(q, 0, kSuper);
    return;
  }
  float scales[8], mins[8], max_scale = 0, max_min = 0, weights[kSub];
  for (int j = 0; j < 8; ++j) {
    const float* v = x + j * kSub;
    float sum2 = 0;
    for (int i = 0; i < kSub; ++i) sum2 += v[i] * v[i];
    const float rms = std::sqrt(sum2 / kSub);
    for (int i = 0; i < kSub; ++i) weights[i] = rms + std::fabs(v[i]);
    scales[j] =
        FitKQuantSubBlock(kSub, nmax, v, weights, q + j * kSub, &mins[j], rmin, 0.1f, nstep);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  const float inv_scale = max_scale > 0 ? 63 / max_scale : 0;
  const float inv_min = max_min > 0 ? 63 / max_min : 0;
  uint8_t sc[8], m[8];
  for (int j = 0; j < 8; ++j) {
    sc[j] = static_cast<uint8_t>(std::min(63.0f, std::nearbyint(inv_scale * scales[j])));
    m[j] = static_cast<uint8_t>(std::min(63.0f, std::nearbyint(inv_min * mins[j])));
  }
  const uint16_t d = FloatToF16(max_scale / 63), dmin = FloatToF16(max_min / 63);
  std::memcpy(header, &d, 2);
  std::memcpy(header + 2, &dmin, 2);
  Q4KPackScaleMin(sc, m, header + 4);
  // The q again, under the scales as stored (a sub-block whose scale rounded to 0 keeps its fit).
  for (int j = 0; j < 8; ++j) {
    const float dj = F16ToFloat(d) * sc[j];
    if (dj == 0) continue;
    const float mj = F16ToFloat(dmin) * m[j];
    for (int i = 0; i < kSub; ++i) {
      const float r = std::nearbyint((x[j * kSub + i] + mj) / dj);
      q[j * kSub + i] = static_cast<uint8_t>(std::clamp(r, 0.0f, static_cast<float>(nmax)));
    }
  }
}

void QuantizeBlockQ4K(const float* x, uint8_t* block) {
  uint8_t q[kSuper];
  QuantizeKSuperBlock(x, 15, -1.0f, 20, block, q);
  // Sub-blocks 2c and 2c + 1 as the low and high nibbles of qs[32 c, 32 c + 32).
  uint8_t* qs = block + 16;
  for (int c = 0; c < 4; ++c) {
    for (int i = 0; i < kSub; ++i) {
      qs[c * kSub + i] = static_cast<uint8_t>(q[2 * c * kSub + i] | q[(2 * c + 1) * kSub + i] << 4);
    }
  }
}

void QuantizeRowQ4K(const float* x, int64_t n, uint8_t* blocks) {
  for (int64_t b = 0; b < n / kSuper; ++b) {
    QuantizeBlockQ4K(x + b * kSuper, blocks + b * WeightMatrix::kQ4KBlockBytes);
  }
}

void DecodeBlockQ4K(const uint8_t* block, float* s, float* o, uint8_t* q) {
  const float d = LoadF16(block), dmin = LoadF16(block + 2);
  const uint8_t* qs = block + 16;
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    Q4KScaleMin(j, block + 4, &sc, &m);
    s[j] = d * sc;
    o[j] = -(dmin * m);
    // Sub-blocks 2c and 2c + 1 are the low and high nibbles of the same 32 bytes.
    const uint8_t* chunk = qs + j / 2 * kSub;
    for (int c = 0; c < kSub; ++c) {
      q[j * kSub + c] = j % 2 == 0 ? chunk[c] & 0xF : chunk[c] >> 4;
    }
  }
}

void DequantizeRowQ4K(const uint8_t* blocks, int64_t n, float* y) {
  float s[8], o[8];
  uint8_t q[kSuper];
  for (int64_t b = 0; b < n / kSuper; ++b) {
    DecodeBlockQ4K(blocks + b * WeightMatrix::kQ4KBlockBytes, s, o, q);
    // d * sc * q is exact (at most 17 significant bits), so this is ggml's d1 * q - m1.
    for (int64_t i = 0; i < kSuper; ++i)
      y[b * kSuper + i] = std::fma(s[i / kSub], q[i], o[i / kSub]);
  }
}

KVRM_CPU_CLONES
void QuantizeActivationsQ4K(const float* x, int64_t n, int64_t ldx, int64_t k, int8_t* q, float* xd,
                            float* xsum, int32_t* sums16, const int32_t* order) {
  const int64_t blocks = k / kSub;
  float gathered[kSub];
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t b = 0; b < blocks; ++b) {
      const float* v = x + i * ldx + b * kSub;
      if (order != nullptr) {
        for (int64_t c = 0; c < kSub; ++c) gathered[c] = x[i * ldx + order[b * kSub + c]];
        v = gathered;
      }
      int8_t* out = q + i * k + b * kSub;
      float amax = 0;
      bool finite = true;
      for (int64_t c = 0; c < kSub; ++c) {
        // Not std::isfinite: the comparison form vectorises.
        finite &= std::fabs(v[c]) <= std::numeric_limits<float>::max();
        amax = std::max(amax, std::fabs(v[c]));
      }
      float& d = xd[i * blocks + b];
      float& sum = xsum[i * blocks + b];
      int32_t half[2] = {0, 0};  // the sums of q over the block's two 16s
      if (!finite || amax == 0) {
        std::memset(out, 0, kSub);
        d = sum = finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
      } else {
        const float inv = 127.0f / amax;
        for (int64_t c = 0; c < kSub; ++c) {
          out[c] = static_cast<int8_t>(std::nearbyint(std::clamp(v[c] * inv, -127.0f, 127.0f)));
          half[c / 16] += out[c];
        }
        d = amax / 127.0f;
        sum = d * static_cast<float>(half[0] + half[1]);
      }
      if (sums16 != nullptr) {
        sums16[i * 2 * blocks + 2 * b] = 32 * half[0];
        sums16[i * 2 * blocks + 2 * b + 1] = 32 * half[1];
      }
    }
  }
}

void DecodeBlockQ6K(const uint8_t* block, float* s, uint8_t* q) {
  const uint8_t* ql = block;
  const uint8_t* qh = block + 128;
  const int8_t* scales = reinterpret_cast<const int8_t*>(block + 192);
  const float d = LoadF16(block + 208);
  for (int g = 0; g < 16; ++g) s[g] = d * scales[g];
  for (int half = 0; half < 2; ++half, ql += 64, qh += 32) {
    uint8_t* out = q + 128 * half;
    for (int l = 0; l < 32; ++l) {
      out[l] = static_cast<uint8_t>((ql[l] & 0xF) | ((qh[l] & 3) << 4));
      out[l + 32] = static_cast<uint8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4));
      out[l + 64] = static_cast<uint8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
      out[l + 96] = static_cast<uint8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
    }
  }
}

void DequantizeRowQ6K(const uint8_t* blocks, int64_t n, float* y) {
  float s[16];
  uint8_t q[kSuper];
  for (int64_t b = 0; b < n / kSuper; ++b) {
    DecodeBlockQ6K(blocks + b * WeightMatrix::kQ6KBlockBytes, s, q);
    // d * scale is exact, so one rounding of d * scale * (q - 32), as ggml's.
    for (int64_t i = 0; i < kSuper; ++i) y[b * kSuper + i] = s[i / 16] * (q[i] - 32);
  }
}

int64_t Q4KActivationBlockRows(int64_t cols) {
  return std::max<int64_t>(kGroup, kActBlockBytes / RowBytes(cols) / kGroup * kGroup);
}

int64_t Q4KScratchBytes(int64_t cols) {
  // The rows (int8) twice (the AVX-512 kernel regroups them by pass into a second copy) and their
  // scales; never less for more columns (a caller sizes one scratch by its widest matrix).
  return 2 * std::max(kActBlockBytes, kGroup * RowBytes(cols)) + 64;
}

void DecodeBlockQ4G(const uint8_t* block, float* s, uint8_t* z, uint8_t* q) {
  for (int j = 0; j < 8; ++j) {
    uint16_t h;
    std::memcpy(&h, block + 2 * j, 2);
    s[j] = F16ToFloat(h);
    z[j] = block[16 + j];
    const uint8_t* nibbles = block + 24 + 16 * j;
    for (int i = 0; i < 16; ++i) {
      q[32 * j + i] = nibbles[i] & 0xF;
      q[32 * j + 16 + i] = nibbles[i] >> 4;
    }
  }
}

void DequantizeRowQ4G(const uint8_t* blocks, int64_t n, float* y) {
  float s[8];
  uint8_t z[8], q[kSuper];
  for (int64_t b = 0; b < n / kSuper; ++b) {
    DecodeBlockQ4G(blocks + b * WeightMatrix::kQ4GBlockBytes, s, z, q);
    for (int64_t i = 0; i < kSuper; ++i) {
      y[b * kSuper + i] = s[i / 32] * static_cast<float>(static_cast<int>(q[i]) - z[i / 32]);
    }
  }
}

void EncodeBlockQ4G(const uint16_t* s_f16, const uint8_t* z, const uint8_t* q, uint8_t* block) {
  std::memcpy(block, s_f16, 16);
  std::memcpy(block + 16, z, 8);
  for (int j = 0; j < 8; ++j) {
    for (int i = 0; i < 16; ++i) {
      block[24 + 16 * j + i] =
          static_cast<uint8_t>((q[32 * j + i] & 0xF) | (q[32 * j + 16 + i] & 0xF) << 4);
    }
  }
}

}  // namespace kvrm
