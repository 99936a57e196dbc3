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

#include <cstdint>
#include <vector>

namespace pd::engine::cpu {
namespace {

// ggml_vec_dot_f32: four 16-lane FMA accumulators over steps of 64 elements, (a0 + a2) + (a1 + a3),
// then the lane sum; the elements past the last full step one FMA each (as GCC compiles ggml's).
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
  for (int64_t i = np; i < n; ++i) s = __builtin_fmaf(a[i], b[i], s);
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
  for (; c + 16 <= cols; c += 16) {
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

constexpr AttnKernels kAvx512Attn = {16, &AttnDot512, &AttnExpSum512, &AttnReduce512,
                                     &AttnVSum512};

// AVX512F and AVX512DQ (CPUID leaf 7, EBX bits 16 and 17) with ZMM, YMM and XMM state enabled by
// the OS (XCR0 bits 1, 2, 5, 6 and 7).
}  // namespace

const AttnKernels* Avx512AttnKernels() {
  static const bool ok = CpuHasAvx512(bit_AVX512F | bit_AVX512DQ);
  return ok ? &kAvx512Attn : nullptr;
}

}  // namespace pd::engine::cpu

#else  // built without AVX-512

namespace pd::engine::cpu {
const AttnKernels* Avx512AttnKernels() { return nullptr; }
}  // namespace pd::engine::cpu

#endif
