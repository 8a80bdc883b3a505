// GGUF reading (model/gguf.h) and ggml's block formats (model/gguf_quants.h).
#include "model/gguf.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/gguf_quants.h"
#include "model/gguf_writer.h"

namespace kvrm {
namespace {

using ::testing::HasSubstr;

std::string TmpPath(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return (std::filesystem::path(tmp != nullptr ? tmp : "/tmp") / name).string();
}

std::string WriteBytes(const std::string& name, const std::string& bytes) {
  const std::string path = TmpPath(name);
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

absl::StatusOr<std::unique_ptr<GgufFile>> OpenBytes(const std::string& bytes) {
  return GgufFile::Open(WriteBytes("t.gguf", bytes));
}

std::vector<std::byte> Encode(GgmlType type, const std::vector<float>& x) {
  const GgmlTypeTraits& t = GgmlTraits(type);
  std::vector<std::byte> out(x.size() / t.block_elems * t.block_bytes);
  QuantizeRow(type, x.data(), static_cast<int64_t>(x.size()), out.data());
  return out;
}

std::vector<float> RandomNormal(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

TEST(GgufFileTest, ReadsBackEveryValueTypeAndTensor) {
  GgufWriter w;
  w.AddString("general.architecture", "llama");
  w.AddUint32("llama.block_count", 7);
  w.AddFloat32("llama.rope.freq_base", 500000.0f);
  w.AddBool("tokenizer.ggml.add_bos_token", true);
  w.AddStringArray("tokenizer.ggml.tokens", {"a", "", "\xe2\x96\x81hi"});
  w.AddInt32Array("tokenizer.ggml.token_type", {1, -3, 6});
  w.AddFloat32Array("tokenizer.ggml.scores", {0.5f, -2.0f, 0.0f});
  std::string i64(8, '\0');
  const int64_t minus_five = -5;
  std::memcpy(i64.data(), &minus_five, 8);
  w.AddRaw("x.int64", static_cast<uint32_t>(GgufValueType::kInt64), i64);
  const std::vector<float> x = RandomNormal(2 * 64, 1);
  w.AddTensor("m.f32", GgmlType::kF32, {64, 2}, Encode(GgmlType::kF32, x));
  w.AddTensor("m.q8", GgmlType::kQ8_0, {64, 2}, Encode(GgmlType::kQ8_0, x));
  w.AddTensor("v.bf16", GgmlType::kBF16, {3}, Encode(GgmlType::kBF16, {1.0f, -2.0f, 3.5f}));

  absl::StatusOr<std::unique_ptr<GgufFile>> f = OpenBytes(w.Serialize());
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->version(), 3u);
  EXPECT_EQ(*(*f)->GetString("general.architecture"), "llama");
  EXPECT_EQ(*(*f)->GetUint("llama.block_count"), 7u);
  EXPECT_EQ(*(*f)->GetFloat("llama.rope.freq_base"), 500000.0);
  EXPECT_EQ(*(*f)->GetFloat("llama.block_count"), 7.0);  // integers read as numbers too
  EXPECT_TRUE(*(*f)->GetBool("tokenizer.ggml.add_bos_token"));
  EXPECT_THAT(*(*f)->GetStringArray("tokenizer.ggml.tokens"),
              ::testing::ElementsAre("a", "", "\xe2\x96\x81hi"));
  EXPECT_THAT(*(*f)->GetNumberArray("tokenizer.ggml.token_type"), ::testing::ElementsAre(1, -3, 6));
  EXPECT_THAT(*(*f)->GetNumberArray("tokenizer.ggml.scores"),
              ::testing::ElementsAre(0.5, -2.0, 0.0));
  EXPECT_EQ((*f)->Find("x.int64")->i, -5);
  EXPECT_THAT(std::string((*f)->GetUint("x.int64").status().message()),
              HasSubstr("x.int64: expected a non-negative integer"));
  EXPECT_EQ((*f)->GetString("llama.block_count").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*f)->GetUint("missing.key").status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT((*f)->keys(), ::testing::ElementsAre(
                                "general.architecture", "llama.block_count", "llama.rope.freq_base",
                                "tokenizer.ggml.add_bos_token", "tokenizer.ggml.tokens",
                                "tokenizer.ggml.token_type", "tokenizer.ggml.scores", "x.int64"));

  ASSERT_EQ((*f)->tensors().size(), 3u);
  const GgufTensor* m = (*f)->FindTensor("m.f32");
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->rows(), 2);
  EXPECT_EQ(m->cols(), 64);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(m->data) % 32, 0u);
  EXPECT_EQ(std::memcmp(m->data, x.data(), x.size() * 4), 0);
  const GgufTensor* q = (*f)->FindTensor("m.q8");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->type, GgmlType::kQ8_0);
  EXPECT_EQ(q->row_bytes(), 2u * 34u);
  EXPECT_EQ(q->nbytes, 4u * 34u);
  const GgufTensor* v = (*f)->FindTensor("v.bf16");
  ASSERT_NE(v, nullptr);
  std::vector<float> back(3);
  DequantizeRow(GgmlType::kBF16, v->data, 3, back.data());
  EXPECT_THAT(back, ::testing::ElementsAre(1.0f, -2.0f, 3.5f));
  EXPECT_EQ((*f)->FindTensor("nope"), nullptr);
}

// A small valid file, for the malformed cases below.
std::string SmallFile() {
  GgufWriter w;
  w.AddString("general.architecture", "llama");
  w.AddStringArray("tokenizer.ggml.tokens", {"a", "b"});
  w.AddTensor("t", GgmlType::kF32, {8}, Encode(GgmlType::kF32, RandomNormal(8, 2)));
  return w.Serialize();
}

// Every prefix of a valid file is an error that names the file, never a crash or a read past
// the end (the reader's bounds checks; run under ASan by tools/sanitizers.sh).
TEST(GgufFileTest, EveryTruncationIsAnError) {
  const std::string bytes = SmallFile();
  ASSERT_TRUE(OpenBytes(bytes).ok());
  // The tensor's data ends the file, so every cut loses some of it.
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_FALSE(OpenBytes(bytes.substr(0, n)).ok()) << "a file cut to " << n << " bytes opened";
  }
}

TEST(GgufFileTest, MalformedFilesNameWhatIsWrong) {
  const std::string good = SmallFile();
  auto error = [](const std::string& bytes) {
    absl::StatusOr<std::unique_ptr<GgufFile>> f = OpenBytes(bytes);
    return f.ok() ? std::string("opened") : std::string(f.status().message());  // printable
  };
  std::string bad = good;
  bad[0] = 'X';
  EXPECT_THAT(error(bad), HasSubstr("not a GGUF file"));
  bad = good;
  bad[4] = 1;  // version 1: 32-bit counts, which llama.cpp no longer reads either
  EXPECT_THAT(error(bad), HasSubstr("GGUF version 1"));
  bad = good;
  bad[16] = '\xff';  // a metadata count that cannot fit the file
  EXPECT_THAT(error(bad), HasSubstr("cannot fit the file"));

  {
    GgufWriter w;
    w.AddUint32("k", 1);
    w.AddUint32("k", 2);
    EXPECT_THAT(error(w.Serialize()), HasSubstr("k: duplicate key"));
  }
  {
    GgufWriter w;  // an array of arrays
    std::string value;
    const uint32_t array = static_cast<uint32_t>(GgufValueType::kArray);
    value.append(reinterpret_cast<const char*>(&array), 4);
    value.append(8, '\0');
    w.AddRaw("nested", array, value);
    EXPECT_THAT(error(w.Serialize()), HasSubstr("nested: array of unsupported element type 9"));
  }
  {
    GgufWriter w;
    w.AddRaw("odd", 99, "");
    EXPECT_THAT(error(w.Serialize()), HasSubstr("odd: unknown value type 99"));
  }
  {
    GgufWriter w;  // q4_K rows must be whole 256-element blocks
    w.AddTensor("w", GgmlType::kQ4_K, {128, 2}, std::vector<std::byte>(144));
    EXPECT_THAT(error(w.Serialize()),
                HasSubstr("tensor \"w\": rows of 128 elements are not whole q4_K blocks of 256"));
  }
  {
    GgufWriter w;  // more bytes claimed than the file holds
    w.AddTensor("w", GgmlType::kF32, {64, 4}, std::vector<std::byte>(64 * 4));
    EXPECT_THAT(error(w.Serialize()), HasSubstr("tensor \"w\": 1024 bytes at offset 0 run past"));
  }
  {
    GgufWriter w;  // two tensors at the same offset: patched below
    w.AddTensor("a", GgmlType::kF32, {8}, std::vector<std::byte>(32));
    w.AddTensor("b", GgmlType::kF32, {8}, std::vector<std::byte>(32));
    std::string bytes = w.Serialize();
    const size_t at = bytes.find(std::string("b", 1) + std::string(1, '\x01'));
    ASSERT_NE(at, std::string::npos);
    // b's offset: after its name, dims (u32), ne[0] (i64) and type (u32).
    const size_t offset_at = at + 1 + 4 + 8 + 4;
    std::memset(bytes.data() + offset_at, 0, 8);
    EXPECT_THAT(error(bytes), HasSubstr("overlaps tensor"));
    const uint64_t misaligned = 8;
    std::memcpy(bytes.data() + offset_at, &misaligned, 8);
    EXPECT_THAT(error(bytes), HasSubstr("offset 8 is not a multiple of the alignment 32"));
  }
  {
    GgufWriter w;  // an i-quant this loader does not read: UNIMPLEMENTED, naming both
    w.AddTensor("w", GgmlType::kF32, {8}, std::vector<std::byte>(32));
    std::string bytes = w.Serialize();
    const size_t type_at = bytes.find("w") + 1 + 4 + 8;
    const uint32_t iq2_xxs = 16;
    std::memcpy(bytes.data() + type_at, &iq2_xxs, 4);
    absl::StatusOr<std::unique_ptr<GgufFile>> f = OpenBytes(bytes);
    EXPECT_EQ(f.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(std::string(f.status().message()), HasSubstr("tensor \"w\": ggml type iq2_xxs"));
  }
  EXPECT_EQ(GgufFile::Open(TmpPath("absent.gguf")).status().code(), absl::StatusCode::kNotFound);
}

// ---- block formats ------------------------------------------------------------------------

// ggml's dequantization written again from the block layouts, element by element (where each
// element's bits sit), in double: a second reading of the formats to hold DequantizeRow's block
// loops to.
double RefElement(GgmlType type, const uint8_t* b, int e) {
  auto half = [&](int at) {
    uint16_t h;
    std::memcpy(&h, b + at, 2);
    return static_cast<double>(F16ToFloat(h));
  };
  auto nibble = [](const uint8_t* qs, int e, int half_size) {
    return e < half_size ? qs[e] & 0xF : qs[e - half_size] >> 4;
  };
  auto bit = [](const uint8_t* p, int i) { return (p[i / 8] >> (i % 8)) & 1; };
  // K-quant sub-block scale and min (6 bits each, packed in 12 bytes).
  auto scale_min = [](const uint8_t* s, int j, int* sc, int* m) {
    if (j < 4) {
      *sc = s[j] & 63;
      *m = s[j + 4] & 63;
    } else {
      *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
      *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
  };
  switch (type) {
    case GgmlType::kQ8_0:
      return half(0) * static_cast<int8_t>(b[2 + e]);
    case GgmlType::kQ4_0:
      return half(0) * (nibble(b + 2, e, 16) - 8);
    case GgmlType::kQ4_1:
      return half(0) * nibble(b + 4, e, 16) + half(2);
    case GgmlType::kQ5_0:
      return half(0) * ((nibble(b + 6, e, 16) | bit(b + 2, e) << 4) - 16);
    case GgmlType::kQ5_1:
      return half(0) * (nibble(b + 8, e, 16) | bit(b + 4, e) << 4) + half(2);
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K: {
      const bool five = type == GgmlType::kQ5_K;
      const int sub = e / 32, chunk = e / 64, l = e % 32;
      const uint8_t* qs = b + (five ? 48 : 16);
      int q = sub % 2 == 0 ? qs[chunk * 32 + l] & 0xF : qs[chunk * 32 + l] >> 4;
      if (five) q |= ((b[16 + l] >> sub) & 1) << 4;
      int sc, m;
      scale_min(b + 4, sub, &sc, &m);
      return half(0) * sc * q - half(2) * m;
    }
    case GgmlType::kQ6_K: {
      // Element e: half n of 128, and in it l (0..31) and which of the four 32-wide quarters.
      const int n = e / 128, quarter = (e % 128) / 32, l = e % 32;
      const uint8_t* ql = b + n * 64;
      const uint8_t* qh = b + 128 + n * 32;
      const uint8_t byte = ql[l + (quarter % 2 == 1 ? 32 : 0)];
      const int lo4 = quarter < 2 ? byte & 0xF : byte >> 4;
      const int hi2 = (qh[l] >> (2 * quarter)) & 3;
      const int8_t scale = static_cast<int8_t>(b[192 + e / 16]);
      return half(208) * scale * ((lo4 | hi2 << 4) - 32);
    }
    default:
      return 0;
  }
}

const GgmlType kQuantized[] = {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
                               GgmlType::kQ8_0, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K};

// Random blocks (every bit pattern but the scales, which are kept finite and moderate) read the
// same by DequantizeRow and by the element-wise reference.
TEST(GgufQuantsTest, DequantizationMatchesTheBlockLayouts) {
  std::mt19937 rng(7);
  for (GgmlType type : kQuantized) {
    const GgmlTypeTraits& t = GgmlTraits(type);
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<uint8_t> block(t.block_bytes);
      for (uint8_t& x : block) x = static_cast<uint8_t>(rng());
      auto put_half = [&](int at) {
        const uint16_t h = FloatToF16(std::uniform_real_distribution<float>(-0.1f, 0.1f)(rng));
        std::memcpy(block.data() + at, &h, 2);
      };
      switch (type) {
        case GgmlType::kQ4_1:
        case GgmlType::kQ5_1:
        case GgmlType::kQ4_K:
        case GgmlType::kQ5_K:
          put_half(0), put_half(2);
          break;
        case GgmlType::kQ6_K:
          put_half(208);
          break;
        default:
          put_half(0);
      }
      std::vector<float> got(t.block_elems);
      DequantizeRow(type, reinterpret_cast<const std::byte*>(block.data()), t.block_elems,
                    got.data());
      for (int e = 0; e < t.block_elems; ++e) {
        const double want = RefElement(type, block.data(), e);
        ASSERT_NEAR(got[e], want, 1e-6 * std::max(1.0, std::fabs(want)))
            << t.name << " element " << e << " trial " << trial;
      }
    }
  }
}

// Quantizing random rows and reading them back: every element within the format's resolution
// (bounds from each format's step: half a step of the block's scale, plus the f16 rounding of
// the scales), and the row's RMS error a small share of its RMS.
TEST(GgufQuantsTest, QuantizeThenDequantizeStaysWithinTheFormatsResolution) {
  struct Bound {
    GgmlType type;
    double max_rms_share;
  };
  // RMS error over RMS for N(0,1) rows at each format's bits (about 2^-bits * range).
  const Bound bounds[] = {{GgmlType::kQ8_0, 0.01},  {GgmlType::kQ4_0, 0.15},
                          {GgmlType::kQ4_1, 0.12},  {GgmlType::kQ5_0, 0.075},
                          {GgmlType::kQ5_1, 0.06},  {GgmlType::kQ4_K, 0.13},
                          {GgmlType::kQ5_K, 0.065}, {GgmlType::kQ6_K, 0.04},
                          {GgmlType::kF16, 1e-3},   {GgmlType::kBF16, 5e-3}};
  const std::vector<float> x = RandomNormal(4096, 11, 0.02f);
  for (const Bound& b : bounds) {
    std::vector<float> back(x.size());
    DequantizeRow(b.type, Encode(b.type, x).data(), static_cast<int64_t>(x.size()), back.data());
    double err = 0, ref = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      err += (back[i] - x[i]) * (back[i] - x[i]);
      ref += x[i] * x[i];
    }
    EXPECT_LT(std::sqrt(err / ref), b.max_rms_share) << GgmlTraits(b.type).name;
  }
  // q8_0 element by element: within half a step of its block's scale d = amax / 127, plus what
  // storing d as f16 (relative error up to 2^-11) moves the largest code, 127 steps.
  const std::vector<std::byte> q8 = Encode(GgmlType::kQ8_0, x);
  std::vector<float> back(x.size());
  DequantizeRow(GgmlType::kQ8_0, q8.data(), static_cast<int64_t>(x.size()), back.data());
  for (size_t blk = 0; blk < x.size() / 32; ++blk) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[blk * 32 + j]));
    for (int j = 0; j < 32; ++j) {
      EXPECT_LE(std::fabs(back[blk * 32 + j] - x[blk * 32 + j]),
                amax * (0.5f / 127 + 1.0f / 2048) + 1e-7f);
    }
  }
  // An all-zero block quantizes to zeros in every format (no 0/0).
  const std::vector<float> zeros(256, 0.0f);
  for (GgmlType type : kQuantized) {
    std::vector<float> out(256, 1.0f);
    DequantizeRow(type, Encode(type, zeros).data(), 256, out.data());
    EXPECT_THAT(out, ::testing::Each(0.0f)) << GgmlTraits(type).name;
  }
}

TEST(GgufQuantsTest, TypeNamesAndGeometry) {
  EXPECT_EQ(GgmlTypeName(12), "q4_K");
  EXPECT_EQ(GgmlTypeName(30), "bf16");
  EXPECT_EQ(GgmlTypeName(11), "q3_K");  // refused, but named
  EXPECT_EQ(GgmlTypeName(77), "type 77");
  EXPECT_EQ(FindGgmlType(11), nullptr);
  EXPECT_EQ(FindGgmlType(4), nullptr);  // a removed type
  EXPECT_EQ(GgmlTraits(GgmlType::kQ6_K).block_bytes, 210);
  EXPECT_EQ(GgmlTraits(GgmlType::kQ5_K).block_bytes, 176);
}

}  // namespace
}  // namespace kvrm
