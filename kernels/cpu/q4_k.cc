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
// Where a panel super-block's parts start (q4_k.h).
constexpr int64_t kDminAt = 32, kScAt = 64, kMinAt = 192, kLinesAt = 320;
// Bytes of int8 activation rows a q4_K product quantizes at a time (as q8_0.cc's).
constexpr int64_t kActBlockBytes = 128 * 1024;

// Bytes of one quantized activation row: its int8 values and, per 32, xd and xsum.
int64_t RowBytes(int64_t cols) { return cols + cols / kSub * 8; }

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

int64_t Q4KPanelBytes(const WeightMatrix& w) {
  return (w.rows + kGroup - 1) / kGroup * (w.cols / kSuper) * WeightMatrix::kQ4KPanelBlockBytes;
}

void PackQ4KPanels(const WeightMatrix& w, void* out) {
  CHECK(w.format == WeightFormat::kQ4K && w.cols % kSuper == 0) << "q4_K panels of " << w.cols;
  const int64_t supers = w.cols / kSuper;
  const int64_t stride = supers * WeightMatrix::kQ4KPanelBlockBytes;
  uint8_t* panels = static_cast<uint8_t*>(out);
  std::memset(panels, 0, Q4KPanelBytes(w));
  for (int64_t r = 0; r < w.rows; ++r) {
    const uint8_t* row = reinterpret_cast<const uint8_t*>(w.RowPtr(r));
    const int64_t l = r % kGroup;
    uint8_t* panel = panels + r / kGroup * stride;
    for (int64_t s = 0; s < supers; ++s) {
      const uint8_t* src = row + s * WeightMatrix::kQ4KBlockBytes;
      uint8_t* block = panel + s * WeightMatrix::kQ4KPanelBlockBytes;
      std::memcpy(block + 2 * l, src, 2);                // d
      std::memcpy(block + kDminAt + 2 * l, src + 2, 2);  // dmin
      for (int j = 0; j < 8; ++j) {
        Q4KScaleMin(j, src + 4, block + kScAt + kGroup * j + l, block + kMinAt + kGroup * j + l);
        const uint8_t* chunk = src + 16 + j / 2 * kSub;
        uint8_t* lines = block + kLinesAt + 256 * j;
        for (int c = 0; c < kSub; ++c) {
          const uint8_t q = j % 2 == 0 ? chunk[c] & 0xF : chunk[c] >> 4;
          const int t = c / 8, e = c % 8;
          uint8_t& byte = lines[64 * t + 4 * l + e % 4];
          byte |= static_cast<uint8_t>(e < 4 ? q : q << 4);
        }
      }
    }
  }
}

KVRM_CPU_CLONES
void QuantizeActivationsQ4K(const float* x, int64_t n, int64_t ldx, int64_t k, int8_t* q, float* xd,
                            float* xsum) {
  const int64_t blocks = k / kSub;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t b = 0; b < blocks; ++b) {
      const float* v = x + i * ldx + b * kSub;
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
      if (!finite || amax == 0) {
        std::memset(out, 0, kSub);
        d = sum = finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      const float inv = 127.0f / amax;
      int32_t total = 0;
      for (int64_t c = 0; c < kSub; ++c) {
        out[c] = static_cast<int8_t>(std::nearbyint(std::clamp(v[c] * inv, -127.0f, 127.0f)));
        total += out[c];
      }
      d = amax / 127.0f;
      sum = d * static_cast<float>(total);
    }
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

}  // namespace kvrm
