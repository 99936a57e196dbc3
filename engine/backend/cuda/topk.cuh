// The best k entries of each row on the device (Backend::TopK): what a decode step samples from,
// so that it copies back k (value, column) pairs per row instead of the vocabulary's logits.
//
// Host-callable declaration only; safe to include from .cc files compiled by the host compiler.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace pd::engine::cuda {

// The largest k this kernel takes (Backend's kMaxTopK; cuda_backend.cc checks they agree).
inline constexpr int kTopKMax = 256;

// A row wider than kTopKSliceColumns is cut into up to kTopKMaxSlices slices (each at least k
// columns) whose best k are found by one block each, and a second pass takes the best k of
// those: one block per 262,144-wide row took 360 us for k = 40 on an H200 (2026-12-04).
inline constexpr int kTopKSliceColumns = 4096;
inline constexpr int kTopKMaxSlices = 64;

// How many slices LaunchTopK cuts a row into, and the device scratch it then needs (0: none).
int TopKSlices(int rows, int cols, int k);
size_t TopKScratchBytes(int rows, int cols, int k);

// x: device F32 [rows, cols]. Writes each row's best k entries in top_k.h's rank order (value
// descending, equal values by lower column, -0 == +0, NaN below every number) to values [rows, k]
// and ids [rows, k]. rows > 0, 1 <= k <= min(cols, kTopKMax). `scratch`: TopKScratchBytes(rows,
// cols, k) bytes of device memory (may be null when that is 0). Enqueued on `stream`; returns
// the launch error.
cudaError_t LaunchTopK(const float* x, int rows, int cols, int k, float* values, int32_t* ids,
                       void* scratch, cudaStream_t stream);

}  // namespace pd::engine::cuda
