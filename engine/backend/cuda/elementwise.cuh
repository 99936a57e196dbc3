// Elementwise ops on the device: Add, AddBias, SwiGlu, GeGlu, Scale, Softcap and MoeCombine over
// F32 arrays.
//
// Host-callable declarations only; safe to include from .cc files compiled by the host compiler.
// All arrays are device F32, contiguous; y may alias any input (each element is read before it is
// written, by the same thread). Each launcher enqueues on `stream` and returns the launch error.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace pd::engine::cuda {

// y = a + b, n elements. Bit-exact with the CPU backend.
cudaError_t LaunchAdd(const float* a, const float* b, int64_t n, float* y, cudaStream_t stream);

// y[r, c] = x[r, c] + bias[c] for rows x cols. Bit-exact with the CPU backend.
cudaError_t LaunchAddBias(const float* x, const float* bias, int64_t rows, int64_t cols, float* y,
                          cudaStream_t stream);

// y = g / (1 + exp(-g)) * u, n elements (expf within 2 ulp; the CPU uses ggml's vector expf).
cudaError_t LaunchSwiGlu(const float* g, const float* u, int64_t n, float* y, cudaStream_t stream);

// y = gelu(g) * u with the tanh GELU evaluated as ggml's f16 table holds it: 0 for g <= -10, g for
// g >= 10, else gelu of g rounded to f16, computed in F32 and rounded to f16 again.
cudaError_t LaunchGeGlu(const float* g, const float* u, int64_t n, float* y, cudaStream_t stream);

// y = s * x, n elements. Bit-exact with the CPU backend.
cudaError_t LaunchScale(const float* x, float s, int64_t n, float* y, cudaStream_t stream);
// y = tanhf(x * (1 / cap)) * cap (CUDA's tanhf: within 2 ulp of the CPU backend's libm).
cudaError_t LaunchSoftcap(const float* x, float cap, int64_t n, float* y, cudaStream_t stream);
// y[r, c] = sum over j < k, in order, of weights[r * k + j] * rows[index[r * k + j], c], each
// product and sum rounded separately (Backend::MoeCombine), for n_out rows of `cols`. index and
// weights are device arrays of n_out * k entries, every index a row of `rows`; y must not alias
// rows. Bit-exact with the CPU backend.
cudaError_t LaunchMoeCombine(const float* rows, int64_t cols, const int32_t* index,
                             const float* weights, int64_t n_out, int k, float* y,
                             cudaStream_t stream);

}  // namespace pd::engine::cuda
