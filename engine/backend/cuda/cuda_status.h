// Turns CUDA runtime and cuBLAS error codes into absl::Status at the edge of the CUDA backend.
//
// The status code says what the caller should do next:
//   RESOURCE_EXHAUSTED  out of device memory (free something or use a smaller batch),
//   UNAVAILABLE         no usable device or driver (use another backend or machine),
//   FAILED_PRECONDITION the binary has no kernels for this GPU (rebuild for its architecture),
//   INTERNAL            anything else: a bug or a device fault; the CUDA context may be unusable.
// Messages name the operation (the caller's context), the CUDA error name and its description.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "common/strings.h"

namespace pd::engine {

inline absl::StatusCode CudaErrorCode(cudaError_t err) {
  switch (err) {
    case cudaSuccess:
      return absl::StatusCode::kOk;
    case cudaErrorMemoryAllocation:
      return absl::StatusCode::kResourceExhausted;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorSystemNotReady:
    case cudaErrorCompatNotSupportedOnDevice:
      return absl::StatusCode::kUnavailable;
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
      return absl::StatusCode::kFailedPrecondition;
    default:
      return absl::StatusCode::kInternal;
  }
}

// OK for cudaSuccess; otherwise "<context>: <cudaErrorName> (<description>)".
inline absl::Status CudaStatus(cudaError_t err, std::string_view context) {
  if (err == cudaSuccess) return absl::OkStatus();
  std::string msg =
      pd::StrCat(context, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
  if (err == cudaErrorNoKernelImageForDevice) {
    msg += "; rebuild with CMAKE_CUDA_ARCHITECTURES including this GPU";
  }
  return absl::Status(CudaErrorCode(err), msg);
}

// OK for CUBLAS_STATUS_SUCCESS; otherwise "<context>: <CUBLAS_STATUS_...> (<description>)".
inline absl::Status CublasStatus(cublasStatus_t st, std::string_view context) {
  if (st == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const absl::StatusCode code = st == CUBLAS_STATUS_ALLOC_FAILED
                                    ? absl::StatusCode::kResourceExhausted
                                    : absl::StatusCode::kInternal;
  return absl::Status(code, pd::StrCat(context, ": ", cublasGetStatusName(st), " (",
                                       cublasGetStatusString(st), ")"));
}

}  // namespace pd::engine

// Returns from the enclosing function when a CUDA runtime call fails. `context` is a string
// naming the operation ("Upload: cudaMemcpyAsync"); it is only formatted on failure.
#define PD_CUDA_RETURN_IF_ERROR(expr, context)                                                 \
  do {                                                                                         \
    const cudaError_t pd_cuda_err_ = (expr);                                                   \
    if (pd_cuda_err_ != cudaSuccess) return ::pd::engine::CudaStatus(pd_cuda_err_, (context)); \
  } while (0)

// Same for cuBLAS calls.
#define PD_CUBLAS_RETURN_IF_ERROR(expr, context)                   \
  do {                                                             \
    const cublasStatus_t pd_cublas_st_ = (expr);                   \
    if (pd_cublas_st_ != CUBLAS_STATUS_SUCCESS)                    \
      return ::pd::engine::CublasStatus(pd_cublas_st_, (context)); \
  } while (0)
