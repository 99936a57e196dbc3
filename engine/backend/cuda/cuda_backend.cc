// The CUDA backend, first part: device memory, MatMul through cuBLAS for F32 and F16 weights, and
// RmsNorm. The remaining ops return UNIMPLEMENTED until the CUDA engine lands (a later issue);
// they never fall back to the host silently.
//
// Everything is enqueued on one non-blocking stream owned by the backend; cuBLAS runs on the same
// stream, so ops execute in the order they were called without host synchronisation.
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/status.h"
#include "common/strings.h"
#include "engine/backend/backend.h"
#include "engine/backend/cuda/convert.cuh"
#include "engine/backend/cuda/cuda_ops.h"
#include "engine/backend/cuda/cuda_status.h"
#include "engine/backend/cuda/device_buffer.h"
#include "engine/backend/cuda/rmsnorm.cuh"
#include "engine/quant/dtype.h"

namespace pd::engine {
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
  return absl::UnimplementedError(pd::StrCat(
      "CUDA backend: ", op, " is not implemented yet; the CUDA engine arrives with a later issue"));
}

std::string_view TypeName(DType t) { return Traits(t).name; }

// "Attention on an int8 KV cache (no int8 KV kernels on CUDA)" / "StoreKv on an f16 KV cache".
std::string KvOp(std::string_view op, const KvTensor& cache) {
  if (cache.type == KvDType::kI8) {
    return pd::StrCat(op, " on an int8 KV cache (no int8 KV quantize/dequantize kernels on CUDA; "
                      "use --kv-type f16 or the CPU backend)");
  }
  return pd::StrCat(op, " on an ", KvDTypeName(cache.type), " KV cache");
}

std::string ShapeString(const Tensor& t) {
  return pd::StrCat(TypeName(t.type), "[", t.rows, ", ", t.cols, "]");
}

bool FitsInt(int64_t v) { return v >= 0 && v <= INT_MAX; }

// The CUDA backend on one device. Owns a stream, a cuBLAS handle bound to it, and a scratch
// buffer for converted activations. Thread safety: one thread at a time (see Backend); every
// entry point makes the backend's device current on the calling thread first.
class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, std::string name, CudaStream stream, CublasHandle cublas)
      : device_(device),
        name_(std::move(name)),
        stream_(std::move(stream)),
        cublas_(std::move(cublas)) {}

  std::string_view name() const override { return name_; }

  absl::StatusOr<std::unique_ptr<Buffer>> Allocate(size_t bytes) override {
    PD_ASSIGN_OR_RETURN(std::unique_ptr<DeviceBuffer> buf, DeviceBuffer::Create(bytes, device_));
    return std::unique_ptr<Buffer>(std::move(buf));
  }

  // Returns once host_src has been consumed, so the caller may reuse it at once (as with the
  // CPU backend). From pageable memory the runtime stages the bytes before returning; from
  // page-locked memory the copy is truly asynchronous, so we wait for it.
  absl::Status Upload(void* dst, const void* host_src, size_t bytes) override {
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
    PD_RETURN_IF_ERROR(Activate());
    PD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_.get()),
                            "CUDA backend: Synchronize (an earlier asynchronous op failed)");
    return absl::OkStatus();
  }

  // ---- ops ----------------------------------------------------------------------------------

  // Row-major y[n, m] = x[n, k] * w[m, k]^T is, in cuBLAS's column-major terms,
  // y^T[m, n] = op_T(w as k x m, ld k) * (x^T as k x n, ld k), with ldc = m.
  // F32 weights: SGEMM in plain FP32 (no TF32, the default math mode), 2*m*n*k flops.
  // F16 weights: x is first rounded to F16 into scratch (n*k*6 bytes of traffic), then
  // GemmEx with F16 inputs, FP32 accumulation (tensor cores) and F32 output.
  absl::Status MatMul(const Tensor& w, const Tensor& x, Tensor& y) override {
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
    if (m == 0 || n == 0) return absl::OkStatus();
    if (k == 0) return Zero(y.data, y.bytes());  // an empty sum
    if (w.data == nullptr || x.data == nullptr || y.data == nullptr) {
      return absl::InvalidArgumentError("CUDA backend: MatMul on a tensor without data");
    }
    PD_RETURN_IF_ERROR(Activate());

    const float alpha = 1.f, beta = 0.f;
    const int im = static_cast<int>(m), ik = static_cast<int>(k), in = static_cast<int>(n);
    if (w.type == DType::kF32) {
      PD_CUBLAS_RETURN_IF_ERROR(
          cublasSgemm(cublas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, im, in, ik, &alpha,
                      static_cast<const float*>(w.data), ik, static_cast<const float*>(x.data), ik,
                      &beta, static_cast<float*>(y.data), im),
          pd::StrCat("CUDA backend: MatMul f32 (cublasSgemm m=", m, " n=", n, " k=", k, ")"));
      return absl::OkStatus();
    }

    // F16 weights.
    PD_ASSIGN_OR_RETURN(void* x16, Scratch(static_cast<size_t>(n * k) * sizeof(__half)));
    PD_CUDA_RETURN_IF_ERROR(LaunchConvertF32ToF16(static_cast<const float*>(x.data), n * k,
                                                  static_cast<__half*>(x16), stream_.get()),
                            "CUDA backend: MatMul f16 (convert activations to f16)");
    PD_CUBLAS_RETURN_IF_ERROR(
        cublasGemmEx(cublas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, im, in, ik, &alpha, w.data,
                     CUDA_R_16F, ik, x16, CUDA_R_16F, ik, &beta, y.data, CUDA_R_32F, im,
                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        pd::StrCat("CUDA backend: MatMul f16 (cublasGemmEx m=", m, " n=", n, " k=", k, ")"));
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

  absl::Status GetRows(const Tensor&, absl::Span<const int32_t>, Tensor&) override {
    return Unimplemented("GetRows");
  }
  absl::Status Rope(Tensor&, int, absl::Span<const int32_t>, const RopeParams&) override {
    return Unimplemented("Rope");
  }
  absl::Status Add(const Tensor&, const Tensor&, Tensor&) override { return Unimplemented("Add"); }
  absl::Status AddBias(const Tensor&, const Tensor&, Tensor&) override {
    return Unimplemented("AddBias");
  }
  absl::Status SwiGlu(const Tensor&, const Tensor&, Tensor&) override {
    return Unimplemented("SwiGlu");
  }
  absl::Status GeGlu(const Tensor&, const Tensor&, Tensor&) override {
    return Unimplemented("GeGlu");
  }
  absl::Status Scale(const Tensor&, float, Tensor&) override { return Unimplemented("Scale"); }
  absl::Status Softmax(Tensor&) override { return Unimplemented("Softmax"); }
  // No KV kernels yet, for any KV type; INT8 caches say so by name, since a caller choosing INT8 KV
  // (the CPU backend runs it) should learn that the type, not only the op, is missing here.
  absl::Status StoreKv(const Tensor&, const Tensor&, KvTensor& k_cache, KvTensor&,
                       const KvBatch&) override {
    return Unimplemented(KvOp("StoreKv", k_cache));
  }
  absl::Status Attention(const Tensor&, const KvTensor& k_cache, const KvTensor&, const KvBatch&,
                         const AttentionParams&, Tensor&) override {
    return Unimplemented(KvOp("Attention", k_cache));
  }

 private:
  // Makes this backend's device current on the calling thread (cheap when it already is).
  absl::Status Activate() {
    PD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_),
                            pd::StrCat("CUDA backend: cudaSetDevice(", device_, ")"));
    return absl::OkStatus();
  }

  // Device scratch of at least `bytes`, valid until the next call. Reuse across ops is safe
  // because every op is ordered on the one stream; growing frees the old buffer, and cudaFree
  // waits for the work that may still read it.
  absl::StatusOr<void*> Scratch(size_t bytes) {
    if (scratch_ == nullptr || scratch_->size() < bytes) {
      scratch_.reset();
      PD_ASSIGN_OR_RETURN(scratch_, DeviceBuffer::Create(bytes, device_));
    }
    return scratch_->data();
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
  // Declaration order is destruction order reversed: the scratch buffer and the cuBLAS handle
  // go before the stream they use.
  CudaStream stream_;
  CublasHandle cublas_;
  std::unique_ptr<DeviceBuffer> scratch_;  // F16 activations for MatMul; grows on demand
};

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
  std::string name =
      pd::StrCat("cuda:", device, " (", prop.name, ", sm_", prop.major, prop.minor, ")");
  return std::unique_ptr<Backend>(
      new CudaBackend(device, std::move(name), std::move(stream), std::move(cublas)));
}

}  // namespace pd::engine
