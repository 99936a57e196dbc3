// pd-serve: the public APIs (gRPC pdserve.v1.Chat + health + reflection, OpenAI-compatible HTTP
// + /metrics) and a colocated engine (one Scheduler over one Model) in one process.
//
//   pd-serve [--config FILE] [--model PATH] [--grpc-port N] [--http-port M] [--threads T] ...
//
// Flags override the config file (configs/serve.yaml documents every field, docs/config.md
// explains them). Once every listener is up it prints one line on stdout:
//   pd-serve ready: grpc=127.0.0.1:PORT http=http://127.0.0.1:PORT model=ID
// SIGINT / SIGTERM: stop accepting, give running streams shutdown_grace_s to finish, cancel the
// rest, stop the engine, exit 0.
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "CLI/CLI.hpp"
#include "decode_node/node_server.h"
#include "common/config.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/status.h"
#include "common/strings.h"
#include "engine/backend/backend.h"
#include "engine/backend/kv_layout.h"
#include "engine/model/gguf.h"
#include "engine/model/model_finder.h"
#include "engine/runtime/model.h"
#include "engine/sched/scheduler.h"
#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/tokenizer.h"
#include "router/frontend.h"
#include "router/grpc_service.h"
#include "router/http_server.h"
#include "router/model_card.h"
#include "router/serving_metrics.h"

namespace pd::router {
namespace {

struct Flags {
  std::string config;
  ServeOptions o;  // defaults, then the file, then the flags given
};

absl::Status Serve(const ServeOptions& o) {
  // Block the signals in every thread (they inherit the mask); this thread waits for them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  MetricsRegistry registry;
  ServingMetrics metrics(registry);
  // The colocated engine is a decode node's engine (decode_node/node_server.h), built alike.
  PD_ASSIGN_OR_RETURN(node::NodeEngine built, node::BuildNodeEngine(o, &metrics));
  const std::string& model_path = built.model_path;
  std::shared_ptr<engine::GgufFile> file = built.file;
  PD_ASSIGN_OR_RETURN(std::unique_ptr<engine::Tokenizer> tokenizer,
                      engine::Tokenizer::FromGguf(*file));
  absl::StatusOr<engine::ChatTemplateKind> chat_template =
      o.model.chat_template.empty() ? engine::DetectChatTemplate(*file)
                                    : engine::ParseChatTemplateName(o.model.chat_template);
  PD_RETURN_IF_ERROR(chat_template.status());
  std::unique_ptr<engine::Scheduler>& scheduler = built.scheduler;
  ModelCard card = ModelCardFromGguf(*file, model_path, o.model.id);
  card.context_length = scheduler->max_context();

  FrontendOptions fo;
  fo.default_max_tokens = o.limits.default_max_tokens;
  fo.max_tokens_limit = o.limits.max_tokens;
  fo.max_stop = o.limits.max_stop;
  std::unique_ptr<Frontend> frontend =
      MakeLocalFrontend(fo, *scheduler, *tokenizer, *chat_template, card, &metrics);

  std::unique_ptr<GrpcServer> grpc;
  if (o.grpc.enabled) {
    GrpcServerOptions go;
    go.host = o.grpc.host;
    go.port = o.grpc.port;
    go.api_keys = o.api_keys;
    go.max_message_bytes = static_cast<int>(std::min<int64_t>(o.limits.max_body_bytes, INT32_MAX));
    PD_ASSIGN_OR_RETURN(grpc, GrpcServer::Start(*frontend, go, &metrics));
  }
  std::unique_ptr<HttpServer> http;
  int http_port = 0;
  if (o.http.enabled) {
    HttpServerOptions ho;
    ho.max_body_bytes = static_cast<size_t>(o.limits.max_body_bytes);
    ho.api_keys = o.api_keys;
    engine::Scheduler* engine = scheduler.get();
    ho.refresh_metrics = [engine, &metrics] { metrics.Load(engine->Load()); };
    http = std::make_unique<HttpServer>(ho, *frontend, registry, &metrics);
    PD_ASSIGN_OR_RETURN(http_port, http->Start(o.http.host, o.http.port));
  }

  const bool v6 = o.http.host.find(':') != std::string::npos;
  std::printf(
      "pd-serve ready: grpc=%s http=%s model=%s\n", grpc ? grpc->address().c_str() : "off",
      http ? StrCat("http://", v6 ? "[" : "", o.http.host, v6 ? "]" : "", ":", http_port).c_str()
           : "off",
      card.id.c_str());
  std::fflush(stdout);
  PD_LOG(kInfo, "serving ", model_path, " (", card.architecture, ", context ", card.context_length,
         ", template ", engine::ChatTemplateName(*chat_template), ")");

  int sig = 0;
  sigwait(&signals, &sig);
  PD_LOG(kInfo, "signal ", sig, ": shutting down (grace ", o.shutdown_grace_s, " s)");
  const absl::Duration grace = absl::Seconds(o.shutdown_grace_s);
  // Both front doors drain at once; the engine keeps running until they are done.
  std::thread grpc_stop([&grpc, grace] {
    if (grpc) grpc->Shutdown(grace);
  });
  if (http) http->Stop();
  grpc_stop.join();
  scheduler->Shutdown();
  PD_LOG(kInfo, "stopped");
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  CLI::App app{"pd-serve: gRPC + OpenAI-compatible HTTP serving with a colocated engine"};
  std::string config, model, model_id, chat_template, backend, kv_dtype, grpc_host, http_host;
  int grpc_port = 0, http_port = 0, threads = 0, ctx = 0, max_running = 0, max_waiting = 0,
      token_budget = 0, default_max_tokens = 0, max_tokens = 0;
  int64_t kv_mib = 0;
  double grace = 0;
  std::vector<std::string> api_keys;
  bool no_http = false, no_grpc = false;
  app.add_option("--config", config, "YAML config file (see configs/serve.yaml)");
  auto* o_model =
      app.add_option("-m,--model", model, "GGUF model file (default: the default model)");
  auto* o_id = app.add_option("--model-id", model_id, "name clients use (default: file name)");
  auto* o_tmpl = app.add_option("--chat-template", chat_template, "gemma|chatml|llama3|llama2");
  auto* o_backend = app.add_option("--backend", backend, "cpu or cuda");
  auto* o_ctx = app.add_option("-c,--ctx", ctx, "context per request (0 = min(trained, 4096))");
  auto* o_threads = app.add_option("-t,--threads", threads, "CPU threads (0 = all cores)");
  auto* o_grpc_host = app.add_option("--grpc-host", grpc_host, "gRPC listen address");
  auto* o_grpc_port = app.add_option("--grpc-port", grpc_port, "gRPC port (0 = pick a free one)");
  auto* o_http_host = app.add_option("--http-host", http_host, "HTTP listen address");
  auto* o_http_port = app.add_option("--http-port", http_port, "HTTP port (0 = pick a free one)");
  app.add_flag("--no-grpc", no_grpc, "do not serve gRPC");
  app.add_flag("--no-http", no_http, "do not serve HTTP");
  app.add_option("--api-key", api_keys, "accepted API key (repeatable; adds to the config's)");
  auto* o_kv_dtype = app.add_option("--kv-dtype", kv_dtype, "KV cache type: f16, int8 or f32");
  auto* o_kv_mib = app.add_option("--kv-mib", kv_mib, "KV cache memory budget in MiB");
  auto* o_running = app.add_option("--max-running-seqs", max_running, "sequences holding KV");
  auto* o_waiting = app.add_option("--max-waiting", max_waiting, "queued requests before 429s");
  auto* o_budget = app.add_option("--token-budget", token_budget, "tokens per engine step");
  auto* o_defmax =
      app.add_option("--default-max-tokens", default_max_tokens, "max_tokens when unset");
  auto* o_max = app.add_option("--max-tokens-limit", max_tokens, "largest max_tokens allowed");
  auto* o_grace = app.add_option("--shutdown-grace", grace, "seconds streams get on SIGTERM");
  CLI11_PARSE(app, argc, argv);

  absl::StatusOr<ServeOptions> loaded =
      config.empty() ? ParseServeOptions("", "defaults") : LoadServeOptions(config);
  if (!loaded.ok()) {
    std::fprintf(stderr, "pd-serve: error: %s\n", std::string(loaded.status().message()).c_str());
    return 2;
  }
  ServeOptions o = *std::move(loaded);
  if (o_model->count()) o.model.path = model;
  if (o_id->count()) o.model.id = model_id;
  if (o_tmpl->count()) o.model.chat_template = chat_template;
  if (o_backend->count()) o.model.backend = backend;
  if (o_ctx->count()) o.model.context = ctx;
  if (o_threads->count()) o.threads = threads;
  if (o_grpc_host->count()) o.grpc.host = grpc_host;
  if (o_grpc_port->count()) o.grpc.port = grpc_port;
  if (o_http_host->count()) o.http.host = http_host;
  if (o_http_port->count()) o.http.port = http_port;
  if (no_grpc) o.grpc.enabled = false;
  if (no_http) o.http.enabled = false;
  o.api_keys.insert(o.api_keys.end(), api_keys.begin(), api_keys.end());
  if (const char* env = std::getenv("PDSERVE_API_KEYS")) AddApiKeys(env, &o.api_keys);
  if (o_kv_dtype->count()) o.kv.dtype = kv_dtype;
  if (o_kv_mib->count()) o.kv.memory_mib = kv_mib;
  if (o_running->count()) o.scheduler.max_running_seqs = max_running;
  if (o_waiting->count()) o.scheduler.max_waiting = max_waiting;
  if (o_budget->count()) o.scheduler.token_budget = token_budget;
  if (o_defmax->count()) o.limits.default_max_tokens = default_max_tokens;
  if (o_max->count()) o.limits.max_tokens = max_tokens;
  if (o_grace->count()) o.shutdown_grace_s = grace;
  if (absl::Status v = o.Validate(); !v.ok()) {
    std::fprintf(stderr, "pd-serve: error: %s\n", std::string(v.message()).c_str());
    return 2;
  }
  if (absl::Status s = Serve(o); !s.ok()) {
    std::fprintf(stderr, "pd-serve: error: %s\n", std::string(s.ToString()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace pd::router

int main(int argc, char** argv) { return pd::router::Main(argc, argv); }
