// pdserve's own order for Q8_0 and Q5_0 weights x Q8_0 activations (kernels.h, Q8_0OwnOrder*,
// Q5_0*OwnOrder*): the packed activation layout that every ISA's kernel reads, and the portable
// kernels, which are the statement of the order the VNNI kernels (own_order_vnni.cc) are tested
// against bit for bit.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "engine/backend/cpu/kernels.h"
#include "engine/quant/fp16.h"
#include "engine/quant/k_quants.h"
#include "engine/quant/q4_kx16.h"
#include "engine/quant/q5_0x16.h"
#include "engine/quant/q6_kx16.h"
#include "engine/quant/q8_0.h"
#include "engine/quant/q8_0x16.h"

namespace pd::engine::cpu {

size_t Q8_0OwnXRowBytes(int64_t nb) {
  return (static_cast<size_t>(nb) * 40 + 63) / 64 * 64;  // 32 codes + d_x + offset per block
}

size_t Q8_0OwnXBytes(int64_t n, int64_t k) {
  return static_cast<size_t>(n) * Q8_0OwnXRowBytes(k / kQ8_0BlockSize);
}

void PackQ8_0OwnX(const void* x, size_t x_stride, int64_t n, int64_t k, void* out) {
  const int64_t nb = k / kQ8_0BlockSize;
  const size_t row_bytes = Q8_0OwnXRowBytes(nb);
  for (int64_t i = 0; i < n; ++i) {
    const auto* src =
        reinterpret_cast<const BlockQ8_0*>(static_cast<const char*>(x) + i * x_stride);
    char* dst = static_cast<char*>(out) + i * row_bytes;
    auto* d = reinterpret_cast<float*>(dst + nb * kQ8_0BlockSize);
    auto* offset = reinterpret_cast<int32_t*>(d + nb);
    for (int64_t b = 0; b < nb; ++b) {
      std::memcpy(dst + b * kQ8_0BlockSize, src[b].qs, kQ8_0BlockSize);
      d[b] = F16ToF32(src[b].d);
      int32_t sum = 0;
      for (int j = 0; j < kQ8_0BlockSize; ++j) sum += src[b].qs[j];
      offset[b] = -128 * sum;
    }
  }
}

namespace {

// The k-quant orders' packed activation rows: per super-block its 256 codes, then d_x per
// super-block, then per super-block kWords words, word p the 16-bit sums of sub-blocks 2p (low
// half) and 2p + 1 (high half), sub-blocks of 256 / (2 kWords) codes (Q4_K: 4 words, sub-blocks
// of 32, |sum| <= 4096; Q6_K: 8 words, sub-blocks of 16, Q8_K's bsums themselves).
template <int kWords>
size_t KOwnXRowBytes(int64_t nbk) {
  return (static_cast<size_t>(nbk) * (kQK + 4 + 4 * kWords) + 63) / 64 * 64;
}

template <int kWords>
void PackKOwnX(const void* x, size_t x_stride, int64_t n, int64_t k, void* out) {
  constexpr int kSums = 16 / (2 * kWords);  // Q8_K bsums (of 16 codes) per sub-block
  const int64_t nbk = k / kQK;
  const size_t row_bytes = KOwnXRowBytes<kWords>(nbk);
  for (int64_t i = 0; i < n; ++i) {
    const auto* src =
        reinterpret_cast<const BlockQ8_K*>(static_cast<const char*>(x) + i * x_stride);
    char* dst = static_cast<char*>(out) + i * row_bytes;
    char* d = dst + nbk * kQK;
    char* words = d + nbk * 4;
    for (int64_t s = 0; s < nbk; ++s) {
      std::memcpy(dst + s * kQK, src[s].qs, kQK);
      std::memcpy(d + s * 4, &src[s].d, 4);
      for (int p = 0; p < kWords; ++p) {
        int32_t half[2] = {0, 0};
        for (int h = 0; h < 2; ++h) {
          for (int b = 0; b < kSums; ++b) half[h] += src[s].bsums[(2 * p + h) * kSums + b];
        }
        const uint32_t word = static_cast<uint16_t>(half[0]) |
                              static_cast<uint32_t>(static_cast<uint16_t>(half[1])) << 16;
        std::memcpy(words + s * 4 * kWords + p * 4, &word, 4);
      }
    }
  }
}

}  // namespace

size_t Q4_KOwnXRowBytes(int64_t nbk) { return KOwnXRowBytes<4>(nbk); }
size_t Q4_KOwnXBytes(int64_t n, int64_t k) {
  return static_cast<size_t>(n) * Q4_KOwnXRowBytes(k / kQK);
}
void PackQ4_KOwnX(const void* x, size_t x_stride, int64_t n, int64_t k, void* out) {
  PackKOwnX<4>(x, x_stride, n, k, out);
}

size_t Q6_KOwnXRowBytes(int64_t nbk) { return KOwnXRowBytes<8>(nbk); }
size_t Q6_KOwnXBytes(int64_t n, int64_t k) {
  return static_cast<size_t>(n) * Q6_KOwnXRowBytes(k / kQK);
}
void PackQ6_KOwnX(const void* x, size_t x_stride, int64_t n, int64_t k, void* out) {
  PackKOwnX<8>(x, x_stride, n, k, out);
}

namespace {

// A block's weight codes as their values: Q8_0's as stored, Q5_0's minus 16.
void BlockCodes(const BlockQ8_0& b, int8_t out[kQ8_0BlockSize]) {
  std::memcpy(out, b.qs, kQ8_0BlockSize);
}
void BlockCodes(const BlockQ5_0& b, int8_t out[kQ8_0BlockSize]) { UnpackQ5_0(b, out); }

// The order itself: y = fma(d_w * d_x, isum, y) over the blocks in order from +0, isum the
// block's exact integer dot product (|isum| <= 32 * 128 * 127 < 2^24, so its F32 is exact).
template <typename W>
float OwnOrderDot(const W* wr, int64_t nb, const char* xr) {
  const auto* xq = reinterpret_cast<const int8_t*>(xr);
  const auto* xd = reinterpret_cast<const float*>(xr + nb * kQ8_0BlockSize);
  float acc = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    int8_t codes[kQ8_0BlockSize];
    BlockCodes(wr[b], codes);
    int32_t isum = 0;
    for (int j = 0; j < kQ8_0BlockSize; ++j) {
      isum += int32_t{codes[j]} * xq[b * kQ8_0BlockSize + j];
    }
    const float scale = F16ToF32(wr[b].d) * xd[b];
    acc = std::fma(scale, static_cast<float>(isum), acc);
  }
  return acc;
}

// The Q4_K order: per super-block, sumi = sum_j sc_j * isum_j and summ = sum_j m_j * xsum_j,
// both exact (|sumi| <= 8 * 63 * 32 * 15 * 128 < 2^31; |summ| <= 8 * 63 * 4096 < 2^24), then
// y = fma(d_w * d_x, sumi, y) and y = fma(-(dmin_w * d_x), summ, y), from +0, super-blocks in
// order. (sumi's F32 may round: the same rounding in every kernel.)
float OwnOrderDot(const BlockQ4_K* wr, int64_t nbk, const char* xr) {
  const auto* xq = reinterpret_cast<const int8_t*>(xr);
  const char* xd = xr + nbk * kQK;
  const char* xw = xd + nbk * 4;
  float acc = 0.f;
  for (int64_t s = 0; s < nbk; ++s) {
    const BlockQ4_K& b = wr[s];
    int32_t sumi = 0, summ = 0;
    for (int j = 0; j < 8; ++j) {
      int sc, m;
      GetScaleMinK4(j, b.scales, &sc, &m);
      int32_t isum = 0;
      for (int t = 0; t < 32; ++t) {
        const uint8_t byte = b.qs[32 * (j / 2) + t];
        const int code = j % 2 == 0 ? byte & 15 : byte >> 4;
        isum += code * xq[s * kQK + 32 * j + t];
      }
      sumi += sc * isum;
      uint32_t word;
      std::memcpy(&word, xw + s * 16 + (j / 2) * 4, 4);
      const int16_t xsum = static_cast<int16_t>(j % 2 == 0 ? word & 0xFFFF : word >> 16);
      summ += m * int32_t{xsum};
    }
    float dx;
    std::memcpy(&dx, xd + s * 4, 4);
    const float a = F16ToF32(b.d) * dx, bm = F16ToF32(b.dmin) * dx;
    acc = std::fma(a, static_cast<float>(sumi), acc);
    acc = std::fma(-bm, static_cast<float>(summ), acc);
  }
  return acc;
}

// The Q6_K order: per super-block, total = sum_j sc_j * (sum over sub-block j of u * x) -
// 32 * sum_j sc_j * xsum_j over the 16 sub-blocks of 16 (u = the 6-bit code, 0..63: the weight
// + 32), exact (|total| < 4e8 < 2^31), then y = fma(d_w * d_x, total, y), from +0, super-blocks
// in order.
float OwnOrderDot(const BlockQ6_K* wr, int64_t nbk, const char* xr) {
  const auto* xq = reinterpret_cast<const int8_t*>(xr);
  const char* xd = xr + nbk * kQK;
  const char* xw = xd + nbk * 4;
  float acc = 0.f;
  for (int64_t s = 0; s < nbk; ++s) {
    const BlockQ6_K& b = wr[s];
    int32_t sumi = 0, summ = 0;
    for (int j = 0; j < 16; ++j) {
      int32_t isum = 0;
      for (int t = 0; t < 16; ++t) {
        const int w = 16 * j + t, h = w / 128, k = (w % 128) / 32, l = w % 32;
        const int low = (b.ql[64 * h + 32 * (k & 1) + l] >> (4 * (k / 2))) & 0x0F;
        const int high = (b.qh[32 * h + l] >> (2 * k)) & 3;
        isum += (low | high << 4) * xq[s * kQK + w];
      }
      uint32_t word;
      std::memcpy(&word, xw + s * 32 + (j / 2) * 4, 4);
      const int16_t xsum = static_cast<int16_t>(j % 2 == 0 ? word & 0xFFFF : word >> 16);
      sumi += b.scales[j] * isum;
      summ += b.scales[j] * int32_t{xsum};
    }
    float dx;
    std::memcpy(&dx, xd + s * 4, 4);
    acc = std::fma(F16ToF32(b.d) * dx, static_cast<float>(sumi - 32 * summ), acc);
  }
  return acc;
}

// Weights per block and pack_x's row bytes of each type's order.
template <typename W>
constexpr int64_t kBlockWeights = kQ8_0BlockSize;
template <>
constexpr int64_t kBlockWeights<BlockQ4_K> = kQK;
template <>
constexpr int64_t kBlockWeights<BlockQ6_K> = kQK;
size_t OwnXRowBytes(const BlockQ8_0*, int64_t nb) { return Q8_0OwnXRowBytes(nb); }
size_t OwnXRowBytes(const BlockQ5_0*, int64_t nb) { return Q8_0OwnXRowBytes(nb); }
size_t OwnXRowBytes(const BlockQ4_K*, int64_t nb) { return Q4_KOwnXRowBytes(nb); }
size_t OwnXRowBytes(const BlockQ6_K*, int64_t nb) { return Q6_KOwnXRowBytes(nb); }

// Over plain rows (`w_stride` bytes apart).
template <typename W>
void GemmOwnScalar(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* xp,
                   int64_t n, float* y, int64_t y_stride) {
  const int64_t nb = k / kBlockWeights<W>;
  const size_t row_bytes = OwnXRowBytes(static_cast<const W*>(nullptr), nb);
  for (int64_t r = 0; r < rows; ++r) {
    const auto* wr = reinterpret_cast<const W*>(static_cast<const char*>(w) + r * w_stride);
    for (int64_t i = 0; i < n; ++i) {
      y[i * y_stride + r] = OwnOrderDot(wr, nb, static_cast<const char*>(xp) + i * row_bytes);
    }
  }
}

// Row r of a q8_0x16 / q5_0x16 / q4_Kx16 / q6_Kx16 matrix as its source blocks.
void UnpackRow(const void* w, int64_t rows, int64_t k, int64_t r, BlockQ8_0* out) {
  UnpackQ8_0x16Row(w, rows, k, r, out);
}
void UnpackRow(const void* w, int64_t /*rows*/, int64_t k, int64_t r, BlockQ5_0* out) {
  UnpackQ5_0x16Row(w, k, r, out);
}
void UnpackRow(const void* w, int64_t /*rows*/, int64_t k, int64_t r, BlockQ4_K* out) {
  UnpackQ4_Kx16Row(w, k, r, out);
}
void UnpackRow(const void* w, int64_t /*rows*/, int64_t k, int64_t r, BlockQ6_K* out) {
  UnpackQ6_Kx16Row(w, k, r, out);
}

// The same over q8_0x16 / q5_0x16 weights (`w` at a multiple of 16 rows, w_stride unused): each
// row unpacked to its source blocks, so the bits are GemmOwnScalar's on the source rows.
template <typename W>
void GemmX16OwnScalar(int64_t k, const void* w, size_t /*w_stride*/, int64_t rows, const void* xp,
                      int64_t n, float* y, int64_t y_stride) {
  const int64_t nb = k / kBlockWeights<W>;
  const size_t row_bytes = OwnXRowBytes(static_cast<const W*>(nullptr), nb);
  std::vector<W> wr(static_cast<size_t>(nb));
  for (int64_t r = 0; r < rows; ++r) {
    UnpackRow(w, rows, k, r, wr.data());
    for (int64_t i = 0; i < n; ++i) {
      y[i * y_stride + r] =
          OwnOrderDot(wr.data(), nb, static_cast<const char*>(xp) + i * row_bytes);
    }
  }
}

}  // namespace

const GroupedKernels* Q6_KOwnOrderScalar() {
  return &kOwnOrderQ6KKernels<&GemmOwnScalar<BlockQ6_K>>;
}

const GroupedKernels* Q6_Kx16OwnOrderScalar() {
  return &kOwnOrderQ6KKernels<&GemmX16OwnScalar<BlockQ6_K>>;
}

const GroupedKernels* Q4_KOwnOrderScalar() {
  return &kOwnOrderQ4KKernels<&GemmOwnScalar<BlockQ4_K>>;
}

const GroupedKernels* Q4_Kx16OwnOrderScalar() {
  return &kOwnOrderQ4KKernels<&GemmX16OwnScalar<BlockQ4_K>>;
}

const GroupedKernels* Q5_0OwnOrderScalar() { return &kOwnOrderKernels<&GemmOwnScalar<BlockQ5_0>>; }

const GroupedKernels* Q5_0x16OwnOrderScalar() {
  return &kOwnOrderKernels<&GemmX16OwnScalar<BlockQ5_0>>;
}

const GroupedKernels* Q8_0OwnOrderScalar() { return &kOwnOrderKernels<&GemmOwnScalar<BlockQ8_0>>; }

const GroupedKernels* Q8_0x16OwnOrderScalar() {
  return &kOwnOrderKernels<&GemmX16OwnScalar<BlockQ8_0>>;
}

}  // namespace pd::engine::cpu
