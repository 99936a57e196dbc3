// The forward pass of a decoder-only transformer over a batch of tokens from any number of
// sequences (prefill chunks and decode tokens mixed), on one Backend or on several by a
// LayerPlacement (placement.h: layers split between a GPU and the CPU), reading/writing a paged
// KvCache. One shared implementation serves every supported architecture; ModelConfig selects
// the differences (rope mode, biases, tied head).
//
// Not thread safe: owned by one engine loop. Holds scratch buffers sized to the largest batch.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backend/backend.h"
#include "engine/kv/kv_cache.h"
#include "engine/model/gguf.h"
#include "engine/model/model_config.h"
#include "engine/model/weights.h"
#include "engine/runtime/placement.h"

namespace pd::engine {

struct Batch {
  std::vector<int32_t> tokens;       // [n]
  std::vector<int32_t> pos;          // [n] absolute position of each token in its sequence
  std::vector<int64_t> seq;          // [n] KV-cache sequence id of each token
  std::vector<int32_t> logits_rows;  // indices into tokens whose next-token logits are wanted

  // Summation orders (Backend::MatMulRowOrder flags) per row, for every layer and for the last
  // layer's feed-forward and the output head. Filled by AddOrdered for all rows, they make each
  // row's numerics depend on its place in its own prompt only: chunking a prompt or batching it
  // with other sequences changes no bit, and a prompt given in one batch gets llama.cpp's orders.
  // Empty (rows added with Add): the orders follow this batch's rows of each sequence.
  std::vector<uint8_t> orders, orders_last;

  // Rows for the output head only, n_embd floats each: final hidden states (before the output
  // norm) that an earlier forward computed and returned (Model::ForwardHidden), so that their
  // layers are not run again: the verifying step of the self-head drafter. Their logits follow
  // the logits_rows' in the output, in this order, with the one-row summation order.
  std::vector<float> head_x;

  void Add(int32_t token, int32_t position, int64_t seq_id, bool want_logits) {
    if (want_logits) logits_rows.push_back(static_cast<int32_t>(tokens.size()));
    tokens.push_back(token);
    pos.push_back(position);
    seq.push_back(seq_id);
  }
  // A row of a sequence whose prompt has prompt_len tokens (position >= prompt_len: a generated
  // token); all_logits: every prompt position of the sequence outputs logits (else only the last).
  void AddOrdered(int32_t token, int32_t position, int64_t seq_id, bool want_logits,
                  int32_t prompt_len, bool all_logits = false);
  size_t size() const { return tokens.size(); }
};

// ForwardTop's result: for logits row r (logits_rows order), its best k token ids and their
// logits, best first.
struct TopLogits {
  int k = 0;
  std::vector<int32_t> ids;   // [rows * k]
  std::vector<float> values;  // [rows * k]
  absl::Span<const int32_t> Ids(size_t row) const {
    return absl::MakeConstSpan(ids.data() + row * k, static_cast<size_t>(k));
  }
  absl::Span<const float> Values(size_t row) const {
    return absl::MakeConstSpan(values.data() + row * k, static_cast<size_t>(k));
  }
};

// Sees the input of every weight matmul during Model::Forward: what quantizers calibrate on.
// Called on the engine thread, synchronously, with host copies of the activations.
class MatMulObserver {
 public:
  virtual ~MatMulObserver() = default;
  // `weight`: the GGUF tensor name ("blk.3.ffn_down.weight"); `x`: [rows, cols] F32 activations.
  virtual void Observe(std::string_view weight, const float* x, int64_t rows, int64_t cols) = 0;
  // Wants the attention intermediates too (ObserveIntermediate); off by default, so that an
  // observer that only calibrates costs no extra copies.
  virtual bool WantsIntermediates() const { return false; }
  // Q and K after RoPE (before any query scale), V, and the feed-forward output (before its post
  // norm), per layer: `name` is "blk.L.Qcur", "blk.L.Kcur", "blk.L.Vcur" or "blk.L.ffn_out"; `x`:
  // [rows, cols] F32.
  virtual void ObserveIntermediate(std::string_view name, const float* x, int64_t rows,
                                   int64_t cols) {}
};

struct ModelLoadOptions {
  // The model will run over F16 or INT8 caches only (a daemon's kv.dtype). Then, where the
  // output head takes pdserve's own order (head_order_own) and its backend has a layout for
  // that order (the CPU backend with AVX512-VNNI: a Q8_0 head as q8_0x16), the head, and a tied
  // token embedding with it, are mapped in that layout instead of the file's: no second copy,
  // and a batched decode step's head runs without transposing its blocks. A forward over an
  // F32 cache is then refused (FAILED_PRECONDITION): the head could not give llama.cpp's bits.
  // The layers' Q8_0, Q5_0, Q4_K and Q6_K matrices likewise where they take the own order
  // (layer_order_own: q8_0x16, q5_0x16, q4_Kx16, q6_Kx16), so a small batch's layer matmuls cost
  // little more than one row's.
  bool no_f32_cache = false;
};

class Model {
 public:
  using LoadOptions = ModelLoadOptions;

  // Reads the config, validates and maps the weights. `file` is shared so the mapped bytes
  // outlive the model; `backend` must outlive it.
  static absl::StatusOr<std::unique_ptr<Model>> Load(std::shared_ptr<const GgufFile> file,
                                                     Backend& backend,
                                                     const LoadOptions& options = {});
  // The layers on the backends `placement` assigns them (backends[i] is placement's backend i;
  // every backend must outlive the model). INVALID_ARGUMENT for a placement that does not cover
  // the model's layers; UNIMPLEMENTED when a backend lacks an op the model needs.
  static absl::StatusOr<std::unique_ptr<Model>> Load(std::shared_ptr<const GgufFile> file,
                                                     absl::Span<Backend* const> backends,
                                                     const LayerPlacement& placement,
                                                     const LoadOptions& options = {});

  // `target` with its output head restricted to `head_tokens` (ascending token ids < n_vocab, no
  // repeats): the same layers, placement and backends (shared, not copied), and a copy of those
  // rows of the target's head (Weights::WithHead). Its logits at those ids are the target's bit
  // for bit, -infinity elsewhere, at a fraction of the head's cost: the target as its own draft
  // (spec::self-head, docs/speculative.md). It has its own scratch, so it may run between the
  // target's forwards (one thread at a time); the backends must outlive it. Errors as WithHead's.
  static absl::StatusOr<std::unique_ptr<Model>> WithHead(const Model& target,
                                                         std::vector<int32_t> head_tokens);

  // The Backend ops a forward pass of a model with config `c` calls ("MatMul", "Rope", ...).
  static std::vector<std::string_view> OpsUsed(const ModelConfig& c);
  // OK when a backend of kind `backend_kind` ("cpu", "cuda"; op_support.h) runs every op the
  // model in `file` needs, with its weight types; else UNIMPLEMENTED naming each missing op. Needs
  // no device: the node runtime asks before creating the backend. Load() checks it too.
  static absl::Status CheckBackend(const GgufFile& file, std::string_view backend_kind);
  // The same for a config already read from `file` (Load() checks with the config it parsed).
  static absl::Status CheckBackend(const GgufFile& file, const ModelConfig& c,
                                   std::string_view backend_kind);

  const ModelConfig& config() const { return config_; }
  const Weights& weights() const { return *weights_; }
  const GgufFile& file() const { return *file_; }
  // The backend of the output head: the last layer's (the only one for an unplaced model).
  Backend& backend() { return *layer_backends_.back(); }
  // One backend per layer (a KV cache for this model: KvCache::Create(options, LayerBackends())).
  const std::vector<Backend*>& LayerBackends() const { return layer_backends_; }
  const LayerPlacement& placement() const { return placement_; }
  // The output head's order over an F16 or INT8 cache (docs/numerics.md): the backend's own
  // (kRowOrderOwn; on the CPU a Q8_0 head with AVX512-VNNI: the default) or llama.cpp's. Load
  // sets it from PDSERVE_HEAD_ORDER (own | llama); WithHead copies the target's. F32 caches keep
  // llama.cpp's order either way. A head laid out for the own order at load
  // (LoadOptions::no_f32_cache) keeps it: set_head_order_own(false) does not change it.
  void set_head_order_own(bool own) { head_order_own_ = own; }
  bool head_order_own() const { return head_order_own_ || head_laid_out_own(); }
  // Whether Load laid the head out for the own order (LoadOptions::no_f32_cache).
  bool head_laid_out_own() const {
    return weights_->output.type == DType::kQ8_0x16 || weights_->output.type == DType::kQ5_0x16 ||
           weights_->output.type == DType::kQ4_Kx16 || weights_->output.type == DType::kQ6_Kx16;
  }
  // The layers' matmuls' order over an F16 or INT8 cache (docs/numerics.md): the backend's own
  // (kRowOrderOwn on every row; on the CPU Q8_0, Q5_0, Q4_K and Q6_K matrices with AVX512-VNNI:
  // the default)
  // or llama.cpp's. Load sets it from PDSERVE_LAYER_ORDER (own | llama); WithHead copies the
  // target's. Layers laid out for it at load keep it: set_layer_order_own(false) does not change
  // them.
  void set_layer_order_own(bool own) { layer_order_own_ = own; }
  bool layer_order_own() const { return layer_order_own_ || layers_laid_out_own(); }
  // Whether Load laid any layer matrix out for the own order (LoadOptions::no_f32_cache).
  bool layers_laid_out_own() const { return weights_->layers_laid_out_own(); }

  // KV-cache options matching this model.
  KvCacheOptions KvOptions(int n_blocks, KvDType dtype, int block_size = 16) const;

  // Runs `batch`. Preconditions (checked, INVALID_ARGUMENT): token ids < n_vocab, positions >= 0,
  // each sequence's KV capacity covers its positions (KvCache::Reserve first). `kv` holds each
  // layer's K/V on that layer's backend (KvCache::Create with LayerBackends()). On success
  // `logits` holds logits_rows.size() rows of n_vocab floats, in logits_rows order; on an error
  // it is empty. A draft model with a restricted head (ModelConfig::head_tokens) computes the
  // head over its rows only and gives -infinity at every id outside them.
  //
  // `after_kv_store` (may be empty) runs once per layer, right after that layer's K/V of the
  // batch were written to `kv` and the backend synchronized, before its attention: the KV of
  // layer l is final from then on, so a KV transfer can send it while the later layers compute
  // (docs/architecture.md, request path step 4). It runs on the calling thread and must not touch
  // `kv`'s block tables.
  using LayerHook = std::function<void(int layer)>;
  absl::Status Forward(const Batch& batch, KvCache& kv, std::vector<float>* logits,
                       const LayerHook& after_kv_store = nullptr);
  // Forward that also returns, in *hidden, the final hidden state (the last layer's output,
  // before the output norm) of each logits row: logits_rows.size() rows of n_embd floats, what a
  // later batch's head_x takes. (Not of head_x rows.)
  absl::Status ForwardHidden(const Batch& batch, KvCache& kv, std::vector<float>* logits,
                             std::vector<float>* hidden);
  // Forward that keeps the logits on the head's backend and copies back only each logits row's k
  // best entries (Backend::TopK; 1 <= k <= min(n_vocab, kMaxTopK), else INVALID_ARGUMENT): what
  // a sampler needs when its result depends on those alone (Sampler::TopNeeded). The entries are
  // those of Forward's rows, in top_k.h's rank order.
  absl::Status ForwardTop(const Batch& batch, KvCache& kv, int k, TopLogits* top,
                          const LayerHook& after_kv_store = nullptr);

  // Observer of matmul inputs (nullptr = none, the default). Not owned; must outlive its use.
  void set_observer(MatMulObserver* observer) { observer_ = observer; }

 private:
  explicit Model(std::shared_ptr<const GgufFile> file) : file_(std::move(file)) {}
  absl::Status EnsureScratch(int64_t n_tokens, int64_t n_out);
  // The forward pass up to the output head. head: compute the logits rows into *out (on the
  // head's backend, [logits_rows.size(), HeadRows()]); otherwise, and for a batch without logits
  // rows, *out has no rows and the backends are synchronized. host_logits (only where the head's
  // backend has host memory): sized to the head's rows, which the head writes into instead of
  // scratch, *out pointing at them.
  //
  // A step that its backend can capture (Backend::BeginCapture: one backend for every layer, no
  // experts, no hook, observer, hidden rows or head_x rows, logits rows wanted) is recorded and
  // started as one unit; where the backend declines or abandons the recording, the same ops run
  // again without it.
  absl::Status Run(const Batch& batch, KvCache& kv, const LayerHook& after_kv_store, bool head,
                   Tensor* out, std::vector<float>* hidden = nullptr,
                   std::vector<float>* host_logits = nullptr);
  // Run's ops, enqueued on the backends as they come.
  absl::Status RunOps(const Batch& batch, KvCache& kv, const LayerHook& after_kv_store, bool head,
                      Tensor* out, std::vector<float>* hidden, std::vector<float>* host_logits);
  // Copies Run's logits to the host as n_vocab floats per row (a restricted head scattered).
  absl::Status DownloadLogits(const Tensor& out_logits, std::vector<float>* logits);
  // Forward's and ForwardHidden's logits: the head writes straight into *logits where its
  // backend's memory is the host's and every row is a whole vocabulary (no restricted head), so
  // the rows are not copied again (16 MiB per 16-row step of a 262k-vocabulary model); else Run
  // and DownloadLogits.
  absl::Status RunToLogits(const Batch& batch, KvCache& kv, const LayerHook& after_kv_store,
                           std::vector<float>* logits, std::vector<float>* hidden);
  // Rows of the output head: n_vocab, or a draft's head_tokens.
  int64_t HeadRows() const {
    return config_.head_tokens.empty() ? config_.n_vocab
                                       : static_cast<int64_t>(config_.head_tokens.size());
  }
  // Scratch slot `index` on backend `backend` (an index into backends_).
  Tensor Scratch(int backend, int index, int64_t cols, int64_t rows);
  // MatMul of a named weight on `b`; reports the input to the observer first, if any.
  absl::Status Linear(Backend& b, const Tensor& w, const char* name, int layer, const Tensor& x,
                      Tensor& y, absl::Span<const uint8_t> row_orders);
  // Several Linears of the same x (Q/K/V, gate/up) as one Backend::MatMulGroup; one Linear each
  // when an observer watches the matmul inputs.
  struct LinearOut {
    const Tensor* w;
    const char* name;
    Tensor* y;
  };
  absl::Status LinearGroup(Backend& b, std::initializer_list<LinearOut> outs, int layer,
                           const Tensor& x, absl::Span<const uint8_t> row_orders);
  // A mixture-of-experts feed-forward (ModelConfig::n_expert > 0) of layer `layer` on backend
  // index `bi`: o [n, n_embd] from the normed h [n, n_embd]. Routes each token to its experts,
  // runs every expert once over all the tokens routed to it (rows gathered by expert), and
  // combines the outputs by the normalized router probabilities. `orders`: the router matmul's
  // row orders (the layer's, as for a dense feed-forward).
  absl::Status MoeFeedForward(int bi, int layer, const Tensor& h, Tensor& o,
                              absl::Span<const uint8_t> orders);
  // Moves x [n, n_embd] from backend `from`'s residual slot to backend `to`'s (through host
  // memory): the activation hand-off at a placement boundary.
  absl::Status HandOff(int from, int to, int64_t n);

  std::shared_ptr<const GgufFile> file_;
  std::vector<Backend*> backends_;        // as given to Load, indexed by the placement
  std::vector<Backend*> layer_backends_;  // per layer
  std::vector<int> layer_backend_index_;  // per layer: index into backends_
  bool one_backend_ = true;               // every layer on one backend (Run may capture)
  bool head_order_own_ = true;            // set_head_order_own
  bool layer_order_own_ = true;           // set_layer_order_own
  LayerPlacement placement_;
  ModelConfig config_;
  std::shared_ptr<const Weights> weights_;  // shared with the models WithHead makes of this one
  // Per backend index: its scratch slots (empty for a backend no layer uses). The output slots
  // are allocated on the head's backend only.
  std::vector<std::vector<std::unique_ptr<Buffer>>> scratch_;
  std::vector<float> handoff_;  // host staging of the hand-off
  int64_t scratch_tokens_ = 0;
  int64_t scratch_out_ = 0;
  MatMulObserver* observer_ = nullptr;
  // Reports an attention intermediate to the observer when it wants them.
  absl::Status ObserveIntermediate(Backend& b, const char* name, int layer, const Tensor& x);
  std::vector<float> observe_buf_;
  std::vector<float> head_logits_;  // host copy of a restricted head's scores
  std::vector<float> top_scratch_;  // ForwardTop's full rows for a restricted head
  // MoeFeedForward's host-side routing, reused across layers and calls.
  struct MoeRouting {
    std::vector<int32_t> expert;     // [n * k] chosen experts, rank order per token
    std::vector<float> prob;         // [n * k] their probabilities
    std::vector<float> weight;       // [n * k] normalized weights
    std::vector<int32_t> gather;     // [n * k] token of each row of the expert-sorted batch
    std::vector<int32_t> slot_row;   // [n * k] row of slot (t, j) in that batch
    std::vector<int64_t> first;      // [n_expert + 1] each expert's first row
    std::vector<uint8_t> orders;     // row orders of the expert matmuls (all GEMV)
  };
  MoeRouting moe_;
};

}  // namespace pd::engine
