#include "engine/backend/cuda/host_staging.h"

#include <algorithm>
#include <utility>

#include "common/status.h"
#include "common/strings.h"
#include "engine/backend/cuda/cuda_status.h"

namespace pd::engine {
namespace {

// Large enough for the block tables of a few hundred short sequences; slots grow on demand.
constexpr size_t kInitialBytes = 64 * 1024;

size_t Grown(size_t have, size_t want) {
  size_t n = std::max(have, kInitialBytes);
  while (n < want) n *= 2;
  return n;
}

}  // namespace

absl::StatusOr<std::unique_ptr<HostStaging>> HostStaging::Create(int device, cudaStream_t stream) {
  std::unique_ptr<HostStaging> s(new HostStaging(device, stream));
  for (Slot& slot : s->slots_) {
    PD_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&slot.copied, cudaEventDisableTiming),
                            "CUDA backend: staging (cudaEventCreateWithFlags)");
  }
  return s;
}

HostStaging::~HostStaging() {
  for (Slot& slot : slots_) {
    // Destroying an event or freeing page-locked memory waits for nothing, so first let a copy
    // still reading the slot finish.
    if (slot.copied != nullptr) {
      (void)cudaEventSynchronize(slot.copied);
      (void)cudaEventDestroy(slot.copied);
    }
    if (slot.host != nullptr) (void)cudaFreeHost(slot.host);
  }
}

absl::StatusOr<char*> HostStaging::Begin(size_t bytes) {
  current_ = (current_ + 1) % kSlots;
  Slot& slot = slots_[current_];
  PD_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(slot.copied),
                          "CUDA backend: staging (an earlier metadata copy failed)");
  if (slot.size < bytes) {
    if (slot.host != nullptr) {
      (void)cudaFreeHost(slot.host);
      slot.host = nullptr;
      slot.size = 0;
    }
    const size_t size = Grown(slot.size, bytes);
    const cudaError_t err = cudaHostAlloc(&slot.host, size, cudaHostAllocDefault);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      slot.host = nullptr;
      return CudaStatus(
          err, pd::StrCat("CUDA backend: cudaHostAlloc of ", size, " bytes of metadata staging"));
    }
    slot.size = size;
  }
  return static_cast<char*>(slot.host);
}

absl::StatusOr<const char*> HostStaging::Commit(size_t bytes) {
  Slot& slot = slots_[current_];
  if (bytes > slot.size) {
    return absl::InternalError("CUDA backend: staging Commit of more bytes than Begin reserved");
  }
  if (device_buffer_ == nullptr || device_buffer_->size() < bytes) {
    // Freeing the old buffer (cudaFree) waits for the kernels that may still read it.
    device_buffer_.reset();
    PD_ASSIGN_OR_RETURN(device_buffer_, DeviceBuffer::Create(Grown(slot.size, bytes), device_));
  }
  if (bytes > 0) {
    PD_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(device_buffer_->data(), slot.host, bytes, cudaMemcpyHostToDevice, stream_),
        pd::StrCat("CUDA backend: metadata copy of ", bytes, " bytes"));
  }
  PD_CUDA_RETURN_IF_ERROR(cudaEventRecord(slot.copied, stream_),
                          "CUDA backend: staging (cudaEventRecord)");
  return static_cast<const char*>(device_buffer_->data());
}

}  // namespace pd::engine
