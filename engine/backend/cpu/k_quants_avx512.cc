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

// The 256-bit VNNI tiles' conditions (AVX512F + VL + VNNI, ZMM state enabled by the OS,
// PDSERVE_CPU_NO_VNNI unset; avx512_vnni.cc), plus AVX512BW for the 512-bit byte and word ops.
bool CpuHasZmmKQuants() { return Q8_0TileVnni() != nullptr && __builtin_cpu_supports("avx512bw"); }

}  // namespace

ZmmKQuantTiles ZmmKQuantTilesIfSupported() {
  static const bool ok = CpuHasZmmKQuants();
  if (!ok) return {};
  return {&Q2KRepackTable<2>::Gemm, &Q2KRepackTable<1>::Gemm, &GemmQ3KZmm};
}

}  // namespace pd::engine::cpu

#else

namespace pd::engine::cpu {
ZmmKQuantTiles ZmmKQuantTilesIfSupported() { return {}; }
}  // namespace pd::engine::cpu

#endif
