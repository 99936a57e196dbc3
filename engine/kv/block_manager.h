// The host side of the paged KV cache: which block ids each sequence's table holds, and the
// prefix cache over them. It never touches K/V bytes (KvCache owns the storage on a backend).
//
// Every block is in exactly one of three states:
//   free    : no content worth keeping, on the free list;
//   held    : in the table of one or more sequences (ref_count = the number of tables);
//   cached  : held by nobody, but its K/V are a full block of some prompt, filed under its chain
//             hash (block_hash.h) and kept in an LRU list until an allocation needs the block;
//   page    : holds the compressed K/V of up to kPageSlots cached blocks (below).
// Compression (opt-in, PrefixCacheOptions::compress_idle_ms): a cached block left unused that
// long is compressed (KvCache does the bytes: INT8 values, half the bytes of f16) into a slot of a
// page and its own block freed, so two cached blocks then take one block of memory. The filed
// entry keeps its place in the index and the LRU; a hit expands it into a fresh block. Entries
// and blocks share one id space: ids >= n_blocks() are compressed entries.
// A held block may be filed too (a sequence still running whose full blocks were published);
// another sequence with the same prefix then shares it (ref_count > 1).
//
// Sharing rule: only FULL blocks are ever shared, and a full block is never written again. A
// sequence writes only its own last, partial block, which is not filed until it is full. So no
// block is written while it has two owners and no copy-on-write is needed: sharing a partial block
// would save less than one block per sequence and would need a device copy on the first divergent
// write.
//
// Not thread safe: owned by the engine thread, like KvCache.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace pd::engine {

struct PrefixCacheOptions {
  bool enabled = true;  // keep released full blocks for reuse (off: released blocks are freed)
  // Released blocks are kept in the cache only while at least this many blocks stay free (the
  // rest are evicted, least recently used first, when sequences release theirs). 0: the cache may
  // hold every block no sequence holds; allocations evict what they need.
  int min_free_blocks = 0;
  // Hashes in a node's load report (BlockManager::Summary), most recently used first.
  int summary_blocks = 4096;
  // > 0: cached blocks unused for this long are compressed to INT8 in place (twice the cached
  // prefixes in the same memory; a hit on one is no longer bit for bit the cache-off result).
  // Needs an f16 cache in host memory (KvCache::Create checks). 0: off.
  int compress_idle_ms = 0;
  // The scheduler's, not the block manager's: when a request ends (stop or length), an idle
  // engine prefills its prompt + generated tokens again as a prompt, so that its answer's full
  // blocks are filed with prompt numerics and a chat's next turn, which sends the answer back,
  // finds them (Scheduler, docs/kv_cache.md "Filing answers"). A fill yields to any request.
  // Off by default: it spends idle compute on every answer, which pays only for chats.
  bool fill_generated = false;
};

struct PrefixCacheStats {
  int cached_blocks = 0;     // filed blocks (held or in the LRU)
  int evictable_blocks = 0;  // filed blocks no sequence holds (the LRU)
  int64_t evictions = 0;     // filed blocks dropped to make room, since creation
  int compressed_blocks = 0;  // of cached_blocks: held in compressed form (in pages)
  int pages = 0;              // blocks used as pages of compressed entries
  int64_t compressions = 0;   // since creation
  int64_t expansions = 0;     // compressed entries expanded back by a hit
};

// Copies the compressed bytes: `block` -> slot `slot` of page `page` (compress), or back
// (expand). Called by the BlockManager in the middle of a state change; must not fail.
using PageCopy = std::function<void(int32_t block, int32_t page, int slot)>;

class BlockManager {
 public:
  BlockManager(int n_blocks, int block_size, PrefixCacheOptions options);

  // Makes `seq` hold enough blocks for n_tokens positions, taking free blocks first and then
  // evicting least recently used cached ones. RESOURCE_EXHAUSTED (and no change) when free plus
  // evictable blocks are too few.
  absl::Status Reserve(int64_t seq, int n_tokens);
  // Releases every block of `seq`: a block nobody else holds goes to the LRU if it is filed, else
  // to the free list. No-op for an unknown sequence.
  void Free(int64_t seq);
  // Shrinks `seq`'s table to the blocks that cover n_tokens positions: the trailing blocks beyond
  // them (rolled-back speculative positions) are released as Free releases them. Blocks whose
  // chain hash is known (published prompt blocks) are never released by it. No-op for an unknown
  // sequence or a table no longer than that.
  void Truncate(int64_t seq, int n_tokens);

  // For a sequence holding no blocks: finds the longest chain of filed blocks equal to the full
  // blocks of tokens[0, max_tokens) and makes `seq` hold them (their ref counts go up; they leave
  // the LRU). Returns the tokens they cover (a multiple of block_size; 0 when caching is off).
  // A compressed entry on the chain is expanded into a free block (`expand`: page -> block) if
  // one is free; otherwise the match ends before it.
  int MatchPrefix(int64_t seq, absl::Span<const int32_t> tokens, int max_tokens,
                  const PageCopy& expand = nullptr);
  // How many leading tokens of `tokens` MatchPrefix would cover, without taking anything.
  int CachedPrefix(absl::Span<const int32_t> tokens, int max_tokens) const;
  // Files the full blocks of `seq` that cover tokens[0, n_tokens) and are not filed yet: the
  // caller says their K/V are written and final. A block whose chain hash is already filed under
  // another block stays private (freed on release). No-op when caching is off. `tokens` are the
  // sequence's tokens (at least n_tokens of them).
  void Publish(int64_t seq, absl::Span<const int32_t> tokens, int n_tokens);

  // Compresses up to `max_blocks` cached blocks released before now - idle (least recently used
  // first) into page slots (`compress`: block -> page slot), freeing their blocks. Without an
  // open page, the block becomes a page itself, holding its own copy in slot 0 (`compress` is
  // then called with page == block: an in-place conversion). Returns the blocks compressed.
  int CompressIdle(absl::Time now, absl::Duration idle, int max_blocks, const PageCopy& compress);
  // Whether CompressIdle would find a block now (an LRU block idle long enough).
  bool HasIdleBlocks(absl::Time now, absl::Duration idle) const;
  static constexpr int kPageSlots = 2;

  const std::vector<int32_t>& Table(int64_t seq) const;
  // Ids of the sequences holding blocks (any order).
  std::vector<int64_t> Sequences() const;
  // Blocks an allocation can get: free plus evictable.
  int available_blocks() const;
  int free_list_blocks() const { return static_cast<int>(free_.size()); }
  // True when block `block` is shared or filed: nothing may write it.
  bool ReadOnly(int32_t block) const;
  PrefixCacheStats stats() const;
  // Chain hashes of filed blocks, most recently used first, at most options.summary_blocks.
  std::vector<uint64_t> Summary() const;
  int block_size() const { return block_size_; }
  int n_blocks() const { return static_cast<int>(blocks_.size()); }
  bool caching() const { return options_.enabled; }

  // Checks every invariant (each block in exactly one state, ref counts equal the references
  // from tables, the hash index and the LRU agree with the blocks). INTERNAL naming the first
  // broken one. O(blocks + table entries): for tests and debugging.
  absl::Status Audit() const;

 private:
  // A filed block's identity, and its place in the LRU (blocks and compressed entries alike).
  struct Entry {
    bool filed = false;
    bool in_lru = false;
    uint64_t hash = 0;
    uint64_t parent = 0;
    std::vector<int32_t> tokens;  // filed: the block's tokens (to rule out hash collisions)
    std::list<int32_t>::iterator lru_pos;
    absl::Time released = absl::InfinitePast();  // when it last entered the LRU
  };
  struct Block : Entry {
    int ref_count = 0;
    int page_used = -1;  // >= 0: the block is a page with this many occupied slots
    int32_t slots[kPageSlots] = {-1, -1};  // page: the compressed entry ids in each slot
  };
  struct Compressed : Entry {
    int32_t page = -1;  // -1: this entry id is unused
    int slot = 0;
  };
  struct SeqState {
    std::vector<int32_t> table;
    int n_filed = 0;  // leading blocks whose chain hashes are known (filed or duplicates)
    uint64_t last_hash = 0;
  };

  // The filed id (block or compressed entry) for `hash` whose parent and tokens match, or -1.
  int32_t Lookup(uint64_t hash, uint64_t parent, absl::Span<const int32_t> tokens) const;
  Entry& At(int32_t id) {
    return id < n_blocks() ? static_cast<Entry&>(blocks_[id]) : comp_[id - n_blocks()];
  }
  const Entry& At(int32_t id) const {
    return id < n_blocks() ? static_cast<const Entry&>(blocks_[id]) : comp_[id - n_blocks()];
  }
  void Unfile(int32_t id);       // drops it from the hash index
  int32_t TakeBlock();           // a free block, evicting from the LRU front if needed; -1 if none
  void Evict(int32_t id);        // an LRU entry: dropped, its block or page slot freed
  void ReleaseSlot(int32_t id);  // a compressed entry's page slot (the page freed when empty)
  void LruPush(int32_t id, absl::Time now);
  void LruRemove(int32_t id);

  const int block_size_;
  const PrefixCacheOptions options_;
  std::vector<Block> blocks_;
  std::vector<int32_t> free_;  // stack of free block ids
  std::list<int32_t> lru_;     // evictable filed ids, least recently used first
  std::vector<Compressed> comp_;    // compressed entries (id = n_blocks() + index)
  std::vector<int32_t> comp_free_;  // unused indices of comp_
  int lru_blocks_ = 0;              // of lru_: uncompressed blocks
  int pages_ = 0;
  std::vector<int32_t> open_pages_;  // pages with a free slot (may hold stale ids)
  int n_compressed_ = 0;
  int64_t compressions_ = 0, expansions_ = 0;
  absl::flat_hash_map<uint64_t, int32_t> index_;  // chain hash -> filed block
  absl::flat_hash_map<int64_t, SeqState> seqs_;
  int n_filed_ = 0;
  int64_t evictions_ = 0;
};

}  // namespace pd::engine
