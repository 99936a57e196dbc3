#include "engine/quant/q8_0x16.h"

#include <cstring>

#include "common/status.h"

namespace pd::engine {
namespace {

constexpr size_t kBlockBytes = sizeof(BlockQ8_0);

size_t GroupBytes(int64_t nb) { return static_cast<size_t>(kQ8_0x16Rows * nb) * kBlockBytes; }

// Byte of code i of the group's row e within a block.
size_t CodeAt(int e, int i) { return static_cast<size_t>((i / 4) * 64 + e * 4 + i % 4); }

}  // namespace

void RepackQ8_0x16(const void* src, size_t src_stride, int64_t rows, int64_t k, void* dst) {
  PD_CHECK(k % kQ8_0BlockSize == 0 && rows >= 0);
  const int64_t nb = k / kQ8_0BlockSize;
  const int64_t groups = rows / kQ8_0x16Rows;
  auto* out = static_cast<uint8_t*>(dst);
  const auto* in = static_cast<const uint8_t*>(src);
  for (int64_t g = 0; g < groups; ++g) {
    uint8_t* group = out + g * GroupBytes(nb);
    for (int e = 0; e < kQ8_0x16Rows; ++e) {
      const auto* row =
          reinterpret_cast<const BlockQ8_0*>(in + (g * kQ8_0x16Rows + e) * src_stride);
      for (int64_t b = 0; b < nb; ++b) {
        std::memcpy(group + Q8_0x16ScalesAt(nb, b) + e * 2, &row[b].d, 2);
        uint8_t* codes = group + Q8_0x16CodesAt(b);
        for (int i = 0; i < kQ8_0BlockSize; ++i) {
          codes[CodeAt(e, i)] = static_cast<uint8_t>(row[b].qs[i] + 128);
        }
      }
    }
  }
  const size_t row_bytes = static_cast<size_t>(nb) * kBlockBytes;
  for (int64_t r = groups * kQ8_0x16Rows; r < rows; ++r) {
    std::memcpy(out + r * row_bytes, in + r * src_stride, row_bytes);
  }
}

void UnpackQ8_0x16Row(const void* w, int64_t rows, int64_t k, int64_t r, BlockQ8_0* out) {
  PD_CHECK(k % kQ8_0BlockSize == 0 && r >= 0 && r < rows);
  const int64_t nb = k / kQ8_0BlockSize;
  const auto* base = static_cast<const uint8_t*>(w);
  if (r >= rows / kQ8_0x16Rows * kQ8_0x16Rows) {
    std::memcpy(out, base + r * nb * kBlockBytes, nb * kBlockBytes);
    return;
  }
  const int e = static_cast<int>(r % kQ8_0x16Rows);
  const uint8_t* group = base + (r / kQ8_0x16Rows) * GroupBytes(nb);
  for (int64_t b = 0; b < nb; ++b) {
    std::memcpy(&out[b].d, group + Q8_0x16ScalesAt(nb, b) + e * 2, 2);
    const uint8_t* codes = group + Q8_0x16CodesAt(b);
    for (int i = 0; i < kQ8_0BlockSize; ++i) {
      out[b].qs[i] = static_cast<int8_t>(codes[CodeAt(e, i)] - 128);
    }
  }
}

}  // namespace pd::engine
