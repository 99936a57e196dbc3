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

int BlockManager::available_blocks() const { return static_cast<int>(free_.size() + lru_.size()); }

bool BlockManager::ReadOnly(int32_t block) const {
  const Block& b = blocks_[block];
  return b.filed || b.ref_count > 1;
}

PrefixCacheStats BlockManager::stats() const {
  return PrefixCacheStats{n_filed_, static_cast<int>(lru_.size()), evictions_};
}

void BlockManager::Unfile(int32_t id) {
  Block& b = blocks_[id];
  if (!b.filed) return;
  auto it = index_.find(b.hash);
  if (it != index_.end() && it->second == id) index_.erase(it);
  b.filed = false;
  b.hash = b.parent = 0;
  b.tokens.clear();
  b.tokens.shrink_to_fit();
  --n_filed_;
}

void BlockManager::Evict(int32_t id) {
  Block& b = blocks_[id];
  PD_CHECK(b.in_lru && b.ref_count == 0);
  lru_.erase(b.lru_pos);
  b.in_lru = false;
  Unfile(id);
  ++evictions_;
  free_.push_back(id);
}

int32_t BlockManager::TakeBlock() {
  if (free_.empty()) {
    if (lru_.empty()) return -1;
    Evict(lru_.front());
  }
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
    return absl::ResourceExhaustedError(pd::StrCat("KV cache full: sequence needs ", more,
                                                   " more blocks, ", free_.size(), " free and ",
                                                   lru_.size(), " cached but unused"));
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

void BlockManager::Free(int64_t seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  const std::vector<int32_t>& table = it->second.table;
  // Last block first: a chain's tail is then evicted before its head (a head without its tail is
  // still a useful prefix; a tail without its head is unreachable).
  for (auto b = table.rbegin(); b != table.rend(); ++b) {
    Block& blk = blocks_[*b];
    PD_CHECK(blk.ref_count > 0);
    if (--blk.ref_count > 0) continue;
    if (blk.filed) {
      blk.lru_pos = lru_.insert(lru_.end(), *b);
      blk.in_lru = true;
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
  const Block& b = blocks_[it->second];
  if (b.parent != parent ||
      !std::equal(tokens.begin(), tokens.end(), b.tokens.begin(), b.tokens.end())) {
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

int BlockManager::MatchPrefix(int64_t seq, absl::Span<const int32_t> tokens, int max_tokens) {
  if (!options_.enabled) return 0;
  PD_CHECK_MSG(Table(seq).empty(), "MatchPrefix: the sequence already holds blocks");
  const int n = std::min<int>(max_tokens, static_cast<int>(tokens.size())) / block_size_;
  uint64_t h = kRootBlockHash;
  std::vector<int32_t> found;
  for (int i = 0; i < n; ++i) {
    const auto block = tokens.subspan(static_cast<size_t>(i) * block_size_, block_size_);
    const uint64_t next = BlockHash(h, block);
    const int32_t id = Lookup(next, h, block);
    if (id < 0) break;
    found.push_back(id);
    h = next;
  }
  if (found.empty()) return 0;
  SeqState& s = seqs_[seq];
  for (int32_t id : found) {
    Block& b = blocks_[id];
    if (b.in_lru) {
      lru_.erase(b.lru_pos);
      b.in_lru = false;
    }
    ++b.ref_count;
    s.table.push_back(id);
  }
  s.n_filed = static_cast<int>(found.size());
  s.last_hash = h;
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
    out.push_back(blocks_[*it].hash);
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
  for (int32_t id : lru_) {
    if (id < 0 || id >= n_blocks() || !blocks_[id].in_lru) return broken("LRU entry ", id);
    ++in_lru;
  }
  if (in_lru != lru_.size()) return broken("LRU size");
  int filed = 0;
  for (int32_t id = 0; id < n_blocks(); ++id) {
    const Block& b = blocks_[id];
    if (b.ref_count != refs[id]) {
      return broken("block ", id, ": ref count ", b.ref_count, ", held by ", refs[id], " tables");
    }
    const int states = (refs[id] > 0) + on_free[id] + b.in_lru;
    if (states != 1) {
      return broken("block ", id, " is in ", states, " states (held ", refs[id], ", free ",
                    int{on_free[id]}, ", lru ", int{b.in_lru}, ")");
    }
    if (b.in_lru && !b.filed) return broken("block ", id, " in the LRU but not filed");
    if (on_free[id] && b.filed) return broken("block ", id, " free but filed");
    if (b.filed) {
      ++filed;
      auto it = index_.find(b.hash);
      if (it == index_.end() || it->second != id) return broken("block ", id, " not indexed");
      if (static_cast<int>(b.tokens.size()) != block_size_) return broken("block ", id, " tokens");
      if (BlockHash(b.parent, b.tokens) != b.hash) return broken("block ", id, " hash");
    }
  }
  if (filed != n_filed_ || static_cast<size_t>(filed) != index_.size()) {
    return broken("filed count ", n_filed_, ", blocks filed ", filed, ", index ", index_.size());
  }
  return absl::OkStatus();
}

}  // namespace pd::engine
