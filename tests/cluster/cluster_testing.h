// Helpers for the tests that run the cluster as users start it: `pdctl up` with real pd-prefill,
// pd-decode and pd-router processes on 127.0.0.1 (ports chosen by the OS) over tiny synthetic
// models; gRPC to the router and the node API, HTTP to /metrics.
#pragma once

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "common/grpc_tls.h"
#include "common/status.h"
#include "common/strings.h"
#include "pdserve/node/v1/node.grpc.pb.h"
#include "pdserve/v1/chat.grpc.pb.h"
#include "tests/frontend/serving_testing.h"
#include "tests/testing/process.h"
#include "tests/testing/tiny_model.h"

namespace pd::router {

using ::pd::testing::Process;
using ::pd::testing::TempDir;

// Big enough that a 200-token stream lasts a good fraction of a second on one core (so a node can
// be killed in the middle of it), small enough to build in a moment.
inline std::string SlowModelGguf(uint32_t context_length = 256) {
  engine::testing::TinyModelSpec spec;
  spec.n_vocab = static_cast<int>(frontend::testing::ServingVocab().size());
  spec.n_embd = 384;
  spec.n_layer = 8;
  spec.n_head = 6;
  spec.n_head_kv = 2;
  spec.n_ff = 1024;
  spec.type = engine::DType::kQ8_0;  // ~13 MiB: GgufBuilder writes at most 16 MiB of data
  spec.seed = 11;
  spec.context_length = context_length;
  spec.metadata = frontend::testing::AddServingVocab;
  return engine::testing::TinyModel(spec);
}

inline constexpr char kConfig[] = R"(
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

// Credentials for calls to the nodes of the cluster started last: under mutual TLS (every
// cluster the tests start, see StartClusterWithConfig), the router's certificate from the cluster's
// CA; null: plaintext. One cluster at a time per test process.
inline std::shared_ptr<grpc::ChannelCredentials>& NodeCredentials() {
  static std::shared_ptr<grpc::ChannelCredentials> credentials;
  return credentials;
}

// `yaml`: the whole config file every daemon gets; `env`: NAME=VALUE settings for every daemon.
// `extra`: more `pdctl up` arguments. The logs go to LogDir(dir). The daemons talk to each other
// over mutual TLS (`pdctl up --cluster-tls`, or `--tls` when `extra` has it) unless `extra` has
// "--no-cluster-tls" (which is not passed on); the router's APIs are plaintext without --tls.
inline std::string LogDir(const TempDir& dir) { return dir.Write("logs.keep", "") + ".d"; }
inline std::unique_ptr<Cluster> StartClusterWithConfig(const TempDir& dir, const std::string& yaml,
                                                       const std::string& model, int prefill,
                                                       int decode,
                                                       const std::vector<std::string>& env = {},
                                                       const std::vector<std::string>& extra = {}) {
  const std::string config = dir.Write("cluster.yaml", yaml);
  auto c = std::make_unique<Cluster>();
  std::vector<std::string> args = {"/usr/bin/env"};
  args.insert(args.end(), env.begin(), env.end());
  for (const std::string& a :
       {std::string(PD_BIN_DIR "/pdctl"), std::string("up"), std::string("--prefill"),
        std::to_string(prefill), std::string("--decode"), std::to_string(decode),
        std::string("--config"), config, std::string("--model"), model, std::string("--grpc-port"),
        std::string("0"), std::string("--http-port"), std::string("0"), std::string("--log-dir"),
        LogDir(dir)}) {
    args.push_back(a);
  }
  bool mtls = true, public_tls = false;
  for (const std::string& a : extra) {
    if (a == "--no-cluster-tls") {
      mtls = false;
      continue;
    }
    public_tls |= a == "--tls";
    args.push_back(a);
  }
  if (mtls && !public_tls) args.push_back("--cluster-tls");
  NodeCredentials() = nullptr;
  c->pdctl = std::make_unique<Process>(args);
  const std::string ready =
      c->pdctl->WaitForLine(std::regex("^pdctl up ready: "), absl::Seconds(60));
  if (ready.empty()) {
    ADD_FAILURE() << "pdctl up did not get ready: " << c->pdctl->Stderr();
    return nullptr;
  }
  if (mtls) {
    const std::string tls = LogDir(dir) + "/tls";
    auto member =
        GrpcChannelCredentials({tls + "/router.pem", tls + "/router.key", tls + "/ca.pem"});
    PD_CHECK_OK(member.status());
    NodeCredentials() = *member;
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

// kConfig plus a router map whose disaggregate_min_prompt is 0 (the tests' prompts are short and
// every one is meant to take the prefill node and the KV transfer when there is a prefill node)
// and `router_extra`, more `key: value` entries of it.
inline std::unique_ptr<Cluster> StartCluster(const TempDir& dir, const std::string& model,
                                             int prefill, int decode,
                                             const std::string& router_extra = "",
                                             const std::vector<std::string>& env = {},
                                             const std::vector<std::string>& extra = {}) {
  return StartClusterWithConfig(dir,
                                StrCat(kConfig, "router: {disaggregate_min_prompt: 0",
                                       router_extra.empty() ? "" : ", ", router_extra, "}\n"),
                                model, prefill, decode, env, extra);
}

inline pdserve::v1::GenerateRequest GreedyRequest(const std::string& text, int max_tokens) {
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
// `credentials`: null = plaintext.
inline Result Generate(const std::string& address, const pdserve::v1::GenerateRequest& req,
                       const std::function<void(const std::vector<int32_t>&)>& on_token = nullptr,
                       std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr) {
  if (credentials == nullptr) credentials = grpc::InsecureChannelCredentials();
  auto stub = pdserve::v1::Chat::NewStub(grpc::CreateChannel(address, credentials));
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

// Node.Load on `address` with `credentials` (null = NodeCredentials()).
inline grpc::Status TryNodeLoad(const std::string& address, pdserve::node::v1::EngineLoad* load,
                                std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr) {
  if (credentials == nullptr) credentials = NodeCredentials();
  if (credentials == nullptr) credentials = grpc::InsecureChannelCredentials();
  auto stub = pdserve::node::v1::Node::NewStub(grpc::CreateChannel(address, credentials));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return stub->Load(&ctx, {}, load);
}

inline pdserve::node::v1::EngineLoad NodeLoad(const std::string& address) {
  pdserve::node::v1::EngineLoad load;
  grpc::Status s = TryNodeLoad(address, &load);
  EXPECT_TRUE(s.ok()) << address << ": " << s.error_message();
  return load;
}

// Every live decode node holds no sequence and all its KV blocks are free (within 3 s).
inline void ExpectKvBackToBaseline(const Cluster& c, const std::vector<std::string>& skip = {}) {
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

inline std::string HttpGet(const std::string& url, const std::string& path) {
  httplib::Client cli(url);
  auto res = cli.Get(path);
  return res ? res->body : "";
}

inline void StopCluster(Cluster& c) {
  c.pdctl->Signal(SIGTERM);
  EXPECT_EQ(c.pdctl->Wait(absl::Seconds(20)), 0) << c.pdctl->Stderr();
  for (const NodeInfo& n : c.nodes) {
    // pdctl waited for its children: none is left running (or as a zombie of ours).
    EXPECT_EQ(kill(n.pid, 0), -1) << n.name << " pid " << n.pid << " still exists";
  }
}

// The value of a counter or gauge line `series` ("name{labels}") in a /metrics text; 0 if absent.
inline double Metric(const std::string& text, const std::string& series) {
  const size_t at = ("\n" + text).find("\n" + series + " ");
  if (at == std::string::npos) return 0;
  return std::stod(text.substr(at + series.size() + 1));
}

}  // namespace pd::router
