// KvPool memory: a populated pool is resident when Create returns (a step never faults its pages
// in); an unpopulated one (a host tier) costs nothing until touched.
#include "runtime/kv_pool.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <vector>
#include <fstream>

#include "gtest/gtest.h"

namespace kvrm {
namespace {

// Resident bytes of this process (/proc/self/statm, second field, in pages).
int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

KvPoolShape Shape64MiB() {
  KvPoolShape s;
  s.num_layers = 4;
  s.kv_heads = 2;
  s.head_dim = 64;
  s.block_tokens = 16;
  s.num_blocks = 1024;  // 4 layers x K,V x 2 heads x 16 tokens x 64 x 4 B = 64 KiB a block
  return s;
}

TEST(KvPoolTest, PopulatedPoolIsResidentAtOnce) {
  const KvPoolShape shape = Shape64MiB();
  ASSERT_EQ(shape.BytesPerBlock() * shape.num_blocks, int64_t{64} << 20);
  const int64_t before = ResidentBytes();
  absl::StatusOr<std::unique_ptr<KvPool>> pool = KvPool::Create(shape, /*populate=*/true);
  ASSERT_TRUE(pool.ok()) << pool.status();
  const int64_t grown = ResidentBytes() - before;
  EXPECT_GE(grown, int64_t{60} << 20) << "resident grew by " << grown << " bytes";
  // Zeroed, as the lazy pool is.
  const KvLayerView v = (*pool)->Layer(3);
  EXPECT_EQ(v.KeyAt(1, 16 * 1000)[63], 0.0f);
}

TEST(KvPoolTest, UnpopulatedPoolCostsNothingUntilTouched) {
  const KvPoolShape shape = Shape64MiB();
  const int64_t before = ResidentBytes();
  absl::StatusOr<std::unique_ptr<KvPool>> pool = KvPool::Create(shape, /*populate=*/false);
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_LT(ResidentBytes() - before, int64_t{8} << 20);
  EXPECT_EQ((*pool)->Layer(0).KeyAt(0, 0)[0], 0.0f);
}

TEST(KvPoolTest, BadShapeIsInvalidArgument) {
  KvPoolShape shape = Shape64MiB();
  shape.num_blocks = 0;
  EXPECT_EQ(KvPool::Create(shape).status().code(), absl::StatusCode::kInvalidArgument);
  shape = Shape64MiB();
  shape.dtype = DType::kF16;  // the pool holds f32, bf16 or FP8
  EXPECT_EQ(KvPool::Create(shape).status().code(), absl::StatusCode::kInvalidArgument);
}

// A bf16 (FP8) pool: half (a quarter of) the bytes of an f32 one of the same shape, its layers
// laid out in its own element size, and a transfer group moves exactly the group's blocks of
// every (layer, K|V, head) with the rest untouched.
void CheckNarrowPoolCopiesGroups(DType dtype, int64_t fraction) {
  KvPoolShape shape = Shape64MiB();
  shape.num_blocks = 8;
  shape.dtype = dtype;
  EXPECT_EQ(shape.BytesPerBlock(), (int64_t{64} << 10) / fraction);
  auto src = KvPool::Create(shape), dst = KvPool::Create(shape);
  ASSERT_TRUE(src.ok() && dst.ok());
  EXPECT_EQ((*src)->bytes(), shape.BytesPerBlock() * 8);
  const int64_t row_bytes = shape.head_dim * static_cast<int64_t>(DTypeSize(dtype));
  // Every byte of src gets a value that moves with its position (wrapping), never 0.
  uint8_t next = 1;
  for (int32_t l = 0; l < shape.num_layers; ++l) {
    const KvLayerView v = (*src)->Layer(l);
    EXPECT_EQ(v.dtype, dtype);
    for (int32_t h = 0; h < shape.kv_heads; ++h) {
      for (int64_t t = 0; t < shape.num_blocks * shape.block_tokens; ++t) {
        for (char* row : {v.KeyBytes(h, t), v.ValueBytes(h, t)}) {
          for (int64_t i = 0; i < row_bytes; ++i) {
            row[i] = static_cast<char>(next);
            next = next == 251 ? 1 : next + 1;
          }
        }
      }
    }
  }
  TransferGroup g;
  g.src_first = 5;
  g.dst_first = 1;
  g.num_blocks = 2;
  CopyGroupBetweenPools(**src, **dst, g);
  const std::vector<char> zero(row_bytes, 0);  // a row the copy must not touch
  for (int32_t l = 0; l < shape.num_layers; ++l) {
    const KvLayerView s = (*src)->Layer(l), d = (*dst)->Layer(l);
    for (int32_t h = 0; h < shape.kv_heads; ++h) {
      for (int64_t t = 0; t < shape.num_blocks * shape.block_tokens; ++t) {
        const int64_t block = t / shape.block_tokens;
        const bool copied = block >= 1 && block < 3;
        const int64_t from = t + (g.src_first - g.dst_first) * shape.block_tokens;
        for (bool key : {true, false}) {
          const char* got = key ? d.KeyBytes(h, t) : d.ValueBytes(h, t);
          const char* want = zero.data();
          if (copied) want = key ? s.KeyBytes(h, from) : s.ValueBytes(h, from);
          ASSERT_EQ(std::memcmp(got, want, row_bytes), 0)
              << DTypeName(dtype) << " layer " << l << " head " << h << " token " << t
              << (key ? " K" : " V");
        }
      }
    }
  }
}

TEST(KvPoolTest, Bf16PoolIsHalfTheBytesAndCopiesGroups) {
  CheckNarrowPoolCopiesGroups(DType::kBF16, 2);
}
TEST(KvPoolTest, Fp8PoolsAreAQuarterOfTheBytesAndCopyGroups) {
  CheckNarrowPoolCopiesGroups(DType::kF8E4M3, 4);
  CheckNarrowPoolCopiesGroups(DType::kF8E5M2, 4);
}

// --kv_dtype's spellings, and an error naming the flag and the choices for anything else.
TEST(KvPoolTest, ParsesKvDtypeFlag) {
  EXPECT_EQ(*ParseKvDtype("f32"), DType::kF32);
  EXPECT_EQ(*ParseKvDtype("bfloat16"), DType::kBF16);
  EXPECT_EQ(*ParseKvDtype("fp8"), DType::kF8E4M3);
  EXPECT_EQ(*ParseKvDtype("fp8_e4m3"), DType::kF8E4M3);
  EXPECT_EQ(*ParseKvDtype("fp8_e5m2"), DType::kF8E5M2);
  const absl::Status bad = ParseKvDtype("int8").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("--kv_dtype=int8"), absl::string_view::npos) << bad;
  EXPECT_NE(bad.message().find("fp8_e5m2"), absl::string_view::npos) << bad;
}

}  // namespace
}  // namespace kvrm
