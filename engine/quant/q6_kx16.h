// q6_Kx16 (DType::kQ6_Kx16): a Q6_K matrix laid out for pdserve's own Q6_K order (kRowOrderOwn,
// engine/backend/cpu/kernels.h), where one 512-bit register holds one 4-byte word of each of 16
// weight rows, as q4_Kx16 (q4_kx16.h) does for Q4_K. A runtime layout made from Q6_K rows at load
// (RepackQ6_Kx16), never stored in a file; the same 210 bytes per row and super-block as Q6_K,
// rearranged:
//
//   rows in groups of 16 (the matrix's rows must be a multiple of 16); group g takes
//   16 * nbk * 210 bytes (nbk = k / 256 super-blocks per row) from byte g * 16 * nbk * 210, its
//   super-blocks one after another (one stream, 3360 bytes each), each its scales first:
//     scales at 0: the int8 scales of 16-weight sub-blocks 2i and 2i + 1 (i < 8) of row e at
//       32i + 2e and + 1 (one sign extension to 16-bit words leaves the pair in lane e's word);
//     d at 256: row e's f16 d at 256 + 2e;
//     low bits at 288: word (h, c, t) (h < 2 the half, c < 2, t < 8) at 288 + (16h + 8c + t) * 64
//       + e * 4, row e's ql[64h + 32c + 4t .. + 3];
//     high bits at 2336: word (h, t) at 2336 + (8h + t) * 64 + e * 4, row e's qh[32h + 4t .. + 3].
//   The 32 weights 32G + 4t .. 32G + 4t + 3 (G = 4h + k < 8, t < 8) are then, per byte, the low
//   word (h, k % 2, t) shifted right by 4 (k / 2) (its low nibble) and bits 2k, 2k + 1 of the high
//   word (h, t) as bits 4 and 5: codes 0..63, the weight + 32.
//
// A view of rows [first, first + count) is the same layout when both are multiples of 16.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/quant/k_quants.h"

namespace pd::engine {

inline constexpr int64_t kQ6_Kx16Rows = 16;
inline constexpr size_t kQ6_Kx16SuperBytes = 16 * sizeof(BlockQ6_K);  // 3360
inline constexpr size_t kQ6_Kx16ScalesAt = 0;
inline constexpr size_t kQ6_Kx16DAt = 256;
inline constexpr size_t kQ6_Kx16LowAt = 288;
inline constexpr size_t kQ6_Kx16HighAt = 2336;

// Lays out one group: rows[e] (e < 16) points at row e's nbk Q6_K blocks; 16 * nbk * 210 bytes
// at `dst`. Rows may repeat (a part group padded with its last row).
void RepackQ6_Kx16Group(const BlockQ6_K* const rows[16], int64_t nbk, void* dst);
// Rearranges `rows` Q6_K rows (rows % 16 == 0) of k columns (k % 256 == 0; `src_stride` bytes
// apart) into q6_Kx16 at `dst` (rows * k / 256 * 210 bytes). Pure; dst must not overlap src.
void RepackQ6_Kx16(const void* src, size_t src_stride, int64_t rows, int64_t k, void* dst);
// Row r of a q6_Kx16 matrix of k columns back as k / 256 Q6_K blocks: the bytes the source row had.
void UnpackQ6_Kx16Row(const void* w, int64_t k, int64_t r, BlockQ6_K* out);

}  // namespace pd::engine
