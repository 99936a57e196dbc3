#include "engine/backend/device_info.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "common/status.h"
#include "common/strings.h"
#include "engine/backend/cuda/cuda_status.h"
#include "engine/backend/cuda/device_buffer.h"

namespace pd::engine {

absl::StatusOr<CudaDeviceInfo> GetCudaDeviceInfo(int device) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return absl::UnavailableError("no CUDA device is visible (cudaGetDeviceCount found none)");
  }
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(
        pd::StrCat("CUDA device ", device, " does not exist (", count, " visible)"));
  }
  PD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device), "cudaSetDevice");
  cudaDeviceProp prop{};
  PD_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  CudaDeviceInfo info;
  info.name = prop.name;
  PD_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&info.free_bytes, &info.total_bytes), "cudaMemGetInfo");
  return info;
}

absl::StatusOr<double> MeasureCudaCopyBandwidth(int device, size_t bytes) {
  PD_ASSIGN_OR_RETURN(const CudaDeviceInfo info, GetCudaDeviceInfo(device));
  bytes = std::min(bytes, info.free_bytes / 4);
  if (bytes < (size_t{1} << 20)) {
    return absl::ResourceExhaustedError("too little free GPU memory to measure its bandwidth");
  }
  PD_ASSIGN_OR_RETURN(std::unique_ptr<DeviceBuffer> a, DeviceBuffer::Create(bytes, device));
  PD_ASSIGN_OR_RETURN(std::unique_ptr<DeviceBuffer> b, DeviceBuffer::Create(bytes, device));
  PD_CUDA_RETURN_IF_ERROR(cudaMemset(a->data(), 1, bytes), "cudaMemset");
  cudaEvent_t start = nullptr, stop = nullptr;
  PD_CUDA_RETURN_IF_ERROR(cudaEventCreate(&start), "cudaEventCreate");
  PD_CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop), "cudaEventCreate");
  float best_ms = 0;
  cudaError_t err = cudaSuccess;
  for (int run = 0; run < 5 && err == cudaSuccess; ++run) {
    err = cudaEventRecord(start);
    if (err == cudaSuccess) {
      err = cudaMemcpy(b->data(), a->data(), bytes, cudaMemcpyDeviceToDevice);
    }
    if (err == cudaSuccess) err = cudaEventRecord(stop);
    if (err == cudaSuccess) err = cudaEventSynchronize(stop);
    float ms = 0;
    if (err == cudaSuccess) err = cudaEventElapsedTime(&ms, start, stop);
    if (err == cudaSuccess && run > 0 && (best_ms == 0 || ms < best_ms)) best_ms = ms;  // run 0 warms
  }
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  PD_CUDA_RETURN_IF_ERROR(err, "MeasureCudaCopyBandwidth");
  return 2.0 * static_cast<double>(bytes) / (best_ms * 1e-3);
}

}  // namespace pd::engine
