// Device helpers shared by the kernels of this folder: warp reductions, f16/bf16 bit reads and
// 2-byte-aligned loads. Device code: include from .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace pd::engine::cuda {

inline constexpr unsigned kFullMask = 0xffffffffu;

// The sum over the warp, in every lane (butterfly order: the same bits in every lane).
__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

__device__ __forceinline__ double WarpSum(double v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  }
  return v;
}

// IEEE binary16 bits -> float (exact).
__device__ __forceinline__ float F16BitsToFloat(uint16_t h) {
  return __half2float(__ushort_as_half(h));
}

// bfloat16 bits -> float (exact: the top half of the float).
__device__ __forceinline__ float Bf16BitsToFloat(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}

// Four bytes at a 2-byte-aligned address, little-endian, as one u32: quant blocks of 34, 22 and
// 210 bytes are only 2-byte aligned, so 4-byte loads would fault on odd blocks.
__device__ __forceinline__ uint32_t LoadU32Align2(const uint8_t* p) {
  const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
  return static_cast<uint32_t>(h[0]) | static_cast<uint32_t>(h[1]) << 16;
}

}  // namespace pd::engine::cuda
