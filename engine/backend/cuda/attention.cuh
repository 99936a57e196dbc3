// Attention over a paged KV cache on the device (grouped-query, causal within each sequence's
// positions, optional sliding window and logit softcap): Backend::Attention's semantics.
//
// Two kernels share the work of one call, and the caller (CudaBackend::Attention) says which
// rows each takes:
//   - the per-row kernel (attention.cu): one block per (row, query head, split of its
//     positions), F32 on CUDA cores. Decode rows, short runs, and every row of a shape the tiled
//     kernel does not take.
//   - the tiled kernel (attention_tiled.cu): a prompt's rows, 64 (row, query head) pairs of one
//     sequence and one KV head per block, Q K^T and P V on tensor cores with Q and P rounded to
//     F16. It takes a run of rows that are consecutive in the batch and hold consecutive
//     positions of one sequence (a prompt chunk), when TiledAttentionSupports() holds.
//
// Host-callable declarations only; safe to include from .cc files compiled by the host compiler.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "engine/backend/cuda/kv_views.cuh"

namespace pd::engine::cuda {

struct AttentionArgs {
  const float* q = nullptr;  // device [n_tokens, n_heads * head_dim]
  float* out = nullptr;      // device, same shape; may be q itself (not a partial overlap)
  KvCacheView k, v;          // same type and shape (n_kv_heads, head_dim, block layout)
  KvBatchView batch;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;  // 1 .. kMaxAttentionHeadDim
  float scale = 0.f;
  float softcap = 0.f;  // > 0: logits = softcap * tanh(scale * q.k / softcap)
  int window = 0;       // > 0: token at pos sees positions > pos - window only
  // The per-row kernel's rows: rows[0, n_rows) (device), batch row ids; nullptr: every row of
  // the batch.
  const int32_t* rows = nullptr;
  int n_rows = 0;
  // The tiled kernel's tiles (device, [n_tiles][2]): tile i is the batch rows tiles[2 i] ..
  // tiles[2 i] + tiles[2 i + 1] - 1, which hold consecutive positions of one sequence, at most
  // TiledAttentionTokens(n_heads / n_kv_heads) of them. n_tiles 0: the kernel is not launched.
  const int32_t* tiles = nullptr;
  int n_tiles = 0;
  // The per-row kernel splits each (row, head)'s visible positions into n_splits contiguous
  // ranges run by separate blocks (so that a decode step of a few heads still fills the GPU) and
  // merged by a second kernel through `partial`, device scratch of AttentionPartialFloats()
  // floats. 1: no split, `partial` unused.
  int n_splits = 1;
  float* partial = nullptr;
};

inline constexpr int kMaxAttentionHeadDim = 512;

// The tiled kernel: (row, query head) pairs per block, the largest head_dim it takes, and the
// shortest run of a sequence's rows the backend gives it (shorter runs, decode rows above all,
// keep the per-row kernel, whose splits fill the GPU when there are few rows; a first guess, to
// be measured on a GPU).
inline constexpr int kTiledAttentionRows = 64;
inline constexpr int kMaxTiledAttentionHeadDim = 256;
inline constexpr int kTiledAttentionMinRun = 16;

// Rows of a sequence per tile with `group` = n_heads / n_kv_heads query heads per KV head: a
// tile holds every query head of its KV head for each of its rows (a group wider than
// kTiledAttentionRows: one row, the group's heads split over several blocks).
inline int TiledAttentionTokens(int group) {
  return group >= kTiledAttentionRows ? 1 : kTiledAttentionRows / group;
}

// Whether the tiled kernel takes this shape: head_dim a multiple of 16 (the MMA's k) up to
// kMaxTiledAttentionHeadDim, caches whose rows it can read in 16-byte (F16, F32) or 4-byte
// (INT8) pieces, and a device of compute capability 8.0 or later (mma.sync m16n8k16).
inline bool TiledAttentionSupports(int head_dim, const KvCacheView& k, const KvCacheView& v,
                                   int cc_major) {
  const size_t align = k.type == KvType::kI8 ? 4 : 16;
  return cc_major >= 8 && head_dim % 16 == 0 && head_dim <= kMaxTiledAttentionHeadDim &&
         k.type == v.type && reinterpret_cast<uintptr_t>(k.data) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(v.data) % 16 == 0 && k.block_bytes % align == 0 &&
         v.block_bytes % align == 0;
}

// Floats of scratch that `args` needs for its split (0 when n_splits == 1).
inline size_t AttentionPartialFloats(const AttentionArgs& args) {
  if (args.n_splits <= 1) return 0;
  const int rows = args.rows != nullptr ? args.n_rows : args.batch.n_tokens;
  return static_cast<size_t>(rows) * args.n_heads * args.n_splits *
         (static_cast<size_t>(args.head_dim) + 2);
}

// Enqueues the tiled kernel over `tiles` and the per-row kernel over `rows` (and the merge of
// split ranges) on `stream`; returns the launch error.
cudaError_t LaunchAttention(const AttentionArgs& args, cudaStream_t stream);

// The tiled kernel alone (attention_tiled.cu); LaunchAttention calls it.
cudaError_t LaunchTiledAttention(const AttentionArgs& args, cudaStream_t stream);

}  // namespace pd::engine::cuda
