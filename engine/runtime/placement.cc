#include "engine/runtime/placement.h"

#include <algorithm>

#include "common/strings.h"
#include "engine/backend/backend.h"

namespace pd::engine {

LayerPlacement LayerPlacement::Single(int n_layer) {
  LayerPlacement p;
  if (n_layer > 0) p.ranges.push_back({0, n_layer, 0});
  return p;
}

LayerPlacement LayerPlacement::Offload(int n_layer, int device_layers, int device_backend,
                                       int host_backend) {
  device_layers = std::clamp(device_layers, 0, std::max(n_layer, 0));
  LayerPlacement p;
  const int split = n_layer - device_layers;
  if (split > 0) p.ranges.push_back({0, split, host_backend});
  if (device_layers > 0) p.ranges.push_back({split, n_layer, device_backend});
  return p;
}

absl::Status LayerPlacement::Validate(int n_layer, int n_backends) const {
  if (ranges.empty()) return absl::InvalidArgumentError("layer placement: no layer ranges");
  int next = 0;
  for (const Range& r : ranges) {
    if (r.begin != next) {
      return absl::InvalidArgumentError(pd::StrCat("layer placement: range [", r.begin, ", ", r.end,
                                                   ") does not start at layer ", next));
    }
    if (r.end <= r.begin) {
      return absl::InvalidArgumentError(
          pd::StrCat("layer placement: empty range [", r.begin, ", ", r.end, ")"));
    }
    if (r.backend < 0 || r.backend >= n_backends) {
      return absl::InvalidArgumentError(pd::StrCat("layer placement: range [", r.begin, ", ",
                                                   r.end, ") names backend ", r.backend, " of ",
                                                   n_backends));
    }
    next = r.end;
  }
  if (next != n_layer) {
    return absl::InvalidArgumentError(
        pd::StrCat("layer placement covers layers [0, ", next, "), the model has ", n_layer));
  }
  return absl::OkStatus();
}

int LayerPlacement::BackendOf(int layer) const {
  for (const Range& r : ranges) {
    if (layer >= r.begin && layer < r.end) return r.backend;
  }
  return -1;
}

int LayerPlacement::LayersOn(int backend) const {
  int n = 0;
  for (const Range& r : ranges) n += r.backend == backend ? r.end - r.begin : 0;
  return n;
}

std::string LayerPlacement::Describe(absl::Span<const std::string> names) const {
  std::string out;
  for (const Range& r : ranges) {
    const std::string name = r.backend >= 0 && static_cast<size_t>(r.backend) < names.size()
                                 ? names[r.backend]
                                 : pd::StrCat("backend ", r.backend);
    const std::string layers = r.end - r.begin == 1 ? pd::StrCat("layer ", r.begin)
                                                    : pd::StrCat("layers ", r.begin, "-", r.end - 1);
    out += pd::StrCat(out.empty() ? "" : ", ", layers, " on ", name);
  }
  return out;
}

absl::StatusOr<std::vector<Backend*>> LayerBackends(const LayerPlacement& placement, int n_layer,
                                                    absl::Span<Backend* const> backends) {
  if (absl::Status st = placement.Validate(n_layer, static_cast<int>(backends.size())); !st.ok()) {
    return st;
  }
  std::vector<Backend*> out(n_layer);
  for (const LayerPlacement::Range& r : placement.ranges) {
    if (backends[r.backend] == nullptr) {
      return absl::InvalidArgumentError(
          pd::StrCat("layer placement: backend ", r.backend, " is null"));
    }
    std::fill(out.begin() + r.begin, out.begin() + r.end, backends[r.backend]);
  }
  return out;
}

}  // namespace pd::engine
