// AVX2 MatMul tiles of the float and 32-block formats: F32, F16, BF16, Q8_0, Q4_0 and Q5_0
// (x Q8_0). The k-quant tiles are in k_quants_avx2.cc, the table in kernels_avx2.cc.
// Compiled with -mavx2 -mfma -mf16c and run only after SelectKernels() has checked the CPU;
// like every AVX2 file it calls no inline function from shared headers (see
// kernels_avx2_internal.h).
//
// Scalar twins in kernels_scalar.cc; see kernels.h.
#include "engine/backend/cpu/kernels.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <algorithm>
#include <cstring>

#include "engine/backend/cpu/kernels_avx2_internal.h"

namespace pd::engine::cpu {
namespace {

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

// Q8_0: per block, row and column, |w| (unsigned) times x with w's sign (signed) via maddubs gives
// 16 int16 pair sums (|127 * 128 * 2| < 2^15, so no saturation even for a -128 weight; our
// activations never hold -128), madd with ones gives 8 int32, which are scaled by d_w * d_x and
// accumulated in F32. Per block: 34 bytes per row read; per row and column 6 vector ops (sign,
// maddubs, madd, cvt, mul, fmadd), per row 3 more.
// Software prefetch of the next tile (kTileR rows on), as for the other formats: Gemma 3's tied
// head has rows of only 640 weights (680 bytes), too short for the hardware prefetchers; measured
// on that shape, one thread, busy machine: 5.1 -> 11.6 GB/s (8192-wide rows: 11.0 -> 14.1 GB/s).
//
// Several activation rows (batched decode, verification, prompts): AVX2 has 16 ymm registers,
// and a 4 x 4 tile's 16 accumulators with their row and column operands do not fit; GCC then
// keeps the accumulators in memory, a load and a store around every FMA (the Gemma 3 head at 16
// activation rows, one Zen 3 thread: 5.5 cycles per row, column and block). So such tiles run as
// passes of at most PassRows(R, C) rows (<= 8 accumulators, in registers), over activation blocks
// staged once per tile, 32 blocks at a time: codes 32-byte aligned (a 34-byte block puts half of
// its code vectors across a cache line) and scales as F32. Each output keeps its own order of
// operations (d_w * d_x is the product of the two broadcast scales, ggml's scalar product in
// every lane), so neither passes nor staging change a bit. Measured with gemv_bench
// rows/q8_0/N/1 (best of 5, Zen 3, one thread): 4 rows 30.6 -> 26.9 ms, 8 rows 66.0 -> 56.3, 16
// rows 133.6 -> 105.4. One activation row keeps an in-place tile (TileQ8Row), faster there.
// Since the row kernels (rows_avx2.cc), CpuBackend's MatMul no longer runs this tile on CPUs
// without VNNI (PlanMatMul sends every Q8_0 MatMul to the row or grouped kernel): it stays the
// table's Q8_0 entry and the reference those kernels' bits are tested against.
constexpr int kPassAcc = 8;
static_assert(kPassAcc / kGemmTileX >= 1, "a pass holds at least one row of a tile");
constexpr int PassRows(int r, int c) { return std::min(r, kPassAcc / c); }

template <int C>
struct Q8Stage {
  static constexpr int kBlocks = 32;
  alignas(32) int8_t qs[kBlocks][C][kQ8_0BlockSize];
  float d[kBlocks][C];
  void Fill(const char* x, size_t xs, int64_t b0, int n) {
    for (int j = 0; j < n; ++j) {
      PD_UNROLL for (int c = 0; c < C; ++c) {
        const BlockQ8_0* xb = reinterpret_cast<const BlockQ8_0*>(x + c * xs) + b0 + j;
        _mm256_store_si256(reinterpret_cast<__m256i*>(qs[j][c]), Load32(xb->qs));
        d[j][c] = HalfToFloat(xb->d);
      }
    }
  }
  __m256i Codes(int j, int c) const {
    return _mm256_load_si256(reinterpret_cast<const __m256i*>(qs[j][c]));
  }
};

// One pass of R rows over blocks [b0, b0 + n) of the staged columns, into acc (in memory between
// calls: once per staged chunk).
template <int R, int C, int kTileR>
PD_ALWAYS_INLINE inline void Q8Pass(const char* w, size_t ws, const Q8Stage<C>& st, int64_t b0,
                                    int n, __m256 (*acc_mem)[C]) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R][C];
  PD_UNROLL for (int r = 0; r < R; ++r) {
    PD_UNROLL for (int c = 0; c < C; ++c) acc[r][c] = acc_mem[r][c];
  }
  for (int j = 0; j < n; ++j) {
    PD_UNROLL for (int r = 0; r < R; ++r) {
      const BlockQ8_0* wb = reinterpret_cast<const BlockQ8_0*>(w + r * ws) + b0 + j;
      // The same block of the next tile's rows: blocks are 34 bytes, so one prefetch per block
      // touches every 64-byte line.
      _mm_prefetch(reinterpret_cast<const char*>(wb) + kTileR * ws, _MM_HINT_T1);
      const __m256i wq = Load32(wb->qs);
      const __m256i wabs = _mm256_sign_epi8(wq, wq);
      const __m256 dw = _mm256_set1_ps(HalfToFloat(wb->d));
      PD_UNROLL for (int c = 0; c < C; ++c) {
        const __m256i xq = st.Codes(j, c);
        const __m256i p16 = _mm256_maddubs_epi16(wabs, _mm256_sign_epi8(xq, wq));
        const __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
        acc[r][c] =
            _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_broadcast_ss(&st.d[j][c])), p, acc[r][c]);
      }
    }
  }
  PD_UNROLL for (int r = 0; r < R; ++r) {
    PD_UNROLL for (int c = 0; c < C; ++c) acc_mem[r][c] = acc[r][c];
  }
}

// Passes of PassRows(R, C) rows each over the same staged blocks; acc holds R rows.
template <int R, int C, int kTileR>
PD_ALWAYS_INLINE inline void Q8Passes(const char* w, size_t ws, const Q8Stage<C>& st, int64_t b0,
                                      int n, __m256 (*acc)[C]) {
  constexpr int P = PassRows(R, C);
  Q8Pass<P, C, kTileR>(w, ws, st, b0, n, acc);
  if constexpr (R > P) Q8Passes<R - P, C, kTileR>(w + P * ws, ws, st, b0, n, acc + P);
}

// One activation row (decode): the blocks read in place (staged, the Gemma 3 head from DRAM was
// 5-20% slower in the same runs; so was this row through Q8Pass, 13-25%).
template <int R>
void TileQ8Row(int64_t k, const char* w, size_t ws, const char* x, float* y) {
  const int64_t nb = k / kQ8_0BlockSize;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const BlockQ8_0* xb = reinterpret_cast<const BlockQ8_0*>(x) + b;
    const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb->qs));
    const float dx = HalfToFloat(xb->d);
    for (int r = 0; r < R; ++r) {
      const BlockQ8_0* wb = reinterpret_cast<const BlockQ8_0*>(w + r * ws) + b;
      // The same block of the next tile's rows: blocks are 34 bytes, so one prefetch per block
      // touches every 64-byte line.
      _mm_prefetch(reinterpret_cast<const char*>(wb) + R * ws, _MM_HINT_T1);
      const __m256i wq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb->qs));
      const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(wq, wq), _mm256_sign_epi8(xq, wq));
      const __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(HalfToFloat(wb->d) * dx), p, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) y[r] = HSum(acc[r]);
}

template <int R, int C>
void TileQ8(int64_t k, const char* w, size_t ws, const char* x, size_t xs, float* y, int64_t ys) {
  if constexpr (C == 1) {
    TileQ8Row<R>(k, w, ws, x, y);
  } else {
    const int64_t nb = k / kQ8_0BlockSize;
    Q8Stage<C> st;
    __m256 acc[R][C];
    PD_UNROLL for (int r = 0; r < R; ++r) {
      PD_UNROLL for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
    }
    for (int64_t b0 = 0; b0 < nb; b0 += Q8Stage<C>::kBlocks) {
      const int n = static_cast<int>(std::min<int64_t>(Q8Stage<C>::kBlocks, nb - b0));
      st.Fill(x, xs, b0, n);
      Q8Passes<R, C, R>(w, ws, st, b0, n, acc);
    }
    StoreTile<R, C>(acc, y, ys);
  }
}

// Q4_0 and Q5_0 unpack and dot their codes as the k-quant tiles do (the scheme is described
// at the top of k_quants_avx2.cc).

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
// most 3810 + 2032 in magnitude). The int32 lanes are then put back into ggml's layout (lane L:
// weights 4L..4L+3 of one block, vec_dot_q4_0_q8_0 and tinyBLAS alike) and each block takes its
// own FMA, in block order, so that every F32 step is ggml's. Per row and block pair: 5 ops to
// unpack, 1.5 for the scales; per column 14 (maddubs x2, sub x2, madd x2, perm x2, cvt x2,
// scale x2, fmadd x2) + 1. Leftover blocks (nb % 4) go one at a time.
template <int R, int C>
void TileQ4_0(int64_t k, const char* w, size_t ws, const char* x, size_t xs, float* y, int64_t ys) {
  const int64_t nb = k / BlockQ4_0::kWeights;
  const __m256i m4 = _mm256_set1_epi8(0x0F), eights = _mm256_set1_epi8(8);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    PD_UNROLL for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 4 <= nb; b += 4) {
    __m256i ya[C][2], yb[C][2], za[C][2], zb[C][2];
    __m128 dx[C];
    PD_UNROLL for (int c = 0; c < C; ++c) {
      const BlockQ8_0* xb = reinterpret_cast<const BlockQ8_0*>(x + c * xs) + b;
      PD_UNROLL for (int pr = 0; pr < 2; ++pr) {
        const __m256i y0 = Load32(xb[2 * pr].qs), y1 = Load32(xb[2 * pr + 1].qs);
        ya[c][pr] = _mm256_permute2x128_si256(y0, y1, 0x20);  // weights 0..15 of b | of b+1
        yb[c][pr] = _mm256_permute2x128_si256(y0, y1, 0x31);  // weights 16..31
        za[c][pr] = _mm256_maddubs_epi16(eights, ya[c][pr]);
        zb[c][pr] = _mm256_maddubs_epi16(eights, yb[c][pr]);
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
          // lo: lanes 0-3 weights 0..15 of b, 4-7 of b+1; hi: weights 16..31 likewise.
          const __m256i lo = _mm256_madd_epi16(
              _mm256_sub_epi16(_mm256_maddubs_epi16(ua[pr], ya[c][pr]), za[c][pr]), ones);
          const __m256i hi = _mm256_madd_epi16(
              _mm256_sub_epi16(_mm256_maddubs_epi16(ub[pr], yb[c][pr]), zb[c][pr]), ones);
          const __m256 s0 = _mm256_cvtepi32_ps(_mm256_permute2x128_si256(lo, hi, 0x20));
          const __m256 s1 = _mm256_cvtepi32_ps(_mm256_permute2x128_si256(lo, hi, 0x31));
          const __m256 d0 = _mm256_permutevar8x32_ps(d4, _mm256_set1_epi32(2 * pr));
          const __m256 d1 = _mm256_permutevar8x32_ps(d4, _mm256_set1_epi32(2 * pr + 1));
          acc[r][c] = _mm256_fmadd_ps(d0, s0, acc[r][c]);
          acc[r][c] = _mm256_fmadd_ps(d1, s1, acc[r][c]);
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

// Q5_0 x Q8_0. Each block is unpacked in weight order with its fifth bits ORed in (UnpackQ5_0,
// kernels_avx2_internal.h; grouped_avx2.cc's prompt kernel unpacks the same way).
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
  const __m256i sixteen = _mm256_set1_epi8(16);
  const __m256i ones = _mm256_set1_epi16(1);
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
      PD_UNROLL for (int j = 0; j < 4; ++j) u[j] = UnpackQ5_0(wb + j);
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
      const __m256i u = UnpackQ5_0(wb);
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

}  // namespace

namespace avx2 {

void GemmF32(int64_t k, const void* w, size_t w_stride, int nr, const void* x, size_t x_stride,
             int nc, float* y, int64_t y_stride) {
  TileTable<F32Tile>::Gemm(k, w, w_stride, nr, x, x_stride, nc, y, y_stride);
}

void GemmF16(int64_t k, const void* w, size_t w_stride, int nr, const void* x, size_t x_stride,
             int nc, float* y, int64_t y_stride) {
  TileTable<F16Tile>::Gemm(k, w, w_stride, nr, x, x_stride, nc, y, y_stride);
}

void GemmBf16(int64_t k, const void* w, size_t w_stride, int nr, const void* x, size_t x_stride,
              int nc, float* y, int64_t y_stride) {
  TileTable<Bf16Tile>::Gemm(k, w, w_stride, nr, x, x_stride, nc, y, y_stride);
}

// Q4_0, Q8_0 and Q5_0: the AVX512-VNNI tile when the CPU has it (same bits), else the AVX2 one.
void GemmQ4_0Dispatch(int64_t k, const void* w, size_t w_stride, int nr, const void* x,
                      size_t x_stride, int nc, float* y, int64_t y_stride) {
  static const GemmTileFn vnni = Q4_0TileVnni();
  (vnni != nullptr ? vnni : &TileTable<Q4_0Tile>::Gemm)(k, w, w_stride, nr, x, x_stride, nc, y,
                                                         y_stride);
}

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

}  // namespace avx2

void GemmQ8_0Avx2(int64_t k, const void* w, size_t w_stride, int nr, const void* x,
                  size_t x_stride, int nc, float* y, int64_t y_stride) {
  TileTable<Q8Tile>::Gemm(k, w, w_stride, nr, x, x_stride, nc, y, y_stride);
}

void GemmQ5_0Avx2(int64_t k, const void* w, size_t w_stride, int nr, const void* x,
                  size_t x_stride, int nc, float* y, int64_t y_stride) {
  TileTable<Q5_0Tile>::Gemm(k, w, w_stride, nr, x, x_stride, nc, y, y_stride);
}

void GemmQ4_0Avx2(int64_t k, const void* w, size_t w_stride, int nr, const void* x,
                  size_t x_stride, int nc, float* y, int64_t y_stride) {
  TileTable<Q4_0Tile>::Gemm(k, w, w_stride, nr, x, x_stride, nc, y, y_stride);
}

}  // namespace pd::engine::cpu

#else  // no AVX2 build

namespace pd::engine::cpu {
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
void GemmQ4_0Avx2(int64_t k, const void* w, size_t w_stride, int nr, const void* x,
                  size_t x_stride, int nc, float* y, int64_t y_stride) {
  ScalarKernels().gemm[static_cast<int>(GemmType::kQ4_0)](k, w, w_stride, nr, x, x_stride, nc, y,
                                                           y_stride);
}
}  // namespace pd::engine::cpu

#endif
