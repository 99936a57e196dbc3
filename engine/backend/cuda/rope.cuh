// Rotary position embeddings on the device, in place.
//
// Host-callable declaration only; safe to include from .cc files compiled by the host compiler.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace pd::engine::cuda {

struct RopeArgs {
  int n_tokens = 0;
  int n_heads = 0;
  int head_dim = 0;
  int rot_dim = 0;          // even, <= head_dim: the leading elements of each head that rotate
  bool neox = false;        // pairs (i, i + rot_dim / 2); else (2i, 2i + 1)
  float theta_scale = 0.f;  // powf(freq_base, -2 / rot_dim), computed on the host as the CPU does
  float freq_scale = 1.f;
  const int32_t* pos = nullptr;         // device [n_tokens]
  const float* freq_factors = nullptr;  // device [rot_dim / 2], or nullptr for none
};

// x: device F32 [n_tokens, n_heads * head_dim], rotated in place. Angles as the CPU backend builds
// them, bit for bit: theta_i = freq_scale * ((pos * theta_scale^i by repeated F32 products) /
// ff_i). Their cosines and sines come from sincosf (within 2 ulp; the CPU's cosf/sinf within 1).
// Every pair is rotated in NeoX's fused form, a' = fma(a, c, -(b s)), b' = fma(a, s, b c) (the CPU
// backend leaves some normal-mode pairs unfused, as GCC compiles ggml: one rounding apart).
// Enqueued on `stream`; returns the launch error.
cudaError_t LaunchRope(float* x, const RopeArgs& args, cudaStream_t stream);

}  // namespace pd::engine::cuda
