// KvPool memory: a populated pool is resident when Create returns (a step never faults its pages
// in); an unpopulated one (a host tier) costs nothing until touched.
#include "runtime/kv_pool.h"

#include <unistd.h>

#include <cstdio>
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
}

}  // namespace
}  // namespace kvrm
