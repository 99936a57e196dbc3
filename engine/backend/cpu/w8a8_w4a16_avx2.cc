// AVX2 + FMA + F16C kernels for pdserve's own formats W8A8 and W4A16 (layouts in
// engine/quant/w8a8.h and w4a16.h). Compiled with -mavx2 -mfma -mf16c and called only after
// SelectKernels() has checked the CPU. Like kernels_avx2.cc, it calls no inline function from a
// shared header (an AVX2 copy could be picked by the linker for the whole program); only
// constants come from the headers.
//
// Scalar twins: DotW8A8 / DotW4A16F32 / QuantizeRowW8A8; tests/engine/backend/
// pd_format_kernels_test.cc compares them.
#include "engine/backend/cpu/kernels.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <immintrin.h>

#include <cstring>

namespace pd::engine::cpu {
namespace {

#define PD_W4_UNROLL _Pragma("GCC unroll 16")

inline float HSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The exact sum of 8 int32 lanes.
inline int64_t HSum64(__m256i v) {
  alignas(32) int32_t l[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(l), v);
  int64_t s = 0;
  for (int i = 0; i < 8; ++i) s += l[i];
  return s;
}

inline float RowScale(const char* row) {
  float d;
  std::memcpy(&d, row, sizeof(d));
  return d;
}

// ---- W8A8 ----------------------------------------------------------------------------------
// Rows of R <= 2 weights x C <= 4 tokens over the whole row: per 32 codes and (row, token) pair,
// maddubs(|w|, sign(x, w)) gives 16 int16 pair sums (at most 2 * 127 * 127, no saturation: codes
// are never -128) and madd with ones 8 int32 sums added to the pair's int32 accumulator (each
// lane grows by at most 4 * 127^2 per step: exact for k <= 2^20). At the end the lanes are summed
// exactly in int64 and scaled: (d_w * d_x) * float(sum), the scalar kernel's expression, so the
// results are bit-identical. Bytes: k + 16 per weight row and token row; 2 k flops per pair.
// Registers: 2 x 4 accumulators + 4 activation vectors + 2 weight vectors + ones.
template <int R, int C>
void TileW8A8(int64_t k, const char* w, size_t ws, const char* x, size_t xs, float* y, int64_t ys) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_si256();
  const char* wq = w + kW8A8HeaderBytes;
  const char* xq = x + kW8A8HeaderBytes;
  for (int64_t i = 0; i < k; i += 32) {
    __m256i xv[C];
    for (int c = 0; c < C; ++c) {
      xv[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + c * xs + i));
    }
    for (int r = 0; r < R; ++r) {
      const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wq + r * ws + i));
      const __m256i wabs = _mm256_sign_epi8(wv, wv);
      for (int c = 0; c < C; ++c) {
        const __m256i p16 = _mm256_maddubs_epi16(wabs, _mm256_sign_epi8(xv[c], wv));
        acc[r][c] = _mm256_add_epi32(acc[r][c], _mm256_madd_epi16(p16, ones));
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    const float dw = RowScale(w + r * ws);
    for (int c = 0; c < C; ++c) {
      const float dx = RowScale(x + c * xs);
      y[c * ys + r] = (dw * dx) * static_cast<float>(HSum64(acc[r][c]));
    }
  }
}

template <int R>
void TileW8A8Cols(int64_t k, const char* w, size_t ws, const char* x, size_t xs, int nc, float* y,
                  int64_t ys) {
  switch (nc) {
    case 1:
      return TileW8A8<R, 1>(k, w, ws, x, xs, y, ys);
    case 2:
      return TileW8A8<R, 2>(k, w, ws, x, xs, y, ys);
    case 3:
      return TileW8A8<R, 3>(k, w, ws, x, xs, y, ys);
    default:
      return TileW8A8<R, 4>(k, w, ws, x, xs, y, ys);
  }
}

// ---- W4A16 ---------------------------------------------------------------------------------
// Per block of 128 and weight row: d is broadcast once; each 8 consecutive weights are 8 nibbles
// (the low or high halves of 8 code bytes), widened to int32, converted to f32 and turned into
// weights by one fmsub (u * d - 8 d, exact: u * d is exact in f32 for f16 d and u < 16, so this
// equals float(u - 8) * d); then one FMA per token. Per 8 weights: ~5 ops + C FMAs; bytes: 66
// per 128 weights per row, 512 per 128 activations per token (from L1 after the first row).
// An FMA chain into one register would wait 4 cycles per step (its latency): with few tokens,
// each (row, token) pair keeps K = 4 / C independent partial sums, added at the end (measured on
// an 8192 x 8192 GEMV, one thread: 14.4 ms of CPU time with one chain, 7.6 ms with four).
// Registers: R x C x K <= 8 accumulators + C activation vectors.
template <int R, int C>
void TileW4A16(int64_t k, const char* w, size_t ws, const char* x, size_t xs, float* y,
               int64_t ys) {
  constexpr int K = C == 1 ? 4 : C == 2 ? 2 : 1;
  __m256 acc[R][C][K];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c)
      for (int a = 0; a < K; ++a) acc[r][c][a] = _mm256_setzero_ps();
  const __m256i low = _mm256_set1_epi32(15);
  const int64_t nb = k / kW4A16BlockSize;
  for (int64_t b = 0; b < nb; ++b) {
    __m256 d[R], d8[R];
    const uint8_t* qs[R];
    for (int r = 0; r < R; ++r) {
      const BlockW4A16* blk = reinterpret_cast<const BlockW4A16*>(w + r * ws) + b;
      uint16_t h;
      std::memcpy(&h, &blk->d, 2);
      d[r] = _mm256_set1_ps(_cvtsh_ss(h));
      d8[r] = _mm256_mul_ps(d[r], _mm256_set1_ps(8.f));
      qs[r] = blk->qs;
    }
    const float* xb[C];
    for (int c = 0; c < C; ++c) {
      xb[c] = reinterpret_cast<const float*>(x + c * xs) + b * kW4A16BlockSize;
    }
    // i = 0..15 runs over the 16 groups of 8 weights: i < 8 the low nibbles of bytes 8i..8i+7
    // (weights 8i..), i >= 8 the high nibbles of bytes 8(i-8).. (weights 64 + 8(i-8)..).
    PD_W4_UNROLL for (int i = 0; i < 16; ++i) {
      const int v = i & 7;
      __m256 xv[C];
      for (int c = 0; c < C; ++c) xv[c] = _mm256_loadu_ps(xb[c] + 8 * i);
      for (int r = 0; r < R; ++r) {
        const __m256i raw =
            _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs[r] + 8 * v)));
        const __m256i u = i < 8 ? _mm256_and_si256(raw, low) : _mm256_srli_epi32(raw, 4);
        const __m256 wv = _mm256_fmsub_ps(_mm256_cvtepi32_ps(u), d[r], d8[r]);
        for (int c = 0; c < C; ++c) {
          acc[r][c][i % K] = _mm256_fmadd_ps(wv, xv[c], acc[r][c][i % K]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) {
      __m256 s = acc[r][c][0];
      for (int a = 1; a < K; ++a) s = _mm256_add_ps(s, acc[r][c][a]);
      y[c * ys + r] = HSum(s);
    }
  }
}

template <int R>
void TileW4A16Cols(int64_t k, const char* w, size_t ws, const char* x, size_t xs, int nc, float* y,
                   int64_t ys) {
  switch (nc) {
    case 1:
      return TileW4A16<R, 1>(k, w, ws, x, xs, y, ys);
    case 2:
      return TileW4A16<R, 2>(k, w, ws, x, xs, y, ys);
    case 3:
      return TileW4A16<R, 3>(k, w, ws, x, xs, y, ys);
    default:
      return TileW4A16<R, 4>(k, w, ws, x, xs, y, ys);
  }
}

}  // namespace

void GemmW8A8Avx2(int64_t k, const void* w, size_t w_stride, int nr, const void* x, size_t x_stride,
                  int nc, float* y, int64_t y_stride) {
  const char* wb = static_cast<const char*>(w);
  const char* xb = static_cast<const char*>(x);
  // Row pairs keep the accumulators in registers (2 x 4 of them).
  for (int r = 0; r < nr; r += 2) {
    if (nr - r >= 2) {
      TileW8A8Cols<2>(k, wb + r * w_stride, w_stride, xb, x_stride, nc, y + r, y_stride);
    } else {
      TileW8A8Cols<1>(k, wb + r * w_stride, w_stride, xb, x_stride, nc, y + r, y_stride);
    }
  }
}

void GemmW4A16Avx2(int64_t k, const void* w, size_t w_stride, int nr, const void* x,
                   size_t x_stride, int nc, float* y, int64_t y_stride) {
  const char* wb = static_cast<const char*>(w);
  const char* xb = static_cast<const char*>(x);
  for (int r = 0; r < nr; r += 2) {
    if (nr - r >= 2) {
      TileW4A16Cols<2>(k, wb + r * w_stride, w_stride, xb, x_stride, nc, y + r, y_stride);
    } else {
      TileW4A16Cols<1>(k, wb + r * w_stride, w_stride, xb, x_stride, nc, y + r, y_stride);
    }
  }
}

// amax by vector max (exact, order-free), then roundf(x * id) as trunc + (|frac| >= 0.5 ? +-1),
// which equals roundf for every float (the subtraction s - trunc(s) is exact), clamped to
// [-127, 127] like the scalar rule, packed to int8.
void QuantizeRowW8A8Avx2(const float* x, void* y, int64_t n) {
  const __m256 sign_mask = _mm256_set1_ps(-0.f);
  __m256 amax = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) {
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign_mask, _mm256_loadu_ps(x + i)));
  }
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  const float d = _mm_cvtss_f32(m) / 127.f;
  const float id = d != 0.f ? 1.f / d : 0.f;
  char* out = static_cast<char*>(y);
  std::memset(out, 0, kW8A8HeaderBytes);
  std::memcpy(out, &d, sizeof(d));
  int8_t* q = reinterpret_cast<int8_t*>(out + kW8A8HeaderBytes);
  const __m256 vid = _mm256_set1_ps(id);
  const __m256 half = _mm256_set1_ps(0.5f);
  const __m256 one = _mm256_set1_ps(1.f);
  const __m256 lim = _mm256_set1_ps(127.f);
  const __m256 nlim = _mm256_set1_ps(-127.f);
  for (int64_t i = 0; i < n; i += 32) {
    __m256i qi[4];
    for (int j = 0; j < 4; ++j) {
      const __m256 s = _mm256_mul_ps(_mm256_loadu_ps(x + i + 8 * j), vid);
      const __m256 t = _mm256_round_ps(s, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
      const __m256 frac = _mm256_andnot_ps(sign_mask, _mm256_sub_ps(s, t));
      const __m256 step = _mm256_or_ps(_mm256_and_ps(s, sign_mask), one);  // +-1
      __m256 r = _mm256_add_ps(t, _mm256_and_ps(step, _mm256_cmp_ps(frac, half, _CMP_GE_OQ)));
      r = _mm256_max_ps(nlim, _mm256_min_ps(lim, r));
      qi[j] = _mm256_cvtps_epi32(r);
    }
    const __m256i q16a = _mm256_packs_epi32(qi[0], qi[1]);
    const __m256i q16b = _mm256_packs_epi32(qi[2], qi[3]);
    const __m256i q8 = _mm256_packs_epi16(q16a, q16b);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i), _mm256_permutevar8x32_epi32(q8, order));
  }
}

}  // namespace pd::engine::cpu

#endif
