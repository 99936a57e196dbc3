// What makes a node daemon a decode node or a prefill node. The node runtime (node_main.h) builds
// the engine, the KV transport, the servers, etcd registration and the drain; a role adds its
// gRPC service and whatever it keeps on the transport. decode_node/ and prefill_node/ each
// implement one; neither knows the other.
//
// Life cycle, driven by NodeMain on the daemon's main thread: ConfigureTransport (before the
// transport opens) -> Start (engine and transport up, servers not yet) -> serving -> Stop (the
// servers have drained; the transport is still open) -> the role is destroyed (after the
// transport closed, before the engine stops), so a transport callback that is still running may
// use what the role owns.
#pragma once

#include <grpcpp/impl/service_type.h>

#include <string_view>

#include "absl/status/statusor.h"
#include "kvtransfer/kv_transport.h"
#include "node/node_server.h"

namespace pd::node {

class NodeRole {
 public:
  virtual ~NodeRole() = default;

  // "decode" or "prefill": Node.Load's role, the etcd key, the log lines.
  virtual std::string_view name() const = 0;

  // Adjusts the KV transport's options before it opens (the prefill role sends f16 layers in
  // place from the cache).
  virtual void ConfigureTransport(kvtransfer::TransportOptions& options) const {}

  // Creates the role's service over `state` (state.transport() is null when KV transfer is off).
  // The service is owned by the role; `state` outlives it. An error stops the daemon.
  virtual absl::StatusOr<grpc::Service*> Start(NodeState& state) = 0;

  // The servers have drained: end what the role holds on the engine and the transport.
  virtual void Stop() {}
};

}  // namespace pd::node
