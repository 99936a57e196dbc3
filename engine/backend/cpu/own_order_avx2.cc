// pdserve's own orders (kernels.h: Q8_0x16OwnOrderAvx2 and the rest) on AVX2 alone: the laid-out
// layouts that the VNNI kernels read (q8_0x16, q5_0x16, q4_Kx16), 8 weight rows in the lanes of a
// YMM register, the same bits as the portable kernels (own_order.cc) on every CPU. (Q6_K keeps
// llama.cpp's order on AVX2: docs/numerics.md.)
//
// The order's block sums are exact integers, so any exact way of forming them gives the same
// bits. Without VPDPBUSD the sums come from VPMADDUBSW (unsigned x signed bytes, adjacent pairs
// added into int16) and VPMADDWD against ones (pairs of int16 into the int32 lane of one weight
// row), then VPADDD, and no horizontal sums at all, since each lane is one weight row.
//
// - q5_0x16: codes 0..31 (the weight + 16), so the int16 pairs of four code words add up exactly
//   in int16 before one MADD widens them (4 * 2 * 31 * 128 < 2^15); the sums start at the packed
//   offset / 8 (-16 * sum(x)), as the VNNI kernel's do. The fifth bits (a 32-bit mask per code
//   word and 8 rows) widen to bytes by a shuffle, an AND with the bit of each byte and a compare,
//   once per block and pass of activation rows.
// - q4_Kx16: codes 0..15, the pairs of a whole sub-block (8 code words) in int16, one MADD by the
//   rows' (sc, sc) pairs (TileQ4Kx16).
// - q8_0x16: the codes are stored as w + 128 for VPDPBUSD, which MADDUBS cannot take (2 * 255 *
//   127 overflows its pairs). XOR 0x80 gives w back; MADDUBS then takes |w| (<= 128) against
//   x signed by w (VPSIGNB), exact while |x| <= 127: Q8_0 activations as QuantizeQ8_0 makes them
//   (round(x / d), d = amax / 127). A call whose packed activations hold a -128 (VPSIGNB cannot
//   negate it) runs the portable kernel instead, so the bits never depend on the path. Per code
//   word and activation row four operations (SIGN, MADDUBS, MADD, ADD): on Zen 4 they share two
//   pipes at ~1.6 cycles, so four rows through Gemma 3's head cost ~13 ms against llama.cpp's
//   order's ~16 (rows_avx2.cc).
//
// Per block and activation row the F32 steps are the portable kernel's on each lane: CVT,
// d_w * d_x, one FMA into the row's accumulator, from +0 in block order.
//
// Compiled with -mavx2 -mfma -mf16c (the AVX2 list in engine/backend/CMakeLists.txt); the
// entry points hand out their tables only where Avx2Kernels() runs.
#include "engine/backend/cpu/kernels.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "engine/quant/q4_kx16.h"
#include "engine/quant/q5_0x16.h"
#include "engine/quant/q8_0x16.h"

namespace pd::engine::cpu {
namespace {

constexpr int kBlock = 32;
// Activation rows per pass over a group.
constexpr int kMaxActRows = 16;
// The rows of a pass run this many at a time against a block (their int32 sums in registers
// beside the code words; the F32 accumulators of more rows in memory, touched once per block).
// Above it the q8_0x16 / q5_0x16 tiles make each block's code words once into memory; the
// q4_Kx16 tile makes them again per chunk, which is cheaper there (TileQ4Kx16).
constexpr int kChunkRows = 4;
// Up to this many activation rows a pass runs both halves of a group (rows 0-7 and 8-15) per
// block; more rows take the halves one after the other (the second from cache), so that the
// sums fit the 16 registers.
constexpr int kBothHalvesMaxRows = 2;
// How far ahead of the group's stream the software prefetch runs (into L1 for one activation row,
// into L2 alone for more).
constexpr size_t kPrefetchBytes = 16384;
// The head stream (kernels.h, HeadStream) at one activation row on AMD runs without software
// prefetch, which the hardware prefetchers follow better alone, as on VNNI (own_order_vnni.cc,
// FetchFor): gemv_bench head_x16/q8_0/1/1 under PDSERVE_CPU_ISA=avx2 on Zen 4, two runs, ms:
// into L1 6.75 / 6.78, into L2 7.49 / 7.41, none 5.83 / 5.89; two rows level (6.6-6.9), three
// lose without it (10.1-10.6 against 14.1). On Intel one or two rows prefetch into L1 near
// (NearPrefetch; the tile runs a block from L2 at ~46 GB/s): head_x16/q8_0/<n>/<t> under the
// cap on the AMX Xeon, two alternating runs, ms, L2 16 KiB ahead (the rule before) -> L1 2 KiB
// ahead: n = 1, 1 thread 14.7 / 14.6 -> 11.5 / 12.3, 2 threads 7.0 / 6.9 -> 6.0 / 6.0; n = 2,
// 15.8 / 15.9 -> 12.2 / 13.7 and 8.3 / 8.4 -> 6.5 / 6.2; 16 KiB ahead into L1 17.4-17.7, 4 KiB
// 18.1 at n = 2, and 2 KiB from n = 3 on loses (n = 4: 21.8 -> 22.5-23.2). The layers' streams
// the same (rows_x16/<type>/<n>/<t>, rows/s, L1 16 KiB or L2 16 KiB (q4_Kx16: 8 KiB) -> L1 2 KiB):
// q5_0 1/1 3.67k -> 4.95k, 1/2 6.01k -> 8.17k, 2/1 6.53k -> 8.29k, 2/2 11.6k -> 13.7k; q4_K
// 5.29k -> 6.51k, 10.0k -> 10.9k, 8.76k -> 11.2k, 15.1k -> 18.6k (1 KiB level with 2, 4 KiB
// between; bench/results/near_prefetch_layers_2026-12-07_intel.md).

enum class X16 { kQ8_0, kQ5_0 };

// Where a driver's software prefetch goes for `n` activation rows: near into L1 on Intel at one
// or two rows (kernels.h, NearPrefetch), else one row into L1 and more into L2 alone, `far`
// bytes ahead of the group's stream.
struct Ahead {
  bool near, l2;
  size_t bytes;
};
inline Ahead AheadFor(int64_t n, size_t far) {
  const bool near = NearPrefetch(n);
  return {near, n > 1 && !near, near ? kNearPrefetchBytes : far};
}

template <X16 kW>
constexpr size_t X16BlockBytes() {  // per group of 16 rows and block
  return kW == X16::kQ8_0 ? 16 * (kBlock + 2) : 16 * 22;
}

// Code words p and p + 4 (codes 4p..4p+3 and 16 + 4p..16 + 4p + 3) of block b for the 8 rows of
// half h, as MADDUBS' unsigned operands (`u`) and, for Q8_0, the signed weights whose signs the
// activations take (`sw`).
struct Words {
  __m256i u[2];
  __m256i sw[2];
};

// The 32 fifth bits of 8 rows' code word (bit 4e + t: row e's code t) as bytes of 16 or 0.
__attribute__((always_inline)) inline __m256i FifthBits(uint32_t m) {
  const __m256i spread =
      _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int32_t>(m)),
                          _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                           2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
  return _mm256_and_si256(set, _mm256_set1_epi8(16));
}

template <X16 kW>
__attribute__((always_inline)) inline Words LoadWords(const char* group, int64_t nb, int64_t b,
                                                      int h, int p) {
  Words w;
  if constexpr (kW == X16::kQ8_0) {
    const char* cb = group + Q8_0x16CodesAt(b) + 32 * h;
    const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
    for (int q = 0; q < 2; ++q) {
      w.sw[q] = _mm256_xor_si256(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cb + 64 * (p + 4 * q))), flip);
      w.u[q] = _mm256_abs_epi8(w.sw[q]);
    }
  } else {
    // Nibble word p: its low nibbles are code word p, its high nibbles code word p + 4.
    const __m256i q = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(group + Q5_0x16NibblesAt(b) + 32 * h + 64 * p));
    const char* masks = group + Q5_0x16MasksAt(nb, b) + 4 * h;
    uint32_t lo_bits, hi_bits;
    std::memcpy(&lo_bits, masks + 8 * p, 4);
    std::memcpy(&hi_bits, masks + 8 * (p + 4), 4);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    w.u[0] = _mm256_add_epi8(_mm256_and_si256(q, m4), FifthBits(lo_bits));
    w.u[1] = _mm256_add_epi8(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), FifthBits(hi_bits));
  }
  return w;
}

// Block b's 8 F16 scales of half h as F32.
template <X16 kW>
__attribute__((always_inline)) inline __m256 LoadScales(const char* group, int64_t nb, int64_t b,
                                                        int h) {
  const char* s =
      group + (kW == X16::kQ8_0 ? Q8_0x16ScalesAt(nb, b) : Q5_0x16ScalesAt(nb, b)) + 16 * h;
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
}

// MADDUBS of 8 rows' unsigned code word against one activation row's (4 codes at xq, broadcast):
// each row's two int16 pair sums.
__attribute__((always_inline)) inline __m256i Pairs(__m256i u, const char* xq) {
  int32_t word;
  std::memcpy(&word, xq, 4);
  return _mm256_maddubs_epi16(u, _mm256_set1_epi32(word));
}

// One activation row's code word (4 codes at xq, broadcast) against 8 rows' word: s += the 8
// rows' exact dot products. The empty asm keeps each row's sum one chain of adds: without it GCC
// reassociates a block's adds into a tree whose leaves (every row's MADD results) outnumber the
// 16 registers and spill (gemv_bench head_x16/q8_0/<n>/1 under the cap on the AMX Xeon, two
// alternating runs, ms: n = 4 23.8 / 22.3 -> 20.8 / 20.6, 8 35.9 / 34.7 -> 31.1 / 30.8, 16
// 63.5 / 53.4 -> 51.3 / 48.1). Q5_0's and Q4_K's int16 trees do not spill, and the same barrier
// there measured level (Q5_0) or 20-40 % slower (Q4_K).
template <X16 kW>
__attribute__((always_inline)) inline __m256i AddWord(__m256i s, __m256i u, __m256i sw,
                                                      const char* xq) {
  int32_t word;
  std::memcpy(&word, xq, 4);
  __m256i x = _mm256_set1_epi32(word);
  if constexpr (kW == X16::kQ8_0) x = _mm256_sign_epi8(x, sw);
  __m256i r =
      _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1)));
  asm("" : "+x"(r));
  return r;
}

// NC activation rows' block b against the 8 rows of half h: acc[i] = fma(d_w * d_x, isum,
// acc[i]), the portable kernel's operations on each lane. The code words (p and p + 4 for each p)
// are made from the group's bytes as they are needed (kMade false) or read from `made`.
// (`made`: code word j's unsigned operand at made[j], Q8_0's signed weights at made[8 + j].)
template <X16 kW, int NC, bool kMade>
__attribute__((always_inline)) inline void RowsBlock(const char* group, int h, const __m256i* made,
                                                     const char* const* xr, int64_t b, int64_t nb,
                                                     __m256 dw, __m256* acc) {
  const auto words = [&](int p) __attribute__((always_inline)) {
    if constexpr (kMade) {
      Words w;
      for (int q = 0; q < 2; ++q) {
        w.u[q] = _mm256_load_si256(made + p + 4 * q);
        if constexpr (kW == X16::kQ8_0) w.sw[q] = _mm256_load_si256(made + 8 + p + 4 * q);
      }
      return w;
    } else {
      return LoadWords<kW>(group, nb, b, h, p);
    }
  };
  // The sums start at 0 (Q8_0) or at -16 * sum(x) (Q5_0: the packed offset / 8).
  __m256i sum[NC];
  for (int i = 0; i < NC; ++i) {
    int32_t c = 0;
    if constexpr (kW == X16::kQ5_0) std::memcpy(&c, xr[i] + nb * (kBlock + 4) + b * 4, 4);
    sum[i] = _mm256_set1_epi32(c >> 3);
  }
  if constexpr (kW == X16::kQ8_0) {
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) {
      const Words w = words(p);
#pragma GCC unroll 8
      for (int i = 0; i < NC; ++i) {
        const char* xq = xr[i] + b * kBlock + 4 * p;
        sum[i] = AddWord<kW>(sum[i], w.u[0], w.sw[0], xq);
        sum[i] = AddWord<kW>(sum[i], w.u[1], w.sw[1], xq + 16);
      }
    }
  } else {
    // Q5_0's codes are small enough that MADDUBS' int16 pairs of four code words add up exactly
    // in int16 (4 * 2 * 31 * 128 = 31744 < 2^15) before one MADD widens them: per two nibble
    // words (4 code words) and activation row 4 MADDUBS, 3 ADDW, MADD and ADD.
#pragma GCC unroll 2
    for (int p = 0; p < 4; p += 2) {
      const Words w0 = words(p);
      const Words w1 = words(p + 1);
#pragma GCC unroll 8
      for (int i = 0; i < NC; ++i) {
        const char* xq = xr[i] + b * kBlock + 4 * p;
        const __m256i q =
            _mm256_add_epi16(_mm256_add_epi16(Pairs(w0.u[0], xq), Pairs(w0.u[1], xq + 16)),
                             _mm256_add_epi16(Pairs(w1.u[0], xq + 4), Pairs(w1.u[1], xq + 20)));
        sum[i] = _mm256_add_epi32(sum[i], _mm256_madd_epi16(q, _mm256_set1_epi16(1)));
      }
    }
  }
  for (int i = 0; i < NC; ++i) {
    float d;
    std::memcpy(&d, xr[i] + nb * kBlock + b * 4, 4);
    acc[i] =
        _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(d)), _mm256_cvtepi32_ps(sum[i]), acc[i]);
  }
}

__attribute__((always_inline)) inline void Prefetch(const char* p, bool l2) {
  if (l2) {
    _mm_prefetch(p, _MM_HINT_T1);
  } else {
    _mm_prefetch(p, _MM_HINT_T0);
  }
}

// One group of 16 weight rows (laid out as kW) against activation rows [i0, i0 + NN):
// y[i * ys + r]. kBoth: both halves per block, else half h alone. `prefetch`: where this group's
// stream share starts kPrefetchBytes ahead (nullptr: none), into L2 alone where `l2`.
template <int NN, X16 kW, bool kBoth>
void TileX16(int64_t nb, const char* group, int h, const char* prefetch, bool l2, const char* xp,
             size_t x_row_bytes, int64_t i0, float* y, int64_t ys) {
  constexpr int kHalves = kBoth ? 2 : 1;
  constexpr size_t kBytes = X16BlockBytes<kW>();
  constexpr int kLines = static_cast<int>((kBytes + 63) / 64);
  __m256 acc[kHalves][NN];
  for (auto& a : acc) {
    for (__m256& v : a) v = _mm256_setzero_ps();
  }
  const char* xr[NN];
  for (int i = 0; i < NN; ++i) xr[i] = xp + (i0 + i) * x_row_bytes;
  for (int64_t b = 0; b < nb; ++b) {
    if (prefetch != nullptr) {
      const char* p = prefetch + b * kBytes;
#pragma GCC unroll 9
      for (int o = 0; o < kLines; ++o) Prefetch(p + 64 * o, l2);
    }
#pragma GCC unroll 2
    for (int hh = 0; hh < kHalves; ++hh) {
      const int half = kBoth ? hh : h;
      const __m256 dw = LoadScales<kW>(group, nb, b, half);
      if constexpr (NN <= kChunkRows) {
        // The code words made as the rows need them.
        RowsBlock<kW, NN, false>(group, half, nullptr, xr, b, nb, dw, acc[hh]);
      } else {
        // The code words made once, then the rows kChunkRows at a time.
        alignas(32) __m256i ws[16];
#pragma GCC unroll 4
        for (int p = 0; p < 4; ++p) {
          const Words w = LoadWords<kW>(group, nb, b, half, p);
          for (int q = 0; q < 2; ++q) {
            _mm256_store_si256(ws + p + 4 * q, w.u[q]);
            if constexpr (kW == X16::kQ8_0) _mm256_store_si256(ws + 8 + p + 4 * q, w.sw[q]);
          }
        }
#pragma GCC unroll 4
        for (int c = 0; c < NN / kChunkRows; ++c) {
          RowsBlock<kW, kChunkRows, true>(group, half, ws, xr + c * kChunkRows, b, nb, dw,
                                          acc[hh] + c * kChunkRows);
        }
        if constexpr (NN % kChunkRows != 0) {
          constexpr int kDone = NN / kChunkRows * kChunkRows;
          RowsBlock<kW, NN - kDone, true>(group, half, ws, xr + kDone, b, nb, dw, acc[hh] + kDone);
        }
      }
    }
  }
  for (int hh = 0; hh < kHalves; ++hh) {
    const int half = kBoth ? hh : h;
    for (int i = 0; i < NN; ++i) _mm256_storeu_ps(y + i * ys + 8 * half, acc[hh][i]);
  }
}

using TileFn = void (*)(int64_t, const char*, int, const char*, bool, const char*, size_t, int64_t,
                        float*, int64_t);

template <X16 kW, int... N>
constexpr auto MakeTiles(std::integer_sequence<int, N...>) {
  return std::array<TileFn, sizeof...(N)>{&TileX16<N + 1, kW, (N + 1 <= kBothHalvesMaxRows)>...};
}

// True when an activation code of the packed rows is -128 (q8_0x16's sign trick cannot take it).
bool HasMinus128(const char* xp, size_t x_row_bytes, int64_t n, int64_t nb) {
  const __m256i m128 = _mm256_set1_epi8(static_cast<char>(-128));
  __m256i any = _mm256_setzero_si256();
  for (int64_t i = 0; i < n; ++i) {
    const char* xq = xp + i * x_row_bytes;
    for (int64_t b = 0; b < nb; ++b) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + b * kBlock));
      any = _mm256_or_si256(any, _mm256_cmpeq_epi8(q, m128));
    }
  }
  return !_mm256_testz_si256(any, any);
}

template <X16 kW>
void GemmPlainAvx2(int64_t k, const void* w, size_t ws, int64_t rows, const void* xp, int64_t n,
                   float* y, int64_t ys);

// y[i * ys + r] over the groups of 16 rows (kW's layout) in passes of up to kMaxActRows
// activation rows; q8_0x16's last rows % 16 are plain Q8_0 rows (q5_0x16 has none).
template <X16 kW>
void GemmX16Avx2(int64_t k, const void* w, size_t /*w_stride*/, int64_t rows, const void* xp,
                 int64_t n, float* y, int64_t ys) {
  static constexpr auto kTiles = MakeTiles<kW>(std::make_integer_sequence<int, kMaxActRows>{});
  const int64_t nb = k / kBlock;
  const size_t x_row_bytes = Q8_0OwnXRowBytes(nb);
  const char* xa = static_cast<const char*>(xp);
  if (kW == X16::kQ8_0 && HasMinus128(xa, x_row_bytes, n, nb)) {
    Q8_0x16OwnOrderScalar()->gemm(k, w, 0, rows, xp, n, y, ys);
    return;
  }
  const char* wa = static_cast<const char*>(w);
  const size_t group_bytes = static_cast<size_t>(nb) * X16BlockBytes<kW>();
  const int64_t groups = rows / 16;
  // AheadFor, except the head stream at one row off Intel: the hardware alone (above).
  const Ahead fetch = AheadFor(n, kPrefetchBytes);
  const bool hardware_only =
      kW == X16::kQ8_0 && HeadStream(groups, group_bytes) && n == 1 && !fetch.near;
  for (int64_t g = 0; g < groups; ++g) {
    const char* group = wa + g * group_bytes;
    const size_t next = static_cast<size_t>(g) * group_bytes + fetch.bytes;
    const char* ahead = next < groups * group_bytes && !hardware_only ? wa + next : nullptr;
    for (int64_t i0 = 0; i0 < n; i0 += kMaxActRows) {
      const int nn = static_cast<int>(std::min<int64_t>(kMaxActRows, n - i0));
      const TileFn tile = kTiles[nn - 1];
      float* yg = y + i0 * ys + g * 16;
      tile(nb, group, 0, i0 == 0 ? ahead : nullptr, fetch.l2, xa, x_row_bytes, i0, yg, ys);
      if (nn > kBothHalvesMaxRows)
        tile(nb, group, 1, nullptr, fetch.l2, xa, x_row_bytes, i0, yg, ys);
    }
  }
  if constexpr (kW == X16::kQ8_0) {
    if (const int64_t tail = rows - groups * 16; tail > 0) {
      GemmPlainAvx2<X16::kQ8_0>(k, wa + groups * group_bytes, static_cast<size_t>(nb) * 34, tail,
                                xp, n, y + groups * 16, ys);
    }
  }
}

// Plain rows (`ws` bytes apart: weights not laid out, q8_0x16's tail rows): each group of 16 (a
// part group padded with its last row) copied and laid out in scratch, then the tiles; rows past
// the matrix are not stored. A fallback for the same bits, not a fast path.
template <X16 kW>
void GemmPlainAvx2(int64_t k, const void* w, size_t ws, int64_t rows, const void* xp, int64_t n,
                   float* y, int64_t ys) {
  const int64_t nb = k / kBlock;
  const size_t row_bytes = static_cast<size_t>(nb) * (kW == X16::kQ8_0 ? 34 : 22);
  thread_local std::vector<char> src, laid;
  thread_local std::vector<float> part;
  src.resize(16 * row_bytes);
  laid.resize(16 * row_bytes);
  part.resize(static_cast<size_t>(n) * 16);
  for (int64_t r0 = 0; r0 < rows; r0 += 16) {
    const int nr = static_cast<int>(std::min<int64_t>(16, rows - r0));
    for (int e = 0; e < 16; ++e) {
      std::memcpy(src.data() + e * row_bytes,
                  static_cast<const char*>(w) + (r0 + std::min(e, nr - 1)) * ws, row_bytes);
    }
    if constexpr (kW == X16::kQ8_0) {
      RepackQ8_0x16(src.data(), row_bytes, 16, k, laid.data());
    } else {
      RepackQ5_0x16(src.data(), row_bytes, 16, k, laid.data());
    }
    GemmX16Avx2<kW>(k, laid.data(), 0, 16, xp, n, part.data(), 16);
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(y + i * ys + r0, part.data() + i * 16, nr * sizeof(float));
    }
  }
}

// ---- Q4_K in the own order (q4_Kx16) ------------------------------------------------------
//
// Per group of 16 weight rows, half of 8 rows and super-block, sub-block by sub-block: its 8 code
// words (a nibble word ANDed, or shifted first for the odd sub-blocks); per activation row 8
// MADDUBS whose int16 pairs add up exactly in int16 (8 * 2 * 15 * 128 = 30720 < 2^15), then one
// MADD by the rows' scale pairs (sc, sc) gives sc * isum in each row's lane, added into sumi. Per
// super-block and row the mins: 4 MADD of the rows' (m_2i, m_2i+1) pairs against the activation's
// (xsum_2i, xsum_2i+1) words. Then CVT, d * d_x, FMA and dmin * d_x, FNMADD: the portable kernel's
// operations on each lane (own_order.cc).

// Code word w (codes 4w..4w+3) of sub-block j (of super-block `sb`) for half h.
__attribute__((always_inline)) inline __m256i Q4KCode(const char* sb, int h, int j, int w) {
  const __m256i q = _mm256_loadu_si256(
      reinterpret_cast<const __m256i*>(sb + kQ4_Kx16NibblesAt + ((j / 2) * 8 + w) * 64 + 32 * h));
  return _mm256_and_si256(j % 2 == 0 ? q : _mm256_srli_epi16(q, 4), _mm256_set1_epi8(0x0F));
}

// NC activation rows (xr) against super-block s of a half (sb: the super-block; h: the half), the
// code words made as they are needed; acc[i] += the rows' super-block terms. `pf`: the
// super-block kKPrefetchBytes ahead, fetched a share per sub-block.
template <int NC>
__attribute__((always_inline)) inline void Q4KRows(const char* sb, int h, const char* pf, bool l2,
                                                   const char* const* xr, int64_t s, int64_t nbk,
                                                   __m256* acc) {
  constexpr int kLines = static_cast<int>(kQ4_Kx16SuperBytes / 64);
  __m256i sumi[NC];
  for (int i = 0; i < NC; ++i) sumi[i] = _mm256_setzero_si256();
#pragma GCC unroll 1
  for (int j = 0; j < 8; ++j) {
    if (pf != nullptr) {
      // The super-block's 37 lines over its 8 sub-blocks, 5 a step.
      for (int o = 5 * j; o < std::min(5 * j + 5, kLines); ++o) Prefetch(pf + 64 * o, l2);
    }
    __m256i q[NC];
#pragma GCC unroll 8
    for (int w = 0; w < 8; ++w) {
      const __m256i c = Q4KCode(sb, h, j, w);
#pragma GCC unroll 4
      for (int i = 0; i < NC; ++i) {
        const __m256i pw = Pairs(c, xr[i] + s * kQK + 32 * j + 4 * w);
        q[i] = w == 0 ? pw : _mm256_add_epi16(q[i], pw);
      }
    }
    // (sc, sc) in each row's lane.
    uint64_t sc8;
    std::memcpy(&sc8, sb + kQ4_Kx16ScalesAt + 16 * j + 8 * h, 8);
    const __m256i sc = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(sc8)));
    const __m256i sc_pair = _mm256_or_si256(sc, _mm256_slli_epi32(sc, 16));
    for (int i = 0; i < NC; ++i)
      sumi[i] = _mm256_add_epi32(sumi[i], _mm256_madd_epi16(q[i], sc_pair));
  }
  __m256i mins[4];
  for (int p = 0; p < 4; ++p) {
    mins[p] = _mm256_cvtepu8_epi16(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(sb + kQ4_Kx16MinsAt + 32 * p + 16 * h)));
  }
  const __m256 dw =
      _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sb + kQ4_Kx16DAt + 16 * h)));
  const __m256 dm = _mm256_cvtph_ps(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(sb + kQ4_Kx16DminAt + 16 * h)));
  const int64_t d_off = nbk * kQK, w_off = d_off + nbk * 4;
  for (int i = 0; i < NC; ++i) {
    float dx;
    std::memcpy(&dx, xr[i] + d_off + s * 4, 4);
    int32_t words[4];
    std::memcpy(words, xr[i] + w_off + s * 16, 16);
    __m256i summ = _mm256_madd_epi16(mins[0], _mm256_set1_epi32(words[0]));
    for (int p = 1; p < 4; ++p) {
      summ = _mm256_add_epi32(summ, _mm256_madd_epi16(mins[p], _mm256_set1_epi32(words[p])));
    }
    const __m256 vdx = _mm256_set1_ps(dx);
    acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(dw, vdx), _mm256_cvtepi32_ps(sumi[i]), acc[i]);
    acc[i] = _mm256_fnmadd_ps(_mm256_mul_ps(dm, vdx), _mm256_cvtepi32_ps(summ), acc[i]);
  }
}

// Prefetch distance of the k-quant layouts, a super-block's lines spread over its 8 steps (on
// Intel one or two rows: AheadFor's near distance).
constexpr size_t kKPrefetchBytes = 8192;

// One group of 16 weight rows (q4_Kx16), half h (both halves where kBoth), against activation
// rows [i0, i0 + NN), kChunkRows at a time per super-block (from L1 after the first chunk), each
// chunk making the code words again: cheaper than making them once into memory (gemv_bench
// rows_x16/q4_K/16/1 on Zen 4 under PDSERVE_CPU_ISA=avx2: 921 us with the words made once per
// super-block, 755-759 per chunk).
template <int NN, bool kBoth>
void TileQ4Kx16(int64_t nbk, const char* group, int h, const char* prefetch, bool l2,
                const char* xp, size_t x_row_bytes, int64_t i0, float* y, int64_t ys) {
  constexpr int kHalves = kBoth ? 2 : 1;
  __m256 acc[kHalves][NN];
  for (auto& a : acc) {
    for (__m256& v : a) v = _mm256_setzero_ps();
  }
  const char* xr[NN];
  for (int i = 0; i < NN; ++i) xr[i] = xp + (i0 + i) * x_row_bytes;
  for (int64_t s = 0; s < nbk; ++s) {
    const char* sb = group + s * kQ4_Kx16SuperBytes;
    const char* pf = prefetch != nullptr ? prefetch + s * kQ4_Kx16SuperBytes : nullptr;
#pragma GCC unroll 2
    for (int hh = 0; hh < kHalves; ++hh) {
      const int half = kBoth ? hh : h;
      const char* f = hh == 0 ? pf : nullptr;
#pragma GCC unroll 4
      for (int c = 0; c < NN / kChunkRows; ++c) {
        Q4KRows<kChunkRows>(sb, half, c == 0 ? f : nullptr, l2, xr + c * kChunkRows, s, nbk,
                            acc[hh] + c * kChunkRows);
      }
      if constexpr (NN % kChunkRows != 0) {
        constexpr int kDone = NN / kChunkRows * kChunkRows;
        Q4KRows<NN - kDone>(sb, half, kDone == 0 ? f : nullptr, l2, xr + kDone, s, nbk,
                            acc[hh] + kDone);
      }
    }
  }
  for (int hh = 0; hh < kHalves; ++hh) {
    const int half = kBoth ? hh : h;
    for (int i = 0; i < NN; ++i) _mm256_storeu_ps(y + i * ys + 8 * half, acc[hh][i]);
  }
}

template <int... N>
constexpr auto MakeTilesQ4K(std::integer_sequence<int, N...>) {
  return std::array<TileFn, sizeof...(N)>{&TileQ4Kx16<N + 1, (N + 1 <= kBothHalvesMaxRows)>...};
}
constexpr auto kTilesQ4K = MakeTilesQ4K(std::make_integer_sequence<int, kMaxActRows>{});

// y[i * ys + r] over the groups of 16 rows of a k-quant layout (kTiles[nn - 1]: nn activation rows
// of one half), in passes of up to kMaxActRows activation rows, the first half's pass
// prefetching kKPrefetchBytes ahead of the group's stream.
template <const auto& kTiles, size_t kSuperBytes, size_t (*kXRowBytes)(int64_t)>
void GemmKx16Avx2(int64_t k, const void* w, size_t /*w_stride*/, int64_t rows, const void* xp,
                  int64_t n, float* y, int64_t ys) {
  const int64_t nbk = k / kQK;
  const size_t x_row_bytes = kXRowBytes(nbk);
  const char* wa = static_cast<const char*>(w);
  const char* xa = static_cast<const char*>(xp);
  const size_t group_bytes = static_cast<size_t>(nbk) * kSuperBytes;
  const int64_t groups = rows / 16;
  const Ahead fetch = AheadFor(n, kKPrefetchBytes);
  for (int64_t g = 0; g < groups; ++g) {
    const char* group = wa + g * group_bytes;
    const size_t next = static_cast<size_t>(g) * group_bytes + fetch.bytes;
    const char* ahead = next < groups * group_bytes ? wa + next : nullptr;
    for (int64_t i0 = 0; i0 < n; i0 += kMaxActRows) {
      const int nn = static_cast<int>(std::min<int64_t>(kMaxActRows, n - i0));
      float* yg = y + i0 * ys + g * 16;
      kTiles[nn - 1](nbk, group, 0, i0 == 0 ? ahead : nullptr, fetch.l2, xa, x_row_bytes, i0, yg,
                     ys);
      if (nn > kBothHalvesMaxRows)
        kTiles[nn - 1](nbk, group, 1, nullptr, fetch.l2, xa, x_row_bytes, i0, yg, ys);
    }
  }
}

// Plain k-quant rows (weights not laid out): each group of 16 (a part group padded with its last
// row) laid out in scratch by kRepack, then GemmKx16Avx2's tiles; rows past the matrix are not
// stored. A fallback for the same bits, not a fast path.
template <const auto& kTiles, size_t kSuperBytes, size_t (*kXRowBytes)(int64_t), typename Block,
          void (*kRepack)(const Block* const[16], int64_t, void*)>
void GemmKPlainAvx2(int64_t k, const void* w, size_t ws, int64_t rows, const void* xp, int64_t n,
                    float* y, int64_t ys) {
  const int64_t nbk = k / kQK;
  thread_local std::vector<char> laid;
  thread_local std::vector<float> part;
  laid.resize(static_cast<size_t>(nbk) * kSuperBytes);
  part.resize(static_cast<size_t>(n) * 16);
  for (int64_t r0 = 0; r0 < rows; r0 += 16) {
    const int nr = static_cast<int>(std::min<int64_t>(16, rows - r0));
    const Block* src[16];
    for (int e = 0; e < 16; ++e) {
      src[e] = reinterpret_cast<const Block*>(static_cast<const char*>(w) +
                                              (r0 + std::min(e, nr - 1)) * ws);
    }
    kRepack(src, nbk, laid.data());
    GemmKx16Avx2<kTiles, kSuperBytes, kXRowBytes>(k, laid.data(), 0, 16, xp, n, part.data(), 16);
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(y + i * ys + r0, part.data() + i * 16, nr * sizeof(float));
    }
  }
}

}  // namespace

// Only where the AVX2 table runs (the CPU and PDSERVE_CPU_ISA; kernels.h).
static bool Avx2Runs() {
  static const bool runs = &SelectKernels(/*force_scalar=*/false) == Avx2Kernels();
  return runs;
}

const GroupedKernels* Q8_0OwnOrderAvx2() {
  return Avx2Runs() ? &kOwnOrderKernels<&GemmPlainAvx2<X16::kQ8_0>> : nullptr;
}

const GroupedKernels* Q8_0x16OwnOrderAvx2() {
  return Avx2Runs() ? &kOwnOrderKernels<&GemmX16Avx2<X16::kQ8_0>> : nullptr;
}

const GroupedKernels* Q5_0OwnOrderAvx2() {
  return Avx2Runs() ? &kOwnOrderKernels<&GemmPlainAvx2<X16::kQ5_0>> : nullptr;
}

const GroupedKernels* Q5_0x16OwnOrderAvx2() {
  return Avx2Runs() ? &kOwnOrderKernels<&GemmX16Avx2<X16::kQ5_0>> : nullptr;
}

const GroupedKernels* Q4_KOwnOrderAvx2() {
  return Avx2Runs() ? &kOwnOrderQ4KKernels<
                          &GemmKPlainAvx2<kTilesQ4K, kQ4_Kx16SuperBytes, &Q4_KOwnXRowBytes,
                                          BlockQ4_K, &RepackQ4_Kx16Group>>
                    : nullptr;
}

const GroupedKernels* Q4_Kx16OwnOrderAvx2() {
  return Avx2Runs()
             ? &kOwnOrderQ4KKernels<&GemmKx16Avx2<kTilesQ4K, kQ4_Kx16SuperBytes, &Q4_KOwnXRowBytes>>
             : nullptr;
}

}  // namespace pd::engine::cpu

#else

namespace pd::engine::cpu {
const GroupedKernels* Q8_0OwnOrderAvx2() { return nullptr; }
const GroupedKernels* Q8_0x16OwnOrderAvx2() { return nullptr; }
const GroupedKernels* Q5_0OwnOrderAvx2() { return nullptr; }
const GroupedKernels* Q5_0x16OwnOrderAvx2() { return nullptr; }
const GroupedKernels* Q4_KOwnOrderAvx2() { return nullptr; }
const GroupedKernels* Q4_Kx16OwnOrderAvx2() { return nullptr; }
}  // namespace pd::engine::cpu

#endif
