// Scalar reference dequantizers of Q4_0 and the k-quants, and the DType row dispatch.
//
// Each expression is written in ggml's evaluation order (noted per format in k_quants.h) so that
// the results are bit-exact with llama.cpp's; this file is built with -ffp-contract=off.
#include "engine/quant/k_quants.h"

#include "engine/quant/q5_0.h"
#include "engine/quant/w4a16.h"
#include "engine/quant/w8a8.h"

#include <cstring>

#include "common/status.h"
#include "engine/quant/fp16.h"

namespace pd::engine {

// 2 bytes read and 32 floats written per block.
template <>
void DequantizeRow(const BlockQ4_0* x, float* y, int64_t n) {
  PD_CHECK(n % BlockQ4_0::kWeights == 0);
  for (int64_t b = 0; b < n / BlockQ4_0::kWeights; ++b) {
    const float d = F16ToF32(x[b].d);
    float* yb = y + b * BlockQ4_0::kWeights;
    for (int j = 0; j < 16; ++j) {
      yb[j] = static_cast<float>((x[b].qs[j] & 0x0F) - 8) * d;
      yb[j + 16] = static_cast<float>((x[b].qs[j] >> 4) - 8) * d;
    }
  }
}

template <>
void DequantizeRow(const BlockQ2_K* x, float* y, int64_t n) {
  PD_CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const BlockQ2_K& blk = x[b];
    const float d = F16ToF32(blk.d);
    const float dmin = F16ToF32(blk.dmin);
    float* yb = y + b * kQK;
    for (int w = 0; w < kQK; ++w) {
      const int i = w / 16;
      const int q = (blk.qs[32 * (w / 128) + w % 32] >> (2 * ((w % 128) / 32))) & 3;
      const float dl = d * static_cast<float>(blk.scales[i] & 0x0F);
      const float ml = dmin * static_cast<float>(blk.scales[i] >> 4);
      yb[w] = dl * static_cast<float>(q) - ml;
    }
  }
}

template <>
void DequantizeRow(const BlockQ3_K* x, float* y, int64_t n) {
  PD_CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const BlockQ3_K& blk = x[b];
    const float d = F16ToF32(blk.d);
    float* yb = y + b * kQK;
    for (int w = 0; w < kQK; ++w) {
      const int low = (blk.qs[32 * (w / 128) + w % 32] >> (2 * ((w % 128) / 32))) & 3;
      const bool high = (blk.hmask[w % 32] >> (w / 32)) & 1;
      const int q = low - (high ? 0 : 4);
      const float dl = d * static_cast<float>(GetScaleQ3K(w / 16, blk.scales) - 32);
      yb[w] = dl * static_cast<float>(q);
    }
  }
}

namespace {

// Q4_K and Q5_K share everything but the fifth bit; qh == nullptr for Q4_K.
void DequantizeQ45K(uint16_t d16, uint16_t dmin16, const uint8_t* scales, const uint8_t* qh,
                    const uint8_t* qs, float* y) {
  const float d = F16ToF32(d16);
  const float dmin = F16ToF32(dmin16);
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    GetScaleMinK4(j, scales, &sc, &m);
    const float d1 = d * static_cast<float>(sc);
    const float m1 = dmin * static_cast<float>(m);
    const uint8_t* q = qs + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int l = 0; l < 32; ++l) {
      int v = (q[l] >> shift) & 0x0F;
      if (qh != nullptr) v |= ((qh[l] >> j) & 1) << 4;
      y[32 * j + l] = d1 * static_cast<float>(v) - m1;
    }
  }
}

}  // namespace

template <>
void DequantizeRow(const BlockQ4_K* x, float* y, int64_t n) {
  PD_CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) {
    DequantizeQ45K(x[b].d, x[b].dmin, x[b].scales, nullptr, x[b].qs, y + b * kQK);
  }
}

template <>
void DequantizeRow(const BlockQ5_K* x, float* y, int64_t n) {
  PD_CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) {
    DequantizeQ45K(x[b].d, x[b].dmin, x[b].scales, x[b].qh, x[b].qs, y + b * kQK);
  }
}

template <>
void DequantizeRow(const BlockQ6_K* x, float* y, int64_t n) {
  PD_CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const BlockQ6_K& blk = x[b];
    const float d = F16ToF32(blk.d);
    float* yb = y + b * kQK;
    for (int w = 0; w < kQK; ++w) {
      const int h = w / 128, k = (w % 128) / 32, l = w % 32;
      const int low = (blk.ql[64 * h + 32 * (k & 1) + l] >> (4 * (k / 2))) & 0x0F;
      const int high = (blk.qh[32 * h + l] >> (2 * k)) & 3;
      const int q = (low | high << 4) - 32;
      const float dl = d * static_cast<float>(blk.scales[w / 16]);
      yb[w] = dl * static_cast<float>(q);
    }
  }
}

template <>
void DequantizeRow(const BlockQ8_K* x, float* y, int64_t n) {
  PD_CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) {
    for (int w = 0; w < kQK; ++w) y[b * kQK + w] = x[b].d * static_cast<float>(x[b].qs[w]);
  }
}

template <>
void DequantizeRow(const BlockQ8_0* x, float* y, int64_t n) {
  DequantizeRowQ8_0(x, y, n);
}

template <>
void QuantizeRow(const float* x, BlockQ8_0* y, int64_t n, const float* importance) {
  QuantizeRowQ8_0(x, y, n);
}

void DequantizeRow(DType t, const void* x, float* y, int64_t n) {
  PD_CHECK(n % Traits(t).block_size == 0);
  switch (t) {
    case DType::kF32:
      if (n > 0) std::memcpy(y, x, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::kF16:
      return F16ToF32Row(static_cast<const uint16_t*>(x), y, n);
    case DType::kBF16:
      return Bf16ToF32Row(static_cast<const uint16_t*>(x), y, n);
    case DType::kQ8_0:
      return DequantizeRowQ8_0(static_cast<const BlockQ8_0*>(x), y, n);
    case DType::kQ4_0:
      return DequantizeRow(static_cast<const BlockQ4_0*>(x), y, n);
    case DType::kQ5_0:
      return DequantizeRowQ5_0(static_cast<const BlockQ5_0*>(x), y, n);
    case DType::kQ2_K:
      return DequantizeRow(static_cast<const BlockQ2_K*>(x), y, n);
    case DType::kQ3_K:
      return DequantizeRow(static_cast<const BlockQ3_K*>(x), y, n);
    case DType::kQ4_K:
      return DequantizeRow(static_cast<const BlockQ4_K*>(x), y, n);
    case DType::kQ5_K:
      return DequantizeRow(static_cast<const BlockQ5_K*>(x), y, n);
    case DType::kQ6_K:
      return DequantizeRow(static_cast<const BlockQ6_K*>(x), y, n);
    case DType::kQ8_K:
      return DequantizeRow(static_cast<const BlockQ8_K*>(x), y, n);
    case DType::kW8A8:
      return DequantizeRowW8A8(x, y, n);
    case DType::kW4A16:
      return DequantizeRowW4A16(static_cast<const BlockW4A16*>(x), y, n);
    case DType::kQ8_0x16:
    case DType::kQ5_0x16:
    case DType::kQ4_Kx16:
    case DType::kQ6_Kx16:
      break;  // rows interleaved 16 at a time: Unpack*x16Row (q*x16.h)
  }
  PD_CHECK_MSG(false, "unsupported DType");
}

void QuantizeRow(DType t, const float* x, void* y, int64_t n, const float* importance) {
  PD_CHECK(n % Traits(t).block_size == 0);
  switch (t) {
    case DType::kF32:
      if (n > 0) std::memcpy(y, x, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::kF16:
      return F32ToF16Row(x, static_cast<uint16_t*>(y), n);
    case DType::kBF16:
      return F32ToBf16Row(x, static_cast<uint16_t*>(y), n);
    case DType::kQ8_0:
      return QuantizeRowQ8_0(x, static_cast<BlockQ8_0*>(y), n);
    case DType::kQ4_0:
      return QuantizeRow(x, static_cast<BlockQ4_0*>(y), n, importance);
    case DType::kQ5_0:
      return QuantizeRowQ5_0(x, static_cast<BlockQ5_0*>(y), n);  // importance not used
    case DType::kQ2_K:
      return QuantizeRow(x, static_cast<BlockQ2_K*>(y), n, importance);
    case DType::kQ3_K:
      return QuantizeRow(x, static_cast<BlockQ3_K*>(y), n, importance);
    case DType::kQ4_K:
      return QuantizeRow(x, static_cast<BlockQ4_K*>(y), n, importance);
    case DType::kQ5_K:
      return QuantizeRow(x, static_cast<BlockQ5_K*>(y), n, importance);
    case DType::kQ6_K:
      return QuantizeRow(x, static_cast<BlockQ6_K*>(y), n, importance);
    case DType::kQ8_K:
      return QuantizeRow(x, static_cast<BlockQ8_K*>(y), n, importance);
    case DType::kW8A8:
      return QuantizeRowW8A8(x, y, n);  // importance not used (one scale per row)
    case DType::kW4A16:
      return QuantizeRowW4A16(x, static_cast<BlockW4A16*>(y), n, importance);
    case DType::kQ8_0x16:
    case DType::kQ5_0x16:
    case DType::kQ4_Kx16:
    case DType::kQ6_Kx16:
      break;  // made from Q8_0 / Q5_0 / Q4_K / Q6_K rows at load (q*x16.h), never quantized
  }
  PD_CHECK_MSG(false, "unsupported DType");
}

}  // namespace pd::engine
