// Paged KV cache: per layer, a K and a V cache of n_blocks blocks of block_size token slots (in
// the layout of engine/backend/kv_layout.h: F16, F32, or INT8 values with an F32 scale per token
// and head inside each block), a free-list block allocator and one block table per sequence.
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
#include <map>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backend/backend.h"

namespace pd::engine {

struct KvCacheOptions {
  int n_layer = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int block_size = 16;
  int n_blocks = 0;               // total blocks per layer
  KvDType dtype = KvDType::kF16;  // f16 (serving default), f32 or int8
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
  // Bytes a cache with these options occupies (for sizing from a memory budget), scales included.
  static size_t BytesFor(const KvCacheOptions& options);
  // Bytes of one block of one layer for these options.
  static KvBlockBytes BlockBytesFor(const KvCacheOptions& options);

  // Makes sequence `seq` own enough blocks for `n_tokens` positions in total (grows its table).
  // RESOURCE_EXHAUSTED (and no change) if not enough free blocks.
  absl::Status Reserve(int64_t seq, int n_tokens);
  // Returns all blocks of `seq` to the free list. No-op for an unknown sequence.
  void Free(int64_t seq);
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
  bool host_memory() const { return backend_.host_memory(); }
  // Copies block `block_index` of `seq` (K or V of `layer`) into `host_dst`, which holds `bytes`
  // == BlockBytes().span() bytes. Errors as Import.
  absl::Status Export(int64_t seq, int layer, int block_index, KvPart part, void* host_dst,
                      size_t bytes);
  // Overwrites block `block_index` of `seq` (K or V of `layer`, a block the sequence already owns,
  // see Reserve) with `bytes` bytes of the exported format from host memory. The sender's cache
  // must have the same dtype, block_size, n_kv_heads and head_dim (the transfer descriptor
  // carries them; only the size can be checked here). NOT_FOUND: unknown sequence;
  // OUT_OF_RANGE: block_index outside its table; INVALID_ARGUMENT: bad layer, null data, or
  // `bytes` != BlockBytes().span().
  absl::Status Import(int64_t seq, int layer, int block_index, KvPart part, const void* host_src,
                      size_t bytes);

  int free_blocks() const { return static_cast<int>(free_.size()); }
  int total_blocks() const { return options_.n_blocks; }
  const KvCacheOptions& options() const { return options_; }
  KvTensor& k(int layer) { return k_[layer]; }
  KvTensor& v(int layer) { return v_[layer]; }

 private:
  explicit KvCache(Backend& backend) : backend_(backend) {}
  // The address of one block's K or V range after validating the arguments (see Import).
  absl::StatusOr<char*> BlockAddress(int64_t seq, int layer, int block_index, KvPart part,
                                     const void* host, size_t bytes) const;

  Backend& backend_;
  KvCacheOptions options_;
  std::vector<std::unique_ptr<Buffer>> buffers_;
  std::vector<KvTensor> k_, v_;
  std::vector<int32_t> free_;  // stack of free block ids
  std::map<int64_t, std::vector<int32_t>> tables_;
};

}  // namespace pd::engine
