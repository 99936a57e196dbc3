// A node's registration in etcd (docs/cluster.md, "etcd membership"): the key
// `<prefix>nodes/<role>/<name>` = {"name", "role", "address"} under a lease of
// `etcd.lease_ttl_s`, kept alive from a background thread every TTL / 3, and revoked on Stop
// (the node's drain), so that routers watching the prefix add the node when it starts, drop it at
// once when it drains and within the TTL when it dies.
//
// etcd being unreachable never stops the node: the first registration is tried before Start
// returns, then retried in the background with a warning every few seconds; a lease that expired
// meanwhile (etcd answers NOT_FOUND) is replaced by a new one and the key put again.
//
// Ownership: owns its thread (joined by Stop / the destructor) and its EtcdClient.
// Thread safety: Start and Stop from the daemon's main thread; registered() from any thread.
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/config.h"
#include "common/etcd_client.h"

namespace pd::node {

class EtcdRegistration {
 public:
  // Registers `node` (see above). INVALID_ARGUMENT when options.endpoints is empty or `node`
  // is incomplete.
  static absl::StatusOr<std::unique_ptr<EtcdRegistration>> Start(const EtcdOptions& options,
                                                                 const NodeOptions& node);
  ~EtcdRegistration();  // Stop()

  // Stops the keepalive thread and revokes the lease: the key is deleted at once. Idempotent.
  void Stop();
  // Whether the key is in etcd as far as this node knows (the last grant / put / keepalive
  // succeeded).
  bool registered() const;
  const NodeOptions& node() const { return node_; }

 private:
  EtcdRegistration(const EtcdOptions& options, const NodeOptions& node);
  // Grants a lease and puts the key; on success stores the lease.
  absl::Status Register();
  void Loop();

  const EtcdOptions options_;
  const NodeOptions node_;
  const std::string key_, value_;
  EtcdClient client_;

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int64_t lease_ ABSL_GUARDED_BY(mu_) = 0;  // 0: not registered
  std::thread thread_;
};

// The identity a node registers: `options.node_name`, or "<role>-<host>-<port>" when empty; the
// address is `grpc_address` (NodeServer::grpc_address(), "host:port" or "[v6]:port") with a
// wildcard host (0.0.0.0, ::) replaced by this machine's host name.
NodeOptions EtcdNodeIdentity(const EtcdOptions& options, const std::string& role,
                             const std::string& grpc_address);

// NodeMain's wiring: nullptr when etcd is off (no endpoints); else a started registration of
// this node. Errors are logged, never returned: the node serves either way.
std::unique_ptr<EtcdRegistration> StartEtcdRegistration(const ServeOptions& o,
                                                        const std::string& role,
                                                        const std::string& grpc_address);

}  // namespace pd::node
