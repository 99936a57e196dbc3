// TLS credentials for gRPC from PEM files (docs/security.md): the public API's server side, and
// mutual TLS between the cluster's daemons (a CA that signs every node; each side shows its own
// certificate and checks the other's).
#pragma once

#include <memory>
#include <string>

#include <grpcpp/channel.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>
#include <grpcpp/security/server_credentials.h>

#include "absl/status/statusor.h"

namespace pd {

struct TlsFiles {
  std::string cert_file;  // PEM certificate chain
  std::string key_file;   // PEM private key
  // PEM CA certificate(s). Server: set = clients must show a certificate it signed (mutual TLS).
  // Client: the CA the server's certificate must chain to.
  std::string ca_file;
};

// Reads a PEM file; INVALID_ARGUMENT naming `what` and the path when it cannot be read or holds no
// PEM block.
absl::StatusOr<std::string> ReadPem(const std::string& path, const std::string& what);

// Insecure credentials when cert_file and key_file are empty; else TLS with that certificate, and
// with ca_file a required, verified client certificate.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> GrpcServerCredentials(const TlsFiles& f);

// Insecure credentials when ca_file is empty; else TLS verifying the server against ca_file and,
// with cert_file and key_file, showing this client's certificate.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> GrpcChannelCredentials(const TlsFiles& f);

// How a daemon opens channels to the other daemons of its cluster (router -> nodes, prefill ->
// decode): plaintext, or mutual TLS with the daemon's own certificate. `server_name`, when set, is
// the name the peers' certificates must carry, checked instead of the host in their address (for
// certificates issued to a service name rather than to each address).
struct ClusterChannels {
  std::shared_ptr<grpc::ChannelCredentials> credentials;  // null: plaintext
  std::string server_name;
  bool tls() const { return credentials != nullptr; }
  // A channel to `address` with these credentials and `args`.
  std::shared_ptr<grpc::Channel> Make(const std::string& address,
                                      grpc::ChannelArguments args) const;
};

// Plaintext when `files` is empty; else all three files are required (mutual TLS).
absl::StatusOr<ClusterChannels> MakeClusterChannels(const TlsFiles& files,
                                                    const std::string& server_name);

}  // namespace pd
