#include "engine/quant/q6_kx16.h"

#include <cstring>

#include "common/status.h"

namespace pd::engine {
namespace {

// Where each source byte of row e goes within a super-block (and back).
template <bool kToLayout>
void Move(uint8_t* sb, int e, BlockQ6_K& blk) {
  auto move = [&](size_t at, void* field, size_t n) {
    if constexpr (kToLayout) {
      std::memcpy(sb + at, field, n);
    } else {
      std::memcpy(field, sb + at, n);
    }
  };
  for (int i = 0; i < 8; ++i) move(kQ6_Kx16ScalesAt + 32 * i + 2 * e, blk.scales + 2 * i, 2);
  move(kQ6_Kx16DAt + 2 * e, &blk.d, 2);
  for (int word = 0; word < 32; ++word)
    move(kQ6_Kx16LowAt + word * 64 + e * 4, blk.ql + 4 * word, 4);
  for (int word = 0; word < 16; ++word)
    move(kQ6_Kx16HighAt + word * 64 + e * 4, blk.qh + 4 * word, 4);
}

}  // namespace

void RepackQ6_Kx16Group(const BlockQ6_K* const rows[16], int64_t nbk, void* dst) {
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t s = 0; s < nbk; ++s) {
    for (int e = 0; e < kQ6_Kx16Rows; ++e) {
      BlockQ6_K blk = rows[e][s];
      Move<true>(out + s * kQ6_Kx16SuperBytes, e, blk);
    }
  }
}

void RepackQ6_Kx16(const void* src, size_t src_stride, int64_t rows, int64_t k, void* dst) {
  PD_CHECK(k % kQK == 0 && rows >= 0 && rows % kQ6_Kx16Rows == 0);
  const int64_t nbk = k / kQK;
  const auto* in = static_cast<const uint8_t*>(src);
  for (int64_t g = 0; g < rows / kQ6_Kx16Rows; ++g) {
    const BlockQ6_K* group[16];
    for (int e = 0; e < 16; ++e) {
      group[e] = reinterpret_cast<const BlockQ6_K*>(in + (g * kQ6_Kx16Rows + e) * src_stride);
    }
    RepackQ6_Kx16Group(group, nbk, static_cast<uint8_t*>(dst) + g * nbk * kQ6_Kx16SuperBytes);
  }
}

void UnpackQ6_Kx16Row(const void* w, int64_t k, int64_t r, BlockQ6_K* out) {
  PD_CHECK(k % kQK == 0 && r >= 0);
  const int64_t nbk = k / kQK;
  const int e = static_cast<int>(r % kQ6_Kx16Rows);
  // (Move reads through a non-const pointer; unpacking only reads.)
  auto* group = const_cast<uint8_t*>(static_cast<const uint8_t*>(w)) +
                (r / kQ6_Kx16Rows) * nbk * kQ6_Kx16SuperBytes;
  for (int64_t s = 0; s < nbk; ++s) Move<false>(group + s * kQ6_Kx16SuperBytes, e, out[s]);
}

}  // namespace pd::engine
