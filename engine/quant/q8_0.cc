#include "engine/quant/q8_0.h"

#include <algorithm>
#include <cmath>

#include "common/status.h"
#include "engine/quant/fp16.h"

namespace pd::engine {

void QuantizeRowQ8_0(const float* x, BlockQ8_0* y, int64_t n) {
  PD_CHECK(n % kQ8_0BlockSize == 0);
  const int64_t nb = n / kQ8_0BlockSize;
  for (int64_t b = 0; b < nb; ++b) {
    const float* xb = x + b * kQ8_0BlockSize;
    float amax = 0.f;
    for (int j = 0; j < kQ8_0BlockSize; ++j) amax = std::max(amax, std::fabs(xb[j]));
    // The scale used for rounding is the f32 one (as ggml does), not the stored f16 one.
    const float d = amax / 127.f;
    const float id = d != 0.f ? 1.f / d : 0.f;
    y[b].d = F32ToF16(d);
    for (int j = 0; j < kQ8_0BlockSize; ++j) {
      y[b].qs[j] = static_cast<int8_t>(std::roundf(xb[j] * id));  // half away from zero
    }
  }
}

void QuantizeRowQ8_0Act(const float* x, BlockQ8_0* y, int64_t n) {
  PD_CHECK(n % kQ8_0BlockSize == 0);
  const int64_t nb = n / kQ8_0BlockSize;
  for (int64_t b = 0; b < nb; ++b) {
    const float* xb = x + b * kQ8_0BlockSize;
    float amax = 0.f;
    for (int j = 0; j < kQ8_0BlockSize; ++j) amax = std::max(amax, std::fabs(xb[j]));
    y[b].d = F32ToF16(amax / 127.f);
    const float id = amax != 0.f ? 127.f / amax : 0.f;
    for (int j = 0; j < kQ8_0BlockSize; ++j) {
      y[b].qs[j] = static_cast<int8_t>(std::nearbyint(xb[j] * id));  // half to even
    }
  }
}

void DequantizeRowQ8_0(const BlockQ8_0* x, float* y, int64_t n) {
  PD_CHECK(n % kQ8_0BlockSize == 0);
  const int64_t nb = n / kQ8_0BlockSize;
  for (int64_t b = 0; b < nb; ++b) {
    const float d = F16ToF32(x[b].d);
    for (int j = 0; j < kQ8_0BlockSize; ++j) y[b * kQ8_0BlockSize + j] = d * x[b].qs[j];
  }
}

void F32ToF16Row(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = F32ToF16(x[i]);
}
void F16ToF32Row(const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = F16ToF32(x[i]);
}
void F32ToBf16Row(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = F32ToBf16(x[i]);
}
void Bf16ToF32Row(const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = Bf16ToF32(x[i]);
}

}  // namespace pd::engine
