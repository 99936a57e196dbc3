#include "common/config.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"
#include "common/net.h"
#include "common/status.h"
#include "common/strings.h"

namespace pd {
namespace {

// Reads one YAML mapping into fields, remembering which keys were used so that the rest can be
// reported as unknown. yaml-cpp throws; every call here converts that into the first error.
class MapReader {
 public:
  MapReader(const YAML::Node& node, std::string path) : node_(node), path_(std::move(path)) {
    if (node_ && !node_.IsNull() && !node_.IsMap()) {
      Fail(Where(), "expected a mapping");
    }
  }

  absl::Status status() const { return status_; }

  template <typename T>
  void Get(const char* key, T* out) {
    used_.push_back(key);
    if (!status_.ok() || !IsMap()) return;
    const YAML::Node v = node_[key];
    if (!v || v.IsNull()) return;  // keep the default
    const std::string where = Join(key);
    if (!v.IsScalar()) return Fail(where, "expected a single value");
    if constexpr (std::is_same_v<T, std::string>) {
      *out = v.Scalar();
    } else if constexpr (std::is_same_v<T, bool>) {
      bool b = false;
      if (!YAML::convert<bool>::decode(v, b)) {
        return Fail(where, StrCat("expected true or false, got '", v.Scalar(), "'"));
      }
      *out = b;
    } else if constexpr (std::is_integral_v<T>) {
      int64_t x = 0;
      if (!YAML::convert<int64_t>::decode(v, x) || x < std::numeric_limits<T>::min() ||
          x > std::numeric_limits<T>::max()) {
        return Fail(where, StrCat("expected an integer, got '", v.Scalar(), "'"));
      }
      *out = static_cast<T>(x);
    } else {
      static_assert(std::is_floating_point_v<T>);
      double x = 0;
      if (!YAML::convert<double>::decode(v, x) || !std::isfinite(x)) {
        return Fail(where, StrCat("expected a number, got '", v.Scalar(), "'"));
      }
      *out = static_cast<T>(x);
    }
  }

  // A list of mappings; `read` fills one element from its reader (whose keys are checked).
  template <typename T, typename F>
  void GetList(const char* key, std::vector<T>* out, F read) {
    used_.push_back(key);
    if (!status_.ok() || !IsMap()) return;
    const YAML::Node v = node_[key];
    if (!v || v.IsNull()) return;
    const std::string where = Join(key);
    if (!v.IsSequence()) return Fail(where, "expected a list");
    out->clear();
    for (size_t i = 0; i < v.size(); ++i) {
      MapReader r(v[i], StrCat(where, "[", i, "]"));
      T item;
      read(r, &item);
      Merge(r);
      if (!status_.ok()) return;
      out->push_back(std::move(item));
    }
  }

  void GetStrings(const char* key, std::vector<std::string>* out) {
    used_.push_back(key);
    if (!status_.ok() || !IsMap()) return;
    const YAML::Node v = node_[key];
    if (!v || v.IsNull()) return;
    const std::string where = Join(key);
    if (!v.IsSequence()) return Fail(where, "expected a list of strings");
    out->clear();
    for (size_t i = 0; i < v.size(); ++i) {
      if (!v[i].IsScalar()) return Fail(StrCat(where, "[", i, "]"), "expected a string");
      out->push_back(v[i].Scalar());
    }
  }

  // A nested mapping; its own unknown keys are checked by its Finish().
  MapReader Child(const char* key) {
    used_.push_back(key);
    YAML::Node v;
    if (status_.ok() && IsMap()) v = node_[key];
    return MapReader(v, Join(key));
  }

  // Merges a child's status and reports keys nobody asked for.
  void Merge(const MapReader& child) {
    if (status_.ok()) status_ = child.Finish();
  }

  absl::Status Finish() const {
    PD_RETURN_IF_ERROR(status_);
    if (!IsMap()) return absl::OkStatus();
    std::vector<std::pair<std::string, int>> seen;  // key, line
    for (auto it = node_.begin(); it != node_.end(); ++it) {
      const std::string key = it->first.Scalar();
      const int line = it->first.Mark().line + 1;
      for (const auto& [k, first_line] : seen) {
        // yaml-cpp keeps both and reads the first: a silent surprise, so refuse it.
        if (k == key) {
          return absl::InvalidArgumentError(
              StrCat(Join(key), ": duplicate key (lines ", first_line, " and ", line, ")"));
        }
      }
      seen.emplace_back(key, line);
      bool known = false;
      for (const std::string& u : used_) known = known || u == key;
      if (!known) {
        std::string valid;
        for (const std::string& u : used_) valid += StrCat(valid.empty() ? "" : ", ", u);
        return absl::InvalidArgumentError(StrCat(Join(key), ": unknown key (line ",
                                                 it->first.Mark().line + 1, "; valid keys: ", valid,
                                                 ")"));
      }
    }
    return absl::OkStatus();
  }

 private:
  bool IsMap() const { return node_ && node_.IsMap(); }
  std::string Join(std::string_view key) const {
    return path_.empty() ? std::string(key) : StrCat(path_, ".", key);
  }
  std::string Where() const { return path_.empty() ? "(top level)" : path_; }
  void Fail(const std::string& where, const std::string& what) {
    if (status_.ok()) status_ = absl::InvalidArgumentError(StrCat(where, ": ", what));
  }

  YAML::Node node_;
  std::string path_;
  std::vector<std::string> used_;
  absl::Status status_;
};

void ReadListen(MapReader& parent, const char* key, ListenOptions* o) {
  MapReader r = parent.Child(key);
  r.Get("enabled", &o->enabled);
  r.Get("host", &o->host);
  r.Get("port", &o->port);
  parent.Merge(r);
}

absl::Status Check(bool ok, std::string_view field, std::string_view rule, const auto& value) {
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(StrCat(field, ": ", rule, " (got ", value, ")"));
}

absl::Status ValidateEtcd(const EtcdOptions& etcd) {
  for (size_t i = 0; i < etcd.endpoints.size(); ++i) {
    const std::string& e = etcd.endpoints[i];
    // The gateway is reached with plain HTTP; the port is required (etcd's default is 2379).
    if (e.rfind("http://", 0) != 0 || e.find('/', 7) != std::string::npos ||
        !SplitHostPort(std::string_view(e).substr(7), nullptr, nullptr).ok()) {
      return absl::InvalidArgumentError(
          StrCat("etcd.endpoints[", i, "]: must be http://host:port (got '", e, "')"));
    }
  }
  if (etcd.prefix.empty() || etcd.prefix.back() != '/') {
    return absl::InvalidArgumentError(
        StrCat("etcd.prefix: must end with '/' (got '", etcd.prefix, "')"));
  }
  // etcd raises TTLs below its minimum (1.5 s with its default timings) to 2 s.
  PD_RETURN_IF_ERROR(Check(etcd.lease_ttl_s >= 2 && etcd.lease_ttl_s <= 3600, "etcd.lease_ttl_s",
                           "must be in [2, 3600]", etcd.lease_ttl_s));
  PD_RETURN_IF_ERROR(Check(etcd.poll_interval_ms >= 10, "etcd.poll_interval_ms", "must be >= 10",
                           etcd.poll_interval_ms));
  if (etcd.node_name.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(
        StrCat("etcd.node_name: must not contain '/' (got '", etcd.node_name, "')"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ServeOptions::Validate() const {
  if (!model.chat_template.empty() && model.chat_template != "gemma" &&
      model.chat_template != "chatml" && model.chat_template != "llama3" &&
      model.chat_template != "llama2" && model.chat_template != "phi3") {
    return absl::InvalidArgumentError(
        StrCat("model.chat_template: must be gemma, chatml, llama3, llama2, phi3 or empty (got '",
               model.chat_template, "')"));
  }
  if (model.backend != "cpu" && model.backend != "cuda") {
    return absl::InvalidArgumentError(
        StrCat("model.backend: must be cpu or cuda (got '", model.backend, "')"));
  }
  if (model.gpu_layers != "all" && model.gpu_layers != "auto" &&
      (model.gpu_layers.empty() ||
       model.gpu_layers.find_first_not_of("0123456789") != std::string::npos ||
       model.gpu_layers.size() > 6)) {
    return absl::InvalidArgumentError(StrCat(
        "model.gpu_layers: must be all, auto or a layer count (got '", model.gpu_layers, "')"));
  }
  if (model.gpu_layers != "all" && model.backend != "cuda") {
    return absl::InvalidArgumentError(
        StrCat("model.gpu_layers: '", model.gpu_layers,
               "' places layers on a GPU; it needs backend: cuda (the backend is ", model.backend,
               ")"));
  }
  PD_RETURN_IF_ERROR(Check(model.context >= 0, "model.context", "must be >= 0", model.context));
  PD_RETURN_IF_ERROR(Check(threads >= 0, "threads", "must be >= 0", threads));
  for (const auto& [name, l] :
       {std::pair<const char*, const ListenOptions*>{"grpc", &grpc}, {"http", &http}}) {
    PD_RETURN_IF_ERROR(Check(l->port >= 0 && l->port <= 65535, StrCat(name, ".port"),
                             "must be in [0, 65535]", l->port));
    if (l->enabled && l->host.empty()) {
      return absl::InvalidArgumentError(StrCat(name, ".host: must not be empty"));
    }
  }
  {
    const HttpLimitsOptions& l = http_limits;
    PD_RETURN_IF_ERROR(Check(l.max_connections >= 1, "http.max_connections", "must be >= 1",
                             l.max_connections));
    PD_RETURN_IF_ERROR(Check(l.max_connections_per_address >= 0,
                             "http.max_connections_per_address", "must be >= 0",
                             l.max_connections_per_address));
    for (const auto& [name, v] : {std::pair<const char*, int>{"http.header_timeout_ms",
                                                              l.header_timeout_ms},
                                  {"http.body_timeout_ms", l.body_timeout_ms},
                                  {"http.idle_timeout_ms", l.idle_timeout_ms},
                                  {"http.write_timeout_ms", l.write_timeout_ms},
                                  {"http.threads", l.threads},
                                  {"http.io_threads", l.io_threads}}) {
      PD_RETURN_IF_ERROR(Check(v >= 1, name, "must be >= 1", v));
    }
  }
  if (tls.cert_file.empty() != tls.key_file.empty()) {
    return absl::InvalidArgumentError(
        "tls: cert_file and key_file go together (both set: TLS; both empty: plaintext)");
  }
  {
    const ClusterTlsOptions& c = cluster_tls;
    const int set = !c.ca_file.empty() + !c.cert_file.empty() + !c.key_file.empty();
    if (set != 0 && set != 3) {
      return absl::InvalidArgumentError(
          "cluster_tls: ca_file, cert_file and key_file go together (mutual TLS)");
    }
  }
  PD_RETURN_IF_ERROR(Check(admission.max_waiting >= 0, "admission.max_waiting", "must be >= 0",
                           admission.max_waiting));
  PD_RETURN_IF_ERROR(Check(admission.ttft_slo_ms >= 0, "admission.ttft_slo_ms", "must be >= 0",
                           admission.ttft_slo_ms));
  PD_RETURN_IF_ERROR(Check(admission.slo_headroom > 0 && admission.slo_headroom <= 1,
                           "admission.slo_headroom", "must be in (0, 1]", admission.slo_headroom));
  for (size_t i = 0; i < api_keys.size(); ++i) {
    if (api_keys[i].empty()) {
      return absl::InvalidArgumentError(StrCat("api_keys[", i, "]: must not be empty"));
    }
  }
  const SchedulerConfigOptions& s = scheduler;
  PD_RETURN_IF_ERROR(Check(s.max_running_seqs >= 1, "scheduler.max_running_seqs", "must be >= 1",
                           s.max_running_seqs));
  PD_RETURN_IF_ERROR(
      Check(s.max_waiting >= 0, "scheduler.max_waiting", "must be >= 0", s.max_waiting));
  PD_RETURN_IF_ERROR(Check(s.max_total_tokens >= 0, "scheduler.max_total_tokens", "must be >= 0",
                           s.max_total_tokens));
  PD_RETURN_IF_ERROR(Check(s.token_budget >= s.max_running_seqs, "scheduler.token_budget",
                           StrCat("must be >= scheduler.max_running_seqs (", s.max_running_seqs,
                                  ") so that every running sequence decodes each step"),
                           s.token_budget));
  PD_RETURN_IF_ERROR(
      Check(s.prefill_chunk >= 1, "scheduler.prefill_chunk", "must be >= 1", s.prefill_chunk));
  PD_RETURN_IF_ERROR(Check(s.step_time_stretch == 0 || s.step_time_stretch >= 1,
                           "scheduler.step_time_stretch", "must be 0 (off) or >= 1",
                           s.step_time_stretch));
  PD_RETURN_IF_ERROR(Check(s.min_prefill_chunk >= 1, "scheduler.min_prefill_chunk",
                           "must be >= 1", s.min_prefill_chunk));
  PD_RETURN_IF_ERROR(Check(s.prefill_pace_steps >= 0, "scheduler.prefill_pace_steps",
                           "must be >= 0", s.prefill_pace_steps));
  PD_RETURN_IF_ERROR(Check(s.prompt_rate_steps >= 1, "scheduler.prompt_rate_steps", "must be >= 1",
                           s.prompt_rate_steps));
  if (kv.dtype != "f16" && kv.dtype != "int8" && kv.dtype != "f32") {
    return absl::InvalidArgumentError(
        StrCat("kv.dtype: must be f16, int8 or f32 (got '", kv.dtype, "')"));
  }
  PD_RETURN_IF_ERROR(Check(kv.memory_mib >= 1, "kv.memory_mib", "must be >= 1", kv.memory_mib));
  PD_RETURN_IF_ERROR(Check(kv.block_size >= 1 && kv.block_size <= 1024, "kv.block_size",
                           "must be in [1, 1024]", kv.block_size));
  PD_RETURN_IF_ERROR(Check(prefix_cache.min_free_blocks >= 0, "prefix_cache.min_free_blocks",
                           "must be >= 0", prefix_cache.min_free_blocks));
  PD_RETURN_IF_ERROR(Check(prefix_cache.summary_blocks >= 0, "prefix_cache.summary_blocks",
                           "must be >= 0", prefix_cache.summary_blocks));
  PD_RETURN_IF_ERROR(Check(prefix_cache.compress_idle_ms >= 0, "prefix_cache.compress_idle_ms",
                           "must be >= 0", prefix_cache.compress_idle_ms));
  if (prefix_cache.compress_idle_ms > 0 && kv.dtype != "f16") {
    return absl::InvalidArgumentError(StrCat(
        "prefix_cache.compress_idle_ms: compresses f16 KV blocks to INT8; kv.dtype is ", kv.dtype));
  }
  const SpeculativeConfigOptions& sp = speculative;
  if (sp.drafter.empty()) {
    return absl::InvalidArgumentError(
        "speculative.drafter: must be off, ngram, self, self-head or a draft GGUF path (got '')");
  }
  PD_RETURN_IF_ERROR(
      Check(sp.max_k >= 1 && sp.max_k <= 16, "speculative.max_k", "must be in [1, 16]", sp.max_k));
  PD_RETURN_IF_ERROR(
      Check(sp.min_gain > 0, "speculative.min_gain", "must be > 0", sp.min_gain));
  PD_RETURN_IF_ERROR(Check(sp.fixed_k >= 0 && sp.fixed_k <= sp.max_k, "speculative.fixed_k",
                           StrCat("must be in [0, speculative.max_k (", sp.max_k, ")]"),
                           sp.fixed_k));
  PD_RETURN_IF_ERROR(
      Check(sp.ngram_min >= 1, "speculative.ngram_min", "must be >= 1", sp.ngram_min));
  PD_RETURN_IF_ERROR(Check(sp.ngram_max >= sp.ngram_min, "speculative.ngram_max",
                           StrCat("must be >= speculative.ngram_min (", sp.ngram_min, ")"),
                           sp.ngram_max));
  PD_RETURN_IF_ERROR(Check(sp.draft_kv_mib >= 1, "speculative.draft_kv_mib", "must be >= 1",
                           sp.draft_kv_mib));
  PD_RETURN_IF_ERROR(
      Check(sp.head_rows >= 1, "speculative.head_rows", "must be >= 1", sp.head_rows));
  PD_RETURN_IF_ERROR(Check(limits.default_max_tokens >= 1, "limits.default_max_tokens",
                           "must be >= 1", limits.default_max_tokens));
  PD_RETURN_IF_ERROR(
      Check(limits.max_tokens >= limits.default_max_tokens, "limits.max_tokens",
            StrCat("must be >= limits.default_max_tokens (", limits.default_max_tokens, ")"),
            limits.max_tokens));
  PD_RETURN_IF_ERROR(Check(limits.max_body_bytes >= 1024, "limits.max_body_bytes",
                           "must be >= 1024", limits.max_body_bytes));
  PD_RETURN_IF_ERROR(Check(limits.max_stop >= 0 && limits.max_stop <= 64, "limits.max_stop",
                           "must be in [0, 64]", limits.max_stop));
  PD_RETURN_IF_ERROR(
      Check(shutdown_grace_s >= 0, "shutdown_grace_s", "must be >= 0", shutdown_grace_s));
  const RouterOptions& r = router;
  for (size_t i = 0; i < r.nodes.size(); ++i) {
    const NodeOptions& n = r.nodes[i];
    const std::string at = StrCat("router.nodes[", i, "]");
    if (n.name.empty()) return absl::InvalidArgumentError(StrCat(at, ".name: must not be empty"));
    if (n.role != "prefill" && n.role != "decode") {
      return absl::InvalidArgumentError(
          StrCat(at, ".role: must be prefill or decode (got '", n.role, "')"));
    }
    if (!SplitHostPort(n.address, nullptr, nullptr).ok()) {
      return absl::InvalidArgumentError(
          StrCat(at, ".address: must be host:port (got '", n.address, "')"));
    }
    for (size_t j = 0; j < i; ++j) {
      if (r.nodes[j].name == n.name) {
        return absl::InvalidArgumentError(StrCat(at, ".name: '", n.name, "' is used twice"));
      }
    }
  }
  PD_RETURN_IF_ERROR(Check(r.health_interval_ms >= 10, "router.health_interval_ms", "must be >= 10",
                           r.health_interval_ms));
  PD_RETURN_IF_ERROR(Check(r.health_timeout_ms >= 10, "router.health_timeout_ms", "must be >= 10",
                           r.health_timeout_ms));
  PD_RETURN_IF_ERROR(Check(r.unhealthy_after >= 1, "router.unhealthy_after", "must be >= 1",
                           r.unhealthy_after));
  if (r.decode_policy != "kv_aware" && r.decode_policy != "least_loaded" &&
      r.decode_policy != "round_robin" && r.decode_policy != "random") {
    return absl::InvalidArgumentError(
        StrCat("router.decode_policy: must be kv_aware, least_loaded, round_robin or random (got '",
               r.decode_policy, "')"));
  }
  if (r.prefill_policy != "kv_aware" && r.prefill_policy != "fewest_pending_tokens" &&
      r.prefill_policy != "round_robin") {
    return absl::InvalidArgumentError(
        StrCat("router.prefill_policy: must be kv_aware, fewest_pending_tokens or round_robin (got '",
               r.prefill_policy, "')"));
  }
  PD_RETURN_IF_ERROR(Check(r.prefix_weight >= 0 && r.prefix_weight <= 1000, "router.prefix_weight",
                           "must be in [0, 1000]", r.prefix_weight));
  PD_RETURN_IF_ERROR(
      Check(r.seq_cost_tokens >= 0, "router.seq_cost_tokens", "must be >= 0", r.seq_cost_tokens));
  PD_RETURN_IF_ERROR(
      Check(r.max_retries >= 0, "router.max_retries", "must be >= 0", r.max_retries));
  if (r.kv_wire != "f16" && r.kv_wire != "int8") {
    return absl::InvalidArgumentError(
        StrCat("router.kv_wire: must be f16 or int8 (got '", r.kv_wire, "')"));
  }
  PD_RETURN_IF_ERROR(Check(r.kv_transfer_timeout_ms >= 10, "router.kv_transfer_timeout_ms",
                           "must be >= 10", r.kv_transfer_timeout_ms));
  PD_RETURN_IF_ERROR(Check(r.disaggregate_min_prompt >= 0, "router.disaggregate_min_prompt",
                           "must be >= 0", r.disaggregate_min_prompt));
  PD_RETURN_IF_ERROR(Check(kv_transfer.staging_mib >= 1, "kv_transfer.staging_mib",
                           "must be >= 1", kv_transfer.staging_mib));
  PD_RETURN_IF_ERROR(Check(kv_transfer.prefix_pull_min_tokens >= 1,
                           "kv_transfer.prefix_pull_min_tokens", "must be >= 1",
                           kv_transfer.prefix_pull_min_tokens));
  PD_RETURN_IF_ERROR(ValidateEtcd(etcd));
  return absl::OkStatus();
}

absl::StatusOr<ServeOptions> ParseServeOptions(std::string_view yaml, std::string_view source) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(StrCat(source, ":", e.mark.line + 1, ":", e.mark.column + 1,
                                             ": YAML syntax error: ", e.msg));
  }
  ServeOptions o;
  absl::Status status;
  try {
    MapReader top(root, "");
    {
      MapReader m = top.Child("model");
      m.Get("path", &o.model.path);
      m.Get("id", &o.model.id);
      m.Get("chat_template", &o.model.chat_template);
      m.Get("context", &o.model.context);
      m.Get("backend", &o.model.backend);
      m.Get("gpu_layers", &o.model.gpu_layers);
      m.Get("quantize", &o.model.quantize);
      top.Merge(m);
    }
    top.Get("threads", &o.threads);
    ReadListen(top, "grpc", &o.grpc);
    {
      MapReader h = top.Child("http");
      h.Get("enabled", &o.http.enabled);
      h.Get("host", &o.http.host);
      h.Get("port", &o.http.port);
      HttpLimitsOptions& l = o.http_limits;
      h.Get("max_connections", &l.max_connections);
      h.Get("max_connections_per_address", &l.max_connections_per_address);
      h.Get("header_timeout_ms", &l.header_timeout_ms);
      h.Get("body_timeout_ms", &l.body_timeout_ms);
      h.Get("idle_timeout_ms", &l.idle_timeout_ms);
      h.Get("write_timeout_ms", &l.write_timeout_ms);
      h.Get("threads", &l.threads);
      h.Get("io_threads", &l.io_threads);
      top.Merge(h);
    }
    {
      MapReader t = top.Child("tls");
      t.Get("cert_file", &o.tls.cert_file);
      t.Get("key_file", &o.tls.key_file);
      top.Merge(t);
    }
    {
      MapReader c = top.Child("cluster_tls");
      c.Get("ca_file", &o.cluster_tls.ca_file);
      c.Get("cert_file", &o.cluster_tls.cert_file);
      c.Get("key_file", &o.cluster_tls.key_file);
      c.Get("server_name", &o.cluster_tls.server_name);
      top.Merge(c);
    }
    {
      MapReader a = top.Child("admission");
      a.Get("max_waiting", &o.admission.max_waiting);
      a.Get("ttft_slo_ms", &o.admission.ttft_slo_ms);
      a.Get("slo_headroom", &o.admission.slo_headroom);
      top.Merge(a);
    }
    top.GetStrings("api_keys", &o.api_keys);
    top.Get("api_keys_file", &o.api_keys_file);
    {
      MapReader s = top.Child("scheduler");
      s.Get("max_running_seqs", &o.scheduler.max_running_seqs);
      s.Get("max_waiting", &o.scheduler.max_waiting);
      s.Get("max_total_tokens", &o.scheduler.max_total_tokens);
      s.Get("token_budget", &o.scheduler.token_budget);
      s.Get("chunked_prefill", &o.scheduler.chunked_prefill);
      s.Get("prefill_chunk", &o.scheduler.prefill_chunk);
      s.Get("step_time_stretch", &o.scheduler.step_time_stretch);
      s.Get("prefill_pace_steps", &o.scheduler.prefill_pace_steps);
      s.Get("prompt_rate_steps", &o.scheduler.prompt_rate_steps);
      s.Get("min_prefill_chunk", &o.scheduler.min_prefill_chunk);
      s.Get("priority", &o.scheduler.priority);
      top.Merge(s);
    }
    {
      MapReader k = top.Child("kv");
      k.Get("dtype", &o.kv.dtype);
      k.Get("memory_mib", &o.kv.memory_mib);
      k.Get("block_size", &o.kv.block_size);
      top.Merge(k);
    }
    {
      MapReader c = top.Child("prefix_cache");
      c.Get("enabled", &o.prefix_cache.enabled);
      c.Get("min_free_blocks", &o.prefix_cache.min_free_blocks);
      c.Get("summary_blocks", &o.prefix_cache.summary_blocks);
      c.Get("compress_idle_ms", &o.prefix_cache.compress_idle_ms);
      c.Get("fill_generated", &o.prefix_cache.fill_generated);
      top.Merge(c);
    }
    {
      MapReader sp = top.Child("speculative");
      sp.Get("drafter", &o.speculative.drafter);
      sp.Get("max_k", &o.speculative.max_k);
      sp.Get("min_gain", &o.speculative.min_gain);
      sp.Get("fixed_k", &o.speculative.fixed_k);
      sp.Get("ngram_min", &o.speculative.ngram_min);
      sp.Get("ngram_max", &o.speculative.ngram_max);
      sp.Get("draft_kv_mib", &o.speculative.draft_kv_mib);
      sp.Get("head_rows", &o.speculative.head_rows);
      top.Merge(sp);
    }
    {
      MapReader l = top.Child("limits");
      l.Get("default_max_tokens", &o.limits.default_max_tokens);
      l.Get("max_tokens", &o.limits.max_tokens);
      l.Get("max_body_bytes", &o.limits.max_body_bytes);
      l.Get("max_stop", &o.limits.max_stop);
      top.Merge(l);
    }
    top.Get("shutdown_grace_s", &o.shutdown_grace_s);
    {
      MapReader r = top.Child("router");
      r.GetList("nodes", &o.router.nodes, [](MapReader& n, NodeOptions* node) {
        n.Get("name", &node->name);
        n.Get("role", &node->role);
        n.Get("address", &node->address);
      });
      r.Get("health_interval_ms", &o.router.health_interval_ms);
      r.Get("health_timeout_ms", &o.router.health_timeout_ms);
      r.Get("unhealthy_after", &o.router.unhealthy_after);
      r.Get("decode_policy", &o.router.decode_policy);
      r.Get("prefill_policy", &o.router.prefill_policy);
      r.Get("prefix_weight", &o.router.prefix_weight);
      r.Get("seq_cost_tokens", &o.router.seq_cost_tokens);
      r.Get("max_retries", &o.router.max_retries);
      r.Get("disaggregate", &o.router.disaggregate);
      r.Get("kv_wire", &o.router.kv_wire);
      r.Get("kv_transfer_timeout_ms", &o.router.kv_transfer_timeout_ms);
      r.Get("disaggregate_min_prompt", &o.router.disaggregate_min_prompt);
      top.Merge(r);
    }
    {
      MapReader t = top.Child("kv_transfer");
      t.Get("enabled", &o.kv_transfer.enabled);
      t.Get("ucx_tls", &o.kv_transfer.ucx_tls);
      t.Get("peer_failure", &o.kv_transfer.peer_failure);
      t.Get("staging_mib", &o.kv_transfer.staging_mib);
      t.Get("prefix_pull", &o.kv_transfer.prefix_pull);
      t.Get("prefix_pull_min_tokens", &o.kv_transfer.prefix_pull_min_tokens);
      top.Merge(t);
    }
    {
      MapReader e = top.Child("etcd");
      e.GetStrings("endpoints", &o.etcd.endpoints);
      e.Get("prefix", &o.etcd.prefix);
      e.Get("lease_ttl_s", &o.etcd.lease_ttl_s);
      e.Get("poll_interval_ms", &o.etcd.poll_interval_ms);
      e.Get("node_name", &o.etcd.node_name);
      top.Merge(e);
    }
    status = top.Finish();
  } catch (const YAML::Exception& e) {
    status = absl::InvalidArgumentError(
        StrCat("line ", e.mark.line + 1, ", column ", e.mark.column + 1, ": ", e.msg));
  }
  if (!status.ok()) {
    return absl::InvalidArgumentError(StrCat(source, ": ", status.message()));
  }
  if (absl::Status v = o.Validate(); !v.ok()) {
    return absl::InvalidArgumentError(StrCat(source, ": ", v.message()));
  }
  return o;
}

absl::StatusOr<ServeOptions> LoadServeOptions(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(StrCat("cannot read config file '", path, "'"));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ParseServeOptions(ss.str(), path);
}

absl::Status LoadApiKeysFile(const std::string& path, std::vector<std::string>* keys) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(StrCat("api_keys_file: cannot read '", path, "'"));
  std::string line;
  int added = 0;
  while (std::getline(in, line)) {
    absl::string_view k = absl::StripAsciiWhitespace(ToAbsl(line));
    if (k.empty() || k.front() == '#') continue;
    keys->emplace_back(k);
    ++added;
  }
  if (added == 0) {
    return absl::InvalidArgumentError(StrCat("api_keys_file: '", path, "' holds no key"));
  }
  return absl::OkStatus();
}

void AddApiKeys(std::string_view comma_separated, std::vector<std::string>* keys) {
  for (absl::string_view k : absl::StrSplit(ToAbsl(comma_separated), ',')) {
    k = absl::StripAsciiWhitespace(k);
    if (!k.empty()) keys->emplace_back(k);
  }
}

}  // namespace pd
