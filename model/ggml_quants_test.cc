// model/gguf_quants against ggml itself: testdata/ggml_quants/<type>.bin hold inputs, the blocks
// llama.cpp's reference quantize_row_<type>_ref made of them and the floats its
// dequantize_row_<type> gave back (tools/gguf/quant_vectors writes them from llama.cpp's
// ggml-quants.c). Dequantization must give ggml's floats bit for bit, and quantization ggml's
// blocks byte for byte. The inputs cover 16 regimes:
// unit, small, one-signed, zero, constant, outliers, below f16's normal range, large, sparse,
// integers, rounding ties, weight-like. mxfp4 (gpt-oss's experts) as well.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/json.h"
#include "gtest/gtest.h"
#include "kernels/cpu/weight_matrix.h"
#include "model/gguf.h"
#include "model/gguf_quants.h"

namespace kvrm {
namespace {

struct Vectors {
  GgmlType type{};
  int64_t n = 0;
  std::vector<float> x, y;
  std::vector<std::byte> blocks;
};

Vectors Load(const std::string& name) {
  const absl::StatusOr<std::string> file =
      ReadFileToString("model/testdata/ggml_quants/" + name + ".bin");
  EXPECT_TRUE(file.ok()) << file.status();
  const std::string s = file.ok() ? *file : "";
  Vectors v;
  EXPECT_GE(s.size(), 12u) << name;
  if (s.size() < 12 || s.compare(0, 4, "KVQV") != 0) return v;
  uint32_t id = 0, n = 0;
  std::memcpy(&id, s.data() + 4, 4);
  std::memcpy(&n, s.data() + 8, 4);
  const GgmlTypeTraits* t = FindGgmlType(id);
  EXPECT_NE(t, nullptr) << name;
  if (t == nullptr) return v;
  v.type = t->type;
  v.n = n;
  const size_t bytes = static_cast<size_t>(n / t->block_elems * t->block_bytes);
  EXPECT_EQ(s.size(), 12 + 8 * size_t{n} + bytes) << name;
  if (s.size() != 12 + 8 * size_t{n} + bytes) return v;
  v.x.resize(n);
  v.y.resize(n);
  v.blocks.resize(bytes);
  std::memcpy(v.x.data(), s.data() + 12, 4 * size_t{n});
  std::memcpy(v.blocks.data(), s.data() + 12 + 4 * size_t{n}, bytes);
  std::memcpy(v.y.data(), s.data() + 12 + 4 * size_t{n} + bytes, 4 * size_t{n});
  return v;
}

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

class GgmlQuantsTest : public testing::TestWithParam<std::string> {};

TEST_P(GgmlQuantsTest, DequantizesGgmlsBlocksToGgmlsFloats) {
  const Vectors v = Load(GetParam());
  ASSERT_EQ(static_cast<int64_t>(v.x.size()), v.n);
  ASSERT_GT(v.n, 0);
  std::vector<float> got(v.n);
  DequantizeRow(v.type, v.blocks.data(), v.n, got.data());
  int wrong = 0;
  for (int64_t i = 0; i < v.n; ++i) {
    if (Bits(got[i]) != Bits(v.y[i]) && ++wrong <= 5) {
      ADD_FAILURE() << GetParam() << " element " << i << ": ggml " << v.y[i] << ", here " << got[i];
    }
  }
  EXPECT_EQ(wrong, 0);
}

// The blocks ggml's reference quantization makes of the same inputs, byte for byte.
TEST_P(GgmlQuantsTest, QuantizesAsGgmlsReference) {
  const Vectors v = Load(GetParam());
  ASSERT_GT(v.n, 0);
  std::vector<std::byte> got(v.blocks.size());
  QuantizeRow(v.type, v.x.data(), v.n, got.data());
  const GgmlTypeTraits& t = GgmlTraits(v.type);
  int wrong = 0;
  for (size_t b = 0; b * t.block_bytes < got.size(); ++b) {
    if (std::memcmp(got.data() + b * t.block_bytes, v.blocks.data() + b * t.block_bytes,
                    t.block_bytes) != 0 &&
        ++wrong <= 5) {
      ADD_FAILURE() << GetParam() << " block " << b << " (elements from " << b * t.block_elems
                    << ") differs from ggml's";
    }
  }
  EXPECT_EQ(wrong, 0);
}

// The block formats the loader keeps a type in (GgufLoadOptions::as_q8): the type's own bytes
// (StoredBlockFormat) or the 8-bit blocks ToExact8Bit makes (Exact8BitFormat), read back by the
// kernels' WeightRowToFloat, hold ggml's floats bit for bit.
TEST_P(GgmlQuantsTest, KernelFormatsHoldGgmlsFloats) {
  const Vectors v = Load(GetParam());
  ASSERT_GT(v.n, 0);
  const int64_t cols = 256, rows = v.n / cols;  // rows of whole K-quant super-blocks
  const WeightFormat stored = StoredBlockFormat(v.type);
  const WeightFormat exact = Exact8BitFormat(v.type);
  ASSERT_TRUE(stored != WeightFormat::kDense || exact != WeightFormat::kDense) << GetParam();
  const GgmlTypeTraits& t = GgmlTraits(v.type);
  const int64_t file_row = cols / t.block_elems * t.block_bytes;
  for (const WeightFormat format : {stored, exact}) {
    if (format == WeightFormat::kDense) continue;
    WeightMatrix m{DType::kF32, nullptr, rows, cols, cols, nullptr, format};
    std::vector<std::byte> bytes(m.DataBytes(cols) * rows);
    if (format == stored) {
      ASSERT_EQ(m.DataBytes(cols), file_row);
      bytes = v.blocks;
    } else {
      for (int64_t r = 0; r < rows; ++r) {
        ASSERT_TRUE(ToExact8Bit(v.type, v.blocks.data() + r * file_row, cols,
                                bytes.data() + r * m.DataBytes(cols)));
      }
    }
    m.data = bytes.data();
    std::vector<float> row(cols);
    int wrong = 0;
    for (int64_t r = 0; r < rows; ++r) {
      WeightRowToFloat(m, r, row.data());
      for (int64_t c = 0; c < cols; ++c) {
        if (Bits(row[c]) != Bits(v.y[r * cols + c]) && ++wrong <= 5) {
          ADD_FAILURE() << GetParam() << (format == stored ? " as stored" : " as 8-bit blocks")
                        << " element " << r * cols + c << ": ggml " << v.y[r * cols + c]
                        << ", here " << row[c];
        }
      }
    }
    EXPECT_EQ(wrong, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Ggml, GgmlQuantsTest,
                         testing::Values("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_K", "q5_K",
                                         "q6_K", "mxfp4"));

}  // namespace
}  // namespace kvrm
