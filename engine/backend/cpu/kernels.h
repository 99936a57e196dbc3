// The CPU backend's kernel table: the inner loops every op is built from.
//
// There is one table per instruction set: ScalarKernels() is the portable reference and
// Avx2Kernels() the AVX2+FMA+F16C version (nullptr when not compiled in). Tests run both on the
// same inputs and compare (tests/engine/backend/cpu_kernels_test.cc), so every SIMD entry has a
// scalar twin with the same contract. All kernels are pure functions of their arguments and
// thread-safe; none allocates.
//
// Pointers need no particular alignment. Lengths are element counts; Q8_0 and Q4_0 lengths must
// be multiples of 32, k-quant and Q8_K lengths multiples of 256, W8A8 of 32 (rows carry a 16-byte
// header) and W4A16 of 128 (callers check).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

#include "engine/backend/kv_rotation.h"
#include "engine/quant/k_quants.h"
#include "engine/quant/q5_0.h"
#include "engine/quant/q8_0.h"
#include "engine/quant/w4a16.h"
#include "engine/quant/w8a8.h"

namespace pd::engine::cpu {

// Weight types MatMul runs, indexing Kernels::gemm. Each names the weight type; the activation
// ("companion", ggml's vec_dot_type) type is the weight's own for F32/F16/BF16/Q8_0, Q8_0 for
// Q4_0 and Q8_K for the k-quants.
enum class GemmType : int {
  kF32 = 0,
  kF16 = 1,
  kBF16 = 2,
  kQ8_0 = 3,
  kQ4_0 = 4,  // x: BlockQ8_0
  kQ2_K = 5,  // x: BlockQ8_K (and the rest)
  kQ3_K = 6,
  kQ4_K = 7,
  kQ5_K = 8,
  kQ6_K = 9,
  kQ5_0 = 10,  // x: BlockQ8_0
  kW8A8 = 11,   // x: W8A8 rows (per-token INT8, w8a8.h)
  kW4A16 = 12,  // x: F32
};
inline constexpr int kNumGemmTypes = 13;

// The largest tile a GemmTileFn computes: kGemmTileW weight rows x kGemmTileX activation rows.
inline constexpr int kGemmTileW = 4;
inline constexpr int kGemmTileX = 4;

// Computes an nr x nc tile of y = x w^T, where w holds rows of k elements in the weight's type and
// x rows of k elements in its companion type (activations already converted: F32, F16 bits, BF16
// bits, BlockQ8_0 or BlockQ8_K):
//   y[c * y_stride + r] = dot(w + r * w_stride, x + c * x_stride)   for r < nr, c < nc
// with 1 <= nr <= kGemmTileW, 1 <= nc <= kGemmTileX; strides of w and x are in bytes, of y in
// floats. Each weight row is read once per tile and each activation row once per tile, so a
// 4x4 tile does 16 row-dots for 8 row reads.
using GemmTileFn = void (*)(int64_t k, const void* w, size_t w_stride, int nr, const void* x,
                            size_t x_stride, int nc, float* y, int64_t y_stride);

// The AVX512-VNNI Q8_0 and Q5_0 (x Q8_0) tiles (avx512_vnni.cc), bit-identical to the AVX2
// table's; nullptr when the CPU lacks AVX512F/BW/VL/VNNI, PDSERVE_CPU_ISA caps AVX-512 off, or
// PDSERVE_CPU_NO_VNNI is set (non-empty, not "0"; see CpuIsa below). The AVX2 table's Q8_0 and
// Q5_0 entries call them when present.
// 512-bit k-quant tiles (k_quants_avx512.cc; AVX512F + BW + VL + VNNI, PDSERVE_CPU_NO_VNNI
// unset): the same bits as the AVX2 tables' entries they stand in for; nullptr members elsewhere.
// q4_k_repack_gemv and q6_k (gemm[kQ6_K]) apply the sub-block scales with VPDPWSSD on 64 weights
// per instruction, so a tile of several activation rows (a few decode sequences, or the K+1 rows
// of a speculative step, each in the one-row order) costs much less than that many one-row tiles.
struct ZmmKQuantTiles {
  GemmTileFn q2_k_repack_gemm = nullptr;
  GemmTileFn q2_k_repack_gemv = nullptr;
  GemmTileFn q3_k = nullptr;  // gemm[kQ3_K]
  GemmTileFn q4_k_repack_gemv = nullptr;
  GemmTileFn q6_k = nullptr;  // gemm[kQ6_K]
  // Prompt rows: the tile's four weight rows in the 128-bit lanes of one ZMM, each column's
  // activations broadcast, so the integer lane sums of a pair of sub-blocks are shared by rows.
  GemmTileFn q4_k_repack_gemm = nullptr;
  GemmTileFn q6_k_wide = nullptr;  // gemm_wide[kQ6_K]
  // q4_k_repack_gemv and q6_k for exactly kGemmTileX + 1 activation rows (Kernels::
  // q4_k_repack_gemv5 and q6_k5).
  GemmTileFn q4_k_repack_gemv5 = nullptr;
  GemmTileFn q6_k5 = nullptr;
};
ZmmKQuantTiles ZmmKQuantTilesIfSupported();
// The AVX2 tiles that ZmmKQuantTiles' q3_k, q4_k_repack_gemv / gemm, q6_k and q6_k_wide stand in
// for (without the 512-bit dispatch), so that tests can compare them bit for bit. Only call where
// AVX2 runs.
GemmTileFn Q3KTileAvx2Only();
GemmTileFn Q4KRepackGemvTileAvx2Only();
GemmTileFn Q4KRepackGemmTileAvx2Only();
GemmTileFn Q6KWideTileAvx2Only();
GemmTileFn Q6KTileAvx2Only();
GemmTileFn Q8_0TileVnni();
GemmTileFn Q5_0TileVnni();
GemmTileFn Q4_0TileVnni();
// Q8_0 or Q5_0 weights x many Q8_0 activation rows (batched decode, prompts) on 512-bit VPDPBUSD
// with 16 activation rows per register (avx512_vnni.cc): `pack_x` lays out n activation rows once
// per MatMul (x_bytes(n, k) bytes, 64-byte aligned); `pack_w` (Q5_0 only) unpacks a chunk of
// weight rows (w_bytes(rows, k) bytes); `gemm` writes y[c * y_stride + r] for the chunk's rows r
// and all n columns c. Results equal the AVX2 (and VNNI) tiles' bit for bit. nullptr without
// AVX512-VNNI (or with PDSERVE_CPU_NO_VNNI set).
struct GroupedKernels {
  size_t (*x_bytes)(int64_t n, int64_t k);
  void (*pack_x)(const void* x, size_t x_stride, int64_t n, int64_t k, void* out);
  // nullptr: `gemm` reads the weight blocks in place (Q8_0).
  size_t (*w_bytes)(int64_t rows, int64_t k);
  void (*pack_w)(const void* w, size_t w_stride, int64_t rows, int64_t k, void* out);
  // `w`: the packed chunk (w_stride ignored) or, without pack_w, the rows themselves.
  void (*gemm)(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* packed_x,
               int64_t n, float* y, int64_t y_stride);
};
const GroupedKernels* Q8_0GroupedVnni();
const GroupedKernels* Q5_0GroupedVnni();
// Q5_0 the same way with the blocks read in place (no pack_w), each unpacked as the kernel reaches
// it: for one group of 16 activation rows (a batched decode step), where the packed chunk costs a
// store and a load of every code and is read once (gemv_bench rows/q5_0/16/1 on the AVX-512
// Xeon: 1.27 -> 1.01 ms). Several groups read each block several times: Q5_0GroupedVnni.
const GroupedKernels* Q5_0GroupedInPlaceVnni();
// Q5_0 on AVX2 alone (grouped_avx2.cc): eight activation rows per 256-bit register, a chunk's rows
// unpacked once per MatMul. Bit-identical to the AVX2 tile. nullptr when the build has no AVX2
// code; only call where AVX2 runs (Avx2Kernels() selected).
const GroupedKernels* Q5_0GroupedAvx2();
// Q8_0 weights (read in place, no pack_w) the same way: the tile's |w| and sign() per 4-byte
// group, eight activation rows per register; bit-identical to the AVX2 tile.
const GroupedKernels* Q8_0GroupedAvx2();
// Q8_0 and Q5_0 weights (in place) x a few activation rows on AVX2 alone (rows_avx2.cc): one
// weight row at a time against every activation row, the scale products formed eight at a time;
// more than 8 rows run in passes of 8, each reading the weights again. pack_x's layout serves
// both types. Bit-identical to the AVX2 tiles. nullptr when the build has no AVX2 code; only call
// where AVX2 runs.
const GroupedKernels* Q8_0RowsAvx2();
const GroupedKernels* Q5_0RowsAvx2();
// Q4_K weights x Q8_K prompt rows in llama.cpp's repacked GEMM order (the order of
// Kernels::q4_k_repack_gemm, for rows not in the GEMV order) on AVX2 (grouped_avx2.cc): a chunk's
// rows unpacked once per MatMul, eight prompt rows per register. Bit-identical to the AVX2
// q4_k_repack_gemm tile. nullptr when the build has no AVX2 code; only call where AVX2 runs.
const GroupedKernels* Q4KRepackGroupedAvx2();
// Q6_K weights x Q8_K rows in llama.cpp's tiled order (gemm_wide, rows with kRowOrderWide) on
// AVX2, the same way; bit-identical to the AVX2 gemm_wide Q6_K tile.
const GroupedKernels* Q6KWideGroupedAvx2();
// The same contract for small batches (2 to ~11 activation rows: a few decode sequences, or the
// K+1 rows of one sequence that a speculative step verifies): four activation rows per 512-bit
// register (one 128-bit lane each, avx512_vnni.cc), weight blocks read in place and broadcast; a
// last row alone in its group of four (n = 5, 9) takes the 256-bit tile's form in the same pass.
// pack_x's layout serves both types. Results equal the AVX2 tiles' bit for bit; nullptr without
// AVX512-VNNI (or with PDSERVE_CPU_NO_VNNI set).
const GroupedKernels* Q8_0QuadVnni();
const GroupedKernels* Q5_0QuadVnni();
// pdserve's own order for Q8_0 weights x Q8_0 activations, for rows that no llama.cpp order binds
// (kRowOrderOwn: the output head where the K/V cache is not F32, docs/numerics.md). Each output is
// one F32 chain over its blocks in order from +0: y = fma(d_w * d_x, isum, y), isum the block's
// exact integer dot product, d_w * d_x rounded to F32. An output depends on its own weight row and
// activation row only, so an activation row gets the same bits in any batch, and the VNNI kernel
// gives the portable one's bits (cpu_kernels_test.cc, OwnOrderTest). Where ggml's order spends ~9
// vector operations per weight row, block and four activation rows on lanes it must keep apart,
// here the integer sums come out whole: 16 weight rows sit in the lanes of a ZMM register,
// transposed from their blocks in place once per block and batch, and each activation row costs
// 8 VPDPBUSD and three F32 operations per block for all 16. On AVX2 alone (Q8_0x16OwnOrderAvx2
// below) the laid-out rows take sign, MADDUBS, MADD and ADD per code word and 8 rows.
// pack_x's layout (both): per activation row Q8_0OwnXRowBytes(k / 32) bytes: the codes of its
// blocks (32 bytes each), then d_x per block (F32), then -128 * sum(codes) per block (int32:
// VPDPBUSD's offset for the unsigned w + 128).
size_t Q8_0OwnXRowBytes(int64_t nb);
size_t Q8_0OwnXBytes(int64_t n, int64_t k);
void PackQ8_0OwnX(const void* x, size_t x_stride, int64_t n, int64_t k, void* out);
// Every own-order kernel's table: the shared pack_x, its own gemm.
template <auto kGemm>
inline constexpr GroupedKernels kOwnOrderKernels = {&Q8_0OwnXBytes, &PackQ8_0OwnX, nullptr, nullptr,
                                                    kGemm};
const GroupedKernels* Q8_0OwnOrderScalar();
// nullptr without AVX512-VNNI (or with PDSERVE_CPU_NO_VNNI set).
const GroupedKernels* Q8_0OwnOrderVnni();
// The same order over q8_0x16 weights (engine/quant/q8_0x16.h: the Q8_0 rows repacked at load,
// 16 rows' code words side by side, stored + 128), the same pack_x. `w` starts at a multiple of
// 16 rows and w_stride is unused. The words load straight into the lanes, so the transposition
// above is gone and one activation row costs 8 VPDPBUSD and three F32 operations per 16 weight
// rows and block (ggml's order: ~9 operations per weight row and block), with the bits of
// Q8_0OwnOrderScalar on the source rows. The portable kernel unpacks each row and runs that one.
const GroupedKernels* Q8_0x16OwnOrderScalar();
// nullptr where Q8_0OwnOrderVnni is.
const GroupedKernels* Q8_0x16OwnOrderVnni();
// pdserve's own order for Q5_0 weights laid out as q5_0x16 (engine/quant/q5_0x16.h: 16 rows'
// nibble words side by side, their fifth bits as byte masks), the same pack_x: per output
// y = fma(d_w * d_x, isum, y) over the blocks from +0, isum = sum (code - 16) * x exact (the
// VNNI kernels start the sums at -16 * sum(x), pack_x's offset / 8). `w` starts at a multiple of
// 16 rows, rows is a multiple of 16 and w_stride is unused. The VNNI kernel makes a block's 8
// code words with AND / shift and a masked add of 16 per word, once per block for up to 16
// activation rows, then the Q8_0 layout's 8 VPDPBUSD and three F32 operations per activation
// row, so one row costs the stream of its bytes and four cost little more; the portable kernel
// (each row unpacked, integer dot per block) is the statement of the order, bit for bit.
const GroupedKernels* Q5_0x16OwnOrderScalar();
// nullptr where Q8_0OwnOrderVnni is.
const GroupedKernels* Q5_0x16OwnOrderVnni();
// The same order on plain Q5_0 rows (kRowOrderOwn over weights not laid out at load): the
// portable kernel on the rows; the VNNI one is Q8_0OwnOrderVnni's (16 rows transposed per block,
// one or two activation rows through 256-bit dots and a HADD tree) with each row's block unpacked
// to its 32 codes first (a masked add of 16 from qh): the same bits as on the layout.
const GroupedKernels* Q5_0OwnOrderScalar();
const GroupedKernels* Q5_0OwnOrderVnni();
// The same orders on AVX2 alone (own_order_avx2.cc), for CPUs without AVX512-VNNI: 8 weight rows
// of q8_0x16 / q5_0x16 in the lanes of a YMM register, per code word and activation row MADDUBS,
// MADD against ones and ADD (Q8_0: |w| against x signed by w, VPSIGNB; a call whose activations
// hold a -128 takes the portable kernel), the portable kernels' bits. On plain rows (weights not
// laid out, q8_0x16's tail rows) each group of 16 is laid out in scratch first: a fallback.
// nullptr where the AVX2 table does not run (SelectKernels).
const GroupedKernels* Q8_0OwnOrderAvx2();
const GroupedKernels* Q8_0x16OwnOrderAvx2();
const GroupedKernels* Q5_0OwnOrderAvx2();
const GroupedKernels* Q5_0x16OwnOrderAvx2();
// The q8_0x16 / q5_0x16 orders with Intel AMX (own_order_amx.cc): a laid-out block of 16 weight
// rows is an AMX B tile as it lies, so one TDPBSUD forms the block's exact sums for up to 16
// activation rows and 16 weight rows, and per activation row the VNNI kernel's three F32
// operations follow: the portable kernels' bits. Calls of fewer activation rows than the tiles
// pay for (Q8_0: 2, Q5_0: 3) take the VNNI kernel. nullptr unless AmxRuns().
const GroupedKernels* Q8_0x16OwnOrderAmx();
const GroupedKernels* Q5_0x16OwnOrderAmx();
// True where the AMX kernels run: CPUID reports AMX-TILE and AMX-INT8, the OS enables the tile
// state and grants it to this process (Linux: arch_prctl ARCH_REQ_XCOMP_PERM, asked once here),
// the VNNI kernels run (PDSERVE_CPU_ISA, PDSERVE_CPU_NO_VNNI), and PDSERVE_CPU_NO_AMX is unset,
// empty or "0". Read once per process.
bool AmxRuns();
// pdserve's own order for Q4_K weights x Q8_K activations (kRowOrderOwn): per output and
// super-block, sumi = sum_j sc_j * isum_j over the 8 sub-blocks (isum_j the sub-block's exact
// integer dot product of the 4-bit codes) and summ = sum_j m_j * xsum_j, both exact, then
// y = fma(d_w * d_x, sumi, y) and y = fma(-(dmin_w * d_x), summ, y), super-blocks in order from
// +0 (own_order.cc states it). ggml's order keeps 8 lanes of partial sums per super-block and
// row and ends each row in a horizontal sum, so a few activation rows cost nearly a row each;
// here 16 weight rows sit in the lanes of a ZMM register (q4_Kx16, engine/quant/q4_kx16.h, laid
// out at load) and an activation row costs 64 VPDPBUSD, 8 VPMULLD and 4 VPDPWSSD per 16 weight
// rows and super-block. An output depends on its own weight row and activation row only.
// pack_x's layout: per activation row Q4_KOwnXRowBytes(k / 256) bytes: the codes of its
// super-blocks (256 each), then d_x per super-block (F32), then per super-block 4 words, word p
// the 16-bit sums of sub-blocks 2p (low half) and 2p + 1 (high half).
size_t Q4_KOwnXRowBytes(int64_t nbk);
size_t Q4_KOwnXBytes(int64_t n, int64_t k);
void PackQ4_KOwnX(const void* x, size_t x_stride, int64_t n, int64_t k, void* out);
template <auto kGemm>
inline constexpr GroupedKernels kOwnOrderQ4KKernels = {&Q4_KOwnXBytes, &PackQ4_KOwnX, nullptr,
                                                       nullptr, kGemm};
// On plain Q4_K rows (weights not laid out at load): the portable kernel is the statement of the
// order; the VNNI one lays each group of 16 rows out in a scratch buffer first and runs the
// q4_Kx16 kernel on it (the same bits, at the cost of that copy: a fallback, not a fast path).
const GroupedKernels* Q4_KOwnOrderScalar();
const GroupedKernels* Q4_KOwnOrderVnni();  // nullptr where Q8_0OwnOrderVnni is
// On q4_Kx16 weights (`w` at a multiple of 16 rows, rows a multiple of 16, w_stride unused).
const GroupedKernels* Q4_Kx16OwnOrderScalar();
const GroupedKernels* Q4_Kx16OwnOrderVnni();  // nullptr where Q8_0OwnOrderVnni is
// The same on AVX2 alone (own_order_avx2.cc): 8 weight rows in the lanes of a YMM register, per
// sub-block and activation row 8 MADDUBS summed exactly in int16 and one MADD by the rows' scale
// pairs, the mins by 4 MADD per super-block: the portable kernel's bits. nullptr where the AVX2
// table does not run.
const GroupedKernels* Q4_KOwnOrderAvx2();
const GroupedKernels* Q4_Kx16OwnOrderAvx2();
// The q4_Kx16 order with Intel AMX (own_order_amx.cc): one TDPBSUD per sub-block of 32 for up to
// 16 activation rows, then the VNNI kernel's integer and F32 operations per row: the portable
// kernel's bits. Fewer than 8 activation rows take the VNNI kernel. nullptr unless AmxRuns().
const GroupedKernels* Q4_Kx16OwnOrderAmx();
// pdserve's own order for Q6_K weights x Q8_K activations (kRowOrderOwn): per output and
// super-block, total = sum_j sc_j * isum_j - 32 * sum_j sc_j * xsum_j over the 16 sub-blocks of
// 16 weights (isum_j the exact dot product of the unsigned 6-bit codes, the weight + 32), exact,
// then y = fma(d_w * d_x, total, y), super-blocks in order from +0 (own_order.cc states it).
// On q6_Kx16 (engine/quant/q6_kx16.h, laid out at load) 16 weight rows sit in the lanes: a
// code word costs two shifts, an AND and a VPTERNLOGD once per batch, an activation row 64
// VPDPBUSD, 16 VPMULLD and 8 VPDPWSSD per 16 weight rows and super-block. pack_x's layout: per
// activation row Q6_KOwnXRowBytes(k / 256) bytes: the codes of its super-blocks (256 each), then
// d_x per super-block (F32), then per super-block 8 words, word p the 16-bit sums of sub-blocks
// 2p (low half) and 2p + 1 (high half).
size_t Q6_KOwnXRowBytes(int64_t nbk);
size_t Q6_KOwnXBytes(int64_t n, int64_t k);
void PackQ6_KOwnX(const void* x, size_t x_stride, int64_t n, int64_t k, void* out);
template <auto kGemm>
inline constexpr GroupedKernels kOwnOrderQ6KKernels = {&Q6_KOwnXBytes, &PackQ6_KOwnX, nullptr,
                                                       nullptr, kGemm};
// On plain Q6_K rows: the portable kernel; the VNNI one lays each group of 16 rows out in scratch
// first (a fallback, as Q4_KOwnOrderVnni's).
const GroupedKernels* Q6_KOwnOrderScalar();
const GroupedKernels* Q6_KOwnOrderVnni();  // nullptr where Q8_0OwnOrderVnni is
// On q6_Kx16 weights (`w` at a multiple of 16 rows, rows a multiple of 16, w_stride unused).
const GroupedKernels* Q6_Kx16OwnOrderScalar();
const GroupedKernels* Q6_Kx16OwnOrderVnni();  // nullptr where Q8_0OwnOrderVnni is
// The AVX2 table's Q8_0, Q5_0 and Q4_0 tiles without the VNNI dispatch (tests compare the two).
void GemmQ8_0Avx2(int64_t k, const void* w, size_t w_stride, int nr, const void* x,
                  size_t x_stride, int nc, float* y, int64_t y_stride);
void GemmQ5_0Avx2(int64_t k, const void* w, size_t w_stride, int nr, const void* x,
                  size_t x_stride, int nc, float* y, int64_t y_stride);
void GemmQ4_0Avx2(int64_t k, const void* w, size_t w_stride, int nr, const void* x,
                  size_t x_stride, int nc, float* y, int64_t y_stride);

// AVX2 kernels of pdserve's own formats (w8a8_w4a16_avx2.cc); only called when the CPU has
// AVX2 + FMA + F16C. GemmTileFn contracts; see the table entries below for their numerics.
void GemmW8A8Avx2(int64_t k, const void* w, size_t w_stride, int nr, const void* x,
                  size_t x_stride, int nc, float* y, int64_t y_stride);
void GemmW4A16Avx2(int64_t k, const void* w, size_t w_stride, int nr, const void* x,
                   size_t x_stride, int nc, float* y, int64_t y_stride);
// Bit-exact with QuantizeRowW8A8.
void QuantizeRowW8A8Avx2(const float* x, void* y, int64_t n);

// Attention in ggml-cpu's order, so that llama.cpp on the same CPU with an F32 K/V cache gives the
// same bits: ggml_vec_dot_f32 for Q.K, ggml_vec_soft_max_f32 for the exponentials and their F64
// sum, and for the weighted sum of V either llamafile's tinyBLAS (batches of two or more rows of a
// sequence) or ggml_vec_dot_f32 (one row). Both of those keep one F32 accumulator per position
// modulo R and sum the R accumulators at the end in a fixed tree: R = `lanes` for tinyBLAS and
// 4 * `lanes` for ggml_vec_dot_f32. `lanes` is the width ggml is built with: 16 on CPUs with
// AVX512F + AVX512DQ, 8 on AVX2 ones.
struct AttnKernels {
  int lanes;
  // ggml_vec_dot_f32(n, a, b): 4 * lanes FMA accumulators (element i feeds accumulator
  // i % (4 * lanes)), reduced like `reduce`; elements past the last full 4 * lanes step are added
  // as GCC compiles ggml's tail loop (GgmlDotTailFusedFrom: whole groups of lanes / 2 with
  // rounded products, then one FMA each). Head dims under 4 * lanes are all tail.
  float (*dot)(const float* a, const float* b, int64_t n);
  // y = exp(x - max) with ggml's vector expf of this width, returning the sum of y in F64, added
  // one `lanes`-wide group at a time (each group summed in F32 first, in the reduction tree of
  // ggml_vec_soft_max_f32). n must be a multiple of lanes; x = -inf gives y = 0.
  double (*exp_sum)(const float* x, float max, float* y, int64_t n);
  // out[c] = the sum over r < n_rows of rows[r * stride + c] for c < cols, in the order of
  // tinyBLAS's final hsum (n_rows == lanes) or of ggml_vec_dot_f32's reduction (n_rows == 4 *
  // lanes); one row is copied.
  void (*reduce)(const float* rows, int n_rows, int64_t stride, int64_t cols, float* out);
  // out[c] = sum over positions j in [lo, hi] of p[j - lo] * v[j - lo][c], c < cols, with one
  // FMA accumulator per position modulo n_acc (lanes or 4 * lanes, by absolute position j) summed
  // like `reduce`: the same bits as accumulating into n_acc rows and reducing them, without the
  // rows (the accumulators of a few columns at a time live in registers). n_acc = 1 is one chain
  // per column, the positions in order from +0: pv_gemm's chain (pdserve's order for generated
  // rows over an F16 cache, docs/numerics.md).
  void (*vsum)(const float* p, const float* const* v, int64_t lo, int64_t hi, int n_acc,
               int64_t cols, float* out);
  // The scores of a KV head's query heads against a run of keys, bit for bit `dot`:
  //   out[g * out_stride + j] = dot(k[j], q + g * q_stride, n)   for g < n_q, j < n_k.
  // The SIMD versions read each key once for up to four query heads and sum the lanes of `lanes`
  // keys at once (a transpose whose adds are, per key, exactly those of dot's lane sum), so no
  // key pays a horizontal reduction of its own.
  void (*dots)(const float* q, int64_t q_stride, int n_q, const float* const* k, int n_k, int64_t n,
               float* out, int64_t out_stride);
  // vsum for the query heads of one KV head, bit for bit:
  //   out + g * out_stride = vsum(p + g * p_stride, v, lo, hi, n_acc, cols)   for g < n_q.
  // The SIMD versions walk the positions one accumulator (position modulo n_acc) at a time, so
  // each loaded V segment feeds every head's accumulator and each V byte is read once per call
  // instead of once per head.
  void (*vsums)(const float* p, int64_t p_stride, int n_q, const float* const* v, int64_t lo,
                int64_t hi, int n_acc, int64_t cols, float* out, int64_t out_stride);
  // dots and vsums on F16 rows (keys / values), widened to F32 as they are loaded: the bits of
  // dots / vsums on the widened rows (f16 -> f32 is exact), without writing the F32 rows out.
  void (*dots_f16)(const float* q, int64_t q_stride, int n_q, const uint16_t* const* k, int n_k,
                   int64_t n, float* out, int64_t out_stride);
  void (*vsums_f16)(const float* p, int64_t p_stride, int n_q, const uint16_t* const* v, int64_t lo,
                    int64_t hi, int n_acc, int64_t cols, float* out, int64_t out_stride);
  // vsums for n_rows query rows of one sequence (a prompt's rows) against the same V rows, bit for
  // bit, each row with its own range [lo[r], hi[r]]:
  //   vsums(p[r], p_stride, n_q, v + (lo[r] - base), lo[r], hi[r], n_acc, cols, out[r], out_stride)
  // for r < n_rows, where v[j - base] is position j's row for j in [base, max hi], base <= every
  // lo[r]. The AVX-512 version takes the (row, head) pairs 16 at a time, their accumulators in
  // registers, and loads each V segment once per 16 pairs instead of once per row (positions
  // outside a row's range are skipped, never given a zero weight: 0 * inf would be NaN); the
  // others call vsums row by row.
  void (*vsums_rows)(const float* const* p, int64_t p_stride, int n_q, int n_rows,
                     const float* const* v, int64_t base, const int64_t* lo, const int64_t* hi,
                     int n_acc, int64_t cols, float* const* out, int64_t out_stride);
  void (*vsums_rows_f16)(const float* const* p, int64_t p_stride, int n_q, int n_rows,
                         const uint16_t* const* v, int64_t base, const int64_t* lo,
                         const int64_t* hi, int n_acc, int64_t cols, float* const* out,
                         int64_t out_stride);

  // ---- The GEMM order: prompt rows over an F16 K/V cache (not ggml's; docs/numerics.md) ----
  // Every (query, key) score and every (query, column) weighted sum is one chain of FMAs in a
  // fixed order from +0, whatever the lanes, the tiling or the number of queries: the SIMD
  // versions give the scalar twins' bits on every CPU, and a row's result depends on its own
  // range of positions only. The queries share each key and value load (a GEMM micro-tile).
  //
  // Scores: out[m][j - first] = chain over d = 0 .. n-1 of fma(q[m][d], key_j[d], s), for
  // m < n_q and j in [first, first + n_k). Keys are in the blocked transposed layout
  // (AttnKeyBlockIndex): 16 keys per block, element d of the block's keys contiguous.
  void (*qk_gemm)(const float* const* q, int n_q, const float* kt, int64_t n, int64_t first,
                  int64_t n_k, float* const* out);
  // Weighted sums, onto what acc holds: acc[m][c] = fma(p[m][j], v_j[c], acc[m][c]) for j = 0 ..
  // n_k-1 in order, c < cols, m < n_q, where v_j = v + j * v_stride. Each position's weight
  // multiplies its row (a weight of 0 still adds 0 * v: callers pass only positions in range).
  void (*pv_gemm)(const float* const* p, int n_q, const float* v, int64_t v_stride, int64_t n_k,
                  int64_t cols, float* const* acc);
};

// Keys per block of the transposed key layout of AttnKernels::qk_gemm.
inline constexpr int64_t kAttnKeyBlock = 16;
// Where element d of key j lives in that layout for head dim n: block j / 16, then d, then j % 16.
inline int64_t AttnKeyBlockIndex(int64_t j, int64_t d, int64_t n) {
  return (j / kAttnKeyBlock) * kAttnKeyBlock * n + d * kAttnKeyBlock + j % kAttnKeyBlock;
}

// AttnKernels::vsums_rows as a loop over the rows with a table's vsums (`VSums`): the scalar
// twins, and the AVX2 table.
template <typename T, auto VSums>
void AttnVSumsRowByRow(const float* const* p, int64_t p_stride, int n_q, int n_rows,
                       const T* const* v, int64_t base, const int64_t* lo, const int64_t* hi,
                       int n_acc, int64_t cols, float* const* out, int64_t out_stride) {
  for (int r = 0; r < n_rows; ++r) {
    VSums(p[r], p_stride, n_q, v + (lo[r] - base), lo[r], hi[r], n_acc, cols, out[r], out_stride);
  }
}
// `x` as an F32 value of its own: GCC does not fuse it into a following add or subtract (files
// built with -mfma contract a * b + c even across statements), for the places where ggml's
// compiled code rounds a product before adding it.
inline float RoundedF32(float x) {
#if defined(__x86_64__) || defined(__i386__)
  __asm__("" : "+x"(x));
#endif
  return x;
}
// ggml_vec_dot_f32's leftovers, elements [np, n) past its last full step of 4 * lanes, as GCC
// compiles its `sumf += x[i]*y[i]`: an in-order vectorized reduction over whole vectors of
// lanes / 2 (products rounded, VMULPS, then added one by one, VADDSS) up to the returned index,
// then one FMA per element. Measured on ggml_vec_dot_f32 of both builds for n = 1..257
// (tests/python/test_matmul_sweep.py runs head dims through the attention it feeds).
inline int64_t GgmlDotTailFusedFrom(int64_t np, int64_t n, int lanes) {
  const int64_t v = lanes / 2;
  return np + (n - np) / v * v;
}

// Portable versions of both widths (the reference the SIMD ones are tested against).
const AttnKernels& ScalarAttnKernels(int lanes);
// The AVX2 versions (attention_avx2.cc; the scalar 8-lane ones in a build without AVX2). Only call
// their entries where AVX2 + FMA run.
const AttnKernels& Avx2AttnKernels();
// The instruction sets the CPU backend may use, in increasing order. The environment variable
// PDSERVE_CPU_ISA caps them for the whole process, so that benchmarks and tests can run on an
// AVX-512 machine the kernels (and llama.cpp's orders) of CPUs without it:
//   unset, "" or "avx512": no cap, every kernel the CPU supports;
//   "avx2":   no AVX-512 kernel anywhere (CpuHasAvx512 answers false): AVX2 + FMA + F16C;
//   "scalar": SelectKernels() gives the portable table too (like --cpu-kernels scalar).
// PDSERVE_CPU_NO_VNNI (non-empty, not "0") is a narrower switch on top: it keeps AVX-512
// attention and INT8 KV rows but drops the VNNI matmul tiles (which give the same bits).
enum class CpuIsa : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };
// Parses PDSERVE_CPU_ISA (read each call). INVALID_ARGUMENT naming the accepted values for any
// other value: binaries call it at startup to fail cleanly.
absl::StatusOr<CpuIsa> CpuIsaCapFromEnv();
// The cap, read once per process (the dispatchers cache their choices in statics). An invalid
// value aborts with CpuIsaCapFromEnv's message: nothing silently falls back to a default.
CpuIsa CpuIsaCap();
// True on a CPU whose CPUID vendor is GenuineIntel (read once): the own orders' laid-out
// streams are prefetched differently there (NearPrefetch below).
bool CpuIsIntel();
// The output head's stream: a q8_0x16 call over at least kHeadStreamMinBytes in groups of at
// most kHeadStreamMaxGroupBytes (rows of <= 960 weights; Gemma 3 270M's head is one 170 MiB stream
// of 640-weight rows). On AMD cores one row over it (VNNI: up to three) leaves it to the hardware
// prefetchers, which follow so long a stream of short rows best alone.
inline constexpr size_t kHeadStreamMinBytes = size_t{8} << 20;
inline constexpr size_t kHeadStreamMaxGroupBytes = size_t{16} << 10;
inline bool HeadStream(int64_t groups, size_t group_bytes) {
  return static_cast<size_t>(groups) * group_bytes >= kHeadStreamMinBytes &&
         group_bytes <= kHeadStreamMaxGroupBytes;
}
// On Intel cores, whose hardware prefetchers run less far ahead of a stream, one or two
// activation rows over a laid-out matrix (the head stream and the layers' q8_0x16, q5_0x16 and
// q4_Kx16 matrices; q6_Kx16 keeps its L2 prefetch, where near loses) prefetch into L1 only
// kNearPrefetchBytes ahead (NearPrefetch): the tiles eat a block from L2 faster than memory
// delivers it, so a short prefetch keeps as many lines in flight as the fill buffers hold, where
// one further ahead only queues behind them. Two such rows over the head take the VNNI kernel
// rather than the AMX tiles. Figures: own_order_avx2.cc, own_order_vnni.cc (FetchFor),
// own_order_amx.cc.
inline constexpr size_t kNearPrefetchBytes = 2048;
inline constexpr int64_t kNearPrefetchMaxRows = 2;
inline bool NearPrefetch(int64_t n) { return n <= kNearPrefetchMaxRows && CpuIsIntel(); }
// True when the OS saves the opmask and ZMM state, CPUID leaf 7 (subleaf 0) reports every bit
// of `leaf7_ebx` in EBX and of `leaf7_ecx` in ECX (cpuid.h's bit_AVX512F, bit_AVX512BW, ...),
// and CpuIsaCap() allows AVX-512: the check every AVX-512 file makes before handing out its
// kernels. False off x86.
bool CpuHasAvx512(uint32_t leaf7_ebx, uint32_t leaf7_ecx = 0);
// On every function of an AVX-512 file that runs before, or to make, that check (the exported
// entry points and their checks): those files are compiled with -mavx512*, so without it the
// compiler may use AVX-512 anywhere in them, and did: a struct returned by value was zeroed with
// an EVEX store, and every process died with SIGILL on a CPU without AVX-512 (AMD EPYC, AVX2
// only). Under this attribute AVX-512 code cannot be generated or inlined there. Lambdas do not
// inherit it: write such code as named functions.
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define PD_NO_AVX512 __attribute__((target("no-avx512f")))
#else
#define PD_NO_AVX512
#endif

// The AVX-512 versions (attention_avx512.cc): nullptr unless the CPU has AVX512F and AVX512DQ.
const AttnKernels* Avx512AttnKernels();
// Kernels::swiglu on 16 lanes with ggml's AVX-512 expf (same conditions; the AVX2 table's entry
// calls it when present).
using SwiGluFn = void (*)(const float* g, const float* u, float* y, int64_t n);
SwiGluFn Avx512SwiGlu();

// The fused F16 <-> INT8 KV rows (kv_i8_avx512.cc; Kernels::quantize_kv_i8_f16 and
// dequantize_kv_i8_f16): nullptr unless the CPU has AVX512F + AVX512BW and head_dim is 64, 128 or
// 256.
using KvRowF16ToI8Fn = float (*)(const uint16_t* x, int8_t* q);
KvRowF16ToI8Fn Avx512KvRowF16ToI8(int head_dim);
using KvRowI8ToF16Fn = void (*)(const int8_t* q, float scale, uint16_t* y);
KvRowI8ToF16Fn Avx512KvRowI8ToF16(int head_dim);

struct Kernels {
  const char* name;  // "scalar", "avx2"

  // MatMul tiles, by GemmType. F32: F32 dot in F32. F16/BF16: products of halves accumulated in
  // F32. Q8_0 and Q4_0 (x Q8_0): int32 dot per 32-block times d_w * d_x, accumulated in F32.
  // k-quants (x Q8_K): per 256-block an exact int32 sum of sub-block scale times the sub-block's
  // int32 dot (and, for Q2_K/Q4_K/Q5_K, an int32 sum of sub-block min times the activations'
  // bsums), then times d_w * d_x (and dmin_w * d_x), accumulated in F32 (see kernels_scalar.cc).
  // The tables differ only in the order of the F32 additions, never in the integer parts.
  // W8A8 (x W8A8 activation rows): the whole row's exact integer dot times f32(d_w * d_x), so
  // every table gives the same bits (k <= kW8A8MaxCols). W4A16 (x F32): dequantized weights
  // (float(u - 8) * d) times f32 activations, summed in F32; tables differ in summation order
  // (measured bound in tests/engine/backend/pd_format_kernels_test.cc).
  GemmTileFn gemm[kNumGemmTypes];
  // k-quants in the order of llama.cpp's tiled kernel (ggml-cpu tiled/), which it uses for 8 or
  // more activation rows of matrices it does not repack: per super-block the exact integer sums
  // s1 (scales times dots) and s2 (mins times bsums), r = float(s1) * d_w (- dmin_w * float(s2),
  // one FMA), acc = fma(r, d_x, acc). nullptr for types without one (Q2_K and Q3_K: not yet; they
  // keep gemm's order).
  GemmTileFn gemm_wide[kNumGemmTypes];
  // Q4_K in the orders of llama.cpp's repacked x86 kernels, which it uses for Q4_K matrices whose
  // row count is a multiple of 8: the GEMM for activation rows in full groups of four, the GEMV
  // for the rest (gemm[kQ4_K] is the plain vec_dot order, for the other matrices). Per super-block
  // the integer parts are gemm[kQ4_K]'s; the F32 steps are spelled out in kernels_scalar.cc
  // (DotQ4_KRepack), and every table gives the same bits.
  GemmTileFn q4_k_repack_gemm;
  GemmTileFn q4_k_repack_gemv;
  // Q2_K in the orders of llama.cpp's repacked q2_K 8x8 kernels, which it uses on CPUs with
  // AVX-512 for Q2_K matrices whose row count is a multiple of 8 (GEMM for activation rows in full
  // groups of four, GEMV for the rest; DotQ2_KRepack in kernels_scalar.cc spells out the order).
  GemmTileFn q2_k_repack_gemm;
  GemmTileFn q2_k_repack_gemv;
  // q4_k_repack_gemv and gemm[kQ6_K] for nc = kGemmTileX + 1 exactly (1 <= nr <= kGemmTileW): a
  // step of five rows (a speculative step with K = 4, five decode sequences) in one pass where
  // tiles of 4 and 1 columns unpack every weight block twice, and the fifth row's pass cost 60 %
  // of a whole one-row pass. The bits of the 4 + 1 tiles (each column's sums are its own).
  // nullptr: none in this table (the caller splits 4 + 1).
  GemmTileFn q4_k_repack_gemv5;
  GemmTileFn q6_k5;

  // Row conversions (used to convert activations once per MatMul, for GetRows and the KV cache).
  // Narrowing conversions round to nearest even; Q8_0 quantization is QuantizeRowQ8_0Act's
  // (ggml-cpu x86's activation quantizer; bit-exact in every table).
  void (*f32_to_f16)(const float* x, uint16_t* y, int64_t n);
  void (*f16_to_f32)(const uint16_t* x, float* y, int64_t n);
  void (*f32_to_bf16)(const float* x, uint16_t* y, int64_t n);
  void (*bf16_to_f32)(const uint16_t* x, float* y, int64_t n);
  void (*quantize_q8_0)(const float* x, BlockQ8_0* y, int64_t n);
  void (*dequantize_q8_0)(const BlockQ8_0* x, float* y, int64_t n);
  // Activations for k-quant weights: bit-exact with QuantizeRow<BlockQ8_K> (k_quants.h) in every
  // table, bsums included.
  void (*quantize_q8_k)(const float* x, BlockQ8_K* y, int64_t n);
  // Activations for W8A8 weights, one row per token: bit-exact with QuantizeRowW8A8 (w8a8.h).
  void (*quantize_w8a8)(const float* x, void* y, int64_t n);

  // INT8 KV cache (engine/backend/kv_layout.h). quantize_kv_i8 quantizes one token's head of n
  // finite values, already rotated (QuantizeKvRowI8 below does both): returns
  // scale = max|x| / 127 and writes q = round_half_even(x * (1 / scale)), clamped to [-127, 127]
  // (all zeros when scale is 0); bit-exact in every table. dot_i8_f32 is the unscaled dot of
  // int8 key values with an F32 query (the caller multiplies by the key's scale); axpy_i8 is
  // y += a * q (the caller folds the value's scale into a); widen_i8 is y = q, exactly (the
  // attention's chain order widens a block of rows for all heads at once, cpu_attention.cc).
  float (*quantize_kv_i8)(const float* x, int8_t* q, int64_t n);
  // The rotation of INT8 KV rows (kv_rotation.h): x <- scale * (H x) per block of
  // KvRotationBlock(head_dim) values, bit-exact with RotateKvRow in every table (the same
  // butterflies; the AVX2 one keeps 64-value groups in registers, kv_i8_avx2.cc).
  void (*rotate_kv_row)(float* x, int head_dim, float scale);
  // One F16 row (head_dim values) into the INT8 scheme: F16 -> F32, rotate into the stored basis,
  // quantize; bit-exact with f16_to_f32 + QuantizeKvRowI8 below (`tmp`: head_dim floats of
  // scratch). The AVX2 table does it in one pass over 512-bit registers where the CPU has
  // AVX512F + BW and head_dim is 64, 128 or 256 (kv_i8_avx512.cc).
  float (*quantize_kv_i8_f16)(const uint16_t* x, float* tmp, int8_t* q, int head_dim);
  // And back: y = F16 of H (q * scale), the row out of the stored basis; bit-exact with
  // q * scale in F32, rotate_kv_row (scale 1) and f32_to_f16 (same AVX-512 conditions).
  void (*dequantize_kv_i8_f16)(const int8_t* q, float scale, float* tmp, uint16_t* y,
                               int head_dim);
  float (*dot_i8_f32)(const int8_t* a, const float* b, int64_t n);
  void (*axpy_i8)(float a, const int8_t* x, float* y, int64_t n);
  void (*widen_i8)(const int8_t* x, float* y, int64_t n);

  // Elementwise row ops (y may alias an input).
  double (*sum_squares)(const float* x, int64_t n);  // products in F32, summed in F64 (ggml)
  void (*scale)(const float* x, float s, float* y, int64_t n);                      // y = s * x
  void (*scale_mul)(const float* x, float s, const float* w, float* y, int64_t n);  // (s*x)*w
  void (*add)(const float* a, const float* b, float* y, int64_t n);
  // y = g / (1 + exp(0 - g)) * u (ggml_v_silu times u) with ggml's vector expf of attn()'s width
  // on every element; ggml's scalar tail of a row (the last cols % lanes, libm expf) is the
  // caller's (CpuBackend::SwiGlu).
  void (*swiglu)(const float* g, const float* u, float* y, int64_t n);
  float (*max)(const float* x, int64_t n);                              // -inf when n == 0
  // y = exp(x - m); returns the sum of y in F64.
  double (*exp_sub_sum)(const float* x, float m, float* y, int64_t n);
  // RoPE rotation of one head by angles with cosines c[i] and sines s[i], i < half, in the
  // roundings of llama.cpp's build (ggml's rotate_pairs as GCC 12 compiles it):
  //   NeoX pairs (i, i + half):   a' = fma(a, c, -(b * s)),  b' = fma(a, s, b * c)
  //   normal pairs (2i, 2i + 1):  the first RopeNormalFusedPairs(half) pairs as NeoX's (GCC's
  //     vectorized loop: VFMADDSUB), the rest unfused, a' = a * c - b * s, b' = a * s + b * c
  //     (its tail, which it SLP-vectorizes into VADDSUBPS of rounded products).
  void (*rope_neox)(float* v, const float* c, const float* s, int64_t half);
  void (*rope_normal)(float* v, const float* c, const float* s, int64_t half);
  // Attention's kernels in ggml's order (AttnKernels above): the scalar table gives the portable
  // 8-lane version, the AVX2 table the AVX-512 version where the CPU has it, else its AVX2 one.
  const AttnKernels& (*attn)();
};

// How many leading pairs of a normal-mode RoPE row ggml fuses (Kernels::rope_normal): GCC
// vectorizes rotate_pairs' loop (n_offset 1) with a main loop of `main` pairs per step, taken
// when half >= main, then one step of `epi` pairs when that many remain; the rest is its tail.
// AVX-512 builds (CPUs with AVX512F + AVX512DQ, under PDSERVE_CPU_ISA): main 8 (ZMM), epi 4
// (YMM); AVX2 builds: main 4 (YMM), epi 2 (XMM). Measured against ggml_rope_ext for head dims
// 2..256 (tests/python/test_matmul_sweep.py).
struct RopeNormalWidths {
  int main;
  int epi;
};
RopeNormalWidths RopeNormalOrder();
inline int64_t RopeNormalFusedPairs(int64_t half, RopeNormalWidths w) {
  int64_t fused = half >= w.main ? half / w.main * w.main : 0;
  if (half - fused >= w.epi) fused += w.epi;
  return fused;
}

const Kernels& ScalarKernels();
// The AVX2+FMA+F16C table, or nullptr when this build has none (non-x86). Only call its entries
// when the CPU supports those instructions (see SelectKernels).
const Kernels* Avx2Kernels();
// Avx2Kernels() when compiled in, not `force_scalar`, CpuIsaCap() is not kScalar and the CPU
// reports avx2, fma and f16c; otherwise ScalarKernels().
const Kernels& SelectKernels(bool force_scalar);
// The kernel set a backend on table `k` runs, for logs and benchmark records: "scalar", "avx2",
// "avx512" (AVX-512 attention, INT8 KV rows and llama.cpp's AVX-512 orders, no VNNI tiles) or
// "avx512-vnni" (also the VNNI / 512-bit matmul tiles) or "avx512-vnni-amx" (also the own
// orders' AMX kernels, AmxRuns()).
std::string_view KernelSetName(const Kernels& k);

// One token-head of an INT8 KV row in the cache's scheme (kv_layout.h): `x` (head_dim values,
// overwritten) is rotated into the stored basis in place and quantized into `q`; returns the
// scale. StoreKv and the KV-transfer codec both encode through this.
inline float QuantizeKvRowI8(const Kernels& k, float* x, int8_t* q, int head_dim) {
  k.rotate_kv_row(x, head_dim, 1.f / static_cast<float>(KvRotationBlock(head_dim)));
  return k.quantize_kv_i8(x, q, head_dim);
}

}  // namespace pd::engine::cpu
