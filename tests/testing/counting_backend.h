// A Backend that runs the CPU backend and counts what runs on it: bytes allocated, weights mapped,
// ops called, downloads. It can also pass its memory off as a device's (host_memory() false), so
// that code paths meant for a GPU backend run, and are counted, on machines without one.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "engine/backend/backend.h"

namespace pd::engine::testing {

class CountingBackend final : public Backend {
 public:
  // `host_memory`: what host_memory() answers. false makes the CPU backend's memory pass for a
  // device's: callers must then go through Upload / Download (counted), as with a GPU.
  explicit CountingBackend(std::string name, bool host_memory = true)
      : inner_(CreateCpuBackend({.threads = 1})), name_(std::move(name)), host_(host_memory) {}
  std::string_view name() const override { return name_; }
  bool host_memory() const override { return host_; }
  absl::StatusOr<std::unique_ptr<Buffer>> Allocate(size_t bytes) override {
    allocated += bytes;
    return inner_->Allocate(bytes);
  }
  absl::Status Upload(void* d, const void* s, size_t n) override { return inner_->Upload(d, s, n); }
  absl::Status Download(void* d, const void* s, size_t n) override {
    ++downloads;
    return inner_->Download(d, s, n);
  }
  absl::Status Zero(void* d, size_t n) override { return inner_->Zero(d, n); }
  absl::StatusOr<Tensor> MapWeights(const Tensor& host, std::unique_ptr<Buffer>* st) override {
    mapped += host.bytes();
    return inner_->MapWeights(host, st);
  }
  absl::Status Synchronize() override { return inner_->Synchronize(); }
  absl::Status MatMul(const Tensor& w, const Tensor& x, Tensor& y) override {
    ++ops;
    return inner_->MatMul(w, x, y);
  }
  absl::Status MatMulRowOrder(const Tensor& w, const Tensor& x, Tensor& y,
                              absl::Span<const uint8_t> o) override {
    ++ops;
    return inner_->MatMulRowOrder(w, x, y, o);
  }
  absl::Status MatMulGroup(absl::Span<const Tensor* const> ws, const Tensor& x,
                           absl::Span<Tensor* const> ys, absl::Span<const uint8_t> o) override {
    ++ops;
    return inner_->MatMulGroup(ws, x, ys, o);
  }
  absl::Status GetRows(const Tensor& t, absl::Span<const int32_t> ids, Tensor& out) override {
    ++ops;
    return inner_->GetRows(t, ids, out);
  }
  absl::Status RmsNorm(const Tensor& x, const Tensor& w, float eps, Tensor& y) override {
    ++ops;
    return inner_->RmsNorm(x, w, eps, y);
  }
  absl::Status Rope(Tensor& x, int h, absl::Span<const int32_t> pos,
                    const RopeParams& p) override {
    ++ops;
    return inner_->Rope(x, h, pos, p);
  }
  absl::Status Add(const Tensor& a, const Tensor& b, Tensor& y) override {
    ++ops;
    return inner_->Add(a, b, y);
  }
  absl::Status AddBias(const Tensor& x, const Tensor& b, Tensor& y) override {
    ++ops;
    return inner_->AddBias(x, b, y);
  }
  absl::Status SwiGlu(const Tensor& g, const Tensor& u, Tensor& y) override {
    ++ops;
    return inner_->SwiGlu(g, u, y);
  }
  absl::Status GeGlu(const Tensor& g, const Tensor& u, Tensor& y) override {
    ++ops;
    return inner_->GeGlu(g, u, y);
  }
  absl::Status Scale(const Tensor& x, float s, Tensor& y) override {
    ++ops;
    return inner_->Scale(x, s, y);
  }
  absl::Status Softcap(const Tensor& x, float cap, Tensor& y) override {
    ++ops;
    return inner_->Softcap(x, cap, y);
  }
  absl::Status MoeCombine(const Tensor& rows, absl::Span<const int32_t> index,
                          absl::Span<const float> weights, int k, Tensor& y) override {
    ++ops;
    return inner_->MoeCombine(rows, index, weights, k, y);
  }
  absl::Status Softmax(Tensor& x) override {
    ++ops;
    return inner_->Softmax(x);
  }
  absl::Status StoreKv(const Tensor& k, const Tensor& v, KvTensor& kc, KvTensor& vc,
                       const KvBatch& kv) override {
    ++ops;
    return inner_->StoreKv(k, v, kc, vc, kv);
  }
  absl::Status Attention(const Tensor& q, const KvTensor& kc, const KvTensor& vc,
                         const KvBatch& kv, const AttentionParams& p, Tensor& out) override {
    ++ops;
    return inner_->Attention(q, kc, vc, kv, p, out);
  }
  absl::Status TopK(const Tensor& x, int k, Tensor& values, int32_t* ids) override {
    ++ops;
    return inner_->TopK(x, k, values, ids);
  }

  // Updated on the thread that runs the ops (a scheduler's engine thread); readable from any.
  std::atomic<size_t> allocated{0}, mapped{0};
  std::atomic<int> ops{0}, downloads{0};

 private:
  std::unique_ptr<Backend> inner_;
  std::string name_;
  bool host_;
};

}  // namespace pd::engine::testing
