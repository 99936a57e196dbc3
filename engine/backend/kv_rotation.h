// The Hadamard rotation of INT8 KV rows (engine/backend/kv_layout.h, "INT8").
//
// An INT8 K or V row is quantized with one scale per token and head: scale = max|x| / 127. A head
// whose values have a few large channels (Gemma's K after its QK norm and RoPE, V's outlier
// channels) spends most of the 255 codes on those channels and rounds the rest coarsely. Rotating
// the row by a Hadamard matrix first spreads every channel over all of them: the rotated row is
// close to Gaussian, its max|x| is a few standard deviations, and the rounding error of every
// value shrinks. Rotations keep dot products, so attention does not need to undo it per key:
//
//   store    k' = H k / b,  v' = H v / b           (H: b x b, entries +-1, H H = b I)
//   scores   q . k = (H q) . k'                     (rotate the query once per row and head)
//   output   sum_t p_t v_t = H (sum_t p_t v'_t)     (rotate the weighted sum once per row and head)
//
// H is the Sylvester (Walsh-Hadamard) matrix of size b, applied to each of the head_dim / b
// consecutive blocks of a head (b = the largest power of two dividing head_dim, e.g. 256 for
// Gemma's 256, 128 for 128, 16 for 80). The factor 1 / b is a power of two, so every scale in
// this scheme is exact; the butterflies' F32 additions round like any F32 sum. The transform is
// its own inverse up to 1 / b, so the same function with the other scale undoes it.
//
// The loops below are the reference and the scalar kernel table's version; the CPU backend and
// the KV-transfer codec rotate through their kernel table (cpu::Kernels::rotate_kv_row), whose
// AVX2 version computes the same butterflies in the same order and so gives the same bits
// (cpu_kernels_test checks it). The transform costs head_dim * log2(b) additions per row: about
// 80 ns for 256 values with AVX2, 600-800 ns in these loops.
#pragma once

#include <cstdint>

namespace pd::engine {

// The rotation's block size for `head_dim` (> 0): its largest power-of-two divisor.
inline int KvRotationBlock(int head_dim) { return head_dim & -head_dim; }

// x[0, head_dim) <- scale * (H x) per block of KvRotationBlock(head_dim) values. scale = 1 / b
// (KvRotationBlock) rotates a row into the stored basis; scale = 1 rotates a query into it, or
// a stored row (or a weighted sum of them) back.
inline void RotateKvRow(float* x, int head_dim, float scale) {
  const int b = KvRotationBlock(head_dim);
  for (int base = 0; base < head_dim; base += b) {
    float* y = x + base;
    for (int len = 1; len < b; len *= 2) {
      for (int i = 0; i < b; i += 2 * len) {
        for (int j = i; j < i + len; ++j) {
          const float u = y[j], v = y[j + len];
          y[j] = u + v;
          y[j + len] = u - v;
        }
      }
    }
    if (scale != 1.f) {
      for (int i = 0; i < b; ++i) y[i] *= scale;
    }
  }
}

// Into the stored basis: x <- H x / b.
inline void RotateKvRowIn(float* x, int head_dim) {
  RotateKvRow(x, head_dim, 1.f / static_cast<float>(KvRotationBlock(head_dim)));
}

// Out of it (or a query into it): x <- H x.
inline void RotateKvRowOut(float* x, int head_dim) { RotateKvRow(x, head_dim, 1.f); }

}  // namespace pd::engine
