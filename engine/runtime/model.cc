#include "engine/runtime/model.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <string_view>

#include "common/status.h"
#include "common/strings.h"
#include "engine/backend/op_support.h"
#include "engine/backend/top_k.h"

namespace pd::engine {
namespace {

// Scratch slots, each a [rows, cols] F32 activation buffer.
// kTopValues and kTopIds (int32 in an F32-sized slot) hold TopK's output for ForwardTop.
// kRouter .. kMoeOut hold a mixture-of-experts layer's router probabilities, the top experts'
// probabilities and ids, and the expert-sorted rows (n_tokens * n_expert_used of them) of its
// inputs, gate, up and outputs; one float column each in a dense model.
enum Slot {
  kX, kH, kQ, kK, kV, kAttn, kO, kGate, kUp, kRouter, kMoeTopV, kMoeTopI, kMoeIn, kMoeGate, kMoeUp,
  kMoeOut, kOutX, kOutH, kLogits, kTopValues, kTopIds, kNumSlots
};

// The summation order llama.cpp gives each row (Backend::MatMulRowOrder), from the `rows`
// (indices into the batch) of each sequence that a matmul multiplies, in batch order: those past
// the last full group of four get kRowOrderGemv, and all of them kRowOrderWide when there are 8
// or more. A sequence's orders depend only on its own rows, so batching sequences together
// changes none of them.
void MarkRowOrders(absl::Span<const int32_t> seq, absl::Span<const int32_t> rows,
                   std::vector<uint8_t>& orders) {
  std::map<int32_t, int64_t> count, seen;
  for (int32_t r : rows) ++count[seq[r]];
  for (int32_t r : rows) {
    const int64_t c = count[seq[r]];
    orders[r] = static_cast<uint8_t>((seen[seq[r]]++ >= c - c % 4 ? kRowOrderGemv : 0) |
                                     (c >= 8 ? kRowOrderWide : 0) |
                                     (c >= 2 ? kRowOrderAttnWide : 0));
  }
}

}  // namespace

// llama.cpp given the whole prompt of prompt_len tokens in one batch: rows past the last full
// group of four take its GEMV orders, all rows its tiled k-quant order when there are 8 or more
// and tinyBLAS attention when there are two or more; a generated token is a batch of one. The
// last layer's feed-forward runs on the output rows only: one row unless every position outputs.
void Batch::AddOrdered(int32_t token, int32_t position, int64_t seq_id, bool want_logits,
                       int32_t prompt_len, bool all_logits) {
  uint8_t o = kRowOrderGemv;
  if (position < prompt_len) {
    const int32_t l = prompt_len;
    o = static_cast<uint8_t>((position >= l - l % 4 ? kRowOrderGemv : 0) |
                             (l >= 8 ? kRowOrderWide : 0) | (l >= 2 ? kRowOrderAttnWide : 0));
  }
  orders.push_back(o);
  orders_last.push_back(all_logits && position < prompt_len ? o : kRowOrderGemv);
  Add(token, position, seq_id, want_logits);
}

namespace {

// `name`=own|llama (docs/config.md) into *own; unset or empty leaves it.
absl::Status ReadOrderSetting(const char* name, bool* own) {
  const char* order = std::getenv(name);
  if (order == nullptr || *order == '\0') return absl::OkStatus();
  const std::string_view v(order);
  if (v != "own" && v != "llama") {
    return absl::InvalidArgumentError(
        pd::StrCat(name, "=", v, ": want own (the default) or llama"));
  }
  *own = v == "own";
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> Model::Load(std::shared_ptr<const GgufFile> file,
                                                   Backend& backend, const LoadOptions& options) {
  Backend* const one[] = {&backend};
  PD_ASSIGN_OR_RETURN(const ModelConfig c, ModelConfig::FromGguf(*file));
  return Load(std::move(file), one, LayerPlacement::Single(c.n_layer), options);
}

absl::StatusOr<std::unique_ptr<Model>> Model::Load(std::shared_ptr<const GgufFile> file,
                                                   absl::Span<Backend* const> backends,
                                                   const LayerPlacement& placement,
                                                   const LoadOptions& options) {
  std::unique_ptr<Model> m(new Model(std::move(file)));
  PD_RETURN_IF_ERROR(ReadOrderSetting("PDSERVE_HEAD_ORDER", &m->head_order_own_));
  PD_RETURN_IF_ERROR(ReadOrderSetting("PDSERVE_LAYER_ORDER", &m->layer_order_own_));
  PD_ASSIGN_OR_RETURN(m->config_, ModelConfig::FromGguf(*m->file_));
  PD_ASSIGN_OR_RETURN(m->layer_backends_,
                      engine::LayerBackends(placement, m->config_.n_layer, backends));
  m->backends_.assign(backends.begin(), backends.end());
  m->placement_ = placement;
  for (int l = 0; l < m->config_.n_layer; ++l) {
    m->layer_backend_index_.push_back(placement.BackendOf(l));
    m->one_backend_ =
        m->one_backend_ && m->layer_backend_index_.back() == m->layer_backend_index_[0];
  }
  for (const LayerPlacement::Range& r : placement.ranges) {
    PD_RETURN_IF_ERROR(
        CheckBackend(*m->file_, m->config_, BackendKind(backends[r.backend]->name())));
  }
  PD_ASSIGN_OR_RETURN(
      m->weights_, Weights::Load(*m->file_, m->config_, m->layer_backends_,
                                 /*own_head_layout=*/options.no_f32_cache && m->head_order_own_,
                                 /*own_layer_layout=*/options.no_f32_cache && m->layer_order_own_));
  m->scratch_.resize(backends.size());
  return m;
}

absl::StatusOr<std::unique_ptr<Model>> Model::WithHead(const Model& target,
                                                       std::vector<int32_t> head_tokens) {
  std::unique_ptr<Model> m(new Model(target.file_));
  m->backends_ = target.backends_;
  m->layer_backends_ = target.layer_backends_;
  m->layer_backend_index_ = target.layer_backend_index_;
  m->one_backend_ = target.one_backend_;
  m->placement_ = target.placement_;
  PD_ASSIGN_OR_RETURN(m->weights_, Weights::WithHead(target.weights_, *target.file_, target.config_,
                                                     absl::MakeConstSpan(head_tokens),
                                                     *target.layer_backends_.back()));
  // Its head is plain rows, so it takes any cache; over F16 and INT8 ones the order of the
  // target's head (the own order through the flag, where the target's is laid out for it).
  m->head_order_own_ = target.head_order_own();
  m->layer_order_own_ = target.layer_order_own();  // the same layers
  m->config_ = target.config_;
  m->config_.tied_output = false;  // its head is its own rows
  m->config_.head_tokens = std::move(head_tokens);
  m->scratch_.resize(m->backends_.size());
  return m;
}

std::vector<std::string_view> Model::OpsUsed(const ModelConfig& c) {
  std::vector<std::string_view> ops = {"GetRows", "MatMul",    "RmsNorm", "Rope",
                                       "StoreKv", "Attention", "Add"};
  ops.push_back(c.ffn_act == FfnActivation::kGeluTanh ? "GeGlu" : "SwiGlu");
  if (c.n_expert > 0) {
    ops.push_back("Softmax");  // the router's probabilities; TopK below picks the experts
    ops.push_back("MoeCombine");
  }
  if (c.qkv_bias) ops.push_back("AddBias");
  if (c.embedding_scale > 0 || c.attention_scale > 0) ops.push_back("Scale");
  if (c.final_softcap > 0) ops.push_back("Softcap");
  ops.push_back("TopK");  // ForwardTop
  return ops;
}

absl::Status Model::CheckBackend(const GgufFile& file, std::string_view backend_kind) {
  PD_ASSIGN_OR_RETURN(const ModelConfig c, ModelConfig::FromGguf(file));
  return CheckBackend(file, c, backend_kind);
}

absl::Status Model::CheckBackend(const GgufFile& file, const ModelConfig& c,
                                 std::string_view backend_kind) {
  std::vector<DType> weight_types;  // of the matrices (norms and biases are 1-D)
  for (const GgufTensorInfo& t : file.tensors()) {
    if (t.shape.size() >= 2 &&
        std::find(weight_types.begin(), weight_types.end(), t.type) == weight_types.end()) {
      weight_types.push_back(t.type);
    }
  }
  const std::vector<std::string> missing = MissingOps(backend_kind, OpsUsed(c), weight_types);
  if (missing.empty()) return absl::OkStatus();
  std::string list;
  for (const std::string& op : missing) list = list.empty() ? op : StrCat(list, ", ", op);
  return absl::UnimplementedError(
      StrCat("the ", backend_kind, " backend cannot run this model (", c.arch, "): it lacks ", list,
             " (docs/architecture.md, \"Backends\"); use backend: cpu"));
}

KvCacheOptions Model::KvOptions(int n_blocks, KvDType dtype, int block_size) const {
  KvCacheOptions o;
  o.n_layer = config_.n_layer;
  o.n_kv_heads = config_.n_head_kv;
  o.head_dim = config_.head_dim;
  o.block_size = block_size;
  o.n_blocks = n_blocks;
  o.dtype = dtype;
  return o;
}

absl::Status Model::EnsureScratch(int64_t n_tokens, int64_t n_out) {
  if (n_tokens <= scratch_tokens_ && n_out <= scratch_out_) return absl::OkStatus();
  n_tokens = std::max(n_tokens, scratch_tokens_);
  n_out = std::max(n_out, scratch_out_);
  const ModelConfig& c = config_;
  const int64_t q_dim = int64_t{c.n_head} * c.head_dim;
  const int64_t kv_dim = int64_t{c.n_head_kv} * c.head_dim;
  const bool moe = c.n_expert > 0;
  const int64_t k = moe ? c.n_expert_used : 1;  // rows of the expert slots per token
  const int64_t cols[kNumSlots] = {c.n_embd,
                                   c.n_embd,
                                   q_dim,
                                   kv_dim,
                                   kv_dim,
                                   q_dim,
                                   c.n_embd,
                                   moe ? 1 : c.n_ff,
                                   moe ? 1 : c.n_ff,
                                   moe ? c.n_expert : 1,
                                   k,
                                   k,
                                   moe ? k * c.n_embd : 1,
                                   moe ? k * c.n_ff_exp : 1,
                                   moe ? k * c.n_ff_exp : 1,
                                   moe ? k * c.n_embd : 1,
                                   c.n_embd,
                                   c.n_embd,
                                   HeadRows(),
                                   kMaxTopK,
                                   kMaxTopK};
  const int head = layer_backend_index_.back();
  for (size_t bi = 0; bi < backends_.size(); ++bi) {
    std::vector<std::unique_ptr<Buffer>>& slots = scratch_[bi];
    slots.clear();
    if (std::find(layer_backend_index_.begin(), layer_backend_index_.end(), int(bi)) ==
        layer_backend_index_.end()) {
      continue;  // no layer runs there
    }
    for (int s = 0; s < kNumSlots; ++s) {
      if (s >= kOutX && static_cast<int>(bi) != head) {
        slots.push_back(nullptr);  // the output head runs on the last layer's backend only
        continue;
      }
      const int64_t rows = s >= kOutX ? n_out : n_tokens;
      PD_ASSIGN_OR_RETURN(auto buf, backends_[bi]->Allocate(sizeof(float) * cols[s] *
                                                            std::max<int64_t>(rows, 1)));
      slots.push_back(std::move(buf));
    }
  }
  scratch_tokens_ = n_tokens;
  scratch_out_ = n_out;
  return absl::OkStatus();
}

Tensor Model::Scratch(int backend, int index, int64_t cols, int64_t rows) {
  return Tensor{DType::kF32, cols, rows, scratch_[backend][index]->data()};
}

absl::Status Model::HandOff(int from, int to, int64_t n) {
  const Tensor src = Scratch(from, kX, config_.n_embd, n);
  const Tensor dst = Scratch(to, kX, config_.n_embd, n);
  Backend& a = *backends_[from];
  Backend& b = *backends_[to];
  if (a.host_memory() && b.host_memory()) {
    PD_RETURN_IF_ERROR(a.Synchronize());
    std::memcpy(dst.data, src.data, src.bytes());
    return absl::OkStatus();
  }
  handoff_.resize(static_cast<size_t>(src.numel()));
  PD_RETURN_IF_ERROR(a.Download(handoff_.data(), src.data, src.bytes()));
  PD_RETURN_IF_ERROR(a.Synchronize());
  return b.Upload(dst.data, handoff_.data(), dst.bytes());
}

absl::Status Model::Linear(Backend& b, const Tensor& w, const char* name, int layer,
                           const Tensor& x, Tensor& y, absl::Span<const uint8_t> row_orders) {
  if (observer_ != nullptr) {
    observe_buf_.resize(static_cast<size_t>(x.numel()));
    PD_RETURN_IF_ERROR(b.Download(observe_buf_.data(), x.data, x.bytes()));
    PD_RETURN_IF_ERROR(b.Synchronize());
    const std::string full = layer >= 0 ? pd::StrCat("blk.", layer, ".", name, ".weight")
                                        : pd::StrCat(name, ".weight");
    observer_->Observe(full, observe_buf_.data(), x.rows, x.cols);
  }
  return b.MatMulRowOrder(w, x, y, row_orders);
}

absl::Status Model::LinearGroup(Backend& b, std::initializer_list<LinearOut> outs, int layer,
                                const Tensor& x, absl::Span<const uint8_t> row_orders) {
  if (observer_ != nullptr) {
    for (const LinearOut& o : outs) {
      PD_RETURN_IF_ERROR(Linear(b, *o.w, o.name, layer, x, *o.y, row_orders));
    }
    return absl::OkStatus();
  }
  const Tensor* ws[4];
  Tensor* ys[4];
  size_t n = 0;
  for (const LinearOut& o : outs) {
    PD_CHECK(n < 4);
    ws[n] = o.w;
    ys[n] = o.y;
    ++n;
  }
  return b.MatMulGroup(absl::MakeConstSpan(ws, n), x, absl::MakeConstSpan(ys, n), row_orders);
}

absl::Status Model::ObserveIntermediate(Backend& b, const char* name, int layer, const Tensor& x) {
  if (observer_ == nullptr || !observer_->WantsIntermediates()) return absl::OkStatus();
  observe_buf_.resize(static_cast<size_t>(x.numel()));
  PD_RETURN_IF_ERROR(b.Download(observe_buf_.data(), x.data, x.bytes()));
  PD_RETURN_IF_ERROR(b.Synchronize());
  observer_->ObserveIntermediate(pd::StrCat("blk.", layer, ".", name), observe_buf_.data(), x.rows,
                                 x.cols);
  return absl::OkStatus();
}

// Routing as llama.cpp's build_moe_ffn with softmax gating and normalized weights: the router's
// logits, softmax over the experts, the n_expert_used most probable (TopK's rank order: ties to
// the lower expert id), their probabilities divided by their sum (summed in double and rounded
// to F32 as ggml_sum_rows does, clamped below at 2^-14). Unlike llama.cpp, which computes every
// expert for the whole batch through mul_mat_id, the tokens are sorted by expert and each expert
// multiplies only the rows routed to it: one gather, three matmuls per expert with work, one
// SwiGLU and one combine. Every expert row takes the single-row (GEMV) summation order, so that a
// token's result does not depend on which other tokens share its experts in a batch (batch
// invariance, docs/numerics.md).
absl::Status Model::MoeFeedForward(int bi, int layer, const Tensor& h, Tensor& o,
                                   absl::Span<const uint8_t> orders) {
  const ModelConfig& c = config_;
  const LayerWeights& w = weights_->layers[layer];
  Backend& b = *backends_[bi];
  const int64_t n = h.rows;
  const int k = c.n_expert_used;
  const int64_t nk = n * k;
  Tensor router = Scratch(bi, kRouter, c.n_expert, n);
  PD_RETURN_IF_ERROR(Linear(b, w.ffn_gate_inp, "ffn_gate_inp", layer, h, router, orders));
  PD_RETURN_IF_ERROR(b.Softmax(router));
  Tensor top_v = Scratch(bi, kMoeTopV, k, n);
  int32_t* top_i = static_cast<int32_t*>(Scratch(bi, kMoeTopI, k, n).data);
  PD_RETURN_IF_ERROR(b.TopK(router, k, top_v, top_i));
  MoeRouting& r = moe_;
  r.expert.resize(nk);
  r.prob.resize(nk);
  PD_RETURN_IF_ERROR(b.Download(r.prob.data(), top_v.data, nk * sizeof(float)));
  PD_RETURN_IF_ERROR(b.Download(r.expert.data(), top_i, nk * sizeof(int32_t)));
  PD_RETURN_IF_ERROR(b.Synchronize());

  // Weights, and the expert-sorted order of the (token, slot) pairs: by expert, then token.
  r.weight.resize(nk);
  r.first.assign(c.n_expert + 1, 0);
  for (int64_t t = 0; t < n; ++t) {
    double sum = 0;
    for (int j = 0; j < k; ++j) sum += r.prob[t * k + j];
    const float norm = std::max(static_cast<float>(sum), 6.103515625e-5f);
    for (int j = 0; j < k; ++j) {
      const int32_t e = r.expert[t * k + j];
      if (e < 0 || e >= c.n_expert) {
        return absl::InternalError(pd::StrCat("expert routing: expert ", e, " of token ", t,
                                              " in layer ", layer, " is outside [0, ",
                                              c.n_expert, ")"));
      }
      r.weight[t * k + j] = r.prob[t * k + j] / norm;
      ++r.first[e + 1];
    }
  }
  for (int e = 0; e < c.n_expert; ++e) r.first[e + 1] += r.first[e];
  r.gather.resize(nk);
  r.slot_row.resize(nk);
  std::vector<int64_t> next(r.first.begin(), r.first.end() - 1);
  for (int64_t t = 0; t < n; ++t) {
    for (int j = 0; j < k; ++j) {
      const int64_t row = next[r.expert[t * k + j]]++;
      r.gather[row] = static_cast<int32_t>(t);
      r.slot_row[t * k + j] = static_cast<int32_t>(row);
    }
  }
  r.orders.assign(nk, kRowOrderGemv);

  Tensor in = Scratch(bi, kMoeIn, c.n_embd, nk);
  Tensor gate = Scratch(bi, kMoeGate, c.n_ff_exp, nk);
  Tensor up = Scratch(bi, kMoeUp, c.n_ff_exp, nk);
  Tensor out = Scratch(bi, kMoeOut, c.n_embd, nk);
  PD_RETURN_IF_ERROR(b.GetRows(h, absl::MakeConstSpan(r.gather), in));
  for (int e = 0; e < c.n_expert; ++e) {
    const int64_t first = r.first[e], m = r.first[e + 1] - first;
    if (m == 0) continue;
    const Tensor we_gate = w.Expert(w.gate_exps, e), we_up = w.Expert(w.up_exps, e);
    Tensor g = gate.Rows(first, m), u = up.Rows(first, m);
    const absl::Span<const uint8_t> ord = absl::MakeConstSpan(r.orders).subspan(first, m);
    PD_RETURN_IF_ERROR(LinearGroup(b, {{&we_gate, "ffn_gate_exps", &g}, {&we_up, "ffn_up_exps", &u}},
                                   layer, in.Rows(first, m), ord));
  }
  PD_RETURN_IF_ERROR(b.SwiGlu(gate, up, gate));
  for (int e = 0; e < c.n_expert; ++e) {
    const int64_t first = r.first[e], m = r.first[e + 1] - first;
    if (m == 0) continue;
    Tensor y = out.Rows(first, m);
    PD_RETURN_IF_ERROR(Linear(b, w.Expert(w.down_exps, e), "ffn_down_exps", layer,
                              gate.Rows(first, m), y,
                              absl::MakeConstSpan(r.orders).subspan(first, m)));
  }
  return b.MoeCombine(out, absl::MakeConstSpan(r.slot_row), absl::MakeConstSpan(r.weight), k, o);
}

absl::Status Model::Forward(const Batch& batch, KvCache& kv, std::vector<float>* logits,
                            const LayerHook& after_kv_store) {
  if (logits == nullptr) {
    Tensor out_logits;
    return Run(batch, kv, after_kv_store, false, &out_logits);
  }
  return RunToLogits(batch, kv, after_kv_store, logits, nullptr);
}

absl::Status Model::RunToLogits(const Batch& batch, KvCache& kv, const LayerHook& after_kv_store,
                                std::vector<float>* logits, std::vector<float>* hidden) {
  const bool in_place = config_.head_tokens.empty() && backend().host_memory();
  Tensor out_logits;
  absl::Status st =
      Run(batch, kv, after_kv_store, true, &out_logits, hidden, in_place ? logits : nullptr);
  if (st.ok() && out_logits.rows > 0) {
    st = in_place ? backend().Synchronize() : DownloadLogits(out_logits, logits);
  }
  if (!st.ok() || out_logits.rows == 0) logits->clear();  // no stale rows behind an error
  return st;
}

absl::Status Model::ForwardHidden(const Batch& batch, KvCache& kv, std::vector<float>* logits,
                                  std::vector<float>* hidden) {
  if (logits == nullptr || hidden == nullptr) {
    return absl::InvalidArgumentError("ForwardHidden: null output");
  }
  return RunToLogits(batch, kv, nullptr, logits, hidden);
}

absl::Status Model::DownloadLogits(const Tensor& out_logits, std::vector<float>* logits) {
  const ModelConfig& c = config_;
  Backend& b = backend();
  const int64_t n_out = out_logits.rows;
  // Every element is written below, so a vector reused at the same size (a decode loop's) is
  // not zero-filled again.
  logits->resize(static_cast<size_t>(n_out) * c.n_vocab);
  if (c.head_tokens.empty()) {
    PD_RETURN_IF_ERROR(b.Download(logits->data(), out_logits.data, out_logits.bytes()));
    return b.Synchronize();
  }
  // A restricted head: its [n_out, head_rows] scores go to their token ids; every other id gets
  // -infinity, so that a sampler's probability there is exactly 0. (The device sends head_rows
  // floats per row, not n_vocab; the scatter is n_vocab stores per row on the host.)
  head_logits_.resize(static_cast<size_t>(out_logits.numel()));
  PD_RETURN_IF_ERROR(b.Download(head_logits_.data(), out_logits.data, out_logits.bytes()));
  PD_RETURN_IF_ERROR(b.Synchronize());
  std::fill(logits->begin(), logits->end(), -std::numeric_limits<float>::infinity());
  const int64_t rows = HeadRows();
  for (int64_t j = 0; j < n_out; ++j) {
    float* dst = logits->data() + j * c.n_vocab;
    const float* src = head_logits_.data() + j * rows;
    for (int64_t i = 0; i < rows; ++i) dst[c.head_tokens[i]] = src[i];
  }
  return absl::OkStatus();
}

absl::Status Model::ForwardTop(const Batch& batch, KvCache& kv, int k, TopLogits* top,
                               const LayerHook& after_kv_store) {
  const ModelConfig& c = config_;
  if (top == nullptr) return absl::InvalidArgumentError("ForwardTop: null output");
  if (k < 1 || k > std::min<int64_t>(c.n_vocab, kMaxTopK)) {
    return absl::InvalidArgumentError(pd::StrCat("ForwardTop: k = ", k, " is outside [1, min(",
                                                 c.n_vocab, " tokens, ", kMaxTopK, ")]"));
  }
  Tensor out_logits;
  PD_RETURN_IF_ERROR(Run(batch, kv, after_kv_store, true, &out_logits));
  const int64_t n_out = out_logits.rows;
  top->k = k;
  top->ids.resize(static_cast<size_t>(n_out) * k);
  top->values.resize(top->ids.size());
  if (n_out == 0) return absl::OkStatus();
  if (!c.head_tokens.empty()) {
    // A restricted head (a draft model's): its rows are not token ids, so rank the scattered
    // rows on the host. Draft models sample on the host anyway.
    PD_RETURN_IF_ERROR(DownloadLogits(out_logits, &top_scratch_));
    for (int64_t j = 0; j < n_out; ++j) {
      RowTopK(top_scratch_.data() + j * c.n_vocab, c.n_vocab, k, top->ids.data() + j * k,
              top->values.data() + j * k);
    }
    return absl::OkStatus();
  }
  const int cur = layer_backend_index_.back();
  Backend& b = backend();
  Tensor values = Scratch(cur, kTopValues, k, n_out);
  int32_t* ids = static_cast<int32_t*>(Scratch(cur, kTopIds, k, n_out).data);
  PD_RETURN_IF_ERROR(b.TopK(out_logits, k, values, ids));
  PD_RETURN_IF_ERROR(b.Download(top->values.data(), values.data, values.bytes()));
  PD_RETURN_IF_ERROR(b.Download(top->ids.data(), ids, top->ids.size() * sizeof(int32_t)));
  return b.Synchronize();
}

absl::Status Model::Run(const Batch& batch, KvCache& kv, const LayerHook& after_kv_store, bool head,
                        Tensor* out, std::vector<float>* hidden, std::vector<float>* host_logits) {
  const bool capturable = one_backend_ && head && !after_kv_store && observer_ == nullptr &&
                          hidden == nullptr && host_logits == nullptr && config_.n_expert == 0 &&
                          batch.head_x.empty() && !batch.logits_rows.empty() && batch.size() > 0;
  if (capturable) {
    // What a recording may not do: grow the activation buffers (allocations wait for the device).
    const int64_t n = static_cast<int64_t>(batch.size());
    PD_RETURN_IF_ERROR(EnsureScratch(n, static_cast<int64_t>(batch.logits_rows.size())));
    Backend& b = *backends_[layer_backend_index_.front()];
    if (b.BeginCapture(n)) {
      const absl::Status st = RunOps(batch, kv, after_kv_store, head, out, hidden, host_logits);
      PD_ASSIGN_OR_RETURN(const bool ran, b.EndCapture(st.ok()));
      if (ran) return absl::OkStatus();
      if (st.code() != absl::StatusCode::kAborted) PD_RETURN_IF_ERROR(st);
      // Recording abandoned (an op asked for it, or the backend could not record): run again.
    }
  }
  return RunOps(batch, kv, after_kv_store, head, out, hidden, host_logits);
}

absl::Status Model::RunOps(const Batch& batch, KvCache& kv, const LayerHook& after_kv_store,
                           bool head, Tensor* out, std::vector<float>* hidden,
                           std::vector<float>* host_logits) {
  *out = Tensor{DType::kF32, HeadRows(), 0, nullptr};
  const ModelConfig& c = config_;
  const int64_t n = static_cast<int64_t>(batch.size());
  if (n == 0) return absl::InvalidArgumentError("empty batch");
  if ((head_laid_out_own() || layers_laid_out_own()) && kv.options().dtype == KvDType::kF32) {
    return absl::FailedPreconditionError(
        "an F32 cache needs llama.cpp's orders in the matmuls, and this model was loaded "
        "for F16 and INT8 caches (weights laid out for pdserve's own order: "
        "Model::LoadOptions::no_f32_cache); load it without that option");
  }
  if (batch.pos.size() != batch.tokens.size() || batch.seq.size() != batch.tokens.size()) {
    return absl::InvalidArgumentError("batch tokens/pos/seq lengths differ");
  }
  // Validate inputs and build the per-sequence block tables.
  std::map<int64_t, int32_t> seq_index;
  std::vector<int32_t> seq_of_token(n);
  KvBatch kvb;
  kvb.block_size = kv.options().block_size;
  for (int64_t i = 0; i < n; ++i) {
    if (batch.tokens[i] < 0 || batch.tokens[i] >= c.n_vocab) {
      return absl::InvalidArgumentError(
          pd::StrCat("token id ", batch.tokens[i], " is outside the vocabulary of ", c.n_vocab));
    }
    if (batch.pos[i] < 0) {
      return absl::InvalidArgumentError(pd::StrCat("negative position ", batch.pos[i]));
    }
    auto [it, inserted] = seq_index.emplace(batch.seq[i], static_cast<int32_t>(seq_index.size()));
    if (inserted) {
      const std::vector<int32_t>& table = kv.BlockTable(batch.seq[i]);
      kvb.block_tables.push_back(absl::MakeConstSpan(table));
    }
    if (batch.pos[i] >= kv.Capacity(batch.seq[i])) {
      return absl::InvalidArgumentError(pd::StrCat("position ", batch.pos[i], " of sequence ",
                                                   batch.seq[i], " is beyond its reserved KV (",
                                                   kv.Capacity(batch.seq[i]), " slots)"));
    }
    seq_of_token[i] = it->second;
  }
  for (int32_t r : batch.logits_rows) {
    if (r < 0 || r >= n) return absl::InvalidArgumentError("logits row out of range");
  }
  if (batch.head_x.size() % static_cast<size_t>(c.n_embd) != 0) {
    return absl::InvalidArgumentError(
        pd::StrCat("head_x holds ", batch.head_x.size(), " floats, not rows of ", c.n_embd));
  }
  if (!batch.head_x.empty() && !head) {
    return absl::InvalidArgumentError("head_x rows in a forward without logits");
  }
  kvb.pos = absl::MakeConstSpan(batch.pos);
  kvb.seq = absl::MakeConstSpan(seq_of_token);
  const int64_t n_logits = static_cast<int64_t>(batch.logits_rows.size());
  const int64_t n_head_x = static_cast<int64_t>(batch.head_x.size()) / c.n_embd;
  const int64_t n_out = n_logits + n_head_x;  // rows through the output head
  PD_RETURN_IF_ERROR(EnsureScratch(n, n_out));

  // Row orders (MarkRowOrders): every layer's matmuls over the whole batch; llama.cpp runs the
  // last layer's feed-forward and the output head on the output rows only, so there a row's order
  // follows its place among its sequence's output rows.
  absl::Span<const uint8_t> orders = batch.orders, orders_last = batch.orders_last;
  std::vector<uint8_t> own, own_last;  // when the batch carries no orders (rows added with Add)
  if (static_cast<int64_t>(orders.size()) != n || static_cast<int64_t>(orders_last.size()) != n) {
    std::vector<int32_t> all_rows(n);
    for (int64_t i = 0; i < n; ++i) all_rows[i] = static_cast<int32_t>(i);
    own.resize(n);
    MarkRowOrders(seq_of_token, all_rows, own);
    own_last = own;
    if (n_logits > 0) MarkRowOrders(seq_of_token, batch.logits_rows, own_last);
    orders = own;
    orders_last = own_last;
  }
  std::vector<uint8_t> orders_out(n_out, kRowOrderGemv);  // head_x rows: the one-row order
  for (int64_t j = 0; j < n_logits; ++j) orders_out[j] = orders_last[batch.logits_rows[j]];
  // llama.cpp's bits hold with an F32 cache only (docs/numerics.md); with any other, the head
  // may take the backend's own order (set_head_order_own), the same for a row in any batch.
  if (head_order_own() && kv.options().dtype != KvDType::kF32) {
    for (uint8_t& o : orders_out) o |= kRowOrderOwn;
  }
  kvb.row_orders = orders;
  // The layers' matmuls likewise (layer_order_own); attention keeps its own orders (kvb).
  std::vector<uint8_t> layer_own, layer_own_last;
  if (layer_order_own() && kv.options().dtype != KvDType::kF32) {
    layer_own.assign(orders.begin(), orders.end());
    layer_own_last.assign(orders_last.begin(), orders_last.end());
    for (uint8_t& o : layer_own) o |= kRowOrderOwn;
    for (uint8_t& o : layer_own_last) o |= kRowOrderOwn;
    orders = layer_own;
    orders_last = layer_own_last;
  }

  const int64_t q_dim = int64_t{c.n_head} * c.head_dim;
  const int64_t kv_dim = int64_t{c.n_head_kv} * c.head_dim;
  // The activations of the backend that runs the current layer (rebound at each boundary).
  int cur = layer_backend_index_.front();
  Backend* bp = backends_[cur];
  Tensor x, h, q, k, v, attn, o, gate, up, q_heads, k_heads;
  const auto bind = [&](int bi) {
    cur = bi;
    bp = backends_[bi];
    x = Scratch(bi, kX, c.n_embd, n);
    h = Scratch(bi, kH, c.n_embd, n);
    q = Scratch(bi, kQ, q_dim, n);
    k = Scratch(bi, kK, kv_dim, n);
    v = Scratch(bi, kV, kv_dim, n);
    attn = Scratch(bi, kAttn, q_dim, n);
    o = Scratch(bi, kO, c.n_embd, n);
    gate = Scratch(bi, kGate, c.n_ff, n);
    up = Scratch(bi, kUp, c.n_ff, n);
    // Per-head views for Q/K norms: [n_tokens * heads, head_dim].
    q_heads = Tensor{DType::kF32, c.head_dim, n * c.n_head, q.data};
    k_heads = Tensor{DType::kF32, c.head_dim, n * c.n_head_kv, k.data};
  };
  bind(cur);

  RopeParams rope;
  rope.mode = c.rope_mode;
  rope.head_dim = c.head_dim;
  rope.rot_dim = c.rope_dim;
  rope.freq_factors = absl::MakeConstSpan(weights_->rope_freq_factors);
  AttentionParams ap;
  ap.n_heads = c.n_head;
  ap.n_kv_heads = c.n_head_kv;
  ap.head_dim = c.head_dim;
  // Architectures with an explicit query scale apply it to Q (as llama.cpp does); the others
  // scale the Q.K logits.
  ap.scale = c.attention_scale > 0 ? 1.0f : 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  ap.softcap = c.attn_softcap;
  const absl::Span<const int32_t> pos = absl::MakeConstSpan(batch.pos);

  PD_RETURN_IF_ERROR(bp->GetRows(weights_->token_embd, absl::MakeConstSpan(batch.tokens), x));
  if (c.embedding_scale > 0) PD_RETURN_IF_ERROR(bp->Scale(x, c.embedding_scale, x));
  for (int l = 0; l < c.n_layer; ++l) {
    if (layer_backend_index_[l] != cur) {
      PD_RETURN_IF_ERROR(HandOff(cur, layer_backend_index_[l], n));
      bind(layer_backend_index_[l]);
    }
    Backend& b = *bp;
    const LayerWeights& w = weights_->layers[l];
    const bool sliding = c.IsSlidingLayer(l);
    rope.freq_base = sliding ? c.rope_freq_base_swa : c.rope_freq_base;
    rope.freq_scale = sliding ? c.rope_freq_scale_swa : c.rope_freq_scale;
    ap.window = sliding ? c.sliding_window : 0;
    // Attention block.  h = norm(x); q,k,v = h W^T (+ b); [qk norm]; rope; store; attend;
    // x += [post norm](attn Wo^T)
    PD_RETURN_IF_ERROR(b.RmsNorm(x, w.attn_norm, c.rms_eps, h));
    // Views of a fused matrix report their inputs under the file's one name: a quantizer's
    // calibration files its statistics by tensor name.
    const bool fq = w.fused_qkv;
    PD_RETURN_IF_ERROR(LinearGroup(b,
                                   {{&w.wq, fq ? "attn_qkv" : "attn_q", &q},
                                    {&w.wk, fq ? "attn_qkv" : "attn_k", &k},
                                    {&w.wv, fq ? "attn_qkv" : "attn_v", &v}},
                                   l, h, orders));
    if (w.bq.data != nullptr) {
      PD_RETURN_IF_ERROR(b.AddBias(q, w.bq, q));
      PD_RETURN_IF_ERROR(b.AddBias(k, w.bk, k));
      PD_RETURN_IF_ERROR(b.AddBias(v, w.bv, v));
    }
    if (c.qk_norm) {
      PD_RETURN_IF_ERROR(b.RmsNorm(q_heads, w.q_norm, c.rms_eps, q_heads));
      PD_RETURN_IF_ERROR(b.RmsNorm(k_heads, w.k_norm, c.rms_eps, k_heads));
    }
    PD_RETURN_IF_ERROR(b.Rope(q, c.n_head, pos, rope));
    PD_RETURN_IF_ERROR(b.Rope(k, c.n_head_kv, pos, rope));
    PD_RETURN_IF_ERROR(ObserveIntermediate(b, "Qcur", l, q));
    PD_RETURN_IF_ERROR(ObserveIntermediate(b, "Kcur", l, k));
    PD_RETURN_IF_ERROR(ObserveIntermediate(b, "Vcur", l, v));
    if (c.attention_scale > 0) PD_RETURN_IF_ERROR(b.Scale(q, c.attention_scale, q));
    PD_RETURN_IF_ERROR(b.StoreKv(k, v, kv.k(l), kv.v(l), kvb));
    if (after_kv_store) {
      PD_RETURN_IF_ERROR(b.Synchronize());
      after_kv_store(l);
    }
    PD_RETURN_IF_ERROR(b.Attention(q, kv.k(l), kv.v(l), kvb, ap, attn));
    PD_RETURN_IF_ERROR(Linear(b, w.wo, "attn_output", l, attn, o, orders));
    if (c.post_norms) PD_RETURN_IF_ERROR(b.RmsNorm(o, w.post_attn_norm, c.rms_eps, o));
    PD_RETURN_IF_ERROR(b.Add(x, o, x));
    // Feed-forward block.  x += [post norm]((act(h Wg^T) * (h Wu^T)) Wd^T)
    PD_RETURN_IF_ERROR(b.RmsNorm(x, w.ffn_norm, c.rms_eps, h));
    const absl::Span<const uint8_t> ffn_orders = l + 1 == c.n_layer ? orders_last : orders;
    if (c.n_expert > 0) {
      PD_RETURN_IF_ERROR(MoeFeedForward(cur, l, h, o, ffn_orders));
      PD_RETURN_IF_ERROR(ObserveIntermediate(b, "ffn_out", l, o));
      if (c.post_norms) PD_RETURN_IF_ERROR(b.RmsNorm(o, w.post_ffn_norm, c.rms_eps, o));
      PD_RETURN_IF_ERROR(b.Add(x, o, x));
      continue;
    }
    PD_RETURN_IF_ERROR(LinearGroup(
        b, {{&w.w_gate, w.fused_gate_up ? "ffn_up" : "ffn_gate", &gate}, {&w.w_up, "ffn_up", &up}},
        l, h, ffn_orders));
    PD_RETURN_IF_ERROR(ObserveIntermediate(b, "ffn_gate", l, gate));
    PD_RETURN_IF_ERROR(ObserveIntermediate(b, "ffn_up", l, up));
    if (c.ffn_act == FfnActivation::kGeluTanh) {
      PD_RETURN_IF_ERROR(b.GeGlu(gate, up, gate));
    } else {
      PD_RETURN_IF_ERROR(b.SwiGlu(gate, up, gate));
    }
    PD_RETURN_IF_ERROR(Linear(b, w.w_down, "ffn_down", l, gate, o, ffn_orders));
    PD_RETURN_IF_ERROR(ObserveIntermediate(b, "ffn_out", l, o));
    if (c.post_norms) PD_RETURN_IF_ERROR(b.RmsNorm(o, w.post_ffn_norm, c.rms_eps, o));
    PD_RETURN_IF_ERROR(b.Add(x, o, x));
  }
  Backend& b = *bp;  // the last layer's, which holds the output head
  if (!head || n_out == 0) return b.Synchronize();

  // Only the rows whose logits are wanted go through the output head.
  Tensor out_x = Scratch(cur, kOutX, c.n_embd, n_out);
  Tensor out_h = Scratch(cur, kOutH, c.n_embd, n_out);
  Tensor out_logits = Scratch(cur, kLogits, HeadRows(), n_out);
  if (host_logits != nullptr) {
    // Every element is written by the head, so a vector reused at the same size (a decode
    // loop's) is not zero-filled again either.
    host_logits->resize(static_cast<size_t>(out_logits.numel()));
    out_logits.data = host_logits->data();
  }
  if (n_logits > 0) {
    Tensor rows = out_x.Rows(0, n_logits);
    PD_RETURN_IF_ERROR(b.GetRows(x, absl::MakeConstSpan(batch.logits_rows), rows));
    if (hidden != nullptr) {
      hidden->resize(static_cast<size_t>(rows.numel()));
      PD_RETURN_IF_ERROR(b.Download(hidden->data(), rows.data, rows.bytes()));
    }
  } else if (hidden != nullptr) {
    hidden->clear();
  }
  if (n_head_x > 0) {
    Tensor rows = out_x.Rows(n_logits, n_head_x);
    PD_RETURN_IF_ERROR(b.Upload(rows.data, batch.head_x.data(), rows.bytes()));
  }
  PD_RETURN_IF_ERROR(b.RmsNorm(out_x, weights_->output_norm, c.rms_eps, out_h));
  PD_RETURN_IF_ERROR(Linear(b, weights_->output, c.tied_output ? "token_embd" : "output", -1,
                            out_h, out_logits, orders_out));
  if (c.final_softcap > 0) PD_RETURN_IF_ERROR(b.Softcap(out_logits, c.final_softcap, out_logits));
  *out = out_logits;
  return absl::OkStatus();
}

}  // namespace pd::engine
