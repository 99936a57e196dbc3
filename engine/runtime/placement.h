// Which backend runs each layer of a model: the CPU-offload path (docs/offload.md).
//
// A LayerPlacement maps contiguous layer ranges to backends, given as indices into a list of
// backends the caller owns. The model's weights, its KV cache (each layer's K/V on its layer's
// backend) and its forward pass all follow it; the forward pass hands the residual stream (one
// [n_tokens, n_embd] F32 tensor) from one backend to the next at each boundary, through host
// memory. The token embedding lives on layer 0's backend and the output head on the last layer's.
//
// The usual placement for a GPU that cannot hold a whole model is Offload(): the first layers on
// the CPU, the last `device_layers` on the GPU together with the output head (as llama.cpp's
// -ngl does), so that one boundary is crossed per forward and the large head runs on the device.
//
// Thread safety: a plain value.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace pd::engine {

class Backend;

struct LayerPlacement {
  struct Range {
    int begin = 0;    // first layer
    int end = 0;      // one past the last layer
    int backend = 0;  // index into the backends the placement is used with
  };
  std::vector<Range> ranges;  // in layer order, covering [0, n_layer) without gaps or overlaps

  // Every layer on backend 0.
  static LayerPlacement Single(int n_layer);
  // Layers [0, n_layer - device_layers) on `host_backend`, the rest on `device_backend`.
  // device_layers is clamped to [0, n_layer]; empty ranges are left out.
  static LayerPlacement Offload(int n_layer, int device_layers, int device_backend = 0,
                                int host_backend = 1);

  // OK when the ranges cover [0, n_layer) in order, each non-empty, with backend indices in
  // [0, n_backends); INVALID_ARGUMENT naming the first fault otherwise.
  absl::Status Validate(int n_layer, int n_backends) const;
  // The backend index of `layer` (which must be covered).
  int BackendOf(int layer) const;
  // Layers on backend `backend`.
  int LayersOn(int backend) const;
  // "layers 0-9 on cpu, 10-17 on cuda:0 (...)" with the backends' names; `names` has one entry per
  // backend index.
  std::string Describe(absl::Span<const std::string> names) const;
};

// The per-layer backend list (one pointer per layer) a placement gives over `backends`; the
// placement must be valid for them (Validate).
absl::StatusOr<std::vector<Backend*>> LayerBackends(const LayerPlacement& placement, int n_layer,
                                                    absl::Span<Backend* const> backends);

}  // namespace pd::engine
