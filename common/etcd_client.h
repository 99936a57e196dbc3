// A small client of etcd's v3 HTTP/JSON gateway (etcd 3.4: POST /v3/lease/grant,
// /v3/lease/keepalive, /v3/lease/revoke, /v3/kv/put, /v3/kv/range), enough for the cluster
// membership of docs/cluster.md ("etcd membership"), and that membership's key and value schema,
// shared by the nodes (node/etcd_registration.h) and the router (router/etcd_watcher.h).
//
// The gateway speaks JSON: keys and values are base64, 64-bit integers are decimal strings, and
// errors come back as a non-200 status with {"error", "message", "code"} (code: a gRPC code).
// Each call is one HTTP request (no connection kept); an endpoint that cannot be reached is
// skipped for the next one in the list, and the one that answered is tried first next time.
//
// Errors: UNAVAILABLE when no endpoint answered (connection refused, timeout); etcd's own code
// otherwise (NOT_FOUND for an unknown or expired lease); INTERNAL for an answer that is not the
// JSON the gateway sends.
// Thread safety: every method may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/config.h"

namespace pd {

struct EtcdKeyValue {
  std::string key, value;  // decoded
  int64_t lease = 0;       // 0: none
  int64_t mod_revision = 0;
};

class EtcdClient {
 public:
  // `endpoints`: "http://host:port" (EtcdOptions::endpoints, validated there); not empty.
  // `timeout`: connect and read deadline of one request to one endpoint.
  EtcdClient(std::vector<std::string> endpoints, absl::Duration timeout);

  // A lease of `ttl_s` seconds; returns its id.
  absl::StatusOr<int64_t> GrantLease(int ttl_s);
  // Renews the lease; returns the TTL it got. NOT_FOUND when the lease is gone (expired or
  // revoked): its keys are deleted and a new lease is needed.
  absl::StatusOr<int64_t> KeepAlive(int64_t lease);
  // Revokes the lease: its keys are deleted at once. NOT_FOUND when it was already gone.
  absl::Status RevokeLease(int64_t lease);
  // Puts `key` = `value`, attached to `lease` (0: none).
  absl::Status Put(std::string_view key, std::string_view value, int64_t lease);
  // Every key that starts with `prefix`, in key order.
  absl::StatusOr<std::vector<EtcdKeyValue>> RangePrefix(std::string_view prefix);

  const std::vector<std::string>& endpoints() const { return endpoints_; }

 private:
  // POSTs `body` to `path` on the first endpoint that answers; returns the response body.
  absl::StatusOr<std::string> Post(const std::string& path, const std::string& body);

  const std::vector<std::string> endpoints_;
  const absl::Duration timeout_;
  std::atomic<size_t> preferred_{0};  // the endpoint that answered last
};

// The JSON of the gateway, exposed for tests. Bodies are what the client sends; the parsers take
// what etcd answers (200) and return INTERNAL for anything else.
namespace etcd_json {

std::string Base64(std::string_view bytes);
// INVALID_ARGUMENT for text that is not standard base64.
absl::StatusOr<std::string> FromBase64(std::string_view text);
// The range_end that selects every key starting with `prefix` (the prefix with its last byte
// incremented, trailing 0xff bytes dropped); "\0" (every key) for a prefix of only 0xff bytes.
std::string PrefixRangeEnd(std::string_view prefix);

std::string GrantBody(int ttl_s);
std::string LeaseBody(int64_t lease);  // keepalive and revoke
std::string PutBody(std::string_view key, std::string_view value, int64_t lease);
std::string RangeBody(std::string_view key, std::string_view range_end);

absl::StatusOr<int64_t> ParseGrant(std::string_view body);  // the lease id
// The TTL; NOT_FOUND when etcd answered without one (the lease is gone). Accepts the streamed
// form {"result": {...}} and the plain one.
absl::StatusOr<int64_t> ParseKeepAlive(std::string_view body);
absl::StatusOr<std::vector<EtcdKeyValue>> ParseRange(std::string_view body);
// A non-200 answer as a Status: etcd's code (a gRPC code) and message; UNKNOWN when the body does
// not say. `http_status` goes into the message.
absl::Status ParseError(int http_status, std::string_view body);

}  // namespace etcd_json

// The membership schema: `<prefix>nodes/<role>/<name>` = {"name", "role", "address"}.
std::string EtcdNodesPrefix(const EtcdOptions& o);  // "<prefix>nodes/"
std::string EtcdNodeKey(const EtcdOptions& o, const NodeOptions& node);
std::string EtcdNodeValue(const NodeOptions& node);
// The node a key and value describe. INVALID_ARGUMENT when the value is not that JSON, a field is
// missing or empty, the role is not prefill or decode, the address has no port, or the key does
// not match the value's role and name (`key` is the full key, `nodes_prefix` EtcdNodesPrefix()).
absl::StatusOr<NodeOptions> ParseEtcdNode(std::string_view nodes_prefix, std::string_view key,
                                          std::string_view value);

}  // namespace pd
