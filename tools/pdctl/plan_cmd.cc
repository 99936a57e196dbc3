#include "tools/pdctl/plan_cmd.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "common/strings.h"
#include "engine/convert/hf_convert.h"
#include "engine/backend/cuda/cuda_ops.h"
#include "engine/backend/kv_layout.h"
#include "engine/model/gguf.h"
#include "engine/model/model_config.h"
#include "engine/model/model_finder.h"
#include "engine/runtime/bandwidth.h"
#include "engine/runtime/planner.h"

namespace pd::tools {
namespace {

double MiB(double b) { return b / 1048576.0; }

// The type holding most of the file's matrix bytes ("q4_K" for a Q4_K_M file).
std::string MainWeightType(const engine::GgufFile& file) {
  std::vector<std::pair<engine::DType, size_t>> bytes;
  for (const engine::GgufTensorInfo& t : file.tensors()) {
    if (t.shape.size() < 2) continue;
    auto it = std::find_if(bytes.begin(), bytes.end(), [&](const auto& e) { return e.first == t.type; });
    if (it == bytes.end()) bytes.emplace_back(t.type, t.nbytes);
    else it->second += t.nbytes;
  }
  if (bytes.empty()) return "f32";
  auto top = std::max_element(bytes.begin(), bytes.end(),
                              [](const auto& a, const auto& b) { return a.second < b.second; });
  return std::string(engine::Traits(top->first).name);
}

void PrintPlan(const engine::Plan& p) {
  std::printf("  placement: %s\n",
              p.gpu_layers == 0 ? "every layer on the CPU"
              : p.gpu_layers == p.n_layer
                  ? pd::StrCat("every layer on the GPU (", p.n_layer, ")").c_str()
                  : pd::StrCat("layers 0-", p.n_layer - p.gpu_layers - 1, " on the CPU, ",
                               p.n_layer - p.gpu_layers, "-", p.n_layer - 1, " on the GPU (",
                               p.gpu_layers, " of ", p.n_layer, ")")
                        .c_str());
  std::printf("  GPU memory: weights %.1f MiB + KV %.1f MiB + activations %.1f MiB + workspace "
              "%.1f MiB = %.1f MiB\n",
              MiB(p.gpu_weight_bytes), MiB(p.gpu_kv_bytes), MiB(p.activation_bytes),
              MiB(p.workspace_bytes), MiB(p.gpu_total()));
  std::printf("  CPU memory: weights %.1f MiB + KV %.1f MiB\n", MiB(p.cpu_weight_bytes),
              MiB(p.cpu_kv_bytes));
  if (p.decode_seconds >= 0) {
    std::printf("  predicted decode time per token: %.2f ms (%.1f MiB read on the GPU, %.1f MiB "
                "on the CPU)\n",
                p.decode_seconds * 1e3, MiB(p.gpu_read_bytes), MiB(p.cpu_read_bytes));
  } else {
    std::printf("  predicted decode time per token: unknown (a bandwidth is missing, see above)\n");
  }
}

}  // namespace

bool ParseByteSize(const std::string& text, size_t* bytes) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) {
    ++i;
  }
  if (i == 0) return false;
  double v = 0;
  try {
    v = std::stod(text.substr(0, i));
  } catch (...) {
    return false;
  }
  std::string unit = text.substr(i);
  for (char& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  double mult = 0;
  if (unit.empty() || unit == "B") mult = 1;
  else if (unit == "K" || unit == "KIB") mult = 1024.0;
  else if (unit == "M" || unit == "MIB") mult = 1048576.0;
  else if (unit == "G" || unit == "GIB") mult = 1073741824.0;
  else if (unit == "T" || unit == "TIB") mult = 1099511627776.0;
  else if (unit == "KB") mult = 1e3;
  else if (unit == "MB") mult = 1e6;
  else if (unit == "GB") mult = 1e9;
  else if (unit == "TB") mult = 1e12;
  else return false;
  const double b = v * mult;
  if (!(b > 0) || b > 1.8e19) return false;
  *bytes = static_cast<size_t>(b);
  return true;
}

CLI::App* AddPlanCommand(CLI::App& app, PlanFlags* f) {
  CLI::App* c = app.add_subcommand(
      "plan", "how many layers of a model a GPU memory budget holds, what stays on the CPU, and "
              "the predicted decode time per token (docs/offload.md)");
  c->add_option("-m,--model", f->model, "GGUF model file (default: the default model)");
  c->add_option("--gpu-mem", f->gpu_mem,
                "GPU memory budget: bytes, or with a unit: 80G / 80GiB (2^30), 80GB (10^9), 512M")
      ->required();
  c->add_option("-c,--ctx", f->ctx, "tokens per sequence (0 = min(training context, 4096))");
  c->add_option("--batch", f->batch, "sequences decoded together (each with ctx tokens of KV)");
  c->add_option("--tokens-per-step", f->tokens_per_step,
                "rows of one forward pass (the prefill chunk): sizes the activation buffers");
  c->add_option("--kv-type", f->kv_type, "KV cache element type: f16, f32 or int8")
      ->check(CLI::IsMember({"f16", "f32", "int8"}));
  c->add_option("--gpu-layers", f->gpu_layers,
                "cost exactly this many GPU layers instead of fitting the budget (-1 = fit)");
  c->add_option("--gpu-bw", f->gpu_bw_gbps,
                "GPU memory bandwidth in GB/s (0 = measure on this machine's GPU, cached)");
  c->add_option("--cpu-bw", f->cpu_bw_gbps,
                "CPU memory bandwidth in GB/s (0 = measure on this machine, cached)");
  c->add_option("-t,--threads", f->threads, "CPU threads the CPU layers run with (0 = all)");
  return c;
}

int RunPlan(const PlanFlags& f) {
  size_t budget = 0;
  if (!ParseByteSize(f.gpu_mem, &budget)) {
    std::fprintf(stderr, "pdctl plan: --gpu-mem '%s' is not a size (e.g. 24G, 80GB, 8000000000)\n",
                 f.gpu_mem.c_str());
    return 2;
  }
  const std::optional<engine::KvDType> kv = engine::ParseKvDType(f.kv_type);
  if (!kv || f.batch <= 0 || f.tokens_per_step <= 0 || f.ctx < 0) {
    std::fprintf(stderr, "pdctl plan: --batch and --tokens-per-step must be positive, --ctx >= 0\n");
    return 2;
  }
  std::string path = f.model;
  if (path.empty()) {
    absl::StatusOr<std::string> def = engine::FindDefaultModel();
    if (!def.ok()) {
      std::fprintf(stderr, "pdctl plan: %s\n", std::string(def.status().message()).c_str());
      return 2;
    }
    path = *def;
  }
  absl::StatusOr<std::unique_ptr<engine::GgufFile>> file = engine::OpenModelFile(path);
  if (!file.ok()) {
    std::fprintf(stderr, "pdctl plan: %s\n", std::string(file.status().message()).c_str());
    return 2;
  }
  absl::StatusOr<engine::ModelConfig> config = engine::ModelConfig::FromGguf(**file);
  if (!config.ok()) {
    std::fprintf(stderr, "pdctl plan: %s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  const engine::ModelConfig& c = *config;

  engine::PlanRequest req;
  req.gpu_bytes = budget;
  req.ctx = f.ctx > 0 ? f.ctx : engine::DefaultContext(c.n_ctx_train);
  req.batch = f.batch;
  req.tokens_per_step = f.tokens_per_step;
  req.kv_type = *kv;
  // Bandwidths: given, or measured here and cached.
  std::string gpu_note, cpu_note;
  if (f.gpu_bw_gbps > 0) {
    req.gpu_bandwidth = f.gpu_bw_gbps * 1e9;
    gpu_note = "given (--gpu-bw)";
  } else if (absl::StatusOr<engine::MeasuredBandwidth> g = engine::GpuCopyBandwidth(); g.ok()) {
    req.gpu_bandwidth = g->bytes_per_s;
    gpu_note = pd::StrCat(g->cached ? "measured earlier, cached" : "measured now", ": ", g->key);
  } else {
    gpu_note = pd::StrCat("unknown: ", g.status().message(), "; pass --gpu-bw GB/s");
  }
  if (f.cpu_bw_gbps > 0) {
    req.cpu_bandwidth = f.cpu_bw_gbps * 1e9;
    cpu_note = "given (--cpu-bw)";
  } else if (absl::StatusOr<engine::MeasuredBandwidth> h = engine::HostReadBandwidth(f.threads);
             h.ok()) {
    req.cpu_bandwidth = h->bytes_per_s;
    cpu_note = pd::StrCat(h->cached ? "measured earlier, cached" : "measured now", ": ", h->key);
  } else {
    cpu_note = pd::StrCat("unknown: ", h.status().message(), "; pass --cpu-bw GB/s");
  }

  const engine::ModelFootprint own = engine::FootprintOf(**file, c);
  std::printf("model: %s (%s, %d layers, %.1f MiB)\n", path.c_str(), c.arch.c_str(), c.n_layer,
              MiB(own.total()));
  std::printf("GPU budget: %.1f MiB; context %lld x batch %d, KV %s, %d tokens per step\n",
              MiB(budget), static_cast<long long>(req.ctx), req.batch, f.kv_type.c_str(),
              req.tokens_per_step);
  const size_t layer_kv = engine::LayerKvBytes(c, req.ctx, req.kv_type, req.kv_block_size) *
                          static_cast<size_t>(req.batch);
  std::printf("per layer: weights %.1f MiB (layer 0), KV %.1f MiB (2 x %d kv heads x %d x %lld "
              "tokens x %d sequences, %s)\n",
              MiB(own.layer_bytes.empty() ? 0 : own.layer_bytes[0]), MiB(layer_kv), c.n_head_kv,
              c.head_dim, static_cast<long long>(req.ctx), req.batch, f.kv_type.c_str());
  std::printf("head: %.1f MiB%s; embedding %.1f MiB (on the GPU only when every layer is)\n",
              MiB(own.head_bytes + (own.tied ? own.embd_bytes : 0)),
              own.tied ? " (tied to the embedding)" : "", MiB(own.embd_bytes));
  std::printf("bandwidth: GPU %.0f GB/s (%s)\n           CPU %.1f GB/s (%s)\n",
              req.gpu_bandwidth / 1e9, gpu_note.c_str(), req.cpu_bandwidth / 1e9,
              cpu_note.c_str());
  std::printf("formula: t = n w / B_gpu + (N - n) w / B_cpu, the head on the GPU when n >= 1\n\n");

  int rc = 0;
  std::printf("as it is (mostly %s):\n", MainWeightType(**file).c_str());
  absl::StatusOr<engine::Plan> plan =
      f.gpu_layers >= 0 ? engine::PlanFixed(c, own, req, f.gpu_layers)
                        : engine::PlanOffload(c, own, req);
  if (plan.ok()) {
    PrintPlan(*plan);
    if (plan->gpu_total() > budget) {
      std::printf("  (over the budget by %.1f MiB)\n", MiB(plan->gpu_total() - budget));
    }
  } else {
    std::printf("  refused: %s\n", std::string(plan.status().message()).c_str());
    rc = plan.status().code() == absl::StatusCode::kResourceExhausted ? 1 : 2;
  }

  // The other weight types the CUDA engine runs, re-quantized (`pdctl quantize --type T`), from
  // the fewest bits per weight; f32 and bf16 are left out (nobody serves f32, and bf16 takes
  // f16's bytes).
  std::printf("\nby weight type (every matrix re-quantized; 1-D tensors stay f32):\n");
  std::printf("%-6s %10s %10s %12s %12s\n", "type", "model MiB", "GPU layers", "GPU MiB",
              "ms/token");
  std::vector<engine::DType> types;
  for (engine::DType t : engine::cuda::kMatMulWeightTypes) {
    if (t != engine::DType::kF32 && t != engine::DType::kBF16) types.push_back(t);
  }
  const auto bits = [](engine::DType t) {
    return 8.0 * engine::Traits(t).block_bytes / engine::Traits(t).block_size;
  };
  std::stable_sort(types.begin(), types.end(),
                   [&](engine::DType a, engine::DType b) { return bits(a) < bits(b); });
  for (engine::DType t : types) {
    const engine::ModelFootprint fp = engine::FootprintAs(**file, c, t);
    absl::StatusOr<engine::Plan> p = f.gpu_layers >= 0 ? engine::PlanFixed(c, fp, req, f.gpu_layers)
                                                        : engine::PlanOffload(c, fp, req);
    if (!p.ok()) {
      std::printf("%-6s %10.1f %10s %12s %12s\n", std::string(engine::Traits(t).name).c_str(),
                  MiB(fp.total()), "none fits", "-", "-");
      continue;
    }
    std::printf("%-6s %10.1f %10d %12.1f %12s\n", std::string(engine::Traits(t).name).c_str(),
                MiB(fp.total()), p->gpu_layers, MiB(p->gpu_total()),
                p->decode_seconds >= 0 ? pd::StrCat(std::round(p->decode_seconds * 1e5) / 100).c_str()
                                       : "?");
  }
  return rc;
}

}  // namespace pd::tools
