// NodeRegistry's placement (router/node_registry.h) against fake nodes on loopback whose
// Node.Load reports a chosen load and prefix-cache summary: kv_aware sends a prompt where its
// prefix is cached unless that node is loaded (decode and prefill nodes), CachedPrefixTokens
// reads the summary as the node's scheduler would reuse it, and random placement spreads.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <optional>
#include <set>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/status.h"
#include "engine/kv/block_hash.h"
#include "pdserve/node/v1/node.grpc.pb.h"
#include "router/node_registry.h"

namespace pd::router {
namespace {

namespace nv1 = ::pdserve::node::v1;

class FakeDecode final : public nv1::Node::Service {
 public:
  explicit FakeDecode(std::string role = "decode") : role_(std::move(role)) {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(this);
    server_ = b.BuildAndStart();
  }
  ~FakeDecode() override { server_->Shutdown(); }

  grpc::Status Load(grpc::ServerContext*, const nv1::LoadRequest*, nv1::EngineLoad* l) override {
    absl::MutexLock lock(&mu_);
    l->set_role(role_);
    l->set_kv_blocks_total(1024);
    l->set_kv_blocks_free(1024);
    l->set_kv_block_size(16);
    l->set_max_context(8192);
    l->set_pending_prefill_tokens(pending_);
    l->set_kv_blocks_cached(static_cast<int32_t>(hashes_.size()));
    l->mutable_cached_block_hashes()->Add(hashes_.begin(), hashes_.end());
    ++polls_;
    return grpc::Status::OK;
  }
  void Set(std::vector<uint64_t> hashes, int64_t pending) {
    absl::MutexLock lock(&mu_);
    hashes_ = std::move(hashes);
    pending_ = pending;
    polls_ = 0;
  }
  int polls() {
    absl::MutexLock lock(&mu_);
    return polls_;
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  const std::string role_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  absl::Mutex mu_;
  std::vector<uint64_t> hashes_ ABSL_GUARDED_BY(mu_);
  int64_t pending_ ABSL_GUARDED_BY(mu_) = 0;
  int polls_ ABSL_GUARDED_BY(mu_) = 0;
};

std::vector<int32_t> Prompt(int n, int32_t base) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; ++i) p[i] = base + i;
  return p;
}

struct Cluster {
  FakeDecode a, b;
  std::unique_ptr<NodeRegistry> reg;

  explicit Cluster(const std::string& policy) {
    RouterOptions o;
    o.health_interval_ms = 10;
    o.health_timeout_ms = 500;
    o.decode_policy = policy;
    auto r = NodeRegistry::Create(o, nullptr);
    PD_CHECK_OK(r.status());
    reg = std::move(*r);
    PD_CHECK_OK(reg->AddNode({"a", "decode", a.address()}));
    PD_CHECK_OK(reg->AddNode({"b", "decode", b.address()}));
    PD_CHECK(reg->WaitForDecodeNodes(2, absl::Seconds(5)));
  }
  // Waits until both nodes answered a poll after their last Set.
  void Settle() {
    for (int i = 0; i < 500 && (a.polls() < 2 || b.polls() < 2); ++i) {
      absl::SleepFor(absl::Milliseconds(5));
    }
  }
};

TEST(NodeRegistryPlacementTest, KvAwareFollowsTheCachedPrefix) {
  Cluster c("kv_aware");
  const std::vector<int32_t> turn1 = Prompt(200, 1000);
  std::vector<int32_t> turn2 = turn1;
  for (int i = 0; i < 40; ++i) turn2.push_back(7);
  // b holds turn 1's first 12 blocks (192 tokens: turn 1 filed rows below 200 - 200 % 4).
  c.b.Set(engine::BlockHashes(turn1, 16), 0);
  c.a.Set({}, 0);
  c.Settle();
  int cached = -1;
  const NodeRegistry::Node* n = c.reg->PickDecode(300, {}, turn2, &cached);
  ASSERT_NE(n, nullptr);
  EXPECT_EQ(n->options.name, "b");
  EXPECT_EQ(cached, 192);
  // An unrelated prompt: equal cost; the tie goes to either node but reports nothing cached.
  n = c.reg->PickDecode(300, {}, Prompt(100, 50000), &cached);
  ASSERT_NE(n, nullptr);
  EXPECT_EQ(cached, 0);
  // A node under load is still avoided: b's queue outweighs the prefix it holds.
  c.b.Set(engine::BlockHashes(turn1, 16), 5000);
  c.Settle();
  n = c.reg->PickDecode(300, {}, turn2, &cached);
  ASSERT_NE(n, nullptr);
  EXPECT_EQ(n->options.name, "a");
  EXPECT_EQ(cached, 0);
}

TEST(NodeRegistryPlacementTest, CachedPrefixTokensReadsTheSummaryLikeTheNode) {
  NodeStatus s;
  s.load.kv_block_size = 16;
  const std::vector<int32_t> p = Prompt(100, 3);
  EXPECT_EQ(NodeRegistry::CachedPrefixTokens(s, p), 0);       // no summary
  std::vector<uint64_t> hashes = engine::BlockHashes(p, 16);  // 6 blocks
  s.cached_blocks =
      std::make_shared<const absl::flat_hash_set<uint64_t>>(hashes.begin(), hashes.end());
  EXPECT_EQ(NodeRegistry::CachedPrefixTokens(s, p), 96);
  // The chain stops at the first block the node lacks.
  auto gap = hashes;
  gap.erase(gap.begin() + 2);
  s.cached_blocks = std::make_shared<const absl::flat_hash_set<uint64_t>>(gap.begin(), gap.end());
  EXPECT_EQ(NodeRegistry::CachedPrefixTokens(s, p), 32);
  // Never the whole prompt: its last rows are computed (here 96 = 96 - 96 % 4, minus one token).
  s.cached_blocks =
      std::make_shared<const absl::flat_hash_set<uint64_t>>(hashes.begin(), hashes.end());
  EXPECT_EQ(NodeRegistry::CachedPrefixTokens(s, absl::MakeConstSpan(p).first(96)), 80);
  // Another block size: the hashes do not match.
  s.load.kv_block_size = 8;
  EXPECT_EQ(NodeRegistry::CachedPrefixTokens(s, p), 0);
}

TEST(NodeRegistryPlacementTest, RandomSpreadsAndRoundRobinAlternates) {
  for (const char* policy : {"random", "round_robin"}) {
    Cluster c(policy);
    std::set<std::string> seen;
    for (int i = 0; i < 50; ++i) {
      const NodeRegistry::Node* n = c.reg->PickDecode(10, {}, Prompt(40, 1));
      ASSERT_NE(n, nullptr);
      seen.insert(n->options.name);
    }
    EXPECT_EQ(seen.size(), 2u) << policy;
  }
}

// Prefill placement: kv_aware weighs a node's pending prompt tokens against the part of this
// prompt it would compute, which is neither in its cache nor in the chosen decode node's (which it
// pulls from there); fewest_pending_tokens looks at the queue only.
TEST(NodeRegistryPlacementTest, KvAwarePrefillWeighsItsCacheAndTheDecodeNodes) {
  const std::vector<int32_t> turn1 = Prompt(200, 1000);
  std::vector<int32_t> turn2 = turn1;
  for (int i = 0; i < 40; ++i) turn2.push_back(7);
  for (const std::string policy : {"kv_aware", "fewest_pending_tokens"}) {
    SCOPED_TRACE(policy);
    FakeDecode a("prefill"), b("prefill");
    a.Set({}, 0);
    b.Set(engine::BlockHashes(turn1, 16), 100);  // 192 tokens of turn 2 cached, 100 queued
    RouterOptions o;
    o.health_interval_ms = 10;
    o.health_timeout_ms = 500;
    o.prefill_policy = policy;
    auto reg = NodeRegistry::Create(o, nullptr);
    ASSERT_TRUE(reg.ok()) << reg.status();
    ASSERT_TRUE((*reg)->AddNode({"a", "prefill", a.address()}).ok());
    ASSERT_TRUE((*reg)->AddNode({"b", "prefill", b.address()}).ok());
    for (int i = 0; i < 500 && ((*reg)->HealthyCount("prefill") < 2 || a.polls() < 2 ||
                                b.polls() < 2);
         ++i) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    ASSERT_EQ((*reg)->HealthyCount("prefill"), 2);
    const bool kv = policy == std::string("kv_aware");
    // a: 0 + 240; b: 100 + (240 - 192).
    const NodeRegistry::Node* n = (*reg)->PickPrefill(240, {}, turn2, 0);
    ASSERT_NE(n, nullptr);
    EXPECT_EQ(n->options.name, kv ? "b" : "a");
    // The decode node holds those 192 tokens too: a pulls them, and its queue is shorter.
    n = (*reg)->PickPrefill(240, {}, turn2, 192);
    ASSERT_NE(n, nullptr);
    EXPECT_EQ(n->options.name, "a");
  }
}

// PrefillWait: unknown until the node has finished enough work; then the node's reported queue
// (or the router's own count there, whichever is more) and the prompt, at the measured rate.
TEST(NodeRegistryPlacementTest, PrefillWaitIsTheQueueAtTheMeasuredRate) {
  FakeDecode p("prefill");
  p.Set({}, 3000);  // the node reports 3,000 prompt tokens pending
  RouterOptions o;
  o.health_interval_ms = 10;
  o.health_timeout_ms = 500;
  auto reg = NodeRegistry::Create(o, nullptr);
  ASSERT_TRUE(reg.ok()) << reg.status();
  ASSERT_TRUE((*reg)->AddNode({"p", "prefill", p.address()}).ok());
  for (int i = 0; i < 500 && ((*reg)->HealthyCount("prefill") < 1 || p.polls() < 2); ++i) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  const NodeRegistry::Node* n = (*reg)->PickPrefill(1000, {});
  ASSERT_NE(n, nullptr);
  EXPECT_FALSE((*reg)->PrefillWait(n, 1000));
  // One prefill of 2,000 tokens that takes ~0.6 s of the router's time on the node.
  const absl::Time start = absl::Now();
  (*reg)->AddActive(n, 1, 2000);
  absl::SleepFor(absl::Milliseconds(600));
  (*reg)->AddActive(n, -1, 2000);
  const double busy = absl::ToDoubleSeconds(absl::Now() - start);
  (*reg)->ObservePrefill(n, 2000);
  // (3,000 pending + 1,000) at 2,000 tokens per `busy` seconds: 2 x busy.
  std::optional<absl::Duration> wait = (*reg)->PrefillWait(n, 1000);
  ASSERT_TRUE(wait);
  EXPECT_GE(absl::ToDoubleSeconds(*wait), 2 * 0.6);
  EXPECT_LE(absl::ToDoubleSeconds(*wait), 2 * busy);
  const std::vector<NodeStatus> snap = (*reg)->Snapshot();
  ASSERT_EQ(snap.size(), 1u);
  EXPECT_GE(snap[0].prefill_tokens_per_s, 2000 / busy);
  EXPECT_LE(snap[0].prefill_tokens_per_s, 2000 / 0.6);
  // The router's own requests there count when they are more than the node reports.
  (*reg)->AddActive(n, 1, 9000);
  wait = (*reg)->PrefillWait(n, 1000);
  ASSERT_TRUE(wait);
  EXPECT_GE(absl::ToDoubleSeconds(*wait), 5 * 0.6);
  EXPECT_LE(absl::ToDoubleSeconds(*wait), 5 * busy);
  (*reg)->AddActive(n, -1, 9000);
}

}  // namespace
}  // namespace pd::router
