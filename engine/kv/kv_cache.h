// Paged KV cache: per layer, a K and a V cache of n_blocks blocks of block_size token slots (in
// the layout of engine/backend/kv_layout.h: F16, F32, or INT8 values with an F32 scale per token
// and head inside each block), and a BlockManager (block_manager.h) that hands out the blocks:
// one block table per sequence, and optionally the prefix cache, through which sequences with a
// common prompt prefix share its full blocks (MatchPrefix, Publish; docs/kv_cache.md).
//
// A sequence's blocks can be exported and imported block by block (KV transfer between a prefill
// and a decode node): each (layer, block, K or V) is one contiguous byte range of
// BlockBytes().span() bytes, scales included, in the same format on every backend. ExportSpans
// names those ranges in the backend's address space (host memory for the CPU backend: a transport
// can send from them directly); Export and Import copy one range to or from host memory through
// Backend::Download / Upload, so they work whatever memory the backend owns. docs/kv_cache.md
// describes the format.
//
// Owned by the engine loop of a node; not thread safe (one owner thread).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/backend/backend.h"
#include "engine/kv/block_manager.h"

namespace pd::engine {

struct KvCacheOptions {
  int n_layer = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int block_size = 16;
  int n_blocks = 0;               // total blocks per layer
  KvDType dtype = KvDType::kF16;  // f16 (serving default), f32 or int8
  // Off unless the owner turns it on (the Scheduler does, from its options): a bare cache frees
  // what a sequence releases.
  PrefixCacheOptions prefix_cache{.enabled = false};
};

// Bytes of one block of one layer's K cache (V is the same).
struct KvBlockBytes {
  size_t values = 0;  // block_size * n_kv_heads * head_dim * (4 | 2 | 1)
  size_t scales = 0;  // INT8: block_size * n_kv_heads * 4, right after the values; else 0
  size_t span() const { return values + scales; }  // one exported K or V range
  size_t per_layer() const { return 2 * span(); }  // K and V of one block in one layer
};

enum class KvPart : uint8_t { kK = 0, kV = 1 };

// One (layer, block, K or V) byte range of a sequence.
struct KvSpan {
  int layer = 0;
  int block_index = 0;  // index in the sequence's block table (0 = its first block_size tokens)
  KvPart part = KvPart::kK;
  void* data = nullptr;  // in the backend's address space (host memory for the CPU backend)
  size_t bytes = 0;      // == BlockBytes().span()
};

class KvCache {
 public:
  // Allocates every layer's K/V on `backend` (which must outlive the cache).
  // INVALID_ARGUMENT on bad options, RESOURCE_EXHAUSTED when the backend has no room.
  static absl::StatusOr<std::unique_ptr<KvCache>> Create(const KvCacheOptions& options,
                                                         Backend& backend);
  // Each layer's K/V on its own backend: layer_backends[l] (options.n_layer entries, none null;
  // Model::LayerBackends gives a placed model's). The block tables are shared by all layers.
  static absl::StatusOr<std::unique_ptr<KvCache>> Create(
      const KvCacheOptions& options, absl::Span<Backend* const> layer_backends);
  // Bytes a cache with these options occupies (for sizing from a memory budget), scales included.
  static size_t BytesFor(const KvCacheOptions& options);
  // Bytes of one block of one layer for these options.
  static KvBlockBytes BlockBytesFor(const KvCacheOptions& options);

  // Makes sequence `seq` own enough blocks for `n_tokens` positions in total (grows its table),
  // evicting unused cached blocks when the free list runs out. RESOURCE_EXHAUSTED (and no
  // change) if free plus evictable blocks are too few.
  absl::Status Reserve(int64_t seq, int n_tokens);
  // Releases all blocks of `seq`: to the prefix cache those that are filed there, to the free
  // list the others. No-op for an unknown sequence.
  void Free(int64_t seq);
  // Keeps the blocks of `seq` that cover its first n_tokens positions and releases the rest
  // (BlockManager::Truncate): rolling back positions written speculatively and rejected.
  void Truncate(int64_t seq, int n_tokens) { blocks_->Truncate(seq, n_tokens); }

  // ---- prefix cache (BlockManager; no-ops when options().prefix_cache.enabled is false) -------
  // For a sequence holding no blocks yet: takes the longest cached chain of full blocks equal to
  // tokens[0, max_tokens)'s and returns the tokens it covers; their K/V are in place.
  // Compressed blocks on the chain are expanded back into free blocks (lossy: INT8).
  int MatchPrefix(int64_t seq, absl::Span<const int32_t> tokens, int max_tokens);
  // prefix_cache.compress_idle_ms > 0: compresses up to `max_blocks` cached blocks unused for
  // that long into INT8 page slots (BlockManager::CompressIdle); returns how many. No-op when off.
  int CompressIdle(absl::Time now, int max_blocks);
  // Whether CompressIdle(now) has work.
  bool HasIdleBlocks(absl::Time now) const;
  // Files `seq`'s full blocks within tokens[0, n_tokens), whose K/V the caller has written and
  // will not change, for later sequences to share.
  void Publish(int64_t seq, absl::Span<const int32_t> tokens, int n_tokens) {
    blocks_->Publish(seq, tokens, n_tokens);
  }
  PrefixCacheStats prefix_stats() const { return blocks_->stats(); }
  std::vector<uint64_t> PrefixSummary() const { return blocks_->Summary(); }
  const BlockManager& blocks() const { return *blocks_; }
  // Block table of `seq` (empty if unknown).
  const std::vector<int32_t>& BlockTable(int64_t seq) const;
  // Tokens the sequence's blocks can hold.
  int Capacity(int64_t seq) const;

  // ---- export / import -----------------------------------------------------------------------
  KvBlockBytes BlockBytes() const { return BlockBytesFor(options_); }
  // The byte ranges of `seq`'s blocks in `layer`: for each block of its table in order, K then V.
  // The pointers stay valid until the sequence is freed. NOT_FOUND for an unknown sequence,
  // INVALID_ARGUMENT for a layer outside [0, n_layer).
  absl::StatusOr<std::vector<KvSpan>> ExportSpans(int64_t seq, int layer) const;
  // True when ExportSpans' pointers are host memory (the CPU backend): another thread may then
  // write a reserved sequence's blocks through them (engine/kv/kv_write_fence.h).
  // (Every layer's backend must be the CPU's.)
  bool host_memory() const { return host_memory_; }
  // Copies block `block_index` of `seq` (K or V of `layer`) into `host_dst`, which holds `bytes`
  // == BlockBytes().span() bytes. Errors as Import.
  absl::Status Export(int64_t seq, int layer, int block_index, KvPart part, void* host_dst,
                      size_t bytes) const;
  // Overwrites block `block_index` of `seq` (K or V of `layer`, a block the sequence alone owns,
  // see Reserve; FAILED_PRECONDITION for a shared or cached one) with `bytes` bytes of the exported
  // format from host memory. The sender's cache must have the same dtype, block_size, n_kv_heads
  // and head_dim (the transfer descriptor carries them; only the size can be checked here).
  // NOT_FOUND: unknown sequence; OUT_OF_RANGE: block_index outside its table; INVALID_ARGUMENT: bad
  // layer, null data, or `bytes` != BlockBytes().span().
  absl::Status Import(int64_t seq, int layer, int block_index, KvPart part, const void* host_src,
                      size_t bytes);

  // Blocks an allocation can get (free, or cached and unused).
  int free_blocks() const { return blocks_->available_blocks(); }
  int total_blocks() const { return options_.n_blocks; }
  const KvCacheOptions& options() const { return options_; }
  KvTensor& k(int layer) { return k_[layer]; }
  KvTensor& v(int layer) { return v_[layer]; }

 private:
  KvCache() = default;
  // The address of one block's K or V range after validating the arguments (see Import).
  absl::StatusOr<char*> BlockAddress(int64_t seq, int layer, int block_index, KvPart part,
                                     const void* host, size_t bytes) const;

  std::vector<Backend*> backends_;  // per layer
  bool host_memory_ = true;
  KvCacheOptions options_;
  std::vector<std::unique_ptr<Buffer>> buffers_;
  std::vector<KvTensor> k_, v_;
  std::unique_ptr<BlockManager> blocks_;
  // Compression: per page slot (page * kPageSlots + slot), the F32 scales of its rows
  // [layer][K, V][block_size * n_kv_heads]; the INT8 values are in the page block itself (the
  // first and second half of each layer's K and V span).
  absl::flat_hash_map<int64_t, std::vector<float>> page_scales_;
  void CompressBlock(int32_t block, int32_t page, int slot);
  void ExpandBlock(int32_t block, int32_t page, int slot);
};

}  // namespace pd::engine
