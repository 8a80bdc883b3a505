// Element types of model weights and their conversions to float.
#ifndef KVRM_COMMON_DTYPE_H_
#define KVRM_COMMON_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace kvrm {

// kF8E4M3 and kF8E5M2 are KV cache element types only (--kv_dtype=fp8): weights stored as FP8
// are read through model/quantized_checkpoint.h, never held as a DType.
enum class DType : uint8_t { kF32, kF16, kBF16, kF8E4M3, kF8E5M2 };

constexpr size_t DTypeSize(DType t) {
  return t == DType::kF32 ? 4 : (t == DType::kF8E4M3 || t == DType::kF8E5M2) ? 1 : 2;
}

constexpr bool IsFp8(DType t) { return t == DType::kF8E4M3 || t == DType::kF8E5M2; }

// "f32", "f16", "bf16", "fp8_e4m3", "fp8_e5m2": the names used by flags, ModelInfo and
// make_model.
constexpr std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kF8E4M3:
      return "fp8_e4m3";
    case DType::kF8E5M2:
      return "fp8_e5m2";
  }
  return "?";
}

inline float Bf16ToFloat(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// Round to nearest even, NaN preserved (as PyTorch's conversion does).
inline uint16_t FloatToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

inline float F16ToFloat(uint16_t h) {
#if defined(__F16C__) || defined(__FLT16_MAX__)
  _Float16 v;
  std::memcpy(&v, &h, sizeof(v));
  return static_cast<float>(v);
#else
  const uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
#endif
}

inline uint16_t FloatToF16(float f) {
  _Float16 v = static_cast<_Float16>(f);  // round to nearest even
  uint16_t h;
  std::memcpy(&h, &v, sizeof(h));
  return h;
}

// FP8 (OCP 8-bit floating point, as PyTorch's float8_e4m3fn and float8_e5m2 and safetensors'
// F8_E4M3 / F8_E5M2 store them). E4M3 ("fn"): 4 exponent bits biased by 7, 3 mantissa bits, no
// infinities, S.1111.111 NaN; largest finite 448, smallest subnormal 2^-9. E5M2: IEEE-style, 5
// exponent bits biased by 15, 2 mantissa bits, infinities and NaNs; largest finite 57344.
inline float F8E4M3ToFloat(uint8_t b) {
  const uint32_t exp = (b >> 3) & 15, mant = b & 7;
  float v;
  if (exp == 0) {
    v = static_cast<float>(mant) * 0x1p-9f;  // subnormal: 2^-6 * mant / 8
  } else if (exp == 15 && mant == 7) {
    v = __builtin_nanf("");
  } else {
    uint32_t bits = ((exp + 127 - 7) << 23) | (mant << 20);
    std::memcpy(&v, &bits, sizeof(v));
  }
  return (b & 0x80) ? -v : v;
}

inline float F8E5M2ToFloat(uint8_t b) {
  // The top byte of an f16.
  return F16ToFloat(static_cast<uint16_t>(b) << 8);
}

namespace fp8_internal {

// A float to the nearest code of an 8-bit float of `mant_bits` mantissa bits and exponent bias
// `bias` (ties to even), saturating to `max_code` from `saturate_from` (the midpoint between
// the largest finite value and the next step) on, NaN to 0x7f. Branch-free (selects), so a loop
// of them vectorises: KV cache stores (kernels/cpu/attention.cc) run it per element. Called
// with constants, which fold.
inline uint8_t Encode(float f, uint32_t mant_bits, uint32_t bias, float saturate_from,
                      uint32_t max_code) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  const uint32_t sign = (bits >> 24) & 0x80u, abits = bits & 0x7fffffffu;
  float a;
  std::memcpy(&a, &abits, sizeof(a));
  // Normal: keep mant_bits of the 23 mantissa bits, rounding the rest to nearest even; a carry
  // moves the exponent up, as it should. Exponent and mantissa are one field: rebias it.
  const uint32_t drop = 23 - mant_bits;
  const uint32_t normal = ((abits + ((1u << (drop - 1)) - 1) + ((abits >> drop) & 1u)) >> drop) -
                          ((127u - bias) << mant_bits);
  // Subnormal steps of 2^(1 - bias - mant_bits): a / step (exact) plus 2^23 rounds to an
  // integer, to nearest even; 1 << mant_bits is the smallest normal's code.
  const uint32_t inv_step_bits = (127u + bias - 1 + mant_bits) << 23;
  const uint32_t min_normal_bits = (128u - bias) << 23;
  float inv_step, min_normal;
  std::memcpy(&inv_step, &inv_step_bits, sizeof(inv_step));
  std::memcpy(&min_normal, &min_normal_bits, sizeof(min_normal));
  const float m = a * inv_step + 0x1p23f;
  uint32_t mbits;
  std::memcpy(&mbits, &m, sizeof(mbits));
  uint32_t code = a < min_normal ? mbits - 0x4b000000u : normal;
  code = a < saturate_from ? code : max_code;
  code = abits > 0x7f800000u ? 0x7fu : code;
  return static_cast<uint8_t>(sign | code);
}

}  // namespace fp8_internal

// Round to nearest even, saturating at +-448 (what quantizers do: they clamp to the format's
// range before PyTorch's cast); NaN to 0x7f / 0xff. Branch-free.
inline uint8_t FloatToF8E4M3(float f) {
  return fp8_internal::Encode(f, 3, 7, 464.0f, 0x7e);  // 448 and all that rounds past it
}

// Round to nearest even, saturating at +-57344 (not to infinity: a KV cache element that
// overflowed would poison every score it enters); NaN stays NaN. Branch-free.
inline uint8_t FloatToF8E5M2(float f) {
  return fp8_internal::Encode(f, 2, 15, 61440.0f, 0x7b);  // 57344 and all that rounds past it
}

// The largest finite value of an FP8 format: what a calibrated scale maps a layer's amax to.
constexpr float Fp8MaxFinite(DType t) { return t == DType::kF8E5M2 ? 57344.0f : 448.0f; }

// An FP8 byte as the f16 whose value is the byte's times Fp8HalfUnit(dtype): E5M2 is the top
// byte of an f16; E4M3's exponent (bias 7) sits in an f16's (bias 15), 2^8 too small,
// subnormals included. What the CPU attention widens with one vcvtph2ps. Every finite code;
// E4M3's NaN (0x7f, what FloatToF8E4M3 makes of a NaN) reads as 480, a finite outlier, where an
// f32 or bf16 cache would carry the NaN on (a model whose keys are NaN is broken either way).
inline uint16_t Fp8AsHalf(DType t, uint8_t b) {
  return t == DType::kF8E5M2 ? static_cast<uint16_t>(b << 8)
                             : static_cast<uint16_t>(((b & 0x80) << 8) | ((b & 0x7f) << 7));
}
constexpr float Fp8HalfUnit(DType t) { return t == DType::kF8E5M2 ? 1.0f : 256.0f; }

// FP8 KV pool elements as types of their own (kernels/cpu/attention.*): one byte each, read as
// an f16 (Fp8AsHalf) and scaled by KvLayerView::KeyUnit() / ValueUnit().
enum class Fp8E4M3 : uint8_t {};
enum class Fp8E5M2 : uint8_t {};

}  // namespace kvrm

#endif  // KVRM_COMMON_DTYPE_H_
