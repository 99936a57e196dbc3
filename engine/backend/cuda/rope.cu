#include <algorithm>
#include <cstdint>

#include "engine/backend/cuda/rope.cuh"

namespace pd::engine::cuda {
namespace {

constexpr int kRopeBlock = 128;

// One block per (token, group of heads_per_block heads). Thread i < rot_dim / 2 first builds angle
// i (i dependent F32 products: the same rounding chain as the CPU's running product, at most 255
// products for head_dim 512) and its cosine and sine into shared memory; then the block rotates
// every (head, pair) of its heads: 6 flops and 16 bytes moved per pair. Groups of about one pair
// per thread keep a decode token's heads on many SMs (one block per token took 10 us for Llama
// 7B's 32 heads on an H200, 8% of a decode step).
__global__ void RopeKernel(float* x, RopeArgs a, int heads_per_block) {
  extern __shared__ float cos_sin[];  // [half] cosines, then [half] sines
  const int half = a.rot_dim / 2;
  float* cosv = cos_sin;
  float* sinv = cos_sin + half;
  const int t = blockIdx.x;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    float theta_base = static_cast<float>(a.pos[t]);
    for (int j = 0; j < i; ++j) theta_base = __fmul_rn(theta_base, a.theta_scale);
    const float ff = a.freq_factors != nullptr ? a.freq_factors[i] : 1.f;
    const float theta = __fmul_rn(a.freq_scale, __fdiv_rn(theta_base, ff));
    sincosf(theta, &sinv[i], &cosv[i]);
  }
  __syncthreads();

  float* row = x + static_cast<int64_t>(t) * a.n_heads * a.head_dim;
  const int h0 = blockIdx.y * heads_per_block;
  const int pairs = min(heads_per_block, a.n_heads - h0) * half;
  for (int idx = threadIdx.x; idx < pairs; idx += blockDim.x) {
    const int h = h0 + idx / half, i = idx % half;
    float* v = row + static_cast<int64_t>(h) * a.head_dim;
    const int ia = a.neox ? i : 2 * i;
    const int ib = a.neox ? i + half : 2 * i + 1;
    const float va = v[ia], vb = v[ib], c = cosv[i], s = sinv[i];
    v[ia] = __fmaf_rn(va, c, -__fmul_rn(vb, s));
    v[ib] = __fmaf_rn(va, s, __fmul_rn(vb, c));
  }
}

}  // namespace

cudaError_t LaunchRope(float* x, const RopeArgs& args, cudaStream_t stream) {
  if (args.n_tokens <= 0 || args.n_heads <= 0 || args.rot_dim <= 0) return cudaSuccess;
  const size_t smem = sizeof(float) * static_cast<size_t>(args.rot_dim);
  const int half = args.rot_dim / 2;
  const int heads_per_block = std::max(1, kRopeBlock / half);
  const dim3 grid(static_cast<unsigned>(args.n_tokens),
                  static_cast<unsigned>((args.n_heads + heads_per_block - 1) / heads_per_block));
  RopeKernel<<<grid, kRopeBlock, smem, stream>>>(x, args, heads_per_block);
  return cudaGetLastError();
}

}  // namespace pd::engine::cuda
