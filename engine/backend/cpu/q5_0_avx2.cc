// AVX2 dot product of Q5_0 weight blocks with Q8_0 activation blocks.
//
// Per block: 22 weight bytes + 34 activation bytes; 32 int8 products summed exactly in int32
// (maddubs on |w| and sign-adjusted x, then madd with ones), then one float FMA per block into an
// 8-lane accumulator reduced at the end. Results equal DotQ5_0Q8_0's up to float summation order.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "engine/quant/q5_0.h"

namespace pd::engine::cpu {
namespace {

inline float HalfToFloat(uint16_t h) { return _cvtsh_ss(h); }

// Expands the 32 high bits of a block to 32 bytes: 0x10 where the bit is set, else 0.
inline __m256i HighBitsToBytes(uint32_t qh) {
  const __m256i shuffle = _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101,
                                             0x0202020202020202, 0x0303030303030303);
  __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)), shuffle);
  const __m256i bit = _mm256_set1_epi64x(0x8040201008040201);
  bytes = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);  // 0xff where set
  return _mm256_and_si256(bytes, _mm256_set1_epi8(0x10));
}

}  // namespace

float DotQ5_0Q8_0Avx2(const BlockQ5_0* w, const BlockQ8_0* x, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  const __m256i low_mask = _mm256_set1_epi8(0x0f);
  const __m256i sixteen = _mm256_set1_epi8(16);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < n / 32; ++b) {
    const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[b].qs));
    // bytes 0-15: low nibbles (weights 0-15); bytes 16-31: high nibbles (weights 16-31)
    __m256i codes = _mm256_and_si256(
        _mm256_set_m128i(_mm_srli_epi16(qs, 4), qs), low_mask);
    uint32_t qh;
    std::memcpy(&qh, w[b].qh, 4);
    codes = _mm256_or_si256(codes, HighBitsToBytes(qh));
    const __m256i wv = _mm256_sub_epi8(codes, sixteen);  // [-16, 15]
    const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs));
    const __m256i prod16 = _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));
    const __m256i prod32 = _mm256_madd_epi16(prod16, ones);
    const __m256 d = _mm256_set1_ps(HalfToFloat(w[b].d) * HalfToFloat(x[b].d));
    acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(prod32), acc);
  }
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

}  // namespace pd::engine::cpu
