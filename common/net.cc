#include "common/net.h"

#include "absl/strings/numbers.h"
#include "common/strings.h"

namespace pd {

absl::Status SplitHostPort(std::string_view address, std::string* host, int* port) {
  const auto bad = [&] {
    return absl::InvalidArgumentError(
        StrCat("'", address, "': expected HOST:PORT (or [IPV6]:PORT)"));
  };
  const size_t colon = address.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return bad();
  std::string_view h = address.substr(0, colon);
  if (h.front() == '[' || h.back() == ']') {
    if (h.size() < 3 || h.front() != '[' || h.back() != ']') return bad();
    h = h.substr(1, h.size() - 2);
  } else if (h.find(':') != std::string_view::npos) {
    return bad();  // an IPv6 host without brackets: where the port starts is ambiguous
  }
  int p = 0;
  if (!absl::SimpleAtoi(ToAbsl(address.substr(colon + 1)), &p) || p <= 0 || p > 65535) {
    return bad();
  }
  if (host != nullptr) *host = std::string(h);
  if (port != nullptr) *port = p;
  return absl::OkStatus();
}

std::string JoinHostPort(std::string_view host, int port) {
  const bool v6 = host.find(':') != std::string_view::npos;
  return StrCat(v6 ? "[" : "", host, v6 ? "]" : "", ":", port);
}

}  // namespace pd
