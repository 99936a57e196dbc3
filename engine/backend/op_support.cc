#include "engine/backend/op_support.h"

#include <algorithm>

#include "common/strings.h"
#include "engine/backend/cuda/cuda_ops.h"
#include "engine/quant/dtype.h"

namespace pd::engine {

std::string_view BackendKind(std::string_view backend_name) {
  return backend_name.substr(0, backend_name.find(':'));
}

std::vector<std::string> MissingOps(std::string_view kind, absl::Span<const std::string_view> ops,
                                    absl::Span<const DType> weight_types) {
  std::vector<std::string> missing;
  if (kind == "cpu") return missing;  // every op, every weight type (the reference backend)
  const bool cuda = kind == "cuda";
  const auto has = [](const auto& list, const auto& x) {
    return std::find(list.begin(), list.end(), x) != list.end();
  };
  for (std::string_view op : ops) {
    if (!cuda || !has(cuda::kImplementedOps, op)) missing.emplace_back(op);
  }
  const bool matmul = has(ops, std::string_view("MatMul"));
  for (DType t : weight_types) {
    if (matmul && cuda && !has(cuda::kMatMulWeightTypes, t)) {
      std::string name = StrCat("MatMul with ", Traits(t).name, " weights");
      if (!has(missing, name)) missing.push_back(std::move(name));
    }
  }
  return missing;
}

}  // namespace pd::engine
