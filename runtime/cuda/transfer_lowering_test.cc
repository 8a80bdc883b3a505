#include "runtime/cuda/transfer_lowering.h"

#include <cstring>
#include <random>
#include <vector>

#include "common/dtype.h"
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

// Both element types: f32 and bf16 pools (--kv_dtype), whose rows are half as wide.
TEST(TransferLoweringTest, OneStridedCopyEqualsThePerHeadMemcpys) {
  std::mt19937 rng(5);
  for (int iter = 0; iter < 80; ++iter) {
    KvPoolShape dev;
    dev.dtype = iter % 2 ? DType::kBF16 : DType::kF32;
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
    EXPECT_EQ(lowered->width, int64_t{g.num_blocks} * dev.block_tokens * dev.head_dim *
                                  (dev.dtype == DType::kBF16 ? 2 : 4));
    EXPECT_EQ(lowered->src_tier, g.src_tier);
    EXPECT_EQ(lowered->dst_tier, g.dst_tier);
    ApplyOnHost(*lowered, src->Layer(0).k, dst->Layer(0).k);
    ASSERT_EQ(std::memcmp(expected.data(), dst->Layer(0).k, dst->bytes()), 0) << "iter " << iter;
  }
}

// The byte arithmetic of one group, by hand: a bf16 pool's offsets, width and pitches are half
// an f32 pool's of the same shape (2 bytes an element, not sizeof(float)); the height is not.
TEST(TransferLoweringTest, Bf16PoolsCountTwoBytesAnElement) {
  KvPoolShape dev{/*num_layers=*/2, /*kv_heads=*/4, /*head_dim=*/64, /*block_tokens=*/16,
                  /*num_blocks=*/100, DType::kBF16};
  KvPoolShape host = dev;
  host.num_blocks = 40;
  const TransferGroup g{KvTier::kDevice, 10, KvTier::kHost, 5, 3};
  auto c = LowerTransferGroup(dev, host, g);
  ASSERT_TRUE(c.ok()) << c.status();
  const int64_t token_bytes = 64 * 2;  // one head's row of one token
  EXPECT_EQ(c->src_offset, 10 * 16 * token_bytes);  // 20480
  EXPECT_EQ(c->dst_offset, 5 * 16 * token_bytes);   // 10240
  EXPECT_EQ(c->width, 3 * 16 * token_bytes);        // 6144
  EXPECT_EQ(c->src_pitch, 100 * 16 * token_bytes);  // 204800: the device pool's row
  EXPECT_EQ(c->dst_pitch, 40 * 16 * token_bytes);   // 81920: the host tier's row
  EXPECT_EQ(c->height, 2 * 2 * 4);                  // layers x K|V x heads

  KvPoolShape dev32 = dev, host32 = host;
  dev32.dtype = host32.dtype = DType::kF32;
  auto c32 = LowerTransferGroup(dev32, host32, g);
  ASSERT_TRUE(c32.ok()) << c32.status();
  EXPECT_EQ(c32->src_offset, 2 * c->src_offset);
  EXPECT_EQ(c32->dst_offset, 2 * c->dst_offset);
  EXPECT_EQ(c32->width, 2 * c->width);
  EXPECT_EQ(c32->src_pitch, 2 * c->src_pitch);
  EXPECT_EQ(c32->dst_pitch, 2 * c->dst_pitch);
  EXPECT_EQ(c32->height, c->height);

  // The 2-D copy spans exactly the pools' bytes: a pool's bytes are height x pitch, and a group
  // ending at the last block ends at the pool's last byte (no row reaches past it).
  auto dev_pool = KvPool::Create(dev);
  auto host_pool = KvPool::Create(host);
  ASSERT_TRUE(dev_pool.ok() && host_pool.ok());
  EXPECT_EQ((*dev_pool)->bytes(), c->height * c->src_pitch);
  EXPECT_EQ((*host_pool)->bytes(), c->height * c->dst_pitch);
  const TransferGroup tail{KvTier::kHost, 37, KvTier::kDevice, 97, 3};
  auto t = LowerTransferGroup(host, dev, tail);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->src_offset + (t->height - 1) * t->src_pitch + t->width, (*host_pool)->bytes());
  EXPECT_EQ(t->dst_offset + (t->height - 1) * t->dst_pitch + t->width, (*dev_pool)->bytes());
}

// A bf16 group moves the stored bit patterns, nothing else: every copied element of the
// destination equals its source's 16 bits, and every other element is untouched.
TEST(TransferLoweringTest, Bf16CopyMovesTheStoredBitsOnly) {
  KvPoolShape dev{3, 2, 8, 4, 12, DType::kBF16};
  KvPoolShape host = dev;
  host.num_blocks = 7;
  auto a = KvPool::Create(dev);
  auto b = KvPool::Create(host);
  ASSERT_TRUE(a.ok() && b.ok());
  uint16_t* src = static_cast<uint16_t*>((*a)->Layer(0).k);
  uint16_t* dst = static_cast<uint16_t*>((*b)->Layer(0).k);
  const int64_t n_src = (*a)->bytes() / 2, n_dst = (*b)->bytes() / 2;
  for (int64_t i = 0; i < n_src; ++i) src[i] = FloatToBf16(0.001f * static_cast<float>(i) - 1.0f);
  for (int64_t i = 0; i < n_dst; ++i) dst[i] = 0xdead;
  const TransferGroup g{KvTier::kDevice, 6, KvTier::kHost, 2, 4};
  auto c = LowerTransferGroup(dev, host, g);
  ASSERT_TRUE(c.ok()) << c.status();
  ApplyOnHost(*c, src, dst);
  const int64_t row_tokens_src = dev.num_blocks * dev.block_tokens;
  const int64_t row_tokens_dst = host.num_blocks * host.block_tokens;
  int64_t copied = 0;
  for (int64_t row = 0; row < int64_t{dev.num_layers} * 2 * dev.kv_heads; ++row) {
    for (int64_t tok = 0; tok < row_tokens_dst; ++tok) {
      for (int32_t d = 0; d < dev.head_dim; ++d) {
        const uint16_t got = dst[(row * row_tokens_dst + tok) * dev.head_dim + d];
        const int64_t block = tok / host.block_tokens;
        if (block >= g.dst_first && block < g.dst_first + g.num_blocks) {
          const int64_t src_tok = tok + int64_t{g.src_first - g.dst_first} * dev.block_tokens;
          ASSERT_EQ(got, src[(row * row_tokens_src + src_tok) * dev.head_dim + d])
              << "row " << row << " token " << tok << " element " << d;
          ++copied;
        } else {
          ASSERT_EQ(got, 0xdead) << "row " << row << " token " << tok << " element " << d;
        }
      }
    }
  }
  EXPECT_EQ(copied, int64_t{dev.num_layers} * 2 * dev.kv_heads * g.num_blocks * dev.block_tokens *
                        dev.head_dim);
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
  other = dev;
  other.dtype = DType::kBF16;  // an f32 pool and a bf16 one: not a byte copy
  EXPECT_EQ(LowerTransferGroup(dev, other, g).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvrm::cuda
