#include "engine/quant/q5_0.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/status.h"
#include "engine/quant/fp16.h"

namespace pd::engine {

void QuantizeRowQ5_0(const float* x, BlockQ5_0* y, int64_t n) {
  PD_CHECK(n % 32 == 0);
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* xb = x + b * 32;
    float amax = 0.f, m = 0.f;
    for (int j = 0; j < 32; ++j) {
      if (std::fabs(xb[j]) > amax) {
        amax = std::fabs(xb[j]);
        m = xb[j];
      }
    }
    const float d = m / -16.f;
    const float id = d != 0.f ? 1.f / d : 0.f;
    y[b].d = F32ToF16(d);
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
      const int c0 = std::min(31, static_cast<int>(static_cast<int8_t>(xb[j] * id + 16.5f)));
      const int c1 = std::min(31, static_cast<int>(static_cast<int8_t>(xb[j + 16] * id + 16.5f)));
      y[b].qs[j] = static_cast<uint8_t>((c0 & 0x0f) | ((c1 & 0x0f) << 4));
      qh |= static_cast<uint32_t>((c0 >> 4) & 1) << j;
      qh |= static_cast<uint32_t>((c1 >> 4) & 1) << (j + 16);
    }
    std::memcpy(y[b].qh, &qh, 4);
  }
}

void UnpackQ5_0(const BlockQ5_0& b, int8_t out[32]) {
  uint32_t qh;
  std::memcpy(&qh, b.qh, 4);
  for (int j = 0; j < 16; ++j) {
    out[j] = static_cast<int8_t>(((b.qs[j] & 0x0f) | (((qh >> j) & 1) << 4)) - 16);
    out[j + 16] = static_cast<int8_t>(((b.qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16);
  }
}

void DequantizeRowQ5_0(const BlockQ5_0* x, float* y, int64_t n) {
  PD_CHECK(n % 32 == 0);
  int8_t c[32];
  for (int64_t b = 0; b < n / 32; ++b) {
    const float d = F16ToF32(x[b].d);
    UnpackQ5_0(x[b], c);
    for (int j = 0; j < 32; ++j) y[b * 32 + j] = c[j] * d;
  }
}

float DotQ5_0Q8_0(const BlockQ5_0* w, const BlockQ8_0* x, int64_t n) {
  float sum = 0.f;
  int8_t c[32];
  for (int64_t b = 0; b < n / 32; ++b) {
    UnpackQ5_0(w[b], c);
    int32_t isum = 0;
    for (int j = 0; j < 32; ++j) isum += int32_t{c[j]} * x[b].qs[j];
    sum += (F16ToF32(w[b].d) * F16ToF32(x[b].d)) * static_cast<float>(isum);
  }
  return sum;
}

}  // namespace pd::engine
