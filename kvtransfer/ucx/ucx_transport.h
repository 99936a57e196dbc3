// The UCX KV transport (the default): UCP tag messages over whatever transports UCX finds (shared
// memory, TCP, RDMA, CUDA where present; UCX_TLS or TransportOptions::ucx_tls choose). One UCP
// context and worker per transport, driven by the transport's progress thread only (it sleeps on
// the worker's event fd when idle); large layer messages go by UCX's rendezvous protocol (CMA /
// RDMA get), so the receiver reads straight from the sender's staging buffer.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "kvtransfer/kv_transport.h"

namespace pd::kvtransfer {

// UNAVAILABLE when UCX cannot create a context or worker (no usable transport).
absl::StatusOr<std::unique_ptr<KvTransport>> CreateUcxTransport(const TransportOptions& options);

}  // namespace pd::kvtransfer
