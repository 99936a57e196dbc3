#include "common/grpc_tls.h"

#include <fstream>
#include <sstream>

#include "common/status.h"
#include "common/strings.h"

namespace pd {

absl::StatusOr<std::string> ReadPem(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(StrCat(what, ": cannot read '", path, "'"));
  std::ostringstream text;
  text << in.rdbuf();
  std::string pem = text.str();
  if (pem.find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(StrCat(what, ": '", path, "' holds no PEM block"));
  }
  return pem;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> GrpcServerCredentials(const TlsFiles& f) {
  if (f.cert_file.empty() && f.key_file.empty()) {
    if (!f.ca_file.empty()) {
      return absl::InvalidArgumentError("TLS: a CA without a certificate and key of its own");
    }
    return grpc::InsecureServerCredentials();
  }
  if (f.cert_file.empty() || f.key_file.empty()) {
    return absl::InvalidArgumentError("TLS: cert_file and key_file go together");
  }
  grpc::SslServerCredentialsOptions o;
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  PD_ASSIGN_OR_RETURN(pair.private_key, ReadPem(f.key_file, "TLS key"));
  PD_ASSIGN_OR_RETURN(pair.cert_chain, ReadPem(f.cert_file, "TLS certificate"));
  o.pem_key_cert_pairs.push_back(std::move(pair));
  if (!f.ca_file.empty()) {
    PD_ASSIGN_OR_RETURN(o.pem_root_certs, ReadPem(f.ca_file, "TLS CA"));
    o.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(o);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> GrpcChannelCredentials(
    const TlsFiles& f) {
  if (f.ca_file.empty()) {
    if (!f.cert_file.empty() || !f.key_file.empty()) {
      return absl::InvalidArgumentError("TLS: a client certificate without a CA to check against");
    }
    return grpc::InsecureChannelCredentials();
  }
  if (f.cert_file.empty() != f.key_file.empty()) {
    return absl::InvalidArgumentError("TLS: cert_file and key_file go together");
  }
  grpc::SslCredentialsOptions o;
  PD_ASSIGN_OR_RETURN(o.pem_root_certs, ReadPem(f.ca_file, "TLS CA"));
  if (!f.cert_file.empty()) {
    PD_ASSIGN_OR_RETURN(o.pem_private_key, ReadPem(f.key_file, "TLS key"));
    PD_ASSIGN_OR_RETURN(o.pem_cert_chain, ReadPem(f.cert_file, "TLS certificate"));
  }
  return grpc::SslCredentials(o);
}

std::shared_ptr<grpc::Channel> ClusterChannels::Make(const std::string& address,
                                                     grpc::ChannelArguments args) const {
  if (credentials == nullptr) {
    return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  }
  if (!server_name.empty()) args.SetSslTargetNameOverride(server_name);
  return grpc::CreateCustomChannel(address, credentials, args);
}

absl::StatusOr<ClusterChannels> MakeClusterChannels(const TlsFiles& files,
                                                    const std::string& server_name) {
  ClusterChannels c;
  c.server_name = server_name;
  if (files.ca_file.empty() && files.cert_file.empty() && files.key_file.empty()) return c;
  if (files.ca_file.empty() || files.cert_file.empty() || files.key_file.empty()) {
    return absl::InvalidArgumentError(
        "cluster TLS needs ca_file, cert_file and key_file together (mutual TLS)");
  }
  PD_ASSIGN_OR_RETURN(c.credentials, GrpcChannelCredentials(files));
  return c;
}

}  // namespace pd
