// The weight formats the CUDA kernels read, and their block layouts, as plain structs that both
// nvcc and the host compiler see.
//
// The .cu files include only CUDA headers and headers of this folder (see CMakeLists.txt), so the
// blocks are declared again here rather than taken from engine/quant. cuda_backend.cc, which sees
// both, static_asserts that every size and field offset agrees with engine/quant's definition
// (q8_0.h, q5_0.h, k_quants.h: the layouts and the dequantization formulas are documented there).
#pragma once

#include <cstdint>

namespace pd::engine::cuda {

// The table and weight types that GetRows and the quantized MatMul kernels read. Host code maps
// a DType onto it (cuda_backend.cc); every other DType has no CUDA kernel.
enum class WeightFormat : int {
  kF32,
  kF16,
  kBF16,
  kQ8_0,
  kQ4_0,
  kQ5_0,
  kQ2_K,
  kQ3_K,
  kQ4_K,
  kQ5_K,
  kQ6_K,
};

// Q8_0: 32 weights, x = f32(d) * q.
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[32];
};
static_assert(sizeof(BlockQ8_0) == 34, "block_q8_0 is 34 bytes");

// Q4_0: 32 weights; code c of weight j = low nibble of qs[j] (j < 16) or high nibble of
// qs[j - 16]; x = float(c - 8) * f32(d).
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ4_0) == 18, "block_q4_0 is 18 bytes");

// Q5_0: 32 weights; code c of weight j = low nibble of qs[j] (j < 16) or high nibble of
// qs[j - 16], fifth bit = bit j of the little-endian u32 qh; x = float(c - 16) * f32(d).
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ5_0) == 22, "block_q5_0 is 22 bytes");

// Q2_K: 256 weights in 16 sub-blocks of 16 with 4-bit scales (low nibble of scales[i]) and mins
// (high nibble); weight 128h + 32k + l is bits 2k..2k+1 of qs[32h + l];
// x = (d * sc_i) * q - dmin * m_i.
struct BlockQ2_K {
  uint8_t scales[16];
  uint8_t qs[64];
  uint16_t d;
  uint16_t dmin;
};
static_assert(sizeof(BlockQ2_K) == 84, "block_q2_K is 84 bytes");

// Q3_K: 256 weights in 16 sub-blocks of 16 with signed 6-bit scales u_i - 32 packed in 12 bytes;
// weight w = 128h + 32k + l has its low two bits at 2k in qs[32h + l] and its high bit at w / 32
// in hmask[l]; q = low - (high ? 0 : 4); x = (d * (u_i - 32)) * q.
struct BlockQ3_K {
  uint8_t hmask[32];
  uint8_t qs[64];
  uint8_t scales[12];
  uint16_t d;
};
static_assert(sizeof(BlockQ3_K) == 110, "block_q3_K is 110 bytes");

// Q4_K: 256 weights in 8 sub-blocks of 32 with 6-bit scales and mins; weight 64p + 32t + l is
// nibble t of qs[32p + l]; x = (d * sc_j) * q - dmin * m_j.
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qs[128];
};
static_assert(sizeof(BlockQ4_K) == 144, "block_q4_K is 144 bytes");

// Q5_K: Q4_K's scales and low nibbles plus a fifth bit: bit j of qh[l] for weight 32j + l;
// x = (d * sc_j) * q - dmin * m_j.
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};
static_assert(sizeof(BlockQ5_K) == 176, "block_q5_K is 176 bytes");

// Q6_K: 256 weights in 16 sub-blocks of 16 with int8 scales; weight 128h + 32k + l has its low
// nibble in ql[64h + 32(k & 1) + l] (high nibble for k >= 2) and its top two bits at 2k in
// qh[32h + l]; x = (d * sc_i) * (q - 32).
struct BlockQ6_K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};
static_assert(sizeof(BlockQ6_K) == 210, "block_q6_K is 210 bytes");

}  // namespace pd::engine::cuda
