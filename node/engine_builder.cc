#include "node/engine_builder.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "common/status.h"
#include "common/strings.h"
#include "engine/backend/cpu/kernels.h"
#include "engine/backend/kv_layout.h"
#include "engine/model/model_finder.h"

namespace pd::node {

absl::StatusOr<Engine> BuildEngine(const EngineOptions& options) {
  if (options.backend != "cpu" && options.backend != "cuda") {
    return absl::InvalidArgumentError(
        StrCat("backend: must be cpu or cuda (got '", options.backend, "')"));
  }
  Engine e;
  e.model_path = options.model_path;
  if (e.model_path.empty()) {
    PD_ASSIGN_OR_RETURN(e.model_path, engine::FindDefaultModel());
  }
  PD_ASSIGN_OR_RETURN(e.file, engine::GgufFile::Open(e.model_path));
  PD_RETURN_IF_ERROR(engine::Model::CheckBackend(*e.file, options.backend));
  if (options.backend == "cuda") {
    PD_ASSIGN_OR_RETURN(e.backend, engine::CreateCudaBackend(0));
    e.kernels = "cuda";
  } else {
    PD_RETURN_IF_ERROR(engine::cpu::CpuIsaCapFromEnv().status());
    engine::CpuBackendOptions cpu;
    cpu.threads = options.threads;
    cpu.force_scalar = options.force_scalar;
    e.backend = engine::CreateCpuBackend(cpu);
    e.kernels = std::string(
        engine::cpu::KernelSetName(engine::cpu::SelectKernels(options.force_scalar)));
  }
  PD_ASSIGN_OR_RETURN(e.model, engine::Model::Load(e.file, *e.backend));
  e.context =
      options.context > 0 ? options.context : engine::DefaultContext(e.model->config().n_ctx_train);
  return e;
}

EngineOptions EngineOptionsFrom(const ServeOptions& o) {
  EngineOptions e;
  e.model_path = o.model.path;
  e.backend = o.model.backend;
  e.threads = o.threads;
  e.context = o.model.context;
  return e;
}

absl::StatusOr<ServingEngine> BuildServingEngine(const ServeOptions& o,
                                                 frontend::ServingMetrics* metrics) {
  std::optional<engine::KvDType> kv_dtype = engine::ParseKvDType(o.kv.dtype);
  if (!kv_dtype) return absl::InvalidArgumentError(StrCat("kv.dtype: unknown '", o.kv.dtype, "'"));
  PD_ASSIGN_OR_RETURN(Engine built, BuildEngine(EngineOptionsFrom(o)));
  engine::SchedulerOptions so;
  so.kv_bytes = o.kv.memory_mib << 20;
  so.block_size = o.kv.block_size;
  so.kv_dtype = *kv_dtype;
  so.prefix_cache.enabled = o.prefix_cache.enabled;
  so.prefix_cache.min_free_blocks = o.prefix_cache.min_free_blocks;
  so.prefix_cache.summary_blocks = o.prefix_cache.summary_blocks;
  so.prefix_cache.compress_idle_ms = o.prefix_cache.compress_idle_ms;
  so.max_running_seqs = o.scheduler.max_running_seqs;
  so.max_waiting = o.scheduler.max_waiting;
  so.max_total_tokens = o.scheduler.max_total_tokens;
  so.token_budget = o.scheduler.token_budget;
  so.chunked_prefill = o.scheduler.chunked_prefill;
  so.prefill_chunk = o.scheduler.prefill_chunk;
  so.step_time_stretch = o.scheduler.step_time_stretch;
  so.prefill_pace_steps = o.scheduler.prefill_pace_steps;
  so.min_prefill_chunk = o.scheduler.min_prefill_chunk;
  so.enable_priority = o.scheduler.priority;
  so.max_context = built.context;
  if (metrics != nullptr) {
    so.step_observer = [metrics](const engine::StepStats& s) {
      metrics->Step(frontend::StepStats{s.prefill_tokens, s.decode_tokens, s.seconds});
      metrics->Load(s.load);
    };
  }
  ServingEngine e;
  e.backend = std::move(built.backend);
  e.file = std::move(built.file);
  e.model_path = std::move(built.model_path);
  e.kernels = std::move(built.kernels);
  PD_ASSIGN_OR_RETURN(e.scheduler, engine::Scheduler::Create(std::move(built.model), so));
  return e;
}

}  // namespace pd::node
