#include "router/etcd_watcher.h"

#include <utility>

#include "common/log.h"
#include "common/status.h"
#include "common/strings.h"

namespace pd::router {
namespace {

bool SameNode(const NodeOptions& a, const NodeOptions& b) {
  return a.name == b.name && a.role == b.role && a.address == b.address;
}

// A warning at most this often while etcd cannot be read.
constexpr absl::Duration kWarnEvery = absl::Seconds(5);

}  // namespace

EtcdNodeWatcher::EtcdNodeWatcher(const EtcdOptions& options, NodeRegistry& registry)
    : options_(options),
      nodes_prefix_(EtcdNodesPrefix(options)),
      registry_(registry),
      // A poll waits at most this long per endpoint; the registry keeps serving meanwhile.
      client_(options.endpoints, absl::Seconds(1)) {}

absl::StatusOr<std::unique_ptr<EtcdNodeWatcher>> EtcdNodeWatcher::Start(const EtcdOptions& options,
                                                                        NodeRegistry& registry) {
  if (options.endpoints.empty()) {
    return absl::InvalidArgumentError("etcd.endpoints: empty (etcd membership is off)");
  }
  std::unique_ptr<EtcdNodeWatcher> w(new EtcdNodeWatcher(options, registry));
  const absl::Status first = w->SyncOnce();
  if (!first.ok()) {
    PD_LOG(kWarning, "etcd: cannot read ", w->nodes_prefix_, " (", first.message(),
           "); starting with the configured nodes only, retrying every ", options.poll_interval_ms,
           " ms");
  }
  w->thread_ = std::thread([p = w.get(), ok = first.ok()] { p->Loop(ok); });
  return w;
}

EtcdNodeWatcher::~EtcdNodeWatcher() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void EtcdNodeWatcher::Loop(bool synced) {
  const absl::Duration interval = absl::Milliseconds(options_.poll_interval_ms);
  // Start read the prefix just now (and warned if it could not).
  absl::Time failing_since = synced ? absl::InfiniteFuture() : absl::Now();
  absl::Time last_warning = synced ? absl::InfinitePast() : absl::Now();
  absl::Time start = absl::Now();
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto stopped = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
      mu_.AwaitWithDeadline(absl::Condition(&stopped), start + interval);
      if (stop_) return;
    }
    start = absl::Now();
    const absl::Status s = SyncOnce();
    if (!s.ok()) {
      if (failing_since == absl::InfiniteFuture()) failing_since = start;
      if (start - last_warning >= kWarnEvery) {
        last_warning = start;
        const absl::Duration down = absl::Trunc(start - failing_since, absl::Milliseconds(100));
        PD_LOG(kWarning, "etcd: cannot read ", nodes_prefix_,
               down > absl::ZeroDuration() ? StrCat(" for ", absl::FormatDuration(down)) : "", " (",
               s.message(), "); keeping the ", Nodes().size(),
               " node(s) registered there, and the configured ones, still polling");
      }
    } else if (failing_since != absl::InfiniteFuture()) {
      PD_LOG(kInfo, "etcd: ", nodes_prefix_, " readable again after ",
             absl::FormatDuration(absl::Trunc(start - failing_since, absl::Milliseconds(100))));
      failing_since = absl::InfiniteFuture();
      last_warning = absl::InfinitePast();
    }
  }
}

absl::Status EtcdNodeWatcher::SyncOnce() {
  absl::MutexLock lock(&sync_mu_);
  PD_ASSIGN_OR_RETURN(std::vector<EtcdKeyValue> kvs, client_.RangePrefix(nodes_prefix_));
  std::map<std::string, NodeOptions> seen;  // by name
  std::map<std::string, std::string> skipped;
  auto skip = [&](const EtcdKeyValue& kv, const std::string& why) { Skip(kv, why, &skipped); };
  for (const EtcdKeyValue& kv : kvs) {
    absl::StatusOr<NodeOptions> n = ParseEtcdNode(nodes_prefix_, kv.key, kv.value);
    if (!n.ok()) {
      skip(kv, std::string(n.status().message()));
    } else if (seen.contains(n->name)) {
      skip(kv, StrCat("the name ", n->name, " is registered twice (as ", seen[n->name].role,
                      " and ", n->role, ")"));
    } else {
      seen[n->name] = *n;
    }
  }
  // Gone or changed: out first, so that a changed node is added again below.
  for (auto it = known_.begin(); it != known_.end();) {
    auto s = seen.find(it->first);
    if (s != seen.end() && SameNode(s->second, it->second)) {
      ++it;
      continue;
    }
    PD_LOG(kInfo, "etcd: node ", it->first, " (", it->second.role, "@", it->second.address, ") ",
           s == seen.end() ? "left (its key is gone: lease revoked or expired)"
                           : StrCat("changed to ", s->second.role, "@", s->second.address));
    if (absl::Status r = registry_.RemoveNode(it->first); !r.ok()) {
      PD_LOG(kWarning, "etcd: ", r.message());
    }
    it = known_.erase(it);
  }
  for (const auto& [name, n] : seen) {
    if (known_.contains(name)) continue;
    if (absl::Status a = registry_.AddNode(n); !a.ok()) {
      const std::string key = StrCat(nodes_prefix_, n.role, "/", name);
      skip(EtcdKeyValue{key, EtcdNodeValue(n)}, std::string(a.message()));
      continue;
    }
    PD_LOG(kInfo, "etcd: node ", name, " (", n.role, "@", n.address, ") joined");
    known_[name] = n;
  }
  skipped_ = std::move(skipped);
  return absl::OkStatus();
}

void EtcdNodeWatcher::Skip(const EtcdKeyValue& kv, const std::string& why,
                           std::map<std::string, std::string>* skipped) {
  auto it = skipped_.find(kv.key);
  if (it == skipped_.end() || it->second != kv.value) {
    PD_LOG(kWarning, "etcd: skipping ", kv.key, ": ", why);
  }
  (*skipped)[kv.key] = kv.value;
}

std::vector<NodeOptions> EtcdNodeWatcher::Nodes() const {
  absl::MutexLock lock(&sync_mu_);
  std::vector<NodeOptions> out;
  for (const auto& [name, n] : known_) out.push_back(n);
  return out;
}

}  // namespace pd::router
