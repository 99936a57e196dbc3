#include "node/engine_builder.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <utility>

#include "common/log.h"
#include "common/status.h"
#include "common/strings.h"
#include "engine/backend/cpu/kernels.h"
#include "engine/backend/device_info.h"
#include "engine/backend/kv_layout.h"
#include "engine/convert/hf_convert.h"
#include "engine/model/model_finder.h"
#include "engine/model/vocab_match.h"
#include "engine/quant/quantize/draft_model.h"
#include "engine/quant/quantize/policy.h"
#include "engine/quant/quantize/progress.h"
#include "engine/quant/quantize/quantize_model.h"
#include "engine/runtime/placement.h"
#include "engine/runtime/planner.h"
#include "engine/spec/draft_model.h"
#include "engine/spec/ngram.h"
#include "engine/spec/self_head.h"

namespace pd::node {
namespace {

// The GPU layers `options.gpu_layers` asks for: every layer, a count, or the planner's fit to the
// device's free memory (less a tenth for the CUDA context and fragmentation), for a KV cache of
// `kv_dtype` (options.kv_dtype, parsed by BuildEngine).
absl::StatusOr<int> GpuLayers(const EngineOptions& options, const engine::GgufFile& file,
                              const engine::ModelConfig& c, int context, engine::KvDType kv_dtype) {
  int n = c.n_layer;
  if (options.gpu_layers != "all" && options.gpu_layers != "auto") {
    if (options.gpu_layers.empty() ||
        options.gpu_layers.find_first_not_of("0123456789") != std::string::npos ||
        options.gpu_layers.size() > 6 || (n = std::stoi(options.gpu_layers)) > c.n_layer) {
      return absl::InvalidArgumentError(StrCat("gpu_layers: must be all, auto or a count in [0, ",
                                               c.n_layer, "] (got '", options.gpu_layers, "')"));
    }
  }
  PD_ASSIGN_OR_RETURN(const engine::CudaDeviceInfo dev, engine::GetCudaDeviceInfo(0));
  engine::PlanRequest req;
  req.gpu_bytes = dev.free_bytes / 10 * 9;
  req.ctx = context;
  req.kv_type = kv_dtype;
  const size_t one_seq = engine::LayerKvBytes(c, context, kv_dtype, 16) * c.n_layer;
  req.batch = options.kv_bytes > 0
                  ? std::max<int>(1, static_cast<int>(static_cast<size_t>(options.kv_bytes) /
                                                      std::max<size_t>(one_seq, 1)))
                  : 1;
  const engine::ModelFootprint footprint = engine::FootprintOf(file, c);
  if (options.gpu_layers != "auto") {
    // A fixed count: refuse at start, with the numbers, what the GPU cannot hold.
    PD_ASSIGN_OR_RETURN(const engine::Plan fixed, engine::PlanFixed(c, footprint, req, n));
    if (fixed.gpu_total() > req.gpu_bytes) {
      return absl::ResourceExhaustedError(StrCat(
          n, " of ", c.n_layer, " layers need ", fixed.gpu_total() >> 20, " MiB on ", dev.name,
          " (weights ", fixed.gpu_weight_bytes >> 20, ", KV ", fixed.gpu_kv_bytes >> 20,
          ", buffers ", (fixed.activation_bytes + fixed.workspace_bytes) >> 20, "); ",
          req.gpu_bytes >> 20, " MiB are free to use: set gpu_layers: auto (or fewer), a "
          "smaller context or KV budget (`pdctl plan` shows the options)"));
    }
    return n;
  }
  absl::StatusOr<engine::Plan> plan = engine::PlanOffload(c, footprint, req);
  if (!plan.ok()) {
    return absl::Status(plan.status().code(),
                        StrCat("gpu_layers auto on ", dev.name, ": ", plan.status().message()));
  }
  PD_LOG(kInfo, "gpu_layers auto: ", plan->gpu_layers, " of ", c.n_layer, " layers fit in ",
         req.gpu_bytes >> 20, " MiB of ", dev.name, " (", plan->gpu_total() >> 20, " MiB used)");
  return plan->gpu_layers;
}

}  // namespace

namespace {

// The model quantized to options.quantize by pdserve's quantizer, kept in memory.
absl::StatusOr<std::shared_ptr<engine::GgufFile>> QuantizeAtLoad(const std::string& path,
                                                                 const EngineOptions& options) {
  namespace q = engine::quantize;
  absl::StatusOr<engine::DType> type = q::ParseTypeName(options.quantize);
  if (!type.ok()) {
    return absl::InvalidArgumentError(StrCat("quantize: ", type.status().message()));
  }
  q::QuantizeOptions qo;
  qo.input = path;  // qo.output "": in memory
  qo.type = *type;
  qo.threads = options.threads;
  qo.open_input = engine::OpenModelFile;
  PD_LOG(kInfo, "quantizing ", path, " to ", options.quantize, " at load");
  std::unique_ptr<q::Progress> progress = q::MakeQuietProgress();
  absl::StatusOr<q::QuantizeReport> r = q::QuantizeModel(qo, *progress);
  if (!r.ok()) {
    return absl::Status(r.status().code(),
                        StrCat("quantize ", options.quantize, " at load: ", r.status().message()));
  }
  PD_LOG(kInfo, "quantized at load: ", r->bpw, " bits per weight, ", r->file_bytes >> 20, " MiB");
  return r->model;
}

}  // namespace

absl::StatusOr<Engine> BuildEngine(const EngineOptions& options) {
  if (options.backend != "cpu" && options.backend != "cuda") {
    return absl::InvalidArgumentError(
        StrCat("backend: must be cpu or cuda (got '", options.backend, "')"));
  }
  Engine e;
  const std::optional<engine::KvDType> kv_dtype = engine::ParseKvDType(options.kv_dtype);
  if (!kv_dtype) {
    return absl::InvalidArgumentError(StrCat("kv.dtype: unknown '", options.kv_dtype, "'"));
  }
  // The engine's one cache type: over F16 / INT8 the head may be laid out for the own order.
  engine::Model::LoadOptions load;
  load.no_f32_cache = *kv_dtype != engine::KvDType::kF32;
  e.model_path = options.model_path;
  if (e.model_path.empty()) {
    PD_ASSIGN_OR_RETURN(e.model_path, engine::FindDefaultModel());
  }
  if (options.quantize.empty()) {
    PD_ASSIGN_OR_RETURN(e.file, engine::OpenModelFile(e.model_path));
  } else {
    PD_ASSIGN_OR_RETURN(e.file, QuantizeAtLoad(e.model_path, options));
  }
  PD_RETURN_IF_ERROR(engine::Model::CheckBackend(*e.file, options.backend));
  if (options.gpu_layers != "all" && options.backend != "cuda") {
    return absl::InvalidArgumentError(StrCat("gpu_layers '", options.gpu_layers,
                                             "' needs backend cuda (the backend is ",
                                             options.backend, ")"));
  }
  const auto make_cpu = [&]() -> absl::StatusOr<std::unique_ptr<engine::Backend>> {
    PD_RETURN_IF_ERROR(engine::cpu::CpuIsaCapFromEnv().status());
    engine::CpuBackendOptions cpu;
    cpu.threads = options.threads;
    cpu.force_scalar = options.force_scalar;
    PD_ASSIGN_OR_RETURN(cpu.copy_weights, engine::CpuCopyWeightsFromEnv());
    PD_RETURN_IF_ERROR(engine::CpuAttnGgmlOrderFromEnv().status());
    return engine::CreateCpuBackend(cpu);
  };
  if (options.backend == "cuda") {
    PD_ASSIGN_OR_RETURN(const engine::ModelConfig c, engine::ModelConfig::FromGguf(*e.file));
    const int context =
        options.context > 0 ? options.context : engine::DefaultContext(c.n_ctx_train);
    PD_ASSIGN_OR_RETURN(const int gpu_layers, GpuLayers(options, *e.file, c, context, *kv_dtype));
    PD_ASSIGN_OR_RETURN(e.backend, engine::CreateCudaBackend(0));
    e.kernels = "cuda";
    if (gpu_layers < c.n_layer) {
      PD_ASSIGN_OR_RETURN(e.host_backend, make_cpu());
      e.kernels = StrCat("cuda + ", engine::cpu::KernelSetName(
                                        engine::cpu::SelectKernels(options.force_scalar)));
      engine::Backend* const backends[] = {e.backend.get(), e.host_backend.get()};
      const engine::LayerPlacement placement = engine::LayerPlacement::Offload(c.n_layer, gpu_layers);
      e.placement = placement.Describe({std::string(e.backend->name()), "cpu"});
      PD_ASSIGN_OR_RETURN(e.model, engine::Model::Load(e.file, backends, placement, load));
      e.context = context;
      PD_LOG(kInfo, "placement: ", e.placement);
      return e;
    }
  } else {
    PD_ASSIGN_OR_RETURN(e.backend, make_cpu());
    e.kernels = std::string(
        engine::cpu::KernelSetName(engine::cpu::SelectKernels(options.force_scalar)));
  }
  PD_ASSIGN_OR_RETURN(e.model, engine::Model::Load(e.file, *e.backend, load));
  e.placement = StrCat("every layer on ", e.backend->name());
  e.context =
      options.context > 0 ? options.context : engine::DefaultContext(e.model->config().n_ctx_train);
  return e;
}

EngineOptions EngineOptionsFrom(const ServeOptions& o) {
  EngineOptions e;
  e.model_path = o.model.path;
  e.backend = o.model.backend;
  e.gpu_layers = o.model.gpu_layers;
  e.quantize = o.model.quantize;
  e.kv_bytes = o.kv.memory_mib << 20;
  e.kv_dtype = o.kv.dtype;
  e.threads = o.threads;
  e.context = o.model.context;
  return e;
}

absl::StatusOr<std::string> FindOrBuildSelfDraft(const std::string& model_path, int threads) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (engine::IsHfCheckpoint(model_path)) {
    return absl::FailedPreconditionError(
        StrCat("self-draft: ", model_path, " is a Hugging Face folder; convert it first "
               "(pdctl convert) so that the draft can be cached beside a file"));
  }
  const fs::path model(model_path);
  const std::string stem = model.stem().string();
  const fs::path beside = model.parent_path() / (stem + ".draft.gguf");
  if (fs::exists(beside, ec)) return beside.string();
  const uintmax_t bytes = fs::file_size(model, ec);
  if (ec) return absl::NotFoundError(StrCat("self-draft: cannot read ", model_path));
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const fs::path cache = xdg != nullptr && *xdg != '\0' ? fs::path(xdg) / "pdserve" / "drafts"
                         : home != nullptr             ? fs::path(home) / ".cache/pdserve/drafts"
                                                       : fs::path("/tmp/pdserve-drafts");
  const fs::path cached = cache / StrCat(stem, "-", bytes, ".draft.gguf");
  if (fs::exists(cached, ec)) return cached.string();
  fs::create_directories(cache, ec);
  if (ec) {
    return absl::PermissionDeniedError(
        StrCat("self-draft: cannot create ", cache.string(), ": ", ec.message()));
  }
  PD_LOG(kInfo, "self-draft: none for ", model_path, "; building ", cached.string(),
         " (pdctl quantize --draft; a few minutes, once)");
  engine::quantize::DraftOptions d;
  d.quant.input = model_path;
  d.quant.output = cached.string();
  d.quant.type = engine::DType::kQ3_K;
  d.quant.method = engine::quantize::Method::kImportance;
  d.quant.policy = "S";
  d.quant.calib_tokens = 4096;
  d.quant.threads = threads;
  std::unique_ptr<engine::quantize::Progress> progress = engine::quantize::MakeStderrProgress();
  PD_ASSIGN_OR_RETURN(engine::quantize::DraftReport report,
                      engine::quantize::QuantizeDraft(d, *progress));
  PD_LOG(kInfo, "self-draft: wrote ", cached.string(), " (", report.draft_step_bytes >> 20,
         " MiB read per step against the model's ", report.target_step_bytes >> 20,
         " MiB; top-1 agreement ", report.agreement, ")");
  return cached.string();
}

absl::StatusOr<std::shared_ptr<engine::spec::Drafter>> BuildDrafter(
    const SpeculativeConfigOptions& o, const engine::Model& target, const std::string& target_path,
    engine::Backend& backend, int threads) {
  if (o.drafter == "off") return std::shared_ptr<engine::spec::Drafter>();
  if (o.drafter == "ngram") {
    engine::spec::NgramOptions n{.min_n = o.ngram_min, .max_n = o.ngram_max};
    PD_RETURN_IF_ERROR(n.Validate());
    return std::shared_ptr<engine::spec::Drafter>(std::make_shared<engine::spec::NgramDrafter>(n));
  }
  if (o.drafter == "self-head") {
    // The target as its own draft: its layers on its own cache, its head restricted to the draft
    // head's tokens (the ranking `pdctl quantize --draft` uses).
    PD_ASSIGN_OR_RETURN(const engine::quantize::HeadSelection head,
                        engine::quantize::DraftHeadTokens(target.file(), o.head_rows));
    PD_ASSIGN_OR_RETURN(std::unique_ptr<engine::Model> view,
                        engine::Model::WithHead(target, head.ids));
    PD_ASSIGN_OR_RETURN(std::unique_ptr<engine::spec::SelfHeadDrafter> drafter,
                        engine::spec::SelfHeadDrafter::Create(std::move(view)));
    PD_LOG(kInfo, "speculative decoding: self-head draft (the model's layers, ", head.ids.size(),
           " of ", target.config().n_vocab, " head rows), draft step ",
           drafter->StepSeconds(1) * 1e3, " ms (1 row)");
    return std::shared_ptr<engine::spec::Drafter>(std::move(drafter));
  }
  std::string path = o.drafter;
  if (o.drafter == "self") {
    PD_ASSIGN_OR_RETURN(path, FindOrBuildSelfDraft(target_path, threads));
  }
  auto opened = engine::GgufFile::Open(path);
  if (!opened.ok()) {
    return absl::Status(opened.status().code(),
                        StrCat("speculative.drafter: ", opened.status().message()));
  }
  std::shared_ptr<const engine::GgufFile> file(std::move(*opened));
  if (absl::Status st = engine::CheckSameVocabulary(target.file(), *file); !st.ok()) {
    return absl::Status(st.code(), StrCat("speculative.drafter ", path,
                                          ": not the model's vocabulary: ", st.message()));
  }
  engine::spec::DraftModelOptions dm;
  dm.kv_bytes = o.draft_kv_mib << 20;
  // Its cache is F16 (dm.kv_dtype): its matrices laid out for the own order as the target's are.
  PD_ASSIGN_OR_RETURN(
      std::unique_ptr<engine::Model> draft,
      engine::Model::Load(file, backend, {.no_f32_cache = dm.kv_dtype != engine::KvDType::kF32}));
  PD_ASSIGN_OR_RETURN(std::unique_ptr<engine::spec::DraftModelDrafter> drafter,
                      engine::spec::DraftModelDrafter::Create(std::move(draft),
                                                              target.config().n_vocab, dm));
  PD_LOG(kInfo, "speculative decoding: draft model ", path, ", draft step ",
         drafter->StepSeconds(1) * 1e3, " ms (1 row)");
  return std::shared_ptr<engine::spec::Drafter>(std::move(drafter));
}

absl::StatusOr<ServingEngine> BuildServingEngine(const ServeOptions& o,
                                                 frontend::ServingMetrics* metrics,
                                                 bool speculate) {
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
  so.prefix_cache.fill_generated = o.prefix_cache.fill_generated;
  so.max_running_seqs = o.scheduler.max_running_seqs;
  so.max_waiting = o.scheduler.max_waiting;
  so.max_total_tokens = o.scheduler.max_total_tokens;
  so.token_budget = o.scheduler.token_budget;
  so.chunked_prefill = o.scheduler.chunked_prefill;
  so.prefill_chunk = o.scheduler.prefill_chunk;
  so.step_time_stretch = o.scheduler.step_time_stretch;
  so.prefill_pace_steps = o.scheduler.prefill_pace_steps;
  so.prompt_rate_steps = o.scheduler.prompt_rate_steps;
  so.min_prefill_chunk = o.scheduler.min_prefill_chunk;
  so.enable_priority = o.scheduler.priority;
  so.max_context = built.context;
  if (speculate) {
    PD_ASSIGN_OR_RETURN(so.speculative.drafter,
                        BuildDrafter(o.speculative, *built.model, built.model_path,
                                     *built.backend, o.threads));
    so.speculative.max_k = o.speculative.max_k;
    so.speculative.min_gain = o.speculative.min_gain;
    so.speculative.fixed_k = o.speculative.fixed_k;
  }
  if (metrics != nullptr) {
    so.step_observer = [metrics](const engine::StepStats& s) {
      metrics->Step(frontend::StepStats{s.prefill_tokens, s.decode_tokens, s.seconds});
      metrics->Load(s.load);
      if (s.spec_sequences > 0) {
        metrics->Speculation(s.spec_sequences, s.draft_tokens, s.accepted_tokens, s.drafted_at,
                             s.accepted_at, s.draft_seconds);
      }
    };
  }
  ServingEngine e;
  e.backend = std::move(built.backend);
  e.host_backend = std::move(built.host_backend);
  e.file = std::move(built.file);
  e.model_path = std::move(built.model_path);
  e.kernels = std::move(built.kernels);
  PD_ASSIGN_OR_RETURN(e.scheduler, engine::Scheduler::Create(std::move(built.model), so));
  return e;
}

}  // namespace pd::node
