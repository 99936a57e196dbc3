// AVX2 elementwise row ops: sums of squares, scaling, add, SwiGLU, max, exp-sum and RoPE.
// Compiled with -mavx2 -mfma -mf16c and run only after SelectKernels() has checked the CPU;
// like every AVX2 file it calls no inline function from shared headers (see
// kernels_avx2_internal.h).
//
// Scalar twins in kernels_scalar.cc; see kernels.h.
#include "engine/backend/cpu/kernels.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <math.h>

#include "engine/backend/cpu/kernels_avx2_internal.h"

namespace pd::engine::cpu {
namespace {

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

}  // namespace

namespace avx2 {

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
  const int64_t fused = RopeNormalFusedPairs(half, RopeNormalOrder());
  for (int64_t i = 0; i < fused; ++i) {
    const float a = v[2 * i], b = v[2 * i + 1];
    v[2 * i] = __builtin_fmaf(a, c[i], -(b * s[i]));
    v[2 * i + 1] = __builtin_fmaf(a, s[i], b * c[i]);
  }
  for (int64_t i = fused; i < half; ++i) {
    const float a = v[2 * i], b = v[2 * i + 1];
    const float ac = RoundedF32(a * c[i]), bs = RoundedF32(b * s[i]);
    const float as = RoundedF32(a * s[i]), bc = RoundedF32(b * c[i]);
    v[2 * i] = ac - bs;
    v[2 * i + 1] = as + bc;
  }
}

}  // namespace avx2
}  // namespace pd::engine::cpu

#endif
