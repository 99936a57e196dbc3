// Element types and the block layout of a paged KV cache, shared by the Backend ops that read and
// write it (StoreKv, Attention) and by engine/kv's KvCache that owns it.
//
// KV element types are not tensor types: they never appear in model files, and INT8 carries
// per-token, per-head scales beside its values. So they have an enum of their own, and DType (the
// GGUF/ggml tensor types) stays what model files can hold.
//
// Layout of one layer's K (and, identically, V) cache: `n_blocks` blocks of `block_size` token
// slots, block b at bytes [b * block_bytes(), (b + 1) * block_bytes()) from `data`. Within a block:
//
//   F32 / F16  values [block_size][n_kv_heads][head_dim] (4 / 2 bytes each). Block-major is then
//              the same as a row-major [n_blocks * block_size, n_kv_heads * head_dim] matrix.
//   INT8       values [block_size][n_kv_heads][head_dim] int8, then
//              scales [block_size][n_kv_heads] float32 (little-endian, 4 bytes each).
//              Each token-head x is first rotated, x' = H x / b (engine/backend/kv_rotation.h:
//              a Walsh-Hadamard matrix per block of b values, b the largest power of two dividing
//              head_dim), then quantized symmetrically: scale = max|x'| / 127 over the head's
//              head_dim values, q = round_half_even(x' / scale) in [-127, 127]; x ~ H (scale * q).
//              A head of all zeros has scale 0 and q = 0. The rotation spreads outlier channels
//              over the whole head (bench/results/kv_int8_*.md measure what it buys).
//
// A block is therefore one contiguous byte range per layer for K and one for V, scales included:
// what KvCache exports and imports for KV transfer. Bytes per token and head, against F16:
// (head_dim + 4) / (2 * head_dim), e.g. 260 / 512 = 0.508 at head_dim 256 and 132 / 256 = 0.516
// at head_dim 128 (F16 scales would give 0.504 / 0.508; F32 keeps the scale exact and aligned).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace pd::engine {

enum class KvDType : uint8_t {
  kF16 = 0,  // the serving default
  kF32 = 1,  // reference numerics (tests compare against llama.cpp with it)
  kI8 = 2,   // INT8 values + F32 scale per token and head
};

// "f16", "f32", "int8": the names pdctl's --kv-type and the configs use.
inline std::string_view KvDTypeName(KvDType t) {
  switch (t) {
    case KvDType::kF16:
      return "f16";
    case KvDType::kF32:
      return "f32";
    case KvDType::kI8:
      return "int8";
  }
  return "invalid";
}

// The KvDType named `name` ("f16", "f32", "int8"), or nullopt.
inline std::optional<KvDType> ParseKvDType(std::string_view name) {
  if (name == "f16") return KvDType::kF16;
  if (name == "f32") return KvDType::kF32;
  if (name == "int8") return KvDType::kI8;
  return std::nullopt;
}

// Bytes of one value (INT8: without its share of the scale).
inline size_t KvValueBytes(KvDType t) {
  switch (t) {
    case KvDType::kF16:
      return 2;
    case KvDType::kF32:
      return 4;
    case KvDType::kI8:
      return 1;
  }
  return 0;
}

// Bytes of scale per token and head (F32 for INT8, none for the float types).
inline size_t KvScaleBytes(KvDType t) { return t == KvDType::kI8 ? sizeof(float) : 0; }

// One layer's K or V cache, in the backend's address space (host memory for the CPU backend,
// device memory for CUDA). A non-owning view; the layout is the file comment's.
struct KvTensor {
  KvDType type = KvDType::kF16;
  int n_kv_heads = 0;
  int head_dim = 0;
  int block_size = 0;
  int64_t n_blocks = 0;
  void* data = nullptr;

  // Values of one token slot (all heads): n_kv_heads * head_dim elements.
  int64_t row_elems() const { return int64_t{n_kv_heads} * head_dim; }
  size_t row_bytes() const { return static_cast<size_t>(row_elems()) * KvValueBytes(type); }
  // Values of one block, then its scales (0 for F16/F32).
  size_t block_value_bytes() const { return row_bytes() * static_cast<size_t>(block_size); }
  size_t block_scale_bytes() const {
    return KvScaleBytes(type) * static_cast<size_t>(block_size) * static_cast<size_t>(n_kv_heads);
  }
  size_t block_bytes() const { return block_value_bytes() + block_scale_bytes(); }
  size_t bytes() const { return block_bytes() * static_cast<size_t>(n_blocks); }
  int64_t slots() const { return n_blocks * block_size; }

  // Address of head `head`'s values in slot `slot` (= block * block_size + offset).
  char* values(int64_t slot, int head) const {
    const int64_t block = slot / block_size, off = slot % block_size;
    return static_cast<char*>(data) + static_cast<size_t>(block) * block_bytes() +
           static_cast<size_t>(off) * row_bytes() +
           static_cast<size_t>(head) * static_cast<size_t>(head_dim) * KvValueBytes(type);
  }
  // Address of head `head`'s scale in slot `slot` (INT8 only); may be unaligned for odd
  // head_dim * n_kv_heads * block_size, so read it with memcpy.
  char* scale(int64_t slot, int head) const {
    const int64_t block = slot / block_size, off = slot % block_size;
    return static_cast<char*>(data) + static_cast<size_t>(block) * block_bytes() +
           block_value_bytes() +
           (static_cast<size_t>(off) * static_cast<size_t>(n_kv_heads) +
            static_cast<size_t>(head)) *
               sizeof(float);
  }
};

}  // namespace pd::engine
