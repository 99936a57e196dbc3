#include "tools/pdctl/engine_flags.h"

#include <optional>
#include <utility>

#include "common/status.h"
#include "common/strings.h"
#include "node/engine_builder.h"

namespace pd::tools {

absl::StatusOr<Engine> LoadEngine(const EngineFlags& f) {
  // The node runtime's engine construction (node/engine_builder.h): the same default model,
  // backend check and context rule as pd-serve and the cluster's nodes.
  node::EngineOptions eo;
  eo.model_path = f.model;
  eo.backend = f.backend;
  eo.threads = f.threads;
  eo.force_scalar = f.cpu_kernels == "scalar";
  eo.context = f.ctx;
  eo.gpu_layers = f.gpu_layers;
  eo.quantize = f.quantize;
  eo.kv_dtype = f.kv_type;
  PD_ASSIGN_OR_RETURN(node::Engine built, node::BuildEngine(eo));
  Engine e;
  e.model_path = built.model_path;
  e.kernels = built.kernels;
  e.backend = std::move(built.backend);
  e.host_backend = std::move(built.host_backend);
  e.file = std::move(built.file);
  e.model = std::move(built.model);
  const int ctx = built.context;
  const int block = 16;
  const int n_blocks = (ctx + block - 1) / block;
  const std::optional<engine::KvDType> kv_type = engine::ParseKvDType(f.kv_type);
  if (!kv_type) return absl::InvalidArgumentError(pd::StrCat("unknown --kv-type ", f.kv_type));
  PD_ASSIGN_OR_RETURN(e.kv,
                      engine::KvCache::Create(e.model->KvOptions(n_blocks, *kv_type),
                                              e.model->LayerBackends()));
  return e;
}

}  // namespace pd::tools
