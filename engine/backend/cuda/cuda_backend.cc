// The CUDA backend: device memory, and every op of the Backend interface as kernels of our own
// (one .cu/.cuh pair per op family in this folder) or cuBLAS GEMMs, for the types listed in
// cuda_ops.h. Anything else returns UNIMPLEMENTED; nothing falls back to the host silently.
//
// Everything is enqueued on one non-blocking stream owned by the backend; cuBLAS runs on the same
// stream, so ops execute in the order they were called without host synchronisation. Host-side
// metadata (token ids, positions, block tables) reaches the kernels through HostStaging, which
// copies it asynchronously ahead of each op.
//
// Numerics against the CPU backend (tests/engine/backend/cuda_backend_test.cc checks each op):
// GetRows, Add, AddBias, Scale and StoreKv (F32, F16, INT8) are bit-exact; RmsNorm, Rope, SwiGlu,
// GeGlu, Softmax and Attention differ by the rounding of expf/tanhf/sincosf and of sums taken in
// another order, and Attention's prompt rows (the tiled kernel) by queries, probabilities and F32
// cache values rounded to F16 for the tensor cores. MatMul multiplies F32 activations for
// decode-sized batches of quantized weights (the CPU quantizes them to the weights' companion
// type first) and F16-rounded activations and weights on tensor cores otherwise.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <bit>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/status.h"
#include "common/strings.h"
#include "engine/backend/backend.h"
#include "engine/backend/cuda/attention.cuh"
#include "engine/backend/cuda/convert.cuh"
#include "engine/backend/cuda/cuda_ops.h"
#include "engine/backend/cuda/cuda_status.h"
#include "engine/backend/cuda/dequantize.cuh"
#include "engine/backend/cuda/device_buffer.h"
#include "engine/backend/cuda/elementwise.cuh"
#include "engine/backend/cuda/host_staging.h"
#include "engine/backend/cuda/kv_store.cuh"
#include "engine/backend/cuda/kv_views.cuh"
#include "engine/backend/cuda/matmul_q8act.cuh"
#include "engine/backend/cuda/matmul_quant.cuh"
#include "engine/backend/cuda/quant_blocks.cuh"
#include "engine/backend/cuda/rmsnorm.cuh"
#include "engine/backend/cuda/rope.cuh"
#include "engine/backend/cuda/softmax.cuh"
#include "engine/backend/cuda/topk.cuh"
#include "engine/backend/kv_batch_check.h"
#include "engine/backend/kv_layout.h"
#include "engine/quant/dtype.h"
#include "engine/quant/k_quants.h"
#include "engine/quant/q5_0.h"
#include "engine/quant/q8_0.h"

namespace pd::engine {

static_assert(cuda::kTopKMax == kMaxTopK, "topk.cu must take every k Backend::TopK allows");
namespace {

// A cudaStream_t, destroyed with its owner. Move-only.
class CudaStream {
 public:
  // A non-blocking stream on the current device.
  static absl::StatusOr<CudaStream> Create() {
    cudaStream_t s = nullptr;
    PD_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
                            "cudaStreamCreateWithFlags");
    return CudaStream(s);
  }
  CudaStream(CudaStream&& o) noexcept : stream_(std::exchange(o.stream_, nullptr)) {}
  CudaStream& operator=(CudaStream&& o) noexcept {
    if (this != &o) {
      Reset();
      stream_ = std::exchange(o.stream_, nullptr);
    }
    return *this;
  }
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  ~CudaStream() { Reset(); }

  cudaStream_t get() const { return stream_; }

 private:
  explicit CudaStream(cudaStream_t s) : stream_(s) {}
  // Pending work still completes; the stream's resources are released after it.
  void Reset() {
    if (stream_ != nullptr) (void)cudaStreamDestroy(std::exchange(stream_, nullptr));
  }
  cudaStream_t stream_ = nullptr;
};

// A cublasHandle_t bound to one stream, destroyed with its owner. Move-only.
class CublasHandle {
 public:
  static absl::StatusOr<CublasHandle> Create(cudaStream_t stream) {
    cublasHandle_t h = nullptr;
    PD_CUBLAS_RETURN_IF_ERROR(cublasCreate(&h), "cublasCreate");
    CublasHandle handle(h);
    PD_CUBLAS_RETURN_IF_ERROR(cublasSetStream(h, stream), "cublasSetStream");
    return handle;
  }
  CublasHandle(CublasHandle&& o) noexcept : handle_(std::exchange(o.handle_, nullptr)) {}
  CublasHandle& operator=(CublasHandle&& o) noexcept {
    if (this != &o) {
      Reset();
      handle_ = std::exchange(o.handle_, nullptr);
    }
    return *this;
  }
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  ~CublasHandle() { Reset(); }

  cublasHandle_t get() const { return handle_; }

 private:
  explicit CublasHandle(cublasHandle_t h) : handle_(h) {}
  void Reset() {
    if (handle_ != nullptr) (void)cublasDestroy(std::exchange(handle_, nullptr));
  }
  cublasHandle_t handle_ = nullptr;
};

absl::Status Unimplemented(std::string_view op) {
  return absl::UnimplementedError(
      pd::StrCat("CUDA backend: ", op, " is not implemented on CUDA (the CPU backend runs it)"));
}

std::string_view TypeName(DType t) { return Traits(t).name; }

std::string ShapeString(const Tensor& t) {
  return pd::StrCat(TypeName(t.type), "[", t.rows, ", ", t.cols, "]");
}

std::string ShapeString(const KvTensor& t) {
  return pd::StrCat(KvDTypeName(t.type), "[", t.n_blocks, " blocks x ", t.block_size, " slots x ",
                    t.n_kv_heads, " heads x ", t.head_dim, "]");
}

bool FitsInt(int64_t v) { return v >= 0 && v <= INT_MAX; }

// The kernels' block structs (quant_blocks.cuh) and KV types (kv_views.cuh) are declared apart
// from engine/quant and kv_layout.h, which nvcc does not see; they must agree byte for byte.
static_assert(sizeof(cuda::BlockQ8_0) == sizeof(BlockQ8_0) &&
              offsetof(cuda::BlockQ8_0, qs) == offsetof(BlockQ8_0, qs));
static_assert(sizeof(cuda::BlockQ4_0) == sizeof(BlockQ4_0) &&
              offsetof(cuda::BlockQ4_0, qs) == offsetof(BlockQ4_0, qs));
static_assert(sizeof(cuda::BlockQ5_0) == sizeof(BlockQ5_0) &&
              offsetof(cuda::BlockQ5_0, qh) == offsetof(BlockQ5_0, qh) &&
              offsetof(cuda::BlockQ5_0, qs) == offsetof(BlockQ5_0, qs));
static_assert(sizeof(cuda::BlockQ2_K) == sizeof(BlockQ2_K) &&
              offsetof(cuda::BlockQ2_K, qs) == offsetof(BlockQ2_K, qs) &&
              offsetof(cuda::BlockQ2_K, d) == offsetof(BlockQ2_K, d) &&
              offsetof(cuda::BlockQ2_K, dmin) == offsetof(BlockQ2_K, dmin));
static_assert(sizeof(cuda::BlockQ3_K) == sizeof(BlockQ3_K) &&
              offsetof(cuda::BlockQ3_K, qs) == offsetof(BlockQ3_K, qs) &&
              offsetof(cuda::BlockQ3_K, scales) == offsetof(BlockQ3_K, scales) &&
              offsetof(cuda::BlockQ3_K, d) == offsetof(BlockQ3_K, d));
static_assert(sizeof(cuda::BlockQ4_K) == sizeof(BlockQ4_K) &&
              offsetof(cuda::BlockQ4_K, dmin) == offsetof(BlockQ4_K, dmin) &&
              offsetof(cuda::BlockQ4_K, scales) == offsetof(BlockQ4_K, scales) &&
              offsetof(cuda::BlockQ4_K, qs) == offsetof(BlockQ4_K, qs));
static_assert(sizeof(cuda::BlockQ5_K) == sizeof(BlockQ5_K) &&
              offsetof(cuda::BlockQ5_K, dmin) == offsetof(BlockQ5_K, dmin) &&
              offsetof(cuda::BlockQ5_K, scales) == offsetof(BlockQ5_K, scales) &&
              offsetof(cuda::BlockQ5_K, qh) == offsetof(BlockQ5_K, qh) &&
              offsetof(cuda::BlockQ5_K, qs) == offsetof(BlockQ5_K, qs));
static_assert(sizeof(cuda::BlockQ6_K) == sizeof(BlockQ6_K) &&
              offsetof(cuda::BlockQ6_K, qh) == offsetof(BlockQ6_K, qh) &&
              offsetof(cuda::BlockQ6_K, scales) == offsetof(BlockQ6_K, scales) &&
              offsetof(cuda::BlockQ6_K, d) == offsetof(BlockQ6_K, d));
static_assert(static_cast<int>(cuda::KvType::kF16) == static_cast<int>(KvDType::kF16) &&
              static_cast<int>(cuda::KvType::kF32) == static_cast<int>(KvDType::kF32) &&
              static_cast<int>(cuda::KvType::kI8) == static_cast<int>(KvDType::kI8));

// The kernels' name for a table or weight type, or nullopt for a type they do not read.
std::optional<cuda::WeightFormat> FormatOf(DType t) {
  switch (t) {
    case DType::kF32:
      return cuda::WeightFormat::kF32;
    case DType::kF16:
      return cuda::WeightFormat::kF16;
    case DType::kBF16:
      return cuda::WeightFormat::kBF16;
    case DType::kQ8_0:
      return cuda::WeightFormat::kQ8_0;
    case DType::kQ4_0:
      return cuda::WeightFormat::kQ4_0;
    case DType::kQ5_0:
      return cuda::WeightFormat::kQ5_0;
    case DType::kQ2_K:
      return cuda::WeightFormat::kQ2_K;
    case DType::kQ3_K:
      return cuda::WeightFormat::kQ3_K;
    case DType::kQ4_K:
      return cuda::WeightFormat::kQ4_K;
    case DType::kQ5_K:
      return cuda::WeightFormat::kQ5_K;
    case DType::kQ6_K:
      return cuda::WeightFormat::kQ6_K;
    default:
      return std::nullopt;
  }
}

bool IsQuantized(DType t) { return t != DType::kF32 && t != DType::kF16 && t != DType::kBF16; }

// ---- argument checks (the CPU backend's, with this backend's limits) -------------------------

// An F32 activation tensor of a non-negative shape, with data unless empty.
absl::Status CheckF32(const Tensor& t, std::string_view what) {
  if (t.type != DType::kF32) {
    return absl::InvalidArgumentError(
        pd::StrCat("CUDA backend: ", what, " must be f32, got ", ShapeString(t)));
  }
  if (t.rows < 0 || t.cols < 0) {
    return absl::InvalidArgumentError(
        pd::StrCat("CUDA backend: ", what, " has a negative shape ", ShapeString(t)));
  }
  if (t.numel() > 0 && t.data == nullptr) {
    return absl::InvalidArgumentError(
        pd::StrCat("CUDA backend: ", what, " ", ShapeString(t), " has no data"));
  }
  return absl::OkStatus();
}

absl::Status CheckSameShape(const Tensor& a, const Tensor& b, std::string_view what) {
  if (a.rows != b.rows || a.cols != b.cols) {
    return absl::InvalidArgumentError(pd::StrCat(
        "CUDA backend: ", what, " shapes differ: ", ShapeString(a), " vs ", ShapeString(b)));
  }
  return absl::OkStatus();
}

bool Overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  if (a_bytes == 0 || b_bytes == 0) return false;
  const char* a0 = static_cast<const char*>(a);
  const char* b0 = static_cast<const char*>(b);
  return a0 < b0 + b_bytes && b0 < a0 + a_bytes;
}

bool Overlap(const Tensor& a, const Tensor& b) {
  return Overlap(a.data, a.bytes(), b.data, b.bytes());
}

absl::Status CheckCache(const KvTensor& c, const KvBatch& kv, std::string_view what) {
  if (c.type != KvDType::kF32 && c.type != KvDType::kF16 && c.type != KvDType::kI8) {
    return absl::UnimplementedError(
        pd::StrCat("CUDA backend: ", what, ": unknown KV cache type ", static_cast<int>(c.type)));
  }
  if (c.n_kv_heads <= 0 || c.head_dim <= 0 || c.block_size <= 0 || c.n_blocks < 0 ||
      (c.n_blocks > 0 && c.data == nullptr)) {
    return absl::InvalidArgumentError(pd::StrCat("CUDA backend: ", what, ": bad cache ",
                                                 ShapeString(c),
                                                 c.data == nullptr ? " (null data)" : ""));
  }
  if (c.block_size != kv.block_size) {
    return absl::InvalidArgumentError(pd::StrCat("CUDA backend: ", what, ": cache blocks of ",
                                                 c.block_size, " slots, batch block size ",
                                                 kv.block_size));
  }
  // Kernels index heads by blockIdx.y (at most 65535) and slots and tables with int.
  if (c.n_kv_heads > 65535 || !FitsInt(c.slots())) {
    return absl::InvalidArgumentError(
        pd::StrCat("CUDA backend: ", what, ": cache too large for the kernels: ", ShapeString(c)));
  }
  return absl::OkStatus();
}

cuda::KvCacheView CacheView(const KvTensor& c) {
  cuda::KvCacheView v;
  v.type = static_cast<cuda::KvType>(c.type);
  v.n_kv_heads = c.n_kv_heads;
  v.head_dim = c.head_dim;
  v.block_bytes = c.block_bytes();
  v.block_value_bytes = c.block_value_bytes();
  v.data = c.data;
  return v;
}

// First position token t of `kv` attends to.
int64_t FirstVisible(const KvBatch& kv, int64_t t, int window) {
  return window > 0 ? std::max<int64_t>(0, int64_t{kv.pos[t]} - window + 1) : 0;
}

// The CUDA backend on one device. Owns a stream, a cuBLAS handle bound to it, the staging of
// host metadata, and device scratch (converted activations, expanded weights, attention
// partials). Thread safety: one thread at a time (see Backend); every entry point makes the
// backend's device current on the calling thread first.
class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, std::string name, int sm_count, int cc_major, CudaStream stream,
              CublasHandle cublas, std::unique_ptr<HostStaging> staging, bool gemv_int8,
              bool graphs)
      : device_(device),
        name_(std::move(name)),
        sm_count_(sm_count),
        cc_major_(cc_major),
        stream_(std::move(stream)),
        cublas_(std::move(cublas)),
        staging_(std::move(staging)),
        gemv_int8_(gemv_int8),
        graphs_(graphs) {}

  ~CudaBackend() override {
    if (capturing_) {
      cudaGraph_t graph = nullptr;
      (void)cudaStreamEndCapture(stream_.get(), &graph);
      if (graph != nullptr) (void)cudaGraphDestroy(graph);
    }
    (void)cudaSetDevice(device_);
    (void)cudaStreamSynchronize(stream_.get());  // a launched graph may still run
    for (cudaGraphExec_t& exec : execs_) {
      if (exec != nullptr) (void)cudaGraphExecDestroy(std::exchange(exec, nullptr));
    }
    (void)cudaGetLastError();
  }

  std::string_view name() const override { return name_; }

  absl::StatusOr<std::unique_ptr<Buffer>> Allocate(size_t bytes) override {
    PD_RETURN_IF_ERROR(NotRecording("Allocate"));
    PD_ASSIGN_OR_RETURN(std::unique_ptr<DeviceBuffer> buf, DeviceBuffer::Create(bytes, device_));
    return std::unique_ptr<Buffer>(std::move(buf));
  }

  // Returns once host_src has been consumed, so the caller may reuse it at once (as with the
  // CPU backend). From pageable memory the runtime stages the bytes before returning; from
  // page-locked memory the copy is truly asynchronous, so we wait for it.
  absl::Status Upload(void* dst, const void* host_src, size_t bytes) override {
    PD_RETURN_IF_ERROR(NotRecording("Upload"));
    if (bytes == 0) return absl::OkStatus();
    if (dst == nullptr || host_src == nullptr) {
      return absl::InvalidArgumentError("CUDA backend: Upload with a null pointer");
    }
    PD_RETURN_IF_ERROR(Activate());
    PD_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_.get()),
        pd::StrCat("CUDA backend: Upload of ", bytes, " bytes (cudaMemcpyAsync)"));
    if (IsPageLocked(host_src)) {
      PD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_.get()),
                              "CUDA backend: Upload (cudaStreamSynchronize)");
    }
    return absl::OkStatus();
  }

  // Enqueued after all earlier ops. Into pageable memory the runtime completes the copy before
  // returning; into page-locked memory the bytes are there after Synchronize().
  absl::Status Download(void* host_dst, const void* src, size_t bytes) override {
    PD_RETURN_IF_ERROR(NotRecording("Download"));
    if (bytes == 0) return absl::OkStatus();
    if (host_dst == nullptr || src == nullptr) {
      return absl::InvalidArgumentError("CUDA backend: Download with a null pointer");
    }
    PD_RETURN_IF_ERROR(Activate());
    PD_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_.get()),
        pd::StrCat("CUDA backend: Download of ", bytes, " bytes (cudaMemcpyAsync)"));
    return absl::OkStatus();
  }

  absl::Status Zero(void* dst, size_t bytes) override {
    if (bytes == 0) return absl::OkStatus();
    if (dst == nullptr) return absl::InvalidArgumentError("CUDA backend: Zero of a null pointer");
    PD_RETURN_IF_ERROR(Activate());
    PD_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dst, 0, bytes, stream_.get()),
                            pd::StrCat("CUDA backend: Zero of ", bytes, " bytes"));
    return absl::OkStatus();
  }

  // Copies the host bytes of any supported type into a new device buffer; whether an op can
  // use the type is decided by the op.
  absl::StatusOr<Tensor> MapWeights(const Tensor& host, std::unique_ptr<Buffer>* storage) override {
    PD_RETURN_IF_ERROR(NotRecording("MapWeights"));
    if (storage == nullptr) {
      return absl::InvalidArgumentError("CUDA backend: MapWeights needs a storage pointer");
    }
    if (host.data == nullptr && host.bytes() > 0) {
      return absl::InvalidArgumentError("CUDA backend: MapWeights of a tensor without data");
    }
    PD_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> buf, Allocate(host.bytes()));
    PD_RETURN_IF_ERROR(Upload(buf->data(), host.data, host.bytes()));
    Tensor t = host;
    t.data = buf->data();
    *storage = std::move(buf);
    return t;
  }

  absl::Status Synchronize() override {
    PD_RETURN_IF_ERROR(NotRecording("Synchronize"));
    PD_RETURN_IF_ERROR(Activate());
    PD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_.get()),
                            "CUDA backend: Synchronize (an earlier asynchronous op failed)");
    return absl::OkStatus();
  }

  // ---- ops ----------------------------------------------------------------------------------

  // Row-major y[n, m] = x[n, k] * w[m, k]^T is, in cuBLAS's column-major terms,
  // y^T[m, n] = op_T(w as k x m, ld k) * (x^T as k x n, ld k), with ldc = m.
  // F32 weights: SGEMM in plain FP32 (no TF32, the default math mode), 2*m*n*k flops.
  // F16 / BF16 weights: x is first rounded to the weights' type into scratch (n*k*6 bytes of
  // traffic), then GemmEx with half inputs, FP32 accumulation (tensor cores) and F32 output.
  // Quantized weights (Q8_0, Q4_0, Q5_0, Q2_K ... Q6_K): for n <= cuda::kMaxGemvRows, a GEMV
  // that reads each weight block once and dots it with the F32 activations (matmul_quant.cu):
  // bound by the m * row_bytes weight bytes. For larger n the weights are expanded to F16 a slab
  // of rows at a time (dequantize.cu: row_bytes read and 2k bytes written per row) and multiplied
  // like F16 weights, so that tensor cores do the 2*m*n*k flops.
  absl::Status MatMul(const Tensor& w, const Tensor& x, Tensor& y) override {
    PD_RETURN_IF_ERROR(CheckMatMul(w, x, y));
    const int64_t m = w.rows, k = w.cols, n = x.rows;
    if (m == 0 || n == 0) return absl::OkStatus();
    if (k == 0) return Zero(y.data, y.bytes());  // an empty sum
    PD_RETURN_IF_ERROR(Activate());

    const float alpha = 1.f, beta = 0.f;
    const int im = static_cast<int>(m), ik = static_cast<int>(k), in = static_cast<int>(n);
    if (w.type == DType::kF32) {
      PD_RETURN_IF_ERROR(Unrecorded("MatMul through cuBLAS"));
      PD_CUBLAS_RETURN_IF_ERROR(
          cublasSgemm(cublas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, im, in, ik, &alpha,
                      static_cast<const float*>(w.data), ik, static_cast<const float*>(x.data), ik,
                      &beta, static_cast<float*>(y.data), im),
          pd::StrCat("CUDA backend: MatMul f32 (cublasSgemm m=", m, " n=", n, " k=", k, ")"));
      return absl::OkStatus();
    }

    if (w.type == DType::kBF16) {
      PD_RETURN_IF_ERROR(Unrecorded("MatMul through cuBLAS"));
      PD_ASSIGN_OR_RETURN(void* x16, Scratch(scratch_, static_cast<size_t>(n * k) * 2));
      PD_CUDA_RETURN_IF_ERROR(
          LaunchConvertF32ToBf16(static_cast<const float*>(x.data), n * k,
                                 static_cast<__nv_bfloat16*>(x16), stream_.get()),
          "CUDA backend: MatMul bf16 (convert activations to bf16)");
      PD_CUBLAS_RETURN_IF_ERROR(
          cublasGemmEx(cublas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, im, in, ik, &alpha, w.data,
                       CUDA_R_16BF, ik, x16, CUDA_R_16BF, ik, &beta, y.data, CUDA_R_32F, im,
                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          pd::StrCat("CUDA backend: MatMul bf16 (cublasGemmEx m=", m, " n=", n, " k=", k, ")"));
      return absl::OkStatus();
    }

    const cuda::WeightFormat format = *FormatOf(w.type);
    const size_t row_bytes = w.row_bytes();
    cuda::ActQuant act;
    const bool gemv = IsQuantized(w.type) && n <= cuda::kMaxGemvRows;
    if (gemv && gemv_int8_ && cuda::Q8ActGemvFormat(format, &act) &&
        cuda::Q8ActGemvAligned(format, w.data, row_bytes)) {
      PD_ASSIGN_OR_RETURN(void* xq, Scratch(scratch_, cuda::Q8ActLayoutFor(act, in, ik).bytes));
      PD_CUDA_RETURN_IF_ERROR(cuda::LaunchQuantizeAct(act, static_cast<const float*>(x.data), in,
                                                      ik, xq, stream_.get()),
                              pd::StrCat("CUDA backend: MatMul ", TypeName(w.type),
                                         " (quantize activations, k=", k, " n=", n, ")"));
      PD_CUDA_RETURN_IF_ERROR(
          cuda::LaunchQuantGemvQ8Act(format, w.data, row_bytes, im, ik, xq, in,
                                     static_cast<float*>(y.data), stream_.get()),
          pd::StrCat("CUDA backend: MatMul ", TypeName(w.type), " int8 GEMV (m=", m, " k=", k,
                     " n=", n, ")"));
      return absl::OkStatus();
    }
    if (gemv && GemvAligned(w)) {
      PD_CUDA_RETURN_IF_ERROR(cuda::LaunchQuantGemv(format, w.data, row_bytes, im, ik,
                                                    static_cast<const float*>(x.data), in,
                                                    static_cast<float*>(y.data), stream_.get()),
                              pd::StrCat("CUDA backend: MatMul ", TypeName(w.type), " GEMV (m=", m,
                                         " k=", k, " n=", n, ")"));
      return absl::OkStatus();
    }

    // F16 weights, or quantized ones expanded to F16 a slab of rows at a time.
    PD_RETURN_IF_ERROR(Unrecorded("MatMul through cuBLAS"));
    PD_ASSIGN_OR_RETURN(void* x16, Scratch(scratch_, static_cast<size_t>(n * k) * sizeof(__half)));
    PD_CUDA_RETURN_IF_ERROR(LaunchConvertF32ToF16(static_cast<const float*>(x.data), n * k,
                                                  static_cast<__half*>(x16), stream_.get()),
                            "CUDA backend: MatMul (convert activations to f16)");
    const int64_t slab_rows =
        w.type == DType::kF16 ? m : std::min<int64_t>(m, std::max<int64_t>(1, kSlabElems / k));
    void* w16 = nullptr;
    if (w.type != DType::kF16) {
      PD_ASSIGN_OR_RETURN(
          w16, Scratch(weight_scratch_, static_cast<size_t>(slab_rows * k) * sizeof(__half)));
    }
    for (int64_t r0 = 0; r0 < m; r0 += slab_rows) {
      const int64_t rows = std::min(slab_rows, m - r0);
      const void* a = static_cast<const char*>(w.data) + static_cast<size_t>(r0) * row_bytes;
      if (w.type != DType::kF16) {
        PD_CUDA_RETURN_IF_ERROR(
            cuda::LaunchDequantizeToF16(format, a, row_bytes, rows, k, static_cast<__half*>(w16),
                                        stream_.get()),
            pd::StrCat("CUDA backend: MatMul ", TypeName(w.type), " (expand weights to f16)"));
        a = w16;
      }
      // Rows r0 .. r0 + rows of w give y's columns r0 .. r0 + rows: in column-major terms the
      // rows of y^T starting at y + r0, with the full leading dimension m.
      PD_CUBLAS_RETURN_IF_ERROR(
          cublasGemmEx(cublas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows), in, ik,
                       &alpha, a, CUDA_R_16F, ik, x16, CUDA_R_16F, ik, &beta,
                       static_cast<float*>(y.data) + r0, CUDA_R_32F, im, CUBLAS_COMPUTE_32F,
                       CUBLAS_GEMM_DEFAULT),
          pd::StrCat("CUDA backend: MatMul ", TypeName(w.type), " (cublasGemmEx m=", rows, " n=", n,
                     " k=", k, ")"));
    }
    return absl::OkStatus();
  }

  // Q, K and V (or gate and up) of a decode step read the same activations. When every weight
  // of the group takes the int8 GEMV with the same activation quantization (Q4_K and Q6_K share
  // Q8_K), x is quantized once and each format's weights run in one launch
  // (cuda::LaunchQuantGemvQ8ActGroup): 2 launches for Q, K and V instead of 6, and one grid over
  // all their rows. Every output has the bits MatMul gives it. Other groups run MatMul per weight.
  absl::Status MatMulGroup(absl::Span<const Tensor* const> ws, const Tensor& x,
                           absl::Span<Tensor* const> ys,
                           absl::Span<const uint8_t> row_orders) override {
    const std::optional<cuda::ActQuant> act = GroupActivations(ws, x, ys);
    if (!act.has_value()) return Backend::MatMulGroup(ws, x, ys, row_orders);
    PD_RETURN_IF_ERROR(Activate());
    const int k = static_cast<int>(x.cols), n = static_cast<int>(x.rows);
    PD_ASSIGN_OR_RETURN(void* xq, Scratch(scratch_, cuda::Q8ActLayoutFor(*act, n, k).bytes));
    PD_CUDA_RETURN_IF_ERROR(
        cuda::LaunchQuantizeAct(*act, static_cast<const float*>(x.data), n, k, xq, stream_.get()),
        pd::StrCat("CUDA backend: MatMulGroup (quantize activations, k=", k, " n=", n, ")"));
    // The weights of each format in the order given, up to kMaxGemvParts per launch.
    std::vector<bool> done(ws.size(), false);
    for (size_t first = 0; first < ws.size(); ++first) {
      if (done[first]) continue;
      const DType type = ws[first]->type;
      std::vector<cuda::Q8ActGemvPart> parts;
      for (size_t i = first; i < ws.size(); ++i) {
        if (done[i] || ws[i]->type != type) continue;
        parts.push_back({ws[i]->data, ws[i]->row_bytes(), static_cast<int>(ws[i]->rows),
                         static_cast<float*>(ys[i]->data)});
        done[i] = true;
      }
      for (size_t p = 0; p < parts.size(); p += cuda::kMaxGemvParts) {
        const int count =
            static_cast<int>(std::min(parts.size() - p, static_cast<size_t>(cuda::kMaxGemvParts)));
        PD_CUDA_RETURN_IF_ERROR(
            cuda::LaunchQuantGemvQ8ActGroup(*FormatOf(type), parts.data() + p, count, k, xq, n,
                                            stream_.get()),
            pd::StrCat("CUDA backend: MatMulGroup ", TypeName(type), " int8 GEMV of ", count,
                       " weights (k=", k, " n=", n, ")"));
      }
    }
    return absl::OkStatus();
  }

  absl::Status RmsNorm(const Tensor& x, const Tensor& w, float eps, Tensor& y) override {
    if (x.type != DType::kF32 || y.type != DType::kF32) {
      return absl::InvalidArgumentError(
          pd::StrCat("CUDA backend: RmsNorm needs F32 x and y, got x ", ShapeString(x), ", y ",
                     ShapeString(y)));
    }
    if (y.rows != x.rows || y.cols != x.cols) {
      return absl::InvalidArgumentError(pd::StrCat("CUDA backend: RmsNorm shape mismatch: x ",
                                                   ShapeString(x), ", y ", ShapeString(y)));
    }
    const bool has_weight = w.data != nullptr;
    if (has_weight && (w.type != DType::kF32 || w.rows != 1 || w.cols != x.cols)) {
      return absl::InvalidArgumentError(pd::StrCat("CUDA backend: RmsNorm weight must be f32[1, ",
                                                   x.cols, "], got ", ShapeString(w)));
    }
    if (!FitsInt(x.rows) || !FitsInt(x.cols)) {
      return absl::InvalidArgumentError(
          pd::StrCat("CUDA backend: RmsNorm dimensions too large: ", ShapeString(x)));
    }
    if (x.rows == 0 || x.cols == 0) return absl::OkStatus();
    if (x.data == nullptr || y.data == nullptr) {
      return absl::InvalidArgumentError("CUDA backend: RmsNorm on a tensor without data");
    }
    PD_RETURN_IF_ERROR(Activate());
    PD_CUDA_RETURN_IF_ERROR(LaunchRmsNorm(static_cast<const float*>(x.data),
                                          has_weight ? static_cast<const float*>(w.data) : nullptr,
                                          eps, static_cast<int>(x.rows), static_cast<int>(x.cols),
                                          static_cast<float*>(y.data), stream_.get()),
                            "CUDA backend: RmsNorm kernel launch");
    return absl::OkStatus();
  }

  // Per output row: the table row's bytes read and cols * 4 bytes written.
  absl::Status GetRows(const Tensor& table, absl::Span<const int32_t> ids, Tensor& out) override {
    const std::optional<cuda::WeightFormat> format = FormatOf(table.type);
    if (!format.has_value()) {
      return Unimplemented(pd::StrCat("GetRows from a ", TypeName(table.type), " table"));
    }
    PD_RETURN_IF_ERROR(CheckF32(out, "GetRows out"));
    if (table.rows < 0 || table.cols < 0 || table.cols % Traits(table.type).block_size != 0 ||
        out.rows != static_cast<int64_t>(ids.size()) || out.cols != table.cols) {
      return absl::InvalidArgumentError(pd::StrCat("CUDA backend: GetRows: table ",
                                                   ShapeString(table), ", ", ids.size(),
                                                   " ids, out ", ShapeString(out)));
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] >= table.rows) {
        return absl::InvalidArgumentError(pd::StrCat("CUDA backend: GetRows: id ", ids[i], " at ",
                                                     i, " outside ", table.rows, " rows"));
      }
    }
    if (ids.empty() || table.cols == 0) return absl::OkStatus();
    if (table.data == nullptr) {
      return absl::InvalidArgumentError("CUDA backend: GetRows from a table without data");
    }
    if (Overlap(table, out)) {
      return absl::InvalidArgumentError("CUDA backend: GetRows: out overlaps the table");
    }
    PD_RETURN_IF_ERROR(Activate());
    const size_t bytes = ids.size() * sizeof(int32_t);
    PD_ASSIGN_OR_RETURN(char* host, staging_->Begin(bytes));
    std::memcpy(host, ids.data(), bytes);
    PD_ASSIGN_OR_RETURN(const char* dev, staging_->Commit(bytes));
    PD_CUDA_RETURN_IF_ERROR(
        cuda::LaunchGetRows(*format, table.data, table.row_bytes(),
                            reinterpret_cast<const int32_t*>(dev), static_cast<int64_t>(ids.size()),
                            table.cols, static_cast<float*>(out.data), stream_.get()),
        pd::StrCat("CUDA backend: GetRows from ", ShapeString(table)));
    return absl::OkStatus();
  }

  // Angles as the CPU backend builds them (see rope.cuh): theta_scale is its powf on the host.
  absl::Status Rope(Tensor& x, int n_heads, absl::Span<const int32_t> pos,
                    const RopeParams& p) override {
    PD_RETURN_IF_ERROR(CheckF32(x, "Rope x"));
    if (n_heads <= 0 || p.head_dim <= 0 || p.rot_dim <= 0 || p.rot_dim % 2 != 0 ||
        p.rot_dim > p.head_dim) {
      return absl::InvalidArgumentError(pd::StrCat("CUDA backend: Rope: n_heads ", n_heads,
                                                   ", head_dim ", p.head_dim, ", rot_dim ",
                                                   p.rot_dim));
    }
    if (x.cols != static_cast<int64_t>(n_heads) * p.head_dim ||
        x.rows != static_cast<int64_t>(pos.size())) {
      return absl::InvalidArgumentError(pd::StrCat("CUDA backend: Rope: x ", ShapeString(x),
                                                   " for ", pos.size(), " positions of ", n_heads,
                                                   " heads x ", p.head_dim));
    }
    if (!p.freq_factors.empty() && static_cast<int>(p.freq_factors.size()) != p.rot_dim / 2) {
      return absl::InvalidArgumentError(pd::StrCat("CUDA backend: Rope: ", p.freq_factors.size(),
                                                   " freq_factors for rot_dim ", p.rot_dim));
    }
    if (!(p.freq_base > 0.f) || !std::isfinite(p.freq_base) || !std::isfinite(p.freq_scale)) {
      return absl::InvalidArgumentError(
          pd::StrCat("CUDA backend: Rope: freq_base ", p.freq_base, ", freq_scale ", p.freq_scale));
    }
    if (!FitsInt(x.rows) || !FitsInt(x.cols)) {
      return absl::InvalidArgumentError(
          pd::StrCat("CUDA backend: Rope: x too large: ", ShapeString(x)));
    }
    if (x.rows == 0) return absl::OkStatus();
    PD_RETURN_IF_ERROR(Activate());
    // Staged: positions, then the frequency factors (both 4-byte values).
    const size_t pos_bytes = pos.size() * sizeof(int32_t);
    const size_t ff_bytes = p.freq_factors.size() * sizeof(float);
    PD_ASSIGN_OR_RETURN(char* host, staging_->Begin(pos_bytes + ff_bytes));
    std::memcpy(host, pos.data(), pos_bytes);
    if (ff_bytes > 0) std::memcpy(host + pos_bytes, p.freq_factors.data(), ff_bytes);
    PD_ASSIGN_OR_RETURN(const char* dev, staging_->Commit(pos_bytes + ff_bytes));
    cuda::RopeArgs args;
    args.n_tokens = static_cast<int>(x.rows);
    args.n_heads = n_heads;
    args.head_dim = p.head_dim;
    args.rot_dim = p.rot_dim;
    args.neox = p.mode == RopeMode::kNeox;
    args.theta_scale = std::pow(p.freq_base, -2.f / static_cast<float>(p.rot_dim));
    args.freq_scale = p.freq_scale;
    args.pos = reinterpret_cast<const int32_t*>(dev);
    args.freq_factors = ff_bytes > 0 ? reinterpret_cast<const float*>(dev + pos_bytes) : nullptr;
    PD_CUDA_RETURN_IF_ERROR(cuda::LaunchRope(static_cast<float*>(x.data), args, stream_.get()),
                            "CUDA backend: Rope kernel launch");
    return absl::OkStatus();
  }

  absl::Status Add(const Tensor& a, const Tensor& b, Tensor& y) override {
    PD_RETURN_IF_ERROR(CheckBinary(a, b, y, "Add"));
    if (y.numel() == 0) return absl::OkStatus();
    PD_RETURN_IF_ERROR(Activate());
    PD_CUDA_RETURN_IF_ERROR(
        cuda::LaunchAdd(static_cast<const float*>(a.data), static_cast<const float*>(b.data),
                        a.numel(), static_cast<float*>(y.data), stream_.get()),
        "CUDA backend: Add kernel launch");
    return absl::OkStatus();
  }

  absl::Status AddBias(const Tensor& x, const Tensor& bias, Tensor& y) override {
    PD_RETURN_IF_ERROR(CheckF32(x, "AddBias x"));
    PD_RETURN_IF_ERROR(CheckF32(bias, "AddBias bias"));
    PD_RETURN_IF_ERROR(CheckF32(y, "AddBias y"));
    PD_RETURN_IF_ERROR(CheckSameShape(x, y, "AddBias"));
    if (bias.rows != 1 || bias.cols != x.cols) {
      return absl::InvalidArgumentError(
          pd::StrCat("CUDA backend: AddBias: bias ", ShapeString(bias), " for x ", ShapeString(x)));
    }
    if (x.numel() == 0) return absl::OkStatus();
    PD_RETURN_IF_ERROR(Activate());
    PD_CUDA_RETURN_IF_ERROR(
        cuda::LaunchAddBias(static_cast<const float*>(x.data), static_cast<const float*>(bias.data),
                            x.rows, x.cols, static_cast<float*>(y.data), stream_.get()),
        "CUDA backend: AddBias kernel launch");
    return absl::OkStatus();
  }

  absl::Status SwiGlu(const Tensor& gate, const Tensor& up, Tensor& y) override {
    PD_RETURN_IF_ERROR(CheckBinary(gate, up, y, "SwiGlu"));
    if (y.numel() == 0) return absl::OkStatus();
    PD_RETURN_IF_ERROR(Activate());
    PD_CUDA_RETURN_IF_ERROR(
        cuda::LaunchSwiGlu(static_cast<const float*>(gate.data), static_cast<const float*>(up.data),
                           gate.numel(), static_cast<float*>(y.data), stream_.get()),
        "CUDA backend: SwiGlu kernel launch");
    return absl::OkStatus();
  }

  absl::Status GeGlu(const Tensor& gate, const Tensor& up, Tensor& y) override {
    PD_RETURN_IF_ERROR(CheckBinary(gate, up, y, "GeGlu"));
    if (y.numel() == 0) return absl::OkStatus();
    PD_RETURN_IF_ERROR(Activate());
    PD_CUDA_RETURN_IF_ERROR(
        cuda::LaunchGeGlu(static_cast<const float*>(gate.data), static_cast<const float*>(up.data),
                          gate.numel(), static_cast<float*>(y.data), stream_.get()),
        "CUDA backend: GeGlu kernel launch");
    return absl::OkStatus();
  }

  absl::Status Softcap(const Tensor& x, float cap, Tensor& y) override {
    PD_RETURN_IF_ERROR(CheckF32(x, "Softcap x"));
    PD_RETURN_IF_ERROR(CheckF32(y, "Softcap y"));
    PD_RETURN_IF_ERROR(CheckSameShape(x, y, "Softcap"));
    if (!(cap > 0) || !std::isfinite(cap)) {
      return absl::InvalidArgumentError(StrCat("Softcap: cap ", cap, " must be finite and > 0"));
    }
    if (y.numel() == 0) return absl::OkStatus();
    PD_RETURN_IF_ERROR(Activate());
    PD_CUDA_RETURN_IF_ERROR(cuda::LaunchSoftcap(static_cast<const float*>(x.data), cap, x.numel(),
                                                static_cast<float*>(y.data), stream_.get()),
                            "CUDA backend: Softcap kernel launch");
    return absl::OkStatus();
  }

  absl::Status Scale(const Tensor& x, float s, Tensor& y) override {
    PD_RETURN_IF_ERROR(CheckF32(x, "Scale x"));
    PD_RETURN_IF_ERROR(CheckF32(y, "Scale y"));
    PD_RETURN_IF_ERROR(CheckSameShape(x, y, "Scale"));
    if (y.numel() == 0) return absl::OkStatus();
    PD_RETURN_IF_ERROR(Activate());
    PD_CUDA_RETURN_IF_ERROR(cuda::LaunchScale(static_cast<const float*>(x.data), s, x.numel(),
                                              static_cast<float*>(y.data), stream_.get()),
                            "CUDA backend: Scale kernel launch");
    return absl::OkStatus();
  }

  // The slots' row indices and weights are staged together (both 4-byte values).
  absl::Status MoeCombine(const Tensor& rows, absl::Span<const int32_t> index,
                          absl::Span<const float> weights, int k, Tensor& y) override {
    PD_RETURN_IF_ERROR(CheckF32(rows, "MoeCombine rows"));
    PD_RETURN_IF_ERROR(CheckF32(y, "MoeCombine y"));
    if (k < 1 || index.size() != weights.size() ||
        index.size() != static_cast<size_t>(y.rows) * static_cast<size_t>(k) ||
        rows.cols != y.cols) {
      return absl::InvalidArgumentError(pd::StrCat(
          "CUDA backend: MoeCombine: rows ", ShapeString(rows), ", y ", ShapeString(y), ", k = ",
          k, ", ", index.size(), " indices and ", weights.size(), " weights"));
    }
    if (Overlap(rows, y)) {
      return absl::InvalidArgumentError("CUDA backend: MoeCombine: y overlaps rows");
    }
    for (size_t i = 0; i < index.size(); ++i) {
      if (index[i] < 0 || index[i] >= rows.rows) {
        return absl::InvalidArgumentError(pd::StrCat("CUDA backend: MoeCombine: index[", i,
                                                     "] = ", index[i], " is outside the ",
                                                     rows.rows, " rows"));
      }
    }
    if (y.numel() == 0) return absl::OkStatus();
    PD_RETURN_IF_ERROR(Activate());
    const size_t bytes = index.size() * sizeof(int32_t);
    PD_ASSIGN_OR_RETURN(char* host, staging_->Begin(2 * bytes));
    std::memcpy(host, index.data(), bytes);
    std::memcpy(host + bytes, weights.data(), bytes);
    PD_ASSIGN_OR_RETURN(const char* dev, staging_->Commit(2 * bytes));
    PD_CUDA_RETURN_IF_ERROR(
        cuda::LaunchMoeCombine(static_cast<const float*>(rows.data), rows.cols,
                               reinterpret_cast<const int32_t*>(dev),
                               reinterpret_cast<const float*>(dev + bytes), y.rows, k,
                               static_cast<float*>(y.data), stream_.get()),
        "CUDA backend: MoeCombine kernel launch");
    return absl::OkStatus();
  }

  absl::Status Softmax(Tensor& x) override {
    PD_RETURN_IF_ERROR(CheckF32(x, "Softmax x"));
    if (!FitsInt(x.rows) || !FitsInt(x.cols)) {
      return absl::InvalidArgumentError(
          pd::StrCat("CUDA backend: Softmax: x too large: ", ShapeString(x)));
    }
    if (x.numel() == 0) return absl::OkStatus();
    PD_RETURN_IF_ERROR(Activate());
    PD_CUDA_RETURN_IF_ERROR(
        cuda::LaunchSoftmax(static_cast<float*>(x.data), static_cast<int>(x.rows),
                            static_cast<int>(x.cols), stream_.get()),
        "CUDA backend: Softmax kernel launch");
    return absl::OkStatus();
  }

  // Per token: reads 4 * (k.cols + v.cols) bytes and writes as many cache bytes (F32), half (F16)
  // or a quarter plus 4 bytes of scale per head (INT8); see kv_store.cu.
  absl::Status StoreKv(const Tensor& k, const Tensor& v, KvTensor& k_cache, KvTensor& v_cache,
                       const KvBatch& kv) override {
    PD_RETURN_IF_ERROR(CheckF32(k, "StoreKv k"));
    PD_RETURN_IF_ERROR(CheckF32(v, "StoreKv v"));
    PD_RETURN_IF_ERROR(CheckCache(k_cache, kv, "StoreKv k_cache"));
    PD_RETURN_IF_ERROR(CheckCache(v_cache, kv, "StoreKv v_cache"));
    if (k.rows != v.rows || k.cols != k_cache.row_elems() || v.cols != v_cache.row_elems()) {
      return absl::InvalidArgumentError(
          pd::StrCat("CUDA backend: StoreKv: k ", ShapeString(k), ", v ", ShapeString(v),
                     ", k_cache ", ShapeString(k_cache), ", v_cache ", ShapeString(v_cache)));
    }
    if (!FitsInt(k.rows)) {
      return absl::InvalidArgumentError(
          pd::StrCat("CUDA backend: StoreKv: too many tokens: ", k.rows));
    }
    PD_RETURN_IF_ERROR(CheckKvBatch(kv, k.rows));
    for (int64_t t = 0; t < k.rows; ++t) {
      PD_RETURN_IF_ERROR(CheckSlots(kv, kv.seq[t], kv.pos[t], kv.pos[t],
                                    std::min(k_cache.slots(), v_cache.slots())));
    }
    if (k.rows == 0) return absl::OkStatus();
    PD_RETURN_IF_ERROR(Activate());
    PD_ASSIGN_OR_RETURN(const cuda::KvBatchView batch, StageKvBatch(kv, k.rows));
    PD_CUDA_RETURN_IF_ERROR(cuda::LaunchStoreKv(static_cast<const float*>(k.data),
                                                CacheView(k_cache), batch, stream_.get()),
                            pd::StrCat("CUDA backend: StoreKv into ", ShapeString(k_cache)));
    PD_CUDA_RETURN_IF_ERROR(cuda::LaunchStoreKv(static_cast<const float*>(v.data),
                                                CacheView(v_cache), batch, stream_.get()),
                            pd::StrCat("CUDA backend: StoreKv into ", ShapeString(v_cache)));
    return absl::OkStatus();
  }

  // Two kernels (attention.cuh). Which rows each takes is decided here, per call:
  //   - the tiled kernel (attention_tiled.cu) takes every run of at least
  //     cuda::kTiledAttentionMinRun rows that are consecutive in the batch and hold consecutive
  //     positions of one sequence (a prompt, or a chunk of one), cut into tiles of
  //     cuda::TiledAttentionTokens(group) rows, when cuda::TiledAttentionSupports() holds
  //     (head_dim a multiple of 16 up to 256, aligned caches, compute capability >= 8.0).
  //     Tensor cores, Q and P rounded to F16: 4 * head_dim flops per visible (row, head,
  //     position), each K and V row read once per tile of up to 64 (row, head) pairs.
  //   - the per-row kernel (attention.cu) takes every other row: decode rows, short runs, and
  //     all rows of a shape the tiled kernel does not take. A block per (row, head, split of its
  //     positions), online softmax in F32: 4 * head_dim flops per visible position, its K and V
  //     rows read per (row, head) (from L2 for the query heads of a KV head after the first).
  absl::Status Attention(const Tensor& q, const KvTensor& k_cache, const KvTensor& v_cache,
                         const KvBatch& kv, const AttentionParams& p, Tensor& out) override {
    PD_RETURN_IF_ERROR(CheckF32(q, "Attention q"));
    PD_RETURN_IF_ERROR(CheckF32(out, "Attention out"));
    PD_RETURN_IF_ERROR(CheckCache(k_cache, kv, "Attention k_cache"));
    PD_RETURN_IF_ERROR(CheckCache(v_cache, kv, "Attention v_cache"));
    if (p.n_heads <= 0 || p.n_kv_heads <= 0 || p.n_heads % p.n_kv_heads != 0 || p.head_dim <= 0 ||
        p.window < 0 || !(p.softcap >= 0.f) || !std::isfinite(p.softcap) ||
        !std::isfinite(p.scale)) {
      return absl::InvalidArgumentError(pd::StrCat("CUDA backend: Attention: n_heads ", p.n_heads,
                                                   ", n_kv_heads ", p.n_kv_heads, ", head_dim ",
                                                   p.head_dim, ", window ", p.window, ", softcap ",
                                                   p.softcap, ", scale ", p.scale));
    }
    const int64_t q_cols = static_cast<int64_t>(p.n_heads) * p.head_dim;
    if (q.cols != q_cols || k_cache.n_kv_heads != p.n_kv_heads || k_cache.head_dim != p.head_dim ||
        v_cache.n_kv_heads != p.n_kv_heads || v_cache.head_dim != p.head_dim) {
      return absl::InvalidArgumentError(pd::StrCat("CUDA backend: Attention: q ", ShapeString(q),
                                                   ", k_cache ", ShapeString(k_cache), ", v_cache ",
                                                   ShapeString(v_cache), " for ", p.n_heads, "/",
                                                   p.n_kv_heads, " heads of ", p.head_dim));
    }
    PD_RETURN_IF_ERROR(CheckSameShape(q, out, "Attention q/out"));
    if (out.data != q.data && Overlap(q, out)) {
      return absl::InvalidArgumentError("CUDA backend: Attention: out partially overlaps q");
    }
    if (k_cache.type != v_cache.type) {
      return Unimplemented(pd::StrCat("Attention over a ", KvDTypeName(k_cache.type),
                                      " K cache with a ", KvDTypeName(v_cache.type),
                                      " V cache (the kernels read both as one type)"));
    }
    if (p.head_dim > cuda::kMaxAttentionHeadDim || p.n_heads > 65535 || !FitsInt(q.rows)) {
      return Unimplemented(pd::StrCat("Attention with ", p.n_heads, " heads of ", p.head_dim,
                                      " over ", q.rows, " tokens (the kernels take head_dim <= ",
                                      cuda::kMaxAttentionHeadDim, " and at most 65535 heads)"));
    }
    const int64_t n_tokens = q.rows;
    PD_RETURN_IF_ERROR(CheckKvBatch(kv, n_tokens));
    const int64_t cache_slots = std::min(k_cache.slots(), v_cache.slots());
    for (int64_t t = 0; t < n_tokens; ++t) {
      PD_RETURN_IF_ERROR(
          CheckSlots(kv, kv.seq[t], FirstVisible(kv, t, p.window), kv.pos[t], cache_slots));
    }
    if (n_tokens == 0) return absl::OkStatus();
    PD_RETURN_IF_ERROR(Activate());

    cuda::AttentionArgs args;
    args.q = static_cast<const float*>(q.data);
    args.out = static_cast<float*>(out.data);
    args.k = CacheView(k_cache);
    args.v = CacheView(v_cache);
    args.n_heads = p.n_heads;
    args.n_kv_heads = p.n_kv_heads;
    args.head_dim = p.head_dim;
    args.scale = p.scale;
    args.softcap = p.softcap;
    args.window = p.window;

    // The tiles ([first row, rows] pairs, the latest positions first: the longest tiles start
    // first and the short ones fill in behind them) and the per-row kernel's rows.
    tiles_.clear();
    rows_.clear();
    const bool tiled = cuda::TiledAttentionSupports(p.head_dim, args.k, args.v, cc_major_);
    const int64_t tile_rows = cuda::TiledAttentionTokens(p.n_heads / p.n_kv_heads);
    for (int64_t t = 0; t < n_tokens;) {
      int64_t run = 1;
      while (t + run < n_tokens && kv.seq[t + run] == kv.seq[t] &&
             kv.pos[t + run] == kv.pos[t] + run) {
        ++run;
      }
      if (tiled && run >= cuda::kTiledAttentionMinRun) {
        for (int64_t r = 0; r < run; r += tile_rows) {
          tiles_.push_back(
              {static_cast<int32_t>(t + r), static_cast<int32_t>(std::min(tile_rows, run - r))});
        }
      } else {
        for (int64_t r = 0; r < run; ++r) rows_.push_back(static_cast<int32_t>(t + r));
      }
      t += run;
    }
    std::stable_sort(tiles_.begin(), tiles_.end(),
                     [&](const std::array<int32_t, 2>& a, const std::array<int32_t, 2>& b) {
                       return kv.pos[a[0]] + a[1] > kv.pos[b[0]] + b[1];
                     });
    // Every row per-row (no tiles): no list to stage.
    const bool all_rows = tiles_.empty();
    std::vector<int32_t>& extra = staged_ints_;
    extra.clear();
    for (const std::array<int32_t, 2>& tile : tiles_) {
      extra.insert(extra.end(), tile.begin(), tile.end());
    }
    if (!all_rows) extra.insert(extra.end(), rows_.begin(), rows_.end());
    const int32_t* extra_dev = nullptr;
    PD_ASSIGN_OR_RETURN(args.batch, StageKvBatch(kv, n_tokens, extra, &extra_dev));
    if (!all_rows) {
      args.tiles = extra_dev;
      args.n_tiles = static_cast<int>(tiles_.size());
      args.rows = extra_dev + 2 * tiles_.size();
      args.n_rows = static_cast<int>(rows_.size());
    }

    // Fewer per-row (row, head) blocks than two per SM (decode of a few sequences): split the
    // positions so that every SM has work, keeping at least kMinSplitPositions per split, since
    // each split costs a record of head_dim + 2 floats and a share of the merge. A warp walks its
    // positions one dependent K then V load at a time, so a split's time is its length times a
    // memory latency: at 64 positions per split a 140-token Llama 7B decode took 31 us a layer on
    // an H200 (2026-12-04), 16 gives the SMs four times the splits to overlap.
    const int64_t n_rows = all_rows ? n_tokens : static_cast<int64_t>(rows_.size());
    int64_t max_visible = 0;
    for (int64_t i = 0; i < n_rows; ++i) {
      const int64_t t = all_rows ? i : rows_[i];
      max_visible = std::max<int64_t>(max_visible, kv.pos[t] - FirstVisible(kv, t, p.window) + 1);
    }
    constexpr int64_t kMinSplitPositions = 16, kMaxSplits = 64;
    const int64_t blocks = n_rows * p.n_heads;
    const int64_t want = 2 * int64_t{sm_count_};
    if (blocks > 0 && blocks < want) {
      args.n_splits = static_cast<int>(std::max<int64_t>(
          1,
          std::min({(want + blocks - 1) / blocks, max_visible / kMinSplitPositions, kMaxSplits})));
    }
    if (args.n_splits > 1) {
      PD_ASSIGN_OR_RETURN(
          void* partial,
          // A power of two: the partials grow with the context, and each growth would abandon a
          // captured step.
          Scratch(attention_scratch_,
                  std::bit_ceil(cuda::AttentionPartialFloats(args) * sizeof(float))));
      args.partial = static_cast<float*>(partial);
    }
    PD_CUDA_RETURN_IF_ERROR(cuda::LaunchAttention(args, stream_.get()),
                            pd::StrCat("CUDA backend: Attention over ", ShapeString(k_cache)));
    return absl::OkStatus();
  }

  // One block per row (topk.cu): k == 1 is a single reduction pass, larger k a radix select.
  absl::Status TopK(const Tensor& x, int k, Tensor& values, int32_t* ids) override {
    PD_RETURN_IF_ERROR(CheckF32(x, "TopK x"));
    PD_RETURN_IF_ERROR(CheckF32(values, "TopK values"));
    if (k < 1 || k > kMaxTopK || k > x.cols) {
      return absl::InvalidArgumentError(pd::StrCat("CUDA backend: TopK: k = ", k,
                                                   " is outside [1, min(", x.cols, " columns, ",
                                                   kMaxTopK, ")]"));
    }
    if (values.rows != x.rows || values.cols != k) {
      return absl::InvalidArgumentError(pd::StrCat("CUDA backend: TopK: values ",
                                                   ShapeString(values), " for x ", ShapeString(x),
                                                   " and k = ", k));
    }
    if (!FitsInt(x.rows) || !FitsInt(x.cols)) {
      return absl::InvalidArgumentError(
          pd::StrCat("CUDA backend: TopK: x too large: ", ShapeString(x)));
    }
    if (x.rows == 0) return absl::OkStatus();
    if (ids == nullptr) return absl::InvalidArgumentError("CUDA backend: TopK: null ids");
    PD_RETURN_IF_ERROR(Activate());
    const int rows = static_cast<int>(x.rows), cols = static_cast<int>(x.cols);
    void* scratch = nullptr;
    if (const size_t bytes = cuda::TopKScratchBytes(rows, cols, k); bytes > 0) {
      PD_ASSIGN_OR_RETURN(scratch, Scratch(topk_scratch_, bytes));
    }
    PD_CUDA_RETURN_IF_ERROR(
        cuda::LaunchTopK(static_cast<const float*>(x.data), rows, cols, k,
                         static_cast<float*>(values.data), ids, scratch, stream_.get()),
        "CUDA backend: TopK kernel launch");
    return absl::OkStatus();
  }

  // ---- captured steps ---------------------------------------------------------------------
  // A decode step (rows <= kMaxGemvRows, so that every quantized MatMul is a GEMV of our own) is
  // recorded by stream capture into a graph and launched as one: the step's few hundred kernels
  // then start back to back on the GPU instead of each waiting for its launch from the host. Each
  // step is recorded again (its positions, block tables and attention splits change), and the
  // executable graph of its batch size is updated in place when the recording has the same
  // shape, else instantiated anew. What cannot be recorded (cuBLAS, which may allocate; a scratch
  // buffer or the staging arena that must grow) abandons the recording: the model runs the step
  // again without it, and what had to grow grows outside any recording. After kMaxAbandoned
  // abandoned recordings in a row this backend stops capturing (a model whose step always needs
  // cuBLAS, say: F16 weights).
  bool BeginCapture(int64_t rows) override {
    if (!graphs_ || capturing_ || rows < 1 || rows > cuda::kMaxGemvRows ||
        abandoned_in_a_row_ >= kMaxAbandoned) {
      return false;
    }
    if (!Activate().ok() || !staging_->StartArena().ok()) return false;
    if (cudaStreamBeginCapture(stream_.get(), cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
      (void)cudaGetLastError();
      staging_->StopArena();
      ++abandoned_in_a_row_;
      ++stats_.abandoned;
      return false;
    }
    capturing_ = true;
    recording_void_ = false;
    capture_rows_ = rows;
    return true;
  }

  absl::StatusOr<bool> EndCapture(bool run) override {
    if (!capturing_) {
      return absl::FailedPreconditionError("CUDA backend: EndCapture without BeginCapture");
    }
    capturing_ = false;
    staging_->StopArena();
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream_.get(), &graph);
    const bool abandoned = recording_void_ || staging_->ArenaOverflowed();
    if (!run || abandoned || ended != cudaSuccess || graph == nullptr) {
      if (graph != nullptr) (void)cudaGraphDestroy(graph);
      (void)cudaGetLastError();  // an op's launch error invalidates the capture: not sticky
      if (abandoned || run) {    // not for an op's own error
        ++abandoned_in_a_row_;
        ++stats_.abandoned;
      }
      return false;
    }
    cudaGraphExec_t& exec = execs_[static_cast<size_t>(capture_rows_)];
    if (exec != nullptr) {
      cudaGraphExecUpdateResultInfo info{};
      if (cudaGraphExecUpdate(exec, graph, &info) != cudaSuccess) {
        (void)cudaGetLastError();  // another shape: instantiate this recording instead
        (void)cudaGraphExecDestroy(std::exchange(exec, nullptr));
      }
    }
    if (exec == nullptr) {
      const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
      if (made != cudaSuccess) {
        (void)cudaGetLastError();
        exec = nullptr;
        (void)cudaGraphDestroy(graph);
        ++abandoned_in_a_row_;
        ++stats_.abandoned;
        return false;
      }
    }
    (void)cudaGraphDestroy(graph);  // the executable graph holds what it needs
    PD_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec, stream_.get()),
                            "CUDA backend: launching a captured step (cudaGraphLaunch)");
    PD_RETURN_IF_ERROR(staging_->ArenaLaunched());
    abandoned_in_a_row_ = 0;
    ++stats_.launched;
    return true;
  }

  CaptureStats capture_stats() const override { return stats_; }

 private:
  static constexpr int kMaxAbandoned = 8;

  // FAILED_PRECONDITION while a step is recorded: `what` waits for the device or allocates.
  absl::Status NotRecording(std::string_view what) const {
    if (!capturing_) return absl::OkStatus();
    return absl::FailedPreconditionError(
        pd::StrCat("CUDA backend: ", what, " while a step is being captured"));
  }
  // ABORTED while a step is recorded, which is then abandoned: `what` cannot be recorded.
  absl::Status Unrecorded(std::string_view what) {
    if (!capturing_) return absl::OkStatus();
    recording_void_ = true;
    return absl::AbortedError(
        pd::StrCat("CUDA backend: ", what, " cannot be captured; the step runs uncaptured"));
  }
  // Weights expanded to F16 for a GEMM take at most this many elements of scratch at a time
  // (64 MiB): a 262144 x 640 output head goes in 4 slabs, a 4096 x 14336 projection in one.
  static constexpr int64_t kSlabElems = int64_t{32} << 20;

  // Makes this backend's device current on the calling thread (cheap when it already is).
  absl::Status Activate() {
    if (capturing_) return absl::OkStatus();  // BeginCapture made the device current
    PD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_),
                            pd::StrCat("CUDA backend: cudaSetDevice(", device_, ")"));
    return absl::OkStatus();
  }

  // Device scratch `buf` grown to at least `bytes`; its contents are valid until the next call
  // that uses the same buffer. Reuse across ops is safe because every op is ordered on the one
  // stream; growing frees the old buffer, and cudaFree waits for the work that may still read it.
  absl::StatusOr<void*> Scratch(std::unique_ptr<DeviceBuffer>& buf, size_t bytes) {
    if (buf == nullptr || buf->size() < bytes) {
      PD_RETURN_IF_ERROR(Unrecorded(pd::StrCat("growing a scratch buffer to ", bytes, " bytes")));
      buf.reset();
      PD_ASSIGN_OR_RETURN(buf, DeviceBuffer::Create(bytes, device_));
    }
    return buf->data();
  }

  // Three F32 tensors of one shape.
  static absl::Status CheckBinary(const Tensor& a, const Tensor& b, const Tensor& y,
                                  std::string_view op) {
    PD_RETURN_IF_ERROR(CheckF32(a, op));
    PD_RETURN_IF_ERROR(CheckF32(b, op));
    PD_RETURN_IF_ERROR(CheckF32(y, op));
    PD_RETURN_IF_ERROR(CheckSameShape(a, b, op));
    return CheckSameShape(a, y, op);
  }

  // MatMul's checks of w [m, k], x [n, k] and y [n, m], and of their data when there is work.
  static absl::Status CheckMatMul(const Tensor& w, const Tensor& x, const Tensor& y) {
    if (std::find(cuda::kMatMulWeightTypes.begin(), cuda::kMatMulWeightTypes.end(), w.type) ==
        cuda::kMatMulWeightTypes.end()) {
      return Unimplemented(pd::StrCat("MatMul with ", TypeName(w.type), " weights"));
    }
    if (x.type != DType::kF32 || y.type != DType::kF32) {
      return absl::InvalidArgumentError(
          pd::StrCat("CUDA backend: MatMul needs F32 activations, got x ", ShapeString(x),
                     " and y ", ShapeString(y)));
    }
    if (w.cols != x.cols || y.rows != x.rows || y.cols != w.rows) {
      return absl::InvalidArgumentError(
          pd::StrCat("CUDA backend: MatMul shape mismatch: w ", ShapeString(w), ", x ",
                     ShapeString(x), ", y ", ShapeString(y), " (want w[m, k], x[n, k], y[n, m])"));
    }
    const int64_t m = w.rows, k = w.cols, n = x.rows;
    if (!FitsInt(m) || !FitsInt(k) || !FitsInt(n)) {
      return absl::InvalidArgumentError(
          pd::StrCat("CUDA backend: MatMul dimensions must be in [0, INT_MAX], got m=", m, " k=", k,
                     " n=", n));
    }
    if (k % Traits(w.type).block_size != 0) {
      return absl::InvalidArgumentError(pd::StrCat("CUDA backend: MatMul: k of w ", ShapeString(w),
                                                   " is not a multiple of the block size ",
                                                   Traits(w.type).block_size));
    }
    if (m == 0 || n == 0 || k == 0) return absl::OkStatus();  // nothing is read
    if (w.data == nullptr || x.data == nullptr || y.data == nullptr) {
      return absl::InvalidArgumentError("CUDA backend: MatMul on a tensor without data");
    }
    if (Overlap(y, x) || Overlap(y, w)) {
      return absl::InvalidArgumentError("CUDA backend: MatMul output overlaps an input");
    }
    return absl::OkStatus();
  }

  // The activation quantization that every weight of a MatMulGroup takes, when the group can run
  // as one quantization and grouped int8 GEMVs: two or more weights, each one MatMul would send to
  // the int8 GEMV (valid, non-empty, n <= kMaxGemvRows) with the same quantization. nullopt
  // otherwise, and for every group MatMul would refuse, so that MatMul per weight gives the error.
  std::optional<cuda::ActQuant> GroupActivations(absl::Span<const Tensor* const> ws,
                                                 const Tensor& x,
                                                 absl::Span<Tensor* const> ys) const {
    if (!gemv_int8_ || ws.size() < 2 || ws.size() != ys.size() || x.rows < 1 ||
        x.rows > cuda::kMaxGemvRows || x.cols < 1) {
      return std::nullopt;
    }
    std::optional<cuda::ActQuant> act;
    for (size_t i = 0; i < ws.size(); ++i) {
      const Tensor& w = *ws[i];
      cuda::ActQuant a;
      const std::optional<cuda::WeightFormat> format = FormatOf(w.type);
      if (!IsQuantized(w.type) || !format.has_value() || !cuda::Q8ActGemvFormat(*format, &a) ||
          (act.has_value() && a != *act) || w.rows < 1 || !CheckMatMul(w, x, *ys[i]).ok() ||
          !cuda::Q8ActGemvAligned(*format, w.data, w.row_bytes())) {
        return std::nullopt;
      }
      act = a;
    }
    return act;
  }

  // The GEMV reads Q2_K, Q4_K and Q5_K codes as 4-byte words and the other formats' as 2-byte
  // halves; weight views at other offsets (never made by the model loader) take the GEMM path
  // instead.
  static bool GemvAligned(const Tensor& w) {
    const bool words = w.type == DType::kQ2_K || w.type == DType::kQ4_K || w.type == DType::kQ5_K;
    const uintptr_t align = words ? 4 : 2;
    return reinterpret_cast<uintptr_t>(w.data) % align == 0 && w.row_bytes() % align == 0;
  }

  // Copies a checked batch's positions, sequence ids and block tables to the device (one staged
  // copy, int32 throughout: pos [n], seq [n], table offsets [n_seq + 1], the tables), and after
  // them `extra` (Attention's tiles and rows), whose device address goes to *extra_dev.
  absl::StatusOr<cuda::KvBatchView> StageKvBatch(const KvBatch& kv, int64_t n_tokens,
                                                 absl::Span<const int32_t> extra = {},
                                                 const int32_t** extra_dev = nullptr) {
    const size_t n_seq = kv.block_tables.size();
    size_t n_blocks = 0;
    for (const absl::Span<const int32_t>& table : kv.block_tables) n_blocks += table.size();
    if (n_blocks > static_cast<size_t>(INT_MAX)) {
      return absl::InvalidArgumentError(
          pd::StrCat("CUDA backend: KvBatch: ", n_blocks, " block ids in all"));
    }
    const size_t n = static_cast<size_t>(n_tokens);
    const size_t ints = 2 * n + n_seq + 1 + n_blocks + extra.size();
    PD_ASSIGN_OR_RETURN(char* host_bytes, staging_->Begin(ints * sizeof(int32_t)));
    int32_t* host = reinterpret_cast<int32_t*>(host_bytes);
    std::memcpy(host, kv.pos.data(), n * sizeof(int32_t));
    std::memcpy(host + n, kv.seq.data(), n * sizeof(int32_t));
    int32_t* offsets = host + 2 * n;
    int32_t* tables = offsets + n_seq + 1;
    int32_t offset = 0;
    for (size_t s = 0; s < n_seq; ++s) {
      offsets[s] = offset;
      const absl::Span<const int32_t> table = kv.block_tables[s];
      if (!table.empty())
        std::memcpy(tables + offset, table.data(), table.size() * sizeof(int32_t));
      offset += static_cast<int32_t>(table.size());
    }
    offsets[n_seq] = offset;
    if (!extra.empty()) {
      std::memcpy(tables + offset, extra.data(), extra.size() * sizeof(int32_t));
    }
    PD_ASSIGN_OR_RETURN(const char* dev_bytes, staging_->Commit(ints * sizeof(int32_t)));
    const int32_t* dev = reinterpret_cast<const int32_t*>(dev_bytes);
    if (extra_dev != nullptr) *extra_dev = dev + (ints - extra.size());
    cuda::KvBatchView view;
    view.pos = dev;
    view.seq = dev + n;
    view.table_offsets = dev + 2 * n;
    view.tables = dev + 2 * n + n_seq + 1;
    view.n_tokens = static_cast<int>(n_tokens);
    view.block_size = kv.block_size;
    return view;
  }

  // True when `p` is page-locked host memory (cudaMallocHost / cudaHostRegister).
  static bool IsPageLocked(const void* p) {
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
      (void)cudaGetLastError();  // not a pointer CUDA knows: pageable
      return false;
    }
    return attr.type == cudaMemoryTypeHost;
  }

  const int device_;
  const std::string name_;
  const int sm_count_;  // multiprocessors: how many blocks Attention aims to keep busy
  const int cc_major_;  // compute capability: the tiled attention kernel needs 8 or more
  // Declaration order is destruction order reversed: the scratch buffers, the staging and the
  // cuBLAS handle go before the stream they use.
  CudaStream stream_;
  CublasHandle cublas_;
  std::unique_ptr<HostStaging> staging_;
  // PDSERVE_CUDA_GEMV at Create (default int8): Q4_K, Q6_K and Q8_0 GEMVs quantize the
  // activations and dot int8 codes (matmul_q8act.cu); f32 dots F32 activations (matmul_quant.cu).
  const bool gemv_int8_;
  // Captured steps (PDSERVE_CUDA_GRAPHS, BeginCapture / EndCapture): one executable graph per
  // batch size, updated in place from each step's recording when its shape allows.
  const bool graphs_;
  bool capturing_ = false;
  bool recording_void_ = false;  // an op could not be recorded: the capture is abandoned
  int64_t capture_rows_ = 0;
  int abandoned_in_a_row_ = 0;
  CaptureStats stats_;
  std::array<cudaGraphExec_t, cuda::kMaxGemvRows + 1> execs_{};
  std::unique_ptr<DeviceBuffer> scratch_;            // MatMul: activations in F16 / BF16
  std::unique_ptr<DeviceBuffer> weight_scratch_;     // MatMul: a slab of weights expanded to F16
  std::unique_ptr<DeviceBuffer> attention_scratch_;  // Attention: the splits' partial results
  std::unique_ptr<DeviceBuffer> topk_scratch_;       // TopK: the slices' candidates
  // Attention's row plan, kept across calls so that a step allocates nothing: the tiled
  // kernel's tiles, the per-row kernel's rows, and both as the ints staged after the batch.
  std::vector<std::array<int32_t, 2>> tiles_;
  std::vector<int32_t> rows_;
  std::vector<int32_t> staged_ints_;
};

// PDSERVE_CUDA_GEMV: which GEMV decode-sized quantized MatMuls run. Unset, empty or "int8" (the
// default since it passed and was timed on an H200, 2026-12-04: 1.4-1.9x the F32 GEMV on Q4_K):
// activations quantized as the CPU backend quantizes them and dotted in int8 for Q4_K, Q6_K and
// Q8_0 weights (matmul_q8act.cu); "f32": F32 activations for every format (matmul_quant.cu).
// Anything else is an error at start rather than a silent default.
// PDSERVE_CUDA_GRAPHS: whether decode steps are captured as CUDA graphs (Backend::BeginCapture).
// "1" or "on": captured; unset, empty, "0" or "off": each op launched (the default until the
// staged GPU checks have passed with graphs on). Anything else is an error at start.
absl::StatusOr<bool> GraphsFromEnv() {
  const char* v = std::getenv("PDSERVE_CUDA_GRAPHS");
  const std::string_view mode = v == nullptr ? "" : v;
  if (mode.empty() || mode == "0" || mode == "off") return false;
  if (mode == "1" || mode == "on") return true;
  return absl::InvalidArgumentError(
      pd::StrCat("PDSERVE_CUDA_GRAPHS=", mode, " is not a graph mode (use 1/on or 0/off)"));
}

absl::StatusOr<bool> GemvInt8FromEnv() {
  const char* v = std::getenv("PDSERVE_CUDA_GEMV");
  const std::string_view mode = v == nullptr ? "" : v;
  if (mode.empty() || mode == "int8") return true;
  if (mode == "f32") return false;
  return absl::InvalidArgumentError(
      pd::StrCat("PDSERVE_CUDA_GEMV=", mode, " is not a GEMV mode (use int8 or f32)"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::UnavailableError(
        pd::StrCat("no usable CUDA device: cudaGetDeviceCount failed: ", cudaGetErrorName(err),
                   " (", cudaGetErrorString(err), ")"));
  }
  if (count == 0) return absl::UnavailableError("no usable CUDA device: none is present");
  if (device < 0 || device >= count) {
    return absl::UnavailableError(pd::StrCat("CUDA device ", device, " requested, but ", count,
                                             " device(s) are present (valid: 0..", count - 1, ")"));
  }
  PD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device),
                          pd::StrCat("CreateCudaBackend: cudaSetDevice(", device, ")"));
  cudaDeviceProp prop{};
  PD_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device),
                          "CreateCudaBackend: cudaGetDeviceProperties");
  PD_ASSIGN_OR_RETURN(CudaStream stream, CudaStream::Create());
  PD_ASSIGN_OR_RETURN(CublasHandle cublas, CublasHandle::Create(stream.get()));
  PD_ASSIGN_OR_RETURN(std::unique_ptr<HostStaging> staging,
                      HostStaging::Create(device, stream.get()));
  PD_ASSIGN_OR_RETURN(const bool gemv_int8, GemvInt8FromEnv());
  PD_ASSIGN_OR_RETURN(const bool graphs, GraphsFromEnv());
  std::string name =
      pd::StrCat("cuda:", device, " (", prop.name, ", sm_", prop.major, prop.minor,
                 gemv_int8 ? ", int8 GEMV" : ", f32 GEMV", graphs ? ", graphs" : "", ")");
  return std::unique_ptr<Backend>(new CudaBackend(device, std::move(name), prop.multiProcessorCount,
                                                  prop.major, std::move(stream), std::move(cublas),
                                                  std::move(staging), gemv_int8, graphs));
}

}  // namespace pd::engine
