// Scalar reference quantizers of Q4_0, the k-quants and Q8_K (layouts in k_quants.h).
//
// Design (our own; llama.cpp's searches differ):
// - Every stored code is the nearest level of its sub-block's stored grid (clamped to the code
//   range), except a few "pinned" weights described below. Errors are always measured on what
//   would be stored: the f16 scales, the integer sub-block scales and mins, and the float
//   expression the dequantizer evaluates.
// - k-quants: the f16 super-scales come from the data by a fixed rule (below); given them, each
//   sub-block tries EVERY integer scale (and the min nearest to its smallest weight, and that
//   min's two neighbours) and keeps the one of smallest weighted squared error. Three candidate
//   super-scales (kPinOvershoot) are tried, and a fourth (with its own dmin) from the
//   sub-blocks' weighted least-squares scales and mins (FitSymmetricScale, FitAffine: the
//   largest maps to the extreme integer scale, as llama.cpp does; no weight pinned, mins
//   searched around the fitted ones). The best total error wins. The fourth finds the grid of
//   weights that llama.cpp quantized (and that were dequantized since) again, which the pinned
//   rule below does not.
// - No weight is stored more than kMaxClipSteps steps of its grid away from its input, so the
//   search may clip outliers, but only a little.
// - Idempotence: quantizing dequantized values again gives the same values. The super-scales
//   must then be recoverable from the dequantized values, which the rule guarantees by pinning
//   one sub-block:
//     symmetric (Q3_K, Q6_K): d = x_am / (qmin * scmin * (1 + k / |qmin|)), x_am the value of
//       largest magnitude in the super-block (the first, on ties); its sub-block gets scale
//       scmin and x_am code qmin, so that on dequantized input x_am = d * scmin * qmin exactly
//       and k = 0 finds d again.
//     with mins (Q2_K, Q4_K, Q5_K): d = r / (smax * qmax * (1 + k / qmax)), r the largest
//       sub-block range max(x) - min(min(x), 0); that sub-block gets scale smax and its maximum
//       code qmax, so its range on dequantized input is smax * qmax * d. dmin = -x_min / smax
//       for the super-block minimum x_min < 0, whose sub-block gets min smax. Every sub-block
//       with a nonzero min stores its smallest weight at code 0, so that its min is the negated
//       smallest dequantized value.
//   With d and dmin recovered, each sub-block's exact (scale, min) is among those tried and has
//   zero error, so it (or another encoding of the same values) wins again.
//   The pin costs accuracy only where the super-scale is an f16 subnormal (blocks with
//   |x_am| < 2^-14 |qmin * scmin| or r < 2^-14 smax * qmax): the pinned weight is then off by up
//   to half an f16 step of d times that factor.
// - Q4_0 (no super-block): the scale maps the largest magnitude to each nonzero level and to
//   fractional levels near both ends, is refit by weighted least squares, rounded to f16, and
//   judged by the stored error; on-grid input finds its own scale among the integer levels.
// This file is built with -ffp-contract=off: the encoder evaluates the dequantizer's float
// expressions and must round exactly as it does.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/status.h"
#include "engine/quant/fp16.h"
#include "engine/quant/k_quants.h"

namespace pd::engine {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Super-scales tried for the k-quants: the pinned weight lands `k` code steps beyond the end of
// its grid (and is clipped by at most k steps), trading its error for finer sub-block scales.
constexpr float kPinOvershoot[] = {0.f, 0.25f, 0.5f};

// A stored weight may lie at most this many grid steps from its input (clipping at the ends of
// the grid; a sub-block of scale 0 counts steps of the super-scale). Bounds the error of every
// weight by two natural steps while leaving the search free to clip outliers a little.
constexpr float kMaxClipSteps = 2.f;

// Round half to even (the default rounding mode), as ggml's nearest_int.
inline int Nearest(float v) { return static_cast<int>(std::nearbyint(v)); }
inline int Clamp(int v, int lo, int hi) { return std::min(hi, std::max(lo, v)); }

// f16 bits of v, saturated to the largest finite f16 instead of overflowing to inf.
uint16_t ToF16Saturated(float v) {
  const uint16_t h = F32ToF16(v);
  if ((h & 0x7c00u) == 0x7c00u) return static_cast<uint16_t>((h & 0x8000u) | 0x7bffu);
  return h;
}

// The weights of n consecutive values: importance[0..n), or ones when importance is nullptr or
// holds no positive weight.
void SubWeights(const float* importance, int n, float* w) {
  float sum = 0.f;
  if (importance != nullptr) {
    for (int j = 0; j < n; ++j) sum += importance[j];
  }
  for (int j = 0; j < n; ++j) w[j] = sum > 0.f ? importance[j] : 1.f;
}

// Index of the first value of largest magnitude.
int ArgMaxAbs(const float* x, int n) {
  int im = 0;
  for (int j = 1; j < n; ++j) {
    if (std::fabs(x[j]) > std::fabs(x[im])) im = j;
  }
  return im;
}

// ---- Q4_0 ----------------------------------------------------------------------------------

void QuantizeBlockQ4_0(const float* x, const float* w, BlockQ4_0* y) {
  constexpr int kN = 32, kQMin = -8, kQMax = 7;
  const float xm = x[ArgMaxAbs(x, kN)];
  // d = 0 (every weight at level 0) stays only if no scale is representable: an all-zero block,
  // or one so small that its scale underflows f16.
  uint16_t best_d = 0;
  double best_err = kInf;
  // Stores with the f16 rounding of scale s, keeps it if better, and returns the weighted
  // least-squares scale for the codes it chose (0 when there is none).
  auto try_scale = [&](float s) -> float {
    const uint16_t d16 = ToF16Saturated(s);
    const float d = F16ToF32(d16);
    if (d == 0.f) return 0.f;
    double err = 0, sxl = 0, sll = 0;
    bool clipped = false;
    for (int j = 0; j < kN; ++j) {
      const int l = Clamp(Nearest(x[j] / d), kQMin, kQMax);
      const double r = x[j] - static_cast<float>(l) * d;
      err += w[j] * r * r;
      sxl += double{w[j]} * x[j] * l;
      sll += double{w[j]} * l * l;
      clipped |= std::fabs(r) > kMaxClipSteps * std::fabs(d);
    }
    if (err < best_err && !clipped) {
      best_err = err;
      best_d = d16;
    }
    return sll > 0 ? static_cast<float>(sxl / sll) : 0.f;
  };
  if (xm != 0.f) {
    for (int t = kQMin; t <= kQMax; ++t) {
      if (t != 0) try_scale(try_scale(xm / static_cast<float>(t)));
    }
    for (int k = 0; k < 14; ++k) {
      for (float t : {kQMin - 0.4f + 0.1f * k, kQMax + 0.4f - 0.1f * k}) {
        const float s1 = try_scale(xm / t);
        if (s1 != 0.f) try_scale(try_scale(s1));
      }
    }
  }
  // Every candidate clipped too far: only when the scale saturates f16 (|x| > ~5e5).
  if (best_err == kInf && xm != 0.f) best_d = ToF16Saturated(xm / static_cast<float>(kQMin));
  y->d = best_d;
  const float d = F16ToF32(best_d);
  for (int j = 0; j < 16; ++j) {
    const int l0 = d != 0.f ? Clamp(Nearest(x[j] / d), kQMin, kQMax) : 0;
    const int l1 = d != 0.f ? Clamp(Nearest(x[j + 16] / d), kQMin, kQMax) : 0;
    y->qs[j] = static_cast<uint8_t>((l0 - kQMin) | (l1 - kQMin) << 4);
  }
}

// ---- k-quants without mins (Q3_K, Q6_K) ------------------------------------------------------

struct SymmetricFormat {
  int sub;           // weights per sub-block (16)
  int qmin, qmax;    // code levels
  int scmin, scmax;  // integer sub-block scales
};

struct SymmetricCode {
  uint16_t d = 0;
  int sc[16] = {};
  int l[kQK] = {};  // levels qmin..qmax
};

// Best scale of sub-block x[0..sub) for super-scale d: its error, and its scale and codes.
// `pin` >= 0: the scale is fixed to scmin and weight `pin` to qmin.
// `strict`: no second pass; kInf when every scale clips too far (or by more than r_cap).
double EncodeSymmetricSub(const SymmetricFormat& f, const float* x, const float* w, float d,
                          int pin, int* sc_out, int* l_out, bool strict = false,
                          double r_cap = kInf) {
  double best = kInf;
  const int sc_hi = pin >= 0 ? f.scmin : f.scmax;
  int l[32];
  // The pinned sub-block is not limited (its one candidate clips by at most 1 + overshoot steps);
  // should every other candidate clip too far, the second pass takes the best regardless.
  for (int pass = 0; pass < (strict ? 1 : 2) && best == kInf; ++pass) {
    const bool limit_clip = pass == 0 && pin < 0;
    for (int sc = f.scmin; sc <= sc_hi; ++sc) {
      const float dl = d * static_cast<float>(sc);
      const double max_r = std::min(r_cap, double{kMaxClipSteps * std::fabs(dl != 0.f ? dl : d)});
      double err = 0;
      for (int j = 0; j < f.sub && err < best; ++j) {
        l[j] = dl != 0.f ? Clamp(Nearest(x[j] / dl), f.qmin, f.qmax) : 0;
        if (j == pin) l[j] = f.qmin;
        const double r = x[j] - dl * static_cast<float>(l[j]);
        err += w[j] * r * r;
        if (limit_clip && std::fabs(r) > max_r) err = kInf;
      }
      if (err < best) {
        best = err;
        *sc_out = sc;
        std::copy(l, l + f.sub, l_out);
      }
      if (best == 0) break;
    }
  }
  return best;
}

// The weighted least-squares scale s of sub-block x[0..n) for codes qmin..qmax (x ~ s * l):
// codes from 19 trial scales around amax / qmin, each refit; the best fit's scale.
float FitSymmetricScale(const float* x, const float* w, int n, int qmin, int qmax) {
  const float xm = x[ArgMaxAbs(x, n)];
  if (xm == 0.f) return 0.f;
  double best = 0;
  float scale = xm / static_cast<float>(qmin);
  for (int is = -9; is <= 9; ++is) {
    const float iscale = (static_cast<float>(qmin) + 0.1f * static_cast<float>(is)) / xm;
    double sxl = 0, sll = 0;
    for (int j = 0; j < n; ++j) {
      const int l = Clamp(Nearest(iscale * x[j]), qmin, qmax);
      sxl += double{w[j]} * x[j] * l;
      sll += double{w[j]} * l * l;
    }
    // Error of the refit: sum w x^2 - sxl^2 / sll; the largest sxl^2 / sll wins.
    if (sll > 0 && sxl * sxl > best * sll) {
      best = sxl * sxl / sll;
      scale = static_cast<float>(sxl / sll);
    }
  }
  // And the largest weight at every integer level of either sign (on-grid input: its own).
  for (int k = 1; k <= std::max(-qmin, qmax); ++k) {
    for (const int sign : {-1, 1}) {
      const float iscale = static_cast<float>(sign * k) / xm;
      double sxl = 0, sll = 0;
      for (int j = 0; j < n; ++j) {
        const int l = Clamp(Nearest(iscale * x[j]), qmin, qmax);
        sxl += double{w[j]} * x[j] * l;
        sll += double{w[j]} * l * l;
      }
      if (sll > 0 && sxl * sxl > best * sll) {
        best = sxl * sxl / sll;
        scale = static_cast<float>(sxl / sll);
      }
    }
  }
  return scale;
}

// The super-scale for sub-block scales s[0..n) stored as integers of magnitude <= kmax: among
// s_ref / k for k = kmax, kmax - 1, ..., kmax / 2 (s_ref the scale of largest magnitude), the one
// whose integer multiples come closest to all of them. On scales that are exact multiples of
// one super-scale (weights dequantized from such a grid) it finds that super-scale.
float BestSuperScale(const float* s, int n, int kmax) {
  float s_ref = 0.f;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(s[i]) > std::fabs(s_ref)) s_ref = s[i];
  }
  if (s_ref == 0.f) return 0.f;
  float best_d = s_ref / static_cast<float>(kmax);
  double best = kInf;
  for (int k = kmax; k >= kmax / 2; --k) {
    const float d = s_ref / static_cast<float>(k);
    double err = 0;
    for (int i = 0; i < n; ++i) {
      const double r = s[i] - d * std::nearbyint(s[i] / d);
      err += r * r;
    }
    if (err < best * (1 - 1e-9)) {
      best = err;
      best_d = d;
    }
  }
  return best_d;
}

// The values a symmetric code stores, as the dequantizer computes them.
void SymmetricValues(const SymmetricFormat& f, const SymmetricCode& c, float* y) {
  const float d = F16ToF32(c.d);
  for (int k = 0; k < kQK; ++k) {
    y[k] = d * static_cast<float>(c.sc[k / f.sub]) * static_cast<float>(c.l[k]);
  }
}

// `verify`: the fitted candidate (below) is taken only if quantizing the values it stores gives
// those values again (so that quantization stays idempotent); the check itself runs with false.
void EncodeSymmetric(const SymmetricFormat& f, const float* x, const float* w, SymmetricCode* out,
                     bool verify = true) {
  const int n_sub = kQK / f.sub;
  const int am = ArgMaxAbs(x, kQK);
  *out = SymmetricCode{};
  if (x[am] == 0.f) return;  // all zero: d = 0, codes 0
  double best_total = kInf;
  SymmetricCode cand;
  for (float k : kPinOvershoot) {
    const float delta = k / static_cast<float>(-f.qmin);
    cand.d = ToF16Saturated(x[am] / (static_cast<float>(f.qmin * f.scmin) * (1.f + delta)));
    const float d = F16ToF32(cand.d);
    double total = 0;
    for (int i = 0; i < n_sub && total < best_total; ++i) {
      const int pin = am / f.sub == i ? am % f.sub : -1;
      total += EncodeSymmetricSub(f, x + i * f.sub, w + i * f.sub, d, pin, &cand.sc[i],
                                  cand.l + i * f.sub);
    }
    if (total < best_total) {
      best_total = total;
      *out = cand;
    }
  }
  // One more super-scale, from the sub-blocks' own least-squares scales: the one of largest
  // magnitude gets the extreme integer scale scmin (no weight pinned). On weights that already
  // lie on a grid of this format made that way (llama.cpp's rule), it finds that grid again.
  // Taken only when no sub-block clips a weight by more than kMaxClipSteps.
  float s_fit[16];
  for (int i = 0; i < n_sub; ++i) {
    // Magnitudes: the sign of a sub-block scale is the search's choice.
    s_fit[i] = std::fabs(FitSymmetricScale(x + i * f.sub, w + i * f.sub, f.sub, f.qmin, f.qmax));
  }
  // Its grid steps may exceed the natural step h; no weight is clipped by more than 2 h.
  const double h = std::fabs(x[am]) / static_cast<double>(-f.qmin);
  cand.d = ToF16Saturated(-BestSuperScale(s_fit, n_sub, -f.scmin));
  const float d = F16ToF32(cand.d);
  if (d == 0.f) return;
  double total = 0;
  for (int i = 0; i < n_sub && total < best_total; ++i) {
    total += EncodeSymmetricSub(f, x + i * f.sub, w + i * f.sub, d, -1, &cand.sc[i],
                                cand.l + i * f.sub, /*strict=*/true, kMaxClipSteps * h);
  }
  if (!(total < best_total)) return;
  if (verify) {
    float y[kQK], y2[kQK];
    SymmetricValues(f, cand, y);
    SymmetricCode again;
    EncodeSymmetric(f, y, w, &again, /*verify=*/false);
    SymmetricValues(f, again, y2);
    if (std::memcmp(y, y2, sizeof(y)) != 0) return;
  }
  *out = cand;
}

// ---- k-quants with mins (Q2_K, Q4_K, Q5_K) ---------------------------------------------------

struct AffineFormat {
  int sub;   // weights per sub-block
  int qmax;  // codes 0..qmax
  int smax;  // integer scales and mins 0..smax
};

struct AffineCode {
  uint16_t d = 0, dmin = 0;
  int sc[16] = {}, m[16] = {};
  int l[kQK] = {};
};

// Best (scale, min) of sub-block x[0..sub) for super-scales d, dmin: the error, scale, min and
// codes. The min is the nearest one to -min(x) or a neighbour (`m_fixed` >= 0: exactly that);
// with a nonzero min the smallest weight `jmin` takes code 0. `jmax` >= 0 pins the scale to smax
// and weight jmax to code qmax.
//
// `m_center` >= 0 (the unpinned search): mins around m_center instead, and no weight pinned to
// code 0; with `strict`, no second pass (kInf when every candidate clips too far, or by more
// than r_cap).
double EncodeAffineSub(const AffineFormat& f, const float* x, const float* w, float d, float dmin,
                       int jmin, int jmax, int m_fixed, int* sc_out, int* m_out, int* l_out,
                       float m_center = -1.f, bool strict = false, double r_cap = kInf) {
  double best = kInf;
  int m_lo = 0, m_hi = 0;
  const bool pin_min = m_center < 0.f;
  if (m_fixed >= 0) {
    m_lo = m_hi = m_fixed;
  } else if (dmin > 0.f) {
    const int m0 = Clamp(Nearest(pin_min ? std::max(0.f, -x[jmin]) / dmin : m_center / dmin), 0,
                         f.smax);
    m_lo = std::max(0, m0 - 1);
    m_hi = std::min(f.smax, m0 + 1);
  }
  const int sc_lo = jmax >= 0 ? f.smax : 0;
  int l[32];
  // As in EncodeSymmetricSub: the sub-block pinned by its maximum is not limited.
  for (int pass = 0; pass < (strict ? 1 : 2) && best == kInf; ++pass) {
    const bool limit_clip = pass == 0 && jmax < 0;
    for (int m = m_lo; m <= m_hi; ++m) {
      const float ml = dmin * static_cast<float>(m);
      for (int sc = sc_lo; sc <= f.smax; ++sc) {
        const float dl = d * static_cast<float>(sc);
        const double max_r = std::min(r_cap, kMaxClipSteps * double{dl != 0.f ? dl : d});
        double err = 0;
        for (int j = 0; j < f.sub && err < best; ++j) {
          l[j] = dl != 0.f ? Clamp(Nearest((x[j] + ml) / dl), 0, f.qmax) : 0;
          if (pin_min && m > 0 && j == jmin) l[j] = 0;
          if (j == jmax) l[j] = f.qmax;
          const double r = x[j] - (dl * static_cast<float>(l[j]) - ml);
          err += w[j] * r * r;
          if (limit_clip && std::fabs(r) > max_r) err = kInf;
        }
        if (err < best) {
          best = err;
          *sc_out = sc;
          *m_out = m;
          std::copy(l, l + f.sub, l_out);
        }
      }
    }
  }
  return best;
}

// The weighted least-squares scale and min of sub-block x[0..n) for codes 0..qmax
// (x ~ s * l - m, m >= 0): codes from 21 trial scales across the range, each refit; the best.
void FitAffine(const float* x, const float* w, int n, int qmax, float* s_out, float* m_out) {
  float lo = x[0], hi = x[0];
  for (int j = 1; j < n; ++j) {
    lo = std::min(lo, x[j]);
    hi = std::max(hi, x[j]);
  }
  lo = std::min(lo, 0.f);
  *s_out = hi > lo ? (hi - lo) / static_cast<float>(qmax) : 0.f;
  *m_out = -lo;
  if (!(hi > lo)) return;
  double best = kInf;
  int l[32];
  for (int is = 0; is <= 20; ++is) {
    const float iscale = (static_cast<float>(qmax) - 1.f + 0.1f * static_cast<float>(is)) /
                         (hi - lo);
    double sw = 0, sl = 0, sll = 0, sx = 0, sxl = 0;
    for (int j = 0; j < n; ++j) {
      l[j] = Clamp(Nearest(iscale * (x[j] - lo)), 0, qmax);
      sw += w[j];
      sl += double{w[j]} * l[j];
      sll += double{w[j]} * l[j] * l[j];
      sx += double{w[j]} * x[j];
      sxl += double{w[j]} * x[j] * l[j];
    }
    const double det = sw * sll - sl * sl;
    if (det <= 0) continue;
    double s = (sw * sxl - sx * sl) / det, b = (sll * sx - sl * sxl) / det;  // x ~ s l + b
    if (b > 0) {  // the min must not be negative: b = 0
      b = 0;
      s = sll > 0 ? sxl / sll : 0;
    }
    if (s <= 0) continue;
    double err = 0;
    for (int j = 0; j < n; ++j) {
      const double r = s * l[j] + b - x[j];
      err += w[j] * r * r;
    }
    if (err < best) {
      best = err;
      *s_out = static_cast<float>(s);
      *m_out = static_cast<float>(-b);
    }
  }
  // On-grid input: the range spans an integer number k of steps, the smallest weight at code 0.
  for (int k = 1; k <= qmax; ++k) {
    const float step = (hi - lo) / static_cast<float>(k);
    double err = 0;
    for (int j = 0; j < n; ++j) {
      const float r = x[j] - (lo + step * static_cast<float>(Clamp(Nearest((x[j] - lo) / step),
                                                                      0, qmax)));
      err += double{w[j]} * r * r;
    }
    if (err < best) {
      best = err;
      *s_out = step;
      *m_out = -lo;
    }
  }
}

// The values an affine code stores, as the dequantizer computes them.
void AffineValues(const AffineFormat& f, const AffineCode& c, float* y) {
  const float d = F16ToF32(c.d), dmin = F16ToF32(c.dmin);
  for (int k = 0; k < kQK; ++k) {
    const int i = k / f.sub;
    const float dl = d * static_cast<float>(c.sc[i]), ml = dmin * static_cast<float>(c.m[i]);
    y[k] = dl * static_cast<float>(c.l[k]) - ml;
  }
}

// `verify`: as in EncodeSymmetric.
void EncodeAffine(const AffineFormat& f, const float* x, const float* w, AffineCode* out,
                  bool verify = true) {
  const int n_sub = kQK / f.sub;
  int jmin[16], jmax[16];
  int k_range = 0, k_min = 0;  // sub-blocks of the largest range and of the minimum
  float range_max = -1.f;
  for (int i = 0; i < n_sub; ++i) {
    const float* xs = x + i * f.sub;
    jmin[i] = jmax[i] = 0;
    for (int j = 1; j < f.sub; ++j) {
      if (xs[j] < xs[jmin[i]]) jmin[i] = j;
      if (xs[j] > xs[jmax[i]]) jmax[i] = j;
    }
    const float range = xs[jmax[i]] - std::min(xs[jmin[i]], 0.f);
    if (range > range_max) {
      range_max = range;
      k_range = i;
    }
    if (xs[jmin[i]] < x[k_min * f.sub + jmin[k_min]]) k_min = i;
  }
  const float x_min = x[k_min * f.sub + jmin[k_min]];
  *out = AffineCode{};
  AffineCode cand;
  cand.dmin = x_min < 0.f ? ToF16Saturated(-x_min / static_cast<float>(f.smax)) : 0;
  const float dmin = F16ToF32(cand.dmin);
  double best_total = kInf;
  for (float k : kPinOvershoot) {
    const float delta = k / static_cast<float>(f.qmax);
    cand.d = ToF16Saturated(range_max / (static_cast<float>(f.smax * f.qmax) * (1.f + delta)));
    const float d = F16ToF32(cand.d);
    double total = 0;
    for (int i = 0; i < n_sub && total < best_total; ++i) {
      const int m_fixed = i == k_min && dmin > 0.f ? f.smax : -1;
      total += EncodeAffineSub(f, x + i * f.sub, w + i * f.sub, d, dmin, jmin[i],
                               i == k_range ? jmax[i] : -1, m_fixed, &cand.sc[i], &cand.m[i],
                               cand.l + i * f.sub);
    }
    if (total < best_total) {
      best_total = total;
      *out = cand;
    }
  }
  // One more pair of super-scales, from the sub-blocks' own least-squares scales and mins (as
  // in EncodeSymmetric): d maps the largest to scale smax, dmin the largest min to smax; mins
  // are searched around each sub-block's fitted min, nothing pinned.
  float s_fit[16], m_fit[16];
  for (int i = 0; i < n_sub; ++i) {
    FitAffine(x + i * f.sub, w + i * f.sub, f.sub, f.qmax, &s_fit[i], &m_fit[i]);
  }
  // Its grid steps may exceed the natural step h; no weight is clipped by more than 2 h.
  const double h =
      (std::max(double{*std::max_element(x, x + kQK)}, 0.0) - std::min(double{x_min}, 0.0)) /
      f.qmax;
  cand.d = ToF16Saturated(BestSuperScale(s_fit, n_sub, f.smax));
  cand.dmin = ToF16Saturated(BestSuperScale(m_fit, n_sub, f.smax));
  const float d2 = F16ToF32(cand.d), dmin2 = F16ToF32(cand.dmin);
  if (d2 == 0.f) return;
  double total = 0;
  for (int i = 0; i < n_sub && total < best_total; ++i) {
    total += EncodeAffineSub(f, x + i * f.sub, w + i * f.sub, d2, dmin2, jmin[i], -1, -1,
                             &cand.sc[i], &cand.m[i], cand.l + i * f.sub, m_fit[i],
                             /*strict=*/true, kMaxClipSteps * h);
  }
  if (!(total < best_total)) return;
  if (verify) {
    float y[kQK], y2[kQK];
    AffineValues(f, cand, y);
    AffineCode again;
    EncodeAffine(f, y, w, &again, /*verify=*/false);
    AffineValues(f, again, y2);
    if (std::memcmp(y, y2, sizeof(y)) != 0) return;
  }
  *out = cand;
}

// ---- Bit packing -------------------------------------------------------------------------------

// Q2_K / Q3_K 2-bit plane: weight w = 128h + 32k + l in bits 2k..2k+1 of qs[32h + l].
void Pack2BitPlane(const int* u, uint8_t* qs) {
  std::memset(qs, 0, 64);
  for (int w = 0; w < kQK; ++w) {
    qs[32 * (w / 128) + w % 32] |= static_cast<uint8_t>((u[w] & 3) << (2 * ((w % 128) / 32)));
  }
}

// Q4_K / Q5_K 12 scale bytes from eight 6-bit scales and mins.
void PackScalesK4(const int* sc, const int* m, uint8_t* s) {
  for (int j = 0; j < 4; ++j) {
    s[j] = static_cast<uint8_t>((sc[j] & 63) | (sc[j + 4] >> 4) << 6);
    s[j + 4] = static_cast<uint8_t>((m[j] & 63) | (m[j + 4] >> 4) << 6);
    s[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | (m[j + 4] & 15) << 4);
  }
}

// Q4_K / Q5_K low nibbles: weight w = 64p + 32t + l in nibble t of qs[32p + l].
void PackNibblesK4(const int* u, uint8_t* qs) {
  std::memset(qs, 0, 128);
  for (int w = 0; w < kQK; ++w) {
    qs[32 * (w / 64) + w % 32] |= static_cast<uint8_t>((u[w] & 15) << (4 * ((w % 64) / 32)));
  }
}

// Q3_K / Q5_K one-bit plane: bit (w / 32) of h[w % 32] is bit `bit` of u[w].
void PackHighBits(const int* u, int bit, uint8_t* h) {
  std::memset(h, 0, 32);
  for (int w = 0; w < kQK; ++w) {
    h[w % 32] |= static_cast<uint8_t>(((u[w] >> bit) & 1) << (w / 32));
  }
}

constexpr SymmetricFormat kQ3KFormat{16, -4, 3, -32, 31};
constexpr SymmetricFormat kQ6KFormat{16, -32, 31, -128, 127};
constexpr AffineFormat kQ2KFormat{16, 3, 15};
constexpr AffineFormat kQ4KFormat{32, 15, 63};
constexpr AffineFormat kQ5KFormat{32, 31, 63};

}  // namespace

template <>
void QuantizeRow(const float* x, BlockQ4_0* y, int64_t n, const float* importance) {
  PD_CHECK(n % BlockQ4_0::kWeights == 0);
  float w[32];
  for (int64_t b = 0; b < n / BlockQ4_0::kWeights; ++b) {
    SubWeights(importance ? importance + b * 32 : nullptr, 32, w);
    QuantizeBlockQ4_0(x + b * 32, w, y + b);
  }
}

// Weights of a super-block: each sub-block of `sub` falls back to ones on its own.
static void SuperWeights(const float* importance, int sub, float* w) {
  for (int i = 0; i < kQK / sub; ++i) {
    SubWeights(importance ? importance + i * sub : nullptr, sub, w + i * sub);
  }
}

template <>
void QuantizeRow(const float* x, BlockQ2_K* y, int64_t n, const float* importance) {
  PD_CHECK(n % kQK == 0);
  float w[kQK];
  AffineCode c;
  for (int64_t b = 0; b < n / kQK; ++b) {
    SuperWeights(importance ? importance + b * kQK : nullptr, kQ2KFormat.sub, w);
    EncodeAffine(kQ2KFormat, x + b * kQK, w, &c);
    BlockQ2_K& blk = y[b];
    blk.d = c.d;
    blk.dmin = c.dmin;
    for (int i = 0; i < 16; ++i) blk.scales[i] = static_cast<uint8_t>(c.sc[i] | c.m[i] << 4);
    Pack2BitPlane(c.l, blk.qs);
  }
}

template <>
void QuantizeRow(const float* x, BlockQ3_K* y, int64_t n, const float* importance) {
  PD_CHECK(n % kQK == 0);
  float w[kQK];
  SymmetricCode c;
  int u[kQK];
  for (int64_t b = 0; b < n / kQK; ++b) {
    SuperWeights(importance ? importance + b * kQK : nullptr, kQ3KFormat.sub, w);
    EncodeSymmetric(kQ3KFormat, x + b * kQK, w, &c);
    BlockQ3_K& blk = y[b];
    blk.d = c.d;
    for (int k = 0; k < kQK; ++k) u[k] = c.l[k] + 4;  // 0..7; bit 2 set means "no -4"
    Pack2BitPlane(u, blk.qs);
    PackHighBits(u, 2, blk.hmask);
    std::memset(blk.scales, 0, 12);
    for (int i = 0; i < 16; ++i) {
      const int v = c.sc[i] + 32;  // 0..63
      blk.scales[i % 8] |= static_cast<uint8_t>((v & 15) << (i < 8 ? 0 : 4));
      blk.scales[8 + i % 4] |= static_cast<uint8_t>((v >> 4) << (2 * (i / 4)));
    }
  }
}

template <>
void QuantizeRow(const float* x, BlockQ4_K* y, int64_t n, const float* importance) {
  PD_CHECK(n % kQK == 0);
  float w[kQK];
  AffineCode c;
  for (int64_t b = 0; b < n / kQK; ++b) {
    SuperWeights(importance ? importance + b * kQK : nullptr, kQ4KFormat.sub, w);
    EncodeAffine(kQ4KFormat, x + b * kQK, w, &c);
    BlockQ4_K& blk = y[b];
    blk.d = c.d;
    blk.dmin = c.dmin;
    PackScalesK4(c.sc, c.m, blk.scales);
    PackNibblesK4(c.l, blk.qs);
  }
}

template <>
void QuantizeRow(const float* x, BlockQ5_K* y, int64_t n, const float* importance) {
  PD_CHECK(n % kQK == 0);
  float w[kQK];
  AffineCode c;
  for (int64_t b = 0; b < n / kQK; ++b) {
    SuperWeights(importance ? importance + b * kQK : nullptr, kQ5KFormat.sub, w);
    EncodeAffine(kQ5KFormat, x + b * kQK, w, &c);
    BlockQ5_K& blk = y[b];
    blk.d = c.d;
    blk.dmin = c.dmin;
    PackScalesK4(c.sc, c.m, blk.scales);
    PackNibblesK4(c.l, blk.qs);
    PackHighBits(c.l, 4, blk.qh);
  }
}

template <>
void QuantizeRow(const float* x, BlockQ6_K* y, int64_t n, const float* importance) {
  PD_CHECK(n % kQK == 0);
  float w[kQK];
  SymmetricCode c;
  for (int64_t b = 0; b < n / kQK; ++b) {
    SuperWeights(importance ? importance + b * kQK : nullptr, kQ6KFormat.sub, w);
    EncodeSymmetric(kQ6KFormat, x + b * kQK, w, &c);
    BlockQ6_K& blk = y[b];
    blk.d = c.d;
    for (int i = 0; i < 16; ++i) blk.scales[i] = static_cast<int8_t>(c.sc[i]);
    std::memset(blk.ql, 0, sizeof(blk.ql));
    std::memset(blk.qh, 0, sizeof(blk.qh));
    for (int k = 0; k < kQK; ++k) {
      const int u = c.l[k] + 32;  // 0..63
      const int h = k / 128, q = (k % 128) / 32, l = k % 32;
      blk.ql[64 * h + 32 * (q & 1) + l] |= static_cast<uint8_t>((u & 15) << (4 * (q / 2)));
      blk.qh[32 * h + l] |= static_cast<uint8_t>((u >> 4) << (2 * q));
    }
  }
}

// ggml's reference Q8_K quantizer (see k_quants.h); `importance` is ignored.
template <>
void QuantizeRow(const float* x, BlockQ8_K* y, int64_t n, const float* importance) {
  PD_CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float* xb = x + b * kQK;
    BlockQ8_K& blk = y[b];
    const float max = xb[ArgMaxAbs(xb, kQK)];
    std::memset(blk.bsums, 0, sizeof(blk.bsums));
    if (max == 0.f) {
      blk.d = 0.f;
      std::memset(blk.qs, 0, sizeof(blk.qs));
      continue;
    }
    const float iscale = -127.f / max;
    for (int j = 0; j < kQK; ++j) {
      blk.qs[j] = static_cast<int8_t>(std::min(127, Nearest(iscale * xb[j])));
      blk.bsums[j / 16] = static_cast<int16_t>(blk.bsums[j / 16] + blk.qs[j]);
    }
    blk.d = 1.f / iscale;
  }
}

}  // namespace pd::engine
