#include "engine/quant/q4_kx16.h"

#include <cstring>

#include "common/status.h"

namespace pd::engine {

void RepackQ4_Kx16Group(const BlockQ4_K* const rows[16], int64_t nbk, void* dst) {
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t s = 0; s < nbk; ++s) {
    uint8_t* sb = out + s * kQ4_Kx16SuperBytes;
    for (int e = 0; e < kQ4_Kx16Rows; ++e) {
      const BlockQ4_K& blk = rows[e][s];
      for (int word = 0; word < 32; ++word)
        std::memcpy(sb + kQ4_Kx16NibblesAt + word * 64 + e * 4, blk.qs + 4 * word, 4);
      for (int j = 0; j < 8; ++j) {
        int sc, m;
        GetScaleMinK4(j, blk.scales, &sc, &m);
        sb[kQ4_Kx16ScalesAt + 16 * j + e] = static_cast<uint8_t>(sc);
        sb[kQ4_Kx16MinsAt + 32 * (j / 2) + 2 * e + j % 2] = static_cast<uint8_t>(m);
      }
      std::memcpy(sb + kQ4_Kx16DAt + 2 * e, &blk.d, 2);
      std::memcpy(sb + kQ4_Kx16DminAt + 2 * e, &blk.dmin, 2);
    }
  }
}

void RepackQ4_Kx16(const void* src, size_t src_stride, int64_t rows, int64_t k, void* dst) {
  PD_CHECK(k % kQK == 0 && rows >= 0 && rows % kQ4_Kx16Rows == 0);
  const int64_t nbk = k / kQK;
  const auto* in = static_cast<const uint8_t*>(src);
  for (int64_t g = 0; g < rows / kQ4_Kx16Rows; ++g) {
    const BlockQ4_K* group[16];
    for (int e = 0; e < 16; ++e) {
      group[e] = reinterpret_cast<const BlockQ4_K*>(in + (g * kQ4_Kx16Rows + e) * src_stride);
    }
    RepackQ4_Kx16Group(group, nbk, static_cast<uint8_t*>(dst) + g * nbk * kQ4_Kx16SuperBytes);
  }
}

void UnpackQ4_Kx16Row(const void* w, int64_t k, int64_t r, BlockQ4_K* out) {
  PD_CHECK(k % kQK == 0 && r >= 0);
  const int64_t nbk = k / kQK;
  const int e = static_cast<int>(r % kQ4_Kx16Rows);
  const uint8_t* group =
      static_cast<const uint8_t*>(w) + (r / kQ4_Kx16Rows) * nbk * kQ4_Kx16SuperBytes;
  for (int64_t s = 0; s < nbk; ++s) {
    const uint8_t* sb = group + s * kQ4_Kx16SuperBytes;
    BlockQ4_K& blk = out[s];
    for (int word = 0; word < 32; ++word)
      std::memcpy(blk.qs + 4 * word, sb + kQ4_Kx16NibblesAt + word * 64 + e * 4, 4);
    uint8_t sc[8], m[8];
    for (int j = 0; j < 8; ++j) {
      sc[j] = sb[kQ4_Kx16ScalesAt + 16 * j + e];
      m[j] = sb[kQ4_Kx16MinsAt + 32 * (j / 2) + 2 * e + j % 2];
    }
    // GetScaleMinK4's packing inverted: bytes 0-3 the low 6 bits of scales 0-3 (top 2 bits: those
    // of scale 4-7), bytes 4-7 the same for the mins, bytes 8-11 the low nibbles of scales 4-7
    // and (high nibble) of mins 4-7.
    for (int j = 0; j < 4; ++j) {
      blk.scales[j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
      blk.scales[j + 4] = static_cast<uint8_t>((m[j] & 63) | ((m[j + 4] >> 4) << 6));
      blk.scales[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
    }
    std::memcpy(&blk.d, sb + kQ4_Kx16DAt + 2 * e, 2);
    std::memcpy(&blk.dmin, sb + kQ4_Kx16DminAt + 2 * e, 2);
  }
}

}  // namespace pd::engine
