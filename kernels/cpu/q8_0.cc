#include "kernels/cpu/q8_0.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/dtype.h"
#include "kernels/cpu/isa.h"

namespace kvrm {
namespace {

constexpr int64_t kBlock = WeightMatrix::kQ8Block;
// Bytes of int16 activation rows a q8_0 product quantizes at a time: a block stays in L2 while
// the panels stream by (as the bf16 panel kernel's converted rows).
constexpr int64_t kActBlockBytes = 128 * 1024;

// Bytes of one quantized activation row as the passes read it: its int16 values, its scale and
// its block sums.
int64_t RowBytes(int64_t cols) {
  return Q8PaddedCols(cols) * 2 + 4 + Q8PaddedCols(cols) / kBlock * 4;
}

}  // namespace

void QuantizeBlockQ8_0(const float* x, uint8_t* block) {
  float amax = 0;
  bool finite = true;
  for (int64_t j = 0; j < kBlock; ++j) {
    finite = finite && std::isfinite(x[j]);
    amax = std::max(amax, std::fabs(x[j]));
  }
  int8_t* q = reinterpret_cast<int8_t*>(block + 2);
  if (!finite) {
    const uint16_t nan = 0x7e00;
    std::memcpy(block, &nan, 2);
    std::memset(q, 0, kBlock);
    return;
  }
  const float d = amax / 127;
  const float id = d != 0 ? 1 / d : 0;
  const uint16_t h = FloatToF16(d);
  std::memcpy(block, &h, 2);
  for (int64_t j = 0; j < kBlock; ++j) {
    q[j] = static_cast<int8_t>(std::clamp(std::roundf(x[j] * id), -127.0f, 127.0f));
  }
}

void DequantizeBlockQ8_0(const uint8_t* block, float* y) {
  uint16_t h;
  std::memcpy(&h, block, 2);
  const float d = F16ToFloat(h);
  const int8_t* q = reinterpret_cast<const int8_t*>(block + 2);
  for (int64_t j = 0; j < kBlock; ++j) y[j] = q[j] * d;
}

void DequantizeRowQ8Affine(const uint8_t* blocks, int64_t n, float* y) {
  for (int64_t b = 0; b < n / kBlock; ++b) {
    const uint8_t* block = blocks + b * WeightMatrix::kQ8AffineBlockBytes;
    float s, o;
    std::memcpy(&s, block, 4);
    std::memcpy(&o, block + 4, 4);
    const int8_t* q = reinterpret_cast<const int8_t*>(block + 8);
    for (int64_t j = 0; j < kBlock; ++j) y[b * kBlock + j] = std::fma(s, q[j], o);
  }
}

void DequantizeRowQ8Halves(const uint8_t* blocks, int64_t n, float* y) {
  for (int64_t b = 0; b < n / kBlock; ++b) {
    const uint8_t* block = blocks + b * WeightMatrix::kQ8AffineBlockBytes;
    float s[2];
    std::memcpy(s, block, 8);
    const int8_t* q = reinterpret_cast<const int8_t*>(block + 8);
    for (int64_t j = 0; j < kBlock; ++j) y[b * kBlock + j] = s[j / 16] * q[j];
  }
}

float Mxfp4HalfScale(uint8_t e) {
  const uint32_t bits = (static_cast<uint32_t>(e) - 1) << 23;
  float d;
  std::memcpy(&d, &bits, 4);
  return d;
}

void DequantizeRowMxfp4(const uint8_t* blocks, int64_t n, float* y) {
  for (int64_t b = 0; b < n / kBlock; ++b) {
    const uint8_t* block = blocks + b * WeightMatrix::kMxfp4BlockBytes;
    const float d = std::ldexp(1.0f, static_cast<int>(block[0]) - 128);
    for (int64_t j = 0; j < 16; ++j) {
      y[b * kBlock + j] = kMxfp4Twice[block[1 + j] & 15] * d;
      y[b * kBlock + 16 + j] = kMxfp4Twice[block[1 + j] >> 4] * d;
    }
  }
}

void QuantizeRowQ8_0(const float* x, int64_t n, uint8_t* blocks) {
  for (int64_t b = 0; b < n / kBlock; ++b) {
    QuantizeBlockQ8_0(x + b * kBlock, blocks + b * WeightMatrix::kQ8BlockBytes);
  }
}

void DequantizeRowQ8_0(const uint8_t* blocks, int64_t n, float* y) {
  for (int64_t b = 0; b < n / kBlock; ++b) {
    DequantizeBlockQ8_0(blocks + b * WeightMatrix::kQ8BlockBytes, y + b * kBlock);
  }
}

KVRM_CPU_CLONES
void QuantizeActivationsQ8(const float* x, int64_t n, int64_t ldx, int64_t k, int64_t kp,
                           int16_t* q, float* scale, float* block_sums) {
  for (int64_t i = 0; i < n; ++i) {
    const float* row = x + i * ldx;
    int16_t* out = q + i * kp;
    float amax = 0;
    bool finite = true;
    for (int64_t c = 0; c < k; ++c) {
      // Not std::isfinite: the comparison form vectorises.
      finite &= std::fabs(row[c]) <= std::numeric_limits<float>::max();
      amax = std::max(amax, std::fabs(row[c]));
    }
    if (!finite || amax == 0) {
      std::memset(out, 0, kp * sizeof(int16_t));
      scale[i] = finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    const float inv = 32767.0f / amax;
    for (int64_t c = 0; c < k; ++c) {
      // |row[c] * inv| <= 32767 (+ one rounding), so the conversion cannot overflow int16.
      out[c] = static_cast<int16_t>(std::nearbyint(std::min(row[c] * inv, 32767.0f)));
    }
    std::fill(out + k, out + kp, int16_t{0});
    scale[i] = amax / 32767.0f;
  }
  if (block_sums == nullptr) return;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t b = 0; b < kp / kBlock; ++b) {
      int32_t sum = 0;
      for (int64_t c = 0; c < kBlock; ++c) sum += q[i * kp + b * kBlock + c];
      block_sums[i * (kp / kBlock) + b] = static_cast<float>(sum);
    }
  }
}

int64_t Q8ActivationBlockRows(int64_t cols) {
  constexpr int64_t kGroup = WeightMatrix::kPanelRows;
  return std::max<int64_t>(kGroup, kActBlockBytes / RowBytes(cols) / kGroup * kGroup);
}

int64_t Q8ScratchBytes(int64_t cols) {
  // Twice a block (the AVX-512 kernel regroups the rows by pass into a second copy). Never less
  // for more columns (a caller sizes one scratch by its widest matrix).
  return 2 * std::max(kActBlockBytes, WeightMatrix::kPanelRows * RowBytes(cols)) + 64;
}

}  // namespace kvrm
