// Q2_K and Q3_K decode tiles on 512-bit registers (AVX512F + BW + VL + VNNI). This file alone is
// compiled with those flags (plus AVX2/FMA/F16C); its kernels run only when CPUID reports them
// (Q2KRepackTilesZmm(), Q3KTileZmm() return nullptr otherwise). Like kernels_avx2.cc it calls no
// inline function from shared headers.
//
// The AVX2 tiles (k_quants_avx2.cc) spend most of their time unpacking 2-bit fields and applying
// sub-block scales, 32 weights per instruction. Here one ZMM holds two code vectors: the low 256
// bits code vector kk (weights 32kk .. 32kk+31 of the super-block) and the high 256 bits code
// vector 4 + kk (weights 128 + 32kk ..), the same shift and mask unpacking both, and VPDPWSSD
// applies the int16 sub-block scales and accumulates in one instruction. The integer sums per
// lane are exactly the AVX2 tiles' (integer additions in another grouping), and the F32 steps are
// theirs, so the results are the same bits (tests/engine/backend/k_quant_kernels_test.cc).
#include "engine/backend/cpu/kernels.h"

#if defined(__x86_64__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && \
    defined(__AVX512VL__) && defined(__F16C__)

#include <immintrin.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "engine/quant/k_quants.h"

namespace pd::engine::cpu {
namespace {

#define PD_ZMM_INLINE __attribute__((always_inline)) inline
#define PD_ZMM_UNROLL _Pragma("GCC unroll 8")

// Sums of each of four vectors' 8 int32 lanes: [sum a, sum b, sum c, sum d].
PD_ZMM_INLINE __m128i HSum4Zmm(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i ab = _mm256_hadd_epi32(a, b), cd = _mm256_hadd_epi32(c, d);
  const __m256i abcd = _mm256_hadd_epi32(ab, cd);
  return _mm_add_epi32(_mm256_castsi256_si128(abcd), _mm256_extracti128_si256(abcd, 1));
}
// The same for four 128-bit vectors (4 lanes each).
PD_ZMM_INLINE __m128i HSum4Xmm(__m128i a, __m128i b, __m128i c, __m128i d) {
  return _mm_hadd_epi32(_mm_hadd_epi32(a, b), _mm_hadd_epi32(c, d));
}

// pshufb indices (per 128-bit lane) that turn 16 scale bytes, broadcast to all four lanes, into
// int16 lanes: for code vector pair kk, 128-bit lane L of the ZMM covers sub-block 2kk + L
// (L < 2, code vector kk) or 8 + 2kk + (L - 2) (code vector 4 + kk); each of its eight int16
// lanes gets that sub-block's byte, zero-extended (high = false: index 0x80 gives a zero high
// byte) or times 256 (high = true: the byte in the high half, sign-correct for signed bytes).
struct ScaleIdx {
  alignas(64) uint8_t idx[4][64];
};
constexpr ScaleIdx MakeScaleIdx(bool high) {
  ScaleIdx t{};
  for (int kk = 0; kk < 4; ++kk) {
    for (int lane = 0; lane < 4; ++lane) {
      const auto sub = static_cast<uint8_t>(lane < 2 ? 2 * kk + lane : 8 + 2 * kk + (lane - 2));
      for (int j = 0; j < 8; ++j) {
        t.idx[kk][16 * lane + 2 * j] = high ? 0x80 : sub;
        t.idx[kk][16 * lane + 2 * j + 1] = high ? sub : 0x80;
      }
    }
  }
  return t;
}
constexpr ScaleIdx kScaleIdx = MakeScaleIdx(false);
constexpr ScaleIdx kScaleIdx256 = MakeScaleIdx(true);

// Activations of code vectors kk and 4 + kk side by side, as the weights' ZMM holds them.
PD_ZMM_INLINE __m512i PairedActs(const BlockQ8_K* xb, int kk) {
  const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb->qs + 32 * kk));
  const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb->qs + 128 + 32 * kk));
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

// Q2_K in llama.cpp's repacked orders (kernels.h q2_k_repack_*; k_quants_avx2.cc TileQ2KRepack has
// the F32 steps): per (row, column) and super-block the ZMM accumulator's low 8 lanes sum the
// first half (sub-blocks 0-7, I_0) and its high 8 lanes the second (I_1); the mins' madd gives
// M_0 in lanes 0-3 and M_1 in lanes 4-7. kHalves == 2 (GEMM): one FMA per half; 1 (GEMV): one
// per super-block with I_0 + I_1 and M_0 + M_1; four rows share each 4-lane FMA.
template <int R, int C, int kHalves>
void TileQ2KRepackZmm(int64_t k, const char* w, size_t ws, const char* x, size_t xs, float* y,
                      int64_t ys) {
  static_assert(R <= 4, "one 4-lane accumulator per column holds the tile's rows");
  const int64_t nb = k / kQK;
  const __m512i m3 = _mm512_set1_epi8(3), m4 = _mm512_set1_epi8(0x0F);
  const __m128i m4x = _mm_set1_epi8(0x0F);
  __m128 acc[C], macc[C];
  PD_ZMM_UNROLL for (int c = 0; c < C; ++c) acc[c] = macc[c] = _mm_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const BlockQ8_K* xb[C];
    __m512i xv[C][4];
    PD_ZMM_UNROLL for (int c = 0; c < C; ++c) {
      xb[c] = reinterpret_cast<const BlockQ8_K*>(x + c * xs) + b;
      PD_ZMM_UNROLL for (int kk = 0; kk < 4; ++kk) xv[c][kk] = PairedActs(xb[c], kk);
    }
    // (d, dmin) of the four rows as f16 pairs in one register (filled lane by lane: storing them
    // to memory and loading four at once would stall on store forwarding every block).
    __m128i ddm = _mm_setzero_si128();
    __m512i isum[4][C];
    __m256i mins[4][C];
    PD_ZMM_UNROLL for (int r = R; r < 4; ++r) {
      PD_ZMM_UNROLL for (int c = 0; c < C; ++c) {
        isum[r][c] = _mm512_setzero_si512();
        mins[r][c] = _mm256_setzero_si256();
      }
    }
    PD_ZMM_UNROLL for (int r = 0; r < R; ++r) {
      const BlockQ2_K* wb = reinterpret_cast<const BlockQ2_K*>(w + r * ws) + b;
      // The same block of the next tile's rows (kernels_avx2_internal.h, PrefetchNextTile).
      _mm_prefetch(reinterpret_cast<const char*>(wb) + R * ws, _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(wb) + R * ws + 64, _MM_HINT_T1);
      const __m128i sb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb->scales));
      const __m512i scb = _mm512_and_si512(_mm512_broadcast_i32x4(sb), m4);
      // Mins (high nibbles) as int16, sub-blocks 0-7 in the low lane, 8-15 in the high one.
      const __m256i m16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sb, 4), m4x));
      uint32_t ddm_r;
      std::memcpy(&ddm_r, &wb->d, 4);  // d, then dmin
      ddm = _mm_mask_set1_epi32(ddm, static_cast<__mmask8>(1u << r), static_cast<int>(ddm_r));
      const __m512i q = _mm512_loadu_si512(wb->qs);
      __m512i part[C];
      PD_ZMM_UNROLL for (int c = 0; c < C; ++c) part[c] = _mm512_setzero_si512();
      PD_ZMM_UNROLL for (int kk = 0; kk < 4; ++kk) {
        const __m512i u = _mm512_and_si512(kk == 0 ? q : _mm512_srli_epi16(q, 2 * kk), m3);
        const __m512i s = _mm512_shuffle_epi8(
            scb, _mm512_load_si512(reinterpret_cast<const void*>(kScaleIdx.idx[kk])));
        PD_ZMM_UNROLL for (int c = 0; c < C; ++c) {
          part[c] = _mm512_dpwssd_epi32(part[c], _mm512_maddubs_epi16(u, xv[c][kk]), s);
        }
      }
      PD_ZMM_UNROLL for (int c = 0; c < C; ++c) {
        isum[r][c] = part[c];
        mins[r][c] = _mm256_madd_epi16(
            m16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb[c]->bsums)));
      }
    }
    // [d0 dmin0 d1 dmin1 ...] -> d0..d3 and dmin0..dmin3.
    const __m256 pairs = _mm256_cvtph_ps(ddm);
    const __m256 split = _mm256_permutevar8x32_ps(pairs, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
    const __m128 vdw = _mm256_castps256_ps128(split), vdminw = _mm256_extractf128_ps(split, 1);
    PD_ZMM_UNROLL for (int c = 0; c < C; ++c) {
      const __m128 dx = _mm_set1_ps(xb[c]->d);
      const __m128 d = _mm_mul_ps(vdw, dx), dmin = _mm_mul_ps(vdminw, dx);
      __m256i lo[4], hi[4];
      PD_ZMM_UNROLL for (int r = 0; r < 4; ++r) {
        lo[r] = _mm512_castsi512_si256(isum[r][c]);
        hi[r] = _mm512_extracti64x4_epi64(isum[r][c], 1);
      }
      if constexpr (kHalves == 1) {
        __m256i t[4];
        PD_ZMM_UNROLL for (int r = 0; r < 4; ++r) t[r] = _mm256_add_epi32(lo[r], hi[r]);
        const __m128i it = HSum4Zmm(t[0], t[1], t[2], t[3]);
        const __m128i im = HSum4Zmm(mins[0][c], mins[1][c], mins[2][c], mins[3][c]);
        acc[c] = _mm_fmadd_ps(_mm_cvtepi32_ps(it), d, acc[c]);
        macc[c] = _mm_fmadd_ps(_mm_cvtepi32_ps(im), dmin, macc[c]);
      } else {
        const __m128i i0 = HSum4Zmm(lo[0], lo[1], lo[2], lo[3]);
        const __m128i i1 = HSum4Zmm(hi[0], hi[1], hi[2], hi[3]);
        __m128i ml[4], mh[4];
        PD_ZMM_UNROLL for (int r = 0; r < 4; ++r) {
          ml[r] = _mm256_castsi256_si128(mins[r][c]);
          mh[r] = _mm256_extracti128_si256(mins[r][c], 1);
        }
        const __m128i m0 = HSum4Xmm(ml[0], ml[1], ml[2], ml[3]);
        const __m128i m1 = HSum4Xmm(mh[0], mh[1], mh[2], mh[3]);
        acc[c] = _mm_fmadd_ps(_mm_cvtepi32_ps(i0), d, acc[c]);
        macc[c] = _mm_fmadd_ps(_mm_cvtepi32_ps(m0), dmin, macc[c]);
        acc[c] = _mm_fmadd_ps(_mm_cvtepi32_ps(i1), d, acc[c]);
        macc[c] = _mm_fmadd_ps(_mm_cvtepi32_ps(m1), dmin, macc[c]);
      }
    }
  }
  PD_ZMM_UNROLL for (int c = 0; c < C; ++c) {
    alignas(16) float out[4];
    _mm_store_ps(out, _mm_sub_ps(acc[c], macc[c]));
    for (int r = 0; r < R; ++r) y[c * ys + r] = out[r];
  }
}

// Q3_K in gemm[kQ3_K]'s order (k_quants_avx2.cc TileQ3_K: codes u = low2 | high << 2, signed
// scales sc - 32 as int16 256 sc, 8 int32 lanes per block, offsets 4 bsum sc, one 8-lane FMA per
// block with d_w * d_x / 256, and the same final lane sum). The ZMM's two halves hold code
// vectors kk and 4 + kk (weights 32kk.. and 128 + 32kk..: qs bytes 0-31 and 32-63, hmask nibbles
// low and high); adding the halves gives the AVX2 tile's 8 lanes exactly.
struct Q3Tables {
  alignas(32) uint8_t widen256[32];      // 16 signed bytes -> int16 256 b, [b0..b7 | b8..b15]
  alignas(16) uint8_t spread[2][16];     // 4 hmask bits -> high bits at 2 and 6 (even / odd codes)
};
constexpr Q3Tables MakeQ3Tables() {
  Q3Tables t{};
  for (int i = 0; i < 16; ++i) {
    t.widen256[2 * (i % 8) + 16 * (i / 8)] = 0x80;
    t.widen256[2 * (i % 8) + 16 * (i / 8) + 1] = static_cast<uint8_t>(i);
  }
  for (int n = 0; n < 16; ++n) {
    t.spread[0][n] = static_cast<uint8_t>(((n & 1) << 2) | (((n >> 2) & 1) << 6));
    t.spread[1][n] = static_cast<uint8_t>((((n >> 1) & 1) << 2) | (((n >> 3) & 1) << 6));
  }
  return t;
}
constexpr Q3Tables kQ3 = MakeQ3Tables();

PD_ZMM_INLINE float HSumF32Zmm(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <int R, int C>
void TileQ3KZmm(int64_t k, const char* w, size_t ws, const char* x, size_t xs, float* y,
                int64_t ys) {
  const int64_t nb = k / kQK;
  const __m512i m33 = _mm512_set1_epi8(0x33), m7 = _mm512_set1_epi8(7);
  const __m512i m4z = _mm512_set1_epi8(0x0F);
  const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
  const __m256i k32 = _mm256_set1_epi8(32);
  const __m512i spread_e = _mm512_broadcast_i32x4(
      _mm_load_si128(reinterpret_cast<const __m128i*>(kQ3.spread[0])));
  const __m512i spread_o = _mm512_broadcast_i32x4(
      _mm_load_si128(reinterpret_cast<const __m128i*>(kQ3.spread[1])));
  const __m256i widen = _mm256_load_si256(reinterpret_cast<const __m256i*>(kQ3.widen256));
  const __m256i low_shift = _mm256_setr_epi32(0, 0, 4, 4, 0, 0, 4, 4);
  const __m256i high_shift = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
  __m256 acc[R][C];
  PD_ZMM_UNROLL for (int r = 0; r < R; ++r) {
    PD_ZMM_UNROLL for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < nb; ++b) {
    const BlockQ8_K* xb[C];
    __m512i xv[C][4];
    PD_ZMM_UNROLL for (int c = 0; c < C; ++c) {
      xb[c] = reinterpret_cast<const BlockQ8_K*>(x + c * xs) + b;
      PD_ZMM_UNROLL for (int kk = 0; kk < 4; ++kk) xv[c][kk] = PairedActs(xb[c], kk);
    }
    PD_ZMM_UNROLL for (int r = 0; r < R; ++r) {
      const BlockQ3_K* wb = reinterpret_cast<const BlockQ3_K*>(w + r * ws) + b;
      _mm_prefetch(reinterpret_cast<const char*>(wb) + R * ws, _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(wb) + R * ws + 64, _MM_HINT_T1);
      // Scales (TileQ3_K): signed bytes sc - 32, byte j = sub-block j, in both 128-bit lanes.
      int64_t a01;
      int32_t a2;
      std::memcpy(&a01, wb->scales, 8);
      std::memcpy(&a2, wb->scales + 8, 4);
      const __m256i low =
          _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi64x(a01), low_shift), m4);
      const __m256i high =
          _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(a2), high_shift), m2);
      const __m256i scb =
          _mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi32(high, 4)), k32);
      const __m256i sc256 = _mm256_shuffle_epi8(scb, widen);
      const __m512i scz = _mm512_broadcast_i64x4(scb);
      const __m256i hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb->hmask));
      const __m512i hn = _mm512_and_si512(
          _mm512_inserti64x4(_mm512_castsi256_si512(hm), _mm256_srli_epi16(hm, 4), 1), m4z);
      const __m512i q = _mm512_loadu_si512(wb->qs);
      const __m512i ze =
          _mm512_or_si512(_mm512_and_si512(q, m33), _mm512_shuffle_epi8(spread_e, hn));
      const __m512i zo = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(q, 2), m33),
                                         _mm512_shuffle_epi8(spread_o, hn));
      __m512i part[C];
      PD_ZMM_UNROLL for (int c = 0; c < C; ++c) part[c] = _mm512_setzero_si512();
      PD_ZMM_UNROLL for (int kk = 0; kk < 4; ++kk) {
        const __m512i z = kk % 2 == 0 ? ze : zo;
        const __m512i u = _mm512_and_si512(kk < 2 ? z : _mm512_srli_epi16(z, 4), m7);
        const __m512i s = _mm512_shuffle_epi8(
            scz, _mm512_load_si512(reinterpret_cast<const void*>(kScaleIdx256.idx[kk])));
        PD_ZMM_UNROLL for (int c = 0; c < C; ++c) {
          part[c] = _mm512_dpwssd_epi32(part[c], _mm512_maddubs_epi16(u, xv[c][kk]), s);
        }
      }
      const __m256 dw = _mm256_cvtph_ps(_mm_set1_epi16(static_cast<int16_t>(wb->d)));
      PD_ZMM_UNROLL for (int c = 0; c < C; ++c) {
        const __m256i lanes = _mm256_add_epi32(_mm512_castsi512_si256(part[c]),
                                               _mm512_extracti64x4_epi64(part[c], 1));
        const __m256i offs = _mm256_madd_epi16(
            sc256, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb[c]->bsums)));
        const __m256 d = _mm256_mul_ps(dw, _mm256_set1_ps(xb[c]->d * 0x1p-8f));
        acc[r][c] = _mm256_fmadd_ps(
            d, _mm256_cvtepi32_ps(_mm256_sub_epi32(lanes, _mm256_slli_epi32(offs, 2))),
            acc[r][c]);
      }
    }
  }
  PD_ZMM_UNROLL for (int r = 0; r < R; ++r) {
    PD_ZMM_UNROLL for (int c = 0; c < C; ++c) y[c * ys + r] = HSumF32Zmm(acc[r][c]);
  }
}

// ---- Q4_K (repacked GEMV order) and Q6_K (vec_dot order): decode rows ----------------------
//
// The AVX2 tiles (k_quants_avx2.cc TileQ4KRepackGemv, TileQ6_K) spend three instructions per 32
// weights and (row, column) pair (maddubs, madd with the sub-block scales, add), so a 4-column
// tile, a few decode sequences or a speculative step's rows, costs nearly four times one column.
// Here one ZMM holds 64 weights (two 32-weight code vectors) and MADDUBS + VPDPWSSD apply the
// int16 sub-block scales and accumulate: two instructions per 64 weights and pair. Each ZMM's
// codes cover 64 consecutive weights, so the activations are read in place, one 64-byte load.
// The weights are unpacked once per tile (four weight rows x up to four activation rows).
// Integer sums are exact, so only the grouping of integer additions differs from the AVX2 tiles;
// the F32 steps (conversion, scale products, FMAs, final lane sums) are theirs, so the results are
// the AVX2 tiles' bits (tests/engine/backend/k_quant_kernels_test.cc).

// pshufb indices (per 128-bit lane) that widen Q4_K scale bytes sc_0..sc_7 (the low 8 bytes of
// every lane) to int16 for the ZMM of sub-blocks 2p (lanes 0-1) and 2p + 1 (lanes 2-3).
struct Q4KScaleIdx {
  alignas(64) uint8_t idx[4][64];
};
constexpr Q4KScaleIdx MakeQ4KScaleIdx() {
  Q4KScaleIdx t{};
  for (int p = 0; p < 4; ++p) {
    for (int lane = 0; lane < 4; ++lane) {
      const auto sub = static_cast<uint8_t>(2 * p + lane / 2);
      for (int j = 0; j < 8; ++j) {
        t.idx[p][16 * lane + 2 * j] = sub;
        t.idx[p][16 * lane + 2 * j + 1] = 0x80;
      }
    }
  }
  return t;
}
constexpr Q4KScaleIdx kQ4KScaleIdx = MakeQ4KScaleIdx();

// vpermw indices for Q6_K: the ZMM of code vectors 2p and 2p + 1 covers sub-blocks 4p .. 4p + 3,
// one per 128-bit lane (16 weights = 8 int16 lanes after maddubs).
struct Q6KScaleIdx {
  alignas(64) uint16_t idx[4][32];
};
constexpr Q6KScaleIdx MakeQ6KScaleIdx() {
  Q6KScaleIdx t{};
  for (int p = 0; p < 4; ++p) {
    for (int i = 0; i < 32; ++i) t.idx[p][i] = static_cast<uint16_t>(4 * p + i / 8);
  }
  return t;
}
constexpr Q6KScaleIdx kQ6KScaleIdx = MakeQ6KScaleIdx();

// The block R rows further (the next tile's), as PrefetchNextTile does for the AVX2 tiles.
template <int R, size_t kBlockBytes>
PD_ZMM_INLINE void PrefetchNextTileZmm(const void* block, size_t ws) {
  const char* p = static_cast<const char*>(block) + R * ws;
  PD_ZMM_UNROLL for (size_t i = 0; i < (kBlockBytes + 63) / 64; ++i) {
    _mm_prefetch(p + 64 * i, _MM_HINT_T1);
  }
}

// Q4_K scales and mins (k_quants_avx2.cc DecodeScalesK4): sc_0..7 and m_0..7 as 8 bytes each
// (byte v = sub-block v).
PD_ZMM_INLINE void DecodeScalesK4Zmm(const uint8_t* scales, uint64_t* sc8, uint64_t* m8) {
  uint32_t a[3];
  std::memcpy(a, scales, 12);
  const uint32_t sc03 = a[0] & 0x3f3f3f3fu, m03 = a[1] & 0x3f3f3f3fu;
  const uint32_t sc47 = (a[2] & 0x0f0f0f0fu) | ((a[0] >> 2) & 0x30303030u);
  const uint32_t m47 = ((a[2] >> 4) & 0x0f0f0f0fu) | ((a[1] >> 2) & 0x30303030u);
  *sc8 = sc03 | uint64_t{sc47} << 32;
  *m8 = m03 | uint64_t{m47} << 32;
}

// Q4_K in llama.cpp's repacked GEMV order (TileQ4KRepackGemv: per super-block and pair one FMA
// of the exact scaled dot with d_w * d_x and one of the mins with dmin_w * d_x, four weight rows
// in the lanes of one 4-lane vector; y = acc - macc). ZMM p holds the low nibbles of qs[32p ..
// 32p + 31] (sub-block 2p, weights 64p ..) and their high nibbles (sub-block 2p + 1) after them:
// activations 64p .. 64p + 63. Per weight row and block: 12 ops to unpack, 4 scale shuffles, ~16
// scalar ops for scales and mins; per pair 8 (MADDUBS + VPDPWSSD per ZMM), the mins' madd, and
// a quarter of two 4-row lane sums (13 + 5 ops).
template <int R, int C>
void TileQ4KRepackGemvZmm(int64_t k, const char* w, size_t ws, const char* x, size_t xs,
                          float* y, int64_t ys) {
  static_assert(R <= 4, "one 4-lane accumulator per column holds the tile's rows");
  const int64_t nb = k / kQK;
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i nibble_shift = _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4);
  __m128 acc[C], macc[C];
  PD_ZMM_UNROLL for (int c = 0; c < C; ++c) acc[c] = macc[c] = _mm_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const BlockQ8_K* xb[C];
    PD_ZMM_UNROLL for (int c = 0; c < C; ++c) {
      xb[c] = reinterpret_cast<const BlockQ8_K*>(x + c * xs) + b;
    }
    __m128i ddm = _mm_setzero_si128();  // (d, dmin) f16 pairs of the four rows
    __m512i isum[4][C];
    // Each row's mins as int16 [m0 m0 m1 m1 .. m7 m7] (one per bsum), dotted after the rows.
    alignas(32) int16_t mdup[4][16] = {};
    PD_ZMM_UNROLL for (int r = 0; r < 4; ++r) {
      PD_ZMM_UNROLL for (int c = 0; c < C; ++c) isum[r][c] = _mm512_setzero_si512();
    }
    PD_ZMM_UNROLL for (int r = 0; r < R; ++r) {
      const BlockQ4_K* wb = reinterpret_cast<const BlockQ4_K*>(w + r * ws) + b;
      PrefetchNextTileZmm<R, sizeof(BlockQ4_K)>(wb, ws);
      uint64_t sc8, m8;
      DecodeScalesK4Zmm(wb->scales, &sc8, &m8);
      const __m512i scz = _mm512_set1_epi64(static_cast<int64_t>(sc8));
      const __m128i m8x = _mm_cvtsi64_si128(static_cast<int64_t>(m8));
      _mm256_store_si256(reinterpret_cast<__m256i*>(mdup[r]),
                         _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8x, m8x)));
      uint32_t ddm_r;
      std::memcpy(&ddm_r, &wb->d, 4);  // d, then dmin
      ddm = _mm_mask_set1_epi32(ddm, static_cast<__mmask8>(1u << r), static_cast<int>(ddm_r));
      PD_ZMM_UNROLL for (int p = 0; p < 4; ++p) {
        const __m512i q = _mm512_broadcast_i64x4(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb->qs + 32 * p)));
        const __m512i u = _mm512_and_si512(_mm512_srlv_epi64(q, nibble_shift), m4);
        const __m512i s = _mm512_shuffle_epi8(
            scz, _mm512_load_si512(reinterpret_cast<const void*>(kQ4KScaleIdx.idx[p])));
        PD_ZMM_UNROLL for (int c = 0; c < C; ++c) {
          const __m512i xv = _mm512_loadu_si512(xb[c]->qs + 64 * p);
          isum[r][c] = _mm512_dpwssd_epi32(isum[r][c], _mm512_maddubs_epi16(u, xv), s);
        }
      }
    }
    // [d0 dmin0 d1 dmin1 ...] -> d0..d3 and dmin0..dmin3.
    const __m256 pairs = _mm256_cvtph_ps(ddm);
    const __m256 split = _mm256_permutevar8x32_ps(pairs, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
    const __m128 vdw = _mm256_castps256_ps128(split), vdminw = _mm256_extractf128_ps(split, 1);
    PD_ZMM_UNROLL for (int c = 0; c < C; ++c) {
      const __m128 dx = _mm_set1_ps(xb[c]->d);
      const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb[c]->bsums));
      __m256i t[4], m[4];
      PD_ZMM_UNROLL for (int r = 0; r < 4; ++r) {
        t[r] = _mm256_add_epi32(_mm512_castsi512_si256(isum[r][c]),
                                _mm512_extracti64x4_epi64(isum[r][c], 1));
        m[r] = _mm256_madd_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(mdup[r])),
                                 bsums);
      }
      const __m128i it = HSum4Zmm(t[0], t[1], t[2], t[3]);
      const __m128i im = HSum4Zmm(m[0], m[1], m[2], m[3]);
      acc[c] = _mm_fmadd_ps(_mm_cvtepi32_ps(it), _mm_mul_ps(vdw, dx), acc[c]);
      macc[c] = _mm_fmadd_ps(_mm_cvtepi32_ps(im), _mm_mul_ps(vdminw, dx), macc[c]);
    }
  }
  PD_ZMM_UNROLL for (int c = 0; c < C; ++c) {
    alignas(16) float out[4];
    _mm_store_ps(out, _mm_sub_ps(acc[c], macc[c]));
    for (int r = 0; r < R; ++r) y[c * ys + r] = out[r];
  }
}

// ---- Q4_K in llama.cpp's repacked GEMM order: prompt rows ------------------------------------
//
// The order (TileQ4KRepackGemm, DotQ4_KRepack<1>): per super-block and pair p of sub-blocks the
// exact integer sums isum_p = sc_2p (codes . x) + sc_2p+1 (codes . x) and imin_p = m_2p bb_2p +
// m_2p+1 bb_2p+1 (bb_v = bsums 2v + 2v+1), then acc = fma(isum_p, d_w d_x, acc) and macc =
// fma(imin_p, dmin_w d_x, macc) for p = 0..3; y = acc - macc. The AVX2 tile needs one integer
// lane sum per (row, column, pair), which costs as much as its arithmetic. Here the four weight
// rows of the tile sit in the four 128-bit lanes of a ZMM (16 codes of one row each) and one
// column's 16 matching activations are broadcast to all four, so one VPDPBUSD does 16 weights x 4
// rows, and the lane sums of the four rows are shared: per column and pair, two VPDPBUSD per
// sub-block (int32 lanes of 8 products, |lane| <= 8 x 15 x 128 < 2^15), one VPDPWSSD per
// sub-block with (sc, 0) as int16 pairs (the lane's low half is its value), and after four pairs
// one in-lane transpose-add gives lane 4r + p = isum_p of row r. The mins come from one VPMADDWD
// of (m_2p, m_2p+1) per row against (bb_2p, bb_2p+1). Integer sums are exact, and the F32 steps
// are the tile's (d_w d_x as an F32 product, four FMAs per block in pair order), so the results
// are its bits (tests/engine/backend/k_quant_kernels_test.cc). Rows past R repeat row R - 1.

// pshufb indices (the same in every 128-bit lane) that put sub-block v's scale byte (byte v of
// the lane's low 8 bytes) in the low byte of each int32 lane and zero the rest.
struct Q4KGemmScaleIdx {
  alignas(64) uint8_t idx[8][64];
};
constexpr Q4KGemmScaleIdx MakeQ4KGemmScaleIdx() {
  Q4KGemmScaleIdx t{};
  for (int v = 0; v < 8; ++v) {
    for (int i = 0; i < 64; ++i) t.idx[v][i] = i % 4 == 0 ? static_cast<uint8_t>(v) : 0x80;
  }
  return t;
}
constexpr Q4KGemmScaleIdx kQ4KGemmScaleIdx = MakeQ4KGemmScaleIdx();

template <int R, int C>
void TileQ4KRepackGemmZmm(int64_t k, const char* w, size_t ws, const char* x, size_t xs, float* y,
                          int64_t ys) {
  static_assert(R <= 4, "one 128-bit lane per weight row");
  const int64_t nb = k / kQK;
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i d_idx = _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6);
  const __m512i dmin_idx = _mm512_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3, 5, 5, 5, 5, 7, 7, 7, 7);
  // Lane 4r of acc[c] / macc[c]: row r's accumulators for column c (the other lanes are unused).
  __m512 acc[C], macc[C];
  PD_ZMM_UNROLL for (int c = 0; c < C; ++c) acc[c] = macc[c] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const BlockQ4_K* wb[4];
    uint64_t sc8[4], m8[4];
    __m128i ddm = _mm_setzero_si128();  // (d, dmin) f16 pairs of the four rows
    PD_ZMM_UNROLL for (int r = 0; r < 4; ++r) {
      wb[r] = reinterpret_cast<const BlockQ4_K*>(w + (r < R ? r : R - 1) * ws) + b;
      if (r < R) PrefetchNextTileZmm<R, sizeof(BlockQ4_K)>(wb[r], ws);
      DecodeScalesK4Zmm(wb[r]->scales, &sc8[r], &m8[r]);
      uint32_t ddm_r;
      std::memcpy(&ddm_r, &wb[r]->d, 4);  // d, then dmin
      ddm = _mm_mask_set1_epi32(ddm, static_cast<__mmask8>(1u << r), static_cast<int>(ddm_r));
    }
    const __m512i scq =
        _mm512_set_epi64(0, static_cast<int64_t>(sc8[3]), 0, static_cast<int64_t>(sc8[2]), 0,
                         static_cast<int64_t>(sc8[1]), 0, static_cast<int64_t>(sc8[0]));
    // Lane 4r + p: row r's (m_2p, m_2p+1) as int16.
    const __m512i mq = _mm512_cvtepu8_epi16(
        _mm256_set_epi64x(static_cast<int64_t>(m8[3]), static_cast<int64_t>(m8[2]),
                          static_cast<int64_t>(m8[1]), static_cast<int64_t>(m8[0])));
    const __m512 ddmf = _mm512_castps256_ps512(_mm256_cvtph_ps(ddm));
    const __m512 dw = _mm512_permutexvar_ps(d_idx, ddmf);
    const __m512 dminw = _mm512_permutexvar_ps(dmin_idx, ddmf);
    // 16 code bytes at `off` of each row's qs, row r in lane r.
    auto quad = [&](int off) __attribute__((always_inline)) {
      __m512i v = _mm512_castsi128_si512(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb[0]->qs + off)));
      v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb[1]->qs + off)),
                             1);
      v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb[2]->qs + off)),
                             2);
      return _mm512_inserti32x4(
          v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb[3]->qs + off)), 3);
    };
    auto bcast = [](const int8_t* p) __attribute__((always_inline)) {
      return _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    };
    const BlockQ8_K* xb[C];
    PD_ZMM_UNROLL for (int c = 0; c < C; ++c) {
      xb[c] = reinterpret_cast<const BlockQ8_K*>(x + c * xs) + b;
    }
    // half[c]: pair 2q's sums until pair 2q + 1 joins them; red[c]: the transpose-add so far.
    __m512i half[C], red[C];
    PD_ZMM_UNROLL for (int p = 0; p < 4; ++p) {
      // qs[32p .. 32p + 31]: low nibbles are sub-block 2p, high nibbles sub-block 2p + 1.
      const __m512i raw0 = quad(32 * p), raw1 = quad(32 * p + 16);
      const __m512i lo0 = _mm512_and_si512(raw0, m4), lo1 = _mm512_and_si512(raw1, m4);
      const __m512i hi0 = _mm512_and_si512(_mm512_srli_epi16(raw0, 4), m4);
      const __m512i hi1 = _mm512_and_si512(_mm512_srli_epi16(raw1, 4), m4);
      const __m512i sc_lo = _mm512_shuffle_epi8(
          scq, _mm512_load_si512(reinterpret_cast<const void*>(kQ4KGemmScaleIdx.idx[2 * p])));
      const __m512i sc_hi = _mm512_shuffle_epi8(
          scq, _mm512_load_si512(reinterpret_cast<const void*>(kQ4KGemmScaleIdx.idx[2 * p + 1])));
      PD_ZMM_UNROLL for (int c = 0; c < C; ++c) {
        const int8_t* xp = xb[c]->qs + 64 * p;
        __m512i t0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo0, bcast(xp));
        t0 = _mm512_dpbusd_epi32(t0, lo1, bcast(xp + 16));
        __m512i t1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), hi0, bcast(xp + 32));
        t1 = _mm512_dpbusd_epi32(t1, hi1, bcast(xp + 48));
        const __m512i s =
            _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(_mm512_setzero_si512(), t0, sc_lo), t1, sc_hi);
        if (p % 2 == 0) {
          half[c] = s;
        } else {
          // Per lane r: [a0 + a2, b0 + b2, a1 + a3, b1 + b3] of pairs a = p - 1, b = p.
          const __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(half[c], s),
                                              _mm512_unpackhi_epi32(half[c], s));
          red[c] = p == 1 ? ab
                          : _mm512_add_epi32(_mm512_unpacklo_epi64(red[c], ab),
                                             _mm512_unpackhi_epi64(red[c], ab));
        }
      }
    }
    PD_ZMM_UNROLL for (int c = 0; c < C; ++c) {
      const __m512 vf = _mm512_cvtepi32_ps(red[c]);  // lane 4r + p: isum_p of row r
      const __m128i bb =
          _mm_hadd_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xb[c]->bsums)),
                         _mm_loadu_si128(reinterpret_cast<const __m128i*>(xb[c]->bsums + 8)));
      const __m512 mf = _mm512_cvtepi32_ps(_mm512_madd_epi16(mq, _mm512_broadcast_i32x4(bb)));
      const __m512 dx = _mm512_set1_ps(xb[c]->d);
      const __m512 d = _mm512_mul_ps(dw, dx), dmin = _mm512_mul_ps(dminw, dx);
      acc[c] = _mm512_fmadd_ps(vf, d, acc[c]);
      acc[c] = _mm512_fmadd_ps(_mm512_permute_ps(vf, 1), d, acc[c]);
      acc[c] = _mm512_fmadd_ps(_mm512_permute_ps(vf, 2), d, acc[c]);
      acc[c] = _mm512_fmadd_ps(_mm512_permute_ps(vf, 3), d, acc[c]);
      macc[c] = _mm512_fmadd_ps(mf, dmin, macc[c]);
      macc[c] = _mm512_fmadd_ps(_mm512_permute_ps(mf, 1), dmin, macc[c]);
      macc[c] = _mm512_fmadd_ps(_mm512_permute_ps(mf, 2), dmin, macc[c]);
      macc[c] = _mm512_fmadd_ps(_mm512_permute_ps(mf, 3), dmin, macc[c]);
    }
  }
  PD_ZMM_UNROLL for (int c = 0; c < C; ++c) {
    alignas(64) float out[16];
    _mm512_store_ps(out, _mm512_sub_ps(acc[c], macc[c]));
    for (int r = 0; r < R; ++r) y[c * ys + r] = out[4 * r];
  }
}

// Q6_K in gemm[kQ6_K]'s order (TileQ6_K: codes u = low4 | high2 << 4, offsets 32 sc bsum, 8 int32
// lanes per block, one 8-lane FMA per block with d_w * d_x, the HSum lane sum at the end). ZMM p
// holds code vectors 2p and 2p + 1 (activations 64p .. 64p + 63): for half h = p / 2, the low
// (p even) or high (p odd) nibbles of ql[64h .. 64h + 63] and bits of qh[32h .. 32h + 31]
// shifted into bits 4-5 by per-256-bit amounts. Adding its two 256-bit halves gives the AVX2
// tile's lane j (bytes 4j .. 4j + 3 of every code vector) exactly. Per weight row and block: 14
// ops to unpack, 4 scale permutes; per pair 8, plus 7 for the offsets and the FMA.
// kWide: llama.cpp's tiled order (TileQ6_K<.., true>, prompts of 8+ rows): the block's exact
// total t (the eight lanes summed), then acc = fma(float(t) * d_w, d_x, acc); four columns' totals
// share one lane-sum transpose and one 4-lane FMA (lane c = column c).
template <int R, int C, bool kWide>
void TileQ6KZmm(int64_t k, const char* w, size_t ws, const char* x, size_t xs, float* y,
                int64_t ys) {
  const int64_t nb = k / kQK;
  const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
  const __m512i shl_even = _mm512_setr_epi64(4, 4, 4, 4, 2, 2, 2, 2);  // code vectors 4h, 4h + 1
  const __m512i shr_odd = _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2);   // 4h + 2, 4h + 3
  __m256 acc[R][C];
  __m128 wacc[R];  // kWide: lane c = column c
  PD_ZMM_UNROLL for (int r = 0; r < R; ++r) {
    wacc[r] = _mm_setzero_ps();
    PD_ZMM_UNROLL for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < nb; ++b) {
    const BlockQ8_K* xb[C];
    alignas(16) float dx[4] = {};
    PD_ZMM_UNROLL for (int c = 0; c < C; ++c) {
      xb[c] = reinterpret_cast<const BlockQ8_K*>(x + c * xs) + b;
      if constexpr (kWide) dx[c] = xb[c]->d;
    }
    PD_ZMM_UNROLL for (int r = 0; r < R; ++r) {
      const BlockQ6_K* wb = reinterpret_cast<const BlockQ6_K*>(w + r * ws) + b;
      PrefetchNextTileZmm<R, sizeof(BlockQ6_K)>(wb, ws);
      const __m256i sc16 =
          _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb->scales)));
      const __m512i scz = _mm512_castsi256_si512(sc16);
      __m512i isum[C];
      PD_ZMM_UNROLL for (int c = 0; c < C; ++c) isum[c] = _mm512_setzero_si512();
      PD_ZMM_UNROLL for (int h = 0; h < 2; ++h) {
        const __m512i ql = _mm512_loadu_si512(wb->ql + 64 * h);
        const __m512i hq = _mm512_broadcast_i64x4(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb->qh + 32 * h)));
        PD_ZMM_UNROLL for (int odd = 0; odd < 2; ++odd) {
          const int p = 2 * h + odd;
          const __m512i lo4 = _mm512_and_si512(odd ? _mm512_srli_epi16(ql, 4) : ql, m4);
          const __m512i hb = odd ? _mm512_srlv_epi64(hq, shr_odd) : _mm512_sllv_epi64(hq, shl_even);
          const __m512i u = _mm512_or_si512(lo4, _mm512_and_si512(hb, m30));
          const __m512i s = _mm512_permutexvar_epi16(
              _mm512_load_si512(reinterpret_cast<const void*>(kQ6KScaleIdx.idx[p])), scz);
          PD_ZMM_UNROLL for (int c = 0; c < C; ++c) {
            const __m512i xv = _mm512_loadu_si512(xb[c]->qs + 64 * p);
            isum[c] = _mm512_dpwssd_epi32(isum[c], _mm512_maddubs_epi16(u, xv), s);
          }
        }
      }
      __m256i totals[4] = {};
      PD_ZMM_UNROLL for (int c = 0; c < C; ++c) {
        const __m256i lanes = _mm256_add_epi32(_mm512_castsi512_si256(isum[c]),
                                               _mm512_extracti64x4_epi64(isum[c], 1));
        const __m256i offs = _mm256_madd_epi16(
            sc16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb[c]->bsums)));
        const __m256i total = _mm256_sub_epi32(lanes, _mm256_slli_epi32(offs, 5));
        if constexpr (kWide) {
          totals[c] = total;
        } else {
          // TileQ6_K's BlockScale and AccumulateBlock: f32(d_w) * d_x, then one FMA per lane.
          const __m256 d =
              _mm256_mul_ps(_mm256_cvtph_ps(_mm_set1_epi16(static_cast<int16_t>(wb->d))),
                            _mm256_set1_ps(xb[c]->d));
          acc[r][c] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(total), acc[r][c]);
        }
      }
      if constexpr (kWide) {
        const __m128i t = HSum4Zmm(totals[0], totals[1], totals[2], totals[3]);
        const __m128 res = _mm_mul_ps(_mm_cvtepi32_ps(t),
                                      _mm_cvtph_ps(_mm_set1_epi16(static_cast<int16_t>(wb->d))));
        wacc[r] = _mm_fmadd_ps(res, _mm_load_ps(dx), wacc[r]);
      }
    }
  }
  PD_ZMM_UNROLL for (int r = 0; r < R; ++r) {
    if constexpr (kWide) {
      alignas(16) float out[4];
      _mm_store_ps(out, wacc[r]);
      PD_ZMM_UNROLL for (int c = 0; c < C; ++c) y[c * ys + r] = out[c];
    } else {
      PD_ZMM_UNROLL for (int c = 0; c < C; ++c) y[c * ys + r] = HSumF32Zmm(acc[r][c]);
    }
  }
}

using TileImplZmm = void (*)(int64_t, const char*, size_t, const char*, size_t, float*, int64_t);

template <int kHalves>
struct Q2KRepackTable {
  template <int R, int C>
  static constexpr TileImplZmm F = &TileQ2KRepackZmm<R, C, kHalves>;
  static constexpr TileImplZmm kFns[4][4] = {
      {F<1, 1>, F<1, 2>, F<1, 3>, F<1, 4>},
      {F<2, 1>, F<2, 2>, F<2, 3>, F<2, 4>},
      {F<3, 1>, F<3, 2>, F<3, 3>, F<3, 4>},
      {F<4, 1>, F<4, 2>, F<4, 3>, F<4, 4>},
  };
  static void Gemm(int64_t k, const void* w, size_t w_stride, int nr, const void* x,
                   size_t x_stride, int nc, float* y, int64_t y_stride) {
    kFns[nr - 1][nc - 1](k, static_cast<const char*>(w), w_stride, static_cast<const char*>(x),
                         x_stride, y, y_stride);
  }
};
template <int R, int C>
constexpr TileImplZmm kQ3F = &TileQ3KZmm<R, C>;
constexpr TileImplZmm kQ3Fns[4][4] = {
    {kQ3F<1, 1>, kQ3F<1, 2>, kQ3F<1, 3>, kQ3F<1, 4>},
    {kQ3F<2, 1>, kQ3F<2, 2>, kQ3F<2, 3>, kQ3F<2, 4>},
    {kQ3F<3, 1>, kQ3F<3, 2>, kQ3F<3, 3>, kQ3F<3, 4>},
    {kQ3F<4, 1>, kQ3F<4, 2>, kQ3F<4, 3>, kQ3F<4, 4>},
};
void GemmQ3KZmm(int64_t k, const void* w, size_t w_stride, int nr, const void* x,
                size_t x_stride, int nc, float* y, int64_t y_stride) {
  kQ3Fns[nr - 1][nc - 1](k, static_cast<const char*>(w), w_stride, static_cast<const char*>(x),
                         x_stride, y, y_stride);
}
static_assert(kGemmTileW == 4 && kGemmTileX == 4, "the tables list 4x4 instantiations");
// Every R x C instantiation of a tile template and the GemmTileFn that dispatches on nr, nc.
template <template <int, int> class T>
struct ZmmTable {
  static constexpr TileImplZmm kFns[4][4] = {
      {T<1, 1>::Fn, T<1, 2>::Fn, T<1, 3>::Fn, T<1, 4>::Fn},
      {T<2, 1>::Fn, T<2, 2>::Fn, T<2, 3>::Fn, T<2, 4>::Fn},
      {T<3, 1>::Fn, T<3, 2>::Fn, T<3, 3>::Fn, T<3, 4>::Fn},
      {T<4, 1>::Fn, T<4, 2>::Fn, T<4, 3>::Fn, T<4, 4>::Fn},
  };
  static void Gemm(int64_t k, const void* w, size_t w_stride, int nr, const void* x,
                   size_t x_stride, int nc, float* y, int64_t y_stride) {
    kFns[nr - 1][nc - 1](k, static_cast<const char*>(w), w_stride, static_cast<const char*>(x),
                         x_stride, y, y_stride);
  }
};
// The same tiles for exactly kGemmTileX + 1 columns (Kernels::q4_k_repack_gemv5, q6_k5). Their
// sums (Q4_K: 20 ZMM; Q6_K: 20 YMM accumulators and 5 ZMM) crowd the register file and the
// compiler spills a few more values than at four columns (stack stores in the code: Q4_K 26
// against 19, Q6_K 39 against 21), yet one pass beats 4 + 1 (gemv_bench rows/q4_K/5/1 439-461 ->
// 345-350 us, rows/q6_K/5/1 589-594 -> 422-425 us).
template <template <int, int> class T>
struct ZmmTable5 {
  static constexpr int kCols = kGemmTileX + 1;
  static constexpr TileImplZmm kFns[4] = {T<1, kCols>::Fn, T<2, kCols>::Fn, T<3, kCols>::Fn,
                                          T<4, kCols>::Fn};
  static void Gemm(int64_t k, const void* w, size_t w_stride, int nr, const void* x,
                   size_t x_stride, int nc, float* y, int64_t y_stride) {
    (void)nc;  // kCols by contract
    kFns[nr - 1](k, static_cast<const char*>(w), w_stride, static_cast<const char*>(x), x_stride, y,
                 y_stride);
  }
};
template <int R, int C>
struct Q4KRepackGemvZmm {
  static constexpr TileImplZmm Fn = &TileQ4KRepackGemvZmm<R, C>;
};
template <int R, int C>
struct Q4KRepackGemmZmm {
  static constexpr TileImplZmm Fn = &TileQ4KRepackGemmZmm<R, C>;
};
template <int R, int C>
struct Q6KZmm {
  static constexpr TileImplZmm Fn = &TileQ6KZmm<R, C, false>;
};
template <int R, int C>
struct Q6KWideZmm {
  static constexpr TileImplZmm Fn = &TileQ6KZmm<R, C, true>;
};

// The 256-bit VNNI tiles' conditions (AVX512F + VL + VNNI, ZMM state enabled by the OS,
// PDSERVE_CPU_NO_VNNI unset; avx512_vnni.cc), plus AVX512BW for the 512-bit byte and word ops.
PD_NO_AVX512 bool CpuHasZmmKQuants() {
  return Q8_0TileVnni() != nullptr && __builtin_cpu_supports("avx512bw");
}

}  // namespace

PD_NO_AVX512 ZmmKQuantTiles ZmmKQuantTilesIfSupported() {
  static const bool ok = CpuHasZmmKQuants();
  if (!ok) return {};
  return {.q2_k_repack_gemm = &Q2KRepackTable<2>::Gemm,
          .q2_k_repack_gemv = &Q2KRepackTable<1>::Gemm,
          .q3_k = &GemmQ3KZmm,
          .q4_k_repack_gemv = &ZmmTable<Q4KRepackGemvZmm>::Gemm,
          .q6_k = &ZmmTable<Q6KZmm>::Gemm,
          .q4_k_repack_gemm = &ZmmTable<Q4KRepackGemmZmm>::Gemm,
          .q6_k_wide = &ZmmTable<Q6KWideZmm>::Gemm,
          .q4_k_repack_gemv5 = &ZmmTable5<Q4KRepackGemvZmm>::Gemm,
          .q6_k5 = &ZmmTable5<Q6KZmm>::Gemm};
}

}  // namespace pd::engine::cpu

#else

namespace pd::engine::cpu {
ZmmKQuantTiles ZmmKQuantTilesIfSupported() { return {}; }
}  // namespace pd::engine::cpu

#endif
