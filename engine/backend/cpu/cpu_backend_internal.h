// Internal to the CPU backend (cpu_backend.cc, cpu_matmul.cc, cpu_attention.cc): the CpuBackend
// class and the argument checks its ops share. Users create it through CreateCpuBackend
// (engine/backend/backend.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/host_alloc.h"
#include "common/status.h"
#include "engine/backend/backend.h"
#include "engine/backend/kv_batch_check.h"
#include "engine/backend/cpu/kernels.h"
#include "engine/backend/cpu/thread_pool.h"
#include "engine/quant/dtype.h"

namespace pd::engine::cpu {

inline constexpr size_t kAlignment = 64;

// 64-byte aligned host memory. Owns its allocation.
class HostBuffer final : public Buffer {
 public:
  HostBuffer(void* data, size_t size) : data_(data), size_(size) {}
  ~HostBuffer() override { std::free(data_); }
  void* data() override { return data_; }
  size_t size() const override { return size_; }

 private:
  void* data_;
  size_t size_;
};

// A weight tensor's copy inside a shared chunk of 2 MiB-page memory (CpuBackend::CopyWeights):
// the chunk is freed with the last slice that points into it.
class WeightSlice final : public Buffer {
 public:
  WeightSlice(std::shared_ptr<char> chunk, char* data, size_t size)
      : chunk_(std::move(chunk)), data_(data), size_(size) {}
  void* data() override { return data_; }
  size_t size() const override { return size_; }

 private:
  std::shared_ptr<char> chunk_;
  char* data_;
  size_t size_;
};

// Argument checks shared by the ops (defined in cpu_backend.cc).
bool IsSupported(DType t);
// Weight types MatMul has kernels for: all but Q8_K, which is an activation format only (never in
// model files). MatMul and MapWeights refuse it with UNIMPLEMENTED (before looking at the shape),
// so that a model holding it fails at load time rather than in its first forward pass.
bool HasMatMul(DType t);
absl::Status NoMatMul(const Tensor& w, const char* what);
std::string Describe(const Tensor& t);
// A tensor whose type this backend runs, with a non-negative block-aligned shape and data.
absl::Status CheckTensor(const Tensor& t, const char* what);
// An F32 activation tensor.
absl::Status CheckF32(const Tensor& t, const char* what);
std::string Describe(const KvTensor& t);
// A KV cache of a known type and positive shape whose block size is the batch's.
absl::Status CheckCache(const KvTensor& t, const KvBatch& kv, const char* what);
absl::Status CheckSameShape(const Tensor& a, const Tensor& b, const char* what);
bool Overlap(const Tensor& a, const Tensor& b);

// Slot of an already checked position.
inline int64_t SlotOf(const KvBatch& kv, int32_t seq, int64_t pos) {
  return static_cast<int64_t>(kv.block_tables[seq][pos / kv.block_size]) * kv.block_size +
         pos % kv.block_size;
}

inline float* RowF32(const Tensor& t, int64_t r) {
  return static_cast<float*>(t.data) + r * t.cols;
}

// The CPU backend. Ops are defined in cpu_backend.cc, MatMul in cpu_matmul.cc and Attention in
// cpu_attention.cc. Thread safety: as backend.h says, one engine thread at a time.
class CpuBackend final : public Backend {
 public:
  CpuBackend(const Kernels& kernels, int threads, bool copy_weights = true,
             size_t copy_weights_max_bytes = 0)
      : k_(kernels),
        copy_weights_(copy_weights),
        copy_budget_(copy_weights_max_bytes),
        pool_(threads) {}

  std::string_view name() const override { return "cpu"; }
  bool host_memory() const override { return true; }

  absl::StatusOr<std::unique_ptr<Buffer>> Allocate(size_t bytes) override {
    void* p = AllocHost(bytes, kAlignment);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cpu: cannot allocate ", bytes, " bytes of host memory"));
    }
    return std::unique_ptr<Buffer>(new HostBuffer(p, bytes));
  }

  absl::Status Upload(void* dst, const void* host_src, size_t bytes) override {
    return Copy(dst, host_src, bytes, "Upload");
  }
  absl::Status Download(void* host_dst, const void* src, size_t bytes) override {
    return Copy(host_dst, src, bytes, "Download");
  }
  absl::Status Zero(void* dst, size_t bytes) override {
    if (bytes == 0) return absl::OkStatus();
    if (dst == nullptr) return absl::InvalidArgumentError("Zero: null destination");
    std::memset(dst, 0, bytes);
    return absl::OkStatus();
  }

  absl::StatusOr<Tensor> MapWeights(const Tensor& host, std::unique_ptr<Buffer>* storage) override {
    if (IsSupported(host.type) && !HasMatMul(host.type)) return NoMatMul(host, "MapWeights");
    PD_RETURN_IF_ERROR(CheckTensor(host, "MapWeights"));
    if (storage != nullptr) storage->reset();
    if (!copy_weights_ || storage == nullptr || host.bytes() == 0) return host;
    return CopyWeights(host, storage);
  }

  // Q8_0 as q8_0x16, and Q5_0, Q4_K and Q6_K (rows a multiple of 16) as q5_0x16, q4_Kx16 and
  // q6_Kx16 where PlanMatMul honours
  // kRowOrderOwn (the VNNI, AVX2 or portable kernels), in the weight copies' chunks and budget
  // (ReserveWeights); none with copies off (PDSERVE_CPU_WEIGHTS=mmap) or past the budget.
  absl::StatusOr<Tensor> MapWeightsOwnLayout(const Tensor& host,
                                             std::unique_ptr<Buffer>* storage) override;

  absl::Status Synchronize() override { return absl::OkStatus(); }

  absl::Status MatMul(const Tensor& w, const Tensor& x, Tensor& y) override {
    return MatMulImpl(w, x, y, {});
  }
  absl::Status MatMulRowOrder(const Tensor& w, const Tensor& x, Tensor& y,
                              absl::Span<const uint8_t> row_orders) override {
    if (static_cast<int64_t>(row_orders.size()) != x.rows) {
      return absl::InvalidArgumentError(absl::StrCat("MatMulRowOrder: ", row_orders.size(),
                                                     " row orders for x ", Describe(x)));
    }
    return MatMulImpl(w, x, y, row_orders);
  }
  absl::Status MatMulGroup(absl::Span<const Tensor* const> ws, const Tensor& x,
                           absl::Span<Tensor* const> ys,
                           absl::Span<const uint8_t> row_orders) override;
  absl::Status MatMulImpl(const Tensor& w, const Tensor& x, Tensor& y,
                          absl::Span<const uint8_t> row_orders);
  absl::Status GetRows(const Tensor& table, absl::Span<const int32_t> ids, Tensor& out) override;
  absl::Status RmsNorm(const Tensor& x, const Tensor& w, float eps, Tensor& y) override;
  absl::Status Rope(Tensor& x, int n_heads, absl::Span<const int32_t> pos,
                    const RopeParams& p) override;
  absl::Status Add(const Tensor& a, const Tensor& b, Tensor& y) override;
  absl::Status AddBias(const Tensor& x, const Tensor& bias, Tensor& y) override;
  absl::Status SwiGlu(const Tensor& gate, const Tensor& up, Tensor& y) override;
  absl::Status GeGlu(const Tensor& gate, const Tensor& up, Tensor& y) override;
  absl::Status Scale(const Tensor& x, float s, Tensor& y) override;
  absl::Status Softcap(const Tensor& x, float cap, Tensor& y) override;
  absl::Status MoeCombine(const Tensor& rows, absl::Span<const int32_t> index,
                          absl::Span<const float> weights, int k, Tensor& y) override;
  absl::Status Softmax(Tensor& x) override;
  absl::Status StoreKv(const Tensor& k, const Tensor& v, KvTensor& k_cache, KvTensor& v_cache,
                       const KvBatch& kv) override;
  absl::Status Attention(const Tensor& q, const KvTensor& k_cache, const KvTensor& v_cache,
                         const KvBatch& kv, const AttentionParams& p, Tensor& out) override;
  absl::Status TopK(const Tensor& x, int k, Tensor& values, int32_t* ids) override;

 private:
  static absl::Status Copy(void* dst, const void* src, size_t bytes, const char* what) {
    if (bytes == 0) return absl::OkStatus();
    if (dst == nullptr || src == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": null pointer"));
    }
    std::memmove(dst, src, bytes);
    return absl::OkStatus();
  }

  // Scratch memory for converted activations, grown on demand and kept between calls; one slot
  // per companion type that a MatMulGroup converts to.
  static constexpr int kScratchSlots = 3;
  absl::StatusOr<char*> Scratch(size_t bytes, int slot = 0) {
    if (bytes > scratch_size_[slot]) {
      void* p = AllocHost(bytes, kAlignment);
      if (p == nullptr) {
        return absl::ResourceExhaustedError(
            absl::StrCat("cpu: cannot allocate ", bytes, " bytes of scratch memory"));
      }
      scratch_[slot].reset(static_cast<char*>(p));
      scratch_size_[slot] = bytes;
    }
    return scratch_[slot].get();
  }

  // One MatMul after validation and activation conversion: what each weight chunk needs.
  struct MatMulPlan {
    const Tensor* w = nullptr;
    Tensor* y = nullptr;
    int64_t n = 0, m = 0, k = 0;
    const char* xa = nullptr;  // activations in the weight's companion type
    size_t xs = 0;             // their row stride
    absl::Span<const uint8_t> row_orders;
    int64_t chunk_rows = 0, n_chunks = 0;  // n_chunks 0: nothing to compute
    // A kernel that reads the weight rows in place over activations packed once (kernels.h
    // GroupedKernels without pack_w): small batches of Q8_0 / Q5_0 on VNNI (Q8_0QuadVnni,
    // Q5_0QuadVnni), and every Q8_0 MatMul without VNNI (Q8_0RowsAvx2 up to 8 rows,
    // Q8_0GroupedAvx2 above); nullptr: the tiles.
    const GroupedKernels* quad = nullptr;
    const char* quad_x = nullptr;
    // RunMatMulChunks computes activation rows [x_begin, n) (a grouped kernel took the others).
    int64_t x_begin = 0;
  };
  // Validates y = x w^T, converts x to the companion type (into scratch slot `slot`, unless
  // `converted` already holds that conversion: {type, data, stride}) and plans the chunks.
  struct Converted {
    DType type = DType::kF32;
    const char* data = nullptr;
    size_t stride = 0;
    const char* quad_x = nullptr;  // Q8_0 rows packed for the quad kernels, once per group
    const GroupedKernels* quad = nullptr;  // whose pack_x wrote quad_x
  };
  absl::Status PlanMatMul(const Tensor& w, const Tensor& x, Tensor& y,
                          absl::Span<const uint8_t> row_orders, int slot, Converted* converted,
                          MatMulPlan* plan);
  // MapWeights' copy (CpuBackendOptions::copy_weights), in parallel: tensors are laid end to end
  // (64-byte aligned) in chunks of at least kWeightChunk bytes of 2 MiB pages, so that a layer's
  // small matrices share huge pages too.
  absl::StatusOr<Tensor> CopyWeights(const Tensor& host, std::unique_ptr<Buffer>* storage);
  // Room for `bytes` of weights in those chunks, counted against the copies' budget: nullptr past
  // it (logged once); RESOURCE_EXHAUSTED when no chunk can be allocated. CopyWeights and
  // MapWeightsOwnLayout fill it.
  absl::StatusOr<std::unique_ptr<WeightSlice>> ReserveWeights(size_t bytes);
  // The own-order kernels for weights of type `w` on this backend's kernel table: Q8_0, Q5_0,
  // Q4_K and Q6_K rows (nullptr where it keeps llama.cpp's order: other types, Q6_K on AVX2
  // without VNNI), and the q8_0x16 / q5_0x16 / q4_Kx16 / q6_Kx16 layouts (their VNNI kernels,
  // else the AVX2 ones, else the portable ones: same bits).
  const GroupedKernels* OwnOrderKernels(DType w) const;
  static constexpr size_t kWeightChunk = size_t{64} << 20;

  // Weight chunks [c0, c1) of a plan (tiles in llama.cpp's per-row orders).
  void RunMatMulChunks(const MatMulPlan& p, int64_t c0, int64_t c1) const;

  struct FreeDeleter {
    void operator()(char* p) const { std::free(p); }
  };

  const Kernels& k_;
  const bool copy_weights_;
  std::shared_ptr<char> weight_chunk_;  // CopyWeights' current chunk
  size_t weight_chunk_size_ = 0, weight_chunk_used_ = 0;
  size_t copy_budget_;  // bytes copies may still take (before the first: 0 = automatic)
  bool copy_budget_set_ = false;
  bool copy_budget_hit_ = false;  // a tensor stayed a view: logged once
  // llama.cpp repacks Q2_K only where it is built with AVX-512 (ggml_cpu_has_avx512; with
  // -march=native, as llama-cpp-python builds it, a CPU with AVX512F; CPUID leaf 7 EBX bit 16).
  // Under PDSERVE_CPU_ISA=avx2 or scalar, the order of llama.cpp's AVX2 build.
  const bool q2_k_repacked_ = CpuHasAvx512(1u << 16);
  cpu::ThreadPool pool_;
  std::unique_ptr<char, FreeDeleter> scratch_[kScratchSlots];
  size_t scratch_size_[kScratchSlots] = {};
  std::vector<float> widened_kv_;  // Attention: prompts' F16 K/V widened once (reused)
  std::vector<char> quad_x_[kScratchSlots];  // PlanMatMul: packed activations of small batches
};

}  // namespace pd::engine::cpu
