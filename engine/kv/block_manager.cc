#include "engine/kv/block_manager.h"

#include <algorithm>

#include "common/status.h"
#include "common/strings.h"
#include "engine/kv/block_hash.h"

namespace pd::engine {

BlockManager::BlockManager(int n_blocks, int block_size, PrefixCacheOptions options)
    : block_size_(block_size), options_(options), blocks_(n_blocks) {
  PD_CHECK(n_blocks > 0 && block_size > 0);
  free_.reserve(n_blocks);
  for (int b = n_blocks - 1; b >= 0; --b) free_.push_back(b);
}

int BlockManager::available_blocks() const {
  // Every page comes back once its entries are evicted, and they are all evictable.
  return static_cast<int>(free_.size()) + lru_blocks_ + pages_;
}

bool BlockManager::ReadOnly(int32_t block) const {
  const Block& b = blocks_[block];
  return b.filed || b.ref_count > 1 || b.page_used >= 0;
}

PrefixCacheStats BlockManager::stats() const {
  PrefixCacheStats s;
  s.cached_blocks = n_filed_;
  s.evictable_blocks = static_cast<int>(lru_.size());
  s.evictions = evictions_;
  s.compressed_blocks = n_compressed_;
  s.pages = pages_;
  s.compressions = compressions_;
  s.expansions = expansions_;
  return s;
}

void BlockManager::Unfile(int32_t id) {
  Entry& e = At(id);
  if (!e.filed) return;
  auto it = index_.find(e.hash);
  if (it != index_.end() && it->second == id) index_.erase(it);
  e.filed = false;
  e.hash = e.parent = 0;
  e.tokens.clear();
  e.tokens.shrink_to_fit();
  --n_filed_;
}

void BlockManager::LruPush(int32_t id, absl::Time now) {
  Entry& e = At(id);
  e.lru_pos = lru_.insert(lru_.end(), id);
  e.in_lru = true;
  e.released = now;
  if (id < n_blocks()) ++lru_blocks_;
}

void BlockManager::LruRemove(int32_t id) {
  Entry& e = At(id);
  PD_CHECK(e.in_lru);
  lru_.erase(e.lru_pos);
  e.in_lru = false;
  if (id < n_blocks()) --lru_blocks_;
}

void BlockManager::ReleaseSlot(int32_t id) {
  Compressed& c = comp_[id - n_blocks()];
  Block& page = blocks_[c.page];
  PD_CHECK(page.page_used > 0 && page.slots[c.slot] == id);
  page.slots[c.slot] = -1;
  if (--page.page_used == 0) {
    page.page_used = -1;
    --pages_;
    free_.push_back(c.page);
  } else {
    open_pages_.push_back(c.page);
  }
  c.page = -1;
  comp_free_.push_back(id - n_blocks());
  --n_compressed_;
}

void BlockManager::Evict(int32_t id) {
  PD_CHECK(At(id).in_lru);
  LruRemove(id);
  Unfile(id);
  ++evictions_;
  if (id < n_blocks()) {
    PD_CHECK(blocks_[id].ref_count == 0);
    free_.push_back(id);
  } else {
    ReleaseSlot(id);
  }
}

int32_t BlockManager::TakeBlock() {
  // Evicting a compressed entry frees a block only when its page empties: evict until one is.
  while (free_.empty() && !lru_.empty()) Evict(lru_.front());
  if (free_.empty()) return -1;
  const int32_t id = free_.back();
  free_.pop_back();
  return id;
}

absl::Status BlockManager::Reserve(int64_t seq, int n_tokens) {
  const size_t need = (static_cast<size_t>(std::max(n_tokens, 0)) + block_size_ - 1) / block_size_;
  auto it = seqs_.find(seq);
  const size_t have = it == seqs_.end() ? 0 : it->second.table.size();
  if (need <= have) return absl::OkStatus();
  const size_t more = need - have;
  if (more > static_cast<size_t>(available_blocks())) {
    return absl::ResourceExhaustedError(
        pd::StrCat("KV cache full: sequence needs ", more, " more blocks, ", free_.size(),
                   " free and ", lru_blocks_ + pages_, " more held by cached but unused prefixes"));
  }
  SeqState& s = it == seqs_.end() ? seqs_[seq] : it->second;
  for (size_t i = 0; i < more; ++i) {
    const int32_t id = TakeBlock();
    PD_CHECK(id >= 0);
    blocks_[id].ref_count = 1;
    s.table.push_back(id);
  }
  return absl::OkStatus();
}

void BlockManager::Truncate(int64_t seq, int n_tokens) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  SeqState& s = it->second;
  // Hashed (filed or duplicate) blocks hold final K/V of the prompt: never released here.
  const size_t keep = std::max<size_t>(
      (static_cast<size_t>(std::max(n_tokens, 0)) + block_size_ - 1) / block_size_, s.n_filed);
  if (s.table.size() <= keep) return;
  const absl::Time now = options_.compress_idle_ms > 0 ? absl::Now() : absl::InfinitePast();
  while (s.table.size() > keep) {
    const int32_t b = s.table.back();
    s.table.pop_back();
    Block& blk = blocks_[b];
    PD_CHECK(blk.ref_count > 0);
    if (--blk.ref_count > 0) continue;
    if (blk.filed) {
      LruPush(b, now);
    } else {
      free_.push_back(b);
    }
  }
}

void BlockManager::Free(int64_t seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  const std::vector<int32_t>& table = it->second.table;
  const absl::Time now = options_.compress_idle_ms > 0 ? absl::Now() : absl::InfinitePast();
  // Last block first: a chain's tail is then evicted before its head (a head without its tail is
  // still a useful prefix; a tail without its head is unreachable).
  for (auto b = table.rbegin(); b != table.rend(); ++b) {
    Block& blk = blocks_[*b];
    PD_CHECK(blk.ref_count > 0);
    if (--blk.ref_count > 0) continue;
    if (blk.filed) {
      LruPush(*b, now);
    } else {
      free_.push_back(*b);
    }
  }
  seqs_.erase(it);
  while (static_cast<int>(free_.size()) < options_.min_free_blocks && !lru_.empty()) {
    Evict(lru_.front());
  }
}

int32_t BlockManager::Lookup(uint64_t hash, uint64_t parent,
                             absl::Span<const int32_t> tokens) const {
  auto it = index_.find(hash);
  if (it == index_.end()) return -1;
  const Entry& e = At(it->second);
  if (e.parent != parent ||
      !std::equal(tokens.begin(), tokens.end(), e.tokens.begin(), e.tokens.end())) {
    return -1;  // a 64-bit collision
  }
  return it->second;
}

int BlockManager::CachedPrefix(absl::Span<const int32_t> tokens, int max_tokens) const {
  if (!options_.enabled) return 0;
  const int n = std::min<int>(max_tokens, static_cast<int>(tokens.size())) / block_size_;
  uint64_t h = kRootBlockHash;
  int i = 0;
  for (; i < n; ++i) {
    const auto block = tokens.subspan(static_cast<size_t>(i) * block_size_, block_size_);
    const uint64_t next = BlockHash(h, block);
    if (Lookup(next, h, block) < 0) break;
    h = next;
  }
  return i * block_size_;
}

int BlockManager::MatchPrefix(int64_t seq, absl::Span<const int32_t> tokens, int max_tokens,
                              const PageCopy& expand) {
  if (!options_.enabled) return 0;
  PD_CHECK_MSG(Table(seq).empty(), "MatchPrefix: the sequence already holds blocks");
  const int n = std::min<int>(max_tokens, static_cast<int>(tokens.size())) / block_size_;
  uint64_t h = kRootBlockHash;
  std::vector<int32_t> found;
  SeqState* s = nullptr;
  for (int i = 0; i < n; ++i) {
    const auto block = tokens.subspan(static_cast<size_t>(i) * block_size_, block_size_);
    const uint64_t next = BlockHash(h, block);
    int32_t id = Lookup(next, h, block);
    if (id < 0) break;
    if (id >= n_blocks()) {
      // Compressed: expand into a block, evicting other LRU entries if none is free. The blocks
      // matched so far are held already (not evictable) and this entry is taken out of the LRU
      // first; a later entry of the chain may be evicted, which only ends the match there.
      if (!expand) break;
      LruRemove(id);
      const int32_t dst = TakeBlock();
      if (dst < 0) {
        LruPush(id, At(id).released);
        break;
      }
      Compressed& c = comp_[id - n_blocks()];
      expand(dst, c.page, c.slot);
      Block& b = blocks_[dst];
      b.filed = true;
      b.hash = c.hash;
      b.parent = c.parent;
      b.tokens = std::move(c.tokens);
      c.filed = false;
      c.tokens.clear();
      ReleaseSlot(id);
      index_[b.hash] = dst;
      ++expansions_;
      id = dst;
    }
    Block& b = blocks_[id];
    if (b.in_lru) LruRemove(id);
    ++b.ref_count;
    if (s == nullptr) s = &seqs_[seq];
    s->table.push_back(id);
    found.push_back(id);
    h = next;
  }
  if (found.empty()) return 0;
  s->n_filed = static_cast<int>(found.size());
  s->last_hash = h;
  return static_cast<int>(found.size()) * block_size_;
}

void BlockManager::Publish(int64_t seq, absl::Span<const int32_t> tokens, int n_tokens) {
  if (!options_.enabled) return;
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  SeqState& s = it->second;
  const int full = std::min<int>({n_tokens, static_cast<int>(tokens.size()),
                                  static_cast<int>(s.table.size()) * block_size_}) /
                   block_size_;
  if (s.n_filed == 0) s.last_hash = kRootBlockHash;
  for (int i = s.n_filed; i < full; ++i) {
    const auto block = tokens.subspan(static_cast<size_t>(i) * block_size_, block_size_);
    const uint64_t next = BlockHash(s.last_hash, block);
    const int32_t id = s.table[i];
    Block& b = blocks_[id];
    if (!b.filed && !index_.contains(next)) {
      b.filed = true;
      b.hash = next;
      b.parent = s.last_hash;
      b.tokens.assign(block.begin(), block.end());
      index_.emplace(next, id);
      ++n_filed_;
    }
    s.last_hash = next;
    s.n_filed = i + 1;
  }
}

bool BlockManager::HasIdleBlocks(absl::Time now, absl::Duration idle) const {
  for (int32_t id : lru_) {
    const Entry& e = At(id);
    if (e.released > now - idle) return false;  // the rest were released later
    if (id < n_blocks()) return true;
  }
  return false;
}

int BlockManager::CompressIdle(absl::Time now, absl::Duration idle, int max_blocks,
                               const PageCopy& compress) {
  int done = 0;
  for (auto it = lru_.begin(); it != lru_.end() && done < max_blocks;) {
    const int32_t id = *it++;
    const Entry& e = At(id);
    if (e.released > now - idle) break;  // the LRU is in release order
    if (id >= n_blocks()) continue;      // already compressed
    // A page with a free slot (open_pages_ may hold stale ids: checked here), else the block
    // itself becomes a page, its own compressed copy in slot 0 (compressed in place: no free
    // block is needed, so compression works when memory is full, which is when it matters).
    int32_t page = -1;
    while (page < 0 && !open_pages_.empty()) {
      const int32_t p = open_pages_.back();
      open_pages_.pop_back();
      if (blocks_[p].page_used > 0 && blocks_[p].page_used < kPageSlots) page = p;
    }
    const bool in_place = page < 0;
    if (in_place) page = id;
    Block& pg = blocks_[page];
    int slot = 0;
    while (pg.slots[slot] >= 0) ++slot;
    int32_t ci;
    if (comp_free_.empty()) {
      ci = static_cast<int32_t>(comp_.size());
      comp_.emplace_back();
    } else {
      ci = comp_free_.back();
      comp_free_.pop_back();
    }
    const int32_t cid = n_blocks() + ci;
    compress(id, page, slot);
    Block& b = blocks_[id];
    Compressed& c = comp_[ci];
    c.page = page;
    c.slot = slot;
    c.filed = true;
    c.hash = b.hash;
    c.parent = b.parent;
    c.tokens = std::move(b.tokens);
    b.tokens.clear();
    b.filed = false;
    b.hash = b.parent = 0;
    // The entry takes the block's place in the LRU (same recency).
    c.lru_pos = lru_.insert(b.lru_pos, cid);
    c.in_lru = true;
    c.released = b.released;
    lru_.erase(b.lru_pos);
    b.in_lru = false;
    --lru_blocks_;
    index_[c.hash] = cid;
    if (in_place) {
      pg.page_used = 0;
      ++pages_;
    }
    pg.slots[slot] = cid;
    if (++pg.page_used < kPageSlots) open_pages_.push_back(page);
    if (!in_place) free_.push_back(id);
    ++n_compressed_;
    ++compressions_;
    ++done;
  }
  return done;
}

const std::vector<int32_t>& BlockManager::Table(int64_t seq) const {
  static const std::vector<int32_t> kEmpty;
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? kEmpty : it->second.table;
}

std::vector<int64_t> BlockManager::Sequences() const {
  std::vector<int64_t> out;
  out.reserve(seqs_.size());
  for (const auto& [seq, s] : seqs_) out.push_back(seq);
  return out;
}

std::vector<uint64_t> BlockManager::Summary() const {
  std::vector<uint64_t> out;
  const size_t cap = static_cast<size_t>(std::max(options_.summary_blocks, 0));
  if (!options_.enabled || cap == 0) return out;
  out.reserve(std::min<size_t>(cap, n_filed_));
  for (const Block& b : blocks_) {  // held filed blocks: in use now
    if (out.size() >= cap) return out;
    if (b.filed && b.ref_count > 0) out.push_back(b.hash);
  }
  for (auto it = lru_.rbegin(); it != lru_.rend() && out.size() < cap; ++it) {
    out.push_back(At(*it).hash);
  }
  return out;
}

absl::Status BlockManager::Audit() const {
  auto broken = [](auto&&... parts) { return absl::InternalError(pd::StrCat(parts...)); };
  std::vector<int> refs(blocks_.size(), 0);
  for (const auto& [seq, s] : seqs_) {
    if (s.table.empty()) return broken("sequence ", seq, " holds an empty table");
    if (s.n_filed > static_cast<int>(s.table.size())) {
      return broken("sequence ", seq, ": ", s.n_filed, " hashed blocks of ", s.table.size());
    }
    for (int32_t id : s.table) {
      if (id < 0 || id >= n_blocks()) return broken("sequence ", seq, " holds block ", id);
      ++refs[id];
    }
  }
  std::vector<char> on_free(blocks_.size(), 0);
  for (int32_t id : free_) {
    if (id < 0 || id >= n_blocks() || on_free[id]) return broken("free list entry ", id);
    on_free[id] = 1;
  }
  size_t in_lru = 0;
  int lru_blocks = 0;
  for (int32_t id : lru_) {
    if (id < 0 || id >= n_blocks() + static_cast<int32_t>(comp_.size()) || !At(id).in_lru) {
      return broken("LRU entry ", id);
    }
    ++in_lru;
    lru_blocks += id < n_blocks();
  }
  if (in_lru != lru_.size() || lru_blocks != lru_blocks_) return broken("LRU size");
  int filed = 0, pages = 0, compressed = 0;
  for (int32_t id = 0; id < n_blocks(); ++id) {
    const Block& b = blocks_[id];
    if (b.ref_count != refs[id]) {
      return broken("block ", id, ": ref count ", b.ref_count, ", held by ", refs[id], " tables");
    }
    const bool page = b.page_used >= 0;
    const int states = (refs[id] > 0) + on_free[id] + b.in_lru + page;
    if (states != 1) {
      return broken("block ", id, " is in ", states, " states (held ", refs[id], ", free ",
                    int{on_free[id]}, ", lru ", int{b.in_lru}, ", page ", int{page}, ")");
    }
    if (b.in_lru && !b.filed) return broken("block ", id, " in the LRU but not filed");
    if ((on_free[id] || page) && b.filed) return broken("block ", id, " free or a page but filed");
    if (page) {
      ++pages;
      int used = 0;
      for (int s = 0; s < kPageSlots; ++s) {
        const int32_t cid = b.slots[s];
        if (cid < 0) continue;
        ++used;
        if (cid < n_blocks() || cid - n_blocks() >= static_cast<int32_t>(comp_.size()) ||
            comp_[cid - n_blocks()].page != id || comp_[cid - n_blocks()].slot != s) {
          return broken("page ", id, " slot ", s, " names entry ", cid, " which is not there");
        }
      }
      if (used != b.page_used || used == 0) return broken("page ", id, " occupancy ", used);
    }
  }
  for (size_t i = 0; i < comp_.size(); ++i) {
    const Compressed& c = comp_[i];
    if (c.page < 0) continue;
    ++compressed;
    if (!c.filed || !c.in_lru) return broken("compressed entry ", i, " not filed or not in LRU");
  }
  for (int32_t id = 0; id < n_blocks() + static_cast<int32_t>(comp_.size()); ++id) {
    if (id >= n_blocks() && comp_[id - n_blocks()].page < 0) continue;
    const Entry& e = At(id);
    if (!e.filed) continue;
    ++filed;
    auto it = index_.find(e.hash);
    if (it == index_.end() || it->second != id) return broken("entry ", id, " not indexed");
    if (static_cast<int>(e.tokens.size()) != block_size_) return broken("entry ", id, " tokens");
    if (BlockHash(e.parent, e.tokens) != e.hash) return broken("entry ", id, " hash");
  }
  if (filed != n_filed_ || static_cast<size_t>(filed) != index_.size()) {
    return broken("filed count ", n_filed_, ", entries filed ", filed, ", index ", index_.size());
  }
  if (pages != pages_ || compressed != n_compressed_) {
    return broken("pages ", pages_, " vs ", pages, ", compressed ", n_compressed_, " vs ",
                  compressed);
  }
  return absl::OkStatus();
}

}  // namespace pd::engine
