// The in-process KV transport: transports in one process find each other by name in a registry
// and hand message buffers over without copying. It runs the same protocol, threads and failure
// handling as the UCX transport (transport_base.h), so tests exercise everything but the network;
// a destroyed or crashed transport is seen by its peers as a disconnect (UNAVAILABLE).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "kvtransfer/kv_transport.h"

namespace pd::kvtransfer {

// options.inproc_name names the transport (its descriptor address); empty: "inproc-<n>".
// ALREADY_EXISTS when the name is taken.
absl::StatusOr<std::unique_ptr<KvTransport>> CreateInprocTransport(const TransportOptions& options);

}  // namespace pd::kvtransfer
