// Dequantization on the device: GetRows (table rows picked by id, widened to F32) and the
// expansion of quantized weights into F16 that MatMul feeds to cuBLAS for larger batches.
//
// Host-callable declarations only; safe to include from .cc files compiled by the host compiler.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "engine/backend/cuda/quant_blocks.cuh"

namespace pd::engine::cuda {

// out[i, :] = dequant(table row ids[i]) for i < n_ids. table: device rows of `row_bytes` bytes in
// `format`; ids: device [n_ids], each in [0, table rows) (the caller checks); out: device F32
// [n_ids, cols], not overlapping the table. cols is a multiple of the format's block size.
// Bit-exact with the CPU backend's GetRows. Enqueued on `stream`; returns the launch error.
cudaError_t LaunchGetRows(WeightFormat format, const void* table, size_t row_bytes,
                          const int32_t* ids, int64_t n_ids, int64_t cols, float* out,
                          cudaStream_t stream);

// out[r, :] = half(dequant(w row r)) for r < n_rows (round to nearest even). w: device rows of
// `row_bytes` bytes in `format`; out: device F16 [n_rows, cols]. Enqueued on `stream`.
cudaError_t LaunchDequantizeToF16(WeightFormat format, const void* w, size_t row_bytes,
                                  int64_t n_rows, int64_t cols, __half* out, cudaStream_t stream);

}  // namespace pd::engine::cuda
