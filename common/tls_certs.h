// A throwaway certificate authority for a local cluster and for tests (docs/security.md): `pdctl
// up --tls` makes one CA and a certificate per daemon, so that the public APIs speak TLS and the
// daemons authenticate each other with mutual TLS. Production deployments bring their own PKI;
// nothing here is meant to replace it. EC P-256 keys, SHA-256 signatures (OpenSSL).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pd {

struct PemPair {
  std::string cert;  // PEM certificate
  std::string key;   // PEM private key (PKCS#8)
};

// A self-signed CA certificate (basicConstraints CA:TRUE) valid from an hour ago for `validity`.
absl::StatusOr<PemPair> MakeCa(std::string_view common_name, absl::Duration validity);

// A certificate signed by `ca` for both server and client authentication, naming `dns_names` and
// `ip_addresses` in its subjectAltName. INVALID_ARGUMENT for a malformed CA or IP address.
absl::StatusOr<PemPair> IssueCert(const PemPair& ca, std::string_view common_name,
                                  const std::vector<std::string>& dns_names,
                                  const std::vector<std::string>& ip_addresses,
                                  absl::Duration validity);

// Writes ca.pem (certificate only: the CA key is not kept) and, for each name, <name>.pem and
// <name>.key (mode 0600) into `dir` (created, 0700). Each certificate names localhost and
// 127.0.0.1 besides `name`. Returns the CA path.
absl::StatusOr<std::string> WriteLocalCluster(const std::string& dir,
                                              const std::vector<std::string>& names);

}  // namespace pd
