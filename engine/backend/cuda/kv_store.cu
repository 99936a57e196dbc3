#include <cuda_fp16.h>

#include <cstdint>

#include "engine/backend/cuda/device_util.cuh"
#include "engine/backend/cuda/kv_device.cuh"
#include "engine/backend/cuda/kv_store.cuh"

namespace pd::engine::cuda {
namespace {

constexpr int kStoreBlock = 128;

// One block per (token, kv head): reads head_dim * 4 bytes and writes head_dim values (4, 2 or 1
// bytes each; INT8 adds 4 bytes of scale after head_dim * log2(b) additions of the rotation, a
// max and a quantize pass in shared memory).
template <KvType T>
__global__ void __launch_bounds__(kStoreBlock)
    StoreKvKernel(const float* __restrict__ src, KvCacheView c, KvBatchView batch) {
  const int t = blockIdx.x, head = blockIdx.y;
  const int p = batch.pos[t];
  const int block = batch.tables[batch.table_offsets[batch.seq[t]] + p / batch.block_size];
  const int off = p % batch.block_size;
  const int hd = c.head_dim;
  const float* x = src + (static_cast<int64_t>(t) * c.n_kv_heads + head) * hd;
  uint8_t* dst = static_cast<uint8_t*>(c.data) + KvValueOffset<T>(c, block, off, head);

  if constexpr (T == KvType::kF32) {
    float* d = reinterpret_cast<float*>(dst);
    for (int i = threadIdx.x; i < hd; i += blockDim.x) d[i] = x[i];
  } else if constexpr (T == KvType::kF16) {
    __half* d = reinterpret_cast<__half*>(dst);
    for (int i = threadIdx.x; i < hd; i += blockDim.x) d[i] = __float2half_rn(x[i]);
  } else {
    // The CPU's QuantizeKvRowI8: rotate by H / b, scale = max|x| / 127, codes round half to
    // even of x * (1 / scale), clamped to [-127, 127]; a zero head keeps scale 0 and codes 0.
    extern __shared__ float row[];  // [head_dim]
    __shared__ float warp_max[kStoreBlock / 32];
    for (int i = threadIdx.x; i < hd; i += blockDim.x) row[i] = x[i];
    __syncthreads();
    BlockRotateKvRow(row, hd, 1.f / static_cast<float>(hd & -hd));
    float amax = 0.f;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) amax = fmaxf(amax, fabsf(row[i]));
    amax = WarpMax(amax);
    if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
    __syncthreads();
    amax = warp_max[0];
#pragma unroll
    for (int w = 1; w < kStoreBlock / 32; ++w) amax = fmaxf(amax, warp_max[w]);
    const float d = __fdiv_rn(amax, 127.f);
    const float id = d != 0.f ? __fdiv_rn(1.f, d) : 0.f;
    int8_t* q = reinterpret_cast<int8_t*>(dst);
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
      const float r = rintf(__fmul_rn(row[i], id));
      q[i] = static_cast<int8_t>(fminf(127.f, fmaxf(-127.f, r)));
    }
    if (threadIdx.x == 0) StoreKvScale(c, block, off, head, d);
  }
}

}  // namespace

cudaError_t LaunchStoreKv(const float* src, const KvCacheView& cache, const KvBatchView& batch,
                          cudaStream_t stream) {
  if (batch.n_tokens <= 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(batch.n_tokens), static_cast<unsigned>(cache.n_kv_heads));
  switch (cache.type) {
    case KvType::kF32:
      StoreKvKernel<KvType::kF32><<<grid, kStoreBlock, 0, stream>>>(src, cache, batch);
      break;
    case KvType::kF16:
      StoreKvKernel<KvType::kF16><<<grid, kStoreBlock, 0, stream>>>(src, cache, batch);
      break;
    case KvType::kI8:
      StoreKvKernel<KvType::kI8>
          <<<grid, kStoreBlock, sizeof(float) * cache.head_dim, stream>>>(src, cache, batch);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace pd::engine::cuda
