// Element-wise dequantization on the device: weight `col` of a row in each WeightFormat, as F32.
// Device code: include from .cu files only.
//
// Each formula is engine/quant's scalar reference (k_quants.cc, q5_0.cc, q8_0.cc) with its
// evaluation order, and the products and differences are spelled with __fmul_rn / __fsub_rn so
// that nvcc cannot contract them into FMAs (the reference is built with -ffp-contract=off): the
// results are bit-exact with the CPU backend's GetRows.
#pragma once

#include <cstdint>

#include "engine/backend/cuda/device_util.cuh"
#include "engine/backend/cuda/quant_blocks.cuh"

namespace pd::engine::cuda {

// Q4_K/Q5_K's 6-bit scale and min of sub-block j (k_quants.h, GetScaleMinK4).
__device__ __forceinline__ void ScaleMinK4(int j, const uint8_t* s, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Q3_K's unsigned 6-bit scale u_i of sub-block i (0..15; the scale is u_i - 32) (k_quants.h,
// GetScaleQ3K).
__device__ __forceinline__ int ScaleQ3K(int i, const uint8_t* s) {
  const int low = i < 8 ? (s[i] & 15) : (s[i - 8] >> 4);
  const int high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
  return low | high << 4;
}

template <WeightFormat F>
struct Dequant;

template <>
struct Dequant<WeightFormat::kF32> {
  static constexpr int kBlockWeights = 1;
  __device__ static float At(const uint8_t* row, int64_t col) {
    return reinterpret_cast<const float*>(row)[col];
  }
};

template <>
struct Dequant<WeightFormat::kF16> {
  static constexpr int kBlockWeights = 1;
  __device__ static float At(const uint8_t* row, int64_t col) {
    return F16BitsToFloat(reinterpret_cast<const uint16_t*>(row)[col]);
  }
};

template <>
struct Dequant<WeightFormat::kBF16> {
  static constexpr int kBlockWeights = 1;
  __device__ static float At(const uint8_t* row, int64_t col) {
    return Bf16BitsToFloat(reinterpret_cast<const uint16_t*>(row)[col]);
  }
};

// d * q.
template <>
struct Dequant<WeightFormat::kQ8_0> {
  static constexpr int kBlockWeights = 32;
  __device__ static float At(const uint8_t* row, int64_t col) {
    const BlockQ8_0& b = reinterpret_cast<const BlockQ8_0*>(row)[col / 32];
    return __fmul_rn(F16BitsToFloat(b.d), static_cast<float>(b.qs[col % 32]));
  }
};

// float(c - 8) * d.
template <>
struct Dequant<WeightFormat::kQ4_0> {
  static constexpr int kBlockWeights = 32;
  __device__ static float At(const uint8_t* row, int64_t col) {
    const BlockQ4_0& b = reinterpret_cast<const BlockQ4_0*>(row)[col / 32];
    const int j = static_cast<int>(col % 32);
    const int c = j < 16 ? (b.qs[j] & 0x0F) : (b.qs[j - 16] >> 4);
    return __fmul_rn(static_cast<float>(c - 8), F16BitsToFloat(b.d));
  }
};

// float(c - 16) * d.
template <>
struct Dequant<WeightFormat::kQ5_0> {
  static constexpr int kBlockWeights = 32;
  __device__ static float At(const uint8_t* row, int64_t col) {
    const BlockQ5_0& b = reinterpret_cast<const BlockQ5_0*>(row)[col / 32];
    const int j = static_cast<int>(col % 32);
    const int low = j < 16 ? (b.qs[j] & 0x0F) : (b.qs[j - 16] >> 4);
    const int high = (b.qh[j / 8] >> (j % 8)) & 1;
    return __fmul_rn(static_cast<float>((low | high << 4) - 16), F16BitsToFloat(b.d));
  }
};

// (d * sc_i) * q - dmin * m_i.
template <>
struct Dequant<WeightFormat::kQ2_K> {
  static constexpr int kBlockWeights = 256;
  __device__ static float At(const uint8_t* row, int64_t col) {
    const BlockQ2_K& b = reinterpret_cast<const BlockQ2_K*>(row)[col / 256];
    const int w = static_cast<int>(col % 256);
    const int i = w / 16;
    const int q = (b.qs[32 * (w / 128) + w % 32] >> (2 * ((w % 128) / 32))) & 3;
    const float dl = __fmul_rn(F16BitsToFloat(b.d), static_cast<float>(b.scales[i] & 0x0F));
    const float ml = __fmul_rn(F16BitsToFloat(b.dmin), static_cast<float>(b.scales[i] >> 4));
    return __fsub_rn(__fmul_rn(dl, static_cast<float>(q)), ml);
  }
};

// (d * (u_i - 32)) * q, q = low2 - 4 where the high bit is clear.
template <>
struct Dequant<WeightFormat::kQ3_K> {
  static constexpr int kBlockWeights = 256;
  __device__ static float At(const uint8_t* row, int64_t col) {
    const BlockQ3_K& b = reinterpret_cast<const BlockQ3_K*>(row)[col / 256];
    const int w = static_cast<int>(col % 256);
    const int low = (b.qs[32 * (w / 128) + w % 32] >> (2 * ((w % 128) / 32))) & 3;
    const int high = (b.hmask[w % 32] >> (w / 32)) & 1;
    const int q = low - (high != 0 ? 0 : 4);
    const float dl =
        __fmul_rn(F16BitsToFloat(b.d), static_cast<float>(ScaleQ3K(w / 16, b.scales) - 32));
    return __fmul_rn(dl, static_cast<float>(q));
  }
};

// (d * sc_j) * q - dmin * m_j.
template <>
struct Dequant<WeightFormat::kQ4_K> {
  static constexpr int kBlockWeights = 256;
  __device__ static float At(const uint8_t* row, int64_t col) {
    const BlockQ4_K& b = reinterpret_cast<const BlockQ4_K*>(row)[col / 256];
    const int w = static_cast<int>(col % 256);
    const int j = w / 32;
    int sc, m;
    ScaleMinK4(j, b.scales, &sc, &m);
    const float d1 = __fmul_rn(F16BitsToFloat(b.d), static_cast<float>(sc));
    const float m1 = __fmul_rn(F16BitsToFloat(b.dmin), static_cast<float>(m));
    const int q = (b.qs[32 * (j / 2) + w % 32] >> (4 * (j % 2))) & 0x0F;
    return __fsub_rn(__fmul_rn(d1, static_cast<float>(q)), m1);
  }
};

// (d * sc_j) * q - dmin * m_j, q with its fifth bit from qh.
template <>
struct Dequant<WeightFormat::kQ5_K> {
  static constexpr int kBlockWeights = 256;
  __device__ static float At(const uint8_t* row, int64_t col) {
    const BlockQ5_K& b = reinterpret_cast<const BlockQ5_K*>(row)[col / 256];
    const int w = static_cast<int>(col % 256);
    const int j = w / 32, l = w % 32;
    int sc, m;
    ScaleMinK4(j, b.scales, &sc, &m);
    const float d1 = __fmul_rn(F16BitsToFloat(b.d), static_cast<float>(sc));
    const float m1 = __fmul_rn(F16BitsToFloat(b.dmin), static_cast<float>(m));
    const int q = ((b.qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0F) | ((b.qh[l] >> j) & 1) << 4;
    return __fsub_rn(__fmul_rn(d1, static_cast<float>(q)), m1);
  }
};

// (d * sc_i) * (q - 32).
template <>
struct Dequant<WeightFormat::kQ6_K> {
  static constexpr int kBlockWeights = 256;
  __device__ static float At(const uint8_t* row, int64_t col) {
    const BlockQ6_K& b = reinterpret_cast<const BlockQ6_K*>(row)[col / 256];
    const int w = static_cast<int>(col % 256);
    const int h = w / 128, k = (w % 128) / 32, l = w % 32;
    const int low = (b.ql[64 * h + 32 * (k & 1) + l] >> (4 * (k / 2))) & 0x0F;
    const int high = (b.qh[32 * h + l] >> (2 * k)) & 3;
    const float dl = __fmul_rn(F16BitsToFloat(b.d), static_cast<float>(b.scales[w / 16]));
    return __fmul_rn(dl, static_cast<float>((low | high << 4) - 32));
  }
};

}  // namespace pd::engine::cuda
