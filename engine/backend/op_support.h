// Which ops a kind of backend runs, known without a device. A model needs a fixed set of the
// Backend interface's ops (Model::OpsUsed); a backend that lacks one would fail the model's first
// forward, so the engine refuses such a model at load time naming every missing op.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/types/span.h"
#include "engine/quant/dtype.h"

namespace pd::engine {

// The kind of a backend from its name(): "cpu", or "cuda" for "cuda:0 (NVIDIA H200, sm_90)".
std::string_view BackendKind(std::string_view backend_name);

// Of `ops` (Backend method names, "Rope", "MatMul", ...) and the MatMul weight types
// `weight_types`, those that backend kind `kind` cannot run, each named: "Rope", "MatMul with w8a8
// weights". Empty when it runs them all. An unknown kind lacks every op. The CUDA kind's ops and
// weight types are cuda_ops.h's lists.
std::vector<std::string> MissingOps(std::string_view kind, absl::Span<const std::string_view> ops,
                                    absl::Span<const DType> weight_types);

}  // namespace pd::engine
