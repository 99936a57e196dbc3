// W4A16 ("w4a16", DType::kW4A16 = 0x50440002, pdserve's own type): symmetric INT4 weights in
// groups of 128 with one f16 scale per group; activations stay floating point (the kernels
// dequantize the weights in registers and FMA them with f32 activations).
//
// Layout of one 66-byte block (128 weights, 4.125 bits per weight):
//   bytes 0-1   d       f16 scale (IEEE binary16 bits, little-endian)
//   bytes 2-65  qs[64]  4-bit codes u in [0, 15]: weight j (0..63) is the low nibble of qs[j],
//                       weight j + 64 the high nibble of qs[j]
//   x^ = d * (u - 8)    (float(u - 8) * f32(d)), levels -8..7
// The half split (like Q4_0's) lets a SIMD kernel unpack 32 bytes into two runs of 32
// consecutive weights with one mask and one shift.
//
// Quantization: per block, a search over candidate scales (max|x| / t for t in 6.5 .. 8.0, of
// both signs, so that the extra level -8 can fall on either side), each rounded to f16 first,
// keeping the one with the smallest weighted squared error sum_j w_j (x_j - x^_j)^2 (w_j =
// importance[j], 1 when importance is nullptr); codes are the nearest levels of the stored scale.
//
// All functions are pure and thread-safe: the scalar reference the SIMD kernels are tested
// against.
#pragma once

#include <cstdint>

namespace pd::engine {

inline constexpr int kW4A16BlockSize = 128;

struct BlockW4A16 {
  uint16_t d;      // f16 scale
  uint8_t qs[64];  // nibbles
};
static_assert(sizeof(BlockW4A16) == 66, "BlockW4A16 is 66 bytes: f16 + 64 bytes of nibbles");

// n % 128 == 0 (PD_CHECKed). `importance`: nullptr or n non-negative weights.
void QuantizeRowW4A16(const float* x, BlockW4A16* y, int64_t n, const float* importance);
void DequantizeRowW4A16(const BlockW4A16* x, float* y, int64_t n);
// Levels u - 8 of one block, in weight order: [-8, 7].
void UnpackW4A16(const BlockW4A16& b, int8_t out[128]);
// A block from a scale and 128 levels (each in [-8, 7], PD_CHECKed).
void PackW4A16(uint16_t d, const int8_t q[128], BlockW4A16* b);

// Scalar reference dot of n / 128 blocks with n f32 activations: per block the f32 sum, in
// weight order, of float(u - 8) * x, times f32(d), accumulated in f32 in block order. The SIMD
// kernels differ only in the order of the f32 additions.
float DotW4A16F32(const BlockW4A16* w, const float* x, int64_t n);

}  // namespace pd::engine
