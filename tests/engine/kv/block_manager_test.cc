// BlockManager: sharing of full prompt blocks, the LRU of released ones, eviction only under
// pressure, and the audit after long random runs (no leak, every shared block freed once).
#include "engine/kv/block_manager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "common/status_matchers.h"
#include "engine/kv/block_hash.h"

namespace pd::engine {
namespace {

using ::pd::testing::StatusIs;

std::vector<int32_t> Tokens(int n, int32_t base) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = base + i;
  return t;
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Reserves and "computes" a sequence: its blocks for all tokens, then files them.
void Compute(BlockManager& m, int64_t seq, const std::vector<int32_t>& tokens) {
  PD_ASSERT_OK(m.Reserve(seq, static_cast<int>(tokens.size())));
  m.Publish(seq, tokens, static_cast<int>(tokens.size()));
}

TEST(BlockHashTest, IsAFixedFunctionOfTheWholePrefix) {
  // Pinned: a router and nodes of different builds must agree on it.
  const std::vector<int32_t> t = {1, 2, 3, 4};
  EXPECT_EQ(BlockHash(kRootBlockHash, t), BlockHash(kRootBlockHash, t));
  EXPECT_EQ(BlockHashes(t, 2).size(), 2u);
  EXPECT_EQ(BlockHashes(t, 2)[0], BlockHash(kRootBlockHash, {1, 2}));
  EXPECT_EQ(BlockHashes(t, 2)[1], BlockHash(BlockHash(kRootBlockHash, {1, 2}), {3, 4}));
  EXPECT_EQ(BlockHashes(t, 3).size(), 1u);  // full blocks only
  EXPECT_EQ(BlockHashes(t, 2, 1).size(), 1u);
  // Same block tokens after different prefixes hash differently; order matters.
  EXPECT_NE(BlockHashes({9, 9, 3, 4}, 2)[1], BlockHashes(t, 2)[1]);
  EXPECT_NE(BlockHash(kRootBlockHash, {2, 1}), BlockHash(kRootBlockHash, {1, 2}));
  EXPECT_EQ(BlockHash(kRootBlockHash, t), 0x9520d7c707bd9cefULL);
}

TEST(BlockManagerTest, EqualPrefixesShareFullBlocksOnly) {
  BlockManager m(16, 4, PrefixCacheOptions{});
  const std::vector<int32_t> a = Tokens(10, 100);  // 2 full blocks + 2 tokens
  Compute(m, 1, a);
  EXPECT_EQ(m.stats().cached_blocks, 2);  // the partial third block is not filed
  const std::vector<int32_t> b = Concat(Tokens(9, 100), Tokens(5, 500));
  EXPECT_EQ(m.CachedPrefix(b, 14), 8);
  EXPECT_EQ(m.MatchPrefix(2, b, 14), 8);
  ASSERT_EQ(m.Table(2).size(), 2u);
  EXPECT_EQ(m.Table(2)[0], m.Table(1)[0]);
  EXPECT_EQ(m.Table(2)[1], m.Table(1)[1]);
  EXPECT_TRUE(m.ReadOnly(m.Table(1)[0]));
  EXPECT_FALSE(m.ReadOnly(m.Table(1)[2]));  // the partial block stays private and writable
  PD_ASSERT_OK(m.Reserve(2, 14));           // its own third and fourth block
  EXPECT_EQ(m.Table(2).size(), 4u);
  EXPECT_NE(m.Table(2)[2], m.Table(1)[2]);
  PD_EXPECT_OK(m.Audit());
  // max_tokens caps the match at whole blocks.
  EXPECT_EQ(m.CachedPrefix(b, 7), 4);
  EXPECT_EQ(m.CachedPrefix(b, 3), 0);
  // A different first block matches nothing even when later blocks are equal.
  EXPECT_EQ(m.CachedPrefix(Concat({7, 7, 7, 7}, Tokens(6, 104)), 10), 0);
}

TEST(BlockManagerTest, SharedBlocksAreFreedOnceWhenTheLastHolderLeaves) {
  BlockManager m(8, 4, PrefixCacheOptions{});
  const std::vector<int32_t> p = Tokens(8, 0);
  Compute(m, 1, p);
  ASSERT_EQ(m.MatchPrefix(2, p, 8), 8);
  ASSERT_EQ(m.MatchPrefix(3, p, 8), 8);
  EXPECT_EQ(m.available_blocks(), 6);
  m.Free(1);
  m.Free(2);
  EXPECT_EQ(m.available_blocks(), 6);  // still held by 3
  EXPECT_EQ(m.stats().evictable_blocks, 0);
  PD_EXPECT_OK(m.Audit());
  m.Free(3);
  EXPECT_EQ(m.available_blocks(), 8);
  EXPECT_EQ(m.stats().evictable_blocks, 2);
  EXPECT_EQ(m.free_list_blocks(), 6);
  PD_EXPECT_OK(m.Audit());
  m.Free(3);  // unknown now: no-op
  PD_EXPECT_OK(m.Audit());
}

TEST(BlockManagerTest, AllocationUsesFreeBlocksFirstThenEvictsLeastRecentlyUsed) {
  BlockManager m(6, 2, PrefixCacheOptions{});
  const std::vector<int32_t> old_p = Tokens(4, 0), new_p = Tokens(4, 50);
  Compute(m, 1, old_p);
  m.Free(1);
  Compute(m, 2, new_p);
  m.Free(2);
  EXPECT_EQ(m.stats().evictable_blocks, 4);
  EXPECT_EQ(m.free_list_blocks(), 2);
  PD_ASSERT_OK(m.Reserve(3, 4));  // the two free blocks: nothing evicted
  EXPECT_EQ(m.stats().evictions, 0);
  EXPECT_EQ(m.CachedPrefix(old_p, 4), 4);
  PD_ASSERT_OK(m.Reserve(4, 2));  // evicts the least recently used chain's TAIL first
  EXPECT_EQ(m.stats().evictions, 1);
  EXPECT_EQ(m.CachedPrefix(old_p, 4), 2);
  EXPECT_EQ(m.CachedPrefix(new_p, 4), 4);
  // A hit refreshes: new_p's blocks are taken and released again, old_p is now older.
  ASSERT_EQ(m.MatchPrefix(5, new_p, 4), 4);
  m.Free(5);
  PD_ASSERT_OK(m.Reserve(6, 2));
  EXPECT_EQ(m.CachedPrefix(old_p, 4), 0);
  EXPECT_EQ(m.CachedPrefix(new_p, 4), 4);
  // Free + evictable is what an allocation can get; beyond it nothing changes.
  EXPECT_EQ(m.available_blocks(), 2);
  EXPECT_THAT(m.Reserve(7, 6), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_TRUE(m.Table(7).empty());
  PD_EXPECT_OK(m.Audit());
}

TEST(BlockManagerTest, MinFreeBlocksEvictsOnRelease) {
  PrefixCacheOptions o;
  o.min_free_blocks = 3;
  BlockManager m(4, 2, o);
  Compute(m, 1, Tokens(8, 0));  // all four blocks, filed
  m.Free(1);
  EXPECT_EQ(m.free_list_blocks(), 3);
  EXPECT_EQ(m.stats().evictable_blocks, 1);
  EXPECT_EQ(m.CachedPrefix(Tokens(8, 0), 8), 2);  // the head survives
  PD_EXPECT_OK(m.Audit());
}

TEST(BlockManagerTest, DisabledCachingFreesEverythingAndMatchesNothing) {
  BlockManager m(4, 2, PrefixCacheOptions{.enabled = false});
  Compute(m, 1, Tokens(8, 0));
  EXPECT_EQ(m.stats().cached_blocks, 0);
  m.Free(1);
  EXPECT_EQ(m.free_list_blocks(), 4);
  EXPECT_EQ(m.MatchPrefix(2, Tokens(8, 0), 8), 0);
  EXPECT_TRUE(m.Summary().empty());
  PD_EXPECT_OK(m.Audit());
}

TEST(BlockManagerTest, DuplicateBlocksStayPrivate) {
  BlockManager m(8, 2, PrefixCacheOptions{});
  const std::vector<int32_t> p = Tokens(4, 0);
  // Two sequences computed the same prompt side by side (neither could share yet).
  PD_ASSERT_OK(m.Reserve(1, 4));
  PD_ASSERT_OK(m.Reserve(2, 4));
  m.Publish(1, p, 4);
  m.Publish(2, p, 4);
  EXPECT_EQ(m.stats().cached_blocks, 2);
  EXPECT_FALSE(m.ReadOnly(m.Table(2)[0]));
  m.Free(2);
  EXPECT_EQ(m.free_list_blocks(), 6);  // sequence 2's copies went back to the free list
  m.Free(1);
  EXPECT_EQ(m.stats().evictable_blocks, 2);
  PD_EXPECT_OK(m.Audit());
}

TEST(BlockManagerTest, PublishContinuesAChainTakenFromTheCache) {
  BlockManager m(8, 2, PrefixCacheOptions{});
  Compute(m, 1, Tokens(4, 0));
  m.Free(1);
  const std::vector<int32_t> longer = Tokens(8, 0);
  ASSERT_EQ(m.MatchPrefix(2, longer, 8), 4);
  PD_ASSERT_OK(m.Reserve(2, 8));
  m.Publish(2, longer, 8);
  m.Free(2);
  EXPECT_EQ(m.CachedPrefix(longer, 8), 8);
  EXPECT_EQ(m.stats().cached_blocks, 4);
  // The summary lists them, most recent first, bounded.
  EXPECT_EQ(m.Summary().size(), 4u);
  EXPECT_EQ(m.Summary().front(), BlockHashes(longer, 2).front());  // released last: freshest
  BlockManager small(8, 2, PrefixCacheOptions{.summary_blocks = 1});
  Compute(small, 1, longer);
  EXPECT_EQ(small.Summary().size(), 1u);
  PD_EXPECT_OK(m.Audit());
}

// Compression (compress_idle_ms): idle cached blocks move into page slots, two per page, and
// their blocks are freed; the entries keep their place in the index and the LRU; a hit expands
// them into free blocks; pressure evicts them like any cached block.
TEST(BlockManagerTest, IdleBlocksCompressTwoPerPageAndExpandOnAHit) {
  BlockManager m(8, 2, PrefixCacheOptions{.compress_idle_ms = 1});
  const std::vector<int32_t> p = Tokens(8, 0);  // 4 blocks
  Compute(m, 1, p);
  m.Free(1);
  const absl::Time later = absl::Now() + absl::Seconds(1);
  EXPECT_FALSE(m.HasIdleBlocks(absl::Now() - absl::Seconds(1), absl::Milliseconds(1)));
  EXPECT_TRUE(m.HasIdleBlocks(later, absl::Milliseconds(1)));
  std::vector<std::tuple<int32_t, int32_t, int>> moves;
  auto record = [&](int32_t b, int32_t page, int slot) { moves.emplace_back(b, page, slot); };
  EXPECT_EQ(m.CompressIdle(later, absl::Milliseconds(1), 3, record), 3);  // bounded
  EXPECT_EQ(m.CompressIdle(later, absl::Milliseconds(1), 10, record), 1);
  EXPECT_EQ(m.CompressIdle(later, absl::Milliseconds(1), 10, record), 0);  // all compressed
  ASSERT_EQ(moves.size(), 4u);
  EXPECT_EQ(std::get<1>(moves[0]), std::get<1>(moves[1]));  // two per page
  EXPECT_NE(std::get<2>(moves[0]), std::get<2>(moves[1]));
  PrefixCacheStats st = m.stats();
  EXPECT_EQ(st.compressed_blocks, 4);
  EXPECT_EQ(st.pages, 2);
  EXPECT_EQ(st.cached_blocks, 4);
  EXPECT_EQ(m.free_list_blocks(), 6);  // 8 - 2 pages: the four blocks' memory is now two
  EXPECT_EQ(m.available_blocks(), 8);
  EXPECT_TRUE(m.ReadOnly(std::get<1>(moves[0])));
  EXPECT_EQ(m.Summary().size(), 4u);
  PD_EXPECT_OK(m.Audit());
  EXPECT_EQ(m.CachedPrefix(p, 8), 8);
  // A hit expands the chain's compressed entries (page -> a free block each).
  std::vector<std::tuple<int32_t, int32_t, int>> expanded;
  ASSERT_EQ(m.MatchPrefix(
                2, p, 6,
                [&](int32_t b, int32_t page, int slot) { expanded.emplace_back(b, page, slot); }),
            6);
  ASSERT_EQ(expanded.size(), 3u);
  EXPECT_EQ(m.stats().expansions, 3);
  EXPECT_EQ(m.stats().compressed_blocks, 1);
  PD_EXPECT_OK(m.Audit());
  // Without an expand callback a compressed entry ends the match.
  EXPECT_EQ(m.MatchPrefix(3, p, 8), 6);
  m.Free(2);
  m.Free(3);
  PD_EXPECT_OK(m.Audit());
  // Pressure: taking every block evicts the compressed entry and its page too.
  PD_ASSERT_OK(m.Reserve(4, 16));
  EXPECT_EQ(m.stats().compressed_blocks, 0);
  EXPECT_EQ(m.stats().pages, 0);
  PD_EXPECT_OK(m.Audit());
  m.Free(4);
  EXPECT_EQ(m.available_blocks(), 8);
  PD_EXPECT_OK(m.Audit());
}

// 10,000 random requests: reserve with or without a cache lookup, grow, publish, release at
// random points (finish, preemption, cancellation). After every operation the audit holds; at the
// end every block is free or cached-and-unused.
TEST(BlockManagerTest, RandomWorkloadNeverLeaksOrDoubleFrees) {
  std::mt19937 rng(7);
  BlockManager m(64, 4, PrefixCacheOptions{.min_free_blocks = 2, .compress_idle_ms = 1});
  const auto nop = [](int32_t, int32_t, int) {};
  const std::vector<std::vector<int32_t>> prefixes = {Tokens(12, 0), Tokens(20, 1000),
                                                      Tokens(7, 2000)};
  struct Live {
    std::vector<int32_t> tokens;
    int computed = 0;
  };
  std::map<int64_t, Live> live;
  int64_t next = 0;
  int started = 0;
  while (started < 10000 || !live.empty()) {
    const int op = static_cast<int>(rng() % 4);
    if (rng() % 8 == 0) {  // idle blocks compressed now and then
      m.CompressIdle(absl::Now() + absl::Seconds(1), absl::Milliseconds(1),
                     static_cast<int>(rng() % 5), nop);
    }
    if (op == 0 && started < 10000) {
      Live l;
      l.tokens = prefixes[rng() % prefixes.size()];
      const int extra = static_cast<int>(rng() % 12);
      for (int i = 0; i < extra; ++i) l.tokens.push_back(static_cast<int32_t>(rng() % 50));
      const int64_t id = next++;
      ++started;
      l.computed = m.MatchPrefix(id, l.tokens, static_cast<int>(l.tokens.size()) - 1, nop);
      ASSERT_EQ(l.computed % 4, 0);
      if (!m.Reserve(id, l.computed + 1).ok()) {
        m.Free(id);  // no room: give the cached blocks back, drop the request
      } else {
        live.emplace(id, std::move(l));
      }
    } else if (!live.empty()) {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      Live& l = it->second;
      if (op == 3 || l.computed >= static_cast<int>(l.tokens.size()) + 8) {
        m.Free(it->first);  // finished, cancelled or preempted
        live.erase(it);
      } else {
        const int grow = 1 + static_cast<int>(rng() % 6);
        if (m.Reserve(it->first, l.computed + grow).ok()) {
          l.computed += grow;
          while (static_cast<int>(l.tokens.size()) < l.computed) l.tokens.push_back(7);
          m.Publish(it->first, l.tokens, l.computed);
        } else {
          m.Free(it->first);  // preempted
          live.erase(it);
        }
      }
    }
    ASSERT_TRUE(m.Audit().ok()) << m.Audit() << " after " << started << " requests";
  }
  EXPECT_EQ(m.available_blocks(), 64);
  EXPECT_TRUE(m.Sequences().empty());
  EXPECT_GT(m.stats().evictions, 0);
  EXPECT_GT(m.stats().compressions, 0);
  EXPECT_GT(m.stats().expansions, 0);
}

}  // namespace
}  // namespace pd::engine
