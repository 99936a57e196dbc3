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

#include <cstring>

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

// Bit-exact with QuantizeRowQ8_0: same amax, same f32 reciprocal, x * id rounded half away from
// zero (truncate, then step away from zero when the dropped fraction is >= 0.5; both exact).
void QuantizeQ8_0(const float* x, BlockQ8_0* y, int64_t n) {
  const __m256 sign_mask = _mm256_set1_ps(-0.f);
  const __m256 half = _mm256_set1_ps(0.5f);
  const __m256 one = _mm256_set1_ps(1.f);
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
    const float d = _mm_cvtss_f32(m) / 127.f;
    const float id = d != 0.f ? 1.f / d : 0.f;
    y[b].d = FloatToHalf(d);
    const __m256 vid = _mm256_set1_ps(id);
    __m256i q[4];
    for (int j = 0; j < 4; ++j) {
      const __m256 s = _mm256_mul_ps(v[j], vid);
      const __m256 t = _mm256_round_ps(s, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
      const __m256 frac = _mm256_andnot_ps(sign_mask, _mm256_sub_ps(s, t));
      const __m256 step = _mm256_or_ps(_mm256_and_ps(s, sign_mask), one);  // +-1
      const __m256 r = _mm256_add_ps(t, _mm256_and_ps(step, _mm256_cmp_ps(frac, half, _CMP_GE_OQ)));
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

// ---- attention and row ops ------------------------------------------------------------------

float DotF32(const float* a, const float* b, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8)
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  float s = HSum(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

float DotF16F32(const uint16_t* a, const float* b, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(LoadF16(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(LoadF16(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(LoadF16(a + i), _mm256_loadu_ps(b + i), acc0);
  float s = HSum(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) s += HalfToFloat(a[i]) * b[i];
  return s;
}

void AxpyF32(float a, const float* x, float* y, int64_t n) {
  const __m256 va = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  }
  for (; i < n; ++i) y[i] += a * x[i];
}

void AxpyF16(float a, const uint16_t* x, float* y, int64_t n) {
  const __m256 va = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, LoadF16(x + i), _mm256_loadu_ps(y + i)));
  }
  for (; i < n; ++i) y[i] += a * HalfToFloat(x[i]);
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

constexpr Kernels kAvx2 = {
    .name = "avx2",
    .gemm = {&TileTable<F32Tile>::Gemm, &TileTable<F16Tile>::Gemm, &TileTable<Bf16Tile>::Gemm,
             &TileTable<Q8Tile>::Gemm},
    .f32_to_f16 = &F32ToF16,
    .f16_to_f32 = &F16ToF32,
    .f32_to_bf16 = &F32ToBf16,
    .bf16_to_f32 = &Bf16ToF32,
    .quantize_q8_0 = &QuantizeQ8_0,
    .dequantize_q8_0 = &DequantizeQ8_0,
    .dot_f32 = &DotF32,
    .dot_f16_f32 = &DotF16F32,
    .axpy_f32 = &AxpyF32,
    .axpy_f16 = &AxpyF16,
    .sum_squares = &SumSquares,
    .scale = &Scale,
    .scale_mul = &ScaleMul,
    .add = &Add,
    .swiglu = &SwiGlu,
    .max = &Max,
    .exp_sub_sum = &ExpSubSum,
};

}  // namespace

const Kernels* Avx2Kernels() { return &kAvx2; }

}  // namespace pd::engine::cpu

#else  // no AVX2 build

namespace pd::engine::cpu {
const Kernels* Avx2Kernels() { return nullptr; }
}  // namespace pd::engine::cpu

#endif
