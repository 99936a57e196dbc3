// Row-wise softmax on the device, in place.
//
// Host-callable declaration only; safe to include from .cc files compiled by the host compiler.
#pragma once

#include <cuda_runtime_api.h>

namespace pd::engine::cuda {

// x: device F32 [rows, cols], rows contiguous. Each row becomes exp(x - max) / sum, the sum taken
// in F64 as the CPU backend takes it; a row whose max is -inf (all masked) becomes zeros. rows,
// cols > 0. Enqueued on `stream`; returns the launch error.
cudaError_t LaunchSoftmax(float* x, int rows, int cols, cudaStream_t stream);

}  // namespace pd::engine::cuda
