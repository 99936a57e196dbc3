// pdserve's own Q8_0 order (kernels.h, Q8_0OwnOrderVnni) on AVX512-VNNI: 16 weight rows in the
// lanes of a ZMM register, each activation row's block against all of them in 8 VPDPBUSD.
//
// Per group of 16 weight rows and block: the 16 rows' 32 codes are loaded in place as unsigned
// bytes (RowCodes: Q8_0's XOR 0x80, w + 128; Q5_0's nibbles plus 16 by a masked add from qh), two
// rows per ZMM, regrouped by 128-bit lane (4 VSHUFI32X4 x 2) and transposed four by four within
// the lanes (16 VPUNPCK), which leaves W[j] holding code word j (codes 4j..4j+3) of all 16 rows:
// lane 4L + q is row 4q + L. The activation row's packed offset, -128 * sum(x) (Q5_0: / 8),
// starts the sums, so each lane ends at the block's exact integer dot product. The 16 scales come
// in one gather (in the same lane order) and VCVTPH2PS. Then per activation row and block: 8
// VPDPBUSD with the row's code words broadcast from memory, CVT, d_w * d_x, FMA: the portable
// kernel's operations on each lane (own_order.cc). The transposition is paid once per block and
// batch of up to 16 activation rows; a permute per row and group puts the lanes back in row order
// before the masked store. One or two activation rows cannot pay for the transposition and take
// SmallTile instead (below), with the same bits.
//
// A head laid out as q8_0x16 at load (engine/quant/q8_0x16.h; Model::LoadOptions) holds the
// words already where LoadCodes leaves them (in row order, w + 128), so TileX16 loads them
// straight: one row then costs the stream of its bytes, not the transposition. Q5_0 matrices
// laid out as q5_0x16 (q5_0x16.h: the layers' own order) hold nibble words and fifth-bit masks
// in the same row order, which TileX16 turns into the 8 code words with AND, a shift and a masked
// add per word; the sums start at -16 * sum(x) (the packed offset / 8).
//
// This file alone is compiled with -mavx512f -mavx512bw -mavx512vl -mavx512vnni (plus
// AVX2/FMA/F16C); its kernels run only when CPUID reports those instructions.
#include "engine/backend/cpu/kernels.h"
#include "engine/backend/cpu/own_order_x16_avx512.h"
#include "engine/quant/q4_kx16.h"
#include "engine/quant/q5_0x16.h"
#include "engine/quant/q6_kx16.h"
#include "engine/quant/q8_0x16.h"

#if defined(__x86_64__) && defined(__AVX512VNNI__) && defined(__AVX512VL__) && \
    defined(__AVX512BW__) && defined(__F16C__)

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

namespace pd::engine::cpu {
namespace {

using own_x16::LoadX16;
using own_x16::X16;
using own_x16::X16BlockBytes;

constexpr int kLanes = 16;       // weight rows per register
constexpr int kMaxActRows = 16;  // activation rows per pass (accumulators in registers)
constexpr int kBlock = 32;
constexpr size_t kBlockBytes = 34;
// How many groups ahead the software prefetch runs (gemv_bench head_own/q8_0/16/1 on Zen 4: 1, 2
// and 4 groups within the noise; none: 2.2x slower).
constexpr int64_t kPrefetchGroups = 2;
// Up to this many activation rows take the small-batch kernel (SmallTile). Zen 4, one thread, ms
// per Gemma 3 head from DRAM (4 KiB pages), small kernel against transposing: 1 row 12.6 against
// 17.1, 2 rows 13.4 against 17.3, 4 rows 26.6 against 17.8.
constexpr int kSmallMaxRows = 2;
// How many weight rows ahead the small kernel's prefetch runs (gemv_bench head_own/q8_0/1/1 on
// Zen 4: 8 rows 9.8 ms, 16 rows 11.6; at 4 KiB pages 32 rows 17.4).
constexpr int64_t kSmallPrefetchRows = 8;

// Up to this many activation rows the q8_0x16 kernel splits a block's sums into two chains
// (gemv_bench head_x16/q8_0/1/1 on Zen 4: 7.5 -> 7.1 ms, within the noise of 2 rows).
constexpr int kX16TwoChainsMaxRows = 2;
// Four activation rows over a long stream (kHeadStreamMinBytes: the output head)
// run the five-row tile, its fifth row a copy of the fourth that is computed and not stored:
// with the same L2 prefetch, the five-row schedule keeps the stream busier than the four-row one
// (head_x16/q8_0/4/1 on Zen 4, three alternating runs: 7.15-7.65 -> 5.85-6.36 ms; the same
// padding for three rows: 7.0 -> 7.4-7.6, not taken). Bits unchanged: each row's sums are its own.
constexpr int kX16PaddedRows = 4;
// How far ahead of its stream the q8_0x16 kernel's software prefetch runs (gemv_bench
// head_x16/q8_0/1/1 and /4/1 on Zen 4 into L1, ms: 8 KiB 7.9 / 10.6, 12 KiB 6.9 / 7.6, 16 KiB
// 6.8 / 7.6, 20 KiB 7.3 / 8.2; into L2, 4 rows: 8, 16 and 64 KiB within 0.5 ms of each other).
// Which level, if any: FetchFor (an earlier build measured 12.6 ms at one row without software
// prefetch; this one 5.7-6.3).
constexpr size_t kX16PrefetchBytes = 16384;

// Where the laid-out kernels' software prefetch puts the lines, by the call's activation rows
// (all on Zen 4, 1 thread; gemv_bench, two or three alternating runs each):
// - One activation row: into L1 (T0), except for q6_Kx16. Into L2 alone (T1) is slower there
//   (rows_x16/q4_K/1/1 89-96 against 99-104 us, q5_0 121-122 against 125-133).
// - More rows: into L2 alone, where the demand loads find them without the L1 fill buffers the
//   prefetches would hold (rows_x16, us, T0 / T1: q5_0 4 rows 193-196 / 128-131, 8 rows 258-261
//   / 230-244; q4_K 4 rows 133-134 / 120-125; q6_K 4 rows 193-201 / 141-146, and one row of
//   q6_K 175-186 / 161-166, which takes T1 too).
// - None, up to kHardwarePrefetchMaxRows rows over the head stream (kernels.h, HeadStream: at
//   least 8 MiB in groups of at most 16 KiB; short rows:
//   Gemma 3 270M's head, one 170 MiB stream of 640-weight rows): the hardware prefetchers follow
//   it to near the DRAM rate once trained, and software prefetches on top only take fill buffers
//   (head_x16/q8_0/n/1, ms, T0 / none: n = 1 7.0-7.4 / 5.7-6.3, 3 7.0 / 6.3-6.9; from 5 rows the
//   loads come too slowly for the hardware to run far enough ahead, T1 / none: 5 6.5-6.9
//   / 7.6-8.5). Four rows there sit between the two: none 6.9-7.7, T1 7.2-7.9, T1 through the
//   five-row tile (kX16PaddedRows) 5.9-6.5.
// Matrices of a few MiB start a new stream on every call, too short for the hardware to train on
// (rows_x16/q5_0/4/1 without any software prefetch: 289-305 us). Rows of 2048 weights lose
// without it too, however long the stream (pdctl bench, one sequence, 1 thread, tok/s, L1 /
// none: synthetic Llama of 4 layers, embd 2048, ff 8192, vocab 32000, all Q8_0: 79-82 / 66-72;
// one layer and a 131072 x 2048 head: 83-88 / 65-66; the same with a 262144 x 640 head: 136-149
// / 156-180). The padded four-row tile serves rows of every length (four sequences, tok/s, L2 /
// L2 padded: 322-335 / 358-404 on the 2048-wide head, 284-310 / 354-376 on the 4-layer model).
constexpr int64_t kHardwarePrefetchMaxRows = 3;
enum class Fetch { kNone, kL1, kL2, kL1Near };
// On Intel cores one or two rows over every laid-out stream but q6_Kx16's (one_row_to_l2) go into
// L1, kNearPrefetchBytes ahead (kL1Near; kernels.h, NearPrefetch says why). head_x16/q8_0/n/1 on
// the AMX Xeon (PDSERVE_CPU_NO_AMX=1), two alternating runs, ms: n = 1 none 13.0-13.5, L1 16 KiB
// ahead 12.1-12.6, L2 16 KiB 11.5-11.8, L1 2 KiB 11.1-11.4 (llama.cpp's order on the plain rows
// 11.1); n = 2 none 14.6-15.0, L1 2 KiB 11.3-11.6, 4 KiB 11.6-12.2 (two threads 7.3-8.0 ->
// 5.8-5.9). The layers' (rows_x16/<type>/<n>/<t>, rows/s, the rule before -> L1 2 KiB, the
// default kernel set): q5_0 1/1 4.25k -> 5.28k, 1/2 7.42k -> 9.47k, 2/1 8.80k -> 8.78k, 2/2
// 14.6k -> 17.6k; q4_K 4.23k -> 6.32k, 7.19k -> 10.2k, 10.4k -> 11.9k, 19.1k -> 20.5k (1 KiB
// level with 2); q6_K loses (4.05k -> 3.87k at 1/1, 7.47k -> 7.28k at 2/1;
// bench/results/near_prefetch_layers_2026-12-07_intel.md).
inline Fetch FetchFor(int64_t n, bool hardware_stream, bool one_row_to_l2) {
  if (!one_row_to_l2 && NearPrefetch(n)) return Fetch::kL1Near;
  if (n <= kHardwarePrefetchMaxRows && hardware_stream) return Fetch::kNone;
  return n == 1 && !one_row_to_l2 ? Fetch::kL1 : Fetch::kL2;
}
// How far ahead of its stream a driver's prefetch runs at `fetch`: `far`, or the near distance.
inline size_t AheadBytes(Fetch fetch, size_t far) {
  return fetch == Fetch::kL1Near ? kNearPrefetchBytes : far;
}
// One line into L1 and L2 (T0) or L2 alone (T1).
template <bool kL2>
__attribute__((always_inline)) inline void PrefetchLine(const char* p) {
  _mm_prefetch(p, kL2 ? _MM_HINT_T1 : _MM_HINT_T0);
}

// Row of lane e (lane 4L + q holds row 4q + L) and its inverse (the same map).
inline int RowOfLane(int e) { return 4 * (e % 4) + e / 4; }

struct Group {
  const char* rows[kLanes];  // row pointers; rows past the matrix repeat the last one
  __m512i scale_index;       // byte offsets of each lane's row from rows[0]
};

// The plain-row formats the transposing kernels read: Q8_0 rows and Q5_0 rows as in the file.
enum class Plain { kQ8_0, kQ5_0 };

template <Plain kP>
constexpr size_t PlainBlockBytes() {
  return kP == Plain::kQ8_0 ? kBlockBytes : 22;
}
// The offset's shift (RowBlock): Q8_0's w + 128 against -128 * sum(x), Q5_0's codes against / 8.
template <Plain kP>
constexpr int PlainShift() {
  return kP == Plain::kQ8_0 ? 0 : 3;
}

// One row's block (at its f16 d) as 32 unsigned codes in order: Q8_0's w + 128 (XOR 0x80);
// Q5_0's nibbles (low: codes 0-15, high: 16-31) plus 16 where qh has the code's bit, the 32 bits
// of qh the byte mask of one masked add.
template <Plain kP>
__attribute__((always_inline)) inline __m256i RowCodes(const char* block) {
  if constexpr (kP == Plain::kQ8_0) {
    return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 2)),
                            _mm256_set1_epi8(static_cast<char>(0x80)));
  } else {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 6));
    const __m128i m4 = _mm_set1_epi8(0x0F);
    const __m256i codes =
        _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m4), _mm_and_si128(q, m4));
    uint32_t h;
    std::memcpy(&h, block + 2, 4);
    return _mm256_mask_add_epi8(codes, _cvtu32_mask32(h), codes, _mm256_set1_epi8(16));
  }
}

// Block `off` of the group's 16 rows as W[j] = code word j of every row (lane 4L + q: row 4q + L),
// unsigned.
template <Plain kP>
__attribute__((always_inline)) inline void LoadCodes(const Group& g, size_t off, __m512i (&w)[8]) {
  __m512i z[8];
  for (int p = 0; p < 8; ++p) {
    z[p] = _mm512_inserti64x4(_mm512_castsi256_si512(RowCodes<kP>(g.rows[2 * p] + off)),
                              RowCodes<kP>(g.rows[2 * p + 1] + off), 1);
  }
  // t[h][q]: 128-bit lane L holds words 4h..4h+3 of row 4q + L.
  __m512i t[2][4];
  for (int q = 0; q < 4; ++q) {
    t[0][q] = _mm512_shuffle_i32x4(z[2 * q], z[2 * q + 1], _MM_SHUFFLE(2, 0, 2, 0));
    t[1][q] = _mm512_shuffle_i32x4(z[2 * q], z[2 * q + 1], _MM_SHUFFLE(3, 1, 3, 1));
  }
  for (int h = 0; h < 2; ++h) {
    const __m512i a0 = _mm512_unpacklo_epi32(t[h][0], t[h][1]);
    const __m512i a1 = _mm512_unpackhi_epi32(t[h][0], t[h][1]);
    const __m512i a2 = _mm512_unpacklo_epi32(t[h][2], t[h][3]);
    const __m512i a3 = _mm512_unpackhi_epi32(t[h][2], t[h][3]);
    w[4 * h + 0] = _mm512_unpacklo_epi64(a0, a2);
    w[4 * h + 1] = _mm512_unpackhi_epi64(a0, a2);
    w[4 * h + 2] = _mm512_unpacklo_epi64(a1, a3);
    w[4 * h + 3] = _mm512_unpackhi_epi64(a1, a3);
  }
}

// Fetches a later group of weight rows (rows [first, first + count) of the matrix) into L1 a
// share per block while the current group computes: the 16 or 8 rows of a short matrix (Gemma
// 3's head: 680 bytes each) are as many streams, which the hardware prefetchers follow late.
// (By value: passed as a reference into the kernels, the one-row kernel ran 1.6x slower.)
struct Prefetcher {
  const char* base = nullptr;  // nullptr: past the matrix, nothing to fetch
  size_t step = 0;             // bytes per block, whole lines
};
Prefetcher PrefetchRows(const char* w, size_t ws, int64_t rows, int64_t first, int64_t count,
                        int64_t nb) {
  const int64_t n = std::min<int64_t>(count, rows - first);
  if (n <= 0) return {};
  return {w + first * ws, (static_cast<size_t>(n) * ws + nb - 1) / nb / 64 * 64 + 64};
}
__attribute__((always_inline)) inline void PrefetchBlock(const char* base, size_t step, int64_t b) {
  if (base == nullptr) return;
  for (size_t o = 0; o < step; o += 64) _mm_prefetch(base + b * step + o, _MM_HINT_T0);
}

// s += VPDPBUSD(w, the 4 bytes at x broadcast): the broadcast as the instruction's memory operand
// ({1to16}), one load micro-op, which GCC does not fold from _mm512_set1_epi32 (it emits a
// separate VPBROADCASTD per word: 16 activation rows x 8 words per block). gemv_bench
// head_x16/q8_0/4/1 on Zen 4: 8.7 -> 7.4 ms; 16 rows unchanged (27.8 ms).
__attribute__((always_inline)) inline void DpbusdBroadcast(__m512i& s, __m512i w, const int8_t* x) {
  asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(s) : "v"(w), "m"(*reinterpret_cast<const int32_t*>(x)));
}

// One activation row's block (packed as pack_x lays it out at xr; nb blocks a row) against the
// 16 weight rows in w's lanes (w + 128; dw their scales): acc = fma(d_w * d_x, isum, acc), isum
// the row's packed offset plus the 8 words' VPDPBUSD, the portable kernel's operations on each
// lane (own_order.cc). kTwoChains: the sums in two chains of four (the same integers) where few
// rows leave one chain's latency exposed.
// kStartShift: the offset's shift for the weights' code range (0: Q8_0's w + 128 against
// -128 * sum(x); 3: Q5_0's codes 0..31 against -16 * sum(x), exact).
template <bool kTwoChains, int kStartShift = 0>
__attribute__((always_inline)) inline __m512 RowBlock(__m512 acc, const __m512i (&w)[8], __m512 dw,
                                                      const char* xr, int64_t b, int64_t nb) {
  const auto* xq = reinterpret_cast<const int8_t*>(xr + b * kBlock);
  int32_t c;
  float d;
  std::memcpy(&c, xr + nb * (kBlock + 4) + b * 4, 4);  // after the codes and the d_x
  std::memcpy(&d, xr + nb * kBlock + b * 4, 4);
  __m512i s = _mm512_set1_epi32(c >> kStartShift);
  if constexpr (kTwoChains) {
    __m512i s1 = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int j = 0; j < 8; j += 2) {
      DpbusdBroadcast(s, w[j], xq + 4 * j);
      DpbusdBroadcast(s1, w[j + 1], xq + 4 * j + 4);
    }
    s = _mm512_add_epi32(s, s1);
  } else {
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) DpbusdBroadcast(s, w[j], xq + 4 * j);
  }
  return _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(d)), _mm512_cvtepi32_ps(s), acc);
}

// One group of weight rows (plain rows of kP) against activation rows [i0, i0 + NN):
// y[i * ys + lane row].
template <int NN, Plain kP>
void Tile(int64_t nb, const Group& g, const char* prefetch, size_t prefetch_step, const char* xp,
          size_t x_row_bytes, int64_t i0, float* y, int64_t ys, int nr) {
  __m512 acc[NN];
  for (int i = 0; i < NN; ++i) acc[i] = _mm512_setzero_ps();
  const char* xr[NN];
  for (int i = 0; i < NN; ++i) xr[i] = xp + (i0 + i) * x_row_bytes;
  for (int64_t b = 0; b < nb; ++b) {
    PrefetchBlock(prefetch, prefetch_step, b);
    const size_t off = static_cast<size_t>(b) * PlainBlockBytes<kP>();
    __m512i w[8];
    LoadCodes<kP>(g, off, w);
    const __m512i dw_bits = _mm512_i32gather_epi32(g.scale_index, g.rows[0] + off, 1);
    const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dw_bits));
#pragma GCC unroll 16
    for (int i = 0; i < NN; ++i) {
      acc[i] = RowBlock<false, PlainShift<kP>()>(acc[i], w, dw, xr[i], b, nb);
    }
  }
  // Lane of row r, RowOfLane(r) (the map is its own inverse).
  const __m512i to_rows = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __mmask16 keep = static_cast<__mmask16>((1u << nr) - 1);
  for (int i = 0; i < NN; ++i) {
    _mm512_mask_storeu_ps(y + i * ys, keep, _mm512_permutexvar_ps(to_rows, acc[i]));
  }
}

using TileFn = void (*)(int64_t, const Group&, const char*, size_t, const char*, size_t, int64_t,
                        float*, int64_t, int);

template <Plain kP, int... N>
constexpr auto MakeTiles(std::integer_sequence<int, N...>) {
  return std::array<TileFn, sizeof...(N)>{&Tile<N + 1, kP>...};
}

// A few activation rows (a decode step of a few sequences, a short speculative step): the
// transposition above costs more than the rows' products, so each weight row's block is dotted
// with each activation row's in one 256-bit VPDPBUSD (eight int32 partial sums) and the partial
// sums of 8 weight rows are added up by a HADD tree into one register, lane r = weight row r's
// exact block sum. From there the same CVT, d_w * d_x and FMA per lane: the same bits.
template <int NN, Plain kP>
void SmallTile(int64_t nb, const char* const* rows, const char* prefetch, size_t prefetch_step,
               const char* xp, size_t x_row_bytes, float* y, int64_t ys, int nr) {
  __m256 acc[NN];
  for (int i = 0; i < NN; ++i) acc[i] = _mm256_setzero_ps();
  const int64_t d_off = nb * kBlock, c_off = d_off + nb * 4;
  for (int64_t b = 0; b < nb; ++b) {
    PrefetchBlock(prefetch, prefetch_step, b);
    const size_t off = static_cast<size_t>(b) * PlainBlockBytes<kP>();
    __m256i wu[8];
    alignas(16) uint16_t dh[8];
    for (int r = 0; r < 8; ++r) {
      wu[r] = RowCodes<kP>(rows[r] + off);
      std::memcpy(&dh[r], rows[r] + off, 2);
    }
    const __m256 dw = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(dh)));
#pragma GCC unroll 2
    for (int i = 0; i < NN; ++i) {
      const char* xr = xp + i * x_row_bytes;
      const __m256i xq = _mm256_load_si256(reinterpret_cast<const __m256i*>(xr + b * kBlock));
      __m256i p[8];
      for (int r = 0; r < 8; ++r) p[r] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), wu[r], xq);
      // Per 128-bit half: [rows 0..3 of the low words | the same of the high words], then both.
      const __m256i q01 = _mm256_hadd_epi32(p[0], p[1]), q23 = _mm256_hadd_epi32(p[2], p[3]);
      const __m256i q45 = _mm256_hadd_epi32(p[4], p[5]), q67 = _mm256_hadd_epi32(p[6], p[7]);
      const __m256i lo = _mm256_hadd_epi32(q01, q23), hi = _mm256_hadd_epi32(q45, q67);
      __m256i isum = _mm256_add_epi32(_mm256_permute2x128_si256(lo, hi, 0x20),
                                      _mm256_permute2x128_si256(lo, hi, 0x31));
      int32_t c;
      float d;
      std::memcpy(&c, xr + c_off + b * 4, 4);
      std::memcpy(&d, xr + d_off + b * 4, 4);
      isum = _mm256_add_epi32(isum, _mm256_set1_epi32(c >> PlainShift<kP>()));
      const __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(d));
      acc[i] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(isum), acc[i]);
    }
  }
  const __mmask8 keep = static_cast<__mmask8>((1u << nr) - 1);
  for (int i = 0; i < NN; ++i) _mm256_mask_storeu_ps(y + i * ys, keep, acc[i]);
}

using SmallTileFn = void (*)(int64_t, const char* const*, const char*, size_t, const char*, size_t,
                             float*, int64_t, int);

template <Plain kP>
void GemmOwnVnniSmall(int64_t nb, const char* wa, size_t ws, int64_t rows, const char* xp,
                      size_t x_row_bytes, int64_t n, float* y, int64_t ys) {
  static constexpr SmallTileFn kTiles[kSmallMaxRows] = {&SmallTile<1, kP>, &SmallTile<2, kP>};
  for (int64_t r0 = 0; r0 < rows; r0 += 8) {
    const int nr = static_cast<int>(std::min<int64_t>(8, rows - r0));
    const char* row_ptrs[8];
    for (int r = 0; r < 8; ++r) row_ptrs[r] = wa + (r0 + std::min(r, nr - 1)) * ws;
    const Prefetcher ahead = PrefetchRows(wa, ws, rows, r0 + kSmallPrefetchRows, 8, nb);
    kTiles[n - 1](nb, row_ptrs, ahead.base, ahead.step, xp, x_row_bytes, y + r0, ys, nr);
  }
}

// The own order on plain rows of kP (`ws` bytes apart): Tile's transposition per group of 16
// rows and block, SmallTile for one or two activation rows.
template <Plain kP>
void GemmOwnVnni(int64_t k, const void* w, size_t ws, int64_t rows, const void* xp, int64_t n,
                 float* y, int64_t ys) {
  static constexpr auto kTiles = MakeTiles<kP>(std::make_integer_sequence<int, kMaxActRows>{});
  const int64_t nb = k / kBlock;
  const size_t x_row_bytes = Q8_0OwnXRowBytes(nb);
  const char* wa = static_cast<const char*>(w);
  if (n <= kSmallMaxRows) {
    GemmOwnVnniSmall<kP>(nb, wa, ws, rows, static_cast<const char*>(xp), x_row_bytes, n, y, ys);
    return;
  }
  for (int64_t r0 = 0; r0 < rows; r0 += kLanes) {
    const int nr = static_cast<int>(std::min<int64_t>(kLanes, rows - r0));
    Group g;
    alignas(64) int32_t index[kLanes];
    for (int e = 0; e < kLanes; ++e) {
      const int row = std::min(e, nr - 1);
      g.rows[e] = wa + (r0 + row) * ws;
      index[e] = static_cast<int32_t>(std::min(RowOfLane(e), nr - 1) * ws);
    }
    g.scale_index = _mm512_load_si512(index);
    const Prefetcher ahead = PrefetchRows(wa, ws, rows, r0 + kPrefetchGroups * kLanes, kLanes, nb);
    for (int64_t i0 = 0; i0 < n; i0 += kMaxActRows) {
      const int nn = static_cast<int>(std::min<int64_t>(kMaxActRows, n - i0));
      kTiles[nn - 1](nb, g, i0 == 0 ? ahead.base : nullptr, ahead.step,
                     static_cast<const char*>(xp), x_row_bytes, i0, y + i0 * ys + r0, ys, nr);
    }
  }
}

// One group of 16 weight rows (laid out as kW) against activation rows [i0, i0 + NN). The code
// words load (q8_0x16) or unpack (q5_0x16) straight into W[j] (lane e = the group's row e, already
// unsigned) and the 16 scales in one VCVTPH2PS; per activation row and block the operations of
// Tile above, so the bits are the portable kernel's, and the lanes are already in row order.
// kStored: the rows stored (the rows from kStored on repeat row kStored - 1: kX16PaddedRows).
template <int NN, X16 kW, bool kL2, int kStored = NN>
void TileX16(int64_t nb, const char* codes, const char* prefetch, const char* xp,
             size_t x_row_bytes, int64_t i0, float* y, int64_t ys) {
  constexpr size_t kBytes = X16BlockBytes<kW>();
  constexpr int kLines = static_cast<int>((kBytes + 63) / 64);
  constexpr int kShift = kW == X16::kQ8_0 ? 0 : 3;
  __m512 acc[NN];
  for (int i = 0; i < NN; ++i) acc[i] = _mm512_setzero_ps();
  const char* xr[NN];
  for (int i = 0; i < NN; ++i) xr[i] = xp + (i0 + std::min(i, kStored - 1)) * x_row_bytes;
  for (int64_t b = 0; b < nb; ++b) {
    if (prefetch != nullptr) {
      // kBytes per block of the stream: whole lines from its share's start cover it.
      const char* p = prefetch + b * kBytes;
#pragma GCC unroll 10
      for (int o = 0; o < kLines; ++o) PrefetchLine<kL2>(p + 64 * o);
    }
    __m512i w[8];
    const __m512 dw = LoadX16<kW>(codes, nb, b, w);
#pragma GCC unroll 16
    for (int i = 0; i < NN; ++i) {
      acc[i] = RowBlock<(NN <= kX16TwoChainsMaxRows), kShift>(acc[i], w, dw, xr[i], b, nb);
    }
  }
  for (int i = 0; i < kStored; ++i) _mm512_storeu_ps(y + i * ys, acc[i]);
}

using TileX16Fn = void (*)(int64_t, const char*, const char*, const char*, size_t, int64_t, float*,
                           int64_t);

// [l2][nn - 1]: the tiles of nn activation rows, prefetching into L1 (l2 = 0) or L2 alone.
template <X16 kW, int... N>
constexpr auto MakeTilesX16(std::integer_sequence<int, N...>) {
  return std::array<std::array<TileX16Fn, sizeof...(N)>, 2>{
      {{&TileX16<N + 1, kW, false>...}, {&TileX16<N + 1, kW, true>...}}};
}

// y[i * ys + r] over the groups of 16 rows (kW's layout) in passes of up to kMaxActRows activation
// rows; q8_0x16's last rows % 16 are plain Q8_0 rows (q5_0x16 has none).
template <X16 kW>
void GemmX16Vnni(int64_t k, const void* w, size_t /*w_stride*/, int64_t rows, const void* xp,
                 int64_t n, float* y, int64_t ys) {
  static constexpr auto kTiles = MakeTilesX16<kW>(std::make_integer_sequence<int, kMaxActRows>{});
  const int64_t nb = k / kBlock;
  const size_t x_row_bytes = Q8_0OwnXRowBytes(nb);
  const char* wa = static_cast<const char*>(w);
  const size_t group_bytes = static_cast<size_t>(nb) * X16BlockBytes<kW>();
  const int64_t groups = rows / kLanes;
  const bool long_stream = static_cast<size_t>(groups) * group_bytes >= kHeadStreamMinBytes;
  const Fetch fetch =
      FetchFor(n, kW == X16::kQ8_0 && HeadStream(groups, group_bytes), /*one_row_to_l2=*/false);
  const auto& tiles = kTiles[fetch == Fetch::kL2];
  // Four rows over a long q8_0x16 stream: the five-row tile, padded (kX16PaddedRows).
  static constexpr TileX16Fn kPadded[2] = {&TileX16<kX16PaddedRows + 1, kW, false, kX16PaddedRows>,
                                           &TileX16<kX16PaddedRows + 1, kW, true, kX16PaddedRows>};
  const TileX16Fn padded = kW == X16::kQ8_0 && n == kX16PaddedRows && long_stream
                               ? kPadded[fetch == Fetch::kL2]
                               : nullptr;
  for (int64_t g = 0; g < groups; ++g) {
    const char* codes = wa + g * group_bytes;
    // The group's bytes are one stream: fetch kX16PrefetchBytes ahead of it, a block's share per
    // block, up to the matrix's end (or leave it to the hardware: FetchFor).
    const size_t next = static_cast<size_t>(g) * group_bytes + AheadBytes(fetch, kX16PrefetchBytes);
    const char* ahead = next < groups * group_bytes && fetch != Fetch::kNone ? wa + next : nullptr;
    for (int64_t i0 = 0; i0 < n; i0 += kMaxActRows) {
      const int nn = static_cast<int>(std::min<int64_t>(kMaxActRows, n - i0));
      (padded != nullptr ? padded : tiles[nn - 1])(nb, codes, i0 == 0 ? ahead : nullptr,
                                                   static_cast<const char*>(xp), x_row_bytes, i0,
                                                   y + i0 * ys + g * kLanes, ys);
    }
  }
  if constexpr (kW == X16::kQ8_0) {
    // The last rows % 16 rows are plain Q8_0 rows.
    if (const int64_t tail = rows - groups * kLanes; tail > 0) {
      GemmOwnVnni<Plain::kQ8_0>(k, wa + groups * group_bytes, static_cast<size_t>(nb) * kBlockBytes,
                                tail, xp, n, y + groups * kLanes, ys);
    }
  }
}

// ---- Q4_K in the own order (q4_Kx16) ------------------------------------------------------
//
// Per group of 16 weight rows and super-block, sub-block by sub-block: its 8 nibble words load
// straight into the lanes (AND 0x0F, or a shift first for the odd sub-blocks), the 16 rows' 6-bit
// scales widen to 32-bit lanes in one VPMOVZXBD; per activation row 8 VPDPBUSD (the row's code
// words broadcast from memory) give each lane the sub-block's exact dot, one VPMULLD and VPADDD
// add it into sumi at its scale. Per super-block and row, the mins: 4 VPDPWSSD of the rows'
// (m_2p, m_2p+1) 16-bit pairs against the activation's (xsum_2p, xsum_2p+1); then CVT, d * d_x,
// FMA and dmin * d_x, FNMADD: the portable kernel's operations on each lane (own_order.cc).

// Activation rows per pass: NN sums and NN accumulators live across a super-block beside the 8
// code words, the scales and the nibble mask (2 NN + 12 of 32 registers).
constexpr int kQ4KMaxActRows = 8;
// How far ahead of its stream the kernel's software prefetch runs, a super-block's 37 lines
// spread over its 8 sub-blocks (gemv_bench rows_x16/q4_K/1/1 and /4/1, 2048 x 2048 on Zen 4, us,
// three alternating runs: 8 KiB 97-112 / 135-146, 12 KiB 100-109 / 152-158, 16 KiB 96-111 /
// 165-193; all 37 lines at the super-block's start: 183 / 355).
constexpr size_t kQ4KPrefetchBytes = 8192;

template <int NN, bool kL2>
void TileQ4Kx16(int64_t nbk, const char* group, const char* prefetch, const char* xp,
                size_t x_row_bytes, int64_t i0, float* y, int64_t ys) {
  constexpr int kLines = static_cast<int>(kQ4_Kx16SuperBytes / 64);
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  __m512 acc[NN];
  for (int i = 0; i < NN; ++i) acc[i] = _mm512_setzero_ps();
  const char* xr[NN];
  for (int i = 0; i < NN; ++i) xr[i] = xp + (i0 + i) * x_row_bytes;
  const int64_t d_off = nbk * kQK, w_off = d_off + nbk * 4;
  for (int64_t s = 0; s < nbk; ++s) {
    const char* pf = prefetch != nullptr ? prefetch + s * kQ4_Kx16SuperBytes : nullptr;
    const char* sb = group + s * kQ4_Kx16SuperBytes;
    __m512i sumi[NN];
    for (int i = 0; i < NN; ++i) sumi[i] = _mm512_setzero_si512();
#pragma GCC unroll 1
    for (int j = 0; j < 8; ++j) {
      if (pf != nullptr) {
        // The super-block's 37 lines spread over its 8 sub-blocks, 5 a step.
        for (int o = 5 * j; o < std::min(5 * j + 5, kLines); ++o) PrefetchLine<kL2>(pf + 64 * o);
      }
      const __m512i sc = _mm512_cvtepu8_epi32(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(sb + kQ4_Kx16ScalesAt + 16 * j)));
      const char* nib = sb + kQ4_Kx16NibblesAt + (j / 2) * 8 * 64;
      const int shift = (j % 2) * 4;
      __m512i w[8];
#pragma GCC unroll 8
      for (int t = 0; t < 8; ++t) {
        w[t] = _mm512_and_si512(_mm512_srli_epi16(_mm512_loadu_si512(nib + 64 * t), shift), m4);
      }
#pragma GCC unroll 8
      for (int i = 0; i < NN; ++i) {
        const auto* xq = reinterpret_cast<const int8_t*>(xr[i] + s * kQK + 32 * j);
        __m512i t0 = _mm512_setzero_si512();
        if constexpr (NN <= 2) {
          __m512i t1 = _mm512_setzero_si512();
#pragma GCC unroll 4
          for (int t = 0; t < 8; t += 2) {
            DpbusdBroadcast(t0, w[t], xq + 4 * t);
            DpbusdBroadcast(t1, w[t + 1], xq + 4 * t + 4);
          }
          t0 = _mm512_add_epi32(t0, t1);
        } else {
#pragma GCC unroll 8
          for (int t = 0; t < 8; ++t) DpbusdBroadcast(t0, w[t], xq + 4 * t);
        }
        sumi[i] = _mm512_add_epi32(sumi[i], _mm512_mullo_epi32(t0, sc));
      }
    }
    __m512i mins[4];
    for (int p = 0; p < 4; ++p) {
      mins[p] = _mm512_cvtepu8_epi16(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb + kQ4_Kx16MinsAt + 32 * p)));
    }
    const __m512 dw =
        _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb + kQ4_Kx16DAt)));
    const __m512 dm =
        _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb + kQ4_Kx16DminAt)));
#pragma GCC unroll 8
    for (int i = 0; i < NN; ++i) {
      float dx;
      std::memcpy(&dx, xr[i] + d_off + s * 4, 4);
      int32_t words[4];
      std::memcpy(words, xr[i] + w_off + s * 16, 16);
      __m512i summ = _mm512_setzero_si512();
      for (int p = 0; p < 4; ++p) {
        summ = _mm512_dpwssd_epi32(summ, mins[p], _mm512_set1_epi32(words[p]));
      }
      const __m512 vdx = _mm512_set1_ps(dx);
      acc[i] = _mm512_fmadd_ps(_mm512_mul_ps(dw, vdx), _mm512_cvtepi32_ps(sumi[i]), acc[i]);
      acc[i] = _mm512_fnmadd_ps(_mm512_mul_ps(dm, vdx), _mm512_cvtepi32_ps(summ), acc[i]);
    }
  }
  for (int i = 0; i < NN; ++i) _mm512_storeu_ps(y + i * ys, acc[i]);
}

template <int... N>
constexpr auto MakeTilesQ4K(std::integer_sequence<int, N...>) {  // as MakeTilesX16
  return std::array<std::array<TileX16Fn, sizeof...(N)>, 2>{
      {{&TileQ4Kx16<N + 1, false>...}, {&TileQ4Kx16<N + 1, true>...}}};
}
constexpr auto kTilesQ4K = MakeTilesQ4K(std::make_integer_sequence<int, kQ4KMaxActRows>{});

// The drivers of the k-quant layouts (q4_Kx16, q6_Kx16), each given its tiles (kTiles[l2][nn - 1]
// takes nn activation rows), super-block bytes, pack_x row bytes and prefetch distance.
//
// y[i * ys + r] over the groups of 16 rows of a laid-out matrix, in passes of up to
// kTiles[0].size() activation rows, the first pass prefetching kPrefetch bytes ahead of the
// group's stream where FetchFor says so (kOneRowToL2: its argument).
template <const auto& kTiles, size_t kSuperBytes, size_t (*kXRowBytes)(int64_t), size_t kPrefetch,
          bool kOneRowToL2>
void GemmKx16Vnni(int64_t k, const void* w, size_t /*w_stride*/, int64_t rows, const void* xp,
                  int64_t n, float* y, int64_t ys) {
  constexpr int64_t kMax = static_cast<int64_t>(kTiles[0].size());
  const int64_t nbk = k / kQK;
  const size_t x_row_bytes = kXRowBytes(nbk);
  const char* wa = static_cast<const char*>(w);
  const size_t group_bytes = static_cast<size_t>(nbk) * kSuperBytes;
  const int64_t groups = rows / 16;
  const Fetch fetch = FetchFor(n, /*hardware_stream=*/false, kOneRowToL2);
  const auto& tiles = kTiles[fetch == Fetch::kL2];
  for (int64_t g = 0; g < groups; ++g) {
    const char* codes = wa + g * group_bytes;
    const size_t next = static_cast<size_t>(g) * group_bytes + AheadBytes(fetch, kPrefetch);
    const char* ahead = next < groups * group_bytes && fetch != Fetch::kNone ? wa + next : nullptr;
    for (int64_t i0 = 0; i0 < n; i0 += kMax) {
      const int nn = static_cast<int>(std::min<int64_t>(kMax, n - i0));
      tiles[nn - 1](nbk, codes, i0 == 0 ? ahead : nullptr, static_cast<const char*>(xp),
                    x_row_bytes, i0, y + i0 * ys + g * 16, ys);
    }
  }
}

// Plain rows (weights not laid out: copies off or past their budget, a row count off the groups
// of 16, tools that load without the layout): each group of 16 (a part group padded with its last
// row) laid out in a scratch buffer by kRepack, then the tiles; rows past the matrix are not
// stored. The copy costs more than the products at a few activation rows (gemv_bench rows_own
// against rows_x16): a fallback for the same bits, not a fast path.
template <const auto& kTiles, size_t kSuperBytes, size_t (*kXRowBytes)(int64_t), typename Block,
          void (*kRepack)(const Block* const[16], int64_t, void*)>
void GemmKPlainVnni(int64_t k, const void* w, size_t ws, int64_t rows, const void* xp, int64_t n,
                    float* y, int64_t ys) {
  constexpr int64_t kMax = static_cast<int64_t>(kTiles[0].size());
  const int64_t nbk = k / kQK;
  const size_t x_row_bytes = kXRowBytes(nbk);
  thread_local std::vector<char> group;
  group.resize(static_cast<size_t>(nbk) * kSuperBytes);
  alignas(64) float part[kMax * 16];
  for (int64_t r0 = 0; r0 < rows; r0 += 16) {
    const int nr = static_cast<int>(std::min<int64_t>(16, rows - r0));
    const Block* src[16];
    for (int e = 0; e < 16; ++e) {
      src[e] = reinterpret_cast<const Block*>(static_cast<const char*>(w) +
                                              (r0 + std::min(e, nr - 1)) * ws);
    }
    kRepack(src, nbk, group.data());
    for (int64_t i0 = 0; i0 < n; i0 += kMax) {
      const int nn = static_cast<int>(std::min<int64_t>(kMax, n - i0));
      if (nr == 16) {
        kTiles[0][nn - 1](nbk, group.data(), nullptr, static_cast<const char*>(xp), x_row_bytes, i0,
                          y + i0 * ys + r0, ys);
        continue;
      }
      kTiles[0][nn - 1](nbk, group.data(), nullptr, static_cast<const char*>(xp), x_row_bytes, i0,
                        part, 16);
      for (int i = 0; i < nn; ++i) {
        std::memcpy(y + (i0 + i) * ys + r0, part + i * 16, nr * sizeof(float));
      }
    }
  }
}

// ---- Q6_K in the own order (q6_Kx16) ------------------------------------------------------
//
// Per group of 16 weight rows and super-block, 32 weights G (G = 4h + k < 8) at a time: each of
// their 8 code words is the low word (h, k % 2, t) shifted right by 4 (k / 2), its low nibbles
// kept, and the high word (h, t) shifted so that bits 2k, 2k + 1 land on 4 and 5, those two kept
// (one AND, then one VPTERNLOGD merges both), once per batch; per activation row 4 VPDPBUSD for
// each of the two 16-weight sub-blocks and a VPMULLD at its scale. Per super-block and row: 8
// VPDPWSSD of the rows' scale pairs against the activation's sub-block sums, total = sumi -
// 32 * summ, then CVT, d * d_x, FMA: the portable kernel's operations on each lane.

constexpr int kQ6KMaxActRows = 8;
// Prefetch distance, as kQ4KPrefetchBytes (a super-block's 53 lines spread over its 8 steps;
// gemv_bench rows_x16/q6_K/1/1 and /4/1, us, two alternating runs: 4 KiB 212-244 / 207-229,
// 8 KiB 225-233 / 222-225, 16 KiB 233-242 / 232-306, 24 KiB 216-253 / 232-305; all 53 lines
// at the start of a half super-block: 251 / 392).
constexpr size_t kQ6KPrefetchBytes = 8192;

template <int kK>
__attribute__((always_inline)) inline __m512i Q6Code(const char* low, const char* high, __m512i m0f,
                                                     __m512i m30) {
  __m512i lo = _mm512_loadu_si512(low);
  if constexpr (kK >= 2) lo = _mm512_srli_epi16(lo, 4);
  __m512i hi = _mm512_loadu_si512(high);
  if constexpr (kK < 2) {
    hi = _mm512_slli_epi16(hi, 4 - 2 * kK);
  } else if constexpr (kK == 3) {
    hi = _mm512_srli_epi16(hi, 2);
  }
  // (lo & 0x0F) | (hi & 0x30): VPTERNLOGD of (lo, hi & 0x30, 0x0F) as (a & c) | b.
  return _mm512_ternarylogic_epi32(lo, _mm512_and_si512(hi, m30), m0f, 0xEC);
}

template <int NN, int kK, bool kL2>
__attribute__((always_inline)) inline void Q6Step(const char* sb, const char* pf, int h, int64_t s,
                                                  const char* const (&xr)[NN], __m512i (&sumi)[NN],
                                                  __m512i m0f, __m512i m30) {
  const int g = 4 * h + kK;
  if (pf != nullptr) {
    // The super-block's 53 lines spread over its 8 steps, 7 a step.
    constexpr int kLines = static_cast<int>((kQ6_Kx16SuperBytes + 63) / 64);
    for (int o = 7 * g; o < std::min(7 * g + 7, kLines); ++o) PrefetchLine<kL2>(pf + 64 * o);
  }
  // Scales of sub-blocks 2g and 2g + 1, 32-bit per lane.
  const __m512i pair = _mm512_cvtepi8_epi16(
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb + kQ6_Kx16ScalesAt + 32 * g)));
  const __m512i sc0 = _mm512_srai_epi32(_mm512_slli_epi32(pair, 16), 16);
  const __m512i sc1 = _mm512_srai_epi32(pair, 16);
  const char* low = sb + kQ6_Kx16LowAt + (16 * h + 8 * (kK % 2)) * 64;
  const char* high = sb + kQ6_Kx16HighAt + 8 * h * 64;
  __m512i w[8];
#pragma GCC unroll 8
  for (int t = 0; t < 8; ++t) w[t] = Q6Code<kK>(low + 64 * t, high + 64 * t, m0f, m30);
#pragma GCC unroll 8
  for (int i = 0; i < NN; ++i) {
    const auto* xq = reinterpret_cast<const int8_t*>(xr[i] + s * kQK + 32 * g);
    __m512i t0 = _mm512_setzero_si512(), t1 = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int t = 0; t < 4; ++t) {
      DpbusdBroadcast(t0, w[t], xq + 4 * t);
      DpbusdBroadcast(t1, w[t + 4], xq + 16 + 4 * t);
    }
    sumi[i] = _mm512_add_epi32(
        sumi[i], _mm512_add_epi32(_mm512_mullo_epi32(t0, sc0), _mm512_mullo_epi32(t1, sc1)));
  }
}

template <int NN, bool kL2>
void TileQ6Kx16(int64_t nbk, const char* group, const char* prefetch, const char* xp,
                size_t x_row_bytes, int64_t i0, float* y, int64_t ys) {
  const __m512i m0f = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
  __m512 acc[NN];
  for (int i = 0; i < NN; ++i) acc[i] = _mm512_setzero_ps();
  const char* xr[NN];
  for (int i = 0; i < NN; ++i) xr[i] = xp + (i0 + i) * x_row_bytes;
  const int64_t d_off = nbk * kQK, w_off = d_off + nbk * 4;
  for (int64_t s = 0; s < nbk; ++s) {
    const char* pf = prefetch != nullptr ? prefetch + s * kQ6_Kx16SuperBytes : nullptr;
    const char* sb = group + s * kQ6_Kx16SuperBytes;
    __m512i sumi[NN];
    for (int i = 0; i < NN; ++i) sumi[i] = _mm512_setzero_si512();
#pragma GCC unroll 1
    for (int h = 0; h < 2; ++h) {
      Q6Step<NN, 0, kL2>(sb, pf, h, s, xr, sumi, m0f, m30);
      Q6Step<NN, 1, kL2>(sb, pf, h, s, xr, sumi, m0f, m30);
      Q6Step<NN, 2, kL2>(sb, pf, h, s, xr, sumi, m0f, m30);
      Q6Step<NN, 3, kL2>(sb, pf, h, s, xr, sumi, m0f, m30);
    }
    const __m512 dw =
        _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb + kQ6_Kx16DAt)));
    __m512i pairs[8];
    for (int p = 0; p < 8; ++p) {
      pairs[p] = _mm512_cvtepi8_epi16(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb + kQ6_Kx16ScalesAt + 32 * p)));
    }
#pragma GCC unroll 8
    for (int i = 0; i < NN; ++i) {
      float dx;
      std::memcpy(&dx, xr[i] + d_off + s * 4, 4);
      int32_t words[8];
      std::memcpy(words, xr[i] + w_off + s * 32, 32);
      __m512i summ = _mm512_setzero_si512();
      for (int p = 0; p < 8; ++p) {
        summ = _mm512_dpwssd_epi32(summ, pairs[p], _mm512_set1_epi32(words[p]));
      }
      const __m512i total = _mm512_sub_epi32(sumi[i], _mm512_slli_epi32(summ, 5));
      acc[i] =
          _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(dx)), _mm512_cvtepi32_ps(total), acc[i]);
    }
  }
  for (int i = 0; i < NN; ++i) _mm512_storeu_ps(y + i * ys, acc[i]);
}

template <int... N>
constexpr auto MakeTilesQ6K(std::integer_sequence<int, N...>) {  // as MakeTilesX16
  return std::array<std::array<TileX16Fn, sizeof...(N)>, 2>{
      {{&TileQ6Kx16<N + 1, false>...}, {&TileQ6Kx16<N + 1, true>...}}};
}
constexpr auto kTilesQ6K = MakeTilesQ6K(std::make_integer_sequence<int, kQ6KMaxActRows>{});

}  // namespace

// Runs where the quad kernels do (avx512_vnni.cc's check: the CPU, PDSERVE_CPU_ISA and
// PDSERVE_CPU_NO_VNNI).
PD_NO_AVX512 const GroupedKernels* Q8_0OwnOrderVnni() {
  return Q8_0QuadVnni() != nullptr ? &kOwnOrderKernels<&GemmOwnVnni<Plain::kQ8_0>> : nullptr;
}

PD_NO_AVX512 const GroupedKernels* Q8_0x16OwnOrderVnni() {
  return Q8_0QuadVnni() != nullptr ? &kOwnOrderKernels<&GemmX16Vnni<X16::kQ8_0>> : nullptr;
}

PD_NO_AVX512 const GroupedKernels* Q5_0OwnOrderVnni() {
  return Q8_0QuadVnni() != nullptr ? &kOwnOrderKernels<&GemmOwnVnni<Plain::kQ5_0>> : nullptr;
}

PD_NO_AVX512 const GroupedKernels* Q5_0x16OwnOrderVnni() {
  return Q8_0QuadVnni() != nullptr ? &kOwnOrderKernels<&GemmX16Vnni<X16::kQ5_0>> : nullptr;
}

PD_NO_AVX512 const GroupedKernels* Q4_KOwnOrderVnni() {
  return Q8_0QuadVnni() != nullptr
             ? &kOwnOrderQ4KKernels<
                   &GemmKPlainVnni<kTilesQ4K, kQ4_Kx16SuperBytes, &Q4_KOwnXRowBytes, BlockQ4_K,
                                   &RepackQ4_Kx16Group>>
             : nullptr;
}

PD_NO_AVX512 const GroupedKernels* Q4_Kx16OwnOrderVnni() {
  return Q8_0QuadVnni() != nullptr
             ? &kOwnOrderQ4KKernels<&GemmKx16Vnni<kTilesQ4K, kQ4_Kx16SuperBytes, &Q4_KOwnXRowBytes,
                                                  kQ4KPrefetchBytes, false>>
             : nullptr;
}

PD_NO_AVX512 const GroupedKernels* Q6_KOwnOrderVnni() {
  return Q8_0QuadVnni() != nullptr
             ? &kOwnOrderQ6KKernels<
                   &GemmKPlainVnni<kTilesQ6K, kQ6_Kx16SuperBytes, &Q6_KOwnXRowBytes, BlockQ6_K,
                                   &RepackQ6_Kx16Group>>
             : nullptr;
}

PD_NO_AVX512 const GroupedKernels* Q6_Kx16OwnOrderVnni() {
  return Q8_0QuadVnni() != nullptr
             ? &kOwnOrderQ6KKernels<&GemmKx16Vnni<kTilesQ6K, kQ6_Kx16SuperBytes, &Q6_KOwnXRowBytes,
                                                  kQ6KPrefetchBytes, true>>
             : nullptr;
}

}  // namespace pd::engine::cpu

#else

namespace pd::engine::cpu {
const GroupedKernels* Q8_0OwnOrderVnni() { return nullptr; }
const GroupedKernels* Q8_0x16OwnOrderVnni() { return nullptr; }
const GroupedKernels* Q5_0OwnOrderVnni() { return nullptr; }
const GroupedKernels* Q5_0x16OwnOrderVnni() { return nullptr; }
const GroupedKernels* Q4_KOwnOrderVnni() { return nullptr; }
const GroupedKernels* Q4_Kx16OwnOrderVnni() { return nullptr; }
const GroupedKernels* Q6_KOwnOrderVnni() { return nullptr; }
const GroupedKernels* Q6_Kx16OwnOrderVnni() { return nullptr; }
}  // namespace pd::engine::cpu

#endif
