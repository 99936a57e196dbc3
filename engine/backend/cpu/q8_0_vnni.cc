// AVX512-VNNI tiles for Q8_0 weights x Q8_0 activations (the 256-bit, VL forms of VPDPBUSD).
// This file alone is compiled with -mavx512f -mavx512vl -mavx512vnni (plus AVX2/FMA/F16C); its
// kernels run only when Q8_0TileVnni() found those instructions on the CPU. Like
// kernels_avx2.cc, it calls no inline function from shared headers.
//
// VPDPBUSD multiplies unsigned by signed bytes and adds each group of four products to an int32
// lane. Q8_0 weights are signed, so the tile feeds w + 128 (w XOR 0x80) as the unsigned operand
// and starts each lane at -128 * (sum of the four activations), computed once per activation
// block: lane i = sum_{j<4} (w + 128) x - 128 sum_{j<4} x = sum_{j<4} w x, exactly the int32 lane
// the AVX2 tile's maddubs + madd produce (no saturation: |255 * 127 * 4| < 2^31). The F32 part
// (cvt, d_w * d_x, fmadd into 8 lanes, the final sum) is the AVX2 tile's, so both give the same
// bits. Per weight row, activation column and 32-weight block: 4 vector ops instead of 7.
#include "engine/backend/cpu/kernels.h"

#if defined(__x86_64__) && defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__F16C__)

#include <cpuid.h>
#include <immintrin.h>

#include <cstdint>
#include <cstdlib>

namespace pd::engine::cpu {
namespace {

inline float HalfToFloatVnni(uint16_t h) { return _cvtsh_ss(h); }

inline float HSumVnni(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

#define PD_VNNI_UNROLL _Pragma("GCC unroll 4")

// The loops over R and C are fully unrolled so that the R x C accumulators (and the C activation
// vectors) live in registers: 16 + 12 of AVX512VL's 32 ymm registers for a 4 x 4 tile.
template <int R, int C>
void TileQ8Vnni(int64_t k, const char* w, size_t ws, const char* x, size_t xs, float* y,
                int64_t ys) {
  const int64_t nb = k / kQ8_0BlockSize;
  const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80));
  const __m256i zero = _mm256_setzero_si256();
  __m256 acc[R][C];
  PD_VNNI_UNROLL
  for (int r = 0; r < R; ++r)
    PD_VNNI_UNROLL
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m256i xq[C], start[C];
    __m256 dx[C];
    PD_VNNI_UNROLL
    for (int c = 0; c < C; ++c) {
      const BlockQ8_0* xb = reinterpret_cast<const BlockQ8_0*>(x + c * xs) + b;
      xq[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb->qs));
      start[c] = _mm256_sub_epi32(zero, _mm256_dpbusd_epi32(zero, bias, xq[c]));
      dx[c] = _mm256_set1_ps(HalfToFloatVnni(xb->d));
    }
    PD_VNNI_UNROLL
    for (int r = 0; r < R; ++r) {
      const BlockQ8_0* wb = reinterpret_cast<const BlockQ8_0*>(w + r * ws) + b;
      _mm_prefetch(reinterpret_cast<const char*>(wb) + R * ws, _MM_HINT_T1);
      const __m256i wu = _mm256_xor_si256(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb->qs)), bias);
      const __m256 dw = _mm256_set1_ps(HalfToFloatVnni(wb->d));
      PD_VNNI_UNROLL
      for (int c = 0; c < C; ++c) {
        const __m256i dot = _mm256_dpbusd_epi32(start[c], wu, xq[c]);
        acc[r][c] =
            _mm256_fmadd_ps(_mm256_mul_ps(dw, dx[c]), _mm256_cvtepi32_ps(dot), acc[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[c * ys + r] = HSumVnni(acc[r][c]);
}

using TileImplVnni = void (*)(int64_t, const char*, size_t, const char*, size_t, float*, int64_t);

constexpr TileImplVnni kTiles[4][4] = {
    {&TileQ8Vnni<1, 1>, &TileQ8Vnni<1, 2>, &TileQ8Vnni<1, 3>, &TileQ8Vnni<1, 4>},
    {&TileQ8Vnni<2, 1>, &TileQ8Vnni<2, 2>, &TileQ8Vnni<2, 3>, &TileQ8Vnni<2, 4>},
    {&TileQ8Vnni<3, 1>, &TileQ8Vnni<3, 2>, &TileQ8Vnni<3, 3>, &TileQ8Vnni<3, 4>},
    {&TileQ8Vnni<4, 1>, &TileQ8Vnni<4, 2>, &TileQ8Vnni<4, 3>, &TileQ8Vnni<4, 4>},
};
static_assert(kGemmTileW == 4 && kGemmTileX == 4, "kTiles lists 4x4 instantiations");

void GemmQ8_0Vnni(int64_t k, const void* w, size_t w_stride, int nr, const void* x,
                  size_t x_stride, int nc, float* y, int64_t y_stride) {
  kTiles[nr - 1][nc - 1](k, static_cast<const char*>(w), w_stride, static_cast<const char*>(x),
                         x_stride, y, y_stride);
}

// AVX512F + AVX512VL + AVX512_VNNI, and the OS saves the opmask and ZMM state.
bool CpuHasAvx512Vnni() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE)) return false;
  unsigned xcr0_lo, xcr0_hi;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & 0xe6) != 0xe6) return false;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool avx512f = b & (1u << 16), avx512vl = b & (1u << 31), vnni = c & (1u << 11);
  return avx512f && avx512vl && vnni;
}

}  // namespace

GemmTileFn Q8_0TileVnni() {
  static const GemmTileFn fn = [] {
    const char* off = std::getenv("PDSERVE_CPU_NO_VNNI");
    if (off != nullptr && off[0] != '\0' && off[0] != '0') return GemmTileFn{nullptr};
    return CpuHasAvx512Vnni() ? &GemmQ8_0Vnni : GemmTileFn{nullptr};
  }();
  return fn;
}

}  // namespace pd::engine::cpu

#else

namespace pd::engine::cpu {
GemmTileFn Q8_0TileVnni() { return nullptr; }
}  // namespace pd::engine::cpu

#endif
