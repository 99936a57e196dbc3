// Internal to the AVX2 kernel table: kernels_avx2.cc builds it from the kernels of matmul_avx2.cc,
// k_quants_avx2.cc, convert_avx2.cc, kv_i8_avx2.cc, row_ops_avx2.cc and attention_avx2.cc.
//
// Include this header only from files compiled with exactly -mavx2 -mfma -mf16c (the AVX2 list
// in engine/backend/CMakeLists.txt). Its helpers are AVX2 code in an anonymous namespace, so each
// of those files has its own copy: an inline function with external linkage would let the linker
// pick one file's copy for every caller, and a copy from a file compiled with wider flags (an
// AVX-512 one) or by a file without them would be wrong for the others. The entry points in
// namespace avx2 are ordinary (non-inline) functions, defined once; they run only after
// SelectKernels() has checked the CPU.
#pragma once

#if !(defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
#error "kernels_avx2_internal.h is only for files compiled with -mavx2 -mfma -mf16c"
#endif

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "engine/backend/cpu/kernels.h"

namespace pd::engine::cpu {
namespace avx2 {

// The AVX2 table's entries (kernels.h, struct Kernels), by the file that defines them.

// matmul_avx2.cc: GemmTileFn contracts.
void GemmF32(int64_t k, const void* w, size_t w_stride, int nr, const void* x, size_t x_stride,
             int nc, float* y, int64_t y_stride);
void GemmF16(int64_t k, const void* w, size_t w_stride, int nr, const void* x, size_t x_stride,
             int nc, float* y, int64_t y_stride);
void GemmBf16(int64_t k, const void* w, size_t w_stride, int nr, const void* x, size_t x_stride,
              int nc, float* y, int64_t y_stride);
// Q4_0, Q8_0 and Q5_0: the AVX512-VNNI tile when the CPU has it (same bits), else the AVX2 one.
void GemmQ4_0Dispatch(int64_t k, const void* w, size_t w_stride, int nr, const void* x,
                      size_t x_stride, int nc, float* y, int64_t y_stride);
void GemmQ8_0Dispatch(int64_t k, const void* w, size_t w_stride, int nr, const void* x,
                      size_t x_stride, int nc, float* y, int64_t y_stride);
void GemmQ5_0Dispatch(int64_t k, const void* w, size_t w_stride, int nr, const void* x,
                      size_t x_stride, int nc, float* y, int64_t y_stride);

// k_quants_avx2.cc: GemmTileFn contracts; the Q3_K and Q2_K repacked ones take the 512-bit tiles
// where the CPU has them (same bits).
void GemmQ2_K(int64_t k, const void* w, size_t w_stride, int nr, const void* x, size_t x_stride,
              int nc, float* y, int64_t y_stride);
void GemmQ3KDispatch(int64_t k, const void* w, size_t w_stride, int nr, const void* x,
                     size_t x_stride, int nc, float* y, int64_t y_stride);
void GemmQ4_K(int64_t k, const void* w, size_t w_stride, int nr, const void* x, size_t x_stride,
              int nc, float* y, int64_t y_stride);
void GemmQ5_K(int64_t k, const void* w, size_t w_stride, int nr, const void* x, size_t x_stride,
              int nc, float* y, int64_t y_stride);
void GemmQ6_K(int64_t k, const void* w, size_t w_stride, int nr, const void* x, size_t x_stride,
              int nc, float* y, int64_t y_stride);
void GemmQ4_KWide(int64_t k, const void* w, size_t w_stride, int nr, const void* x, size_t x_stride,
                  int nc, float* y, int64_t y_stride);
void GemmQ5_KWide(int64_t k, const void* w, size_t w_stride, int nr, const void* x, size_t x_stride,
                  int nc, float* y, int64_t y_stride);
void GemmQ6_KWide(int64_t k, const void* w, size_t w_stride, int nr, const void* x, size_t x_stride,
                  int nc, float* y, int64_t y_stride);
void GemmQ4KRepackGemm(int64_t k, const void* w, size_t w_stride, int nr, const void* x,
                       size_t x_stride, int nc, float* y, int64_t y_stride);
void GemmQ4KRepackGemv(int64_t k, const void* w, size_t w_stride, int nr, const void* x,
                       size_t x_stride, int nc, float* y, int64_t y_stride);
// Five columns (Kernels::q4_k_repack_gemv5, q6_k5): the 512-bit five-column tile where it runs,
// else the 4- and 1-column tiles.
void GemmQ4KRepackGemv5(int64_t k, const void* w, size_t w_stride, int nr, const void* x,
                        size_t x_stride, int nc, float* y, int64_t y_stride);
void GemmQ6_K5(int64_t k, const void* w, size_t w_stride, int nr, const void* x, size_t x_stride,
               int nc, float* y, int64_t y_stride);
void GemmQ2KRepackGemm(int64_t k, const void* w, size_t w_stride, int nr, const void* x,
                       size_t x_stride, int nc, float* y, int64_t y_stride);
void GemmQ2KRepackGemv(int64_t k, const void* w, size_t w_stride, int nr, const void* x,
                       size_t x_stride, int nc, float* y, int64_t y_stride);

// convert_avx2.cc: row conversions.
void F32ToF16(const float* x, uint16_t* y, int64_t n);
void F16ToF32(const uint16_t* x, float* y, int64_t n);
void F32ToBf16(const float* x, uint16_t* y, int64_t n);
void Bf16ToF32(const uint16_t* x, float* y, int64_t n);
void QuantizeQ8_0(const float* x, BlockQ8_0* y, int64_t n);
void DequantizeQ8_0(const BlockQ8_0* x, float* y, int64_t n);
void QuantizeQ8_K(const float* x, BlockQ8_K* y, int64_t n);

// kv_i8_avx2.cc: the INT8 KV rows and their rotation.
void RotateKvRowAvx2(float* x, int head_dim, float scale);
float QuantizeKvI8(const float* x, int8_t* q, int64_t n);
float QuantizeKvI8F16(const uint16_t* x, float* tmp, int8_t* q, int head_dim);
void DequantizeKvI8F16(const int8_t* q, float scale, float* tmp, uint16_t* y, int head_dim);
float DotI8F32(const int8_t* a, const float* b, int64_t n);
void AxpyI8(float a, const int8_t* x, float* y, int64_t n);
void WidenI8(const int8_t* x, float* y, int64_t n);

// row_ops_avx2.cc: elementwise row ops.
double SumSquares(const float* x, int64_t n);
void Scale(const float* x, float s, float* y, int64_t n);
void ScaleMul(const float* x, float s, const float* w, float* y, int64_t n);
void Add(const float* a, const float* b, float* y, int64_t n);
void SwiGluGgml(const float* g, const float* u, float* y, int64_t n);  // attention_avx2.cc
float Max(const float* x, int64_t n);
double ExpSubSum(const float* x, float m, float* y, int64_t n);
void RopeNeox(float* v, const float* c, const float* s, int64_t half);
void RopeNormal(float* v, const float* c, const float* s, int64_t half);

// attention_avx2.cc: the AVX-512 order where the CPU has it (llama.cpp built for it uses that),
// else AVX2's.
const AttnKernels& Avx2TableAttn();

}  // namespace avx2

namespace {

inline float HSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline double HSum(__m256d v) {
  __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
  s = _mm_add_sd(s, _mm_unpackhi_pd(s, s));
  return _mm_cvtsd_f64(s);
}

inline float HalfToFloat(uint16_t h) { return _cvtsh_ss(h); }
inline uint16_t FloatToHalf(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}
inline float BfloatToFloat(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline __m256 LoadF16(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m256 LoadBf16(const uint16_t* p) {
  const __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}

// ---- shared by the MatMul tiles (matmul_avx2.cc, k_quants_avx2.cc) ----------------------------

#define PD_ALWAYS_INLINE __attribute__((always_inline))
// Fully unrolls the loop that follows (activation columns: C <= 4), so that per-column
// accumulators stay in registers instead of a stack array.
#define PD_UNROLL _Pragma("GCC unroll 8")

// Calls f(std::integral_constant<int, 0>{}) ... f(std::integral_constant<int, N - 1>{}), so that
// shift counts and table rows inside f are compile-time constants.
template <int N, typename F>
PD_ALWAYS_INLINE inline void Unroll(F&& f) {
  [&]<int... I>(std::integer_sequence<int, I...>) PD_ALWAYS_INLINE {
    (f(std::integral_constant<int, I>{}), ...);
  }(std::make_integer_sequence<int, N>{});
}

inline __m256i Load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// Weight rows are short (a few KiB) and a tile reads R of them side by side, so the hardware
// prefetchers see many short streams and fall behind DRAM (measured: Q4_K GEMV from DRAM on one
// thread 8.3 GB/s without, 13-14 GB/s with, of 14.5 GB/s). Each tile therefore prefetches the
// same block of the R rows after its own (the next tile of a row chunk, contiguous in memory) as
// it goes: one prefetch per 64 bytes of block, which covers every line since blocks are
// contiguous. Into L2 (T1): a tile ahead is R rows (18 KiB for Q4_K at k = 8192, more for longer
// rows), too much to park in L1 next to the activations; T0 measured the same or 1-3% slower.
// Prefetches past the matrix end are harmless hints.
template <int R, size_t kBlockBytes>
PD_ALWAYS_INLINE inline void PrefetchNextTile(const void* block, size_t ws) {
  const char* p = static_cast<const char*>(block) + R * ws;
  Unroll<(kBlockBytes + 63) / 64>([&](auto i) PD_ALWAYS_INLINE {
    _mm_prefetch(p + 64 * decltype(i)::value, _MM_HINT_T1);
  });
}

// The 32 codes (0..31) of a Q5_0 block in weight order: bytes 0-15 the low nibbles (weights
// 0-15), bytes 16-31 the high nibbles (weights 16-31), byte i with bit i of qh as its 0x10 (pshufb
// spreads qh byte i / 8 over 8 bytes; and, cmpeq against the bit pattern, and 0x10).
PD_ALWAYS_INLINE inline __m256i UnpackQ5_0(const BlockQ5_0* wb) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), sixteen = _mm256_set1_epi8(16);
  const __m256i spread =
      _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303);
  const __m256i bits = _mm256_set1_epi64x(0x8040201008040201);
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb->qs));
  uint32_t h;
  std::memcpy(&h, wb->qh, 4);
  const __m256i hb =
      _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(h)), spread), bits);
  const __m256i lo = _mm256_and_si256(
      _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1), m4);
  return _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(hb, bits), sixteen));
}

// HSum of four vectors (weight rows r = 0..3) stored to y[0 .. rows): each s_r = lo + hi, the
// four transposed so that lane r of p_j is s_r[j], then (p0 + p2) + (p1 + p3): HSum's additions
// for four rows at once and one 16-byte store (masked to `rows`; the vectors past them are the
// caller's zeros), where four reductions and four scalar stores were.
PD_ALWAYS_INLINE inline void StoreHSum4(__m256 a0, __m256 a1, __m256 a2, __m256 a3, float* y,
                                        int rows) {
  const __m128 s0 = _mm_add_ps(_mm256_castps256_ps128(a0), _mm256_extractf128_ps(a0, 1));
  const __m128 s1 = _mm_add_ps(_mm256_castps256_ps128(a1), _mm256_extractf128_ps(a1, 1));
  const __m128 s2 = _mm_add_ps(_mm256_castps256_ps128(a2), _mm256_extractf128_ps(a2, 1));
  const __m128 s3 = _mm_add_ps(_mm256_castps256_ps128(a3), _mm256_extractf128_ps(a3, 1));
  const __m128 a01lo = _mm_unpacklo_ps(s0, s1), a01hi = _mm_unpackhi_ps(s0, s1);
  const __m128 a23lo = _mm_unpacklo_ps(s2, s3), a23hi = _mm_unpackhi_ps(s2, s3);
  const __m128 p0 = _mm_movelh_ps(a01lo, a23lo), p1 = _mm_movehl_ps(a23lo, a01lo);
  const __m128 p2 = _mm_movelh_ps(a01hi, a23hi), p3 = _mm_movehl_ps(a23hi, a01hi);
  const __m128 v = _mm_add_ps(_mm_add_ps(p0, p2), _mm_add_ps(p1, p3));
  if (rows == 4) {
    _mm_storeu_ps(y, v);
  } else {
    _mm_maskstore_ps(y, _mm_cmpgt_epi32(_mm_set1_epi32(rows), _mm_setr_epi32(0, 1, 2, 3)), v);
  }
}

// A tile's R x C results (R <= 4 weight rows) through StoreHSum4, rows past R as zeros (the
// default model's 640-wide rows are 20 blocks, so a tile does little work per result and its
// reduction counts).
template <int R, int C>
inline void StoreTile(__m256 (&acc)[R][C], float* y, int64_t ys) {
  static_assert(R >= 1 && R <= 4);
  PD_UNROLL for (int c = 0; c < C; ++c) {
    __m256 a[4];
    PD_UNROLL for (int r = 0; r < 4; ++r) a[r] = _mm256_setzero_ps();
    PD_UNROLL for (int r = 0; r < R; ++r) a[r] = acc[r][c];
    StoreHSum4(a[0], a[1], a[2], a[3], y + c * ys, R);
  }
}

using TileImpl = void (*)(int64_t, const char*, size_t, const char*, size_t, float*, int64_t);

// Dispatch table over (nr, nc) for one tile template.
template <template <int, int> class T>
struct TileTable {
  static constexpr TileImpl kFns[kGemmTileW][kGemmTileX] = {
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
static_assert(kGemmTileW == 4 && kGemmTileX == 4, "TileTable lists 4x4 instantiations");

}  // namespace
}  // namespace pd::engine::cpu
