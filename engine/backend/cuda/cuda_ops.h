// What the CUDA backend runs today, as data that host code can read without a device: the node
// runtime refuses at start a model that needs an op missing here (op_support.h), instead of
// failing on its first forward. cuda_backend.cc answers UNIMPLEMENTED for everything else and
// takes its MatMul weight types from here; an op added there is added to this list.
#pragma once

#include <array>
#include <string_view>

#include "engine/quant/dtype.h"

namespace pd::engine::cuda {

// Ops of the Backend interface that the CUDA backend implements.
inline constexpr std::array<std::string_view, 2> kImplementedOps = {"MatMul", "RmsNorm"};
// Weight types its MatMul multiplies.
inline constexpr std::array<DType, 2> kMatMulWeightTypes = {DType::kF32, DType::kF16};

}  // namespace pd::engine::cuda
