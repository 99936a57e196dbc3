// Chain hashes of full KV blocks: the key under which the prefix cache (engine/kv/block_manager.h)
// files a block, and what a node's load report summarizes for the router's KV-aware placement.
//
// Block i of a token sequence covers tokens [i * block_size, (i + 1) * block_size); its hash is
// BlockHash(hash of block i - 1, its tokens), starting from kRootBlockHash, so equal hashes mean
// equal whole prefixes (up to 64-bit collisions, which the cache rules out by also comparing the
// block's tokens and its parent's hash). The function is fixed (no per-process seed): a router
// and its nodes, on any machine, compute the same hashes for the same tokens.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace pd::engine {

inline constexpr uint64_t kRootBlockHash = 0x70647365727665ULL;  // "pdserve"

// splitmix64's finalizer: a bijection that spreads every input bit over the output.
inline uint64_t MixBlockHash(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// The hash of a block of `tokens` whose parent block hashes to `parent`. Never 0.
inline uint64_t BlockHash(uint64_t parent, absl::Span<const int32_t> tokens) {
  uint64_t h = MixBlockHash(parent ^ (uint64_t{tokens.size()} << 32));
  for (int32_t t : tokens) h = MixBlockHash(h + 0x9e3779b97f4a7c15ULL + static_cast<uint32_t>(t));
  return h == 0 ? 1 : h;
}

// Leading rows of a prompt of `prompt_len` tokens whose K/V may be filed in or taken from the
// prefix cache. Batch::AddOrdered gives a prompt of L >= 8 tokens the same summation orders on
// every row below L - L % 4 (kRowOrderWide | kRowOrderAttnWide); its last L % 4 rows, shorter
// prompts and generated tokens get others (docs/numerics.md). Rows of that interior are bit for
// bit the same whatever the prompt's length, so they are the ones prompts may share.
inline int CacheablePrefix(int prompt_len) {
  return prompt_len >= 8 ? prompt_len - prompt_len % 4 : 0;
}

// The chain hashes of the first min(max_blocks, tokens.size() / block_size) full blocks of
// `tokens`. block_size >= 1.
inline std::vector<uint64_t> BlockHashes(absl::Span<const int32_t> tokens, int block_size,
                                         size_t max_blocks = SIZE_MAX) {
  std::vector<uint64_t> out;
  const size_t n = std::min(max_blocks, tokens.size() / static_cast<size_t>(block_size));
  out.reserve(n);
  uint64_t h = kRootBlockHash;
  for (size_t i = 0; i < n; ++i) {
    h = BlockHash(h, tokens.subspan(i * block_size, block_size));
    out.push_back(h);
  }
  return out;
}

// How many leading full blocks of `tokens`, at most `max_blocks`, are held according to
// `held(chain hash)` (e.g. a node's cache summary): the chain stops at the first block that is not.
template <typename Held>
int LeadingHeldBlocks(absl::Span<const int32_t> tokens, int block_size, int max_blocks,
                      const Held& held) {
  uint64_t h = kRootBlockHash;
  int n = 0;
  while (n < max_blocks && static_cast<size_t>(n + 1) * block_size <= tokens.size()) {
    h = BlockHash(h, tokens.subspan(static_cast<size_t>(n) * block_size, block_size));
    if (!held(h)) break;
    ++n;
  }
  return n;
}

}  // namespace pd::engine
