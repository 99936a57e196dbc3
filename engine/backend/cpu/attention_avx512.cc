// Attention's kernels in ggml-cpu's AVX-512 order (AttnKernels, kernels.h): what llama.cpp built
// for a CPU with AVX512F and AVX512DQ computes, op for op, so that an F32 K/V cache gives the same
// bits as llama.cpp there. This file alone is compiled with -mavx512f -mavx512dq; its kernels run
// only when CPUID reports both (and the OS saves ZMM state). The lane sums use GCC's
// _mm512_reduce_add_ps, as llama.cpp's build on the same compiler does; their order is spelled
// out in the scalar twins (kernels_scalar.cc), which the tests compare against bit for bit.
#include "engine/backend/cpu/kernels.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512DQ__)

#include <cpuid.h>
#include <immintrin.h>

// GCC 12 warns that the don't-care operands (_mm512_undefined_*()) inside its own AVX-512
// intrinsics (extract, scalef) are uninitialized; nothing here reads an undefined value.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

// Fully unrolls the loop that follows (heads, units, column chunks: at most 16), so that the
// accumulator arrays stay in registers: GCC at -O2 does not peel such nests itself and kept
// them in a stack array, a load and a store around every FMA.
#define PD_ATTN_UNROLL _Pragma("GCC unroll 16")

namespace pd::engine::cpu {
namespace {

// ggml_vec_dot_f32: four 16-lane FMA accumulators over steps of 64 elements, (a0 + a2) + (a1 + a3),
// then the lane sum; the elements past the last full step as GCC compiles ggml's
// (GgmlDotTailFusedFrom: whole groups of 8 unfused, then one FMA each).
float AttnDot512(const float* a, const float* b, int64_t n) {
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                   _mm512_setzero_ps()};
  const int64_t np = n - n % 64;
  for (int64_t i = 0; i < np; i += 64) {
    for (int r = 0; r < 4; ++r) {
      acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16 * r), _mm512_loadu_ps(b + i + 16 * r),
                               acc[r]);
    }
  }
  const __m512 x = _mm512_add_ps(_mm512_add_ps(acc[0], acc[2]), _mm512_add_ps(acc[1], acc[3]));
  float s = _mm512_reduce_add_ps(x);
  const int64_t nf = GgmlDotTailFusedFrom(np, n, 16);
  for (int64_t i = np; i < nf; ++i) s += RoundedF32(a[i] * b[i]);
  for (int64_t i = nf; i < n; ++i) s = __builtin_fmaf(a[i], b[i], s);
  return s;
}

// ggml's AVX-512 expf: x = n ln2 + b, j = 1 + p(b) with the last step fused, and 2^n applied by
// VSCALEFPS; |n| > 192 gives 0 (n < 0) or +inf.
inline __m512 GgmlExp512(__m512 x) {
  const __m512 r = _mm512_set1_ps(0x1.8p23f);
  const __m512 z = _mm512_fmadd_ps(x, _mm512_set1_ps(0x1.715476p+0f), r);
  const __m512 n = _mm512_sub_ps(z, r);
  const __m512 b = _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.7f7d1cp-20f),
                                    _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.62e4p-1f), x));
  const __mmask16 far = _mm512_cmp_ps_mask(_mm512_abs_ps(n), _mm512_set1_ps(192.f), _CMP_GT_OQ);
  const __m512 u = _mm512_mul_ps(b, b);
  const __m512 j = _mm512_fmadd_ps(
      _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_set1_ps(0x1.0e4020p-7f), b,
                                      _mm512_set1_ps(0x1.573e2ep-5f)),
                      u,
                      _mm512_fmadd_ps(_mm512_set1_ps(0x1.555e66p-3f), b,
                                      _mm512_set1_ps(0x1.fffdb6p-2f))),
      u, _mm512_fmadd_ps(_mm512_set1_ps(0x1.ffffecp-1f), b, _mm512_set1_ps(1.f)));
  const __m512 res = _mm512_scalef_ps(j, n);
  if (far == 0) return res;
  const __mmask16 non_positive = _mm512_cmp_ps_mask(n, _mm512_setzero_ps(), _CMP_LE_OQ);
  const __m512 limit =
      _mm512_mask_blend_ps(non_positive, _mm512_set1_ps(__builtin_inff()), _mm512_setzero_ps());
  return _mm512_mask_blend_ps(far, res, limit);
}

double AttnExpSum512(const float* x, float max, float* y, int64_t n) {
  const __m512 vm = _mm512_set1_ps(max);
  double sum = 0.0;
  for (int64_t i = 0; i + 16 <= n; i += 16) {
    const __m512 e = GgmlExp512(_mm512_sub_ps(_mm512_loadu_ps(x + i), vm));
    _mm512_storeu_ps(y + i, e);
    sum += static_cast<double>(_mm512_reduce_add_ps(e));
  }
  return sum;
}

// The lane-sum tree of _mm512_reduce_add_ps applied to rows (lane l = row l), 16 columns at a
// time: h = r[l + 8] + r[l], q = h[i + 4] + h[i], (q0 + q2) + (q1 + q3). With 64 rows (ggml_vec_dot_f32's
// four accumulators) row l first becomes (r[l] + r[l + 32]) + (r[l + 16] + r[l + 48]).
void AttnReduce512(const float* rows, int n_rows, int64_t stride, int64_t cols, float* out) {
  if (n_rows == 1) {  // one chain (AttnKernels::reduce): nothing to add
    std::copy(rows, rows + cols, out);
    return;
  }
  int64_t c = 0;
  for (; c + 16 <= cols; c += 16) {
    auto row = [&](int r) { return _mm512_loadu_ps(rows + r * stride + c); };
    __m512 v[16];
    for (int l = 0; l < 16; ++l) {
      v[l] = n_rows == 16 ? row(l)
                          : _mm512_add_ps(_mm512_add_ps(row(l), row(l + 32)),
                                          _mm512_add_ps(row(l + 16), row(l + 48)));
    }
    __m512 h[8];
    for (int i = 0; i < 8; ++i) h[i] = _mm512_add_ps(v[i + 8], v[i]);
    __m512 q[4];
    for (int i = 0; i < 4; ++i) q[i] = _mm512_add_ps(h[i + 4], h[i]);
    _mm512_storeu_ps(out + c, _mm512_add_ps(_mm512_add_ps(q[0], q[2]), _mm512_add_ps(q[1], q[3])));
  }
  if (c < cols) ScalarAttnKernels(16).reduce(rows + c, n_rows, stride, cols - c, out + c);
}

// AttnVSumRef<16> with the accumulators of 16 columns in registers: one pass over the positions
// per group of 16 accumulators (n_acc / 16 passes), each partial parked in `part`, then the tree.
void AttnVSum512(const float* p, const float* const* v, int64_t lo, int64_t hi, int n_acc,
                 int64_t cols, float* out) {
  const int passes = n_acc / 16;
  int64_t c = 0;
  if (n_acc == 1) {  // one chain per column, the positions in order
    for (; c + 16 <= cols; c += 16) {
      __m512 acc = _mm512_setzero_ps();
      for (int64_t j = lo; j <= hi; ++j) {
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(v[j - lo] + c), _mm512_set1_ps(p[j - lo]), acc);
      }
      _mm512_storeu_ps(out + c, acc);
    }
  }
  for (; n_acc > 1 && c + 16 <= cols; c += 16) {
    alignas(64) float part[4][16][16];
    for (int a = 0; a < passes; ++a) {
      __m512 acc[16];
      for (int l = 0; l < 16; ++l) acc[l] = _mm512_setzero_ps();
      for (int64_t blk = lo / 16; blk * 16 <= hi; ++blk) {
        if (blk % passes != a) continue;
        const int64_t j0 = blk * 16 > lo ? blk * 16 : lo;
        const int64_t j1 = blk * 16 + 15 < hi ? blk * 16 + 15 : hi;
        if (j0 == blk * 16 && j1 == blk * 16 + 15) {  // a whole group: lanes 0..15 in order
          for (int l = 0; l < 16; ++l) {
            acc[l] = _mm512_fmadd_ps(_mm512_loadu_ps(v[j0 + l - lo] + c),
                                     _mm512_set1_ps(p[j0 + l - lo]), acc[l]);
          }
          continue;
        }
        for (int64_t j = j0; j <= j1; ++j) {
          const int l = static_cast<int>(j % 16);
          acc[l] = _mm512_fmadd_ps(_mm512_loadu_ps(v[j - lo] + c), _mm512_set1_ps(p[j - lo]),
                                   acc[l]);
        }
      }
      for (int l = 0; l < 16; ++l) _mm512_store_ps(part[a][l], acc[l]);
    }
    AttnReduce512(&part[0][0][0], n_acc, 16, 16, out + c);
  }
  if (c < cols) {  // the last columns through the reference
    std::vector<const float*> vc(static_cast<size_t>(hi - lo + 1));
    for (int64_t j = lo; j <= hi; ++j) vc[j - lo] = v[j - lo] + c;
    ScalarAttnKernels(16).vsum(p, vc.data(), lo, hi, n_acc, cols - c, out + c);
  }
}

// Lane j of the result is _mm512_reduce_add_ps(x[j]), bit for bit: the same three levels of
// adds per key (upper 256 bits onto the lower, upper 128 onto the lower, then (q0 + q2) +
// (q1 + q3)), done for 16 keys at once by interleaving the keys' halves into whole vectors.
// 15 adds and 30 shuffles for 16 keys instead of 16 x (4 adds + 4 shuffles).
inline __m512 ReduceAdd16(const __m512* x) {
  __m512 h[8];  // h[m]: keys 2m and 2m + 1, 8 lanes each: x[i] + x[i + 8]
  for (int m = 0; m < 8; ++m) {
    h[m] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * m], x[2 * m + 1], 0x44),
                         _mm512_shuffle_f32x4(x[2 * m], x[2 * m + 1], 0xEE));
  }
  __m512 q[4];  // q[n]: 128-bit lane k = key 4n + k, 4 lanes each: h[i] + h[i + 4]
  for (int n = 0; n < 4; ++n) {
    q[n] = _mm512_add_ps(_mm512_shuffle_f32x4(h[2 * n], h[2 * n + 1], 0x88),
                         _mm512_shuffle_f32x4(h[2 * n], h[2 * n + 1], 0xDD));
  }
  __m512 y[2];  // y[p]: lane k = (q0 + q2, q1 + q3) of key 8p + k, then of key 8p + 4 + k
  for (int p = 0; p < 2; ++p) {
    y[p] = _mm512_add_ps(_mm512_shuffle_ps(q[2 * p], q[2 * p + 1], 0x44),
                         _mm512_shuffle_ps(q[2 * p], q[2 * p + 1], 0xEE));
  }
  // Element 4k + m holds key 4m + k.
  const __m512 r =
      _mm512_add_ps(_mm512_shuffle_ps(y[0], y[1], 0x88), _mm512_shuffle_ps(y[0], y[1], 0xDD));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(order, r);
}

// 16 F32 values from F32 or (widened exactly) F16 ones; one value for the scalar tails.
inline __m512 Load16(const float* x) { return _mm512_loadu_ps(x); }
inline __m512 Load16(const uint16_t* x) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
}
inline float Value(const float* x, int64_t i) { return x[i]; }
inline float Value(const uint16_t* x, int64_t i) { return _cvtsh_ss(x[i]); }

// AttnDot512 of up to 16 keys against NQ query heads: each key's 64-element step is loaded once
// for all NQ heads (4 NQ accumulators in registers), the combined vectors are parked and summed
// by ReduceAdd16. Per pair and 64 elements: 4 FMAs, 4 query loads, 4 / NQ key loads.
template <int NQ, typename T>
void AttnDotsBlock512(const float* q, int64_t q_stride, const T* const* k, int n_k, int64_t n,
                      float* out, int64_t out_stride) {
  const int64_t np = n - n % 64;
  __m512 x[NQ][16];
  for (int j = 0; j < n_k; ++j) {
    __m512 acc[NQ][4];
    PD_ATTN_UNROLL for (int g = 0; g < NQ; ++g) {
      PD_ATTN_UNROLL for (int r = 0; r < 4; ++r) acc[g][r] = _mm512_setzero_ps();
    }
    const T* kj = k[j];
    for (int64_t i = 0; i < np; i += 64) {
      __m512 kv[4];
      PD_ATTN_UNROLL for (int r = 0; r < 4; ++r) kv[r] = Load16(kj + i + 16 * r);
      PD_ATTN_UNROLL for (int g = 0; g < NQ; ++g) {
        PD_ATTN_UNROLL for (int r = 0; r < 4; ++r) {
          acc[g][r] =
              _mm512_fmadd_ps(kv[r], _mm512_loadu_ps(q + g * q_stride + i + 16 * r), acc[g][r]);
        }
      }
    }
    PD_ATTN_UNROLL for (int g = 0; g < NQ; ++g) {
      x[g][j] =
          _mm512_add_ps(_mm512_add_ps(acc[g][0], acc[g][2]), _mm512_add_ps(acc[g][1], acc[g][3]));
    }
  }
  PD_ATTN_UNROLL for (int g = 0; g < NQ; ++g) {
    for (int j = n_k; j < 16; ++j) x[g][j] = _mm512_setzero_ps();
    alignas(64) float s[16];
    _mm512_store_ps(s, ReduceAdd16(x[g]));
    const float* qg = q + g * q_stride;
    const int64_t nf = GgmlDotTailFusedFrom(np, n, 16);
    for (int j = 0; j < n_k; ++j) {
      float v = s[j];
      for (int64_t i = np; i < nf; ++i) v += RoundedF32(Value(k[j], i) * qg[i]);
      for (int64_t i = nf; i < n; ++i) v = __builtin_fmaf(Value(k[j], i), qg[i], v);
      out[g * out_stride + j] = v;
    }
  }
}

template <typename T>
void AttnDotsT512(const float* q, int64_t q_stride, int n_q, const T* const* k, int n_k, int64_t n,
                  float* out, int64_t out_stride) {
  for (int g = 0; g < n_q; g += 4) {
    const float* qg = q + g * q_stride;
    float* og = out + g * out_stride;
    for (int j = 0; j < n_k; j += 16) {
      const int nk = n_k - j < 16 ? n_k - j : 16;
      switch (n_q - g < 4 ? n_q - g : 4) {
        case 1:
          AttnDotsBlock512<1, T>(qg, q_stride, k + j, nk, n, og + j, out_stride);
          break;
        case 2:
          AttnDotsBlock512<2, T>(qg, q_stride, k + j, nk, n, og + j, out_stride);
          break;
        case 3:
          AttnDotsBlock512<3, T>(qg, q_stride, k + j, nk, n, og + j, out_stride);
          break;
        default:
          AttnDotsBlock512<4, T>(qg, q_stride, k + j, nk, n, og + j, out_stride);
          break;
      }
    }
  }
}

// AttnVSum512 for NQ heads over NC 16-column chunks starting at column c0, one accumulator
// (position modulo n_acc) at a time: its positions j, j + n_acc, ... in order, each V segment
// loaded once and FMA'd into all NQ heads' registers (NQ x NC accumulators, at most 16). The
// accumulators of l, l + 16, l + 32, l + 48 are combined as AttnReduce512 combines its 64 rows,
// and the 16 rows left go through its tree.
template <int NQ, int NC, typename T>
void AttnVSumsCols512(const float* p, int64_t p_stride, const T* const* v, int64_t lo, int64_t hi,
                      int n_acc, int64_t c0, float* out, int64_t out_stride) {
  constexpr int kW = 16 * NC;
  // acc = the positions j, j + step, ... <= hi, in order from +0.
  auto walk = [&](int64_t j, int step, __m512(&acc)[NQ][NC]) __attribute__((always_inline)) {
    PD_ATTN_UNROLL for (int g = 0; g < NQ; ++g) {
      PD_ATTN_UNROLL for (int c = 0; c < NC; ++c) acc[g][c] = _mm512_setzero_ps();
    }
    for (; j <= hi; j += step) {
      const T* vr = v[j - lo] + c0;
      __m512 pg[NQ];
      PD_ATTN_UNROLL for (int g = 0; g < NQ; ++g) {
        pg[g] = _mm512_set1_ps(p[g * p_stride + (j - lo)]);
      }
      PD_ATTN_UNROLL for (int c = 0; c < NC; ++c) {
        const __m512 vv = Load16(vr + 16 * c);
        PD_ATTN_UNROLL for (int g = 0; g < NQ; ++g) {
          acc[g][c] = _mm512_fmadd_ps(vv, pg[g], acc[g][c]);
        }
      }
    }
  };
  if (n_acc == 1) {  // one chain per (head, column), straight to out
    __m512 acc[NQ][NC];
    walk(lo, 1, acc);
    PD_ATTN_UNROLL for (int g = 0; g < NQ; ++g) {
      PD_ATTN_UNROLL for (int c = 0; c < NC; ++c) {
        _mm512_storeu_ps(out + g * out_stride + c0 + 16 * c, acc[g][c]);
      }
    }
    return;
  }
  alignas(64) float quad[4][NQ][kW];
  alignas(64) float part[NQ][16][kW];
  const int rounds = n_acc / 16;
  for (int l = 0; l < 16; ++l) {
    for (int a = 0; a < rounds; ++a) {
      const int r = l + 16 * a;
      __m512 acc[NQ][NC];
      walk(lo + ((r - lo % n_acc) + n_acc) % n_acc, n_acc, acc);
      float* dst = rounds == 1 ? &part[0][l][0] : &quad[a][0][0];
      const int64_t g_stride = rounds == 1 ? 16 * kW : kW;
      PD_ATTN_UNROLL for (int g = 0; g < NQ; ++g) {
        PD_ATTN_UNROLL for (int c = 0; c < NC; ++c) {
          _mm512_store_ps(dst + g * g_stride + 16 * c, acc[g][c]);
        }
      }
    }
    if (rounds == 1) continue;
    // (r[l] + r[l + 32]) + (r[l + 16] + r[l + 48])
    PD_ATTN_UNROLL for (int g = 0; g < NQ; ++g) {
      PD_ATTN_UNROLL for (int c = 0; c < kW; c += 16) {
        const __m512 x = _mm512_add_ps(
            _mm512_add_ps(_mm512_load_ps(&quad[0][g][c]), _mm512_load_ps(&quad[2][g][c])),
            _mm512_add_ps(_mm512_load_ps(&quad[1][g][c]), _mm512_load_ps(&quad[3][g][c])));
        _mm512_store_ps(&part[g][l][c], x);
      }
    }
  }
  PD_ATTN_UNROLL for (int g = 0; g < NQ; ++g) {
    AttnReduce512(&part[g][0][0], 16, kW, kW, out + g * out_stride + c0);
  }
}

template <int NQ, typename T>
void AttnVSumsHeads512(const float* p, int64_t p_stride, const T* const* v, int64_t lo, int64_t hi,
                       int n_acc, int64_t cols, float* out, int64_t out_stride) {
  constexpr int kNc = 16 / (NQ == 3 ? 4 : NQ);  // chunks per pass: NQ x kNc <= 16 accumulators
  int64_t c = 0;
  for (; c + 16 * kNc <= cols; c += 16 * kNc) {
    AttnVSumsCols512<NQ, kNc, T>(p, p_stride, v, lo, hi, n_acc, c, out, out_stride);
  }
  for (; c + 16 <= cols; c += 16) {
    AttnVSumsCols512<NQ, 1, T>(p, p_stride, v, lo, hi, n_acc, c, out, out_stride);
  }
  if (c < cols) {  // the last columns through the scalar reference
    std::vector<const T*> vc(static_cast<size_t>(hi - lo + 1));
    for (int64_t j = lo; j <= hi; ++j) vc[j - lo] = v[j - lo] + c;
    if constexpr (std::is_same_v<T, float>) {
      ScalarAttnKernels(16).vsums(p, p_stride, NQ, vc.data(), lo, hi, n_acc, cols - c, out + c,
                                  out_stride);
    } else {
      ScalarAttnKernels(16).vsums_f16(p, p_stride, NQ, vc.data(), lo, hi, n_acc, cols - c, out + c,
                                      out_stride);
    }
  }
}

template <typename T>
void AttnVSumsT512(const float* p, int64_t p_stride, int n_q, const T* const* v, int64_t lo,
                   int64_t hi, int n_acc, int64_t cols, float* out, int64_t out_stride) {
  for (int g = 0; g < n_q; g += 4) {
    const float* pg = p + g * p_stride;
    float* og = out + g * out_stride;
    switch (n_q - g < 4 ? n_q - g : 4) {
      case 1:
        AttnVSumsHeads512<1, T>(pg, p_stride, v, lo, hi, n_acc, cols, og, out_stride);
        break;
      case 2:
        AttnVSumsHeads512<2, T>(pg, p_stride, v, lo, hi, n_acc, cols, og, out_stride);
        break;
      case 3:
        AttnVSumsHeads512<3, T>(pg, p_stride, v, lo, hi, n_acc, cols, og, out_stride);
        break;
      default:
        AttnVSumsHeads512<4, T>(pg, p_stride, v, lo, hi, n_acc, cols, og, out_stride);
        break;
    }
  }
}

// ---- vsums_rows: (row, head) units of a prompt's rows sharing the V rows ----------------------
// A unit u is one query row's head: probabilities p[u][j - lo[u]] for positions j in
// [lo[u], hi[u]], output row out[u]. AttnVSumsCols512's loop with U units instead of NQ heads:
// per accumulator (position modulo n_acc) the positions in order, each V segment loaded once and
// FMA'd into every unit whose range holds the position; a unit's accumulator sees exactly the
// positions, in the order, of its own vsum. `pt` holds the probabilities position-major,
// pt[(j - lo_min) * U + u], so that a position's U weights are one cache line.
struct VSumsUnits {
  const float* p[16];
  int64_t lo[16], hi[16];
  float* out[16];
  int64_t lo_min, hi_max, lo_all, hi_all;  // union and common ranges
};

template <int U, int NC, typename T>
void AttnVSumsUnitsCols512(const VSumsUnits& un, const float* pt, const T* const* v, int64_t base,
                           int n_acc, int64_t c0) {
  constexpr int kW = 16 * NC;
  // acc = the positions j, j + step, ... <= hi_max, in order from +0, each unit its own.
  auto walk = [&](int64_t j, int step, __m512(&acc)[U][NC]) __attribute__((always_inline)) {
    PD_ATTN_UNROLL for (int u = 0; u < U; ++u) {
      PD_ATTN_UNROLL for (int c = 0; c < NC; ++c) acc[u][c] = _mm512_setzero_ps();
    }
    auto add = [&](int64_t pos, bool check) __attribute__((always_inline)) {
      const T* vr = v[pos - base] + c0;
      const float* w = pt + (pos - un.lo_min) * U;
      __m512 vv[NC];
      PD_ATTN_UNROLL for (int c = 0; c < NC; ++c) vv[c] = Load16(vr + 16 * c);
      PD_ATTN_UNROLL for (int u = 0; u < U; ++u) {
        if (check && (pos < un.lo[u] || pos > un.hi[u])) continue;
        const __m512 pu = _mm512_set1_ps(w[u]);
        PD_ATTN_UNROLL for (int c = 0; c < NC; ++c) {
          acc[u][c] = _mm512_fmadd_ps(vv[c], pu, acc[u][c]);
        }
      }
    };
    for (; j <= un.hi_max && j < un.lo_all; j += step) add(j, true);
    for (; j <= un.hi_all; j += step) add(j, false);
    for (; j <= un.hi_max; j += step) add(j, true);
  };
  if (n_acc == 1) {  // one chain per (unit, column), straight to out
    __m512 acc[U][NC];
    walk(un.lo_min, 1, acc);
    PD_ATTN_UNROLL for (int u = 0; u < U; ++u) {
      PD_ATTN_UNROLL for (int c = 0; c < NC; ++c)
          _mm512_storeu_ps(un.out[u] + c0 + 16 * c, acc[u][c]);
    }
    return;
  }
  alignas(64) float quad[4][U][kW];
  alignas(64) float part[U][16][kW];
  const int rounds = n_acc / 16;
  for (int l = 0; l < 16; ++l) {
    for (int a = 0; a < rounds; ++a) {
      const int r = l + 16 * a;
      __m512 acc[U][NC];
      walk(un.lo_min + ((r - un.lo_min % n_acc) + n_acc) % n_acc, n_acc, acc);
      float* dst = rounds == 1 ? &part[0][l][0] : &quad[a][0][0];
      const int64_t u_stride = rounds == 1 ? 16 * kW : kW;
      PD_ATTN_UNROLL for (int u = 0; u < U; ++u) {
        PD_ATTN_UNROLL for (int c = 0; c < NC; ++c) {
          _mm512_store_ps(dst + u * u_stride + 16 * c, acc[u][c]);
        }
      }
    }
    if (rounds == 1) continue;
    // (r[l] + r[l + 32]) + (r[l + 16] + r[l + 48])
    PD_ATTN_UNROLL for (int u = 0; u < U; ++u) {
      PD_ATTN_UNROLL for (int c = 0; c < kW; c += 16) {
        const __m512 x = _mm512_add_ps(
            _mm512_add_ps(_mm512_load_ps(&quad[0][u][c]), _mm512_load_ps(&quad[2][u][c])),
            _mm512_add_ps(_mm512_load_ps(&quad[1][u][c]), _mm512_load_ps(&quad[3][u][c])));
        _mm512_store_ps(&part[u][l][c], x);
      }
    }
  }
  PD_ATTN_UNROLL for (int u = 0; u < U; ++u) {
    AttnReduce512(&part[u][0][0], 16, kW, kW, un.out[u] + c0);
  }
}

template <int U, typename T>
void AttnVSumsUnits512(VSumsUnits& un, const T* const* v, int64_t base, int n_acc, int64_t cols) {
  un.lo_min = un.lo_all = un.lo[0];
  un.hi_max = un.hi_all = un.hi[0];
  for (int u = 1; u < U; ++u) {
    un.lo_min = un.lo[u] < un.lo_min ? un.lo[u] : un.lo_min;
    un.lo_all = un.lo[u] > un.lo_all ? un.lo[u] : un.lo_all;
    un.hi_max = un.hi[u] > un.hi_max ? un.hi[u] : un.hi_max;
    un.hi_all = un.hi[u] < un.hi_all ? un.hi[u] : un.hi_all;
  }
  thread_local std::vector<float> pt;
  pt.resize(static_cast<size_t>((un.hi_max - un.lo_min + 1) * U));
  for (int u = 0; u < U; ++u) {
    for (int64_t j = un.lo[u]; j <= un.hi[u]; ++j)
      pt[(j - un.lo_min) * U + u] = un.p[u][j - un.lo[u]];
  }
  constexpr int kNc = 16 / U;
  int64_t c = 0;
  for (; c + 16 * kNc <= cols; c += 16 * kNc) {
    AttnVSumsUnitsCols512<U, kNc, T>(un, pt.data(), v, base, n_acc, c);
  }
  if constexpr (kNc > 1) {
    for (; c + 16 <= cols; c += 16)
      AttnVSumsUnitsCols512<U, 1, T>(un, pt.data(), v, base, n_acc, c);
  }
  if (c < cols) {  // the last columns through the scalar reference, unit by unit
    for (int u = 0; u < U; ++u) {
      std::vector<const T*> vc(static_cast<size_t>(un.hi[u] - un.lo[u] + 1));
      for (int64_t j = un.lo[u]; j <= un.hi[u]; ++j) vc[j - un.lo[u]] = v[j - base] + c;
      if constexpr (std::is_same_v<T, float>) {
        ScalarAttnKernels(16).vsums(un.p[u], 0, 1, vc.data(), un.lo[u], un.hi[u], n_acc, cols - c,
                                    un.out[u] + c, 0);
      } else {
        ScalarAttnKernels(16).vsums_f16(un.p[u], 0, 1, vc.data(), un.lo[u], un.hi[u], n_acc,
                                        cols - c, un.out[u] + c, 0);
      }
    }
  }
}

// The n_rows x n_q units in groups of 16 (one V segment per 16 FMAs), then 8, 4, 2, 1 (more
// columns per pass, 16 accumulators in all).
template <typename T>
void AttnVSumsRowsT512(const float* const* p, int64_t p_stride, int n_q, int n_rows,
                       const T* const* v, int64_t base, const int64_t* lo, const int64_t* hi,
                       int n_acc, int64_t cols, float* const* out, int64_t out_stride) {
  const int n_units = n_q * n_rows;
  VSumsUnits un;
  for (int u0 = 0; u0 < n_units;) {
    const int left = n_units - u0;
    const int nu = left >= 16 ? 16 : left >= 8 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1;
    for (int i = 0; i < nu; ++i) {
      const int r = (u0 + i) / n_q, g = (u0 + i) % n_q;
      un.p[i] = p[r] + g * p_stride;
      un.lo[i] = lo[r];
      un.hi[i] = hi[r];
      un.out[i] = out[r] + g * out_stride;
    }
    switch (nu) {
      case 16:
        AttnVSumsUnits512<16, T>(un, v, base, n_acc, cols);
        break;
      case 8:
        AttnVSumsUnits512<8, T>(un, v, base, n_acc, cols);
        break;
      case 4:
        AttnVSumsUnits512<4, T>(un, v, base, n_acc, cols);
        break;
      case 2:
        AttnVSumsUnits512<2, T>(un, v, base, n_acc, cols);
        break;
      default:
        AttnVSumsUnits512<1, T>(un, v, base, n_acc, cols);
        break;
    }
    u0 += nu;
  }
}

// ---- The GEMM order (AttnKernels::qk_gemm / pv_gemm) ----------------------------------------
// Scores of MQ queries against NB blocks of 16 keys: one accumulator register per (query, block),
// one FMA per head-dim element, in order (the scalar twin's chain per lane). `mask[b]` picks the
// lanes of block b to store, at out[m] + off[b].
template <int MQ, int NB>
inline void QkTile512(const float* const* q, const float* kt, int64_t n, float* const* out,
                      const int64_t* off, const __mmask16* mask) {
  __m512 acc[MQ * NB];
  PD_ATTN_UNROLL
  for (int i = 0; i < MQ * NB; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t d = 0; d < n; ++d) {
    __m512 k[NB];
    PD_ATTN_UNROLL
    for (int b = 0; b < NB; ++b) k[b] = _mm512_loadu_ps(kt + b * kAttnKeyBlock * n + d * 16);
    PD_ATTN_UNROLL
    for (int m = 0; m < MQ; ++m) {
      const __m512 qd = _mm512_set1_ps(q[m][d]);
      PD_ATTN_UNROLL
      for (int b = 0; b < NB; ++b) acc[m * NB + b] = _mm512_fmadd_ps(qd, k[b], acc[m * NB + b]);
    }
  }
  PD_ATTN_UNROLL
  for (int m = 0; m < MQ; ++m) {
    PD_ATTN_UNROLL
    for (int b = 0; b < NB; ++b) _mm512_mask_storeu_ps(out[m] + off[b], mask[b], acc[m * NB + b]);
  }
}

template <int NB>
void QkQueries512(const float* const* q, int n_q, const float* kt, int64_t n, float* const* out,
                  const int64_t* off, const __mmask16* mask) {
  int m = 0;
  for (; m + 6 <= n_q; m += 6) QkTile512<6, NB>(q + m, kt, n, out + m, off, mask);
  switch (n_q - m) {
    case 5:
      QkTile512<5, NB>(q + m, kt, n, out + m, off, mask);
      break;
    case 4:
      QkTile512<4, NB>(q + m, kt, n, out + m, off, mask);
      break;
    case 3:
      QkTile512<3, NB>(q + m, kt, n, out + m, off, mask);
      break;
    case 2:
      QkTile512<2, NB>(q + m, kt, n, out + m, off, mask);
      break;
    case 1:
      QkTile512<1, NB>(q + m, kt, n, out + m, off, mask);
      break;
    default:
      break;
  }
}

void AttnQkGemm512(const float* const* q, int n_q, const float* kt, int64_t n, int64_t first,
                   int64_t n_k, float* const* out) {
  if (n_k <= 0 || n_q <= 0) return;
  const int64_t end = first + n_k;
  // Block b's lanes that fall in [first, end), and where lane 0 would be stored.
  auto block = [&](int64_t b, int64_t* off, __mmask16* mask) {
    const int64_t j0 = b * kAttnKeyBlock;
    const int64_t lo = first > j0 ? first - j0 : 0, hi = end - j0 < 16 ? end - j0 : 16;
    *mask = static_cast<__mmask16>(((1u << hi) - 1) & ~((1u << lo) - 1));
    *off = j0 - first;
  };
  int64_t b = first / kAttnKeyBlock;
  const int64_t b_end = (end + kAttnKeyBlock - 1) / kAttnKeyBlock;
  for (; b + 2 <= b_end; b += 2) {
    int64_t off[2];
    __mmask16 mask[2];
    block(b, &off[0], &mask[0]);
    block(b + 1, &off[1], &mask[1]);
    QkQueries512<2>(q, n_q, kt + b * kAttnKeyBlock * n, n, out, off, mask);
  }
  if (b < b_end) {
    int64_t off[1];
    __mmask16 mask[1];
    block(b, &off[0], &mask[0]);
    QkQueries512<1>(q, n_q, kt + b * kAttnKeyBlock * n, n, out, off, mask);
  }
}

// Weighted sums of MQ queries over NC column vectors (16 columns each, the last one under
// `last`): acc in registers across positions [0, n_k).
template <int MQ, int NC>
inline void PvTile512(const float* const* p, const float* v, int64_t v_stride, int64_t n_k,
                      float* const* acc, int64_t c0, __mmask16 last) {
  __m512 a[MQ * NC];
  PD_ATTN_UNROLL
  for (int m = 0; m < MQ; ++m) {
    PD_ATTN_UNROLL
    for (int c = 0; c < NC; ++c) {
      a[m * NC + c] =
          _mm512_maskz_loadu_ps(c + 1 == NC ? last : __mmask16{0xffff}, acc[m] + c0 + c * 16);
    }
  }
  for (int64_t j = 0; j < n_k; ++j) {
    const float* vj = v + j * v_stride + c0;
    __m512 vv[NC];
    PD_ATTN_UNROLL
    for (int c = 0; c < NC; ++c) {
      vv[c] = _mm512_maskz_loadu_ps(c + 1 == NC ? last : __mmask16{0xffff}, vj + c * 16);
    }
    PD_ATTN_UNROLL
    for (int m = 0; m < MQ; ++m) {
      const __m512 pj = _mm512_set1_ps(p[m][j]);
      PD_ATTN_UNROLL
      for (int c = 0; c < NC; ++c) a[m * NC + c] = _mm512_fmadd_ps(pj, vv[c], a[m * NC + c]);
    }
  }
  PD_ATTN_UNROLL
  for (int m = 0; m < MQ; ++m) {
    PD_ATTN_UNROLL
    for (int c = 0; c < NC; ++c) {
      _mm512_mask_storeu_ps(acc[m] + c0 + c * 16, c + 1 == NC ? last : __mmask16{0xffff},
                            a[m * NC + c]);
    }
  }
}

template <int NC>
void PvQueries512(const float* const* p, int n_q, const float* v, int64_t v_stride, int64_t n_k,
                  float* const* acc, int64_t c0, __mmask16 last) {
  int m = 0;
  for (; m + 4 <= n_q; m += 4) PvTile512<4, NC>(p + m, v, v_stride, n_k, acc + m, c0, last);
  switch (n_q - m) {
    case 3:
      PvTile512<3, NC>(p + m, v, v_stride, n_k, acc + m, c0, last);
      break;
    case 2:
      PvTile512<2, NC>(p + m, v, v_stride, n_k, acc + m, c0, last);
      break;
    case 1:
      PvTile512<1, NC>(p + m, v, v_stride, n_k, acc + m, c0, last);
      break;
    default:
      break;
  }
}

// Positions go in runs of kPvRun, each run's V rows (kPvRun x cols floats) read from L1/L2 by
// every (query group, column chunk); per output the FMAs stay in position order.
void AttnPvGemm512(const float* const* p, int n_q, const float* v, int64_t v_stride, int64_t n_k,
                   int64_t cols, float* const* acc) {
  constexpr int64_t kPvRun = 64;
  const float* pr[64];
  for (int64_t j0 = 0; j0 < n_k; j0 += kPvRun) {
    const int64_t nj = n_k - j0 < kPvRun ? n_k - j0 : kPvRun;
    for (int m0 = 0; m0 < n_q; m0 += 64) {
      const int nq = n_q - m0 < 64 ? n_q - m0 : 64;
      for (int m = 0; m < nq; ++m) pr[m] = p[m0 + m] + j0;
      const float* vj = v + j0 * v_stride;
      float* const* am = acc + m0;
      int64_t c0 = 0;
      for (; c0 + 64 <= cols; c0 += 64) PvQueries512<4>(pr, nq, vj, v_stride, nj, am, c0, 0xffff);
      const int64_t rest = cols - c0;
      if (rest == 0) continue;
      const int nc = static_cast<int>((rest + 15) / 16);
      const int tail = static_cast<int>(rest - (nc - 1) * 16);
      const __mmask16 last = static_cast<__mmask16>((1u << tail) - 1);
      switch (nc) {
        case 3:
          PvQueries512<3>(pr, nq, vj, v_stride, nj, am, c0, last);
          break;
        case 2:
          PvQueries512<2>(pr, nq, vj, v_stride, nj, am, c0, last);
          break;
        default:
          PvQueries512<1>(pr, nq, vj, v_stride, nj, am, c0, last);
          break;
      }
    }
  }
}

constexpr AttnKernels kAvx512Attn = {16,
                                     &AttnDot512,
                                     &AttnExpSum512,
                                     &AttnReduce512,
                                     &AttnVSum512,
                                     &AttnDotsT512<float>,
                                     &AttnVSumsT512<float>,
                                     &AttnDotsT512<uint16_t>,
                                     &AttnVSumsT512<uint16_t>,
                                     &AttnVSumsRowsT512<float>,
                                     &AttnVSumsRowsT512<uint16_t>,
                                     &AttnQkGemm512,
                                     &AttnPvGemm512};

// AVX512F and AVX512DQ (CPUID leaf 7, EBX bits 16 and 17) with ZMM, YMM and XMM state enabled by
// the OS (XCR0 bits 1, 2, 5, 6 and 7).
// ggml_v_silu(g) * u on 16 lanes: g / (1 + expf(0 - g)) with ggml's AVX-512 expf.
inline __m512 SwiGlu16(__m512 g, __m512 u) {
  const __m512 e = GgmlExp512(_mm512_sub_ps(_mm512_setzero_ps(), g));
  return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.f), e)), u);
}

void SwiGlu512(const float* g, const float* u, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(y + i, SwiGlu16(_mm512_loadu_ps(g + i), _mm512_loadu_ps(u + i)));
  }
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(y + i, m, SwiGlu16(_mm512_maskz_loadu_ps(m, g + i),
                                             _mm512_maskz_loadu_ps(m, u + i)));
  }
}

}  // namespace

PD_NO_AVX512 SwiGluFn Avx512SwiGlu() {
  static const bool ok = CpuHasAvx512(bit_AVX512F | bit_AVX512DQ);
  return ok ? &SwiGlu512 : nullptr;
}

PD_NO_AVX512 const AttnKernels* Avx512AttnKernels() {
  static const bool ok = CpuHasAvx512(bit_AVX512F | bit_AVX512DQ);
  return ok ? &kAvx512Attn : nullptr;
}

}  // namespace pd::engine::cpu

#else  // built without AVX-512

namespace pd::engine::cpu {
const AttnKernels* Avx512AttnKernels() { return nullptr; }
SwiGluFn Avx512SwiGlu() { return nullptr; }
}  // namespace pd::engine::cpu

#endif
