// AVX2 MatMul tiles of the k-quants (Q2_K .. Q6_K x Q8_K), in the orders of llama.cpp's vec_dot,
// tiled and repacked kernels (kernels.h). The 512-bit versions of some are in
// k_quants_avx512.cc, the table in kernels_avx2.cc.
// Compiled with -mavx2 -mfma -mf16c and run only after SelectKernels() has checked the CPU;
// like every AVX2 file it calls no inline function from shared headers (see
// kernels_avx2_internal.h).
//
// Scalar twins in kernels_scalar.cc; tests/engine/backend/k_quant_kernels_test.cc compares them.
//
// Integer parts are exact and equal to the scalar kernels'; only the F32 accumulation differs:
// each block's (super-block's) int32 sums stay in 8 int32 lanes, are converted to F32 and
// multiplied into 8 F32 accumulator lanes (fmadd with the broadcast d_w * d_x), and the lanes are
// added at the end. Weight codes are unpacked with shifts and byte masks (a 16-bit shift moves
// bits across bytes, but only into positions the mask then clears), dotted with the int8
// activations by maddubs (unsigned codes x signed activations -> int16 pairs, never saturating:
// at most 2 * 63 * 128 = 16128), and the int16 pair sums are multiplied by the sub-block scales
// and widened to int32 by madd. Signed codes are handled as unsigned codes u = q + offset with
// the offset's share (offset * sum of activations) subtracted via the activations' bsums.
//
// The loops are: super-block b, then weight row r (its scales decoded once), then the eight
// 32-weight vectors of the row (unpacked once), then the activation columns: each weight byte is
// read once per tile, each activation byte once per weight row from L1.
//
// Vector op counts (AVX2 instructions, per weight row and super-block, loads folded) are noted
// per format; per activation column add 3 per 32 weights (maddubs, madd, add) plus ~6 for scales.
#include "engine/backend/cpu/kernels.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <cstddef>
#include <cstring>
#include <type_traits>

#include "engine/backend/cpu/kernels_avx2_internal.h"

namespace pd::engine::cpu {
namespace {

struct alignas(32) ShuffleTable {
  uint8_t idx[8][32];
};

// kScaleBcast.idx[j]: pshufb indices that turn 8 bytes (repeated in each 128-bit lane) into 16
// int16 copies of byte j, zero-extended.
constexpr ShuffleTable MakeScaleBcast() {
  ShuffleTable t{};
  for (int j = 0; j < 8; ++j) {
    for (int i = 0; i < 32; i += 2) {
      t.idx[j][i] = static_cast<uint8_t>(j);
      t.idx[j][i + 1] = 0x80;
    }
  }
  return t;
}
constexpr ShuffleTable kScaleBcast = MakeScaleBcast();

// kPairBcast.idx[k] (k < 4): pshufb indices that turn [s0..s7 | s0..s7] (int16) into int16
// s_{2k} in the low 128-bit lane and s_{2k+1} in the high one: the scales of the two 16-weight
// sub-blocks one 32-byte code vector spans. Rows 4..7 unused.
constexpr ShuffleTable MakePairBcast() {
  ShuffleTable t{};
  for (int k = 0; k < 4; ++k) {
    for (int i = 0; i < 32; i += 2) {
      const int s = i < 16 ? 2 * k : 2 * k + 1;
      t.idx[k][i] = static_cast<uint8_t>(2 * s);
      t.idx[k][i + 1] = static_cast<uint8_t>(2 * s + 1);
    }
  }
  return t;
}
constexpr ShuffleTable kPairBcast = MakePairBcast();

// Row 0: pshufb indices that turn 8 bytes m0..m7 (repeated in each lane) into int16
// [m0 m0 m1 m1 m2 m2 m3 m3 | m4 m4 m5 m5 m6 m6 m7 m7], matching 16 bsums (two per 32 weights).
constexpr ShuffleTable MakeMinDup() {
  ShuffleTable t{};
  for (int i = 0; i < 32; i += 2) {
    t.idx[0][i] = static_cast<uint8_t>((i < 16 ? 0 : 4) + (i % 16) / 4);
    t.idx[0][i + 1] = 0x80;
  }
  return t;
}
constexpr ShuffleTable kMinDup = MakeMinDup();

// kPairBytes.idx[v]: pshufb indices that turn 16 byte scales s0..s15 (repeated in each 128-bit
// lane) into zero-extended int16 s_{2v} in the low lane and s_{2v+1} in the high one: the scales
// of the two 16-weight sub-blocks that 32-byte code vector v spans. kPairBytes256 does the same
// but puts the byte in the HIGH half of each int16 (value 256 s, correct for signed s).
constexpr ShuffleTable MakePairBytes(bool high) {
  ShuffleTable t{};
  for (int v = 0; v < 8; ++v) {
    for (int i = 0; i < 32; i += 2) {
      const uint8_t src = static_cast<uint8_t>(i < 16 ? 2 * v : 2 * v + 1);
      t.idx[v][i] = high ? 0x80 : src;
      t.idx[v][i + 1] = high ? src : 0x80;
    }
  }
  return t;
}
constexpr ShuffleTable kPairBytes = MakePairBytes(false);
constexpr ShuffleTable kPairBytes256 = MakePairBytes(true);

// Row 0: 16 byte values (repeated in each lane) -> int16 [b0 .. b7 | b8 .. b15], zero-extended;
// row 1: the same times 256 (byte in the high half), for signed bytes.
constexpr ShuffleTable MakeWiden() {
  ShuffleTable t{};
  for (int i = 0; i < 32; i += 2) {
    const uint8_t src = static_cast<uint8_t>(i / 2);  // lane 1 holds entries 8..15
    t.idx[0][i] = src;
    t.idx[0][i + 1] = 0x80;
    t.idx[1][i] = 0x80;
    t.idx[1][i + 1] = src;
  }
  return t;
}
constexpr ShuffleTable kWiden = MakeWiden();

// Q3_K high bits: for a nibble n of hmask bits (4 consecutive code vectors), row 0 maps n to a
// byte with bit 0 of n at bit 2 and bit 2 of n at bit 6, row 1 bits 1 and 3 likewise: the high
// bits of the code vectors whose 2-bit codes sit at bits 0-1 and 4-5 of (qs & 0x33), or of
// (qs >> 2 & 0x33). Each lane holds the 16-entry table.
constexpr ShuffleTable MakeHighBitSpread() {
  ShuffleTable t{};
  for (int i = 0; i < 32; ++i) {
    const int n = i % 16;
    t.idx[0][i] = static_cast<uint8_t>(((n & 1) << 2) | (((n >> 2) & 1) << 6));
    t.idx[1][i] = static_cast<uint8_t>((((n >> 1) & 1) << 2) | (((n >> 3) & 1) << 6));
  }
  return t;
}
constexpr ShuffleTable kHighBitSpread = MakeHighBitSpread();

inline __m256i Shuffle(__m256i v, const ShuffleTable& t, int row) {
  return _mm256_shuffle_epi8(v, _mm256_load_si256(reinterpret_cast<const __m256i*>(t.idx[row])));
}

// Shared tail of every k-quant row: acc += (d_w * d_x) * isum [- (dmin_w * d_x) * imin]. The
// products d_w * d_x and dmin_w * d_x are rounded as the scalar kernels round them.
PD_ALWAYS_INLINE inline void AccumulateBlock(__m256& acc, __m256 d, __m256i isum) {
  acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(isum), acc);
}
PD_ALWAYS_INLINE inline void AccumulateMins(__m256& acc, __m256 dmin, __m256i imin) {
  acc = _mm256_fnmadd_ps(dmin, _mm256_cvtepi32_ps(imin), acc);
}

// d_w * d_x broadcast, d_w an f16 (d_x may carry a power-of-two factor: the product is then
// exactly that factor times d_w * d_x).
PD_ALWAYS_INLINE inline __m256 BlockScale(uint16_t d, float dx) {
  return _mm256_mul_ps(_mm256_cvtph_ps(_mm_set1_epi16(static_cast<int16_t>(d))),
                       _mm256_set1_ps(dx));
}

// d_w * d_x and dmin_w * d_x broadcast, from the two adjacent f16 at `d_dmin` (one 32-bit load,
// one conversion); dx = [d_x * f, d_x, ...] with f a power of two that also scales d_w * d_x.
PD_ALWAYS_INLINE inline __m128 ActScales(float dx, float f = 1.f) {
  return _mm_setr_ps(dx * f, dx, 0.f, 0.f);
}
PD_ALWAYS_INLINE inline void BlockScales(const void* d_dmin, __m128 dx, __m256* d, __m256* dmin) {
  uint32_t bits;
  std::memcpy(&bits, d_dmin, 4);
  const __m128 s = _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(bits))), dx);
  *d = _mm256_broadcastss_ps(s);
  *dmin = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(s), _mm256_set1_epi32(1));
}

// [s0..s7 | s0..s7] and [s8..s15 | s8..s15] from 16 int16 scales, for kPairBcast.
PD_ALWAYS_INLINE inline void SplitScales(__m256i s16, __m256i* lo, __m256i* hi) {
  *lo = _mm256_permute4x64_epi64(s16, 0x44);
  *hi = _mm256_permute4x64_epi64(s16, 0xEE);
}

// Q2_K: code vector v = 4h + k (weights 32v .. 32v+31, sub-blocks 2v and 2v+1) is bits 2k..2k+1
// of qs[32h .. 32h+31]. Odd k are masked in place (qs & 0x0C, and (qs >> 4) & 0x0C: 4 times the
// code, one shift per 4 vectors instead of three) and even k get 4 times their scales, so every
// product is 4x and d_w * d_x / 4 (exact) scales the sum. The 16 scale bytes are broadcast to
// both lanes by the load; one pshufb per code vector widens its two scales to int16. Per row: 10
// ops to unpack, 8 scale shuffles, 5 for the scale/min bytes, 5 for d and dmin.
static_assert(offsetof(BlockQ2_K, dmin) == offsetof(BlockQ2_K, d) + 2);
template <int R, int C>
void TileQ2_K(int64_t k, const char* w, size_t ws, const char* x, size_t xs, float* y, int64_t ys) {
  const int64_t nb = k / kQK;
  const __m256i m3 = _mm256_set1_epi8(3), mc = _mm256_set1_epi8(0x0C);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    PD_UNROLL for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const BlockQ8_K* xb[C];
    __m128 dx[C];
    PD_UNROLL for (int c = 0; c < C; ++c) {
      xb[c] = reinterpret_cast<const BlockQ8_K*>(x + c * xs) + b;
      dx[c] = ActScales(xb[c]->d, 0.25f);
    }
    for (int r = 0; r < R; ++r) {
      const BlockQ2_K* wb = reinterpret_cast<const BlockQ2_K*>(w + r * ws) + b;
      PrefetchNextTile<R, sizeof(BlockQ2_K)>(wb, ws);
      const __m256i sb = _mm256_broadcastsi128_si256(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb->scales)));
      const __m256i scb = _mm256_and_si256(sb, m4);
      const __m256i scb4 = _mm256_slli_epi16(scb, 2);  // at most 60: stays in its byte
      const __m256i m16 = Shuffle(_mm256_and_si256(_mm256_srli_epi16(sb, 4), m4), kWiden, 0);
      __m256i isum[C];
      PD_UNROLL for (int c = 0; c < C; ++c) isum[c] = _mm256_setzero_si256();
      Unroll<2>([&](auto hc) PD_ALWAYS_INLINE {
        constexpr int h = decltype(hc)::value;
        const __m256i q = Load32(wb->qs + 32 * h);
        const __m256i q4 = _mm256_srli_epi16(q, 4);
        Unroll<4>([&](auto kc) PD_ALWAYS_INLINE {
          constexpr int kk = decltype(kc)::value, v = 4 * h + kk;
          const __m256i u = _mm256_and_si256(kk < 2 ? q : q4, kk % 2 == 0 ? m3 : mc);
          const __m256i s = Shuffle(kk % 2 == 0 ? scb4 : scb, kPairBytes, v);
          PD_UNROLL for (int c = 0; c < C; ++c) {
            const __m256i p = _mm256_maddubs_epi16(u, Load32(xb[c]->qs + 32 * v));
            isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(p, s));
          }
        });
      });
      PD_UNROLL for (int c = 0; c < C; ++c) {
        __m256 d, dmin;
        BlockScales(&wb->d, dx[c], &d, &dmin);
        // ggml_vec_dot_q2_K_q8_K's order: the min terms first, then the scaled sums.
        AccumulateMins(acc[r][c], dmin, _mm256_madd_epi16(m16, Load32(xb[c]->bsums)));
        AccumulateBlock(acc[r][c], d, isum[c]);
      }
    }
  }
  StoreTile<R, C>(acc, y, ys);
}

// Q3_K: u = low2 | high << 2 (0..7) and q = u - 4, so the dot is sum_i sc_i (P_i - 4 bsum_i).
// Unpacking works on half a block (h) at a time: the 2-bit codes at bits 0-1 and 4-5 of
// (qs & 0x33) get their high bits at bits 2 and 6 from a pshufb table on 4 hmask bits
// (kHighBitSpread), and likewise (qs >> 2 & 0x33), so each 3-bit code is one mask (and shift)
// away. The 6-bit scales are decoded with two 4-lane variable shifts (one lane per 4 sub-blocks)
// to signed bytes sc - 32, which one pshufb per code vector widens to int16 256 sc (byte in the
// high half: sign-correct); the 256 is taken out of the F32 scale, exactly. Per row: 29 ops to
// unpack, 8 scale shuffles, ~12 to decode the scales, 4 for d; per column 3 for the offset.
template <int R, int C>
void TileQ3_K(int64_t k, const char* w, size_t ws, const char* x, size_t xs, float* y, int64_t ys) {
  const int64_t nb = k / kQK;
  const __m256i m33 = _mm256_set1_epi8(0x33), m7 = _mm256_set1_epi8(7);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i spread_e = Load32(kHighBitSpread.idx[0]);
  const __m256i spread_o = Load32(kHighBitSpread.idx[1]);
  const __m256i low_shift = _mm256_setr_epi32(0, 0, 4, 4, 0, 0, 4, 4);
  const __m256i high_shift = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
  const __m256i m2 = _mm256_set1_epi8(3), k32 = _mm256_set1_epi8(32);
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    PD_UNROLL for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const BlockQ8_K* xb[C];
    PD_UNROLL for (int c = 0; c < C; ++c) {
      xb[c] = reinterpret_cast<const BlockQ8_K*>(x + c * xs) + b;
    }
    PD_UNROLL for (int r = 0; r < R; ++r) {
      const BlockQ3_K* wb = reinterpret_cast<const BlockQ3_K*>(w + r * ws) + b;
      PrefetchNextTile<R, sizeof(BlockQ3_K)>(wb, ws);
      // Scales, in both 128-bit lanes at once (the loads broadcast): 4-byte groups = sub-blocks
      // 0-3, 4-7, 8-11, 12-15. Low nibbles from bytes 0-3, 4-7, 0-3 >> 4, 4-7 >> 4; high pairs
      // from bytes 8-11 >> 0, 2, 4, 6.
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
      const __m256i sc256 = Shuffle(scb, kWiden, 1);
      const __m256i hm = Load32(wb->hmask);
      __m256i isum[C];
      PD_UNROLL for (int c = 0; c < C; ++c) isum[c] = _mm256_setzero_si256();
      Unroll<2>([&](auto hc) PD_ALWAYS_INLINE {
        constexpr int h = decltype(hc)::value;
        const __m256i q = Load32(wb->qs + 32 * h);
        const __m256i hn = _mm256_and_si256(h == 0 ? hm : _mm256_srli_epi16(hm, 4), m4);
        const __m256i ze = _mm256_or_si256(_mm256_and_si256(q, m33),
                                           _mm256_shuffle_epi8(spread_e, hn));
        const __m256i zo = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 2), m33),
                                           _mm256_shuffle_epi8(spread_o, hn));
        Unroll<4>([&](auto kc) PD_ALWAYS_INLINE {
          constexpr int kk = decltype(kc)::value, v = 4 * h + kk;
          const __m256i z = kk % 2 == 0 ? ze : zo;
          const __m256i u = _mm256_and_si256(kk < 2 ? z : _mm256_srli_epi16(z, 4), m7);
          const __m256i s = Shuffle(scb, kPairBytes256, v);
          PD_UNROLL for (int c = 0; c < C; ++c) {
            const __m256i p = _mm256_maddubs_epi16(u, Load32(xb[c]->qs + 32 * v));
            isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(p, s));
          }
        });
      });
      PD_UNROLL for (int c = 0; c < C; ++c) {
        const __m256i offs = _mm256_madd_epi16(sc256, Load32(xb[c]->bsums));
        AccumulateBlock(acc[r][c], BlockScale(wb->d, xb[c]->d * 0x1p-8f),
                        _mm256_sub_epi32(isum[c], _mm256_slli_epi32(offs, 2)));
      }
    }
  }
  StoreTile<R, C>(acc, y, ys);
}

PD_ALWAYS_INLINE inline int32_t HSumI32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

// Q4_K / Q5_K scales and mins (k_quants.h): with a0, a1, a2 the little-endian words of bytes
// 0-3, 4-7, 8-11: sc_0..3 = a0 & 63, m_0..3 = a1 & 63, sc_4..7 = (a2 & 15) | (a0 >> 6) << 4,
// m_4..7 = (a2 >> 4) | (a1 >> 6) << 4, bytewise. Returns sc_0..7 and m_0..7 as 8 bytes each.
PD_ALWAYS_INLINE inline void DecodeScalesK4(const uint8_t* s, uint64_t* sc, uint64_t* m) {
  uint32_t a[3];
  std::memcpy(a, s, 12);
  const uint32_t sc03 = a[0] & 0x3f3f3f3fu, m03 = a[1] & 0x3f3f3f3fu;
  const uint32_t sc47 = (a[2] & 0x0f0f0f0fu) | ((a[0] >> 2) & 0x30303030u);
  const uint32_t m47 = ((a[2] >> 4) & 0x0f0f0f0fu) | ((a[1] >> 2) & 0x30303030u);
  *sc = sc03 | uint64_t{sc47} << 32;
  *m = m03 | uint64_t{m47} << 32;
}

// The sub-block scales broadcast for kScaleBcast and the mins duplicated per bsum pair (kMinDup).
PD_ALWAYS_INLINE inline void ScalesMinsK4(const uint8_t* scales, __m256i* scv, __m256i* mdup) {
  uint64_t sc8, m8;
  DecodeScalesK4(scales, &sc8, &m8);
  *scv = _mm256_set1_epi64x(static_cast<int64_t>(sc8));
  *mdup = Shuffle(_mm256_set1_epi64x(static_cast<int64_t>(m8)), kMinDup, 0);
}

// Q4_K and Q5_K (kHigh): code vector v = 2p + t is sub-block v: nibble t of qs[32p .. 32p+31]
// (| bit v of qh[0..31] << 4 for Q5_K). Per row: 12 ops to unpack (+24 for Q5_K's fifth bit),
// 8 scale shuffles, ~14 scalar and 5 vector ops for scales and mins.
static_assert(offsetof(BlockQ4_K, dmin) == offsetof(BlockQ4_K, d) + 2);
static_assert(offsetof(BlockQ5_K, dmin) == offsetof(BlockQ5_K, d) + 2);
// kWide: llama.cpp's tiled order (kernels.h, gemm_wide): per super-block the lane sums of isum
// and of the mins, then r = float(s1) * d_w, r = fma(-dmin_w, float(s2), r), acc = fma(r, d_x, acc).
template <int R, int C, bool kHigh, typename Block, bool kWide = false>
void TileQ45K(int64_t k, const char* w, size_t ws, const char* x, size_t xs, float* y,
              int64_t ys) {
  const int64_t nb = k / kQK;
  const __m256i m4 = _mm256_set1_epi8(0x0F), bit4 = _mm256_set1_epi8(0x10);
  __m256 acc[R][C];
  // The min terms in ggml_vec_dot_q4_K_q8_K's / q5_K's order: Q4_K four lanes (sub-block pairs)
  // in an accumulator of their own, Q5_K the exact total per super-block into one float.
  __m128 macc[R][C];
  float wacc[R][C] = {}, msum[R][C] = {};
  for (int r = 0; r < R; ++r)
    PD_UNROLL for (int c = 0; c < C; ++c) {
      acc[r][c] = _mm256_setzero_ps();
      macc[r][c] = _mm_setzero_ps();
    }
  for (int64_t b = 0; b < nb; ++b) {
    const BlockQ8_K* xb[C];
    PD_UNROLL for (int c = 0; c < C; ++c) {
      xb[c] = reinterpret_cast<const BlockQ8_K*>(x + c * xs) + b;
    }
    for (int r = 0; r < R; ++r) {
      const Block* wb = reinterpret_cast<const Block*>(w + r * ws) + b;
      PrefetchNextTile<R, sizeof(Block)>(wb, ws);
      __m256i scv, mdup;
      ScalesMinsK4(wb->scales, &scv, &mdup);
      __m256i qh = _mm256_setzero_si256();
      if constexpr (kHigh) qh = Load32(wb->qh);
      __m256i isum[C];
      PD_UNROLL for (int c = 0; c < C; ++c) isum[c] = _mm256_setzero_si256();
      Unroll<4>([&](auto pc) PD_ALWAYS_INLINE {
        constexpr int p = decltype(pc)::value;
        const __m256i q = Load32(wb->qs + 32 * p);
        Unroll<2>([&](auto tc) PD_ALWAYS_INLINE {
          constexpr int t = decltype(tc)::value, v = 2 * p + t;
          __m256i u = _mm256_and_si256(t == 0 ? q : _mm256_srli_epi16(q, 4), m4);
          if constexpr (kHigh) {
            __m256i hb;  // bit v of qh moved to bit 4
            if constexpr (v < 4) {
              hb = _mm256_slli_epi16(qh, 4 - v);
            } else if constexpr (v == 4) {
              hb = qh;
            } else {
              hb = _mm256_srli_epi16(qh, v - 4);
            }
            u = _mm256_or_si256(u, _mm256_and_si256(hb, bit4));
          }
          const __m256i s = Shuffle(scv, kScaleBcast, v);
          PD_UNROLL for (int c = 0; c < C; ++c) {
            const __m256i prod = _mm256_maddubs_epi16(u, Load32(xb[c]->qs + 32 * v));
            isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(prod, s));
          }
        });
      });
      if constexpr (kWide) {
        const float dw = HalfToFloat(wb->d), dminw = HalfToFloat(wb->dmin);
        PD_UNROLL for (int c = 0; c < C; ++c) {
          const int32_t s1 = HSumI32(isum[c]);
          const int32_t s2 = HSumI32(_mm256_madd_epi16(mdup, Load32(xb[c]->bsums)));
          const float res = __builtin_fmaf(-dminw, static_cast<float>(s2),
                                           static_cast<float>(s1) * dw);
          wacc[r][c] = __builtin_fmaf(res, xb[c]->d, wacc[r][c]);
        }
      } else {
        PD_UNROLL for (int c = 0; c < C; ++c) {
          __m256 d, dmin;
          BlockScales(&wb->d, ActScales(xb[c]->d), &d, &dmin);
          AccumulateBlock(acc[r][c], d, isum[c]);
          // Lane t: m_t * (bsum_2t + bsum_2t+1), sub-block t's min term; pairs of them summed
          // (exactly) are ggml's four _mm_madd_epi16 lanes.
          const __m256i m8 = _mm256_madd_epi16(mdup, Load32(xb[c]->bsums));
          const __m128i m4 = _mm_hadd_epi32(_mm256_castsi256_si128(m8),
                                            _mm256_extracti128_si256(m8, 1));
          const float ndmin = -_mm256_cvtss_f32(dmin);
          if constexpr (kHigh) {
            const __m128i t = _mm_hadd_epi32(_mm_hadd_epi32(m4, m4), m4);
            msum[r][c] = __builtin_fmaf(ndmin, static_cast<float>(_mm_cvtsi128_si32(t)),
                                        msum[r][c]);
          } else {
            macc[r][c] = _mm_fmadd_ps(_mm_set1_ps(ndmin), _mm_cvtepi32_ps(m4), macc[r][c]);
          }
        }
      }
    }
  }
  if constexpr (kWide) {
    for (int r = 0; r < R; ++r)
      PD_UNROLL for (int c = 0; c < C; ++c) y[c * ys + r] = wacc[r][c];
  } else {
    for (int r = 0; r < R; ++r)
      PD_UNROLL for (int c = 0; c < C; ++c) {
        float m = msum[r][c];
        if constexpr (!kHigh) {
          __m128 t = _mm_add_ps(macc[r][c], _mm_movehl_ps(macc[r][c], macc[r][c]));
          m = _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));  // (m0 + m2) + (m1 + m3)
        }
        y[c * ys + r] = HSum(acc[r][c]) + m;
      }
  }
}

// The four lane sums of a, b, c, d (8 int32 lanes each) as one vector [sum a, sum b, sum c, sum d].
PD_ALWAYS_INLINE inline __m128i HSum4I32(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i ab = _mm256_hadd_epi32(a, b), cd = _mm256_hadd_epi32(c, d);
  const __m256i abcd = _mm256_hadd_epi32(ab, cd);  // per 128-bit half: [a b c d] partial sums
  return _mm_add_epi32(_mm256_castsi256_si128(abcd), _mm256_extracti128_si256(abcd, 1));
}

// Q4_K sub-blocks 2p and 2p + 1 (the two nibbles of qs[32p .. 32p + 31]) dotted with each
// column's activations and scaled by their sub-block scales: 8 int32 lanes per column, added to
// sums[c]. The integer part of both repacked-order tiles below.
template <int p, int C>
PD_ALWAYS_INLINE inline void AddQ4KPairDots(const BlockQ4_K* wb, const BlockQ8_K* const* xb,
                                            __m256i scv, __m256i* sums) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i q = Load32(wb->qs + 32 * p);
  Unroll<2>([&](auto tc) PD_ALWAYS_INLINE {
    constexpr int t = decltype(tc)::value, v = 2 * p + t;
    const __m256i u = _mm256_and_si256(t == 0 ? q : _mm256_srli_epi16(q, 4), m4);
    const __m256i s = Shuffle(scv, kScaleBcast, v);
    PD_UNROLL for (int c = 0; c < C; ++c) {
      const __m256i prod = _mm256_maddubs_epi16(u, Load32(xb[c]->qs + 32 * v));
      sums[c] = _mm256_add_epi32(sums[c], _mm256_madd_epi16(prod, s));
    }
  });
}

// Q4_K in llama.cpp's repacked GEMM order (DotQ4_KRepack<1> in kernels_scalar.cc): exact integer
// sums of scale x dot and min x bsum over each pair of sub-blocks, each added as fma(float(sum),
// d_w * d_x, acc) and fma(float(msum), dmin_w * d_x, macc); y = acc - macc. The integer parts are
// TileQ45K's; lanes over the tile's columns.
template <int R, int C>
void TileQ4KRepackGemm(int64_t k, const char* w, size_t ws, const char* x, size_t xs, float* y,
                   int64_t ys) {
  static_assert(C <= 4, "one 4-lane accumulator per weight row holds the tile's columns");
  const int64_t nb = k / kQK;
  // Lane c of acc[r] / macc[r]: the column-c accumulators (their FMA sequences are per lane).
  __m128 acc[R], macc[R];
  for (int r = 0; r < R; ++r) acc[r] = macc[r] = _mm_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const BlockQ8_K* xb[C];
    alignas(16) float dx[4] = {};
    PD_UNROLL for (int c = 0; c < C; ++c) {
      xb[c] = reinterpret_cast<const BlockQ8_K*>(x + c * xs) + b;
      dx[c] = xb[c]->d;
    }
    const __m128 vdx = _mm_load_ps(dx);
    for (int r = 0; r < R; ++r) {
      const BlockQ4_K* wb = reinterpret_cast<const BlockQ4_K*>(w + r * ws) + b;
      PrefetchNextTile<R, sizeof(BlockQ4_K)>(wb, ws);
      __m256i scv, mdup;
      ScalesMinsK4(wb->scales, &scv, &mdup);
      // d_w * d_x and dmin_w * d_x per column (products in F32, as llama.cpp's).
      const __m128 d = _mm_mul_ps(_mm_set1_ps(HalfToFloat(wb->d)), vdx);
      const __m128 dmin = _mm_mul_ps(_mm_set1_ps(HalfToFloat(wb->dmin)), vdx);
      // sums[c]: the four pair sums of column c; msums[c]: its min sums per pair.
      __m128i sums[4] = {}, msums[4] = {};
      __m256i pair[C][4];
      Unroll<4>([&](auto pc) PD_ALWAYS_INLINE {
        constexpr int p = decltype(pc)::value;
        __m256i sums_p[C];
        PD_UNROLL for (int c = 0; c < C; ++c) sums_p[c] = _mm256_setzero_si256();
        AddQ4KPairDots<p, C>(wb, xb, scv, sums_p);
        PD_UNROLL for (int c = 0; c < C; ++c) pair[c][p] = sums_p[c];
      });
      PD_UNROLL for (int c = 0; c < C; ++c) {
        sums[c] = HSum4I32(pair[c][0], pair[c][1], pair[c][2], pair[c][3]);
        // Lane v of mins: m_v * bsum_v. Pairs: [m0+m1, m2+m3, m4+m5, m6+m7].
        const __m256i mh = _mm256_hadd_epi32(_mm256_madd_epi16(mdup, Load32(xb[c]->bsums)),
                                             _mm256_setzero_si256());
        msums[c] = _mm_unpacklo_epi64(_mm256_castsi256_si128(mh), _mm256_extracti128_si256(mh, 1));
      }
      // Transpose to one vector per pair p (lane c = column c).
      auto transpose = [](__m128i (&v)[4]) PD_ALWAYS_INLINE {
        const __m128i t0 = _mm_unpacklo_epi32(v[0], v[1]), t1 = _mm_unpackhi_epi32(v[0], v[1]);
        const __m128i t2 = _mm_unpacklo_epi32(v[2], v[3]), t3 = _mm_unpackhi_epi32(v[2], v[3]);
        v[0] = _mm_unpacklo_epi64(t0, t2);
        v[1] = _mm_unpackhi_epi64(t0, t2);
        v[2] = _mm_unpacklo_epi64(t1, t3);
        v[3] = _mm_unpackhi_epi64(t1, t3);
      };
      transpose(sums);
      transpose(msums);
      for (int p = 0; p < 4; ++p) {
        acc[r] = _mm_fmadd_ps(_mm_cvtepi32_ps(sums[p]), d, acc[r]);
        macc[r] = _mm_fmadd_ps(_mm_cvtepi32_ps(msums[p]), dmin, macc[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    alignas(16) float out[4];
    _mm_store_ps(out, _mm_sub_ps(acc[r], macc[r]));
    PD_UNROLL for (int c = 0; c < C; ++c) y[c * ys + r] = out[c];
  }
}

// (d, dmin) of up to four rows' blocks, gathered in registers as f16 pairs (row r's 32 bits in
// packed[r / 2] at bit 32 (r % 2)), converted to d0..d3 and dmin0..dmin3. Four scalar stores and
// one vector load instead would stall on store forwarding once per block.
PD_ALWAYS_INLINE inline void AddDDmin(uint64_t (&packed)[2], int r, const uint16_t* d_dmin) {
  uint32_t v;
  std::memcpy(&v, d_dmin, 4);
  packed[r >> 1] |= uint64_t{v} << (32 * (r & 1));
}
PD_ALWAYS_INLINE inline void QuadDDmin(const uint64_t (&packed)[2], __m128* d, __m128* dmin) {
  const __m256 pairs = _mm256_cvtph_ps(
      _mm_set_epi64x(static_cast<int64_t>(packed[1]), static_cast<int64_t>(packed[0])));
  const __m256 split = _mm256_permutevar8x32_ps(pairs, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
  *d = _mm256_castps256_ps128(split);
  *dmin = _mm256_extractf128_ps(split, 1);
}

// Q4_K in llama.cpp's repacked GEMV order (one FMA per super-block: DotQ4_KRepack<4>): lanes over
// the tile's rows, so that one 4-way lane sum serves four outputs (decode has one column).
template <int R, int C>
void TileQ4KRepackGemv(int64_t k, const char* w, size_t ws, const char* x, size_t xs, float* y,
                       int64_t ys) {
  static_assert(R <= 4, "one 4-lane accumulator per column holds the tile's rows");
  const int64_t nb = k / kQK;
  __m128 acc[C], macc[C];
  PD_UNROLL for (int c = 0; c < C; ++c) acc[c] = macc[c] = _mm_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const BlockQ8_K* xb[C];
    PD_UNROLL for (int c = 0; c < C; ++c) {
      xb[c] = reinterpret_cast<const BlockQ8_K*>(x + c * xs) + b;
    }
    uint64_t ddm[2] = {0, 0};
    __m256i isum[4][C], mins[4][C];
    for (int r = 0; r < 4; ++r) {
      PD_UNROLL for (int c = 0; c < C; ++c) isum[r][c] = mins[r][c] = _mm256_setzero_si256();
    }
    PD_UNROLL for (int r = 0; r < R; ++r) {
      const BlockQ4_K* wb = reinterpret_cast<const BlockQ4_K*>(w + r * ws) + b;
      PrefetchNextTile<R, sizeof(BlockQ4_K)>(wb, ws);
      __m256i scv, mdup;
      ScalesMinsK4(wb->scales, &scv, &mdup);
      AddDDmin(ddm, r, &wb->d);
      Unroll<4>([&](auto pc) PD_ALWAYS_INLINE {
        AddQ4KPairDots<decltype(pc)::value, C>(wb, xb, scv, isum[r]);
      });
      PD_UNROLL for (int c = 0; c < C; ++c) {
        mins[r][c] = _mm256_madd_epi16(mdup, Load32(xb[c]->bsums));
      }
    }
    __m128 vdw, vdminw;
    QuadDDmin(ddm, &vdw, &vdminw);
    PD_UNROLL for (int c = 0; c < C; ++c) {
      const __m128 dx = _mm_set1_ps(xb[c]->d);
      const __m128i t = HSum4I32(isum[0][c], isum[1][c], isum[2][c], isum[3][c]);
      const __m128i m = HSum4I32(mins[0][c], mins[1][c], mins[2][c], mins[3][c]);
      acc[c] = _mm_fmadd_ps(_mm_cvtepi32_ps(t), _mm_mul_ps(vdw, dx), acc[c]);
      macc[c] = _mm_fmadd_ps(_mm_cvtepi32_ps(m), _mm_mul_ps(vdminw, dx), macc[c]);
    }
  }
  PD_UNROLL for (int c = 0; c < C; ++c) {
    alignas(16) float out[4];
    _mm_store_ps(out, _mm_sub_ps(acc[c], macc[c]));
    for (int r = 0; r < R; ++r) y[c * ys + r] = out[r];
  }
}

// Q2_K in the orders of llama.cpp's repacked x86 kernels (q2_K 8x8, used on AVX-512 CPUs for
// matrices with a multiple of 8 rows; kernels.h, q2_k_repack_*). The integer part is TileQ2_K's
// (4x products and scales); per half of a super-block (128 weights: code vectors 4h .. 4h+3,
// sub-blocks 8h .. 8h+7) each (row, column) gets its exact sums I_h = sum sc_j dot_j and
// M_h = sum m_j bsum_j, and then, four rows in one 4-lane vector:
//   kHalves == 2 (GEMM): acc = fma(I_h, d_w d_x, acc), macc = fma(M_h, dmin_w d_x, macc) per half;
//   kHalves == 1 (GEMV): the same once per super-block with I_0 + I_1 and M_0 + M_1;
// and the result is acc - macc.
template <int R, int C, int kHalves>
void TileQ2KRepack(int64_t k, const char* w, size_t ws, const char* x, size_t xs, float* y,
                   int64_t ys) {
  static_assert(R <= 4, "one 4-lane accumulator per column holds the tile's rows");
  const int64_t nb = k / kQK;
  const __m256i m3 = _mm256_set1_epi8(3), mc = _mm256_set1_epi8(0x0C);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  __m128 acc[C], macc[C];
  PD_UNROLL for (int c = 0; c < C; ++c) acc[c] = macc[c] = _mm_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const BlockQ8_K* xb[C];
    PD_UNROLL for (int c = 0; c < C; ++c) {
      xb[c] = reinterpret_cast<const BlockQ8_K*>(x + c * xs) + b;
    }
    uint64_t ddm[2] = {0, 0};
    // isum[h][r][c]: 8 lanes of 4x the half's scaled dots; mins[r][c]: lane i = m_2i bsum_2i +
    // m_2i+1 bsum_2i+1 (lanes 0-3: half 0, 4-7: half 1). Each row works on register copies and
    // stores them here once (indexing these arrays inside the row loop spilled every update).
    __m256i isum[2][4][C], mins[4][C];
    for (int r = R; r < 4; ++r) {
      PD_UNROLL for (int c = 0; c < C; ++c) {
        isum[0][r][c] = isum[1][r][c] = mins[r][c] = _mm256_setzero_si256();
      }
    }
    PD_UNROLL for (int r = 0; r < R; ++r) {
      const BlockQ2_K* wb = reinterpret_cast<const BlockQ2_K*>(w + r * ws) + b;
      PrefetchNextTile<R, sizeof(BlockQ2_K)>(wb, ws);
      const __m256i sb = _mm256_broadcastsi128_si256(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb->scales)));
      const __m256i scb = _mm256_and_si256(sb, m4);
      const __m256i scb4 = _mm256_slli_epi16(scb, 2);
      const __m256i m16 = Shuffle(_mm256_and_si256(_mm256_srli_epi16(sb, 4), m4), kWiden, 0);
      AddDDmin(ddm, r, &wb->d);
      Unroll<2>([&](auto hc) PD_ALWAYS_INLINE {
        constexpr int h = decltype(hc)::value;
        const __m256i q = Load32(wb->qs + 32 * h);
        const __m256i q4 = _mm256_srli_epi16(q, 4);
        __m256i part[C];
        PD_UNROLL for (int c = 0; c < C; ++c) part[c] = _mm256_setzero_si256();
        Unroll<4>([&](auto kc) PD_ALWAYS_INLINE {
          constexpr int kk = decltype(kc)::value, v = 4 * h + kk;
          const __m256i u = _mm256_and_si256(kk < 2 ? q : q4, kk % 2 == 0 ? m3 : mc);
          const __m256i sv = Shuffle(kk % 2 == 0 ? scb4 : scb, kPairBytes, v);
          PD_UNROLL for (int c = 0; c < C; ++c) {
            const __m256i pr = _mm256_maddubs_epi16(u, Load32(xb[c]->qs + 32 * v));
            part[c] = _mm256_add_epi32(part[c], _mm256_madd_epi16(pr, sv));
          }
        });
        PD_UNROLL for (int c = 0; c < C; ++c) isum[h][r][c] = part[c];
      });
      PD_UNROLL for (int c = 0; c < C; ++c) {
        mins[r][c] = _mm256_madd_epi16(m16, Load32(xb[c]->bsums));
      }
    }
    __m128 vdw, vdminw;
    QuadDDmin(ddm, &vdw, &vdminw);
    PD_UNROLL for (int c = 0; c < C; ++c) {
      const __m128 dx = _mm_set1_ps(xb[c]->d);
      const __m128 d = _mm_mul_ps(vdw, dx), dmin = _mm_mul_ps(vdminw, dx);
      if constexpr (kHalves == 1) {
        __m256i t4[4];
        for (int r = 0; r < 4; ++r) t4[r] = _mm256_add_epi32(isum[0][r][c], isum[1][r][c]);
        const __m128i t = _mm_srai_epi32(HSum4I32(t4[0], t4[1], t4[2], t4[3]), 2);
        const __m128i m = HSum4I32(mins[0][c], mins[1][c], mins[2][c], mins[3][c]);
        acc[c] = _mm_fmadd_ps(_mm_cvtepi32_ps(t), d, acc[c]);
        macc[c] = _mm_fmadd_ps(_mm_cvtepi32_ps(m), dmin, macc[c]);
      } else {
        Unroll<2>([&](auto hc) PD_ALWAYS_INLINE {
          constexpr int h = decltype(hc)::value;
          const __m128i t = _mm_srai_epi32(
              HSum4I32(isum[h][0][c], isum[h][1][c], isum[h][2][c], isum[h][3][c]), 2);
          __m128i mh[4];
          for (int r = 0; r < 4; ++r) {
            mh[r] = h == 0 ? _mm256_castsi256_si128(mins[r][c])
                           : _mm256_extracti128_si256(mins[r][c], 1);
          }
          const __m128i m = _mm_hadd_epi32(_mm_hadd_epi32(mh[0], mh[1]),
                                           _mm_hadd_epi32(mh[2], mh[3]));
          acc[c] = _mm_fmadd_ps(_mm_cvtepi32_ps(t), d, acc[c]);
          macc[c] = _mm_fmadd_ps(_mm_cvtepi32_ps(m), dmin, macc[c]);
        });
      }
    }
  }
  PD_UNROLL for (int c = 0; c < C; ++c) {
    alignas(16) float out[4];
    _mm_store_ps(out, _mm_sub_ps(acc[c], macc[c]));
    for (int r = 0; r < R; ++r) y[c * ys + r] = out[r];
  }
}

// Q6_K: u = low4 | high2 << 4 (0..63), q = u - 32, so the dot is sum_i sc_i (P_i - 32 bsum_i).
// Code vector v = 4h + k: low nibble (k < 2) or high nibble (k >= 2) of ql[64h + 32(k & 1) ..],
// bits 2k..2k+1 of qh[32h ..]. Per row: 34 ops to unpack, 8 scale shuffles + 3.
// kWide: llama.cpp's tiled order: acc = fma(float(s1) * d_w, d_x, acc), s1 the block's lane sum.
template <int R, int C, bool kWide = false>
void TileQ6_K(int64_t k, const char* w, size_t ws, const char* x, size_t xs, float* y, int64_t ys) {
  const int64_t nb = k / kQK;
  const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
  float wacc[R][C] = {};
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    PD_UNROLL for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const BlockQ8_K* xb[C];
    PD_UNROLL for (int c = 0; c < C; ++c) {
      xb[c] = reinterpret_cast<const BlockQ8_K*>(x + c * xs) + b;
    }
    for (int r = 0; r < R; ++r) {
      const BlockQ6_K* wb = reinterpret_cast<const BlockQ6_K*>(w + r * ws) + b;
      PrefetchNextTile<R, sizeof(BlockQ6_K)>(wb, ws);
      const __m256i sc16 =
          _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb->scales)));
      __m256i s_lo, s_hi;
      SplitScales(sc16, &s_lo, &s_hi);
      __m256i isum[C];
      PD_UNROLL for (int c = 0; c < C; ++c) isum[c] = _mm256_setzero_si256();
      Unroll<2>([&](auto hc) PD_ALWAYS_INLINE {
        constexpr int h = decltype(hc)::value;
        const __m256i la = Load32(wb->ql + 64 * h), lb = Load32(wb->ql + 64 * h + 32);
        const __m256i hq = Load32(wb->qh + 32 * h);
        Unroll<4>([&](auto kc) PD_ALWAYS_INLINE {
          constexpr int kk = decltype(kc)::value, v = 4 * h + kk;
          const __m256i l = (kk & 1) ? lb : la;
          const __m256i lo4 = _mm256_and_si256(kk < 2 ? l : _mm256_srli_epi16(l, 4), m4);
          __m256i hb;  // bits 2k..2k+1 of qh moved to bits 4..5
          if constexpr (kk == 0) {
            hb = _mm256_slli_epi16(hq, 4);
          } else if constexpr (kk == 1) {
            hb = _mm256_slli_epi16(hq, 2);
          } else if constexpr (kk == 2) {
            hb = hq;
          } else {
            hb = _mm256_srli_epi16(hq, 2);
          }
          const __m256i u = _mm256_or_si256(lo4, _mm256_and_si256(hb, m30));
          const __m256i s = Shuffle(h == 0 ? s_lo : s_hi, kPairBcast, kk);
          PD_UNROLL for (int c = 0; c < C; ++c) {
            const __m256i p = _mm256_maddubs_epi16(u, Load32(xb[c]->qs + 32 * v));
            isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(p, s));
          }
        });
      });
      PD_UNROLL for (int c = 0; c < C; ++c) {
        const __m256i offs = _mm256_madd_epi16(sc16, Load32(xb[c]->bsums));
        const __m256i total = _mm256_sub_epi32(isum[c], _mm256_slli_epi32(offs, 5));
        if constexpr (kWide) {
          const float res = static_cast<float>(HSumI32(total)) * HalfToFloat(wb->d);
          wacc[r][c] = __builtin_fmaf(res, xb[c]->d, wacc[r][c]);
        } else {
          AccumulateBlock(acc[r][c], BlockScale(wb->d, xb[c]->d), total);
        }
      }
    }
  }
  if constexpr (kWide) {
    for (int r = 0; r < R; ++r)
      PD_UNROLL for (int c = 0; c < C; ++c) y[c * ys + r] = wacc[r][c];
  } else {
    StoreTile<R, C>(acc, y, ys);
  }
}

template <int R, int C>
struct Q2KTile {
  static constexpr TileImpl Fn = &TileQ2_K<R, C>;
};
template <int R, int C>
struct Q2KRepackGemmTile {
  static constexpr TileImpl Fn = &TileQ2KRepack<R, C, 2>;
};
template <int R, int C>
struct Q2KRepackGemvTile {
  static constexpr TileImpl Fn = &TileQ2KRepack<R, C, 1>;
};
template <int R, int C>
struct Q3KTile {
  static constexpr TileImpl Fn = &TileQ3_K<R, C>;
};
template <int R, int C>
struct Q4KTile {
  static constexpr TileImpl Fn = &TileQ45K<R, C, false, BlockQ4_K>;
};
template <int R, int C>
struct Q4KRepackGemmTile {
  static constexpr TileImpl Fn = &TileQ4KRepackGemm<R, C>;
};
template <int R, int C>
struct Q4KRepackGemvTile {
  static constexpr TileImpl Fn = &TileQ4KRepackGemv<R, C>;
};
template <int R, int C>
struct Q5KTile {
  static constexpr TileImpl Fn = &TileQ45K<R, C, true, BlockQ5_K>;
};
template <int R, int C>
struct Q6KTile {
  static constexpr TileImpl Fn = &TileQ6_K<R, C>;
};
template <int R, int C>
struct Q4KWideTile {
  static constexpr TileImpl Fn = &TileQ45K<R, C, false, BlockQ4_K, true>;
};
template <int R, int C>
struct Q5KWideTile {
  static constexpr TileImpl Fn = &TileQ45K<R, C, true, BlockQ5_K, true>;
};
template <int R, int C>
struct Q6KWideTile {
  static constexpr TileImpl Fn = &TileQ6_K<R, C, true>;
};

// Q2_K repacked orders: the 512-bit tiles where the CPU has them, else the AVX2 ones.
template <int kHalves>
void GemmQ2KRepackDispatch(int64_t k, const void* w, size_t w_stride, int nr, const void* x,
                           size_t x_stride, int nc, float* y, int64_t y_stride) {
  static const GemmTileFn zmm = kHalves == 2 ? ZmmKQuantTilesIfSupported().q2_k_repack_gemm
                                             : ZmmKQuantTilesIfSupported().q2_k_repack_gemv;
  if (zmm != nullptr) return zmm(k, w, w_stride, nr, x, x_stride, nc, y, y_stride);
  using Tile = std::conditional_t<kHalves == 2, TileTable<Q2KRepackGemmTile>,
                                  TileTable<Q2KRepackGemvTile>>;
  Tile::Gemm(k, w, w_stride, nr, x, x_stride, nc, y, y_stride);
}

}  // namespace

GemmTileFn Q3KTileAvx2Only() { return &TileTable<Q3KTile>::Gemm; }
GemmTileFn Q4KRepackGemvTileAvx2Only() { return &TileTable<Q4KRepackGemvTile>::Gemm; }
GemmTileFn Q4KRepackGemmTileAvx2Only() { return &TileTable<Q4KRepackGemmTile>::Gemm; }
GemmTileFn Q6KWideTileAvx2Only() { return &TileTable<Q6KWideTile>::Gemm; }
GemmTileFn Q6KTileAvx2Only() { return &TileTable<Q6KTile>::Gemm; }

namespace avx2 {

void GemmQ3KDispatch(int64_t k, const void* w, size_t w_stride, int nr, const void* x,
                     size_t x_stride, int nc, float* y, int64_t y_stride) {
  static const GemmTileFn zmm = ZmmKQuantTilesIfSupported().q3_k;
  if (zmm != nullptr) return zmm(k, w, w_stride, nr, x, x_stride, nc, y, y_stride);
  TileTable<Q3KTile>::Gemm(k, w, w_stride, nr, x, x_stride, nc, y, y_stride);
}

void GemmQ2_K(int64_t k, const void* w, size_t w_stride, int nr, const void* x, size_t x_stride,
              int nc, float* y, int64_t y_stride) {
  TileTable<Q2KTile>::Gemm(k, w, w_stride, nr, x, x_stride, nc, y, y_stride);
}

void GemmQ4_K(int64_t k, const void* w, size_t w_stride, int nr, const void* x, size_t x_stride,
              int nc, float* y, int64_t y_stride) {
  TileTable<Q4KTile>::Gemm(k, w, w_stride, nr, x, x_stride, nc, y, y_stride);
}

void GemmQ5_K(int64_t k, const void* w, size_t w_stride, int nr, const void* x, size_t x_stride,
              int nc, float* y, int64_t y_stride) {
  TileTable<Q5KTile>::Gemm(k, w, w_stride, nr, x, x_stride, nc, y, y_stride);
}

void GemmQ6_K(int64_t k, const void* w, size_t w_stride, int nr, const void* x, size_t x_stride,
              int nc, float* y, int64_t y_stride) {
  static const GemmTileFn zmm = ZmmKQuantTilesIfSupported().q6_k;
  if (zmm != nullptr) return zmm(k, w, w_stride, nr, x, x_stride, nc, y, y_stride);
  TileTable<Q6KTile>::Gemm(k, w, w_stride, nr, x, x_stride, nc, y, y_stride);
}

void GemmQ4_KWide(int64_t k, const void* w, size_t w_stride, int nr, const void* x, size_t x_stride,
                  int nc, float* y, int64_t y_stride) {
  TileTable<Q4KWideTile>::Gemm(k, w, w_stride, nr, x, x_stride, nc, y, y_stride);
}

void GemmQ5_KWide(int64_t k, const void* w, size_t w_stride, int nr, const void* x, size_t x_stride,
                  int nc, float* y, int64_t y_stride) {
  TileTable<Q5KWideTile>::Gemm(k, w, w_stride, nr, x, x_stride, nc, y, y_stride);
}

void GemmQ6_KWide(int64_t k, const void* w, size_t w_stride, int nr, const void* x, size_t x_stride,
                  int nc, float* y, int64_t y_stride) {
  static const GemmTileFn zmm = ZmmKQuantTilesIfSupported().q6_k_wide;
  if (zmm != nullptr) return zmm(k, w, w_stride, nr, x, x_stride, nc, y, y_stride);
  TileTable<Q6KWideTile>::Gemm(k, w, w_stride, nr, x, x_stride, nc, y, y_stride);
}

void GemmQ4KRepackGemm(int64_t k, const void* w, size_t w_stride, int nr, const void* x,
                       size_t x_stride, int nc, float* y, int64_t y_stride) {
  static const GemmTileFn zmm = ZmmKQuantTilesIfSupported().q4_k_repack_gemm;
  if (zmm != nullptr) return zmm(k, w, w_stride, nr, x, x_stride, nc, y, y_stride);
  TileTable<Q4KRepackGemmTile>::Gemm(k, w, w_stride, nr, x, x_stride, nc, y, y_stride);
}

void GemmQ4KRepackGemv(int64_t k, const void* w, size_t w_stride, int nr, const void* x,
                       size_t x_stride, int nc, float* y, int64_t y_stride) {
  static const GemmTileFn zmm = ZmmKQuantTilesIfSupported().q4_k_repack_gemv;
  if (zmm != nullptr) return zmm(k, w, w_stride, nr, x, x_stride, nc, y, y_stride);
  TileTable<Q4KRepackGemvTile>::Gemm(k, w, w_stride, nr, x, x_stride, nc, y, y_stride);
}

// Five columns: the 512-bit tile, or columns 0-3 and then 4 through the tables above.
void GemmQ4KRepackGemv5(int64_t k, const void* w, size_t w_stride, int nr, const void* x,
                        size_t x_stride, int nc, float* y, int64_t y_stride) {
  static const GemmTileFn zmm = ZmmKQuantTilesIfSupported().q4_k_repack_gemv5;
  if (zmm != nullptr) return zmm(k, w, w_stride, nr, x, x_stride, nc, y, y_stride);
  GemmQ4KRepackGemv(k, w, w_stride, nr, x, x_stride, kGemmTileX, y, y_stride);
  GemmQ4KRepackGemv(k, w, w_stride, nr, static_cast<const char*>(x) + kGemmTileX * x_stride,
                    x_stride, nc - kGemmTileX, y + kGemmTileX * y_stride, y_stride);
}

void GemmQ6_K5(int64_t k, const void* w, size_t w_stride, int nr, const void* x, size_t x_stride,
               int nc, float* y, int64_t y_stride) {
  static const GemmTileFn zmm = ZmmKQuantTilesIfSupported().q6_k5;
  if (zmm != nullptr) return zmm(k, w, w_stride, nr, x, x_stride, nc, y, y_stride);
  GemmQ6_K(k, w, w_stride, nr, x, x_stride, kGemmTileX, y, y_stride);
  GemmQ6_K(k, w, w_stride, nr, static_cast<const char*>(x) + kGemmTileX * x_stride, x_stride,
           nc - kGemmTileX, y + kGemmTileX * y_stride, y_stride);
}

void GemmQ2KRepackGemm(int64_t k, const void* w, size_t w_stride, int nr, const void* x,
                       size_t x_stride, int nc, float* y, int64_t y_stride) {
  GemmQ2KRepackDispatch<2>(k, w, w_stride, nr, x, x_stride, nc, y, y_stride);
}

void GemmQ2KRepackGemv(int64_t k, const void* w, size_t w_stride, int nr, const void* x,
                       size_t x_stride, int nc, float* y, int64_t y_stride) {
  GemmQ2KRepackDispatch<1>(k, w, w_stride, nr, x, x_stride, nc, y, y_stride);
}
}  // namespace avx2
}  // namespace pd::engine::cpu

#else  // no AVX2 build

namespace pd::engine::cpu {
GemmTileFn Q3KTileAvx2Only() { return nullptr; }
GemmTileFn Q4KRepackGemvTileAvx2Only() { return nullptr; }
GemmTileFn Q4KRepackGemmTileAvx2Only() { return nullptr; }
GemmTileFn Q6KWideTileAvx2Only() { return nullptr; }
GemmTileFn Q6KTileAvx2Only() { return nullptr; }
}  // namespace pd::engine::cpu

#endif
