// How every process that runs the model builds its engine: pdctl (one sequence), pd-serve (the
// colocated engine), pd-decode and pd-prefill. One place decides the default model, the backend,
// the context rule and the Scheduler's options from the config, so the four cannot drift apart.
//
// Ownership: an Engine owns its backend, the mapped model file and the Model; a ServingEngine
// owns an Engine's backend and file and a Scheduler, which owns the Model. Thread safety: the
// builders are plain functions; what they return is owned by one thread (the Scheduler has its
// own engine thread, engine/sched/scheduler.h).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/config.h"
#include "engine/backend/backend.h"
#include "engine/model/gguf.h"
#include "engine/runtime/model.h"
#include "engine/sched/scheduler.h"
#include "engine/spec/drafter.h"
#include "frontend/serving_metrics.h"

namespace pd::node {

struct EngineOptions {
  std::string model_path;       // "" = the default model (engine/model/model_finder.h)
  std::string backend = "cpu";  // cpu | cuda
  int threads = 0;              // CPU backend threads; 0 = all cores
  bool force_scalar = false;    // CPU backend: the portable kernels even with AVX2
  int context = 0;              // tokens per sequence; 0 = engine::DefaultContext()
  // backend cuda: "all", a count of GPU layers (the last ones), or "auto" (the offload planner,
  // engine/runtime/planner.h, over the GPU's free memory). The other layers run on a CPU backend.
  std::string gpu_layers = "all";
  // For "auto": the KV bytes the engine will allocate over all layers (0 = one sequence of the
  // context).
  int64_t kv_bytes = 0;
  // The KV cache's element type: for "auto"; and over F16 / INT8 the output head may be laid out
  // for pdserve's own order (Model::LoadOptions::no_f32_cache), so the engine's model then
  // refuses an F32 cache.
  std::string kv_dtype = "f16";
  // "" = the weights as stored; else a quantized type (q4_K, q8_0, ...) that F32/F16/BF16 weights
  // are quantized to at load by pdserve's quantizer (round to nearest, policy M), in memory.
  std::string quantize;
};

// A model loaded on its backend.
struct Engine {
  std::unique_ptr<engine::Backend> backend;
  // The CPU backend of the layers a GPU does not hold (gpu_layers below the model's); else null.
  // Declared after `backend` so that it goes first.
  std::unique_ptr<engine::Backend> host_backend;
  std::shared_ptr<engine::GgufFile> file;
  std::unique_ptr<engine::Model> model;
  std::string model_path;  // the file actually loaded
  int context = 0;         // the context rule applied
  // The kernels that run, for logs and benchmark records: the CPU backend's kernel set
  // (engine/backend/cpu/kernels.h KernelSetName: scalar, avx2, avx512, avx512-vnni) or "cuda".
  std::string kernels;
  std::string placement;  // "every layer on cpu" / "layers 0-9 on cpu, 10-31 on cuda:0 (...)"
};

// Finds the model, checks that the backend runs every op it needs (UNIMPLEMENTED naming the
// missing ops, before any device is touched), creates the backend, maps and loads the weights.
// Errors: NOT_FOUND (no model), INVALID_ARGUMENT (unknown backend, malformed file, a bad
// PDSERVE_CPU_ISA, a bad gpu_layers), UNIMPLEMENTED, UNAVAILABLE (no GPU for cuda),
// RESOURCE_EXHAUSTED (the GPU cannot hold the layers asked of it, with the numbers).
absl::StatusOr<Engine> BuildEngine(const EngineOptions& options);

// The config's model / backend / threads / context as EngineOptions.
EngineOptions EngineOptionsFrom(const ServeOptions& o);

// A serving process's engine: the model under a started Scheduler.
struct ServingEngine {
  std::unique_ptr<engine::Backend> backend;
  std::unique_ptr<engine::Backend> host_backend;  // Engine::host_backend
  std::shared_ptr<engine::GgufFile> file;
  std::unique_ptr<engine::Scheduler> scheduler;
  std::string model_path;
  std::string kernels;  // Engine::kernels
};

// BuildEngine(EngineOptionsFrom(o)), then a Scheduler from the config's scheduler, kv and (with
// `speculate`: the nodes that decode) speculative sections; its step observer feeds `metrics`
// (nullable, must outlive the engine). Errors: the model's, INVALID_ARGUMENT for kv.dtype, the
// drafter's (BuildDrafter), the Scheduler's.
absl::StatusOr<ServingEngine> BuildServingEngine(const ServeOptions& o,
                                                 frontend::ServingMetrics* metrics,
                                                 bool speculate = true);

// The drafter `o.drafter` names for `target` (loaded from `target_path` on `backend`, which
// must outlive the drafter): nullptr for "off"; an NgramDrafter for "ngram"; a SelfHeadDrafter
// over Model::WithHead(target) for "self-head" (it shares the target's weights); for "self" or a
// path, a DraftModelDrafter over that model on the same backend, after checking its vocabulary
// is the target's token by token. Errors: INVALID_ARGUMENT for bad values, NOT_FOUND for a
// missing draft file, FAILED_PRECONDITION naming the first differing token, the model's.
absl::StatusOr<std::shared_ptr<engine::spec::Drafter>> BuildDrafter(
    const SpeculativeConfigOptions& o, const engine::Model& target, const std::string& target_path,
    engine::Backend& backend, int threads);

// The self-draft of the model at `model_path` (docs/speculative.md, "Self-draft"): the first of
// `<dir>/<stem>.draft.gguf` and `~/.cache/pdserve/drafts/<stem>-<bytes>.draft.gguf` that exists,
// else the latter, built by `pdctl quantize --draft`'s job with progress on stderr (minutes).
absl::StatusOr<std::string> FindOrBuildSelfDraft(const std::string& model_path, int threads);

}  // namespace pd::node
