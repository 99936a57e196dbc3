// F32 -> F16 conversion on the device: how MatMul turns F32 activations into the F16 companion
// type of F16 weights before cuBLAS (the same rounding the CPU backend applies, so the two agree).
//
// Host-callable declaration only; safe to include from .cc files compiled by the host compiler.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace pd::engine {

// y[i] = half(x[i]) for 0 <= i < n, round-to-nearest-even (overflow -> inf, NaN stays NaN).
// x, y: device memory, not overlapping. Enqueued on `stream`; returns the launch error, if any.
cudaError_t LaunchConvertF32ToF16(const float* x, int64_t n, __half* y, cudaStream_t stream);

}  // namespace pd::engine
