// q4_Kx16 (DType::kQ4_Kx16): a Q4_K matrix laid out for pdserve's own Q4_K order (kRowOrderOwn,
// engine/backend/cpu/kernels.h), where one 512-bit register holds one 4-byte word of nibbles of
// each of 16 weight rows, as q5_0x16 (q5_0x16.h) does for Q5_0. A runtime layout made from Q4_K
// rows at load (RepackQ4_Kx16), never stored in a file. The nibbles keep their bytes; each
// row's twelve bytes of packed 6-bit scales and mins are stored unpacked, one byte each, so a
// kernel widens them with one instruction: 148 bytes per row and super-block (Q4_K's 144 + 4).
//
//   rows in groups of 16 (the matrix's rows must be a multiple of 16); group g takes
//   16 * nbk * 148 bytes (nbk = k / 256 super-blocks per row) from byte g * 16 * nbk * 148, its
//   super-blocks one after another (one stream, 2368 bytes = 37 cache lines each), each its
//   scales first (a kernel reads them first):
//     scales at 0: sub-block j's (j < 8) 6-bit scale of row e at 16j + e;
//     mins at 128: sub-blocks 2i and 2i + 1 (i < 4) of row e at 128 + 32i + 2e and + 1 (so that
//       one zero-extension to 16-bit words leaves the pair in lane e's 32-bit word);
//     d at 256: row e's f16 d at 256 + 2e; dmin at 288: row e's f16 dmin at 288 + 2e;
//     nibbles at 320: word (p, w) (p < 4 a pair of sub-blocks, w < 8) at 320 + (8p + w) * 64 +
//       e * 4, row e's qs[32p + 4w .. 32p + 4w + 3]: its low nibbles are codes 4w..4w+3 of
//       sub-block 2p, its high nibbles the same codes of sub-block 2p + 1.
//
// A view of rows [first, first + count) is the same layout when both are multiples of 16.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/quant/k_quants.h"

namespace pd::engine {

inline constexpr int64_t kQ4_Kx16Rows = 16;
inline constexpr size_t kQ4_Kx16RowBytes = 148;  // per row and super-block
inline constexpr size_t kQ4_Kx16SuperBytes = kQ4_Kx16Rows * kQ4_Kx16RowBytes;  // 2368
inline constexpr size_t kQ4_Kx16ScalesAt = 0;
inline constexpr size_t kQ4_Kx16MinsAt = 128;
inline constexpr size_t kQ4_Kx16DAt = 256;
inline constexpr size_t kQ4_Kx16DminAt = 288;
inline constexpr size_t kQ4_Kx16NibblesAt = 320;

// Lays out one group: rows[e] (e < 16) points at row e's nbk Q4_K blocks; 16 * nbk * 148 bytes
// at `dst`. Rows may repeat (a part group padded with its last row).
void RepackQ4_Kx16Group(const BlockQ4_K* const rows[16], int64_t nbk, void* dst);
// Rearranges `rows` Q4_K rows (rows % 16 == 0) of k columns (k % 256 == 0; `src_stride` bytes
// apart) into q4_Kx16 at `dst` (rows * k / 256 * 148 bytes). Pure; dst must not overlap src.
void RepackQ4_Kx16(const void* src, size_t src_stride, int64_t rows, int64_t k, void* dst);
// Row r of a q4_Kx16 matrix of k columns back as k / 256 Q4_K blocks: the bytes the source row
// had (the 6-bit packing of scales and mins is one-to-one).
void UnpackQ4_Kx16Row(const void* w, int64_t k, int64_t r, BlockQ4_K* out);

}  // namespace pd::engine
