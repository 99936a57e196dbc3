#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>

#include "engine/backend/cuda/device_util.cuh"
#include "engine/backend/cuda/topk.cuh"

namespace pd::engine::cuda {
namespace {

constexpr int kBlock = 1024;
constexpr int kWarps = kBlock / 32;

// top_k.h's TopKKey: larger key ranks first; -0 takes +0's key, NaN the lowest key (0).
__device__ __forceinline__ uint32_t Key(float v) {
  if (v != v) return 0u;
  if (v == 0.0f) v = 0.0f;
  const uint32_t u = __float_as_uint(v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// True when (ka, ia) ranks before (kb, ib).
__device__ __forceinline__ bool Before(uint32_t ka, int32_t ia, uint32_t kb, int32_t ib) {
  return ka > kb || (ka == kb && ia < ib);
}

// k == 1 (greedy decoding): one pass, each thread's best over a strided run of columns, then a
// warp and a block reduction of (key, column) pairs. Reads the row once.
__global__ void ArgMaxKernel(const float* x, int cols, float* values, int32_t* ids) {
  __shared__ uint32_t warp_key[kWarps];
  __shared__ int32_t warp_id[kWarps];
  const float* row = x + static_cast<int64_t>(blockIdx.x) * cols;
  uint32_t best_key = 0;
  int32_t best_id = INT_MAX;  // ranks after every real entry, NaNs (key 0) included
  for (int c = threadIdx.x; c < cols; c += kBlock) {
    const uint32_t key = Key(row[c]);
    if (Before(key, c, best_key, best_id)) {
      best_key = key;
      best_id = c;
    }
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  auto reduce = [&]() {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      const uint32_t k = __shfl_xor_sync(kFullMask, best_key, offset);
      const int32_t i = __shfl_xor_sync(kFullMask, best_id, offset);
      if (Before(k, i, best_key, best_id)) {
        best_key = k;
        best_id = i;
      }
    }
  };
  reduce();
  if (lane == 0) {
    warp_key[warp] = best_key;
    warp_id[warp] = best_id;
  }
  __syncthreads();
  if (warp == 0) {
    best_key = warp_key[lane];
    best_id = warp_id[lane];
    reduce();
    if (lane == 0) {
      ids[blockIdx.x] = best_id;
      values[blockIdx.x] = row[best_id];
    }
  }
}

// General k: a radix select finds T, the k-th best key, in four passes of eight bits (most
// significant first: each pass histograms the keys that share the bits chosen so far and picks
// the bucket holding the k-th). Then every key > T is taken, and of the keys == T the ones at the
// lowest columns (a block-wide prefix count over contiguous column ranges keeps column order),
// and a bitonic sort in shared memory puts the k in rank order. Per-warp histograms keep the
// shared-memory atomics of a row whose logits share their top bits from piling on one address.
// Reads the row five times (four from L2 after the first).
//
// One block takes one slice of a row: block b is slice b % slices of row b / slices, the row's
// columns cut into `slices` runs of cols / slices (the last takes the remainder; every run holds
// at least k columns). Its best k go to values/ids row b, as columns of the whole row, or, with
// id_map, as id_map[row * cols + column] (the second pass below).
__global__ void TopKKernel(const float* x, int cols, int slices, int k, float* values, int32_t* ids,
                           const int32_t* id_map) {
  __shared__ uint32_t hist[kWarps][256];
  __shared__ uint32_t sel_key[kTopKMax];
  __shared__ int32_t sel_id[kTopKMax];
  __shared__ uint32_t warp_total[kWarps];
  __shared__ uint32_t s_prefix, s_remaining, s_greater;
  const int r = static_cast<int>(blockIdx.x) / slices, s = static_cast<int>(blockIdx.x) % slices;
  const int row_cols = cols, run = cols / slices, first = s * run;
  const float* row = x + static_cast<int64_t>(r) * row_cols + first;
  cols = s + 1 == slices ? row_cols - first : run;  // from here on, the slice's columns
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  uint32_t prefix = 0, mask = 0, remaining = static_cast<uint32_t>(k);
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < kWarps * 256; i += kBlock) (&hist[0][0])[i] = 0;
    __syncthreads();
    for (int c = threadIdx.x; c < cols; c += kBlock) {
      const uint32_t key = Key(row[c]);
      if ((key & mask) == prefix) atomicAdd(&hist[warp][(key >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (threadIdx.x < 256) {  // thread b sums bin b over the warps' histograms into hist[0][b]
      uint32_t sum = 0;
      for (int w = 0; w < kWarps; ++w) sum += hist[w][threadIdx.x];
      hist[0][threadIdx.x] = sum;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      // The bucket holding the remaining-th best key: buckets above it hold fewer than
      // `remaining` keys, together with it at least that many.
      uint32_t above = 0;
      int b = 255;
      for (; b > 0; --b) {
        if (above + hist[0][b] >= remaining) break;
        above += hist[0][b];
      }
      s_prefix = prefix | (static_cast<uint32_t>(b) << shift);
      s_remaining = remaining - above;
    }
    __syncthreads();
    prefix = s_prefix;
    remaining = s_remaining;
    mask |= 255u << shift;
  }
  // prefix is T; `remaining` keys == T are taken, k - remaining keys are > T.
  const uint32_t threshold = prefix;
  const uint32_t greater = static_cast<uint32_t>(k) - remaining;
  if (threadIdx.x == 0) s_greater = 0;
  __syncthreads();
  const int chunk = (cols + kBlock - 1) / kBlock;
  const int c0 = min(cols, static_cast<int>(threadIdx.x) * chunk);
  const int c1 = min(cols, c0 + chunk);
  uint32_t n_eq = 0;
  for (int c = c0; c < c1; ++c) {
    const uint32_t key = Key(row[c]);
    if (key > threshold) {
      const uint32_t slot = atomicAdd(&s_greater, 1u);
      sel_key[slot] = key;
      sel_id[slot] = c;
    } else if (key == threshold) {
      ++n_eq;
    }
  }
  // Exclusive prefix count of the keys == T over the threads' column ranges, in column order.
  uint32_t incl = n_eq;
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const uint32_t v = __shfl_up_sync(kFullMask, incl, offset);
    if (lane >= offset) incl += v;
  }
  if (lane == 31) warp_total[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    uint32_t t = warp_total[lane];
#pragma unroll
    for (int offset = 1; offset < 32; offset <<= 1) {
      const uint32_t v = __shfl_up_sync(kFullMask, t, offset);
      if (lane >= offset) t += v;
    }
    warp_total[lane] = t;  // inclusive over warps
  }
  __syncthreads();
  uint32_t rank = incl - n_eq + (warp > 0 ? warp_total[warp - 1] : 0u);
  for (int c = c0; c < c1 && rank < remaining; ++c) {
    if (Key(row[c]) == threshold) {
      sel_key[greater + rank] = threshold;
      sel_id[greater + rank] = c;
      ++rank;
    }
  }
  // Pad to a power of two with entries that rank after everything, then sort.
  int padded = 1;
  while (padded < k) padded <<= 1;
  for (int i = k + threadIdx.x; i < padded; i += kBlock) {
    sel_key[i] = 0;
    sel_id[i] = INT_MAX;
  }
  __syncthreads();
  for (int size = 2; size <= padded; size <<= 1) {
    for (int stride = size / 2; stride > 0; stride >>= 1) {
      for (int t = threadIdx.x; t < padded / 2; t += kBlock) {
        const int i = 2 * t - (t & (stride - 1));
        const int j = i + stride;
        // Runs whose `size` bit is clear end in rank order, the others reversed, so that each
        // merge step sees a bitonic sequence; the last size (== padded) is all in rank order.
        const bool ranked = (i & size) == 0;
        const bool j_first = Before(sel_key[j], sel_id[j], sel_key[i], sel_id[i]);
        if (ranked == j_first) {
          const uint32_t tk = sel_key[i];
          sel_key[i] = sel_key[j];
          sel_key[j] = tk;
          const int32_t ti = sel_id[i];
          sel_id[i] = sel_id[j];
          sel_id[j] = ti;
        }
      }
      __syncthreads();
    }
  }
  for (int j = threadIdx.x; j < k; j += kBlock) {
    const int32_t c = sel_id[j];
    const int64_t out = static_cast<int64_t>(blockIdx.x) * k + j;
    ids[out] =
        id_map != nullptr ? id_map[static_cast<int64_t>(r) * row_cols + first + c] : first + c;
    values[out] = row[c];
  }
}

}  // namespace

int TopKSlices(int rows, int cols, int k) {
  if (k <= 1 || rows > (1 << 20)) return 1;  // k = 1 takes ArgMaxKernel; the grid stays an int
  return std::max(1, std::min({kTopKMaxSlices, cols / kTopKSliceColumns, cols / k}));
}

size_t TopKScratchBytes(int rows, int cols, int k) {
  const int slices = TopKSlices(rows, cols, k);
  if (slices == 1) return 0;
  return static_cast<size_t>(rows) * slices * k * (sizeof(float) + sizeof(int32_t));
}

cudaError_t LaunchTopK(const float* x, int rows, int cols, int k, float* values, int32_t* ids,
                       void* scratch, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0 || k < 1 || k > kTopKMax || k > cols) return cudaErrorInvalidValue;
  if (k == 1) {
    ArgMaxKernel<<<rows, kBlock, 0, stream>>>(x, cols, values, ids);
    return cudaGetLastError();
  }
  const int slices = TopKSlices(rows, cols, k);
  if (slices == 1) {
    TopKKernel<<<rows, kBlock, 0, stream>>>(x, cols, 1, k, values, ids, nullptr);
    return cudaGetLastError();
  }
  if (scratch == nullptr) return cudaErrorInvalidValue;
  // Two passes: each slice's best k (slices x k candidates a row, in slice order and, within a
  // slice, in rank order), then the best k of the candidates. The k best of a row are among its
  // slices' k best, and candidates of equal value stand in column order (slices in order, equal
  // values within a slice by column), so ranking them by (value, candidate index) is ranking
  // them by (value, column): the one-pass result, bit for bit.
  const int n = slices * k;
  float* cand_values = static_cast<float*>(scratch);
  int32_t* cand_ids = reinterpret_cast<int32_t*>(cand_values + static_cast<size_t>(rows) * n);
  TopKKernel<<<rows * slices, kBlock, 0, stream>>>(x, cols, slices, k, cand_values, cand_ids,
                                                   nullptr);
  TopKKernel<<<rows, kBlock, 0, stream>>>(cand_values, n, 1, k, values, ids, cand_ids);
  return cudaGetLastError();
}

}  // namespace pd::engine::cuda
