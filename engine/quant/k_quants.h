// GGUF/ggml's Q4_0 and k-quant block formats (Q2_K ... Q6_K, and Q8_K for activations): block
// structs bit-exact with the files llama.cpp writes, scalar reference dequantizers, scalar
// reference quantizers, and row conversions dispatched on DType.
//
// These functions are the portable reference: SIMD and GPU kernels are tested against them, so
// their loops stay plain. The dequantizers evaluate exactly the float expressions ggml and the
// `gguf` Python package evaluate, in the same order (each is listed with its format below), and
// reproduce them bit for bit (tests/engine/quant/k_quants_test.cc checks this against
// testdata/kquants, written by scripts/make_kquant_reference.py). Their .cc files are compiled
// with -ffp-contract=off so that no multiply-add is fused.
//
// The quantizers are our own round-to-nearest searches, not llama.cpp's (so their bytes differ
// from llama-quantize's for all types but Q8_K, whose quantizer follows ggml's reference exactly
// because dot products of k-quant weights and Q8_K activations must match llama.cpp's). Each
// stored weight is the nearest level of its sub-block's stored grid (but for one or two pinned
// weights per super-block); the search picks the scales (and mins) of that grid by weighted
// squared error, sum_j w_j (x_j - x^_j)^2 with w_j = importance[j] (1 when importance is
// nullptr), never storing a weight more than two grid steps from its input. Quantizing the
// dequantized values again reproduces them exactly (Q8_K: its codes, and d to a few ulps). Details
// in k_quants_quantize.cc; measured errors and bounds in tests/engine/quant/k_quants_test.cc.
//
// Notation used in the layouts: a super-block holds 256 weights x[0..255]; "weight w" is x[w].
// f16 fields are IEEE binary16 bits and are read with F16ToF32 (exact). All multi-byte fields
// are little-endian, as in the files. All functions are pure and thread-safe.
//
// Preconditions of every function: n is a multiple of the format's block size (PD_CHECKed);
// quantizer inputs are finite and small enough that the scales fit in f16 (|x| < ~1e6 for the
// k-quants; larger values saturate the scale at the largest finite f16).
#pragma once

#include <cstdint>

#include "engine/quant/dtype.h"
#include "engine/quant/q8_0.h"

namespace pd::engine {

// Weights per k-quant super-block (ggml's QK_K).
inline constexpr int kQK = 256;

// ---- Q4_0: 32 weights, 18 bytes, 4.5 bits per weight ---------------------------------------
//   bytes 0-1  d     f16 scale
//   bytes 2-17 qs    16 bytes of 4-bit codes: weight j (0..15) is the low nibble of qs[j],
//                    weight j + 16 the high nibble of qs[j]
//   x^ = d * (code - 8)                 (float(code - 8) * d)
// Codes 0..15 are levels -8..7; the quantizer maps the sub-block's largest magnitude to the
// level the search picks (usually -8, the side with one more level).
struct BlockQ4_0 {
  static constexpr int kWeights = 32;
  uint16_t d;
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ4_0) == 18, "BlockQ4_0 must match ggml's block_q4_0 (18 bytes)");

// ---- Q2_K: 256 weights, 84 bytes, 2.625 bits per weight -------------------------------------
// 16 sub-blocks of 16 weights (sub-block i = weights 16i .. 16i+15), each with a 4-bit scale and
// a 4-bit min, relative to the f16 super-scales d and dmin.
//   bytes 0-15  scales  scales[i] & 0x0F = scale sc_i, scales[i] >> 4 = min m_i of sub-block i
//   bytes 16-79 qs      2-bit codes. Weight w = 128h + 32k + l (h = 0..1, k = 0..3, l = 0..31)
//                       is bits 2k..2k+1 of qs[32h + l]: each byte holds four weights 32 apart
//   bytes 80-81 d       f16 scale of the scales
//   bytes 82-83 dmin    f16 scale of the mins
//   x^ = (d * sc_i) * q - (dmin * m_i),  q = 0..3, i = w / 16
struct BlockQ2_K {
  static constexpr int kWeights = kQK;
  uint8_t scales[16];
  uint8_t qs[64];
  uint16_t d;
  uint16_t dmin;
};
static_assert(sizeof(BlockQ2_K) == 84, "BlockQ2_K must match ggml's block_q2_K (84 bytes)");

// ---- Q3_K: 256 weights, 110 bytes, 3.4375 bits per weight -----------------------------------
// 16 sub-blocks of 16 weights with signed 6-bit scales; 3-bit codes split into a 2-bit plane
// (packed as in Q2_K) and a 1-bit plane, so that the 2-bit plane stays byte-aligned.
//   bytes 0-31   hmask   high bit of weight w is bit (w / 32) of hmask[w % 32]
//   bytes 32-95  qs      low 2 bits of weight w = 128h + 32k + l: bits 2k..2k+1 of qs[32h + l]
//   bytes 96-107 scales  sixteen 6-bit values u_i, sub-block i = weights 16i .. 16i+15:
//                          low 4 bits:  i < 8: scales[i] & 0x0F;  i >= 8: scales[i - 8] >> 4
//                          high 2 bits: bits 2(i/4)..2(i/4)+1 of scales[8 + i % 4]
//                        the signed scale is sc_i = u_i - 32 (-32..31)
//   bytes 108-109 d      f16 super-scale
//   q = low2 - (high bit ? 0 : 4)        (-4..3; a CLEAR high bit subtracts 4)
//   x^ = (d * sc_i) * q
struct BlockQ3_K {
  static constexpr int kWeights = kQK;
  uint8_t hmask[32];
  uint8_t qs[64];
  uint8_t scales[12];
  uint16_t d;
};
static_assert(sizeof(BlockQ3_K) == 110, "BlockQ3_K must match ggml's block_q3_K (110 bytes)");

// ---- Q4_K: 256 weights, 144 bytes, 4.5 bits per weight --------------------------------------
// 8 sub-blocks of 32 weights (sub-block j = weights 32j .. 32j+31), each with an unsigned 6-bit
// scale sc_j and 6-bit min m_j, relative to the f16 super-scales d and dmin.
//   bytes 0-1   d
//   bytes 2-3   dmin
//   bytes 4-15  scales  the 16 six-bit values (s = scales):
//                 j < 4:  sc_j = s[j] & 63                      m_j = s[j + 4] & 63
//                 j >= 4: sc_j = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4
//                         m_j  = (s[j + 4] >> 4) | (s[j] >> 6) << 4
//               i.e. bytes 0-3 hold sc_0..3 in their low 6 bits, bytes 4-7 m_0..3; bytes 8-11
//               hold the low nibbles of sc_4..7 (low half) and m_4..7 (high half); the top two
//               bits of bytes 0-3 and 4-7 hold the high 2 bits of sc_4..7 and m_4..7.
//   bytes 16-143 qs     4-bit codes: weight w = 64p + 32t + l (p = 0..3, t = 0..1, l = 0..31) is
//                       the low (t = 0) or high (t = 1) nibble of qs[32p + l]
//   x^ = (d * sc_j) * q - (dmin * m_j),  q = 0..15, j = w / 32
struct BlockQ4_K {
  static constexpr int kWeights = kQK;
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qs[128];
};
static_assert(sizeof(BlockQ4_K) == 144, "BlockQ4_K must match ggml's block_q4_K (144 bytes)");

// ---- Q5_K: 256 weights, 176 bytes, 5.5 bits per weight --------------------------------------
// Q4_K plus a fifth bit per weight.
//   bytes 0-1, 2-3, 4-15   d, dmin, scales exactly as Q4_K
//   bytes 16-47  qh        bit 4 of weight w is bit (w / 32) of qh[w % 32]
//   bytes 48-175 qs        low 4 bits, packed exactly as Q4_K's qs
//   x^ = (d * sc_j) * q - (dmin * m_j),  q = low4 | high << 4 = 0..31, j = w / 32
struct BlockQ5_K {
  static constexpr int kWeights = kQK;
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};
static_assert(sizeof(BlockQ5_K) == 176, "BlockQ5_K must match ggml's block_q5_K (176 bytes)");

// ---- Q6_K: 256 weights, 210 bytes, 6.5625 bits per weight -----------------------------------
// 16 sub-blocks of 16 weights with int8 scales; 6-bit codes split into a 4-bit plane (ql) and a
// 2-bit plane (qh). Weight w = 128h + 32k + l (h = 0..1, k = 0..3, l = 0..31):
//   bytes 0-127   ql      low 4 bits: nibble of ql[64h + 32(k & 1) + l], low nibble for k < 2,
//                         high nibble for k >= 2
//   bytes 128-191 qh      high 2 bits: bits 2k..2k+1 of qh[32h + l]
//   bytes 192-207 scales  int8 scale sc_i of sub-block i = w / 16
//   bytes 208-209 d       f16 super-scale
//   q = (low4 | high2 << 4) - 32         (-32..31)
//   x^ = (d * sc_i) * q
struct BlockQ6_K {
  static constexpr int kWeights = kQK;
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};
static_assert(sizeof(BlockQ6_K) == 210, "BlockQ6_K must match ggml's block_q6_K (210 bytes)");

// ---- Q8_K: 256 weights, 292 bytes, 9.125 bits per weight (activations) ----------------------
//   bytes 0-3     d      f32 scale
//   bytes 4-259   qs     int8 codes, weight w in qs[w]
//   bytes 260-291 bsums  int16 sums of qs over each 16 weights: bsums[i] = sum qs[16i..16i+15]
//                        (lets a dot product with a min-format weight apply the mins cheaply)
//   x^ = d * q
// Quantization is ggml's reference: m = the value of largest magnitude (the first, on ties),
// iscale = -127 / m, q = nearest-even(iscale * x) (at most 127), d = 1 / iscale; an all-zero
// block gets d = 0, q = 0, bsums = 0.
struct BlockQ8_K {
  static constexpr int kWeights = kQK;
  float d;
  int8_t qs[256];
  int16_t bsums[16];
};
static_assert(sizeof(BlockQ8_K) == 292, "BlockQ8_K must match ggml's block_q8_K (292 bytes)");

// ---- Row conversions -------------------------------------------------------------------------

// Expands n / Block::kWeights blocks into n floats. Defined for BlockQ4_0, BlockQ2_K ... BlockQ6_K,
// BlockQ8_K and BlockQ8_0.
template <typename Block>
void DequantizeRow(const Block* x, float* y, int64_t n);

// Quantizes n floats into n / Block::kWeights blocks. `importance`: nullptr or n non-negative
// per-weight weights of the squared error the search minimizes (a sub-block whose weights are
// all zero is searched with uniform weights). Q8_K and Q8_0 ignore `importance`: their
// quantizers are ggml's reference ones.
template <typename Block>
void QuantizeRow(const float* x, Block* y, int64_t n, const float* importance = nullptr);

template <>
void DequantizeRow(const BlockQ4_0* x, float* y, int64_t n);
template <>
void DequantizeRow(const BlockQ2_K* x, float* y, int64_t n);
template <>
void DequantizeRow(const BlockQ3_K* x, float* y, int64_t n);
template <>
void DequantizeRow(const BlockQ4_K* x, float* y, int64_t n);
template <>
void DequantizeRow(const BlockQ5_K* x, float* y, int64_t n);
template <>
void DequantizeRow(const BlockQ6_K* x, float* y, int64_t n);
template <>
void DequantizeRow(const BlockQ8_K* x, float* y, int64_t n);
template <>
void DequantizeRow(const BlockQ8_0* x, float* y, int64_t n);

template <>
void QuantizeRow(const float* x, BlockQ4_0* y, int64_t n, const float* importance);
template <>
void QuantizeRow(const float* x, BlockQ2_K* y, int64_t n, const float* importance);
template <>
void QuantizeRow(const float* x, BlockQ3_K* y, int64_t n, const float* importance);
template <>
void QuantizeRow(const float* x, BlockQ4_K* y, int64_t n, const float* importance);
template <>
void QuantizeRow(const float* x, BlockQ5_K* y, int64_t n, const float* importance);
template <>
void QuantizeRow(const float* x, BlockQ6_K* y, int64_t n, const float* importance);
template <>
void QuantizeRow(const float* x, BlockQ8_K* y, int64_t n, const float* importance);
template <>
void QuantizeRow(const float* x, BlockQ8_0* y, int64_t n, const float* importance);

// Row of n elements of any DType -> n floats (F32 is copied, F16/BF16 widened exactly).
void DequantizeRow(DType t, const void* x, float* y, int64_t n);
// n floats -> a row of type t (F16/BF16 round to nearest even). `importance` as in QuantizeRow;
// the float types ignore it.
void QuantizeRow(DType t, const float* x, void* y, int64_t n, const float* importance = nullptr);

// The 6-bit scale sc_j and min m_j of sub-block j (0..7) from Q4_K/Q5_K's 12 scale bytes.
inline void GetScaleMinK4(int j, const uint8_t* s, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// The unsigned 6-bit value u_i (0..63; the scale is u_i - 32) of sub-block i (0..15) from Q3_K's
// 12 scale bytes.
inline int GetScaleQ3K(int i, const uint8_t* s) {
  const int low = i < 8 ? (s[i] & 15) : (s[i - 8] >> 4);
  const int high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
  return low | high << 4;
}

}  // namespace pd::engine
