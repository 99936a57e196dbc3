// F32 -> F16 / BF16 conversion on the device: how MatMul turns F32 activations into the companion
// type of F16 and BF16 weights (and of quantized weights it expands to F16) before cuBLAS, with
// the rounding the CPU backend applies, so that the two agree.
//
// Host-callable declaration only; safe to include from .cc files compiled by the host compiler.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace pd::engine {

// y[i] = half(x[i]) for 0 <= i < n, round-to-nearest-even (overflow -> inf, NaN stays NaN).
// x, y: device memory, not overlapping. Enqueued on `stream`; returns the launch error, if any.
cudaError_t LaunchConvertF32ToF16(const float* x, int64_t n, __half* y, cudaStream_t stream);

// y[i] = bfloat16(x[i]), round-to-nearest-even, as the CPU backend's f32_to_bf16. Same contract.
cudaError_t LaunchConvertF32ToBf16(const float* x, int64_t n, __nv_bfloat16* y,
                                   cudaStream_t stream);

}  // namespace pd::engine
