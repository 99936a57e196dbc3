#include "router/node_registry.h"

#include <algorithm>
#include <tuple>

#include "common/log.h"
#include "common/net.h"
#include "common/status.h"
#include "common/strings.h"
#include "engine/model/fingerprint.h"
#include "engine/kv/block_hash.h"

namespace pd::router {
namespace nv1 = ::pdserve::node::v1;

struct NodeRegistry::Entry {
  Node node;  // immutable once added
  // The fields below are guarded by NodeRegistry::mu_.
  NodeStatus status;
  bool removed = false;
  // Bumped by RemoveNode (and when a removed entry is added again): a health loop started for an
  // older generation returns.
  uint64_t generation = 0;
  std::thread health;  // moved out and joined by RemoveNode or the destructor
  std::string refused_why;  // health thread only: the last refusal logged
  PrefillRate rate;         // prefill nodes: fed by AddActive and ObservePrefill
};

NodeRegistry::NodeRegistry(const RouterOptions& options, MetricsRegistry* metrics,
                           ClusterChannels channels, uint64_t model_fingerprint)
    : options_(options), channels_(std::move(channels)), model_fingerprint_(model_fingerprint) {
  if (metrics != nullptr) {
    healthy_gauge_ = &metrics->AddGauge(
        "pdserve_router_node_healthy", "1 while the node receives work, else 0.", {"node", "role"});
    member_gauge_ = &metrics->AddGauge(
        "pdserve_router_node_member",
        "1 while the node is in the router's cluster (configured, or registered in etcd), 0 "
        "after it left.",
        {"node", "role"});
    load_gauge_ = &metrics->AddGauge(
        "pdserve_router_node_load",
        "The node's load from its last health poll (field: running, waiting, kv_blocks_total, "
        "kv_blocks_free, pending_prefill_tokens, kv_blocks_cached), the router's streams on it "
        "(active) and, for prefill nodes, the prompt tokens per second of busy time the router "
        "measured there (prefill_tokens_per_s; 0 until measured).",
        {"node", "role", "field"});
    evictions_ = &metrics->AddCounter("pdserve_router_node_evictions_total",
                                      "Times a node stopped receiving work (failed health checks "
                                      "or a failed request).",
                                      {"node"});
  }
}

absl::StatusOr<std::unique_ptr<NodeRegistry>> NodeRegistry::Create(const RouterOptions& options,
                                                                   MetricsRegistry* metrics,
                                                                   ClusterChannels channels,
                                                                   uint64_t model_fingerprint) {
  std::unique_ptr<NodeRegistry> r(
      new NodeRegistry(options, metrics, std::move(channels), model_fingerprint));
  for (const NodeOptions& n : options.nodes) PD_RETURN_IF_ERROR(r->AddNode(n));
  return r;
}

NodeRegistry::~NodeRegistry() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    for (auto& e : entries_) {
      if (e->health.joinable()) threads.push_back(std::move(e->health));
    }
  }
  for (std::thread& t : threads) t.join();
}

absl::Status NodeRegistry::AddNode(const NodeOptions& n) {
  if (n.name.empty()) return absl::InvalidArgumentError("node name: must not be empty");
  if (n.role != "prefill" && n.role != "decode") {
    return absl::InvalidArgumentError(
        StrCat("node ", n.name, ": role must be prefill or decode (got '", n.role, "')"));
  }
  if (!SplitHostPort(n.address, nullptr, nullptr).ok()) {
    return absl::InvalidArgumentError(
        StrCat("node ", n.name, ": address must be host:port (got '", n.address, "')"));
  }
  absl::MutexLock lock(&mu_);
  if (stop_) return absl::FailedPreconditionError("the registry is shutting down");
  Entry* e = nullptr;
  for (auto& x : entries_) {
    if (!x->removed && x->node.options.address == n.address && x->node.options.name != n.name) {
      return absl::AlreadyExistsError(StrCat("node ", n.name, ": ", n.address,
                                             " is already in the cluster as node ",
                                             x->node.options.name));
    }
    if (x->node.options.name != n.name) continue;
    if (!x->removed) {
      return absl::AlreadyExistsError(StrCat("node ", n.name, ": already registered (",
                                             x->node.options.role, "@", x->node.options.address,
                                             ")"));
    }
    if (x->node.options.role == n.role && x->node.options.address == n.address) e = x.get();
  }
  if (e != nullptr) {
    // Back at the same address: reuse the entry (and its channel). The router's own requests
    // still on it keep their counts.
    e->removed = false;
    ++e->generation;
    NodeStatus& st = e->status;
    st.healthy = false;
    st.draining = false;
    st.consecutive_failures = 0;
    st.load = engine::EngineLoad();
    st.max_context = 0;
  } else {
    auto owned = std::make_unique<Entry>();
    e = owned.get();
    e->node.options = n;
    grpc::ChannelArguments args;
    // Reconnect quickly after a node restarts (gRPC's default backoff grows to minutes).
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
    args.SetMaxReceiveMessageSize(64 << 20);
    e->node.channel = channels_.Make(n.address, args);
    e->node.decode = nv1::Decode::NewStub(e->node.channel);
    e->node.prefill = nv1::Prefill::NewStub(e->node.channel);
    e->node.node = nv1::Node::NewStub(e->node.channel);
    e->status.name = n.name;
    e->status.role = n.role;
    e->status.address = n.address;
    entries_.push_back(std::move(owned));
  }
  Publish(*e);
  const uint64_t generation = e->generation;
  e->health = std::thread([this, e, generation] { HealthLoop(e, generation); });
  return absl::OkStatus();
}

absl::Status NodeRegistry::RemoveNode(const std::string& name) {
  Entry* e = nullptr;
  std::thread health;
  bool was_healthy = false;
  {
    absl::MutexLock lock(&mu_);
    for (auto& x : entries_) {
      if (x->node.options.name == name && !x->removed) e = x.get();
    }
    if (e == nullptr) return absl::NotFoundError(StrCat("node ", name, ": not registered"));
    e->removed = true;
    ++e->generation;  // the health loop returns at its next wake-up
    was_healthy = e->status.healthy;
    e->status.healthy = false;
    health = std::move(e->health);
    Publish(*e);
  }
  if (health.joinable()) health.join();
  PD_LOG(kInfo, "node ", name, " (", e->node.options.role, "@", e->node.options.address,
         ") removed from the cluster");
  if (was_healthy) MarkUnhealthy(e, "removed from the cluster");
  return absl::OkStatus();
}

NodeRegistry::Entry* NodeRegistry::FindLocked(const Node* node) {
  for (auto& e : entries_) {
    if (&e->node == node) return e.get();
  }
  return nullptr;
}

void NodeRegistry::Publish(const Entry& e) {
  const NodeStatus& s = e.status;
  if (healthy_gauge_ != nullptr) healthy_gauge_->WithLabels({s.name, s.role}).Set(s.healthy);
  if (member_gauge_ != nullptr) member_gauge_->WithLabels({s.name, s.role}).Set(!e.removed);
  if (load_gauge_ != nullptr) {
    auto set = [&](const char* field, double v) {
      load_gauge_->WithLabels({s.name, s.role, field}).Set(v);
    };
    set("running", s.load.running);
    set("waiting", s.load.waiting);
    set("kv_blocks_total", s.load.kv_blocks_total);
    set("kv_blocks_free", s.load.kv_blocks_free);
    set("pending_prefill_tokens", static_cast<double>(s.load.pending_prefill_tokens));
    set("kv_blocks_cached", s.load.kv_blocks_cached);
    set("active", s.active);
    if (s.role == "prefill") set("prefill_tokens_per_s", s.prefill_tokens_per_s);
  }
}

void NodeRegistry::HealthLoop(Entry* e, uint64_t generation) {
  const absl::Duration interval = absl::Milliseconds(options_.health_interval_ms);
  const absl::Duration timeout = absl::Milliseconds(options_.health_timeout_ms);
  while (true) {
    const absl::Time start = absl::Now();
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(start + timeout));
    nv1::EngineLoad l;
    const grpc::Status s = e->node.node->Load(&ctx, nv1::LoadRequest(), &l);
    std::shared_ptr<const absl::flat_hash_set<uint64_t>> cached;  // built outside the lock
    if (s.ok() && l.cached_block_hashes_size() > 0) {
      cached = std::make_shared<const absl::flat_hash_set<uint64_t>>(
          l.cached_block_hashes().begin(), l.cached_block_hashes().end());
    }
    bool turned_unhealthy = false;
    std::string why;
    {
      absl::MutexLock lock(&mu_);
      if (stop_ || e->generation != generation) return;
      NodeStatus& st = e->status;
      if (s.ok() && l.role() != st.role) {
        why = StrCat("serves role '", l.role(), "', configured as '", st.role, "'");
      } else if (s.ok() && model_fingerprint_ != 0 &&
                 l.model_fingerprint() != model_fingerprint_) {
        why = StrCat("runs another model (fingerprint ",
                     engine::FingerprintHex(l.model_fingerprint()), ", the router's ",
                     engine::FingerprintHex(model_fingerprint_),
                     "): it gets no work; start it with the router's model file");
      } else if (s.ok()) {
        if (!st.healthy && !l.draining()) {
          PD_LOG(kInfo, "node ", st.name, " (", st.address, ") is healthy");
        }
        st.consecutive_failures = 0;
        st.draining = l.draining();
        turned_unhealthy = st.healthy && l.draining();
        st.healthy = !l.draining();
        if (turned_unhealthy) why = "draining";
        st.load.running = l.running();
        st.load.waiting = l.waiting();
        st.load.kv_blocks_total = l.kv_blocks_total();
        st.load.kv_blocks_free = l.kv_blocks_free();
        st.load.kv_block_size = l.kv_block_size();
        st.load.pending_prefill_tokens = l.pending_prefill_tokens();
        st.load.kv_blocks_cached = l.kv_blocks_cached();
        st.cached_blocks = std::move(cached);
        st.max_context = l.max_context();
      } else {
        why = StrCat(s.error_code(), " ", s.error_message());
      }
      if (!s.ok() || !why.empty()) {
        if (!turned_unhealthy) {
          ++st.consecutive_failures;
          if (st.healthy && st.consecutive_failures >= options_.unhealthy_after) {
            st.healthy = false;
            turned_unhealthy = true;
          }
        }
      }
      Publish(*e);
    }
    if (turned_unhealthy) MarkUnhealthy(e, StrCat("health check: ", why));
    // A node that answers but is refused (wrong role or model) never turns unhealthy, since it
    // never was healthy: say why once, and again when the reason changes.
    if (s.ok() && !why.empty() && why != e->refused_why) {
      PD_LOG(kWarning, "node ", e->node.options.name, " (", e->node.options.address,
             ") refused: ", why);
    }
    e->refused_why = s.ok() ? why : "";
    absl::MutexLock lock(&mu_);
    auto stopped = [this, e, generation]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stop_ || e->generation != generation;
    };
    mu_.AwaitWithDeadline(absl::Condition(&stopped), start + interval);
    if (stopped()) return;
  }
}

// Called without the lock once a node turned unhealthy: logs, counts, tells the listeners.
void NodeRegistry::MarkUnhealthy(Entry* e, const std::string& why) {
  std::vector<std::pair<int, std::function<void(const Node*)>>> listeners;
  {
    absl::MutexLock lock(&mu_);
    listeners = listeners_;
    ++notifying_;
  }
  PD_LOG(kWarning, "node ", e->node.options.name, " (", e->node.options.address,
         ") stops receiving work: ", why);
  if (evictions_ != nullptr) evictions_->WithLabels({e->node.options.name}).Increment();
  for (auto& [id, l] : listeners) l(&e->node);
  absl::MutexLock lock(&mu_);
  --notifying_;
}

void NodeRegistry::ReportFailure(const Node* node, const std::string& why) {
  Entry* e = nullptr;
  bool was_healthy = false;
  {
    absl::MutexLock lock(&mu_);
    e = FindLocked(node);
    if (e == nullptr) return;
    was_healthy = e->status.healthy;
    e->status.healthy = false;
    e->status.consecutive_failures = std::max(e->status.consecutive_failures, 1);
    Publish(*e);
  }
  if (was_healthy) MarkUnhealthy(e, StrCat("request failed: ", why));
}

void NodeRegistry::AddActive(const Node* node, int delta, int64_t tokens) {
  absl::MutexLock lock(&mu_);
  Entry* e = FindLocked(node);
  if (e == nullptr) return;
  e->status.active += delta;
  e->status.active_tokens += delta * tokens;
  if (e->status.role == "prefill") e->rate.Active(e->status.active, absl::Now());
  Publish(*e);
}

void NodeRegistry::ObservePrefill(const Node* node, int64_t tokens) {
  absl::MutexLock lock(&mu_);
  Entry* e = FindLocked(node);
  if (e == nullptr) return;
  e->rate.Finished(tokens, absl::Now());
  e->status.prefill_tokens_per_s = e->rate.TokensPerSecond().value_or(0);
  Publish(*e);
}

std::optional<absl::Duration> NodeRegistry::PrefillWait(const Node* node, int64_t tokens) {
  absl::MutexLock lock(&mu_);
  const Entry* e = FindLocked(node);
  if (e == nullptr) return std::nullopt;
  const int64_t backlog = std::max(e->status.load.pending_prefill_tokens, e->status.active_tokens);
  return e->rate.Wait(backlog, tokens);
}

int NodeRegistry::OnUnhealthy(std::function<void(const Node*)> listener) {
  absl::MutexLock lock(&mu_);
  const int id = next_listener_++;
  listeners_.emplace_back(id, std::move(listener));
  return id;
}

void NodeRegistry::RemoveListener(int id) {
  absl::MutexLock lock(&mu_);
  std::erase_if(listeners_, [id](const auto& l) { return l.first == id; });
  // A notification that copied the list before the erase may still call it: wait it out. (Any
  // notification, to keep this simple: they are rare and short.)
  auto quiet = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return notifying_ == 0; };
  mu_.Await(absl::Condition(&quiet));
}

const NodeRegistry::Node* NodeRegistry::PickDecode(int64_t tokens,
                                                   const std::vector<const Node*>& exclude,
                                                   absl::Span<const int32_t> prompt,
                                                   int* cached_tokens) {
  return Pick("decode", tokens, exclude, prompt, cached_tokens);
}

const NodeRegistry::Node* NodeRegistry::PickPrefill(int64_t tokens,
                                                    const std::vector<const Node*>& exclude,
                                                    absl::Span<const int32_t> prompt,
                                                    int decode_cached) {
  return Pick("prefill", tokens, exclude, prompt, nullptr, decode_cached);
}

int NodeRegistry::CachedPrefixTokens(const NodeStatus& s, absl::Span<const int32_t> prompt) {
  if (s.cached_blocks == nullptr || s.load.kv_block_size < 1 || prompt.empty()) return 0;
  const int block = s.load.kv_block_size;
  const int limit = std::min(engine::CacheablePrefix(static_cast<int>(prompt.size())),
                             static_cast<int>(prompt.size()) - 1);
  return block * engine::LeadingHeldBlocks(prompt, block, limit / block, [&](uint64_t h) {
           return s.cached_blocks->contains(h);
         });
}

const NodeRegistry::Node* NodeRegistry::Pick(const std::string& role, int64_t tokens,
                                             const std::vector<const Node*>& exclude,
                                             absl::Span<const int32_t> prompt, int* cached_tokens,
                                             int decode_cached) {
  absl::MutexLock lock(&mu_);
  std::vector<Entry*> candidates;
  for (auto& e : entries_) {
    const NodeStatus& s = e->status;
    if (e->removed || s.role != role || !s.healthy) continue;
    if (std::find(exclude.begin(), exclude.end(), &e->node) != exclude.end()) continue;
    if (role == "decode") {
      // Never a node whose whole cache (or context) cannot hold the request.
      const int64_t capacity = int64_t{s.load.kv_blocks_total} * s.load.kv_block_size;
      if (capacity < tokens || (s.max_context > 0 && s.max_context < tokens)) continue;
    }
    candidates.push_back(e.get());
  }
  if (candidates.empty()) return nullptr;
  const std::string& policy = role == "decode" ? options_.decode_policy : options_.prefill_policy;
  Entry* best = nullptr;
  if (policy == "round_robin") {
    best = candidates[round_robin_++ % candidates.size()];
  } else if (policy == "random") {
    random_state_ = engine::MixBlockHash(random_state_ + 0x9e3779b97f4a7c15ULL);
    best = candidates[random_state_ % candidates.size()];
  } else if (role == "decode") {
    // least_loaded and kv_aware: nodes with room for the request first, then the policy's measure
    // (sequences; or the cost in prompt tokens ahead of the first token), then the most free KV.
    // One key per candidate: kv_aware's hashes the prompt up to the first uncached block.
    const bool kv_aware = policy == "kv_aware";
    std::vector<std::tuple<int, double, int64_t>> keys;
    keys.reserve(candidates.size());
    for (const Entry* e : candidates) {
      const NodeStatus& s = e->status;
      const int64_t block = std::max(1, s.load.kv_block_size);
      const int64_t free_tokens = int64_t{s.load.kv_blocks_free} * block - s.active_tokens;
      const int seqs = std::max(s.load.running + s.load.waiting, s.active);
      const double measure =
          kv_aware ? static_cast<double>(prompt.size()) -
                         options_.prefix_weight * CachedPrefixTokens(s, prompt) +
                         static_cast<double>(s.load.pending_prefill_tokens) +
                         static_cast<double>(options_.seq_cost_tokens) * seqs
                   : static_cast<double>(seqs);
      keys.emplace_back(free_tokens >= tokens ? 0 : 1, measure, -free_tokens);
    }
    best = candidates[std::min_element(keys.begin(), keys.end()) - keys.begin()];
  } else {
    // fewest_pending_tokens: prompt tokens queued there. kv_aware adds what this prompt would
    // cost there: the part that neither the node's cache nor the decode node (whose prefix the
    // node pulls, docs/cluster.md) holds.
    const bool kv_aware = policy == "kv_aware";
    auto key = [&](const Entry* e) {
      const NodeStatus& s = e->status;
      double k = static_cast<double>(s.load.pending_prefill_tokens + s.active_tokens);
      if (kv_aware) {
        const int held = std::max(CachedPrefixTokens(s, prompt), decode_cached);
        k += static_cast<double>(prompt.size()) - options_.prefix_weight * held;
      }
      return k;
    };
    best = *std::min_element(candidates.begin(), candidates.end(),
                             [&](const Entry* a, const Entry* b) { return key(a) < key(b); });
  }
  if (cached_tokens != nullptr) *cached_tokens = CachedPrefixTokens(best->status, prompt);
  return &best->node;
}

std::vector<NodeStatus> NodeRegistry::Snapshot() const {
  absl::MutexLock lock(&mu_);
  std::vector<NodeStatus> out;
  for (const auto& e : entries_) {
    if (!e->removed) out.push_back(e->status);
  }
  return out;
}

int NodeRegistry::HealthyCount(const std::string& role) const {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const auto& e : entries_) n += !e->removed && e->status.role == role && e->status.healthy;
  return n;
}

int NodeRegistry::DecodeContext() const {
  absl::MutexLock lock(&mu_);
  int ctx = 0;
  for (const auto& e : entries_) {
    const NodeStatus& s = e->status;
    if (e->removed || s.role != "decode" || s.max_context <= 0) continue;
    ctx = ctx == 0 ? s.max_context : std::min(ctx, s.max_context);
  }
  return ctx;
}

engine::EngineLoad NodeRegistry::DecodeLoad() const {
  absl::MutexLock lock(&mu_);
  engine::EngineLoad sum;
  for (const auto& e : entries_) {
    const NodeStatus& s = e->status;
    if (e->removed || s.role != "decode" || !s.healthy) continue;
    sum.running += s.load.running;
    sum.waiting += s.load.waiting;
    sum.kv_blocks_total += s.load.kv_blocks_total;
    sum.kv_blocks_free += s.load.kv_blocks_free;
    sum.kv_block_size = s.load.kv_block_size;
    sum.pending_prefill_tokens += s.load.pending_prefill_tokens;
  }
  return sum;
}

bool NodeRegistry::WaitForHealthy(const std::string& role, int n, absl::Duration timeout) const {
  const absl::Time end = absl::Now() + timeout;
  while (HealthyCount(role) < n) {
    if (absl::Now() >= end) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return true;
}

}  // namespace pd::router
