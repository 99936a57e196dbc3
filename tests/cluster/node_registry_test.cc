// NodeRegistry (health checks, eviction, return, placement) and RemoteEngine against decode nodes
// running in this process: a tiny model's Scheduler behind DecodeService + NodeServer on loopback.
#include "router/node_registry.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <optional>
#include <set>

#include "decode_node/decode_service.h"
#include "node/node_server.h"
#include "prefill_node/prefill_service.h"
#include "proto/node_convert.h"
#include "router/remote_engine.h"
#include "tests/frontend/serving_testing.h"

namespace pd::router {
namespace {

struct InProcessNode {
  std::unique_ptr<frontend::testing::Stack> stack;
  std::unique_ptr<node::NodeState> state;
  std::unique_ptr<node::DecodeService> service;
  MetricsRegistry registry;
  std::unique_ptr<node::NodeServer> server;

  // (Re)starts the node's servers on `port` (0: a free one).
  void Serve(int port) {
    state = std::make_unique<node::NodeState>("decode", *stack->scheduler);
    service = std::make_unique<node::DecodeService>(*state);
    node::NodeServerOptions o;
    o.name = "pd-decode";
    o.grpc.port = port;
    o.http.enabled = false;
    auto s = node::NodeServer::Start(o, *state, service.get(), registry, nullptr);
    PD_CHECK_OK(s.status());
    server = std::move(*s);
  }
  std::string address() const { return server->grpc_address(); }
  int port() const { return std::stoi(address().substr(address().rfind(':') + 1)); }
};

std::unique_ptr<InProcessNode> StartNode(int kv_blocks) {
  auto n = std::make_unique<InProcessNode>();
  frontend::testing::StackOptions so;
  so.scheduler.kv_blocks = kv_blocks;
  so.scheduler.block_size = 16;
  n->stack = frontend::testing::MakeStack(so);
  n->Serve(0);
  return n;
}

RouterOptions Options(const std::vector<std::pair<std::string, std::string>>& nodes) {
  RouterOptions o;
  for (const auto& [name, address] : nodes) o.nodes.push_back({name, "decode", address});
  return o;
}

bool WaitFor(const std::function<bool()>& cond, absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    if (cond()) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return cond();
}

TEST(NodeRegistryTest, AFailedNodeIsEvictedWithinTwoSecondsAndReturnsWhenHealthy) {
  std::unique_ptr<InProcessNode> d0 = StartNode(64);
  auto registry = NodeRegistry::Create(Options({{"d0", d0->address()}}), nullptr);
  ASSERT_TRUE(registry.ok()) << registry.status();
  NodeRegistry& r = **registry;
  std::vector<std::string> evicted;
  absl::Mutex mu;
  r.OnUnhealthy([&](const NodeRegistry::Node* n) {
    absl::MutexLock l(&mu);
    evicted.push_back(n->options.name);
  });
  ASSERT_TRUE(r.WaitForDecodeNodes(1, absl::Seconds(5)));
  EXPECT_GT(r.DecodeContext(), 0);

  const int port = d0->port();
  d0->server.reset();  // the node's server goes away (as if the process died)
  const absl::Time down = absl::Now();
  ASSERT_TRUE(WaitFor([&] { return r.HealthyCount("decode") == 0; }, absl::Seconds(3)));
  EXPECT_LT(absl::Now() - down, absl::Seconds(2));
  EXPECT_EQ(r.PickDecode(10, {}), nullptr);
  {
    absl::MutexLock l(&mu);
    EXPECT_EQ(evicted, std::vector<std::string>{"d0"});
  }
  d0->Serve(port);  // back on the same address
  EXPECT_TRUE(WaitFor([&] { return r.HealthyCount("decode") == 1; }, absl::Seconds(2)));
  EXPECT_NE(r.PickDecode(10, {}), nullptr);
}

TEST(NodeRegistryTest, ADrainingNodeStopsReceivingWork) {
  std::unique_ptr<InProcessNode> d0 = StartNode(64);
  auto registry = NodeRegistry::Create(Options({{"d0", d0->address()}}), nullptr);
  ASSERT_TRUE(registry.ok());
  ASSERT_TRUE((*registry)->WaitForDecodeNodes(1, absl::Seconds(5)));
  d0->state->StartDraining();
  EXPECT_TRUE(WaitFor([&] { return (*registry)->HealthyCount("decode") == 0; }, absl::Seconds(2)));
}

TEST(NodeRegistryTest, PlacementNeverPicksANodeThatCannotHoldTheRequest) {
  std::unique_ptr<InProcessNode> small = StartNode(4);  // 64 tokens
  std::unique_ptr<InProcessNode> big = StartNode(16);   // 256 tokens (the model's context)
  for (const char* policy : {"least_loaded", "round_robin"}) {
    SCOPED_TRACE(policy);
    RouterOptions o = Options({{"small", small->address()}, {"big", big->address()}});
    o.decode_policy = policy;
    auto registry = NodeRegistry::Create(o, nullptr);
    ASSERT_TRUE(registry.ok());
    NodeRegistry& r = **registry;
    ASSERT_TRUE(r.WaitForDecodeNodes(2, absl::Seconds(5)));
    for (int i = 0; i < 6; ++i) {
      const NodeRegistry::Node* n = r.PickDecode(100, {});
      ASSERT_NE(n, nullptr);
      EXPECT_EQ(n->options.name, "big");
    }
    EXPECT_EQ(r.PickDecode(100, {r.PickDecode(100, {})}), nullptr);  // only "big" could
    EXPECT_EQ(r.PickDecode(1000, {}), nullptr);
    std::set<std::string> picked;
    for (int i = 0; i < 4; ++i) picked.insert(r.PickDecode(10, {})->options.name);
    if (std::string(policy) == "round_robin") {
      EXPECT_EQ(picked, (std::set<std::string>{"small", "big"}));
    } else {
      EXPECT_EQ(picked, (std::set<std::string>{"big"}));  // more free KV, equally idle
    }
  }
}

TEST(RemoteEngineTest, RunsOnADecodeNodeAndRefusesWhenNoneIsHealthy) {
  std::unique_ptr<InProcessNode> d0 = StartNode(64);
  auto registry = NodeRegistry::Create(Options({{"d0", d0->address()}}), nullptr);
  ASSERT_TRUE(registry.ok());
  ASSERT_TRUE((*registry)->WaitForDecodeNodes(1, absl::Seconds(5)));
  RemoteEngine engine(**registry, RemoteEngineOptions{}, nullptr);

  class Sink : public engine::GenerationSink {
   public:
    void OnTokens(const std::vector<int32_t>& t) override {
      absl::MutexLock l(&mu);
      tokens.insert(tokens.end(), t.begin(), t.end());
    }
    void OnFinish(const engine::FinishInfo& i) override {
      absl::MutexLock l(&mu);
      info = i;
    }
    absl::Mutex mu;
    std::vector<int32_t> tokens;
    std::optional<engine::FinishInfo> info;
  };
  auto sink = std::make_shared<Sink>();
  engine::GenerationRequest req;
  req.id = "r1";
  req.prompt = {1, 300, 301};
  req.max_tokens = 7;
  req.sampling = engine::SamplingParams::Greedy();
  ASSERT_TRUE(engine.Submit(req, sink).ok());
  ASSERT_TRUE(WaitFor(
      [&] {
        absl::MutexLock l(&sink->mu);
        return sink->info.has_value();
      },
      absl::Seconds(10)));
  EXPECT_EQ(sink->info->reason, engine::FinishReason::kLength);
  EXPECT_EQ(sink->info->completion_tokens, 7);
  EXPECT_EQ(sink->tokens.size(), 7u);
  EXPECT_EQ(sink->info->prompt_tokens, 3);
  EXPECT_TRUE(d0->stack->WaitIdle(absl::Seconds(2)));

  d0->server.reset();
  ASSERT_TRUE(WaitFor([&] { return (*registry)->HealthyCount("decode") == 0; }, absl::Seconds(3)));
  req.id = "r2";
  EXPECT_EQ(engine.Submit(req, std::make_shared<Sink>()).code(), absl::StatusCode::kUnavailable);
}

// What is not built says so: the KV-transfer half of the node API.
// A decode node without a KV transport (kv_transfer.enabled off, or UCX failed to start) says so
// to every KV-transfer call; the router then takes the plain path.
TEST(NodeApiTest, KvTransferCallsOnANodeWithoutTransportAreFailedPrecondition) {
  std::unique_ptr<InProcessNode> d0 = StartNode(64);
  auto channel = grpc::CreateChannel(d0->address(), grpc::InsecureChannelCredentials());
  auto decode = pdserve::node::v1::Decode::NewStub(channel);
  {
    grpc::ClientContext ctx;
    pdserve::node::v1::ReserveRequest req;
    pdserve::node::v1::ReserveResponse resp;
    grpc::Status s = decode->Reserve(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_THAT(s.error_message(), ::testing::HasSubstr("kv_transfer.enabled"));
  }
  {
    grpc::ClientContext ctx;
    pdserve::node::v1::ReleaseRequest req;
    pdserve::node::v1::ReleaseResponse resp;
    EXPECT_EQ(decode->Release(&ctx, req, &resp).error_code(),
              grpc::StatusCode::FAILED_PRECONDITION);
  }
  {
    grpc::ClientContext ctx;
    pdserve::node::v1::GenerateRequest req;
    req.set_request_id("x");
    req.add_prompt(1);
    req.set_max_tokens(1);
    req.set_reservation(7);
    auto reader = decode->Generate(&ctx, req);
    pdserve::node::v1::GenerateResponse resp;
    EXPECT_FALSE(reader->Read(&resp));
    grpc::Status s = reader->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_THAT(s.error_message(), ::testing::HasSubstr("reservation"));
  }
}

// Prefill.Prefill without a KV descriptor: the first token, equal to the first token a decode
// node generates for the same greedy request.
TEST(NodeApiTest, PrefillReturnsTheFirstToken) {
  auto stack = frontend::testing::MakeStack();
  node::NodeState state("prefill", *stack->scheduler);
  node::PrefillService service(state);
  MetricsRegistry registry;
  node::NodeServerOptions o;
  o.http.enabled = false;
  auto server = node::NodeServer::Start(o, state, &service, registry, nullptr);
  ASSERT_TRUE(server.ok()) << server.status();
  auto prefill = pdserve::node::v1::Prefill::NewStub(
      grpc::CreateChannel((*server)->grpc_address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  pdserve::node::v1::PrefillRequest req;
  req.set_request_id("p");
  for (int t : {1, 300, 301, 302}) req.add_prompt(t);
  node::ToProto(engine::SamplingParams::Greedy(), req.mutable_sampling());
  pdserve::node::v1::PrefillResponse resp;
  ASSERT_TRUE(prefill->Prefill(&ctx, req, &resp).ok());
  EXPECT_FALSE(resp.stopped());

  std::unique_ptr<InProcessNode> d0 = StartNode(64);
  auto decode = pdserve::node::v1::Decode::NewStub(
      grpc::CreateChannel(d0->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext gctx;
  pdserve::node::v1::GenerateRequest g;
  g.set_request_id("g");
  *g.mutable_prompt() = req.prompt();
  *g.mutable_sampling() = req.sampling();
  g.set_max_tokens(1);
  auto reader = decode->Generate(&gctx, g);
  pdserve::node::v1::GenerateResponse r;
  std::vector<int32_t> tokens;
  while (reader->Read(&r)) tokens.insert(tokens.end(), r.tokens().begin(), r.tokens().end());
  ASSERT_TRUE(reader->Finish().ok());
  ASSERT_EQ(tokens.size(), 1u);
  EXPECT_EQ(resp.first_token(), tokens[0]);
  // The first token is a stop token: still returned (the decode node needs it), marked stopped.
  {
    grpc::ClientContext sctx;
    pdserve::node::v1::PrefillRequest stop_req = req;
    stop_req.set_request_id("s");
    stop_req.add_stop_token_ids(resp.first_token());
    pdserve::node::v1::PrefillResponse stop_resp;
    ASSERT_TRUE(prefill->Prefill(&sctx, stop_req, &stop_resp).ok());
    EXPECT_TRUE(stop_resp.stopped());
    EXPECT_EQ(stop_resp.first_token(), resp.first_token());
  }
  // A KV descriptor on a node without a transport: FAILED_PRECONDITION, nothing run.
  {
    grpc::ClientContext kctx;
    pdserve::node::v1::PrefillRequest kv_req = req;
    kv_req.set_request_id("k");
    kv_req.mutable_kv()->set_transport("descriptor bytes");
    pdserve::node::v1::PrefillResponse kv_resp;
    grpc::Status s = prefill->Prefill(&kctx, kv_req, &kv_resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_THAT(s.error_message(), ::testing::HasSubstr("kv_transfer.enabled"));
  }
  EXPECT_TRUE(stack->WaitIdle(absl::Seconds(2)));
}

}  // namespace
}  // namespace pd::router
