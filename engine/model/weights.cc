#include "engine/model/weights.h"

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <string>
#include <string_view>

#include "common/status.h"
#include "common/strings.h"

namespace pd::engine {
namespace {

std::string ShapeStr(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += pd::StrCat(i ? ", " : "", s[i]);
  return out + "]";
}

class Loader {
 public:
  Loader(const GgufFile& f, std::vector<std::unique_ptr<Buffer>>& storage, size_t& bytes)
      : f_(f), storage_(storage), bytes_(bytes) {}

  // The backend the next Get()s map onto.
  void set_backend(Backend& b) { b_ = &b; }
  // Whether the next Get()s map into the backend's own-order layout where it has one
  // (Backend::MapWeightsOwnLayout), else as usual.
  void set_own_layout(bool own) { own_layout_ = own; }
  // How many tensors so far were mapped in an own-order layout.
  int own_layouts() const { return own_layouts_; }

  // Finds `name` with ggml shape {cols, rows} (rows == 0 for 1-D) and maps it; `count`: whether
  // its bytes add to the total (false for a second mapping of the same tensor).
  absl::StatusOr<Tensor> Get(const std::string& name, int64_t cols, int64_t rows,
                             bool float_only = false, bool optional = false, bool count = true) {
    const GgufTensorInfo* t = f_.FindTensor(name);
    if (t == nullptr) {
      if (optional) return Tensor{};
      return absl::InvalidArgumentError(pd::StrCat("tensor '", name, "' is missing"));
    }
    std::vector<int64_t> want = {cols};
    if (rows > 0) want.push_back(rows);
    if (t->shape != want) {
      return absl::InvalidArgumentError(pd::StrCat("tensor '", name, "' has shape ",
                                                   ShapeStr(t->shape), ", expected ",
                                                   ShapeStr(want), " for this architecture"));
    }
    if (float_only && t->type != DType::kF32) {
      return absl::InvalidArgumentError(pd::StrCat("tensor '", name, "' has type ",
                                                   Traits(t->type).name, ", expected f32"));
    }
    Tensor host{t->type, cols, rows > 0 ? rows : 1, const_cast<uint8_t*>(t->data)};
    PD_ASSIGN_OR_RETURN(Tensor mapped, Map(host));
    if (count) bytes_ += t->nbytes;
    return mapped;
  }

  // Finds the stacked expert matrices `name`, ggml shape {cols, rows, n_expert}, and maps them as
  // one [n_expert * rows, cols] tensor (each expert's rows are contiguous: a block of rows).
  absl::StatusOr<Tensor> GetExperts(const std::string& name, int64_t cols, int64_t rows,
                                    int64_t n_expert) {
    const GgufTensorInfo* t = f_.FindTensor(name);
    if (t == nullptr) {
      return absl::InvalidArgumentError(pd::StrCat("tensor '", name, "' is missing"));
    }
    const std::vector<int64_t> want = {cols, rows, n_expert};
    if (t->shape != want) {
      return absl::InvalidArgumentError(pd::StrCat("tensor '", name, "' has shape ",
                                                   ShapeStr(t->shape), ", expected ",
                                                   ShapeStr(want), " ({cols, rows, experts})"));
    }
    PD_ASSIGN_OR_RETURN(Tensor mapped,
                        Map(Tensor{t->type, cols, rows * n_expert, const_cast<uint8_t*>(t->data)}));
    bytes_ += t->nbytes;
    return mapped;
  }

  // Finds the fused matrix `name`, ggml shape {cols, sum(parts)}, and maps its consecutive row
  // blocks of parts[0], parts[1], ... rows as one tensor each (in that order). A row of every
  // weight type is self-contained (its header and whole blocks, dtype.h), so a block of rows of
  // the file's bytes is a matrix of the same type: on the CPU the parts are views, on a device
  // copies. `layout` says what the rows hold, for the error message.
  absl::StatusOr<std::vector<Tensor>> GetSplit(const std::string& name, int64_t cols,
                                               std::initializer_list<int64_t> parts,
                                               std::string_view layout) {
    const GgufTensorInfo* t = f_.FindTensor(name);
    if (t == nullptr) {
      return absl::InvalidArgumentError(pd::StrCat("tensor '", name, "' is missing"));
    }
    int64_t rows = 0;
    for (int64_t n : parts) rows += n;
    const std::vector<int64_t> want = {cols, rows};
    if (t->shape != want) {
      return absl::InvalidArgumentError(pd::StrCat("tensor '", name, "' has shape ",
                                                   ShapeStr(t->shape), ", expected ",
                                                   ShapeStr(want), " (", layout, ")"));
    }
    const Tensor whole{t->type, cols, rows, const_cast<uint8_t*>(t->data)};
    std::vector<Tensor> out;
    int64_t first = 0;
    for (int64_t n : parts) {
      PD_ASSIGN_OR_RETURN(Tensor part, Map(whole.Rows(first, n)));
      out.push_back(part);
      first += n;
    }
    bytes_ += t->nbytes;
    return out;
  }

 private:
  absl::StatusOr<Tensor> Map(const Tensor& host) {
    std::unique_ptr<Buffer> buf;
    if (own_layout_) {
      PD_ASSIGN_OR_RETURN(Tensor own, b_->MapWeightsOwnLayout(host, &buf));
      if (own.data != nullptr) {
        if (!buf) return absl::InternalError("MapWeightsOwnLayout: a layout without storage");
        ++own_layouts_;
        storage_.push_back(std::move(buf));
        f_.DropPages(host.data, host.bytes());
        return own;
      }
    }
    PD_ASSIGN_OR_RETURN(Tensor mapped, b_->MapWeights(host, &buf));
    if (buf) {
      // The backend holds its own copy (a device, or the CPU's 2 MiB pages): the file's pages
      // need not stay in this process's resident set.
      storage_.push_back(std::move(buf));
      f_.DropPages(host.data, host.bytes());
    }
    return mapped;
  }

  const GgufFile& f_;
  Backend* b_ = nullptr;
  bool own_layout_ = false;
  int own_layouts_ = 0;
  std::vector<std::unique_ptr<Buffer>>& storage_;
  size_t& bytes_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Weights>> Weights::Load(const GgufFile& f, const ModelConfig& c,
                                                       Backend& backend, bool own_head_layout,
                                                       bool own_layer_layout) {
  const std::vector<Backend*> all(static_cast<size_t>(std::max(c.n_layer, 0)), &backend);
  return Load(f, c, absl::MakeConstSpan(all), own_head_layout, own_layer_layout);
}

absl::StatusOr<std::unique_ptr<Weights>> Weights::Load(const GgufFile& f, const ModelConfig& c,
                                                       absl::Span<Backend* const> layer_backends,
                                                       bool own_head_layout,
                                                       bool own_layer_layout) {
  if (c.n_layer <= 0 || layer_backends.size() != static_cast<size_t>(c.n_layer) ||
      std::find(layer_backends.begin(), layer_backends.end(), nullptr) != layer_backends.end()) {
    return absl::InvalidArgumentError(pd::StrCat("weights: ", layer_backends.size(),
                                                 " layer backends (none may be null) for ",
                                                 c.n_layer, " layers"));
  }
  std::unique_ptr<Weights> w(new Weights());
  Loader L(f, w->storage_, w->total_bytes);
  const int64_t q_dim = int64_t{c.n_head} * c.head_dim;
  const int64_t kv_dim = int64_t{c.n_head_kv} * c.head_dim;
  Backend& embd_backend = *layer_backends.front();
  Backend& head_backend = *layer_backends.back();

  L.set_backend(embd_backend);
  // A tied embedding that is also the head's mapping takes the head's layout (GetRows reads it).
  L.set_own_layout(own_head_layout && c.tied_output && &head_backend == &embd_backend);
  PD_ASSIGN_OR_RETURN(w->token_embd, L.Get("token_embd.weight", c.n_embd, c.n_vocab));
  L.set_own_layout(false);
  L.set_backend(head_backend);
  PD_ASSIGN_OR_RETURN(w->output_norm, L.Get("output_norm.weight", c.n_embd, 0, true));
  L.set_own_layout(own_head_layout);
  if (c.tied_output) {
    if (&head_backend == &embd_backend) {
      w->output = w->token_embd;
    } else {
      PD_ASSIGN_OR_RETURN(w->output, L.Get("token_embd.weight", c.n_embd, c.n_vocab, false, false,
                                           /*count=*/false));
    }
  } else {
    // A draft's restricted head has one row per listed token (ModelConfig::head_tokens).
    const int64_t head_rows =
        c.head_tokens.empty() ? c.n_vocab : static_cast<int64_t>(c.head_tokens.size());
    PD_ASSIGN_OR_RETURN(w->output, L.Get("output.weight", c.n_embd, head_rows));
  }
  L.set_own_layout(false);
  if (const GgufTensorInfo* rf = f.FindTensor("rope_freqs.weight")) {
    if (rf->type != DType::kF32 || rf->shape != std::vector<int64_t>{c.rope_dim / 2}) {
      return absl::InvalidArgumentError(
          pd::StrCat("tensor 'rope_freqs.weight' has shape ", ShapeStr(rf->shape), " and type ",
                     Traits(rf->type).name, ", expected [", c.rope_dim / 2, "] f32"));
    }
    const float* p = reinterpret_cast<const float*>(rf->data);
    w->rope_freq_factors.assign(p, p + c.rope_dim / 2);
  }

  w->layers.resize(c.n_layer);
  const int own_before_layers = L.own_layouts();
  for (int i = 0; i < c.n_layer; ++i) {
    LayerWeights& l = w->layers[i];
    L.set_backend(*layer_backends[i]);
    L.set_own_layout(own_layer_layout);  // the dense matrices; norms and biases have none
    const std::string p = pd::StrCat("blk.", i, ".");
    PD_ASSIGN_OR_RETURN(l.attn_norm, L.Get(p + "attn_norm.weight", c.n_embd, 0, true));
    if (f.FindTensor(p + "attn_qkv.weight") != nullptr) {
      // Fused projections (Phi-3; llama.cpp takes them for any architecture): rows q, k, v.
      for (const char* separate : {"attn_q.weight", "attn_k.weight", "attn_v.weight"}) {
        if (f.FindTensor(p + separate) != nullptr) {
          return absl::InvalidArgumentError(pd::StrCat("layer ", i, " has both '", p,
                                                       "attn_qkv.weight' and '", p, separate,
                                                       "'; expected either fused or separate "
                                                       "Q, K and V"));
        }
      }
      if (f.FindTensor(p + "attn_qkv.bias") != nullptr) {
        return absl::UnimplementedError(pd::StrCat("a fused QKV bias ('", p,
                                                   "attn_qkv.bias') is not supported (separate "
                                                   "attn_{q,k,v}.bias are)"));
      }
      PD_ASSIGN_OR_RETURN(
          std::vector<Tensor> qkv,
          L.GetSplit(p + "attn_qkv.weight", c.n_embd, {q_dim, kv_dim, kv_dim},
                     pd::StrCat("q, k and v rows: ", q_dim, " + ", kv_dim, " + ", kv_dim)));
      l.wq = qkv[0];
      l.wk = qkv[1];
      l.wv = qkv[2];
      l.fused_qkv = true;
    } else {
      PD_ASSIGN_OR_RETURN(l.wq, L.Get(p + "attn_q.weight", c.n_embd, q_dim));
      PD_ASSIGN_OR_RETURN(l.wk, L.Get(p + "attn_k.weight", c.n_embd, kv_dim));
      PD_ASSIGN_OR_RETURN(l.wv, L.Get(p + "attn_v.weight", c.n_embd, kv_dim));
    }
    PD_ASSIGN_OR_RETURN(l.wo, L.Get(p + "attn_output.weight", q_dim, c.n_embd));
    PD_ASSIGN_OR_RETURN(l.bq, L.Get(p + "attn_q.bias", q_dim, 0, true, !c.qkv_bias));
    PD_ASSIGN_OR_RETURN(l.bk, L.Get(p + "attn_k.bias", kv_dim, 0, true, !c.qkv_bias));
    PD_ASSIGN_OR_RETURN(l.bv, L.Get(p + "attn_v.bias", kv_dim, 0, true, !c.qkv_bias));
    PD_ASSIGN_OR_RETURN(l.ffn_norm, L.Get(p + "ffn_norm.weight", c.n_embd, 0, true));
    if (c.qk_norm) {
      PD_ASSIGN_OR_RETURN(l.q_norm, L.Get(p + "attn_q_norm.weight", c.head_dim, 0, true));
      PD_ASSIGN_OR_RETURN(l.k_norm, L.Get(p + "attn_k_norm.weight", c.head_dim, 0, true));
    }
    if (c.post_norms) {
      PD_ASSIGN_OR_RETURN(l.post_attn_norm,
                          L.Get(p + "post_attention_norm.weight", c.n_embd, 0, true));
      PD_ASSIGN_OR_RETURN(l.post_ffn_norm, L.Get(p + "post_ffw_norm.weight", c.n_embd, 0, true));
    }
    if (c.n_expert > 0) {
      // Experts: the router stays F32 or whatever the file has (llama.cpp's quantizer keeps
      // ffn_gate_inp unquantized; any matrix type runs).
      l.n_expert = c.n_expert;
      L.set_own_layout(false);  // Weights::Expert takes row blocks of the file's layout
      PD_ASSIGN_OR_RETURN(l.ffn_gate_inp, L.Get(p + "ffn_gate_inp.weight", c.n_embd, c.n_expert));
      PD_ASSIGN_OR_RETURN(l.gate_exps,
                          L.GetExperts(p + "ffn_gate_exps.weight", c.n_embd, c.n_ff_exp,
                                       c.n_expert));
      PD_ASSIGN_OR_RETURN(l.up_exps, L.GetExperts(p + "ffn_up_exps.weight", c.n_embd, c.n_ff_exp,
                                                  c.n_expert));
      PD_ASSIGN_OR_RETURN(l.down_exps, L.GetExperts(p + "ffn_down_exps.weight", c.n_ff_exp,
                                                    c.n_embd, c.n_expert));
      continue;
    }
    if (f.FindTensor(p + "ffn_gate.weight") == nullptr &&
        f.FindTensor(p + "ffn_up.weight") != nullptr) {
      // Gate and up fused into ffn_up (Phi-3): the first n_ff rows are the gate (ggml_swiglu
      // applies silu to the first half of the row), the next n_ff the up projection.
      PD_ASSIGN_OR_RETURN(std::vector<Tensor> gate_up,
                          L.GetSplit(p + "ffn_up.weight", c.n_embd, {c.n_ff, c.n_ff},
                                     pd::StrCat("no '", p, "ffn_gate.weight': gate and up fused, ",
                                                c.n_ff, " + ", c.n_ff, " rows")));
      l.w_gate = gate_up[0];
      l.w_up = gate_up[1];
      l.fused_gate_up = true;
    } else {
      PD_ASSIGN_OR_RETURN(l.w_gate, L.Get(p + "ffn_gate.weight", c.n_embd, c.n_ff));
      PD_ASSIGN_OR_RETURN(l.w_up, L.Get(p + "ffn_up.weight", c.n_embd, c.n_ff));
    }
    PD_ASSIGN_OR_RETURN(l.w_down, L.Get(p + "ffn_down.weight", c.n_ff, c.n_embd));
  }
  w->layers_laid_out_own_ = L.own_layouts() > own_before_layers;
  return w;
}

absl::StatusOr<std::unique_ptr<Weights>> Weights::WithHead(std::shared_ptr<const Weights> base,
                                                           const GgufFile& f, const ModelConfig& c,
                                                           absl::Span<const int32_t> head_tokens,
                                                           Backend& head_backend) {
  if (base == nullptr) return absl::InvalidArgumentError("restricted head: no base weights");
  if (!c.head_tokens.empty()) {
    return absl::InvalidArgumentError(
        "restricted head: the model's head is already restricted (a draft model)");
  }
  if (head_tokens.empty()) return absl::InvalidArgumentError("restricted head: no tokens");
  for (size_t i = 0; i < head_tokens.size(); ++i) {
    const int32_t id = head_tokens[i];
    if (id < 0 || id >= c.n_vocab) {
      return absl::InvalidArgumentError(
          pd::StrCat("restricted head: token ", id, " is outside the vocabulary of ", c.n_vocab));
    }
    if (i > 0 && id <= head_tokens[i - 1]) {
      return absl::InvalidArgumentError(
          pd::StrCat("restricted head: token ids must be ascending without repeats (",
                     head_tokens[i - 1], " then ", id, ")"));
    }
  }
  const char* name = c.tied_output ? "token_embd.weight" : "output.weight";
  const GgufTensorInfo* t = f.FindTensor(name);
  if (t == nullptr || t->shape != std::vector<int64_t>{c.n_embd, c.n_vocab}) {
    return absl::InvalidArgumentError(
        pd::StrCat("restricted head: the file's '", name, "' is not the model's full head"));
  }
  const Tensor full{t->type, c.n_embd, c.n_vocab, const_cast<uint8_t*>(t->data)};
  const size_t row = full.row_bytes();
  std::vector<uint8_t> rows(row * head_tokens.size());
  for (size_t i = 0; i < head_tokens.size(); ++i) {
    std::memcpy(rows.data() + i * row, full.Rows(head_tokens[i], 1).data, row);
  }
  // The target's head laid out for the own order (MapWeightsOwnLayout at load).
  const bool head_laid_out = base->output.type != full.type;
  std::unique_ptr<Weights> w(new Weights());
  w->token_embd = base->token_embd;
  w->output_norm = base->output_norm;
  w->rope_freq_factors = base->rope_freq_factors;
  w->layers = base->layers;
  w->layers_laid_out_own_ = base->layers_laid_out_own_;
  w->total_bytes = base->total_bytes;
  w->base_ = std::move(base);  // its buffers (a device's copies) outlive the views
  const int64_t n_rows = static_cast<int64_t>(head_tokens.size());
  if (head_laid_out) {
    // The rows take the target's layout where the backend has one for them (the same bits
    // either way; the plain rows would run the order's slower kernels).
    std::unique_ptr<Buffer> laid_buf;
    PD_ASSIGN_OR_RETURN(Tensor laid,
                        head_backend.MapWeightsOwnLayout(
                            Tensor{full.type, c.n_embd, n_rows, rows.data()}, &laid_buf));
    if (laid.data != nullptr) {
      if (!laid_buf) return absl::InternalError("MapWeightsOwnLayout: a layout without storage");
      w->output = laid;
      w->storage_.push_back(std::move(laid_buf));
      w->total_bytes += laid.bytes();
      return w;
    }
  }
  PD_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> buf, head_backend.Allocate(rows.size()));
  PD_RETURN_IF_ERROR(head_backend.Upload(buf->data(), rows.data(), rows.size()));
  PD_RETURN_IF_ERROR(head_backend.Synchronize());
  w->output = Tensor{full.type, c.n_embd, n_rows, buf->data()};
  w->storage_.push_back(std::move(buf));
  w->total_bytes += rows.size();
  return w;
}

}  // namespace pd::engine
