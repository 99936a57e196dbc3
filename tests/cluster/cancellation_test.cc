// A client that goes away, in every phase a request passes through the cluster (issue 21): queued
// at the router, queued at a prefill node, in prefill, with its KV pushed to the decode node but
// not yet admitted there, decoding, and with its stream back-pressured (a reader that stopped
// reading). Each test runs `pdctl up` (real pd-router, pd-prefill and pd-decode processes over
// loopback, mutual TLS between them), puts one request into its phase over the router's OpenAI HTTP
// API, hangs up (closes the socket, as a client that dies does), and then measures from the
// hang-up:
//  - the work stops within one engine step + 100 ms: the node that had the request runs and
//    queues nothing for it any more (Node.Load, polled every 2 ms). "One step" is an upper bound
//    read from that node's own step-time histogram (the bucket holding its slowest step so far);
//  - every KV block is free again on both nodes within 1 s (Node.Load's free blocks, and no KV
//    reservation left on the decode node: pdserve_kv_reservations).
// docs/security.md lists these phases with this test.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/strings.h"
#include "tests/cluster/cluster_testing.h"

namespace pd::router {
namespace {

using ::testing::HasSubstr;

// One thread per daemon, one running sequence at a time (so a second request queues), a context
// long enough for prompts whose prefill takes many steps, and a KV transfer deadline far beyond
// the 1 s the tests allow for cleanup (so nothing is freed by merely expiring).
constexpr char kCancelConfig[] = R"(
model: {id: slow, chat_template: chatml}
threads: 1
kv: {memory_mib: 48}
scheduler: {max_running_seqs: 1, token_budget: 64}
shutdown_grace_s: 1
router: {disaggregate_min_prompt: 0, kv_transfer_timeout_ms: 20000}
)";

// A prompt of about `tokens` tokens: "the cat " is 6 tokens of the test vocabulary (whose merges
// stop at "▁t", "h", "e", ...).
std::string Prompt(int tokens) {
  std::string p;
  for (int i = 0; i < tokens / 6; ++i) p += "the cat ";
  return p;
}

// A streaming /v1/completions request over a plain socket, so the test decides when it stops
// reading and how it goes away.
class HttpStream {
 public:
  // `url`: http://127.0.0.1:PORT. `rcvbuf` > 0: the socket's receive buffer (set before connect,
  // so the TCP window stays small and a reader that stops reading back-pressures the server).
  HttpStream(const std::string& url, const std::string& prompt, int max_tokens, int rcvbuf = 0) {
    const size_t colon = url.rfind(':');
    const int port = std::stoi(url.substr(colon + 1));
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    PD_CHECK(fd_ >= 0);
    if (rcvbuf > 0) PD_CHECK(setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf) == 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    PD_CHECK(connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    const std::string body = StrCat(R"({"prompt": ")", prompt, R"(", "max_tokens": )", max_tokens,
                                    R"(, "stream": true, "temperature": 0, "ignore_eos": true})");
    const std::string req = StrCat(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Connection: close\r\nContent-Length: ",
        body.size(), "\r\n\r\n", body);
    PD_CHECK(send(fd_, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size()));
  }
  ~HttpStream() { Close(); }

  // Reads until `n` SSE events arrived in all, the server ended the response, or `timeout`.
  // Returns the events read so far: n or more once satisfied, since one read can carry several.
  int ReadEvents(int n, absl::Duration timeout = absl::Seconds(30)) {
    const absl::Time end = absl::Now() + timeout;
    while (events_ < n && !eof_ && absl::Now() < end) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 20) <= 0) continue;
      char buf[4096];
      const ssize_t got = recv(fd_, buf, sizeof buf, 0);
      if (got <= 0) {
        eof_ = true;
        break;
      }
      data_.append(buf, static_cast<size_t>(got));
      size_t at;
      while ((at = data_.find("data: ", scanned_)) != std::string::npos) {
        ++events_;
        scanned_ = at + 6;
      }
    }
    return events_;
  }
  // Reads to the end of the response; returns everything received.
  std::string ReadAll(absl::Duration timeout = absl::Seconds(60)) {
    ReadEvents(1 << 30, timeout);
    return data_;
  }
  // Bytes received by the kernel that the test has not read.
  int Unread() const {
    int n = 0;
    PD_CHECK(ioctl(fd_, FIONREAD, &n) == 0);
    return n;
  }
  // The client goes away: the socket is closed (a reset when it holds unread data).
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  std::string data_;
  size_t scanned_ = 0;
  int events_ = 0;
  bool eof_ = false;
};

// Polls `done` every 2 ms until it holds or `limit` passed; returns the time it took from `from`,
// or nullopt.
std::optional<absl::Duration> TimeUntil(absl::Time from, absl::Duration limit,
                                        const std::function<bool()>& done) {
  const absl::Time end = from + limit;
  while (true) {
    if (done()) return absl::Now() - from;
    if (absl::Now() >= end) return std::nullopt;
    absl::SleepFor(absl::Milliseconds(2));
  }
}

// An upper bound of the slowest engine step `node` took so far: the `le` of the first bucket of
// its histogram `name` (pdserve_prefill_step_seconds or pdserve_decode_step_seconds) that holds
// every observation; 0 when it observed none.
absl::Duration SlowestStep(const NodeInfo& node, const std::string& name) {
  const std::string text = HttpGet(node.http, "/metrics");
  const double count = Metric(text, name + "_count");
  if (count == 0) return absl::ZeroDuration();
  std::istringstream lines(text);
  std::string line;
  const std::string prefix = name + "_bucket{le=\"";
  while (std::getline(lines, line)) {
    if (line.rfind(prefix, 0) != 0) continue;
    const size_t q = line.find('"', prefix.size());
    const std::string le = line.substr(prefix.size(), q - prefix.size());
    if (std::stod(line.substr(line.rfind(' ') + 1)) >= count) {
      return le == "+Inf" ? absl::InfiniteDuration() : absl::Seconds(std::stod(le));
    }
  }
  return absl::InfiniteDuration();
}

// After a failure: the end of every daemon's log (a node that died says why there).
void PrintLogTails(const TempDir& dir) {
  if (!::testing::Test::HasFailure()) return;
  for (const auto& entry : std::filesystem::directory_iterator(LogDir(dir))) {
    if (entry.path().extension() != ".log") continue;
    std::ifstream in(entry.path());
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    const size_t from = lines.size() > 30 ? lines.size() - 30 : 0;
    std::printf("---- %s (last %zu lines)\n", entry.path().filename().c_str(), lines.size() - from);
    for (size_t i = from; i < lines.size(); ++i) std::printf("%s\n", lines[i].c_str());
  }
}

double Reservations(const NodeInfo& decode) {
  return Metric(HttpGet(decode.http, "/metrics"), "pdserve_kv_reservations");
}

// Every node runs and queues nothing, all its KV blocks are free, and no decode node holds a
// reservation.
bool AllClean(const Cluster& c) {
  for (const NodeInfo& n : c.nodes) {
    const pdserve::node::v1::EngineLoad l = NodeLoad(n.grpc);
    if (l.running() != 0 || l.waiting() != 0 || l.kv_blocks_free() != l.kv_blocks_total()) {
      return false;
    }
    if (n.role == "decode" && Reservations(n) != 0) return false;
  }
  return true;
}

// `node` has at most `running` running and `waiting` waiting sequences.
std::function<bool()> AtMost(const NodeInfo& node, int running, int waiting) {
  return [&node, running, waiting] {
    const pdserve::node::v1::EngineLoad l = NodeLoad(node.grpc);
    return l.running() <= running && l.waiting() <= waiting;
  };
}

int UsedBlocks(const NodeInfo& node) {
  const pdserve::node::v1::EngineLoad l = NodeLoad(node.grpc);
  return l.kv_blocks_total() - l.kv_blocks_free();
}

double RouterCancelled(const Cluster& c) {
  return Metric(HttpGet(c.http, "/metrics"), "pdserve_requests_total{finish_reason=\"cancelled\"}");
}

class CancellationTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    model_ = new std::string(dir_->Write("slow4k.gguf", SlowModelGguf(/*context_length=*/4096)));
  }
  static void TearDownTestSuite() {
    delete model_;
    delete dir_;
  }

  void SetUp() override {
    c_ = StartClusterWithConfig(dir_case_, kCancelConfig, *model_, 1, 1, env_);
    ASSERT_NE(c_, nullptr);
    prefill_ = c_->Find("p0");
    decode_ = c_->Find("d0");
    ASSERT_NE(prefill_, nullptr);
    ASSERT_NE(decode_, nullptr);
  }
  void TearDown() override {
    PrintLogTails(dir_case_);
    if (c_ != nullptr) StopCluster(*c_);
  }

  // The hang-up at `t0` left nothing behind: every KV block on both nodes is free again (and no
  // reservation is left) within 1 s.
  void ExpectAllFreedWithinOneSecond(absl::Time t0) {
    const std::optional<absl::Duration> clean =
        TimeUntil(t0, absl::Seconds(1), [this] { return AllClean(*c_); });
    ASSERT_TRUE(clean.has_value())
        << "1 s after the hang-up: p0 uses " << UsedBlocks(*prefill_) << " blocks, d0 "
        << UsedBlocks(*decode_) << " blocks and " << Reservations(*decode_) << " reservations";
    Report("every KV block free on both nodes", *clean, absl::Seconds(1));
  }

  // The work on `node` stopped (at most `running`/`waiting` sequences left) within one step (the
  // node's slowest `step_metric` step) + 100 ms of `t0`.
  void ExpectWorkStopped(const NodeInfo& node, const std::string& step_metric, absl::Time t0,
                         int running = 0, int waiting = 0) {
    const std::optional<absl::Duration> stopped =
        TimeUntil(t0, absl::Seconds(5), AtMost(node, running, waiting));
    ASSERT_TRUE(stopped.has_value()) << node.name << " still works 5 s after the hang-up";
    const absl::Duration step = SlowestStep(node, step_metric);
    EXPECT_LE(*stopped, step + absl::Milliseconds(100))
        << node.name << ": stopped " << *stopped << " after the hang-up; its slowest step took "
        << "at most " << step;
    Report(StrCat("work stopped on ", node.name), *stopped, step + absl::Milliseconds(100));
  }

  // One line per measurement, for the record (docs/security.md quotes them).
  static void Report(const std::string& what, absl::Duration took, absl::Duration bound) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::printf("cancel %s: %s after %.1f ms (bound %.1f ms)\n", info->name(), what.c_str(),
                absl::ToDoubleMilliseconds(took), absl::ToDoubleMilliseconds(bound));
  }

  static TempDir* dir_;
  static std::string* model_;
  TempDir dir_case_;
  std::vector<std::string> env_;
  std::unique_ptr<Cluster> c_;
  const NodeInfo* prefill_ = nullptr;
  const NodeInfo* decode_ = nullptr;
};
TempDir* CancellationTest::dir_ = nullptr;
std::string* CancellationTest::model_ = nullptr;

// Queued at the router: the router holds the request while the decode node it picked does not
// answer (stopped with SIGSTOP: a node stalled by a long GC-like pause, swap or a full socket).
// Nothing runs anywhere yet; the hang-up must end the router's wait at once (Decode.Reserve is
// cancelled), and the decode node, once it runs again, must not keep a reservation for a caller
// that is gone.
TEST_F(CancellationTest, QueuedAtTheRouter) {
  ASSERT_EQ(kill(decode_->pid, SIGSTOP), 0);
  HttpStream s(c_->http, Prompt(240), 64);
  absl::SleepFor(absl::Milliseconds(300));  // the router sent Decode.Reserve, which waits
  const double before = RouterCancelled(*c_);
  const absl::Time t0 = absl::Now();
  s.Close();
  const std::optional<absl::Duration> ended =
      TimeUntil(t0, absl::Seconds(2), [&] { return RouterCancelled(*c_) == before + 1; });
  kill(decode_->pid, SIGCONT);
  ASSERT_TRUE(ended.has_value()) << "the router still holds the request 2 s after the hang-up";
  EXPECT_LE(*ended, absl::Milliseconds(100));  // no engine step involved
  Report("the router ended the request", *ended, absl::Milliseconds(100));
  const absl::Time resumed = absl::Now();
  ExpectAllFreedWithinOneSecond(resumed);
}

// Queued at the prefill node: a long prompt A is being prefilled there (one sequence at a time),
// B waits behind it. B's hang-up takes it out of the prefill node's queue and frees the blocks
// its reservation holds on the decode node; A is untouched and completes.
TEST_F(CancellationTest, QueuedAtThePrefillNode) {
  HttpStream a(c_->http, Prompt(1500), 4);  // ~24 prefill steps
  ASSERT_TRUE(TimeUntil(absl::Now(), absl::Seconds(10), [&] {
                return NodeLoad(prefill_->grpc).running() == 1;
              }).has_value());
  const int a_blocks = UsedBlocks(*decode_);  // A's reservation
  HttpStream b(c_->http, Prompt(600), 4);
  ASSERT_TRUE(TimeUntil(absl::Now(), absl::Seconds(10),
                        [&] {
                          const auto l = NodeLoad(prefill_->grpc);
                          return l.running() == 1 && l.waiting() == 1;
                        })
                  .has_value())
      << "B never queued behind A on the prefill node";
  ASSERT_GT(UsedBlocks(*decode_), a_blocks) << "B holds no reservation on the decode node";
  const absl::Time t0 = absl::Now();
  b.Close();
  ExpectWorkStopped(*prefill_, "pdserve_prefill_step_seconds", t0, /*running=*/1,
                    /*waiting=*/0);
  // B's reservation is gone; A's is all the decode node holds.
  const std::optional<absl::Duration> freed = TimeUntil(t0, absl::Seconds(1), [&] {
    return Reservations(*decode_) <= 1 && UsedBlocks(*decode_) <= a_blocks + 1;
  });
  EXPECT_TRUE(freed.has_value()) << "d0 uses " << UsedBlocks(*decode_) << " blocks (" << a_blocks
                                 << " for A), " << Reservations(*decode_) << " reservations";
  const std::string rest = a.ReadAll();
  EXPECT_THAT(rest, HasSubstr("[DONE]"));
  EXPECT_THAT(rest, HasSubstr("\"finish_reason\":\"length\""));
  ExpectAllFreedWithinOneSecond(absl::Now());
}

// In prefill: the prefill node is computing the prompt (many chunked steps) when the client goes
// away: the prefill stops at the next step, the prefill node's blocks and the decode node's
// reservation are freed.
TEST_F(CancellationTest, InPrefill) {
  HttpStream s(c_->http, Prompt(2000), 8);
  ASSERT_TRUE(TimeUntil(absl::Now(), absl::Seconds(10),
                        [&] {
                          return NodeLoad(prefill_->grpc).running() == 1 &&
                                 UsedBlocks(*prefill_) > 16;
                        })
                  .has_value())
      << "the prefill never started: " << s.ReadAll(absl::Seconds(1));
  const absl::Time t0 = absl::Now();
  s.Close();
  ExpectWorkStopped(*prefill_, "pdserve_prefill_step_seconds", t0);
  ExpectAllFreedWithinOneSecond(t0);
}

// The KV pushed but not yet admitted: the prefill node computed the prompt and pushed its layers
// into the decode node's reservation, but the transfer has not completed (its last layer is held
// back: PDSERVE_TEST_KV_FAULTS=stall_after_layers=7 on this 8-layer model), so the request is not
// admitted to the decode node's batch. The hang-up must abort the transfer and free both nodes'
// blocks now, not at the transfer's 20 s deadline.
class CancellationStalledTransferTest : public CancellationTest {
 protected:
  void SetUp() override {
    env_ = {"PDSERVE_TEST_KV_FAULTS=stall_after_layers=7"};
    CancellationTest::SetUp();
  }
};

TEST_F(CancellationStalledTransferTest, KvPushedNotAdmitted) {
  HttpStream s(c_->http, Prompt(600), 8);
  ASSERT_TRUE(TimeUntil(absl::Now(), absl::Seconds(10),
                        [&] {
                          const auto p = NodeLoad(prefill_->grpc);
                          const auto d = NodeLoad(decode_->grpc);
                          // The prompt is computed (the prefill node runs nothing but holds the
                          // blocks it sends from); the decode node holds the reservation and runs
                          // nothing.
                          return p.running() == 0 && p.kv_blocks_free() < p.kv_blocks_total() &&
                                 d.running() == 0 && Reservations(*decode_) == 1 &&
                                 Metric(HttpGet(decode_->http, "/metrics"),
                                        "pdserve_kv_transfer_layers_total{path=\"landed\"}") +
                                         Metric(
                                             HttpGet(decode_->http, "/metrics"),
                                             "pdserve_kv_transfer_layers_total{path=\"engine\"}") >=
                                     7;
                        })
                  .has_value())
      << "the transfer never reached its stall";
  const double before = RouterCancelled(*c_);
  const absl::Time t0 = absl::Now();
  s.Close();
  const std::optional<absl::Duration> ended =
      TimeUntil(t0, absl::Seconds(2), [&] { return RouterCancelled(*c_) == before + 1; });
  ASSERT_TRUE(ended.has_value()) << "the router still holds the request 2 s after the hang-up";
  EXPECT_LE(*ended, absl::Milliseconds(100));
  Report("the router ended the request", *ended, absl::Milliseconds(100));
  ExpectAllFreedWithinOneSecond(t0);
}

// Decoding: the client reads a few tokens and goes away; the decode node stops at the next step.
TEST_F(CancellationTest, Decoding) {
  HttpStream s(c_->http, Prompt(120), 3000);
  ASSERT_GE(s.ReadEvents(20), 20);
  ASSERT_EQ(NodeLoad(decode_->grpc).running(), 1);
  const absl::Time t0 = absl::Now();
  s.Close();
  ExpectWorkStopped(*decode_, "pdserve_decode_step_seconds", t0);
  ExpectAllFreedWithinOneSecond(t0);
}

// The same over the gRPC API: the client cancels its call mid-stream.
TEST_F(CancellationTest, DecodingGrpcCallCancelled) {
  auto stub =
      pdserve::v1::Chat::NewStub(grpc::CreateChannel(c_->grpc, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  auto reader = stub->Generate(&ctx, GreedyRequest(Prompt(120), 3000));
  pdserve::v1::GenerateResponse resp;
  int tokens = 0;
  while (tokens < 20 && reader->Read(&resp)) tokens += resp.delta().token_ids_size();
  ASSERT_GE(tokens, 20);
  ASSERT_EQ(NodeLoad(decode_->grpc).running(), 1);
  const absl::Time t0 = absl::Now();
  ctx.TryCancel();
  ExpectWorkStopped(*decode_, "pdserve_decode_step_seconds", t0);
  ExpectAllFreedWithinOneSecond(t0);
  while (reader->Read(&resp)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
}

// Back-pressured: the client stops reading (a 4 KiB receive buffer) while the tokens keep
// coming, until the server's writes to it are stuck; then it goes away. The decode node stops at
// the next step, nothing is left.
TEST_F(CancellationTest, StreamBackPressured) {
  HttpStream s(c_->http, Prompt(120), 3000, /*rcvbuf=*/4096);
  ASSERT_GE(s.ReadEvents(5), 5);
  // Stuck: the decode node is still generating, but nothing more reaches the client's socket.
  int unread = -1;
  absl::Time since = absl::Now();
  ASSERT_TRUE(TimeUntil(absl::Now(), absl::Seconds(20), [&] {
                const int now = s.Unread();
                if (now != unread) {
                  unread = now;
                  since = absl::Now();
                }
                return absl::Now() - since > absl::Milliseconds(300);
              }).has_value());
  ASSERT_EQ(NodeLoad(decode_->grpc).running(), 1)
      << "the request ended before its stream was back-pressured";
  const absl::Time t0 = absl::Now();
  s.Close();
  ExpectWorkStopped(*decode_, "pdserve_decode_step_seconds", t0);
  ExpectAllFreedWithinOneSecond(t0);
}

// ---- Many random cancellations under load ----

// Node.Audit on `node`.
pdserve::node::v1::AuditReport Audit(const NodeInfo& node) {
  auto stub = pdserve::node::v1::Node::NewStub(grpc::CreateChannel(node.grpc, NodeCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(15));
  pdserve::node::v1::AuditReport report;
  const grpc::Status s = stub->Audit(&ctx, {}, &report);
  EXPECT_TRUE(s.ok()) << node.name << ": " << s.error_message();
  return report;
}

std::string Describe(const pdserve::node::v1::AuditReport& r) {
  return StrCat("kv_error '", r.kv_error(), "', blocks used ", r.kv_blocks_used(),
                ", live requests ", r.live_requests(), ", reservations ", r.kv_reservations(),
                ", open transfers ", r.kv_transfers());
}

// The fast tiny model (context 256), two decode nodes, and prompts of 24 tokens or more taking the
// prefill node and the KV transfer: every phase a request can be cancelled in is crossed often.
constexpr char kRandomConfig[] = R"(
model: {id: tiny, chat_template: chatml}
threads: 1
kv: {memory_mib: 4}
scheduler: {max_running_seqs: 6, token_budget: 64}
shutdown_grace_s: 1
router: {disaggregate_min_prompt: 24}
)";

// 10,000 clients that go away at a random moment (PD_CANCELLATIONS overrides the count), over
// both APIs: half cancel a gRPC call, half close an HTTP socket, each after a random delay of
// 0-40 ms or a random number of tokens; one request in ten is read to its end. While they run,
// every node's KV audit passes; at the end the block manager's audit, Node.Load, the /metrics
// gauges and the KV transfer's reservations and open transfers all say the same: nothing is held.
TEST(RandomCancellationsTest, TenThousandUnderLoadLeakNothing) {
  int target = 10000;
  if (const char* n = std::getenv("PD_CANCELLATIONS")) target = std::atoi(n);
  TempDir dir;
  const std::string model = dir.Write("tiny.gguf", frontend::testing::ServingModelGguf());
  std::unique_ptr<Cluster> c = StartClusterWithConfig(dir, kRandomConfig, model, 1, 2);
  ASSERT_NE(c, nullptr);

  // Hang-ups by the clients; cancellations counted by the router (requests it had accepted that
  // ended cancelled: a hang-up after the end, or before the request was read, is not one).
  std::atomic<int> cancelled{0}, completed{0}, refused{0}, failed{0};
  std::atomic<int> router_cancelled{0};
  std::atomic<bool> stop{false};
  constexpr int kClients = 12;
  const std::vector<std::string> words = {"hello", "world", "the", "cat", "sat", "on", "mat"};
  auto client = [&](int k) {
    std::mt19937 rng(1000 + k);
    auto stub = pdserve::v1::Chat::NewStub(
        grpc::CreateChannel(c->grpc, grpc::InsecureChannelCredentials()));
    while (!stop.load() && router_cancelled.load() < target && failed.load() < 20) {
      std::string prompt;
      const int n_words = 1 + static_cast<int>(rng() % 25);  // ~5-150 tokens
      for (int i = 0; i < n_words; ++i) prompt += words[rng() % words.size()] + " ";
      const int max_tokens = 1 + static_cast<int>(rng() % 64);
      const bool to_end = rng() % 10 == 0;
      const bool by_tokens = rng() % 2 == 0;
      const int after_tokens = static_cast<int>(rng() % 8);
      const absl::Duration after = absl::Microseconds(rng() % 40000);
      if (rng() % 2 == 0) {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
        auto reader = stub->Generate(&ctx, GreedyRequest(prompt, max_tokens));
        const absl::Time start = absl::Now();
        pdserve::v1::GenerateResponse resp;
        int tokens = 0;
        bool finished = false, hung_up = false;
        while (!to_end && !by_tokens && absl::Now() - start < after) absl::SleepFor(after / 8);
        if (!to_end && !by_tokens) {
          ctx.TryCancel();
          hung_up = true;
        }
        while (reader->Read(&resp)) {
          tokens += resp.delta().token_ids_size();
          finished |= resp.has_finish();
          if (!to_end && by_tokens && !hung_up && tokens >= after_tokens) {
            ctx.TryCancel();
            hung_up = true;
          }
        }
        const grpc::Status st = reader->Finish();
        if (st.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
          refused.fetch_add(1);
        } else if (hung_up && !finished) {
          cancelled.fetch_add(1);
        } else if (st.ok() && finished) {
          completed.fetch_add(1);
        } else {
          failed.fetch_add(1);
          ADD_FAILURE() << "gRPC: " << st.error_code() << " " << st.error_message();
        }
      } else {
        HttpStream s(c->http, prompt, max_tokens);
        const int events = to_end ? (1 << 30) : (by_tokens ? after_tokens : 0);
        if (!to_end && !by_tokens) absl::SleepFor(after);
        const int got = s.ReadEvents(events, absl::Seconds(60));
        s.Close();
        if (to_end) {
          completed.fetch_add(1);
        } else if (got >= events) {
          cancelled.fetch_add(1);
        }
      }
    }
  };
  std::thread auditor([&] {
    while (!stop.load()) {
      router_cancelled.store(static_cast<int>(RouterCancelled(*c)));
      for (const NodeInfo& n : c->nodes) {
        const auto r = Audit(n);
        EXPECT_EQ(r.kv_error(), "") << n.name << " under load: " << Describe(r);
      }
      absl::SleepFor(absl::Milliseconds(250));
    }
  });
  const absl::Time t0 = absl::Now();
  std::vector<std::thread> clients;
  for (int k = 0; k < kClients; ++k) clients.emplace_back(client, k);
  for (std::thread& t : clients) t.join();
  stop.store(true);
  auditor.join();
  const double by_router = RouterCancelled(*c);
  std::printf(
      "random cancellations: %g cancelled at the router (%d client hang-ups), %d "
      "completed, %d refused, %d failed in %.1f s\n",
      by_router, cancelled.load(), completed.load(), refused.load(), failed.load(),
      absl::ToDoubleSeconds(absl::Now() - t0));
  EXPECT_GE(by_router, target);
  EXPECT_EQ(failed.load(), 0);

  // Every daemon lived through it, and everything agrees that nothing is held (within 5 s: the
  // last hang-ups are being cleaned up).
  for (const NodeInfo& n : c->nodes) {
    EXPECT_EQ(kill(n.pid, 0), 0) << n.name << " (pid " << n.pid << ") died";
    pdserve::node::v1::AuditReport r;
    const std::optional<absl::Duration> idle = TimeUntil(absl::Now(), absl::Seconds(5), [&] {
      r = Audit(n);
      return r.kv_error().empty() && r.kv_blocks_used() == 0 && r.live_requests() == 0 &&
             r.kv_reservations() == 0 && r.kv_transfers() == 0;
    });
    EXPECT_TRUE(idle.has_value()) << n.name << ": " << Describe(r);
    const pdserve::node::v1::EngineLoad l = NodeLoad(n.grpc);
    EXPECT_EQ(l.kv_blocks_free(), l.kv_blocks_total()) << n.name;
    EXPECT_EQ(l.running() + l.waiting(), 0) << n.name;
    const std::string m = HttpGet(n.http, "/metrics");
    EXPECT_EQ(Metric(m, "pdserve_kv_blocks_used"), 0) << n.name;
    EXPECT_EQ(Metric(m, "pdserve_running_sequences"), 0) << n.name;
    EXPECT_EQ(Metric(m, "pdserve_waiting_sequences"), 0) << n.name;
    EXPECT_EQ(Metric(m, "pdserve_kv_reservations"), 0) << n.name;
    std::printf(
        "%s at the end: %s; gauges: kv_blocks_used %g, running %g, waiting %g, "
        "reservations %g\n",
        n.name.c_str(), Describe(r).c_str(), Metric(m, "pdserve_kv_blocks_used"),
        Metric(m, "pdserve_running_sequences"), Metric(m, "pdserve_waiting_sequences"),
        Metric(m, "pdserve_kv_reservations"));
  }
  PrintLogTails(dir);
  StopCluster(*c);
}

}  // namespace
}  // namespace pd::router
