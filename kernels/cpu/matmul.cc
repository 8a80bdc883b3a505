#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/logging.h"
#include "kernels/cpu/q4_k.h"
#include "kernels/cpu/q8_0.h"

namespace kvrm {

// Defined in matmul_{generic,avx2,avx512}.cc, each compiled with its own -m flags.
void MatMulRows_generic(const float*, int64_t, int64_t, const WeightMatrix&, int64_t, int64_t,
                        float*, int64_t, float*);
void MatMulRows_avx2(const float*, int64_t, int64_t, const WeightMatrix&, int64_t, int64_t,
                     float*, int64_t, float*);
void MatMulRows_avx512(const float*, int64_t, int64_t, const WeightMatrix&, int64_t, int64_t,
                       float*, int64_t, float*);
void MatMulRows_avx512_bf16(const float*, int64_t, int64_t, const WeightMatrix&, int64_t,
                            int64_t, float*, int64_t, float*);
int64_t MatMulScratchFloats_avx512_bf16(int64_t cols);

int64_t MatMulScratchFloats(int64_t cols) {
  // Enough for every path and format, so a caller may switch paths (tests and benchmarks do).
  return std::max({4 * cols + 16, MatMulScratchFloats_avx512_bf16(cols),
                   (Q8ScratchBytes(cols) + 3) / 4, (Q4KScratchBytes(cols) + 3) / 4});
}

void MatMulRows(CpuIsa isa, const float* x, int64_t n, int64_t ldx, const WeightMatrix& w,
                int64_t row_begin, int64_t row_end, float* y, int64_t ldy, float* scratch) {
  if (WeightMatrix::IsQuantized(w.panel_format)) {
    CHECK(w.panels != nullptr && row_begin % WeightMatrix::kPanelRows == 0)
        << "block panels from row " << row_begin;
  } else {
    CHECK(w.format == WeightFormat::kDense) << "a block-format matrix without its panels";
  }
  switch (isa) {
    case CpuIsa::kGeneric:
      return MatMulRows_generic(x, n, ldx, w, row_begin, row_end, y, ldy, scratch);
    case CpuIsa::kAvx2:
      return MatMulRows_avx2(x, n, ldx, w, row_begin, row_end, y, ldy, scratch);
    case CpuIsa::kAvx512:
      return MatMulRows_avx512(x, n, ldx, w, row_begin, row_end, y, ldy, scratch);
    case CpuIsa::kAvx512Bf16:
      return MatMulRows_avx512_bf16(x, n, ldx, w, row_begin, row_end, y, ldy, scratch);
  }
  LOG(FATAL) << "unsupported instruction set " << static_cast<int>(isa);
}

void MatMulShareBounds(int64_t rows, int thread, int num_threads, int64_t* begin, int64_t* end) {
  constexpr int64_t kGroup = WeightMatrix::kPanelRows;
  const int64_t groups = (rows + kGroup - 1) / kGroup;
  *begin = std::min(rows, groups * thread / num_threads * kGroup);
  *end = std::min(rows, groups * (thread + 1) / num_threads * kGroup);
}

void MatMulShare(CpuIsa isa, const float* x, int64_t n, int64_t ldx, const WeightMatrix& w,
                 float* y, int64_t ldy, int thread, int num_threads, float* scratch) {
  int64_t begin, end;
  MatMulShareBounds(w.rows, thread, num_threads, &begin, &end);
  if (begin < end) MatMulRows(isa, x, n, ldx, w, begin, end, y, ldy, scratch);
}

void MatMul(ThreadPool& pool, const float* x, int64_t n, int64_t ldx, const WeightMatrix& w,
            float* y, int64_t ldy, float* scratch) {
  const CpuIsa isa = ActiveCpuIsa();
  const int64_t per_thread = MatMulScratchFloats(w.cols);
  pool.RunOnAll([&](int t) {
    MatMulShare(isa, x, n, ldx, w, y, ldy, t, pool.num_threads(), scratch + t * per_thread);
  });
}

int64_t PanelBytes(const WeightMatrix& w) {
  CHECK(w.format == WeightFormat::kDense) << "dtype panels of a q8_0 matrix";
  return (w.rows + WeightMatrix::kPanelRows - 1) / WeightMatrix::kPanelRows * w.PanelStride() *
         static_cast<int64_t>(DTypeSize(w.dtype));
}

namespace {

// kPerLine columns of the group's 16 rows per line: 2 for bf16 (vdpbf16ps pairs), else 1.
template <typename Elem, int64_t kPerLine>
void PackPanelsOf(const WeightMatrix& w, Elem* out) {
  constexpr int64_t kGroup = WeightMatrix::kPanelRows;
  const int64_t stride = w.PanelStride();
  std::memset(out, 0, PanelBytes(w));
  for (int64_t r = 0; r < w.rows; ++r) {
    const Elem* row = reinterpret_cast<const Elem*>(w.RowPtr(r));
    Elem* lane = out + r / kGroup * stride + r % kGroup * kPerLine;
    for (int64_t c = 0; c < w.cols; ++c) {
      lane[c / kPerLine * kGroup * kPerLine + c % kPerLine] = row[c];
    }
  }
}

}  // namespace

void PackPanels(const WeightMatrix& w, void* out) {
  switch (w.dtype) {
    case DType::kF32: return PackPanelsOf<float, 1>(w, static_cast<float*>(out));
    case DType::kF16: return PackPanelsOf<uint16_t, 1>(w, static_cast<uint16_t*>(out));
    case DType::kBF16: return PackPanelsOf<uint16_t, 2>(w, static_cast<uint16_t*>(out));
    case DType::kF8E4M3:
    case DType::kF8E5M2:
      break;  // KV cache types only (FP8 weights load as q8_0 or bf16)
  }
  LOG(FATAL) << "no dense " << DTypeName(w.dtype) << " weights";
}

WeightFormat BlockPanelFormat(const WeightMatrix& w) {
  return w.format == WeightFormat::kDense ? WeightFormat::kQ8_0 : w.format;
}

int64_t BlockPanelBytes(const WeightMatrix& w, WeightFormat format) {
  if (format == WeightFormat::kDense) format = BlockPanelFormat(w);
  const int64_t groups = (w.rows + WeightMatrix::kPanelRows - 1) / WeightMatrix::kPanelRows;
  const int64_t blocks = (w.cols + WeightMatrix::BlockCols(format) - 1) /
                         WeightMatrix::BlockCols(format);
  return groups * blocks * WeightMatrix::PanelBlockSize(format);
}

namespace {

// MXFP4 rows into their panels (weight_matrix.h): each block's e at its row's byte, and line p's
// byte l the row's codes of columns 2p and 2p + 1.
void PackMxfp4Panels(const WeightMatrix& w, uint8_t* panels) {
  constexpr int64_t kGroup = WeightMatrix::kPanelRows, kBlock = WeightMatrix::kQ8Block;
  constexpr int64_t kTo = WeightMatrix::kMxfp4PanelBlockBytes;
  CHECK(w.cols % kBlock == 0) << "MXFP4 rows of " << w.cols;
  const int64_t blocks = w.cols / kBlock;
  for (int64_t r = 0; r < w.rows; ++r) {
    const uint8_t* src = reinterpret_cast<const uint8_t*>(w.RowPtr(r));
    const int64_t l = r % kGroup;
    uint8_t* panel = panels + r / kGroup * blocks * kTo;
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* from = src + b * WeightMatrix::kMxfp4BlockBytes;
      uint8_t* block = panel + b * kTo;
      block[l] = from[0];
      auto code = [&](int64_t c) { return c < 16 ? from[1 + c] & 15 : from[1 + c - 16] >> 4; };
      for (int64_t p = 0; p < kBlock / 2; ++p) {
        block[kGroup + p * kGroup + l] = static_cast<uint8_t>(code(2 * p) | code(2 * p + 1) << 4);
      }
    }
  }
}

}  // namespace

void PackQ8Panels(const WeightMatrix& w, void* out) {
  constexpr int64_t kGroup = WeightMatrix::kPanelRows, kBlock = WeightMatrix::kQ8Block;
  if (w.format == WeightFormat::kMxfp4) {
    std::memset(out, 0, BlockPanelBytes(w, WeightFormat::kMxfp4));
    return PackMxfp4Panels(w, static_cast<uint8_t*>(out));
  }
  // Per block: the row's scales (f16 d; or two f32, s and o for affine, s0 and s1 for halves),
  // then its q. Dense rows are quantized to q8_0 blocks first.
  const WeightFormat format = BlockPanelFormat(w);
  const bool two_scales = format != WeightFormat::kQ8_0;
  const int64_t scale_bytes = two_scales ? 4 : 2;  // one scale
  const int64_t head_bytes = WeightMatrix::DataBlockSize(format) - kBlock;
  const int64_t from_bytes = WeightMatrix::DataBlockSize(format);
  const int64_t to_bytes = WeightMatrix::PanelBlockSize(format);
  const int64_t blocks = w.Q8Blocks();
  CHECK(w.format == WeightFormat::kDense || w.cols % kBlock == 0) << "q8 rows of " << w.cols;
  uint8_t* panels = static_cast<uint8_t*>(out);
  std::memset(panels, 0, BlockPanelBytes(w, format));
  std::vector<float> row(blocks * kBlock, 0.0f);
  std::vector<uint8_t> quantized(blocks * WeightMatrix::kQ8BlockBytes);
  for (int64_t r = 0; r < w.rows; ++r) {
    const uint8_t* src;
    if (w.format != WeightFormat::kDense) {
      src = reinterpret_cast<const uint8_t*>(w.RowPtr(r));
    } else {
      WeightRowToFloat(w, r, row.data());  // the padding past cols stays zero
      QuantizeRowQ8_0(row.data(), blocks * kBlock, quantized.data());
      src = quantized.data();
    }
    const int64_t l = r % kGroup;
    uint8_t* panel = panels + r / kGroup * blocks * to_bytes;
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* from = src + b * from_bytes;
      uint8_t* block = panel + b * to_bytes;
      std::memcpy(block + scale_bytes * l, from, scale_bytes);  // d, s or s0
      if (two_scales) std::memcpy(block + 4 * kGroup + 4 * l, from + 4, 4);  // o or s1
      uint8_t* lines = block + WeightMatrix::Q8LinesAt(format);
      for (int64_t c = 0; c < kBlock; ++c) {
        lines[c / 2 * 2 * kGroup + 2 * l + c % 2] = from[head_bytes + c];
      }
    }
  }
}

namespace {

// Puts q, column c of a 32-column sub-block of row l (of a panel's 16), into the sub-block's
// four 64-byte lines as q4_k.h lays them out: line c / 8, byte 4 l + c % 4, the low nibble for
// c % 8 < 4 and the high one for the rest.
void PutLineNibble(uint8_t* lines, int64_t l, int c, uint8_t q) {
  const int t = c / 8, e = c % 8;
  lines[64 * t + 4 * l + e % 4] |= static_cast<uint8_t>(e < 4 ? q : q << 4);
}

}  // namespace

void PackQ4KPanels(const WeightMatrix& w, void* out) {
  constexpr int64_t kGroup = WeightMatrix::kPanelRows, kSub = WeightMatrix::kQ8Block;
  // Where a panel super-block's parts start (q4_k.h): dmin, scales, mins, lines.
  constexpr int64_t kDminAt = 32, kScAt = 64, kMinAt = 192, kLinesAt = 320;
  CHECK((w.format == WeightFormat::kQ4K || w.format == WeightFormat::kDense) &&
        w.cols % WeightMatrix::kQ4KBlock == 0)
      << "q4_K panels of " << w.cols << " columns";
  const int64_t supers = w.cols / WeightMatrix::kQ4KBlock;
  const int64_t stride = supers * WeightMatrix::kQ4KPanelBlockBytes;
  uint8_t* panels = static_cast<uint8_t*>(out);
  std::memset(panels, 0, BlockPanelBytes(w, WeightFormat::kQ4K));
  const bool dense = w.format == WeightFormat::kDense;  // quantized row by row first
  std::vector<float> values(dense ? w.cols : 0);
  std::vector<uint8_t> quantized(dense ? supers * WeightMatrix::kQ4KBlockBytes : 0);
  for (int64_t r = 0; r < w.rows; ++r) {
    const uint8_t* row = reinterpret_cast<const uint8_t*>(w.RowPtr(r));
    if (dense) {
      WeightRowToFloat(w, r, values.data());
      QuantizeRowQ4K(values.data(), w.cols, quantized.data());
      row = quantized.data();
    }
    const int64_t l = r % kGroup;
    uint8_t* panel = panels + r / kGroup * stride;
    for (int64_t s = 0; s < supers; ++s) {
      const uint8_t* src = row + s * WeightMatrix::kQ4KBlockBytes;
      uint8_t* block = panel + s * WeightMatrix::kQ4KPanelBlockBytes;
      std::memcpy(block + 2 * l, src, 2);                // d
      std::memcpy(block + kDminAt + 2 * l, src + 2, 2);  // dmin
      for (int j = 0; j < 8; ++j) {
        Q4KScaleMin(j, src + 4, block + kScAt + kGroup * j + l, block + kMinAt + kGroup * j + l);
        const uint8_t* chunk = src + 16 + j / 2 * kSub;  // sub-blocks 2c, 2c + 1: low, high
        uint8_t* lines = block + kLinesAt + 256 * j;
        for (int c = 0; c < kSub; ++c) {
          PutLineNibble(lines, l, c, j % 2 == 0 ? chunk[c] & 0xF : chunk[c] >> 4);
        }
      }
    }
  }
}

void PackQ4GPanels(const WeightMatrix& w, void* out) {
  constexpr int64_t kGroup = WeightMatrix::kPanelRows, kSub = WeightMatrix::kQ8Block;
  constexpr int64_t kZeroAt = 256, kLinesAt = 384;  // q4_k.h
  CHECK(w.format == WeightFormat::kQ4G && w.cols % WeightMatrix::kQ4KBlock == 0)
      << "q4 group panels of " << w.cols << " columns";
  const int64_t supers = w.cols / WeightMatrix::kQ4KBlock;
  const int64_t stride = supers * WeightMatrix::kQ4GPanelBlockBytes;
  uint8_t* panels = static_cast<uint8_t*>(out);
  std::memset(panels, 0, BlockPanelBytes(w, WeightFormat::kQ4G));
  for (int64_t r = 0; r < w.rows; ++r) {
    const uint8_t* row = reinterpret_cast<const uint8_t*>(w.RowPtr(r));
    const int64_t l = r % kGroup;
    uint8_t* panel = panels + r / kGroup * stride;
    for (int64_t s = 0; s < supers; ++s) {
      const uint8_t* src = row + s * WeightMatrix::kQ4GBlockBytes;
      uint8_t* block = panel + s * WeightMatrix::kQ4GPanelBlockBytes;
      for (int j = 0; j < 8; ++j) {
        std::memcpy(block + 32 * j + 2 * l, src + 2 * j, 2);  // s
        block[kZeroAt + kGroup * j + l] = src[16 + j];        // z
        const uint8_t* nibbles = src + 24 + 16 * j;
        uint8_t* lines = block + kLinesAt + 256 * j;
        for (int c = 0; c < kSub; ++c) {
          PutLineNibble(lines, l, c, c < 16 ? nibbles[c] & 0xF : nibbles[c - 16] >> 4);
        }
      }
    }
  }
}

void PackQ6KPanels(const WeightMatrix& w, void* out) {
  constexpr int64_t kGroup = WeightMatrix::kPanelRows, kSub = WeightMatrix::kQ8Block;
  CHECK(w.format == WeightFormat::kQ6K && w.cols % WeightMatrix::kQ4KBlock == 0)
      << "q6_K panels of " << w.cols << " columns";
  const int64_t supers = w.cols / WeightMatrix::kQ4KBlock;
  const int64_t stride = supers * WeightMatrix::kQ6KPanelBlockBytes;
  uint8_t* panels = static_cast<uint8_t*>(out);
  std::memset(panels, 0, BlockPanelBytes(w, WeightFormat::kQ6K));
  float scales[16];
  uint8_t q[WeightMatrix::kQ4KBlock];
  for (int64_t r = 0; r < w.rows; ++r) {
    const uint8_t* row = reinterpret_cast<const uint8_t*>(w.RowPtr(r));
    const int64_t l = r % kGroup;
    uint8_t* panel = panels + r / kGroup * stride;
    for (int64_t s = 0; s < supers; ++s) {
      const uint8_t* src = row + s * WeightMatrix::kQ6KBlockBytes;
      uint8_t* block = panel + s * WeightMatrix::kQ6KPanelBlockBytes;
      DecodeBlockQ6K(src, scales, q);
      std::memcpy(block + 2 * l, src + 208, 2);  // d
      for (int g = 0; g < 16; ++g) block[64 + kGroup * g + l] = src[192 + g];  // int8 scales
      for (int j = 0; j < 8; ++j) {
        uint8_t* lines = block + 320 + 384 * j;
        for (int c = 0; c < kSub; ++c) {
          const int v = q[j * kSub + c], t = c / 8, e = c % 8, half = e / 4;
          const int64_t at = 4 * l + e % 4;
          lines[64 * t + at] |= static_cast<uint8_t>((v & 0xF) << (4 * half));
          lines[256 + 64 * (t / 2) + at] |= static_cast<uint8_t>((v >> 4) << (2 * (2 * (t % 2) + half)));
        }
      }
    }
  }
}

PanelCopy::PanelCopy(const WeightMatrix& w, WeightFormat format) {
  const bool blocks = WeightMatrix::IsQuantized(format);
  CHECK(!blocks || format == BlockPanelFormat(w) ||
        (format == WeightFormat::kQ4K && w.format == WeightFormat::kDense))
      << "panels of another format than the data's";
  bytes_ = blocks ? BlockPanelBytes(w, format) : PanelBytes(w);
  memory_.reset(new uint8_t[bytes_ + 64]);  // filled below
  data_ = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(memory_.get()) + 63) / 64 * 64);
  if (format == WeightFormat::kQ4K) {
    PackQ4KPanels(w, data_);
  } else if (format == WeightFormat::kQ6K) {
    PackQ6KPanels(w, data_);
  } else if (format == WeightFormat::kQ4G) {
    PackQ4GPanels(w, data_);
  } else if (blocks) {
    PackQ8Panels(w, data_);
  } else {
    PackPanels(w, data_);
  }
}

void WeightRowToFloat(const WeightMatrix& w, int64_t r, float* out) {
  const char* row = w.RowPtr(r);
  if (w.format == WeightFormat::kQ8_0) {
    return DequantizeRowQ8_0(reinterpret_cast<const uint8_t*>(row), w.cols, out);
  }
  if (w.format == WeightFormat::kQ8Affine) {
    return DequantizeRowQ8Affine(reinterpret_cast<const uint8_t*>(row), w.cols, out);
  }
  if (w.format == WeightFormat::kQ8Halves) {
    return DequantizeRowQ8Halves(reinterpret_cast<const uint8_t*>(row), w.cols, out);
  }
  if (w.format == WeightFormat::kMxfp4) {
    return DequantizeRowMxfp4(reinterpret_cast<const uint8_t*>(row), w.cols, out);
  }
  if (w.format == WeightFormat::kQ4K) {
    return DequantizeRowQ4K(reinterpret_cast<const uint8_t*>(row), w.cols, out);
  }
  if (w.format == WeightFormat::kQ6K) {
    return DequantizeRowQ6K(reinterpret_cast<const uint8_t*>(row), w.cols, out);
  }
  if (w.format == WeightFormat::kQ4G) {
    if (w.input_order == nullptr) {
      return DequantizeRowQ4G(reinterpret_cast<const uint8_t*>(row), w.cols, out);
    }
    std::vector<float> stored(w.cols);  // (act-order: a load-time and reference path)
    DequantizeRowQ4G(reinterpret_cast<const uint8_t*>(row), w.cols, stored.data());
    for (int64_t c = 0; c < w.cols; ++c) out[w.input_order[c]] = stored[c];
    return;
  }
  switch (w.dtype) {
    case DType::kF32:
      std::memcpy(out, row, w.cols * sizeof(float));
      return;
    case DType::kF16:
      for (int64_t i = 0; i < w.cols; ++i) {
        out[i] = F16ToFloat(reinterpret_cast<const uint16_t*>(row)[i]);
      }
      return;
    case DType::kBF16:
      for (int64_t i = 0; i < w.cols; ++i) {
        out[i] = Bf16ToFloat(reinterpret_cast<const uint16_t*>(row)[i]);
      }
      return;
    case DType::kF8E4M3:
    case DType::kF8E5M2:
      break;  // KV cache types only
  }
  LOG(FATAL) << "no dense " << DTypeName(w.dtype) << " weights";
}

}  // namespace kvrm
