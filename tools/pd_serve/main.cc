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
#include "common/cli_parse.h"
#include "common/config.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/signals.h"
#include "common/status.h"
#include "common/tls_flags.h"
#include "engine/sched/scheduler.h"
#include "engine/tokenizer/chat_template.h"
#include "frontend/frontend.h"
#include "frontend/public_api.h"
#include "frontend/serving_metrics.h"
#include "node/engine_builder.h"

namespace pd::frontend {
namespace {

struct Flags {
  std::string config;
  ServeOptions o;  // defaults, then the file, then the flags given
};

absl::Status Serve(const ServeOptions& o) {
  // Block the signals in every thread (they inherit the mask); this thread waits for them.
  const sigset_t signals = BlockStopSignals();
  MetricsRegistry registry;
  ServingMetrics metrics(registry);
  // The colocated engine is a node's engine (node/engine_builder.h), built alike.
  PD_ASSIGN_OR_RETURN(node::ServingEngine built, node::BuildServingEngine(o, &metrics));
  engine::Scheduler* scheduler = built.scheduler.get();
  PD_ASSIGN_OR_RETURN(FrontendModel model,
                      LoadFrontendModel(*built.file, built.model_path, o.model));
  model.card.context_length = scheduler->max_context();
  std::unique_ptr<Frontend> frontend =
      MakeLocalFrontend(FrontendOptionsFrom(o), *scheduler, *model.tokenizer, model.chat_template,
                        model.card, &metrics);
  PD_ASSIGN_OR_RETURN(std::unique_ptr<PublicServers> servers,
                      PublicServers::Start(o, *frontend, registry, &metrics, [scheduler, &metrics] {
                        metrics.Load(scheduler->Load());
                      }));
  std::printf("pd-serve ready: %s model=%s\n", servers->Endpoints().c_str(), model.card.id.c_str());
  std::fflush(stdout);
  PD_LOG(kInfo, "serving ", built.model_path, " (", model.card.architecture, ", context ",
         model.card.context_length, ", template ", engine::ChatTemplateName(model.chat_template),
         ", kernels ", built.kernels, ")");

  int sig = 0;
  sigwait(&signals, &sig);
  PD_LOG(kInfo, "signal ", sig, ": shutting down (grace ", o.shutdown_grace_s, " s)");
  // Both front doors drain at once; the engine keeps running until they are done.
  servers->Shutdown(absl::Seconds(o.shutdown_grace_s));
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
      app.add_option("-m,--model", model,
                     "GGUF model file or Hugging Face checkpoint folder (default: the default "
                     "model)");
  std::string quantize;
  auto* o_quantize = app.add_option(
      "--quantize", quantize,
      "quantize F32/F16/BF16 weights at load to this type (q8_0, q4_K, ...; model.quantize)");
  auto* o_id = app.add_option("--model-id", model_id, "name clients use (default: file name)");
  auto* o_tmpl = app.add_option("--chat-template", chat_template, "gemma|chatml|llama3|llama2|phi3");
  auto* o_backend = app.add_option("--backend", backend, "cpu or cuda");
  std::string gpu_layers;
  auto* o_gpu_layers = app.add_option(
      "--gpu-layers", gpu_layers,
      "with --backend cuda: all, auto (what the GPU's free memory holds) or N (the last N "
      "layers); the rest run on the CPU (model.gpu_layers)");
  auto* o_ctx = app.add_option("-c,--ctx", ctx, "context per request (0 = min(trained, 4096))");
  auto* o_threads = app.add_option("-t,--threads", threads, "CPU threads (0 = all cores)");
  auto* o_grpc_host = app.add_option("--grpc-host", grpc_host, "gRPC listen address");
  auto* o_grpc_port = app.add_option("--grpc-port", grpc_port, "gRPC port (0 = pick a free one)");
  auto* o_http_host = app.add_option("--http-host", http_host, "HTTP listen address");
  auto* o_http_port = app.add_option("--http-port", http_port, "HTTP port (0 = pick a free one)");
  app.add_flag("--no-grpc", no_grpc, "do not serve gRPC");
  app.add_flag("--no-http", no_http, "do not serve HTTP");
  app.add_option("--api-key", api_keys, "accepted API key (repeatable; adds to the config's)");
  std::string api_key_file;
  app.add_option("--api-key-file", api_key_file,
                 "file of accepted API keys, one per line (api_keys_file)");
  auto* o_kv_dtype = app.add_option("--kv-dtype", kv_dtype, "KV cache type: f16, int8 or f32");
  auto* o_kv_mib = app.add_option("--kv-mib", kv_mib, "KV cache memory budget in MiB");
  bool no_prefix_cache = false;
  app.add_flag("--no-prefix-cache", no_prefix_cache,
               "recompute every prompt (prefix_cache.enabled: false)");
  auto* o_running = app.add_option("--max-running-seqs", max_running, "sequences holding KV");
  auto* o_waiting = app.add_option("--max-waiting", max_waiting, "queued requests before 429s");
  auto* o_budget = app.add_option("--token-budget", token_budget, "tokens per engine step");
  auto* o_defmax =
      app.add_option("--default-max-tokens", default_max_tokens, "max_tokens when unset");
  auto* o_max = app.add_option("--max-tokens-limit", max_tokens, "largest max_tokens allowed");
  auto* o_grace = app.add_option("--shutdown-grace", grace, "seconds streams get on SIGTERM");
  std::string spec;
  int spec_k = 0;
  auto* o_spec = app.add_option("--spec", spec,
                                "speculative decoding: off, ngram, self or a draft GGUF path "
                                "(speculative.drafter; pd-prefill ignores it)");
  auto* o_spec_k = app.add_option("--spec-k", spec_k, "the most draft tokens per step (1..16)");
  TlsFlags tls_flags;
  tls_flags.Add(app, /*public_api=*/true, /*cluster=*/false);
  if (const int rc = pd::ParseFlags(app, argc, argv); rc >= 0) return rc;

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
  if (o_gpu_layers->count()) o.model.gpu_layers = gpu_layers;
  if (o_quantize->count()) o.model.quantize = quantize;
  if (o_ctx->count()) o.model.context = ctx;
  if (o_threads->count()) o.threads = threads;
  if (o_spec->count()) o.speculative.drafter = spec;
  if (o_spec_k->count()) o.speculative.max_k = spec_k;
  if (o_grpc_host->count()) o.grpc.host = grpc_host;
  if (o_grpc_port->count()) o.grpc.port = grpc_port;
  if (o_http_host->count()) o.http.host = http_host;
  if (o_http_port->count()) o.http.port = http_port;
  if (no_grpc) o.grpc.enabled = false;
  if (no_http) o.http.enabled = false;
  o.api_keys.insert(o.api_keys.end(), api_keys.begin(), api_keys.end());
  if (const char* env = std::getenv("PDSERVE_API_KEYS")) AddApiKeys(env, &o.api_keys);
  if (!api_key_file.empty()) o.api_keys_file = api_key_file;
  if (!o.api_keys_file.empty()) {
    if (absl::Status k = LoadApiKeysFile(o.api_keys_file, &o.api_keys); !k.ok()) {
      std::fprintf(stderr, "pd-serve: error: %s\n", std::string(k.message()).c_str());
      return 2;
    }
  }
  if (o_kv_dtype->count()) o.kv.dtype = kv_dtype;
  if (o_kv_mib->count()) o.kv.memory_mib = kv_mib;
  if (no_prefix_cache) o.prefix_cache.enabled = false;
  if (o_running->count()) o.scheduler.max_running_seqs = max_running;
  if (o_waiting->count()) o.scheduler.max_waiting = max_waiting;
  if (o_budget->count()) o.scheduler.token_budget = token_budget;
  if (o_defmax->count()) o.limits.default_max_tokens = default_max_tokens;
  if (o_max->count()) o.limits.max_tokens = max_tokens;
  if (o_grace->count()) o.shutdown_grace_s = grace;
  tls_flags.ApplyTo(&o);
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
}  // namespace pd::frontend

int main(int argc, char** argv) { return pd::frontend::Main(argc, argv); }
