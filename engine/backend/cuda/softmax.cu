#include <cstdint>

#include "engine/backend/cuda/device_util.cuh"
#include "engine/backend/cuda/softmax.cuh"

namespace pd::engine::cuda {
namespace {

// Every warp reduces the per-warp partials itself, so one barrier per reduction is enough; the
// `partials` slots are reused by the next reduction only after a second barrier.
template <int kBlock, typename T, typename Op>
__device__ T BlockReduce(T v, T* partials, Op op, T identity) {
  static_assert(kBlock % 32 == 0 && kBlock <= 1024, "block must be whole warps, at most 1024");
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = op(v, __shfl_xor_sync(kFullMask, v, offset));
  if constexpr (kBlock == 32) {
    return v;
  } else {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) partials[warp] = v;
    __syncthreads();
    v = lane < kBlock / 32 ? partials[lane] : identity;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      v = op(v, __shfl_xor_sync(kFullMask, v, offset));
    }
    __syncthreads();
    return v;
  }
}

// One block per row, three passes: the max; exp(x - max) written back and summed in F64; the
// scale by the F32 reciprocal of the sum (the CPU backend's order). Each thread touches the same
// elements in every pass, so the in-place update needs no barrier beyond the reductions'.
// Per element: 8 bytes read (the second and third reads from L1/L2) and 4 written twice; an expf
// and 3 flops.
template <int kBlock>
__global__ void SoftmaxKernel(float* x, int cols) {
  __shared__ float max_partials[32];
  __shared__ double sum_partials[32];
  float* row = x + static_cast<int64_t>(blockIdx.x) * cols;

  float m = -INFINITY;
  for (int c = threadIdx.x; c < cols; c += kBlock) m = fmaxf(m, row[c]);
  m = BlockReduce<kBlock>(
      m, max_partials, [](float a, float b) { return fmaxf(a, b); }, -INFINITY);
  if (m == -INFINITY) {
    for (int c = threadIdx.x; c < cols; c += kBlock) row[c] = 0.f;
    return;
  }

  double sum = 0.0;
  for (int c = threadIdx.x; c < cols; c += kBlock) {
    const float e = expf(row[c] - m);
    row[c] = e;
    sum += e;
  }
  sum = BlockReduce<kBlock>(
      sum, sum_partials, [](double a, double b) { return a + b; }, 0.0);
  const float inv = static_cast<float>(1.0 / sum);
  for (int c = threadIdx.x; c < cols; c += kBlock) row[c] = __fmul_rn(row[c], inv);
}

}  // namespace

cudaError_t LaunchSoftmax(float* x, int rows, int cols, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  // Short rows (attention scores of a few positions): a warp; vocabulary-sized rows: 1024 threads.
  if (cols <= 256) {
    SoftmaxKernel<32><<<rows, 32, 0, stream>>>(x, cols);
  } else if (cols <= 8192) {
    SoftmaxKernel<256><<<rows, 256, 0, stream>>>(x, cols);
  } else {
    SoftmaxKernel<1024><<<rows, 1024, 0, stream>>>(x, cols);
  }
  return cudaGetLastError();
}

}  // namespace pd::engine::cuda
