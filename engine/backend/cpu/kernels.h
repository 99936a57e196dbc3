// The CPU backend's kernel table: the inner loops every op is built from.
//
// There is one table per instruction set: ScalarKernels() is the portable reference and
// Avx2Kernels() the AVX2+FMA+F16C version (nullptr when not compiled in). Tests run both on the
// same inputs and compare (tests/engine/backend/cpu_kernels_test.cc), so every SIMD entry has a
// scalar twin with the same contract. All kernels are pure functions of their arguments and
// thread-safe; none allocates.
//
// Pointers need no particular alignment. Lengths are element counts; Q8_0 and Q4_0 lengths must
// be multiples of 32, k-quant and Q8_K lengths multiples of 256, W8A8 of 32 (rows carry a 16-byte
// header) and W4A16 of 128 (callers check).
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/quant/k_quants.h"
#include "engine/quant/q5_0.h"
#include "engine/quant/q8_0.h"
#include "engine/quant/w4a16.h"
#include "engine/quant/w8a8.h"

namespace pd::engine::cpu {

// Weight types MatMul runs, indexing Kernels::gemm. Each names the weight type; the activation
// ("companion", ggml's vec_dot_type) type is the weight's own for F32/F16/BF16/Q8_0, Q8_0 for
// Q4_0 and Q8_K for the k-quants.
enum class GemmType : int {
  kF32 = 0,
  kF16 = 1,
  kBF16 = 2,
  kQ8_0 = 3,
  kQ4_0 = 4,  // x: BlockQ8_0
  kQ2_K = 5,  // x: BlockQ8_K (and the rest)
  kQ3_K = 6,
  kQ4_K = 7,
  kQ5_K = 8,
  kQ6_K = 9,
  kQ5_0 = 10,  // x: BlockQ8_0
  kW8A8 = 11,   // x: W8A8 rows (per-token INT8, w8a8.h)
  kW4A16 = 12,  // x: F32
};
inline constexpr int kNumGemmTypes = 13;

// The largest tile a GemmTileFn computes: kGemmTileW weight rows x kGemmTileX activation rows.
inline constexpr int kGemmTileW = 4;
inline constexpr int kGemmTileX = 4;

// Computes an nr x nc tile of y = x w^T, where w holds rows of k elements in the weight's type and
// x rows of k elements in its companion type (activations already converted: F32, F16 bits, BF16
// bits, BlockQ8_0 or BlockQ8_K):
//   y[c * y_stride + r] = dot(w + r * w_stride, x + c * x_stride)   for r < nr, c < nc
// with 1 <= nr <= kGemmTileW, 1 <= nc <= kGemmTileX; strides of w and x are in bytes, of y in
// floats. Each weight row is read once per tile and each activation row once per tile, so a
// 4x4 tile does 16 row-dots for 8 row reads.
using GemmTileFn = void (*)(int64_t k, const void* w, size_t w_stride, int nr, const void* x,
                            size_t x_stride, int nc, float* y, int64_t y_stride);

// The AVX512-VNNI Q8_0 and Q5_0 (x Q8_0) tiles (avx512_vnni.cc), bit-identical to the AVX2
// table's; nullptr when the CPU lacks AVX512F/VL/VNNI or PDSERVE_CPU_NO_VNNI is set (non-empty,
// not "0"). The AVX2 table's Q8_0 and Q5_0 entries call them when present.
GemmTileFn Q8_0TileVnni();
GemmTileFn Q5_0TileVnni();
// Q8_0 or Q5_0 weights x many Q8_0 activation rows (batched decode, prompts) on 512-bit VPDPBUSD
// with 16 activation rows per register (avx512_vnni.cc): `pack_x` lays out n activation rows once
// per MatMul (x_bytes(n, k) bytes, 64-byte aligned); `pack_w` (Q5_0 only) unpacks a chunk of
// weight rows (w_bytes(rows, k) bytes); `gemm` writes y[c * y_stride + r] for the chunk's rows r
// and all n columns c. Results equal the AVX2 (and VNNI) tiles' bit for bit. nullptr without
// AVX512-VNNI (or with PDSERVE_CPU_NO_VNNI set).
struct GroupedKernels {
  size_t (*x_bytes)(int64_t n, int64_t k);
  void (*pack_x)(const void* x, size_t x_stride, int64_t n, int64_t k, void* out);
  // nullptr: `gemm` reads the weight blocks in place (Q8_0).
  size_t (*w_bytes)(int64_t rows, int64_t k);
  void (*pack_w)(const void* w, size_t w_stride, int64_t rows, int64_t k, void* out);
  // `w`: the packed chunk (w_stride ignored) or, without pack_w, the rows themselves.
  void (*gemm)(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* packed_x,
               int64_t n, float* y, int64_t y_stride);
};
const GroupedKernels* Q8_0GroupedVnni();
const GroupedKernels* Q5_0GroupedVnni();
// The AVX2 table's Q8_0 and Q5_0 tiles without the VNNI dispatch (tests compare the two).
void GemmQ8_0Avx2(int64_t k, const void* w, size_t w_stride, int nr, const void* x,
                  size_t x_stride, int nc, float* y, int64_t y_stride);
void GemmQ5_0Avx2(int64_t k, const void* w, size_t w_stride, int nr, const void* x,
                  size_t x_stride, int nc, float* y, int64_t y_stride);

// AVX2 dot of Q5_0 weight blocks with Q8_0 activation blocks (q5_0_avx2.cc); only called when the
// CPU has AVX2 + FMA + F16C.
float DotQ5_0Q8_0Avx2(const BlockQ5_0* w, const BlockQ8_0* x, int64_t n);

// AVX2 kernels of pdserve's own formats (w8a8_w4a16_avx2.cc); only called when the CPU has
// AVX2 + FMA + F16C. GemmTileFn contracts; see the table entries below for their numerics.
void GemmW8A8Avx2(int64_t k, const void* w, size_t w_stride, int nr, const void* x,
                  size_t x_stride, int nc, float* y, int64_t y_stride);
void GemmW4A16Avx2(int64_t k, const void* w, size_t w_stride, int nr, const void* x,
                   size_t x_stride, int nc, float* y, int64_t y_stride);
// Bit-exact with QuantizeRowW8A8.
void QuantizeRowW8A8Avx2(const float* x, void* y, int64_t n);

struct Kernels {
  const char* name;  // "scalar", "avx2"

  // MatMul tiles, by GemmType. F32: F32 dot in F32. F16/BF16: products of halves accumulated in
  // F32. Q8_0 and Q4_0 (x Q8_0): int32 dot per 32-block times d_w * d_x, accumulated in F32.
  // k-quants (x Q8_K): per 256-block an exact int32 sum of sub-block scale times the sub-block's
  // int32 dot (and, for Q2_K/Q4_K/Q5_K, an int32 sum of sub-block min times the activations'
  // bsums), then times d_w * d_x (and dmin_w * d_x), accumulated in F32 (see kernels_scalar.cc).
  // The tables differ only in the order of the F32 additions, never in the integer parts.
  // W8A8 (x W8A8 activation rows): the whole row's exact integer dot times f32(d_w * d_x), so
  // every table gives the same bits (k <= kW8A8MaxCols). W4A16 (x F32): dequantized weights
  // (float(u - 8) * d) times f32 activations, summed in F32; tables differ in summation order
  // (measured bound in tests/engine/backend/pd_format_kernels_test.cc).
  GemmTileFn gemm[kNumGemmTypes];

  // Row conversions (used to convert activations once per MatMul, for GetRows and the KV cache).
  // Narrowing conversions round to nearest even; Q8_0 quantization is QuantizeRowQ8_0Act's
  // (ggml-cpu x86's activation quantizer; bit-exact in every table).
  void (*f32_to_f16)(const float* x, uint16_t* y, int64_t n);
  void (*f16_to_f32)(const uint16_t* x, float* y, int64_t n);
  void (*f32_to_bf16)(const float* x, uint16_t* y, int64_t n);
  void (*bf16_to_f32)(const uint16_t* x, float* y, int64_t n);
  void (*quantize_q8_0)(const float* x, BlockQ8_0* y, int64_t n);
  void (*dequantize_q8_0)(const BlockQ8_0* x, float* y, int64_t n);
  // Activations for k-quant weights: bit-exact with QuantizeRow<BlockQ8_K> (k_quants.h) in every
  // table, bsums included.
  void (*quantize_q8_k)(const float* x, BlockQ8_K* y, int64_t n);
  // Activations for W8A8 weights, one row per token: bit-exact with QuantizeRowW8A8 (w8a8.h).
  void (*quantize_w8a8)(const float* x, void* y, int64_t n);

  // Attention inner loops: dot of an F32 query with an F32 / F16 key row, and y += a * v for an
  // F32 / F16 value row.
  float (*dot_f32)(const float* a, const float* b, int64_t n);
  float (*dot_f16_f32)(const uint16_t* a, const float* b, int64_t n);
  void (*axpy_f32)(float a, const float* x, float* y, int64_t n);
  void (*axpy_f16)(float a, const uint16_t* x, float* y, int64_t n);
  // INT8 KV cache (engine/backend/kv_layout.h). quantize_kv_i8 quantizes one token's head of n
  // finite values: returns scale = max|x| / 127 and writes q = round_half_even(x * (1 / scale)),
  // clamped to [-127, 127] (all zeros when scale is 0); bit-exact in every table. dot_i8_f32 is
  // the unscaled dot of int8 key values with an F32 query (the caller multiplies by the key's
  // scale); axpy_i8 is y += a * q (the caller folds the value's scale into a).
  float (*quantize_kv_i8)(const float* x, int8_t* q, int64_t n);
  float (*dot_i8_f32)(const int8_t* a, const float* b, int64_t n);
  void (*axpy_i8)(float a, const int8_t* x, float* y, int64_t n);

  // Elementwise row ops (y may alias an input).
  double (*sum_squares)(const float* x, int64_t n);  // products in F32, summed in F64 (ggml)
  void (*scale)(const float* x, float s, float* y, int64_t n);                      // y = s * x
  void (*scale_mul)(const float* x, float s, const float* w, float* y, int64_t n);  // (s*x)*w
  void (*add)(const float* a, const float* b, float* y, int64_t n);
  void (*swiglu)(const float* g, const float* u, float* y, int64_t n);  // g/(1+exp(-g)) * u
  float (*max)(const float* x, int64_t n);                              // -inf when n == 0
  // y = exp(x - m); returns the sum of y in F64.
  double (*exp_sub_sum)(const float* x, float m, float* y, int64_t n);
};

const Kernels& ScalarKernels();
// The AVX2+FMA+F16C table, or nullptr when this build has none (non-x86). Only call its entries
// when the CPU supports those instructions (see SelectKernels).
const Kernels* Avx2Kernels();
// Avx2Kernels() when compiled in, not `force_scalar`, and the CPU reports avx2, fma and f16c;
// otherwise ScalarKernels().
const Kernels& SelectKernels(bool force_scalar);

}  // namespace pd::engine::cpu
