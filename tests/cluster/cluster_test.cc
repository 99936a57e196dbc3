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
#include <thread>
#include <vector>

#include "common/grpc_tls.h"
#include "common/strings.h"
#include "common/tls_certs.h"
#include "pdserve/node/v1/node.grpc.pb.h"
#include "pdserve/v1/chat.grpc.pb.h"
#include "tests/cluster/cluster_testing.h"

namespace pd::router {
namespace {

using ::pd::testing::Process;
using ::pd::testing::TempDir;
using ::testing::HasSubstr;


class ClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    tiny_ = new std::string(dir_->Write("tiny.gguf", frontend::testing::ServingModelGguf()));
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

// `pdctl up --tls`: a throwaway CA, mutual TLS between router and nodes, TLS on the router's APIs.
// A prompt takes the whole disaggregated path (router -> prefill node -> KV push -> decode node);
// a caller without a certificate from the cluster's CA is refused at the handshake by every node.
TEST_F(ClusterTest, MutualTlsClusterServesAndRefusesUnauthenticatedCallers) {
  TempDir dir;
  std::unique_ptr<Cluster> c = StartCluster(dir, *tiny_, 1, 1, "", {}, {"--tls"});
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->http.rfind("https://", 0), 0u) << c->http;
  const std::string tls = LogDir(dir) + "/tls";
  auto public_creds = GrpcChannelCredentials({"", "", tls + "/ca.pem"});
  ASSERT_TRUE(public_creds.ok());
  Result r = Generate(c->grpc, GreedyRequest("hello world", 12), nullptr, *public_creds);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.ids.size(), 12u);
  // The same request in plaintext is refused by the router.
  EXPECT_FALSE(Generate(c->grpc, GreedyRequest("hello world", 2)).status.ok());
  // HTTPS with the CA; the prompt went through the prefill node.
  httplib::Client https(c->http);
  https.set_ca_cert_path((tls + "/ca.pem").c_str());
  https.enable_server_certificate_verification(true);
  auto metrics = https.Get("/metrics");
  ASSERT_TRUE(metrics) << httplib::to_string(metrics.error());
  EXPECT_THAT(metrics->body,
              HasSubstr("pdserve_router_placements_total{node=\"p0\",role=\"prefill\"} 1"));

  const TempDir other;
  ASSERT_TRUE(WriteLocalCluster(other.path() + "/ca", {"intruder"}).ok());
  for (const NodeInfo& n : c->nodes) {
    pdserve::node::v1::EngineLoad load;
    // A daemon of the cluster (its certificate) is let in.
    auto member = GrpcChannelCredentials(
        {StrCat(tls, "/router.pem"), StrCat(tls, "/router.key"), tls + "/ca.pem"});
    ASSERT_TRUE(member.ok());
    EXPECT_TRUE(TryNodeLoad(n.grpc, &load, *member).ok()) << n.name;
    // Plaintext, TLS without a client certificate, and a certificate from another CA are not.
    EXPECT_EQ(TryNodeLoad(n.grpc, &load, grpc::InsecureChannelCredentials()).error_code(),
              grpc::StatusCode::UNAVAILABLE)
        << n.name;
    auto anonymous = GrpcChannelCredentials({"", "", tls + "/ca.pem"});
    EXPECT_EQ(TryNodeLoad(n.grpc, &load, *anonymous).error_code(), grpc::StatusCode::UNAVAILABLE)
        << n.name;
    auto intruder = GrpcChannelCredentials({other.path() + "/ca/intruder.pem",
                                            other.path() + "/ca/intruder.key", tls + "/ca.pem"});
    EXPECT_EQ(TryNodeLoad(n.grpc, &load, *intruder).error_code(), grpc::StatusCode::UNAVAILABLE)
        << n.name;
  }
  StopCluster(*c);
}

// A daemon started by hand; returns its ready line's "grpc=" address ("" on failure).
std::string StartDaemon(Process& p, const std::string& what) {
  const std::string ready = p.WaitForLine(std::regex(" ready: "), absl::Seconds(30));
  std::smatch m;
  if (!std::regex_search(ready, m, std::regex(R"(grpc=(\S+))"))) {
    ADD_FAILURE() << what << " did not get ready: " << p.Stderr();
    return "";
  }
  return m[1].str();
}

// A prefill node started with another model than the decode node and the router: the router
// never gives it work (and logs why), requests are still served (the decode node prefills), and
// a descriptor from the decode node is refused by the prefill node before it computes anything.
TEST_F(ClusterTest, ANodeWithAnotherModelIsRefusedNotSilentlyDecoded) {
  TempDir dir;
  const std::string config =
      dir.Write("cluster.yaml", StrCat(kConfig, "router: {disaggregate_min_prompt: 0}\n"));
  Process decode({PD_BIN_DIR "/pd-decode", "--config", config, "--model", *tiny_, "--grpc-host",
                  "127.0.0.1", "--grpc-port", "0", "--http-port", "0"});
  Process prefill({PD_BIN_DIR "/pd-prefill", "--config", config, "--model", *slow_,
                   "--grpc-host", "127.0.0.1", "--grpc-port", "0", "--http-port", "0"});
  const std::string d = StartDaemon(decode, "pd-decode");
  const std::string p = StartDaemon(prefill, "pd-prefill");
  ASSERT_FALSE(d.empty());
  ASSERT_FALSE(p.empty());
  // p0 never turns healthy: the router's ready line waits for it --wait-ready seconds.
  Process router({PD_BIN_DIR "/pd-router", "--config", config, "--model", *tiny_, "--grpc-port",
                  "0", "--http-port", "0", "--wait-ready", "2", "--node", StrCat("d0=decode@", d),
                  "--node", StrCat("p0=prefill@", p)});
  const std::string r = StartDaemon(router, "pd-router");
  ASSERT_FALSE(r.empty());
  Result res = Generate(r, GreedyRequest("hello world", 6));
  ASSERT_TRUE(res.status.ok()) << res.status.error_message();
  EXPECT_EQ(res.ids.size(), 6u);
  std::string log;
  for (absl::Time end = absl::Now() + absl::Seconds(5);
       log.find("runs another model") == std::string::npos && absl::Now() < end;) {
    log += router.Stderr();
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_THAT(log, HasSubstr("node p0 (" + p + ") refused: runs another model"));

  // The decode node's reservation, handed to the prefill node directly: refused, naming both.
  auto dstub = pdserve::node::v1::Decode::NewStub(
      grpc::CreateChannel(d, grpc::InsecureChannelCredentials()));
  pdserve::node::v1::ReserveRequest rreq;
  rreq.mutable_request()->set_request_id("mixed");
  rreq.mutable_request()->add_prompt(1);
  rreq.mutable_request()->add_prompt(2);
  rreq.mutable_request()->set_max_tokens(2);
  rreq.mutable_request()->mutable_sampling()->set_top_p(1);
  rreq.mutable_request()->mutable_sampling()->set_repetition_penalty(1);
  rreq.set_deadline_s(5);
  pdserve::node::v1::ReserveResponse rresp;
  grpc::ClientContext rctx;
  const grpc::Status reserved = dstub->Reserve(&rctx, rreq, &rresp);
  ASSERT_TRUE(reserved.ok()) << reserved.error_message();
  ASSERT_TRUE(rresp.has_kv());
  auto pstub = pdserve::node::v1::Prefill::NewStub(
      grpc::CreateChannel(p, grpc::InsecureChannelCredentials()));
  pdserve::node::v1::PrefillRequest preq;
  preq.set_request_id("mixed");
  preq.add_prompt(1);
  preq.add_prompt(2);
  *preq.mutable_sampling() = rreq.request().sampling();
  *preq.mutable_kv() = rresp.kv();
  pdserve::node::v1::PrefillResponse presp;
  grpc::ClientContext pctx;
  const grpc::Status st = pstub->Prefill(&pctx, preq, &presp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(st.error_message(), HasSubstr("runs another model"));
  for (Process* proc : {&router, &prefill, &decode}) {
    proc->Signal(SIGTERM);
    EXPECT_EQ(proc->Wait(absl::Seconds(20)), 0) << proc->Stderr();
  }
}

// `make run`'s demo: `pdctl up --complete` continues a prompt through the router's OpenAI API,
// prints it with its timing, and stops the cluster; --chat and --complete exclude each other.
TEST_F(ClusterTest, PdctlUpCompleteContinuesAPromptAndStops) {
  TempDir dir;
  const std::string config = dir.Write("cluster.yaml", kConfig);
  Process up({PD_BIN_DIR "/pdctl", "up", "--prefill", "1", "--decode", "1", "--config", config,
              "--model", *tiny_, "--complete", "hello world", "-n", "6", "--log-dir",
              dir.Write("logs.keep", "") + ".d"});
  const std::regex timing(
      R"(^\((\d+) tokens; first token after \d+ ms; [\d.]+ tokens/s after it\)$)");
  const std::string line = up.WaitForLine(timing, absl::Seconds(90));
  ASSERT_FALSE(line.empty()) << up.Stderr();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(line, m, timing));
  EXPECT_GE(std::stoi(m[1].str()), 1);
  EXPECT_LE(std::stoi(m[1].str()), 6);
  EXPECT_EQ(up.Wait(absl::Seconds(30)), 0) << up.Stderr();

  Process both({PD_BIN_DIR "/pdctl", "up", "--chat", "hi", "--complete", "hello"});
  EXPECT_NE(both.Wait(absl::Seconds(10)), 0);
  EXPECT_THAT(both.Stderr(), HasSubstr("excludes"));
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
  // Every prompt ran on the prefill node and its KV was pushed to a decode node.
  EXPECT_THAT(HttpGet(c->http, "/metrics"),
              HasSubstr("pdserve_router_prefill_path_total{path=\"kv_transfer\"} 3"));
  const std::string pm = HttpGet(c->nodes[0].http, "/metrics");
  EXPECT_THAT(pm, HasSubstr("pdserve_kv_transfer_seconds_count 3"));
  EXPECT_THAT(pm, ::testing::Not(HasSubstr("pdserve_kv_transfer_bytes_total 0\n")));
  int received = 0;
  for (const NodeInfo& n : c->nodes) {
    if (n.role != "decode") continue;
    std::smatch mm;
    const std::string dm = HttpGet(n.http, "/metrics");
    if (std::regex_search(dm, mm,
                          std::regex(R"re(pdserve_kv_transfer_received_total\{result="ok"\} (\d+))re"))) {
      received += std::stoi(mm[1].str());
    }
  }
  EXPECT_EQ(received, 3);
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

double SumOverDecodeNodes(const Cluster& c, const std::string& series) {
  double sum = 0;
  for (const NodeInfo& n : c.nodes) {
    if (n.role == "decode") sum += Metric(HttpGet(n.http, "/metrics"), series);
  }
  return sum;
}

// With the default router.disaggregate_min_prompt (512), a chat-sized prompt is prefilled by the
// decode node itself: no reservation, no transfer, and the prefill node stays idle.
TEST_F(ClusterTest, ShortPromptsArePrefilledByTheDecodeNodeByDefault) {
  TempDir dir;
  std::unique_ptr<Cluster> c = StartClusterWithConfig(dir, kConfig, *tiny_, 1, 1);
  ASSERT_NE(c, nullptr);
  Result r = Generate(c->grpc, GreedyRequest("the cat sat on the mat", 8));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.ids.size(), 8u);
  const std::string rm = HttpGet(c->http, "/metrics");
  EXPECT_EQ(Metric(rm, "pdserve_router_prefill_path_total{path=\"decode_local\"}"), 1);
  EXPECT_EQ(Metric(rm, "pdserve_router_prefill_path_total{path=\"kv_transfer\"}"), 0);
  EXPECT_EQ(Metric(HttpGet(c->nodes[0].http, "/metrics"), "pdserve_kv_transfer_seconds_count"), 0);
  ExpectKvBackToBaseline(*c);
  StopCluster(*c);
}

// The reference: the same greedy requests on a cluster without prefill nodes (decode nodes
// prefill themselves; GreedyOutputThroughTheClusterEqualsPdServe ties that to pd-serve).
std::vector<std::vector<int32_t>> Reference(const TempDir& dir, const std::string& model,
                                            const std::vector<std::string>& prompts,
                                            int max_tokens) {
  std::unique_ptr<Cluster> c = StartCluster(dir, model, 0, 1);
  std::vector<std::vector<int32_t>> out;
  if (c == nullptr) return out;
  for (const std::string& p : prompts) {
    Result r = Generate(c->grpc, GreedyRequest(p, max_tokens));
    EXPECT_TRUE(r.status.ok()) << r.status.error_message();
    out.push_back(r.ids);
  }
  StopCluster(*c);
  return out;
}

// A corrupted layer (checksum mismatch on the decode node) or a truncated one: the transfer
// fails, the decode node prefills locally, the client sees the same greedy output, no KV leaks.
TEST_F(ClusterTest, CorruptOrShortKvTransferFallsBackToLocalPrefill) {
  const std::vector<std::string> prompts = {"hello world", "the cat sat on the mat"};
  TempDir ref_dir;
  const auto want = Reference(ref_dir, *tiny_, prompts, 16);
  ASSERT_EQ(want.size(), prompts.size());
  for (const char* fault : {"corrupt_layer=1", "truncate_layer=0"}) {
    SCOPED_TRACE(fault);
    TempDir dir;
    std::unique_ptr<Cluster> c =
        StartCluster(dir, *tiny_, 1, 1, "", {StrCat("PDSERVE_TEST_KV_FAULTS=", fault)});
    ASSERT_NE(c, nullptr);
    for (size_t i = 0; i < prompts.size(); ++i) {
      const absl::Time t0 = absl::Now();
      Result r = Generate(c->grpc, GreedyRequest(prompts[i], 16));
      ASSERT_TRUE(r.status.ok()) << r.status.error_message();
      EXPECT_EQ(r.ids, want[i]);
      EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
    }
    const std::string rm = HttpGet(c->http, "/metrics");
    EXPECT_EQ(Metric(rm, "pdserve_router_prefill_path_total{path=\"transfer_fallback\"}"), 2);
    EXPECT_EQ(Metric(rm, "pdserve_router_prefill_path_total{path=\"kv_transfer\"}"), 0);
    EXPECT_EQ(SumOverDecodeNodes(*c, "pdserve_kv_transfer_received_total{result=\"ok\"}"), 0);
    EXPECT_EQ(SumOverDecodeNodes(*c, "pdserve_kv_reservations"), 0);
    ExpectKvBackToBaseline(*c);
    StopCluster(*c);
  }
}

// A transfer that stalls (the prefill node stops sending after the first layer) ends at its deadline
// (router.kv_transfer_timeout_ms) and the decode node prefills: the request completes, correct,
// within the deadline plus a little.
TEST_F(ClusterTest, StalledKvTransferEndsAtItsDeadlineAndTheDecodeNodePrefills) {
  TempDir ref_dir;
  const auto want = Reference(ref_dir, *tiny_, {"a stalled transfer"}, 12);
  ASSERT_EQ(want.size(), 1u);
  TempDir dir;
  std::unique_ptr<Cluster> c =
      StartCluster(dir, *tiny_, 1, 1, "kv_transfer_timeout_ms: 800",
                   {"PDSERVE_TEST_KV_FAULTS=stall_after_layers=1"});
  ASSERT_NE(c, nullptr);
  const absl::Time t0 = absl::Now();
  Result r = Generate(c->grpc, GreedyRequest("a stalled transfer", 12));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.ids, want[0]);
  EXPECT_LT(absl::Now() - t0, absl::Seconds(4));
  EXPECT_EQ(Metric(HttpGet(c->http, "/metrics"),
                   "pdserve_router_prefill_path_total{path=\"transfer_fallback\"}"),
            1);
  ExpectKvBackToBaseline(*c);
  StopCluster(*c);
}

// INT8 on the wire: every transfer succeeds and moves about half the bytes of f16.
TEST_F(ClusterTest, Int8WireMovesAboutHalfTheBytes) {
  double bytes[2] = {0, 0};
  int i = 0;
  for (const char* wire : {"f16", "int8"}) {
    SCOPED_TRACE(wire);
    TempDir dir;
    std::unique_ptr<Cluster> c =
        StartCluster(dir, *tiny_, 1, 1, StrCat("kv_wire: ", wire));
    ASSERT_NE(c, nullptr);
    Result r = Generate(c->grpc, GreedyRequest("the cat sat on the mat and looked around", 8));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.ids.size(), 8u);
    EXPECT_EQ(Metric(HttpGet(c->http, "/metrics"),
                     "pdserve_router_prefill_path_total{path=\"kv_transfer\"}"),
              1);
    bytes[i++] = Metric(HttpGet(c->nodes[0].http, "/metrics"), "pdserve_kv_transfer_bytes_total");
    ExpectKvBackToBaseline(*c);
    StopCluster(*c);
  }
  ASSERT_GT(bytes[0], 0);
  // INT8 values plus an f32 scale per token and head: (head_dim + 4) / (2 * head_dim), 0.625
  // for the tiny model's head_dim of 16 (0.508 for Gemma 3's 256).
  EXPECT_LT(bytes[1] / bytes[0], 0.65);
  EXPECT_GT(bytes[1] / bytes[0], 0.45);
}

// kill -9 of the only prefill node while it computes a long prompt: the router attaches to the
// reservation without a first token and the decode node prefills; the stream is complete and
// correct, the decode node's KV returns to baseline.
TEST_F(ClusterTest, PrefillNodeKilledDuringAPromptTheDecodeNodeTakesOver) {
  std::string prompt;
  for (int i = 0; i < 11; ++i) prompt += "the cat sat on the mat and ";  // ~220 of 256 tokens
  TempDir dir;
  // Without prefix caches: the second run of the prompt must be computed again, slowly enough
  // to be caught pending on the prefill node.
  std::unique_ptr<Cluster> c = StartClusterWithConfig(
      dir,
      StrCat(kConfig, "prefix_cache: {enabled: false}\nrouter: {disaggregate_min_prompt: 0}\n"),
      *slow_, 1, 1);
  ASSERT_NE(c, nullptr);
  Result want = Generate(c->grpc, GreedyRequest(prompt, 12));  // through the prefill node
  ASSERT_TRUE(want.status.ok()) << want.status.error_message();
  ASSERT_EQ(want.ids.size(), 12u);

  Result got;
  std::thread client([&] { got = Generate(c->grpc, GreedyRequest(prompt, 12)); });
  const NodeInfo* p0 = c->Find("p0");
  bool killed = false;
  for (absl::Time end = absl::Now() + absl::Seconds(10); absl::Now() < end && !killed;) {
    if (NodeLoad(p0->grpc).pending_prefill_tokens() > 0) {
      kill(p0->pid, SIGKILL);
      killed = true;
    }
  }
  const absl::Time killed_at = absl::Now();
  client.join();
  ASSERT_TRUE(killed) << "the prefill node never had the prompt pending";
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.ids, want.ids);
  EXPECT_LT(absl::Now() - killed_at, absl::Seconds(5));
  EXPECT_GE(Metric(HttpGet(c->http, "/metrics"),
                   "pdserve_router_prefill_path_total{path=\"transfer_fallback\"}"),
            1);
  ExpectKvBackToBaseline(*c);
  StopCluster(*c);
}

// A dead prefill node among two: requests that reach it before it is evicted are prefilled on
// the other one with a fresh reservation; every request completes through a KV transfer.
TEST_F(ClusterTest, DeadPrefillNodeTheOtherPrefillNodeTakesItsWork) {
  TempDir dir;
  std::unique_ptr<Cluster> c = StartCluster(dir, *tiny_, 2, 1);
  ASSERT_NE(c, nullptr);
  kill(c->Find("p0")->pid, SIGKILL);
  for (int i = 0; i < 4; ++i) {
    Result r = Generate(c->grpc, GreedyRequest("the mat", 10));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.ids.size(), 10u);
  }
  EXPECT_EQ(Metric(HttpGet(c->http, "/metrics"),
                   "pdserve_router_prefill_path_total{path=\"kv_transfer\"}"),
            4);
  ExpectKvBackToBaseline(*c);
  StopCluster(*c);
}

// KV-aware routing (docs/cluster.md): turn 1 of a chat, long enough for the prefill node, lands
// on a decode node that files the imported blocks; turn 2 (the same conversation plus a short
// message) goes to that node, is prefilled there on top of its cache and says so in usage; when
// that node dies, turn 3 still completes elsewhere (the cache is lost, nothing else).
TEST_F(ClusterTest, ChatTurnsFollowTheirCachedPrefixAndSurviveTheNodeDying) {
  TempDir dir;
  std::unique_ptr<Cluster> c = StartClusterWithConfig(
      dir, StrCat(kConfig, "router: {disaggregate_min_prompt: 100}\n"), *tiny_, 1, 2);
  ASSERT_NE(c, nullptr);
  std::string words;
  for (int i = 0; i < 40; ++i) words += (i ? " " : "") + std::string(i % 2 ? "cat" : "mat");
  pdserve::v1::GenerateRequest turn = GreedyRequest(words, 6);
  Result r1 = Generate(c->grpc, turn);
  ASSERT_TRUE(r1.status.ok()) << r1.status.error_message();
  ASSERT_TRUE(r1.finish.has_value());
  const int prompt1 = r1.finish->usage().prompt_tokens();
  ASSERT_GE(prompt1, 100);
  std::string rm = HttpGet(c->http, "/metrics");
  EXPECT_EQ(Metric(rm, "pdserve_router_prefill_path_total{path=\"kv_transfer\"}"), 1);
  // The node's summary reaches the router with its next poll (250 ms).
  absl::SleepFor(absl::Milliseconds(700));

  auto* assistant = turn.mutable_messages()->add_messages();
  assistant->set_role("assistant");
  assistant->set_content(r1.text);
  auto* next = turn.mutable_messages()->add_messages();
  next->set_role("user");
  next->set_content("the cat");
  Result r2 = Generate(c->grpc, turn);
  ASSERT_TRUE(r2.status.ok()) << r2.status.error_message();
  ASSERT_TRUE(r2.finish.has_value());
  EXPECT_EQ(r2.ids.size(), 6u);
  // Turn 1's prompt rows below L - L % 4, in whole blocks of 16.
  EXPECT_GE(r2.finish->usage().cached_tokens(), (prompt1 - 3) / 16 * 16);
  EXPECT_LT(r2.finish->usage().cached_tokens(), r2.finish->usage().prompt_tokens());
  rm = HttpGet(c->http, "/metrics");
  EXPECT_EQ(Metric(rm, "pdserve_router_prefill_path_total{path=\"decode_local\"}"), 1)
      << "turn 1: " << prompt1 << " tokens; turn 2: " << r2.finish->usage().prompt_tokens()
      << ", cached " << r2.finish->usage().cached_tokens();
  const double d0 = Metric(rm, "pdserve_router_placements_total{node=\"d0\",role=\"decode\"}");
  const double d1 = Metric(rm, "pdserve_router_placements_total{node=\"d1\",role=\"decode\"}");
  EXPECT_TRUE((d0 == 2 && d1 == 0) || (d0 == 0 && d1 == 2)) << d0 << " " << d1;
  const std::string holder = d0 == 2 ? "d0" : "d1";
  EXPECT_GT(Metric(HttpGet(c->Find(holder)->http, "/metrics"), "pdserve_prefix_cache_blocks"), 0);

  kill(c->Find(holder)->pid, SIGKILL);
  absl::SleepFor(absl::Milliseconds(1500));  // evicted after two failed polls
  next = turn.mutable_messages()->add_messages();
  next->set_role("assistant");
  next->set_content(r2.text);
  next = turn.mutable_messages()->add_messages();
  next->set_role("user");
  next->set_content("the mat");
  Result r3 = Generate(c->grpc, turn);
  ASSERT_TRUE(r3.status.ok()) << r3.status.error_message();
  EXPECT_EQ(r3.ids.size(), 6u);
  ExpectKvBackToBaseline(*c, {holder});
  c->pdctl->Signal(SIGTERM);
  c->pdctl->Wait(absl::Seconds(20));
}

// With every prompt sent to the prefill node (disaggregate_min_prompt 0), a next turn travels
// only as the blocks its decode node lacks (the descriptor's first_block): fewer KV bytes than
// turn 1 although the prompt is longer, and the same greedy tokens as a cluster without caches.
TEST_F(ClusterTest, ANextTurnPushesOnlyTheBlocksTheDecodeNodeLacks) {
  std::vector<int32_t> turn2_ids[2];
  double bytes[2][2] = {};
  for (int cache = 0; cache < 2; ++cache) {
    TempDir dir;
    std::unique_ptr<Cluster> c = StartClusterWithConfig(
        dir,
        StrCat(kConfig, "router: {disaggregate_min_prompt: 0}\nprefix_cache: {enabled: ",
               cache ? "true" : "false", "}\n"),
        *tiny_, 1, 1);
    ASSERT_NE(c, nullptr);
    std::string words;
    for (int i = 0; i < 40; ++i) words += (i ? " " : "") + std::string(i % 3 ? "cat" : "mat");
    pdserve::v1::GenerateRequest turn = GreedyRequest(words, 6);
    Result r1 = Generate(c->grpc, turn);
    ASSERT_TRUE(r1.status.ok()) << r1.status.error_message();
    const std::string p0 = c->Find("p0")->http;
    bytes[cache][0] = Metric(HttpGet(p0, "/metrics"), "pdserve_kv_transfer_bytes_total");
    absl::SleepFor(absl::Milliseconds(500));
    auto* assistant = turn.mutable_messages()->add_messages();
    assistant->set_role("assistant");
    assistant->set_content(r1.text);
    auto* next = turn.mutable_messages()->add_messages();
    next->set_role("user");
    next->set_content("the cat sat");
    Result r2 = Generate(c->grpc, turn);
    ASSERT_TRUE(r2.status.ok()) << r2.status.error_message();
    ASSERT_TRUE(r2.finish.has_value());
    EXPECT_EQ(r2.finish->usage().cached_tokens() > 0, cache == 1);
    bytes[cache][1] =
        Metric(HttpGet(p0, "/metrics"), "pdserve_kv_transfer_bytes_total") - bytes[cache][0];
    turn2_ids[cache] = r2.ids;
    EXPECT_EQ(Metric(HttpGet(c->http, "/metrics"),
                     "pdserve_router_prefill_path_total{path=\"kv_transfer\"}"),
              2);
    ExpectKvBackToBaseline(*c);
    StopCluster(*c);
  }
  EXPECT_EQ(turn2_ids[1], turn2_ids[0]);
  EXPECT_GT(bytes[0][1], bytes[0][0]);      // no cache: the longer prompt, all of it
  EXPECT_LT(bytes[1][1], bytes[1][0] / 2);  // cache: only the blocks after turn 1's
  EXPECT_EQ(bytes[1][0], bytes[0][0]);      // turn 1 is the same either way
}

// A decode node that holds a prompt prefix the prefill node lacks (turn 1 was short, so the decode
// node prefilled it itself) hands it over: the prefill node fetches those blocks with
// Decode.SendPrefix and computes only the rest. The greedy tokens are those of a cluster without
// caches, of one whose prefill node computes the prefix itself (prefix_pull off), and of one whose
// transfers are all corrupted (the pull fails and the prefix is computed; the push fails and the
// decode node prefills).
TEST_F(ClusterTest, APrefillNodePullsThePrefixOnlyTheDecodeNodeHolds) {
  enum { kNoCache, kNoPull, kPull, kCorrupt, kVariants };
  std::vector<int32_t> turn2_ids[kVariants];
  for (int variant = 0; variant < kVariants; ++variant) {
    SCOPED_TRACE(StrCat("variant ", variant));
    TempDir dir;
    std::vector<std::string> env;
    if (variant == kCorrupt) env.push_back("PDSERVE_TEST_KV_FAULTS=corrupt_layer=1");
    std::unique_ptr<Cluster> c = StartClusterWithConfig(
        dir,
        StrCat(kConfig, "router: {disaggregate_min_prompt: 48}\nprefix_cache: {enabled: ",
               variant != kNoCache ? "true" : "false", "}\nkv_transfer: {prefix_pull: ",
               variant != kNoPull ? "true" : "false", ", prefix_pull_min_tokens: 16}\n"),
        *tiny_, 1, 1, env);
    ASSERT_NE(c, nullptr);
    // Turn 1 is under disaggregate_min_prompt: the decode node prefills it and files its blocks.
    pdserve::v1::GenerateRequest turn = GreedyRequest("the cat sat on the mat by the door", 4);
    Result r1 = Generate(c->grpc, turn);
    ASSERT_TRUE(r1.status.ok()) << r1.status.error_message();
    absl::SleepFor(absl::Milliseconds(300));
    auto* assistant = turn.mutable_messages()->add_messages();
    assistant->set_role("assistant");
    assistant->set_content(r1.text);
    std::string words;
    for (int i = 0; i < 24; ++i) words += (i ? " " : "") + std::string(i % 4 ? "dog" : "sat");
    auto* next = turn.mutable_messages()->add_messages();
    next->set_role("user");
    next->set_content(words);
    Result r2 = Generate(c->grpc, turn);
    ASSERT_TRUE(r2.status.ok()) << r2.status.error_message();
    ASSERT_TRUE(r2.finish.has_value());
    turn2_ids[variant] = r2.ids;
    const std::string router = HttpGet(c->http, "/metrics");
    EXPECT_EQ(Metric(router, "pdserve_router_prefill_path_total{path=\"decode_local\"}"), 1);
    EXPECT_EQ(Metric(router, variant == kCorrupt
                                 ? "pdserve_router_prefill_path_total{path=\"transfer_fallback\"}"
                                 : "pdserve_router_prefill_path_total{path=\"kv_transfer\"}"),
              1);
    const std::string p0 = HttpGet(c->Find("p0")->http, "/metrics");
    if (variant == kPull) {
      EXPECT_EQ(Metric(p0, "pdserve_kv_prefix_pulls_total{result=\"ok\"}"), 1) << p0;
      EXPECT_GE(Metric(p0, "pdserve_kv_prefix_pull_tokens_total"), 16);
      EXPECT_EQ(Metric(router, "pdserve_router_ttft_phase_seconds_count{phase=\"prefix_pull\"}"),
                1);
    } else if (variant == kCorrupt) {
      EXPECT_EQ(Metric(p0, "pdserve_kv_prefix_pulls_total{result=\"DATA_LOSS\"}"), 1) << p0;
    } else {
      EXPECT_THAT(p0, ::testing::Not(HasSubstr("pdserve_kv_prefix_pulls_total{")));
    }
    // With caches, turn 1's whole blocks were not sent again (the decode node held them).
    if (variant != kCorrupt) {
      EXPECT_EQ(r2.finish->usage().cached_tokens() > 0, variant != kNoCache);
    }
    ExpectKvBackToBaseline(*c);
    StopCluster(*c);
  }
  for (int variant = 1; variant < kVariants; ++variant) {
    EXPECT_EQ(turn2_ids[variant], turn2_ids[kNoCache]) << "variant " << variant;
  }
}

}  // namespace
}  // namespace pd::router
