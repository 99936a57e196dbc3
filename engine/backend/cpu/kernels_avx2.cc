// AVX2 + FMA + F16C kernels. This file alone is compiled with -mavx2 -mfma -mf16c; its functions
// run only after SelectKernels() has checked the CPU. Everything here is in an anonymous
// namespace and calls no inline function from shared headers: an inline function instantiated
// in this file would be compiled with AVX2 and the linker could pick that copy for the whole
// program, which would then crash on a CPU without AVX2.
//
// Each kernel has a scalar twin in kernels_scalar.cc with the same contract; see kernels.h.
#include "engine/backend/cpu/kernels.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <immintrin.h>
#include <math.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

namespace pd::engine::cpu {
namespace {

inline float HSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline double HSum(__m256d v) {
  __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
  s = _mm_add_sd(s, _mm_unpackhi_pd(s, s));
  return _mm_cvtsd_f64(s);
}

inline float HalfToFloat(uint16_t h) { return _cvtsh_ss(h); }
inline uint16_t FloatToHalf(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}
inline float BfloatToFloat(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline __m256 LoadF16(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m256 LoadBf16(const uint16_t* p) {
  const __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}

// e^x for 8 floats; within a few ulps of expf for x in [-87.33, 88.37] (tested to 1e-6). Below that
// range it returns 0 (the true result is subnormal), above it +inf (the true result is within
// 2^-0.5 of FLT_MAX). NaN propagates. Range reduction x = n ln2 + r with ln2 split in two
// (Cody-Waite), then a degree-7 polynomial for e^r on |r| <= ln2/2.
inline __m256 Exp(__m256 x) {
  const __m256 kHi = _mm256_set1_ps(88.3762626647949f);
  const __m256 kLo = _mm256_set1_ps(-87.3365447504f);
  const __m256 xc = _mm256_min_ps(kHi, _mm256_max_ps(kLo, x));  // keeps NaN (second operand)
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, kLo, _CMP_LT_OQ));
  y = _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(x, kHi, _CMP_GT_OQ));
  return y;
}

// ---- MatMul tiles --------------------------------------------------------------------------
// R weight rows x C activation rows; R * C accumulators of 8 lanes, reduced at the end.
// Per 8 elements: R + C vector loads and R * C FMAs (16 flops each).

template <int R, int C>
void TileF32(int64_t k, const char* w, size_t ws, const char* x, size_t xs, float* y, int64_t ys) {
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    __m256 xv[C];
    for (int c = 0; c < C; ++c)
      xv[c] = _mm256_loadu_ps(reinterpret_cast<const float*>(x + c * xs) + i);
    for (int r = 0; r < R; ++r) {
      const __m256 wv = _mm256_loadu_ps(reinterpret_cast<const float*>(w + r * ws) + i);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(wv, xv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    const float* wr = reinterpret_cast<const float*>(w + r * ws);
    for (int c = 0; c < C; ++c) {
      const float* xc = reinterpret_cast<const float*>(x + c * xs);
      float s = HSum(acc[r][c]);
      for (int64_t j = i; j < k; ++j) s += wr[j] * xc[j];
      y[c * ys + r] = s;
    }
  }
}

// F16 and BF16 share one body: products of halves widened to F32, accumulated in F32.
template <int R, int C, __m256 (*Load)(const uint16_t*), float (*ToFloat)(uint16_t)>
void TileHalf(int64_t k, const char* w, size_t ws, const char* x, size_t xs, float* y, int64_t ys) {
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    __m256 xv[C];
    for (int c = 0; c < C; ++c) xv[c] = Load(reinterpret_cast<const uint16_t*>(x + c * xs) + i);
    for (int r = 0; r < R; ++r) {
      const __m256 wv = Load(reinterpret_cast<const uint16_t*>(w + r * ws) + i);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(wv, xv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    const uint16_t* wr = reinterpret_cast<const uint16_t*>(w + r * ws);
    for (int c = 0; c < C; ++c) {
      const uint16_t* xc = reinterpret_cast<const uint16_t*>(x + c * xs);
      float s = HSum(acc[r][c]);
      for (int64_t j = i; j < k; ++j) s += ToFloat(wr[j]) * ToFloat(xc[j]);
      y[c * ys + r] = s;
    }
  }
}

// Q8_0: per block and row pair, |w| (unsigned) times x with w's sign (signed) via maddubs gives
// 16 int16 pair sums (|127 * 128 * 2| < 2^15, so no saturation even for a -128 weight; our
// activations never hold -128), madd with ones gives 8 int32, which are scaled by d_w * d_x and
// accumulated in F32. Per block: 34 bytes per row read; per row pair 5 integer/float ops.
// Software prefetch of the next tile, as for the other formats: Gemma 3's tied head has rows of
// only 640 weights (680 bytes), too short for the hardware prefetchers; measured on that shape,
// one thread, busy machine: 5.1 -> 11.6 GB/s (8192-wide rows: 11.0 -> 14.1 GB/s).
template <int R, int C>
void TileQ8(int64_t k, const char* w, size_t ws, const char* x, size_t xs, float* y, int64_t ys) {
  const int64_t nb = k / kQ8_0BlockSize;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m256i xq[C];
    float dx[C];
    for (int c = 0; c < C; ++c) {
      const BlockQ8_0* xb = reinterpret_cast<const BlockQ8_0*>(x + c * xs) + b;
      xq[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb->qs));
      dx[c] = HalfToFloat(xb->d);
    }
    for (int r = 0; r < R; ++r) {
      const BlockQ8_0* wb = reinterpret_cast<const BlockQ8_0*>(w + r * ws) + b;
      // The same block of the next tile's rows (see PrefetchNextTile below): blocks are 34
      // bytes, so one prefetch per block touches every 64-byte line.
      _mm_prefetch(reinterpret_cast<const char*>(wb) + R * ws, _MM_HINT_T1);
      const __m256i wq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb->qs));
      const __m256i wabs = _mm256_sign_epi8(wq, wq);
      const float dw = HalfToFloat(wb->d);
      for (int c = 0; c < C; ++c) {
        const __m256i p16 = _mm256_maddubs_epi16(wabs, _mm256_sign_epi8(xq[c], wq));
        const __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
        acc[r][c] = _mm256_fmadd_ps(_mm256_set1_ps(dw * dx[c]), p, acc[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[c * ys + r] = HSum(acc[r][c]);
}

// ---- Q4_0 and the k-quants ------------------------------------------------------------------
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

#define PD_ALWAYS_INLINE __attribute__((always_inline))
// Fully unrolls the loop that follows (activation columns: C <= 4), so that per-column
// accumulators stay in registers instead of a stack array.
#define PD_UNROLL _Pragma("GCC unroll 8")

// Calls f(std::integral_constant<int, 0>{}) ... f(std::integral_constant<int, N - 1>{}), so that
// shift counts and table rows inside f are compile-time constants.
template <int N, typename F>
PD_ALWAYS_INLINE inline void Unroll(F&& f) {
  [&]<int... I>(std::integer_sequence<int, I...>) PD_ALWAYS_INLINE {
    (f(std::integral_constant<int, I>{}), ...);
  }(std::make_integer_sequence<int, N>{});
}

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

inline __m256i Load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// Weight rows are short (a few KiB) and a tile reads R of them side by side, so the hardware
// prefetchers see many short streams and fall behind DRAM (measured: Q4_K GEMV from DRAM on one
// thread 8.3 GB/s without, 13-14 GB/s with, of 14.5 GB/s). Each tile therefore prefetches the
// same block of the R rows after its own (the next tile of a row chunk, contiguous in memory) as
// it goes: one prefetch per 64 bytes of block, which covers every line since blocks are
// contiguous. Into L2 (T1): a tile ahead is R rows (18 KiB for Q4_K at k = 8192, more for longer
// rows), too much to park in L1 next to the activations; T0 measured the same or 1-3% slower.
// Prefetches past the matrix end are harmless hints.
template <int R, size_t kBlockBytes>
PD_ALWAYS_INLINE inline void PrefetchNextTile(const void* block, size_t ws) {
  const char* p = static_cast<const char*>(block) + R * ws;
  Unroll<(kBlockBytes + 63) / 64>([&](auto i) PD_ALWAYS_INLINE {
    _mm_prefetch(p + 64 * decltype(i)::value, _MM_HINT_T1);
  });
}

template <int R, int C>
inline void StoreTile(__m256 (&acc)[R][C], float* y, int64_t ys) {
  for (int r = 0; r < R; ++r)
    PD_UNROLL for (int c = 0; c < C; ++c) y[c * ys + r] = HSum(acc[r][c]);
}

// Four f16 scales at a stride of `stride` bytes, as 4 floats.
inline __m128 QuadScale(const char* p, size_t stride) {
  uint16_t h[4];
  for (int i = 0; i < 4; ++i) std::memcpy(&h[i], p + i * stride, 2);
  const uint64_t bits = h[0] | uint64_t{h[1]} << 16 | uint64_t{h[2]} << 32 | uint64_t{h[3]} << 48;
  return _mm_cvtph_ps(_mm_cvtsi64_si128(static_cast<int64_t>(bits)));
}

// Q4_0 x Q8_0, four blocks (two pairs) at a time. The 32 code bytes of blocks b and b+1 form one
// vector whose low nibbles are weights 0..15 of both blocks ([b | b+1] by 128-bit lane) and high
// nibbles weights 16..31; the activations are permuted to match once per column (shared by the R
// rows). Codes are unsigned (0..15); the -8 offset is subtracted as maddubs(8, y) in int16 (at
// most 7620 + 4064 in magnitude). The four d_w are converted at once and multiplied by the four
// d_x, then spread over the pairs' lanes ([b x4 | b+1 x4]). Per row and block pair: 5 ops to
// unpack, 1.5 for the scales; per column 8 (maddubs x2, add, sub, madd, cvt, fmadd, permute) +
// 0.5. Leftover blocks (nb % 4) go one at a time.
template <int R, int C>
void TileQ4_0(int64_t k, const char* w, size_t ws, const char* x, size_t xs, float* y, int64_t ys) {
  const int64_t nb = k / BlockQ4_0::kWeights;
  const __m256i m4 = _mm256_set1_epi8(0x0F), eights = _mm256_set1_epi8(8);
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i lo_pair = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
  const __m256i hi_pair = _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3);
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    PD_UNROLL for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 4 <= nb; b += 4) {
    __m256i ya[C][2], yb[C][2], z[C][2];
    __m128 dx[C];
    PD_UNROLL for (int c = 0; c < C; ++c) {
      const BlockQ8_0* xb = reinterpret_cast<const BlockQ8_0*>(x + c * xs) + b;
      PD_UNROLL for (int pr = 0; pr < 2; ++pr) {
        const __m256i y0 = Load32(xb[2 * pr].qs), y1 = Load32(xb[2 * pr + 1].qs);
        ya[c][pr] = _mm256_permute2x128_si256(y0, y1, 0x20);  // weights 0..15 of b | of b+1
        yb[c][pr] = _mm256_permute2x128_si256(y0, y1, 0x31);  // weights 16..31
        z[c][pr] = _mm256_add_epi16(_mm256_maddubs_epi16(eights, ya[c][pr]),
                                    _mm256_maddubs_epi16(eights, yb[c][pr]));
      }
      dx[c] = QuadScale(reinterpret_cast<const char*>(&xb->d), sizeof(BlockQ8_0));
    }
    for (int r = 0; r < R; ++r) {
      const BlockQ4_0* wb = reinterpret_cast<const BlockQ4_0*>(w + r * ws) + b;
      PrefetchNextTile<R, 4 * sizeof(BlockQ4_0)>(wb, ws);
      const __m128 dw = QuadScale(reinterpret_cast<const char*>(&wb->d), sizeof(BlockQ4_0));
      __m256i ua[2], ub[2];
      PD_UNROLL for (int pr = 0; pr < 2; ++pr) {
        const __m256i q = _mm256_inserti128_si256(
            _mm256_castsi128_si256(
                _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb[2 * pr].qs))),
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb[2 * pr + 1].qs)), 1);
        ua[pr] = _mm256_and_si256(q, m4);
        ub[pr] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
      }
      PD_UNROLL for (int c = 0; c < C; ++c) {
        const __m256 d4 = _mm256_castps128_ps256(_mm_mul_ps(dw, dx[c]));
        PD_UNROLL for (int pr = 0; pr < 2; ++pr) {
          const __m256i p = _mm256_sub_epi16(
              _mm256_add_epi16(_mm256_maddubs_epi16(ua[pr], ya[c][pr]),
                               _mm256_maddubs_epi16(ub[pr], yb[c][pr])),
              z[c][pr]);
          const __m256 d = _mm256_permutevar8x32_ps(d4, pr == 0 ? lo_pair : hi_pair);
          acc[r][c] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones)),
                                      acc[r][c]);
        }
      }
    }
  }
  for (; b < nb; ++b) {  // leftover blocks, codes in natural order
    for (int r = 0; r < R; ++r) {
      const BlockQ4_0* wb = reinterpret_cast<const BlockQ4_0*>(w + r * ws) + b;
      const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb->qs));
      const __m256i u =
          _mm256_and_si256(_mm256_inserti128_si256(_mm256_castsi128_si256(q),
                                                   _mm_srli_epi16(q, 4), 1), m4);
      const float dw = HalfToFloat(wb->d);
      PD_UNROLL for (int c = 0; c < C; ++c) {
        const BlockQ8_0* xb = reinterpret_cast<const BlockQ8_0*>(x + c * xs) + b;
        const __m256i yv = Load32(xb->qs);
        const __m256i p =
            _mm256_sub_epi16(_mm256_maddubs_epi16(u, yv), _mm256_maddubs_epi16(eights, yv));
        acc[r][c] = _mm256_fmadd_ps(_mm256_set1_ps(dw * HalfToFloat(xb->d)),
                                    _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones)), acc[r][c]);
      }
    }
  }
  StoreTile<R, C>(acc, y, ys);
}

// Q5_0 x Q8_0. Each block is unpacked in weight order (bytes 0-15: low nibbles = weights 0-15,
// bytes 16-31: high nibbles = weights 16-31) and its fifth bits ORed in: byte i takes bit i of qh
// (pshufb spreads qh byte i / 8 over 8 bytes, and + cmpeq against the bit pattern, and 0x10).
// Codes are unsigned (0..31); the -16 offset is subtracted as maddubs(16, y), once per column
// and block for all R rows (int16 never saturates: at most 7936 + 4096 in magnitude; a -128
// activation is exact). So every int32 lane holds exactly the integer ggml's
// ggml_vec_dot_q5_0_q8_0 has there, and the F32 steps (d_w * d_x, one fmadd per block, the final
// lane sum) are its steps: for activations from the Q8_0 quantizer (never -128, where ggml's
// sign trick wraps) results are bit-identical to llama.cpp's AVX2 dot (unlike a layout
// that packs two blocks per vector, which flipped 2 of the 20 greedy Gemma continuations of
// tests/python/test_gemma_reference.py). Four blocks per step share one f16 -> f32 conversion of
// their scales. Per row and block: ~9 ops to unpack; per column 6 (maddubs, sub, madd, cvt,
// scale broadcast, fmadd). Bytes per block: 22 of weights, 34 of activations (from L1, shared
// by the R rows).
template <int R, int C>
void TileQ5_0(int64_t k, const char* w, size_t ws, const char* x, size_t xs, float* y, int64_t ys) {
  const int64_t nb = k / kQ8_0BlockSize;
  const __m256i m4 = _mm256_set1_epi8(0x0F), sixteen = _mm256_set1_epi8(16);
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i spread = _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202,
                                            0x0303030303030303);
  const __m256i bits = _mm256_set1_epi64x(0x8040201008040201);
  // The 32 codes of a block in weight order.
  auto unpack = [&](const BlockQ5_0* wb) PD_ALWAYS_INLINE {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb->qs));
    uint32_t h;
    std::memcpy(&h, wb->qh, 4);
    const __m256i hb = _mm256_and_si256(
        _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(h)), spread), bits);
    const __m256i lo = _mm256_and_si256(
        _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1), m4);
    return _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(hb, bits), sixteen));
  };
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    PD_UNROLL for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 4 <= nb; b += 4) {
    __m256i yv[C][4], z[C][4];
    __m128 dx[C];
    PD_UNROLL for (int c = 0; c < C; ++c) {
      const BlockQ8_0* xb = reinterpret_cast<const BlockQ8_0*>(x + c * xs) + b;
      PD_UNROLL for (int j = 0; j < 4; ++j) {
        yv[c][j] = Load32(xb[j].qs);
        z[c][j] = _mm256_maddubs_epi16(sixteen, yv[c][j]);
      }
      dx[c] = QuadScale(reinterpret_cast<const char*>(&xb->d), sizeof(BlockQ8_0));
    }
    for (int r = 0; r < R; ++r) {
      const BlockQ5_0* wb = reinterpret_cast<const BlockQ5_0*>(w + r * ws) + b;
      // Two tiles ahead: rows of 440 bytes (Gemma 3 270M) make a tile short; measured 1 thread
      // from DRAM, busy machine: 8.1 / 7.8 GB/s one tile ahead, 9.2 / 8.2 two, 9.1 three.
      PrefetchNextTile<R, 4 * sizeof(BlockQ5_0)>(reinterpret_cast<const char*>(wb) + R * ws, ws);
      const __m128 dw = QuadScale(reinterpret_cast<const char*>(&wb->d), sizeof(BlockQ5_0));
      __m256i u[4];
      PD_UNROLL for (int j = 0; j < 4; ++j) u[j] = unpack(wb + j);
      PD_UNROLL for (int c = 0; c < C; ++c) {
        const __m256 d4 = _mm256_castps128_ps256(_mm_mul_ps(dw, dx[c]));
        PD_UNROLL for (int j = 0; j < 4; ++j) {
          const __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(u[j], yv[c][j]), z[c][j]);
          const __m256 d = _mm256_permutevar8x32_ps(d4, _mm256_set1_epi32(j));
          acc[r][c] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones)),
                                      acc[r][c]);
        }
      }
    }
  }
  for (; b < nb; ++b) {  // leftover blocks
    for (int r = 0; r < R; ++r) {
      const BlockQ5_0* wb = reinterpret_cast<const BlockQ5_0*>(w + r * ws) + b;
      const __m256i u = unpack(wb);
      const float dw = HalfToFloat(wb->d);
      PD_UNROLL for (int c = 0; c < C; ++c) {
        const BlockQ8_0* xb = reinterpret_cast<const BlockQ8_0*>(x + c * xs) + b;
        const __m256i yq = Load32(xb->qs);
        const __m256i p =
            _mm256_sub_epi16(_mm256_maddubs_epi16(u, yq), _mm256_maddubs_epi16(sixteen, yq));
        acc[r][c] = _mm256_fmadd_ps(_mm256_set1_ps(dw * HalfToFloat(xb->d)),
                                    _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones)), acc[r][c]);
      }
    }
  }
  StoreTile<R, C>(acc, y, ys);
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
        AccumulateBlock(acc[r][c], d, isum[c]);
        AccumulateMins(acc[r][c], dmin, _mm256_madd_epi16(m16, Load32(xb[c]->bsums)));
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
  float wacc[R][C] = {};
  for (int r = 0; r < R; ++r)
    PD_UNROLL for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
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
          AccumulateMins(acc[r][c], dmin, _mm256_madd_epi16(mdup, Load32(xb[c]->bsums)));
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

using TileImpl = void (*)(int64_t, const char*, size_t, const char*, size_t, float*, int64_t);

// Dispatch table over (nr, nc) for one tile template.
template <template <int, int> class T>
struct TileTable {
  static constexpr TileImpl kFns[kGemmTileW][kGemmTileX] = {
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
static_assert(kGemmTileW == 4 && kGemmTileX == 4, "TileTable lists 4x4 instantiations");

template <int R, int C>
struct F32Tile {
  static constexpr TileImpl Fn = &TileF32<R, C>;
};
template <int R, int C>
struct F16Tile {
  static constexpr TileImpl Fn = &TileHalf<R, C, LoadF16, HalfToFloat>;
};
template <int R, int C>
struct Bf16Tile {
  static constexpr TileImpl Fn = &TileHalf<R, C, LoadBf16, BfloatToFloat>;
};
template <int R, int C>
struct Q8Tile {
  static constexpr TileImpl Fn = &TileQ8<R, C>;
};
template <int R, int C>
struct Q4_0Tile {
  static constexpr TileImpl Fn = &TileQ4_0<R, C>;
};
template <int R, int C>
struct Q5_0Tile {
  static constexpr TileImpl Fn = &TileQ5_0<R, C>;
};
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

// ---- row conversions ------------------------------------------------------------------------

void F32ToF16(const float* x, uint16_t* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) y[i] = FloatToHalf(x[i]);
}

void F16ToF32(const uint16_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, LoadF16(x + i));
  for (; i < n; ++i) y[i] = HalfToFloat(x[i]);
}

// Round to nearest even on the top 16 bits; NaN keeps its top bits and is made quiet, exactly
// as the scalar F32ToBf16.
void F32ToBf16(const float* x, uint16_t* y, int64_t n) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256i inf = _mm256_set1_epi32(0x7f800000);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i bias = _mm256_set1_epi32(0x7fff);
  const __m256i quiet = _mm256_set1_epi32(0x40);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i h[2];
    for (int j = 0; j < 2; ++j) {
      const __m256i u = _mm256_castps_si256(_mm256_loadu_ps(x + i + 8 * j));
      const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
      const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
      const __m256i rounded =
          _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(bias, lsb)), 16);
      const __m256i nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), quiet);
      h[j] = _mm256_blendv_epi8(rounded, nan, is_nan);
    }
    // packus works within 128-bit lanes: [a0..3 b0..3 | a4..7 b4..7]; reorder the 64-bit quarters.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(h[0], h[1]), 0xd8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), packed);
  }
  for (; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, x + i, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      y[i] = static_cast<uint16_t>((u >> 16) | 0x40u);
    } else {
      y[i] = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
  }
}

void Bf16ToF32(const uint16_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, LoadBf16(x + i));
  for (; i < n; ++i) y[i] = BfloatToFloat(x[i]);
}

// Bit-exact with QuantizeRowQ8_0Act (ggml-cpu x86 quantize_row_q8_0): same amax, id = 127 / amax
// in f32, x * id rounded half to even by _mm256_round_ps.
void QuantizeQ8_0(const float* x, BlockQ8_0* y, int64_t n) {
  const __m256 sign_mask = _mm256_set1_ps(-0.f);
  for (int64_t b = 0; b < n / kQ8_0BlockSize; ++b) {
    const float* xb = x + b * kQ8_0BlockSize;
    __m256 v[4];
    __m256 amax = _mm256_setzero_ps();
    for (int j = 0; j < 4; ++j) {
      v[j] = _mm256_loadu_ps(xb + 8 * j);
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign_mask, v[j]));
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float am = _mm_cvtss_f32(m);
    y[b].d = FloatToHalf(am / 127.f);
    const __m256 vid = _mm256_set1_ps(am != 0.f ? 127.f / am : 0.f);
    __m256i q[4];
    for (int j = 0; j < 4; ++j) {
      const __m256 r = _mm256_round_ps(_mm256_mul_ps(v[j], vid),
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      q[j] = _mm256_cvtps_epi32(r);
    }
    // int32 -> int8 with in-lane packs, then restore element order.
    const __m256i q16a = _mm256_packs_epi32(q[0], q[1]);  // [0-3 8-11 | 4-7 12-15]
    const __m256i q16b = _mm256_packs_epi32(q[2], q[3]);  // [16-19 24-27 | 20-23 28-31]
    const __m256i q8 = _mm256_packs_epi16(q16a, q16b);    // [0-3 8-11 16-19 24-27 | 4-7 ...]
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[b].qs),
                        _mm256_permutevar8x32_epi32(q8, order));
  }
}

void DequantizeQ8_0(const BlockQ8_0* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQ8_0BlockSize; ++b) {
    const __m256 d = _mm256_set1_ps(HalfToFloat(x[b].d));
    for (int j = 0; j < 4; ++j) {
      const __m128i q8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(x[b].qs + 8 * j));
      _mm256_storeu_ps(y + b * kQ8_0BlockSize + 8 * j,
                       _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8))));
    }
  }
}

// Bit-exact with QuantizeRow<BlockQ8_K>: the same largest-magnitude value (the first on ties),
// the same f32 iscale = -127 / max, products iscale * x rounded to nearest even by cvtps (the
// default MXCSR mode, as nearbyint), clamped to 127; bsums summed exactly in int32.
void QuantizeQ8_K(const float* x, BlockQ8_K* y, int64_t n) {
  const __m256 sign_mask = _mm256_set1_ps(-0.f);
  const __m256i max_q = _mm256_set1_epi32(127);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float* xb = x + b * kQK;
    BlockQ8_K& yb = y[b];
    __m256 amax = _mm256_setzero_ps();
    for (int j = 0; j < kQK; j += 8) {
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign_mask, _mm256_loadu_ps(xb + j)));
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float am = _mm_cvtss_f32(m);
    if (am == 0.f) {
      std::memset(&yb, 0, sizeof(yb));
      continue;
    }
    int first = 0;
    const __m256 vam = _mm256_set1_ps(am);
    for (int j = 0; j < kQK; j += 8) {
      const __m256 a = _mm256_andnot_ps(sign_mask, _mm256_loadu_ps(xb + j));
      const int mask = _mm256_movemask_ps(_mm256_cmp_ps(a, vam, _CMP_EQ_OQ));
      if (mask != 0) {
        first = j + __builtin_ctz(static_cast<unsigned>(mask));
        break;
      }
    }
    const float iscale = -127.f / xb[first];
    const __m256 vis = _mm256_set1_ps(iscale);
    __m128i sums[4];
    for (int g = 0; g < 4; ++g) {  // 64 weights: sub-blocks 4g .. 4g+3
      __m256i q[8];
      for (int j = 0; j < 8; ++j) {
        const __m256 s = _mm256_mul_ps(vis, _mm256_loadu_ps(xb + 64 * g + 8 * j));
        q[j] = _mm256_min_epi32(_mm256_cvtps_epi32(s), max_q);
      }
      for (int h = 0; h < 2; ++h) {
        const __m256i* qq = q + 4 * h;
        const __m256i q8 = _mm256_packs_epi16(_mm256_packs_epi32(qq[0], qq[1]),
                                              _mm256_packs_epi32(qq[2], qq[3]));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(yb.qs + 64 * g + 32 * h),
                            _mm256_permutevar8x32_epi32(q8, order));
      }
      // Sub-block sums: two vectors each, then a horizontal-add transpose.
      const __m256i s0 = _mm256_add_epi32(q[0], q[1]), s1 = _mm256_add_epi32(q[2], q[3]);
      const __m256i s2 = _mm256_add_epi32(q[4], q[5]), s3 = _mm256_add_epi32(q[6], q[7]);
      const __m256i hh = _mm256_hadd_epi32(_mm256_hadd_epi32(s0, s1), _mm256_hadd_epi32(s2, s3));
      sums[g] = _mm_add_epi32(_mm256_castsi256_si128(hh), _mm256_extracti128_si256(hh, 1));
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(yb.bsums), _mm_packs_epi32(sums[0], sums[1]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(yb.bsums + 8), _mm_packs_epi32(sums[2], sums[3]));
    yb.d = 1.f / iscale;
  }
}

// ---- attention and row ops ------------------------------------------------------------------

// The Walsh-Hadamard rotation of INT8 KV rows (kv_rotation.h), bit-exact with RotateKvRow: every
// output is the same sum or difference of the same two values, stage after stage; only the order
// in which independent butterflies run differs. First pass: groups of up to 64 values in up to 8
// registers go through every stage of span < 64 (spans 1, 2 and 4 inside one register: a
// lane-swapped copy, the lower lane of each pair takes u + v, the upper one u - v; spans 8 to 32
// pair whole registers). Then the spans of 64 and more, two stages per pass over four registers
// (one stage when an odd number is left). The scale multiplies the last stage's results. Blocks
// of fewer than 8 values (head_dim with a small power-of-two factor) take the scalar loops.
inline __m256 HadamardInRegister(__m256 v) {
  __m256 w = _mm256_permute_ps(v, 0xb1);  // [1 0 3 2 ...]: each lane holds its partner
  v = _mm256_blend_ps(_mm256_add_ps(v, w), _mm256_sub_ps(w, v), 0xaa);
  w = _mm256_permute_ps(v, 0x4e);  // [2 3 0 1 ...]
  v = _mm256_blend_ps(_mm256_add_ps(v, w), _mm256_sub_ps(w, v), 0xcc);
  w = _mm256_permute2f128_ps(v, v, 0x01);  // the two halves swapped
  return _mm256_blend_ps(_mm256_add_ps(v, w), _mm256_sub_ps(w, v), 0xf0);
}

// One butterfly stage across registers: r[j] and r[j + kLen] for each pair in blocks of 2 kLen.
template <int kRegs, int kLen>
inline void HadamardRegisterStage(__m256* r) {
#pragma GCC unroll 8
  for (int k = 0; k < kRegs / 2; ++k) {
    const int j = (k / kLen) * 2 * kLen + k % kLen;
    const __m256 u = r[j], v = r[j + kLen];
    r[j] = _mm256_add_ps(u, v);
    r[j + kLen] = _mm256_sub_ps(u, v);
  }
}

// Every stage of span < 8 * kRegs on kRegs consecutive registers at y; scales when `last`. The
// loops are unrolled so that r[] lives in registers.
template <int kRegs>
void HadamardGroup(float* y, bool last, __m256 vscale) {
  __m256 r[kRegs];
#pragma GCC unroll 8
  for (int i = 0; i < kRegs; ++i) r[i] = HadamardInRegister(_mm256_loadu_ps(y + 8 * i));
  if constexpr (kRegs >= 2) HadamardRegisterStage<kRegs, 1>(r);
  if constexpr (kRegs >= 4) HadamardRegisterStage<kRegs, 2>(r);
  if constexpr (kRegs >= 8) HadamardRegisterStage<kRegs, 4>(r);
#pragma GCC unroll 8
  for (int i = 0; i < kRegs; ++i) {
    _mm256_storeu_ps(y + 8 * i, last ? _mm256_mul_ps(r[i], vscale) : r[i]);
  }
}

void RotateKvRowAvx2(float* x, int head_dim, float scale) {
  const int b = head_dim & -head_dim;  // KvRotationBlock, not called: see the top of this file
  if (b < 8) {
    ScalarKernels().rotate_kv_row(x, head_dim, scale);
    return;
  }
  const __m256 vscale = _mm256_set1_ps(scale);
  const int group = std::min(b, 64);
  for (int base = 0; base < head_dim; base += b) {
    float* y = x + base;
    const bool group_last = group == b && scale != 1.f;
    for (int g = 0; g < b; g += group) {
      switch (group) {
        case 8:
          HadamardGroup<1>(y + g, group_last, vscale);
          break;
        case 16:
          HadamardGroup<2>(y + g, group_last, vscale);
          break;
        case 32:
          HadamardGroup<4>(y + g, group_last, vscale);
          break;
        default:
          HadamardGroup<8>(y + g, group_last, vscale);
          break;
      }
    }
    int len = group;
    for (; 4 * len <= b; len *= 4) {  // stages len and 2 len
      const bool last = 4 * len == b && scale != 1.f;
      for (int i = 0; i < b; i += 4 * len) {
        for (int j = i; j < i + len; j += 8) {
          const __m256 a0 = _mm256_loadu_ps(y + j), a1 = _mm256_loadu_ps(y + j + len);
          const __m256 a2 = _mm256_loadu_ps(y + j + 2 * len);
          const __m256 a3 = _mm256_loadu_ps(y + j + 3 * len);
          const __m256 b0 = _mm256_add_ps(a0, a1), b1 = _mm256_sub_ps(a0, a1);
          const __m256 b2 = _mm256_add_ps(a2, a3), b3 = _mm256_sub_ps(a2, a3);
          __m256 c0 = _mm256_add_ps(b0, b2), c2 = _mm256_sub_ps(b0, b2);
          __m256 c1 = _mm256_add_ps(b1, b3), c3 = _mm256_sub_ps(b1, b3);
          if (last) {
            c0 = _mm256_mul_ps(c0, vscale), c1 = _mm256_mul_ps(c1, vscale);
            c2 = _mm256_mul_ps(c2, vscale), c3 = _mm256_mul_ps(c3, vscale);
          }
          _mm256_storeu_ps(y + j, c0);
          _mm256_storeu_ps(y + j + len, c1);
          _mm256_storeu_ps(y + j + 2 * len, c2);
          _mm256_storeu_ps(y + j + 3 * len, c3);
        }
      }
    }
    if (2 * len == b) {  // one stage left
      const bool last = scale != 1.f;
      for (int j = 0; j < len; j += 8) {
        __m256 u = _mm256_loadu_ps(y + j), v = _mm256_loadu_ps(y + j + len);
        __m256 s = _mm256_add_ps(u, v), d = _mm256_sub_ps(u, v);
        if (last) s = _mm256_mul_ps(s, vscale), d = _mm256_mul_ps(d, vscale);
        _mm256_storeu_ps(y + j, s);
        _mm256_storeu_ps(y + j + len, d);
      }
    }
  }
}

// INT8 KV (kernels.h). Two passes: |x| max, then 32 values per step scaled, rounded by cvtps2dq
// (round half to even under the default MXCSR, like the scalar nearbyint), clamped and packed.
float QuantizeKvI8(const float* x, int8_t* q, int64_t n) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 vmax = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    vmax = _mm256_max_ps(vmax, _mm256_and_ps(_mm256_loadu_ps(x + i), abs_mask));
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_movehdup_ps(h));
  float amax = _mm_cvtss_f32(h);
  for (; i < n; ++i) {
    const float a = fabsf(x[i]);
    amax = a > amax ? a : amax;
  }
  const float d = amax / 127.f;
  const float id = d != 0.f ? 1.f / d : 0.f;
  const __m256 vid = _mm256_set1_ps(id);
  const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
  auto quant8 = [&](const float* p) {
    const __m256i r = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(p), vid));
    return _mm256_min_epi32(hi, _mm256_max_epi32(lo, r));
  };
  const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  i = 0;
  for (; i + 32 <= n; i += 32) {
    // packs work within 128-bit lanes: the result holds 4-value groups in the order
    // a0 b0 c0 d0 | a1 b1 c1 d1; the permutation restores a0 a1 b0 b1 c0 c1 d0 d1.
    const __m256i ab = _mm256_packs_epi32(quant8(x + i), quant8(x + i + 8));
    const __m256i cd = _mm256_packs_epi32(quant8(x + i + 16), quant8(x + i + 24));
    const __m256i abcd = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, cd), perm);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i), abcd);
  }
  for (; i < n; ++i) {
    float r = nearbyintf(x[i] * id);
    r = r < -127.f ? -127.f : (r > 127.f ? 127.f : r);
    q[i] = static_cast<int8_t>(r);
  }
  return d;
}

// F16 row -> INT8 scheme: the AVX-512 one-pass kernel where it applies, else the three kernels.
float QuantizeKvI8F16(const uint16_t* x, float* tmp, int8_t* q, int head_dim) {
  if (const KvRowF16ToI8Fn fused = Avx512KvRowF16ToI8(head_dim)) return fused(x, q);
  F16ToF32(x, tmp, head_dim);
  RotateKvRowAvx2(tmp, head_dim, 1.f / static_cast<float>(head_dim & -head_dim));
  return QuantizeKvI8(tmp, q, head_dim);
}

inline __m256 LoadI8(const int8_t* p) {
  return _mm256_cvtepi32_ps(
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// INT8 row -> F16 out of the stored basis: the AVX-512 one-pass kernel where it applies, else
// q * scale (8 lanes, one product each, as the scalar loop), the rotation and F32 -> F16.
void DequantizeKvI8F16(const int8_t* q, float scale, float* tmp, uint16_t* y, int head_dim) {
  if (const KvRowI8ToF16Fn fused = Avx512KvRowI8ToF16(head_dim)) return fused(q, scale, y);
  const __m256 vs = _mm256_set1_ps(scale);
  int i = 0;
  for (; i + 8 <= head_dim; i += 8) _mm256_storeu_ps(tmp + i, _mm256_mul_ps(LoadI8(q + i), vs));
  for (; i < head_dim; ++i) tmp[i] = scale * static_cast<float>(q[i]);
  RotateKvRowAvx2(tmp, head_dim, 1.f);
  F32ToF16(tmp, y, head_dim);
}

float DotI8F32(const int8_t* a, const float* b, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(LoadI8(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(LoadI8(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(LoadI8(a + i), _mm256_loadu_ps(b + i), acc0);
  float s = HSum(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) s += static_cast<float>(a[i]) * b[i];
  return s;
}

void AxpyI8(float a, const int8_t* x, float* y, int64_t n) {
  const __m256 va = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, LoadI8(x + i), _mm256_loadu_ps(y + i)));
  }
  for (; i < n; ++i) y[i] = __builtin_fmaf(a, static_cast<float>(x[i]), y[i]);
}

double SumSquares(const float* x, int64_t n) {
  __m256d acc0 = _mm256_setzero_pd(), acc1 = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 sq = _mm256_mul_ps(v, v);
    acc0 = _mm256_add_pd(acc0, _mm256_cvtps_pd(_mm256_castps256_ps128(sq)));
    acc1 = _mm256_add_pd(acc1, _mm256_cvtps_pd(_mm256_extractf128_ps(sq, 1)));
  }
  double s = HSum(_mm256_add_pd(acc0, acc1));
  for (; i < n; ++i) s += static_cast<double>(x[i] * x[i]);
  return s;
}

void Scale(const float* x, float s, float* y, int64_t n) {
  const __m256 vs = _mm256_set1_ps(s);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(vs, _mm256_loadu_ps(x + i)));
  for (; i < n; ++i) y[i] = s * x[i];
}

void ScaleMul(const float* x, float s, const float* w, float* y, int64_t n) {
  const __m256 vs = _mm256_set1_ps(s);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(
        y + i, _mm256_mul_ps(_mm256_mul_ps(vs, _mm256_loadu_ps(x + i)), _mm256_loadu_ps(w + i)));
  }
  for (; i < n; ++i) y[i] = (s * x[i]) * w[i];
}

void Add(const float* a, const float* b, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
  }
  for (; i < n; ++i) y[i] = a[i] + b[i];
}

void SwiGlu(const float* g, const float* u, float* y, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.f);
  const __m256 sign = _mm256_set1_ps(-0.f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 gv = _mm256_loadu_ps(g + i);
    const __m256 e = Exp(_mm256_xor_ps(gv, sign));
    _mm256_storeu_ps(
        y + i, _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + i)));
  }
  for (; i < n; ++i) y[i] = g[i] / (1.f + expf(-g[i])) * u[i];
}

float Max(const float* x, int64_t n) {
  __m256 m = _mm256_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(x + i));
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_movehdup_ps(h));
  float r = _mm_cvtss_f32(h);
  for (; i < n; ++i) r = x[i] > r ? x[i] : r;
  return r;
}

double ExpSubSum(const float* x, float m, float* y, int64_t n) {
  const __m256 vm = _mm256_set1_ps(m);
  __m256d acc = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = Exp(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
    _mm256_storeu_ps(y + i, e);
    acc = _mm256_add_pd(acc, _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(e)),
                                           _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1))));
  }
  double s = HSum(acc);
  for (; i < n; ++i) {
    y[i] = expf(x[i] - m);
    s += y[i];
  }
  return s;
}

void RopeNeox(float* v, const float* c, const float* s, int64_t half) {
  int64_t i = 0;
  for (; i + 8 <= half; i += 8) {
    const __m256 a = _mm256_loadu_ps(v + i), b = _mm256_loadu_ps(v + i + half);
    const __m256 vc = _mm256_loadu_ps(c + i), vs = _mm256_loadu_ps(s + i);
    _mm256_storeu_ps(v + i, _mm256_fmsub_ps(a, vc, _mm256_mul_ps(b, vs)));
    _mm256_storeu_ps(v + i + half, _mm256_fmadd_ps(a, vs, _mm256_mul_ps(b, vc)));
  }
  for (; i < half; ++i) {
    const float a = v[i], b = v[i + half];
    v[i] = __builtin_fmaf(a, c[i], -(b * s[i]));
    v[i + half] = __builtin_fmaf(a, s[i], b * c[i]);
  }
}

void RopeNormal(float* v, const float* c, const float* s, int64_t half) {
  for (int64_t i = 0; i < half; ++i) {
    const float a = v[2 * i], b = v[2 * i + 1];
    v[2 * i] = __builtin_fmaf(a, c[i], -(b * s[i]));
    v[2 * i + 1] = __builtin_fmaf(b, c[i], a * s[i]);
  }
}

// ---- attention in ggml's AVX2 order (AttnKernels, kernels.h; scalar twins in kernels_scalar.cc) --

// ggml_vec_dot_f32 built for AVX2: four 8-lane FMA accumulators over steps of 32 elements, then
// (a0 + a2) + (a1 + a3), the two 128-bit halves added, and two horizontal adds.
float AttnDotAvx2(const float* a, const float* b, int64_t n) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  const int64_t np = n - n % 32;
  for (int64_t i = 0; i < np; i += 32) {
    for (int r = 0; r < 4; ++r) {
      acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8 * r), _mm256_loadu_ps(b + i + 8 * r),
                               acc[r]);
    }
  }
  const __m256 x = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]));
  const __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  const __m128 t1 = _mm_hadd_ps(t0, t0);
  float s = _mm_cvtss_f32(_mm_hadd_ps(t1, t1));
  for (int64_t i = np; i < n; ++i) s = __builtin_fmaf(a[i], b[i], s);
  return s;
}

// ggml's AVX2 expf: x = n ln2 + b, a degree-5 polynomial j(b), and 2^n built from the bits of
// the rounding constant's sum (k), with a two-factor scaling near the exponent range.
inline __m256 GgmlExpAvx2(__m256 x) {
  const __m256 r = _mm256_set1_ps(0x1.8p23f);
  const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), r);
  const __m256 n = _mm256_sub_ps(z, r);
  const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f),
                                    _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
  const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
  const __m256 k =
      _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_castps_si256(_mm256_set1_ps(1.f))));
  const __m256 abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.f), n);
  const __m256 near = _mm256_cmp_ps(abs_n, _mm256_set1_ps(126.f), _CMP_GT_OQ);
  const __m256 u = _mm256_mul_ps(b, b);
  const __m256 j = _mm256_fmadd_ps(
      _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b,
                                      _mm256_set1_ps(0x1.573e2ep-5f)),
                      u,
                      _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b,
                                      _mm256_set1_ps(0x1.fffdb6p-2f))),
      u, _mm256_mul_ps(_mm256_set1_ps(0x1.ffffecp-1f), b));
  const __m256 plain = _mm256_fmadd_ps(k, j, k);
  if (_mm256_movemask_ps(near) == 0) return plain;
  const __m256i g = _mm256_and_si256(
      _mm256_castps_si256(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ)),
      _mm256_set1_epi32(static_cast<int>(0x82000000u)));
  const __m256 s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f000000)));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
  const __m256 far = _mm256_cmp_ps(abs_n, _mm256_set1_ps(192.f), _CMP_GT_OQ);
  const __m256 scaled = _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1);
  return _mm256_blendv_ps(_mm256_blendv_ps(plain, scaled, near), _mm256_mul_ps(s1, s1), far);
}

// Sum of 8 lanes in tinyBLAS's and ggml_vec_soft_max_f32's order.
inline float SumHalves(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

double AttnExpSumAvx2(const float* x, float max, float* y, int64_t n) {
  const __m256 vm = _mm256_set1_ps(max);
  double sum = 0.0;
  for (int64_t i = 0; i + 8 <= n; i += 8) {
    const __m256 e = GgmlExpAvx2(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
    _mm256_storeu_ps(y + i, e);
    sum += static_cast<double>(SumHalves(e));
  }
  return sum;
}

// The reduction trees of AttnReduceRef<8>, vectorized across columns (each lane one column).
void AttnReduceAvx2(const float* rows, int n_rows, int64_t stride, int64_t cols, float* out) {
  int64_t c = 0;
  for (; c + 8 <= cols; c += 8) {
    auto row = [&](int r) { return _mm256_loadu_ps(rows + r * stride + c); };
    __m256 v[8];
    if (n_rows == 8) {
      for (int l = 0; l < 8; ++l) v[l] = row(l);
      __m256 q[4];
      for (int i = 0; i < 4; ++i) q[i] = _mm256_add_ps(v[i + 4], v[i]);
      _mm256_storeu_ps(out + c, _mm256_add_ps(_mm256_add_ps(q[0], q[2]), _mm256_add_ps(q[1], q[3])));
      continue;
    }
    for (int l = 0; l < 8; ++l) {
      v[l] = _mm256_add_ps(_mm256_add_ps(row(l), row(l + 16)), _mm256_add_ps(row(l + 8), row(l + 24)));
    }
    __m256 q[4];
    for (int i = 0; i < 4; ++i) q[i] = _mm256_add_ps(v[i + 4], v[i]);
    _mm256_storeu_ps(out + c, _mm256_add_ps(_mm256_add_ps(q[0], q[1]), _mm256_add_ps(q[2], q[3])));
  }
  if (c < cols) {
    ScalarAttnKernels(8).reduce(rows + c, n_rows, stride, cols - c, out + c);
  }
}

// AttnVSumRef<8> with the accumulators of 8 columns in registers: one pass over the positions
// per group of 8 accumulators (n_acc / 8 passes), each partial parked in `part`, then the tree.
void AttnVSumAvx2(const float* p, const float* const* v, int64_t lo, int64_t hi, int n_acc,
                  int64_t cols, float* out) {
  const int passes = n_acc / 8;
  int64_t c = 0;
  for (; c + 8 <= cols; c += 8) {
    alignas(32) float part[4][8][8];
    for (int a = 0; a < passes; ++a) {
      __m256 acc[8];
      for (int l = 0; l < 8; ++l) acc[l] = _mm256_setzero_ps();
      // Positions of this pass: j with (j / 8) % passes == a.
      for (int64_t blk = lo / 8; blk * 8 <= hi; ++blk) {
        if (blk % passes != a) continue;
        const int64_t j0 = std::max<int64_t>(lo, blk * 8), j1 = std::min<int64_t>(hi, blk * 8 + 7);
        for (int64_t j = j0; j <= j1; ++j) {
          const int l = static_cast<int>(j % 8);
          acc[l] = _mm256_fmadd_ps(_mm256_loadu_ps(v[j - lo] + c), _mm256_set1_ps(p[j - lo]),
                                   acc[l]);
        }
      }
      for (int l = 0; l < 8; ++l) _mm256_store_ps(part[a][l], acc[l]);
    }
    AttnReduceAvx2(&part[0][0][0], n_acc, 8, 8, out + c);
  }
  if (c < cols) {
    std::vector<const float*> vv(static_cast<size_t>(hi - lo + 1));
    for (int64_t j = lo; j <= hi; ++j) vv[j - lo] = v[j - lo] + c;
    ScalarAttnKernels(8).vsum(p, vv.data(), lo, hi, n_acc, cols - c, out + c);
  }
}

constexpr AttnKernels kAvx2Attn = {8, &AttnDotAvx2, &AttnExpSumAvx2, &AttnReduceAvx2,
                                   &AttnVSumAvx2};

// The AVX-512 order where the CPU has it (llama.cpp built for it uses that), else AVX2's.
const AttnKernels& Avx2TableAttn() {
  static const AttnKernels* const k = Avx512AttnKernels();
  return k != nullptr ? *k : kAvx2Attn;
}

// Q8_0 and Q5_0: the AVX512-VNNI tile when the CPU has it (same bits), else the AVX2 one.
void GemmQ8_0Dispatch(int64_t k, const void* w, size_t w_stride, int nr, const void* x,
                      size_t x_stride, int nc, float* y, int64_t y_stride) {
  static const GemmTileFn vnni = Q8_0TileVnni();
  (vnni != nullptr ? vnni : &TileTable<Q8Tile>::Gemm)(k, w, w_stride, nr, x, x_stride, nc, y,
                                                       y_stride);
}
void GemmQ5_0Dispatch(int64_t k, const void* w, size_t w_stride, int nr, const void* x,
                      size_t x_stride, int nc, float* y, int64_t y_stride) {
  static const GemmTileFn vnni = Q5_0TileVnni();
  (vnni != nullptr ? vnni : &TileTable<Q5_0Tile>::Gemm)(k, w, w_stride, nr, x, x_stride, nc, y,
                                                         y_stride);
}

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

namespace {

void GemmQ3KDispatch(int64_t k, const void* w, size_t w_stride, int nr, const void* x,
                     size_t x_stride, int nc, float* y, int64_t y_stride) {
  static const GemmTileFn zmm = ZmmKQuantTilesIfSupported().q3_k;
  if (zmm != nullptr) return zmm(k, w, w_stride, nr, x, x_stride, nc, y, y_stride);
  TileTable<Q3KTile>::Gemm(k, w, w_stride, nr, x, x_stride, nc, y, y_stride);
}

constexpr Kernels kAvx2 = {
    .name = "avx2",
    .gemm = {&TileTable<F32Tile>::Gemm, &TileTable<F16Tile>::Gemm, &TileTable<Bf16Tile>::Gemm,
             &GemmQ8_0Dispatch, &TileTable<Q4_0Tile>::Gemm,
             &TileTable<Q2KTile>::Gemm, &GemmQ3KDispatch,
             &TileTable<Q4KTile>::Gemm, &TileTable<Q5KTile>::Gemm, &TileTable<Q6KTile>::Gemm,
             &GemmQ5_0Dispatch, &GemmW8A8Avx2, &GemmW4A16Avx2},
    .gemm_wide = {nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                  &TileTable<Q4KWideTile>::Gemm, &TileTable<Q5KWideTile>::Gemm,
                  &TileTable<Q6KWideTile>::Gemm, nullptr, nullptr, nullptr},
    .q4_k_repack_gemm = &TileTable<Q4KRepackGemmTile>::Gemm,
    .q4_k_repack_gemv = &TileTable<Q4KRepackGemvTile>::Gemm,
    .q2_k_repack_gemm = &GemmQ2KRepackDispatch<2>,
    .q2_k_repack_gemv = &GemmQ2KRepackDispatch<1>,
    .f32_to_f16 = &F32ToF16,
    .f16_to_f32 = &F16ToF32,
    .f32_to_bf16 = &F32ToBf16,
    .bf16_to_f32 = &Bf16ToF32,
    .quantize_q8_0 = &QuantizeQ8_0,
    .dequantize_q8_0 = &DequantizeQ8_0,
    .quantize_q8_k = &QuantizeQ8_K,
    .quantize_w8a8 = &QuantizeRowW8A8Avx2,
    .quantize_kv_i8 = &QuantizeKvI8,
    .rotate_kv_row = &RotateKvRowAvx2,
    .quantize_kv_i8_f16 = &QuantizeKvI8F16,
    .dequantize_kv_i8_f16 = &DequantizeKvI8F16,
    .dot_i8_f32 = &DotI8F32,
    .axpy_i8 = &AxpyI8,
    .sum_squares = &SumSquares,
    .scale = &Scale,
    .scale_mul = &ScaleMul,
    .add = &Add,
    .swiglu = &SwiGlu,
    .max = &Max,
    .exp_sub_sum = &ExpSubSum,
    .rope_neox = &RopeNeox,
    .rope_normal = &RopeNormal,
    .attn = &Avx2TableAttn,
};

}  // namespace

const Kernels* Avx2Kernels() { return &kAvx2; }
const AttnKernels& Avx2AttnKernels() { return kAvx2Attn; }

void GemmQ8_0Avx2(int64_t k, const void* w, size_t w_stride, int nr, const void* x,
                  size_t x_stride, int nc, float* y, int64_t y_stride) {
  TileTable<Q8Tile>::Gemm(k, w, w_stride, nr, x, x_stride, nc, y, y_stride);
}

void GemmQ5_0Avx2(int64_t k, const void* w, size_t w_stride, int nr, const void* x,
                  size_t x_stride, int nc, float* y, int64_t y_stride) {
  TileTable<Q5_0Tile>::Gemm(k, w, w_stride, nr, x, x_stride, nc, y, y_stride);
}

}  // namespace pd::engine::cpu

#else  // no AVX2 build

namespace pd::engine::cpu {
const Kernels* Avx2Kernels() { return nullptr; }
const AttnKernels& Avx2AttnKernels() { return ScalarAttnKernels(8); }
GemmTileFn Q3KTileAvx2Only() { return nullptr; }
// No AVX2 table in this build: callers check Avx2Kernels() first; this keeps the symbol.
void GemmQ8_0Avx2(int64_t k, const void* w, size_t w_stride, int nr, const void* x,
                  size_t x_stride, int nc, float* y, int64_t y_stride) {
  ScalarKernels().gemm[static_cast<int>(GemmType::kQ8_0)](k, w, w_stride, nr, x, x_stride, nc, y,
                                                           y_stride);
}
void GemmQ5_0Avx2(int64_t k, const void* w, size_t w_stride, int nr, const void* x,
                  size_t x_stride, int nc, float* y, int64_t y_stride) {
  ScalarKernels().gemm[static_cast<int>(GemmType::kQ5_0)](k, w, w_stride, nr, x, x_stride, nc, y,
                                                           y_stride);
}
}  // namespace pd::engine::cpu

#endif
