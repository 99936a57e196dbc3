// AVX512-VNNI tiles (the 256-bit, VL forms of VPDPBUSD) for Q8_0 and Q5_0 weights x Q8_0
// activations. This file alone is compiled with -mavx512f -mavx512vl -mavx512vnni (plus
// AVX2/FMA/F16C); its kernels run only when Q8_0TileVnni() / Q5_0TileVnni() found those
// instructions on the CPU. Like kernels_avx2.cc, it calls no inline function from shared headers.
//
// VPDPBUSD multiplies unsigned by signed bytes and adds each group of four products to an int32
// lane, starting from the lane's previous value.
// - Q8_0: weights are signed, so the tile feeds w + 128 (w XOR 0x80) as the unsigned operand and
//   starts each lane at -128 * (sum of the four activations), computed once per activation block:
//   lane i = sum_{j<4} (w + 128) x - 128 sum_{j<4} x = sum_{j<4} w x, exactly the int32 lane the
//   AVX2 tile's maddubs + madd produce (no overflow: |255 * 127 * 4| < 2^31). 4 vector ops per
//   weight row, activation column and block instead of 7.
// - Q5_0: codes u are unsigned (0..31, w = u - 16), so the lanes start at -16 * (sum of the four
//   activations): lane i = sum (u - 16) x, the AVX2 tile's (maddubs(u, x) - maddubs(16, x), madd).
// The F32 parts (cvt, d_w * d_x, one fmadd per block in block order, the final lane sum) are the
// AVX2 tiles' own, so both give the same bits (tests/engine/backend/cpu_kernels_test.cc).
#include "engine/backend/cpu/kernels.h"

#if defined(__x86_64__) && defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__F16C__)

#include <cpuid.h>
#include <immintrin.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

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

// Four f16 scales at a stride of `stride` bytes, as 4 floats.
inline __m128 QuadScaleVnni(const char* p, size_t stride) {
  uint16_t h[4];
  for (int i = 0; i < 4; ++i) std::memcpy(&h[i], p + i * stride, 2);
  const uint64_t bits = h[0] | uint64_t{h[1]} << 16 | uint64_t{h[2]} << 32 | uint64_t{h[3]} << 48;
  return _mm_cvtph_ps(_mm_cvtsi64_si128(static_cast<int64_t>(bits)));
}

// The 32 codes (0..31) of a Q5_0 block in weight order.
inline __m256i UnpackQ5_0Vnni(const BlockQ5_0* wb) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), sixteen = _mm256_set1_epi8(16);
  const __m256i spread = _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202,
                                            0x0303030303030303);
  const __m256i bits = _mm256_set1_epi64x(0x8040201008040201);
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb->qs));
  uint32_t h;
  std::memcpy(&h, wb->qh, 4);
  const __m256i hb = _mm256_and_si256(
      _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(h)), spread), bits);
  const __m256i lo = _mm256_and_si256(
      _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1), m4);
  return _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(hb, bits), sixteen));
}

// Q5_0 weights unpacked once (one code byte 0..31 per weight, rows of k bytes): what a prompt's
// MatMul uses, where every weight tile meets n / 4 activation tiles and unpacking it each time
// cost as much as the dot products. Same integer lanes and F32 order as TileQ5_0Vnni (and so
// as the AVX2 tile); the scales still come from the blocks.
void UnpackQ5_0RowsVnni(const void* w, size_t ws, int64_t rows, int64_t k, uint8_t* codes) {
  const int64_t nb = k / kQ8_0BlockSize;
  for (int64_t r = 0; r < rows; ++r) {
    const BlockQ5_0* wb = reinterpret_cast<const BlockQ5_0*>(static_cast<const char*>(w) + r * ws);
    uint8_t* out = codes + r * k;
    for (int64_t b = 0; b < nb; ++b) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + b * kQ8_0BlockSize),
                          UnpackQ5_0Vnni(wb + b));
    }
  }
}

// Q5_0 x Q8_0, four blocks per step like the AVX2 tile (one f16 -> f32 conversion for their
// scales). kCodes: the weight codes come pre-unpacked from `codes` (rows `cs` bytes apart);
// otherwise each block is unpacked here and the weights two tiles ahead are prefetched into L2.
// The scales always come from the blocks `w`.
template <int R, int C, bool kCodes>
void TileQ5_0VnniImpl(int64_t k, const uint8_t* codes, size_t cs, const char* w, size_t ws,
                      const char* x, size_t xs, float* y, int64_t ys) {
  const int64_t nb = k / kQ8_0BlockSize;
  const __m256i sixteen = _mm256_set1_epi8(16);
  const __m256i zero = _mm256_setzero_si256();
  auto code_vec = [&](int r, int64_t block) {
    if constexpr (kCodes) {
      return _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(codes + r * cs + block * kQ8_0BlockSize));
    } else {
      return UnpackQ5_0Vnni(reinterpret_cast<const BlockQ5_0*>(w + r * ws) + block);
    }
  };
  __m256 acc[R][C];
  PD_VNNI_UNROLL
  for (int r = 0; r < R; ++r)
    PD_VNNI_UNROLL
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 4 <= nb; b += 4) {
    __m256i yv[C][4], start[C][4];
    __m128 dx[C];
    PD_VNNI_UNROLL
    for (int c = 0; c < C; ++c) {
      const BlockQ8_0* xb = reinterpret_cast<const BlockQ8_0*>(x + c * xs) + b;
      PD_VNNI_UNROLL
      for (int j = 0; j < 4; ++j) {
        yv[c][j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb[j].qs));
        start[c][j] = _mm256_sub_epi32(zero, _mm256_dpbusd_epi32(zero, sixteen, yv[c][j]));
      }
      dx[c] = QuadScaleVnni(reinterpret_cast<const char*>(&xb->d), sizeof(BlockQ8_0));
    }
    PD_VNNI_UNROLL
    for (int r = 0; r < R; ++r) {
      const BlockQ5_0* wb = reinterpret_cast<const BlockQ5_0*>(w + r * ws) + b;
      if constexpr (!kCodes) {
        const char* ahead = reinterpret_cast<const char*>(wb) + 2 * R * ws;
        _mm_prefetch(ahead, _MM_HINT_T1);
        _mm_prefetch(ahead + 64, _MM_HINT_T1);
      }
      const __m128 dw = QuadScaleVnni(reinterpret_cast<const char*>(&wb->d), sizeof(BlockQ5_0));
      __m256i u[4];
      PD_VNNI_UNROLL
      for (int j = 0; j < 4; ++j) u[j] = code_vec(r, b + j);
      PD_VNNI_UNROLL
      for (int c = 0; c < C; ++c) {
        const __m256 d4 = _mm256_castps128_ps256(_mm_mul_ps(dw, dx[c]));
        PD_VNNI_UNROLL
        for (int j = 0; j < 4; ++j) {
          const __m256i dot = _mm256_dpbusd_epi32(start[c][j], u[j], yv[c][j]);
          const __m256 d = _mm256_permutevar8x32_ps(d4, _mm256_set1_epi32(j));
          acc[r][c] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot), acc[r][c]);
        }
      }
    }
  }
  for (; b < nb; ++b) {  // leftover blocks
    for (int r = 0; r < R; ++r) {
      const BlockQ5_0* wb = reinterpret_cast<const BlockQ5_0*>(w + r * ws) + b;
      const __m256i u = code_vec(r, b);
      const float dw = HalfToFloatVnni(wb->d);
      PD_VNNI_UNROLL
      for (int c = 0; c < C; ++c) {
        const BlockQ8_0* xb = reinterpret_cast<const BlockQ8_0*>(x + c * xs) + b;
        const __m256i yq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb->qs));
        const __m256i st = _mm256_sub_epi32(zero, _mm256_dpbusd_epi32(zero, sixteen, yq));
        acc[r][c] = _mm256_fmadd_ps(_mm256_set1_ps(dw * HalfToFloatVnni(xb->d)),
                                    _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(st, u, yq)),
                                    acc[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[c * ys + r] = HSumVnni(acc[r][c]);
}

template <int R, int C>
void TileQ5_0Vnni(int64_t k, const char* w, size_t ws, const char* x, size_t xs, float* y,
                  int64_t ys) {
  TileQ5_0VnniImpl<R, C, false>(k, nullptr, 0, w, ws, x, xs, y, ys);
}

template <int R, int C>
void TileQ5_0CodesVnni(int64_t k, const uint8_t* codes, size_t cs, const char* w, size_t ws,
                       const char* x, size_t xs, float* y, int64_t ys) {
  TileQ5_0VnniImpl<R, C, true>(k, codes, cs, w, ws, x, xs, y, ys);
}

using CodesTileImpl = void (*)(int64_t, const uint8_t*, size_t, const char*, size_t, const char*,
                               size_t, float*, int64_t);
template <int R, int C>
constexpr CodesTileImpl kCodesTile = &TileQ5_0CodesVnni<R, C>;
constexpr CodesTileImpl kCodesTiles[4][4] = {
    {kCodesTile<1, 1>, kCodesTile<1, 2>, kCodesTile<1, 3>, kCodesTile<1, 4>},
    {kCodesTile<2, 1>, kCodesTile<2, 2>, kCodesTile<2, 3>, kCodesTile<2, 4>},
    {kCodesTile<3, 1>, kCodesTile<3, 2>, kCodesTile<3, 3>, kCodesTile<3, 4>},
    {kCodesTile<4, 1>, kCodesTile<4, 2>, kCodesTile<4, 3>, kCodesTile<4, 4>},
};

void GemmQ5_0CodesVnni(int64_t k, const uint8_t* codes, size_t code_stride, const void* w,
                       size_t w_stride, int nr, const void* x, size_t x_stride, int nc, float* y,
                       int64_t y_stride) {
  kCodesTiles[nr - 1][nc - 1](k, codes, code_stride, static_cast<const char*>(w), w_stride,
                              static_cast<const char*>(x), x_stride, y, y_stride);
}

using TileImplVnni = void (*)(int64_t, const char*, size_t, const char*, size_t, float*, int64_t);

// Every R x C instantiation of a tile template, and the GemmTileFn that dispatches on nr, nc.
template <template <int, int> class T>
struct VnniTable {
  static constexpr TileImplVnni kFns[4][4] = {
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
static_assert(kGemmTileW == 4 && kGemmTileX == 4, "VnniTable lists 4x4 instantiations");

template <int R, int C>
struct Q8Vnni {
  static constexpr TileImplVnni Fn = &TileQ8Vnni<R, C>;
};
template <int R, int C>
struct Q5_0Vnni {
  static constexpr TileImplVnni Fn = &TileQ5_0Vnni<R, C>;
};

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

bool UseVnni() {
  static const bool use = [] {
    const char* off = std::getenv("PDSERVE_CPU_NO_VNNI");
    if (off != nullptr && off[0] != '\0' && off[0] != '0') return false;
    return CpuHasAvx512Vnni();
  }();
  return use;
}

}  // namespace

GemmTileFn Q8_0TileVnni() { return UseVnni() ? &VnniTable<Q8Vnni>::Gemm : nullptr; }
GemmTileFn Q5_0TileVnni() { return UseVnni() ? &VnniTable<Q5_0Vnni>::Gemm : nullptr; }

const Q5_0CodesKernels* Q5_0CodesVnni() {
  static constexpr Q5_0CodesKernels kKernels = {&UnpackQ5_0RowsVnni, &GemmQ5_0CodesVnni};
  return UseVnni() ? &kKernels : nullptr;
}

}  // namespace pd::engine::cpu

#else

namespace pd::engine::cpu {
GemmTileFn Q8_0TileVnni() { return nullptr; }
GemmTileFn Q5_0TileVnni() { return nullptr; }
const Q5_0CodesKernels* Q5_0CodesVnni() { return nullptr; }
}  // namespace pd::engine::cpu

#endif
