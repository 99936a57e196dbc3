// Cluster membership through a real etcd (docs/cluster.md, "etcd membership"): an etcd on free
// loopback ports with a temporary data dir, a pd-router configured with etcd only (no
// router.nodes), and pd-decode processes that join it by starting up. Checks that a request runs
// through a node that registered itself, that a SIGKILLed node leaves within the lease TTL + 1 s,
// that a SIGTERMed node leaves at once, and that the router keeps its nodes while etcd is down.
// Skipped when etcd is not installed (/usr/bin/etcd, or $PD_ETCD; Debian package etcd-server).
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <regex>
#include <string>
#include <vector>

#include "tests/frontend/serving_testing.h"
#include "tests/testing/process.h"

namespace pd::router {
namespace {

using ::pd::testing::Process;
using ::pd::testing::TempDir;
using ::testing::HasSubstr;

constexpr int kLeaseTtlS = 2;  // etcd's minimum; keeps the test short

std::string EtcdBinary() {
  const char* env = std::getenv("PD_ETCD");
  return env != nullptr ? env : "/usr/bin/etcd";
}

// A port free right now (bound to 0 and closed again): etcd cannot listen on port 0.
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  PD_CHECK(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  PD_CHECK(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  close(fd);
  return ntohs(a.sin_port);
}

// A single-member etcd on loopback.
class Etcd {
 public:
  explicit Etcd(const std::string& data_dir) {
    client_port_ = FreePort();
    int peer_port = FreePort();
    while (peer_port == client_port_) peer_port = FreePort();
    const std::string client = "http://127.0.0.1:" + std::to_string(client_port_);
    const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port);
    process_ = std::make_unique<Process>(
        std::vector<std::string>{EtcdBinary(), "--name", "pd-test", "--data-dir", data_dir,
                                 "--listen-client-urls", client, "--advertise-client-urls", client,
                                 "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                                 "--initial-cluster", "pd-test=" + peer, "--log-level", "warn"});
  }
  // Waits until the gateway answers a range request.
  bool WaitReady(absl::Duration timeout) {
    const absl::Time end = absl::Now() + timeout;
    while (absl::Now() < end) {
      httplib::Client c(endpoint());
      c.set_connection_timeout(std::chrono::milliseconds(200));
      auto r = c.Post("/v3/kv/range", R"({"key":"AA=="})", "application/json");
      if (r && r->status == 200) return true;
      absl::SleepFor(absl::Milliseconds(50));
    }
    return false;
  }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(client_port_); }
  Process& process() { return *process_; }

 private:
  int client_port_ = 0;
  std::unique_ptr<Process> process_;
};

std::string HttpGet(const std::string& url, const std::string& path) {
  httplib::Client cli(url);
  cli.set_read_timeout(std::chrono::seconds(5));
  auto res = cli.Get(path);
  return res ? res->body : "";
}

// The value of one sample of the router's /metrics ("" when absent).
std::string Sample(const std::string& http, const std::string& series) {
  const std::string text = HttpGet(http, "/metrics");
  const size_t at = text.find("\n" + series + " ");
  if (at == std::string::npos) return "";
  const size_t start = at + series.size() + 2;
  return text.substr(start, text.find('\n', start) - start);
}

std::string Member(const std::string& node) {
  return "pdserve_router_node_member{node=\"" + node + "\",role=\"decode\"}";
}
std::string Healthy(const std::string& node) {
  return "pdserve_router_node_healthy{node=\"" + node + "\",role=\"decode\"}";
}

// Polls until `series` reads `value`; returns the time it took, or InfiniteDuration.
absl::Duration WaitForSample(const std::string& http, const std::string& series,
                             const std::string& value, absl::Duration timeout) {
  const absl::Time start = absl::Now();
  while (absl::Now() - start < timeout) {
    if (Sample(http, series) == value) return absl::Now() - start;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::InfiniteDuration();
}

// A chat completion through the router's OpenAI API: the HTTP status and the body.
std::pair<int, std::string> Chat(const std::string& http) {
  httplib::Client cli(http);
  cli.set_read_timeout(std::chrono::seconds(30));
  auto res =
      cli.Post("/v1/chat/completions",
               R"({"model":"tiny","messages":[{"role":"user","content":"hello"}],"max_tokens":6,)"
               R"("temperature":0})",
               "application/json");
  if (!res) return {0, "no answer"};
  return {res->status, res->body};
}

class EtcdClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(access(EtcdBinary().c_str(), X_OK), 0)
        << EtcdBinary()
        << " not found: install etcd (Debian package etcd-server, scripts/setup.sh) or point "
           "PD_ETCD at its binary";
    etcd_ = std::make_unique<Etcd>(dir_.Write("etcd.keep", "") + ".d");
    ASSERT_TRUE(etcd_->WaitReady(absl::Seconds(15))) << etcd_->process().Stderr();
    model_ = dir_.Write("tiny.gguf", frontend::testing::ServingModelGguf());
    config_ = dir_.Write("cluster.yaml", std::string(R"(
model: {id: tiny, chat_template: chatml}
threads: 1
kv: {memory_mib: 8}
scheduler: {max_running_seqs: 4, token_budget: 64}
shutdown_grace_s: 1
etcd:
  endpoints: [")") + etcd_->endpoint() + R"("]
  prefix: /pdserve-test/
  lease_ttl_s: )" + std::to_string(kLeaseTtlS) +
                                             "\n");
  }

  // pd-router with etcd only; returns its HTTP URL.
  std::string StartRouter() {
    router_ = std::make_unique<Process>(
        std::vector<std::string>{PD_BIN_DIR "/pd-router", "--config", config_, "--model", model_,
                                 "--grpc-port", "0", "--http-port", "0"});
    const std::string ready =
        router_->WaitForLine(std::regex("^pd-router ready: "), absl::Seconds(20));
    EXPECT_THAT(ready, HasSubstr("nodes=0")) << router_->Stderr();
    std::smatch m;
    if (!std::regex_search(ready, m, std::regex(R"(http=(\S+))"))) return "";
    return m[1].str();
  }

  std::unique_ptr<Process> StartDecode(const std::string& name) {
    auto p = std::make_unique<Process>(
        std::vector<std::string>{PD_BIN_DIR "/pd-decode", "--config", config_, "--model", model_,
                                 "--grpc-port", "0", "--no-http", "--name", name});
    EXPECT_FALSE(p->WaitForLine(std::regex("^pd-decode ready: "), absl::Seconds(20)).empty())
        << p->Stderr();
    return p;
  }

  void StopRouter() {
    router_->Signal(SIGTERM);
    EXPECT_EQ(router_->Wait(absl::Seconds(15)), 0) << router_->Stderr();
  }

  TempDir dir_;
  std::unique_ptr<Etcd> etcd_;
  std::string model_, config_;
  std::unique_ptr<Process> router_;
};

TEST_F(EtcdClusterTest, NodesJoinByStartingAndLeaveWhenKilledOrDrained) {
  const std::string http = StartRouter();
  ASSERT_FALSE(http.empty());
  // No node yet: the router is up and says so.
  EXPECT_EQ(Chat(http).first, 503);

  std::unique_ptr<Process> d1 = StartDecode("d1");
  ASSERT_LT(WaitForSample(http, Healthy("d1"), "1", absl::Seconds(5)), absl::InfiniteDuration())
      << router_->Stderr();
  auto [status, body] = Chat(http);
  EXPECT_EQ(status, 200) << body;
  EXPECT_THAT(body, HasSubstr(R"("completion_tokens":6)"));
  EXPECT_EQ(Sample(http, R"(pdserve_router_placements_total{node="d1",role="decode"})"), "1");

  std::unique_ptr<Process> d2 = StartDecode("d2");
  ASSERT_LT(WaitForSample(http, Healthy("d2"), "1", absl::Seconds(5)), absl::InfiniteDuration());

  // SIGKILL: nothing revokes the lease; it expires within the TTL.
  d1->Signal(SIGKILL);
  const absl::Duration killed =
      WaitForSample(http, Member("d1"), "0", absl::Seconds(kLeaseTtlS + 5));
  EXPECT_LE(killed, absl::Seconds(kLeaseTtlS + 1)) << router_->Stderr();
  std::printf("SIGKILLed node left the router after %s (lease TTL %d s)\n",
              absl::FormatDuration(killed).c_str(), kLeaseTtlS);
  std::tie(status, body) = Chat(http);
  EXPECT_EQ(status, 200) << body;  // on d2
  EXPECT_EQ(Sample(http, R"(pdserve_router_placements_total{node="d2",role="decode"})"), "1");

  // SIGTERM: the node revokes its lease as it starts draining; the router drops it at once
  // (one etcd poll, 250 ms).
  d2->Signal(SIGTERM);
  const absl::Duration drained = WaitForSample(http, Member("d2"), "0", absl::Seconds(5));
  EXPECT_LE(drained, absl::Seconds(1)) << router_->Stderr();
  std::printf("SIGTERMed node left the router after %s\n", absl::FormatDuration(drained).c_str());
  EXPECT_EQ(d2->Wait(absl::Seconds(10)), 0) << d2->Stderr();
  EXPECT_THAT(d2->Stderr(), HasSubstr("etcd: deregistered /pdserve-test/nodes/decode/d2"));
  EXPECT_EQ(Chat(http).first, 503);

  // A node started again under a known name joins again.
  std::unique_ptr<Process> d1b = StartDecode("d1");
  ASSERT_LT(WaitForSample(http, Member("d1"), "1", absl::Seconds(5)), absl::InfiniteDuration());
  ASSERT_LT(WaitForSample(http, Healthy("d1"), "1", absl::Seconds(5)), absl::InfiniteDuration());
  EXPECT_EQ(Chat(http).first, 200);
  StopRouter();
}

TEST_F(EtcdClusterTest, RouterKeepsItsNodesWhileEtcdIsDown) {
  const std::string http = StartRouter();
  ASSERT_FALSE(http.empty());
  std::unique_ptr<Process> d1 = StartDecode("d1");
  ASSERT_LT(WaitForSample(http, Healthy("d1"), "1", absl::Seconds(5)), absl::InfiniteDuration());

  etcd_->process().Signal(SIGKILL);
  absl::SleepFor(absl::Seconds(kLeaseTtlS + 1));  // longer than the lease: it would have expired
  EXPECT_EQ(Sample(http, Member("d1")), "1");
  EXPECT_EQ(Chat(http).first, 200);
  EXPECT_THAT(router_->Stderr(), HasSubstr("etcd: cannot read /pdserve-test/nodes/"));
  EXPECT_THAT(d1->Stderr(), HasSubstr("etcd: cannot renew the lease"));

  // SIGTERM with etcd down: the node says why it could not deregister and still exits.
  d1->Signal(SIGTERM);
  EXPECT_EQ(d1->Wait(absl::Seconds(10)), 0);
  StopRouter();
}

}  // namespace
}  // namespace pd::router
