// The quantized GEMV on int8 activations ("int8 GEMV"): the activations are first quantized on
// the device exactly as the CPU backend quantizes them (Q8_K blocks of 256 for the k-quants, Q8_0
// blocks of 32 for Q8_0 weights), then each weight block's codes are dotted with the int8 codes
// four at a time (DP4A) and scaled once per block. Against matmul_quant.cu's F32 GEMV this cuts
// the work per weight byte several times (no int-to-float conversion per weight, one integer
// instruction per four products), which is what bounds that kernel on an H200 (docs/cuda.md);
// and since the CPU backend dots the same quantized activations, the two backends then differ
// only by the order of float additions.
//
// The default since it passed and was timed on an H200 (2026-12-04,
// bench/results/gpu_2026-12-04.md); PDSERVE_CUDA_GEMV=f32 selects the F32 GEMV instead, per backend
// at start-up (cuda_backend.cc).
//
// Host-callable declarations only; safe to include from .cc files compiled by the host compiler.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "engine/backend/cuda/quant_blocks.cuh"

namespace pd::engine::cuda {

// How a weight format's int8 GEMV wants its activations quantized.
enum class ActQuant {
  kQ8_0,  // per 32 values: d = f16(amax / 127), q = nearest-even(x * 127 / amax) (q8_0.h)
  kQ8_K,  // per 256 values: ggml's reference Q8_K (k_quants.h), plus the sum of q per 32
};

// The weight formats with an int8 GEMV (Q4_K, Q6_K, Q8_0: what Q4_K_M, Q6_K and Q8_0 files of
// Llama-shaped models are made of) and the activations each reads; false for the others.
bool Q8ActGemvFormat(WeightFormat format, ActQuant* act);

// Whether the int8 GEMV can read `format` weights at `w` with rows of `row_bytes`: Q4_K's codes
// are read 16 bytes at a time (w and row_bytes 16-byte aligned), Q6_K's and Q8_0's 2 at a time.
bool Q8ActGemvAligned(WeightFormat format, const void* w, size_t row_bytes);

// The quantized activations of n rows of k values, in one device buffer: the codes (int8 [n][k])
// at offset 0, the block scales (F32 [n][k / block]) at d_offset, and for kQ8_K the sums of the
// codes over each 32 values (int32 [n][k / 32]) at s_offset; `bytes` in all.
struct Q8ActLayout {
  size_t d_offset = 0, s_offset = 0, bytes = 0;
};
Q8ActLayout Q8ActLayoutFor(ActQuant act, int n, int k);

// Quantizes x (device F32 [n, k]; k a multiple of 256 for kQ8_K, of 32 for kQ8_0) into `out`
// (device, Q8ActLayoutFor(act, n, k).bytes, 16-byte aligned). Bit-exact with the CPU's
// quantizers. Enqueued on `stream`.
cudaError_t LaunchQuantizeAct(ActQuant act, const float* x, int n, int k, void* out,
                              cudaStream_t stream);

// y[r, i] = sum over blocks of w row i's block dotted with x row r's quantized block, for
// r < n <= kMaxGemvRows, i < m: the integer dot of each block (sub-block scales applied in
// integers) times the weight's and the activation's block scales, accumulated in F32 along a
// lane and across the warp. w: device [m, k] in `format` (Q8ActGemvFormat), rows of `row_bytes`
// (Q8ActGemvAligned); xq: LaunchQuantizeAct's output for the format's ActQuant; y: device F32
// [n, m]. Enqueued on `stream`.
cudaError_t LaunchQuantGemvQ8Act(WeightFormat format, const void* w, size_t row_bytes, int m, int k,
                                 const void* xq, int n, float* y, cudaStream_t stream);

// One weight of a grouped int8 GEMV: w [m, k] with rows of row_bytes, its outputs y [n, m].
struct Q8ActGemvPart {
  const void* w = nullptr;
  size_t row_bytes = 0;
  int m = 0;
  float* y = nullptr;
};
inline constexpr int kMaxGemvParts = 4;

// LaunchQuantGemvQ8Act for `count` (1 .. kMaxGemvParts) weights of one format over the same
// quantized activations, in one launch: Q, K and V (or gate and up) of a decode step cost one
// launch, and the grid of their rows together fills the GPU where one 4096-row weight leaves it
// short. Each output has the bits LaunchQuantGemvQ8Act gives it alone (the same code per row).
cudaError_t LaunchQuantGemvQ8ActGroup(WeightFormat format, const Q8ActGemvPart* parts, int count,
                                      int k, const void* xq, int n, cudaStream_t stream);

}  // namespace pd::engine::cuda
