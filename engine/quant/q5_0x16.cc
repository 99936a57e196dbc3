#include "engine/quant/q5_0x16.h"

#include <cstring>

#include "common/status.h"

namespace pd::engine {
namespace {

size_t GroupBytes(int64_t nb) { return static_cast<size_t>(kQ5_0x16Rows * nb) * sizeof(BlockQ5_0); }

}  // namespace

void RepackQ5_0x16(const void* src, size_t src_stride, int64_t rows, int64_t k, void* dst) {
  PD_CHECK(k % kQ8_0BlockSize == 0 && rows >= 0 && rows % kQ5_0x16Rows == 0);
  const int64_t nb = k / kQ8_0BlockSize;
  auto* out = static_cast<uint8_t*>(dst);
  const auto* in = static_cast<const uint8_t*>(src);
  for (int64_t g = 0; g < rows / kQ5_0x16Rows; ++g) {
    uint8_t* group = out + g * GroupBytes(nb);
    for (int64_t b = 0; b < nb; ++b) {
      uint64_t masks[8] = {};
      for (int e = 0; e < kQ5_0x16Rows; ++e) {
        const auto& blk =
            reinterpret_cast<const BlockQ5_0*>(in + (g * kQ5_0x16Rows + e) * src_stride)[b];
        std::memcpy(group + Q5_0x16ScalesAt(nb, b) + e * 2, &blk.d, 2);
        for (int j = 0; j < 4; ++j) {
          std::memcpy(group + Q5_0x16NibblesAt(b) + j * 64 + e * 4, blk.qs + 4 * j, 4);
        }
        uint32_t qh;
        std::memcpy(&qh, blk.qh, 4);
        for (int j = 0; j < 8; ++j) {
          masks[j] |= uint64_t{(qh >> (4 * j)) & 0xF} << (4 * e);
        }
      }
      std::memcpy(group + Q5_0x16MasksAt(nb, b), masks, sizeof(masks));  // little-endian x86
    }
  }
}

void UnpackQ5_0x16Row(const void* w, int64_t k, int64_t r, BlockQ5_0* out) {
  PD_CHECK(k % kQ8_0BlockSize == 0 && r >= 0);
  const int64_t nb = k / kQ8_0BlockSize;
  const int e = static_cast<int>(r % kQ5_0x16Rows);
  const uint8_t* group = static_cast<const uint8_t*>(w) + (r / kQ5_0x16Rows) * GroupBytes(nb);
  for (int64_t b = 0; b < nb; ++b) {
    std::memcpy(&out[b].d, group + Q5_0x16ScalesAt(nb, b) + e * 2, 2);
    for (int j = 0; j < 4; ++j) {
      std::memcpy(out[b].qs + 4 * j, group + Q5_0x16NibblesAt(b) + j * 64 + e * 4, 4);
    }
    uint64_t masks[8];
    std::memcpy(masks, group + Q5_0x16MasksAt(nb, b), sizeof(masks));
    uint32_t qh = 0;
    for (int j = 0; j < 8; ++j) qh |= static_cast<uint32_t>((masks[j] >> (4 * e)) & 0xF) << (4 * j);
    std::memcpy(out[b].qh, &qh, 4);
  }
}

}  // namespace pd::engine
