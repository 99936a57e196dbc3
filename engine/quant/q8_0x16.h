// q8_0x16 (DType::kQ8_0x16): a Q8_0 matrix laid out for pdserve's own Q8_0 order (kRowOrderOwn,
// engine/backend/cpu/kernels.h), where one 512-bit register holds one 4-byte word of each of 16
// weight rows. A runtime layout made from Q8_0 rows at load (RepackQ8_0x16), never stored in a
// file; the same bytes as the Q8_0 rows it was made from, rearranged:
//
//   rows [0, 16 * G), G = rows / 16, in groups of 16 rows; group g takes 16 * nb * 34 bytes
//   (nb = k / 32 blocks per row) from byte g * 16 * nb * 34, its blocks in pairs (one stream,
//   in the order a kernel reads it; a pair is 1,088 bytes, 17 cache lines, so every block's
//   codes start on a line when the group does); a last block without a pair stands alone:
//     pair p from p * 1088: the codes of blocks 2p and 2p + 1, 512 bytes each, then their
//       scales, 32 bytes each (Q8_0x16CodesAt, Q8_0x16ScalesAt);
//     a block's codes: word j (codes 4j..4j+3, j < 8) of the group's row e at j * 64 + e * 4,
//       each code stored as q + 128 (unsigned, VPDPBUSD's first operand);
//     a block's scales: the 16 rows' f16 d, row e's at e * 2.
//   rows [16 * G, rows): plain Q8_0 rows (BlockQ8_0), as in the source.
//
// So a view of rows [first, first + count) is the same layout when `first` is a multiple of 16
// and `count` is too or the view runs to the end of the matrix (Q8_0x16ViewOk).
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/quant/q8_0.h"

namespace pd::engine {

inline constexpr int64_t kQ8_0x16Rows = 16;

// True when rows [first, first + count) of a q8_0x16 matrix of `rows` rows are one (above).
inline bool Q8_0x16ViewOk(int64_t rows, int64_t first, int64_t count) {
  return first % kQ8_0x16Rows == 0 && (count % kQ8_0x16Rows == 0 || first + count == rows);
}

// Offsets of block b's codes and scales within a group of nb blocks a row.
inline size_t Q8_0x16CodesAt(int64_t b) {
  return static_cast<size_t>((b / 2) * 1088 + (b % 2) * 512);
}
inline size_t Q8_0x16ScalesAt(int64_t nb, int64_t b) {
  const int64_t p = b / 2, in_pair = 2 * p + 1 < nb ? 2 : 1;
  return static_cast<size_t>(p * 1088 + in_pair * 512 + (b % 2) * 32);
}

// Rearranges `rows` Q8_0 rows of k columns (k % 32 == 0; rows contiguous, `src_stride` bytes
// apart) into q8_0x16 at `dst` (rows * k / 32 * 34 bytes). Pure; dst must not overlap src.
void RepackQ8_0x16(const void* src, size_t src_stride, int64_t rows, int64_t k, void* dst);
// Row r of a q8_0x16 matrix of `rows` rows and k columns back as k / 32 Q8_0 blocks: the bytes
// the source row had.
void UnpackQ8_0x16Row(const void* w, int64_t rows, int64_t k, int64_t r, BlockQ8_0* out);

}  // namespace pd::engine
