// LoadQuantizedLinear on hand-packed tensors: the words below are the ones the reference tools'
// pack loops produce (AutoAWQ's WQLinear_GEMM.from_linear, AutoGPTQ's QuantLinear.pack,
// compressed-tensors' pack_to_int32), worked out bit by bit, so the bit layouts are held to the
// tools rather than to kvrm's own writer (tools/modelgen/quantized_writer.h, which
// tests/quantized_checkpoint_test.cc holds to this loader on whole models).
#include "model/quantized_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/matmul.h"
#include "model/safetensors_writer.h"

namespace kvrm {
namespace {

using ::testing::HasSubstr;

template <typename T>
std::vector<std::byte> Bytes(const std::vector<T>& v) {
  std::vector<std::byte> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

std::vector<std::byte> F16s(const std::vector<float>& v) {
  std::vector<uint16_t> h;
  for (float x : v) h.push_back(FloatToF16(x));
  return Bytes(h);
}

struct Tensor {
  std::string name;
  std::optional<StorageType> type;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<std::byte> data;
};

Tensor I32(const std::string& name, std::vector<int64_t> shape, const std::vector<uint32_t>& v) {
  return {name, StorageType::kI32, DType::kF32, std::move(shape), Bytes(v)};
}

// A directory holding `tensors` as model.safetensors, opened.
std::unique_ptr<SafetensorsSet> Files(const std::string& name, const std::vector<Tensor>& tensors) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/qc_", name);
  std::filesystem::create_directories(dir);
  std::vector<TensorToWrite> write;
  for (const Tensor& t : tensors) write.push_back({t.name, t.dtype, t.shape, t.data, t.type});
  CHECK_OK(WriteSafetensors(dir + "/model.safetensors", write));
  auto files = SafetensorsSet::OpenDirectory(dir);
  CHECK_OK(files.status());
  return *std::move(files);
}

CheckpointQuantization Scheme(const std::string& method, int bits, int group, bool zero_point) {
  CheckpointQuantization q;
  q.method = method;
  q.bits = bits;
  q.group_size = group;
  q.zero_point = zero_point;
  return q;
}

// Every value of the loaded matrix against `expected(n, k)`, exactly.
template <typename F>
void ExpectValues(const WeightMatrix& m, F expected) {
  std::vector<float> row(m.cols);
  for (int64_t n = 0; n < m.rows; ++n) {
    WeightRowToFloat(m, n, row.data());
    for (int64_t k = 0; k < m.cols; ++k) {
      ASSERT_EQ(row[k], expected(n, k)) << "[" << n << "][" << k << "]";
    }
  }
}

// AutoAWQ packs q = 1..8 of output features 0..7 as 0x86427531 (nibble i: feature
// [0, 2, 4, 6, 1, 3, 5, 7][i]); zeros alike; scales [groups][N] f16.
TEST(QuantizedCheckpointTest, AwqGemmWordsUnpackInAutoAwqsOrder) {
  std::vector<float> scales;
  for (int n = 0; n < 8; ++n) scales.push_back(0.5f * (n + 1));
  const std::vector<uint32_t> zeros = {0x33333333u};
  auto files = Files("awq", {I32("l.qweight", {32, 1}, std::vector<uint32_t>(32, 0x86427531u)),
                             I32("l.qzeros", {1, 1}, zeros),
                             {"l.scales", std::nullopt, DType::kF16, {1, 8}, F16s(scales)}});
  std::vector<std::vector<std::byte>> converted;
  auto m = LoadQuantizedLinear(*files, Scheme("awq", 4, 32, true), "l", 8, 32, {}, &converted);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->format, WeightFormat::kQ8_0);
  ExpectValues(*m, [&](int64_t n, int64_t) { return scales[n] * static_cast<float>(n + 1 - 3); });
}

// AutoGPTQ packs q = 1..8 of input features 0..7 of one output feature as 0x87654321, and a
// symmetric 4-bit zero of 8 as 7 per nibble (format gptq, v1) or 8 (gptq_v2).
TEST(QuantizedCheckpointTest, GptqWordsUnpackAlongTheInputFeatures) {
  for (const bool v2 : {false, true}) {
    SCOPED_TRACE(v2 ? "gptq_v2" : "gptq");
    std::vector<float> scales;
    for (int n = 0; n < 8; ++n) scales.push_back(0.25f * (n + 1));
    const std::vector<uint32_t> zeros = {v2 ? 0x88888888u : 0x77777777u};
    auto files = Files(v2 ? "gptq2" : "gptq",
                       {I32("l.qweight", {4, 8}, std::vector<uint32_t>(32, 0x87654321u)),
                        I32("l.qzeros", {1, 1}, zeros),
                        {"l.scales", std::nullopt, DType::kF16, {1, 8}, F16s(scales)},
                        I32("l.g_idx", {32}, std::vector<uint32_t>(32, 0))});
    CheckpointQuantization q = Scheme("gptq", 4, 32, false);
    q.gptq_v1_zeros = !v2;
    std::vector<std::vector<std::byte>> converted;
    auto m = LoadQuantizedLinear(*files, q, "l", 8, 32, {}, &converted);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->format, WeightFormat::kQ8_0);
    ExpectValues(
        *m, [&](int64_t n, int64_t k) { return scales[n] * static_cast<float>(k % 8 + 1 - 8); });
  }
}

// 8-bit GPTQ: four input features a word (bytes from the low end); a symmetric zero of 128
// makes q = 0 the int8 -128, which q8_0 blocks hold; an asymmetric zero puts q - z past int8,
// and the matrix becomes q8 affine blocks, still exactly.
TEST(QuantizedCheckpointTest, GptqEightBitsKeepMinus128AndGoAffineWhenAsymmetric) {
  const std::vector<float> scales = {0.5f, 0.25f, 2.0f, 1.0f};
  const int q_of[4] = {0x00, 0x01, 0x80, 0xFF};
  for (const bool sym : {true, false}) {
    SCOPED_TRACE(sym ? "sym" : "asym");
    const uint32_t zero = sym ? 127 : 4;  // stored less one: 128, or 5
    const std::vector<uint32_t> zeros = {zero | zero << 8 | zero << 16 | zero << 24};
    auto files = Files(sym ? "gptq8s" : "gptq8a",
                       {I32("l.qweight", {8, 4}, std::vector<uint32_t>(32, 0xFF800100u)),
                        I32("l.qzeros", {1, 1}, zeros),
                        {"l.scales", std::nullopt, DType::kF16, {1, 4}, F16s(scales)},
                        I32("l.g_idx", {32}, std::vector<uint32_t>(32, 0))});
    std::vector<std::vector<std::byte>> converted;
    auto m = LoadQuantizedLinear(*files, Scheme("gptq", 8, -1, !sym), "l", 4, 32, {}, &converted);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->format, sym ? WeightFormat::kQ8_0 : WeightFormat::kQ8Affine);
    ExpectValues(*m, [&](int64_t n, int64_t k) {
      return scales[n] * static_cast<float>(q_of[k % 4] - static_cast<int>(zero + 1));
    });
  }
}

// compressed-tensors stores q + 8 (q signed) contiguously along the input features: q = -8..-1
// is 0x76543210. Scales [N][groups] in the model's dtype (bf16 here); an asymmetric zero point
// [N / 8][groups] packed along the output features with the same offset; weight_shape I64.
TEST(QuantizedCheckpointTest, CompressedTensorsPackQuantizedWords) {
  std::vector<uint16_t> scales;
  for (int n = 0; n < 8; ++n) scales.push_back(FloatToBf16(0.125f * (n + 1)));
  const std::vector<int64_t> shape = {8, 32};
  for (const bool asym : {false, true}) {
    SCOPED_TRACE(asym ? "asymmetric" : "symmetric");
    std::vector<Tensor> tensors = {
        I32("l.weight_packed", {8, 4}, std::vector<uint32_t>(32, 0x76543210u)),
        {"l.weight_scale", std::nullopt, DType::kBF16, {8, 1}, Bytes(scales)},
        {"l.weight_shape", StorageType::kI64, DType::kF32, {2}, Bytes(shape)}};
    // Zero points 8 + n, stored as themselves (z + 8 with z = n).
    if (asym) tensors.push_back(I32("l.weight_zero_point", {1, 1}, {0xFEDCBA98u}));
    auto files = Files(asym ? "cta" : "cts", tensors);
    std::vector<std::vector<std::byte>> converted;
    auto m = LoadQuantizedLinear(*files, Scheme("compressed-tensors", 4, -1, asym), "l", 8, 32, {},
                                 &converted);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->format, WeightFormat::kQ8_0);  // bf16 scales of this size are f16s too
    ExpectValues(*m, [&](int64_t n, int64_t k) {
      return Bf16ToFloat(scales[n]) * static_cast<float>(k % 8 - 8 - (asym ? n : 0));
    });
  }
}

// Act-order groups (g_idx not k / group_size) put two groups in one block of 32: the values,
// exact in f32, are quantized again to q8_0 (within about half a step, amax / 254), or
// with as_q8 off rounded to bf16; the stats say so.
TEST(QuantizedCheckpointTest, ActOrderGroupsAreRequantized) {
  std::vector<uint32_t> g_idx;
  for (int k = 0; k < 32; ++k) g_idx.push_back(k % 2);
  std::vector<float> scales;  // [2][8]
  for (int g = 0; g < 2; ++g) {
    for (int n = 0; n < 8; ++n) scales.push_back(g == 0 ? 0.5f + 0.125f * n : 0.03125f * (n + 3));
  }
  auto files = Files("actorder", {I32("l.qweight", {4, 8}, std::vector<uint32_t>(32, 0x87654321u)),
                                  I32("l.qzeros", {2, 1}, {0x77777777u, 0x77777777u}),
                                  {"l.scales", std::nullopt, DType::kF16, {2, 8}, F16s(scales)},
                                  I32("l.g_idx", {32}, g_idx)});
  CheckpointQuantization q = Scheme("gptq", 4, 16, false);
  q.act_order = true;
  auto exact = [&](int64_t n, int64_t k) {
    return scales[(k % 2) * 8 + n] * static_cast<float>(k % 8 + 1 - 8);
  };
  for (const bool as_q8 : {true, false}) {
    SCOPED_TRACE(as_q8 ? "as_q8" : "bf16");
    QuantizedLoadOptions options;
    options.as_q8 = as_q8;
    QuantizedLoadStats stats;
    std::vector<std::vector<std::byte>> converted;
    auto m = LoadQuantizedLinear(*files, q, "l", 8, 32, options, &converted, &stats);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(stats.exact, 0);
    EXPECT_EQ(stats.requantized, 1);
    EXPECT_EQ(m->format, as_q8 ? WeightFormat::kQ8_0 : WeightFormat::kDense);
    std::vector<float> row(32);
    for (int64_t n = 0; n < 8; ++n) {
      WeightRowToFloat(*m, n, row.data());
      float amax = 0;
      for (int64_t k = 0; k < 32; ++k) amax = std::max(amax, std::abs(exact(n, k)));
      for (int64_t k = 0; k < 32; ++k) {
        const float want = exact(n, k);
        if (as_q8) {
          // Half a step of d = amax / 127, plus d's own rounding to f16 times |q| <= 127.
          EXPECT_NEAR(row[k], want, amax / 127 * (0.5 + 127 * 0x1p-11)) << n << " " << k;
        } else {
          EXPECT_EQ(row[k], Bf16ToFloat(FloatToBf16(want))) << n << " " << k;
        }
      }
    }
  }
}

// Malformed tensors are refused naming the tensor: a wrong dtype, a wrong shape, a g_idx past
// the groups, a weight_shape that is not the config's.
TEST(QuantizedCheckpointTest, MalformedTensorsAreNamed) {
  const std::vector<float> scales(8, 1.0f);
  std::vector<std::vector<std::byte>> converted;
  {
    auto files = Files(
        "bad_dtype",
        {{"l.qweight", std::nullopt, DType::kF32, {32, 1}, Bytes(std::vector<float>(32, 1.0f))},
         I32("l.qzeros", {1, 1}, {0}),
         {"l.scales", std::nullopt, DType::kF16, {1, 8}, F16s(scales)}});
    auto m = LoadQuantizedLinear(*files, Scheme("awq", 4, 32, true), "l", 8, 32, {}, &converted);
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(m.status().message(), HasSubstr("\"l.qweight\" has dtype F32 (I32 expected)"));
  }
  {
    auto files =
        Files("bad_shape", {I32("l.qweight", {32, 1}, std::vector<uint32_t>(32, 0)),
                            I32("l.qzeros", {1, 1}, {0}),
                            {"l.scales", std::nullopt, DType::kF16, {2, 4}, F16s(scales)}});
    auto m = LoadQuantizedLinear(*files, Scheme("awq", 4, 32, true), "l", 8, 32, {}, &converted);
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(m.status().message(), HasSubstr("\"l.scales\" has shape [2, 4], expected [1, 8]"));
  }
  {
    std::vector<uint32_t> g_idx(32, 0);
    g_idx[17] = 1;  // one group only (group_size 32)
    auto files = Files("bad_gidx", {I32("l.qweight", {4, 8}, std::vector<uint32_t>(32, 0)),
                                    I32("l.qzeros", {1, 1}, {0}),
                                    {"l.scales", std::nullopt, DType::kF16, {1, 8}, F16s(scales)},
                                    I32("l.g_idx", {32}, g_idx)});
    auto m = LoadQuantizedLinear(*files, Scheme("gptq", 4, 32, false), "l", 8, 32, {}, &converted);
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(m.status().message(), HasSubstr("\"l.g_idx\" [17] = 1 is not a group (0 to 0)"));
  }
  {
    const std::vector<int64_t> shape = {32, 8};
    auto files = Files("bad_wshape",
                       {I32("l.weight_packed", {8, 4}, std::vector<uint32_t>(32, 0)),
                        {"l.weight_scale", std::nullopt, DType::kF16, {8, 1}, F16s(scales)},
                        {"l.weight_shape", StorageType::kI64, DType::kF32, {2}, Bytes(shape)}});
    auto m = LoadQuantizedLinear(*files, Scheme("compressed-tensors", 4, -1, false), "l", 8, 32, {},
                                 &converted);
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(m.status().message(),
                HasSubstr("\"l.weight_shape\" is [32, 8], the config needs [8, 32]"));
  }
  {  // out_features that a word of AWQ's does not pack
    auto files = Files("bad_n", {I32("l.qweight", {32, 1}, std::vector<uint32_t>(32, 0))});
    auto m = LoadQuantizedLinear(*files, Scheme("awq", 4, 32, true), "l", 12, 32, {}, &converted);
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(m.status().message(), HasSubstr("out_features (12) is not a multiple of the 8"));
  }
}

CheckpointQuantization Unpacked(bool fp8, int block_rows, int group) {
  CheckpointQuantization q = Scheme(fp8 ? "fp8" : "compressed-tensors", 8, group, false);
  q.unpacked = true;
  q.fp8 = fp8;
  q.block_rows = block_rows;
  return q;
}

Tensor U8s(const std::string& name, StorageType type, std::vector<int64_t> shape,
           const std::vector<uint8_t>& v) {
  return {name, type, DType::kF32, std::move(shape), Bytes(v)};
}

// FP8 numbers with a scale per 128 x 64 block (Transformers' weight_scale_inv, f32), partial
// blocks at the right and the bottom: in f32 exactly code * scale of the element's block, e4m3
// and e5m2 alike; as 8-bit blocks (the default) quantized again to q8_0, within half a step of
// each block of 32's largest value (and the f16 rounding of its scale).
TEST(QuantizedCheckpointTest, Fp8BlocksScaleEachTileAndRequantizeToQ8_0) {
  constexpr int64_t n = 160, k = 96;
  std::mt19937 rng(5);
  for (const StorageType type : {StorageType::kF8E4M3, StorageType::kF8E5M2}) {
    SCOPED_TRACE(std::string(StorageTypeName(type)));
    auto finite = [&](uint8_t c) {
      return type == StorageType::kF8E4M3 ? (c & 0x7f) != 0x7f : (c & 0x7c) != 0x7c;
    };
    std::vector<uint8_t> codes(n * k);
    for (uint8_t& c : codes) {
      do c = static_cast<uint8_t>(rng());
      while (!finite(c));
    }
    const std::vector<float> scales = {0.001f, 0.0123f, 3.5e-5f, 0.25f};  // [2][2]
    auto files = Files(absl::StrCat("fp8_", std::string(StorageTypeName(type))),
                       {U8s("l.weight", type, {n, k}, codes),
                        {"l.weight_scale_inv", std::nullopt, DType::kF32, {2, 2}, Bytes(scales)}});
    CheckpointQuantization q = Unpacked(true, 128, 64);
    q.scale_suffix = ".weight_scale_inv";
    ASSERT_TRUE(HasQuantizedLinear(*files, q, "l"));
    auto value = [&](int64_t r, int64_t c) {
      const uint8_t code = codes[r * k + c];
      const float x = type == StorageType::kF8E4M3 ? F8E4M3ToFloat(code) : F8E5M2ToFloat(code);
      return scales[(r / 128) * 2 + c / 64] * x;
    };
    std::vector<std::vector<std::byte>> converted;
    QuantizedLoadOptions f32;
    f32.as_q8 = false;
    f32.dense = DType::kF32;
    QuantizedLoadStats stats;
    auto dense = LoadQuantizedLinear(*files, q, "l", n, k, f32, &converted, &stats);
    ASSERT_TRUE(dense.ok()) << dense.status();
    EXPECT_EQ(dense->format, WeightFormat::kDense);
    ExpectValues(*dense, value);
    auto blocks = LoadQuantizedLinear(*files, q, "l", n, k, {}, &converted, &stats);
    ASSERT_TRUE(blocks.ok()) << blocks.status();
    EXPECT_EQ(blocks->format, WeightFormat::kQ8_0);
    EXPECT_EQ(stats.exact, 1);
    EXPECT_EQ(stats.requantized, 1);
    std::vector<float> row(k);
    for (int64_t r = 0; r < n; ++r) {
      WeightRowToFloat(*blocks, r, row.data());
      for (int64_t b = 0; b < k; b += 32) {
        float amax = 0;
        for (int64_t c = b; c < b + 32; ++c) amax = std::max(amax, std::abs(value(r, c)));
        for (int64_t c = b; c < b + 32; ++c) {
          ASSERT_NEAR(row[c], value(r, c), amax / 127 * (0.5 + 127 * 0x1p-11))
              << "[" << r << "][" << c << "]";
        }
      }
    }
  }
}

// What requantizing FP8 to q8_0 costs: on Gaussian weights quantized to e4m3 with a scale per
// row (amax / 448), the q8_0 blocks' distance from the FP8 values is a fraction of the FP8
// values' own distance from the weights (3 mantissa bits: steps of 1/8 to 1/16 of a value; q8_0:
// 1/254 of its block's largest). Measured 0.209 (printed): the error against the weights grows
// by 2.2 % in RMS, sqrt(1 + 0.209^2) with the two independent. Held below 0.25.
TEST(QuantizedCheckpointTest, RequantizingFp8AddsLittleToItsOwnError) {
  constexpr int64_t n = 64, k = 4096;
  std::mt19937 rng(17);
  std::normal_distribution<float> gauss(0, 0.02f);
  std::vector<float> w(n * k), scales(n), fp8(n * k);
  std::vector<uint8_t> codes(n * k);
  for (float& x : w) x = gauss(rng);
  for (int64_t r = 0; r < n; ++r) {
    float amax = 0;
    for (int64_t c = 0; c < k; ++c) amax = std::max(amax, std::abs(w[r * k + c]));
    scales[r] = amax / 448;
    for (int64_t c = 0; c < k; ++c) {
      codes[r * k + c] = FloatToF8E4M3(w[r * k + c] / scales[r]);
      fp8[r * k + c] = scales[r] * F8E4M3ToFloat(codes[r * k + c]);
    }
  }
  auto files =
      Files("fp8_gauss", {U8s("l.weight", StorageType::kF8E4M3, {n, k}, codes),
                          {"l.weight_scale", std::nullopt, DType::kF32, {n, 1}, Bytes(scales)}});
  std::vector<std::vector<std::byte>> converted;
  auto m = LoadQuantizedLinear(*files, Unpacked(true, 1, 0), "l", n, k, {}, &converted);
  ASSERT_TRUE(m.ok()) << m.status();
  double fp8_err = 0, q8_err = 0;
  std::vector<float> row(k);
  for (int64_t r = 0; r < n; ++r) {
    WeightRowToFloat(*m, r, row.data());
    for (int64_t c = 0; c < k; ++c) {
      fp8_err += std::pow(double{fp8[r * k + c]} - w[r * k + c], 2);
      q8_err += std::pow(double{row[c]} - fp8[r * k + c], 2);
    }
  }
  const double ratio = std::sqrt(q8_err / fp8_err);
  std::printf("RMS(q8_0 - fp8) / RMS(fp8 - w) = %.3f\n", ratio);
  EXPECT_LT(ratio, 0.25);
  EXPECT_GT(ratio, 0.01);  // (q8_0 is not FP8: the values do move)
}

// int8 weights (W8A8's int-quantized) are their values exactly: q8_0 blocks with d = s where
// the scale is an f16 (bf16 per row), q8 affine blocks with offset 0 where not (f32 per tensor,
// stored as a 0-d tensor).
TEST(QuantizedCheckpointTest, Int8WeightsAreExactlyTheirValues) {
  constexpr int64_t n = 8, k = 64;
  std::mt19937 rng(23);
  std::vector<uint8_t> q(n * k);
  for (uint8_t& x : q) x = static_cast<uint8_t>(rng());
  auto signed_q = [&](int64_t r, int64_t c) {
    return static_cast<float>(static_cast<int8_t>(q[r * k + c]));
  };
  {
    std::vector<uint16_t> s;
    for (int r = 0; r < n; ++r) s.push_back(FloatToBf16(0.001f * (r + 1)));
    auto files =
        Files("int8_channel", {U8s("l.weight", StorageType::kI8, {n, k}, q),
                               {"l.weight_scale", std::nullopt, DType::kBF16, {n, 1}, Bytes(s)}});
    std::vector<std::vector<std::byte>> converted;
    auto m = LoadQuantizedLinear(*files, Unpacked(false, 1, 0), "l", n, k, {}, &converted);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->format, WeightFormat::kQ8_0);
    ExpectValues(*m, [&](int64_t r, int64_t c) { return Bf16ToFloat(s[r]) * signed_q(r, c); });
  }
  {
    const std::vector<float> s = {0.0012345678f};
    auto files =
        Files("int8_tensor", {U8s("l.weight", StorageType::kI8, {n, k}, q),
                              {"l.weight_scale", std::nullopt, DType::kF32, {}, Bytes(s)}});
    std::vector<std::vector<std::byte>> converted;
    auto m = LoadQuantizedLinear(*files, Unpacked(false, 0, 0), "l", n, k, {}, &converted);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->format, WeightFormat::kQ8Affine);
    ExpectValues(*m, [&](int64_t r, int64_t c) { return s[0] * signed_q(r, c); });
  }
}

// A NaN among FP8 weights, an element type the config does not say, and scales of the wrong
// shape are refused naming the tensor; a float .weight (a module the recipe left alone) is not
// a quantized linear.
TEST(QuantizedCheckpointTest, MalformedUnpackedTensorsAreNamed) {
  std::vector<uint8_t> codes(8 * 32, 0x38);  // 1.0
  codes[3 * 32 + 5] = 0x7f;                  // e4m3 NaN
  const std::vector<float> one = {1.0f};
  std::vector<std::vector<std::byte>> converted;
  {
    auto files = Files("fp8_nan", {U8s("l.weight", StorageType::kF8E4M3, {8, 32}, codes),
                                   {"l.weight_scale", std::nullopt, DType::kF32, {1}, Bytes(one)}});
    auto m = LoadQuantizedLinear(*files, Unpacked(true, 0, 0), "l", 8, 32, {}, &converted);
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(m.status().message(), HasSubstr("\"l.weight\" [3][5] is nan, not a finite weight"));
    // Read as int8 it has the wrong element type.
    m = LoadQuantizedLinear(*files, Unpacked(false, 0, 0), "l", 8, 32, {}, &converted);
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(m.status().message(), HasSubstr("has dtype F8_E4M3 (I8 expected)"));
    // Scales by channel want [8, 1].
    m = LoadQuantizedLinear(*files, Unpacked(true, 1, 0), "l", 8, 32, {}, &converted);
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(m.status().message(), HasSubstr("l.weight_scale"));
  }
  {
    const std::vector<float> two = {1.0f, 2.0f};
    auto files =
        Files("fp8_two",
              {U8s("l.weight", StorageType::kF8E4M3, {8, 32}, std::vector<uint8_t>(8 * 32, 0x38)),
               {"l.weight_scale", std::nullopt, DType::kF32, {2}, Bytes(two)}});
    auto m = LoadQuantizedLinear(*files, Unpacked(true, 0, 0), "l", 8, 32, {}, &converted);
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(m.status().message(), HasSubstr("has shape [2], one scale a tensor expected"));
  }
  {
    auto files = Files("fp8_left_alone", {{"l.weight",
                                           std::nullopt,
                                           DType::kBF16,
                                           {8, 32},
                                           Bytes(std::vector<uint16_t>(8 * 32, 0x3f80))}});
    EXPECT_FALSE(HasQuantizedLinear(*files, Unpacked(true, 0, 0), "l"));
  }
}

CheckpointQuantization Bnb(const std::string& type) {
  CheckpointQuantization q = Scheme("bitsandbytes", type.empty() ? 8 : 4, 64, false);
  q.unpacked = true;
  q.bnb_4bit_type = type;
  if (type.empty()) {
    q.scale_suffix = ".SCB";
    q.scale_multiplier = 1.0f / 127;
  }
  return q;
}

// bitsandbytes' 4-bit layout as its own dequantization reads it (bitsandbytes' dequantize_4bit,
// and mistral.rs's reading of the same files): the flattened matrix's codes two a byte, the
// first in the high nibble; quant_map[code] times the block's absmax, double-quantized here:
// nested_quant_map[absmax byte] * nested_absmax + nested_offset.
TEST(QuantizedCheckpointTest, BitsAndBytes4BitCodesAndDoubleQuantizedAbsmax) {
  constexpr int64_t n = 2, k = 64;
  std::vector<uint8_t> codes(n * k / 2);
  for (size_t i = 0; i < codes.size(); ++i) {
    codes[i] = static_cast<uint8_t>(((2 * i) % 16) << 4 | ((2 * i + 1) * 7 % 16));
  }
  auto code_of = [&](int64_t j) { return static_cast<int>(j % 2 == 0 ? (j % 16) : (j * 7 % 16)); };
  std::vector<float> quant_map(16), nested_map(256);
  for (int c = 0; c < 16; ++c) quant_map[c] = (static_cast<float>(c) - 7.5f) / 7.5f;
  for (int i = 0; i < 256; ++i) nested_map[i] = static_cast<float>(i) / 256 - 0.5f;
  const std::vector<uint8_t> absmax = {200, 55};
  const std::vector<float> nested_absmax = {0.5f};
  const float offset = 0.25f;
  const std::string state =
      R"({"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": [2, 64], )"
      R"("nested_blocksize": 256, "nested_offset": 0.25, "nested_dtype": "float32"})";
  auto files =
      Files("bnb_nf4",
            {U8s("l.weight", StorageType::kU8, {n * k / 2, 1}, codes),
             {"l.weight.quant_map", std::nullopt, DType::kF32, {16}, Bytes(quant_map)},
             U8s("l.weight.absmax", StorageType::kU8, {2}, absmax),
             {"l.weight.nested_absmax", std::nullopt, DType::kF32, {1}, Bytes(nested_absmax)},
             {"l.weight.nested_quant_map", std::nullopt, DType::kF32, {256}, Bytes(nested_map)},
             U8s("l.weight.quant_state.bitsandbytes__nf4", StorageType::kU8,
                 {static_cast<int64_t>(state.size())},
                 std::vector<uint8_t>(state.begin(), state.end()))});
  const CheckpointQuantization q = Bnb("nf4");
  ASSERT_TRUE(HasQuantizedLinear(*files, q, "l"));
  auto value = [&](int64_t r, int64_t c) {
    const int64_t j = r * k + c;
    const float scale = nested_map[absmax[j / 64]] * nested_absmax[0] + offset;
    return quant_map[code_of(j)] * scale;
  };
  std::vector<std::vector<std::byte>> converted;
  QuantizedLoadOptions f32;
  f32.as_q8 = false;
  f32.dense = DType::kF32;
  auto m = LoadQuantizedLinear(*files, q, "l", n, k, f32, &converted);
  ASSERT_TRUE(m.ok()) << m.status();
  ExpectValues(*m, value);
  QuantizedLoadStats stats;
  m = LoadQuantizedLinear(*files, q, "l", n, k, {}, &converted, &stats);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->format, WeightFormat::kQ8_0);
  EXPECT_EQ(stats.requantized, 1);
  // A quant_state of another shape, or the other type's, is refused naming it.
  m = LoadQuantizedLinear(*files, q, "l", n / 2, 2 * k, {}, &converted);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(m.status().message(), HasSubstr("says shape [2,64], the config needs [1, 128]"));
  m = LoadQuantizedLinear(*files, Bnb("fp4"), "l", n, k, {}, &converted);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(m.status().message(), HasSubstr("l.weight.quant_state.bitsandbytes__fp4"));
}

// LLM.int8() rows (load_in_8bit): q * SCB / 127 exactly, as q8 affine blocks (SCB / 127 is
// seldom an f16), from SCB saved beside the weight as [rows].
TEST(QuantizedCheckpointTest, BitsAndBytesInt8RowsAreExact) {
  constexpr int64_t n = 3, k = 32;
  std::mt19937 rng(4);
  std::vector<uint8_t> q(n * k);
  for (uint8_t& x : q) x = static_cast<uint8_t>(rng() % 255 + 129);  // -127..127
  const std::vector<float> scb = {0.731f, 0.0123f, 2.5f};
  auto files = Files("bnb_int8", {U8s("l.weight", StorageType::kI8, {n, k}, q),
                                  {"l.SCB", std::nullopt, DType::kF32, {n}, Bytes(scb)}});
  std::vector<std::vector<std::byte>> converted;
  auto m = LoadQuantizedLinear(*files, Bnb(""), "l", n, k, {}, &converted);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->format, WeightFormat::kQ8Affine);
  ExpectValues(*m, [&](int64_t r, int64_t c) {
    return scb[r] * (1.0f / 127) * static_cast<float>(static_cast<int8_t>(q[r * k + c]));
  });
}

// A code value that is not finite, or one whose product with its absmax overflows, is refused
// naming the tensor (as NaN FP8 weights are); LLM.int8's tiled layouts (weight_format not 0) are
// refused rather than read as rows; a matrix of an odd number of weights keeps its last code in
// a byte of its own, as bitsandbytes packs it.
TEST(QuantizedCheckpointTest, BitsAndBytesMalformedAndOdd) {
  const std::string state = R"({"quant_type": "nf4", "blocksize": 64, "shape": [1, 63]})";
  auto nf4 = [&](const std::string& name, std::vector<float> quant_map, float absmax) {
    return Files(
        name,
        {U8s("l.weight", StorageType::kU8, {32, 1}, std::vector<uint8_t>(32, 0x1f)),
         {"l.weight.quant_map", std::nullopt, DType::kF32, {16}, Bytes(quant_map)},
         {"l.weight.absmax", std::nullopt, DType::kF32, {1}, Bytes(std::vector<float>{absmax})},
         U8s("l.weight.quant_state.bitsandbytes__nf4", StorageType::kU8,
             {static_cast<int64_t>(state.size())},
             std::vector<uint8_t>(state.begin(), state.end()))});
  };
  std::vector<float> map(16);
  for (int c = 0; c < 16; ++c) map[c] = static_cast<float>(c) / 15;
  std::vector<std::vector<std::byte>> converted;
  QuantizedLoadOptions f32;
  f32.as_q8 = false;
  f32.dense = DType::kF32;
  {  // 63 codes in 32 bytes: the last byte's low nibble is padding
    auto files = nf4("bnb_odd", map, 2.0f);
    auto m = LoadQuantizedLinear(*files, Bnb("nf4"), "l", 1, 63, f32, &converted);
    ASSERT_TRUE(m.ok()) << m.status();
    ExpectValues(*m, [&](int64_t, int64_t c) { return map[c % 2 == 0 ? 1 : 15] * 2.0f; });
  }
  {
    std::vector<float> nan_map = map;
    nan_map[1] = NAN;
    auto files = nf4("bnb_nan", nan_map, 2.0f);
    auto m = LoadQuantizedLinear(*files, Bnb("nf4"), "l", 1, 63, f32, &converted);
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(m.status().message(), HasSubstr("\"l.weight.quant_map\" [1] is nan"));
  }
  {
    std::vector<float> big = map;
    big[15] = 1e30f;
    auto files = nf4("bnb_overflow", big, 1e30f);
    auto m = LoadQuantizedLinear(*files, Bnb("nf4"), "l", 1, 63, f32, &converted);
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(m.status().message(), HasSubstr("\"l.weight\" [0][1] overflows"));
  }
  {
    auto files =
        Files("bnb_tiled",
              {U8s("l.weight", StorageType::kI8, {2, 32}, std::vector<uint8_t>(64, 1)),
               {"l.SCB", std::nullopt, DType::kF32, {2}, Bytes(std::vector<float>{1.0f, 2.0f})},
               U8s("l.weight_format", StorageType::kU8, {}, {2})});
    auto m = LoadQuantizedLinear(*files, Bnb(""), "l", 2, 32, {}, &converted);
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(m.status().message(), HasSubstr("\"l.weight_format\" is not 0 (row-major)"));
  }
}

// MXFP4 (gpt-oss's experts): two FP4 E2M1 codes a byte, the low nibble first, times
// 2^(scale - 127) per 32; rows picked with a step (gate_up's interleaved rows). Every code and
// scales from tiny to huge: exactly their values as MXFP4 blocks (ggml's order) or q8_0 while
// every scale suits those, as q8 affine past that, and as f32 without 8-bit blocks.
TEST(QuantizedCheckpointTest, Mxfp4BlocksAreExactlyTheirValues) {
  const int64_t rows = 6, cols = 64, nb = cols / 32;
  std::mt19937 rng(41);
  std::vector<uint8_t> codes(rows * nb * 16);
  for (uint8_t& c : codes) c = static_cast<uint8_t>(rng());
  codes[0] = 0x71;  // elements 0 and 1: 0.5 (code 1) and 6 (code 7)
  auto value = [&](const std::vector<uint8_t>& scales, int64_t row, int64_t k) {
    const uint8_t byte = codes[(row * nb + k / 32) * 16 + (k % 32) / 2];
    const int code = k % 2 == 0 ? byte & 15 : byte >> 4;
    constexpr float kFp4[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    return std::ldexp(kFp4[code], scales[row * nb + k / 32] - 127);
  };
  for (const bool f16_range : {true, false}) {
    std::vector<uint8_t> scales(rows * nb);
    for (int64_t i = 0; i < rows * nb; ++i) scales[i] = static_cast<uint8_t>(120 + i % 14);
    if (!f16_range) scales[3] = 1;  // 2^-126: neither an f16 nor in the MXFP4 kernels' range
    auto files = Files(f16_range ? "mxfp4" : "mxfp4_affine",
                       {{"e.blocks", StorageType::kU8, DType::kF32, {1, rows, nb, 16}, Bytes(codes)},
                        {"e.scales", StorageType::kU8, DType::kF32, {1, rows, nb}, Bytes(scales)}});
    const TensorView blocks = *files->GetAny("e.blocks"), sc = *files->GetAny("e.scales");
    for (const int form : {0, 1, 2}) {  // as MXFP4 blocks, as q8 blocks, dense
      const bool as_q8 = form < 2, mxfp4 = form == 0;
      SCOPED_TRACE(absl::StrCat(f16_range ? "f16 scales" : "a tiny scale", " form ", form));
      QuantizedLoadOptions options;
      options.as_q8 = as_q8;
      options.mxfp4 = mxfp4;
      options.dense = DType::kF32;
      std::vector<std::vector<std::byte>> converted;
      // Rows 1, 3, 5 (the "up" rows of an interleaved gate_up).
      auto m = LoadMxfp4Rows(blocks, sc, 1, 2, 3, cols, options, &converted);
      ASSERT_TRUE(m.ok()) << m.status();
      EXPECT_EQ(m->format, !as_q8       ? WeightFormat::kDense
                           : !f16_range ? WeightFormat::kQ8Affine
                           : mxfp4      ? WeightFormat::kMxfp4
                                        : WeightFormat::kQ8_0);
      ExpectValues(*m, [&](int64_t n, int64_t k) { return value(scales, 1 + 2 * n, k); });
    }
    if (f16_range) {  // the hand-made byte: row 0's first two values
      std::vector<std::vector<std::byte>> converted;
      auto m = LoadMxfp4Rows(blocks, sc, 0, 1, 1, cols, {}, &converted);
      ASSERT_TRUE(m.ok()) << m.status();
      std::vector<float> row(cols);
      WeightRowToFloat(*m, 0, row.data());
      EXPECT_EQ(row[0], std::ldexp(0.5f, 120 - 127));
      EXPECT_EQ(row[1], std::ldexp(6.0f, 120 - 127));
    }
  }
}

TEST(QuantizedCheckpointTest, MalformedMxfp4TensorsAreNamed) {
  std::vector<uint8_t> codes(2 * 2 * 16, 0x11), scales(2 * 2, 127);
  auto files =
      Files("mxfp4_bad",
            {{"e.blocks", StorageType::kU8, DType::kF32, {2, 2, 16}, Bytes(codes)},
             {"e.scales", StorageType::kU8, DType::kF32, {2, 2}, Bytes(scales)},
             {"e.short", StorageType::kU8, DType::kF32, {2, 1}, Bytes(std::vector<uint8_t>(2))},
             {"e.nan",
              StorageType::kU8,
              DType::kF32,
              {2, 2},
              Bytes(std::vector<uint8_t>{127, 127, 255, 127})},
             {"e.huge",
              StorageType::kU8,
              DType::kF32,
              {2, 2},
              Bytes(std::vector<uint8_t>{127, 253, 127, 127})},
             {"e.flat",
              StorageType::kU8,
              DType::kF32,
              {4},
              Bytes(std::vector<uint8_t>{127, 127, 127, 127})}});
  const TensorView blocks = *files->GetAny("e.blocks");
  std::vector<std::vector<std::byte>> converted;
  auto load = [&](const char* scales_name, int64_t rows, int64_t cols) {
    return LoadMxfp4Rows(blocks, *files->GetAny(scales_name), 0, 1, rows, cols, {}, &converted)
        .status();
  };
  EXPECT_TRUE(load("e.scales", 2, 64).ok());
  EXPECT_THAT(load("e.scales", 2, 48).message(), HasSubstr("whole blocks of 32"));
  EXPECT_THAT(load("e.scales", 2, 32).message(), HasSubstr("e.blocks"));
  EXPECT_THAT(load("e.short", 2, 64).message(), HasSubstr("e.short"));
  EXPECT_THAT(load("e.scales", 3, 64).message(), HasSubstr("were asked for"));
  EXPECT_THAT(load("e.nan", 2, 64).message(), HasSubstr("E8M0's NaN"));
  EXPECT_THAT(load("e.huge", 2, 64).message(), HasSubstr("overflows"));
  EXPECT_THAT(load("e.flat", 2, 64).message(), HasSubstr("e.flat"));  // not [2][2]
}

}  // namespace
}  // namespace kvrm
