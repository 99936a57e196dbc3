#include "engine/runtime/planner.h"

#include <algorithm>
#include <cstdlib>
#include <string_view>

#include "common/strings.h"

namespace pd::engine {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
// cuBLAS's own workspace on Hopper (its documented default for sm_90 is 32 MiB).
constexpr size_t kCublasWorkspace = 32 * kMiB;

// Layer index of "blk.L.something", or -1.
int LayerOf(std::string_view name) {
  if (name.substr(0, 4) != "blk.") return -1;
  int l = 0;
  size_t i = 4;
  if (i >= name.size() || name[i] < '0' || name[i] > '9') return -1;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i) l = l * 10 + (name[i] - '0');
  return i < name.size() && name[i] == '.' ? l : -1;
}

ModelFootprint Footprint(const GgufFile& file, const ModelConfig& c, const DType* as_type) {
  ModelFootprint f;
  f.n_layer = c.n_layer;
  f.layer_bytes.assign(c.n_layer, 0);
  f.layer_expert_bytes.assign(c.n_layer, 0);
  f.tied = c.tied_output;
  for (const GgufTensorInfo& t : file.tensors()) {
    size_t bytes = t.nbytes;
    const int l = LayerOf(t.name);
    if (t.shape.size() >= 2) {
      if (l >= 0) f.max_matrix_elems = std::max(f.max_matrix_elems, static_cast<size_t>(t.numel()));
      if (as_type != nullptr && t.shape[0] % Traits(*as_type).block_size == 0) {
        bytes = RowBytes(*as_type, t.shape[0]) * static_cast<size_t>(t.rows());
      }
    }
    if (l >= 0 && l < c.n_layer) {
      f.layer_bytes[l] += bytes;
      if (t.name.find("_exps.") != std::string::npos) f.layer_expert_bytes[l] += bytes;
    } else if (t.name == "token_embd.weight") {
      f.embd_bytes = bytes;
    } else if (t.name == "output.weight" || t.name == "output_norm.weight") {
      f.head_bytes += bytes;
    }
  }
  return f;
}

}  // namespace

size_t ModelFootprint::total() const {
  size_t s = embd_bytes + head_bytes;
  for (size_t b : layer_bytes) s += b;
  return s;
}

ModelFootprint FootprintOf(const GgufFile& file, const ModelConfig& c) {
  return Footprint(file, c, nullptr);
}

ModelFootprint FootprintAs(const GgufFile& file, const ModelConfig& c, DType as_type) {
  return Footprint(file, c, &as_type);
}

size_t LayerKvBytes(const ModelConfig& c, int64_t tokens, KvDType type, int block_size) {
  KvTensor t;
  t.type = type;
  t.n_kv_heads = c.n_head_kv;
  t.head_dim = c.head_dim;
  t.block_size = block_size;
  const int64_t blocks = (tokens + block_size - 1) / block_size;
  return 2 * static_cast<size_t>(blocks) * (t.block_value_bytes() + t.block_scale_bytes());
}

absl::StatusOr<Plan> PlanFixed(const ModelConfig& c, const ModelFootprint& f,
                               const PlanRequest& req, int gpu_layers) {
  if (req.ctx <= 0 || req.batch <= 0 || req.tokens_per_step <= 0 || req.kv_block_size <= 0) {
    return absl::InvalidArgumentError(
        pd::StrCat("plan: ctx (", req.ctx, "), batch (", req.batch, "), tokens per step (",
                   req.tokens_per_step, ") and KV block size must be positive"));
  }
  if (gpu_layers < 0 || gpu_layers > c.n_layer) {
    return absl::InvalidArgumentError(
        pd::StrCat("plan: ", gpu_layers, " GPU layers for a model of ", c.n_layer));
  }
  if (static_cast<int>(f.layer_bytes.size()) != c.n_layer) {
    return absl::InvalidArgumentError("plan: the footprint is not of this model");
  }
  Plan p;
  p.n_layer = c.n_layer;
  p.gpu_layers = gpu_layers;
  p.layer_kv_bytes =
      LayerKvBytes(c, req.ctx, req.kv_type, req.kv_block_size) * static_cast<size_t>(req.batch);
  const int split = c.n_layer - gpu_layers;
  // Expert bytes a batch-1 decode step does not read (the experts its token does not use).
  double gpu_unread = 0, cpu_unread = 0;
  const double unused =
      c.n_expert > 0 ? 1.0 - static_cast<double>(c.n_expert_used) / c.n_expert : 0.0;
  for (int l = 0; l < c.n_layer; ++l) {
    (l >= split ? p.gpu_weight_bytes : p.cpu_weight_bytes) += f.layer_bytes[l];
    (l >= split ? p.gpu_kv_bytes : p.cpu_kv_bytes) += p.layer_kv_bytes;
    if (l < static_cast<int>(f.layer_expert_bytes.size())) {
      (l >= split ? gpu_unread : cpu_unread) += unused * f.layer_expert_bytes[l];
    }
  }
  // The head is on the last layer's backend; the embedding on the first layer's. A tied head is
  // the embedding, mapped on each side that needs it.
  const bool head_gpu = gpu_layers > 0, embd_gpu = gpu_layers == c.n_layer;
  const size_t head = f.head_bytes + (f.tied ? f.embd_bytes : 0);
  (head_gpu ? p.gpu_weight_bytes : p.cpu_weight_bytes) += head;
  if (!(f.tied && head_gpu == embd_gpu)) {
    (embd_gpu ? p.gpu_weight_bytes : p.cpu_weight_bytes) += f.embd_bytes;
  }
  if (gpu_layers > 0) {
    const size_t T = static_cast<size_t>(req.tokens_per_step);
    const size_t E = c.n_embd, F = c.n_ff;
    const size_t q = size_t(c.n_head) * c.head_dim, kv = size_t(c.n_head_kv) * c.head_dim;
    const size_t head_rows = c.head_tokens.empty() ? size_t(c.n_vocab) : c.head_tokens.size();
    // Per token: the residual, norm and attention-output rows, Q/K/V and attention, and the
    // feed-forward: gate and up rows, or with experts the router's probabilities, the chosen
    // experts' values and ids, and k rows each of expert input, gate, up and output.
    const size_t k = size_t(c.n_expert_used), Fe = size_t(c.n_ff_exp);
    const size_t ffn = c.n_expert > 0 ? size_t(c.n_expert) + 2 * k + k * (2 * E + 2 * Fe) : 2 * F;
    p.activation_bytes = sizeof(float) * (T * (3 * E + 2 * q + 2 * kv + ffn) +
                                          size_t(req.batch) * (2 * E + head_rows));
    p.workspace_bytes = sizeof(uint16_t) * (T * std::max({E, F, q}) + f.max_matrix_elems) +
                        kCublasWorkspace;
  }
  // A decode step reads every layer's weights and the head once; the embedding only its rows.
  p.gpu_read_bytes =
      static_cast<double>(p.gpu_weight_bytes - (embd_gpu && !f.tied ? f.embd_bytes : 0)) -
      gpu_unread;
  p.cpu_read_bytes = static_cast<double>(p.cpu_weight_bytes - (!embd_gpu && !(f.tied && !head_gpu)
                                                                   ? f.embd_bytes
                                                                   : 0)) -
                     cpu_unread;
  const bool need_gpu = p.gpu_read_bytes > 0, need_cpu = p.cpu_read_bytes > 0;
  if ((!need_gpu || req.gpu_bandwidth > 0) && (!need_cpu || req.cpu_bandwidth > 0)) {
    p.decode_seconds = (need_gpu ? p.gpu_read_bytes / req.gpu_bandwidth : 0) +
                       (need_cpu ? p.cpu_read_bytes / req.cpu_bandwidth : 0);
  }
  return p;
}

absl::StatusOr<Plan> PlanOffload(const ModelConfig& c, const ModelFootprint& f,
                                 const PlanRequest& req) {
  absl::StatusOr<Plan> one = PlanFixed(c, f, req, std::min(1, c.n_layer));
  if (!one.ok()) return one.status();
  if (one->layer_kv_bytes > req.gpu_bytes) {
    return absl::ResourceExhaustedError(pd::StrCat(
        "the KV cache of one layer (", one->layer_kv_bytes / kMiB, " MiB for ", req.ctx,
        " tokens x ", req.batch, " sequences in ", KvDTypeName(req.kv_type),
        ") is larger than the GPU budget of ", req.gpu_bytes / kMiB,
        " MiB: shorten the context, lower the batch, use an int8 KV cache, or run on the CPU"));
  }
  if (one->gpu_total() > req.gpu_bytes) {
    return absl::ResourceExhaustedError(pd::StrCat(
        "nothing fits: one layer with the output head and the GPU's buffers needs ",
        one->gpu_total() / kMiB, " MiB (weights ", one->gpu_weight_bytes / kMiB, ", KV ",
        one->gpu_kv_bytes / kMiB, ", activations ", one->activation_bytes / kMiB,
        ", workspace ", one->workspace_bytes / kMiB, "), the GPU budget is ",
        req.gpu_bytes / kMiB, " MiB: run it on the CPU (backend: cpu) or give more memory"));
  }
  Plan best = *one;
  for (int n = 2; n <= c.n_layer; ++n) {
    absl::StatusOr<Plan> p = PlanFixed(c, f, req, n);
    if (!p.ok()) return p.status();
    if (p->gpu_total() > req.gpu_bytes) break;
    best = *p;
  }
  return best;
}

}  // namespace pd::engine
