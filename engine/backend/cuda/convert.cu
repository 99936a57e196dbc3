#include <algorithm>

#include "engine/backend/cuda/convert.cuh"

namespace pd::engine {
namespace {

constexpr int kConvertBlock = 256;

// Memory bound: reads 4 bytes and writes 2 bytes per element, no flops worth counting. A
// grid-stride loop so any n runs with a bounded grid.
__global__ void ConvertF32ToF16Kernel(const float* __restrict__ x, int64_t n,
                                      __half* __restrict__ y) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    y[i] = __float2half_rn(x[i]);
  }
}

// The same for bfloat16.
__global__ void ConvertF32ToBf16Kernel(const float* __restrict__ x, int64_t n,
                                       __nv_bfloat16* __restrict__ y) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    y[i] = __float2bfloat16_rn(x[i]);
  }
}

// Enough blocks to fill any current GPU several times over; the loops cover the rest.
unsigned ConvertBlocks(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>((n + kConvertBlock - 1) / kConvertBlock, 65536));
}

}  // namespace

cudaError_t LaunchConvertF32ToF16(const float* x, int64_t n, __half* y, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  ConvertF32ToF16Kernel<<<ConvertBlocks(n), kConvertBlock, 0, stream>>>(x, n, y);
  return cudaGetLastError();
}

cudaError_t LaunchConvertF32ToBf16(const float* x, int64_t n, __nv_bfloat16* y,
                                   cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  ConvertF32ToBf16Kernel<<<ConvertBlocks(n), kConvertBlock, 0, stream>>>(x, n, y);
  return cudaGetLastError();
}

}  // namespace pd::engine
