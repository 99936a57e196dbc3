// What the CUDA backend runs, as data that host code can read without a device: the node
// runtime refuses at start a model that needs an op missing here (op_support.h), instead of
// failing on its first forward. cuda_backend.cc answers UNIMPLEMENTED for everything else and
// takes its MatMul weight types from here; an op added there is added to this list.
//
// Limits within the listed ops (UNIMPLEMENTED at call time, not known per model): GetRows reads
// the tables of kMatMulWeightTypes only; Attention needs K and V caches of one type and
// head_dim <= 512.
#pragma once

#include <array>
#include <string_view>

#include "engine/quant/dtype.h"

namespace pd::engine::cuda {

// Ops of the Backend interface that the CUDA backend implements: all of them (MatMulRowOrder is
// MatMul there; MatMulGroup is MatMul per weight, or one quantization and grouped int8 GEMVs).
inline constexpr std::array<std::string_view, 15> kImplementedOps = {
    "MatMul",  "GetRows", "RmsNorm", "Rope",      "Add",  "AddBias",   "SwiGlu", "GeGlu",
    "Scale",   "Softcap", "Softmax", "MoeCombine", "StoreKv", "Attention", "TopK"};
// Weight types its MatMul multiplies (the row-order flags of MatMulRowOrder name CPU summation
// orders and are ignored).
inline constexpr std::array<DType, 11> kMatMulWeightTypes = {
    DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ8_0, DType::kQ4_0, DType::kQ5_0,
    DType::kQ2_K, DType::kQ3_K, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

}  // namespace pd::engine::cuda
