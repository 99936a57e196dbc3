// q5_0x16 (DType::kQ5_0x16): a Q5_0 matrix laid out for pdserve's own Q5_0 order (kRowOrderOwn,
// engine/backend/cpu/kernels.h), where one 512-bit register holds one 4-byte word of each of 16
// weight rows, as q8_0x16 (q8_0x16.h) does for Q8_0. A runtime layout made from Q5_0 rows at load
// (RepackQ5_0x16), never stored in a file; the same number of bytes as the rows it was made from
// (22 per row and block), rearranged so that a kernel turns them into unsigned codes (0..31, the
// weight + 16) for VPDPBUSD with a mask and a few whole-register operations:
//
//   rows in groups of 16 (the matrix's rows must be a multiple of 16); group g takes
//   16 * nb * 22 bytes (nb = k / 32 blocks per row) from byte g * 16 * nb * 22, its blocks in
//   pairs (one stream, in the order a kernel reads it; a pair is 704 bytes, 11 cache lines); a
//   last block without a pair stands alone (352 bytes):
//     pair p from p * 704: the nibbles of blocks 2p and 2p + 1 (256 bytes each), then their
//       fifth bits (64 bytes each), then their scales (32 bytes each);
//     a block's nibbles: word j (j < 4: the source's qs[4j..4j+3]) of the group's row e at
//       j * 64 + e * 4, so the low nibbles of word j are codes 4j..4j+3 and its high nibbles
//       codes 16 + 4j..16 + 4j + 3 (code word j + 4);
//     a block's fifth bits: code word j (j < 8: codes 4j..4j+3) as a 64-bit little-endian mask at
//       j * 8, bit 4e + t the fifth bit of row e's code 4j + t (a byte mask over the word's
//       register);
//     a block's scales: the 16 rows' f16 d, row e's at e * 2.
//
// A view of rows [first, first + count) is the same layout when both are multiples of 16.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/quant/q5_0.h"

namespace pd::engine {

inline constexpr int64_t kQ5_0x16Rows = 16;

// Offsets of block b's nibbles, fifth-bit masks and scales within a group of nb blocks a row.
inline size_t Q5_0x16NibblesAt(int64_t b) {
  return static_cast<size_t>((b / 2) * 704 + (b % 2) * 256);
}
inline size_t Q5_0x16MasksAt(int64_t nb, int64_t b) {
  const int64_t p = b / 2, in_pair = 2 * p + 1 < nb ? 2 : 1;
  return static_cast<size_t>(p * 704 + in_pair * 256 + (b % 2) * 64);
}
inline size_t Q5_0x16ScalesAt(int64_t nb, int64_t b) {
  const int64_t p = b / 2, in_pair = 2 * p + 1 < nb ? 2 : 1;
  return static_cast<size_t>(p * 704 + in_pair * 320 + (b % 2) * 32);
}

// Rearranges `rows` Q5_0 rows (rows % 16 == 0) of k columns (k % 32 == 0; `src_stride` bytes
// apart) into q5_0x16 at `dst` (rows * k / 32 * 22 bytes). Pure; dst must not overlap src.
void RepackQ5_0x16(const void* src, size_t src_stride, int64_t rows, int64_t k, void* dst);
// Row r of a q5_0x16 matrix of k columns back as k / 32 Q5_0 blocks: the bytes the source row had.
void UnpackQ5_0x16Row(const void* w, int64_t k, int64_t r, BlockQ5_0* out);

}  // namespace pd::engine
