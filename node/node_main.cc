#include "node/node_main.h"

#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <utility>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "common/cli_parse.h"
#include "common/log.h"
#include "common/signals.h"
#include "common/status.h"
#include "common/strings.h"
#include "common/tls_flags.h"
#include "engine/model/fingerprint.h"
#include "frontend/serving_metrics.h"
#include "kvtransfer/kv_transport.h"
#include "node/engine_builder.h"
#include "node/etcd_registration.h"

namespace pd::node {
namespace {

// PDSERVE_TEST_KV_FAULTS="corrupt_layer=N,truncate_layer=N,stall_after_layers=N" (any subset):
// the faults a sender puts on the wire, for the cluster's fault tests.
absl::StatusOr<kvtransfer::FaultOptions> ParseKvFaults(std::string_view text) {
  kvtransfer::FaultOptions f;
  std::string rest(text);
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string item = rest.substr(0, comma);
    rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
    const size_t eq = item.find('=');
    const std::pair<std::string, std::string> kv{
        item.substr(0, eq), eq == std::string::npos ? "" : item.substr(eq + 1)};
    int value = 0;
    if (!absl::SimpleAtoi(kv.second, &value)) {
      return absl::InvalidArgumentError(
          StrCat("PDSERVE_TEST_KV_FAULTS: bad value in '", item, "'"));
    }
    if (kv.first == "corrupt_layer") {
      f.corrupt_layer = value;
    } else if (kv.first == "truncate_layer") {
      f.truncate_layer = value;
    } else if (kv.first == "stall_after_layers") {
      f.stall_after_layers = value;
    } else {
      return absl::InvalidArgumentError(StrCat("PDSERVE_TEST_KV_FAULTS: unknown fault '", kv.first,
                                               "' (corrupt_layer, truncate_layer, "
                                               "stall_after_layers)"));
    }
  }
  return f;
}

absl::Status Run(const std::string& name, std::unique_ptr<NodeRole>& role, const ServeOptions& o,
                 sigset_t signals) {
  const std::string role_name(role->name());
  MetricsRegistry registry;
  frontend::ServingMetrics metrics(registry);
  // Only the node that decodes speculates (a prefill node computes prompts and one token).
  PD_ASSIGN_OR_RETURN(ServingEngine engine,
                      BuildServingEngine(o, &metrics, /*speculate=*/role_name == "decode"));
  NodeState state(role_name, *engine.scheduler, &registry);
  state.SetModelFingerprint(engine::ModelFingerprint(*engine.file));
  // KV transfer: pd-prefill sends, pd-decode receives (docs/kv_transfer.md, "In the cluster").
  // Declared after the role: it closes before the role (whose objects its last callbacks may
  // reach) is destroyed.
  std::unique_ptr<kvtransfer::KvTransport> transport;
  if (o.kv_transfer.enabled) {
    kvtransfer::TransportOptions to;
    to.kind = "ucx";
    to.ucx_tls = o.kv_transfer.ucx_tls;
    to.ucx_peer_failure = o.kv_transfer.peer_failure;
    to.pool_bytes = static_cast<size_t>(o.kv_transfer.staging_mib) << 20;
    role->ConfigureTransport(to);
    if (const char* f = std::getenv("PDSERVE_TEST_KV_FAULTS")) {
      PD_ASSIGN_OR_RETURN(to.faults, ParseKvFaults(f));
      PD_LOG(kWarning, name, ": PDSERVE_TEST_KV_FAULTS=", f, ": sending faulty KV (tests only)");
    }
    absl::StatusOr<std::unique_ptr<kvtransfer::KvTransport>> t =
        kvtransfer::KvTransport::Create(to);
    if (!t.ok()) {
      // Serving without transfer still works (decode nodes prefill); say why it is off.
      PD_LOG(kWarning, name, ": KV transfer off: ", t.status().ToString());
    } else {
      transport = *std::move(t);
      state.SetKvTransport(transport.get(), o.kv_transfer);
    }
  }
  PD_ASSIGN_OR_RETURN(
      ClusterChannels channels,
      MakeClusterChannels({o.cluster_tls.cert_file, o.cluster_tls.key_file, o.cluster_tls.ca_file},
                          o.cluster_tls.server_name));
  state.SetClusterChannels(std::move(channels));
  PD_ASSIGN_OR_RETURN(grpc::Service * service, role->Start(state));
  NodeServerOptions no;
  no.name = name;
  no.grpc = o.grpc;
  no.http = o.http;
  no.tls = {o.cluster_tls.cert_file, o.cluster_tls.key_file, o.cluster_tls.ca_file};
  engine::Scheduler* sched = engine.scheduler.get();
  PD_ASSIGN_OR_RETURN(std::unique_ptr<NodeServer> server,
                      NodeServer::Start(no, state, service, registry,
                                        [sched, &metrics] { metrics.Load(sched->Load()); }));
  // etcd membership (nullptr when off): routers watching the prefix add this node.
  std::unique_ptr<EtcdRegistration> etcd =
      StartEtcdRegistration(o, role_name, server->grpc_address());
  std::printf("%s\n", server->ReadyLine().c_str());
  std::fflush(stdout);
  PD_LOG(kInfo, name, ": serving ", engine.model_path, " (fingerprint ",
         engine::FingerprintHex(state.model_fingerprint()), ", ", role_name, ", context ",
         sched->max_context(), ", kernels ", engine.kernels, ")");
  int sig = 0;
  sigwait(&signals, &sig);
  PD_LOG(kInfo, name, ": signal ", sig, ": draining (grace ", o.shutdown_grace_s, " s)");
  etcd.reset();  // revokes the lease: routers drop this node at once
  server->Drain(absl::Seconds(o.shutdown_grace_s));
  // The role's holds first (they reference the transport and the engine), then the transport
  // (its last callbacks may still reach the role's objects), then the role, then the engine.
  role->Stop();
  transport.reset();
  role.reset();
  engine.scheduler->Shutdown();
  PD_LOG(kInfo, name, ": stopped");
  return absl::OkStatus();
}

}  // namespace

int NodeMain(const std::string& name, std::unique_ptr<NodeRole> role, int argc, char** argv) {
  const sigset_t signals = BlockStopSignals();
  CLI::App app{
      StrCat(name, ": a ", role->name(), " node of a pdserve cluster (see docs/cluster.md)")};
  std::string config, model, grpc_host;
  int grpc_port = 0, http_port = 0, threads = 0, ctx = 0;
  int64_t kv_mib = 0;
  double grace = 0;
  bool no_http = false;
  app.add_option("--config", config, "YAML config file (configs/serve.yaml lists every field)");
  auto* o_model = app.add_option("-m,--model", model, "GGUF model file");
  std::string backend, gpu_layers;
  auto* o_backend =
      app.add_option("--backend", backend, "compute backend: cpu or cuda (model.backend)");
  auto* o_gpu_layers = app.add_option(
      "--gpu-layers", gpu_layers,
      "with --backend cuda: all, auto (what the GPU's free memory holds) or N (the last N "
      "layers); the rest run on the CPU (model.gpu_layers)");
  auto* o_grpc_host = app.add_option("--grpc-host", grpc_host, "gRPC listen address");
  auto* o_grpc_port = app.add_option("--grpc-port", grpc_port, "gRPC port (0 = a free one)");
  auto* o_http_port = app.add_option("--http-port", http_port, "/metrics port (0 = a free one)");
  app.add_flag("--no-http", no_http, "no /metrics and /health HTTP server");
  auto* o_threads = app.add_option("-t,--threads", threads, "CPU threads (0 = all cores)");
  auto* o_ctx = app.add_option("-c,--ctx", ctx, "context per request");
  auto* o_kv_mib = app.add_option("--kv-mib", kv_mib, "KV cache memory budget in MiB");
  auto* o_grace = app.add_option("--shutdown-grace", grace, "seconds requests get on SIGTERM");
  bool no_prefix_cache = false;
  app.add_flag("--no-prefix-cache", no_prefix_cache,
               "recompute every prompt (prefix_cache.enabled: false)");
  std::string node_name;
  auto* o_name = app.add_option("--name", node_name, "name registered in etcd (etcd.node_name)");
  std::string spec;
  int spec_k = 0;
  auto* o_spec = app.add_option("--spec", spec,
                                "speculative decoding: off, ngram, self, self-head or a draft "
                                "GGUF path "
                                "(speculative.drafter; pd-prefill ignores it)");
  auto* o_spec_k = app.add_option("--spec-k", spec_k, "the most draft tokens per step (1..16)");
  TlsFlags tls_flags;
  tls_flags.Add(app, /*public_api=*/false, /*cluster=*/true);
  if (const int rc = pd::ParseFlags(app, argc, argv); rc >= 0) return rc;
  absl::StatusOr<ServeOptions> loaded =
      config.empty() ? ParseServeOptions("", "defaults") : LoadServeOptions(config);
  if (!loaded.ok()) {
    std::fprintf(stderr, "%s: error: %s\n", name.c_str(),
                 std::string(loaded.status().message()).c_str());
    return 2;
  }
  ServeOptions o = *std::move(loaded);
  if (o_model->count()) o.model.path = model;
  if (o_backend->count()) o.model.backend = backend;
  if (o_gpu_layers->count()) o.model.gpu_layers = gpu_layers;
  if (o_grpc_host->count()) o.grpc.host = grpc_host;
  if (o_grpc_port->count()) o.grpc.port = grpc_port;
  if (o_http_port->count()) o.http.port = http_port;
  if (no_http) o.http.enabled = false;
  if (o_threads->count()) o.threads = threads;
  if (o_spec->count()) o.speculative.drafter = spec;
  if (o_spec_k->count()) o.speculative.max_k = spec_k;
  if (o_ctx->count()) o.model.context = ctx;
  if (o_kv_mib->count()) o.kv.memory_mib = kv_mib;
  if (o_grace->count()) o.shutdown_grace_s = grace;
  if (no_prefix_cache) o.prefix_cache.enabled = false;
  if (o_name->count()) o.etcd.node_name = node_name;
  tls_flags.ApplyTo(&o);
  if (absl::Status v = o.Validate(); !v.ok()) {
    std::fprintf(stderr, "%s: error: %s\n", name.c_str(), std::string(v.message()).c_str());
    return 2;
  }
  if (absl::Status s = Run(name, role, o, signals); !s.ok()) {
    std::fprintf(stderr, "%s: error: %s\n", name.c_str(), s.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace pd::node
