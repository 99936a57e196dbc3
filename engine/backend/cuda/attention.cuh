// Attention over a paged KV cache on the device (grouped-query, causal within each sequence's
// positions, optional sliding window and logit softcap): Backend::Attention's semantics.
//
// Host-callable declarations only; safe to include from .cc files compiled by the host compiler.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

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
  // Each (token, head) splits its visible positions into n_splits contiguous ranges run by
  // separate blocks (so that a decode step of a few heads still fills the GPU) and merged by a
  // second kernel through `partial`, device scratch of AttentionPartialFloats() floats. 1: no
  // split, `partial` unused.
  int n_splits = 1;
  float* partial = nullptr;
};

inline constexpr int kMaxAttentionHeadDim = 512;

// Floats of scratch that `args` needs for its split (0 when n_splits == 1).
inline size_t AttentionPartialFloats(const AttentionArgs& args) {
  if (args.n_splits <= 1) return 0;
  return static_cast<size_t>(args.batch.n_tokens) * args.n_heads * args.n_splits *
         (static_cast<size_t>(args.head_dim) + 2);
}

// Enqueues the attention of every token and head (and the merge of split ranges) on `stream`;
// returns the launch error.
cudaError_t LaunchAttention(const AttentionArgs& args, cudaStream_t stream);

}  // namespace pd::engine::cuda
