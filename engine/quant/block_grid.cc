// Grids and code access of the block formats (layouts in k_quants.h and q8_0.h). Built with
// -ffp-contract=off: Level() must round exactly like the dequantizers.
#include "engine/quant/block_grid.h"

#include <algorithm>
#include <cmath>

#include "common/status.h"
#include "engine/quant/fp16.h"
#include "engine/quant/q5_0.h"
#include "engine/quant/w4a16.h"

namespace pd::engine {
namespace {

// Q2_K / Q3_K 2-bit plane and Q6_K high-bit plane position of weight w = 128h + 32k + l:
// byte 32h + l, bits 2k..2k+1.
inline int Plane2Byte(int w) { return 32 * (w / 128) + w % 32; }
inline int Plane2Shift(int w) { return 2 * ((w % 128) / 32); }
// Q4_K / Q5_K nibble of weight w = 64p + 32t + l: byte 32p + l, nibble t.
inline int NibbleByte(int w) { return 32 * (w / 64) + w % 32; }
inline int NibbleShift(int w) { return 4 * ((w % 64) / 32); }
// Q6_K low nibble of weight w = 128h + 32k + l: ql[64h + 32(k & 1) + l], nibble k / 2.
inline int Q6LowByte(int w) { return 64 * (w / 128) + 32 * (((w % 128) / 32) & 1) + w % 32; }
inline int Q6LowShift(int w) { return 4 * (((w % 128) / 32) / 2); }

inline void SetBits(uint8_t* byte, int shift, int width, int v) {
  const int mask = ((1 << width) - 1) << shift;
  *byte = static_cast<uint8_t>((*byte & ~mask) | ((v << shift) & mask));
}

}  // namespace

int BlockGrid::Nearest(int w, float v) const {
  const float a = scale[w];
  if (a == 0.f || !std::isfinite(a)) return std::clamp(0, qmin, qmax);
  const float q = std::nearbyint((v + offset[w]) / a);
  if (!(q > static_cast<float>(qmin))) return qmin;  // also catches NaN
  if (q > static_cast<float>(qmax)) return qmax;
  return static_cast<int>(q);
}

bool HasGrid(DType t) {
  switch (t) {
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ5_0:
    case DType::kQ2_K:
    case DType::kQ3_K:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
    case DType::kW4A16:
      return true;
    default:
      return false;
  }
}

void ReadGrid(DType t, const void* block, BlockGrid* g) {
  switch (t) {
    case DType::kQ8_0: {
      const auto* b = static_cast<const BlockQ8_0*>(block);
      const float d = F16ToF32(b->d);
      g->n = 32, g->qmin = -127, g->qmax = 127;
      std::fill(g->scale, g->scale + 32, d);
      std::fill(g->offset, g->offset + 32, 0.f);
      return;
    }
    case DType::kQ4_0: {
      const auto* b = static_cast<const BlockQ4_0*>(block);
      const float d = F16ToF32(b->d);
      g->n = 32, g->qmin = -8, g->qmax = 7;
      std::fill(g->scale, g->scale + 32, d);
      std::fill(g->offset, g->offset + 32, 0.f);
      return;
    }
    case DType::kQ5_0: {
      const auto* b = static_cast<const BlockQ5_0*>(block);
      const float d = F16ToF32(b->d);
      g->n = 32, g->qmin = -16, g->qmax = 15;
      std::fill(g->scale, g->scale + 32, d);
      std::fill(g->offset, g->offset + 32, 0.f);
      return;
    }
    case DType::kQ2_K: {
      const auto* b = static_cast<const BlockQ2_K*>(block);
      const float d = F16ToF32(b->d), dmin = F16ToF32(b->dmin);
      g->n = kQK, g->qmin = 0, g->qmax = 3;
      for (int w = 0; w < kQK; ++w) {
        g->scale[w] = d * static_cast<float>(b->scales[w / 16] & 0x0F);
        g->offset[w] = dmin * static_cast<float>(b->scales[w / 16] >> 4);
      }
      return;
    }
    case DType::kQ3_K: {
      const auto* b = static_cast<const BlockQ3_K*>(block);
      const float d = F16ToF32(b->d);
      g->n = kQK, g->qmin = -4, g->qmax = 3;
      for (int w = 0; w < kQK; ++w) {
        g->scale[w] = d * static_cast<float>(GetScaleQ3K(w / 16, b->scales) - 32);
        g->offset[w] = 0.f;
      }
      return;
    }
    case DType::kQ4_K:
    case DType::kQ5_K: {
      // Q5_K starts with Q4_K's d, dmin and scales.
      const auto* b = static_cast<const BlockQ4_K*>(block);
      const float d = F16ToF32(b->d), dmin = F16ToF32(b->dmin);
      g->n = kQK, g->qmin = 0, g->qmax = t == DType::kQ4_K ? 15 : 31;
      for (int j = 0; j < 8; ++j) {
        int sc = 0, m = 0;
        GetScaleMinK4(j, b->scales, &sc, &m);
        std::fill(g->scale + 32 * j, g->scale + 32 * j + 32, d * static_cast<float>(sc));
        std::fill(g->offset + 32 * j, g->offset + 32 * j + 32, dmin * static_cast<float>(m));
      }
      return;
    }
    case DType::kQ6_K: {
      const auto* b = static_cast<const BlockQ6_K*>(block);
      const float d = F16ToF32(b->d);
      g->n = kQK, g->qmin = -32, g->qmax = 31;
      for (int w = 0; w < kQK; ++w) {
        g->scale[w] = d * static_cast<float>(b->scales[w / 16]);
        g->offset[w] = 0.f;
      }
      return;
    }
    case DType::kW4A16: {
      const float d = F16ToF32(static_cast<const BlockW4A16*>(block)->d);
      g->n = kW4A16BlockSize, g->qmin = -8, g->qmax = 7;
      for (int w = 0; w < g->n; ++w) g->scale[w] = d, g->offset[w] = 0.f;
      return;
    }
    default:
      PD_CHECK_MSG(false, "ReadGrid: type without a grid");
  }
}

int GetCode(DType t, const void* block, int w) {
  switch (t) {
    case DType::kQ8_0:
      return static_cast<const BlockQ8_0*>(block)->qs[w];
    case DType::kQ4_0: {
      const auto* b = static_cast<const BlockQ4_0*>(block);
      return ((w < 16 ? b->qs[w] : b->qs[w - 16] >> 4) & 15) - 8;
    }
    case DType::kQ5_0: {
      const auto* b = static_cast<const BlockQ5_0*>(block);
      const int low = (w < 16 ? b->qs[w] : b->qs[w - 16] >> 4) & 15;
      return (low | ((b->qh[w / 8] >> (w % 8)) & 1) << 4) - 16;
    }
    case DType::kQ2_K: {
      const auto* b = static_cast<const BlockQ2_K*>(block);
      return (b->qs[Plane2Byte(w)] >> Plane2Shift(w)) & 3;
    }
    case DType::kQ3_K: {
      const auto* b = static_cast<const BlockQ3_K*>(block);
      const int low = (b->qs[Plane2Byte(w)] >> Plane2Shift(w)) & 3;
      const int high = (b->hmask[w % 32] >> (w / 32)) & 1;
      return low - (high ? 0 : 4);
    }
    case DType::kQ4_K: {
      const auto* b = static_cast<const BlockQ4_K*>(block);
      return (b->qs[NibbleByte(w)] >> NibbleShift(w)) & 15;
    }
    case DType::kQ5_K: {
      const auto* b = static_cast<const BlockQ5_K*>(block);
      const int low = (b->qs[NibbleByte(w)] >> NibbleShift(w)) & 15;
      return low | ((b->qh[w % 32] >> (w / 32)) & 1) << 4;
    }
    case DType::kQ6_K: {
      const auto* b = static_cast<const BlockQ6_K*>(block);
      const int low = (b->ql[Q6LowByte(w)] >> Q6LowShift(w)) & 15;
      const int high = (b->qh[Plane2Byte(w)] >> Plane2Shift(w)) & 3;
      return (low | high << 4) - 32;
    }
    case DType::kW4A16: {
      const auto* b = static_cast<const BlockW4A16*>(block);
      return ((w < 64 ? b->qs[w] : b->qs[w - 64] >> 4) & 15) - 8;
    }
    default:
      PD_CHECK_MSG(false, "GetCode: type without a grid");
  }
}

void SetCode(DType t, void* block, int w, int q) {
  switch (t) {
    case DType::kQ8_0:
      PD_CHECK(q >= -127 && q <= 127);
      static_cast<BlockQ8_0*>(block)->qs[w] = static_cast<int8_t>(q);
      return;
    case DType::kQ4_0: {
      PD_CHECK(q >= -8 && q <= 7);
      auto* b = static_cast<BlockQ4_0*>(block);
      if (w < 16) {
        SetBits(&b->qs[w], 0, 4, q + 8);
      } else {
        SetBits(&b->qs[w - 16], 4, 4, q + 8);
      }
      return;
    }
    case DType::kQ5_0: {
      PD_CHECK(q >= -16 && q <= 15);
      auto* b = static_cast<BlockQ5_0*>(block);
      const int u = q + 16;
      if (w < 16) {
        SetBits(&b->qs[w], 0, 4, u & 15);
      } else {
        SetBits(&b->qs[w - 16], 4, 4, u & 15);
      }
      SetBits(&b->qh[w / 8], w % 8, 1, u >> 4);  // qh is a little-endian u32: bit w
      return;
    }
    case DType::kQ2_K: {
      PD_CHECK(q >= 0 && q <= 3);
      auto* b = static_cast<BlockQ2_K*>(block);
      SetBits(&b->qs[Plane2Byte(w)], Plane2Shift(w), 2, q);
      return;
    }
    case DType::kQ3_K: {
      PD_CHECK(q >= -4 && q <= 3);
      auto* b = static_cast<BlockQ3_K*>(block);
      const int u = q + 4;  // bit 2 set: "no -4"
      SetBits(&b->qs[Plane2Byte(w)], Plane2Shift(w), 2, u & 3);
      SetBits(&b->hmask[w % 32], w / 32, 1, u >> 2);
      return;
    }
    case DType::kQ4_K: {
      PD_CHECK(q >= 0 && q <= 15);
      auto* b = static_cast<BlockQ4_K*>(block);
      SetBits(&b->qs[NibbleByte(w)], NibbleShift(w), 4, q);
      return;
    }
    case DType::kQ5_K: {
      PD_CHECK(q >= 0 && q <= 31);
      auto* b = static_cast<BlockQ5_K*>(block);
      SetBits(&b->qs[NibbleByte(w)], NibbleShift(w), 4, q & 15);
      SetBits(&b->qh[w % 32], w / 32, 1, q >> 4);
      return;
    }
    case DType::kQ6_K: {
      PD_CHECK(q >= -32 && q <= 31);
      auto* b = static_cast<BlockQ6_K*>(block);
      const int u = q + 32;
      SetBits(&b->ql[Q6LowByte(w)], Q6LowShift(w), 4, u & 15);
      SetBits(&b->qh[Plane2Byte(w)], Plane2Shift(w), 2, u >> 4);
      return;
    }
    case DType::kW4A16: {
      PD_CHECK(q >= -8 && q <= 7);
      auto* b = static_cast<BlockW4A16*>(block);
      if (w < 64) {
        SetBits(&b->qs[w], 0, 4, q + 8);
      } else {
        SetBits(&b->qs[w - 64], 4, 4, q + 8);
      }
      return;
    }
    default:
      PD_CHECK_MSG(false, "SetCode: type without a grid");
  }
}

}  // namespace pd::engine
