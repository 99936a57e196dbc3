// Portable kernels: the reference every SIMD table is tested against, and the fallback on CPUs
// without AVX2. Written for clarity first; they accumulate in the same precision as the SIMD
// kernels (F32 dots, F64 row sums) but in a different order, so results agree to rounding.
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "common/status.h"
#include "common/strings.h"
#include "engine/backend/cpu/kernels.h"
#include "engine/quant/q5_0.h"
#include "engine/quant/fp16.h"
#include "engine/quant/k_quants.h"
#include "engine/quant/q8_0.h"

namespace pd::engine::cpu {
namespace {

// F16 -> F32 by lookup (256 KiB, built on first use; thread-safe static init): the bit-twiddling
// F16ToF32 is branchy and would make the scalar F16 dot ~20x slower than the BF16 one.
const float* F16Table() {
  static const float* const table = [] {
    float* t = new float[65536];
    for (uint32_t h = 0; h < 65536; ++h) t[h] = F16ToF32(static_cast<uint16_t>(h));
    return t;
  }();
  return table;
}

// Per element: 2 flops, 4 + 4 bytes.
float DotF32(const float* a, const float* b, int64_t n) {
  float sum = 0.f;
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// Per element: 2 flops, 2 + 2 bytes.
float DotF16(const uint16_t* a, const uint16_t* b, int64_t n) {
  const float* f16 = F16Table();
  float sum = 0.f;
  for (int64_t i = 0; i < n; ++i) sum += f16[a[i]] * f16[b[i]];
  return sum;
}

float DotBf16(const uint16_t* a, const uint16_t* b, int64_t n) {
  float sum = 0.f;
  for (int64_t i = 0; i < n; ++i) sum += Bf16ToF32(a[i]) * Bf16ToF32(b[i]);
  return sum;
}

// Per block of 32: 64 integer ops + 2 flops, 34 + 34 bytes.
float DotQ8_0(const BlockQ8_0* a, const BlockQ8_0* b, int64_t n) {
  float sum = 0.f;
  for (int64_t i = 0; i < n / kQ8_0BlockSize; ++i) {
    int32_t isum = 0;
    for (int j = 0; j < kQ8_0BlockSize; ++j) isum += int32_t{a[i].qs[j]} * int32_t{b[i].qs[j]};
    sum += static_cast<float>(isum) * (F16ToF32(a[i].d) * F16ToF32(b[i].d));
  }
  return sum;
}

// ---- Q4_0 and the k-quants -------------------------------------------------------------------
// Integer products are summed exactly in int32 per sub-block, scaled by the sub-block's integer
// scale and summed in int32 per block (per 256-weight super-block for the k-quants), and only then
// multiplied by the float scales d_w * d_x and added to the F32 result, block after block; this is
// the order of ggml's dot products up to the order of the F32 additions. Formats with mins (Q2_K,
// Q4_K, Q5_K) subtract (dmin_w * d_x) * sum_i(m_i * bsum_i), the activations' bsums standing for
// the sums of their codes over each 16 weights. Flop counts below are per weight-activation pair
// of blocks (integer multiply-adds as "ops"); bytes are what one block pair reads.
//
// No int32 sum can overflow: the largest, Q6_K's, is at most 256 * 32 * 127 * 128 < 2^28. The
// conversion to float is exact up to 2^24 and rounds once above (Q4_K/Q5_K/Q6_K extremes).

// Per block of 32: 32 multiply-adds + 3 flops; 18 + 34 bytes.
float DotQ4_0(const BlockQ4_0* w, const BlockQ8_0* x, int64_t n) {
  float sum = 0.f;
  for (int64_t b = 0; b < n / BlockQ4_0::kWeights; ++b) {
    int32_t isum = 0;
    for (int j = 0; j < 16; ++j) {
      isum += ((w[b].qs[j] & 0x0F) - 8) * int32_t{x[b].qs[j]};
      isum += ((w[b].qs[j] >> 4) - 8) * int32_t{x[b].qs[j + 16]};
    }
    sum += static_cast<float>(isum) * (F16ToF32(w[b].d) * F16ToF32(x[b].d));
  }
  return sum;
}

// Per super-block: 256 + 16 + 16 multiply-adds + 6 flops; 84 + 292 bytes.
// Q2_K sub-blocks [i0, i1) of one super-block: isum += sum sc_i * (codes . activations) and
// imin += sum m_i * bsum_i, exactly.
void Q2KSums(const BlockQ2_K& wb, const BlockQ8_K& xb, int i0, int i1, int32_t* isum,
             int32_t* imin) {
  for (int i = i0; i < i1; ++i) {  // sub-blocks of 16
    int32_t s = 0;
    for (int l = 0; l < 16; ++l) {
      const int wi = 16 * i + l;  // = 128h + 32k + l'
      const int q = (wb.qs[32 * (wi / 128) + wi % 32] >> (2 * ((wi % 128) / 32))) & 3;
      s += q * int32_t{xb.qs[wi]};
    }
    *isum += (wb.scales[i] & 0x0F) * s;
    *imin += (wb.scales[i] >> 4) * int32_t{xb.bsums[i]};
  }
}

float DotQ2_K(const BlockQ2_K* w, const BlockQ8_K* x, int64_t n) {
  float sum = 0.f;
  for (int64_t b = 0; b < n / kQK; ++b) {
    const BlockQ2_K& wb = w[b];
    const BlockQ8_K& xb = x[b];
    int32_t isum = 0, imin = 0;
    Q2KSums(wb, xb, 0, 16, &isum, &imin);
    const float d = F16ToF32(wb.d) * xb.d, dmin = F16ToF32(wb.dmin) * xb.d;
    sum += d * static_cast<float>(isum) - dmin * static_cast<float>(imin);
  }
  return sum;
}

// Q2_K in the order of llama.cpp's repacked x86 kernels (q2_K 8x8: GEMM for activation rows in
// full groups of four, GEMV for the rest): per half of a super-block (kHalves = 2, GEMM) or per
// super-block (kHalves = 1, GEMV), the exact integer sums isum = sum sc_j * dot_j and
// imin = sum m_j * bsum_j over its sub-blocks go into acc = fma(float(isum), d_w * d_x, acc) and
// macc = fma(float(imin), dmin_w * d_x, macc); the result is acc - macc.
template <int kHalves>
float DotQ2_KRepack(const BlockQ2_K* w, const BlockQ8_K* x, int64_t n) {
  float acc = 0.f, macc = 0.f;
  for (int64_t b = 0; b < n / kQK; ++b) {
    const BlockQ2_K& wb = w[b];
    const BlockQ8_K& xb = x[b];
    const float d = F16ToF32(wb.d) * xb.d, dmin = F16ToF32(wb.dmin) * xb.d;
    for (int part = 0; part < kHalves; ++part) {
      const int j0 = part * 16 / kHalves, j1 = (part + 1) * 16 / kHalves;
      int32_t isum = 0, imin = 0;
      Q2KSums(wb, xb, j0, j1, &isum, &imin);
      acc = std::fma(static_cast<float>(isum), d, acc);
      macc = std::fma(static_cast<float>(imin), dmin, macc);
    }
  }
  return acc - macc;
}

// Per super-block: 256 + 16 multiply-adds + 3 flops; 110 + 292 bytes.
float DotQ3_K(const BlockQ3_K* w, const BlockQ8_K* x, int64_t n) {
  float sum = 0.f;
  for (int64_t b = 0; b < n / kQK; ++b) {
    const BlockQ3_K& wb = w[b];
    const BlockQ8_K& xb = x[b];
    int32_t isum = 0;
    for (int i = 0; i < 16; ++i) {
      int32_t s = 0;
      for (int l = 0; l < 16; ++l) {
        const int wi = 16 * i + l;
        const int low = (wb.qs[32 * (wi / 128) + wi % 32] >> (2 * ((wi % 128) / 32))) & 3;
        const int high = (wb.hmask[wi % 32] >> (wi / 32)) & 1;
        s += (low - (high ? 0 : 4)) * int32_t{xb.qs[wi]};
      }
      isum += (GetScaleQ3K(i, wb.scales) - 32) * s;
    }
    sum += (F16ToF32(wb.d) * xb.d) * static_cast<float>(isum);
  }
  return sum;
}

// Q4_K and Q5_K: 8 sub-blocks of 32 with 6-bit scales and mins; qh == nullptr for Q4_K. The exact
// integer sums over sub-blocks [j0, j1): *isum = sum sc_j * dot_j, *imin = sum m_j * bsum_j.
void Q45KSums(const uint8_t* scales, const uint8_t* qh, const uint8_t* qs, const BlockQ8_K& xb,
              int j0, int j1, int32_t* isum, int32_t* imin) {
  *isum = *imin = 0;
  for (int j = j0; j < j1; ++j) {
    int sc, m;
    GetScaleMinK4(j, scales, &sc, &m);
    int32_t s = 0;
    for (int l = 0; l < 32; ++l) {
      int q = (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0F;
      if (qh != nullptr) q |= ((qh[l] >> j) & 1) << 4;
      s += q * int32_t{xb.qs[32 * j + l]};
    }
    *isum += sc * s;
    *imin += m * (int32_t{xb.bsums[2 * j]} + int32_t{xb.bsums[2 * j + 1]});
  }
}

// Q4_K and Q5_K in the order of ggml's x86 vec_dot_q4_K_q8_K / q5_K_q8_K (llama.cpp's kernel for
// fewer than 8 activation rows of matrices it does not repack). Per super-block: 8 int32 lanes,
// lane L the exact sum over sub-blocks j of sc_j * (codes . activations) over weights 4L..4L+3 of
// each sub-block, then acc_L = fma(d_w * d_x, float(lane_L), acc_L). The min terms: Q4_K four
// lanes u, macc_u = fma(-(dmin_w * d_x), float(m_2u bsum_2u + m_2u+1 bsum_2u+1), macc_u), summed
// (m0 + m2) + (m1 + m3); Q5_K the exact total, msum = fma(-(dmin_w * d_x), float(total), msum).
// The result is hsum_float_8(acc) + the min part (hsum: a_i + a_i+4, then (r0 + r2) + (r1 + r3)).
// Per super-block: 256 + 8 + 8 multiply-adds + 14 flops; 144 (Q5_K: 176) + 292 bytes.
template <bool kHigh, typename Block>
float DotQ45KVec(const Block* w, const BlockQ8_K* x, int64_t n) {
  float acc[8] = {}, macc[4] = {}, msum = 0.f;
  for (int64_t b = 0; b < n / kQK; ++b) {
    const Block& wb = w[b];
    const BlockQ8_K& xb = x[b];
    const uint8_t* qh = nullptr;
    if constexpr (kHigh) qh = wb.qh;
    int32_t lane[8] = {}, mins[8];
    for (int j = 0; j < 8; ++j) {
      int sc, m;
      GetScaleMinK4(j, wb.scales, &sc, &m);
      for (int l = 0; l < 32; ++l) {
        int q = (wb.qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0F;
        if (qh != nullptr) q |= ((qh[l] >> j) & 1) << 4;
        lane[l / 4] += sc * q * int32_t{xb.qs[32 * j + l]};
      }
      mins[j] = m * (int32_t{xb.bsums[2 * j]} + int32_t{xb.bsums[2 * j + 1]});
    }
    const float d = F16ToF32(wb.d) * xb.d, ndmin = -(F16ToF32(wb.dmin) * xb.d);
    for (int i = 0; i < 8; ++i) acc[i] = std::fma(d, static_cast<float>(lane[i]), acc[i]);
    if constexpr (kHigh) {
      int32_t total = 0;
      for (int j = 0; j < 8; ++j) total += mins[j];
      msum = std::fma(ndmin, static_cast<float>(total), msum);
    } else {
      for (int u = 0; u < 4; ++u) {
        macc[u] = std::fma(ndmin, static_cast<float>(mins[2 * u] + mins[2 * u + 1]), macc[u]);
      }
    }
  }
  float r[4];
  for (int i = 0; i < 4; ++i) r[i] = acc[i + 4] + acc[i];
  const float hsum = (r[0] + r[2]) + (r[1] + r[3]);
  return hsum + (kHigh ? msum : (macc[0] + macc[2]) + (macc[1] + macc[3]));
}

float DotQ4_K(const BlockQ4_K* w, const BlockQ8_K* x, int64_t n) {
  return DotQ45KVec<false>(w, x, n);
}

// Q4_K in the order of llama.cpp's repacked x86 kernels (ggml's q4_K 8x8 GEMM for rows in full
// groups of four, GEMV for the rest): per step of kPairs pairs of sub-blocks (GEMM: 1, GEMV: all
// 4), the exact integer sums isum = sum sc_j * dot_j and imin = sum m_j * bsum_j are accumulated as
// acc = fma(float(isum), d_w * d_x, acc) and macc = fma(float(imin), dmin_w * d_x, macc); the
// result is acc - macc.
template <int kPairs>
float DotQ4_KRepack(const BlockQ4_K* w, const BlockQ8_K* x, int64_t n) {
  float acc = 0.f, macc = 0.f;
  for (int64_t b = 0; b < n / kQK; ++b) {
    const BlockQ4_K& wb = w[b];
    const BlockQ8_K& xb = x[b];
    const float d = F16ToF32(wb.d) * xb.d, dmin = F16ToF32(wb.dmin) * xb.d;
    for (int p0 = 0; p0 < 4; p0 += kPairs) {
      int32_t isum, imin;
      Q45KSums(wb.scales, nullptr, wb.qs, xb, 2 * p0, 2 * (p0 + kPairs), &isum, &imin);
      acc = std::fma(static_cast<float>(isum), d, acc);
      macc = std::fma(static_cast<float>(imin), dmin, macc);
    }
  }
  return acc - macc;
}

// llama.cpp's tiled order (kernels.h, gemm_wide): per super-block the exact integer sums s1 (scale
// times dot) and s2 (min times bsum), r = fma(-dmin_w, float(s2), float(s1) * d_w), and
// acc = fma(r, d_x, acc).
float DotQ45KWideBlock(uint16_t d16, uint16_t dmin16, const uint8_t* scales, const uint8_t* qh,
                       const uint8_t* qs, const BlockQ8_K& xb, float acc) {
  int32_t isum, imin;
  Q45KSums(scales, qh, qs, xb, 0, 8, &isum, &imin);
  const float r = std::fma(-F16ToF32(dmin16), static_cast<float>(imin),
                           static_cast<float>(isum) * F16ToF32(d16));
  return std::fma(r, xb.d, acc);
}

float DotQ4_KWide(const BlockQ4_K* w, const BlockQ8_K* x, int64_t n) {
  float acc = 0.f;
  for (int64_t b = 0; b < n / kQK; ++b) {
    acc = DotQ45KWideBlock(w[b].d, w[b].dmin, w[b].scales, nullptr, w[b].qs, x[b], acc);
  }
  return acc;
}

float DotQ5_KWide(const BlockQ5_K* w, const BlockQ8_K* x, int64_t n) {
  float acc = 0.f;
  for (int64_t b = 0; b < n / kQK; ++b) {
    acc = DotQ45KWideBlock(w[b].d, w[b].dmin, w[b].scales, w[b].qh, w[b].qs, x[b], acc);
  }
  return acc;
}

float DotQ5_K(const BlockQ5_K* w, const BlockQ8_K* x, int64_t n) {
  return DotQ45KVec<true>(w, x, n);
}

// Per super-block: 256 + 16 multiply-adds + 3 flops; 210 + 292 bytes.
// kWide: llama.cpp's tiled order, acc = fma(float(isum) * d_w, d_x, acc) per super-block.
template <bool kWide = false>
float DotQ6_K(const BlockQ6_K* w, const BlockQ8_K* x, int64_t n) {
  float sum = 0.f;
  for (int64_t b = 0; b < n / kQK; ++b) {
    const BlockQ6_K& wb = w[b];
    const BlockQ8_K& xb = x[b];
    int32_t isum = 0;
    for (int i = 0; i < 16; ++i) {
      int32_t s = 0;
      for (int l = 0; l < 16; ++l) {
        const int wi = 16 * i + l;
        const int h = wi / 128, k = (wi % 128) / 32, lo = wi % 32;
        const int low = (wb.ql[64 * h + 32 * (k & 1) + lo] >> (4 * (k / 2))) & 0x0F;
        const int high = (wb.qh[32 * h + lo] >> (2 * k)) & 3;
        s += ((low | high << 4) - 32) * int32_t{xb.qs[wi]};
      }
      isum += int32_t{wb.scales[i]} * s;
    }
    if constexpr (kWide) {
      sum = std::fma(static_cast<float>(isum) * F16ToF32(wb.d), xb.d, sum);
    } else {
      sum += (F16ToF32(wb.d) * xb.d) * static_cast<float>(isum);
    }
  }
  return sum;
}

void QuantizeQ8_K(const float* x, BlockQ8_K* y, int64_t n) { QuantizeRow(x, y, n); }

// W8A8 rows are untyped bytes (a header, then int8 codes).
float DotW8A8Rows(const char* w, const char* x, int64_t n) { return DotW8A8(w, x, n); }

// Row dots over a tile; `RowDot` takes typed row pointers (weights W, activations X).
template <typename W, typename X, float (*RowDot)(const W*, const X*, int64_t)>
void GemmTile(int64_t k, const void* w, size_t w_stride, int nr, const void* x, size_t x_stride,
              int nc, float* y, int64_t y_stride) {
  const char* wb = static_cast<const char*>(w);
  const char* xb = static_cast<const char*>(x);
  for (int c = 0; c < nc; ++c) {
    for (int r = 0; r < nr; ++r) {
      y[c * y_stride + r] = RowDot(reinterpret_cast<const W*>(wb + r * w_stride),
                                   reinterpret_cast<const X*>(xb + c * x_stride), k);
    }
  }
}

// Per element: 3 flops, 4 bytes read, 1 written (two passes over x: max, then quantize).
float QuantizeKvI8(const float* x, int8_t* q, int64_t n) {
  float amax = 0.f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float d = amax / 127.f;
  const float id = d != 0.f ? 1.f / d : 0.f;
  for (int64_t i = 0; i < n; ++i) {
    const float r = std::nearbyint(x[i] * id);  // round half to even, as cvtps2dq
    q[i] = static_cast<int8_t>(std::min(127.f, std::max(-127.f, r)));
  }
  return d;
}

float QuantizeKvI8F16(const uint16_t* x, float* tmp, int8_t* q, int head_dim) {
  F16ToF32Row(x, tmp, head_dim);
  RotateKvRow(tmp, head_dim, 1.f / static_cast<float>(KvRotationBlock(head_dim)));
  return QuantizeKvI8(tmp, q, head_dim);
}

void DequantizeKvI8F16(const int8_t* q, float scale, float* tmp, uint16_t* y, int head_dim) {
  for (int i = 0; i < head_dim; ++i) tmp[i] = scale * static_cast<float>(q[i]);
  RotateKvRow(tmp, head_dim, 1.f);
  F32ToF16Row(tmp, y, head_dim);
}

// Per element: 2 flops, 1 + 4 bytes.
float DotI8F32(const int8_t* a, const float* b, int64_t n) {
  float sum = 0.f;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<float>(a[i]) * b[i];
  return sum;
}

void AxpyI8(float a, const int8_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::fma(a, static_cast<float>(x[i]), y[i]);
}

void WidenI8(const int8_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(x[i]);
}

double SumSquares(const float* x, int64_t n) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i] * x[i]);
  return sum;
}

void Scale(const float* x, float s, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = s * x[i];
}

void ScaleMul(const float* x, float s, const float* w, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = (s * x[i]) * w[i];
}

void Add(const float* a, const float* b, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

float GgmlExpf8(float x);
void SwiGlu(const float* g, const float* u, float* y, int64_t n) {  // the 8-lane expf (attn())
  for (int64_t i = 0; i < n; ++i) y[i] = g[i] / (1.f + GgmlExpf8(0.f - g[i])) * u[i];
}

float Max(const float* x, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

double ExpSubSum(const float* x, float m, float* y, int64_t n) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    y[i] = std::exp(x[i] - m);
    sum += y[i];
  }
  return sum;
}

void RopeNeox(float* v, const float* c, const float* s, int64_t half) {
  for (int64_t i = 0; i < half; ++i) {
    const float a = v[i], b = v[i + half];
    v[i] = std::fma(a, c[i], -(b * s[i]));
    v[i + half] = std::fma(a, s[i], b * c[i]);
  }
}

void RopeNormal(float* v, const float* c, const float* s, int64_t half) {
  const int64_t fused = RopeNormalFusedPairs(half, RopeNormalOrder());
  for (int64_t i = 0; i < fused; ++i) {
    const float a = v[2 * i], b = v[2 * i + 1];
    v[2 * i] = std::fma(a, c[i], -(b * s[i]));
    v[2 * i + 1] = std::fma(a, s[i], b * c[i]);
  }
  for (int64_t i = fused; i < half; ++i) {  // this file has no FMA contraction (no -mfma)
    const float a = v[2 * i], b = v[2 * i + 1];
    const float ac = a * c[i], bs = b * s[i], as = a * s[i], bc = b * c[i];
    v[2 * i] = ac - bs;
    v[2 * i + 1] = as + bc;
  }
}

// ---- attention in ggml's order (AttnKernels, kernels.h) ------------------------------------------
// Plain C++ with std::fma where ggml's vector code fuses, so that the SIMD versions can be tested
// against it bit for bit. Lane sums of one ggml vector of `lanes` floats:
//   kHalves: tinyBLAS's hsum, ggml_vec_soft_max_f32's group sum and GCC's _mm512_reduce_add_ps:
//            fold the upper half onto the lower (16 -> 8 -> 4 lanes), then (q0 + q2) + (q1 + q3).
//   kPairs:  GGML_F32x8_REDUCE's tail (8 lanes): q[i] = v[i] + v[i + 4], then (q0 + q1) + (q2 + q3).
// ggml's scalar tails (elements past the last full vector step) are written a += x * y; GCC
// vectorizes part of them without fusing and fuses the rest (GgmlDotTailFusedFrom, kernels.h).
enum class LaneSum { kHalves, kPairs };

float SumLanes(const float* v, int lanes, LaneSum how) {
  float h[8];
  if (lanes == 16) {
    for (int i = 0; i < 8; ++i) h[i] = v[i + 8] + v[i];
  } else {
    for (int i = 0; i < 8; ++i) h[i] = v[i];
  }
  float q[4];
  for (int i = 0; i < 4; ++i) q[i] = h[i + 4] + h[i];
  return how == LaneSum::kHalves ? (q[0] + q[2]) + (q[1] + q[3]) : (q[0] + q[1]) + (q[2] + q[3]);
}

// ggml_vec_dot_f32's reduction uses _mm512_reduce_add_ps at 16 lanes, hadd pairs at 8.
LaneSum DotLaneSum(int lanes) { return lanes == 16 ? LaneSum::kHalves : LaneSum::kPairs; }

template <int L>
float AttnDotRef(const float* a, const float* b, int64_t n) {
  float acc[4][L] = {};
  const int64_t np = n - n % (4 * L);
  for (int64_t i = 0; i < np; i += 4 * L) {
    for (int r = 0; r < 4; ++r) {
      for (int l = 0; l < L; ++l) {
        acc[r][l] = std::fma(a[i + r * L + l], b[i + r * L + l], acc[r][l]);
      }
    }
  }
  float x[L];
  for (int l = 0; l < L; ++l) x[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
  float s = SumLanes(x, L, DotLaneSum(L));
  const int64_t nf = GgmlDotTailFusedFrom(np, n, L);
  for (int64_t i = np; i < nf; ++i) s += RoundedF32(a[i] * b[i]);
  for (int64_t i = nf; i < n; ++i) s = std::fma(a[i], b[i], s);
  return s;
}

// ggml's vector expf, one lane. Both widths reduce x to n * ln2 + b (n = round(x / ln2), b in
// [-ln2/2, ln2/2]) and evaluate the same degree-5 polynomial; they differ in how they scale by
// 2^n, which rounds differently.
float GgmlExpf16(float x) {  // the AVX-512 version: j = p(b) + 1 in one FMA, then scalef(j, n)
  const float r = 0x1.8p23f;
  const float z = std::fma(x, 0x1.715476p+0f, r);
  const float n = z - r;
  const float b = std::fma(-n, 0x1.7f7d1cp-20f, std::fma(-n, 0x1.62e4p-1f, x));
  if (std::isnan(n)) return n;
  if (std::fabs(n) > 192.f) return n <= 0.f ? 0.f : std::numeric_limits<float>::infinity();
  const float u = b * b;
  const float j = std::fma(std::fma(std::fma(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u,
                                    std::fma(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                           u, std::fma(0x1.ffffecp-1f, b, 1.f));
  return std::ldexp(j, static_cast<int>(n));  // scalef: one rounding, subnormals included
}

float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
uint32_t FloatToBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float GgmlExpf8(float x) {  // the AVX2 version: k = 2^n from z's bits, then k + k * j
  const float r = 0x1.8p23f;
  const float z = std::fma(x, 0x1.715476p+0f, r);
  const float n = z - r;
  const float b = std::fma(-n, 0x1.7f7d1cp-20f, std::fma(-n, 0x1.62e4p-1f, x));
  const uint32_t e = FloatToBits(z) << 23;
  const float k = BitsToFloat(e + FloatToBits(1.f));
  const float u = b * b;
  const float j = std::fma(std::fma(std::fma(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u,
                                    std::fma(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                           u, 0x1.ffffecp-1f * b);
  if (!(std::fabs(n) > 126.f)) return std::fma(k, j, k);
  // Near or past the exponent range: 2^n as s1 * s2 (or s1 * s1 past 192).
  const uint32_t g = n <= 0.f ? 0x82000000u : 0u;
  const float s1 = BitsToFloat(g + 0x7f000000u);
  if (std::fabs(n) > 192.f) return s1 * s1;
  const float s2 = BitsToFloat(e - g);
  return std::fma(s2, j, s2) * s1;
}

template <int L>
double AttnExpSumRef(const float* x, float max, float* y, int64_t n) {
  double sum = 0.0;
  for (int64_t i = 0; i + L <= n; i += L) {
    for (int l = 0; l < L; ++l) {
      const float d = x[i + l] - max;
      y[i + l] = L == 16 ? GgmlExpf16(d) : GgmlExpf8(d);
    }
    sum += static_cast<double>(SumLanes(y + i, L, LaneSum::kHalves));
  }
  return sum;
}

template <int L>
void AttnReduceRef(const float* rows, int n_rows, int64_t stride, int64_t cols, float* out) {
  if (n_rows == 1) {  // one chain: nothing to add
    std::copy(rows, rows + cols, out);
    return;
  }
  float v[L];
  for (int64_t c = 0; c < cols; ++c) {
    if (n_rows == L) {
      for (int l = 0; l < L; ++l) v[l] = rows[l * stride + c];
      out[c] = SumLanes(v, L, LaneSum::kHalves);
      continue;
    }
    for (int l = 0; l < L; ++l) {
      const float* p = rows + l * stride + c;
      v[l] = (p[0] + p[2 * L * stride]) + (p[L * stride] + p[3 * L * stride]);
    }
    out[c] = SumLanes(v, L, DotLaneSum(L));
  }
}

template <int L>
void AttnVSumRef(const float* p, const float* const* v, int64_t lo, int64_t hi, int n_acc,
                 int64_t cols, float* out) {
  std::vector<float> rows(static_cast<size_t>(n_acc * cols), 0.f);
  for (int64_t j = lo; j <= hi; ++j) {
    float* r = rows.data() + (j % n_acc) * cols;
    for (int64_t c = 0; c < cols; ++c) r[c] = std::fma(v[j - lo][c], p[j - lo], r[c]);
  }
  AttnReduceRef<L>(rows.data(), n_acc, cols, cols, out);
}

// The batched entries are the single ones in a loop: that is their contract.
template <int L>
void AttnDotsRef(const float* q, int64_t q_stride, int n_q, const float* const* k, int n_k,
                 int64_t n, float* out, int64_t out_stride) {
  for (int g = 0; g < n_q; ++g) {
    for (int j = 0; j < n_k; ++j)
      out[g * out_stride + j] = AttnDotRef<L>(k[j], q + g * q_stride, n);
  }
}

template <int L>
void AttnVSumsRef(const float* p, int64_t p_stride, int n_q, const float* const* v, int64_t lo,
                  int64_t hi, int n_acc, int64_t cols, float* out, int64_t out_stride) {
  for (int g = 0; g < n_q; ++g) {
    AttnVSumRef<L>(p + g * p_stride, v, lo, hi, n_acc, cols, out + g * out_stride);
  }
}

std::vector<float> WidenRows(const uint16_t* const* rows, int64_t n_rows, int64_t n,
                             std::vector<const float*>* ptrs) {
  std::vector<float> wide(static_cast<size_t>(n_rows * n));
  ptrs->resize(static_cast<size_t>(n_rows));
  for (int64_t j = 0; j < n_rows; ++j) {
    for (int64_t i = 0; i < n; ++i) wide[j * n + i] = F16ToF32(rows[j][i]);
    (*ptrs)[j] = wide.data() + j * n;
  }
  return wide;
}

template <int L>
void AttnDotsF16Ref(const float* q, int64_t q_stride, int n_q, const uint16_t* const* k, int n_k,
                    int64_t n, float* out, int64_t out_stride) {
  std::vector<const float*> kw;
  const std::vector<float> wide = WidenRows(k, n_k, n, &kw);
  AttnDotsRef<L>(q, q_stride, n_q, kw.data(), n_k, n, out, out_stride);
}

template <int L>
void AttnVSumsF16Ref(const float* p, int64_t p_stride, int n_q, const uint16_t* const* v,
                     int64_t lo, int64_t hi, int n_acc, int64_t cols, float* out,
                     int64_t out_stride) {
  std::vector<const float*> vw;
  const std::vector<float> wide = WidenRows(v, hi - lo + 1, cols, &vw);
  AttnVSumsRef<L>(p, p_stride, n_q, vw.data(), lo, hi, n_acc, cols, out, out_stride);
}

// The GEMM order (AttnKernels::qk_gemm / pv_gemm): one fma chain per output, in order.
void AttnQkGemmRef(const float* const* q, int n_q, const float* kt, int64_t n, int64_t first,
                   int64_t n_k, float* const* out) {
  for (int m = 0; m < n_q; ++m) {
    for (int64_t j = first; j < first + n_k; ++j) {
      float s = 0.f;
      for (int64_t d = 0; d < n; ++d) s = std::fma(q[m][d], kt[AttnKeyBlockIndex(j, d, n)], s);
      out[m][j - first] = s;
    }
  }
}

void AttnPvGemmRef(const float* const* p, int n_q, const float* v, int64_t v_stride, int64_t n_k,
                   int64_t cols, float* const* acc) {
  for (int m = 0; m < n_q; ++m) {
    for (int64_t c = 0; c < cols; ++c) {
      float a = acc[m][c];
      for (int64_t j = 0; j < n_k; ++j) a = std::fma(p[m][j], v[j * v_stride + c], a);
      acc[m][c] = a;
    }
  }
}

constexpr AttnKernels kScalarAttn8 = {8,
                                      &AttnDotRef<8>,
                                      &AttnExpSumRef<8>,
                                      &AttnReduceRef<8>,
                                      &AttnVSumRef<8>,
                                      &AttnDotsRef<8>,
                                      &AttnVSumsRef<8>,
                                      &AttnDotsF16Ref<8>,
                                      &AttnVSumsF16Ref<8>,
                                      &AttnVSumsRowByRow<float, &AttnVSumsRef<8>>,
                                      &AttnVSumsRowByRow<uint16_t, &AttnVSumsF16Ref<8>>,
                                      &AttnQkGemmRef,
                                      &AttnPvGemmRef};
constexpr AttnKernels kScalarAttn16 = {16,
                                       &AttnDotRef<16>,
                                       &AttnExpSumRef<16>,
                                       &AttnReduceRef<16>,
                                       &AttnVSumRef<16>,
                                       &AttnDotsRef<16>,
                                       &AttnVSumsRef<16>,
                                       &AttnDotsF16Ref<16>,
                                       &AttnVSumsF16Ref<16>,
                                       &AttnVSumsRowByRow<float, &AttnVSumsRef<16>>,
                                       &AttnVSumsRowByRow<uint16_t, &AttnVSumsF16Ref<16>>,
                                       &AttnQkGemmRef,
                                       &AttnPvGemmRef};
const AttnKernels& ScalarAttn() { return kScalarAttn8; }

constexpr Kernels kScalar = {
    .name = "scalar",
    .gemm = {&GemmTile<float, float, DotF32>, &GemmTile<uint16_t, uint16_t, DotF16>,
             &GemmTile<uint16_t, uint16_t, DotBf16>, &GemmTile<BlockQ8_0, BlockQ8_0, DotQ8_0>,
             &GemmTile<BlockQ4_0, BlockQ8_0, DotQ4_0>, &GemmTile<BlockQ2_K, BlockQ8_K, DotQ2_K>,
             &GemmTile<BlockQ3_K, BlockQ8_K, DotQ3_K>, &GemmTile<BlockQ4_K, BlockQ8_K, DotQ4_K>,
             &GemmTile<BlockQ5_K, BlockQ8_K, DotQ5_K>, &GemmTile<BlockQ6_K, BlockQ8_K, DotQ6_K<>>,
             &GemmTile<BlockQ5_0, BlockQ8_0, DotQ5_0Q8_0>, &GemmTile<char, char, DotW8A8Rows>,
             &GemmTile<BlockW4A16, float, DotW4A16F32>},
    .gemm_wide = {nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                  &GemmTile<BlockQ4_K, BlockQ8_K, DotQ4_KWide>,
                  &GemmTile<BlockQ5_K, BlockQ8_K, DotQ5_KWide>,
                  &GemmTile<BlockQ6_K, BlockQ8_K, DotQ6_K<true>>, nullptr, nullptr, nullptr},
    .q4_k_repack_gemm = &GemmTile<BlockQ4_K, BlockQ8_K, DotQ4_KRepack<1>>,
    .q4_k_repack_gemv = &GemmTile<BlockQ4_K, BlockQ8_K, DotQ4_KRepack<4>>,
    .q2_k_repack_gemm = &GemmTile<BlockQ2_K, BlockQ8_K, DotQ2_KRepack<2>>,
    .q2_k_repack_gemv = &GemmTile<BlockQ2_K, BlockQ8_K, DotQ2_KRepack<1>>,
    .q4_k_repack_gemv5 = nullptr,  // the driver splits 4 + 1
    .q6_k5 = nullptr,
    .f32_to_f16 = &F32ToF16Row,
    .f16_to_f32 = &F16ToF32Row,
    .f32_to_bf16 = &F32ToBf16Row,
    .bf16_to_f32 = &Bf16ToF32Row,
    .quantize_q8_0 = &QuantizeRowQ8_0Act,
    .dequantize_q8_0 = &DequantizeRowQ8_0,
    .quantize_q8_k = &QuantizeQ8_K,
    .quantize_w8a8 = &QuantizeRowW8A8,
    .quantize_kv_i8 = &QuantizeKvI8,
    .rotate_kv_row = &RotateKvRow,
    .quantize_kv_i8_f16 = &QuantizeKvI8F16,
    .dequantize_kv_i8_f16 = &DequantizeKvI8F16,
    .dot_i8_f32 = &DotI8F32,
    .axpy_i8 = &AxpyI8,
    .widen_i8 = &WidenI8,
    .sum_squares = &SumSquares,
    .scale = &Scale,
    .scale_mul = &ScaleMul,
    .add = &Add,
    .swiglu = &SwiGlu,
    .max = &Max,
    .exp_sub_sum = &ExpSubSum,
    .rope_neox = &RopeNeox,
    .rope_normal = &RopeNormal,
    .attn = &ScalarAttn,
};

}  // namespace

const Kernels& ScalarKernels() { return kScalar; }

const AttnKernels& ScalarAttnKernels(int lanes) {
  return lanes == 16 ? kScalarAttn16 : kScalarAttn8;
}

namespace {

// AVX2 + FMA + F16C, and the OS saves YMM state. Read from CPUID directly: clang 14's
// __builtin_cpu_supports does not know "f16c".
bool CpuHasAvx2Fma() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  const bool fma = c & bit_FMA, f16c = c & bit_F16C, osxsave = c & bit_OSXSAVE;
  if (!fma || !f16c || !osxsave) return false;
  unsigned xcr0_lo, xcr0_hi;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & 0x6) != 0x6) return false;  // XMM and YMM state enabled
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  return b & bit_AVX2;
#else
  return false;
#endif
}

}  // namespace

absl::StatusOr<CpuIsa> CpuIsaCapFromEnv() {
  const char* v = std::getenv("PDSERVE_CPU_ISA");
  const std::string_view s = v == nullptr ? "" : v;
  if (s.empty() || s == "avx512") return CpuIsa::kAvx512;
  if (s == "avx2") return CpuIsa::kAvx2;
  if (s == "scalar") return CpuIsa::kScalar;
  return absl::InvalidArgumentError(
      pd::StrCat("PDSERVE_CPU_ISA='", s, "': expected avx512, avx2 or scalar (or unset)"));
}

CpuIsa CpuIsaCap() {
  static const CpuIsa cap = [] {
    absl::StatusOr<CpuIsa> c = CpuIsaCapFromEnv();
    PD_CHECK_MSG(c.ok(), std::string(c.status().message()).c_str());
    return *c;
  }();
  return cap;
}

bool CpuHasAvx512(uint32_t leaf7_ebx, uint32_t leaf7_ecx) {
  if (CpuIsaCap() < CpuIsa::kAvx512) return false;
#if defined(__x86_64__) || defined(__i386__)
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE)) return false;
  unsigned xcr0_lo, xcr0_hi;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & 0xe6) != 0xe6) return false;  // XMM, YMM, opmask and both ZMM halves
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  return (b & leaf7_ebx) == leaf7_ebx && (c & leaf7_ecx) == leaf7_ecx;
#else
  (void)leaf7_ebx, (void)leaf7_ecx;
  return false;
#endif
}

bool CpuIsIntel() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool intel = [] {
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
    return b == 0x756e6547 && d == 0x49656e69 && c == 0x6c65746e;  // "Genu" "ineI" "ntel"
  }();
  return intel;
#else
  return false;
#endif
}

const Kernels& SelectKernels(bool force_scalar) {
  const Kernels* avx2 = Avx2Kernels();
  if (!force_scalar && avx2 != nullptr && CpuIsaCap() >= CpuIsa::kAvx2 && CpuHasAvx2Fma()) {
    return *avx2;
  }
  return kScalar;
}

RopeNormalWidths RopeNormalOrder() {
  static const RopeNormalWidths w =
      Avx512AttnKernels() != nullptr ? RopeNormalWidths{8, 4} : RopeNormalWidths{4, 2};
  return w;
}

std::string_view KernelSetName(const Kernels& k) {
  if (&k == &kScalar) return "scalar";
  if (Avx512AttnKernels() == nullptr) return "avx2";
  if (Q8_0TileVnni() == nullptr) return "avx512";
  return AmxRuns() ? "avx512-vnni-amx" : "avx512-vnni";
}

}  // namespace pd::engine::cpu
