#include <climits>
#include <cstdint>
#include <utility>

#include "engine/backend/cuda/dequant_device.cuh"
#include "engine/backend/cuda/device_util.cuh"
#include "engine/backend/cuda/matmul_q8act.cuh"
#include "engine/backend/cuda/matmul_quant.cuh"

namespace pd::engine::cuda {
namespace {

constexpr int kWarps = 4;  // warps per thread block, for every kernel here

size_t Align16(size_t v) { return (v + 15) / 16 * 16; }

// ---- Activation quantizers ---------------------------------------------------------------------
//
// Both reproduce the CPU's scalar references operation by operation: IEEE division and
// multiplication in round-to-nearest (spelled out so that nothing is contracted or approximated),
// and nearest-even rounding to int (std::nearbyint there, __float2int_rn here).

// Q8_K, one warp per 256-value block, lane l taking values 8l .. 8l + 7. The scale comes from the
// value of largest magnitude, the first one on ties (k_quants_quantize.cc, ArgMaxAbs): the lanes
// agree on it through a butterfly over (|value| descending, index ascending), a total order, so
// every lane ends with the same winner.
__global__ void __launch_bounds__(kWarps * 32)
    QuantizeQ8KKernel(const float* __restrict__ x, int k, int blocks, int8_t* __restrict__ q,
                      float* __restrict__ d, int* __restrict__ s) {
  const int blk = blockIdx.x * kWarps + threadIdx.x / 32;
  if (blk >= blocks) return;  // whole warps leave together
  const int lane = threadIdx.x % 32;
  const int per_row = k / 256;
  const int r = blk / per_row, b = blk % per_row;
  const int64_t base = static_cast<int64_t>(r) * k + static_cast<int64_t>(b) * 256 + 8 * lane;
  float v[8];
  float best_abs = -1.f, best_v = 0.f;
  int best_i = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    v[i] = x[base + i];
    const float a = fabsf(v[i]);
    if (a > best_abs) {
      best_abs = a;
      best_v = v[i];
      best_i = 8 * lane + i;
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float oa = __shfl_xor_sync(kFullMask, best_abs, off);
    const float ov = __shfl_xor_sync(kFullMask, best_v, off);
    const int oi = __shfl_xor_sync(kFullMask, best_i, off);
    if (oa > best_abs || (oa == best_abs && oi < best_i)) {
      best_abs = oa;
      best_v = ov;
      best_i = oi;
    }
  }
  const float max = best_v;
  const float iscale = max == 0.f ? 0.f : __fdiv_rn(-127.f, max);
  uint32_t packed[2] = {0, 0};
  int sum = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int c = max == 0.f ? 0 : min(127, __float2int_rn(__fmul_rn(iscale, v[i])));
    sum += c;
    packed[i / 4] |= (static_cast<uint32_t>(c) & 0xFFu) << (8 * (i % 4));
  }
  *reinterpret_cast<uint2*>(q + base) = make_uint2(packed[0], packed[1]);
  // Lanes 4j .. 4j + 3 hold the 32 values of sub-block j.
  sum += __shfl_xor_sync(kFullMask, sum, 1);
  sum += __shfl_xor_sync(kFullMask, sum, 2);
  if (lane % 4 == 0) s[static_cast<int64_t>(r) * (k / 32) + b * 8 + lane / 4] = sum;
  if (lane == 0) d[blk] = max == 0.f ? 0.f : __fdiv_rn(1.f, iscale);
}

// Q8_0 activations (QuantizeRowQ8_0Act), one warp per 32-value block, a value per lane. The
// stored scale is the f16 of amax / 127, kept here as the F32 it converts back to; the codes use
// 127 / amax.
__global__ void __launch_bounds__(kWarps * 32)
    QuantizeQ8_0Kernel(const float* __restrict__ x, int blocks, int8_t* __restrict__ q,
                       float* __restrict__ d) {
  const int blk = blockIdx.x * kWarps + threadIdx.x / 32;
  if (blk >= blocks) return;
  const int lane = threadIdx.x % 32;
  const int64_t i = static_cast<int64_t>(blk) * 32 + lane;  // k is a multiple of 32
  const float v = x[i];
  const float amax = WarpMax(fabsf(v));
  const float id = amax != 0.f ? __fdiv_rn(127.f, amax) : 0.f;
  q[i] = static_cast<int8_t>(__float2int_rn(__fmul_rn(v, id)));
  if (lane == 0) d[blk] = __half2float(__float2half_rn(__fdiv_rn(amax, 127.f)));
}

// ---- GEMV kernels -------------------------------------------------------------------------------
//
// A warp per output row (as matmul_quant.cu), its lanes in groups of U::kLanes that each take one
// weight block per step. Each lane dots its codes with the activation codes in int32 (exact),
// applies the block's integer sub-block scales in int32, and adds (weight scale x activation
// scale) x that integer to its F32 accumulator; the warp sums its lanes at the end. A unit U is
// one format's share of a block for one lane: U::Dot<N>(block, part, b, k, x, acc) for lane part
// `part` (0 .. kLanes - 1) of block b.

struct ActView {
  const int8_t* q;
  const float* d;
  const int* s;
};

__device__ __forceinline__ int Dot16(const uint32_t (&w)[4], const int4 x) {
  int s = __dp4a(static_cast<int>(w[0]), x.x, 0);
  s = __dp4a(static_cast<int>(w[1]), x.y, s);
  s = __dp4a(static_cast<int>(w[2]), x.z, s);
  return __dp4a(static_cast<int>(w[3]), x.w, s);
}

// Q4_K x Q8_K: 8 lanes per 144-byte super-block, a warp step covers 4 super-blocks. Part c (0..7)
// reads the 16 code bytes qs[16c ..] (one 16-byte load): their low nibbles are weights
// 64p + 16h + i of sub-block 2p and their high nibbles weights 64p + 32 + 16h + i of sub-block
// 2p + 1 (p = c / 2, h = c % 2). The min term dmin * m_j * sum(q over sub-block j) needs the
// whole sub-block's code sum, so the h = 0 part adds it for both of its sub-blocks.
struct Q4KUnit {
  static constexpr int kLanes = 8, kBlockWeights = 256, kBlockBytes = 144;
  template <int N>
  __device__ static void Dot(const uint8_t* block, int c, int b, int k, const ActView& x,
                             float (&acc)[N]) {
    const BlockQ4_K& blk = *reinterpret_cast<const BlockQ4_K*>(block);
    const int p = c / 2, h = c % 2, nb = k / 256;
    const uint4 qv = __ldg(reinterpret_cast<const uint4*>(blk.qs + 16 * c));
    int sc0, m0, sc1, m1;
    ScaleMinK4(2 * p, blk.scales, &sc0, &m0);
    ScaleMinK4(2 * p + 1, blk.scales, &sc1, &m1);
    const float dw = F16BitsToFloat(blk.d), dmin = F16BitsToFloat(blk.dmin);
    const uint32_t words[4] = {qv.x, qv.y, qv.z, qv.w};
    uint32_t lo[4], hi[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      lo[i] = words[i] & 0x0F0F0F0Fu;
      hi[i] = (words[i] >> 4) & 0x0F0F0F0Fu;
    }
#pragma unroll
    for (int r = 0; r < N; ++r) {
      const int8_t* xr = x.q + static_cast<int64_t>(r) * k + static_cast<int64_t>(b) * 256 +
                         64 * p + 16 * h;
      const int s0 = Dot16(lo, *reinterpret_cast<const int4*>(xr));
      const int s1 = Dot16(hi, *reinterpret_cast<const int4*>(xr + 32));
      float t = dw * static_cast<float>(sc0 * s0 + sc1 * s1);
      if (h == 0) {
        const int* sums = x.s + static_cast<int64_t>(r) * (k / 32) + b * 8 + 2 * p;
        t -= dmin * static_cast<float>(m0 * sums[0] + m1 * sums[1]);
      }
      acc[r] += x.d[static_cast<int64_t>(r) * nb + b] * t;
    }
  }
};

// Q6_K x Q8_K: 8 lanes per 210-byte super-block. Part c takes half t = c / 4 (weights 128t ..)
// and l0 = 8 (c % 4): weights 128t + 32j + l0 + i for j = 0..3, i = 0..7, whose low nibbles are
// in ql[64t + l0 ..] (j = 0 low, j = 2 high) and ql[64t + 32 + l0 ..] (j = 1 low, j = 3 high) and
// top bits at 2j in qh[32t + l0 ..]. The 8 weights of each j share the scale of sub-block
// 8t + 2j + l0 / 16. Codes are rebuilt four per word and shifted to q - 32 (signed).
struct Q6KUnit {
  static constexpr int kLanes = 8, kBlockWeights = 256, kBlockBytes = 210;
  template <int N>
  __device__ static void Dot(const uint8_t* block, int c, int b, int k, const ActView& x,
                             float (&acc)[N]) {
    const BlockQ6_K& blk = *reinterpret_cast<const BlockQ6_K*>(block);
    const int t = c / 4, l0 = 8 * (c % 4), nb = k / 256;
    uint32_t v[4][2];  // [j][word]: the q - 32 of weights 128t + 32j + l0 + 4 word + 0..3
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const uint32_t a = LoadU32Align2(blk.ql + 64 * t + l0 + 4 * e);
      const uint32_t bq = LoadU32Align2(blk.ql + 64 * t + 32 + l0 + 4 * e);
      const uint32_t hb = LoadU32Align2(blk.qh + 32 * t + l0 + 4 * e);
      v[0][e] = __vsub4((a & 0x0F0F0F0Fu) | ((hb << 4) & 0x30303030u), 0x20202020u);
      v[1][e] = __vsub4((bq & 0x0F0F0F0Fu) | ((hb << 2) & 0x30303030u), 0x20202020u);
      v[2][e] = __vsub4(((a >> 4) & 0x0F0F0F0Fu) | (hb & 0x30303030u), 0x20202020u);
      v[3][e] = __vsub4(((bq >> 4) & 0x0F0F0F0Fu) | ((hb >> 2) & 0x30303030u), 0x20202020u);
    }
    const int8_t* sc = blk.scales + 8 * t + l0 / 16;
    const int sc0 = sc[0], sc1 = sc[2], sc2 = sc[4], sc3 = sc[6];
    const float dw = F16BitsToFloat(blk.d);
#pragma unroll
    for (int r = 0; r < N; ++r) {
      const int8_t* xr =
          x.q + static_cast<int64_t>(r) * k + static_cast<int64_t>(b) * 256 + 128 * t + l0;
      int dots[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int2 xv = *reinterpret_cast<const int2*>(xr + 32 * j);
        dots[j] = __dp4a(static_cast<int>(v[j][1]), xv.y,
                         __dp4a(static_cast<int>(v[j][0]), xv.x, 0));
      }
      const int isum = sc0 * dots[0] + sc1 * dots[1] + sc2 * dots[2] + sc3 * dots[3];
      acc[r] += (dw * x.d[static_cast<int64_t>(r) * nb + b]) * static_cast<float>(isum);
    }
  }
};

// Q8_0 x Q8_0: 4 lanes per 34-byte block (8 codes each, read as 2-byte halves: blocks are only
// 2-byte aligned), a warp step covers 8 blocks.
struct Q8_0Unit {
  static constexpr int kLanes = 4, kBlockWeights = 32, kBlockBytes = 34;
  template <int N>
  __device__ static void Dot(const uint8_t* block, int u, int b, int k, const ActView& x,
                             float (&acc)[N]) {
    const int nb = k / 32;
    const float dw = F16BitsToFloat(*reinterpret_cast<const uint16_t*>(block));
    const int w0 = static_cast<int>(LoadU32Align2(block + 2 + 8 * u));
    const int w1 = static_cast<int>(LoadU32Align2(block + 6 + 8 * u));
#pragma unroll
    for (int r = 0; r < N; ++r) {
      const int2 xv = *reinterpret_cast<const int2*>(x.q + static_cast<int64_t>(r) * k +
                                                     static_cast<int64_t>(b) * 32 + 8 * u);
      const int dot = __dp4a(w1, xv.y, __dp4a(w0, xv.x, 0));
      acc[r] += (dw * x.d[static_cast<int64_t>(r) * nb + b]) * static_cast<float>(dot);
    }
  }
};

// The weights of one launch (GroupParts below): part i's thread blocks are first_block[i] ..
// first_block[i + 1] - 1, kWarps rows each.
struct GemvParts {
  const uint8_t* w[kMaxGemvParts];
  size_t row_bytes[kMaxGemvParts];
  int m[kMaxGemvParts];
  float* y[kMaxGemvParts];
  int first_block[kMaxGemvParts + 1];
  int count;
};

// A warp per output row of one of the parts. Every part's row runs the same code as a launch of
// that part alone would: the grouping changes which thread block computes a row, not how.
template <class U, int N>
__global__ void __launch_bounds__(kWarps * 32)
    Q8ActGemvKernel(const GemvParts p, int k, ActView x) {
  // The part that owns this thread block, found with static indices only (a kernel parameter
  // indexed by a run-time value would be copied to local memory).
  const uint8_t* w = p.w[0];
  size_t row_bytes = p.row_bytes[0];
  int m = p.m[0], first = 0;
  float* y = p.y[0];
#pragma unroll
  for (int i = 1; i < kMaxGemvParts; ++i) {
    if (i < p.count && static_cast<int>(blockIdx.x) >= p.first_block[i]) {
      w = p.w[i];
      row_bytes = p.row_bytes[i];
      m = p.m[i];
      y = p.y[i];
      first = p.first_block[i];
    }
  }
  const int row = (static_cast<int>(blockIdx.x) - first) * kWarps + threadIdx.x / 32;
  if (row >= m) return;  // the whole warp leaves together: no shuffle is left short
  const int lane = threadIdx.x % 32;
  const int nb = k / U::kBlockWeights;
  const uint8_t* wr = w + static_cast<size_t>(row) * row_bytes;
  float acc[N];
#pragma unroll
  for (int r = 0; r < N; ++r) acc[r] = 0.f;
  // Unrolled so that the next step's weight loads are in flight while this one is summed.
#pragma unroll 2
  for (int b = lane / U::kLanes; b < nb; b += 32 / U::kLanes) {
    U::template Dot<N>(wr + static_cast<size_t>(b) * U::kBlockBytes, lane % U::kLanes, b, k, x,
                       acc);
  }
#pragma unroll
  for (int r = 0; r < N; ++r) acc[r] = WarpSum(acc[r]);
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < N; ++r) y[static_cast<int64_t>(r) * m + row] = acc[r];
  }
}

template <int N>
void LaunchRows(WeightFormat format, const GemvParts& p, int k, ActView x, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>(p.first_block[p.count]);
  switch (format) {
    case WeightFormat::kQ4_K:
      Q8ActGemvKernel<Q4KUnit, N><<<blocks, kWarps * 32, 0, stream>>>(p, k, x);
      break;
    case WeightFormat::kQ6_K:
      Q8ActGemvKernel<Q6KUnit, N><<<blocks, kWarps * 32, 0, stream>>>(p, k, x);
      break;
    default:
      Q8ActGemvKernel<Q8_0Unit, N><<<blocks, kWarps * 32, 0, stream>>>(p, k, x);
      break;
  }
}

// LaunchRows<n> for n in 1..kMaxGemvRows, picked at run time.
template <int... I>
bool LaunchN(std::integer_sequence<int, I...>, int n, WeightFormat format, const GemvParts& p,
             int k, ActView x, cudaStream_t stream) {
  return ((n == I + 1 ? (LaunchRows<I + 1>(format, p, k, x, stream), true) : false) || ...);
}

}  // namespace

bool Q8ActGemvFormat(WeightFormat format, ActQuant* act) {
  switch (format) {
    case WeightFormat::kQ4_K:
    case WeightFormat::kQ6_K:
      *act = ActQuant::kQ8_K;
      return true;
    case WeightFormat::kQ8_0:
      *act = ActQuant::kQ8_0;
      return true;
    default:
      return false;
  }
}

bool Q8ActGemvAligned(WeightFormat format, const void* w, size_t row_bytes) {
  const size_t align = format == WeightFormat::kQ4_K ? 16 : 2;
  return reinterpret_cast<uintptr_t>(w) % align == 0 && row_bytes % align == 0;
}

Q8ActLayout Q8ActLayoutFor(ActQuant act, int n, int k) {
  const size_t rows = static_cast<size_t>(n);
  const int block = act == ActQuant::kQ8_K ? 256 : 32;
  Q8ActLayout l;
  l.d_offset = Align16(rows * static_cast<size_t>(k));
  l.s_offset = Align16(l.d_offset + rows * static_cast<size_t>(k / block) * sizeof(float));
  l.bytes =
      l.s_offset + (act == ActQuant::kQ8_K ? rows * static_cast<size_t>(k / 32) * sizeof(int) : 0);
  return l;
}

cudaError_t LaunchQuantizeAct(ActQuant act, const float* x, int n, int k, void* out,
                              cudaStream_t stream) {
  const int block = act == ActQuant::kQ8_K ? 256 : 32;
  if (n <= 0 || k <= 0 || k % block != 0) return cudaErrorInvalidValue;
  const Q8ActLayout l = Q8ActLayoutFor(act, n, k);
  auto* base = static_cast<uint8_t*>(out);
  auto* q = reinterpret_cast<int8_t*>(base);
  auto* d = reinterpret_cast<float*>(base + l.d_offset);
  const int blocks = n * (k / block);
  const unsigned grid = static_cast<unsigned>((blocks + kWarps - 1) / kWarps);
  if (act == ActQuant::kQ8_K) {
    QuantizeQ8KKernel<<<grid, kWarps * 32, 0, stream>>>(x, k, blocks, q, d,
                                                        reinterpret_cast<int*>(base + l.s_offset));
  } else {
    QuantizeQ8_0Kernel<<<grid, kWarps * 32, 0, stream>>>(x, blocks, q, d);
  }
  return cudaGetLastError();
}

cudaError_t LaunchQuantGemvQ8ActGroup(WeightFormat format, const Q8ActGemvPart* parts, int count,
                                      int k, const void* xq, int n, cudaStream_t stream) {
  ActQuant act;
  if (!Q8ActGemvFormat(format, &act) || count < 1 || count > kMaxGemvParts) {
    return cudaErrorInvalidValue;
  }
  if (n <= 0) return cudaSuccess;
  if (n > kMaxGemvRows || k % (act == ActQuant::kQ8_K ? 256 : 32) != 0) {
    return cudaErrorInvalidValue;
  }
  GemvParts p{};
  int64_t blocks = 0;
  for (int i = 0; i < count; ++i) {
    const Q8ActGemvPart& part = parts[i];
    if (part.m < 0 || (part.m > 0 && !Q8ActGemvAligned(format, part.w, part.row_bytes))) {
      return cudaErrorInvalidValue;
    }
    p.w[i] = static_cast<const uint8_t*>(part.w);
    p.row_bytes[i] = part.row_bytes;
    p.m[i] = part.m;
    p.y[i] = part.y;
    p.first_block[i] = static_cast<int>(blocks);
    blocks += (part.m + kWarps - 1) / kWarps;
    if (blocks > INT_MAX) return cudaErrorInvalidValue;
  }
  p.first_block[count] = static_cast<int>(blocks);
  p.count = count;
  if (blocks == 0) return cudaSuccess;
  const Q8ActLayout l = Q8ActLayoutFor(act, n, k);
  const auto* base = static_cast<const uint8_t*>(xq);
  const ActView x{reinterpret_cast<const int8_t*>(base),
                  reinterpret_cast<const float*>(base + l.d_offset),
                  reinterpret_cast<const int*>(base + l.s_offset)};
  if (!LaunchN(std::make_integer_sequence<int, kMaxGemvRows>(), n, format, p, k, x, stream)) {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t LaunchQuantGemvQ8Act(WeightFormat format, const void* w, size_t row_bytes, int m, int k,
                                 const void* xq, int n, float* y, cudaStream_t stream) {
  const Q8ActGemvPart part{w, row_bytes, m, y};
  return LaunchQuantGemvQ8ActGroup(format, &part, 1, k, xq, n, stream);
}

}  // namespace pd::engine::cuda
