// HostStaging: how the CUDA backend hands an op's host-side metadata (token ids, positions, block
// tables, RoPE frequency factors) to its kernels without waiting for the device.
//
// An op packs its metadata into page-locked host memory (Begin), and Commit enqueues one
// asynchronous copy of it into a device buffer on the backend's stream, ahead of the op's
// kernels. The host memory must stay untouched until that copy has run, so it rotates through
// kSlots slots, each with an event recorded after its copy: Begin waits only for the copy made
// from the same slot kSlots commits ago, which lets the host run up to kSlots ops ahead of the
// device. The device buffer needs no such care: the next op's copy into it is ordered on the
// stream after this op's kernels.
//
// Owned by the CUDA backend through a unique_ptr; used by its one thread at a time (see Backend).
// Not copyable.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"
#include "engine/backend/cuda/device_buffer.h"

namespace pd::engine {

class HostStaging {
 public:
  static constexpr int kSlots = 8;

  // Slots for `device` (which must be current) whose copies go on `stream`.
  static absl::StatusOr<std::unique_ptr<HostStaging>> Create(int device, cudaStream_t stream);
  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;
  ~HostStaging();

  // Host memory of at least `bytes` (64-byte aligned) to fill, valid until the next Begin.
  // RESOURCE_EXHAUSTED when page-locked or device memory runs out; INTERNAL if an earlier copy
  // failed.
  absl::StatusOr<char*> Begin(size_t bytes);
  // Enqueues the copy of the first `bytes` bytes written since Begin and returns where the
  // device will find them: valid for the kernels enqueued before the next Commit.
  absl::StatusOr<const char*> Commit(size_t bytes);

  // A captured step (a CUDA graph): a recorded copy reads its host bytes when the graph runs, not
  // when it is recorded, so between StartArena and StopArena every Begin hands out bytes of its
  // own, from one page-locked arena, instead of rotating through the slots. StartArena first
  // waits for the copies of the last graph that read the arena (ArenaLaunched) and grows the
  // arena and the device buffer to what the last abandoned recording asked for. While recording,
  // nothing may be allocated: Begin past the arena's end, or Commit past the device buffer's,
  // returns ABORTED (the recording is then abandoned, and the next StartArena grows them).
  absl::Status StartArena();
  void StopArena() { in_arena_ = false; }
  // Whether a Begin or Commit since StartArena returned ABORTED.
  bool ArenaOverflowed() const { return arena_overflowed_; }
  // Records on the stream that the graph just launched is the arena's last reader.
  absl::Status ArenaLaunched();

 private:
  struct Slot {
    void* host = nullptr;  // cudaHostAlloc'd
    size_t size = 0;
    cudaEvent_t copied = nullptr;  // recorded after the last copy from `host`
  };
  HostStaging(int device, cudaStream_t stream) : device_(device), stream_(stream) {}

  const int device_;
  const cudaStream_t stream_;
  std::array<Slot, kSlots> slots_;
  int current_ = 0;  // the slot Begin handed out last
  std::unique_ptr<DeviceBuffer> device_buffer_;
  // The capture arena (StartArena .. StopArena).
  bool in_arena_ = false;
  bool arena_overflowed_ = false;
  void* arena_ = nullptr;  // cudaHostAlloc'd
  size_t arena_size_ = 0, arena_used_ = 0;
  char* arena_current_ = nullptr;  // what Begin handed out last, and its size
  size_t arena_current_size_ = 0;
  size_t arena_want_ = 0, device_want_ = 0;  // sizes an abandoned recording asked for
  cudaEvent_t arena_done_ = nullptr;         // recorded after the last graph that read the arena
};

}  // namespace pd::engine
