#include <cuda_fp16.h>

#include <algorithm>

#include "engine/backend/cuda/elementwise.cuh"

namespace pd::engine::cuda {
namespace {

constexpr int kElementwiseBlock = 256;

// Grid-stride loops over n elements; memory bound (8 to 12 bytes per element against a handful of
// flops), so one element per thread per step is enough. Products and sums are spelled with the
// _rn intrinsics where the CPU's result is a separately rounded product and sum, so that nvcc
// cannot fuse them into an FMA that would round differently.
unsigned Blocks(int64_t n) {
  return static_cast<unsigned>(
      std::min<int64_t>((n + kElementwiseBlock - 1) / kElementwiseBlock, 65536));
}

__device__ __forceinline__ int64_t FirstIndex() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t Stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// 12 bytes, 1 flop per element.
__global__ void AddKernel(const float* a, const float* b, int64_t n, float* y) {
  for (int64_t i = FirstIndex(); i < n; i += Stride()) y[i] = __fadd_rn(a[i], b[i]);
}

// 8 bytes (the bias row stays in L1/L2), 1 flop per element.
__global__ void AddBiasKernel(const float* x, const float* __restrict__ bias, int64_t rows,
                              int64_t cols, float* y) {
  const int64_t n = rows * cols;
  for (int64_t i = FirstIndex(); i < n; i += Stride()) y[i] = __fadd_rn(x[i], bias[i % cols]);
}

// 12 bytes, an expf and 4 flops per element.
__global__ void SwiGluKernel(const float* g, const float* u, int64_t n, float* y) {
  for (int64_t i = FirstIndex(); i < n; i += Stride()) {
    const float gi = g[i];
    y[i] = __fmul_rn(__fdiv_rn(gi, __fadd_rn(1.f, expf(-gi))), u[i]);
  }
}

// ggml's gelu of an f16 input, rounded to f16 (the CPU backend's table entry): the product
// 0.044715 x * x + 1 fused as GCC fuses it in llama.cpp's build, every other step rounded alone.
// tanhf is within 2 ulp of the CPU's tanh; after the rounding to f16 the two agree except where
// the F32 value sits within those ulps of an f16 rounding boundary (then by one f16 ulp).
__device__ __forceinline__ float GeluF16(float x) {
  constexpr float kSqrt2OverPi = 0.79788456080286535588f;
  const float inner = fmaf(__fmul_rn(0.044715f, x), x, 1.0f);
  const float t = tanhf(__fmul_rn(__fmul_rn(kSqrt2OverPi, x), inner));
  const float g = __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, t));
  return __half2float(__float2half_rn(g));
}

// 12 bytes, a tanhf and ~8 flops per element.
__global__ void GeGluKernel(const float* g, const float* u, int64_t n, float* y) {
  for (int64_t i = FirstIndex(); i < n; i += Stride()) {
    const float gi = g[i];
    // As the CPU backend: +0 below -10 (not 0 times u, which could be -0).
    y[i] = gi <= -10.f
               ? 0.f
               : __fmul_rn(gi >= 10.f ? gi : GeluF16(__half2float(__float2half_rn(gi))), u[i]);
  }
}

// 8 bytes, 1 flop per element.
__global__ void ScaleKernel(const float* x, float s, int64_t n, float* y) {
  for (int64_t i = FirstIndex(); i < n; i += Stride()) y[i] = __fmul_rn(s, x[i]);
}

__global__ void SoftcapKernel(const float* x, float cap, float inv, int64_t n, float* y) {
  for (int64_t i = FirstIndex(); i < n; i += Stride()) {
    y[i] = __fmul_rn(tanhf(__fmul_rn(x[i], inv)), cap);
  }
}

// One output element per thread step: k row reads (gathered, 4 bytes each) and one write.
__global__ void MoeCombineKernel(const float* rows, int64_t cols, const int32_t* index,
                                 const float* weights, int64_t n_out, int k, float* y) {
  const int64_t n = n_out * cols;
  for (int64_t i = FirstIndex(); i < n; i += Stride()) {
    const int64_t r = i / cols, c = i % cols;
    const int32_t* idx = index + r * k;
    const float* w = weights + r * k;
    float acc = __fmul_rn(rows[idx[0] * cols + c], w[0]);
    for (int j = 1; j < k; ++j) acc = __fadd_rn(acc, __fmul_rn(rows[idx[j] * cols + c], w[j]));
    y[i] = acc;
  }
}

}  // namespace

cudaError_t LaunchMoeCombine(const float* rows, int64_t cols, const int32_t* index,
                             const float* weights, int64_t n_out, int k, float* y,
                             cudaStream_t stream) {
  if (n_out <= 0 || cols <= 0) return cudaSuccess;
  MoeCombineKernel<<<Blocks(n_out * cols), kElementwiseBlock, 0, stream>>>(rows, cols, index,
                                                                           weights, n_out, k, y);
  return cudaGetLastError();
}

cudaError_t LaunchSoftcap(const float* x, float cap, int64_t n, float* y, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  SoftcapKernel<<<Blocks(n), kElementwiseBlock, 0, stream>>>(x, cap, 1.0f / cap, n, y);
  return cudaGetLastError();
}

cudaError_t LaunchAdd(const float* a, const float* b, int64_t n, float* y, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  AddKernel<<<Blocks(n), kElementwiseBlock, 0, stream>>>(a, b, n, y);
  return cudaGetLastError();
}

cudaError_t LaunchAddBias(const float* x, const float* bias, int64_t rows, int64_t cols, float* y,
                          cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  AddBiasKernel<<<Blocks(rows * cols), kElementwiseBlock, 0, stream>>>(x, bias, rows, cols, y);
  return cudaGetLastError();
}

cudaError_t LaunchSwiGlu(const float* g, const float* u, int64_t n, float* y, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  SwiGluKernel<<<Blocks(n), kElementwiseBlock, 0, stream>>>(g, u, n, y);
  return cudaGetLastError();
}

cudaError_t LaunchGeGlu(const float* g, const float* u, int64_t n, float* y, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  GeGluKernel<<<Blocks(n), kElementwiseBlock, 0, stream>>>(g, u, n, y);
  return cudaGetLastError();
}

cudaError_t LaunchScale(const float* x, float s, int64_t n, float* y, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  ScaleKernel<<<Blocks(n), kElementwiseBlock, 0, stream>>>(x, s, n, y);
  return cudaGetLastError();
}

}  // namespace pd::engine::cuda
