// Facts about a CUDA device that planning needs before a backend exists: its memory, and the
// copy bandwidth its memory sustains (measured). Without a CUDA build or a GPU, every function
// returns UNAVAILABLE saying which.
//
// Thread safety: each call sets the calling thread's current device.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"

namespace pd::engine {

struct CudaDeviceInfo {
  std::string name;        // "NVIDIA H200"
  size_t free_bytes = 0;   // cudaMemGetInfo, now
  size_t total_bytes = 0;
};

absl::StatusOr<CudaDeviceInfo> GetCudaDeviceInfo(int device = 0);

// Device-to-device copy of a `bytes` buffer, best of a few runs: bytes read plus bytes written
// per second (the rate a memory-bound kernel that streams weights can approach).
absl::StatusOr<double> MeasureCudaCopyBandwidth(int device = 0, size_t bytes = size_t{1} << 30);

}  // namespace pd::engine
