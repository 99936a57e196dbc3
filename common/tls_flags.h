// The TLS command-line flags the daemons share (pd-serve, pd-router, pd-prefill, pd-decode), each
// overriding its key in the config (docs/config.md, "tls, cluster_tls").
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "common/config.h"

namespace pd {

struct TlsFlags {
  std::string tls_cert, tls_key;                     // public gRPC + HTTP
  std::string cluster_ca, cluster_cert, cluster_key;  // mutual TLS inside the cluster

  // `public_api`: --tls-cert/--tls-key; `cluster`: --cluster-ca/-cert/-key.
  void Add(CLI::App& app, bool public_api, bool cluster) {
    if (public_api) {
      app.add_option("--tls-cert", tls_cert, "serve gRPC and HTTP over TLS: certificate chain (PEM)");
      app.add_option("--tls-key", tls_key, "... and its private key (PEM)");
    }
    if (cluster) {
      app.add_option("--cluster-ca", cluster_ca,
                     "mutual TLS between router and nodes: the CA that signs every daemon (PEM)");
      app.add_option("--cluster-cert", cluster_cert, "... this daemon's certificate (PEM)");
      app.add_option("--cluster-key", cluster_key, "... and its private key (PEM)");
    }
  }
  // Overrides the config's values with the flags that were given.
  void ApplyTo(ServeOptions* o) const {
    if (!tls_cert.empty()) o->tls.cert_file = tls_cert;
    if (!tls_key.empty()) o->tls.key_file = tls_key;
    if (!cluster_ca.empty()) o->cluster_tls.ca_file = cluster_ca;
    if (!cluster_cert.empty()) o->cluster_tls.cert_file = cluster_cert;
    if (!cluster_key.empty()) o->cluster_tls.key_file = cluster_key;
  }
};

}  // namespace pd
