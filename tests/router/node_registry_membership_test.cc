// NodeRegistry's dynamic membership (AddNode / RemoveNode, router/node_registry.h) against fake
// nodes: a gRPC server on loopback (port 0) that answers Node.Load and counts the polls.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "absl/synchronization/notification.h"
#include "common/status_matchers.h"
#include "pdserve/node/v1/node.grpc.pb.h"
#include "router/node_registry.h"

namespace pd::router {
namespace {

namespace nv1 = ::pdserve::node::v1;
using ::pd::testing::StatusIs;
using ::testing::HasSubstr;

class FakeNode final : public nv1::Node::Service {
 public:
  explicit FakeNode(std::string role) : role_(std::move(role)) {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(this);
    server_ = b.BuildAndStart();
  }
  ~FakeNode() override { server_->Shutdown(); }

  grpc::Status Load(grpc::ServerContext*, const nv1::LoadRequest*, nv1::EngineLoad* l) override {
    polls_.fetch_add(1);
    l->set_role(role_);
    l->set_kv_blocks_total(64);
    l->set_kv_blocks_free(64);
    l->set_kv_block_size(16);
    l->set_max_context(1024);
    return grpc::Status::OK;
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  int polls() const { return polls_.load(); }

 private:
  const std::string role_;
  int port_ = 0;
  std::atomic<int> polls_{0};
  std::unique_ptr<grpc::Server> server_;
};

RouterOptions FastHealth() {
  RouterOptions o;
  o.health_interval_ms = 20;
  o.health_timeout_ms = 200;
  return o;
}

bool WaitFor(const std::function<bool()>& cond, absl::Duration timeout = absl::Seconds(5)) {
  const absl::Time end = absl::Now() + timeout;
  while (!cond()) {
    if (absl::Now() >= end) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

TEST(NodeRegistryMembershipTest, StartsEmptyAndRefusesBadNodes) {
  absl::StatusOr<std::unique_ptr<NodeRegistry>> r = NodeRegistry::Create(FastHealth(), nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  NodeRegistry& reg = **r;
  EXPECT_TRUE(reg.Snapshot().empty());
  EXPECT_EQ(reg.PickDecode(1, {}), nullptr);
  EXPECT_FALSE(reg.WaitForDecodeNodes(1, absl::Milliseconds(30)));
  EXPECT_THAT(reg.AddNode({"", "decode", "h:1"}), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(reg.AddNode({"a", "router", "h:1"}),
              StatusIs(absl::StatusCode::kInvalidArgument, "role"));
  EXPECT_THAT(reg.AddNode({"a", "decode", "h"}),
              StatusIs(absl::StatusCode::kInvalidArgument, "host:port"));
  EXPECT_THAT(reg.RemoveNode("a"), StatusIs(absl::StatusCode::kNotFound));
  ASSERT_TRUE(reg.AddNode({"a", "decode", "127.0.0.1:1"}).ok());
  EXPECT_THAT(reg.AddNode({"a", "prefill", "127.0.0.1:2"}),
              StatusIs(absl::StatusCode::kAlreadyExists, "decode@127.0.0.1:1"));
  // The same node under a second name (pdctl's --node and its own etcd key, say).
  EXPECT_THAT(reg.AddNode({"b", "decode", "127.0.0.1:1"}),
              StatusIs(absl::StatusCode::kAlreadyExists, "already in the cluster as node a"));
  ASSERT_EQ(reg.Snapshot().size(), 1u);
  ASSERT_TRUE(reg.RemoveNode("a").ok());
  EXPECT_TRUE(reg.Snapshot().empty());
  EXPECT_THAT(reg.RemoveNode("a"), StatusIs(absl::StatusCode::kNotFound));
}

TEST(NodeRegistryMembershipTest, AddedNodeServesRemovedNodeIsNotPickedAndNotPolled) {
  FakeNode node("decode");
  MetricsRegistry metrics;
  absl::StatusOr<std::unique_ptr<NodeRegistry>> r = NodeRegistry::Create(FastHealth(), &metrics);
  ASSERT_TRUE(r.ok()) << r.status();
  NodeRegistry& reg = **r;
  std::atomic<int> told{0};
  reg.OnUnhealthy([&](const NodeRegistry::Node*) { told.fetch_add(1); });

  ASSERT_TRUE(reg.AddNode({"d1", "decode", node.address()}).ok());
  ASSERT_TRUE(reg.WaitForDecodeNodes(1, absl::Seconds(5)));
  const NodeRegistry::Node* picked = reg.PickDecode(10, {});
  ASSERT_NE(picked, nullptr);
  EXPECT_EQ(picked->options.name, "d1");
  EXPECT_EQ(reg.DecodeContext(), 1024);
  reg.AddActive(picked, 1, 10);  // a request in flight on it
  EXPECT_THAT(metrics.Render(),
              HasSubstr(R"(pdserve_router_node_member{node="d1",role="decode"} 1)"));

  ASSERT_TRUE(reg.RemoveNode("d1").ok());
  EXPECT_EQ(told.load(), 1);  // it was healthy: its streams are moved
  EXPECT_EQ(reg.PickDecode(10, {}), nullptr);
  EXPECT_EQ(reg.HealthyCount("decode"), 0);
  EXPECT_EQ(reg.DecodeContext(), 0);
  EXPECT_TRUE(reg.Snapshot().empty());
  const std::string text = metrics.Render();
  EXPECT_THAT(text, HasSubstr(R"(pdserve_router_node_member{node="d1",role="decode"} 0)"));
  EXPECT_THAT(text, HasSubstr(R"(pdserve_router_node_healthy{node="d1",role="decode"} 0)"));
  // The pointer stays usable by the request still holding it.
  EXPECT_EQ(picked->options.address, node.address());
  reg.AddActive(picked, -1, 10);
  reg.ReportFailure(picked, "late failure");
  EXPECT_EQ(told.load(), 1);
  // Its health thread is gone.
  const int polls = node.polls();
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(node.polls(), polls);
}

// The race CI once hit as a segfault: a health thread was still telling a RemoteEngine about an
// eviction while the engine was being destroyed. RemoveListener must wait for a notification
// already under way, and the removed listener must never run again.
TEST(NodeRegistryMembershipTest, RemoveListenerWaitsForANotificationUnderWay) {
  FakeNode node("decode");
  absl::StatusOr<std::unique_ptr<NodeRegistry>> r = NodeRegistry::Create(FastHealth(), nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  NodeRegistry& reg = **r;
  ASSERT_TRUE(reg.AddNode({"d1", "decode", node.address()}).ok());
  ASSERT_TRUE(reg.WaitForDecodeNodes(1, absl::Seconds(5)));
  const NodeRegistry::Node* d1 = reg.PickDecode(1, {});
  ASSERT_NE(d1, nullptr);

  absl::Notification entered, release;
  std::atomic<int> second_calls{0};
  // The first listener holds the notification open; the second stands for the dying engine.
  const int first = reg.OnUnhealthy([&](const NodeRegistry::Node*) {
    entered.Notify();
    release.WaitForNotification();
  });
  const int second = reg.OnUnhealthy([&](const NodeRegistry::Node*) { second_calls.fetch_add(1); });
  std::thread failing([&] { reg.ReportFailure(d1, "test"); });
  entered.WaitForNotification();

  std::atomic<bool> removed{false};
  std::thread remover([&] {
    reg.RemoveListener(second);
    removed.store(true);
  });
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(removed.load());  // the notification is still running
  release.Notify();
  remover.join();
  failing.join();
  EXPECT_TRUE(removed.load());
  // The notification had copied the list before the removal, so it may have called the second
  // listener once; once RemoveListener returned it never runs again.
  const int calls = second_calls.load();
  EXPECT_LE(calls, 1);
  ASSERT_TRUE(WaitFor([&] { return reg.HealthyCount("decode") == 1; }));  // polled back
  reg.RemoveListener(first);
  reg.ReportFailure(d1, "again");
  EXPECT_EQ(second_calls.load(), calls);
  reg.RemoveListener(12345);  // unknown ids are ignored
}

TEST(NodeRegistryMembershipTest, NodeBackAtTheSameAddressReusesItsEntry) {
  FakeNode node("decode"), other("decode");
  absl::StatusOr<std::unique_ptr<NodeRegistry>> r = NodeRegistry::Create(FastHealth(), nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  NodeRegistry& reg = **r;
  ASSERT_TRUE(reg.AddNode({"d1", "decode", node.address()}).ok());
  ASSERT_TRUE(reg.WaitForDecodeNodes(1, absl::Seconds(5)));
  const NodeRegistry::Node* first = reg.PickDecode(1, {});
  ASSERT_TRUE(reg.RemoveNode("d1").ok());

  ASSERT_TRUE(reg.AddNode({"d1", "decode", node.address()}).ok());
  ASSERT_TRUE(reg.WaitForDecodeNodes(1, absl::Seconds(5)));
  EXPECT_EQ(reg.PickDecode(1, {}), first);
  ASSERT_TRUE(reg.RemoveNode("d1").ok());

  ASSERT_TRUE(reg.AddNode({"d1", "decode", other.address()}).ok());
  ASSERT_TRUE(reg.WaitForDecodeNodes(1, absl::Seconds(5)));
  const NodeRegistry::Node* moved = reg.PickDecode(1, {});
  ASSERT_NE(moved, nullptr);
  EXPECT_NE(moved, first);
  EXPECT_EQ(moved->options.address, other.address());
  ASSERT_EQ(reg.Snapshot().size(), 1u);
}

TEST(NodeRegistryMembershipTest, RoleIsCheckedByTheHealthPoll) {
  FakeNode prefill("prefill");
  absl::StatusOr<std::unique_ptr<NodeRegistry>> r = NodeRegistry::Create(FastHealth(), nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE((*r)->AddNode({"x", "decode", prefill.address()}).ok());
  ASSERT_TRUE(WaitFor([&] { return prefill.polls() >= 3; }));
  EXPECT_EQ((*r)->HealthyCount("decode"), 0);
}

// Membership changes while requests pick, count and fail nodes on other threads.
TEST(NodeRegistryMembershipTest, ConcurrentChurnIsSafe) {
  FakeNode a("decode"), b("decode");
  absl::StatusOr<std::unique_ptr<NodeRegistry>> r = NodeRegistry::Create(FastHealth(), nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  NodeRegistry& reg = **r;
  ASSERT_TRUE(reg.AddNode({"a", "decode", a.address()}).ok());
  std::atomic<bool> stop{false};
  std::vector<std::thread> users;
  for (int t = 0; t < 3; ++t) {
    users.emplace_back([&] {
      while (!stop.load()) {
        if (const NodeRegistry::Node* n = reg.PickDecode(1, {})) {
          reg.AddActive(n, 1, 1);
          EXPECT_FALSE(n->options.name.empty());
          reg.AddActive(n, -1, 1);
        }
        reg.Snapshot();
        reg.DecodeLoad();
      }
    });
  }
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(reg.AddNode({"b", "decode", b.address()}).ok());
    absl::SleepFor(absl::Milliseconds(5));
    ASSERT_TRUE(reg.RemoveNode("b").ok());
  }
  stop.store(true);
  for (std::thread& t : users) t.join();
  ASSERT_EQ(reg.Snapshot().size(), 1u);
  EXPECT_EQ(reg.Snapshot()[0].active, 0);
}

}  // namespace
}  // namespace pd::router
