// The command line and life cycle of a node daemon (pd-decode, pd-prefill): flags over the YAML
// config (configs/*.yaml; the router section is ignored), the engine (engine_builder.h), the KV
// transport, the node's gRPC + HTTP servers with the role's service (node_role.h), etcd
// registration, the ready line on stdout, and the drain on SIGINT / SIGTERM (exit 0).
//
//   pd-decode [--config FILE] [--model PATH] [--grpc-port N] [--http-port M] [--threads T]
//             [--kv-mib MIB] [--ctx N] [--shutdown-grace S] [--name NAME]
//   -> "pd-decode ready: grpc=127.0.0.1:PORT http=http://127.0.0.1:PORT"
#pragma once

#include <memory>
#include <string>

#include "node/node_role.h"

namespace pd::node {

// Runs daemon `name` ("pd-decode") in `role` until a stop signal; returns the exit code (0 after a
// drain, 1 when it could not start, 2 for bad flags or config).
int NodeMain(const std::string& name, std::unique_ptr<NodeRole> role, int argc, char** argv);

}  // namespace pd::node
