#include "engine/quant/w8a8.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/status.h"

namespace pd::engine {

float W8A8RowScale(const void* row) {
  float d;
  std::memcpy(&d, row, sizeof(d));
  return d;
}

void QuantizeRowW8A8(const float* x, void* y, int64_t n) {
  PD_CHECK(n % kW8A8BlockSize == 0);
  float amax = 0.f;
  for (int64_t j = 0; j < n; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.f;
  const float id = d != 0.f ? 1.f / d : 0.f;
  uint8_t* out = static_cast<uint8_t*>(y);
  std::memset(out, 0, kW8A8HeaderBytes);
  std::memcpy(out, &d, sizeof(d));
  int8_t* q = reinterpret_cast<int8_t*>(out + kW8A8HeaderBytes);
  for (int64_t j = 0; j < n; ++j) {
    // |x * id| <= 127 up to rounding of id; clamp so that a one-ulp excess never makes 128.
    const float v = std::roundf(x[j] * id);
    q[j] = static_cast<int8_t>(std::clamp(v, -127.f, 127.f));
  }
}

void DequantizeRowW8A8(const void* x, float* y, int64_t n) {
  PD_CHECK(n % kW8A8BlockSize == 0);
  const float d = W8A8RowScale(x);
  const int8_t* q = W8A8RowCodes(x);
  for (int64_t j = 0; j < n; ++j) y[j] = d * static_cast<float>(q[j]);
}

void PackRowW8A8(float d, const int8_t* q, void* y, int64_t n) {
  PD_CHECK(n % kW8A8BlockSize == 0);
  uint8_t* out = static_cast<uint8_t*>(y);
  std::memset(out, 0, kW8A8HeaderBytes);
  std::memcpy(out, &d, sizeof(d));
  for (int64_t j = 0; j < n; ++j) PD_CHECK(q[j] >= -127);
  std::memcpy(out + kW8A8HeaderBytes, q, static_cast<size_t>(n));
}

float DotW8A8(const void* w, const void* x, int64_t n) {
  const int8_t* qw = W8A8RowCodes(w);
  const int8_t* qx = W8A8RowCodes(x);
  int64_t isum = 0;
  for (int64_t j = 0; j < n; ++j) isum += int32_t{qw[j]} * int32_t{qx[j]};
  return (W8A8RowScale(w) * W8A8RowScale(x)) * static_cast<float>(isum);
}

std::vector<float> SmoothingFactors(const std::vector<float>& act_absmax,
                                    const std::vector<float>& w_absmax, float alpha) {
  PD_CHECK(act_absmax.size() == w_absmax.size());
  PD_CHECK(alpha >= 0.f && alpha <= 1.f);
  std::vector<float> s(act_absmax.size(), 1.f);
  for (size_t j = 0; j < s.size(); ++j) {
    if (!(act_absmax[j] > 0.f) || !(w_absmax[j] > 0.f)) continue;
    const double a = std::max(double{act_absmax[j]}, 1e-5);
    const double w = std::max(double{w_absmax[j]}, 1e-5);
    s[j] = static_cast<float>(std::pow(a, alpha) / std::pow(w, 1.0 - alpha));
  }
  return s;
}

}  // namespace pd::engine
