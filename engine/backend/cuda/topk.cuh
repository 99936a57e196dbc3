// The best k entries of each row on the device (Backend::TopK): what a decode step samples from,
// so that it copies back k (value, column) pairs per row instead of the vocabulary's logits.
//
// Host-callable declaration only; safe to include from .cc files compiled by the host compiler.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace pd::engine::cuda {

// The largest k this kernel takes (Backend's kMaxTopK; cuda_backend.cc checks they agree).
inline constexpr int kTopKMax = 256;

// x: device F32 [rows, cols]. Writes each row's best k entries in top_k.h's rank order (value
// descending, equal values by lower column, -0 == +0, NaN below every number) to values [rows, k]
// and ids [rows, k]. rows > 0, 1 <= k <= min(cols, kTopKMax). Enqueued on `stream`; returns the
// launch error.
cudaError_t LaunchTopK(const float* x, int rows, int cols, int k, float* values, int32_t* ids,
                       cudaStream_t stream);

}  // namespace pd::engine::cuda
