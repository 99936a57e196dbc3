// absl::Status <-> grpc::Status. Both use the canonical codes, so the mapping is one to one;
// every gRPC service and client in the tree converts through these two functions.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace pd {

grpc::Status ToGrpc(const absl::Status& status);
absl::Status FromGrpc(const grpc::Status& status);

}  // namespace pd
