// Network addresses as the config, etcd and the command lines spell them: "host:port", with an
// IPv6 host in brackets ("[::1]:50051"). One parser and one formatter for every daemon and tool.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace pd {

// Splits "host:port" / "[v6]:port" into a host (brackets removed) and a port in 1..65535.
// INVALID_ARGUMENT naming `address` when the host is empty, the brackets are unbalanced or the
// port is missing, not a number or out of range. Either output may be null.
absl::Status SplitHostPort(std::string_view address, std::string* host, int* port);

// "host:port", or "[host]:port" when the host contains a ':' (an IPv6 address).
std::string JoinHostPort(std::string_view host, int port);

}  // namespace pd
