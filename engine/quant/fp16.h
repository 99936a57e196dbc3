// Scalar IEEE half and bfloat16 conversions (exact, round-to-nearest-even), usable everywhere.
#pragma once

#include <cstdint>
#include <cstring>

namespace pd::engine {

inline float Fp32FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t BitsFromFp32(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// IEEE binary16 -> binary32, exact for every input including subnormals, inf and NaN.
inline float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return Fp32FromBits(sign);
    // Subnormal: normalise.
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    mant &= 0x3ffu;
    return Fp32FromBits(sign | ((127 - 15 - e) << 23) | (mant << 13));
  }
  if (exp == 0x1f) return Fp32FromBits(sign | 0x7f800000u | (mant << 13));
  return Fp32FromBits(sign | ((exp + 127 - 15) << 23) | (mant << 13));
}

// binary32 -> binary16 with round-to-nearest-even; overflow gives inf, NaN stays NaN.
inline uint16_t F32ToF16(float f) {
  const uint32_t x = BitsFromFp32(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520
  if (abs < 0x38800000u) {
    // Result is subnormal or zero: shift with rounding.
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // < 2^-25 rounds to 0
    const uint32_t e = abs >> 23;
    const uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14 + (113 - e)
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t r = abs - 0x38000000u;  // rebias exponent 127 -> 15
  const uint32_t rem = r & 0x1fffu;
  r >>= 13;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return static_cast<uint16_t>(sign | r);
}

inline float Bf16ToF32(uint16_t b) { return Fp32FromBits(static_cast<uint32_t>(b) << 16); }

// binary32 -> bfloat16, round-to-nearest-even; NaN is kept quiet.
inline uint16_t F32ToBf16(float f) {
  uint32_t u = BitsFromFp32(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace pd::engine
