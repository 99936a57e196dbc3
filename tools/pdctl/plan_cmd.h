// `pdctl plan -m MODEL --gpu-mem BYTES --ctx N [--batch B] [--kv-type T]`: the offload planner
// (engine/runtime/planner.h) for a GPU memory budget: the model's bytes per layer, the KV cache's,
// the GPU's buffers, how many layers go on the GPU and which stay on the CPU, and the predicted
// decode time per token from bandwidths measured on this machine (cached), for the model's own
// weight type and each other type it could be quantized to. Exit code: 0, 1 when nothing fits
// (the reason printed), 2 on bad input.
#pragma once

#include <string>

#include "CLI/CLI.hpp"

namespace pd::tools {

struct PlanFlags {
  std::string model;
  std::string gpu_mem;         // "80G", "24GiB", "8000000000"
  int ctx = 0;                 // 0: the model's default context
  int batch = 1;
  int tokens_per_step = 512;
  std::string kv_type = "f16";
  double gpu_bw_gbps = 0;      // > 0: use instead of measuring
  double cpu_bw_gbps = 0;
  int threads = 0;
  int gpu_layers = -1;         // >= 0: cost this many instead of fitting
};

CLI::App* AddPlanCommand(CLI::App& app, PlanFlags* f);
int RunPlan(const PlanFlags& f);

// "80G" / "80GiB" (2^30), "80GB" (10^9), "512M", "4096" (bytes). INVALID_ARGUMENT otherwise.
// Exposed for tests.
bool ParseByteSize(const std::string& text, size_t* bytes);

}  // namespace pd::tools
