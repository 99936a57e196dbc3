// CreateCudaBackend for builds without CUDA: always UNAVAILABLE, so callers fall back to the CPU
// backend (or fail with a message that says how to get a CUDA build).
#include "engine/backend/backend.h"

namespace pd::engine {

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device) {
  return absl::UnavailableError(
      "pdserve was built without CUDA (configure with nvcc present or -DPDSERVE_CUDA=ON)");
}

}  // namespace pd::engine
