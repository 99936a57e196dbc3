// The compute backend: owns device memory and runs the ops of a transformer layer.
//
// Nothing above this interface assumes host memory. A Tensor's `data` is a pointer in the
// backend's own address space (host memory for the CPU backend, device memory for CUDA); callers
// move bytes in and out only through Upload/Download. Ops are enqueued in order on the backend's
// single stream; a device backend may run them asynchronously, so call Synchronize() before
// reading results on the host. Host-side metadata (token positions, block tables) is passed as
// host spans and copied by the backend as it needs.
//
// Thread safety: a Backend instance is used by one engine thread at a time. The CPU backend runs
// each op on its own thread pool internally.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/backend/kv_layout.h"
#include "engine/quant/dtype.h"

namespace pd::engine {

// A non-owning 2-D view: `rows` rows of `cols` elements, rows contiguous (stride = RowBytes).
// Vectors are rows == 1. Quantized types need `cols` to be a multiple of their block size.
struct Tensor {
  DType type = DType::kF32;
  int64_t cols = 0;  // elements per row (ggml's ne0)
  int64_t rows = 1;  // ggml's ne1
  void* data = nullptr;

  size_t row_bytes() const { return RowBytes(type, cols); }
  size_t bytes() const { return row_bytes() * static_cast<size_t>(rows); }
  int64_t numel() const { return cols * rows; }
  // View of rows [first, first + count).
  Tensor Rows(int64_t first, int64_t count) const {
    Tensor t = *this;
    t.rows = count;
    t.data = static_cast<char*>(data) + row_bytes() * static_cast<size_t>(first);
    return t;
  }
};

// Backend-owned memory. Freed when destroyed.
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual void* data() = 0;
  virtual size_t size() const = 0;
};

// How rotary position embeddings are applied.
enum class RopeMode {
  kNormal,  // rotate pairs (2i, 2i+1): Llama's GGUF layout
  kNeox,    // rotate pairs (i, i + rot_dim/2): GPT-NeoX, Qwen2, Gemma
};

struct RopeParams {
  RopeMode mode = RopeMode::kNormal;
  int head_dim = 0;          // elements per head
  int rot_dim = 0;           // leading elements of each head that rotate (== head_dim usually)
  float freq_base = 10000.f;
  float freq_scale = 1.f;    // linear position scaling: theta = pos * freq_scale * base^(-2i/rot_dim)
  // Optional per-frequency divisors (Llama 3 "rope_freqs"), rot_dim/2 floats on the host, or empty.
  absl::Span<const float> freq_factors;
};

// Which KV slots each token of a batch reads and writes. All spans are host memory.
//
// Token t belongs to sequence seq[t] and sits at absolute position pos[t]. Its K/V go to slot
// block_tables[seq[t]][pos[t] / block_size] * block_size + pos[t] % block_size of each layer's
// cache. It attends to every position p of its sequence with max(0, pos[t] - window + 1) <= p <=
// pos[t] (window 0 = unlimited). The caller stores a batch's K/V before running its attention, so
// tokens of one sequence in one batch see each other causally.
struct KvBatch {
  absl::Span<const int32_t> pos;                            // [n_tokens]
  absl::Span<const int32_t> seq;                            // [n_tokens] -> index into tables
  std::vector<absl::Span<const int32_t>> block_tables;      // per sequence: block ids
  int block_size = 16;
  // Optional (empty, or one per token): kRowOrderAttnWide picks the order Attention sums V rows in
  // for that token (see Backend::Attention). Empty: a sequence with two or more tokens in the
  // batch takes it.
  absl::Span<const uint8_t> row_orders = {};
};

struct AttentionParams {
  int n_heads = 0;
  int n_kv_heads = 0;  // n_heads % n_kv_heads == 0 (grouped-query attention)
  int head_dim = 0;
  float scale = 0.f;   // logits = scale * q.k
  int window = 0;      // sliding window in positions; 0 = full causal attention
  float softcap = 0.f; // if > 0: logits = softcap * tanh(logits / softcap)
};

// Row-order flags of Backend::MatMulRowOrder (Gemv, Wide) and KvBatch::row_orders (AttnWide):
// which of llama.cpp's x86 kernels a row would go through. AttnWide: the row is one of a batch of
// two or more prompt rows, whose V sum llama.cpp does with tinyBLAS; without it, ggml_vec_dot_f32
// (one row).
inline constexpr uint8_t kRowOrderGemv = 1;
inline constexpr uint8_t kRowOrderWide = 2;
inline constexpr uint8_t kRowOrderAttnWide = 4;
// Own: no llama.cpp order binds the row (MatMulRowOrder), so a backend may give it pdserve's own
// batch-invariant order for the weight type: the CPU backend's kernels of that order
// (cpu/kernels.h, Q8_0OwnOrder*, Q5_0*OwnOrder*, Q4_K*OwnOrder*, Q6_K*OwnOrder*) sum each
// block's integer products whole. The model
// sets it on the output head's rows (Model::set_head_order_own, PDSERVE_HEAD_ORDER) and on the
// layers' matmul rows (PDSERVE_LAYER_ORDER) when the K/V cache is not F32 and it is told to
// (docs/numerics.md); a MatMul takes it on all of its rows or on none.
inline constexpr uint8_t kRowOrderOwn = 8;

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string_view name() const = 0;
  // True when the memory Allocate returns is ordinary host memory that any thread may read and
  // write directly (the CPU backend); a device backend's is not.
  virtual bool host_memory() const { return false; }

  // ---- memory --------------------------------------------------------------------------------
  // RESOURCE_EXHAUSTED when the device is out of memory.
  virtual absl::StatusOr<std::unique_ptr<Buffer>> Allocate(size_t bytes) = 0;
  virtual absl::Status Upload(void* dst, const void* host_src, size_t bytes) = 0;
  virtual absl::Status Download(void* host_dst, const void* src, size_t bytes) = 0;
  // Fills `bytes` at `dst` with zeros.
  virtual absl::Status Zero(void* dst, size_t bytes) = 0;
  // Makes host-resident weights (e.g. an mmapped GGUF tensor) usable by ops. A backend that
  // copies them (a device; the CPU backend into its 2 MiB pages, CpuBackendOptions::copy_weights)
  // returns the copy's Buffer in *storage, which must outlive the Tensor; one that uses the host
  // bytes in place (the CPU backend with copies off or past their budget, or with a null
  // `storage`) returns a view and leaves *storage empty.
  virtual absl::StatusOr<Tensor> MapWeights(const Tensor& host, std::unique_ptr<Buffer>* storage) = 0;
  // A copy of host-resident weights in a layout of this backend's own for rows that take
  // kRowOrderOwn (the CPU backend with AVX512-VNNI or its portable kernels: Q8_0 as q8_0x16,
  // Q5_0 as q5_0x16, Q4_K as q4_Kx16, Q6_K as q6_Kx16, engine/quant/q*x16.h), its Buffer in
  // *storage; MatMul over it gives every row the own order whatever its flags say, with the bits
  // the flag gives on MapWeights' tensor. A Tensor with null data where the backend has no such
  // layout for the type or will not spend the memory: the rows then go through MapWeights' tensor
  // with the flag, at the same bits.
  virtual absl::StatusOr<Tensor> MapWeightsOwnLayout(const Tensor& host,
                                                     std::unique_ptr<Buffer>* storage) {
    if (storage != nullptr) storage->reset();
    return Tensor{host.type, host.cols, host.rows, nullptr};
  }
  // Waits for all enqueued work. Errors from asynchronous ops surface here.
  virtual absl::Status Synchronize() = 0;

  // ---- ops ----------------------------------------------------------------------------------
  // Activations are F32 unless stated. Every op returns INVALID_ARGUMENT on mismatched shapes and
  // UNIMPLEMENTED for a type this backend does not run (never a silent fallback).

  // y[n, m] = x[n, k] * w[m, k]^T. w: any supported type; x, y: F32. Like ggml, quantized and
  // half weights are dotted against activations converted to the weight's companion type
  // (Q8_0 for Q8_0 and Q4_0, Q8_K for Q2_K .. Q6_K, F16 for F16, BF16 for BF16), F32 weights
  // against F32 activations. pdserve's W8A8 weights take activations quantized to INT8 per token
  // (w8a8.h), W4A16 weights F32 activations (w4a16.h).
  virtual absl::Status MatMul(const Tensor& w, const Tensor& x, Tensor& y) = 0;
  // MatMul where each row of x names the summation order llama.cpp's x86 CPU backend would give
  // it: llama.cpp picks kernels per matmul from the rows it multiplies, so a row's rounding depends
  // on its sequence's rows in the batch. row_orders[r] (row_orders.size() == x.rows) holds flags:
  //   kRowOrderGemv: Q4_K matrices with a multiple of 8 rows are repacked; llama.cpp multiplies
  //     rows in full groups of four with its GEMM and the rest with its GEMV. Set: the GEMV order.
  //   kRowOrderWide: k-quant matrices that are not repacked (Q6_K, Q5_K, other Q4_K) go through
  //     llama.cpp's tiled kernel for 8 or more rows, its vec_dot below. Set: the tiled order.
  //   kRowOrderOwn: pdserve's own order where the backend has one (above); set on every row or
  //     on none (INVALID_ARGUMENT otherwise).
  // Plain MatMul treats the whole batch as one sequence. Backends and weight types without such
  // orders ignore the flags.
  virtual absl::Status MatMulRowOrder(const Tensor& w, const Tensor& x, Tensor& y,
                                      absl::Span<const uint8_t> row_orders) {
    return MatMul(w, x, y);
  }
  // ys[i] = x * ws[i]^T with MatMulRowOrder's row orders, for several matrices that multiply the
  // same activations (a layer's Q, K and V projections; its gate and up projections): the same
  // results as MatMulRowOrder on each. A backend may run them as one op; the CPU backend does for
  // decode-sized batches (one parallel loop over all the matrices' rows, so that a small matrix
  // does not pay a dispatch and a ramp-up of the memory streams of its own).
  virtual absl::Status MatMulGroup(absl::Span<const Tensor* const> ws, const Tensor& x,
                                   absl::Span<Tensor* const> ys,
                                   absl::Span<const uint8_t> row_orders) {
    if (ws.size() != ys.size()) {
      return absl::InvalidArgumentError("MatMulGroup: as many outputs as weights are needed");
    }
    for (size_t i = 0; i < ws.size(); ++i) {
      if (absl::Status st = MatMulRowOrder(*ws[i], x, *ys[i], row_orders); !st.ok()) return st;
    }
    return absl::OkStatus();
  }
  // out[i, :] = dequant(table[ids[i], :]) (embedding lookup). out: F32 [ids.size(), table.cols].
  virtual absl::Status GetRows(const Tensor& table, absl::Span<const int32_t> ids, Tensor& out) = 0;
  // y = x / sqrt(mean(x^2) + eps) * w, per row. w: F32 [1, cols] (or nullptr data = no weight).
  virtual absl::Status RmsNorm(const Tensor& x, const Tensor& w, float eps, Tensor& y) = 0;
  // In place on x [n_tokens, n_heads * head_dim] with positions pos[n_tokens] (host).
  virtual absl::Status Rope(Tensor& x, int n_heads, absl::Span<const int32_t> pos,
                            const RopeParams& p) = 0;
  // y = a + b elementwise (same shapes; y may alias a or b).
  virtual absl::Status Add(const Tensor& a, const Tensor& b, Tensor& y) = 0;
  // y[r, :] = x[r, :] + bias[0, :] for every row (bias broadcast; y may alias x).
  virtual absl::Status AddBias(const Tensor& x, const Tensor& bias, Tensor& y) = 0;
  // y = silu(gate) * up elementwise.
  virtual absl::Status SwiGlu(const Tensor& gate, const Tensor& up, Tensor& y) = 0;
  // y = gelu(gate) * up elementwise, GELU in its tanh form. Like ggml's CPU path, gelu is read
  // from a table over all f16 inputs (gate rounded to f16, result rounded to f16) for |gate| < 10,
  // gelu(x) = 0 below -10 and x above 10: this is what llama.cpp computes, and matching it keeps
  // greedy decoding comparable token for token.
  virtual absl::Status GeGlu(const Tensor& gate, const Tensor& up, Tensor& y) = 0;
  // y = s * x elementwise (y may alias x).
  virtual absl::Status Scale(const Tensor& x, float s, Tensor& y) = 0;
  // y = cap * tanh(x / cap) elementwise, computed as ggml does (x times 1/cap, tanhf, times cap):
  // Gemma 2's final logit soft-capping. y may alias x.
  virtual absl::Status Softcap(const Tensor& x, float cap, Tensor& y) = 0;
  // In-place numerically stable softmax over each row.
  virtual absl::Status Softmax(Tensor& x) = 0;
  // The output of a mixture-of-experts layer from its experts' rows: y[t, :] = sum over j < k of
  // weights[t * k + j] * rows[index[t * k + j], :], the terms added in slot order j = 0, 1, ...,
  // each product rounded to F32 before its add (llama.cpp's ggml_mul, then its chain of ggml_add
  // over the expert slots). rows: F32 [m, cols]; y: F32 [index.size() / k, cols], must not alias
  // rows; index (each in [0, m)) and weights: host spans of k entries per row of y.
  virtual absl::Status MoeCombine(const Tensor& rows, absl::Span<const int32_t> index,
                                  absl::Span<const float> weights, int k, Tensor& y) = 0;
  // Writes k, v [n_tokens, n_kv_heads * head_dim] (F32) into the caches (layout: kv_layout.h;
  // F32, F16 or INT8, block_size == kv.block_size) at the slots `kv` gives each token. F16 rounds
  // to nearest even; INT8 quantizes each token's head symmetrically with its own scale.
  virtual absl::Status StoreKv(const Tensor& k, const Tensor& v, KvTensor& k_cache,
                               KvTensor& v_cache, const KvBatch& kv) = 0;
  // out [n_tokens, n_heads * head_dim] = softmax(scale * q k^T) v over each token's visible
  // positions (see KvBatch), grouped-query: head h reads kv head h / (n_heads / n_kv_heads).
  // INT8 caches are dequantized on the fly (scale * q).
  virtual absl::Status Attention(const Tensor& q, const KvTensor& k_cache,
                                 const KvTensor& v_cache, const KvBatch& kv,
                                 const AttentionParams& p, Tensor& out) = 0;

  // ---- sampling -----------------------------------------------------------------------------
  // The k best entries of each row of x (F32 [rows, cols]) in top_k.h's rank order (largest
  // first, equal values by lower column; -0 equals +0; NaN below every number): their values in
  // `values` (F32 [rows, k]) and their columns in ids[rows * k], both in this backend's memory.
  // 1 <= k <= min(cols, kMaxTopK). A decode step that samples from a row's best k logits copies
  // back k pairs, not the vocabulary's logits.
  virtual absl::Status TopK(const Tensor& x, int k, Tensor& values, int32_t* ids) = 0;

  // ---- captured steps (optional) ----------------------------------------------------------------
  // A device backend may record the ops of a step instead of starting each one, and start them
  // all at the end as one unit (CUDA: a graph), so that a decode step of a few hundred small ops
  // pays one launch instead of a few hundred. The CPU backend does not capture.
  //
  // BeginCapture(rows) is true when the backend records from then on: rows is the batch's token
  // count, and a backend may decline any batch (false, nothing changed). While recording:
  //   - ops read their host spans (positions, block tables, ids) when called, as always, so the
  //     caller may reuse them at once; the device memory they name must stay allocated until the
  //     recorded ops have run;
  //   - Upload, Download, Synchronize, Allocate and MapWeights return FAILED_PRECONDITION;
  //   - an op the backend cannot record (say, a scratch buffer that has to grow first) returns
  //     ABORTED and the recording is void.
  // EndCapture(run) ends the recording. run true: the recorded ops start (asynchronously, like
  // any op) and it returns true; or it returns false when nothing was started (an op was ABORTED,
  // or recording failed), and the caller runs the same ops again without capture. run false:
  // discards the recording (after an op's error) and returns false. A non-OK status: the device
  // failed to start them; the backend's state is then as after a failed op.
  virtual bool BeginCapture(int64_t rows) {
    (void)rows;
    return false;
  }
  virtual absl::StatusOr<bool> EndCapture(bool run) {
    (void)run;
    return absl::FailedPreconditionError("EndCapture without BeginCapture");
  }
  // What became of the recordings so far: steps started as one unit, and recordings abandoned
  // (the step then ran uncaptured). Zeros for a backend that does not capture.
  struct CaptureStats {
    int64_t launched = 0;
    int64_t abandoned = 0;
  };
  virtual CaptureStats capture_stats() const { return {}; }
};

// The largest k Backend::TopK takes.
inline constexpr int kMaxTopK = 256;

struct CpuBackendOptions {
  int threads = 0;             // 0 = all online cores
  bool force_scalar = false;   // use the portable kernels even when AVX2+FMA are present
  // MapWeights copies each weight tensor into memory of 2 MiB pages (where the kernel grants
  // them) instead of using the host bytes in place: an mmapped file's 4 KiB pages cost a TLB miss
  // per 4 KiB of a matmul's weight stream. false: views of the host bytes
  // (PDSERVE_CPU_WEIGHTS=mmap; docs/config.md).
  bool copy_weights = true;
  // The most bytes those copies may take; the tensors after stay views of the host bytes (logged
  // once). 0: half of the memory the kernel reports available (MemAvailable) at the first copy,
  // so that a model near the machine's size is paged from its file rather than OOM-killed.
  size_t copy_weights_max_bytes = 0;
};

// PDSERVE_CPU_WEIGHTS: unset or "copy" -> true, "mmap" -> false (CpuBackendOptions::copy_weights);
// INVALID_ARGUMENT naming the variable for anything else.
absl::StatusOr<bool> CpuCopyWeightsFromEnv();
// PDSERVE_ATTN_ORDER: unset or empty -> false (pdserve's orders over F16 and INT8 caches),
// "ggml" -> true (ggml's attention orders over every cache, a comparison switch; docs/numerics.md);
// INVALID_ARGUMENT naming the variable for anything else. The CPU backend reads it once per
// process.
absl::StatusOr<bool> CpuAttnGgmlOrderFromEnv();

// The CPU backend (AVX2+FMA when the CPU has it, else scalar). Never fails.
std::unique_ptr<Backend> CreateCpuBackend(const CpuBackendOptions& options = {});

// The CUDA backend on `device`. UNAVAILABLE when built without CUDA or no GPU is present.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device = 0);

}  // namespace pd::engine
