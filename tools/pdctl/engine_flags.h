// The model-running pdctl subcommands' shared options (--model, --threads, --kv-type, --ctx,
// --backend, --cpu-kernels) and the engine they load: the node runtime's (node/engine_builder.h)
// with a KV cache for one sequence.
#pragma once

#include <memory>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "engine/backend/backend.h"
#include "engine/kv/kv_cache.h"
#include "engine/model/gguf.h"
#include "engine/runtime/model.h"

namespace pd::tools {

// Options shared by the commands that run the model.
struct EngineFlags {
  std::string model;
  int threads = 0;
  std::string kv_type = "f16";
  int ctx = 0;
  std::string backend = "cpu";
  std::string cpu_kernels = "auto";
  std::string gpu_layers = "all";
  std::string quantize;

  void Add(CLI::App* app) {
    app->add_option("-m,--model", model,
                    "GGUF model file or Hugging Face checkpoint folder (default: the default "
                    "model, see `pdctl models`)");
    app->add_option("--quantize", quantize,
                    "quantize F32/F16/BF16 weights at load to this type (q8_0, q4_0, q2_K .. "
                    "q6_K), in memory");
    app->add_option("-t,--threads", threads, "CPU threads (0 = all cores)");
    app->add_option("--kv-type", kv_type,
                    "KV cache element type: f16, f32, or int8 (per token and head scales)")
        ->check(CLI::IsMember({"f16", "f32", "int8"}));
    app->add_option("-c,--ctx", ctx, "context size in tokens (0 = min(training context, 4096))");
    app->add_option("--backend", backend, "compute backend: cpu or cuda")
        ->check(CLI::IsMember({"cpu", "cuda"}));
    app->add_option("--gpu-layers", gpu_layers,
                    "with --backend cuda: all, auto (what the GPU's free memory holds) or N (the "
                    "last N layers on the GPU, the rest on the CPU; docs/offload.md)");
    app->add_option("--cpu-kernels", cpu_kernels,
                    "CPU kernels: auto (the best the CPU has, capped by PDSERVE_CPU_ISA=avx512|"
                    "avx2|scalar) or scalar (portable)")
        ->check(CLI::IsMember({"auto", "scalar"}));
  }
};

// A loaded model with its backend and a KV cache for one sequence.
struct Engine {
  std::unique_ptr<engine::Backend> backend;
  std::unique_ptr<engine::Backend> host_backend;  // node::Engine::host_backend
  std::shared_ptr<engine::GgufFile> file;
  std::unique_ptr<engine::Model> model;
  std::unique_ptr<engine::KvCache> kv;
  std::string model_path;  // the file loaded: --model, or the default model
  std::string kernels;     // node::Engine::kernels: scalar, avx2, avx512, avx512-vnni or cuda
};

// Loads the model `f` names (the default model when none) on its backend, with a KV cache of
// `f.ctx` tokens (0: min(training context, 4096)). Errors: those of node::BuildEngine and
// engine::KvCache::Create; INVALID_ARGUMENT for an unknown --kv-type.
absl::StatusOr<Engine> LoadEngine(const EngineFlags& f);

}  // namespace pd::tools
