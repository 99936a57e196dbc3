// The offload planner: how many of a model's layers a GPU memory budget holds, and the decode
// time per token that placement predicts (docs/offload.md). `pdctl plan` prints it;
// `gpu_layers: auto` places the model by it.
//
// Memory on the GPU for n of N layers on it (the last n, LayerPlacement::Offload):
//   n x (layer weights + layer KV) + the output head and norm (n >= 1) + the token embedding
//   (n == N, unless tied to the head) + activation buffers + workspace.
// Layer KV = 2 (K and V) x kv_heads x head_dim x ctx x batch x bytes per element (+ the INT8
// scales), in whole blocks. Activations: the forward pass's scratch slots for tokens_per_step
// rows and the head's for `batch` rows (Model::EnsureScratch). Workspace: what the CUDA backend
// allocates besides them (its f16 copy of the activations and dequantized weight slab, cuBLAS's).
//
// Predicted decode time per token (batch 1, bounded by memory bandwidth):
//   t = bytes read on the GPU / B_gpu + bytes read on the CPU / B_cpu
// with each layer's weights (and the head) read once per step: n w / B_gpu + (N - n) w / B_cpu.
// In a mixture of experts a batch-1 step reads only the experts it routes to: of a layer's
// stacked expert tensors, the fraction expert_used_count / expert_count.
//
// Thread safety: plain functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backend/kv_layout.h"
#include "engine/model/gguf.h"
#include "engine/model/model_config.h"
#include "engine/quant/dtype.h"

namespace pd::engine {

// What the planner needs of a model, with its matrices in one weight type.
struct ModelFootprint {
  int n_layer = 0;
  std::vector<size_t> layer_bytes;  // per layer: every tensor of blk.L
  std::vector<size_t> layer_expert_bytes;  // per layer: its stacked experts (ffn_*_exps)
  size_t embd_bytes = 0;            // token_embd.weight
  size_t head_bytes = 0;            // output.weight (0 when tied) + output_norm.weight
  bool tied = false;
  size_t max_matrix_elems = 0;      // the largest layer matrix (elements): the dequant slab
  size_t total() const;
};

// The file's footprint as it is, or with every 2-D weight whose rows fit the type's blocks
// re-typed to `as_type` (what `pdctl quantize --type` would write; 1-D tensors stay F32).
ModelFootprint FootprintOf(const GgufFile& file, const ModelConfig& c);
ModelFootprint FootprintAs(const GgufFile& file, const ModelConfig& c, DType as_type);

struct PlanRequest {
  size_t gpu_bytes = 0;        // the GPU memory budget
  int64_t ctx = 4096;          // tokens per sequence
  int batch = 1;               // sequences decoded together
  int tokens_per_step = 512;   // rows of one forward (prefill chunk): the activation buffers
  KvDType kv_type = KvDType::kF16;
  int kv_block_size = 16;
  double gpu_bandwidth = 0;    // bytes/s, 0 = unknown (no prediction)
  double cpu_bandwidth = 0;    // bytes/s, 0 = unknown
};

struct Plan {
  int n_layer = 0;
  int gpu_layers = 0;                 // the last gpu_layers layers run on the GPU
  size_t layer_kv_bytes = 0;          // KV of one layer for ctx x batch
  size_t gpu_weight_bytes = 0;        // layers, head, embedding on the GPU
  size_t cpu_weight_bytes = 0;
  size_t gpu_kv_bytes = 0, cpu_kv_bytes = 0;
  size_t activation_bytes = 0;        // on the GPU
  size_t workspace_bytes = 0;         // on the GPU
  size_t gpu_total() const { return gpu_weight_bytes + gpu_kv_bytes + activation_bytes + workspace_bytes; }
  // Decode time per token, seconds; < 0 when a needed bandwidth is unknown.
  double decode_seconds = -1;
  double gpu_read_bytes = 0, cpu_read_bytes = 0;  // per decode step
};

// Bytes of one layer's KV (K and V) for `tokens` positions of `c` in `type`, whole blocks.
size_t LayerKvBytes(const ModelConfig& c, int64_t tokens, KvDType type, int block_size);

// The most layers `req.gpu_bytes` holds, and the prediction. Refusals (RESOURCE_EXHAUSTED, with
// the numbers): one layer's KV alone exceeds the budget; not even one layer with the head and
// the buffers fits. INVALID_ARGUMENT for non-positive ctx, batch or tokens_per_step.
absl::StatusOr<Plan> PlanOffload(const ModelConfig& c, const ModelFootprint& f,
                                 const PlanRequest& req);

// The same arithmetic for a fixed number of GPU layers (no fitting; never refuses for memory):
// what `--gpu-layers N` costs and predicts.
absl::StatusOr<Plan> PlanFixed(const ModelConfig& c, const ModelFootprint& f,
                               const PlanRequest& req, int gpu_layers);

}  // namespace pd::engine
