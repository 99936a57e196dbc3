// Paged KV cache: per layer, a K and a V tensor of n_blocks * block_size token slots, plus a
// free-list block allocator and one block table per sequence.
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
  int n_blocks = 0;         // total blocks per layer
  DType dtype = DType::kF16;  // kF16 or kF32
};

class KvCache {
 public:
  // Allocates every layer's K/V on `backend` (which must outlive the cache).
  // INVALID_ARGUMENT on bad options, RESOURCE_EXHAUSTED when the backend has no room.
  static absl::StatusOr<std::unique_ptr<KvCache>> Create(const KvCacheOptions& options,
                                                         Backend& backend);
  // Bytes a cache with these options occupies (for sizing from a memory budget).
  static size_t BytesFor(const KvCacheOptions& options);

  // Makes sequence `seq` own enough blocks for `n_tokens` positions in total (grows its table).
  // RESOURCE_EXHAUSTED (and no change) if not enough free blocks.
  absl::Status Reserve(int64_t seq, int n_tokens);
  // Returns all blocks of `seq` to the free list. No-op for an unknown sequence.
  void Free(int64_t seq);
  // Block table of `seq` (empty if unknown).
  const std::vector<int32_t>& BlockTable(int64_t seq) const;
  // Tokens the sequence's blocks can hold.
  int Capacity(int64_t seq) const;

  int free_blocks() const { return static_cast<int>(free_.size()); }
  int total_blocks() const { return options_.n_blocks; }
  const KvCacheOptions& options() const { return options_; }
  Tensor& k(int layer) { return k_[layer]; }
  Tensor& v(int layer) { return v_[layer]; }

 private:
  KvCache() = default;
  KvCacheOptions options_;
  std::vector<std::unique_ptr<Buffer>> buffers_;
  std::vector<Tensor> k_, v_;
  std::vector<int32_t> free_;  // stack of free block ids
  std::map<int64_t, std::vector<int32_t>> tables_;
};

}  // namespace pd::engine
