// The AVX2 + FMA + F16C kernel table (kernels.h). Its kernels live in one file per op family:
// matmul_avx2.cc (F32, F16, BF16, Q8_0, Q4_0 and Q5_0 tiles), k_quants_avx2.cc (Q2_K .. Q6_K
// tiles), convert_avx2.cc (row conversions), kv_i8_avx2.cc (INT8 KV rows), row_ops_avx2.cc
// (elementwise row ops), attention_avx2.cc (attention in ggml's order), w8a8_w4a16_avx2.cc, and
// grouped_avx2.cc (prompt GEMMs). Those files alone are compiled with -mavx2 -mfma -mf16c; their
// functions run only after SelectKernels() has checked the CPU. Their helpers are in anonymous
// namespaces and they call no inline function from shared headers: an inline function instantiated
// in one of them would be compiled with AVX2 and the linker could pick that copy for the whole
// program, which would then crash on a CPU without AVX2 (kernels_avx2_internal.h, which only they
// include, says how its helpers avoid this).
//
// Each kernel has a scalar twin in kernels_scalar.cc with the same contract; see kernels.h.
#include "engine/backend/cpu/kernels.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include "engine/backend/cpu/kernels_avx2_internal.h"

namespace pd::engine::cpu {
namespace {

constexpr Kernels kAvx2 = {
    .name = "avx2",
    .gemm = {&avx2::GemmF32, &avx2::GemmF16, &avx2::GemmBf16, &avx2::GemmQ8_0Dispatch,
             &avx2::GemmQ4_0Dispatch, &avx2::GemmQ2_K, &avx2::GemmQ3KDispatch, &avx2::GemmQ4_K,
             &avx2::GemmQ5_K, &avx2::GemmQ6_K, &avx2::GemmQ5_0Dispatch, &GemmW8A8Avx2,
             &GemmW4A16Avx2},
    .gemm_wide = {nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                  &avx2::GemmQ4_KWide, &avx2::GemmQ5_KWide, &avx2::GemmQ6_KWide, nullptr, nullptr,
                  nullptr},
    .q4_k_repack_gemm = &avx2::GemmQ4KRepackGemm,
    .q4_k_repack_gemv = &avx2::GemmQ4KRepackGemv,
    .q2_k_repack_gemm = &avx2::GemmQ2KRepackGemm,
    .q2_k_repack_gemv = &avx2::GemmQ2KRepackGemv,
    .q4_k_repack_gemv5 = &avx2::GemmQ4KRepackGemv5,
    .q6_k5 = &avx2::GemmQ6_K5,
    .f32_to_f16 = &avx2::F32ToF16,
    .f16_to_f32 = &avx2::F16ToF32,
    .f32_to_bf16 = &avx2::F32ToBf16,
    .bf16_to_f32 = &avx2::Bf16ToF32,
    .quantize_q8_0 = &avx2::QuantizeQ8_0,
    .dequantize_q8_0 = &avx2::DequantizeQ8_0,
    .quantize_q8_k = &avx2::QuantizeQ8_K,
    .quantize_w8a8 = &QuantizeRowW8A8Avx2,
    .quantize_kv_i8 = &avx2::QuantizeKvI8,
    .rotate_kv_row = &avx2::RotateKvRowAvx2,
    .quantize_kv_i8_f16 = &avx2::QuantizeKvI8F16,
    .dequantize_kv_i8_f16 = &avx2::DequantizeKvI8F16,
    .dot_i8_f32 = &avx2::DotI8F32,
    .axpy_i8 = &avx2::AxpyI8,
    .widen_i8 = &avx2::WidenI8,
    .sum_squares = &avx2::SumSquares,
    .scale = &avx2::Scale,
    .scale_mul = &avx2::ScaleMul,
    .add = &avx2::Add,
    .swiglu = &avx2::SwiGluGgml,
    .max = &avx2::Max,
    .exp_sub_sum = &avx2::ExpSubSum,
    .rope_neox = &avx2::RopeNeox,
    .rope_normal = &avx2::RopeNormal,
    .attn = &avx2::Avx2TableAttn,
};

}  // namespace

const Kernels* Avx2Kernels() { return &kAvx2; }

}  // namespace pd::engine::cpu

#else  // no AVX2 build

namespace pd::engine::cpu {
const Kernels* Avx2Kernels() { return nullptr; }
}  // namespace pd::engine::cpu

#endif
