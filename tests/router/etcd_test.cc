// The etcd gateway client (common/etcd_client.h): its JSON and base64, the node record schema,
// error mapping and endpoint failover against a fake gateway (an httplib server on port 0), and
// the router's EtcdNodeWatcher following that fake's keys into a NodeRegistry. The real etcd is
// exercised by tests/cluster/etcd_cluster_test.cc.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "common/etcd_client.h"
#include "common/status.h"
#include "common/status_matchers.h"
#include "router/etcd_watcher.h"
#include "router/node_registry.h"

namespace pd::router {
namespace {

using ::nlohmann::json;
using ::pd::testing::StatusIs;
using ::testing::ElementsAre;
namespace ej = etcd_json;

TEST(EtcdJsonTest, Base64RoundTrips) {
  EXPECT_EQ(ej::Base64(""), "");
  EXPECT_EQ(ej::Base64("/pdserve/"), "L3Bkc2VydmUv");
  EXPECT_EQ(ej::Base64("ab"), "YWI=");
  const std::string bytes("\0\xff\x10z", 4);
  absl::StatusOr<std::string> back = ej::FromBase64(ej::Base64(bytes));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, bytes);
  EXPECT_THAT(ej::FromBase64("not base64!"), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(EtcdJsonTest, PrefixRangeEnd) {
  EXPECT_EQ(ej::PrefixRangeEnd("/pdserve/"), "/pdserve0");  // '/' + 1 == '0'
  EXPECT_EQ(ej::PrefixRangeEnd("a"), "b");
  EXPECT_EQ(ej::PrefixRangeEnd(std::string("a\xff", 2)), "b");
  EXPECT_EQ(ej::PrefixRangeEnd(std::string("\xff\xff", 2)), std::string(1, '\0'));
}

TEST(EtcdJsonTest, RequestBodies) {
  EXPECT_EQ(json::parse(ej::GrantBody(3)), json({{"TTL", "3"}}));
  EXPECT_EQ(json::parse(ej::LeaseBody(7587862072925130005)), json({{"ID", "7587862072925130005"}}));
  EXPECT_EQ(json::parse(ej::PutBody("k", "v", 42)),
            json({{"key", "aw=="}, {"value", "dg=="}, {"lease", "42"}}));
  EXPECT_FALSE(json::parse(ej::PutBody("k", "v", 0)).contains("lease"));
  EXPECT_EQ(json::parse(ej::RangeBody("/p/", "/p0")),
            json({{"key", "L3Av"}, {"range_end", "L3Aw"}}));
}

// The answers below are what etcd 3.4.23's gateway sent (int64 fields as strings).
TEST(EtcdJsonTest, ParsesGatewayAnswers) {
  absl::StatusOr<int64_t> id =
      ej::ParseGrant(R"({"header":{"cluster_id":"324952591200643719","revision":"1"},)"
                     R"("ID":"2324035703806019333","TTL":"3"})");
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(*id, 2324035703806019333);
  EXPECT_THAT(ej::ParseGrant(R"({"header":{}})"), StatusIs(absl::StatusCode::kInternal));
  EXPECT_THAT(ej::ParseGrant("<html>"), StatusIs(absl::StatusCode::kInternal));

  absl::StatusOr<int64_t> ttl = ej::ParseKeepAlive(R"({"result":{"header":{},"ID":"5","TTL":"3"}})"
                                                   "\n");
  ASSERT_TRUE(ttl.ok()) << ttl.status();
  EXPECT_EQ(*ttl, 3);
  // A lease that is gone: etcd answers 200 without a TTL.
  EXPECT_THAT(ej::ParseKeepAlive(R"({"result":{"header":{},"ID":"5"}})"),
              StatusIs(absl::StatusCode::kNotFound));

  absl::StatusOr<std::vector<EtcdKeyValue>> kvs = ej::ParseRange(
      R"({"header":{"revision":"2"},"kvs":[{"key":"L3Bkc2VydmUvbm9kZXMvZGVjb2RlL2E=",)"
      R"("create_revision":"2","mod_revision":"2","version":"1","value":"eyJ4IjoxfQ==",)"
      R"("lease":"2324035703806019335"}],"count":"1"})");
  ASSERT_TRUE(kvs.ok()) << kvs.status();
  ASSERT_EQ(kvs->size(), 1u);
  EXPECT_EQ((*kvs)[0].key, "/pdserve/nodes/decode/a");
  EXPECT_EQ((*kvs)[0].value, R"({"x":1})");
  EXPECT_EQ((*kvs)[0].lease, 2324035703806019335);
  EXPECT_EQ((*kvs)[0].mod_revision, 2);
  // No key: the gateway leaves "kvs" out.
  kvs = ej::ParseRange(R"({"header":{"revision":"3"}})");
  ASSERT_TRUE(kvs.ok()) << kvs.status();
  EXPECT_TRUE(kvs->empty());
  EXPECT_THAT(ej::ParseRange(R"({"kvs":[{"key":"***"}]})"), StatusIs(absl::StatusCode::kInternal));
}

TEST(EtcdJsonTest, ErrorsKeepEtcdsCode) {
  // A revoke of an unknown lease: 404, then the gateway's trailer in the chunked body.
  EXPECT_THAT(ej::ParseError(404, R"({"error":"etcdserver: requested lease not found",)"
                                  R"("message":"etcdserver: requested lease not found","code":5})"
                                  "Grpc-Trailer-Content-Type: application/grpc"),
              StatusIs(absl::StatusCode::kNotFound,
                       "etcd: HTTP 404: etcdserver: requested lease not found"));
  EXPECT_THAT(ej::ParseError(502, "Bad Gateway"),
              StatusIs(absl::StatusCode::kUnknown, "etcd: HTTP 502: Bad Gateway"));
}

TEST(EtcdNodeRecordTest, KeyAndValueRoundTrip) {
  EtcdOptions o;
  NodeOptions n{"d1", "decode", "10.0.0.7:50061"};
  EXPECT_EQ(EtcdNodesPrefix(o), "/pdserve/nodes/");
  EXPECT_EQ(EtcdNodeKey(o, n), "/pdserve/nodes/decode/d1");
  EXPECT_EQ(json::parse(EtcdNodeValue(n)),
            json({{"name", "d1"}, {"role", "decode"}, {"address", "10.0.0.7:50061"}}));
  absl::StatusOr<NodeOptions> back =
      ParseEtcdNode(EtcdNodesPrefix(o), EtcdNodeKey(o, n), EtcdNodeValue(n));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->name, "d1");
  EXPECT_EQ(back->role, "decode");
  EXPECT_EQ(back->address, "10.0.0.7:50061");
}

TEST(EtcdNodeRecordTest, BadRecordsAreRefusedNamingTheKey) {
  const std::string p = "/pdserve/nodes/", k = "/pdserve/nodes/decode/d1";
  auto bad = [&](const std::string& key, const std::string& value, const char* why) {
    EXPECT_THAT(ParseEtcdNode(p, key, value), StatusIs(absl::StatusCode::kInvalidArgument, why))
        << value;
  };
  bad(k, "nope", "not a JSON object");
  bad(k, R"({"name":"d1","role":"decode"})", "'address' must be a non-empty string");
  bad(k, R"({"name":"","role":"decode","address":"h:1"})", "'name'");
  bad(k, R"({"name":"d1","role":"decode","address":7})", "'address'");
  bad("/pdserve/nodes/router/d1", R"({"name":"d1","role":"router","address":"h:1"})",
      "role must be prefill or decode");
  bad(k, R"({"name":"d1","role":"decode","address":"h"})", "address must be host:port");
  bad(k, R"({"name":"d2","role":"decode","address":"h:1"})", "does not match");
  bad(k, R"({"name":"d1","role":"prefill","address":"h:1"})", "does not match");
}

// A fake etcd gateway: the kv and lease endpoints over an in-memory map (no lease expiry).
class FakeEtcd {
 public:
  FakeEtcd() {
    server_.Post("/v3/kv/range", [this](const httplib::Request& req, httplib::Response& res) {
      const json in = json::parse(req.body);
      const std::string from = *ej::FromBase64(in["key"].get<std::string>());
      const std::string to = *ej::FromBase64(in["range_end"].get<std::string>());
      json kvs = json::array();
      absl::MutexLock lock(&mu_);
      ++ranges_;
      for (const auto& [k, v] : kvs_) {
        if (k >= from && k < to) {
          kvs.push_back({{"key", ej::Base64(k)}, {"value", ej::Base64(v)}, {"mod_revision", "1"}});
        }
      }
      json out = {{"header", json::object()}};
      if (!kvs.empty()) out["kvs"] = kvs;
      res.set_content(out.dump(), "application/json");
    });
    server_.Post("/v3/lease/grant", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"header":{},"ID":"77","TTL":"3"})", "application/json");
    });
    server_.Post("/v3/kv/put", [this](const httplib::Request& req, httplib::Response& res) {
      const json in = json::parse(req.body);
      Set(*ej::FromBase64(in["key"].get<std::string>()),
          *ej::FromBase64(in["value"].get<std::string>()));
      res.set_content(R"({"header":{}})", "application/json");
    });
    server_.Post("/v3/lease/revoke", [](const httplib::Request&, httplib::Response& res) {
      res.status = 404;
      res.set_content(R"({"error":"x","message":"etcdserver: requested lease not found","code":5})",
                      "application/json");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~FakeEtcd() { Stop(); }
  void Stop() {
    server_.stop();
    if (thread_.joinable()) thread_.join();
  }

  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  void Set(const std::string& key, const std::string& value) {
    absl::MutexLock lock(&mu_);
    kvs_[key] = value;
  }
  void Erase(const std::string& key) {
    absl::MutexLock lock(&mu_);
    kvs_.erase(key);
  }
  int ranges() {
    absl::MutexLock lock(&mu_);
    return ranges_;
  }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  absl::Mutex mu_;
  std::map<std::string, std::string> kvs_ ABSL_GUARDED_BY(mu_);
  int ranges_ ABSL_GUARDED_BY(mu_) = 0;
};

// A port nothing listens on: bound and closed again.
std::string DeadEndpoint() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  PD_CHECK(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  PD_CHECK(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  close(fd);
  return "http://127.0.0.1:" + std::to_string(ntohs(a.sin_port));
}

TEST(EtcdClientTest, SkipsAnEndpointThatDoesNotAnswer) {
  FakeEtcd etcd;
  EtcdClient client({DeadEndpoint(), etcd.endpoint()}, absl::Milliseconds(500));
  ASSERT_TRUE(client.Put("/x/a", "1", 0).ok());
  absl::StatusOr<int64_t> lease = client.GrantLease(3);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(*lease, 77);
  absl::StatusOr<std::vector<EtcdKeyValue>> kvs = client.RangePrefix("/x/");
  ASSERT_TRUE(kvs.ok()) << kvs.status();
  ASSERT_EQ(kvs->size(), 1u);
  EXPECT_EQ((*kvs)[0].key, "/x/a");
  EXPECT_EQ((*kvs)[0].value, "1");
  EXPECT_THAT(client.RevokeLease(5), StatusIs(absl::StatusCode::kNotFound, "lease"));
}

TEST(EtcdClientTest, NoEndpointAnsweringIsUnavailableNamingThem) {
  const std::string dead = DeadEndpoint();
  EtcdClient client({dead}, absl::Milliseconds(500));
  EXPECT_THAT(client.RangePrefix("/x/"),
              StatusIs(absl::StatusCode::kUnavailable, "etcd unreachable (" + dead));
}

// The watcher adds what appears, removes what disappears or changes, skips bad records and names
// that are taken, and keeps its nodes while etcd cannot be read.
TEST(EtcdNodeWatcherTest, FollowsTheKeys) {
  FakeEtcd etcd;
  RouterOptions ro;
  ro.nodes.push_back(NodeOptions{"static", "decode", "127.0.0.1:1"});
  absl::StatusOr<std::unique_ptr<NodeRegistry>> registry = NodeRegistry::Create(ro, nullptr);
  ASSERT_TRUE(registry.ok()) << registry.status();
  EtcdOptions eo;
  eo.endpoints = {etcd.endpoint()};
  eo.poll_interval_ms = 100000;  // only the explicit SyncOnce calls below
  const NodeOptions d1{"d1", "decode", "127.0.0.1:2"}, p1{"p1", "prefill", "127.0.0.1:3"};
  etcd.Set(EtcdNodeKey(eo, d1), EtcdNodeValue(d1));
  etcd.Set("/pdserve/nodes/decode/bad", "{");
  etcd.Set("/pdserve/nodes/decode/static", EtcdNodeValue({"static", "decode", "127.0.0.1:9"}));
  etcd.Set("/other/nodes/decode/x", EtcdNodeValue({"x", "decode", "127.0.0.1:9"}));

  absl::StatusOr<std::unique_ptr<EtcdNodeWatcher>> watcher = EtcdNodeWatcher::Start(eo, **registry);
  ASSERT_TRUE(watcher.ok()) << watcher.status();
  auto names = [&] {
    std::vector<std::string> out;
    for (const NodeStatus& s : (*registry)->Snapshot()) out.push_back(s.name + "@" + s.address);
    return out;
  };
  // Start read the prefix once: d1 is in; the bad record and the taken name are skipped.
  EXPECT_THAT(names(), ElementsAre("static@127.0.0.1:1", "d1@127.0.0.1:2"));

  etcd.Set(EtcdNodeKey(eo, p1), EtcdNodeValue(p1));
  ASSERT_TRUE((*watcher)->SyncOnce().ok());
  EXPECT_THAT(names(), ElementsAre("static@127.0.0.1:1", "d1@127.0.0.1:2", "p1@127.0.0.1:3"));

  // d1 restarts elsewhere under the same name; p1's lease ends.
  etcd.Set(EtcdNodeKey(eo, d1), EtcdNodeValue({"d1", "decode", "127.0.0.1:4"}));
  etcd.Erase(EtcdNodeKey(eo, p1));
  ASSERT_TRUE((*watcher)->SyncOnce().ok());
  EXPECT_THAT(names(), ElementsAre("static@127.0.0.1:1", "d1@127.0.0.1:4"));
  ASSERT_EQ((*watcher)->Nodes().size(), 1u);

  // etcd down: the registry keeps what it has.
  etcd.Stop();
  EXPECT_THAT((*watcher)->SyncOnce(), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(names(), ElementsAre("static@127.0.0.1:1", "d1@127.0.0.1:4"));
}

TEST(EtcdNodeWatcherTest, PollsOnItsOwnAndNeedsEndpoints) {
  FakeEtcd etcd;
  absl::StatusOr<std::unique_ptr<NodeRegistry>> registry =
      NodeRegistry::Create(RouterOptions(), nullptr);
  ASSERT_TRUE(registry.ok()) << registry.status();
  EXPECT_THAT(EtcdNodeWatcher::Start(EtcdOptions(), **registry),
              StatusIs(absl::StatusCode::kInvalidArgument, "etcd.endpoints"));
  EtcdOptions eo;
  eo.endpoints = {etcd.endpoint()};
  eo.poll_interval_ms = 20;
  absl::StatusOr<std::unique_ptr<EtcdNodeWatcher>> watcher = EtcdNodeWatcher::Start(eo, **registry);
  ASSERT_TRUE(watcher.ok()) << watcher.status();
  etcd.Set("/pdserve/nodes/decode/d9", EtcdNodeValue({"d9", "decode", "127.0.0.1:5"}));
  const absl::Time end = absl::Now() + absl::Seconds(5);
  while ((*registry)->Snapshot().empty() && absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ((*registry)->Snapshot().size(), 1u);
  EXPECT_EQ((*registry)->Snapshot()[0].name, "d9");
  watcher->reset();  // stops polling; the node stays
  const int ranges = etcd.ranges();
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(etcd.ranges(), ranges);
  EXPECT_EQ((*registry)->Snapshot().size(), 1u);
}

}  // namespace
}  // namespace pd::router
