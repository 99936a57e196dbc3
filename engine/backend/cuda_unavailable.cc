// CreateCudaBackend and device_info.h for builds without CUDA: always UNAVAILABLE, so callers fall back to the CPU
// backend (or fail with a message that says how to get a CUDA build).
#include "engine/backend/backend.h"
#include "engine/backend/device_info.h"

namespace pd::engine {

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device) {
  return absl::UnavailableError(
      "pdserve was built without CUDA (configure with nvcc present or -DPDSERVE_CUDA=ON)");
}

absl::StatusOr<CudaDeviceInfo> GetCudaDeviceInfo(int device) {
  return absl::UnavailableError("pdserve was built without CUDA: no GPU to ask about");
}

absl::StatusOr<double> MeasureCudaCopyBandwidth(int device, size_t bytes) {
  return absl::UnavailableError("pdserve was built without CUDA: no GPU bandwidth to measure");
}

}  // namespace pd::engine
