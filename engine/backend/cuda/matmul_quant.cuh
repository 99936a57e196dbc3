// Matrix-vector products with quantized weights on the device (MatMul for decode-sized batches):
// the weights are read once, in their blocks, and dotted with F32 activations.
//
// Host-callable declarations only; safe to include from .cc files compiled by the host compiler.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "engine/backend/cuda/quant_blocks.cuh"

namespace pd::engine::cuda {

// The largest batch LaunchQuantGemv takes: beyond it, dequantizing into F16 once and running a
// cuBLAS GEMM reads fewer bytes per output than n passes over each weight block's header would
// cost in integer work, and tensor cores take over.
inline constexpr int kMaxGemvRows = 8;

// y[r, i] = sum_j dequant(w[i, j]) * x[r, j] for r < n, i < m, accumulated in F32 (each
// sub-block's codes are dotted with x first and scaled once; see matmul_quant.cu).
// w: device [m, k] in `format` (kQ8_0, kQ4_0, kQ5_0, kQ2_K, kQ3_K, kQ4_K, kQ5_K or kQ6_K), rows
// of `row_bytes`; kQ2_K, kQ4_K and kQ5_K need w and row_bytes 4-byte aligned, the others 2-byte
// aligned. x: device F32 [n, k]; y: device F32 [n, m], not
// overlapping x. 1 <= n <= kMaxGemvRows, k a multiple of the block size. Enqueued on `stream`.
cudaError_t LaunchQuantGemv(WeightFormat format, const void* w, size_t row_bytes, int m, int k,
                            const float* x, int n, float* y, cudaStream_t stream);

}  // namespace pd::engine::cuda
