// The CPU backend: host memory, synchronous ops built from the kernel table (kernels.h), run on a
// fixed thread pool. See backend.h for the semantics of every op.
//
// Numerics follow ggml's CPU backend so that logits match llama.cpp closely: MatMul converts each
// activation row once per call to the weight's companion type (F16, BF16, Q8_0 for Q8_0/Q4_0,
// Q8_K for the k-quants) and dots in that type with F32 accumulation; RmsNorm sums squares in
// F64; Softmax sums exponentials in F64; Rope builds angles in F32 by repeated multiplication.
// Attention follows ggml's order (dot, softmax, weighted sum of V: cpu::AttnKernels), bit-exact
// with llama.cpp for an F32 K/V cache; F16 keys and values are widened to F32 (llama.cpp instead
// rounds the query and the probabilities to F16), INT8 ones dequantized on the fly.
//
// Thread safety: as backend.h says, one engine thread at a time; ops parallelize internally.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/host_alloc.h"
#include "common/status.h"
#include "common/strings.h"
#include "engine/backend/backend.h"
#include "engine/backend/kv_rotation.h"
#include "engine/quant/fp16.h"
#include "engine/backend/cpu/kernels.h"
#include "engine/backend/cpu/thread_pool.h"
#include "engine/quant/dtype.h"
#include "engine/quant/k_quants.h"
#include "engine/quant/q8_0.h"

namespace pd::engine {
namespace {

using cpu::Kernels;

constexpr size_t kAlignment = 64;
// A MatMul work item covers this many weight bytes (rounded to whole 4-row tiles), so that it
// stays in L2 while every activation tile streams past it: weights are read from memory once per
// call whatever the batch size.
constexpr size_t kMatMulChunkBytes = 256 << 10;
// From this many activation rows on, Q8_0 and Q5_0 weights take the grouped 512-bit kernels (16
// rows per register, so fewer rows leave most lanes empty).
constexpr int64_t kGroupedMinRows = 4;

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


bool IsSupported(DType t) { return DTypeFromGgml(static_cast<uint32_t>(t)).has_value(); }

// Weight types MatMul has kernels for: all but Q8_K, which is an activation format only (never in
// model files). MatMul and MapWeights refuse it with UNIMPLEMENTED (before looking at the shape),
// so that a model holding it fails at load time rather than in its first forward pass.
bool HasMatMul(DType t) { return t != DType::kQ8_K; }

// The type MatMul converts activations to for weights of type `w` (ggml's vec_dot_type). Only for
// HasMatMul types.
DType CompanionType(DType w) {
  switch (w) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kQ8_0:
    case DType::kW8A8:  // per-token INT8 rows
      return w;
    case DType::kW4A16:  // activations stay F32
      return DType::kF32;
    case DType::kQ4_0:
    case DType::kQ5_0:
      return DType::kQ8_0;
    case DType::kQ2_K:
    case DType::kQ3_K:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
      return DType::kQ8_K;
    case DType::kQ8_K:
      break;
  }
  PD_CHECK_MSG(false, "no matmul for this weight type");
}

// The kernel that dots weights of type `w` with their companion activations.
cpu::GemmType GemmTypeOf(DType w) {
  switch (w) {
    case DType::kF32: return cpu::GemmType::kF32;
    case DType::kF16: return cpu::GemmType::kF16;
    case DType::kBF16: return cpu::GemmType::kBF16;
    case DType::kQ8_0: return cpu::GemmType::kQ8_0;
    case DType::kQ4_0: return cpu::GemmType::kQ4_0;
    case DType::kQ5_0: return cpu::GemmType::kQ5_0;
    case DType::kQ2_K: return cpu::GemmType::kQ2_K;
    case DType::kQ3_K: return cpu::GemmType::kQ3_K;
    case DType::kQ4_K: return cpu::GemmType::kQ4_K;
    case DType::kQ5_K: return cpu::GemmType::kQ5_K;
    case DType::kQ6_K: return cpu::GemmType::kQ6_K;
    case DType::kW8A8: return cpu::GemmType::kW8A8;
    case DType::kW4A16: return cpu::GemmType::kW4A16;
    case DType::kQ8_K: break;
  }
  PD_CHECK_MSG(false, "no matmul for this weight type");
}

absl::Status NoMatMul(const Tensor& w, const char* what) {
  return absl::UnimplementedError(absl::StrCat(what, ": the CPU backend has no matmul for ",
                                               std::string(Traits(w.type).name), " weights yet"));
}

std::string Describe(const Tensor& t) {
  return absl::StrCat(IsSupported(t.type) ? std::string(Traits(t.type).name)
                                          : RawGgmlTypeName(static_cast<uint32_t>(t.type)),
                      "[", t.rows, ", ", t.cols, "]");
}

// A tensor whose type this backend runs, with a non-negative block-aligned shape and data.
absl::Status CheckTensor(const Tensor& t, const char* what) {
  if (!IsSupported(t.type)) {
    return absl::UnimplementedError(absl::StrCat(what, ": the CPU backend does not run type ",
                                                 RawGgmlTypeName(static_cast<uint32_t>(t.type))));
  }
  if (t.rows < 0 || t.cols < 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": negative shape ", Describe(t)));
  }
  if (t.cols % Traits(t.type).block_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": cols of ", Describe(t),
                                                   " is not a multiple of the block size ",
                                                   Traits(t.type).block_size));
  }
  if (t.numel() > 0 && t.data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": null data for ", Describe(t)));
  }
  return absl::OkStatus();
}

// An F32 activation tensor.
absl::Status CheckF32(const Tensor& t, const char* what) {
  PD_RETURN_IF_ERROR(CheckTensor(t, what));
  if (t.type != DType::kF32) {
    return absl::UnimplementedError(
        absl::StrCat(what, ": expected f32, the CPU backend does not run ", Describe(t)));
  }
  return absl::OkStatus();
}

std::string Describe(const KvTensor& t) {
  return pd::StrCat(KvDTypeName(t.type), "[", t.n_blocks, " blocks x ", t.block_size, " slots x ",
                    t.n_kv_heads, " heads x ", t.head_dim, "]");
}

// A KV cache of a known type and positive shape whose block size is the batch's.
absl::Status CheckCache(const KvTensor& t, const KvBatch& kv, const char* what) {
  if (t.type != KvDType::kF32 && t.type != KvDType::kF16 && t.type != KvDType::kI8) {
    return absl::UnimplementedError(
        absl::StrCat(what, ": unknown KV cache type ", static_cast<int>(t.type)));
  }
  if (t.n_kv_heads <= 0 || t.head_dim <= 0 || t.block_size <= 0 || t.n_blocks < 0 ||
      (t.n_blocks > 0 && t.data == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": bad cache ", Describe(t), t.data == nullptr ? " (null data)" : ""));
  }
  if (t.block_size != kv.block_size) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": cache blocks of ", t.block_size,
                                                   " slots, batch block size ", kv.block_size));
  }
  return absl::OkStatus();
}

absl::Status CheckSameShape(const Tensor& a, const Tensor& b, const char* what) {
  if (a.rows != b.rows || a.cols != b.cols) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": shapes differ: ", Describe(a), " vs ", Describe(b)));
  }
  return absl::OkStatus();
}

bool Overlap(const Tensor& a, const Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  const char* a0 = static_cast<const char*>(a.data);
  const char* b0 = static_cast<const char*>(b.data);
  return a0 < b0 + b.bytes() && b0 < a0 + a.bytes();
}

// Checks the per-token spans of a batch.
absl::Status CheckKvBatch(const KvBatch& kv, int64_t n_tokens) {
  if (static_cast<int64_t>(kv.pos.size()) != n_tokens ||
      static_cast<int64_t>(kv.seq.size()) != n_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("KvBatch: ", kv.pos.size(), " positions and ",
                                                   kv.seq.size(), " sequence ids for ", n_tokens,
                                                   " tokens"));
  }
  if (kv.block_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("KvBatch: block_size ", kv.block_size));
  }
  if (!kv.row_orders.empty() && static_cast<int64_t>(kv.row_orders.size()) != n_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("KvBatch: ", kv.row_orders.size(),
                                                   " row orders for ", n_tokens, " tokens"));
  }
  for (int64_t t = 0; t < n_tokens; ++t) {
    if (kv.seq[t] < 0 || static_cast<size_t>(kv.seq[t]) >= kv.block_tables.size()) {
      return absl::InvalidArgumentError(absl::StrCat("KvBatch: token ", t, " has sequence ",
                                                     kv.seq[t], " but there are ",
                                                     kv.block_tables.size(), " block tables"));
    }
    if (kv.pos[t] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("KvBatch: token ", t, " has position ", kv.pos[t]));
    }
  }
  return absl::OkStatus();
}

// Checks that positions [first, last] of sequence `seq` map to slots below `cache_rows`.
absl::Status CheckSlots(const KvBatch& kv, int32_t seq, int64_t first, int64_t last,
                        int64_t cache_rows) {
  const absl::Span<const int32_t> table = kv.block_tables[seq];
  const int64_t bs = kv.block_size;
  for (int64_t blk = first / bs; blk <= last / bs; ++blk) {
    if (blk >= static_cast<int64_t>(table.size())) {
      return absl::InvalidArgumentError(absl::StrCat("KvBatch: position ", last, " of sequence ",
                                                     seq, " needs block ", blk,
                                                     " but its table has ", table.size()));
    }
    const int64_t last_off = blk == last / bs ? last % bs : bs - 1;
    if (table[blk] < 0 || table[blk] * bs + last_off >= cache_rows) {
      return absl::InvalidArgumentError(
          absl::StrCat("KvBatch: block id ", table[blk], " of sequence ", seq,
                       " is outside a cache of ", cache_rows, " rows"));
    }
  }
  return absl::OkStatus();
}

// Slot of an already checked position.
inline int64_t SlotOf(const KvBatch& kv, int32_t seq, int64_t pos) {
  return static_cast<int64_t>(kv.block_tables[seq][pos / kv.block_size]) * kv.block_size +
         pos % kv.block_size;
}

inline float* RowF32(const Tensor& t, int64_t r) {
  return static_cast<float*>(t.data) + r * t.cols;
}

class CpuBackend final : public Backend {
 public:
  CpuBackend(const Kernels& kernels, int threads) : k_(kernels), pool_(threads) {}

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
    return host;
  }

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
  absl::Status Softmax(Tensor& x) override;
  absl::Status StoreKv(const Tensor& k, const Tensor& v, KvTensor& k_cache, KvTensor& v_cache,
                       const KvBatch& kv) override;
  absl::Status Attention(const Tensor& q, const KvTensor& k_cache, const KvTensor& v_cache,
                         const KvBatch& kv, const AttentionParams& p, Tensor& out) override;

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
  };
  // Validates y = x w^T, converts x to the companion type (into scratch slot `slot`, unless
  // `converted` already holds that conversion: {type, data, stride}) and plans the chunks.
  struct Converted {
    DType type = DType::kF32;
    const char* data = nullptr;
    size_t stride = 0;
  };
  absl::Status PlanMatMul(const Tensor& w, const Tensor& x, Tensor& y,
                          absl::Span<const uint8_t> row_orders, int slot, Converted* converted,
                          MatMulPlan* plan);
  // Weight chunks [c0, c1) of a plan (tiles in llama.cpp's per-row orders).
  void RunMatMulChunks(const MatMulPlan& p, int64_t c0, int64_t c1) const;

  struct FreeDeleter {
    void operator()(char* p) const { std::free(p); }
  };

  const Kernels& k_;
  // llama.cpp repacks Q2_K only where it is built with AVX-512 (ggml_cpu_has_avx512; with
  // -march=native, as llama-cpp-python builds it, a CPU with AVX512F).
  const bool q2_k_repacked_ = __builtin_cpu_supports("avx512f");
  cpu::ThreadPool pool_;
  std::unique_ptr<char, FreeDeleter> scratch_[kScratchSlots];
  size_t scratch_size_[kScratchSlots] = {};
  std::vector<float> widened_kv_;  // Attention: prompts' F16 K/V widened once (reused)
};

// ---- MatMul --------------------------------------------------------------------------------
// Bytes: weights m * row_bytes(w) once, activations n * k * 4 plus their converted copy, and per
// weight chunk a pass over the converted activations (from cache). Flops: 2 * n * m * k.
// Activations are converted to the weight's companion type (CompanionType: F16, BF16, Q8_0 for
// Q8_0 and Q4_0, Q8_K for the k-quants) once per call, in parallel over rows.
absl::Status CpuBackend::PlanMatMul(const Tensor& w, const Tensor& x, Tensor& y,
                                    absl::Span<const uint8_t> row_orders, int slot,
                                    Converted* converted, MatMulPlan* plan) {
  if (IsSupported(w.type) && !HasMatMul(w.type)) return NoMatMul(w, "MatMul");
  PD_RETURN_IF_ERROR(CheckTensor(w, "MatMul w"));
  PD_RETURN_IF_ERROR(CheckF32(x, "MatMul x"));
  PD_RETURN_IF_ERROR(CheckF32(y, "MatMul y"));
  if (x.cols != w.cols || y.rows != x.rows || y.cols != w.rows) {
    return absl::InvalidArgumentError(absl::StrCat("MatMul: w ", Describe(w), ", x ", Describe(x),
                                                   ", y ", Describe(y),
                                                   " (want y [x.rows, w.rows], x.cols == w.cols)"));
  }
  if (Overlap(y, x) || Overlap(y, w)) {
    return absl::InvalidArgumentError("MatMul: y must not overlap x or w");
  }
  const int64_t n = x.rows, m = w.rows, k = w.cols;
  if (w.type == DType::kW8A8 && k > kW8A8MaxCols) {
    return absl::InvalidArgumentError(absl::StrCat("MatMul: w8a8 rows of ", k,
                                                   " exceed the kernels' limit of ", kW8A8MaxCols));
  }
  *plan = MatMulPlan{&w, &y, n, m, k, static_cast<const char*>(x.data), x.row_bytes(),
                     row_orders, 0, 0};
  if (n == 0 || m == 0) return absl::OkStatus();
  if (k == 0) {
    std::memset(y.data, 0, y.bytes());
    return absl::OkStatus();
  }

  const DType xt = CompanionType(w.type);
  const char* xa = static_cast<const char*>(x.data);
  size_t xs = x.row_bytes();
  if (xt != DType::kF32 && converted != nullptr && converted->data != nullptr &&
      converted->type == xt) {
    xa = converted->data;
    xs = converted->stride;
  } else if (xt != DType::kF32) {
    // Convert every activation row once to the weight's companion type; every weight chunk below
    // then reuses the converted rows.
    xs = RowBytes(xt, k);
    PD_ASSIGN_OR_RETURN(char* conv, Scratch(xs * static_cast<size_t>(n), slot));
    const Kernels& kn = k_;
    pool_.ParallelFor(
        n,
        [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r) {
            const float* src = RowF32(x, r);
            char* dst = conv + r * xs;
            switch (xt) {
              case DType::kF16:
                kn.f32_to_f16(src, reinterpret_cast<uint16_t*>(dst), k);
                break;
              case DType::kBF16:
                kn.f32_to_bf16(src, reinterpret_cast<uint16_t*>(dst), k);
                break;
              case DType::kQ8_0:
                kn.quantize_q8_0(src, reinterpret_cast<BlockQ8_0*>(dst), k);
                break;
              case DType::kQ8_K:
                kn.quantize_q8_k(src, reinterpret_cast<BlockQ8_K*>(dst), k);
                break;
              case DType::kW8A8:
                kn.quantize_w8a8(src, dst, k);
                break;
              case DType::kF32:
              case DType::kW4A16:
              case DType::kQ4_0:
              case DType::kQ5_0:
              case DType::kQ2_K:
              case DType::kQ3_K:
              case DType::kQ4_K:
              case DType::kQ5_K:
              case DType::kQ6_K:
                PD_CHECK(false);  // never a companion type that needs converting
            }
          }
        },
        /*grain=*/std::max<int64_t>(1, 16384 / k));
    xa = conv;
    if (converted != nullptr) *converted = Converted{xt, xa, xs};
  }
  plan->xa = xa;
  plan->xs = xs;
  int64_t chunk_rows =
      static_cast<int64_t>(kMatMulChunkBytes / w.row_bytes()) / cpu::kGemmTileW * cpu::kGemmTileW;
  // At least 4 chunks per thread: a small model's K/V projections (256 rows) are one 256 KiB
  // chunk, which left all but one thread idle during decode. Chunk starts stay multiples of the
  // tile height, so the tiles (and the results) are the same for every thread count.
  const int64_t min_chunks = 4 * static_cast<int64_t>(pool_.num_threads());
  const int64_t balanced_rows =
      ((m + min_chunks - 1) / min_chunks + cpu::kGemmTileW - 1) / cpu::kGemmTileW *
      cpu::kGemmTileW;
  chunk_rows = std::max<int64_t>(cpu::kGemmTileW, std::min(chunk_rows, balanced_rows));
  plan->chunk_rows = chunk_rows;
  plan->n_chunks = (m + chunk_rows - 1) / chunk_rows;
  return absl::OkStatus();
}

absl::Status CpuBackend::MatMulImpl(const Tensor& w, const Tensor& x, Tensor& y,
                                    absl::Span<const uint8_t> row_orders) {
  MatMulPlan p;
  PD_RETURN_IF_ERROR(PlanMatMul(w, x, y, row_orders, /*slot=*/0, /*converted=*/nullptr, &p));
  if (p.n_chunks == 0) return absl::OkStatus();
  const int64_t n = p.n, m = p.m, k = p.k, chunk_rows = p.chunk_rows, n_chunks = p.n_chunks;
  const char* wa = static_cast<const char*>(w.data);
  const size_t ws = w.row_bytes();
  float* ya = static_cast<float*>(y.data);
  // Q8_0 and Q5_0 for a batch: activations laid out 16 rows per register once; Q8_0 weights read
  // in place, Q5_0 chunks unpacked once per call (AVX512-VNNI only; bit-identical to the tiles
  // below, so results do not depend on the batch size).
  const cpu::GroupedKernels* grouped = nullptr;
  if (n >= kGroupedMinRows && &k_ == cpu::Avx2Kernels()) {
    if (w.type == DType::kQ8_0) grouped = cpu::Q8_0GroupedVnni();
    if (w.type == DType::kQ5_0) grouped = cpu::Q5_0GroupedVnni();
  }
  if (grouped != nullptr) {
    thread_local std::vector<char> xg_storage;
    xg_storage.resize(grouped->x_bytes(n, k) + 64);
    char* xg = xg_storage.data() + (64 - reinterpret_cast<uintptr_t>(xg_storage.data()) % 64) % 64;
    grouped->pack_x(p.xa, p.xs, n, k, xg);
    pool_.ParallelFor(n_chunks, [&](int64_t c0, int64_t c1) {
      thread_local std::vector<char> wp;
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t r_begin = c * chunk_rows, rows = std::min(m, (c + 1) * chunk_rows) - r_begin;
        const char* wc = wa + r_begin * ws;
        if (grouped->pack_w == nullptr) {
          grouped->gemm(k, wc, ws, rows, xg, n, ya + r_begin, m);
        } else {
          wp.resize(grouped->w_bytes(rows, k));
          grouped->pack_w(wc, ws, rows, k, wp.data());
          grouped->gemm(k, wp.data(), 0, rows, xg, n, ya + r_begin, m);
        }
      }
    });
    return absl::OkStatus();
  }
  pool_.ParallelFor(n_chunks, [&](int64_t c0, int64_t c1) { RunMatMulChunks(p, c0, c1); });
  return absl::OkStatus();
}

void CpuBackend::RunMatMulChunks(const MatMulPlan& p, int64_t c0, int64_t c1) const {
  const Tensor& w = *p.w;
  const int64_t n = p.n, m = p.m, k = p.k, chunk_rows = p.chunk_rows;
  const absl::Span<const uint8_t> row_orders = p.row_orders;
  const char* xa = p.xa;
  const size_t xs = p.xs;
  const cpu::GemmTileFn tile = k_.gemm[static_cast<int>(GemmTypeOf(w.type))];
  const char* wa = static_cast<const char*>(w.data);
  const size_t ws = w.row_bytes();
  float* ya = static_cast<float*>(p.y->data);
  // llama.cpp's per-row orders (Backend::MatMulRowOrder): Q4_K matrices it repacks (rows a
  // multiple of 8) take its repacked GEMM / GEMV orders, other k-quants its tiled order for
  // sequences of 8+ rows; consecutive rows of one order share tiles. Q2_K is repacked too where
  // llama.cpp would be (q2_k_repacked_).
  const bool repacked_q4 = w.type == DType::kQ4_K && m % 8 == 0;
  const bool repacked_q2 = w.type == DType::kQ2_K && m % 8 == 0 && q2_k_repacked_;
  const bool repacked = repacked_q4 || repacked_q2;
  const cpu::GemmTileFn wide_tile = k_.gemm_wide[static_cast<int>(GemmTypeOf(w.type))];
  auto order_of = [&](int64_t i) -> uint8_t {
    if (!row_orders.empty()) return row_orders[i];
    return (i >= n - n % 4 ? kRowOrderGemv : 0) | (n >= 8 ? kRowOrderWide : 0);
  };
  auto tile_of = [&](int64_t i) -> cpu::GemmTileFn {
    const uint8_t o = order_of(i);
    if (repacked_q4) return (o & kRowOrderGemv) ? k_.q4_k_repack_gemv : k_.q4_k_repack_gemm;
    if (repacked_q2) return (o & kRowOrderGemv) ? k_.q2_k_repack_gemv : k_.q2_k_repack_gemm;
    if (wide_tile != nullptr && (o & kRowOrderWide)) return wide_tile;
    return tile;
  };
  const bool per_row = repacked || wide_tile != nullptr;
  const int64_t r_begin = c0 * chunk_rows, r_end = std::min(m, c1 * chunk_rows);
  // Activation tiles outer, weight tiles inner: this chunk of weights stays in cache.
  for (int64_t i = 0; i < n;) {
    int nc = static_cast<int>(std::min<int64_t>(cpu::kGemmTileX, n - i));
    cpu::GemmTileFn fn = tile;
    if (per_row) {
      fn = tile_of(i);
      int same = 1;
      while (same < nc && tile_of(i + same) == fn) ++same;
      nc = same;
    }
    for (int64_t r = r_begin; r < r_end; r += cpu::kGemmTileW) {
      const int nr = static_cast<int>(std::min<int64_t>(cpu::kGemmTileW, r_end - r));
      fn(k, wa + r * ws, ws, nr, xa + i * xs, xs, nc, ya + i * m + r, m);
    }
    i += nc;
  }
}

absl::Status CpuBackend::MatMulGroup(absl::Span<const Tensor* const> ws, const Tensor& x,
                                     absl::Span<Tensor* const> ys,
                                     absl::Span<const uint8_t> row_orders) {
  if (ws.size() != ys.size()) {
    return absl::InvalidArgumentError(absl::StrCat("MatMulGroup: ", ws.size(), " weights, ",
                                                   ys.size(), " outputs"));
  }
  if (static_cast<int64_t>(row_orders.size()) != x.rows) {
    return absl::InvalidArgumentError(absl::StrCat("MatMulGroup: ", row_orders.size(),
                                                   " row orders for x ", Describe(x)));
  }
  // Batches (the grouped VNNI GEMM) and groups with more companion types than scratch slots run
  // one MatMul at a time.
  bool one_loop = ws.size() > 1 && x.rows < kGroupedMinRows;
  DType types[kScratchSlots];
  int n_types = 0;
  for (size_t i = 0; one_loop && i < ws.size(); ++i) {
    const DType xt = CompanionType(ws[i]->type);
    if (xt == DType::kF32 || std::find(types, types + n_types, xt) != types + n_types) continue;
    if (n_types == kScratchSlots) {
      one_loop = false;
    } else {
      types[n_types++] = xt;
    }
  }
  if (!one_loop) {
    for (size_t i = 0; i < ws.size(); ++i) {
      PD_RETURN_IF_ERROR(MatMulImpl(*ws[i], x, *ys[i], row_orders));
    }
    return absl::OkStatus();
  }
  // Each matrix's chunks are the ones MatMul would use (so the same tiles and bits); the
  // activations are converted once per companion type; one parallel loop runs all chunks.
  Converted converted[kScratchSlots];
  std::vector<MatMulPlan> plans(ws.size());
  std::vector<int64_t> first(ws.size() + 1, 0);
  for (size_t i = 0; i < ws.size(); ++i) {
    const DType xt = CompanionType(ws[i]->type);
    const int slot =
        xt == DType::kF32 ? 0 : static_cast<int>(std::find(types, types + n_types, xt) - types);
    PD_RETURN_IF_ERROR(
        PlanMatMul(*ws[i], x, *ys[i], row_orders, slot, &converted[slot], &plans[i]));
    first[i + 1] = first[i] + plans[i].n_chunks;
  }
  pool_.ParallelFor(first.back(), [&](int64_t c0, int64_t c1) {
    size_t j =
        static_cast<size_t>(std::upper_bound(first.begin(), first.end(), c0) - first.begin()) - 1;
    for (int64_t c = c0; c < c1;) {
      while (c >= first[j + 1]) ++j;
      const int64_t end = std::min(c1, first[j + 1]);
      RunMatMulChunks(plans[j], c - first[j], end - first[j]);
      c = end;
    }
  });
  return absl::OkStatus();
}

// ---- GetRows -------------------------------------------------------------------------------
absl::Status CpuBackend::GetRows(const Tensor& table, absl::Span<const int32_t> ids, Tensor& out) {
  PD_RETURN_IF_ERROR(CheckTensor(table, "GetRows table"));
  PD_RETURN_IF_ERROR(CheckF32(out, "GetRows out"));
  if (out.rows != static_cast<int64_t>(ids.size()) || out.cols != table.cols) {
    return absl::InvalidArgumentError(absl::StrCat("GetRows: table ", Describe(table), ", ",
                                                   ids.size(), " ids, out ", Describe(out)));
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= table.rows) {
      return absl::InvalidArgumentError(
          absl::StrCat("GetRows: id ", ids[i], " at ", i, " outside ", table.rows, " rows"));
    }
  }
  if (Overlap(table, out)) return absl::InvalidArgumentError("GetRows: out overlaps table");
  const int64_t cols = table.cols;
  const size_t rb = table.row_bytes();
  const char* base = static_cast<const char*>(table.data);
  pool_.ParallelFor(
      static_cast<int64_t>(ids.size()),
      [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
          const char* src = base + static_cast<size_t>(ids[i]) * rb;
          float* dst = RowF32(out, i);
          switch (table.type) {
            case DType::kF32:
              std::memcpy(dst, src, rb);
              break;
            case DType::kF16:
              k_.f16_to_f32(reinterpret_cast<const uint16_t*>(src), dst, cols);
              break;
            case DType::kBF16:
              k_.bf16_to_f32(reinterpret_cast<const uint16_t*>(src), dst, cols);
              break;
            case DType::kQ8_0:
              k_.dequantize_q8_0(reinterpret_cast<const BlockQ8_0*>(src), dst, cols);
              break;
            case DType::kQ4_0:
            case DType::kQ5_0:
            case DType::kQ2_K:
            case DType::kQ3_K:
            case DType::kQ4_K:
            case DType::kQ5_K:
            case DType::kQ6_K:
            case DType::kQ8_K:
            case DType::kW8A8:
            case DType::kW4A16:
              DequantizeRow(table.type, src, dst, cols);  // scalar reference (k_quants.h)
              break;
          }
        }
      },
      /*grain=*/std::max<int64_t>(1, 16384 / std::max<int64_t>(1, cols)));
  return absl::OkStatus();
}

// ---- RmsNorm -------------------------------------------------------------------------------
// Per row: 3 flops and 8 bytes (12 with a weight) per element.
absl::Status CpuBackend::RmsNorm(const Tensor& x, const Tensor& w, float eps, Tensor& y) {
  PD_RETURN_IF_ERROR(CheckF32(x, "RmsNorm x"));
  PD_RETURN_IF_ERROR(CheckF32(y, "RmsNorm y"));
  PD_RETURN_IF_ERROR(CheckSameShape(x, y, "RmsNorm"));
  const bool has_weight = w.data != nullptr;
  if (has_weight) {
    PD_RETURN_IF_ERROR(CheckF32(w, "RmsNorm w"));
    if (w.rows != 1 || w.cols != x.cols) {
      return absl::InvalidArgumentError(
          absl::StrCat("RmsNorm: weight ", Describe(w), " for x ", Describe(x)));
    }
  }
  if (!(eps >= 0.f) || !std::isfinite(eps)) {
    return absl::InvalidArgumentError(absl::StrCat("RmsNorm: eps ", eps));
  }
  const int64_t cols = x.cols;
  if (cols == 0) return absl::OkStatus();
  pool_.ParallelFor(
      x.rows,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const float* xr = RowF32(x, r);
          float* yr = RowF32(y, r);
          const float mean = static_cast<float>(k_.sum_squares(xr, cols) / cols);
          const float s = 1.f / std::sqrt(mean + eps);
          if (has_weight) {
            k_.scale_mul(xr, s, static_cast<const float*>(w.data), yr, cols);
          } else {
            k_.scale(xr, s, yr, cols);
          }
        }
      },
      /*grain=*/std::max<int64_t>(1, 16384 / cols));
  return absl::OkStatus();
}

// ---- Rope ----------------------------------------------------------------------------------
// Angles: theta_i = freq_scale * (p * b^i / ff_i) with b = powf(base, -2 / rot_dim), where p * b^i
// is built by repeated F32 multiplication (p, p*b, p*b*b, ...) exactly as ggml does, so angles at
// large positions round like llama.cpp's. Per token rot_dim / 2 cos/sin pairs are computed once
// and applied to every head: 6 flops per rotated pair.
absl::Status CpuBackend::Rope(Tensor& x, int n_heads, absl::Span<const int32_t> pos,
                              const RopeParams& p) {
  PD_RETURN_IF_ERROR(CheckF32(x, "Rope x"));
  if (n_heads <= 0 || p.head_dim <= 0 || p.rot_dim <= 0 || p.rot_dim % 2 != 0 ||
      p.rot_dim > p.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat("Rope: n_heads ", n_heads, ", head_dim ",
                                                   p.head_dim, ", rot_dim ", p.rot_dim));
  }
  if (x.cols != static_cast<int64_t>(n_heads) * p.head_dim ||
      x.rows != static_cast<int64_t>(pos.size())) {
    return absl::InvalidArgumentError(absl::StrCat("Rope: x ", Describe(x), " for ", pos.size(),
                                                   " positions of ", n_heads, " heads x ",
                                                   p.head_dim));
  }
  if (!p.freq_factors.empty() && static_cast<int>(p.freq_factors.size()) != p.rot_dim / 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("Rope: ", p.freq_factors.size(), " freq_factors for rot_dim ", p.rot_dim));
  }
  if (!(p.freq_base > 0.f) || !std::isfinite(p.freq_base) || !std::isfinite(p.freq_scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat("Rope: freq_base ", p.freq_base, ", freq_scale ", p.freq_scale));
  }
  const int half = p.rot_dim / 2;
  const float theta_scale = std::pow(p.freq_base, -2.f / static_cast<float>(p.rot_dim));
  const bool neox = p.mode == RopeMode::kNeox;
  pool_.ParallelFor(
      x.rows,
      [&](int64_t t0, int64_t t1) {
        std::vector<float> cs(2 * static_cast<size_t>(half));  // cosines, then sines
        float* cosv = cs.data();
        float* sinv = cs.data() + half;
        for (int64_t t = t0; t < t1; ++t) {
          float theta_base = static_cast<float>(pos[t]);
          for (int i = 0; i < half; ++i) {
            const float ff = p.freq_factors.empty() ? 1.f : p.freq_factors[i];
            const float theta = p.freq_scale * (theta_base / ff);
            cosv[i] = std::cos(theta);
            sinv[i] = std::sin(theta);
            theta_base *= theta_scale;
          }
          float* row = RowF32(x, t);
          for (int h = 0; h < n_heads; ++h) {
            float* v = row + static_cast<int64_t>(h) * p.head_dim;
            (neox ? k_.rope_neox : k_.rope_normal)(v, cosv, sinv, half);
          }
        }
      },
      /*grain=*/std::max<int64_t>(1, 4096 / x.cols));
  return absl::OkStatus();
}

// ---- elementwise ---------------------------------------------------------------------------
// Add / SwiGlu / GeGlu treat their operands as flat arrays (identical shapes, contiguous rows).
constexpr int64_t kElementwiseGrain = 16384;

// Three F32 operands of one shape (the binary elementwise ops).
absl::Status CheckBinary(const Tensor& a, const Tensor& b, const Tensor& y, const char* op) {
  // Messages name the op only: building "op a" strings would cost an allocation on every call.
  PD_RETURN_IF_ERROR(CheckF32(a, op));
  PD_RETURN_IF_ERROR(CheckF32(b, op));
  PD_RETURN_IF_ERROR(CheckF32(y, op));
  PD_RETURN_IF_ERROR(CheckSameShape(a, b, op));
  return CheckSameShape(a, y, op);
}

absl::Status CpuBackend::Add(const Tensor& a, const Tensor& b, Tensor& y) {
  PD_RETURN_IF_ERROR(CheckBinary(a, b, y, "Add"));
  const float* pa = static_cast<const float*>(a.data);
  const float* pb = static_cast<const float*>(b.data);
  float* py = static_cast<float*>(y.data);
  pool_.ParallelFor(
      a.numel(), [&](int64_t i0, int64_t i1) { k_.add(pa + i0, pb + i0, py + i0, i1 - i0); },
      kElementwiseGrain);
  return absl::OkStatus();
}

absl::Status CpuBackend::AddBias(const Tensor& x, const Tensor& bias, Tensor& y) {
  PD_RETURN_IF_ERROR(CheckF32(x, "AddBias x"));
  PD_RETURN_IF_ERROR(CheckF32(bias, "AddBias bias"));
  PD_RETURN_IF_ERROR(CheckF32(y, "AddBias y"));
  PD_RETURN_IF_ERROR(CheckSameShape(x, y, "AddBias"));
  if (bias.rows != 1 || bias.cols != x.cols) {
    return absl::InvalidArgumentError(
        absl::StrCat("AddBias: bias ", Describe(bias), " for x ", Describe(x)));
  }
  const int64_t cols = x.cols;
  if (cols == 0) return absl::OkStatus();
  const float* pb = static_cast<const float*>(bias.data);
  pool_.ParallelFor(
      x.rows,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) k_.add(RowF32(x, r), pb, RowF32(y, r), cols);
      },
      std::max<int64_t>(1, kElementwiseGrain / cols));
  return absl::OkStatus();
}

absl::Status CpuBackend::SwiGlu(const Tensor& gate, const Tensor& up, Tensor& y) {
  PD_RETURN_IF_ERROR(CheckBinary(gate, up, y, "SwiGlu"));
  const float* pg = static_cast<const float*>(gate.data);
  const float* pu = static_cast<const float*>(up.data);
  float* py = static_cast<float*>(y.data);
  pool_.ParallelFor(
      gate.numel(), [&](int64_t i0, int64_t i1) { k_.swiglu(pg + i0, pu + i0, py + i0, i1 - i0); },
      kElementwiseGrain / 4);
  return absl::OkStatus();
}

namespace {

// gelu(x) for every f16 bit pattern x, rounded to f16 (ggml's table) and stored widened to f32:
// 65536 entries (256 KiB), built once.
const float* GeluTable() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    constexpr float kSqrt2OverPi = 0.79788456080286535588f;
    for (uint32_t i = 0; i < 65536; ++i) {
      const float x = F16ToF32(static_cast<uint16_t>(i));
      // ggml's gelu with the one product GCC fuses in llama.cpp's build: 1 + (a x) x.
      const float inner = std::fma(0.044715f * x, x, 1.0f);
      const float g = (0.5f * x) * (1.0f + std::tanh((kSqrt2OverPi * x) * inner));
      t[i] = F16ToF32(F32ToF16(g));
    }
    return t;
  }();
  return table.data();
}

}  // namespace

// The gate values are narrowed to f16 by the kernel table (vectorized, round to nearest even
// like F32ToF16) a block at a time and looked up in an f32 table: per element one 2-byte store,
// one table load and the clamps, instead of two branchy software conversions (was 7% of a
// 512-token Gemma 3 prefill).
absl::Status CpuBackend::GeGlu(const Tensor& gate, const Tensor& up, Tensor& y) {
  PD_RETURN_IF_ERROR(CheckBinary(gate, up, y, "GeGlu"));
  const float* pg = static_cast<const float*>(gate.data);
  const float* pu = static_cast<const float*>(up.data);
  float* py = static_cast<float*>(y.data);
  const float* table = GeluTable();
  pool_.ParallelFor(
      gate.numel(),
      [&](int64_t i0, int64_t i1) {
        constexpr int64_t kBlock = 256;
        uint16_t h[kBlock];
        for (int64_t b = i0; b < i1; b += kBlock) {
          const int64_t n = std::min(kBlock, i1 - b);
          k_.f32_to_f16(pg + b, h, n);
          for (int64_t j = 0; j < n; ++j) {
            const float g = pg[b + j];
            // As ggml: +0 below -10 (not 0 times up, which could be -0).
            py[b + j] = g <= -10.0f ? 0.0f : (g >= 10.0f ? g : table[h[j]]) * pu[b + j];
          }
        }
      },
      kElementwiseGrain / 4);
  return absl::OkStatus();
}

absl::Status CpuBackend::Scale(const Tensor& x, float s, Tensor& y) {
  PD_RETURN_IF_ERROR(CheckF32(x, "Scale x"));
  PD_RETURN_IF_ERROR(CheckF32(y, "Scale y"));
  PD_RETURN_IF_ERROR(CheckSameShape(x, y, "Scale"));
  const float* px = static_cast<const float*>(x.data);
  float* py = static_cast<float*>(y.data);
  pool_.ParallelFor(
      x.numel(), [&](int64_t i0, int64_t i1) { k_.scale(px + i0, s, py + i0, i1 - i0); },
      kElementwiseGrain);
  return absl::OkStatus();
}

// A row of all -inf (everything masked) becomes all zeros rather than NaN.
absl::Status CpuBackend::Softmax(Tensor& x) {
  PD_RETURN_IF_ERROR(CheckF32(x, "Softmax x"));
  const int64_t cols = x.cols;
  if (cols == 0) return absl::OkStatus();
  pool_.ParallelFor(
      x.rows,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          float* row = RowF32(x, r);
          const float m = k_.max(row, cols);
          if (m == -std::numeric_limits<float>::infinity()) {
            std::memset(row, 0, cols * sizeof(float));
            continue;
          }
          const double sum = k_.exp_sub_sum(row, m, row, cols);
          k_.scale(row, static_cast<float>(1.0 / sum), row, cols);
        }
      },
      std::max<int64_t>(1, 4096 / cols));
  return absl::OkStatus();
}

// ---- KV cache ------------------------------------------------------------------------------
// Per token: reads 4 * (k.cols + v.cols) bytes, writes that many cache bytes (F32), half (F16) or
// a quarter plus 4 bytes of scale per head (INT8: the head rotated into the stored basis,
// engine/backend/kv_rotation.h, then a max pass and a quantize pass).
absl::Status CpuBackend::StoreKv(const Tensor& k, const Tensor& v, KvTensor& k_cache,
                                 KvTensor& v_cache, const KvBatch& kv) {
  PD_RETURN_IF_ERROR(CheckF32(k, "StoreKv k"));
  PD_RETURN_IF_ERROR(CheckF32(v, "StoreKv v"));
  PD_RETURN_IF_ERROR(CheckCache(k_cache, kv, "StoreKv k_cache"));
  PD_RETURN_IF_ERROR(CheckCache(v_cache, kv, "StoreKv v_cache"));
  if (k.rows != v.rows || k.cols != k_cache.row_elems() || v.cols != v_cache.row_elems()) {
    return absl::InvalidArgumentError(absl::StrCat("StoreKv: k ", Describe(k), ", v ", Describe(v),
                                                   ", k_cache ", Describe(k_cache), ", v_cache ",
                                                   Describe(v_cache)));
  }
  PD_RETURN_IF_ERROR(CheckKvBatch(kv, k.rows));
  for (int64_t t = 0; t < k.rows; ++t) {
    PD_RETURN_IF_ERROR(CheckSlots(kv, kv.seq[t], kv.pos[t], kv.pos[t],
                                  std::min(k_cache.slots(), v_cache.slots())));
  }
  auto store = [&](const Tensor& src, KvTensor& cache, int64_t t) {
    const int64_t slot = SlotOf(kv, kv.seq[t], kv.pos[t]);
    const float* x = RowF32(src, t);
    switch (cache.type) {
      case KvDType::kF32:
        std::memcpy(cache.values(slot, 0), x, src.cols * sizeof(float));
        break;
      case KvDType::kF16:
        k_.f32_to_f16(x, reinterpret_cast<uint16_t*>(cache.values(slot, 0)), src.cols);
        break;
      case KvDType::kI8: {
        thread_local std::vector<float> rotated;
        rotated.resize(static_cast<size_t>(cache.head_dim));
        for (int h = 0; h < cache.n_kv_heads; ++h) {
          std::memcpy(rotated.data(), x + int64_t{h} * cache.head_dim,
                      static_cast<size_t>(cache.head_dim) * sizeof(float));
          const float d = cpu::QuantizeKvRowI8(
              k_, rotated.data(), reinterpret_cast<int8_t*>(cache.values(slot, h)), cache.head_dim);
          std::memcpy(cache.scale(slot, h), &d, sizeof(float));
        }
        break;
      }
    }
  };
  pool_.ParallelFor(
      k.rows,
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          store(k, k_cache, t);
          store(v, v_cache, t);
        }
      },
      /*grain=*/std::max<int64_t>(1, 8192 / std::max<int64_t>(1, k.cols + v.cols)));
  return absl::OkStatus();
}

// ---- Attention -----------------------------------------------------------------------------
// One work item is (token, kv head): its n_heads / n_kv_heads query heads share every K/V row
// read. Two passes over the visible positions: scores (scale, softcap) into a scratch row per
// head, then the softmax probabilities and a weighted sum of V rows, all in ggml's order (see
// the comment before the work loop). Per token and head: 4 *
// head_dim * L flops over L visible positions; K/V bytes 2 * L * head_dim * elem per kv head
// (INT8: elem 1, plus 4 bytes of scale per row). INT8 is dequantized on the fly: the key's scale
// multiplies its unscaled int8 dot, the value's scale folds into the softmax weight.
absl::Status CpuBackend::Attention(const Tensor& q, const KvTensor& k_cache,
                                   const KvTensor& v_cache, const KvBatch& kv,
                                   const AttentionParams& p, Tensor& out) {
  PD_RETURN_IF_ERROR(CheckF32(q, "Attention q"));
  PD_RETURN_IF_ERROR(CheckF32(out, "Attention out"));
  PD_RETURN_IF_ERROR(CheckCache(k_cache, kv, "Attention k_cache"));
  PD_RETURN_IF_ERROR(CheckCache(v_cache, kv, "Attention v_cache"));
  if (p.n_heads <= 0 || p.n_kv_heads <= 0 || p.n_heads % p.n_kv_heads != 0 || p.head_dim <= 0 ||
      p.window < 0 || !(p.softcap >= 0.f) || !std::isfinite(p.softcap) || !std::isfinite(p.scale)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Attention: n_heads ", p.n_heads, ", n_kv_heads ", p.n_kv_heads, ", head_dim ", p.head_dim,
        ", window ", p.window, ", softcap ", p.softcap, ", scale ", p.scale));
  }
  const int64_t q_cols = static_cast<int64_t>(p.n_heads) * p.head_dim;
  if (q.cols != q_cols || k_cache.n_kv_heads != p.n_kv_heads || k_cache.head_dim != p.head_dim ||
      v_cache.n_kv_heads != p.n_kv_heads || v_cache.head_dim != p.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Attention: q ", Describe(q), ", k_cache ", Describe(k_cache), ", v_cache ",
        Describe(v_cache), " for ", p.n_heads, "/", p.n_kv_heads, " heads of ", p.head_dim));
  }
  PD_RETURN_IF_ERROR(CheckSameShape(q, out, "Attention q/out"));
  if (!(out.data == q.data) && Overlap(q, out)) {
    return absl::InvalidArgumentError("Attention: out partially overlaps q");
  }
  const int64_t n_tokens = q.rows;
  PD_RETURN_IF_ERROR(CheckKvBatch(kv, n_tokens));
  const int64_t cache_rows = std::min(k_cache.slots(), v_cache.slots());
  int64_t max_visible = 0;
  auto first_visible = [&](int64_t t) -> int64_t {
    return p.window > 0 ? std::max<int64_t>(0, kv.pos[t] - p.window + 1) : 0;
  };
  for (int64_t t = 0; t < n_tokens; ++t) {
    const int64_t lo = first_visible(t);
    PD_RETURN_IF_ERROR(CheckSlots(kv, kv.seq[t], lo, kv.pos[t], cache_rows));
    max_visible = std::max<int64_t>(max_visible, kv.pos[t] - lo + 1);
  }

  const int group = p.n_heads / p.n_kv_heads;
  const int64_t hd = p.head_dim;
  // q . k for an INT8 key (F32 and F16 keys are dotted as F32 rows in ggml's order below): the
  // unscaled int8 dot times the key's scale. INT8 keys are stored rotated (kv_rotation.h): `qh`
  // must be the query rotated by RotateKvRowOut.
  auto dot_i8 = [&](int64_t slot, int64_t kvh, const float* qh) -> float {
    float d;
    std::memcpy(&d, k_cache.scale(slot, static_cast<int>(kvh)), sizeof(float));
    return d * k_.dot_i8_f32(
                   reinterpret_cast<const int8_t*>(k_cache.values(slot, static_cast<int>(kvh))),
                   qh, hd);
  };
  // o += a * v for an INT8 value row: its scale folds into the weight (F32 and F16 rows are
  // summed by ak.vsum below). The sum stays in the rotated basis until RotateKvRowOut.
  auto axpy_i8 = [&](float a, int64_t slot, int64_t kvh, float* o) {
    float d;
    std::memcpy(&d, v_cache.scale(slot, static_cast<int>(kvh)), sizeof(float));
    k_.axpy_i8(a * d, reinterpret_cast<const int8_t*>(v_cache.values(slot, static_cast<int>(kvh))),
               o, hd);
  };
  // F16 rows shared by several query heads (GQA) are widened to F32 once and then dotted /
  // accumulated in F32 by every head of the group: exact (f16 -> f32 is), for a quarter of the
  // conversions with Gemma 3 270M's 4 heads per KV head.
  const bool widen_k = k_cache.type == KvDType::kF16 && group > 1;
  const bool widen_v = v_cache.type == KvDType::kF16 && group > 1;
  // A prompt's rows of one sequence read the same keys and values again and again (row t all
  // the positions before it): sequences with many rows in the batch get their visible K and V
  // widened to F32 once, [kv head][position][head_dim], and the rows read those (the same F32
  // kernels on the same values: bit-identical).
  struct WideSeq {
    int64_t lo = 0, hi = -1;  // positions widened (hi < lo: none)
    int64_t rows = 0;         // batch rows of the sequence
    size_t offset = 0;        // into widened_kv_ (K; V follows after n_kv_heads * span * hd)
    int64_t span() const { return hi - lo + 1; }
  };
  std::vector<WideSeq> wide;
  if (widen_k && widen_v && n_tokens >= 16) {
    int32_t n_seq = 0;
    for (int64_t t = 0; t < n_tokens; ++t) n_seq = std::max(n_seq, kv.seq[t] + 1);
    wide.resize(static_cast<size_t>(n_seq));
    for (int64_t t = 0; t < n_tokens; ++t) {
      WideSeq& w = wide[kv.seq[t]];
      const int64_t lo = first_visible(t);
      w.lo = w.rows == 0 ? lo : std::min(w.lo, lo);
      w.hi = w.rows == 0 ? kv.pos[t] : std::max<int64_t>(w.hi, kv.pos[t]);
      ++w.rows;
    }
    size_t total = 0;
    std::vector<std::pair<int32_t, int64_t>> jobs;  // (sequence, kv head) to widen
    for (int32_t sq = 0; sq < n_seq; ++sq) {
      WideSeq& w = wide[sq];
      if (w.rows < 8) {
        w.hi = w.lo - 1;  // few rows: widening per row costs no more
        continue;
      }
      w.offset = total;
      total += 2 * static_cast<size_t>(p.n_kv_heads * w.span() * hd);
      for (int64_t h = 0; h < p.n_kv_heads; ++h) jobs.emplace_back(sq, h);
    }
    if (widened_kv_.size() < total) widened_kv_.resize(total);
    pool_.ParallelFor(static_cast<int64_t>(jobs.size()), [&](int64_t j0, int64_t j1) {
      for (int64_t j = j0; j < j1; ++j) {
        const auto [sq, h] = jobs[j];
        const WideSeq& w = wide[sq];
        float* kd = widened_kv_.data() + w.offset + h * w.span() * hd;
        float* vd = kd + p.n_kv_heads * w.span() * hd;
        for (int64_t pos = w.lo; pos <= w.hi; ++pos) {
          const int64_t slot = SlotOf(kv, sq, pos);
          k_.f16_to_f32(reinterpret_cast<const uint16_t*>(k_cache.values(slot, static_cast<int>(h))),
                        kd + (pos - w.lo) * hd, hd);
          k_.f16_to_f32(reinterpret_cast<const uint16_t*>(v_cache.values(slot, static_cast<int>(h))),
                        vd + (pos - w.lo) * hd, hd);
        }
      }
    });
  }
  // ggml's order (AttnKernels, kernels.h): positions are grouped by L = ak.lanes from position 0,
  // as llama.cpp's KV cells are; masked positions count as exact zeros. A row flagged
  // kRowOrderAttnWide (by default: a sequence with two or more rows in this batch) sums V like
  // tinyBLAS (L accumulators), the others like ggml_vec_dot_f32 (4L).
  const cpu::AttnKernels& ak = k_.attn();
  const int64_t lanes = ak.lanes;
  std::vector<int32_t> seq_rows;
  for (int64_t t = 0; t < n_tokens; ++t) {
    if (kv.seq[t] >= static_cast<int32_t>(seq_rows.size())) seq_rows.resize(kv.seq[t] + 1, 0);
    ++seq_rows[kv.seq[t]];
  }
  const int64_t max_span = max_visible + 2 * lanes;
  // Work items are (row, kv head, slice of the group's query heads). With fewer rows x kv heads
  // than threads (decode of one sequence: Gemma 3 270M has one KV head) the group's heads are
  // split so every thread has work; each slice widens the F16 rows it reads itself, and every
  // head's arithmetic is the same whichever slice computes it.
  const int64_t base_items = n_tokens * p.n_kv_heads;
  const int64_t n_slices =
      base_items >= pool_.num_threads()
          ? 1
          : std::min<int64_t>(group, (pool_.num_threads() + base_items - 1) / base_items);
  pool_.ParallelFor(base_items * n_slices, [&](int64_t w0, int64_t w1) {
    // Per-thread scratch, kept across calls: the accumulator rows alone are 256 KiB for Gemma
    // (4 heads x 64 x 256 floats), and a fresh allocation per call (mmap'd, zeroed by the kernel)
    // cost 4% of a decode step.
    thread_local std::vector<float> scores, acc, widened, widened_v, rotated_q;
    thread_local std::vector<const float*> vrows;
    scores.resize(static_cast<size_t>(group * max_span));
    if (v_cache.type == KvDType::kI8) acc.resize(static_cast<size_t>(group * 4 * lanes * hd));
    widened.resize(static_cast<size_t>(hd));
    if (k_cache.type == KvDType::kI8) rotated_q.resize(static_cast<size_t>(group * hd));
    for (int64_t item = w0; item < w1; ++item) {
      const int64_t slice = item % n_slices;
      const int64_t t = item / n_slices / p.n_kv_heads;
      const int64_t kvh = item / n_slices % p.n_kv_heads;
      const int g0 = static_cast<int>(slice * group / n_slices);
      const int g1 = static_cast<int>((slice + 1) * group / n_slices);
      const int32_t seq = kv.seq[t];
      const int64_t lo = first_visible(t), hi = kv.pos[t];
      const int64_t a0 = lo - lo % lanes, a1 = (hi + lanes) / lanes * lanes, span = a1 - a0;
      const bool attn_wide = kv.row_orders.empty() ? seq_rows[seq] > 1
                                                   : (kv.row_orders[t] & kRowOrderAttnWide) != 0;
      const int64_t n_acc = attn_wide ? lanes : 4 * lanes;
      const float* qh = RowF32(q, t) + kvh * group * hd;  // the group's first query head
      // This row's sequence widened above: its K and V rows in F32, indexed by position - w.lo.
      const float* wk = nullptr;
      const float* wv = nullptr;
      if (!wide.empty() && wide[seq].hi >= wide[seq].lo) {
        const WideSeq& w = wide[seq];
        wk = widened_kv_.data() + w.offset + (kvh * w.span() + (lo - w.lo)) * hd;
        wv = wk + p.n_kv_heads * w.span() * hd;
      }
      // INT8 keys are stored rotated: so is the query they are dotted with.
      const float* qk = qh;
      if (k_cache.type == KvDType::kI8) {
        std::memcpy(rotated_q.data() + g0 * hd, qh + g0 * hd,
                    static_cast<size_t>((g1 - g0) * hd) * sizeof(float));
        for (int g = g0; g < g1; ++g) k_.rotate_kv_row(rotated_q.data() + g * hd, p.head_dim, 1.f);
        qk = rotated_q.data();
      }
      // Pass 1: scores, -inf outside [lo, hi].
      for (int g = g0; g < g1; ++g) {
        float* sg = scores.data() + g * span;
        std::fill(sg, sg + (lo - a0), -std::numeric_limits<float>::infinity());
        std::fill(sg + (hi + 1 - a0), sg + span, -std::numeric_limits<float>::infinity());
      }
      for (int64_t pos = lo; pos <= hi; ++pos) {
        const float* krow = nullptr;  // F32 key row, or nullptr for INT8
        if (wk != nullptr) {
          krow = wk + (pos - lo) * hd;
        } else {
          const int64_t slot = SlotOf(kv, seq, pos);
          const char* raw = k_cache.values(slot, static_cast<int>(kvh));
          if (k_cache.type == KvDType::kF32) {
            krow = reinterpret_cast<const float*>(raw);
          } else if (k_cache.type == KvDType::kF16) {
            k_.f16_to_f32(reinterpret_cast<const uint16_t*>(raw), widened.data(), hd);
            krow = widened.data();
          }
        }
        for (int g = g0; g < g1; ++g) {
          float s = krow != nullptr ? ak.dot(krow, qh + g * hd, hd)
                                    : dot_i8(SlotOf(kv, seq, pos), kvh, qk + g * hd);
          s *= p.scale;
          if (p.softcap > 0.f) s = p.softcap * std::tanh(s / p.softcap);
          scores[g * span + (pos - a0)] = s;
        }
      }
      // Softmax: exponentials and their F64 sum over whole groups of L positions, then the
      // probabilities scaled by the F32 reciprocal. The query is fully read by now, so out may
      // alias q.
      for (int g = g0; g < g1; ++g) {
        float* sg = scores.data() + g * span;
        const float m = k_.max(sg + (lo - a0), hi - lo + 1);
        const float inv = static_cast<float>(1.0 / ak.exp_sum(sg, m, sg, span));
        for (int64_t j = lo - a0; j <= hi - a0; ++j) sg[j] *= inv;
      }
      float* oh = RowF32(out, t) + kvh * group * hd;
      // Pass 2: position pos adds p * v into accumulator pos % n_acc; then the accumulators are
      // summed in ggml's tree. F32 and F16 rows go through ak.vsum, which keeps the accumulators
      // in registers (F16 rows widened to F32 first: a prompt's once per sequence above, a
      // decode row's here); INT8 rows, whose scale folds into the weight, through n_acc rows.
      if (v_cache.type != KvDType::kI8) {
        vrows.resize(static_cast<size_t>(hi - lo + 1));
        if (wv == nullptr && v_cache.type == KvDType::kF16) {
          widened_v.resize(static_cast<size_t>((hi - lo + 1) * hd));
        }
        for (int64_t pos = lo; pos <= hi; ++pos) {
          const float* vr = nullptr;
          if (wv != nullptr) {
            vr = wv + (pos - lo) * hd;
          } else {
            const char* raw = v_cache.values(SlotOf(kv, seq, pos), static_cast<int>(kvh));
            if (v_cache.type == KvDType::kF32) {
              vr = reinterpret_cast<const float*>(raw);
            } else {
              float* dst = widened_v.data() + (pos - lo) * hd;
              k_.f16_to_f32(reinterpret_cast<const uint16_t*>(raw), dst, hd);
              vr = dst;
            }
          }
          vrows[pos - lo] = vr;
        }
        for (int g = g0; g < g1; ++g) {
          ak.vsum(scores.data() + g * span + (lo - a0), vrows.data(), lo, hi,
                  static_cast<int>(n_acc), hd, oh + g * hd);
        }
        continue;
      }
      std::fill(acc.begin() + g0 * n_acc * hd, acc.begin() + g1 * n_acc * hd, 0.f);
      for (int64_t pos = lo; pos <= hi; ++pos) {
        const int64_t r = pos % n_acc;
        for (int g = g0; g < g1; ++g) {
          const float pj = scores[g * span + (pos - a0)];
          float* ar = acc.data() + (g * n_acc + r) * hd;
          axpy_i8(pj, SlotOf(kv, seq, pos), kvh, ar);
        }
      }
      for (int g = g0; g < g1; ++g) {
        ak.reduce(acc.data() + g * n_acc * hd, static_cast<int>(n_acc), hd, hd, oh + g * hd);
        k_.rotate_kv_row(oh + g * hd, p.head_dim, 1.f);  // the weighted sum of rotated values, back
      }
    }
  });
  return absl::OkStatus();
}

}  // namespace

std::unique_ptr<Backend> CreateCpuBackend(const CpuBackendOptions& options) {
  int threads = options.threads;
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::make_unique<CpuBackend>(cpu::SelectKernels(options.force_scalar), threads);
}

}  // namespace pd::engine
