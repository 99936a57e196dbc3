// Keeps pd-router's NodeRegistry in step with the nodes registered in etcd (docs/cluster.md,
// "etcd membership"): every `etcd.poll_interval_ms` it reads `<prefix>nodes/`, adds the nodes
// whose key appeared and removes those whose key is gone (lease expired or revoked) or changed.
// Only the nodes it added are ever removed; router.nodes stay as they are.
//
// When etcd cannot be read, the registry keeps the nodes it has (their health checks still
// evict dead ones) and a warning is logged every few seconds until etcd answers again. A key
// whose value is not a node record, or whose name or address is taken (a router.nodes entry of
// that name, or the same node under another name), is skipped with one warning per value.
//
// Ownership: owns its polling thread (joined by the destructor) and its EtcdClient; borrows the
// registry, which must outlive it. Thread safety: SyncOnce and Nodes may be called from any
// thread.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/config.h"
#include "common/etcd_client.h"
#include "router/node_registry.h"

namespace pd::router {

class EtcdNodeWatcher {
 public:
  // Reads the prefix once (a failure is logged, not returned: the router starts without etcd),
  // then polls on its own thread. INVALID_ARGUMENT when options.endpoints is empty.
  static absl::StatusOr<std::unique_ptr<EtcdNodeWatcher>> Start(const EtcdOptions& options,
                                                                NodeRegistry& registry);
  ~EtcdNodeWatcher();  // stops and joins the thread; the nodes it added stay in the registry

  // Reads the prefix and applies the difference to the registry. UNAVAILABLE (and etcd's errors)
  // when etcd could not be read; the registry is then left as it is.
  absl::Status SyncOnce() ABSL_LOCKS_EXCLUDED(sync_mu_);
  // The nodes added from etcd and still in the registry, by name.
  std::vector<NodeOptions> Nodes() const ABSL_LOCKS_EXCLUDED(sync_mu_);

 private:
  EtcdNodeWatcher(const EtcdOptions& options, NodeRegistry& registry);
  // The polling thread; `synced`: whether Start's first read succeeded.
  void Loop(bool synced);
  // Warns about a skipped key unless the last sync warned about the same value; records it in
  // `skipped` (the next sync's skipped_).
  void Skip(const EtcdKeyValue& kv, const std::string& why,
            std::map<std::string, std::string>* skipped) ABSL_EXCLUSIVE_LOCKS_REQUIRED(sync_mu_);

  const EtcdOptions options_;
  const std::string nodes_prefix_;  // "<prefix>nodes/"
  NodeRegistry& registry_;
  EtcdClient client_;

  // One sync at a time.
  mutable absl::Mutex sync_mu_;
  std::map<std::string, NodeOptions> known_ ABSL_GUARDED_BY(sync_mu_);  // added by us, by name
  // Keys skipped with a warning -> the value warned about (warned again when it changes).
  std::map<std::string, std::string> skipped_ ABSL_GUARDED_BY(sync_mu_);

  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace pd::router
