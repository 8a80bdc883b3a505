#include "runtime/cuda/transfer_lowering.h"

#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace kvrm::cuda {
namespace {

std::unique_ptr<KvPool> RandomPool(const KvPoolShape& shape, std::mt19937& rng) {
  auto pool = KvPool::Create(shape);
  EXPECT_TRUE(pool.ok());
  std::uniform_real_distribution<float> u(-1, 1);
  float* base = static_cast<float*>((*pool)->Layer(0).k);
  const int64_t n = (*pool)->bytes() / 4;
  for (int64_t i = 0; i < n; ++i) base[i] = u(rng);
  return std::move(*pool);
}

TEST(TransferLoweringTest, OneStridedCopyEqualsThePerHeadMemcpys) {
  std::mt19937 rng(5);
  for (int iter = 0; iter < 40; ++iter) {
    KvPoolShape dev;
    dev.num_layers = 1 + rng() % 4;
    dev.kv_heads = 1 + rng() % 3;
    dev.head_dim = 4 * (1 + rng() % 5);
    dev.block_tokens = 1 + rng() % 8;
    dev.num_blocks = 8 + rng() % 40;
    KvPoolShape host = dev;
    host.num_blocks = 4 + rng() % 60;  // the tiers differ in size, so the pitches differ
    auto a = RandomPool(dev, rng);
    auto b = RandomPool(host, rng);
    TransferGroup g;
    const bool swap_out = rng() % 2;
    const KvPool* src = swap_out ? a.get() : b.get();
    KvPool* dst = swap_out ? b.get() : a.get();
    g.src_tier = swap_out ? KvTier::kDevice : KvTier::kHost;
    g.dst_tier = swap_out ? KvTier::kHost : KvTier::kDevice;
    const int64_t most = std::min(src->shape().num_blocks, dst->shape().num_blocks);
    g.num_blocks = 1 + rng() % most;
    g.src_first = rng() % (src->shape().num_blocks - g.num_blocks + 1);
    g.dst_first = rng() % (dst->shape().num_blocks - g.num_blocks + 1);

    // Reference: the per-(layer, K|V, head) memcpys on a copy of the destination.
    std::vector<float> expected(dst->bytes() / 4);
    std::memcpy(expected.data(), dst->Layer(0).k, dst->bytes());
    auto ref = KvPool::Wrap(dst->shape(), expected.data());
    CopyGroupBetweenPools(*src, *ref, g);

    auto lowered = LowerTransferGroup(src->shape(), dst->shape(), g);
    ASSERT_TRUE(lowered.ok()) << lowered.status();
    EXPECT_EQ(lowered->height, int64_t{dev.num_layers} * 2 * dev.kv_heads);
    EXPECT_EQ(lowered->width, int64_t{g.num_blocks} * dev.block_tokens * dev.head_dim * 4);
    EXPECT_EQ(lowered->src_tier, g.src_tier);
    EXPECT_EQ(lowered->dst_tier, g.dst_tier);
    ApplyOnHost(*lowered, src->Layer(0).k, dst->Layer(0).k);
    ASSERT_EQ(std::memcmp(expected.data(), dst->Layer(0).k, dst->bytes()), 0) << "iter " << iter;
  }
}

TEST(TransferLoweringTest, RefusesGroupsOutsideThePoolsAndShapeMismatches) {
  KvPoolShape dev{2, 2, 8, 4, 10};
  KvPoolShape host = dev;
  host.num_blocks = 6;
  TransferGroup g{KvTier::kDevice, 5, KvTier::kHost, 3, 3};
  EXPECT_TRUE(LowerTransferGroup(dev, host, g).ok());
  g.dst_first = 4;  // 4 + 3 > 6
  EXPECT_EQ(LowerTransferGroup(dev, host, g).status().code(), absl::StatusCode::kInvalidArgument);
  g = TransferGroup{KvTier::kDevice, 8, KvTier::kDevice, 0, 3};  // 8 + 3 > 10
  EXPECT_EQ(LowerTransferGroup(dev, dev, g).status().code(), absl::StatusCode::kInvalidArgument);
  g = TransferGroup{KvTier::kDevice, 0, KvTier::kDevice, 1, 0};
  EXPECT_EQ(LowerTransferGroup(dev, dev, g).status().code(), absl::StatusCode::kInvalidArgument);
  KvPoolShape other = dev;
  other.head_dim = 16;
  g = TransferGroup{KvTier::kDevice, 0, KvTier::kDevice, 1, 1};
  EXPECT_EQ(LowerTransferGroup(dev, other, g).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvrm::cuda
