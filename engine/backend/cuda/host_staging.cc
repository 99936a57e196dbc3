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
  if (arena_done_ != nullptr) {
    (void)cudaEventSynchronize(arena_done_);
    (void)cudaEventDestroy(arena_done_);
  }
  if (arena_ != nullptr) (void)cudaFreeHost(arena_);
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
  if (in_arena_) {
    const size_t offset = (arena_used_ + 63) / 64 * 64;
    if (arena_ == nullptr || offset + bytes > arena_size_) {
      arena_want_ = std::max(arena_want_, 2 * (offset + bytes));
      arena_overflowed_ = true;
      return absl::AbortedError(pd::StrCat("CUDA backend: a captured step's metadata needs ",
                                           offset + bytes, " bytes of staging, the arena holds ",
                                           arena_size_, " (it grows before the next step)"));
    }
    arena_current_ = static_cast<char*>(arena_) + offset;
    arena_current_size_ = bytes;
    arena_used_ = offset + bytes;
    return arena_current_;
  }
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
  if (in_arena_) {
    if (bytes > arena_current_size_) {
      return absl::InternalError("CUDA backend: staging Commit of more bytes than Begin reserved");
    }
    if (device_buffer_ == nullptr || device_buffer_->size() < bytes) {
      device_want_ = std::max(device_want_, bytes);
      arena_overflowed_ = true;
      return absl::AbortedError(
          pd::StrCat("CUDA backend: a captured step's metadata copy of ", bytes,
                     " bytes outgrew the device buffer (it grows before the next step)"));
    }
    if (bytes > 0) {
      PD_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(device_buffer_->data(), arena_current_, bytes, cudaMemcpyHostToDevice,
                          stream_),
          pd::StrCat("CUDA backend: metadata copy of ", bytes, " bytes (recorded)"));
    }
    return static_cast<const char*>(device_buffer_->data());
  }
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

absl::Status HostStaging::StartArena() {
  if (arena_done_ == nullptr) {
    PD_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&arena_done_, cudaEventDisableTiming),
                            "CUDA backend: staging (cudaEventCreateWithFlags)");
  }
  // An event never recorded counts as complete.
  PD_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(arena_done_),
                          "CUDA backend: staging (a captured step's metadata copy failed)");
  if (arena_ == nullptr || arena_want_ > arena_size_) {
    if (arena_ != nullptr) (void)cudaFreeHost(std::exchange(arena_, nullptr));
    arena_size_ = 0;
    const size_t size = Grown(0, std::max(arena_want_, 4 * kInitialBytes));
    const cudaError_t err = cudaHostAlloc(&arena_, size, cudaHostAllocDefault);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      arena_ = nullptr;
      return CudaStatus(err, pd::StrCat("CUDA backend: cudaHostAlloc of ", size,
                                        " bytes of captured-step staging"));
    }
    arena_size_ = size;
  }
  if (device_buffer_ == nullptr || device_buffer_->size() < std::max(device_want_, size_t{1})) {
    // Freeing the old buffer (cudaFree) waits for the kernels that may still read it.
    device_buffer_.reset();
    PD_ASSIGN_OR_RETURN(device_buffer_,
                        DeviceBuffer::Create(Grown(0, std::max(device_want_, size_t{1})), device_));
  }
  arena_used_ = 0;
  arena_overflowed_ = false;
  arena_current_ = nullptr;
  arena_current_size_ = 0;
  in_arena_ = true;
  return absl::OkStatus();
}

absl::Status HostStaging::ArenaLaunched() {
  PD_CUDA_RETURN_IF_ERROR(cudaEventRecord(arena_done_, stream_),
                          "CUDA backend: staging (cudaEventRecord after a graph launch)");
  return absl::OkStatus();
}

}  // namespace pd::engine
