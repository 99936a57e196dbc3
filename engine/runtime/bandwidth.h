// Memory bandwidths the offload planner predicts with (planner.h), measured on this machine and
// cached, since a measurement takes a second or two: `~/.cache/pdserve/bandwidth.txt` (or
// $XDG_CACHE_HOME/pdserve/...), one "key bytes_per_second" line per CPU (model name and thread
// count) and per GPU (device name). Delete the file to measure again.
//
// Thread safety: not meant for concurrent calls (they would measure twice, and the last write
// of the cache wins; each write is whole, through a rename).
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace pd::engine {

struct MeasuredBandwidth {
  double bytes_per_s = 0;
  std::string key;     // "cpu AMD EPYC 9B14 x2" / "gpu NVIDIA H200"
  bool cached = false; // read from the cache, not measured now
};

// Read bandwidth of host memory with `threads` threads (0 = all cores): each streams its share
// of a 1 GiB buffer, best of three passes.
absl::StatusOr<MeasuredBandwidth> HostReadBandwidth(int threads);
// Device-to-device copy bandwidth of CUDA device 0 (device_info.h). UNAVAILABLE without a GPU.
absl::StatusOr<MeasuredBandwidth> GpuCopyBandwidth();

// The cache file's path.
std::string BandwidthCachePath();

}  // namespace pd::engine
