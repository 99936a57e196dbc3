// Device helpers for the KV-cache kernels (kv_store.cu, attention.cu, attention_tiled.cu): slot
// addressing, element loads per cache type, and the block-wide Hadamard rotation of INT8 rows.
// Device code: include from .cu files only.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "engine/backend/cuda/kv_views.cuh"

namespace pd::engine::cuda {

__host__ __device__ constexpr int KvValueBytes(KvType t) {
  return t == KvType::kF32 ? 4 : (t == KvType::kF16 ? 2 : 1);
}

// Byte offset of head `head`'s values in slot `off` of block `block`.
template <KvType T>
__device__ __forceinline__ size_t KvValueOffset(const KvCacheView& c, int block, int off,
                                                int head) {
  return static_cast<size_t>(block) * c.block_bytes +
         (static_cast<size_t>(off) * c.n_kv_heads + head) * c.head_dim * KvValueBytes(T);
}

// Address of head `head`'s F32 scale in slot `off` of block `block` (INT8 only). It is 4-byte
// aligned only when the block's value bytes are, so it is read and written a byte at a time.
__device__ __forceinline__ uint8_t* KvScaleAddress(const KvCacheView& c, int block, int off,
                                                   int head) {
  return static_cast<uint8_t*>(c.data) + static_cast<size_t>(block) * c.block_bytes +
         c.block_value_bytes + (static_cast<size_t>(off) * c.n_kv_heads + head) * sizeof(float);
}

__device__ __forceinline__ float LoadKvScale(const KvCacheView& c, int block, int off, int head) {
  const uint8_t* p = KvScaleAddress(c, block, off, head);
  return __uint_as_float(static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
                         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24);
}

__device__ __forceinline__ void StoreKvScale(const KvCacheView& c, int block, int off, int head,
                                             float d) {
  uint8_t* p = KvScaleAddress(c, block, off, head);
  const uint32_t u = __float_as_uint(d);
  p[0] = static_cast<uint8_t>(u);
  p[1] = static_cast<uint8_t>(u >> 8);
  p[2] = static_cast<uint8_t>(u >> 16);
  p[3] = static_cast<uint8_t>(u >> 24);
}

// Element d of a value row starting at `row` (INT8: the unscaled code).
template <KvType T>
__device__ __forceinline__ float LoadKv(const uint8_t* row, int d) {
  if constexpr (T == KvType::kF32) {
    return reinterpret_cast<const float*>(row)[d];
  } else if constexpr (T == KvType::kF16) {
    return __half2float(reinterpret_cast<const __half*>(row)[d]);
  } else {
    return static_cast<float>(reinterpret_cast<const int8_t*>(row)[d]);
  }
}

// v[0, head_dim) <- scale * (H v) per block of b = head_dim & -head_dim values, in shared memory,
// with every thread of the block (call from all of them, after a barrier that published v; it
// ends with one). The butterflies are kv_rotation.h's RotateKvRow stage by stage, each output the
// same single F32 addition of the same two inputs, so the result is bit-exact with the CPU's.
__device__ __forceinline__ void BlockRotateKvRow(float* v, int head_dim, float scale) {
  const int b = head_dim & -head_dim;
  const int half_b = b / 2;
  const int pairs = head_dim / 2;
  for (int len = 1; len < b; len *= 2) {
    for (int pi = threadIdx.x; pi < pairs; pi += blockDim.x) {
      const int r = pi % half_b;
      const int j = (pi / half_b) * b + (r / len) * 2 * len + r % len;
      const float u = v[j], w = v[j + len];
      v[j] = __fadd_rn(u, w);
      v[j + len] = __fsub_rn(u, w);
    }
    __syncthreads();
  }
  if (scale != 1.f) {
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) v[i] = __fmul_rn(v[i], scale);
    __syncthreads();
  }
}

// BlockRotateKvRow on n_rows rows at once, row r at v + r * stride (shared memory; the same
// butterflies, so the same bits per row): the tiled attention kernel rotates its 64 queries in
// and its 64 outputs out this way. Call from every thread, after a barrier; ends with one.
__device__ __forceinline__ void BlockRotateKvRows(float* v, int n_rows, int stride, int head_dim,
                                                  float scale) {
  const int b = head_dim & -head_dim;
  const int half_b = b / 2;
  const int pairs = head_dim / 2;
  for (int len = 1; len < b; len *= 2) {
    for (int i = threadIdx.x; i < n_rows * pairs; i += blockDim.x) {
      const int pi = i % pairs;
      const int r = pi % half_b;
      float* row = v + (i / pairs) * stride;
      const int j = (pi / half_b) * b + (r / len) * 2 * len + r % len;
      const float u = row[j], w = row[j + len];
      row[j] = __fadd_rn(u, w);
      row[j + len] = __fsub_rn(u, w);
    }
    __syncthreads();
  }
  if (scale != 1.f) {
    for (int i = threadIdx.x; i < n_rows * head_dim; i += blockDim.x) {
      float* x = v + (i / head_dim) * stride + i % head_dim;
      *x = __fmul_rn(*x, scale);
    }
    __syncthreads();
  }
}

}  // namespace pd::engine::cuda
