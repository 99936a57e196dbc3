#include <cstdint>
#include <utility>

#include "engine/backend/cuda/dequant_device.cuh"
#include "engine/backend/cuda/device_util.cuh"
#include "engine/backend/cuda/matmul_quant.cuh"

namespace pd::engine::cuda {
namespace {

// A warp per output row; its lanes take the row's blocks in units (a fixed slice of a block's
// weights each), dot every unit's codes with the matching activations of all n rows in F32, and
// the warp sums its lanes at the end. A unit's integer codes are summed against x first and
// scaled by the sub-block's scale once (and, for Q2_K, Q4_K and Q5_K, its min times the sum of
// x), which is the same value as dotting the dequantized weights up to F32 reassociation.
//
// Units are chosen so that one warp step reads a whole super-block (Q4_K, Q5_K, Q6_K), two
// consecutive super-blocks (Q2_K, Q3_K) or 8 consecutive blocks (Q8_0, Q4_0, Q5_0) as contiguous
// memory. Activations are read from L1/L2 (n * k * 4 bytes, reused by every row), so each weight
// byte comes from HBM once per call: the kernel is bound by the weight bytes, m * row_bytes,
// against 2 * n * m * k flops.
constexpr int kGemvWarps = 4;

// The signed byte i (0..3) of a little-endian u32.
__device__ __forceinline__ int SignedByte(uint32_t v, int i) {
  return static_cast<int8_t>(static_cast<uint8_t>(v >> (8 * i)));
}

// Four consecutive activations. With V (x 16-byte aligned, checked at launch) one 16-byte load:
// a warp's lanes then take their activations in 4 L1 wavefronts per instruction where scalar
// loads spread over a 1 KiB span took several per float, which bound the kernel (2026-12-04,
// H200: 618 GB/s of weights for Q4_K 4096 x 4096 with scalar loads).
template <bool V>
__device__ __forceinline__ void LoadX4(const float* p, float (&v)[4]) {
  if constexpr (V) {
    const float4 f = __ldg(reinterpret_cast<const float4*>(p));
    v[0] = f.x;
    v[1] = f.y;
    v[2] = f.z;
    v[3] = f.w;
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = p[i];
  }
}

template <WeightFormat F>
struct GemvUnit;

// Q8_0: 4 units of 8 weights per 34-byte block; a unit reads d and 8 codes. Per unit and row:
// 8 multiply-adds and one scale.
template <>
struct GemvUnit<WeightFormat::kQ8_0> {
  static constexpr int kBlockWeights = 32, kBlockBytes = 34, kUnits = 4;
  template <int N, bool V>
  __device__ static void Dot(const uint8_t* blk, int unit, const float* x, int k, float (&acc)[N]) {
    const BlockQ8_0& b = *reinterpret_cast<const BlockQ8_0*>(blk);
    const float d = F16BitsToFloat(b.d);
    const uint8_t* qs = reinterpret_cast<const uint8_t*>(b.qs) + 8 * unit;
    const uint32_t q0 = LoadU32Align2(qs), q1 = LoadU32Align2(qs + 4);
    float q[8];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      q[i] = static_cast<float>(SignedByte(q0, i));
      q[i + 4] = static_cast<float>(SignedByte(q1, i));
    }
    const float* xu = x + 8 * unit;
#pragma unroll
    for (int r = 0; r < N; ++r) {
      const float* xr = xu + static_cast<int64_t>(r) * k;
      float xa[4], xb[4];
      LoadX4<V>(xr, xa);
      LoadX4<V>(xr + 4, xb);
      float s = 0.f;
#pragma unroll
      for (int i = 0; i < 4; ++i) s += q[i] * xa[i];
#pragma unroll
      for (int i = 0; i < 4; ++i) s += q[i + 4] * xb[i];
      acc[r] += d * s;
    }
  }
};

// Q4_0: 4 units per 18-byte block; unit u takes code bytes 4u..4u+3, i.e. weights 4u..4u+3 (low
// nibbles) and 4u+16..4u+19 (high nibbles). Per unit and row: 8 multiply-adds and one scale.
template <>
struct GemvUnit<WeightFormat::kQ4_0> {
  static constexpr int kBlockWeights = 32, kBlockBytes = 18, kUnits = 4;
  template <int N, bool V>
  __device__ static void Dot(const uint8_t* blk, int unit, const float* x, int k, float (&acc)[N]) {
    const BlockQ4_0& b = *reinterpret_cast<const BlockQ4_0*>(blk);
    const float d = F16BitsToFloat(b.d);
    const uint32_t qs = LoadU32Align2(b.qs + 4 * unit);
    float lo[4], hi[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t byte = (qs >> (8 * i)) & 0xFF;
      lo[i] = static_cast<float>(static_cast<int>(byte & 0x0F) - 8);
      hi[i] = static_cast<float>(static_cast<int>(byte >> 4) - 8);
    }
    const float* xu = x + 4 * unit;
#pragma unroll
    for (int r = 0; r < N; ++r) {
      const float* xr = xu + static_cast<int64_t>(r) * k;
      float xa[4], xb[4];
      LoadX4<V>(xr, xa);
      LoadX4<V>(xr + 16, xb);
      float s = 0.f;
#pragma unroll
      for (int i = 0; i < 4; ++i) s += lo[i] * xa[i] + hi[i] * xb[i];
      acc[r] += d * s;
    }
  }
};

// Q5_0: 4 units per 22-byte block; unit u takes code bytes 4u..4u+3, i.e. weights 4u..4u+3 (low
// nibbles) and 4u+16..4u+19 (high nibbles), with their fifth bits from qh.
template <>
struct GemvUnit<WeightFormat::kQ5_0> {
  static constexpr int kBlockWeights = 32, kBlockBytes = 22, kUnits = 4;
  template <int N, bool V>
  __device__ static void Dot(const uint8_t* blk, int unit, const float* x, int k, float (&acc)[N]) {
    const BlockQ5_0& b = *reinterpret_cast<const BlockQ5_0*>(blk);
    const float d = F16BitsToFloat(b.d);
    const uint32_t qh = LoadU32Align2(b.qh);
    const uint32_t qs = LoadU32Align2(b.qs + 4 * unit);
    float lo[4], hi[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int j = 4 * unit + i;
      const uint32_t byte = (qs >> (8 * i)) & 0xFF;
      lo[i] = static_cast<float>(static_cast<int>((byte & 0x0F) | ((qh >> j) & 1) << 4) - 16);
      hi[i] = static_cast<float>(static_cast<int>((byte >> 4) | ((qh >> (j + 16)) & 1) << 4) - 16);
    }
    const float* xu = x + 4 * unit;
#pragma unroll
    for (int r = 0; r < N; ++r) {
      const float* xr = xu + static_cast<int64_t>(r) * k;
      float xa[4], xb[4];
      LoadX4<V>(xr, xa);
      LoadX4<V>(xr + 16, xb);
      float s = 0.f;
#pragma unroll
      for (int i = 0; i < 4; ++i) s += lo[i] * xa[i] + hi[i] * xb[i];
      acc[r] += d * s;
    }
  }
};

// Q2_K: 16 units per 84-byte super-block; unit u = 8h + e takes the 4 code bytes qs[32h + 4e ..],
// whose bits 2c..2c+1 (c = 0..3) are weights 128h + 32c + 4e + i of sub-block 8h + 2c + e / 4.
// Per unit and row: 16 multiply-adds, 16 adds (the sums of x for the mins) and 8 scale products.
template <>
struct GemvUnit<WeightFormat::kQ2_K> {
  static constexpr int kBlockWeights = 256, kBlockBytes = 84, kUnits = 16;
  template <int N, bool V>
  __device__ static void Dot(const uint8_t* blk, int unit, const float* x, int k, float (&acc)[N]) {
    const BlockQ2_K& b = *reinterpret_cast<const BlockQ2_K*>(blk);
    const int h = unit / 8, e = unit % 8;
    const uint32_t q = *reinterpret_cast<const uint32_t*>(b.qs + 32 * h + 4 * e);
    const float d = F16BitsToFloat(b.d), dmin = F16BitsToFloat(b.dmin);
    float dl[4], ml[4], qf[4][4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int sm = b.scales[8 * h + 2 * c + e / 4];
      dl[c] = d * static_cast<float>(sm & 0x0F);
      ml[c] = dmin * static_cast<float>(sm >> 4);
#pragma unroll
      for (int i = 0; i < 4; ++i) qf[c][i] = static_cast<float>((q >> (8 * i + 2 * c)) & 3);
    }
    const float* xu = x + 128 * h + 4 * e;
#pragma unroll
    for (int r = 0; r < N; ++r) {
      const float* xr = xu + static_cast<int64_t>(r) * k;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        float xc[4];
        LoadX4<V>(xr + 32 * c, xc);
        float s = 0.f, t = 0.f;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          s += qf[c][i] * xc[i];
          t += xc[i];
        }
        acc[r] += dl[c] * s - ml[c] * t;
      }
    }
  }
};

// Q3_K: 16 units per 110-byte super-block; unit u = 8h + e takes the 4 low-plane bytes
// qs[32h + 4e ..] and the 4 high-plane bytes hmask[4e ..]: weights 128h + 32c + 4e + i (c = 0..3)
// of sub-block 8h + 2c + e / 4, low bits at 2c and high bit at 4h + c. Per unit and row: 16
// multiply-adds and 4 scale products.
template <>
struct GemvUnit<WeightFormat::kQ3_K> {
  static constexpr int kBlockWeights = 256, kBlockBytes = 110, kUnits = 16;
  template <int N, bool V>
  __device__ static void Dot(const uint8_t* blk, int unit, const float* x, int k, float (&acc)[N]) {
    const BlockQ3_K& b = *reinterpret_cast<const BlockQ3_K*>(blk);
    const int h = unit / 8, e = unit % 8;
    const uint32_t ql = LoadU32Align2(b.qs + 32 * h + 4 * e);
    const uint32_t hm = LoadU32Align2(b.hmask + 4 * e);
    const float d = F16BitsToFloat(b.d);
    float dl[4], qf[4][4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      dl[c] = d * static_cast<float>(ScaleQ3K(8 * h + 2 * c + e / 4, b.scales) - 32);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int low = static_cast<int>((ql >> (8 * i + 2 * c)) & 3);
        const int high = static_cast<int>((hm >> (8 * i + 4 * h + c)) & 1);
        qf[c][i] = static_cast<float>(low - (high != 0 ? 0 : 4));
      }
    }
    const float* xu = x + 128 * h + 4 * e;
#pragma unroll
    for (int r = 0; r < N; ++r) {
      const float* xr = xu + static_cast<int64_t>(r) * k;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        float xc[4];
        LoadX4<V>(xr + 32 * c, xc);
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < 4; ++i) s += qf[c][i] * xc[i];
        acc[r] += dl[c] * s;
      }
    }
  }
};

// Q4_K: 32 units per 144-byte super-block; unit u = 8p + c takes the 4 code bytes
// qs[32p + 4c ..], whose low nibbles are weights 64p + 4c + i of sub-block 2p and high nibbles
// weights 64p + 32 + 4c + i of sub-block 2p + 1. Per unit and row: 8 multiply-adds, 8 adds (the
// sums of x for the mins) and 4 scale products.
template <>
struct GemvUnit<WeightFormat::kQ4_K> {
  static constexpr int kBlockWeights = 256, kBlockBytes = 144, kUnits = 32;
  template <int N, bool V>
  __device__ static void Dot(const uint8_t* blk, int unit, const float* x, int k, float (&acc)[N]) {
    const BlockQ4_K& b = *reinterpret_cast<const BlockQ4_K*>(blk);
    const int p = unit / 8, l0 = (unit % 8) * 4;
    const uint32_t q = *reinterpret_cast<const uint32_t*>(b.qs + 32 * p + l0);
    int sc0, m0, sc1, m1;
    ScaleMinK4(2 * p, b.scales, &sc0, &m0);
    ScaleMinK4(2 * p + 1, b.scales, &sc1, &m1);
    const float d = F16BitsToFloat(b.d), dmin = F16BitsToFloat(b.dmin);
    const float d0 = d * static_cast<float>(sc0), d1 = d * static_cast<float>(sc1);
    const float n0 = dmin * static_cast<float>(m0), n1 = dmin * static_cast<float>(m1);
    float lo[4], hi[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      lo[i] = static_cast<float>((q >> (8 * i)) & 0x0F);
      hi[i] = static_cast<float>((q >> (8 * i + 4)) & 0x0F);
    }
    const float* xu = x + 64 * p + l0;
#pragma unroll
    for (int r = 0; r < N; ++r) {
      const float* xr = xu + static_cast<int64_t>(r) * k;
      float xa[4], xb[4];
      LoadX4<V>(xr, xa);
      LoadX4<V>(xr + 32, xb);
      float s0 = 0.f, t0 = 0.f, s1 = 0.f, t1 = 0.f;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        s0 += lo[i] * xa[i];
        t0 += xa[i];
        s1 += hi[i] * xb[i];
        t1 += xb[i];
      }
      acc[r] += (d0 * s0 - n0 * t0) + (d1 * s1 - n1 * t1);
    }
  }
};

// Q5_K: Q4_K's units, with the fifth bits from the 4 bytes qh[4c ..] (bit 2p for the low
// nibbles' weights, 2p + 1 for the high nibbles'). Per unit and row as Q4_K.
template <>
struct GemvUnit<WeightFormat::kQ5_K> {
  static constexpr int kBlockWeights = 256, kBlockBytes = 176, kUnits = 32;
  template <int N, bool V>
  __device__ static void Dot(const uint8_t* blk, int unit, const float* x, int k, float (&acc)[N]) {
    const BlockQ5_K& b = *reinterpret_cast<const BlockQ5_K*>(blk);
    const int p = unit / 8, l0 = (unit % 8) * 4;
    const uint32_t q = *reinterpret_cast<const uint32_t*>(b.qs + 32 * p + l0);
    const uint32_t qh = *reinterpret_cast<const uint32_t*>(b.qh + l0);
    int sc0, m0, sc1, m1;
    ScaleMinK4(2 * p, b.scales, &sc0, &m0);
    ScaleMinK4(2 * p + 1, b.scales, &sc1, &m1);
    const float d = F16BitsToFloat(b.d), dmin = F16BitsToFloat(b.dmin);
    const float d0 = d * static_cast<float>(sc0), d1 = d * static_cast<float>(sc1);
    const float n0 = dmin * static_cast<float>(m0), n1 = dmin * static_cast<float>(m1);
    float lo[4], hi[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t lb = (q >> (8 * i)) & 0xFF, hb = (qh >> (8 * i + 2 * p)) & 3;
      lo[i] = static_cast<float>((lb & 0x0F) | (hb & 1) << 4);
      hi[i] = static_cast<float>((lb >> 4) | (hb >> 1) << 4);
    }
    const float* xu = x + 64 * p + l0;
#pragma unroll
    for (int r = 0; r < N; ++r) {
      const float* xr = xu + static_cast<int64_t>(r) * k;
      float xa[4], xb[4];
      LoadX4<V>(xr, xa);
      LoadX4<V>(xr + 32, xb);
      float s0 = 0.f, t0 = 0.f, s1 = 0.f, t1 = 0.f;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        s0 += lo[i] * xa[i];
        t0 += xa[i];
        s1 += hi[i] * xb[i];
        t1 += xb[i];
      }
      acc[r] += (d0 * s0 - n0 * t0) + (d1 * s1 - n1 * t1);
    }
  }
};

// Q6_K: 32 units per 210-byte super-block; unit u = 16h + 8c + e takes the 4 low-plane bytes
// ql[64h + 32c + 4e ..] and the 4 high-plane bytes qh[32h + 4e ..]: weights 128h + 32c + 4e + i
// (low nibbles, high bits at 2c) and those 64 further on (high nibbles, high bits at 2c + 4).
// Per unit and row: 8 multiply-adds and 2 scale products.
template <>
struct GemvUnit<WeightFormat::kQ6_K> {
  static constexpr int kBlockWeights = 256, kBlockBytes = 210, kUnits = 32;
  template <int N, bool V>
  __device__ static void Dot(const uint8_t* blk, int unit, const float* x, int k, float (&acc)[N]) {
    const BlockQ6_K& b = *reinterpret_cast<const BlockQ6_K*>(blk);
    const int h = unit / 16, c = (unit / 8) % 2, l0 = (unit % 8) * 4;
    const uint32_t ql = LoadU32Align2(b.ql + 64 * h + 32 * c + l0);
    const uint32_t qh = LoadU32Align2(b.qh + 32 * h + l0);
    const int is = 8 * h + 2 * c + l0 / 16;
    const float d = F16BitsToFloat(b.d);
    const float da = d * static_cast<float>(b.scales[is]);
    const float db = d * static_cast<float>(b.scales[is + 4]);
    float qa[4], qb[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t lb = (ql >> (8 * i)) & 0xFF, hb = (qh >> (8 * i)) & 0xFF;
      qa[i] = static_cast<float>(static_cast<int>((lb & 0x0F) | ((hb >> (2 * c)) & 3) << 4) - 32);
      qb[i] = static_cast<float>(static_cast<int>((lb >> 4) | ((hb >> (2 * c + 4)) & 3) << 4) - 32);
    }
    const float* xu = x + 128 * h + 32 * c + l0;
#pragma unroll
    for (int r = 0; r < N; ++r) {
      const float* xr = xu + static_cast<int64_t>(r) * k;
      float xa[4], xb[4];
      LoadX4<V>(xr, xa);
      LoadX4<V>(xr + 64, xb);
      float sa = 0.f, sb = 0.f;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        sa += qa[i] * xa[i];
        sb += qb[i] * xb[i];
      }
      acc[r] += da * sa + db * sb;
    }
  }
};

template <WeightFormat F, int N, bool V>
__global__ void __launch_bounds__(kGemvWarps * 32)
    QuantGemvKernel(const uint8_t* __restrict__ w, size_t row_bytes, int m, int k,
                    const float* __restrict__ x, float* __restrict__ y) {
  using U = GemvUnit<F>;
  const int row = blockIdx.x * kGemvWarps + threadIdx.x / 32;
  if (row >= m) return;  // the whole warp leaves together: no shuffle is left short
  const int lane = threadIdx.x % 32;
  const uint8_t* wr = w + static_cast<size_t>(row) * row_bytes;
  const int n_units = k / U::kBlockWeights * U::kUnits;
  float acc[N];
#pragma unroll
  for (int r = 0; r < N; ++r) acc[r] = 0.f;
    // Unrolled so that the next unit's weight loads are in flight while this one is summed.
#pragma unroll 2
  for (int u = lane; u < n_units; u += 32) {
    const int b = u / U::kUnits;
    U::template Dot<N, V>(wr + static_cast<size_t>(b) * U::kBlockBytes, u % U::kUnits,
                          x + static_cast<int64_t>(b) * U::kBlockWeights, k, acc);
  }
#pragma unroll
  for (int r = 0; r < N; ++r) acc[r] = WarpSum(acc[r]);
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < N; ++r) y[static_cast<int64_t>(r) * m + row] = acc[r];
  }
}

template <WeightFormat F, int N>
void LaunchRows(const void* w, size_t row_bytes, int m, int k, const float* x, float* y,
                cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>((m + kGemvWarps - 1) / kGemvWarps);
  // Every unit's activations start at a multiple of 4 floats from the row's start, and rows are
  // k floats apart (k a multiple of 32): all are 16-byte aligned when x is.
  if (reinterpret_cast<uintptr_t>(x) % 16 == 0) {
    QuantGemvKernel<F, N, true><<<blocks, kGemvWarps * 32, 0, stream>>>(
        static_cast<const uint8_t*>(w), row_bytes, m, k, x, y);
  } else {
    QuantGemvKernel<F, N, false><<<blocks, kGemvWarps * 32, 0, stream>>>(
        static_cast<const uint8_t*>(w), row_bytes, m, k, x, y);
  }
}

// LaunchRows<F, n> for the batch's n in 1..kMaxGemvRows, picked at run time: one instantiation
// per n, so that each keeps its n accumulators per row in registers.
template <WeightFormat F, int... I>
cudaError_t LaunchFormat(std::integer_sequence<int, I...>, const void* w, size_t row_bytes, int m,
                         int k, const float* x, int n, float* y, cudaStream_t stream) {
  const bool launched =
      ((n == I + 1 ? (LaunchRows<F, I + 1>(w, row_bytes, m, k, x, y, stream), true) : false) ||
       ...);
  return launched ? cudaGetLastError() : cudaErrorInvalidValue;
}

template <WeightFormat F>
cudaError_t LaunchFormat(const void* w, size_t row_bytes, int m, int k, const float* x, int n,
                         float* y, cudaStream_t stream) {
  return LaunchFormat<F>(std::make_integer_sequence<int, kMaxGemvRows>(), w, row_bytes, m, k, x,
                         n, y, stream);
}

}  // namespace

cudaError_t LaunchQuantGemv(WeightFormat format, const void* w, size_t row_bytes, int m, int k,
                            const float* x, int n, float* y, cudaStream_t stream) {
  if (m <= 0 || n <= 0) return cudaSuccess;
  switch (format) {
    case WeightFormat::kQ8_0:
      return LaunchFormat<WeightFormat::kQ8_0>(w, row_bytes, m, k, x, n, y, stream);
    case WeightFormat::kQ4_0:
      return LaunchFormat<WeightFormat::kQ4_0>(w, row_bytes, m, k, x, n, y, stream);
    case WeightFormat::kQ5_0:
      return LaunchFormat<WeightFormat::kQ5_0>(w, row_bytes, m, k, x, n, y, stream);
    case WeightFormat::kQ2_K:
      return LaunchFormat<WeightFormat::kQ2_K>(w, row_bytes, m, k, x, n, y, stream);
    case WeightFormat::kQ3_K:
      return LaunchFormat<WeightFormat::kQ3_K>(w, row_bytes, m, k, x, n, y, stream);
    case WeightFormat::kQ4_K:
      return LaunchFormat<WeightFormat::kQ4_K>(w, row_bytes, m, k, x, n, y, stream);
    case WeightFormat::kQ5_K:
      return LaunchFormat<WeightFormat::kQ5_K>(w, row_bytes, m, k, x, n, y, stream);
    case WeightFormat::kQ6_K:
      return LaunchFormat<WeightFormat::kQ6_K>(w, row_bytes, m, k, x, n, y, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace pd::engine::cuda
