// The q8_0x16 / q5_0x16 block loads that the AVX-512 own-order kernels share (own_order_vnni.cc,
// own_order_amx.cc): a group's block as its 8 code words in the lanes of ZMM registers. Include
// only from files compiled with AVX512F/BW/VL (+ F16C), whose code runs after their CPU check.
#pragma once

#if defined(__x86_64__) && defined(__AVX512BW__) && defined(__F16C__)

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "engine/quant/q5_0x16.h"
#include "engine/quant/q8_0x16.h"

namespace pd::engine::cpu::own_x16 {

// The layouts the x16 kernels read: q8_0x16 (engine/quant/q8_0x16.h) and q5_0x16 (q5_0x16.h).
enum class X16 { kQ8_0, kQ5_0 };

template <X16 kW>
constexpr size_t X16BlockBytes() {  // per group of 16 rows and block of 32 weights
  return kW == X16::kQ8_0 ? 16 * (32 + 2) : 16 * 22;
}

// Block b's 8 code words (lane e = the group's row e, unsigned: Q8_0's w + 128, Q5_0's w + 16)
// and 16 scales.
template <X16 kW>
__attribute__((always_inline)) inline __m512 LoadX16(const char* group, int64_t nb, int64_t b,
                                                     __m512i (&w)[8]) {
  if constexpr (kW == X16::kQ8_0) {
    const char* cb = group + Q8_0x16CodesAt(b);
    // Unrolled, so the words load straight into registers (as a loop GCC copies them through
    // the stack: head_x16/q8_0/8/1 19.8 -> 11.2 ms on Zen 4).
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) w[j] = _mm512_loadu_si512(cb + 64 * j);
    return _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(group + Q8_0x16ScalesAt(nb, b))));
  } else {
    // Nibble word j: low nibbles are code word j, high nibbles code word j + 4; each takes 16
    // where its fifth bit (a byte mask loaded straight into a mask register) is set.
    const char* nib = group + Q5_0x16NibblesAt(b);
    // (_load_mask64 takes a non-const pointer; it only reads.)
    auto* masks = reinterpret_cast<__mmask64*>(const_cast<char*>(group + Q5_0x16MasksAt(nb, b)));
    const __m512i m4 = _mm512_set1_epi8(0x0F), sixteen = _mm512_set1_epi8(16);
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const __m512i q = _mm512_loadu_si512(nib + 64 * j);
      const __m512i lo = _mm512_and_si512(q, m4);
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
      w[j] = _mm512_mask_add_epi8(lo, _load_mask64(masks + j), lo, sixteen);
      w[j + 4] = _mm512_mask_add_epi8(hi, _load_mask64(masks + j + 4), hi, sixteen);
    }
    return _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(group + Q5_0x16ScalesAt(nb, b))));
  }
}

}  // namespace pd::engine::cpu::own_x16

#endif
