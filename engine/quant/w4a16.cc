#include "engine/quant/w4a16.h"

#include <algorithm>
#include <cmath>

#include "common/status.h"
#include "engine/quant/fp16.h"

namespace pd::engine {
namespace {

inline int NearestLevel(float x, float d) {
  if (d == 0.f) return 0;
  const float q = std::nearbyint(x / d);
  return static_cast<int>(std::clamp(q, -8.f, 7.f));
}

}  // namespace

void QuantizeRowW4A16(const float* x, BlockW4A16* y, int64_t n, const float* importance) {
  PD_CHECK(n % kW4A16BlockSize == 0);
  for (int64_t b = 0; b < n / kW4A16BlockSize; ++b) {
    const float* xb = x + b * kW4A16BlockSize;
    const float* wb = importance != nullptr ? importance + b * kW4A16BlockSize : nullptr;
    float amax = 0.f;
    for (int j = 0; j < kW4A16BlockSize; ++j) amax = std::max(amax, std::fabs(xb[j]));
    uint16_t best_d = 0;
    if (amax > 0.f) {
      double best_err = -1.0;
      for (int sign = 1; sign >= -1; sign -= 2) {
        for (int t = 0; t <= 15; ++t) {
          // (65 + t) / 10 is exact for t = 5 (7) and t = 15 (8): the plain rule max / 7 and the
          // Q4_0-like max / 8 are among the candidates.
          const float div = static_cast<float>(65 + t) / 10.f;
          const uint16_t d16 = F32ToF16(static_cast<float>(sign) * amax / div);
          const float d = F16ToF32(d16);
          if (d == 0.f || !std::isfinite(d)) continue;
          double err = 0.0;
          for (int j = 0; j < kW4A16BlockSize; ++j) {
            const double e = double{xb[j]} - double{d * static_cast<float>(NearestLevel(xb[j], d))};
            err += (wb != nullptr ? double{wb[j]} : 1.0) * e * e;
          }
          if (best_err < 0 || err < best_err) best_err = err, best_d = d16;
        }
      }
    }
    const float d = F16ToF32(best_d);
    int8_t q[kW4A16BlockSize];
    for (int j = 0; j < kW4A16BlockSize; ++j) q[j] = static_cast<int8_t>(NearestLevel(xb[j], d));
    PackW4A16(best_d, q, &y[b]);
  }
}

void UnpackW4A16(const BlockW4A16& b, int8_t out[128]) {
  for (int j = 0; j < 64; ++j) {
    out[j] = static_cast<int8_t>((b.qs[j] & 15) - 8);
    out[j + 64] = static_cast<int8_t>((b.qs[j] >> 4) - 8);
  }
}

void PackW4A16(uint16_t d, const int8_t q[128], BlockW4A16* b) {
  b->d = d;
  for (int j = 0; j < 64; ++j) {
    PD_CHECK(q[j] >= -8 && q[j] <= 7 && q[j + 64] >= -8 && q[j + 64] <= 7);
    b->qs[j] = static_cast<uint8_t>((q[j] + 8) | ((q[j + 64] + 8) << 4));
  }
}

void DequantizeRowW4A16(const BlockW4A16* x, float* y, int64_t n) {
  PD_CHECK(n % kW4A16BlockSize == 0);
  int8_t q[kW4A16BlockSize];
  for (int64_t b = 0; b < n / kW4A16BlockSize; ++b) {
    const float d = F16ToF32(x[b].d);
    UnpackW4A16(x[b], q);
    for (int j = 0; j < kW4A16BlockSize; ++j) {
      y[b * kW4A16BlockSize + j] = static_cast<float>(q[j]) * d;
    }
  }
}

float DotW4A16F32(const BlockW4A16* w, const float* x, int64_t n) {
  float sum = 0.f;
  int8_t q[kW4A16BlockSize];
  for (int64_t b = 0; b < n / kW4A16BlockSize; ++b) {
    UnpackW4A16(w[b], q);
    const float* xb = x + b * kW4A16BlockSize;
    float s = 0.f;
    for (int j = 0; j < kW4A16BlockSize; ++j) s += static_cast<float>(q[j]) * xb[j];
    sum += F16ToF32(w[b].d) * s;
  }
  return sum;
}

}  // namespace pd::engine
