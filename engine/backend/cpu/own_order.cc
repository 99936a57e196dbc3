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
#include "engine/quant/q5_0x16.h"
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

// Over plain rows (`w_stride` bytes apart).
template <typename W>
void GemmOwnScalar(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* xp,
                   int64_t n, float* y, int64_t y_stride) {
  const int64_t nb = k / kQ8_0BlockSize;
  const size_t row_bytes = Q8_0OwnXRowBytes(nb);
  for (int64_t r = 0; r < rows; ++r) {
    const auto* wr = reinterpret_cast<const W*>(static_cast<const char*>(w) + r * w_stride);
    for (int64_t i = 0; i < n; ++i) {
      y[i * y_stride + r] = OwnOrderDot(wr, nb, static_cast<const char*>(xp) + i * row_bytes);
    }
  }
}

// Row r of a q8_0x16 / q5_0x16 matrix as its source blocks.
void UnpackRow(const void* w, int64_t rows, int64_t k, int64_t r, BlockQ8_0* out) {
  UnpackQ8_0x16Row(w, rows, k, r, out);
}
void UnpackRow(const void* w, int64_t /*rows*/, int64_t k, int64_t r, BlockQ5_0* out) {
  UnpackQ5_0x16Row(w, k, r, out);
}

// The same over q8_0x16 / q5_0x16 weights (`w` at a multiple of 16 rows, w_stride unused): each
// row unpacked to its source blocks, so the bits are GemmOwnScalar's on the source rows.
template <typename W>
void GemmX16OwnScalar(int64_t k, const void* w, size_t /*w_stride*/, int64_t rows, const void* xp,
                      int64_t n, float* y, int64_t y_stride) {
  const int64_t nb = k / kQ8_0BlockSize;
  const size_t row_bytes = Q8_0OwnXRowBytes(nb);
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

const GroupedKernels* Q5_0OwnOrderScalar() { return &kOwnOrderKernels<&GemmOwnScalar<BlockQ5_0>>; }

const GroupedKernels* Q5_0x16OwnOrderScalar() {
  return &kOwnOrderKernels<&GemmX16OwnScalar<BlockQ5_0>>;
}

const GroupedKernels* Q8_0OwnOrderScalar() { return &kOwnOrderKernels<&GemmOwnScalar<BlockQ8_0>>; }

const GroupedKernels* Q8_0x16OwnOrderScalar() {
  return &kOwnOrderKernels<&GemmX16OwnScalar<BlockQ8_0>>;
}

}  // namespace pd::engine::cpu
