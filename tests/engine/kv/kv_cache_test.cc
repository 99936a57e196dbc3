#include "engine/kv/kv_cache.h"

#include <set>

#include <gtest/gtest.h>

#include "common/status_matchers.h"

namespace pd::engine {
namespace {

using ::pd::testing::StatusIs;

KvCacheOptions Small(int blocks) {
  KvCacheOptions o;
  o.n_layer = 2;
  o.n_kv_heads = 2;
  o.head_dim = 8;
  o.block_size = 4;
  o.n_blocks = blocks;
  o.dtype = DType::kF16;
  return o;
}

TEST(KvCacheTest, ReserveGrowsTablesAndFreeReturnsBlocks) {
  auto backend = CreateCpuBackend();
  auto kv = KvCache::Create(Small(8), *backend);
  PD_ASSERT_OK(kv);
  KvCache& c = **kv;
  EXPECT_EQ(c.free_blocks(), 8);
  PD_ASSERT_OK(c.Reserve(1, 5));  // 2 blocks
  EXPECT_EQ(c.BlockTable(1).size(), 2u);
  EXPECT_EQ(c.Capacity(1), 8);
  PD_ASSERT_OK(c.Reserve(1, 8));  // still 2
  EXPECT_EQ(c.BlockTable(1).size(), 2u);
  PD_ASSERT_OK(c.Reserve(2, 12));  // 3 blocks
  EXPECT_EQ(c.free_blocks(), 3);
  std::set<int32_t> all(c.BlockTable(1).begin(), c.BlockTable(1).end());
  all.insert(c.BlockTable(2).begin(), c.BlockTable(2).end());
  EXPECT_EQ(all.size(), 5u);  // no block handed out twice
  c.Free(1);
  EXPECT_EQ(c.free_blocks(), 5);
  EXPECT_TRUE(c.BlockTable(1).empty());
  c.Free(1);  // idempotent
  EXPECT_EQ(c.free_blocks(), 5);
}

TEST(KvCacheTest, ExhaustionFailsWithoutSideEffects) {
  auto backend = CreateCpuBackend();
  auto kv = KvCache::Create(Small(2), *backend);
  PD_ASSERT_OK(kv);
  KvCache& c = **kv;
  EXPECT_THAT(c.Reserve(7, 9), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(c.free_blocks(), 2);
  EXPECT_TRUE(c.BlockTable(7).empty());
  PD_ASSERT_OK(c.Reserve(7, 4));
  EXPECT_THAT(c.Reserve(7, 12), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(c.BlockTable(7).size(), 1u);
  EXPECT_EQ(c.free_blocks(), 1);
}

TEST(KvCacheTest, SizesAndValidation) {
  auto backend = CreateCpuBackend();
  KvCacheOptions o = Small(8);
  // 2 (k,v) x 2 layers x 8 blocks x 4 tokens x 16 elements x 2 bytes
  EXPECT_EQ(KvCache::BytesFor(o), 2u * 2 * 8 * 4 * 16 * 2);
  auto kv = KvCache::Create(o, *backend);
  PD_ASSERT_OK(kv);
  EXPECT_EQ((*kv)->k(1).rows, 32);
  EXPECT_EQ((*kv)->k(1).cols, 16);
  o.n_blocks = 0;
  EXPECT_THAT(KvCache::Create(o, *backend), StatusIs(absl::StatusCode::kInvalidArgument));
  o = Small(8);
  o.dtype = DType::kQ8_0;
  EXPECT_THAT(KvCache::Create(o, *backend), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace pd::engine
