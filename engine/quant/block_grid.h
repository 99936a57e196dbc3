// Per-weight access to the levels of one quantized block, for quantizers that pick each weight's
// code themselves after the block's scales are fixed (GPTQ: the scales come from QuantizeRow on
// the block, then every weight is stored as the level nearest to its error-corrected value).
//
// In every supported format the dequantized weight w of a block is an affine function of an
// integer code q:
//   x^_w = scale[w] * q - offset[w],   q in [qmin, qmax]
// where scale/offset are products of the block's stored (super-)scales exactly as the reference
// dequantizer in k_quants.h / q8_0.h evaluates them, so Level() equals DequantizeRow's output
// bit for bit (this file is built with -ffp-contract=off like the dequantizers):
//   Q8_0  scale = d,             offset = 0,          q = code       (-127..127)
//   Q4_0  scale = d,             offset = 0,          q = code - 8   (-8..7)
//   Q5_0  scale = d,             offset = 0,          q = code - 16  (-16..15)
//   Q2_K  scale = d * sc_i,      offset = dmin * m_i, q = code       (0..3)
//   Q3_K  scale = d * (u_i - 32), offset = 0,         q = code - 4   (-4..3)
//   Q4_K  scale = d * sc_j,      offset = dmin * m_j, q = code       (0..15)
//   Q5_K  scale = d * sc_j,      offset = dmin * m_j, q = code       (0..31)
//   Q6_K  scale = d * sc_i,      offset = 0,          q = code - 32  (-32..31)
//   W4A16 scale = d,             offset = 0,          q = code - 8   (-8..7), 128 weights
// (Q8_0 files may hold -128; this grid stays symmetric, as ggml's reference quantizer does.)
//
// All functions are pure and thread-safe.
#pragma once

#include <cstdint>

#include "engine/quant/dtype.h"
#include "engine/quant/k_quants.h"

namespace pd::engine {

struct BlockGrid {
  int n = 0;  // weights in the block (Traits(t).block_size: 32, 128 or 256)
  int qmin = 0, qmax = 0;
  float scale[kQK] = {};
  float offset[kQK] = {};

  // The dequantized value of code q for weight w.
  float Level(int w, int q) const { return scale[w] * static_cast<float>(q) - offset[w]; }
  // The code of the level nearest to v for weight w (clamped to [qmin, qmax]; a zero scale, whose
  // levels all coincide, gives the code nearest to 0).
  int Nearest(int w, float v) const;
};

// True for the block types a grid describes: Q8_0, Q4_0, Q5_0, Q2_K ... Q6_K, W4A16 (not W8A8:
// its one scale per row lives in a row header, not in blocks).
bool HasGrid(DType t);

// Reads the grid of one encoded block of type t. PD_CHECKs HasGrid(t).
void ReadGrid(DType t, const void* block, BlockGrid* grid);

// Code of weight w (0 <= w < block size) of an encoded block, and stores code q (in the grid's
// [qmin, qmax], PD_CHECKed) for it, leaving every other weight and the scales unchanged.
int GetCode(DType t, const void* block, int w);
void SetCode(DType t, void* block, int w, int q);

}  // namespace pd::engine
