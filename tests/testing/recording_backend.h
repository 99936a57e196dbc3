// A Backend that runs the CPU backend as if it were a device that captures steps (the CUDA
// backend's graphs, Backend::BeginCapture), so that the model's side of capture is tested on
// machines without a GPU. Its memory passes for a device's (host_memory() false). While it
// records, each op copies its host spans at once, as the CUDA backend stages them, and runs (and
// checks its arguments) only at EndCapture(true): a caller that read a result, or relied on a
// Tensor or host span it passed staying alive, before the end of the step would see it go wrong.
// Upload, Download, Synchronize, Allocate and MapWeights refuse while recording, as on the GPU.
//
// Options make it decline batches larger than max_rows and abandon a recording (ABORTED) at its
// abort_at-th op, the way the CUDA backend abandons one whose scratch must grow.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/backend/backend.h"

namespace pd::engine::testing {

class RecordingBackend final : public Backend {
 public:
  explicit RecordingBackend(std::string name = "recording")
      : inner_(CreateCpuBackend({.threads = 1})), name_(std::move(name)) {}

  // Batches of more rows are declined (BeginCapture false).
  int64_t max_rows = 8;
  // > 0: every recording returns ABORTED from its abort_at-th op (1-based), which abandons it;
  // only the first `abort_steps` recordings when that is >= 0.
  int abort_at = 0;
  int abort_steps = -1;

  // Counters (engine thread only).
  int begin_calls = 0;   // BeginCapture calls, accepted or not
  int replayed_ops = 0;  // ops run at EndCapture
  int direct_ops = 0;    // ops run as called (outside a recording)

  std::string_view name() const override { return name_; }
  bool host_memory() const override { return false; }

  absl::StatusOr<std::unique_ptr<Buffer>> Allocate(size_t bytes) override {
    if (recording_) return Refused("Allocate");
    return inner_->Allocate(bytes);
  }
  absl::Status Upload(void* d, const void* s, size_t n) override {
    if (recording_) return Refused("Upload");
    return inner_->Upload(d, s, n);
  }
  absl::Status Download(void* d, const void* s, size_t n) override {
    if (recording_) return Refused("Download");
    return inner_->Download(d, s, n);
  }
  absl::Status Zero(void* d, size_t n) override {
    return Op([=, this] { return inner_->Zero(d, n); });
  }
  absl::StatusOr<Tensor> MapWeights(const Tensor& host, std::unique_ptr<Buffer>* st) override {
    if (recording_) return Refused("MapWeights");
    return inner_->MapWeights(host, st);
  }
  absl::Status Synchronize() override {
    if (recording_) return Refused("Synchronize");
    return inner_->Synchronize();
  }

  absl::Status MatMul(const Tensor& w, const Tensor& x, Tensor& y) override {
    return Op([=, this]() mutable { return inner_->MatMul(w, x, y); });
  }
  absl::Status MatMulRowOrder(const Tensor& w, const Tensor& x, Tensor& y,
                              absl::Span<const uint8_t> o) override {
    return Op([=, this, o = Copy(o)]() mutable { return inner_->MatMulRowOrder(w, x, y, o); });
  }
  absl::Status MatMulGroup(absl::Span<const Tensor* const> ws, const Tensor& x,
                           absl::Span<Tensor* const> ys, absl::Span<const uint8_t> o) override {
    std::vector<Tensor> wv, yv;
    for (const Tensor* w : ws) wv.push_back(*w);
    for (const Tensor* y : ys) yv.push_back(*y);
    return Op([=, this, o = Copy(o)]() mutable {
      std::vector<const Tensor*> wp;
      std::vector<Tensor*> yp;
      for (const Tensor& w : wv) wp.push_back(&w);
      for (Tensor& y : yv) yp.push_back(&y);
      return inner_->MatMulGroup(wp, x, yp, o);
    });
  }
  absl::Status GetRows(const Tensor& t, absl::Span<const int32_t> ids, Tensor& out) override {
    return Op([=, this, ids = Copy(ids)]() mutable { return inner_->GetRows(t, ids, out); });
  }
  absl::Status RmsNorm(const Tensor& x, const Tensor& w, float eps, Tensor& y) override {
    return Op([=, this]() mutable { return inner_->RmsNorm(x, w, eps, y); });
  }
  absl::Status Rope(Tensor& x, int h, absl::Span<const int32_t> pos, const RopeParams& p) override {
    std::vector<float> factors(p.freq_factors.begin(), p.freq_factors.end());
    return Op([=, this, pos = Copy(pos)]() mutable {
      RopeParams params = p;
      params.freq_factors = factors;
      return inner_->Rope(x, h, pos, params);
    });
  }
  absl::Status Add(const Tensor& a, const Tensor& b, Tensor& y) override {
    return Op([=, this]() mutable { return inner_->Add(a, b, y); });
  }
  absl::Status AddBias(const Tensor& x, const Tensor& b, Tensor& y) override {
    return Op([=, this]() mutable { return inner_->AddBias(x, b, y); });
  }
  absl::Status SwiGlu(const Tensor& g, const Tensor& u, Tensor& y) override {
    return Op([=, this]() mutable { return inner_->SwiGlu(g, u, y); });
  }
  absl::Status GeGlu(const Tensor& g, const Tensor& u, Tensor& y) override {
    return Op([=, this]() mutable { return inner_->GeGlu(g, u, y); });
  }
  absl::Status Scale(const Tensor& x, float s, Tensor& y) override {
    return Op([=, this]() mutable { return inner_->Scale(x, s, y); });
  }
  absl::Status Softcap(const Tensor& x, float cap, Tensor& y) override {
    return Op([=, this]() mutable { return inner_->Softcap(x, cap, y); });
  }
  absl::Status MoeCombine(const Tensor& rows, absl::Span<const int32_t> index,
                          absl::Span<const float> weights, int k, Tensor& y) override {
    return Op([=, this, index = Copy(index), weights = Copy(weights)]() mutable {
      return inner_->MoeCombine(rows, index, weights, k, y);
    });
  }
  absl::Status Softmax(Tensor& x) override {
    return Op([=, this]() mutable { return inner_->Softmax(x); });
  }
  absl::Status StoreKv(const Tensor& k, const Tensor& v, KvTensor& kc, KvTensor& vc,
                       const KvBatch& kv) override {
    return Op([=, this, kcp = &kc, vcp = &vc, owned = OwnedKvBatch(kv)]() mutable {
      return inner_->StoreKv(k, v, *kcp, *vcp, owned.View());
    });
  }
  absl::Status Attention(const Tensor& q, const KvTensor& kc, const KvTensor& vc, const KvBatch& kv,
                         const AttentionParams& p, Tensor& out) override {
    return Op([=, this, kcp = &kc, vcp = &vc, owned = OwnedKvBatch(kv)]() mutable {
      return inner_->Attention(q, *kcp, *vcp, owned.View(), p, out);
    });
  }
  absl::Status TopK(const Tensor& x, int k, Tensor& values, int32_t* ids) override {
    return Op([=, this]() mutable { return inner_->TopK(x, k, values, ids); });
  }

  bool BeginCapture(int64_t rows) override {
    ++begin_calls;
    if (recording_ || rows < 1 || rows > max_rows) return false;
    recording_ = true;
    void_ = false;
    recorded_.clear();
    return true;
  }
  absl::StatusOr<bool> EndCapture(bool run) override {
    if (!recording_) return absl::FailedPreconditionError("EndCapture without BeginCapture");
    recording_ = false;
    ++recordings_;
    std::vector<std::function<absl::Status()>> ops = std::move(recorded_);
    recorded_.clear();
    if (void_) ++stats_.abandoned;
    if (!run || void_) return false;
    for (auto& op : ops) {
      ++replayed_ops;
      absl::Status st = op();
      if (!st.ok()) return st;  // as a device error surfaces when the graph runs
    }
    ++stats_.launched;
    return true;
  }
  CaptureStats capture_stats() const override { return stats_; }

 private:
  // A KvBatch's spans copied: what the CUDA backend stages when the op is called.
  struct OwnedKv {
    std::vector<int32_t> pos, seq;
    std::vector<std::vector<int32_t>> tables;
    std::vector<uint8_t> row_orders;
    int block_size = 16;
    KvBatch View() const {
      KvBatch b;
      b.pos = pos;
      b.seq = seq;
      for (const auto& t : tables) b.block_tables.push_back(absl::MakeConstSpan(t));
      b.block_size = block_size;
      b.row_orders = row_orders;
      return b;
    }
  };
  static OwnedKv OwnedKvBatch(const KvBatch& kv) {
    OwnedKv o;
    o.pos.assign(kv.pos.begin(), kv.pos.end());
    o.seq.assign(kv.seq.begin(), kv.seq.end());
    for (absl::Span<const int32_t> t : kv.block_tables) o.tables.emplace_back(t.begin(), t.end());
    o.row_orders.assign(kv.row_orders.begin(), kv.row_orders.end());
    o.block_size = kv.block_size;
    return o;
  }
  template <class T>
  static std::vector<T> Copy(absl::Span<const T> s) {
    return std::vector<T>(s.begin(), s.end());
  }
  absl::Status Refused(std::string_view what) const {
    return absl::FailedPreconditionError(std::string(what) +
                                         " while a step is being captured (recording backend)");
  }
  // Runs `op` now, or records it (ABORTED at the abort_at-th op of a recording to abandon).
  template <class F>
  absl::Status Op(F op) {
    if (!recording_) {
      ++direct_ops;
      return op();
    }
    const bool aborting = abort_at > 0 && (abort_steps < 0 || recordings_ < abort_steps);
    if (aborting && static_cast<int>(recorded_.size()) + 1 == abort_at) {
      void_ = true;
      return absl::AbortedError("recording backend: abandoned as asked (abort_at)");
    }
    recorded_.push_back(std::move(op));
    return absl::OkStatus();
  }

  std::unique_ptr<Backend> inner_;
  std::string name_;
  bool recording_ = false;
  bool void_ = false;
  int recordings_ = 0;
  std::vector<std::function<absl::Status()>> recorded_;
  CaptureStats stats_;
};

}  // namespace pd::engine::testing
