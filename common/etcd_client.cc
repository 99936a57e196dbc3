#include "common/etcd_client.h"

#include <httplib.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/escaping.h"
#include "common/net.h"
#include "common/status.h"
#include "common/strings.h"

namespace pd {
namespace etcd_json {
namespace {

using json = nlohmann::json;

absl::StatusOr<json> ParseObject(std::string_view body) {
  json j = json::parse(body, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InternalError(
        StrCat("etcd answered something that is not a JSON object: '", body.substr(0, 200), "'"));
  }
  return j;
}

// The gateway writes int64 fields as decimal strings; plain numbers are accepted too. A missing
// field is 0 (proto3 JSON leaves out zero values).
absl::StatusOr<int64_t> Int64Field(const json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return 0;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_string()) {
    const std::string& s = it->get_ref<const std::string&>();
    int64_t v = 0;
    size_t used = 0;
    try {
      v = std::stoll(s, &used);
    } catch (...) {
      used = 0;
    }
    if (used == s.size() && !s.empty()) return v;
  }
  return absl::InternalError(StrCat("etcd answered a bad '", name, "': ", it->dump()));
}

absl::StatusOr<std::string> Base64Field(const json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return std::string();
  if (!it->is_string()) {
    return absl::InternalError(StrCat("etcd answered a bad '", name, "': ", it->dump()));
  }
  absl::StatusOr<std::string> s = FromBase64(it->get_ref<const std::string&>());
  if (!s.ok()) return absl::InternalError(StrCat("etcd answered a bad '", name, "'"));
  return s;
}

}  // namespace

std::string Base64(std::string_view bytes) { return absl::Base64Escape(ToAbsl(bytes)); }

absl::StatusOr<std::string> FromBase64(std::string_view text) {
  std::string out;
  if (!absl::Base64Unescape(ToAbsl(text), &out)) {
    return absl::InvalidArgumentError(StrCat("not base64: '", text.substr(0, 100), "'"));
  }
  return out;
}

std::string PrefixRangeEnd(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    unsigned char& last = reinterpret_cast<unsigned char&>(end.back());
    if (last < 0xff) {
      ++last;
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

// int64 fields go as strings, like the gateway's own output (JSON numbers lose precision
// beyond 2^53 in many readers).
std::string GrantBody(int ttl_s) { return json{{"TTL", std::to_string(ttl_s)}}.dump(); }

std::string LeaseBody(int64_t lease) { return json{{"ID", std::to_string(lease)}}.dump(); }

std::string PutBody(std::string_view key, std::string_view value, int64_t lease) {
  json j{{"key", Base64(key)}, {"value", Base64(value)}};
  if (lease != 0) j["lease"] = std::to_string(lease);
  return j.dump();
}

std::string RangeBody(std::string_view key, std::string_view range_end) {
  return json{{"key", Base64(key)}, {"range_end", Base64(range_end)}}.dump();
}

absl::StatusOr<int64_t> ParseGrant(std::string_view body) {
  PD_ASSIGN_OR_RETURN(json j, ParseObject(body));
  if (j.contains("error")) {
    return absl::InternalError(StrCat("etcd: lease grant failed: ", j["error"].dump()));
  }
  PD_ASSIGN_OR_RETURN(int64_t id, Int64Field(j, "ID"));
  if (id == 0) return absl::InternalError(StrCat("etcd: lease grant answered no ID: ", body));
  return id;
}

absl::StatusOr<int64_t> ParseKeepAlive(std::string_view body) {
  // The endpoint streams; one request gives one message, possibly followed by a newline.
  PD_ASSIGN_OR_RETURN(json j, ParseObject(body));
  if (auto err = j.find("error"); err != j.end()) {
    return absl::InternalError(StrCat("etcd: lease keepalive failed: ", err->dump()));
  }
  const json& r = j.contains("result") ? j["result"] : j;
  if (!r.is_object()) return absl::InternalError(StrCat("etcd: bad keepalive answer: ", body));
  PD_ASSIGN_OR_RETURN(int64_t ttl, Int64Field(r, "TTL"));
  if (ttl <= 0) return absl::NotFoundError("etcd: the lease has expired or was revoked");
  return ttl;
}

absl::StatusOr<std::vector<EtcdKeyValue>> ParseRange(std::string_view body) {
  PD_ASSIGN_OR_RETURN(json j, ParseObject(body));
  std::vector<EtcdKeyValue> out;
  auto kvs = j.find("kvs");
  if (kvs == j.end() || kvs->is_null()) return out;  // no key: the field is left out
  if (!kvs->is_array()) return absl::InternalError(StrCat("etcd: bad range answer: ", body));
  for (const json& kv : *kvs) {
    if (!kv.is_object()) return absl::InternalError(StrCat("etcd: bad range answer: ", body));
    EtcdKeyValue e;
    PD_ASSIGN_OR_RETURN(e.key, Base64Field(kv, "key"));
    PD_ASSIGN_OR_RETURN(e.value, Base64Field(kv, "value"));
    PD_ASSIGN_OR_RETURN(e.lease, Int64Field(kv, "lease"));
    PD_ASSIGN_OR_RETURN(e.mod_revision, Int64Field(kv, "mod_revision"));
    out.push_back(std::move(e));
  }
  return out;
}

absl::Status ParseError(int http_status, std::string_view body) {
  // The gateway may follow the JSON with trailers in the chunked body; parse up to the last '}'.
  const size_t end = body.rfind('}');
  json j = end == std::string_view::npos
               ? json()
               : json::parse(body.substr(0, end + 1), nullptr, /*allow_exceptions=*/false);
  std::string message = StrCat("etcd: HTTP ", http_status);
  absl::StatusCode code = absl::StatusCode::kUnknown;
  if (j.is_object()) {
    auto c = j.find("code");
    if (c != j.end() && c->is_number_integer()) {
      const int v = c->get<int>();
      if (v > 0 && v <= 16) code = static_cast<absl::StatusCode>(v);
    }
    auto m = j.find("message");
    if (m == j.end() || !m->is_string()) m = j.find("error");
    if (m != j.end() && m->is_string()) message += StrCat(": ", m->get<std::string>());
  } else if (!body.empty()) {
    message += StrCat(": ", body.substr(0, 200));
  }
  return absl::Status(code, message);
}

}  // namespace etcd_json

namespace {

std::string Describe(httplib::Error e) {
  switch (e) {
    case httplib::Error::Connection:
      return "cannot connect";
    case httplib::Error::ConnectionTimeout:
      return "connection timed out";
    case httplib::Error::Read:
      return "no answer (read failed or timed out)";
    case httplib::Error::Write:
      return "write failed";
    default:
      return StrCat("HTTP client error: ", httplib::to_string(e));
  }
}

}  // namespace

EtcdClient::EtcdClient(std::vector<std::string> endpoints, absl::Duration timeout)
    : endpoints_(std::move(endpoints)), timeout_(timeout) {}

absl::StatusOr<std::string> EtcdClient::Post(const std::string& path, const std::string& body) {
  const size_t n = endpoints_.size();
  if (n == 0) return absl::FailedPreconditionError("etcd: no endpoint configured");
  const auto timeout = absl::ToChronoMicroseconds(timeout_);
  const size_t first = preferred_.load() % n;
  std::string errors;
  for (size_t i = 0; i < n; ++i) {
    const size_t k = (first + i) % n;
    // One client per request: httplib::Client is not thread safe, and the calls are few.
    httplib::Client client(endpoints_[k]);
    client.set_connection_timeout(timeout);
    client.set_read_timeout(timeout);
    client.set_write_timeout(timeout);
    httplib::Result r = client.Post(path.c_str(), body, "application/json");
    if (!r) {
      errors += StrCat(errors.empty() ? "" : "; ", endpoints_[k], ": ", Describe(r.error()));
      continue;
    }
    preferred_.store(k);
    if (r->status != 200) return etcd_json::ParseError(r->status, r->body);
    return std::move(r->body);
  }
  return absl::UnavailableError(StrCat("etcd unreachable (", errors, ")"));
}

absl::StatusOr<int64_t> EtcdClient::GrantLease(int ttl_s) {
  PD_ASSIGN_OR_RETURN(std::string body, Post("/v3/lease/grant", etcd_json::GrantBody(ttl_s)));
  return etcd_json::ParseGrant(body);
}

absl::StatusOr<int64_t> EtcdClient::KeepAlive(int64_t lease) {
  PD_ASSIGN_OR_RETURN(std::string body, Post("/v3/lease/keepalive", etcd_json::LeaseBody(lease)));
  return etcd_json::ParseKeepAlive(body);
}

absl::Status EtcdClient::RevokeLease(int64_t lease) {
  return Post("/v3/lease/revoke", etcd_json::LeaseBody(lease)).status();
}

absl::Status EtcdClient::Put(std::string_view key, std::string_view value, int64_t lease) {
  return Post("/v3/kv/put", etcd_json::PutBody(key, value, lease)).status();
}

absl::StatusOr<std::vector<EtcdKeyValue>> EtcdClient::RangePrefix(std::string_view prefix) {
  PD_ASSIGN_OR_RETURN(
      std::string body,
      Post("/v3/kv/range", etcd_json::RangeBody(prefix, etcd_json::PrefixRangeEnd(prefix))));
  return etcd_json::ParseRange(body);
}

std::string EtcdNodesPrefix(const EtcdOptions& o) { return StrCat(o.prefix, "nodes/"); }

std::string EtcdNodeKey(const EtcdOptions& o, const NodeOptions& node) {
  return StrCat(EtcdNodesPrefix(o), node.role, "/", node.name);
}

std::string EtcdNodeValue(const NodeOptions& node) {
  return nlohmann::json{{"name", node.name}, {"role", node.role}, {"address", node.address}}.dump();
}

absl::StatusOr<NodeOptions> ParseEtcdNode(std::string_view nodes_prefix, std::string_view key,
                                          std::string_view value) {
  auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(StrCat("etcd key ", key, ": ", why));
  };
  nlohmann::json j = nlohmann::json::parse(value, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return bad("the value is not a JSON object");
  NodeOptions n;
  for (auto [field, out] : {std::pair<const char*, std::string*>{"name", &n.name},
                            {"role", &n.role},
                            {"address", &n.address}}) {
    auto it = j.find(field);
    if (it == j.end() || !it->is_string() || it->get_ref<const std::string&>().empty()) {
      return bad(StrCat("'", field, "' must be a non-empty string"));
    }
    *out = it->get<std::string>();
  }
  if (n.role != "prefill" && n.role != "decode") {
    return bad(StrCat("role must be prefill or decode (got '", n.role, "')"));
  }
  if (!SplitHostPort(n.address, nullptr, nullptr).ok()) {
    return bad(StrCat("address must be host:port (got '", n.address, "')"));
  }
  if (key != StrCat(nodes_prefix, n.role, "/", n.name)) {
    return bad(
        StrCat("the key does not match the value's role and name (", n.role, ", ", n.name, ")"));
  }
  return n;
}

}  // namespace pd
