// DeviceBuffer: one cudaMalloc'd allocation on one device, freed when destroyed.
//
// Owned through std::unique_ptr<Buffer> by whoever asked the CUDA backend to Allocate or
// MapWeights. Move-only. Not thread safe: like the backend, used by one thread at a time.
// Freeing (cudaFree) waits for all work on the device, so buffers are meant to be long lived
// (weights, KV cache, activation arenas), not allocated per op.
#pragma once

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"
#include "engine/backend/backend.h"

namespace pd::engine {

class DeviceBuffer final : public Buffer {
 public:
  // Allocates `bytes` on `device` (which becomes the calling thread's current device).
  // RESOURCE_EXHAUSTED when the device is out of memory; UNAVAILABLE or INTERNAL for other CUDA
  // failures. A zero-byte buffer holds nullptr.
  static absl::StatusOr<std::unique_ptr<DeviceBuffer>> Create(size_t bytes, int device);

  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() override;

  void* data() override { return ptr_; }
  size_t size() const override { return size_; }
  int device() const { return device_; }

 private:
  DeviceBuffer(void* ptr, size_t size, int device) : ptr_(ptr), size_(size), device_(device) {}
  void Release();

  void* ptr_ = nullptr;  // device memory, or nullptr when empty / moved from
  size_t size_ = 0;
  int device_ = 0;
};

}  // namespace pd::engine
