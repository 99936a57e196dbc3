// Attention's kernels in ggml's AVX2 order (AttnKernels, kernels.h; scalar twins in
// kernels_scalar.cc, the AVX-512 order in attention_avx512.cc).
// Compiled with -mavx2 -mfma -mf16c and run only after SelectKernels() has checked the CPU;
// like every AVX2 file it calls no inline function from shared headers (see
// kernels_avx2_internal.h).
#include "engine/backend/cpu/kernels.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <algorithm>
#include <type_traits>
#include <vector>

#include "engine/backend/cpu/kernels_avx2_internal.h"

namespace pd::engine::cpu {
namespace {

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
  const int64_t nf = GgmlDotTailFusedFrom(np, n, 8);
  for (int64_t i = np; i < nf; ++i) s += RoundedF32(a[i] * b[i]);
  for (int64_t i = nf; i < n; ++i) s = __builtin_fmaf(a[i], b[i], s);
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
  if (n_rows == 1) {  // one chain (AttnKernels::reduce): nothing to add
    std::copy(rows, rows + cols, out);
    return;
  }
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
  if (n_acc == 1) {  // one chain per column, the positions in order
    for (; c + 8 <= cols; c += 8) {
      __m256 acc = _mm256_setzero_ps();
      for (int64_t j = lo; j <= hi; ++j) {
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(v[j - lo] + c), _mm256_set1_ps(p[j - lo]), acc);
      }
      _mm256_storeu_ps(out + c, acc);
    }
  }
  for (; n_acc > 1 && c + 8 <= cols; c += 8) {
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

// Lane j of the result is AttnDotAvx2's lane sum of x[j], bit for bit: the two 128-bit halves
// added, then (t0 + t1) + (t2 + t3) as its two horizontal adds do, for 8 keys at once.
inline __m256 ReduceAdd8(const __m256* x) {
  __m256 t[4];  // t[m]: keys 2m and 2m + 1, 4 lanes each: x[i] + x[i + 4]
  for (int m = 0; m < 4; ++m) {
    t[m] = _mm256_add_ps(_mm256_permute2f128_ps(x[2 * m], x[2 * m + 1], 0x20),
                         _mm256_permute2f128_ps(x[2 * m], x[2 * m + 1], 0x31));
  }
  // (t0 + t1, t2 + t3) per key: keys 4n, 4n + 2 in the low half, 4n + 1, 4n + 3 in the high one.
  const __m256 h0 = _mm256_hadd_ps(t[0], t[1]);
  const __m256 h1 = _mm256_hadd_ps(t[2], t[3]);
  const __m256 r = _mm256_hadd_ps(h0, h1);  // keys 0, 2, 4, 6, 1, 3, 5, 7
  return _mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// 8 F32 values from F32 or (widened exactly) F16 ones; one value for the scalar tails.
inline __m256 Load8(const float* x) { return _mm256_loadu_ps(x); }
inline __m256 Load8(const uint16_t* x) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
}
inline float Value(const float* x, int64_t i) { return x[i]; }
inline float Value(const uint16_t* x, int64_t i) { return _cvtsh_ss(x[i]); }

// AttnDotAvx2 of up to 8 keys against NQ (<= 2) query heads: each key's 32-element step loaded
// once for both heads, the combined vectors summed by ReduceAdd8.
template <int NQ, typename T>
void AttnDotsBlockAvx2(const float* q, int64_t q_stride, const T* const* k, int n_k, int64_t n,
                       float* out, int64_t out_stride) {
  const int64_t np = n - n % 32;
  __m256 x[NQ][8];
  for (int j = 0; j < n_k; ++j) {
    __m256 acc[NQ][4];
    PD_UNROLL for (int g = 0; g < NQ; ++g) {
      PD_UNROLL for (int r = 0; r < 4; ++r) acc[g][r] = _mm256_setzero_ps();
    }
    const T* kj = k[j];
    for (int64_t i = 0; i < np; i += 32) {
      __m256 kv[4];
      PD_UNROLL for (int r = 0; r < 4; ++r) kv[r] = Load8(kj + i + 8 * r);
      PD_UNROLL for (int g = 0; g < NQ; ++g) {
        PD_UNROLL for (int r = 0; r < 4; ++r) {
          acc[g][r] =
              _mm256_fmadd_ps(kv[r], _mm256_loadu_ps(q + g * q_stride + i + 8 * r), acc[g][r]);
        }
      }
    }
    PD_UNROLL for (int g = 0; g < NQ; ++g) {
      x[g][j] =
          _mm256_add_ps(_mm256_add_ps(acc[g][0], acc[g][2]), _mm256_add_ps(acc[g][1], acc[g][3]));
    }
  }
  PD_UNROLL for (int g = 0; g < NQ; ++g) {
    for (int j = n_k; j < 8; ++j) x[g][j] = _mm256_setzero_ps();
    alignas(32) float s[8];
    _mm256_store_ps(s, ReduceAdd8(x[g]));
    const float* qg = q + g * q_stride;
    const int64_t nf = GgmlDotTailFusedFrom(np, n, 8);
    for (int j = 0; j < n_k; ++j) {
      float v = s[j];
      for (int64_t i = np; i < nf; ++i) v += RoundedF32(Value(k[j], i) * qg[i]);
      for (int64_t i = nf; i < n; ++i) v = __builtin_fmaf(Value(k[j], i), qg[i], v);
      out[g * out_stride + j] = v;
    }
  }
}

template <typename T>
void AttnDotsAvx2(const float* q, int64_t q_stride, int n_q, const T* const* k, int n_k, int64_t n,
                  float* out, int64_t out_stride) {
  for (int g = 0; g < n_q; g += 2) {
    const float* qg = q + g * q_stride;
    float* og = out + g * out_stride;
    for (int j = 0; j < n_k; j += 8) {
      const int nk = std::min(n_k - j, 8);
      if (n_q - g >= 2) {
        AttnDotsBlockAvx2<2, T>(qg, q_stride, k + j, nk, n, og + j, out_stride);
      } else {
        AttnDotsBlockAvx2<1, T>(qg, q_stride, k + j, nk, n, og + j, out_stride);
      }
    }
  }
}

// AttnVSumAvx2 for NQ heads over NC 8-column chunks from column c0, one accumulator (position
// modulo n_acc) at a time, each V segment loaded once for all NQ heads (NQ x NC <= 8
// accumulators). With 32 accumulators, l, l + 8, l + 16, l + 24 are combined as AttnReduceAvx2
// combines its rows; the 8 left are summed in its tree for that row count.
template <int NQ, int NC, typename T>
void AttnVSumsColsAvx2(const float* p, int64_t p_stride, const T* const* v, int64_t lo, int64_t hi,
                       int n_acc, int64_t c0, float* out, int64_t out_stride) {
  constexpr int kW = 8 * NC;
  // acc = the positions j, j + step, ... <= hi, in order from +0.
  auto walk = [&](int64_t j, int step, __m256(&acc)[NQ][NC]) __attribute__((always_inline)) {
    PD_UNROLL for (int g = 0; g < NQ; ++g) {
      PD_UNROLL for (int c = 0; c < NC; ++c) acc[g][c] = _mm256_setzero_ps();
    }
    for (; j <= hi; j += step) {
      const T* vr = v[j - lo] + c0;
      __m256 pg[NQ];
      PD_UNROLL for (int g = 0; g < NQ; ++g) pg[g] = _mm256_set1_ps(p[g * p_stride + (j - lo)]);
      PD_UNROLL for (int c = 0; c < NC; ++c) {
        const __m256 vv = Load8(vr + 8 * c);
        PD_UNROLL for (int g = 0; g < NQ; ++g) acc[g][c] = _mm256_fmadd_ps(vv, pg[g], acc[g][c]);
      }
    }
  };
  if (n_acc == 1) {  // one chain per (head, column), straight to out
    __m256 acc[NQ][NC];
    walk(lo, 1, acc);
    PD_UNROLL for (int g = 0; g < NQ; ++g) {
      PD_UNROLL for (int c = 0; c < NC; ++c) {
        _mm256_storeu_ps(out + g * out_stride + c0 + 8 * c, acc[g][c]);
      }
    }
    return;
  }
  alignas(32) float quad[4][NQ][kW];
  alignas(32) float part[NQ][8][kW];
  const int rounds = n_acc / 8;
  for (int l = 0; l < 8; ++l) {
    for (int a = 0; a < rounds; ++a) {
      const int r = l + 8 * a;
      __m256 acc[NQ][NC];
      walk(lo + ((r - lo % n_acc) + n_acc) % n_acc, n_acc, acc);
      float* dst = rounds == 1 ? &part[0][l][0] : &quad[a][0][0];
      const int64_t g_stride = rounds == 1 ? 8 * kW : kW;
      PD_UNROLL for (int g = 0; g < NQ; ++g) {
        PD_UNROLL for (int c = 0; c < NC; ++c) {
          _mm256_store_ps(dst + g * g_stride + 8 * c, acc[g][c]);
        }
      }
    }
    if (rounds == 1) continue;
    // (r[l] + r[l + 16]) + (r[l + 8] + r[l + 24])
    PD_UNROLL for (int g = 0; g < NQ; ++g) {
      for (int c = 0; c < kW; c += 8) {
        const __m256 x = _mm256_add_ps(
            _mm256_add_ps(_mm256_load_ps(&quad[0][g][c]), _mm256_load_ps(&quad[2][g][c])),
            _mm256_add_ps(_mm256_load_ps(&quad[1][g][c]), _mm256_load_ps(&quad[3][g][c])));
        _mm256_store_ps(&part[g][l][c], x);
      }
    }
  }
  PD_UNROLL for (int g = 0; g < NQ; ++g) {
    for (int c = 0; c < kW; c += 8) {
      __m256 q[4];
      PD_UNROLL for (int i = 0; i < 4; ++i) {
        q[i] = _mm256_add_ps(_mm256_load_ps(&part[g][i + 4][c]), _mm256_load_ps(&part[g][i][c]));
      }
      // AttnReduceAvx2's last step: (q0 + q2) + (q1 + q3) for 8 rows, pairs for 32.
      const __m256 s = rounds == 1
                           ? _mm256_add_ps(_mm256_add_ps(q[0], q[2]), _mm256_add_ps(q[1], q[3]))
                           : _mm256_add_ps(_mm256_add_ps(q[0], q[1]), _mm256_add_ps(q[2], q[3]));
      _mm256_storeu_ps(out + g * out_stride + c0 + c, s);
    }
  }
}

template <int NQ, typename T>
void AttnVSumsHeadsAvx2(const float* p, int64_t p_stride, const T* const* v, int64_t lo, int64_t hi,
                        int n_acc, int64_t cols, float* out, int64_t out_stride) {
  constexpr int kNc = NQ >= 3 ? 2 : 8 / NQ;  // NQ x kNc <= 8 accumulators of 16 registers
  int64_t c = 0;
  for (; c + 8 * kNc <= cols; c += 8 * kNc) {
    AttnVSumsColsAvx2<NQ, kNc, T>(p, p_stride, v, lo, hi, n_acc, c, out, out_stride);
  }
  for (; c + 8 <= cols; c += 8) {
    AttnVSumsColsAvx2<NQ, 1, T>(p, p_stride, v, lo, hi, n_acc, c, out, out_stride);
  }
  if (c < cols) {
    std::vector<const T*> vc(static_cast<size_t>(hi - lo + 1));
    for (int64_t j = lo; j <= hi; ++j) vc[j - lo] = v[j - lo] + c;
    if constexpr (std::is_same_v<T, float>) {
      ScalarAttnKernels(8).vsums(p, p_stride, NQ, vc.data(), lo, hi, n_acc, cols - c, out + c,
                                 out_stride);
    } else {
      ScalarAttnKernels(8).vsums_f16(p, p_stride, NQ, vc.data(), lo, hi, n_acc, cols - c, out + c,
                                     out_stride);
    }
  }
}

template <typename T>
void AttnVSumsAvx2(const float* p, int64_t p_stride, int n_q, const T* const* v, int64_t lo,
                   int64_t hi, int n_acc, int64_t cols, float* out, int64_t out_stride) {
  for (int g = 0; g < n_q; g += 4) {
    const float* pg = p + g * p_stride;
    float* og = out + g * out_stride;
    switch (std::min(n_q - g, 4)) {
      case 1:
        AttnVSumsHeadsAvx2<1, T>(pg, p_stride, v, lo, hi, n_acc, cols, og, out_stride);
        break;
      case 2:
        AttnVSumsHeadsAvx2<2, T>(pg, p_stride, v, lo, hi, n_acc, cols, og, out_stride);
        break;
      case 3:
        AttnVSumsHeadsAvx2<3, T>(pg, p_stride, v, lo, hi, n_acc, cols, og, out_stride);
        break;
      default:
        AttnVSumsHeadsAvx2<4, T>(pg, p_stride, v, lo, hi, n_acc, cols, og, out_stride);
        break;
    }
  }
}

// ---- The GEMM order (AttnKernels::qk_gemm / pv_gemm) ----------------------------------------
// Fully unrolled loops over a micro-tile's registers (GCC at -O2 would keep them in memory).
#define PD_GEMM_UNROLL _Pragma("GCC unroll 16")

// Scores of MQ queries against one block of 16 keys (two registers): one accumulator per
// (query, half block), one FMA per head-dim element in order, as the scalar twin's chains.
template <int MQ>
inline void QkTileAvx2(const float* const* q, const float* kt, int64_t n, float* const* out,
                       int64_t off, int lo, int hi) {
  __m256 acc[MQ * 2];
  PD_GEMM_UNROLL
  for (int i = 0; i < MQ * 2; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t d = 0; d < n; ++d) {
    const __m256 k0 = _mm256_loadu_ps(kt + d * 16), k1 = _mm256_loadu_ps(kt + d * 16 + 8);
    PD_GEMM_UNROLL
    for (int m = 0; m < MQ; ++m) {
      const __m256 qd = _mm256_broadcast_ss(q[m] + d);
      acc[m * 2] = _mm256_fmadd_ps(qd, k0, acc[m * 2]);
      acc[m * 2 + 1] = _mm256_fmadd_ps(qd, k1, acc[m * 2 + 1]);
    }
  }
  PD_GEMM_UNROLL
  for (int m = 0; m < MQ; ++m) {
    if (lo == 0 && hi == 16) {
      _mm256_storeu_ps(out[m] + off, acc[m * 2]);
      _mm256_storeu_ps(out[m] + off + 8, acc[m * 2 + 1]);
    } else {
      alignas(32) float t[16];
      _mm256_store_ps(t, acc[m * 2]);
      _mm256_store_ps(t + 8, acc[m * 2 + 1]);
      for (int l = lo; l < hi; ++l) out[m][off + l] = t[l];
    }
  }
}

void AttnQkGemmAvx2(const float* const* q, int n_q, const float* kt, int64_t n, int64_t first,
                    int64_t n_k, float* const* out) {
  if (n_k <= 0 || n_q <= 0) return;
  const int64_t end = first + n_k;
  for (int64_t b = first / 16; b * 16 < end; ++b) {
    const int64_t j0 = b * 16;
    const int lo = first > j0 ? static_cast<int>(first - j0) : 0;
    const int hi = end - j0 < 16 ? static_cast<int>(end - j0) : 16;
    const float* kb = kt + b * 16 * n;
    int m = 0;
    for (; m + 6 <= n_q; m += 6) QkTileAvx2<6>(q + m, kb, n, out + m, j0 - first, lo, hi);
    switch (n_q - m) {
      case 5:
        QkTileAvx2<5>(q + m, kb, n, out + m, j0 - first, lo, hi);
        break;
      case 4:
        QkTileAvx2<4>(q + m, kb, n, out + m, j0 - first, lo, hi);
        break;
      case 3:
        QkTileAvx2<3>(q + m, kb, n, out + m, j0 - first, lo, hi);
        break;
      case 2:
        QkTileAvx2<2>(q + m, kb, n, out + m, j0 - first, lo, hi);
        break;
      case 1:
        QkTileAvx2<1>(q + m, kb, n, out + m, j0 - first, lo, hi);
        break;
      default:
        break;
    }
  }
}

// Weighted sums of MQ queries over 16 columns from c0 (two registers), across positions [0, n_k).
template <int MQ>
inline void PvTileAvx2(const float* const* p, const float* v, int64_t v_stride, int64_t n_k,
                       float* const* acc, int64_t c0) {
  __m256 a[MQ * 2];
  PD_GEMM_UNROLL
  for (int m = 0; m < MQ; ++m) {
    a[m * 2] = _mm256_loadu_ps(acc[m] + c0);
    a[m * 2 + 1] = _mm256_loadu_ps(acc[m] + c0 + 8);
  }
  for (int64_t j = 0; j < n_k; ++j) {
    const __m256 v0 = _mm256_loadu_ps(v + j * v_stride + c0);
    const __m256 v1 = _mm256_loadu_ps(v + j * v_stride + c0 + 8);
    PD_GEMM_UNROLL
    for (int m = 0; m < MQ; ++m) {
      const __m256 pj = _mm256_broadcast_ss(p[m] + j);
      a[m * 2] = _mm256_fmadd_ps(pj, v0, a[m * 2]);
      a[m * 2 + 1] = _mm256_fmadd_ps(pj, v1, a[m * 2 + 1]);
    }
  }
  PD_GEMM_UNROLL
  for (int m = 0; m < MQ; ++m) {
    _mm256_storeu_ps(acc[m] + c0, a[m * 2]);
    _mm256_storeu_ps(acc[m] + c0 + 8, a[m * 2 + 1]);
  }
}

// Positions in runs of 64 (their V rows stay in L1/L2 across query groups and column chunks);
// columns past the last multiple of 16 one FMA at a time, in the same order.
void AttnPvGemmAvx2(const float* const* p, int n_q, const float* v, int64_t v_stride, int64_t n_k,
                    int64_t cols, float* const* acc) {
  const float* pr[6];
  const int64_t cv = cols - cols % 16;
  for (int64_t j0 = 0; j0 < n_k; j0 += 64) {
    const int64_t nj = n_k - j0 < 64 ? n_k - j0 : 64;
    const float* vj = v + j0 * v_stride;
    for (int m0 = 0; m0 < n_q; m0 += 6) {
      const int nq = n_q - m0 < 6 ? n_q - m0 : 6;
      for (int m = 0; m < nq; ++m) pr[m] = p[m0 + m] + j0;
      float* const* am = acc + m0;
      for (int64_t c0 = 0; c0 < cv; c0 += 16) {
        switch (nq) {
          case 6:
            PvTileAvx2<6>(pr, vj, v_stride, nj, am, c0);
            break;
          case 5:
            PvTileAvx2<5>(pr, vj, v_stride, nj, am, c0);
            break;
          case 4:
            PvTileAvx2<4>(pr, vj, v_stride, nj, am, c0);
            break;
          case 3:
            PvTileAvx2<3>(pr, vj, v_stride, nj, am, c0);
            break;
          case 2:
            PvTileAvx2<2>(pr, vj, v_stride, nj, am, c0);
            break;
          default:
            PvTileAvx2<1>(pr, vj, v_stride, nj, am, c0);
            break;
        }
      }
      for (int m = 0; m < nq; ++m) {
        for (int64_t c = cv; c < cols; ++c) {
          float a = am[m][c];
          for (int64_t j = 0; j < nj; ++j) a = __builtin_fmaf(pr[m][j], vj[j * v_stride + c], a);
          am[m][c] = a;
        }
      }
    }
  }
}

constexpr AttnKernels kAvx2Attn = {8,
                                   &AttnDotAvx2,
                                   &AttnExpSumAvx2,
                                   &AttnReduceAvx2,
                                   &AttnVSumAvx2,
                                   &AttnDotsAvx2<float>,
                                   &AttnVSumsAvx2<float>,
                                   &AttnDotsAvx2<uint16_t>,
                                   &AttnVSumsAvx2<uint16_t>,
                                   &AttnVSumsRowByRow<float, &AttnVSumsAvx2<float>>,
                                   &AttnVSumsRowByRow<uint16_t, &AttnVSumsAvx2<uint16_t>>,
                                   &AttnQkGemmAvx2,
                                   &AttnPvGemmAvx2};

inline __m256 SwiGlu8(__m256 g, __m256 u) {
  const __m256 e = GgmlExpAvx2(_mm256_sub_ps(_mm256_setzero_ps(), g));
  return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.f), e)), u);
}

}  // namespace

namespace avx2 {

// ggml_v_silu(g) * u on every element with ggml's vector expf of the width llama.cpp is built
// with here: AVX-512's where the CPU has it (and PDSERVE_CPU_ISA allows it), else AVX2's.
void SwiGluGgml(const float* g, const float* u, float* y, int64_t n) {
  static const SwiGluFn f512 = Avx512SwiGlu();
  if (f512 != nullptr) return f512(g, u, y, n);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, SwiGlu8(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
  }
  if (i < n) {
    alignas(32) float gt[8] = {}, ut[8] = {}, yt[8];
    for (int64_t j = i; j < n; ++j) gt[j - i] = g[j], ut[j - i] = u[j];
    _mm256_store_ps(yt, SwiGlu8(_mm256_load_ps(gt), _mm256_load_ps(ut)));
    for (int64_t j = i; j < n; ++j) y[j] = yt[j - i];
  }
}

// The AVX-512 order where the CPU has it (llama.cpp built for it uses that), else AVX2's.
const AttnKernels& Avx2TableAttn() {
  static const AttnKernels* const k = Avx512AttnKernels();
  return k != nullptr ? *k : kAvx2Attn;
}

}  // namespace avx2

const AttnKernels& Avx2AttnKernels() { return kAvx2Attn; }

}  // namespace pd::engine::cpu

#else  // no AVX2 build

namespace pd::engine::cpu {
const AttnKernels& Avx2AttnKernels() { return ScalarAttnKernels(8); }
}  // namespace pd::engine::cpu

#endif
