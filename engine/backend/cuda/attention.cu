#include <cstdint>

#include "engine/backend/cuda/attention.cuh"
#include "engine/backend/cuda/device_util.cuh"
#include "engine/backend/cuda/kv_device.cuh"

namespace pd::engine::cuda {
namespace {

constexpr int kAttnWarps = 4;
constexpr int kAttnThreads = kAttnWarps * 32;

// Shared memory of AttentionKernel: the query [head_dim], every warp's unnormalized output
// [kAttnWarps][head_dim] and its running max and sum [kAttnWarps][2].
size_t AttentionSmemBytes(int head_dim) {
  return sizeof(float) * (static_cast<size_t>(head_dim) * (1 + kAttnWarps) + 2 * kAttnWarps);
}

// One block per (row, query head, split), row = the batch row rows[blockIdx.x] (or blockIdx.x
// when the kernel takes every row). The block's warps take the split's positions in turn
// (warp w: positions p0 + w, p0 + w + 4, ...), each keeping an online softmax: a running max m,
// the running sum l of exp(s - m) and the running sum o of exp(s - m) * v, rescaled whenever m
// grows. Lane `lane` holds dimensions lane + 32 i (i < kDpl) of the query and of o, so every K and
// V row is read as kDpl coalesced warp loads; a dot is a warp sum, which leaves the same bits in
// every lane, so m and l stay uniform across the warp. The warps' states are merged at the end.
//
// Per position and head: 4 * head_dim flops, two expf, one tanhf with a softcap; bytes: one K and
// one V row (head_dim values each, plus a scale for INT8), shared through L2 by the n_heads /
// n_kv_heads query heads of a KV head. INT8 rows are dequantized on the fly: the key's scale
// multiplies its dot, the value's folds into the softmax weight. INT8 keys and values are stored
// rotated (kv_rotation.h), so the query is rotated into that basis first, and the output out of
// it last (by the merge kernel when the positions are split).
template <int kDpl, KvType T>
__global__ void __launch_bounds__(kAttnThreads) AttentionKernel(AttentionArgs a) {
  extern __shared__ float smem[];
  const int hd = a.head_dim;
  float* qs = smem;                           // [hd]
  float* warp_o = smem + hd;                  // [kAttnWarps][hd]
  float* warp_ml = warp_o + kAttnWarps * hd;  // [kAttnWarps][2]

  const int t = a.rows != nullptr ? a.rows[blockIdx.x] : static_cast<int>(blockIdx.x);
  const int h = blockIdx.y, split = blockIdx.z;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int kvh = h / (a.n_heads / a.n_kv_heads);
  const int pos = a.batch.pos[t];
  const int lo = a.window > 0 ? max(0, pos - a.window + 1) : 0;
  const int chunk = (pos - lo + a.n_splits) / a.n_splits;  // ceil(visible / n_splits) >= 1
  const int p0 = lo + split * chunk;
  const int p1 = min(pos, p0 + chunk - 1);  // p0 > p1: an empty split (fewer positions than splits)
  const int32_t* table = a.batch.tables + a.batch.table_offsets[a.batch.seq[t]];
  const int bs = a.batch.block_size;

  const float* qh = a.q + (static_cast<int64_t>(t) * a.n_heads + h) * hd;
  for (int i = threadIdx.x; i < hd; i += blockDim.x) qs[i] = qh[i];
  __syncthreads();
  if constexpr (T == KvType::kI8) BlockRotateKvRow(qs, hd, 1.f);
  float qr[kDpl], o[kDpl];
#pragma unroll
  for (int i = 0; i < kDpl; ++i) {
    const int d = lane + 32 * i;
    qr[i] = d < hd ? qs[d] : 0.f;
    o[i] = 0.f;
  }

  const uint8_t* kdata = static_cast<const uint8_t*>(a.k.data);
  const uint8_t* vdata = static_cast<const uint8_t*>(a.v.data);
  float m = -INFINITY, l = 0.f;
  for (int p = p0 + warp; p <= p1; p += kAttnWarps) {
    const int block = table[p / bs], off = p % bs;
    // K and V share the layout, so one offset addresses both rows.
    const size_t row = KvValueOffset<T>(a.k, block, off, kvh);
    const uint8_t* kr = kdata + row;
    const uint8_t* vr = vdata + row;
    float dot = 0.f;
#pragma unroll
    for (int i = 0; i < kDpl; ++i) {
      const int d = lane + 32 * i;
      if (d < hd) dot += qr[i] * LoadKv<T>(kr, d);
    }
    dot = WarpSum(dot);
    if constexpr (T == KvType::kI8) dot *= LoadKvScale(a.k, block, off, kvh);
    const float s = a.softcap > 0.f ? a.softcap * tanhf(dot * a.scale / a.softcap) : dot * a.scale;
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new);  // 0 on the first position (m = -inf)
    const float e = expf(s - m_new);
    l = l * corr + e;
    float w = e;
    if constexpr (T == KvType::kI8) w *= LoadKvScale(a.v, block, off, kvh);
#pragma unroll
    for (int i = 0; i < kDpl; ++i) {
      const int d = lane + 32 * i;
      if (d < hd) o[i] = o[i] * corr + w * LoadKv<T>(vr, d);
    }
    m = m_new;
  }
#pragma unroll
  for (int i = 0; i < kDpl; ++i) {
    const int d = lane + 32 * i;
    if (d < hd) warp_o[warp * hd + d] = o[i];
  }
  if (lane == 0) {
    warp_ml[2 * warp] = m;
    warp_ml[2 * warp + 1] = l;
  }
  __syncthreads();

  // Merge the warps: weights exp(m_w - M); a warp that saw no position has m_w = -inf, weight 0.
  float big_m = -INFINITY;
#pragma unroll
  for (int w = 0; w < kAttnWarps; ++w) big_m = fmaxf(big_m, warp_ml[2 * w]);
  float scale_w[kAttnWarps];
  float big_l = 0.f;
#pragma unroll
  for (int w = 0; w < kAttnWarps; ++w) {
    scale_w[w] = big_m == -INFINITY ? 0.f : expf(warp_ml[2 * w] - big_m);
    big_l += warp_ml[2 * w + 1] * scale_w[w];
  }

  if (a.n_splits > 1) {
    float* rec =
        a.partial +
        ((static_cast<int64_t>(blockIdx.x) * a.n_heads + h) * a.n_splits + split) * (hd + 2);
    if (threadIdx.x == 0) {
      rec[0] = big_m;
      rec[1] = big_l;
    }
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
      float sum = 0.f;
#pragma unroll
      for (int w = 0; w < kAttnWarps; ++w) sum += warp_o[w * hd + d] * scale_w[w];
      rec[2 + d] = sum;
    }
    return;
  }
  // Every position was this block's (no split): at least one, so big_l > 0. The query in `qs`
  // is no longer needed; INT8 output goes through it to be rotated back.
  float* oh = a.out + (static_cast<int64_t>(t) * a.n_heads + h) * hd;
  const float inv_l = 1.f / big_l;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < kAttnWarps; ++w) sum += warp_o[w * hd + d] * scale_w[w];
    if constexpr (T == KvType::kI8) {
      qs[d] = sum * inv_l;
    } else {
      oh[d] = sum * inv_l;
    }
  }
  if constexpr (T == KvType::kI8) {
    __syncthreads();
    BlockRotateKvRow(qs, hd, 1.f);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) oh[d] = qs[d];
  }
}

// One block per (row, query head), rows as in AttentionKernel: merges the splits' (max, sum,
// unnormalized output) records the same way the block merged its warps, and rotates INT8 outputs
// back. Reads n_splits * (head_dim + 2) floats, writes head_dim.
__global__ void __launch_bounds__(kAttnThreads) AttentionMergeKernel(AttentionArgs a, bool rotate) {
  extern __shared__ float out_row[];  // [head_dim]
  const int t = a.rows != nullptr ? a.rows[blockIdx.x] : static_cast<int>(blockIdx.x);
  const int h = blockIdx.y, hd = a.head_dim, n = a.n_splits;
  const float* recs = a.partial + (static_cast<int64_t>(blockIdx.x) * a.n_heads + h) * n * (hd + 2);
  float big_m = -INFINITY;
  for (int s = 0; s < n; ++s) big_m = fmaxf(big_m, recs[s * (hd + 2)]);
  // Split 0 always holds the first visible position, so big_m is finite and big_l > 0.
  float big_l = 0.f;
  for (int s = 0; s < n; ++s) {
    big_l += recs[s * (hd + 2) + 1] * expf(recs[s * (hd + 2)] - big_m);
  }
  const float inv_l = 1.f / big_l;
  float* oh = a.out + (static_cast<int64_t>(t) * a.n_heads + h) * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float sum = 0.f;
    for (int s = 0; s < n; ++s) {
      const float* rec = recs + s * (hd + 2);
      sum += rec[2 + d] * expf(rec[0] - big_m);
    }
    if (rotate) {
      out_row[d] = sum * inv_l;
    } else {
      oh[d] = sum * inv_l;
    }
  }
  if (rotate) {
    __syncthreads();
    BlockRotateKvRow(out_row, hd, 1.f);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) oh[d] = out_row[d];
  }
}

template <int kDpl>
cudaError_t LaunchDpl(const AttentionArgs& a, int n_rows, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(n_rows), static_cast<unsigned>(a.n_heads),
                  static_cast<unsigned>(a.n_splits));
  const size_t smem = AttentionSmemBytes(a.head_dim);
  switch (a.k.type) {
    case KvType::kF32:
      AttentionKernel<kDpl, KvType::kF32><<<grid, kAttnThreads, smem, stream>>>(a);
      break;
    case KvType::kF16:
      AttentionKernel<kDpl, KvType::kF16><<<grid, kAttnThreads, smem, stream>>>(a);
      break;
    case KvType::kI8:
      AttentionKernel<kDpl, KvType::kI8><<<grid, kAttnThreads, smem, stream>>>(a);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchAttention(const AttentionArgs& a, cudaStream_t stream) {
  if (a.batch.n_tokens <= 0 || a.n_heads <= 0) return cudaSuccess;
  if (a.head_dim <= 0 || a.head_dim > kMaxAttentionHeadDim || a.n_splits < 1 ||
      a.k.type != a.v.type || (a.n_splits > 1 && a.partial == nullptr) || a.n_rows < 0 ||
      a.n_tiles < 0 || (a.n_tiles > 0 && a.tiles == nullptr)) {
    return cudaErrorInvalidValue;
  }
  cudaError_t err = cudaSuccess;
  if (a.n_tiles > 0) {
    err = LaunchTiledAttention(a, stream);
    if (err != cudaSuccess) return err;
  }
  const int n_rows = a.rows != nullptr ? a.n_rows : a.batch.n_tokens;
  if (n_rows == 0) return cudaSuccess;
  if (a.head_dim <= 32) {
    err = LaunchDpl<1>(a, n_rows, stream);
  } else if (a.head_dim <= 64) {
    err = LaunchDpl<2>(a, n_rows, stream);
  } else if (a.head_dim <= 128) {
    err = LaunchDpl<4>(a, n_rows, stream);
  } else if (a.head_dim <= 256) {
    err = LaunchDpl<8>(a, n_rows, stream);
  } else {
    err = LaunchDpl<16>(a, n_rows, stream);
  }
  if (err != cudaSuccess || a.n_splits == 1) return err;
  const dim3 grid(static_cast<unsigned>(n_rows), static_cast<unsigned>(a.n_heads));
  AttentionMergeKernel<<<grid, kAttnThreads, sizeof(float) * a.head_dim, stream>>>(
      a, a.v.type == KvType::kI8);
  return cudaGetLastError();
}

}  // namespace pd::engine::cuda
