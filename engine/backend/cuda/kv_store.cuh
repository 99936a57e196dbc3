// StoreKv on the device: one layer's new K or V rows into their slots of a paged cache.
//
// Host-callable declaration only; safe to include from .cc files compiled by the host compiler.
#pragma once

#include <cuda_runtime_api.h>

#include "engine/backend/cuda/kv_views.cuh"

namespace pd::engine::cuda {

// Writes src [batch.n_tokens, cache.n_kv_heads * cache.head_dim] (device F32) into `cache` at the
// slots `batch` gives each token. F32 copies, F16 rounds to nearest even, INT8 rotates each
// token-head into the stored basis and quantizes it with its own scale (kv_layout.h): all three
// bit-exact with the CPU backend. Slots of one call must be distinct. Enqueued on `stream`.
cudaError_t LaunchStoreKv(const float* src, const KvCacheView& cache, const KvBatchView& batch,
                          cudaStream_t stream);

}  // namespace pd::engine::cuda
