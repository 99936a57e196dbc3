#include "engine/backend/cuda/device_buffer.h"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <utility>

#include "common/strings.h"
#include "engine/backend/cuda/cuda_status.h"

namespace pd::engine {

absl::StatusOr<std::unique_ptr<DeviceBuffer>> DeviceBuffer::Create(size_t bytes, int device) {
  PD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device), pd::StrCat("cudaSetDevice(", device, ")"));
  void* ptr = nullptr;
  if (bytes > 0) {
    const cudaError_t err = cudaMalloc(&ptr, bytes);
    if (err != cudaSuccess) {
      // An allocation failure is not sticky; clear it so later calls do not report it again.
      (void)cudaGetLastError();
      return CudaStatus(err, pd::StrCat("cudaMalloc of ", bytes, " bytes on CUDA device ", device));
    }
  }
  return std::unique_ptr<DeviceBuffer>(new DeviceBuffer(ptr, bytes, device));
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      device_(other.device_) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    ptr_ = std::exchange(other.ptr_, nullptr);
    size_ = std::exchange(other.size_, 0);
    device_ = other.device_;
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() { Release(); }

void DeviceBuffer::Release() {
  if (ptr_ == nullptr) return;
  // cudaFree needs the owning device current; restore the caller's device afterwards.
  int previous = -1;
  const bool switched = cudaGetDevice(&previous) == cudaSuccess && previous != device_ &&
                        cudaSetDevice(device_) == cudaSuccess;
  const cudaError_t err = cudaFree(ptr_);
  if (err != cudaSuccess && err != cudaErrorCudartUnloading) {
    // A destructor cannot return a Status. A failed free almost always follows a device fault
    // that an earlier Synchronize() has already reported; say so once more, then move on.
    std::fprintf(stderr, "pdserve: cudaFree of %zu bytes on CUDA device %d failed: %s\n", size_,
                 device_, cudaGetErrorString(err));
  }
  if (switched) (void)cudaSetDevice(previous);
  ptr_ = nullptr;
  size_ = 0;
}

}  // namespace pd::engine
