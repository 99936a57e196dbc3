// The Q8_0 block format and scalar row conversions (F32 <-> F16 / BF16 / Q8_0).
//
// Q8_0 is bit-exact with GGUF/ggml's block_q8_0: 32 weights share one f16 scale d, and each
// weight is stored as an int8 q with x ~= d * q. Quantization follows ggml's reference
// quantizer: d = amax / 127, q = roundf(x * (1 / d)) (round half away from zero), so that a row
// quantized here reproduces the bytes llama-quantize writes. Matmul activations use
// QuantizeRowQ8_0Act instead (ggml-cpu's x86 activation quantizer; see below).
//
// These functions are the portable reference; SIMD versions live in engine/backend/cpu and are
// tested against them. All functions are pure and thread-safe.
#pragma once

#include <cstdint>

namespace pd::engine {

inline constexpr int kQ8_0BlockSize = 32;

struct BlockQ8_0 {
  uint16_t d;     // f16 scale (IEEE binary16 bits)
  int8_t qs[32];  // quants; the reference quantizer yields [-127, 127], files may hold -128
};
static_assert(sizeof(BlockQ8_0) == 34, "BlockQ8_0 must match ggml's block_q8_0 (34 bytes)");

// Quantizes n floats (n % 32 == 0, PD_CHECKed) into n / 32 blocks.
void QuantizeRowQ8_0(const float* x, BlockQ8_0* y, int64_t n);
// Matmul activations (the CPU backend's quantize_q8_0 in every kernel table): the quantizer of
// ggml-cpu's x86 quantize_row_q8_0 (ggml/src/ggml-cpu/arch/x86/quants.c, AVX/AVX2 branch), which
// llama.cpp uses for activations, not the reference above: amax as above, d = amax / 127 stored
// as f16, but q = x * id with id = 127 / amax (not 1 / d) rounded half to even (_mm256_round_ps
// _MM_ROUND_NEAREST), so that activation codes match llama.cpp's exactly.
void QuantizeRowQ8_0Act(const float* x, BlockQ8_0* y, int64_t n);
// Expands n / 32 blocks into n floats: y = f32(d) * q.
void DequantizeRowQ8_0(const BlockQ8_0* x, float* y, int64_t n);

// Elementwise conversions of n values (round-to-nearest-even when narrowing; see fp16.h).
void F32ToF16Row(const float* x, uint16_t* y, int64_t n);
void F16ToF32Row(const uint16_t* x, float* y, int64_t n);
void F32ToBf16Row(const float* x, uint16_t* y, int64_t n);
void Bf16ToF32Row(const uint16_t* x, float* y, int64_t n);

}  // namespace pd::engine
