// AVX2 row conversions: F32 <-> F16 and BF16, and the Q8_0 and Q8_K activation quantizers.
// Compiled with -mavx2 -mfma -mf16c and run only after SelectKernels() has checked the CPU;
// like every AVX2 file it calls no inline function from shared headers (see
// kernels_avx2_internal.h).
//
// Scalar twins in kernels_scalar.cc; see kernels.h.
#include "engine/backend/cpu/kernels.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <cstring>

#include "engine/backend/cpu/kernels_avx2_internal.h"

namespace pd::engine::cpu {
namespace avx2 {

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

}  // namespace avx2
}  // namespace pd::engine::cpu

#endif
