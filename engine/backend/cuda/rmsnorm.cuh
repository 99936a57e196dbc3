// RMS normalisation on the device: y = x / sqrt(mean(x^2) + eps) * w, row by row.
//
// Host-callable declaration only; safe to include from .cc files compiled by the host compiler.
#pragma once

#include <cuda_runtime_api.h>

namespace pd::engine {

// x, y: device [rows, cols] F32, rows contiguous; y may alias x. w: device [cols] F32, or nullptr
// for no weight. rows, cols > 0. Enqueued on `stream`; returns the launch error, if any.
cudaError_t LaunchRmsNorm(const float* x, const float* w, float eps, int rows, int cols, float* y,
                          cudaStream_t stream);

}  // namespace pd::engine
