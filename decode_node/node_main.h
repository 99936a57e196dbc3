// The command line and life cycle shared by pd-decode and pd-prefill: flags over the YAML config
// (configs/*.yaml; the router section is ignored), the engine, the node's gRPC + HTTP servers, the
// ready line on stdout, and the drain on SIGINT / SIGTERM (exit 0).
//
//   pd-decode [--config FILE] [--model PATH] [--grpc-port N] [--http-port M] [--threads T]
//             [--kv-mib MIB] [--ctx N] [--shutdown-grace S] [--name NAME]
//   -> "pd-decode ready: grpc=127.0.0.1:PORT http=http://127.0.0.1:PORT"
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/service_type.h>

#include <functional>
#include <memory>
#include <string>

#include "decode_node/node_server.h"

namespace pd::node {

// `make_service` builds the role's service over the node's state (owned by the caller of Run).
int NodeMain(const std::string& name, const std::string& role,
             std::function<std::unique_ptr<grpc::Service>(NodeState&)> make_service, int argc,
             char** argv);

}  // namespace pd::node
