// The disaggregated cluster as a user starts it: `pdctl up` runs pd-prefill, pd-decode and
// pd-router as real processes on 127.0.0.1 (ports chosen by the OS) over a tiny synthetic model;
// the tests talk to the router over gRPC and HTTP, to the nodes over the node API, and kill nodes
// with SIGKILL.
#include <errno.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "pdserve/node/v1/node.grpc.pb.h"
#include "pdserve/v1/chat.grpc.pb.h"
#include "tests/router/serving_testing.h"
#include "tests/testing/process.h"
#include "tests/testing/tiny_model.h"

namespace pd::router {
namespace {

using ::pd::testing::Process;
using ::pd::testing::TempDir;
using ::testing::HasSubstr;

// Big enough that a 200-token stream lasts a good fraction of a second on one core (so a node can
// be killed in the middle of it), small enough to build in a moment.
std::string SlowModelGguf() {
  engine::testing::TinyModelSpec spec;
  spec.n_vocab = static_cast<int>(testing::ServingVocab().size());
  spec.n_embd = 384;
  spec.n_layer = 8;
  spec.n_head = 6;
  spec.n_head_kv = 2;
  spec.n_ff = 1024;
  spec.type = engine::DType::kQ8_0;  // ~13 MiB: GgufBuilder writes at most 16 MiB of data
  spec.seed = 11;
  spec.metadata = testing::AddServingVocab;
  return engine::testing::TinyModel(spec);
}

constexpr char kConfig[] = R"(
model: {id: tiny, chat_template: chatml}
threads: 1
kv: {memory_mib: 8}
scheduler: {max_running_seqs: 4, token_budget: 64}
shutdown_grace_s: 1
)";

struct NodeInfo {
  std::string role, name, grpc, http;
  pid_t pid = -1;
};

// `pdctl up` and what it printed.
struct Cluster {
  std::unique_ptr<Process> pdctl;
  std::string grpc, http;
  std::vector<NodeInfo> nodes;

  const NodeInfo* Find(const std::string& name) const {
    for (const NodeInfo& n : nodes) {
      if (n.name == name) return &n;
    }
    return nullptr;
  }
};

std::unique_ptr<Cluster> StartCluster(const TempDir& dir, const std::string& model, int prefill,
                                      int decode) {
  const std::string config = dir.Write("cluster.yaml", kConfig);
  auto c = std::make_unique<Cluster>();
  c->pdctl = std::make_unique<Process>(std::vector<std::string>{
      PD_BIN_DIR "/pdctl", "up", "--prefill", std::to_string(prefill), "--decode",
      std::to_string(decode), "--config", config, "--model", model, "--grpc-port", "0",
      "--http-port", "0", "--log-dir", dir.Write("logs.keep", "") + ".d"});
  const std::string ready =
      c->pdctl->WaitForLine(std::regex("^pdctl up ready: "), absl::Seconds(60));
  if (ready.empty()) {
    ADD_FAILURE() << "pdctl up did not get ready: " << c->pdctl->Stderr();
    return nullptr;
  }
  std::smatch m;
  PD_CHECK(std::regex_search(ready, m, std::regex(R"(grpc=(\S+) http=(\S+))")));
  c->grpc = m[1].str();
  c->http = m[2].str();
  const std::regex node_re(
      R"(^\s+(prefill|decode)\s+(\S+)\s+pid=(\d+) grpc=(\S+) metrics=(\S+)/metrics)");
  for (int i = 0; i < prefill + decode; ++i) {
    const std::string line = c->pdctl->WaitForLine(node_re, absl::Seconds(5));
    PD_CHECK(std::regex_search(line, m, node_re));
    c->nodes.push_back(NodeInfo{m[1].str(), m[2].str(), m[4].str(), m[5].str(),
                                static_cast<pid_t>(std::stoi(m[3].str()))});
  }
  return c;
}

pdserve::v1::GenerateRequest GreedyRequest(const std::string& text, int max_tokens) {
  pdserve::v1::GenerateRequest req;
  auto* msg = req.mutable_messages()->add_messages();
  msg->set_role("user");
  msg->set_content(text);
  req.set_max_tokens(max_tokens);
  req.set_ignore_eos(true);
  req.mutable_sampling()->set_temperature(0);
  req.mutable_stream_options()->set_include_token_ids(true);
  return req;
}

struct Result {
  grpc::Status status;
  std::vector<int32_t> ids;
  std::string text;
  std::optional<pdserve::v1::Finish> finish;
};

// Runs `req` on `address`; `on_token` (may be null) sees the ids received so far after each
// message.
Result Generate(const std::string& address, const pdserve::v1::GenerateRequest& req,
                const std::function<void(const std::vector<int32_t>&)>& on_token = nullptr) {
  auto stub =
      pdserve::v1::Chat::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto reader = stub->Generate(&ctx, req);
  Result r;
  pdserve::v1::GenerateResponse resp;
  while (reader->Read(&resp)) {
    if (resp.has_delta()) {
      r.ids.insert(r.ids.end(), resp.delta().token_ids().begin(), resp.delta().token_ids().end());
      r.text += resp.delta().text();
      if (on_token) on_token(r.ids);
    }
    if (resp.has_finish()) r.finish = resp.finish();
  }
  r.status = reader->Finish();
  return r;
}

pdserve::node::v1::EngineLoad NodeLoad(const std::string& address) {
  auto stub = pdserve::node::v1::Node::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  pdserve::node::v1::EngineLoad load;
  grpc::Status s = stub->Load(&ctx, {}, &load);
  EXPECT_TRUE(s.ok()) << address << ": " << s.error_message();
  return load;
}

// Every live decode node holds no sequence and all its KV blocks are free (within 3 s).
void ExpectKvBackToBaseline(const Cluster& c, const std::vector<std::string>& skip = {}) {
  for (const NodeInfo& n : c.nodes) {
    if (n.role != "decode" || std::find(skip.begin(), skip.end(), n.name) != skip.end()) continue;
    const absl::Time end = absl::Now() + absl::Seconds(3);
    pdserve::node::v1::EngineLoad l;
    do {
      l = NodeLoad(n.grpc);
      if (l.running() == 0 && l.waiting() == 0 && l.kv_blocks_free() == l.kv_blocks_total()) break;
      absl::SleepFor(absl::Milliseconds(20));
    } while (absl::Now() < end);
    EXPECT_EQ(l.running(), 0) << n.name;
    EXPECT_GT(l.kv_blocks_total(), 0) << n.name;
    EXPECT_EQ(l.kv_blocks_free(), l.kv_blocks_total()) << n.name;
  }
}

std::string HttpGet(const std::string& url, const std::string& path) {
  httplib::Client cli(url);
  auto res = cli.Get(path);
  return res ? res->body : "";
}

void StopCluster(Cluster& c) {
  c.pdctl->Signal(SIGTERM);
  EXPECT_EQ(c.pdctl->Wait(absl::Seconds(20)), 0) << c.pdctl->Stderr();
  for (const NodeInfo& n : c.nodes) {
    // pdctl waited for its children: none is left running (or as a zombie of ours).
    EXPECT_EQ(kill(n.pid, 0), -1) << n.name << " pid " << n.pid << " still exists";
  }
}

class ClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    tiny_ = new std::string(dir_->Write("tiny.gguf", testing::ServingModelGguf()));
    slow_ = new std::string(dir_->Write("slow.gguf", SlowModelGguf()));
  }
  static void TearDownTestSuite() {
    delete tiny_;
    delete slow_;
    delete dir_;
  }
  static TempDir* dir_;
  static std::string* tiny_;
  static std::string* slow_;
};
TempDir* ClusterTest::dir_ = nullptr;
std::string* ClusterTest::tiny_ = nullptr;
std::string* ClusterTest::slow_ = nullptr;

TEST_F(ClusterTest, PdctlUpOnePrefillOneDecodeAnswersGrpcAndHttp) {
  TempDir dir;
  std::unique_ptr<Cluster> c = StartCluster(dir, *tiny_, 1, 1);
  ASSERT_NE(c, nullptr);
  ASSERT_EQ(c->nodes.size(), 2u);
  EXPECT_EQ(c->nodes[0].role, "prefill");
  EXPECT_EQ(c->nodes[1].role, "decode");

  Result r = Generate(c->grpc, GreedyRequest("hello world", 16));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_TRUE(r.finish.has_value());
  EXPECT_EQ(r.finish->reason(), "length");
  EXPECT_EQ(r.finish->usage().completion_tokens(), 16);
  EXPECT_EQ(r.ids.size(), 16u);

  httplib::Client http(c->http);
  auto res = http.Post(
      "/v1/chat/completions",
      R"({"messages": [{"role": "user", "content": "the cat"}], "max_tokens": 8, "temperature": 0})",
      "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200) << res->body;
  EXPECT_THAT(res->body, HasSubstr("\"chat.completion\""));
  EXPECT_EQ(HttpGet(c->http, "/health"), "{\"status\":\"ok\"}");
  const std::string metrics = HttpGet(c->http, "/metrics");
  EXPECT_THAT(metrics, HasSubstr("pdserve_router_node_healthy{node=\"d0\",role=\"decode\"} 1"));
  EXPECT_THAT(metrics, HasSubstr("pdserve_router_node_healthy{node=\"p0\",role=\"prefill\"} 1"));
  EXPECT_THAT(metrics, HasSubstr("pdserve_router_placements_total{node=\"d0\",role=\"decode\"}"));
  // Each node serves its own /metrics.
  EXPECT_THAT(HttpGet(c->nodes[1].http, "/metrics"), HasSubstr("pdserve_kv_blocks"));
  ExpectKvBackToBaseline(*c);
  StopCluster(*c);
}

TEST_F(ClusterTest, GreedyOutputThroughTheClusterEqualsPdServe) {
  TempDir dir;
  const std::string config = dir.Write("serve.yaml", kConfig);
  Process serve({PD_BIN_DIR "/pd-serve", "--config", config, "--model", *tiny_, "--grpc-port", "0",
                 "--http-port", "0"});
  const std::string ready = serve.WaitForLine(std::regex("^pd-serve ready: "), absl::Seconds(30));
  ASSERT_FALSE(ready.empty()) << serve.Stderr();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(ready, m, std::regex(R"(grpc=(\S+))")));
  const std::string serve_addr = m[1].str();

  std::unique_ptr<Cluster> c = StartCluster(dir, *tiny_, 1, 2);
  ASSERT_NE(c, nullptr);
  for (const char* prompt : {"hello world", "the cat sat on the mat", "a b c"}) {
    SCOPED_TRACE(prompt);
    Result want = Generate(serve_addr, GreedyRequest(prompt, 40));
    Result got = Generate(c->grpc, GreedyRequest(prompt, 40));
    ASSERT_TRUE(want.status.ok()) << want.status.error_message();
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    EXPECT_EQ(got.ids, want.ids);
    EXPECT_EQ(got.text, want.text);
    EXPECT_EQ(got.finish->usage().prompt_tokens(), want.finish->usage().prompt_tokens());
  }
  ExpectKvBackToBaseline(*c);
  StopCluster(*c);
  serve.Signal(SIGTERM);
  EXPECT_EQ(serve.Wait(absl::Seconds(10)), 0);
}

TEST_F(ClusterTest, DecodeNodeKilledMidStreamTheStreamContinuesWithoutGapOrRepeat) {
  TempDir dir;
  std::unique_ptr<Cluster> c = StartCluster(dir, *slow_, 0, 2);
  ASSERT_NE(c, nullptr);
  const int kTokens = 200;
  // The reference: the same greedy request, uninterrupted.
  Result want = Generate(c->grpc, GreedyRequest("hello world", kTokens));
  ASSERT_TRUE(want.status.ok()) << want.status.error_message();
  ASSERT_EQ(want.ids.size(), static_cast<size_t>(kTokens));

  std::string killed;
  size_t tokens_at_kill = 0;
  absl::Time kill_time;
  Result got = Generate(c->grpc, GreedyRequest("hello world", kTokens),
                        [&](const std::vector<int32_t>& ids) {
                          if (!killed.empty() || ids.size() < 10) return;
                          for (const NodeInfo& n : c->nodes) {
                            if (NodeLoad(n.grpc).running() > 0) {
                              kill(n.pid, SIGKILL);
                              killed = n.name;
                              tokens_at_kill = ids.size();
                              kill_time = absl::Now();
                              return;
                            }
                          }
                        });
  ASSERT_FALSE(killed.empty()) << "no decode node was running the request";
  ASSERT_LT(tokens_at_kill, static_cast<size_t>(kTokens)) << "the stream ended before the kill";
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_LT(absl::Now() - kill_time, absl::Seconds(5));
  EXPECT_EQ(got.ids, want.ids);  // every token exactly once, in order
  EXPECT_EQ(got.text, want.text);
  EXPECT_EQ(got.finish->reason(), "length");
  EXPECT_EQ(got.finish->usage().completion_tokens(), kTokens);
  EXPECT_THAT(HttpGet(c->http, "/metrics"), HasSubstr("pdserve_router_retries_total{reason="));
  ExpectKvBackToBaseline(*c, {killed});
  StopCluster(*c);
}

// A hung node (SIGSTOP: its connections stay open, nothing arrives) is evicted by the health
// checks, and the router moves its stream to the other decode node: the request still completes,
// without gap or repeat, within 5 s of the hang.
TEST_F(ClusterTest, HungDecodeNodeMidStreamIsEvictedAndTheStreamMovesOn) {
  TempDir dir;
  std::unique_ptr<Cluster> c = StartCluster(dir, *slow_, 0, 2);
  ASSERT_NE(c, nullptr);
  const int kTokens = 200;
  Result want = Generate(c->grpc, GreedyRequest("the cat", kTokens));
  ASSERT_TRUE(want.status.ok()) << want.status.error_message();

  const NodeInfo* stopped = nullptr;
  absl::Time stop_time;
  Result got =
      Generate(c->grpc, GreedyRequest("the cat", kTokens), [&](const std::vector<int32_t>& ids) {
        if (stopped != nullptr || ids.size() < 10) return;
        for (const NodeInfo& n : c->nodes) {
          if (NodeLoad(n.grpc).running() > 0) {
            kill(n.pid, SIGSTOP);
            stopped = &n;
            stop_time = absl::Now();
            return;
          }
        }
      });
  ASSERT_NE(stopped, nullptr) << "no decode node was running the request";
  const absl::Duration took = absl::Now() - stop_time;
  kill(stopped->pid, SIGCONT);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_LT(took, absl::Seconds(5));
  EXPECT_EQ(got.ids, want.ids);
  EXPECT_EQ(got.finish->usage().completion_tokens(), kTokens);
  EXPECT_THAT(HttpGet(c->http, "/metrics"),
              HasSubstr("pdserve_router_retries_total{reason=\"node_failed\"} 1"));
  ExpectKvBackToBaseline(*c);  // the resumed node cancelled the abandoned request
  StopCluster(*c);
}

TEST_F(ClusterTest, PrefillNodeKilledRequestsStillComplete) {
  TempDir dir;
  std::unique_ptr<Cluster> c = StartCluster(dir, *tiny_, 1, 1);
  ASSERT_NE(c, nullptr);
  kill(c->Find("p0")->pid, SIGKILL);
  for (int i = 0; i < 3; ++i) {
    Result r = Generate(c->grpc, GreedyRequest("the mat", 12));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.ids.size(), 12u);
  }
  ExpectKvBackToBaseline(*c);
  StopCluster(*c);
}

TEST_F(ClusterTest, DeadDecodeNodeIsEvictedWithinTwoSecondsAndWorkGoesElsewhere) {
  TempDir dir;
  std::unique_ptr<Cluster> c = StartCluster(dir, *tiny_, 0, 2);
  ASSERT_NE(c, nullptr);
  const std::string healthy = "pdserve_router_node_healthy{node=\"d1\",role=\"decode\"} 1";
  const std::string evicted = "pdserve_router_node_healthy{node=\"d1\",role=\"decode\"} 0";
  ASSERT_THAT(HttpGet(c->http, "/metrics"), HasSubstr(healthy));
  kill(c->Find("d1")->pid, SIGKILL);
  const absl::Time killed = absl::Now();
  absl::Duration took = absl::InfiniteDuration();
  while (absl::Now() - killed < absl::Seconds(5)) {
    if (HttpGet(c->http, "/metrics").find(evicted) != std::string::npos) {
      took = absl::Now() - killed;
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_LT(took, absl::Seconds(2));
  // Every request now lands on d0 and completes.
  for (int i = 0; i < 4; ++i) {
    Result r = Generate(c->grpc, GreedyRequest("hello", 8));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  }
  ExpectKvBackToBaseline(*c, {"d1"});
  StopCluster(*c);
}

}  // namespace
}  // namespace pd::router
