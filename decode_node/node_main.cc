#include "decode_node/node_main.h"

#include <signal.h>

#include <cstdio>

#include "CLI/CLI.hpp"
#include "common/log.h"
#include "common/status.h"
#include "common/strings.h"

namespace pd::node {
namespace {

absl::Status Run(const std::string& name, const std::string& role,
                 const std::function<std::unique_ptr<grpc::Service>(NodeState&)>& make_service,
                 const ServeOptions& o, sigset_t signals) {
  MetricsRegistry registry;
  router::ServingMetrics metrics(registry);
  PD_ASSIGN_OR_RETURN(NodeEngine engine, BuildNodeEngine(o, &metrics));
  NodeState state(role, *engine.scheduler, /*kv_transfer=*/false);
  std::unique_ptr<grpc::Service> service = make_service(state);
  NodeServerOptions no;
  no.name = name;
  no.grpc = o.grpc;
  no.http = o.http;
  engine::Scheduler* sched = engine.scheduler.get();
  PD_ASSIGN_OR_RETURN(std::unique_ptr<NodeServer> server,
                      NodeServer::Start(no, state, service.get(), registry,
                                        [sched, &metrics] { metrics.Load(sched->Load()); }));
  std::printf("%s\n", server->ReadyLine().c_str());
  std::fflush(stdout);
  PD_LOG(kInfo, name, ": serving ", engine.model_path, " (", role, ", context ",
         sched->max_context(), ")");
  int sig = 0;
  sigwait(&signals, &sig);
  PD_LOG(kInfo, name, ": signal ", sig, ": draining (grace ", o.shutdown_grace_s, " s)");
  server->Drain(absl::Seconds(o.shutdown_grace_s));
  engine.scheduler->Shutdown();
  PD_LOG(kInfo, name, ": stopped");
  return absl::OkStatus();
}

}  // namespace

int NodeMain(const std::string& name, const std::string& role,
             std::function<std::unique_ptr<grpc::Service>(NodeState&)> make_service, int argc,
             char** argv) {
  const sigset_t signals = BlockStopSignals();
  CLI::App app{StrCat(name, ": a ", role, " node of a pdserve cluster (see docs/cluster.md)")};
  std::string config, model, grpc_host;
  int grpc_port = 0, http_port = 0, threads = 0, ctx = 0;
  int64_t kv_mib = 0;
  double grace = 0;
  bool no_http = false;
  app.add_option("--config", config, "YAML config file (configs/serve.yaml lists every field)");
  auto* o_model = app.add_option("-m,--model", model, "GGUF model file");
  auto* o_grpc_host = app.add_option("--grpc-host", grpc_host, "gRPC listen address");
  auto* o_grpc_port = app.add_option("--grpc-port", grpc_port, "gRPC port (0 = a free one)");
  auto* o_http_port = app.add_option("--http-port", http_port, "/metrics port (0 = a free one)");
  app.add_flag("--no-http", no_http, "no /metrics and /health HTTP server");
  auto* o_threads = app.add_option("-t,--threads", threads, "CPU threads (0 = all cores)");
  auto* o_ctx = app.add_option("-c,--ctx", ctx, "context per request");
  auto* o_kv_mib = app.add_option("--kv-mib", kv_mib, "KV cache memory budget in MiB");
  auto* o_grace = app.add_option("--shutdown-grace", grace, "seconds requests get on SIGTERM");
  CLI11_PARSE(app, argc, argv);
  absl::StatusOr<ServeOptions> loaded =
      config.empty() ? ParseServeOptions("", "defaults") : LoadServeOptions(config);
  if (!loaded.ok()) {
    std::fprintf(stderr, "%s: error: %s\n", name.c_str(),
                 std::string(loaded.status().message()).c_str());
    return 2;
  }
  ServeOptions o = *std::move(loaded);
  if (o_model->count()) o.model.path = model;
  if (o_grpc_host->count()) o.grpc.host = grpc_host;
  if (o_grpc_port->count()) o.grpc.port = grpc_port;
  if (o_http_port->count()) o.http.port = http_port;
  if (no_http) o.http.enabled = false;
  if (o_threads->count()) o.threads = threads;
  if (o_ctx->count()) o.model.context = ctx;
  if (o_kv_mib->count()) o.kv.memory_mib = kv_mib;
  if (o_grace->count()) o.shutdown_grace_s = grace;
  if (absl::Status v = o.Validate(); !v.ok()) {
    std::fprintf(stderr, "%s: error: %s\n", name.c_str(), std::string(v.message()).c_str());
    return 2;
  }
  if (absl::Status s = Run(name, role, make_service, o, signals); !s.ok()) {
    std::fprintf(stderr, "%s: error: %s\n", name.c_str(), s.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace pd::node
