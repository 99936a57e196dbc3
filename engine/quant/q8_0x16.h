// q8_0x16 (DType::kQ8_0x16): a Q8_0 matrix laid out for pdserve's own Q8_0 order (kRowOrderOwn,
// engine/backend/cpu/kernels.h), where one 512-bit register holds one 4-byte word of each of 16
// weight rows. A runtime layout made from Q8_0 rows at load (RepackQ8_0x16), never stored in a
// file; the same bytes as the Q8_0 rows it was made from, rearranged:
//
//   rows [0, 16 * G), G = rows / 16, in groups of 16 rows; group g takes 16 * nb * 34 bytes
//   (nb = k / 32 blocks per row) from byte g * 16 * nb * 34:
//     codes:  nb * 512 bytes; block b's at b * 512, word j (codes 4j..4j+3, j < 8) of the
//             group's row e at b * 512 + j * 64 + e * 4, each code stored as q + 128 (unsigned,
//             VPDPBUSD's first operand);
//     scales: nb * 32 bytes from nb * 512; block b's f16 d of row e at nb * 512 + b * 32 + e * 2.
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

// Rearranges `rows` Q8_0 rows of k columns (k % 32 == 0; rows contiguous, `src_stride` bytes
// apart) into q8_0x16 at `dst` (rows * k / 32 * 34 bytes). Pure; dst must not overlap src.
void RepackQ8_0x16(const void* src, size_t src_stride, int64_t rows, int64_t k, void* dst);
// Row r of a q8_0x16 matrix of `rows` rows and k columns back as k / 32 Q8_0 blocks: the bytes
// the source row had.
void UnpackQ8_0x16Row(const void* w, int64_t rows, int64_t k, int64_t r, BlockQ8_0* out);

}  // namespace pd::engine
