#include "node/etcd_registration.h"

#include <unistd.h>

#include <algorithm>
#include <utility>

#include "common/log.h"
#include "common/net.h"
#include "common/status.h"
#include "common/strings.h"

namespace pd::node {
namespace {

// A warning at most this often while etcd cannot be reached.
constexpr absl::Duration kWarnEvery = absl::Seconds(5);

std::string HostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

}  // namespace

NodeOptions EtcdNodeIdentity(const EtcdOptions& options, const std::string& role,
                             const std::string& grpc_address) {
  std::string host;
  int port = 0;
  (void)SplitHostPort(grpc_address, &host, &port);  // NodeServer's own address: well formed
  std::string address = grpc_address;
  if (host.empty() || host == "0.0.0.0" || host == "::") {
    host = HostName();
    address = JoinHostPort(host, port);
  }
  NodeOptions n;
  n.role = role;
  n.address = address;
  n.name = options.node_name.empty() ? StrCat(role, "-", host, "-", port) : options.node_name;
  return n;
}

EtcdRegistration::EtcdRegistration(const EtcdOptions& options, const NodeOptions& node)
    : options_(options),
      node_(node),
      key_(EtcdNodeKey(options, node)),
      value_(EtcdNodeValue(node)),
      // Well below the TTL, so that one slow endpoint does not let the lease expire.
      client_(options.endpoints,
              absl::Milliseconds(std::clamp(options.lease_ttl_s * 1000 / 3, 200, 1000))) {}

absl::StatusOr<std::unique_ptr<EtcdRegistration>> EtcdRegistration::Start(
    const EtcdOptions& options, const NodeOptions& node) {
  if (options.endpoints.empty()) {
    return absl::InvalidArgumentError("etcd.endpoints: empty (etcd membership is off)");
  }
  if (node.name.empty() || node.role.empty() || node.address.empty()) {
    return absl::InvalidArgumentError("etcd registration: the node needs a name, role and address");
  }
  std::unique_ptr<EtcdRegistration> r(new EtcdRegistration(options, node));
  if (absl::Status s = r->Register(); !s.ok()) {
    PD_LOG(kWarning, "etcd: cannot register ", r->key_, " (", s.message(),
           "); serving anyway, retrying in the background");
  }
  r->thread_ = std::thread([p = r.get()] { p->Loop(); });
  return r;
}

EtcdRegistration::~EtcdRegistration() { Stop(); }

absl::Status EtcdRegistration::Register() {
  PD_ASSIGN_OR_RETURN(int64_t lease, client_.GrantLease(options_.lease_ttl_s));
  // Without the key the lease is useless; it expires by itself if the put fails.
  PD_RETURN_IF_ERROR(client_.Put(key_, value_, lease));
  PD_LOG(kInfo, "etcd: registered ", key_, " = ", value_, " (lease ", lease, ", TTL ",
         options_.lease_ttl_s, " s)");
  absl::MutexLock lock(&mu_);
  lease_ = lease;
  return absl::OkStatus();
}

void EtcdRegistration::Loop() {
  const absl::Duration interval = absl::Milliseconds(options_.lease_ttl_s * 1000 / 3);
  // Start warned already when its registration failed.
  absl::Time last_warning = registered() ? absl::InfinitePast() : absl::Now();
  auto warn = [&](const std::string& what) {
    if (absl::Now() - last_warning < kWarnEvery) return;
    last_warning = absl::Now();
    PD_LOG(kWarning, "etcd: ", what, "; serving anyway, retrying every ",
           absl::FormatDuration(interval));
  };
  while (true) {
    absl::Time next = absl::Now() + interval;
    {
      absl::MutexLock lock(&mu_);
      auto stopped = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
      mu_.AwaitWithDeadline(absl::Condition(&stopped), next);
      if (stop_) return;
    }
    int64_t lease = 0;
    {
      absl::MutexLock lock(&mu_);
      lease = lease_;
    }
    if (lease != 0) {
      absl::StatusOr<int64_t> ttl = client_.KeepAlive(lease);
      if (ttl.ok()) {
        last_warning = absl::InfinitePast();
        continue;
      }
      if (ttl.status().code() != absl::StatusCode::kNotFound) {
        warn(StrCat("cannot renew the lease of ", key_, " (", ttl.status().message(), ")"));
        continue;
      }
      PD_LOG(kWarning, "etcd: the lease of ", key_, " expired; registering again");
      absl::MutexLock lock(&mu_);
      lease_ = 0;
    }
    if (absl::Status s = Register(); !s.ok()) {
      warn(StrCat("cannot register ", key_, " (", s.message(), ")"));
    } else {
      last_warning = absl::InfinitePast();
    }
  }
}

void EtcdRegistration::Stop() {
  int64_t lease = 0;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
  {
    absl::MutexLock lock(&mu_);
    std::swap(lease, lease_);
  }
  if (lease == 0) return;
  if (absl::Status s = client_.RevokeLease(lease); !s.ok()) {
    PD_LOG(kWarning, "etcd: cannot revoke the lease of ", key_, " (", s.message(),
           "); routers drop this node when it expires, within ", options_.lease_ttl_s, " s");
  } else {
    PD_LOG(kInfo, "etcd: deregistered ", key_);
  }
}

bool EtcdRegistration::registered() const {
  absl::MutexLock lock(&mu_);
  return lease_ != 0;
}

std::unique_ptr<EtcdRegistration> StartEtcdRegistration(const ServeOptions& o,
                                                        const std::string& role,
                                                        const std::string& grpc_address) {
  if (o.etcd.endpoints.empty()) return nullptr;
  absl::StatusOr<std::unique_ptr<EtcdRegistration>> r =
      EtcdRegistration::Start(o.etcd, EtcdNodeIdentity(o.etcd, role, grpc_address));
  if (!r.ok()) {
    PD_LOG(kError, "etcd: not registering this node: ", r.status().message());
    return nullptr;
  }
  return *std::move(r);
}

}  // namespace pd::node
