// Portable kernels: the reference every SIMD table is tested against, and the fallback on CPUs
// without AVX2. Written for clarity first; they accumulate in the same precision as the SIMD
// kernels (F32 dots, F64 row sums) but in a different order, so results agree to rounding.
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/backend/cpu/kernels.h"
#include "engine/quant/fp16.h"
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

// Row dots over a tile; `RowDot` takes typed row pointers.
template <typename T, float (*RowDot)(const T*, const T*, int64_t)>
void GemmTile(int64_t k, const void* w, size_t w_stride, int nr, const void* x, size_t x_stride,
              int nc, float* y, int64_t y_stride) {
  const char* wb = static_cast<const char*>(w);
  const char* xb = static_cast<const char*>(x);
  for (int c = 0; c < nc; ++c) {
    for (int r = 0; r < nr; ++r) {
      y[c * y_stride + r] = RowDot(reinterpret_cast<const T*>(wb + r * w_stride),
                                   reinterpret_cast<const T*>(xb + c * x_stride), k);
    }
  }
}

float DotF16F32(const uint16_t* a, const float* b, int64_t n) {
  const float* f16 = F16Table();
  float sum = 0.f;
  for (int64_t i = 0; i < n; ++i) sum += f16[a[i]] * b[i];
  return sum;
}

void AxpyF32(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

void AxpyF16(float a, const uint16_t* x, float* y, int64_t n) {
  const float* f16 = F16Table();
  for (int64_t i = 0; i < n; ++i) y[i] += a * f16[x[i]];
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

void SwiGlu(const float* g, const float* u, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
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

constexpr Kernels kScalar = {
    .name = "scalar",
    .gemm = {&GemmTile<float, DotF32>, &GemmTile<uint16_t, DotF16>, &GemmTile<uint16_t, DotBf16>,
             &GemmTile<BlockQ8_0, DotQ8_0>},
    .f32_to_f16 = &F32ToF16Row,
    .f16_to_f32 = &F16ToF32Row,
    .f32_to_bf16 = &F32ToBf16Row,
    .bf16_to_f32 = &Bf16ToF32Row,
    .quantize_q8_0 = &QuantizeRowQ8_0,
    .dequantize_q8_0 = &DequantizeRowQ8_0,
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

const Kernels& ScalarKernels() { return kScalar; }

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

const Kernels& SelectKernels(bool force_scalar) {
  const Kernels* avx2 = Avx2Kernels();
  if (!force_scalar && avx2 != nullptr && CpuHasAvx2Fma()) return *avx2;
  (void)avx2;
  return kScalar;
}

}  // namespace pd::engine::cpu
