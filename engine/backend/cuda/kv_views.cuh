// Device-side views of a paged KV cache and of a batch's slot mapping, as plain structs that both
// nvcc and the host compiler see (the .cu files do not include engine/backend/kv_layout.h).
// cuda_backend.cc fills them from KvTensor and KvBatch; the layout is kv_layout.h's.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pd::engine::cuda {

// KvDType's values (cuda_backend.cc static_asserts that they agree).
enum class KvType : uint8_t {
  kF16 = 0,
  kF32 = 1,
  kI8 = 2,
};

// One layer's K or V cache in device memory: n_blocks blocks of `block_bytes`, each
// [block_size][n_kv_heads][head_dim] values, then (INT8) [block_size][n_kv_heads] F32 scales.
struct KvCacheView {
  KvType type = KvType::kF16;
  int n_kv_heads = 0;
  int head_dim = 0;
  size_t block_bytes = 0;        // values and scales
  size_t block_value_bytes = 0;  // where the scales start
  void* data = nullptr;
};

// Which slot each token of a batch reads and writes, in device memory. Token t sits at position
// pos[t] of sequence seq[t]; position p of sequence s lives in block
// tables[table_offsets[s] + p / block_size], slot p % block_size of it. All ids were checked on
// the host (in range of the tables and the cache).
struct KvBatchView {
  const int32_t* pos = nullptr;            // [n_tokens]
  const int32_t* seq = nullptr;            // [n_tokens]
  const int32_t* table_offsets = nullptr;  // [n_seq + 1]
  const int32_t* tables = nullptr;         // the sequences' block tables, concatenated
  int n_tokens = 0;
  int block_size = 0;
};

}  // namespace pd::engine::cuda
