#include <cstdint>

#include "engine/backend/cuda/rope.cuh"

namespace pd::engine::cuda {
namespace {

constexpr int kRopeBlock = 128;

// One block per token. Thread i < rot_dim / 2 first builds angle i (i dependent F32 products: the
// same rounding chain as the CPU's running product, at most 255 products for head_dim 512) and
// its cosine and sine into shared memory; then the block rotates every (head, pair) of the token:
// 6 flops and 16 bytes moved per pair.
__global__ void RopeKernel(float* x, RopeArgs a) {
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
  const int pairs = a.n_heads * half;
  for (int idx = threadIdx.x; idx < pairs; idx += blockDim.x) {
    const int h = idx / half, i = idx % half;
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
  RopeKernel<<<args.n_tokens, kRopeBlock, smem, stream>>>(x, args);
  return cudaGetLastError();
}

}  // namespace pd::engine::cuda
