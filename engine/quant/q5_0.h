// The Q5_0 block format (ggml type 6), bit-exact with GGUF: 32 weights share one f16 scale d;
// each weight is a 5-bit code c in [0, 31] with x ~= d * (c - 16).
//
// Layout of one 22-byte block:
//   d      f16   bytes 0-1
//   qh     u32   bytes 2-5, little-endian: bit j is the fifth (high) bit of weight j, j = 0..31
//   qs[16] u8    bytes 6-21: low nibble of qs[j] = low 4 bits of weight j,
//                            high nibble of qs[j] = low 4 bits of weight j + 16
// Quantization (the reference rule, as llama.cpp's reference quantizer): the element m with the
// largest magnitude (sign kept) sets d = m / -16, so m maps to code 0 (= -16); codes are
// min(31, trunc(x / d + 16.5)).
//
// Used by llama.cpp's Q4_K_M / Q5_K_M mixes for rows that are not a multiple of 256 (e.g. Gemma 3
// 270M's 640-wide projections). Pure functions, thread safe.
#pragma once

#include <cstdint>

#include "engine/quant/q8_0.h"

namespace pd::engine {

struct BlockQ5_0 {
  uint16_t d;      // f16 scale
  uint8_t qh[4];   // high bits
  uint8_t qs[16];  // low nibbles
};
static_assert(sizeof(BlockQ5_0) == 22, "BlockQ5_0 must match ggml's block_q5_0 (22 bytes)");

void QuantizeRowQ5_0(const float* x, BlockQ5_0* y, int64_t n);
void DequantizeRowQ5_0(const BlockQ5_0* x, float* y, int64_t n);
// Codes of one block minus 16, in weight order: [-16, 15].
void UnpackQ5_0(const BlockQ5_0& b, int8_t out[32]);
// Scalar reference dot of `n / 32` Q5_0 blocks with Q8_0 activation blocks: per block the integer
// sum of code*q times f32(d_w) * f32(d_x), accumulated in f32 in block order.
float DotQ5_0Q8_0(const BlockQ5_0* w, const BlockQ8_0* x, int64_t n);

}  // namespace pd::engine
