// AVX2 kernels of the INT8 KV cache (engine/backend/kv_layout.h): the rotation into the stored
// basis (kv_rotation.h), quantization, and the dot and axpy of attention. The one-pass
// AVX-512 F16 rows are in kv_i8_avx512.cc.
// Compiled with -mavx2 -mfma -mf16c and run only after SelectKernels() has checked the CPU;
// like every AVX2 file it calls no inline function from shared headers (see
// kernels_avx2_internal.h).
//
// Scalar twins in kernels_scalar.cc; see kernels.h.
#include "engine/backend/cpu/kernels.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <math.h>

#include <algorithm>

#include "engine/backend/cpu/kernels_avx2_internal.h"

namespace pd::engine::cpu {
namespace {

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

inline __m256 LoadI8(const int8_t* p) {
  return _mm256_cvtepi32_ps(
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

}  // namespace

namespace avx2 {

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

void WidenI8(const int8_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, LoadI8(x + i));
  for (; i < n; ++i) y[i] = static_cast<float>(x[i]);
}

}  // namespace avx2
}  // namespace pd::engine::cpu

#endif
