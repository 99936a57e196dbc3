// pd-router: the public APIs of a pdserve cluster (gRPC pdserve.v1.Chat + health + reflection,
// OpenAI-compatible HTTP + /metrics), unchanged from pd-serve's, over a RemoteEngine that places
// requests on the decode nodes of router.nodes and, with etcd.endpoints set, on those that
// register in etcd (docs/cluster.md). Wiring only.
//
//   pd-router --config configs/cluster-local.yaml [--model PATH] [--grpc-port N] [--http-port M]
//             [--node NAME=ROLE@HOST:PORT ...]
//
// The model file is read for its tokenizer, chat template and model card only (no weights are
// loaded). Ready line on stdout:
//   pd-router ready: grpc=127.0.0.1:PORT http=http://127.0.0.1:PORT model=ID nodes=N
// SIGINT / SIGTERM: stop accepting, give running streams shutdown_grace_s, cancel the rest, exit 0.
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "CLI/CLI.hpp"
#include "common/cli_parse.h"
#include "common/config.h"
#include "common/grpc_tls.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/signals.h"
#include "common/status.h"
#include "common/strings.h"
#include "common/tls_flags.h"
#include "engine/convert/hf_convert.h"
#include "engine/model/fingerprint.h"
#include "engine/model/gguf.h"
#include "engine/model/model_config.h"
#include "engine/model/model_finder.h"
#include "frontend/frontend.h"
#include "frontend/public_api.h"
#include "frontend/serving_metrics.h"
#include "router/etcd_watcher.h"
#include "router/node_registry.h"
#include "router/remote_engine.h"

namespace pd::router {
namespace {

using frontend::Frontend;
using frontend::FrontendModel;
using frontend::FrontendOptionsFrom;
using frontend::LoadFrontendModel;
using frontend::MakeLocalFrontend;
using frontend::ModelCard;
using frontend::PublicServers;
using frontend::ServingMetrics;

absl::Status Route(const ServeOptions& o, sigset_t signals, double wait_ready_s) {
  std::string model_path = o.model.path;
  if (model_path.empty()) {
    PD_ASSIGN_OR_RETURN(model_path, engine::FindDefaultModel());
  }
  PD_ASSIGN_OR_RETURN(std::shared_ptr<engine::GgufFile> file, engine::OpenModelFile(model_path));
  PD_ASSIGN_OR_RETURN(FrontendModel model, LoadFrontendModel(*file, model_path, o.model));
  ModelCard& card = model.card;

  MetricsRegistry registry;
  ServingMetrics metrics(registry);
  PD_ASSIGN_OR_RETURN(
      ClusterChannels channels,
      MakeClusterChannels({o.cluster_tls.cert_file, o.cluster_tls.key_file, o.cluster_tls.ca_file},
                          o.cluster_tls.server_name));
  PD_ASSIGN_OR_RETURN(std::unique_ptr<NodeRegistry> nodes,
                      NodeRegistry::Create(o.router, &registry, std::move(channels),
                                           engine::ModelFingerprint(*file)));
  RemoteEngineOptions ro;
  ro.max_retries = o.router.max_retries;
  ro.disaggregate = o.router.disaggregate;
  ro.disaggregate_min_prompt = o.router.disaggregate_min_prompt;
  ro.int8_wire = o.router.kv_wire == "int8";
  ro.kv_transfer_timeout_s = o.router.kv_transfer_timeout_ms / 1000.0;
  // The nodes' context rule (engine/model/model_config.h), from the file's metadata: no weights
  // here.
  absl::StatusOr<uint64_t> n_ctx = file->GetUint(StrCat(card.architecture, ".context_length"));
  ro.default_context = o.model.context > 0
                           ? o.model.context
                           : engine::DefaultContext(n_ctx.ok() ? static_cast<int>(*n_ctx) : 4096);
  RemoteEngine engine(*nodes, ro, &registry);
  // Dynamic membership (docs/cluster.md, "etcd membership"). Declared after the engine: it is
  // stopped before the engine, whose listener its removals call.
  std::unique_ptr<EtcdNodeWatcher> etcd;
  if (!o.etcd.endpoints.empty()) {
    PD_ASSIGN_OR_RETURN(etcd, EtcdNodeWatcher::Start(o.etcd, *nodes));
  }
  // The configured nodes and those registered in etcd now.
  const std::vector<NodeStatus> known = nodes->Snapshot();
  int n_decode = 0, n_prefill = 0;
  for (const NodeStatus& n : known) (n.role == "decode" ? n_decode : n_prefill)++;
  if (etcd != nullptr && n_decode == 0) {
    PD_LOG(kInfo, "no decode node yet: waiting for nodes to register under ",
           EtcdNodesPrefix(o.etcd), " (requests get UNAVAILABLE until one is healthy)");
  }
  const absl::Time wait_end = absl::Now() + absl::Seconds(std::max(wait_ready_s, 0.0));
  if (wait_ready_s > 0 && !nodes->WaitForDecodeNodes(n_decode, wait_end - absl::Now())) {
    PD_LOG(kWarning, "not every decode node is healthy after ", wait_ready_s, " s; serving with ",
           nodes->HealthyCount("decode"));
  }
  // The prefill nodes too, so that the first prompts after "ready" take the disaggregated path
  // (until one is healthy, decode nodes prefill themselves).
  if (wait_ready_s > 0 && !nodes->WaitForHealthy("prefill", n_prefill, wait_end - absl::Now())) {
    PD_LOG(kWarning, "not every prefill node is healthy after ", wait_ready_s, " s; serving with ",
           nodes->HealthyCount("prefill"), " (decode nodes prefill meanwhile)");
  }
  card.context_length = engine.max_context();

  std::unique_ptr<Frontend> frontend = MakeLocalFrontend(
      FrontendOptionsFrom(o), engine, *model.tokenizer, model.chat_template, card, &metrics);
  PD_ASSIGN_OR_RETURN(std::unique_ptr<PublicServers> servers,
                      PublicServers::Start(o, *frontend, registry, &metrics,
                                           [&engine, &metrics] { metrics.Load(engine.Load()); }));
  std::printf("pd-router ready: %s model=%s nodes=%zu\n", servers->Endpoints().c_str(),
              card.id.c_str(), known.size());
  std::fflush(stdout);

  int sig = 0;
  sigwait(&signals, &sig);
  PD_LOG(kInfo, "pd-router: signal ", sig, ": shutting down (grace ", o.shutdown_grace_s, " s)");
  servers->Shutdown(absl::Seconds(o.shutdown_grace_s));
  etcd.reset();  // no membership changes while the engine stops
  engine.Shutdown();
  PD_LOG(kInfo, "pd-router: stopped");
  return absl::OkStatus();
}

// "NAME=ROLE@HOST:PORT"
absl::StatusOr<NodeOptions> ParseNodeFlag(const std::string& s) {
  const size_t eq = s.find('='), at = s.find('@');
  if (eq == std::string::npos || at == std::string::npos || at < eq) {
    return absl::InvalidArgumentError(
        StrCat("--node: expected NAME=ROLE@HOST:PORT, got '", s, "'"));
  }
  NodeOptions n;
  n.name = s.substr(0, eq);
  n.role = s.substr(eq + 1, at - eq - 1);
  n.address = s.substr(at + 1);
  return n;
}

int Main(int argc, char** argv) {
  const sigset_t signals = BlockStopSignals();

  CLI::App app{"pd-router: the public APIs of a pdserve cluster, placing requests on nodes"};
  std::string config, model, model_id, grpc_host, http_host;
  int grpc_port = 0, http_port = 0;
  double grace = 0, wait_ready = 10;
  std::vector<std::string> node_flags, api_keys;
  app.add_option("--config", config, "YAML config file (configs/cluster-local.yaml)");
  auto* o_model = app.add_option("-m,--model", model, "GGUF model file (tokenizer and template)");
  auto* o_id = app.add_option("--model-id", model_id, "name clients use (default: file name)");
  auto* o_grpc_host = app.add_option("--grpc-host", grpc_host, "gRPC listen address");
  auto* o_grpc_port = app.add_option("--grpc-port", grpc_port, "gRPC port (0 = a free one)");
  auto* o_http_host = app.add_option("--http-host", http_host, "HTTP listen address");
  auto* o_http_port = app.add_option("--http-port", http_port, "HTTP port (0 = a free one)");
  app.add_option("--node", node_flags, "NAME=ROLE@HOST:PORT (repeatable; adds to router.nodes)");
  app.add_option("--api-key", api_keys, "accepted API key (repeatable)");
  std::string api_key_file;
  app.add_option("--api-key-file", api_key_file,
                 "file of accepted API keys, one per line (api_keys_file)");
  app.add_option("--wait-ready", wait_ready,
                 "seconds to wait for every configured node (decode, then prefill) to be healthy "
                 "before the ready line (0: do not wait)");
  auto* o_grace = app.add_option("--shutdown-grace", grace, "seconds streams get on SIGTERM");
  TlsFlags tls_flags;
  tls_flags.Add(app, /*public_api=*/true, /*cluster=*/true);
  if (const int rc = pd::ParseFlags(app, argc, argv); rc >= 0) return rc;

  absl::StatusOr<ServeOptions> loaded =
      config.empty() ? ParseServeOptions("", "defaults") : LoadServeOptions(config);
  if (!loaded.ok()) {
    std::fprintf(stderr, "pd-router: error: %s\n", std::string(loaded.status().message()).c_str());
    return 2;
  }
  ServeOptions o = *std::move(loaded);
  if (o_model->count()) o.model.path = model;
  if (o_id->count()) o.model.id = model_id;
  if (o_grpc_host->count()) o.grpc.host = grpc_host;
  if (o_grpc_port->count()) o.grpc.port = grpc_port;
  if (o_http_host->count()) o.http.host = http_host;
  if (o_http_port->count()) o.http.port = http_port;
  if (o_grace->count()) o.shutdown_grace_s = grace;
  o.api_keys.insert(o.api_keys.end(), api_keys.begin(), api_keys.end());
  if (const char* env = std::getenv("PDSERVE_API_KEYS")) AddApiKeys(env, &o.api_keys);
  if (!api_key_file.empty()) o.api_keys_file = api_key_file;
  if (!o.api_keys_file.empty()) {
    if (absl::Status k = LoadApiKeysFile(o.api_keys_file, &o.api_keys); !k.ok()) {
      std::fprintf(stderr, "pd-router: error: %s\n", std::string(k.message()).c_str());
      return 2;
    }
  }
  for (const std::string& f : node_flags) {
    absl::StatusOr<NodeOptions> n = ParseNodeFlag(f);
    if (!n.ok()) {
      std::fprintf(stderr, "pd-router: error: %s\n", std::string(n.status().message()).c_str());
      return 2;
    }
    o.router.nodes.push_back(*n);
  }
  tls_flags.ApplyTo(&o);
  if (absl::Status v = o.Validate(); !v.ok()) {
    std::fprintf(stderr, "pd-router: error: %s\n", std::string(v.message()).c_str());
    return 2;
  }
  bool any_decode = false;
  for (const NodeOptions& n : o.router.nodes) any_decode |= n.role == "decode";
  if (!any_decode && o.etcd.endpoints.empty()) {
    std::fprintf(stderr,
                 "pd-router: error: router.nodes: no decode node configured (every request runs "
                 "on a decode node; add one in the config or with --node NAME=decode@HOST:PORT, "
                 "or set etcd.endpoints for nodes that register themselves)\n");
    return 2;
  }
  if (absl::Status s = Route(o, signals, wait_ready); !s.ok()) {
    std::fprintf(stderr, "pd-router: error: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace pd::router

int main(int argc, char** argv) { return pd::router::Main(argc, argv); }
